//! Helpers shared by the integration tests: the harness of `smc-harness` (cgroups, attachments,
//! the daemon, processes; shared with `cargo xtask demo`, `soak` and `bench`) with a test's
//! defaults (binaries next to the test, failures as panics), network namespace pairs, real
//! applications on the data path ([`SmcWorld`]), and the counters. Every guard removes what it
//! created when dropped, also when the test fails.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use anyhow::Result;
use smc_harness::{ip, Attachment, DataPath, GlobalLock};
pub use smc_harness::{log_tail, seqpacket_accepts, unique, Cgroup, Daemon, Proc};

/// Where cgroup v2 is mounted (`/proc/self/mountinfo`); fails the test clearly if it is not.
pub fn cgroup2_root() -> PathBuf {
    smc_cgroup::cgroup2_root().unwrap_or_else(|e| panic!("{e}"))
}
pub const PIN_ROOT: &str = "/sys/fs/bpf/smc";

/// Fails the test with a clear message unless it runs as root with cgroup v2 and BPF.
pub fn require_root() {
    smc_harness::require_root(
        "this test loads eBPF programs and creates cgroups: it must run as root (cargo xtask test)",
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
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

/// Serialises the tests that load programs or read the global counters, across test binaries
/// (and with `cargo xtask bench`).
pub type TestLock = GlobalLock;

pub fn lock() -> TestLock {
    GlobalLock::acquire().unwrap_or_else(|e| panic!("test lock: {e:#}"))
}

/// A cgroup v2 directory `smc-test-<pid>x<n>` for one test; its processes are killed and it is
/// removed on drop.
pub fn test_cgroup() -> Cgroup {
    Cgroup::new(&unique("smc-test-")).unwrap_or_else(|e| panic!("{e:#}"))
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
/// `Cgroup::command` registered first). Only system calls between fork and exec.
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

/// `smc-ctl daemon --socket SOCK --state-dir DIR/state`: a private loopback-ism device for one
/// test (the caller adds options and spawns it).
pub fn daemon_command(sock: &Path, dir: &Path) -> Command {
    smc_harness::daemon_command(&bin("smc-ctl"), sock, dir)
}

/// Starts `smc-ctl daemon` (see [`daemon_command`]), its output appended to `log`, and waits
/// until its socket accepts; fails with the log's tail if it exits first.
pub fn start_daemon(c: Command, sock: &Path, log: &Path) -> Daemon {
    let p = spawn_logged(c, log);
    Daemon::ready(p, sock.to_path_buf(), Some(log)).unwrap_or_else(|e| panic!("{e:#}"))
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

/// Runs `smc-ctl` with arguments, returning its output.
pub fn smc_ctl(args: &[&str]) -> Output {
    smc_harness::smc_ctl_output(&bin("smc-ctl"), args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `smc-ctl attach` of a test's cgroup, detached on drop.
pub struct Attached(pub Attachment);

impl Attached {
    /// Attaches `cg` in `mode`; checks what `smc-ctl attach` says on stderr.
    pub fn new(cg: &Cgroup, mode: &str) -> Attached {
        Attached::with(cg, mode, &[])
    }

    /// [`Attached::new`] with more arguments for `smc-ctl attach` (`["--tcp-records", "off"]`).
    pub fn with(cg: &Cgroup, mode: &str, extra: &[&str]) -> Attached {
        let (a, err) = Attachment::new_with(&bin("smc-ctl"), &cg.path, mode, extra, Duration::ZERO)
            .unwrap_or_else(|e| panic!("{e:#}"));
        // The shortcut's differences from TCP are said at every attach, and only then.
        assert_eq!(
            err.contains("EXPERIMENTAL") && err.contains("SO_RCVLOWAT"),
            mode == "shortcut",
            "attach --mode {mode} said on stderr: {err}"
        );
        Attached(a)
    }
}

/// The eBPF counters (`smc-ctl status --json`).
pub fn counters() -> BTreeMap<String, u64> {
    smc_harness::ebpf_counters(&bin("smc-ctl")).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Difference of two counter snapshots.
pub fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, key: &str) -> u64 {
    after.get(key).copied().unwrap_or(0) - before.get(key).copied().unwrap_or(0)
}

/// Two network namespaces joined by a veth pair: `a` has `10.77.<n>.1`, `b` has `10.77.<n>.2`;
/// both deleted on drop.
pub struct NetnsPair {
    pub a: String,
    pub b: String,
    pub addr_a: String,
    pub addr_b: String,
    _ns: [smc_harness::Netns; 2],
}

impl NetnsPair {
    pub fn new() -> Result<NetnsPair> {
        let tag = unique("");
        let seq: u32 = tag
            .rsplit('x')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let n = (std::process::id() % 200) as u8 + seq as u8 % 50;
        let (a, b) = (format!("smct-a{tag}"), format!("smct-b{tag}"));
        let ns = [smc_harness::Netns::new(&a)?, smc_harness::Netns::new(&b)?];
        let pair = NetnsPair {
            a,
            b,
            addr_a: format!("10.77.{n}.1"),
            addr_b: format!("10.77.{n}.2"),
            _ns: ns,
        };
        let va = format!("smva{}", &tag[tag.len().saturating_sub(8)..]);
        let vb = format!("smvb{}", &tag[tag.len().saturating_sub(8)..]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        ip(&["link", "set", &va, "netns", &pair.a])?;
        ip(&["link", "set", &vb, "netns", &pair.b])?;
        for (ns, dev, addr) in [(&pair.a, &va, &pair.addr_a), (&pair.b, &vb, &pair.addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
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

/// Starts `c` with its stdout piped (read it with [`Proc::read_line`] or
/// [`Proc::wait_output`]) and its stderr ours. Killed on drop.
pub fn spawn_piped(mut c: Command) -> Proc {
    let what = format!("{:?}", c.get_program());
    c.stdout(Stdio::piped()).stderr(Stdio::inherit());
    Proc::spawn(&what, &mut c).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The port of the `READY <port>` line a test server prints first (see [`spawn_piped`]).
pub fn ready_port(p: &mut Proc) -> u16 {
    p.read_ready_port().unwrap_or_else(|e| panic!("{e:#}"))
}

/// Starts `c` as [`spawn_piped`] and reads its `READY <port>` line ([`ready_port`]).
pub fn spawn_ready(c: Command) -> (Proc, u16) {
    let mut p = spawn_piped(c);
    let port = ready_port(&mut p);
    (p, port)
}

/// The value after `prefix` on the next line `p` prints (`PORT 4242`, `LISTENING 4242`,
/// `TUPLE 4242`), or a failure that quotes the line.
pub fn read_after<T: std::str::FromStr>(p: &mut Proc, prefix: &str) -> T {
    let line = p.read_line();
    line.strip_prefix(prefix)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} said {line:?} instead of {prefix}…", p.name()))
}

/// Starts `c` as [`spawn_piped`] and reads the port it listens on from its first line, which
/// starts with `prefix` (`READY `, `PORT `, `LISTENING `).
pub fn spawn_port(c: Command, prefix: &str) -> (Proc, u16) {
    let mut p = spawn_piped(c);
    let port = read_after(&mut p, prefix);
    (p, port)
}

/// The `key=value` fields of each line of `out` that starts with `prefix`.
pub fn line_fields(out: &str, prefix: &str) -> Vec<BTreeMap<String, String>> {
    out.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// The data path library (`SMC_PRELOAD_LIB`, else `libsmc_preload.so` built next to the tests).
pub fn preload_lib() -> PathBuf {
    if let Some(p) = std::env::var_os("SMC_PRELOAD_LIB") {
        return PathBuf::from(p);
    }
    let p = bin_dir().join("libsmc_preload.so");
    assert!(
        p.exists(),
        "{} is missing: build it first (cargo build -p smc-preload, or cargo xtask test)",
        p.display()
    );
    p
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
    if let Some(p) = smc_harness::find_tool(tool) {
        return p;
    }
    panic!(
        "{tool} is not installed: `cargo xtask setup` installs the test tools \
         (or apt-get install -y {package})"
    );
}

/// A TCP port of 127.0.0.1 that was free a moment ago ([`smc_harness::free_port`]).
pub fn free_port() -> u16 {
    smc_harness::free_port().expect("a free port")
}

/// Whether a socket listens on `port` in the network namespace of process `pid` (read from
/// `/proc/<pid>/net/tcp{,6}`: no connection is made, so nothing is counted by the data path).
pub fn is_listening(pid: u32, port: u16) -> bool {
    smc_harness::tcp_listening(&proc_net(pid), port)
}

fn proc_net(pid: u32) -> PathBuf {
    Path::new("/proc").join(pid.to_string()).join("net")
}

/// Waits until `p` listens on `port`; fails at once if it exited (with its log, if any).
pub fn wait_listening(p: &mut Proc, port: u16, timeout: Duration, what: &str, log: Option<&Path>) {
    let net = proc_net(p.id());
    smc_harness::wait_listening(p, &net, port, timeout, what)
        .unwrap_or_else(|e| panic!("{e}{}", log.map(log_tail).unwrap_or_default()));
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
    let what = format!("{:?}", c.get_program());
    smc_harness::log_to(&mut c, log)
        .and_then(|()| Proc::spawn(&what, &mut c))
        .unwrap_or_else(|e| panic!("{e:#}"))
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
    let mut p = Proc::new(
        &what,
        c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}")),
    );
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

/// `smc-ctl attach`, waiting (bounded) while the pinned programs belong to another build of
/// smc-ctl: someone else's cgroup is attached with it, which must never be detached from here.
pub fn attach_waiting(cg: &Cgroup, mode: &str, timeout: Duration) -> Attached {
    attach_waiting_with(cg, mode, &[], timeout)
}

/// [`attach_waiting`] with more arguments for `smc-ctl attach` (`["--tcp-records", "off"]`).
pub fn attach_waiting_with(cg: &Cgroup, mode: &str, extra: &[&str], timeout: Duration) -> Attached {
    let (a, _) = Attachment::new_with(&bin("smc-ctl"), &cg.path, mode, extra, timeout)
        .unwrap_or_else(|e| panic!("{e:#}"));
    Attached(a)
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
    smc_ctl: PathBuf,
    cg: Option<Cgroup>,
    att: Option<Attached>,
    daemon: Option<Daemon>,
    /// The daemon's arguments (for [`SmcWorld::restart_daemon`]).
    dargs: Vec<OsString>,
    _lock: TestLock,
}

impl SmcWorld {
    pub fn new() -> SmcWorld {
        SmcWorld::with_daemon_args(&[])
    }

    /// A world whose daemon gets extra arguments (e.g. `--shelve-after-ms 0`).
    pub fn with_daemon_args(args: &[&str]) -> SmcWorld {
        SmcWorld::with_args(&[], args)
    }

    /// A world whose cgroup is attached with more arguments (`["--tcp-records", "off"]`) and
    /// whose daemon gets `daemon_args`.
    pub fn with_args(attach_args: &[&str], args: &[&str]) -> SmcWorld {
        require_root();
        let lock = lock();
        let cg = test_cgroup();
        let att = attach_waiting_with(&cg, "ism", attach_args, Duration::from_secs(600));
        let dir = Path::new("/run/smc").join(unique("apps-test-"));
        fs::create_dir_all(dir.join("procs")).expect("mkdir procs");
        fs::create_dir_all(dir.join("logs")).expect("mkdir logs");
        let smc_ctl = bin("smc-ctl");
        // The daemon makes each client uid's statistics subdirectory in this world's directory.
        let mut dargs: Vec<OsString> = vec!["--procs-dir".into(), dir.join("procs").into()];
        dargs.extend(args.iter().map(OsString::from));
        let daemon = Daemon::start(&smc_ctl, &dir, &dargs, Some(&dir.join("logs/daemon.log")))
            .unwrap_or_else(|e| panic!("{e:#}"));
        SmcWorld {
            dir,
            sock: daemon.socket.clone(),
            smc_ctl,
            cg: Some(cg),
            att: Some(att),
            daemon: Some(daemon),
            dargs,
            _lock: lock,
        }
    }

    /// Ends this world's daemon with `signal` (`SIGTERM`: an upgrade or a stop; `SIGKILL`: a
    /// crash) and waits until it is gone; [`SmcWorld::start_daemon`] starts the next one.
    pub fn stop_daemon(&mut self, signal: i32) {
        let mut d = self.daemon.take().expect("daemon");
        // SAFETY: the pid of our own live child.
        unsafe { libc::kill(d.pid() as libc::pid_t, signal) };
        d.proc
            .0
            .wait()
            .unwrap_or_else(|e| panic!("wait for the daemon: {e}"));
    }

    /// Starts a daemon again on this world's socket, with the first one's arguments.
    pub fn start_daemon(&mut self) {
        assert!(self.daemon.is_none(), "the daemon runs");
        let daemon = Daemon::start(
            &self.smc_ctl,
            &self.dir,
            &self.dargs,
            Some(&self.dir.join("logs/daemon.log")),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(daemon.socket, self.sock);
        self.daemon = Some(daemon);
    }

    pub fn cgroup(&self) -> &Cgroup {
        self.cg.as_ref().expect("cgroup")
    }

    /// The pid of this world's daemon (e.g. to stop it for a while).
    pub fn daemon_pid(&self) -> u32 {
        self.daemon.as_ref().expect("daemon").pid()
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
        self.data_path(&self.dir.join("procs")).set_env(c);
    }

    fn data_path<'a>(&'a self, procs: &'a Path) -> DataPath<'a> {
        DataPath {
            smc_ctl: &self.smc_ctl,
            socket: &self.sock,
            procs: Some(procs),
            clean_env: true,
        }
    }

    /// `smc-ctl run -- PROGRAM` inside the attached cgroup (arguments to be added).
    pub fn run(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let procs = self.dir.join("procs");
        let dp = self.data_path(&procs);
        self.cgroup().launch::<&str>(&[], Some(&dp), program)
    }

    /// [`SmcWorld::run`] (`smc`), or the plain `program` outside the world: the two sides of a
    /// differential test against TCP.
    pub fn run_or_plain(&self, smc: bool, program: impl AsRef<std::ffi::OsStr>) -> Command {
        if smc {
            self.run(program)
        } else {
            Command::new(program)
        }
    }

    /// `ip netns exec NS smc-ctl run -- PROGRAM` inside the attached cgroup.
    pub fn run_in_netns(&self, ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let procs = self.dir.join("procs");
        let dp = self.data_path(&procs);
        self.cgroup()
            .launch(&["ip", "netns", "exec", ns], Some(&dp), program)
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
        self.cgroup().pids().into_iter().map(|p| p as u32).collect()
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
            cg.kill_all();
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

/// Fallbacks of a snapshot, client and server, for a reason other than `code` (a decline code,
/// e.g. `smc_common::diag::Diag::TimeoutCl.code()`).
pub fn fallbacks_other_than(s: &Snapshot, code: u32) -> u64 {
    s.reasons
        .iter()
        .filter(|(k, _)| **k != code)
        .map(|(_, v)| v)
        .sum()
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
    let mut r = smc_harness::Rng::with_state(seed);
    (0..len)
        .map(|_| {
            let b = (r.next_u64() >> 24) as u8;
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
            proc: Proc::new(name, child),
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
