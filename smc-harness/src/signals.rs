//! SIGINT, SIGTERM and SIGHUP as a flag: the waits of the harness check it and fail, so that the
//! guards up the stack get to clean up (a run that is simply killed would leave its cgroups,
//! attachments and daemon behind).
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT/SIGTERM/SIGHUP into the flag [`check_interrupted`] reads.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

/// Whether one of those signals arrived (never, without [`install_signal_handlers`]).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Fails with "interrupted" once one of those signals arrived.
pub fn check_interrupted() -> anyhow::Result<()> {
    if interrupted() {
        anyhow::bail!("interrupted");
    }
    Ok(())
}
