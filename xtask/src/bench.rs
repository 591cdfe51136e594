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
//! Modules: [`cases`](mod@cases) (what each case runs and measures), [`parsers`] (the tools' output),
//! [`judge`] (the checks above and the verdict), [`report`] (table, JSON, plot), [`sys`]
//! (the bench's processes and logs, the daemon's counters, the network namespace, the data
//! path's statistics files) over `smc-harness` (cgroups, attachments, the daemon, processes,
//! shared with the integration tests); the helper program is
//! `src/bin/smc-bench-helper.rs`.
//!
//! `SMC_BENCH_CASES=sockperf-pp,iperf3` (comma-separated case ids) runs only those cases:
//! sockperf-pp, sockperf-tp, iperf3, redis, nginx-keepalive, msgrate, connrate, connrate-policy,
//! fallback-pp, fallback-conn, proc-conn, fallback-proc (one connection per process, the
//! process spawned, its connection made, the process gone, one after the other), and `nginx-close[-smcd][-16k][-c1000]` (Connection: close with
//! the short-connection policy on / off (`-smcd`: every connection SMC-D), 1 KiB / 16 KiB
//! bodies, 50 / 1000 connections), `scale-1k`, `scale-10k` (N connections pinging once a
//! second; `scale-65k` with `SMC_BENCH_SCALE_65K=1`, `scale-20k`, `scale-40k`, … with
//! `SMC_BENCH_SCALE_N=20000,40000`), `scale-idle-10`, `scale-idle-1k`, `scale-idle-4k` (N connections in one epoll set,
//! one of them pinging every millisecond). `SMC_BENCH_TCP_RECORDS=off` attaches the ism cgroup
//! with `--tcp-records off` (explicitly the default), `on` with the records.
use std::{
    cell::Cell as StdCell,
    collections::BTreeMap,
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::{json, Value};

mod cases;
mod judge;
pub(crate) mod parsers;
mod report;
mod sys;

use cases::{cases, Case, Params};
use judge::{
    derived_metrics, judge_case, placement, Outcome, Place, Verdict, MAX_ACCELERATED_TCP_SHARE,
    MIN_FALLBACK_TCP_SHARE, MIN_SMCD_COVERAGE,
};
use report::{Cell, Row, COLUMNS};
use smc_harness::{Cgroup, DataPath, GlobalLock};
use sys::{BpfStats, Daemon, Netns, PreloadSampler, TempDir};

struct Bench {
    smc_ctl: PathBuf,
    /// The data path's own statistics command exists (`smc-ctl stats --json`).
    has_stats_cmd: bool,
    logs: PathBuf,
    /// Where each run's `SMC_PROCS_DIR` is made (a tmpfs when the host has one).
    procs_root: PathBuf,
    next_port: StdCell<u16>,
    /// 1, or 0 on a single-core machine (server and client then share it).
    client_core: u32,
    daemon: Daemon,
    cg_plain: Cgroup,
    cg_shortcut: Cgroup,
    cg_ism: Cgroup,
    netns: Netns,
    _bpf_stats: BpfStats,
}

pub fn run(root: &Path, quick: bool) -> Result<()> {
    smc_harness::require_root(
        "the bench attaches eBPF programs and creates cgroups: run it as root (sudo cargo xtask bench)",
    )?;
    smc_harness::install_signal_handlers();
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
    eprintln!("==> building the bench's own test programs (smc-bench-helper, smc-scale)");
    crate::run(cargo(root).args([
        "build",
        "--release",
        "-p",
        "xtask",
        "--bin",
        "smc-bench-helper",
    ]))?;
    // The scale case's program lives with the integration tests (they run it too).
    crate::run(cargo(root).args([
        "build",
        "--release",
        "-p",
        "integration-tests",
        "--bin",
        "smc-scale",
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
        if smc_harness::find_tool(tool).is_none() {
            bail!("{tool} is not installed (cargo xtask setup installs it)");
        }
    }

    let (stamp, date) = sys::timestamp();
    let out_dir = root.join("results").join(format!("bench-{stamp}"));
    let logs = out_dir.join("logs");
    fs::create_dir_all(&logs).with_context(|| format!("mkdir {}", logs.display()))?;

    let _lock = GlobalLock::acquire()?;
    smc_harness::remove_stale_cgroups(crate::CGROUP_PREFIX, &smc_ctl);
    sys::remove_stale_netns();
    let tmp =
        TempDir::new(std::env::temp_dir().join(format!("smc-bench-{}-run", std::process::id())))?;
    // The processes' statistics files where a host keeps them: `/run` (the default
    // `SMC_PROCS_DIR`) is a tmpfs there. Here `/tmp` may be a disk filesystem, whose journal made
    // each file's creation and removal cost a short-lived process hundreds of microseconds
    // (docs/PERF.md, 2026-12-06).
    let shm = Path::new("/dev/shm");
    let procs_tmp = if sys::is_tmpfs(shm) {
        TempDir::new(shm.join(format!("smc-bench-{}-procs", std::process::id())))?
    } else {
        TempDir::new(tmp.0.join("procs"))?
    };
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
        let cg_plain = crate::cgroup("tcp")?;
        // What attach says on stderr (the shortcut's differences from TCP) is not repeated here.
        let mut cg_shortcut = crate::cgroup("shortcut")?;
        cg_shortcut.attach(&smc_ctl, "shortcut")?;
        let mut cg_ism = crate::cgroup("ism")?;
        // `SMC_BENCH_TCP_RECORDS=on`: the ism cgroup keeps records of connections that cannot
        // become SMC-D (`smc-ctl attach --tcp-records on`), to compare with the default (off).
        match std::env::var("SMC_BENCH_TCP_RECORDS").as_deref() {
            Ok(v @ ("on" | "off")) => {
                eprintln!("==> ism cgroup attached with --tcp-records {v}");
                cg_ism.attach_with(&smc_ctl, "ism", &["--tcp-records", v])?;
            }
            _ => _ = cg_ism.attach(&smc_ctl, "ism")?,
        }
        let daemon = sys::start_daemon(&smc_ctl, &tmp.0)?;
        Bench {
            _bpf_stats: BpfStats::enable(),
            smc_ctl: smc_ctl.clone(),
            has_stats_cmd,
            logs: logs.clone(),
            procs_root: procs_tmp.0.clone(),
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
                smc_harness::check_interrupted()?;
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
    drop(procs_tmp);
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
    fn command(
        &self,
        place: Place,
        core: u32,
        argv: &[OsString],
        procs: &Path,
        env: &[(&str, &str)],
    ) -> Command {
        // The statistics file of a process that exits is kept, for the count after the run.
        let data_path = (place == Place::Smc).then(|| DataPath {
            smc_ctl: &self.smc_ctl,
            socket: &self.daemon.socket,
            procs: Some(procs),
            clean_env: false,
        });
        let core = core.to_string();
        let mut c =
            self.cgroup(place)
                .launch(&["taskset", "-c", &core], data_path.as_ref(), &argv[0]);
        if data_path.is_some() {
            c.envs(env.iter().copied());
        }
        c.args(&argv[1..]);
        self.netns.enter(&mut c);
        c
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let mut ebpf: BTreeMap<String, f64> = sys::ebpf_counters(&self.smc_ctl)?
            .into_iter()
            .map(|(k, v)| (k, v as f64))
            .collect();
        ebpf.extend(sys::bpf_prog_stats());
        let daemon = sys::flatten(&sys::daemon_stats(&self.daemon.socket).context("daemon stats")?);
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
        let procs = self.procs_root.join(&tag);
        fs::create_dir_all(&procs)?;
        let server_argv = (case.server)(port)?;
        let client_argv = (case.client)(port)?;
        let env = &case.smc_env;
        let server_cmd = self.command(server_place, 0, &server_argv, &procs, env);
        let client_cmd = self.command(client_place, self.client_core, &client_argv, &procs, env);
        o.server_cmd = cmd_line(&server_cmd);
        o.client_cmd = cmd_line(&client_cmd);
        let srv_log = self.logs.join(format!("{tag}.server.log"));
        let mut server = sys::spawn_logged(&format!("{} server", case.id), server_cmd, &srv_log)?;
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
        derived_metrics(case, o);
        for m in &case.metrics {
            if !o.metrics.contains_key(m.key) {
                bail!("{} printed no {}", case.id, m.label);
            }
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

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
