//! Types shared by the eBPF programs (`smc-ebpf`) and userspace, and the SMC wire protocol.
//!
//! Module map:
//! - [`bpf`]: `#[repr(C)]` map keys and values, counter indices and the private socket-option
//!   channel between a process and the eBPF programs. `no_std`, used on both sides.
#![cfg_attr(not(feature = "std"), no_std)]

pub mod bpf;
pub mod cdc;
#[cfg(feature = "std")]
pub mod clc;
pub mod diag;
#[cfg(feature = "std")]
pub mod handshake;
