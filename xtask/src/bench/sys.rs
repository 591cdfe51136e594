//! The machinery of the bench: cgroups, attachments, child processes, the loopback-ism daemon and
//! its counters, signals. Every resource is held by a guard that releases it on drop, so an error
//! or an interruption (Ctrl-C) leaves nothing behind.
use std::{
    collections::BTreeMap,
    fs,
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use anyhow::{bail, Context as _, Result};

pub use crate::harness::{cgroup2_root, remove_stale_cgroups, smc_ctl, Cgroup, CGROUP_PREFIX};
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT/SIGTERM/SIGHUP into a flag the waiting loops check, so the guards get to clean up.
pub fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// The lock the integration tests take around everything that loads programs or reads the global
/// counters: the bench takes it too, so neither disturbs the other's counter deltas.
pub struct GlobalLock(#[allow(dead_code)] fs::File);

pub fn lock() -> Result<GlobalLock> {
    use std::os::fd::AsRawFd as _;
    fs::create_dir_all("/run/smc").context("mkdir /run/smc")?;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/run/smc/tests.lock")
        .context("open /run/smc/tests.lock")?;
    // SAFETY: valid fd.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        eprintln!(
            "==> waiting for /run/smc/tests.lock (integration tests or another bench are running)"
        );
        // A blocking flock queues like the tests' own waits (polling with LOCK_NB lost the lock
        // to every blocking waiter on a busy machine); it waits on a helper thread so that
        // SIGINT still ends the wait here.
        let fd = f.as_raw_fd();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: `fd` stays open while this process waits for the answer (on an interrupt
            // the process exits; a lock taken then dies with it).
            let r = unsafe { libc::flock(fd, libc::LOCK_EX) };
            let _ = tx.send(r);
        });
        loop {
            check_interrupted()?;
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(0) => break,
                Ok(_) => bail!("flock /run/smc/tests.lock failed"),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(e) => bail!("flock /run/smc/tests.lock: {e}"),
            }
        }
    }
    Ok(GlobalLock(f))
}

/// The eBPF counters (`smc-ctl status --json`).
pub fn ebpf_counters(smc_ctl: &Path) -> Result<BTreeMap<String, u64>> {
    let out = self::smc_ctl(smc_ctl, &["status", "--json"])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("smc-ctl status --json")?;
    Ok(v["counters"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default())
}

/// A child process, killed (its whole process group) and reaped on drop.
pub struct Proc {
    pub name: String,
    child: Child,
}

impl Proc {
    /// Spawns `cmd` in its own process group, stdin from /dev/null, output to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
        let f = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        cmd.stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f)
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_owned(),
            child,
        })
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (bounded) for the exit; the status must be success.
    pub fn wait(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            check_interrupted()?;
            if let Some(st) = self.child.try_wait()? {
                if !st.success() {
                    bail!("{} exited with {st}", self.name);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {timeout:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn kill(&mut self) {
        let pid = self.child.id() as i32;
        if self.alive() {
            // SAFETY: plain syscalls; the group is the child's own (process_group(0)).
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Runs `cmd` to completion (bounded), returning its stdout; stderr goes to `log`.
pub fn run_capture(name: &str, mut cmd: Command, timeout: Duration, log: &Path) -> Result<String> {
    let f = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(f)
        .process_group(0);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawn {name}: {cmd:?}"))?;
    let mut stdout = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let mut p = Proc {
        name: name.to_owned(),
        child,
    };
    let res = p.wait(timeout);
    p.kill();
    let out = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
    let _ = fs::OpenOptions::new()
        .append(true)
        .open(log)
        .and_then(|mut f| {
            use std::io::Write as _;
            writeln!(f, "---- stdout ----\n{out}")
        });
    res.with_context(|| format!("{name} (log: {})", log.display()))?;
    Ok(out)
}

/// The last lines of a log file, for error messages.
pub fn tail(log: &Path) -> String {
    let s = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(6)..].join(" | ")
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Result<TempDir> {
        let p = std::env::temp_dir().join(format!("smc-bench-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).with_context(|| format!("mkdir {}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The loopback-ism daemon on a private socket.
pub struct Daemon {
    pub socket: PathBuf,
    _proc: Proc,
}

impl Daemon {
    pub fn start(smc_ctl: &Path, dir: &Path) -> Result<Daemon> {
        let socket = dir.join("ism.sock");
        let state = dir.join("ism-state");
        fs::create_dir_all(&state)?;
        let mut cmd = Command::new(smc_ctl);
        cmd.arg("daemon")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(&state)
            // The scale cases hold every connection's two DMBs at once (65 536 connections:
            // 131 072 DMBs in the bench's one cgroup); the default quotas (4096 DMBs per
            // cgroup) would decline most of them with MAX_DMB and measure TCP instead.
            .args(["--max-dmbs", "262144", "--cgroup-max-dmbs", "262144"]);
        let log = dir.join("daemon.log");
        let mut p = Proc::spawn("smc-ctl daemon", cmd, &log)?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while daemon_stats(&socket).is_err() {
            check_interrupted()?;
            if !p.alive() {
                bail!("smc-ctl daemon exited: {}", tail(&log));
            }
            if Instant::now() > deadline {
                bail!(
                    "smc-ctl daemon does not answer on {} after 10 s",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Daemon { socket, _proc: p })
    }

    pub fn stats(&self) -> Result<serde_json::Value> {
        daemon_stats(&self.socket)
    }
}

/// The daemon's counters (`OP_STATS`, through the loopback-ism client) as JSON.
pub fn daemon_stats(socket: &Path) -> Result<serde_json::Value> {
    let stats = smc_ism::Client::connect(socket)
        .and_then(|mut c| c.stats())
        .context("STATS of the ism daemon")?;
    Ok(serde_json::to_value(stats)?)
}

/// Every numeric leaf of a JSON value, keyed by its dotted path.
pub fn flatten(v: &serde_json::Value) -> BTreeMap<String, f64> {
    fn go(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
        match v {
            serde_json::Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.insert(prefix.to_owned(), x);
                }
            }
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    go(&key, v, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    go(&format!("{prefix}[{i}]"), v, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    go("", v, &mut out);
    out
}

/// `after - before` for every key that changed.
pub fn delta_f(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, a)| {
            let d = a - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// UTC now as `YYYYMMDD-HHMMSS` and as RFC 3339.
pub fn timestamp() -> (String, String) {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (hh, mm, ss) = (rem / 3600, rem % 3600 / 60, rem % 60);
    (
        format!("{y:04}{m:02}{d:02}-{hh:02}{mm:02}{ss:02}"),
        format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z"),
    )
}

/// First line of a command's output (tool versions, machine facts); empty when it fails.
pub fn first_line(prog: &str, args: &[&str]) -> String {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let s = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&s)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_owned()
        })
        .unwrap_or_default()
}

/// A private network namespace (`ip netns add`) with `lo` up, deleted on drop. Every process of
/// the bench runs in it, so that its TCP counters (`/proc/PID/net/{snmp,netstat}`) count the
/// bench's traffic and nothing else of the host.
pub struct Netns {
    pub name: String,
    fd: std::os::fd::OwnedFd,
    /// A process parked in the namespace: its `/proc/PID/net` is the namespace's.
    anchor: Option<Proc>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl Netns {
    pub fn new(log_dir: &Path) -> Result<Netns> {
        let name = format!("{CGROUP_PREFIX}{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        let file = fs::File::open(Path::new("/run/netns").join(&name));
        let mut ns = match file {
            Ok(f) => Netns {
                name,
                fd: f.into(),
                anchor: None,
            },
            Err(e) => {
                let _ = ip(&["netns", "del", &name]);
                return Err(e).context("open /run/netns");
            }
        };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        let mut c = Command::new("sleep");
        c.arg("infinity");
        ns.enter(&mut c);
        ns.anchor = Some(Proc::spawn(
            "netns anchor",
            c,
            &log_dir.join("netns-anchor.log"),
        )?);
        Ok(ns)
    }

    /// Makes `cmd` join this namespace between fork and exec.
    pub fn enter(&self, cmd: &mut Command) {
        use std::os::fd::AsRawFd as _;
        let fd = self.fd.as_raw_fd();
        // SAFETY: setns is async-signal-safe; the fd stays open until exec (then O_CLOEXEC).
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// `/proc/<pid>/net` of a process inside the namespace.
    pub fn proc_net(&self) -> PathBuf {
        let pid = self.anchor.as_ref().map(|p| p.child.id()).unwrap_or(0);
        Path::new("/proc").join(pid.to_string()).join("net")
    }

    /// The namespace's SNMP counters: `Tcp.OutSegs`, `TcpExt.TCPOrigDataSent`, `IpExt.OutOctets`, …
    pub fn counters(&self) -> Result<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        for f in ["snmp", "netstat"] {
            let path = self.proc_net().join(f);
            let s =
                fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
            let lines: Vec<&str> = s.lines().collect();
            for pair in lines.chunks(2) {
                let [names, values] = pair else { continue };
                let (Some((p1, n)), Some((p2, v))) =
                    (names.split_once(':'), values.split_once(':'))
                else {
                    continue;
                };
                if p1 != p2 {
                    continue;
                }
                for (k, v) in n.split_whitespace().zip(v.split_whitespace()) {
                    if let Ok(x) = v.parse::<f64>() {
                        out.insert(format!("{p1}.{k}"), x);
                    }
                }
            }
        }
        Ok(out)
    }

    /// Is something listening on `port` in the namespace? Reads /proc, so no connection is made.
    pub fn listening(&self, port: u16) -> bool {
        let want = format!(":{port:04X}");
        ["tcp", "tcp6"].iter().any(|f| {
            fs::read_to_string(self.proc_net().join(f)).is_ok_and(|s| {
                s.lines().skip(1).any(|l| {
                    let mut it = l.split_whitespace();
                    let local = it.nth(1).unwrap_or("");
                    let state = it.nth(1).unwrap_or("");
                    state == "0A" && local.ends_with(&want)
                })
            })
        })
    }

    /// Waits until `server` listens on `port`.
    pub fn wait_listening(&self, server: &mut Proc, port: u16, log: &Path) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            check_interrupted()?;
            if self.listening(port) {
                return Ok(());
            }
            if !server.alive() {
                bail!(
                    "{} exited before listening on {port}: {}",
                    server.name,
                    tail(log)
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "{} does not listen on {port} after 15 s: {}",
                    server.name,
                    tail(log)
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        drop(self.anchor.take());
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Deletes the namespace of an earlier bench that was killed (its pid is gone).
pub fn remove_stale_netns() {
    let Ok(rd) = fs::read_dir("/run/netns") else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            eprintln!("==> removing network namespace {name} left by an interrupted bench");
            let _ = ip(&["netns", "del", &name]);
        }
    }
}

/// Fields of the data path's per-process statistics file (`smc-preload/src/stats.rs`, layout
/// version 1: little-endian u64 at these offsets, then 16 `{code, count}` fallback-reason slots).
const PRELOAD_FIELDS: [(&str, usize); 18] = [
    ("smcd_client", 24),
    ("smcd_server", 32),
    ("fallback_client", 40),
    ("fallback_server", 48),
    ("handshake_errors", 56),
    ("rx_bytes", 64),
    ("tx_bytes", 72),
    ("rx_calls", 80),
    ("tx_calls", 88),
    ("rx_buffer_full", 96),
    ("tx_buffer_full", 104),
    ("special_sendfile", 120),
    ("special_splice", 128),
    ("special_oob", 136),
    ("pending_connects", 144),
    ("doorbells_sent", 152),
    ("doorbells_received", 160),
    ("closed_conns", 112),
];
const PRELOAD_MAGIC: u64 = 0x534d_4350_5354_4154;

fn parse_preload(b: &[u8]) -> Option<BTreeMap<String, f64>> {
    let at = |o: usize| {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
    };
    if at(0)? != PRELOAD_MAGIC || at(8)? != 1 {
        return None;
    }
    let mut m: BTreeMap<String, f64> = PRELOAD_FIELDS
        .iter()
        .map(|(k, o)| (k.to_string(), at(*o).unwrap_or(0) as f64))
        .collect();
    for slot in 0..16 {
        let (code, count) = (at(168 + 16 * slot)?, at(176 + 16 * slot)?);
        if code != 0 {
            *m.entry(format!("fallback_reason_{code:#010x}"))
                .or_default() += count as f64;
        }
    }
    Some(m)
}

/// Reads the per-process statistics files the data path keeps in `SMC_PROCS_DIR` while a run
/// goes on (a process removes its file when it exits, so the last sample before the exit is what
/// is left of it), and sums them per field at the end.
pub struct PreloadSampler {
    stop: std::sync::Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<BTreeMap<String, BTreeMap<String, f64>>>>,
    dir: PathBuf,
}

fn sample_dir(dir: &Path, seen: &mut BTreeMap<String, BTreeMap<String, f64>>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        if let Some(m) = fs::read(e.path()).ok().and_then(|b| parse_preload(&b)) {
            seen.insert(e.file_name().to_string_lossy().into_owned(), m);
        }
    }
}

impl PreloadSampler {
    pub fn start(dir: &Path) -> PreloadSampler {
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (s, d) = (stop.clone(), dir.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut seen = BTreeMap::new();
            while !s.load(Ordering::Relaxed) {
                sample_dir(&d, &mut seen);
                std::thread::sleep(Duration::from_millis(20));
            }
            seen
        });
        PreloadSampler {
            stop,
            thread: Some(thread),
            dir: dir.to_path_buf(),
        }
    }

    /// Stops sampling, reads once more (what killed processes left) and returns the sums over
    /// the processes, with `processes` = how many processes had a file.
    pub fn finish(mut self) -> BTreeMap<String, f64> {
        self.stop.store(true, Ordering::Relaxed);
        let mut seen = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        sample_dir(&self.dir, &mut seen);
        let mut sum: BTreeMap<String, f64> = BTreeMap::new();
        for m in seen.values() {
            for (k, v) in m {
                *sum.entry(k.clone()).or_default() += v;
            }
        }
        if !seen.is_empty() {
            sum.insert("processes".into(), seen.len() as f64);
        }
        sum
    }
}

impl Drop for PreloadSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `kernel.bpf_stats_enabled` on for the bench's lifetime (the programs' `run_time_ns` and
/// `run_cnt`), the previous value restored on drop.
pub struct BpfStats {
    old: Option<String>,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub fn enable() -> BpfStats {
        let old = fs::read_to_string(BPF_STATS).ok();
        if fs::write(BPF_STATS, "1").is_err() {
            eprintln!("warning: cannot enable {BPF_STATS}: no eBPF run times in the results");
        }
        BpfStats { old }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(o) = &self.old {
            let _ = fs::write(BPF_STATS, o.trim());
        }
    }
}

/// Run time and run count of every loaded program named `smc_*` (`bpftool prog show --json`),
/// as `prog.<name>.run_time_ns` / `prog.<name>.run_cnt`, summed over programs of one name.
pub fn bpf_prog_stats() -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    let Ok(out) = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output()
    else {
        return m;
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return m;
    };
    for p in v.as_array().into_iter().flatten() {
        let Some(name) = p["name"].as_str().filter(|n| n.starts_with("smc_")) else {
            continue;
        };
        for k in ["run_time_ns", "run_cnt"] {
            let x = p[k].as_f64().unwrap_or(0.0);
            *m.entry(format!("prog.{name}.{k}")).or_insert(0.0) += x;
        }
    }
    m
}
