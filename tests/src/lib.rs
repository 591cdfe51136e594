//! Helpers shared by the integration tests: cgroups, attach guards, network namespaces, processes
//! started inside a cgroup or namespace, and the counters. Every guard removes what it created
//! when dropped, also when the test fails.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

/// Where cgroup v2 is mounted (`/proc/self/mountinfo`); fails the test clearly if it is not.
pub fn cgroup2_root() -> PathBuf {
    smc_cgroup::cgroup2_root().unwrap_or_else(|e| panic!("{e}"))
}
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
    let root = cgroup2_root();
    if !root.join("cgroup.procs").exists() {
        panic!("cgroup v2 is not usable at {}", root.display());
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
    assert_eq!(
        // SAFETY: `f` is an open file we own for the call; flock only takes a lock on it.
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
        let path = cgroup2_root().join(unique("smc-test-"));
        fs::create_dir(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        Cgroup { path }
    }

    /// A command whose process joins this cgroup before it executes.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        smc_cgroup::join_before_exec(&mut c, &self.path);
        c
    }
}

/// uid and gid of `nobody`.
pub fn nobody() -> (u32, u32) {
    // SAFETY: NUL-terminated name; the result is read at once, before any other getpw* call.
    unsafe {
        let p = libc::getpwnam(c"nobody".as_ptr());
        assert!(!p.is_null(), "no user `nobody` on this host");
        ((*p).pw_uid, (*p).pw_gid)
    }
}

/// Runs `c` as `uid`:`gid` without supplementary groups (after the cgroup join that
/// `Cgroup::command` registered first).
pub fn as_user(c: &mut Command, (uid, gid): (u32, u32)) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: only async-signal-safe system calls between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(gid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
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

/// `smc-ctl daemon --socket SOCK --state-dir DIR/state`: a private loopback-ism device for one
/// test (the caller adds options and spawns it).
pub fn daemon_command(sock: &Path, dir: &Path) -> Command {
    let mut c = Command::new(bin("smc-ctl"));
    c.args(["daemon", "--socket"])
        .arg(sock)
        .arg("--state-dir")
        .arg(dir.join("state"));
    c
}

/// Makes `c` (a `python3`) serve `root` over HTTP on `addr:port` (`python3 -m http.server`).
pub fn http_server_args(c: &mut Command, addr: &str, port: u16, root: &Path) {
    c.args([
        "-m",
        "http.server",
        &port.to_string(),
        "--bind",
        addr,
        "--directory",
    ])
    .arg(root);
}

/// `smc-ctl attach --cgroup CG --mode MODE`.
fn attach(cg: &Cgroup, mode: &str) -> Output {
    smc_ctl(&[
        "attach",
        "--cgroup",
        cg.path.to_str().unwrap(),
        "--mode",
        mode,
    ])
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
        let out = attach(cg, mode);
        assert!(
            out.status.success(),
            "smc-ctl attach failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The shortcut's differences from TCP are said at every attach, and only then.
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            err.contains("EXPERIMENTAL") && err.contains("SO_RCVLOWAT"),
            mode == "shortcut",
            "attach --mode {mode} said on stderr: {err}"
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

// ────────────────────────────────────────────────────────────────────────────────────────────
// Real applications on the data path (`apps_smc.rs`, `clc_capture.rs`): a world with its own
// attached cgroup and loopback-ism daemon, programs started under `smc-ctl run`, the data
// path's per-process statistics, tools looked up with a clear message, bounded waits.
// ────────────────────────────────────────────────────────────────────────────────────────────

pub use smc_stats::Snapshot;

/// The executable `tool` (on `PATH` or in the usual system directories), or a test failure that
/// says how to install it.
pub fn require_tool(tool: &str, package: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(
        [
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/sbin",
            "/usr/bin",
            "/sbin",
            "/bin",
        ]
        .map(PathBuf::from),
    );
    for d in dirs {
        let p = d.join(tool);
        if fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
            return p;
        }
    }
    panic!(
        "{tool} is not installed: `cargo xtask setup` installs the test tools \
         (or apt-get install -y {package})"
    );
}

/// A TCP port of 127.0.0.1 that was free a moment ago (bound to 0 and released), for a server
/// that must be told its port (never a default port: packaged services may run on those).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind 127.0.0.1:0")
        .port()
}

/// Whether a socket listens on `port` in the network namespace of process `pid` (read from
/// `/proc/<pid>/net/tcp{,6}`: no connection is made, so nothing is counted by the data path).
pub fn is_listening(pid: u32, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        fs::read_to_string(format!("/proc/{pid}/net/{f}"))
            .map(|t| {
                t.lines().skip(1).any(|l| {
                    let c: Vec<&str> = l.split_whitespace().collect();
                    c.len() > 3 && c[1].ends_with(&want) && c[3] == "0A"
                })
            })
            .unwrap_or(false)
    })
}

/// Waits until `p` listens on `port`; fails at once if it exited (with its log, if any).
pub fn wait_listening(p: &mut Proc, port: u16, timeout: Duration, what: &str, log: Option<&Path>) {
    let t = Instant::now();
    loop {
        if let Ok(Some(st)) = p.0.try_wait() {
            panic!(
                "{what} exited ({st}) before listening on port {port}{}",
                log.map(log_tail).unwrap_or_default()
            );
        }
        if is_listening(p.0.id(), port) {
            return;
        }
        if t.elapsed() > timeout {
            panic!(
                "{what} does not listen on port {port} after {timeout:?}{}",
                log.map(log_tail).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The last lines of a log file, for failure messages.
pub fn log_tail(path: &Path) -> String {
    let t = fs::read(path).unwrap_or_default();
    let t = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = t.lines().collect();
    let from = lines.len().saturating_sub(30);
    format!(
        "\n--- last lines of {} ---\n{}",
        path.display(),
        lines[from..].join("\n")
    )
}

/// Polls `cond` every 10 ms until it holds; fails with `what` after `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        if t.elapsed() > timeout {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts `c` with stdout and stderr appended to `log` (a server whose output nobody reads must
/// not block on a full pipe). Killed on drop.
pub fn spawn_logged(mut c: Command, log: &Path) -> Proc {
    let f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("open {}: {e}", log.display()));
    let f2 = f.try_clone().expect("dup log fd");
    Proc(
        c.stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?}: {e}", c.get_program())),
    )
}

/// A finished program: its pid (the key of its statistics file), status and output.
pub struct Finished {
    pub what: String,
    pub pid: u32,
    pub status: std::process::ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Finished {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Fails the test unless the program exited with status 0.
    pub fn ok(self) -> Finished {
        assert!(
            self.status.success(),
            "{} failed ({}):\nstdout: {}\nstderr: {}",
            self.what,
            self.status,
            String::from_utf8_lossy(&self.stdout[..self.stdout.len().min(4000)]),
            self.stderr
        );
        self
    }
}

/// Runs `c` to its end (killed after `timeout`), stdout and stderr through files in `dir` (no
/// pipe can fill up), stdin from `stdin` or /dev/null.
pub fn run_to_end(
    mut c: Command,
    dir: &Path,
    stdin: Option<fs::File>,
    timeout: Duration,
) -> Finished {
    let what = format!(
        "{:?} {:?}",
        c.get_program(),
        c.get_args().collect::<Vec<_>>()
    );
    let name = unique("run-");
    let (out, err) = (
        dir.join(format!("{name}.out")),
        dir.join(format!("{name}.err")),
    );
    let fo = fs::File::create(&out).expect("create stdout file");
    let fe = fs::File::create(&err).expect("create stderr file");
    c.stdout(fo).stderr(fe);
    match stdin {
        Some(f) => c.stdin(f),
        None => c.stdin(Stdio::null()),
    };
    let mut p = Proc(c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}")));
    let pid = p.0.id();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = p.0.try_wait().expect("wait") {
            break st;
        }
        if t.elapsed() > timeout {
            drop(p);
            panic!("{what} did not finish within {timeout:?}{}", log_tail(&err));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let f = Finished {
        what,
        pid,
        status,
        stdout: fs::read(&out).unwrap_or_default(),
        stderr: fs::read_to_string(&err).unwrap_or_default(),
    };
    let _ = fs::remove_file(out);
    let _ = fs::remove_file(err);
    f
}

/// Whether a `SOCK_SEQPACKET` Unix socket at `path` accepts connections (the daemon listens).
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
    // SAFETY: plain syscalls on our own fd.
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

/// `smc-ctl attach`, waiting (bounded) while the pinned programs belong to another build of
/// smc-ctl: someone else's cgroup is attached with it, which must never be detached from here.
pub fn attach_waiting(cg: &Cgroup, mode: &str, timeout: Duration) -> Attached {
    let t = Instant::now();
    loop {
        let out = attach(cg, mode);
        if out.status.success() {
            return Attached {
                cgroup: cg.path.clone(),
            };
        }
        let err = String::from_utf8_lossy(&out.stderr);
        if !err.contains("another build") || t.elapsed() > timeout {
            panic!("smc-ctl attach failed: {err}");
        }
        eprintln!("smc-ctl attach: another build holds the programs; waiting: {err}");
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// One test's world for real applications: the shared test lock, an ism-attached cgroup, a
/// private loopback-ism daemon and a private statistics directory. Programs started with
/// [`SmcWorld::run`] run as `smc-ctl run -- PROGRAM` inside the cgroup, find the daemon through
/// `SMC_CTL_SOCK` and keep their statistics file after exit (`SMC_STATS_KEEP=1`) so that each
/// program's own figures can be checked. On drop: every process of the cgroup is killed, the
/// daemon stopped, the cgroup detached and removed, the directory removed (kept when the test
/// failed, for its logs).
pub struct SmcWorld {
    pub dir: PathBuf,
    pub sock: PathBuf,
    cg: Option<Cgroup>,
    att: Option<Attached>,
    daemon: Option<Proc>,
    _lock: TestLock,
}

impl SmcWorld {
    pub fn new() -> SmcWorld {
        SmcWorld::with_daemon_args(&[])
    }

    /// A world whose daemon gets extra arguments (e.g. `--shelve-after-ms 0`).
    pub fn with_daemon_args(args: &[&str]) -> SmcWorld {
        require_root();
        let lock = lock();
        let cg = Cgroup::new();
        let att = attach_waiting(&cg, "ism", Duration::from_secs(600));
        let dir = Path::new("/run/smc").join(unique("apps-test-"));
        fs::create_dir_all(dir.join("procs")).expect("mkdir procs");
        fs::create_dir_all(dir.join("logs")).expect("mkdir logs");
        let sock = dir.join("ctl.sock");
        let mut c = daemon_command(&sock, &dir);
        // The daemon makes each client uid's statistics subdirectory in this world's directory.
        c.arg("--procs-dir").arg(dir.join("procs"));
        c.args(args);
        let log = dir.join("logs/daemon.log");
        let mut daemon = spawn_logged(c, &log);
        let t = Instant::now();
        while !seqpacket_accepts(&sock) {
            if let Ok(Some(st)) = daemon.0.try_wait() {
                panic!("smc-ctl daemon exited ({st}){}", log_tail(&log));
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "smc-ctl daemon does not accept on {} after 10 s{}",
                sock.display(),
                log_tail(&log)
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        SmcWorld {
            dir,
            sock,
            cg: Some(cg),
            att: Some(att),
            daemon: Some(daemon),
            _lock: lock,
        }
    }

    pub fn cgroup(&self) -> &Cgroup {
        self.cg.as_ref().expect("cgroup")
    }

    /// The pid of this world's daemon (e.g. to stop it for a while).
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon").0.id()
    }

    /// A directory for this test's files (created).
    pub fn subdir(&self, name: &str) -> PathBuf {
        let d = self.dir.join(name);
        fs::create_dir_all(&d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
        d
    }

    /// The environment of the data path: this world's daemon and statistics directory, the
    /// library's defaults otherwise (knobs inherited from the caller's environment are dropped,
    /// except `SMC_PRELOAD_LIB` and `SMC_DEBUG`).
    pub fn env(&self, c: &mut Command) {
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("SMC_") && k != "SMC_PRELOAD_LIB" && k != "SMC_DEBUG" {
                c.env_remove(k.as_ref());
            }
        }
        c.env("SMC_CTL_SOCK", &self.sock)
            .env("SMC_PROCS_DIR", self.dir.join("procs"))
            .env("SMC_STATS_KEEP", "1")
            .env_remove("LD_PRELOAD");
    }

    /// `smc-ctl run -- PROGRAM` inside the attached cgroup (arguments to be added).
    pub fn run(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.cgroup().command(bin("smc-ctl"));
        c.arg("run").arg("--").arg(program);
        self.env(&mut c);
        c
    }

    /// `ip netns exec NS smc-ctl run -- PROGRAM` inside the attached cgroup.
    pub fn run_in_netns(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = NetnsPair::command(ns, Some(self.cgroup()), &bin("smc-ctl"));
        c.arg("run").arg("--").arg(program);
        self.env(&mut c);
        c
    }

    /// Every statistics file of this world by name (`<pid>`, or an `exited-` aggregate, as
    /// `uid-<n>/exited-<id>` in a uid's subdirectory), each directory read under its lock (as
    /// `smc-ctl stats` does) so that a file being folded is never seen twice or missed.
    pub fn stats_files(&self) -> BTreeMap<String, Snapshot> {
        use smc_stats::{StatsDir, READER_LOCK_WAIT};
        let mut warnings = Vec::new();
        let dirs = StatsDir::tree(&self.dir.join("procs"), &mut warnings).expect("read procs dir");
        assert!(
            warnings.is_empty(),
            "statistics directories refused: {warnings:?}"
        );
        let mut m = BTreeMap::new();
        for (i, d) in dirs.iter().enumerate() {
            let _lock = d
                .lock(READER_LOCK_WAIT * 20)
                .unwrap_or_else(|e| panic!("lock of {}: {e}", d.path().display()));
            for name in d.names() {
                if name.starts_with('.') {
                    continue;
                }
                if let Ok((_, s)) = d.read_snapshot(&name) {
                    let key = if i > 0 && name.parse::<u32>().is_err() {
                        let sub = d.path().file_name().unwrap_or_default().to_string_lossy();
                        format!("{sub}/{name}")
                    } else {
                        name
                    };
                    m.insert(key, s);
                }
            }
        }
        m
    }

    /// The sum over every process (and aggregate) of this world.
    pub fn stats_sum(&self) -> Snapshot {
        let mut sum = Snapshot::default();
        for s in self.stats_files().values() {
            sum.add(s);
        }
        sum
    }

    /// The figures of process `pid` (it must have made a TCP decision under the library).
    pub fn stats_of(&self, pid: u32, what: &str) -> Snapshot {
        let files = self.stats_files();
        files.get(&pid.to_string()).cloned().unwrap_or_else(|| {
            panic!(
                "{what} (pid {pid}) left no statistics file: it did not run under the data path \
                 (files: {:?})",
                files.keys().collect::<Vec<_>>()
            )
        })
    }

    /// Waits until `pred` holds for the figures `get` reads (e.g. until a server has closed its
    /// connections); fails with the last figures.
    pub fn wait_stats(
        &self,
        timeout: Duration,
        what: &str,
        get: impl Fn(&SmcWorld) -> Snapshot,
        pred: impl Fn(&Snapshot) -> bool,
    ) -> Snapshot {
        let t = Instant::now();
        loop {
            let s = get(self);
            if pred(&s) {
                return s;
            }
            if t.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {what}; figures: {}",
                    brief(&s)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `smc-ctl stats json -a` over this world's daemon and statistics directory.
    pub fn stats_json(&self) -> serde_json::Value {
        let out = Command::new(bin("smc-ctl"))
            .args(["stats", "json", "-a", "--socket"])
            .arg(&self.sock)
            .arg("--procs-dir")
            .arg(self.dir.join("procs"))
            .arg("--baseline")
            .arg(self.dir.join("baseline.json"))
            .output()
            .expect("run smc-ctl stats json");
        assert!(
            out.status.success(),
            "smc-ctl stats json: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("smc-ctl stats json output")
    }

    /// Waits until this world's daemon holds no DMB any more (every SMC-D connection's shared
    /// memory was released), as `smc-ctl stats json` reports it (`daemon.figures.live_dmbs`).
    /// Call it last: `smc-ctl stats` may fold the files of exited processes.
    pub fn wait_no_live_dmbs(&self, timeout: Duration) {
        let t = Instant::now();
        loop {
            let v = self.stats_json();
            assert_eq!(v["daemon"]["running"], true, "daemon: {}", v["daemon"]);
            let live = v["daemon"]["figures"]["live_dmbs"]
                .as_u64()
                .unwrap_or_else(|| panic!("no daemon.figures.live_dmbs: {}", v["daemon"]));
            if live == 0 {
                return;
            }
            if t.elapsed() > timeout {
                panic!(
                    "the daemon still holds {live} DMBs after {timeout:?}: {}",
                    v["daemon"]["figures"]
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The pids of the processes of this world's cgroup that are still running.
    pub fn live_pids(&self) -> Vec<u32> {
        let cg = self.cgroup().path.join("cgroup.procs");
        fs::read_to_string(cg)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Default for SmcWorld {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for SmcWorld {
    fn drop(&mut self) {
        if let Some(cg) = &self.cg {
            // Every process of the test first (servers, workers, stragglers), then the daemon,
            // then the detach while the cgroup still exists, then the cgroup.
            let _ = fs::write(cg.path.join("cgroup.kill"), "1");
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5)
                && !fs::read_to_string(cg.path.join("cgroup.procs"))
                    .unwrap_or_default()
                    .trim()
                    .is_empty()
            {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.daemon.take();
        self.att.take();
        self.cg.take();
        if std::thread::panicking() || std::env::var_os("SMC_KEEP_TEST_DIR").is_some() {
            eprintln!("test files kept in {}", self.dir.display());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// The non-zero figures of a snapshot, one line (for assertion messages).
pub fn brief(s: &Snapshot) -> String {
    let mut out: Vec<String> = s
        .counters
        .iter()
        .filter(|(_, v)| **v != 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for (code, n) in &s.reasons {
        out.push(format!("reason[{code:#010x}]={n}"));
    }
    format!("{{{}}}", out.join(" "))
}

/// SMC-D connections of a snapshot that are not closed yet.
pub fn smcd_open(s: &Snapshot) -> u64 {
    (s.get("smcd_client") + s.get("smcd_server")).saturating_sub(s.get("closed_conns"))
}

/// Fallbacks of a snapshot, client and server.
pub fn fallbacks(s: &Snapshot) -> u64 {
    s.get("fallback_client") + s.get("fallback_server")
}

/// Hex SHA-256.
pub fn sha256_hex(b: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Deterministic pseudo-random bytes (xorshift), `printable` limits them to `[0-9a-z]`.
pub fn pseudo_random(len: usize, seed: u64, printable: bool) -> Vec<u8> {
    const ALNUM: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let b = (s >> 24) as u8;
            if printable {
                ALNUM[b as usize % ALNUM.len()]
            } else {
                b
            }
        })
        .collect()
}

/// A long-running program driven line by line: stdin piped (the test says when to stop),
/// stdout and stderr into files of a directory (read as they grow; no pipe can fill up).
/// Killed on drop.
pub struct Driven {
    pub proc: Proc,
    pub what: String,
    pub out: PathBuf,
    pub err: PathBuf,
}

impl Driven {
    pub fn spawn(mut c: Command, dir: &Path, name: &str) -> Driven {
        let (out, err) = (
            dir.join(format!("{name}.out")),
            dir.join(format!("{name}.err")),
        );
        let fo = fs::File::create(&out).expect("create stdout file");
        let fe = fs::File::create(&err).expect("create stderr file");
        let child = c
            .stdin(Stdio::piped())
            .stdout(fo)
            .stderr(fe)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Driven {
            proc: Proc(child),
            what: name.to_string(),
            out,
            err,
        }
    }

    /// The complete lines written to stdout so far.
    pub fn lines(&self) -> Vec<String> {
        let t = fs::read(&self.out).unwrap_or_default();
        let t = String::from_utf8_lossy(&t);
        let complete = t.rfind('\n').map_or("", |i| &t[..i]);
        complete.lines().map(str::to_string).collect()
    }

    /// What it wrote to stderr so far.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&fs::read(&self.err).unwrap_or_default()).into_owned()
    }

    /// Waits (bounded) until `cond` holds for stdout's lines; fails at once if the program
    /// exited meanwhile (with its status: a signal is a crash), or after `timeout`.
    pub fn wait_for<T>(
        &mut self,
        timeout: Duration,
        what: &str,
        mut cond: impl FnMut(&[String]) -> Option<T>,
    ) -> T {
        let t = Instant::now();
        loop {
            if let Some(v) = cond(&self.lines()) {
                return v;
            }
            if let Ok(Some(st)) = self.proc.0.try_wait() {
                if let Some(v) = cond(&self.lines()) {
                    return v;
                }
                panic!(
                    "{} exited ({st}) while waiting for {what}{}{}",
                    self.what,
                    log_tail(&self.out),
                    log_tail(&self.err)
                );
            }
            if t.elapsed() > timeout {
                panic!(
                    "{}: timed out after {timeout:?} waiting for {what}{}{}",
                    self.what,
                    log_tail(&self.out),
                    log_tail(&self.err)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(None))
    }

    /// Writes one line to its stdin.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write as _;
        let stdin = self.proc.0.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "{line}").unwrap_or_else(|e| panic!("tell {}: {e}", self.what));
        stdin.flush().expect("flush stdin");
    }

    /// Waits (bounded) for its exit; its status.
    pub fn finish(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = self.proc.0.try_wait().expect("wait") {
                return st;
            }
            if t.elapsed() > timeout {
                panic!(
                    "{} did not exit within {timeout:?}{}{}",
                    self.what,
                    log_tail(&self.out),
                    log_tail(&self.err)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
