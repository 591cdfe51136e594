//! Helpers shared by the integration tests: cgroups, attach guards, network namespaces, processes
//! started inside a cgroup or namespace, and the counters. Every guard removes what it created
//! when dropped, also when the test fails.
use std::{
    collections::BTreeMap,
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

pub const CGROUP2_ROOT: &str = "/sys/fs/cgroup/unified";
pub const PIN_ROOT: &str = "/sys/fs/bpf/smc";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A unique short name for this test process: `<prefix><pid>x<n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Fails the test with a clear message unless it runs as root with cgroup v2 and BPF.
pub fn require_root() {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!("this test loads eBPF programs and creates cgroups: it must run as root (cargo xtask test)");
    }
    if !Path::new(CGROUP2_ROOT).join("cgroup.procs").exists() {
        panic!("cgroup v2 is not mounted at {CGROUP2_ROOT}");
    }
}

/// Directory of the binaries built with the tests (`target/<profile>`).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test>-<hash>
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// Path of a workspace binary built into the same target directory as the tests.
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo xtask test builds smc-ctl, smc-preload and the test programs)",
        p.display()
    );
    p
}

/// Serialises the tests that load programs or read the global counters, across test binaries.
pub struct TestLock(#[allow(dead_code)] fs::File);

pub fn lock() -> TestLock {
    use std::os::fd::AsRawFd as _;
    fs::create_dir_all("/run/smc").expect("mkdir /run/smc");
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/smc/tests.lock")
        .expect("open test lock");
    // SAFETY: valid fd.
    assert_eq!(
        unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) },
        0,
        "flock"
    );
    TestLock(f)
}

/// A cgroup v2 directory created for one test; its processes are killed and it is removed on drop.
pub struct Cgroup {
    pub path: PathBuf,
}

impl Cgroup {
    pub fn new() -> Cgroup {
        let path = Path::new(CGROUP2_ROOT).join(unique("smc-test-"));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path }
    }

    /// A command whose process joins this cgroup before it executes.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        let procs = self.path.join("cgroup.procs");
        // SAFETY: only async-signal-safe calls between fork and exec (open/write/close).
        unsafe {
            c.pre_exec(move || join_cgroup(&procs));
        }
        c
    }
}

fn join_cgroup(procs: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let mut p = procs.as_os_str().as_bytes().to_vec();
    p.push(0);
    // SAFETY: NUL-terminated path; plain syscalls.
    unsafe {
        let fd = libc::open(p.as_ptr().cast(), libc::O_WRONLY);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
        libc::close(fd);
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl Default for Cgroup {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = fs::write(self.path.join("cgroup.kill"), "1");
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if fs::remove_dir(&self.path).is_ok() || !self.path.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("warning: could not remove {}", self.path.display());
    }
}

/// Runs `smc-ctl` with arguments, returning its output.
pub fn smc_ctl(args: &[&str]) -> Output {
    Command::new(bin("smc-ctl"))
        .args(args)
        .output()
        .expect("run smc-ctl")
}

/// `smc-ctl attach` on drop-detached terms.
pub struct Attached {
    pub cgroup: PathBuf,
}

impl Attached {
    pub fn new(cg: &Cgroup, mode: &str) -> Attached {
        let out = smc_ctl(&[
            "attach",
            "--cgroup",
            cg.path.to_str().unwrap(),
            "--mode",
            mode,
        ]);
        assert!(
            out.status.success(),
            "smc-ctl attach failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Attached {
            cgroup: cg.path.clone(),
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = smc_ctl(&["detach", "--cgroup", self.cgroup.to_str().unwrap()]);
    }
}

/// The eBPF counters (`smc-ctl status --json`).
pub fn counters() -> BTreeMap<String, u64> {
    let out = smc_ctl(&["status", "--json"]);
    assert!(
        out.status.success(),
        "smc-ctl status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status json");
    v["counters"]
        .as_object()
        .expect("counters")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
        .collect()
}

/// Difference of two counter snapshots.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, key: &str) -> u64 {
    after.get(key).copied().unwrap_or(0) - before.get(key).copied().unwrap_or(0)
}

/// Two network namespaces joined by a veth pair: `a` has `10.77.<n>.1`, `b` has `10.77.<n>.2`.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub addr_a: String,
    pub addr_b: String,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("run ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {:?}: {}", args, String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl NetnsPair {
    pub fn new() -> Result<NetnsPair> {
        let tag = unique("");
        let n = (std::process::id() % 200) as u8 + SEQ.fetch_add(1, Ordering::Relaxed) as u8 % 50;
        let pair = NetnsPair {
            a: format!("smct-a{tag}"),
            b: format!("smct-b{tag}"),
            addr_a: format!("10.77.{n}.1"),
            addr_b: format!("10.77.{n}.2"),
        };
        let va = format!("smva{}", &tag[tag.len().saturating_sub(8)..]);
        let vb = format!("smvb{}", &tag[tag.len().saturating_sub(8)..]);
        ip(&["netns", "add", &pair.a])?;
        ip(&["netns", "add", &pair.b])?;
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &pair.a])?;
        ip(&["link", "set", &vb, "netns", &pair.b])?;
        for (ns, dev, addr) in [(&pair.a, &va, &pair.addr_a), (&pair.b, &vb, &pair.addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(pair)
    }

    /// A command run inside namespace `ns` (optionally also inside a cgroup).
    pub fn command(ns: &str, cg: Option<&Cgroup>, program: &Path) -> Command {
        let mut c = match cg {
            Some(cg) => cg.command("ip"),
            None => Command::new("ip"),
        };
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for NetnsPair {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Proc {
    pub fn spawn(mut c: Command) -> Proc {
        Proc(
            c.stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn"),
        )
    }

    /// Waits for exit (bounded) and returns stdout.
    pub fn wait_output(mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait()? {
                let mut s = String::new();
                use std::io::Read as _;
                self.0.stdout.take().map(|mut o| o.read_to_string(&mut s));
                if !status.success() {
                    return Err(anyhow!("process failed: {status}; stdout: {s}"));
                }
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("process did not finish within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads the first line of stdout (e.g. "listening on PORT").
    pub fn read_line(&mut self) -> String {
        use std::io::Read as _;
        let out = self.0.stdout.as_mut().expect("piped stdout");
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        while out.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {
            line.push(b[0]);
        }
        String::from_utf8_lossy(&line).into_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
