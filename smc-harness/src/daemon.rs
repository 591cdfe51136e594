//! The loopback-ism daemon (`smc-ctl daemon`) on a private socket and state directory.
use std::{
    ffi::OsStr,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::{
    proc::{log_tail, log_to, Proc, ScratchDir},
    signals::check_interrupted,
};

/// How long a daemon may take until its socket accepts.
pub const DAEMON_START_TIMEOUT: Duration = Duration::from_secs(10);

/// `smc-ctl daemon --socket SOCKET --state-dir DIR/state` (the caller adds options).
pub fn daemon_command(smc_ctl: &Path, socket: &Path, dir: &Path) -> Command {
    let mut c = Command::new(smc_ctl);
    c.args(["daemon", "--socket"])
        .arg(socket)
        .arg("--state-dir")
        .arg(dir.join("state"));
    c
}

/// A running daemon whose socket accepts; stopped (killed) on drop, then its directory removed
/// if it was started in a [`ScratchDir`] ([`Daemon::start_scratch`]).
pub struct Daemon {
    pub socket: PathBuf,
    pub proc: Proc,
    // Dropped after `proc` (fields drop in order).
    dir: Option<ScratchDir>,
}

impl Daemon {
    /// Starts `smc-ctl daemon` with its socket `DIR/ctl.sock`, state in `DIR/state` and `args`
    /// added, its output appended to `log` (or, without one, stdout to /dev/null and stderr to
    /// ours); waits until it accepts.
    pub fn start<S: AsRef<OsStr>>(
        smc_ctl: &Path,
        dir: &Path,
        args: &[S],
        log: Option<&Path>,
    ) -> Result<Daemon> {
        let socket = dir.join("ctl.sock");
        let mut c = daemon_command(smc_ctl, &socket, dir);
        c.args(args);
        match log {
            Some(l) => log_to(&mut c, l)?,
            None => {
                c.stdin(Stdio::null()).stdout(Stdio::null());
            }
        }
        let p = Proc::spawn("smc-ctl daemon", &mut c)?;
        Daemon::ready(p, socket, log)
    }

    /// [`Daemon::start`] in `dir`, which is removed when the daemon is dropped.
    pub fn start_scratch<S: AsRef<OsStr>>(
        smc_ctl: &Path,
        dir: ScratchDir,
        args: &[S],
        log: Option<&Path>,
    ) -> Result<Daemon> {
        let mut d = Daemon::start(smc_ctl, &dir.0, args, log)?;
        d.dir = Some(dir);
        Ok(d)
    }

    /// Waits (up to [`DAEMON_START_TIMEOUT`]) until the daemon `proc`, started elsewhere (in a
    /// process group, under setpriv, …), accepts on `socket`; fails at once if it exits, with
    /// the tail of its `log`.
    pub fn ready(mut proc: Proc, socket: PathBuf, log: Option<&Path>) -> Result<Daemon> {
        let tail = || log.map(log_tail).unwrap_or_default();
        let t = Instant::now();
        while !seqpacket_accepts(&socket) {
            check_interrupted()?;
            if let Ok(Some(st)) = proc.0.try_wait() {
                bail!("{} exited ({st}){}", proc.name(), tail());
            }
            if t.elapsed() > DAEMON_START_TIMEOUT {
                bail!(
                    "{} does not accept on {} after {DAEMON_START_TIMEOUT:?}{}",
                    proc.name(),
                    socket.display(),
                    tail()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Daemon {
            socket,
            proc,
            dir: None,
        })
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }
}

/// Whether a `SOCK_SEQPACKET` Unix socket at `path` accepts connections (the daemon listens).
/// Only connects: no request is sent, so no counter of the daemon moves.
pub fn seqpacket_accepts(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt as _;
    let b = path.as_os_str().as_bytes();
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if b.len() >= sa.sun_path.len() {
        return false;
    }
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in sa.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain syscalls on our own fd; `sa` is a valid sockaddr_un of the size given.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return false;
        }
        let r = libc::connect(
            fd,
            &sa as *const libc::sockaddr_un as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        );
        libc::close(fd);
        r == 0
    }
}
