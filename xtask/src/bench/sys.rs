//! What the bench adds to the shared harness (`smc-harness`: cgroups, attachments, processes,
//! the daemon, the lock, interrupts): the bench's processes with their logs, the daemon's and
//! the namespace's counters, the private network namespace, the data path's statistics files,
//! the eBPF run times. Every resource is held by a guard that releases it on drop, so an error
//! or an interruption (Ctrl-C) leaves nothing behind.
use std::{
    collections::BTreeMap,
    fs,
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
pub use smc_harness::{ebpf_counters, Daemon, Proc, ScratchDir as TempDir};
use smc_harness::{ip, last_lines, log_to};

use crate::CGROUP_PREFIX;

/// Spawns `cmd` in its own process group (killed as a whole on drop), stdin from /dev/null,
/// output to `log`.
pub fn spawn_logged(name: &str, mut cmd: Command, log: &Path) -> Result<Proc> {
    log_to(&mut cmd, log)?;
    Proc::spawn_group(name, &mut cmd)
}

/// Runs `cmd` to completion (bounded), returning its stdout; stderr goes to `log`.
pub fn run_capture(name: &str, mut cmd: Command, timeout: Duration, log: &Path) -> Result<String> {
    let f = fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(f);
    let mut p = Proc::spawn_group(name, &mut cmd)?;
    let mut stdout = p.0.stdout.take().context("piped stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = stdout.read_to_end(&mut s);
        s
    });
    let res = p.wait_success(timeout);
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

/// The last lines of a log file on one line, for error messages.
pub fn tail(log: &Path) -> String {
    last_lines(log, 6).join(" | ")
}

/// The loopback-ism daemon in `dir` (socket `ctl.sock`, state `state/`, log `daemon.log`), in
/// its own process group.
pub fn start_daemon(smc_ctl: &Path, dir: &Path) -> Result<Daemon> {
    let socket = dir.join("ctl.sock");
    let mut cmd = smc_harness::daemon_command(smc_ctl, &socket, dir);
    // The scale cases hold every connection's two DMBs at once (65 536 connections: 131 072
    // DMBs in the bench's one cgroup); the default quotas (4096 DMBs per cgroup) would decline
    // most of them with MAX_DMB and measure TCP instead.
    cmd.args(["--max-dmbs", "262144", "--cgroup-max-dmbs", "262144"]);
    let log = dir.join("daemon.log");
    let p = spawn_logged("smc-ctl daemon", cmd, &log)?;
    Daemon::ready(p, socket, Some(&log))
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
    /// A process parked in the namespace: its `/proc/PID/net` is the namespace's.
    anchor: Option<Proc>,
    fd: std::os::fd::OwnedFd,
    // Deleted after the anchor is gone (fields drop in order).
    _ns: smc_harness::Netns,
}

impl Netns {
    pub fn new(log_dir: &Path) -> Result<Netns> {
        let ns = smc_harness::Netns::new(&format!("{CGROUP_PREFIX}{}", std::process::id()))?;
        let fd = fs::File::open(Path::new("/run/netns").join(&ns.name))
            .context("open /run/netns")?
            .into();
        let mut ns = Netns {
            anchor: None,
            fd,
            _ns: ns,
        };
        let mut c = Command::new("sleep");
        c.arg("infinity");
        ns.enter(&mut c);
        ns.anchor = Some(spawn_logged(
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
        let pid = self.anchor.as_ref().map(Proc::id).unwrap_or(0);
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

    /// Waits until `server` listens on `port` in the namespace (read from /proc: no connection
    /// is made).
    pub fn wait_listening(&self, server: &mut Proc, port: u16, log: &Path) -> Result<()> {
        let what = server.name().to_owned();
        smc_harness::wait_listening(
            server,
            &self.proc_net(),
            port,
            Duration::from_secs(15),
            &what,
        )
        .map_err(|e| anyhow::anyhow!("{e}: {}", tail(log)))
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

/// Whether `p` is on a tmpfs (`statfs`).
pub fn is_tmpfs(p: &Path) -> bool {
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: all-zero is a valid statfs, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out buffer.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == libc::TMPFS_MAGIC }
}
