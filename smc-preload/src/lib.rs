//! Interposition library for `smc-ctl run`: moves same-host TCP connections onto shared-memory
//! rings (SMC-D over a loopback-ism device), transparently, with TCP fallback.
//!
//! Module map:
//! - [`real`]: the real libc functions (`dlsym(RTLD_NEXT)`).
//! - [`fdtable`]: the lock-free per-fd table.
//! - [`shm`]: mappings, memfds, a process-shared futex lock.
//! - [`conn`]: one SMC connection: rings, cursors, read/write/peek/shutdown/close, wakeups.
//! - [`obj`]: what an fd can be for us (connection, listener, pending socket, epoll set).
//! - `interpose` (feature `interpose`, not in unit tests): the exported libc symbols.

pub mod conn;
pub mod epoll;
pub mod fdtable;
pub mod iov;
pub mod log;
pub mod obj;
pub mod ops;
pub mod poll;
pub mod real;
pub mod setup;
pub mod shm;
pub mod signals;
pub mod stats;

#[cfg(all(feature = "interpose", not(test)))]
mod interpose;

use std::sync::atomic::{AtomicU32, Ordering};

static PID: AtomicU32 = AtomicU32::new(0);

/// Our pid (cached; reset in the child after fork).
pub fn pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: plain syscall.
    let p = unsafe { libc::getpid() } as u32;
    PID.store(p, Ordering::Relaxed);
    p
}

/// Forget the cached pid (child after fork).
pub fn reset_pid() {
    PID.store(0, Ordering::Relaxed);
}
