//! `cargo xtask bench [--quick]`: plain TCP loopback, the sk_msg shortcut and the shared-memory
//! data path (SMC-D), side by side, with the third-party tools the Linux SMC-D loopback patches
//! were measured with (sockperf, iperf3, redis-benchmark, nginx + wrk) and two small programs of
//! our own (`smc-bench-helper`: an ipc-bench-like message rate, connection setup).
//!
//! Modes (the columns of the table):
//! - `tcp`: both ends in a cgroup no program is attached to: plain TCP loopback.
//! - `shortcut`: both ends in a cgroup attached with `smc-ctl attach --mode shortcut`.
//! - `smcd`: both ends started with `smc-ctl run` in a cgroup attached with `--mode ism`, with a
//!   loopback-ism daemon the bench starts on a private socket (`SMC_CTL_SOCK`).
//!
//! The fallback rows put the server in the plain cgroup and only the client in the accelerated
//! one: what acceleration costs when the peer cannot take it.
//!
//! All processes run in a private network namespace, so that its TCP counters are the bench's
//! alone. Every run is checked (the eBPF counters are host-wide and other work moves them too, so
//! they are recorded but decide nothing alone):
//! - shortcut: the namespace's TCP must have carried at most 20% of the data segments (per unit
//!   of work) that plain TCP needed in the same case, and `bytes_redirected` must have grown;
//! - SMC-D: the data path's per-process statistics (`SMC_PROCS_DIR`, private to the run) must
//!   show at least 90% of the connections on SMC-D, and the private daemon must have attached
//!   DMBs;
//! - fallback rows: nothing may have been accelerated (the library must have decided fallback).
//!
//! A mode with a failed or a fell-back repetition is shown as such, never as a number. Server on
//! core 0, client on core 1; the modes alternate (tcp, shortcut, smcd, tcp, …) so that drift of
//! the machine hits them alike.
//!
//! Results: `<root>/results/bench-<UTC timestamp>/` with `table.txt`, `results.json` (every run,
//! its command, output metrics and counter deltas), `plot.svg` and the logs of every process.
//!
//! `SMC_BENCH_CASES=sockperf-pp,iperf3` (comma-separated case ids) runs only those cases:
//! sockperf-pp, sockperf-tp, iperf3, redis, nginx-keepalive, nginx-close, msgrate, connrate,
//! fallback-pp, fallback-conn.
use std::{
    cell::Cell as StdCell,
    collections::BTreeMap,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};

mod report;
mod sys;

use report::{Cell, Row, COLUMNS};
use sys::{Cgroup, Daemon, Netns, PreloadSampler, Proc, TempDir};

/// Where a process of a run is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// The plain cgroup, started as is.
    Plain,
    /// The cgroup attached with `--mode shortcut`, started as is.
    Shortcut,
    /// The cgroup attached with `--mode ism`, started with `smc-ctl run`.
    Smc,
}

/// What the counters of a run must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Plain,
    Shortcut,
    Smcd,
    /// Fallback row, client in the shortcut cgroup: the data must still go through TCP.
    FallbackShortcut,
    /// Fallback row, client under `smc-ctl run`: no SMC-D connection, fallback decided.
    FallbackSmcd,
}

/// Largest share of plain TCP's data segments a shortcut run may still send through TCP.
const MAX_ACCELERATED_TCP_SHARE: f64 = 0.2;
/// Smallest share of the connections that must be SMC-D in an SMC-D run.
const MIN_SMCD_COVERAGE: f64 = 0.9;
/// Smallest share of plain TCP's data segments a fallback run must send through TCP.
const MIN_FALLBACK_TCP_SHARE: f64 = 0.5;

struct Metric {
    key: &'static str,
    label: &'static str,
    unit: &'static str,
    higher_is_better: bool,
}

const fn metric(
    key: &'static str,
    label: &'static str,
    unit: &'static str,
    higher: bool,
) -> Metric {
    Metric {
        key,
        label,
        unit,
        higher_is_better: higher,
    }
}

type Argv = Box<dyn Fn(u16) -> Result<Vec<OsString>>>;
type Parse = fn(&str) -> Result<BTreeMap<String, f64>>;

struct Case {
    id: &'static str,
    title: &'static str,
    metrics: Vec<Metric>,
    /// Output key counting the work done in a run (messages, requests, bytes), to compare the
    /// TCP data segments of runs of different speed; `None`: every run does the same work.
    units: Option<&'static str>,
    /// Server plain, client accelerated (the fallback rows).
    fallback: bool,
    server: Argv,
    client: Argv,
    parse: Parse,
    timeout: Duration,
}

/// Durations and sizes of one bench flavour.
struct Params {
    reps: usize,
    /// Seconds of each time-bound client run.
    secs: u32,
    /// Requests per redis-benchmark test.
    redis_n: u32,
}

/// Everything the runs share. Dropping it stops the daemon, kills every process, removes the
/// cgroups (detaching them first), then the network namespace.
struct Bench {
    smc_ctl: PathBuf,
    /// The data path's own statistics command exists (`smc-ctl stats --json`).
    has_stats_cmd: bool,
    logs: PathBuf,
    tmp: PathBuf,
    next_port: StdCell<u16>,
    /// 1, or 0 on a single-core machine (server and client then share it).
    client_core: u32,
    daemon: Daemon,
    cg_plain: Cgroup,
    cg_shortcut: Cgroup,
    cg_ism: Cgroup,
    netns: Netns,
}

pub fn run(root: &Path, quick: bool) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the bench attaches eBPF programs and creates cgroups: run it as root (sudo cargo xtask bench)");
    }
    let cg_root = sys::cgroup2_root()?;
    if !cg_root.join("cgroup.procs").exists() {
        bail!("cgroup v2 is not usable at {}", cg_root.display());
    }
    sys::install_signal_handlers();
    let params = if quick {
        Params {
            reps: 3,
            secs: 1,
            redis_n: 20_000,
        }
    } else {
        Params {
            reps: 5,
            secs: 10,
            redis_n: 400_000,
        }
    };

    let target = target_dir(root)?;
    let release = target.join("release");
    let smc_ctl = release.join("smc-ctl");
    for f in [&smc_ctl, &release.join("libsmc_preload.so")] {
        if !f.exists() {
            bail!("{} is missing (cargo xtask build)", f.display());
        }
    }
    eprintln!("==> building the bench's own test programs (smc-bench-helper)");
    crate::run(cargo(root).args([
        "build",
        "--release",
        "-p",
        "xtask",
        "--bin",
        "smc-bench-helper",
    ]))?;
    let helper = release.join("smc-bench-helper");
    for tool in [
        "taskset",
        "ip",
        "sockperf",
        "iperf3",
        "redis-server",
        "redis-benchmark",
        "nginx",
        "wrk",
    ] {
        if which(tool).is_none() {
            bail!("{tool} is not installed (cargo xtask setup installs it)");
        }
    }

    let (stamp, date) = sys::timestamp();
    let out_dir = root.join("results").join(format!("bench-{stamp}"));
    let logs = out_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("mkdir {}", logs.display()))?;

    let _lock = sys::lock()?;
    sys::remove_stale_cgroups(&smc_ctl);
    sys::remove_stale_netns();
    let tmp = TempDir::new("run")?;
    let has_stats_cmd = Command::new(&smc_ctl)
        .args(["stats", "--help"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());

    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let client_core = if cores >= 2 { 1 } else { 0 };
    if cores < 2 {
        eprintln!("warning: one CPU only: server and client share core 0");
    }
    eprintln!("==> network namespace, cgroups, attachments and the loopback-ism daemon");
    let bench = {
        let netns = Netns::new(&logs)?;
        let cg_plain = Cgroup::new("tcp", &smc_ctl)?;
        let mut cg_shortcut = Cgroup::new("shortcut", &smc_ctl)?;
        cg_shortcut.attach("shortcut")?;
        let mut cg_ism = Cgroup::new("ism", &smc_ctl)?;
        cg_ism.attach("ism")?;
        let daemon = Daemon::start(&smc_ctl, &tmp.0)?;
        Bench {
            smc_ctl: smc_ctl.clone(),
            has_stats_cmd,
            logs: logs.clone(),
            tmp: tmp.0.clone(),
            next_port: StdCell::new(20_000),
            client_core,
            daemon,
            cg_plain,
            cg_shortcut,
            cg_ism,
            netns,
        }
    };

    let mut cases = cases(&params, &helper, &tmp.0)?;
    if let Ok(only) = std::env::var("SMC_BENCH_CASES") {
        let want: Vec<&str> = only
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        cases.retain(|c| want.contains(&c.id));
        if cases.is_empty() {
            bail!("SMC_BENCH_CASES={only} selects no case");
        }
        eprintln!("==> only the cases {want:?} (SMC_BENCH_CASES)");
    }
    let started = Instant::now();
    let load_before = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    // (case, column) → per-repetition outcome.
    let mut outcomes: BTreeMap<(usize, usize), Vec<Outcome>> = BTreeMap::new();
    for (ci, case) in cases.iter().enumerate() {
        eprintln!(
            "==> {} ({} × {} modes)",
            case.title,
            params.reps,
            COLUMNS.len()
        );
        for rep in 0..params.reps {
            for (col, col_name) in COLUMNS.iter().enumerate() {
                sys::check_interrupted()?;
                let o = bench.run_once(case, col, rep);
                eprintln!("    rep {} {:<8} {}", rep + 1, col_name, o.summary());
                outcomes.entry((ci, col)).or_default().push(o);
            }
        }
        judge_case(ci, case, &mut outcomes);
        for (col, col_name) in COLUMNS.iter().enumerate() {
            let v: Vec<String> = outcomes[&(ci, col)]
                .iter()
                .map(|o| o.verdict.short())
                .collect();
            eprintln!("    verdict  {col_name:<8} {}", v.join(", "));
        }
    }
    let load_after = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let elapsed = started.elapsed();
    drop(bench);
    drop(tmp);

    let rows = rows(&cases, &outcomes);
    let machine = machine(root);
    let subtitle = format!(
        "{date}, {} ({} cores), kernel {}, {} mode, {} repetitions; server on core 0, client on core 1",
        machine["cpu"].as_str().unwrap_or("?"),
        machine["cores"],
        machine["kernel"].as_str().unwrap_or("?"),
        if quick { "quick" } else { "full" },
        params.reps
    );
    let mut text = format!(
        "cargo xtask bench{} — {subtitle}\n\n",
        if quick { " --quick" } else { "" }
    );
    text.push_str(&report::table(&rows));
    text.push_str(&notes(&rows, &load_before, &load_after));

    let cases_ref = &cases;
    let runs: Vec<Value> = outcomes
        .iter()
        .flat_map(|((ci, col), os)| {
            os.iter()
                .enumerate()
                .map(move |(rep, o)| o.to_json(&cases_ref[*ci], COLUMNS[*col], rep))
        })
        .collect();
    let json = json!({
        "date": date,
        "command": format!("cargo xtask bench{}", if quick { " --quick" } else { "" }),
        "quick": quick,
        "repetitions": params.reps,
        "seconds_per_run": params.secs,
        "redis_requests": params.redis_n,
        "machine": machine,
        "load_before": load_before.trim(),
        "load_after": load_after.trim(),
        "elapsed_seconds": elapsed.as_secs_f64(),
        "smc_ctl_stats_available": has_stats_cmd,
        "tools": tools(),
        "columns": {
            "tcp": "both ends plain (cgroup without programs)",
            "shortcut": "both ends in a cgroup attached with --mode shortcut (fallback rows: client only)",
            "smcd": "both ends under `smc-ctl run` in a cgroup attached with --mode ism (fallback rows: client only)",
        },
        "ratios": "median(mode) / median(TCP); for latencies lower is better",
        "checks": {
            "max_accelerated_tcp_share": MAX_ACCELERATED_TCP_SHARE,
            "min_smcd_coverage": MIN_SMCD_COVERAGE,
            "min_fallback_tcp_share": MIN_FALLBACK_TCP_SHARE,
        },
        "rows": rows,
        "runs": runs,
    });
    fs::write(out_dir.join("table.txt"), &text)?;
    fs::write(
        out_dir.join("results.json"),
        serde_json::to_string_pretty(&json)?,
    )?;
    fs::write(out_dir.join("plot.svg"), report::svg(&rows, &subtitle))?;
    println!("{text}");
    println!(
        "results: {}/ (table.txt, results.json, plot.svg, logs/)",
        out_dir.display()
    );
    Ok(())
}

/// One repetition of one case in one mode.
struct Outcome {
    server_cmd: Vec<String>,
    client_cmd: Vec<String>,
    metrics: BTreeMap<String, f64>,
    error: Option<String>,
    /// Deltas over the client run: host-wide eBPF counters, the private daemon's counters, the
    /// namespace's TCP counters; `smc-ctl stats --json` of the run's processes when it exists.
    ebpf: BTreeMap<String, f64>,
    daemon: BTreeMap<String, f64>,
    netns: BTreeMap<String, f64>,
    datapath: BTreeMap<String, f64>,
    /// The data path's per-process statistics of the run, summed over its processes.
    preload: BTreeMap<String, f64>,
    /// TCP data segments per unit of work, against plain TCP's in the same case.
    tcp_share: Option<f64>,
    verdict: Verdict,
    seconds: f64,
}

#[derive(Clone, Debug)]
enum Verdict {
    Ok,
    Failed(String),
    FellBack(String),
    NotFallback(String),
}

impl Verdict {
    fn short(&self) -> String {
        match self {
            Verdict::Ok => "ok".into(),
            Verdict::Failed(e) => format!("FAILED ({e})"),
            Verdict::FellBack(e) => format!("fell back ({e})"),
            Verdict::NotFallback(e) => format!("not a fallback ({e})"),
        }
    }
}

impl Outcome {
    fn summary(&self) -> String {
        if let Some(e) = &self.error {
            return format!("FAILED: {e}");
        }
        let mut m: Vec<String> = self
            .metrics
            .iter()
            .map(|(k, v)| format!("{k}={}", report::num(*v)))
            .collect();
        m.push(format!("tcp_payload_segs={}", self.data_segs()));
        if !self.preload.is_empty() {
            m.push(format!(
                "smcd={}+{} fallback={}+{}",
                get(&self.preload, "smcd_client"),
                get(&self.preload, "smcd_server"),
                get(&self.preload, "fallback_client"),
                get(&self.preload, "fallback_server")
            ));
        }
        m.join(" ")
    }

    fn to_json(&self, case: &Case, col: &str, rep: usize) -> Value {
        let (status, reason) = match &self.verdict {
            Verdict::Ok => ("ok", String::new()),
            Verdict::Failed(e) => ("failed", e.clone()),
            Verdict::FellBack(e) => ("fell_back", e.clone()),
            Verdict::NotFallback(e) => ("not_fallback", e.clone()),
        };
        json!({
            "case": case.id,
            "mode": col,
            "repetition": rep + 1,
            "status": status,
            "reason": reason,
            "seconds": self.seconds,
            "server": self.server_cmd,
            "client": self.client_cmd,
            "metrics": self.metrics,
            "tcp_data_share_vs_plain": self.tcp_share,
            "counters": {
                "ebpf_hostwide": self.ebpf,
                "daemon": self.daemon,
                "netns": self.netns,
                "preload": self.preload,
                "smc_ctl_stats_of_the_run": self.datapath,
            },
        })
    }

    fn units(&self, case: &Case) -> Option<f64> {
        match case.units {
            Some(k) => self.metrics.get(k).copied().filter(|u| *u > 0.0),
            None => Some(1.0),
        }
    }

    /// Segments with payload the namespace's TCP sent: `TCPOrigDataSent` counts the FINs too,
    /// two per connection (`ActiveOpens`), which are no payload.
    fn data_segs(&self) -> f64 {
        (get(&self.netns, "TcpExt.TCPOrigDataSent") - 2.0 * get(&self.netns, "Tcp.ActiveOpens"))
            .max(0.0)
    }

    /// TCP payload segments per unit of work.
    fn segs_per_unit(&self, case: &Case) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        Some(self.data_segs() / self.units(case)?)
    }
}

/// Counter snapshot around one run.
struct Snapshot {
    ebpf: BTreeMap<String, f64>,
    daemon: BTreeMap<String, f64>,
    netns: BTreeMap<String, f64>,
}

impl Bench {
    fn cgroup(&self, p: Place) -> &Cgroup {
        match p {
            Place::Plain => &self.cg_plain,
            Place::Shortcut => &self.cg_shortcut,
            Place::Smc => &self.cg_ism,
        }
    }

    /// `taskset -c CORE [smc-ctl run --] ARGV` inside the namespace and the place's cgroup.
    fn command(&self, place: Place, core: u32, argv: &[OsString], procs: &Path) -> Command {
        let mut c = Command::new("taskset");
        c.arg("-c").arg(core.to_string());
        if place == Place::Smc {
            c.arg(&self.smc_ctl).args(["run", "--"]);
            c.env("SMC_CTL_SOCK", &self.daemon.socket);
            c.env("SMC_PROCS_DIR", procs);
            // Keep the statistics file of a process that exits, for the count after the run.
            c.env("SMC_STATS_KEEP", "1");
        }
        c.args(argv);
        self.netns.enter(&mut c);
        self.cgroup(place).enter(&mut c);
        c
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let ebpf = sys::ebpf_counters(&self.smc_ctl)?
            .into_iter()
            .map(|(k, v)| (k, v as f64))
            .collect();
        let daemon = sys::flatten(&self.daemon.stats().context("daemon stats")?);
        let netns = self.netns.counters()?;
        Ok(Snapshot {
            ebpf,
            daemon,
            netns,
        })
    }

    fn run_once(&self, case: &Case, col: usize, rep: usize) -> Outcome {
        let mut o = Outcome {
            server_cmd: Vec::new(),
            client_cmd: Vec::new(),
            metrics: BTreeMap::new(),
            error: None,
            ebpf: BTreeMap::new(),
            daemon: BTreeMap::new(),
            netns: BTreeMap::new(),
            datapath: BTreeMap::new(),
            preload: BTreeMap::new(),
            tcp_share: None,
            verdict: Verdict::Ok,
            seconds: 0.0,
        };
        let t0 = Instant::now();
        if let Err(e) = self.try_run(case, col, rep, &mut o) {
            o.error = Some(format!("{e:#}"));
        }
        o.seconds = t0.elapsed().as_secs_f64();
        o
    }

    fn try_run(&self, case: &Case, col: usize, rep: usize, o: &mut Outcome) -> Result<()> {
        let (server_place, client_place, _) = placement(case.fallback, col);
        let port = self.next_port.get();
        self.next_port.set(port + 1);
        let tag = format!("{}-{}-{}", case.id, COLUMNS[col], rep + 1);
        let procs = self.tmp.join("procs").join(&tag);
        fs::create_dir_all(&procs)?;
        let server_argv = (case.server)(port)?;
        let client_argv = (case.client)(port)?;
        let server_cmd = self.command(server_place, 0, &server_argv, &procs);
        let client_cmd = self.command(client_place, self.client_core, &client_argv, &procs);
        o.server_cmd = cmd_line(&server_cmd);
        o.client_cmd = cmd_line(&client_cmd);
        let srv_log = self.logs.join(format!("{tag}.server.log"));
        let mut server = Proc::spawn(&format!("{} server", case.id), server_cmd, &srv_log)?;
        self.netns.wait_listening(&mut server, port, &srv_log)?;
        let sampler = PreloadSampler::start(&procs);
        let before = self.snapshot()?;
        let out = sys::run_capture(
            &format!("{} client", case.id),
            client_cmd,
            case.timeout,
            &self.logs.join(format!("{tag}.client.log")),
        );
        let after = self.snapshot();
        drop(server);
        // Whatever the server left (nginx workers, forks) goes too.
        self.cgroup(server_place).kill_all();
        self.cgroup(client_place).kill_all();
        o.preload = sampler.finish();
        if self.has_stats_cmd {
            // The data path's own report of this run's processes (their files are kept).
            let out = Command::new(&self.smc_ctl)
                .args(["stats", "--json"])
                .env("SMC_PROCS_DIR", &procs)
                .output();
            if let Some(v) = out
                .ok()
                .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
            {
                o.datapath = sys::flatten(&v);
            }
        }
        let _ = fs::remove_dir_all(&procs);
        let (out, after) = (out?, after?);
        o.ebpf = sys::delta_f(&before.ebpf, &after.ebpf);
        o.daemon = sys::delta_f(&before.daemon, &after.daemon);
        o.netns = sys::delta_f(&before.netns, &after.netns);
        o.metrics =
            (case.parse)(&out).with_context(|| format!("parsing the output of {}", case.id))?;
        for m in &case.metrics {
            if !o.metrics.contains_key(m.key) {
                bail!("{} printed no {}", case.id, m.label);
            }
        }
        Ok(())
    }
}

/// Where server and client run in a column, and what the counters must show.
fn placement(fallback: bool, col: usize) -> (Place, Place, Expect) {
    match (fallback, col) {
        (_, 0) => (Place::Plain, Place::Plain, Expect::Plain),
        (false, 1) => (Place::Shortcut, Place::Shortcut, Expect::Shortcut),
        (false, _) => (Place::Smc, Place::Smc, Expect::Smcd),
        (true, 1) => (Place::Plain, Place::Shortcut, Expect::FallbackShortcut),
        (true, _) => (Place::Plain, Place::Smc, Expect::FallbackSmcd),
    }
}

fn get(m: &BTreeMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    })
}

/// Sets the verdict of every run of a case, once all its repetitions are done (the shares need
/// plain TCP's runs of the same case).
fn judge_case(ci: usize, case: &Case, outcomes: &mut BTreeMap<(usize, usize), Vec<Outcome>>) {
    let reference = outcomes
        .get(&(ci, 0))
        .and_then(|os| median(os.iter().filter_map(|o| o.segs_per_unit(case)).collect()))
        .filter(|r| *r > 0.0);
    for col in 0..COLUMNS.len() {
        let expect = placement(case.fallback, col).2;
        for o in outcomes.get_mut(&(ci, col)).into_iter().flatten() {
            o.tcp_share = reference.and_then(|r| o.segs_per_unit(case).map(|s| s / r));
            o.verdict = judge(expect, o);
        }
    }
}

fn judge(expect: Expect, o: &Outcome) -> Verdict {
    if let Some(e) = &o.error {
        return Verdict::Failed(e.clone());
    }
    let share = o.tcp_share;
    let pct = |s: f64| format!("{:.0}%", s * 100.0);
    let p = &o.preload;
    let smcd = get(p, "smcd_client") + get(p, "smcd_server");
    let fallback = get(p, "fallback_client") + get(p, "fallback_server");
    let attached = get(&o.daemon, "ops.attach.ok");
    let reasons = || {
        let r: Vec<String> = p
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix("fallback_reason_")
                    .map(|c| format!("{c}×{v}"))
            })
            .collect();
        if r.is_empty() {
            String::new()
        } else {
            format!(", reasons {}", r.join(" "))
        }
    };
    match expect {
        Expect::Plain => Verdict::Ok,
        Expect::Shortcut => match share {
            Some(s) if s > MAX_ACCELERATED_TCP_SHARE => Verdict::FellBack(format!(
                "TCP still carried {} of the data segments plain TCP needed",
                pct(s)
            )),
            _ if get(&o.ebpf, "bytes_redirected") <= 0.0 => {
                Verdict::FellBack("bytes_redirected did not increase".into())
            }
            None => Verdict::FellBack(
                "no plain TCP reference to compare the TCP data segments with".into(),
            ),
            Some(_) => Verdict::Ok,
        },
        Expect::Smcd => {
            if p.get("processes").is_none() {
                if attached <= 0.0 {
                    return Verdict::FellBack(
                        "no data path statistics and no DMB attached by the daemon".into(),
                    );
                }
            } else if smcd <= 0.0 {
                return Verdict::FellBack(format!(
                    "no SMC-D connection, {fallback} fell back{}",
                    reasons()
                ));
            } else if smcd / (smcd + fallback) < MIN_SMCD_COVERAGE {
                return Verdict::FellBack(format!(
                    "only {} of the connections on SMC-D ({smcd} SMC-D, {fallback} fallback{})",
                    pct(smcd / (smcd + fallback)),
                    reasons()
                ));
            }
            if attached <= 0.0 {
                return Verdict::FellBack("the ism daemon attached no DMB".into());
            }
            Verdict::Ok
        }
        Expect::FallbackShortcut => match share {
            Some(s) if s < MIN_FALLBACK_TCP_SHARE => Verdict::NotFallback(format!(
                "TCP carried only {} of plain TCP's data segments",
                pct(s)
            )),
            None => Verdict::Failed(
                "no plain TCP reference to compare the TCP data segments with".into(),
            ),
            Some(_) => Verdict::Ok,
        },
        Expect::FallbackSmcd => {
            if smcd > 0.0 || attached > 0.0 {
                Verdict::NotFallback(format!("{smcd} SMC-D connections, {attached} DMB attaches"))
            } else if p.get("processes").is_some() && fallback <= 0.0 {
                Verdict::Failed("the data path decided no fallback: was it loaded?".into())
            } else {
                Verdict::Ok
            }
        }
    }
}

fn cmd_line(c: &Command) -> Vec<String> {
    std::iter::once(c.get_program())
        .chain(c.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

fn rows(cases: &[Case], outcomes: &BTreeMap<(usize, usize), Vec<Outcome>>) -> Vec<Row> {
    let mut rows = Vec::new();
    for (ci, case) in cases.iter().enumerate() {
        for m in &case.metrics {
            let cells = [0, 1, 2].map(|col| {
                let os = outcomes.get(&(ci, col)).map(Vec::as_slice).unwrap_or(&[]);
                if os.is_empty() {
                    return Cell::NotRun;
                }
                for o in os {
                    if let Verdict::Failed(e) = &o.verdict {
                        return Cell::Failed { reason: e.clone() };
                    }
                }
                for o in os {
                    match &o.verdict {
                        Verdict::FellBack(e) => return Cell::FellBack { reason: e.clone() },
                        Verdict::NotFallback(e) => return Cell::NotFallback { reason: e.clone() },
                        _ => {}
                    }
                }
                Cell::from_values(os.iter().map(|o| o.metrics[m.key]).collect())
            });
            rows.push(Row {
                case: case.id.into(),
                title: case.title.into(),
                metric: m.label.into(),
                unit: m.unit.into(),
                higher_is_better: m.higher_is_better,
                cells,
            });
        }
    }
    rows
}

fn notes(rows: &[Row], load_before: &str, load_after: &str) -> String {
    let mut s = String::from(
        "\nValues: median over the repetitions ± spread ((max-min)/median). Ratios: median(mode)/median(TCP);\n\
         for rows marked LOWER (latencies) a ratio below 1 is the improvement, for the others above 1.\n\
         Fallback rows: server plain, client accelerated (shortcut cgroup / smc-ctl run), TCP = both plain.\n",
    );
    let load = |l: &str| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    s.push_str(&format!(
        "Load average before: {}, after: {} (other work on the machine disturbs the numbers).\n",
        load(load_before),
        load(load_after)
    ));
    let mut reasons: Vec<String> = Vec::new();
    for r in rows {
        for (col, cell) in r.cells.iter().enumerate() {
            let why = match cell {
                Cell::Failed { reason } => format!("failed: {reason}"),
                Cell::FellBack { reason } => format!("fell back: {reason}"),
                Cell::NotFallback { reason } => format!("not a fallback: {reason}"),
                _ => continue,
            };
            let line = format!("  {} [{}]: {why}", r.title, COLUMNS[col]);
            if !reasons.contains(&line) {
                reasons.push(line);
            }
        }
    }
    if !reasons.is_empty() {
        s.push_str("Not reported:\n");
        for r in reasons {
            s.push_str(&r);
            s.push('\n');
        }
    }
    s
}

fn cargo(root: &Path) -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root);
    c
}

/// The target directory cargo builds into (honours CARGO_TARGET_DIR and config).
fn target_dir(root: &Path) -> Result<PathBuf> {
    let out = cargo(root)
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: Value = serde_json::from_slice(&out.stdout)?;
    v["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow!("cargo metadata: no target_directory"))
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

fn machine(root: &Path) -> Value {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .and_then(|r| r.split(':').nth(1))
        })
        .unwrap_or("?")
        .trim()
        .to_owned();
    let mem = fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:").map(|r| r.trim().to_owned()))
        .unwrap_or_default();
    let read = |p: &str| fs::read_to_string(p).unwrap_or_default().trim().to_owned();
    let commit = sys::first_line(
        "git",
        &[
            "-C",
            &root.to_string_lossy(),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    );
    let dirty = Command::new("git")
        .args([
            "-C",
            &root.to_string_lossy(),
            "status",
            "--porcelain",
            "--untracked-files=no",
        ])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    json!({
        "hostname": read("/proc/sys/kernel/hostname"),
        "kernel": read("/proc/sys/kernel/osrelease"),
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "memory": mem,
        "git_commit": if dirty { format!("{commit}-dirty") } else { commit },
    })
}

fn tools() -> Value {
    json!({
        "sockperf": sys::first_line("sockperf", &["--version"]),
        "iperf3": sys::first_line("iperf3", &["--version"]),
        "redis-server": sys::first_line("redis-server", &["--version"]),
        "nginx": sys::first_line("nginx", &["-v"]),
        "wrk": sys::first_line("wrk", &["-v"]),
    })
}

// ---- the cases -------------------------------------------------------------------------------

fn os_args(v: &[String]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn argv(f: impl Fn(u16) -> Vec<String> + 'static) -> Argv {
    Box::new(move |port| Ok(os_args(&f(port))))
}

fn cases(p: &Params, helper: &Path, tmp: &Path) -> Result<Vec<Case>> {
    let secs = p.secs;
    let timed = Duration::from_secs(u64::from(secs) * 3 + 60);
    let helper = helper.to_string_lossy().into_owned();
    let sockperf_server = || {
        argv(|port| {
            sv(&[
                "sockperf",
                "sr",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
        })
    };
    let pp_client = move || {
        argv(move |port| {
            sv(&[
                "sockperf",
                "pp",
                "--tcp",
                "-i",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-m",
                "14",
                // sockperf sizes its sequence table from the message rate; at the shared-memory
                // path's sub-µs round trips the default overflows (`_seqN > m_maxSequenceNo`).
                "--mps=5000000",
                "-t",
                &secs.to_string(),
            ])
        })
    };
    let h = helper.clone();
    let conn_server = move || {
        let h = h.clone();
        argv(move |port| sv(&[&h, "conn-server", &port.to_string()]))
    };
    let h = helper.clone();
    let conn_client = move || {
        let h = h.clone();
        argv(move |port| sv(&[&h, "conn-client", &port.to_string(), &secs.to_string()]))
    };

    // nginx: its own prefix with a config per port, a 1 KiB file, run as root in the foreground.
    let www = tmp.join("www");
    fs::create_dir_all(&www)?;
    fs::write(www.join("index.html"), "x".repeat(1023) + "\n")?;
    let tmp_s = tmp.to_string_lossy().into_owned();
    let nginx_server = move || -> Argv {
        let dir = tmp_s.clone();
        Box::new(move |port| {
            let conf = format!("{dir}/nginx-{port}.conf");
            fs::write(&conf, nginx_conf(&dir, port))?;
            Ok(os_args(&sv(&[
                "nginx",
                "-p",
                &dir,
                "-e",
                &format!("{dir}/nginx-error.log"),
                "-c",
                &conf,
            ])))
        })
    };
    let wrk = move |close: bool| {
        argv(move |port| {
            let mut a = sv(&["wrk", "-t", "1", "-c", "50", "-d", &format!("{secs}s")]);
            if close {
                a.extend(sv(&["-H", "Connection: close"]));
            }
            a.push(format!("http://127.0.0.1:{port}/index.html"));
            a
        })
    };
    let redis_n = p.redis_n;
    let redis_dir = tmp.to_string_lossy().into_owned();
    let h = helper.clone();
    let h2 = helper.clone();

    Ok(vec![
        Case {
            id: "sockperf-pp",
            title: "sockperf ping-pong 14 B",
            metrics: vec![
                metric("p50_us", "p50 latency", "us", false),
                metric("p99_us", "p99 latency", "us", false),
            ],
            units: Some("sent_messages"),
            fallback: false,
            server: sockperf_server(),
            client: pp_client(),
            parse: parse_sockperf_pp,
            timeout: timed,
        },
        Case {
            id: "sockperf-tp",
            title: "sockperf throughput 64000 B",
            metrics: vec![metric("mbps", "bandwidth", "MB/s", true)],
            units: Some("sent_messages"),
            fallback: false,
            server: sockperf_server(),
            client: argv(move |port| {
                sv(&[
                    "sockperf",
                    "tp",
                    "--tcp",
                    "-i",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-m",
                    "64000",
                    "-t",
                    &secs.to_string(),
                ])
            }),
            parse: parse_sockperf_tp,
            timeout: timed,
        },
        Case {
            id: "iperf3",
            title: "iperf3 single stream",
            metrics: vec![metric("gbps", "bitrate", "Gbit/s", true)],
            units: Some("bytes"),
            fallback: false,
            server: argv(|port| sv(&["iperf3", "-s", "-p", &port.to_string()])),
            client: argv(move |port| {
                sv(&[
                    "iperf3",
                    "-c",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-t",
                    &secs.to_string(),
                    "-J",
                ])
            }),
            parse: parse_iperf3,
            timeout: timed,
        },
        Case {
            id: "redis",
            title: "redis-benchmark -d 1024 -c 50",
            metrics: vec![
                metric("get_rps", "GET", "req/s", true),
                metric("set_rps", "SET", "req/s", true),
            ],
            units: None,
            fallback: false,
            server: argv(move |port| {
                sv(&[
                    "redis-server",
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    "--daemonize",
                    "no",
                    "--dir",
                    &redis_dir,
                    "--dbfilename",
                    &format!("bench-{port}.rdb"),
                ])
            }),
            client: argv(move |port| {
                sv(&[
                    "redis-benchmark",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-t",
                    "set,get",
                    "-d",
                    "1024",
                    "-c",
                    "50",
                    "-n",
                    &redis_n.to_string(),
                    "--csv",
                ])
            }),
            parse: parse_redis,
            timeout: Duration::from_secs(if redis_n > 100_000 { 600 } else { 120 }),
        },
        Case {
            id: "nginx-keepalive",
            title: "nginx + wrk keep-alive, 1 KiB",
            metrics: vec![metric("rps", "requests", "req/s", true)],
            units: Some("requests"),
            fallback: false,
            server: nginx_server(),
            client: wrk(false),
            parse: parse_wrk,
            timeout: timed,
        },
        Case {
            id: "nginx-close",
            title: "nginx + wrk Connection: close, 1 KiB",
            metrics: vec![metric("rps", "requests", "req/s", true)],
            units: Some("requests"),
            fallback: false,
            server: nginx_server(),
            client: wrk(true),
            parse: parse_wrk,
            timeout: timed,
        },
        Case {
            id: "msgrate",
            title: "message rate 100 B ping-pong (ipc-bench style)",
            metrics: vec![
                metric("msg_per_sec", "messages", "msg/s", true),
                metric("p50_us", "p50 round trip", "us", false),
            ],
            units: Some("total_messages"),
            fallback: false,
            server: argv(move |port| sv(&[&h, "msg-server", &port.to_string(), "100"])),
            client: argv(move |port| {
                sv(&[
                    &h2,
                    "msg-client",
                    &port.to_string(),
                    "100",
                    &secs.to_string(),
                ])
            }),
            parse: parse_json_line,
            timeout: timed,
        },
        Case {
            id: "connrate",
            title: "connection setup (connect, 1 B each way, close)",
            metrics: vec![
                metric("conn_per_sec", "connections", "conn/s", true),
                metric("p50_us", "p50 setup latency", "us", false),
                metric("p99_us", "p99 setup latency", "us", false),
            ],
            units: Some("total_connections"),
            fallback: false,
            server: conn_server(),
            client: conn_client(),
            parse: parse_json_line,
            timeout: timed,
        },
        Case {
            id: "fallback-pp",
            title: "fallback: sockperf ping-pong 14 B",
            metrics: vec![
                metric("p50_us", "p50 latency", "us", false),
                metric("p99_us", "p99 latency", "us", false),
            ],
            units: Some("sent_messages"),
            fallback: true,
            server: sockperf_server(),
            client: pp_client(),
            parse: parse_sockperf_pp,
            timeout: timed,
        },
        Case {
            id: "fallback-conn",
            title: "fallback: connection setup",
            metrics: vec![
                metric("conn_per_sec", "connections", "conn/s", true),
                metric("p50_us", "p50 setup latency", "us", false),
            ],
            units: Some("total_connections"),
            fallback: true,
            server: conn_server(),
            client: conn_client(),
            parse: parse_json_line,
            timeout: timed,
        },
    ])
}

fn sv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn nginx_conf(dir: &str, port: u16) -> String {
    format!(
        "user root;\n\
         worker_processes 1;\n\
         env LD_PRELOAD;\n\
         env SMC_CTL_SOCK;\n\
         env SMC_PROCS_DIR;\n\
         env SMC_STATS_KEEP;\n\
         daemon off;\n\
         master_process on;\n\
         pid {dir}/nginx-{port}.pid;\n\
         error_log {dir}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   default_type text/html;\n\
         \x20   sendfile on;\n\
         \x20   keepalive_requests 10000000;\n\
         \x20   keepalive_timeout 60s;\n\
         \x20   client_body_temp_path {dir}/nginx-body;\n\
         \x20   proxy_temp_path {dir}/nginx-proxy;\n\
         \x20   fastcgi_temp_path {dir}/nginx-fastcgi;\n\
         \x20   uwsgi_temp_path {dir}/nginx-uwsgi;\n\
         \x20   scgi_temp_path {dir}/nginx-scgi;\n\
         \x20   server {{\n\
         \x20       listen 127.0.0.1:{port};\n\
         \x20       root {dir}/www;\n\
         \x20   }}\n\
         }}\n"
    )
}

// ---- output parsers --------------------------------------------------------------------------

/// Drops ANSI colour sequences (sockperf prints them).
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            if it.peek() == Some(&'[') {
                it.next();
                for c in it.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The number right after `key` (skipping `=`, `:` and blanks).
fn number_after(s: &str, key: &str) -> Option<f64> {
    let i = s.find(key)? + key.len();
    let rest = s[i..].trim_start_matches(|c: char| c == '=' || c == ':' || c.is_whitespace());
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn parse_sockperf_pp(out: &str) -> Result<BTreeMap<String, f64>> {
    let s = strip_ansi(out);
    let mut m = BTreeMap::new();
    m.insert(
        "p50_us".into(),
        number_after(&s, "percentile 50.000").ok_or_else(|| anyhow!("no p50"))?,
    );
    m.insert(
        "p99_us".into(),
        number_after(&s, "percentile 99.000").ok_or_else(|| anyhow!("no p99"))?,
    );
    if let Some(avg) = number_after(&s, "Summary: Latency is") {
        m.insert("avg_us".into(), avg);
    }
    // The first is the [Total Run] line (warm-up included, like the namespace's TCP counters).
    if let Some(n) = number_after(&s, "SentMessages") {
        m.insert("sent_messages".into(), n);
    }
    Ok(m)
}

fn parse_sockperf_tp(out: &str) -> Result<BTreeMap<String, f64>> {
    let s = strip_ansi(out);
    let mut m = BTreeMap::new();
    m.insert(
        "mbps".into(),
        number_after(&s, "BandWidth is").ok_or_else(|| anyhow!("no BandWidth"))?,
    );
    if let Some(r) = number_after(&s, "Message Rate is") {
        m.insert("msg_per_sec".into(), r);
    }
    if let Some(n) = number_after(&s, "Total of") {
        m.insert("sent_messages".into(), n);
    }
    Ok(m)
}

fn parse_iperf3(out: &str) -> Result<BTreeMap<String, f64>> {
    let v: Value = serde_json::from_str(out).context("iperf3 -J output")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received.bits_per_second"))?;
    let mut m = BTreeMap::new();
    m.insert("gbps".into(), bps / 1e9);
    if let Some(b) = v["end"]["sum_sent"]["bytes"].as_f64() {
        m.insert("bytes".into(), b);
    }
    if let Some(r) = v["end"]["sum_sent"]["retransmits"].as_f64() {
        m.insert("retransmits".into(), r);
    }
    Ok(m)
}

fn parse_redis(out: &str) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line
            .split(',')
            .map(|x| x.trim().trim_matches('"'))
            .collect();
        if f.len() < 2 {
            continue;
        }
        let key = match f[0] {
            "GET" => "get_rps",
            "SET" => "set_rps",
            _ => continue,
        };
        m.insert(
            key.to_string(),
            f[1].parse()
                .with_context(|| format!("redis-benchmark: {line}"))?,
        );
    }
    Ok(m)
}

fn parse_wrk(out: &str) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    let rps = number_after(out, "Requests/sec:").ok_or_else(|| anyhow!("no Requests/sec"))?;
    m.insert("rps".into(), rps);
    let requests = out
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .and_then(|(n, _)| n.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    m.insert("requests".into(), requests);
    let non2xx = number_after(out, "Non-2xx or 3xx responses:").unwrap_or(0.0);
    if non2xx > 0.0 {
        bail!("{non2xx} non-2xx responses");
    }
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors:")) {
        let errs: f64 = ["connect", "read", "write", "timeout"]
            .iter()
            .filter_map(|k| number_after(l, k))
            .sum();
        m.insert("socket_errors".into(), errs);
        if errs > requests * 0.01 {
            bail!("wrk: {}", l.trim());
        }
    }
    Ok(m)
}

fn parse_json_line(out: &str) -> Result<BTreeMap<String, f64>> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("no JSON line"))?;
    let v: Value = serde_json::from_str(line)?;
    Ok(v.as_object()
        .ok_or_else(|| anyhow!("not an object"))?
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_output() {
        let pp = "sockperf: \x1b[2;35m====> avg-latency=93.640 (std-dev=485.902)\x1b[0m\n\
                  sockperf: Summary: Latency is 93.640 usec\n\
                  sockperf: ---> percentile 99.000 = 2466.027\n\
                  sockperf: ---> percentile 50.000 =   20.320\n";
        let m = parse_sockperf_pp(pp).unwrap();
        assert_eq!(m["p50_us"], 20.32);
        assert_eq!(m["p99_us"], 2466.027);
        let tp = "sockperf: Summary: BandWidth is 469.971 MBps (3759.766 Mbps)\n";
        assert_eq!(parse_sockperf_tp(tp).unwrap()["mbps"], 469.971);
        let redis = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"81300.81\",\"0.3\"\n\"GET\",\"90000.00\",\"0.2\"\n";
        let m = parse_redis(redis).unwrap();
        assert_eq!((m["get_rps"], m["set_rps"]), (90000.0, 81300.81));
        let wrk = "Running 1s test @ http://127.0.0.1:1/\n  12345 requests in 1.00s, 3.00MB read\n\
                   Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec:  12345.67\n";
        let m = parse_wrk(wrk).unwrap();
        assert_eq!(
            (m["rps"], m["requests"], m["socket_errors"]),
            (12345.67, 12345.0, 3.0)
        );
    }

    #[test]
    fn median_and_spread() {
        match Cell::from_values(vec![3.0, 1.0, 2.0]) {
            Cell::Ok {
                median, spread_pct, ..
            } => assert_eq!((median, spread_pct), (2.0, 100.0)),
            c => panic!("{c:?}"),
        }
    }
}
