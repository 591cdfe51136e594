//! Types shared by the eBPF programs (`smc-ebpf`) and userspace, and the SMC wire protocol.
//!
//! Module map:
//! - [`bpf`]: `#[repr(C)]` map keys and values, counter indices and the private socket-option
//!   channel between a process and the eBPF programs. `no_std`, used on both sides; with
//!   `std`, the userspace side's one definition of a key from socket addresses
//!   ([`bpf::SockKey::new`], [`bpf::key_ip`]), of the network namespace cookie
//!   ([`bpf::netns_cookie`], [`bpf::own_netns_cookie`]) and of the state query
//!   ([`bpf::sock_state`]) (libc's `getsockopt`: not for smc-preload, see there).
//! - [`cdc`]: the 32-byte SMC-D CDC header at offset 0 of every DMB (type `0xFE`, producer and
//!   consumer cursor words loaded/stored atomically as `u64`, producer and connection-state
//!   flags), cursor/ring arithmetic with wrap, readable bytes, free space, the 10% consumer
//!   update rule, and validation of untrusted peer cursors. `no_std`, no allocation.
//! - [`diag`]: CLC decline diagnosis codes (`SMC_CLC_DECL_*`) with their Linux names and
//!   numbers, and the data path's private fallback reason (`POLICY_SHORT`). `no_std`.
//! - [`clc`] (feature `std`): CLC messages (Proposal v1/v2 with the SMC-Dv2 extension, SMC-D
//!   Accept/Confirm v1/v2 with the first-contact extension, Decline v1/v2), byte-exact with
//!   Linux `net/smc/smc_clc.h`; framing ([`clc::message_len`]) and strict decoding
//!   ([`clc::decode`]) with typed errors that map to decline codes.
//! - [`urg`]: TCP urgent data (`MSG_OOB`) over a CDC ring as Linux TCP shows it (the mark,
//!   the reader's urgent state, the urgent word in the CDC header's type word). `no_std`,
//!   sans-IO.
//! - [`handshake`] (feature `std`): sans-IO client and server CLC state machines for SMC-Dv2
//!   over a loopback-ism-like device (CHID [`clc::LOOPBACK_CHID`], 128-bit [`clc::Gid`]); timeouts, DMB registration
//!   and I/O errors are inputs, messages to send and the outcome are outputs.
//!
//! Features: `std` (default) enables `clc`, `handshake` and the socket helpers of `bpf` (with
//! libc); `user` adds the `aya::Pod` impls
//! of [`bpf`]. The eBPF side depends on this crate with `default-features = false`.
//!
//! Tests: unit tests with byte vectors per message kind (`src/clc/tests.rs`), property tests
//! (`tests/proptests.rs`), a Wireshark/tshark dissector test (`tests/tshark.rs`), and
//! cargo-fuzz targets in `fuzz/` (`fuzz/run.sh SECONDS`).
#![cfg_attr(not(feature = "std"), no_std)]

pub mod bpf;
pub mod cdc;
#[cfg(feature = "std")]
pub mod clc;
pub mod clc_wire;
pub mod diag;
#[cfg(feature = "std")]
pub mod handshake;
pub mod urg;
