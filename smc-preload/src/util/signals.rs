//! Which signals interrupt a blocking socket call.
//!
//! A blocking `recv` in the kernel is restarted after a handler installed with `SA_RESTART` and
//! fails with `EINTR` otherwise. Our blocking waits sleep in `poll`, which never restarts, so we
//! track the handlers the program installs (our `sigaction`/`signal`) and report `EINTR` only
//! when some handler without `SA_RESTART` exists.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bit `n` set: signal `n` has a handler without SA_RESTART.
static NORESTART: AtomicU64 = AtomicU64::new(0);

/// Record a handler change.
pub fn note(sig: i32, handler: libc::sighandler_t, flags: i32) {
    if !(1..64).contains(&sig) {
        return;
    }
    // Fault signals (a runtime's stack-overflow or crash handler) are synchronous to the
    // faulting thread: they never interrupt a blocking call of another.
    if matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP | libc::SIGSYS
    ) {
        return;
    }
    let bit = 1u64 << sig;
    let is_handler = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
    if is_handler && flags & libc::SA_RESTART == 0 {
        NORESTART.fetch_or(bit, Ordering::Relaxed);
    } else {
        NORESTART.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Whether a poll interrupted by a signal should surface as EINTR.
pub fn interrupts() -> bool {
    NORESTART.load(Ordering::Relaxed) != 0
}
