//! RAII guards for the demo and the benchmarks: a cgroup, an attachment, the daemon, a process.
//! Everything is stopped and removed on drop, also when the run fails.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// Where cgroup v2 is mounted (from `/proc/self/mountinfo`, see `smc_common::cgroup`).
pub fn cgroup2_root() -> Result<PathBuf> {
    Ok(smc_common::cgroup::cgroup2_root()?)
}

/// The release binaries `cargo xtask build` produced.
pub struct Bins {
    pub smc_ctl: PathBuf,
    pub preload: PathBuf,
}

impl Bins {
    pub fn new(root: &Path) -> Result<Bins> {
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("release");
        let b = Bins {
            smc_ctl: dir.join("smc-ctl"),
            preload: dir.join("libsmc_preload.so"),
        };
        for p in [&b.smc_ctl, &b.preload] {
            if !p.exists() {
                bail!("{} missing: run `cargo xtask build`", p.display());
            }
        }
        Ok(b)
    }
}

/// A cgroup v2 directory; its processes are killed and it is removed on drop.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn new(name: &str) -> Result<Cgroup> {
        let path = cgroup2_root()?.join(format!("{name}-{}", std::process::id()));
        fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(Cgroup { path })
    }

    /// `cmd` with its process joined to this cgroup before exec.
    pub fn adopt(&self, cmd: &mut Command) {
        smc_common::cgroup::join_before_exec(cmd, &self.path);
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while fs::remove_dir(&self.path).is_err() && self.path.exists() && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `smc-ctl attach` undone on drop.
pub struct Attachment {
    smc_ctl: PathBuf,
    cgroup: PathBuf,
}

impl Attachment {
    pub fn new(bins: &Bins, cg: &Cgroup, mode: &str) -> Result<Attachment> {
        let out = Command::new(&bins.smc_ctl)
            .args(["attach", "--cgroup"])
            .arg(&cg.path)
            .args(["--mode", mode])
            .output()?;
        if !out.status.success() {
            bail!("smc-ctl attach: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(Attachment {
            smc_ctl: bins.smc_ctl.clone(),
            cgroup: cg.path.clone(),
        })
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let _ = Command::new(&self.smc_ctl)
            .arg("detach")
            .arg("--cgroup")
            .arg(&self.cgroup)
            .output();
    }
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Result<Proc> {
        Ok(Proc(
            cmd.stdin(Stdio::null())
                .spawn()
                .with_context(|| format!("spawn {cmd:?}"))?,
        ))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The loopback-ism daemon on a private socket and state directory.
pub struct Daemon {
    pub socket: PathBuf,
    state: PathBuf,
    _proc: Proc,
}

impl Daemon {
    pub fn start(bins: &Bins, name: &str) -> Result<Daemon> {
        let dir = PathBuf::from(format!("/run/smc/{name}-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let socket = dir.join("ctl.sock");
        let proc = Proc::spawn(
            Command::new(&bins.smc_ctl)
                .arg("daemon")
                .arg("--socket")
                .arg(&socket)
                .arg("--state-dir")
                .arg(dir.join("state"))
                .stdout(Stdio::null()),
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while smc_ism::Client::connect(&socket).is_err() {
            if Instant::now() > deadline {
                bail!("the daemon did not come up on {}", socket.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Daemon {
            socket,
            state: dir,
            _proc: proc,
        })
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.state);
    }
}

/// Whether a TCP socket listens on `port` (from /proc/net/tcp{,6}; connecting to probe would
/// consume an accept of one-shot servers such as `iperf3 -1`).
pub fn listening(port: u16) -> bool {
    let hex = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3
                    && format!("{} ", &cols[1][cols[1].len() - 5..]) == hex
                    && cols[3] == "0A"
            })
    })
}

/// Waits until something listens on `port`.
pub fn wait_listen(port: u16, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !listening(port) {
        if Instant::now() > deadline {
            bail!("nothing listens on port {port} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
