//! eBPF side of the SMC accelerator.
//!
//! - `smc_sockops_{shortcut,ism}` (`sock_ops`, one per cgroup mode): writes the SMC experimental
//!   TCP option into the SYN / SYN-ACK of sockets that opted in, records whether the peer announced
//!   SMC, records established sockets so that same-host pairs are recognised, and puts sockets into
//!   the SOCKHASH for the `sk_msg` shortcut.
//! - `smc_sk_msg` (`sk_msg` on the SOCKHASH): redirects a message to the same-host peer socket when
//!   the sender is enabled for the shortcut and the peer is registered; passes it to TCP otherwise.
//! - `smc_setsockopt` / `smc_getsockopt` (cgroup sockopt): the unprivileged per-socket channel at
//!   the private level `SOL_SMC_BPF`.
//! - `smc_quarantine_verdict` (stream verdict on `SMC_QUARANTINE`) and `smc_sweep` (`iter/tcp`):
//!   connections a withdrawn listener had queued never show an image without the data path
//!   their client's CLC bytes ([`quarantine`]).
//!
//! Modules: [`maps`] (every map of the object and its small accessors), [`storage`] (the socket
//! storage map type), [`key`] (4-tuple keys from the program contexts), and one module per
//! program type: [`sock_ops`], [`sk_msg`], [`sockopt`], [`quarantine`].
#![no_std]
// The atomic `or` of `quarantine::flags_or` (see there); built with `RUSTC_BOOTSTRAP` anyway.
#![allow(internal_features)]
#![feature(core_intrinsics)]
#![no_main]
#![deny(clippy::undocumented_unsafe_blocks)]
// aya-ebpf's map methods take `impl Borrow<K>`: a key passed by value is copied to the stack
// again, which costs the verifier-checked programs instructions and stack (the BPF stack is
// 512 bytes). Keys and values are passed by reference.
#![allow(clippy::needless_borrows_for_generic_args)]

mod key;
mod maps;
mod quarantine;
mod sk_msg;
mod sock_ops;
mod sockopt;
mod storage;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
