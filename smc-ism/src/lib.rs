//! The loopback-ism device (daemon and client).
