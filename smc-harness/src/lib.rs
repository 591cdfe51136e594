//! The harness of the integration tests (`tests`), `cargo xtask demo`, `cargo xtask soak` and
//! `cargo xtask bench`: one home for what they all set up around the data path, each piece a
//! guard that releases what it made when dropped, also when a test panics or a run fails.
//!
//! - [`Cgroup`]: a cgroup v2 directory below the mount `smc_cgroup` detects (never an assumed
//!   `/sys/fs/cgroup`), optionally attached (`smc-ctl attach`, [`Attachment`]); on drop its
//!   processes are killed, it is detached, then removed. [`Cgroup::launch`] builds a command
//!   that runs in it, with [`DataPath`] under `smc-ctl run` (the preload library) on a daemon.
//! - [`Daemon`]: `smc-ctl daemon` (the loopback-ism device) on a private socket and state
//!   directory, started and waited for until its socket accepts.
//! - [`Proc`]: a child process killed and reaped on drop (its process group when started with
//!   [`Proc::spawn_group`]).
//! - [`GlobalLock`]: `/run/smc/tests.lock`, taken by the tests and the bench around everything
//!   that loads programs or reads the host-wide counters.
//! - [`Netns`], [`ip`], [`tcp_listening`], [`wait_listening`], [`free_port`]: network
//!   namespaces, listeners and ports.
//! - [`SoakSummary`]: the summary line of the soak program, and which of its counters are
//!   failures.
//! - [`Rng`]: the test programs' pseudo-random numbers (xorshift64, from a seed).
//! - [`find_tool`]: a program on `PATH` or in the usual system directories.
//! - [`install_signal_handlers`] / [`check_interrupted`]: SIGINT, SIGTERM and SIGHUP become a
//!   flag that the harness's waits check, so that the guards get to clean up.
//!
//! A process joins its cgroup between `fork` and `exec` without allocating
//! (`smc_cgroup::join_before_exec`): the child of a multi-threaded parent must only make
//! async-signal-safe calls.
//!
//! Errors are `anyhow` errors; the integration tests turn them into test failures. Nothing here
//! needs root to build or to run its unit tests.

mod cgroup;
mod daemon;
mod lock;
mod net;
mod proc;
mod rng;
mod signals;
mod soak;

pub use cgroup::{
    attached_cgroups, ebpf_counters, remove_stale_cgroups, smc_ctl, smc_ctl_output, unique,
    Attachment, Cgroup, DataPath,
};
pub use daemon::{daemon_command, seqpacket_accepts, Daemon, DAEMON_START_TIMEOUT};
pub use lock::{GlobalLock, GLOBAL_LOCK};
pub use net::{free_port, ip, tcp_listening, wait_listening, Netns};
pub use proc::{last_lines, log_tail, log_to, Proc, ScratchDir};
pub use rng::Rng;
pub use signals::{check_interrupted, install_signal_handlers, interrupted};
pub use soak::{SoakSummary, SOAK_FAILURES};

/// The executable `tool` on `PATH` or in the usual system directories (`sbin` ones included,
/// which a normal user's `PATH` may lack).
pub fn find_tool(tool: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let usual = [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    std::env::split_paths(&path)
        .chain(usual.map(std::path::PathBuf::from))
        .map(|d| d.join(tool))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Where cgroup v2 is mounted (from `/proc/self/mountinfo`, see `smc_cgroup`).
pub fn cgroup2_root() -> anyhow::Result<std::path::PathBuf> {
    Ok(smc_cgroup::cgroup2_root()?)
}

/// Fails unless this process is root and cgroup v2 is usable; `not_root` is the message when it
/// is not root (why root is needed, how to run it).
pub fn require_root(not_root: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        anyhow::bail!("{not_root}");
    }
    let root = cgroup2_root()?;
    if !root.join("cgroup.procs").exists() {
        anyhow::bail!("cgroup v2 is not usable at {}", root.display());
    }
    Ok(())
}
