//! Process lifecycle: what the library must (not) do across `vfork`, `exec` and fd passing.
//!
//! - **vfork.** A `vfork` child (CPython's `subprocess`, `posix_spawn`, Java, NuProcess) runs in
//!   its parent's memory until it execs or exits: the fd table, the connection objects and the
//!   signal bookkeeping it would touch are the parent's. Its `close`/`close_range`/`dup2`/
//!   `sigaction` only act on its own fd table in the kernel, so here they go straight to libc
//!   and leave our state alone ([`in_vfork_child`]).

use std::sync::atomic::Ordering;

/// Whether this code runs in a `vfork` child (or any child sharing our memory): its pid is not
/// the one cached for the memory image. Costs one `getpid` system call, so callers ask only
/// when they are about to change shared bookkeeping (a slot that is not empty, a signal
/// handler), never on the data path.
pub fn in_vfork_child() -> bool {
    let cached = crate::PID.load(Ordering::Relaxed);
    // SAFETY: plain system call (glibc no longer caches getpid, but the raw call says it
    // plainly).
    let now = unsafe { libc::syscall(libc::SYS_getpid) } as u32;
    cached != 0 && cached != now
}
