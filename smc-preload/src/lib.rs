//! Interposition library for `smc-ctl run`.
