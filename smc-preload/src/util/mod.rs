//! Leaves any layer may use: the real libc functions ([`real`]), `SMC_DEBUG` lines ([`log`]),
//! the environment knobs read once at load ([`config`]), fork-safe globals ([`forklock`]), which signals interrupt a blocking call ([`signals`]), the
//! cached pid ([`pid`]).

pub mod config;
pub mod forklock;
pub mod log;
pub mod real;
pub mod signals;

use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) static PID: AtomicU32 = AtomicU32::new(0);

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

/// Cache our own pid again (child after fork). It is stored at once rather than forgotten: a
/// `vfork` child shares this memory, and [`crate::lifecycle::in_vfork_child`] tells it apart by
/// comparing its pid with the cached one, so the cache must never be filled lazily by a child.
pub fn reset_pid() {
    // SAFETY: plain syscall.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}
