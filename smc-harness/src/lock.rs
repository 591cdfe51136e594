//! The lock that the integration tests and the bench take around everything that loads the eBPF
//! programs or reads the host-wide counters, so that neither disturbs the other's counter deltas.
use std::{fs, os::fd::AsRawFd as _, time::Duration};

use anyhow::{bail, Context as _, Result};

use crate::signals::check_interrupted;

/// Its path.
pub const GLOBAL_LOCK: &str = "/run/smc/tests.lock";

/// Held while alive (`flock` on [`GLOBAL_LOCK`], released when the file is closed).
pub struct GlobalLock(#[allow(dead_code)] fs::File);

impl GlobalLock {
    /// Takes the lock, waiting as long as another holder keeps it (an interrupt ends the wait,
    /// see [`crate::install_signal_handlers`]).
    pub fn acquire() -> Result<GlobalLock> {
        fs::create_dir_all("/run/smc").context("mkdir /run/smc")?;
        let f = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(GLOBAL_LOCK)
            .with_context(|| format!("open {GLOBAL_LOCK}"))?;
        // SAFETY: `f` is an open file we own for the call; flock only takes a lock on it.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(GlobalLock(f));
        }
        eprintln!("==> waiting for {GLOBAL_LOCK} (integration tests or a bench are running)");
        // A blocking flock queues fairly with the other waiters (polling with LOCK_NB loses the
        // lock to every blocking waiter on a busy machine); it waits on a helper thread so that
        // an interrupt still ends the wait here.
        let fd = f.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: flock only takes a lock on the descriptor. `fd` stays open while the caller
            // waits for the answer; only an interrupt ends that wait early, and then the caller
            // fails and its program is about to exit (a lock taken then dies with it).
            let r = unsafe { libc::flock(fd, libc::LOCK_EX) };
            let _ = tx.send(r);
        });
        loop {
            check_interrupted()?;
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(0) => return Ok(GlobalLock(f)),
                Ok(_) => bail!("flock {GLOBAL_LOCK} failed"),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => bail!("flock {GLOBAL_LOCK}: {e}"),
            }
        }
    }
}
