//! RAII guards for the demo, the soak and the benchmarks: a cgroup (attached or not), the
//! daemon, a process.
//! Everything is stopped and removed on drop, also when the run fails.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// Where cgroup v2 is mounted (from `/proc/self/mountinfo`, see `smc_cgroup`).
pub fn cgroup2_root() -> Result<PathBuf> {
    Ok(smc_cgroup::cgroup2_root()?)
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

/// Prefix of every cgroup (and the bench's network namespace) xtask creates:
/// `smc-xtask-<pid>-<role>`; what a killed run left behind is found by it.
pub const CGROUP_PREFIX: &str = "smc-xtask-";

/// `smc-ctl` with arguments; fails with its stderr.
pub fn smc_ctl(bin: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "smc-ctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A cgroup v2 directory, optionally attached with `smc-ctl attach`. On drop: its processes are
/// killed, it is detached, then removed.
pub struct Cgroup {
    pub path: PathBuf,
    smc_ctl: PathBuf,
    attached: bool,
}

impl Cgroup {
    pub fn new(role: &str, smc_ctl: &Path) -> Result<Cgroup> {
        let path = cgroup2_root()?.join(format!("{CGROUP_PREFIX}{}-{role}", std::process::id()));
        fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(Cgroup {
            path,
            smc_ctl: smc_ctl.to_path_buf(),
            attached: false,
        })
    }

    pub fn attach(&mut self, mode: &str) -> Result<()> {
        let p = self.path.to_string_lossy().into_owned();
        smc_ctl(&self.smc_ctl, &["attach", "--cgroup", &p, "--mode", mode])?;
        self.attached = true;
        Ok(())
    }

    /// Makes `cmd` join this cgroup between fork and exec.
    pub fn enter(&self, cmd: &mut Command) {
        smc_cgroup::join_before_exec(cmd, &self.path);
    }

    /// Kills every process of the cgroup (servers that daemonised or forked included).
    pub fn kill_all(&self) {
        kill_cgroup(&self.path);
    }
}

fn cgroup_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// `cgroup.kill` (Linux ≥ 5.14), SIGKILL per pid otherwise; waits until the cgroup is empty.
fn kill_cgroup(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let pids = cgroup_pids(path);
        if pids.is_empty() {
            return;
        }
        if fs::write(path.join("cgroup.kill"), "1").is_err() {
            for pid in pids {
                // SAFETY: plain syscall; the pid is in our cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn remove_cgroup(path: &Path, smc_ctl: Option<&Path>) {
    kill_cgroup(path);
    if let Some(bin) = smc_ctl {
        if let Err(e) = self::smc_ctl(bin, &["detach", "--cgroup", &path.to_string_lossy()]) {
            eprintln!("warning: {e:#}");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if fs::remove_dir(path).is_ok() || !path.exists() {
            return;
        }
        kill_cgroup(path);
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove {}", path.display());
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        remove_cgroup(&self.path, self.attached.then_some(self.smc_ctl.as_path()));
    }
}

/// Removes what an earlier bench killed by SIGKILL left behind (its pid is gone).
pub fn remove_stale_cgroups(smc_ctl: &Path) {
    let Ok(rd) = cgroup2_root().and_then(|r| Ok(fs::read_dir(r)?)) else {
        return;
    };
    let attached = status_cgroups(smc_ctl);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(CGROUP_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = e.path();
        let is_attached = attached
            .as_ref()
            .is_some_and(|a| a.iter().any(|c| Path::new(c) == path));
        eprintln!(
            "==> removing {} left by an interrupted bench",
            path.display()
        );
        remove_cgroup(&path, is_attached.then_some(smc_ctl));
    }
}

fn status_cgroups(smc_ctl: &Path) -> Option<Vec<String>> {
    let out = self::smc_ctl(smc_ctl, &["status", "--json"]).ok()?;
    let v: serde_json::Value = serde_json::from_str(&out).ok()?;
    Some(
        v["cgroups"]
            .as_array()?
            .iter()
            .filter_map(|c| c["cgroup"].as_str().map(str::to_owned))
            .collect(),
    )
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
