//! `smc-ctl stats [show|reset|json]`: the figures of `smcd stats`, fed by the real counters.
//!
//! Sources:
//! - the data path's per-process files ([`smc_stats`], `$SMC_PROCS_DIR` or
//!   `/run/smc/procs`): SMC-D connections, fallbacks and their decline codes, handshake errors,
//!   bytes, requests, buffer-full events, special calls. Files of processes that are gone are
//!   folded into the per-cgroup aggregate `exited-<cgroup id>` (under the directory's lock), so
//!   that exited processes keep counting;
//! - the eBPF per-CPU counters (host-wide): same-host pairs, the sk_msg shortcut;
//! - the loopback-ism daemon's counters, when it answers;
//! - the live connections of the attached cgroups ([`crate::conns`]): SMC-D, shortcut and
//!   same-host TCP now, with why.
//!
//! `reset` stores the current absolute figures as a baseline (`/run/smc/stats.baseline.json`),
//! per scope (host and every cgroup); `show` and `json` then print the difference, `-a` the
//! absolute figures. Live figures (gauges) are never differences.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use smc_stats::{self as procstats, Snapshot, HIST_BUCKETS, HIST_NAMES};

use crate::{bpf, conns};

/// Default baseline file of `reset`.
pub const DEFAULT_BASELINE: &str = "/run/smc/stats.baseline.json";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Print the figures (since the last `reset`, or absolute with `-a`).
    #[default]
    Show,
    /// Store the current figures as the baseline of `show` and `json`.
    Reset,
    /// Print every figure as JSON (stable snake_case keys, see the README).
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct StatsArgs {
    /// show (default), reset or json.
    #[arg(value_enum)]
    pub action: Option<Action>,
    /// Details: client/server splits, every fallback reason, the special calls one by one,
    /// the eBPF counters and the daemon's operations.
    #[arg(short = 'd', long)]
    pub details: bool,
    /// Absolute figures, ignoring the baseline of `reset`.
    #[arg(short = 'a', long)]
    pub absolute: bool,
    /// Only the processes and connections of this cgroup (and its descendants).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// The loopback-ism daemon's socket.
    #[arg(long, default_value_os_t = smc_ism::default_socket_path())]
    pub socket: PathBuf,
    /// The data path's per-process statistics directory.
    #[arg(long, default_value_os_t = procstats::default_dir())]
    pub procs_dir: PathBuf,
    /// Baseline file of `reset`.
    #[arg(long, default_value = DEFAULT_BASELINE)]
    pub baseline: PathBuf,
    /// Same as the `json` action.
    #[arg(long)]
    pub json: bool,
}

// ---------------------------------------------------------------------------------------------
// raw counters (what a baseline stores and differences apply to)

/// Cumulative counters of one scope.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Raw {
    /// procstats::COUNTERS, summed.
    pub procs: BTreeMap<String, u64>,
    /// Decline code (`0x…`) → count: both sides, client, server.
    pub reasons: BTreeMap<String, u64>,
    pub reasons_client: BTreeMap<String, u64>,
    pub reasons_server: BTreeMap<String, u64>,
    /// `rx_ring` … → buckets.
    pub hists: BTreeMap<String, Vec<u64>>,
    /// Host scope only.
    pub ebpf: Option<BTreeMap<String, u64>>,
    /// Flattened daemon counters (gauges excluded).
    pub daemon: Option<BTreeMap<String, u64>>,
    /// When the daemon started (Unix seconds), to tell a restart.
    pub daemon_started: Option<u64>,
}

fn sub_map(cur: &BTreeMap<String, u64>, base: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    cur.iter()
        .map(|(k, &v)| {
            let b = base.get(k).copied().unwrap_or(0);
            // A counter below its baseline was reset at its source: count from zero.
            (k.clone(), if v >= b { v - b } else { v })
        })
        .collect()
}

impl Raw {
    fn minus(&self, base: &Raw) -> Raw {
        let daemon_same = match (self.daemon_started, base.daemon_started) {
            (Some(a), Some(b)) => a.abs_diff(b) <= 2,
            _ => false,
        };
        Raw {
            procs: sub_map(&self.procs, &base.procs),
            reasons: sub_map(&self.reasons, &base.reasons),
            reasons_client: sub_map(&self.reasons_client, &base.reasons_client),
            reasons_server: sub_map(&self.reasons_server, &base.reasons_server),
            hists: self
                .hists
                .iter()
                .map(|(k, v)| {
                    let b = base.hists.get(k).cloned().unwrap_or_default();
                    let d = v
                        .iter()
                        .enumerate()
                        .map(|(i, &x)| {
                            let y = b.get(i).copied().unwrap_or(0);
                            if x >= y {
                                x - y
                            } else {
                                x
                            }
                        })
                        .collect();
                    (k.clone(), d)
                })
                .collect(),
            ebpf: match (&self.ebpf, &base.ebpf) {
                (Some(c), Some(b)) => Some(sub_map(c, b)),
                (c, _) => c.clone(),
            },
            daemon: match (&self.daemon, &base.daemon) {
                (Some(c), Some(b)) if daemon_same => Some(sub_map(c, b)),
                (c, _) => c.clone(),
            },
            daemon_started: self.daemon_started,
        }
    }

    fn p(&self, k: &str) -> u64 {
        self.procs.get(k).copied().unwrap_or(0)
    }

    /// Adds the data path's figures of `o` (cgroup baselines are summed over a scope).
    fn add_procs(&mut self, o: &Raw) {
        for (dst, src) in [
            (&mut self.procs, &o.procs),
            (&mut self.reasons, &o.reasons),
            (&mut self.reasons_client, &o.reasons_client),
            (&mut self.reasons_server, &o.reasons_server),
        ] {
            for (k, v) in src {
                let e = dst.entry(k.clone()).or_insert(0);
                *e = e.wrapping_add(*v);
            }
        }
        for (k, v) in &o.hists {
            let e = self.hists.entry(k.clone()).or_default();
            if e.len() < v.len() {
                e.resize(v.len(), 0);
            }
            for (d, x) in e.iter_mut().zip(v) {
                *d = d.wrapping_add(*x);
            }
        }
    }
}

fn code_key(code: u32) -> String {
    format!("{code:#010x}")
}

fn raw_from_snapshot(s: &Snapshot) -> Raw {
    let m = |t: &BTreeMap<u32, u64>| t.iter().map(|(c, n)| (code_key(*c), *n)).collect();
    Raw {
        procs: s
            .counters
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect(),
        reasons: m(&s.reasons),
        reasons_client: m(&s.reasons_client),
        reasons_server: m(&s.reasons_server),
        hists: s
            .hists
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect(),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// the per-process files

/// What the directory held.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ProcScan {
    pub dir: String,
    /// Sum per cgroup id (0 = unknown).
    #[serde(skip)]
    pub per_cgroup: BTreeMap<u64, Snapshot>,
    /// Files of running processes.
    pub live_processes: u64,
    /// Aggregates of exited processes.
    pub exited_aggregates: u64,
    /// Files of processes that are gone, folded into aggregates by this run.
    pub stale_folded: u64,
    /// Files of processes that are gone, left as they are (no write access).
    pub stale_kept: u64,
    /// Live processes whose cgroup was read from `/proc/<pid>/cgroup` because their file does
    /// not record it.
    pub cgroup_from_proc: u64,
    /// SMC-D connections open now (Σ smcd_client + smcd_server − closed_conns over the files
    /// of running processes).
    #[serde(skip)]
    pub live_smcd_by_cgroup: BTreeMap<u64, i64>,
    /// Fold/lock problems.
    pub warnings: Vec<String>,
}

/// Reads the directory tree: the top directory and its `uid-<n>` subdirectories (see
/// `procstats::StatsDir::tree`), and one level of other subdirectories (one per container: a
/// container gets its own, mounted at its `/run/smc/procs`, as its pids collide with the
/// host's and other containers'), each with its own `uid-<n>` subdirectories. Live files,
/// aggregates, stale files (folded when possible). Nothing in it can make this block for longer
/// than [`procstats::READER_LOCK_WAIT`] per directory, nor read a FIFO, device or oversized
/// file: such entries are skipped with a warning.
pub fn scan_procs(dir: &Path) -> ProcScan {
    let mut scan = scan_one(dir);
    let Ok(rd) = fs::read_dir(dir) else {
        return scan;
    };
    let mut subs: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| {
            e.file_type().is_ok_and(|t| t.is_dir())
                && !e.file_name().as_encoded_bytes().starts_with(b".")
                // The per-uid subdirectories are part of `scan_one(dir)` already.
                && !e.file_name().as_encoded_bytes().starts_with(b"uid-")
        })
        .map(|e| e.path())
        .collect();
    subs.sort();
    for sub in subs {
        let s = scan_one(&sub);
        for (cg, snap) in s.per_cgroup {
            scan.per_cgroup
                .entry(cg)
                .or_insert_with(|| Snapshot {
                    cgroup_id: cg,
                    ..Default::default()
                })
                .add(&snap);
        }
        for (cg, n) in s.live_smcd_by_cgroup {
            *scan.live_smcd_by_cgroup.entry(cg).or_insert(0) += n;
        }
        scan.live_processes += s.live_processes;
        scan.exited_aggregates += s.exited_aggregates;
        scan.stale_folded += s.stale_folded;
        scan.stale_kept += s.stale_kept;
        scan.cgroup_from_proc += s.cgroup_from_proc;
        scan.warnings.extend(s.warnings);
    }
    scan
}

fn scan_one(dir: &Path) -> ProcScan {
    let mut scan = ProcScan {
        dir: dir.display().to_string(),
        ..Default::default()
    };
    let mut warnings = Vec::new();
    let Ok(dirs) = procstats::StatsDir::tree(dir, &mut warnings) else {
        return scan;
    };
    scan.warnings = warnings;
    for d in &dirs {
        scan_dir(&mut scan, d);
    }
    scan
}

/// Open SMC-D connections are counted over the files of running processes only: those of a
/// process that is gone were closed with it.
fn add_to_scan(scan: &mut ProcScan, cg: u64, s: &Snapshot, live: bool) {
    scan.per_cgroup
        .entry(cg)
        .or_insert_with(|| Snapshot {
            cgroup_id: cg,
            ..Default::default()
        })
        .add(s);
    if live {
        let open = s.get("smcd_client") as i64 + s.get("smcd_server") as i64
            - s.get("closed_conns") as i64;
        *scan.live_smcd_by_cgroup.entry(cg).or_insert(0) += open;
    }
}

fn scan_dir(scan: &mut ProcScan, d: &procstats::StatsDir) {
    // Without write access nothing is folded and stale files are read as they are. A lock held
    // for longer than the wait (only the directory's owner or root can hold it) leaves this
    // directory read without folding: a uid can only disturb its own figures.
    let lock = match d.lock(procstats::READER_LOCK_WAIT) {
        Ok(l) => Some(l),
        Err(e) => {
            if !e.is_permission() {
                scan.warnings.push(format!(
                    "lock of {}: {e}; read without folding",
                    d.path().display()
                ));
            }
            None
        }
    };
    let mut names = d.names();
    // Stale files first, so that the aggregates read afterwards include them.
    names.sort_by_key(|n| n.starts_with(procstats::AGGREGATE_PREFIX));
    let mut aggregates = BTreeSet::new();
    for name in names {
        if name.starts_with(procstats::AGGREGATE_PREFIX) {
            aggregates.insert(name);
            continue;
        }
        if name.parse::<u64>().is_err() {
            continue;
        }
        let (bytes, s) = match d.read_snapshot(&name) {
            Ok(v) => v,
            Err(e) if e.not_found() => continue, // folded meanwhile by its exiting writer
            Err(e) => {
                scan.warnings
                    .push(format!("ignored {}: {e}", d.path().join(&name).display()));
                continue;
            }
        };
        if procstats::is_live(&s) {
            scan.live_processes += 1;
            let cg = if s.valid & procstats::VALID_IDENTITY != 0 && s.cgroup_id != 0 {
                s.cgroup_id
            } else {
                scan.cgroup_from_proc += 1;
                procstats::proc_cgroup_id(&s.pid.to_string()).unwrap_or(0)
            };
            add_to_scan(scan, cg, &s, true);
            continue;
        }
        // Gone: fold into its cgroup's aggregate when we may write, else count as it is.
        if lock.is_some() {
            match d.fold_into_aggregate(s.cgroup_id, &bytes) {
                Ok(()) => {
                    let _ = d.remove(&name);
                    scan.stale_folded += 1;
                    continue;
                }
                Err(e) => scan
                    .warnings
                    .push(format!("fold {}: {e}", d.path().join(&name).display())),
            }
        }
        scan.stale_kept += 1;
        add_to_scan(scan, s.cgroup_id, &s, false);
    }
    // The aggregates, re-listed: folding may have created some.
    aggregates.extend(
        d.names()
            .into_iter()
            .filter(|n| n.starts_with(procstats::AGGREGATE_PREFIX)),
    );
    if lock.is_some() && aggregates.len() > PRUNE_AGGREGATES_ABOVE {
        prune_aggregates(d, &mut aggregates, &mut scan.warnings);
    }
    for name in aggregates {
        match d.read_snapshot(&name) {
            Ok((_, s)) => {
                scan.exited_aggregates += 1;
                add_to_scan(scan, s.cgroup_id, &s, false);
            }
            Err(e) if e.not_found() => {}
            Err(e) => scan
                .warnings
                .push(format!("ignored {}: {e}", d.path().join(&name).display())),
        }
    }
    drop(lock);
}

/// Above this many aggregates, those of cgroups that no longer exist are merged into
/// `exited-0`, so that container churn does not leave one file per container behind.
const PRUNE_AGGREGATES_ABOVE: usize = 32;

fn prune_aggregates(
    d: &procstats::StatsDir,
    names: &mut BTreeSet<String>,
    warnings: &mut Vec<String>,
) {
    let ids: BTreeMap<u64, String> = names
        .iter()
        .filter_map(|n| {
            let id = n.strip_prefix(procstats::AGGREGATE_PREFIX)?.parse().ok()?;
            (id != 0).then(|| (id, n.clone()))
        })
        .collect();
    let found = crate::sys::cgroup_paths_by_inode(ids.keys().copied().collect());
    for (id, n) in ids {
        if found.contains_key(&id) {
            continue;
        }
        let Ok(b) = d.read(&n) else { continue };
        match d.fold_into_aggregate(0, &b) {
            Ok(()) => {
                let _ = d.remove(&n);
                names.remove(&n);
                names.insert(procstats::aggregate_name(0));
            }
            Err(e) => warnings.push(format!("merge {}: {e}", d.path().join(&n).display())),
        }
    }
}

impl ProcScan {
    /// The sum over the given cgroups (all when `None`).
    fn sum(&self, ids: Option<&BTreeSet<u64>>) -> (Snapshot, i64) {
        let mut total = Snapshot::default();
        let mut open = 0;
        for (cg, s) in &self.per_cgroup {
            if ids.is_none_or(|ids| ids.contains(cg)) {
                total.add(s);
                open += self.live_smcd_by_cgroup.get(cg).copied().unwrap_or(0);
            }
        }
        (total, open)
    }
}

// ---------------------------------------------------------------------------------------------
// the daemon

struct DaemonView {
    stats: Option<smc_ism::Stats>,
    error: Option<String>,
    /// Live DMBs by size bucket (from the DMB list).
    live_hist: Option<[u64; HIST_BUCKETS]>,
}

fn daemon_view(socket: &Path) -> DaemonView {
    let mut c = match smc_ism::Client::connect(socket) {
        Ok(c) => c,
        Err(e) => {
            return DaemonView {
                stats: None,
                error: Some(e.to_string()),
                live_hist: None,
            }
        }
    };
    let stats = c.stats();
    let list = c.list_dmbs().ok();
    let live_hist = list.map(|l| {
        let mut h = [0u64; HIST_BUCKETS];
        for d in l {
            h[procstats::hist_bucket(d.size)] += 1;
        }
        h
    });
    match stats {
        Ok(s) => DaemonView {
            stats: Some(s),
            error: None,
            live_hist,
        },
        Err(e) => DaemonView {
            stats: None,
            error: Some(e.to_string()),
            live_hist: None,
        },
    }
}

fn daemon_counters(s: &smc_ism::Stats) -> BTreeMap<String, u64> {
    let mut out = s.figures();
    out.retain(|k, _| !smc_ism::Stats::is_gauge(k));
    out
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// baseline

#[derive(Debug, Default, Serialize, Deserialize)]
struct Baseline {
    version: u32,
    created_unix: u64,
    procs_dir: String,
    /// `host`, `cgroup:<id>`.
    scopes: BTreeMap<String, (u64, Raw)>,
}

fn load_baseline(path: &Path) -> Option<Baseline> {
    let b: Baseline = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    (b.version == 1).then_some(b)
}

fn save_baseline(path: &Path, b: &Baseline) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(b)?)
        .with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// gathering

/// Which processes a scope covers.
struct Scope {
    key: String,
    cgroup: Option<PathBuf>,
    /// Cgroup ids (the directory and its descendants); `None` = host.
    ids: Option<BTreeSet<u64>>,
}

fn scope_of(cgroup: Option<&Path>) -> Result<Scope> {
    match cgroup {
        None => Ok(Scope {
            key: "host".into(),
            cgroup: None,
            ids: None,
        }),
        Some(dir) => {
            let dir = fs::canonicalize(dir).with_context(|| format!("{}", dir.display()))?;
            let id = fs::metadata(&dir)?.ino();
            Ok(Scope {
                key: cgroup_key(id),
                ids: Some(conns::cgroup_tree(&dir).into_iter().map(|x| x.1).collect()),
                cgroup: Some(dir),
            })
        }
    }
}

/// Everything read once.
struct Inputs {
    scan: ProcScan,
    ebpf: BTreeMap<&'static str, u64>,
    ebpf_loaded: bool,
    daemon: DaemonView,
    conns: Vec<conns::ConnInfo>,
    conn_notes: Option<conns::Notes>,
}

fn gather(a: &StatsArgs, scope: &Scope, ask_daemon: bool) -> Inputs {
    let ebpf_loaded = Path::new(bpf::PIN_ROOT).join("maps").exists();
    let ebpf = bpf::counters().unwrap_or_default();
    let scan = scan_procs(&a.procs_dir);
    let daemon = if ask_daemon {
        daemon_view(&a.socket)
    } else {
        DaemonView {
            stats: None,
            error: None,
            live_hist: None,
        }
    };
    let (conns, conn_notes) = match conns::collect(&conns::Options {
        socket: a.socket.clone(),
        procs_dir: a.procs_dir.clone(),
        cgroup: scope.cgroup.clone(),
        listening: false,
    }) {
        Ok((c, n)) => (c, Some(n)),
        Err(_) => (Vec::new(), None),
    };
    Inputs {
        scan,
        ebpf,
        ebpf_loaded,
        daemon,
        conns,
        conn_notes,
    }
}

fn raw_of(inp: &Inputs, scope: &Scope) -> Raw {
    let (sum, _) = inp.scan.sum(scope.ids.as_ref());
    let mut raw = raw_from_snapshot(&sum);
    if scope.ids.is_none() && inp.ebpf_loaded {
        raw.ebpf = Some(inp.ebpf.iter().map(|(k, v)| (k.to_string(), *v)).collect());
    }
    // The daemon is host-wide: its figures are shown in every scope.
    if let Some(s) = &inp.daemon.stats {
        raw.daemon = Some(daemon_counters(s));
        raw.daemon_started = Some(now_unix().saturating_sub(s.uptime_secs));
    }
    raw
}

// ---------------------------------------------------------------------------------------------
// the figures

fn reasons_list(m: &BTreeMap<String, u64>) -> Vec<Value> {
    let mut v: Vec<(&String, &u64)> = m.iter().filter(|(_, &n)| n > 0).collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    v.into_iter()
        .map(|(code, n)| {
            let c = u32::from_str_radix(code.trim_start_matches("0x"), 16).unwrap_or(0);
            json!({
                "code": code,
                "name": smc_common::diag::reason_name(c),
                "count": n,
            })
        })
        .collect()
}

fn hist_obj(h: Option<&Vec<u64>>) -> Value {
    match h {
        None => Value::Null,
        Some(h) => Value::Object(
            HIST_NAMES
                .iter()
                .enumerate()
                .map(|(i, n)| (n.to_string(), json!(h.get(i).copied().unwrap_or(0))))
                .collect(),
        ),
    }
}

/// The baseline of a scope: the host's, or the sum of the scope's cgroups' (a cgroup without
/// an entry had nothing at the reset); `None` when nothing of the scope was reset.
fn scope_base(b: &Baseline, scope: &Scope) -> Option<(u64, Raw)> {
    let Some(ids) = &scope.ids else {
        return b.scopes.get("host").cloned();
    };
    let mut out: Option<(u64, Raw)> = None;
    for id in ids {
        if let Some((t, r)) = b.scopes.get(&cgroup_key(*id)) {
            let e = out.get_or_insert_with(|| (*t, Raw::default()));
            e.0 = e.0.min(*t);
            e.1.add_procs(r);
        }
    }
    // The daemon's figures (host-wide) count from the host's reset.
    if let (Some((_, r)), Some((_, h))) = (out.as_mut(), b.scopes.get("host")) {
        r.daemon = h.daemon.clone();
        r.daemon_started = h.daemon_started;
    }
    out
}

fn cgroup_key(id: u64) -> String {
    format!("cgroup:{id}")
}

/// Builds every figure of a scope as JSON (what `json` prints and `show` formats).
fn figures(a: &StatsArgs, inp: &Inputs, scope: &Scope, base: Option<&Baseline>) -> Value {
    let abs = raw_of(inp, scope);
    let base = base
        .filter(|_| !a.absolute)
        .and_then(|b| scope_base(b, scope));
    let r = match &base {
        Some((_, br)) => abs.minus(br),
        None => abs.clone(),
    };
    let baseline_unix = base.as_ref().map(|(t, _)| *t);
    let (sum_abs, open_smcd) = inp.scan.sum(scope.ids.as_ref());
    let valid = sum_abs.valid;
    let smcd_client = r.p("smcd_client");
    let smcd_server = r.p("smcd_server");
    let smcd = smcd_client + smcd_server;
    let fb_c = r.p("fallback_client");
    let fb_s = r.p("fallback_server");
    let closed = r.p("closed_conns");
    let requests = r.p("rx_calls") + r.p("tx_calls");
    let avg = if closed > 0 {
        (requests as f64 / closed as f64 * 10.0).round() / 10.0
    } else {
        0.0
    };
    let live = conns::live(&inp.conns);
    let eb = |k: &str| r.ebpf.as_ref().map(|m| m.get(k).copied().unwrap_or(0));
    let same_host_pairs = eb("same_host_pairs");
    let side_reasons = valid & procstats::VALID_SIDE_REASONS != 0;
    let ring = valid & procstats::VALID_RING_HIST != 0;
    let req = valid & procstats::VALID_REQ_HIST != 0;
    let fork_exec = valid & procstats::VALID_FORK_EXEC != 0;
    let peek = valid & procstats::VALID_PEEK != 0;
    let opt = |on: bool, k: &str| if on { json!(r.p(k)) } else { Value::Null };
    let special = r.p("special_sendfile")
        + r.p("special_splice")
        + r.p("special_oob")
        + if peek { r.p("special_peek") } else { 0 }
        + if fork_exec {
            r.p("special_fork") + r.p("special_exec")
        } else {
            0
        };
    let daemon = match &inp.daemon.stats {
        None => json!({
            "running": false,
            "socket": a.socket.display().to_string(),
            "error": inp.daemon.error,
        }),
        Some(s) => {
            let mut figs: BTreeMap<String, u64> = r.daemon.clone().unwrap_or_default();
            let all = s.figures();
            for g in smc_ism::Stats::GAUGES {
                if let Some(v) = all.get(*g) {
                    figs.insert(g.to_string(), *v);
                }
            }
            let cg = scope.cgroup.as_ref().and_then(|dir| {
                let root = crate::sys::cgroup2_root().ok()?;
                let rel = dir.strip_prefix(root).ok()?;
                let rel = format!("/{}", rel.display());
                s.cgroups.iter().find(|c| c.path == rel).cloned()
            });
            json!({
                "running": true,
                "socket": a.socket.display().to_string(),
                "gid": s.gid,
                "figures": figs,
                "live_dmb_hist": inp.daemon.live_hist.map(|h| hist_obj(Some(&h.to_vec()))),
                "cgroup": cg.map(|c| json!({"dmbs": c.dmbs, "bytes": c.bytes, "refused": c.refused})),
            })
        }
    };
    json!({
        "scope": if scope.ids.is_some() { "cgroup" } else { "host" },
        "cgroup": scope.cgroup.as_ref().map(|p| p.display().to_string()),
        "absolute": baseline_unix.is_none(),
        "baseline_unix": baseline_unix,
        "connections": {
            "total": smcd + fb_c + fb_s,
            "smcd": smcd,
            "smcd_client": smcd_client,
            "smcd_server": smcd_server,
            "smcd_open": open_smcd.max(0),
            "handshake_errors": r.p("handshake_errors"),
            "avg_requests_per_conn": avg,
            "tcp_fallback": fb_c + fb_s,
            "tcp_fallback_client": fb_c,
            "tcp_fallback_server": fb_s,
            "fallback_reasons": reasons_list(&r.reasons),
            "fallback_reasons_client": if side_reasons { json!(reasons_list(&r.reasons_client)) } else { Value::Null },
            "fallback_reasons_server": if side_reasons { json!(reasons_list(&r.reasons_server)) } else { Value::Null },
            "pending_connects": r.p("pending_connects"),
            "shortcut_sockets": eb("shortcut_sockets"),
            "shortcut_messages": eb("msg_redirected"),
            "shortcut_bytes": eb("bytes_redirected"),
            "same_host_pairs": same_host_pairs,
            "same_host_not_smcd": same_host_pairs.map(|p| p.saturating_sub(smcd_client)),
        },
        "live": {
            "connections": live.connections,
            "smcd": live.smcd,
            "shortcut": live.shortcut,
            "tcp": live.tcp,
            "same_host_tcp": live.same_host_tcp,
            "same_host_tcp_reasons": live.tcp_reasons,
        },
        "rx": {
            "bytes": r.p("rx_bytes"),
            "requests": r.p("rx_calls"),
            "buffer_full": r.p("rx_buffer_full"),
            "ring_hist": if ring { hist_obj(r.hists.get("rx_ring")) } else { Value::Null },
            "req_hist": if req { hist_obj(r.hists.get("rx_req")) } else { Value::Null },
        },
        "tx": {
            "bytes": r.p("tx_bytes"),
            "requests": r.p("tx_calls"),
            "buffer_full_remote": r.p("tx_buffer_full"),
            "ring_hist": if ring { hist_obj(r.hists.get("tx_ring")) } else { Value::Null },
            "req_hist": if req { hist_obj(r.hists.get("tx_req")) } else { Value::Null },
        },
        "extras": {
            "special_calls": special,
            "sendfile": r.p("special_sendfile"),
            "splice": r.p("special_splice"),
            "urgent_data": r.p("special_oob"),
            "peek": opt(peek, "special_peek"),
            "fork": opt(fork_exec, "special_fork"),
            "exec": opt(fork_exec, "special_exec"),
            "doorbells_sent": r.p("doorbells_sent"),
            "doorbells_received": r.p("doorbells_received"),
        },
        "ebpf": r.ebpf,
        "daemon": daemon,
        "sources": {
            "procs_dir": inp.scan.dir,
            "live_processes": inp.scan.live_processes,
            "exited_aggregates": inp.scan.exited_aggregates,
            "stale_folded": inp.scan.stale_folded,
            "stale_kept": inp.scan.stale_kept,
            "cgroup_from_proc": inp.scan.cgroup_from_proc,
            "ebpf_loaded": inp.ebpf_loaded,
            "daemon_running": inp.daemon.stats.is_some(),
            "connection_records": inp.conn_notes.as_ref().map(|n| n.processes_with_records > 0),
            "warnings": inp.scan.warnings,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// text

/// `1234567` → `1.2M` (binary units, like smc-tools' abbreviations).
fn abbrev(v: u64) -> String {
    const U: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut x = v as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v}")
    } else if x < 10.0 {
        format!("{x:.2}{}", U[i])
    } else if x < 100.0 {
        format!("{x:.1}{}", U[i])
    } else {
        format!("{x:.0}{}", U[i])
    }
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64 * 100.0
    }
}

fn hist_row(label: &str, h: &Value) -> String {
    let Some(m) = h.as_object() else {
        return format!(
            "  {label:<5}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  (not recorded)",
            "-", "-", "-", "-", "-", "-", "-", "-"
        );
    };
    let g = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
    // smc-tools' columns: ≤8K … 512K, and >512K (1024K and above together).
    let cols = [
        g("8k"),
        g("16k"),
        g("32k"),
        g("64k"),
        g("128k"),
        g("256k"),
        g("512k"),
        g("1024k") + g("gt_1024k"),
    ];
    let mut s = format!("  {label:<5}");
    for c in cols {
        s.push_str(&format!("  {:>6}", abbrev(c)));
    }
    s
}

fn print_reasons(list: &Value, max: usize) {
    for r in list.as_array().into_iter().flatten().take(max) {
        println!(
            "     {:<23}{:>12}",
            r["name"].as_str().unwrap_or("?"),
            n(&r["count"])
        );
    }
}

fn print_text(f: &Value, details: bool) {
    let c = &f["connections"];
    let l = &f["live"];
    let title = match f["cgroup"].as_str() {
        Some(cg) => format!("SMC-D Connections Summary (cgroup {cg})"),
        None => "SMC-D Connections Summary".to_string(),
    };
    println!("{title}");
    println!("  Total connections handled  {:>12}", n(&c["total"]));
    if details {
        println!(
            "  SMC-D connections          {:>12} (client {}, server {})",
            n(&c["smcd"]),
            n(&c["smcd_client"]),
            n(&c["smcd_server"])
        );
    } else {
        println!("  SMC-D connections          {:>12}", n(&c["smcd"]));
    }
    println!("    open now                 {:>12}", n(&c["smcd_open"]));
    println!(
        "  Handshake errors           {:>12}",
        n(&c["handshake_errors"])
    );
    println!(
        "  Avg requests per SMC conn  {:>14.1}",
        c["avg_requests_per_conn"].as_f64().unwrap_or(0.0)
    );
    if details {
        println!(
            "  TCP fallback               {:>12} (client {}, server {})",
            n(&c["tcp_fallback"]),
            n(&c["tcp_fallback_client"]),
            n(&c["tcp_fallback_server"])
        );
    } else {
        println!("  TCP fallback               {:>12}", n(&c["tcp_fallback"]));
    }
    let max = if details { usize::MAX } else { 3 };
    if details && !c["fallback_reasons_server"].is_null() {
        if c["fallback_reasons_server"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            println!("    Server");
            print_reasons(&c["fallback_reasons_server"], max);
        }
        if c["fallback_reasons_client"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            println!("    Client");
            print_reasons(&c["fallback_reasons_client"], max);
        }
    } else {
        print_reasons(&c["fallback_reasons"], max);
    }
    match c["shortcut_sockets"].as_u64() {
        Some(s) => {
            println!("  Shortcut (sk_msg) sockets  {s:>12}");
            if details {
                println!(
                    "    messages redirected      {:>12}",
                    n(&c["shortcut_messages"])
                );
                println!(
                    "    bytes redirected         {:>12}",
                    n(&c["shortcut_bytes"])
                );
            }
        }
        None => println!("  Shortcut (sk_msg) sockets  {:>12}", "n/a"),
    }
    match c["same_host_pairs"].as_u64() {
        Some(p) => {
            println!("  Same-host connections      {p:>12}");
            println!(
                "    not on SMC-D             {:>12}",
                n(&c["same_host_not_smcd"])
            );
        }
        None => println!("  Same-host connections      {:>12}", "n/a"),
    }
    println!(
        "  Live now                   {:>12} (SMC-D {}, shortcut {}, TCP {}, same-host TCP {})",
        n(&l["connections"]),
        n(&l["smcd"]),
        n(&l["shortcut"]),
        n(&l["tcp"]),
        n(&l["same_host_tcp"])
    );
    if let Some(m) = l["same_host_tcp_reasons"].as_object() {
        let mut v: Vec<(&String, u64)> = m.iter().map(|(k, x)| (k, n(x))).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (k, x) in v.into_iter().take(max) {
            println!("     {k:<23}{x:>12}");
        }
    }
    println!();
    for (dir, title) in [("rx", "RX Stats"), ("tx", "TX Stats")] {
        let d = &f[dir];
        println!("{title}");
        let bytes = n(&d["bytes"]);
        println!(
            "  Data transmitted (Bytes) {:>14} ({})",
            bytes,
            abbrev(bytes)
        );
        let reqs = n(&d["requests"]);
        println!("  Total requests             {reqs:>12}");
        if dir == "rx" {
            let full = n(&d["buffer_full"]);
            println!(
                "  Buffer full                {full:>12} ({:.2}%)",
                pct(full, reqs)
            );
        } else {
            let full = n(&d["buffer_full_remote"]);
            println!(
                "  Buffer full (remote)       {full:>12} ({:.2}%)",
                pct(full, reqs)
            );
        }
        println!("            8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB");
        println!("{}", hist_row("Bufs", &d["ring_hist"]));
        println!("{}", hist_row("Reqs", &d["req_hist"]));
        println!();
    }
    let e = &f["extras"];
    println!("Extras");
    println!(
        "  Special socket calls       {:>12}",
        n(&e["special_calls"])
    );
    if details {
        let na = |v: &Value| match v.as_u64() {
            Some(x) => format!("{x:>12}"),
            None => format!("{:>12}", "n/a"),
        };
        println!("    sendfile                 {:>12}", n(&e["sendfile"]));
        println!("    splice                   {:>12}", n(&e["splice"]));
        println!("    urgent data              {:>12}", n(&e["urgent_data"]));
        println!("    MSG_PEEK                 {}", na(&e["peek"]));
        println!("    fork                     {}", na(&e["fork"]));
        println!("    exec                     {}", na(&e["exec"]));
        println!(
            "  Doorbells sent / received  {:>12} / {}",
            n(&e["doorbells_sent"]),
            n(&e["doorbells_received"])
        );
    }
    println!();
    let d = &f["daemon"];
    println!("Daemon (loopback-ism)");
    if d["running"].as_bool() != Some(true) {
        println!(
            "  daemon not running ({}: {})",
            d["socket"].as_str().unwrap_or("?"),
            d["error"].as_str().unwrap_or("?")
        );
    } else {
        let g = &d["figures"];
        println!(
            "  GID                        {}",
            d["gid"].as_str().unwrap_or("?")
        );
        println!(
            "  Live DMBs                  {:>12} ({} bytes, {} attachments)",
            n(&g["live_dmbs"]),
            n(&g["live_bytes"]),
            n(&g["live_attachments"])
        );
        println!(
            "  Registrations              {:>12} (failed {})",
            n(&g["ops_register_requests"]),
            n(&g["ops_register_failed"])
        );
        println!(
            "  Attaches                   {:>12} (failed {})",
            n(&g["ops_attach_requests"]),
            n(&g["ops_attach_failed"])
        );
        println!(
            "  Clients                    {:>12} connected ({} total)",
            n(&g["clients_connected"]),
            n(&g["clients_total"])
        );
        if let Some(cg) = d["cgroup"].as_object() {
            println!(
                "  This cgroup                {:>12} DMBs ({} bytes, {} refused)",
                cg.get("dmbs").map(n).unwrap_or(0),
                cg.get("bytes").map(n).unwrap_or(0),
                cg.get("refused").map(n).unwrap_or(0)
            );
        }
        if details {
            println!("            8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB");
            println!("{}", hist_row("Live", &d["live_dmb_hist"]));
            if let Some(m) = g.as_object() {
                for (k, v) in m {
                    if n(v) > 0 && (k.starts_with("failures_") || k.starts_with("ops_")) {
                        println!("    {k:<26} {:>12}", n(v));
                    }
                }
            }
        }
    }
    if details {
        if let Some(m) = f["ebpf"].as_object() {
            println!();
            println!("eBPF counters (host-wide)");
            for (k, v) in m {
                println!("  {k:<27}{:>12}", n(v));
            }
        }
    }
    println!();
    let s = &f["sources"];
    let since = match f["baseline_unix"].as_u64() {
        Some(t) => format!(
            "since reset {}s ago (-a: absolute)",
            now_unix().saturating_sub(t)
        ),
        None => "absolute".to_string(),
    };
    println!(
        "Figures {since}; {} live process file(s), {} exited aggregate(s) in {}; eBPF {}",
        n(&s["live_processes"]),
        n(&s["exited_aggregates"]),
        s["procs_dir"].as_str().unwrap_or("?"),
        if s["ebpf_loaded"].as_bool() == Some(true) {
            "loaded"
        } else {
            "not loaded"
        }
    );
    if n(&s["cgroup_from_proc"]) > 0 {
        println!(
            "note: {} process file(s) do not record their cgroup; it was read from /proc/<pid>/cgroup",
            n(&s["cgroup_from_proc"])
        );
    }
    if f["scope"] == "cgroup" {
        println!(
            "note: eBPF counters (shortcut, same-host pairs) are host-wide: not shown per cgroup"
        );
    }
    println!("note: RX/TX bytes and requests are counted when a connection closes");
}

// ---------------------------------------------------------------------------------------------
// entry points

/// `smc-ctl stats`.
pub fn run(a: StatsArgs) -> Result<()> {
    crate::sys::require_root()?;
    let action = if a.json {
        Action::Json
    } else {
        a.action.unwrap_or_default()
    };
    let scope = scope_of(a.cgroup.as_deref())?;
    let inp = gather(&a, &scope, true);
    for w in &inp.scan.warnings {
        eprintln!("warning: {w}");
    }
    let procs_dir = a.procs_dir.display().to_string();
    match action {
        Action::Reset => {
            let mut b = load_baseline(&a.baseline)
                .filter(|b| b.procs_dir == procs_dir)
                .unwrap_or_default();
            b.version = 1;
            b.procs_dir = procs_dir;
            let t = now_unix();
            b.created_unix = t;
            if scope.ids.is_none() {
                // Host-wide reset: the host and every cgroup seen.
                b.scopes.clear();
                b.scopes.insert("host".into(), (t, raw_of(&inp, &scope)));
                for cg in inp.scan.per_cgroup.keys() {
                    let s = Scope {
                        key: cgroup_key(*cg),
                        cgroup: None,
                        ids: Some([*cg].into()),
                    };
                    b.scopes.insert(s.key.clone(), (t, raw_of(&inp, &s)));
                }
            } else {
                // Each cgroup of the scope (its figures may be summed in other scopes too).
                for cg in scope.ids.iter().flatten() {
                    let s = Scope {
                        key: cgroup_key(*cg),
                        cgroup: None,
                        ids: Some([*cg].into()),
                    };
                    b.scopes.insert(s.key.clone(), (t, raw_of(&inp, &s)));
                }
            }
            save_baseline(&a.baseline, &b)?;
            println!(
                "statistics reset ({}); `smc-ctl stats -a` shows the absolute figures",
                scope
                    .cgroup
                    .as_ref()
                    .map(|p| format!("cgroup {}", p.display()))
                    .unwrap_or_else(|| "host and every cgroup".into())
            );
        }
        Action::Show | Action::Json => {
            let b = load_baseline(&a.baseline).filter(|b| b.procs_dir == procs_dir);
            let f = figures(&a, &inp, &scope, b.as_ref());
            if action == Action::Json {
                println!("{}", serde_json::to_string_pretty(&f)?);
            } else {
                print_text(&f, a.details);
            }
        }
    }
    Ok(())
}

/// Prometheus text exposition of the host-wide absolute figures (without the daemon's own,
/// which the daemon adds): the metrics hook `smc-ctl daemon --metrics` installs.
pub fn prometheus(procs_dir: &Path, socket: &Path) -> String {
    let a = StatsArgs {
        action: None,
        details: false,
        absolute: true,
        cgroup: None,
        socket: socket.to_path_buf(),
        procs_dir: procs_dir.to_path_buf(),
        baseline: PathBuf::new(),
        json: false,
    };
    let scope = Scope {
        key: "host".into(),
        cgroup: None,
        ids: None,
    };
    // The daemon reports itself: do not ask it for its stats from inside.
    let inp = gather(&a, &scope, false);
    let f = figures(&a, &inp, &scope, None);
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: Vec<(String, u64)>| {
        out.push_str(&format!(
            "# HELP smc_{name} {help}\n# TYPE smc_{name} {kind}\n"
        ));
        for (labels, v) in samples {
            out.push_str(&format!("smc_{name}{labels} {v}\n"));
        }
    };
    let groups: [(&str, &str, &[&str]); 4] = [
        (
            "connections",
            "counter",
            &[
                "total",
                "smcd_client",
                "smcd_server",
                "handshake_errors",
                "tcp_fallback_client",
                "tcp_fallback_server",
                "pending_connects",
            ],
        ),
        ("rx", "counter", &["bytes", "requests", "buffer_full"]),
        (
            "tx",
            "counter",
            &["bytes", "requests", "buffer_full_remote"],
        ),
        (
            "extras",
            "counter",
            &[
                "sendfile",
                "splice",
                "urgent_data",
                "doorbells_sent",
                "doorbells_received",
            ],
        ),
    ];
    for (g, kind, keys) in groups {
        for k in keys {
            if let Some(v) = f[g][k].as_u64() {
                metric(
                    &format!("{g}_{k}"),
                    kind,
                    &format!("smc-ctl stats json key {g}.{k}"),
                    vec![(String::new(), v)],
                );
            }
        }
    }
    metric(
        "connections_smcd_open",
        "gauge",
        "SMC-D connections open now",
        vec![(String::new(), n(&f["connections"]["smcd_open"]))],
    );
    for side in ["client", "server"] {
        let list = &f["connections"][format!("fallback_reasons_{side}")];
        let list = if list.is_null() {
            &f["connections"]["fallback_reasons"]
        } else {
            list
        };
        let samples = list
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    format!(
                        "{{side=\"{side}\",reason=\"{}\",code=\"{}\"}}",
                        r["name"].as_str().unwrap_or("?"),
                        r["code"].as_str().unwrap_or("?")
                    ),
                    n(&r["count"]),
                )
            })
            .collect();
        metric(
            &format!("fallback_reasons_{side}"),
            "counter",
            "TCP fallbacks by decline code",
            samples,
        );
    }
    for k in ["connections", "smcd", "shortcut", "tcp", "same_host_tcp"] {
        metric(
            &format!("live_{k}"),
            "gauge",
            &format!("smc-ctl stats json key live.{k}"),
            vec![(String::new(), n(&f["live"][k]))],
        );
    }
    for dir in ["rx", "tx"] {
        if let Some(m) = f[dir]["ring_hist"].as_object() {
            let samples = m
                .iter()
                .map(|(b, v)| (format!("{{bucket=\"{b}\"}}"), n(v)))
                .collect();
            metric(
                &format!("{dir}_ring_hist"),
                "counter",
                "closed SMC-D connections by DMB size",
                samples,
            );
        }
    }
    if let Some(m) = f["ebpf"].as_object() {
        for (k, v) in m {
            metric(
                &format!("ebpf_{k}"),
                "counter",
                &format!("eBPF counter {k}"),
                vec![(String::new(), n(v))],
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(pairs: &[(&str, u64)]) -> Raw {
        Raw {
            procs: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn differences() {
        let cur = Raw {
            reasons: [("0x03010000".to_string(), 5)].into(),
            ebpf: Some([("same_host_pairs".to_string(), 10)].into()),
            daemon: Some([("ops_register_ok".to_string(), 7)].into()),
            daemon_started: Some(1000),
            ..raw(&[("smcd_client", 9), ("rx_bytes", 100)])
        };
        let base = Raw {
            reasons: [("0x03010000".to_string(), 2)].into(),
            ebpf: Some([("same_host_pairs".to_string(), 4)].into()),
            daemon: Some([("ops_register_ok".to_string(), 3)].into()),
            daemon_started: Some(1001),
            ..raw(&[("smcd_client", 4), ("rx_bytes", 150)])
        };
        let d = cur.minus(&base);
        assert_eq!(d.p("smcd_client"), 5);
        // Below its baseline: its source was reset, count from zero.
        assert_eq!(d.p("rx_bytes"), 100);
        assert_eq!(d.reasons["0x03010000"], 3);
        assert_eq!(d.ebpf.unwrap()["same_host_pairs"], 6);
        assert_eq!(d.daemon.unwrap()["ops_register_ok"], 4);
        // A restarted daemon (other start time) is not subtracted.
        let restarted = Raw {
            daemon_started: Some(5000),
            ..cur.clone()
        };
        assert_eq!(restarted.minus(&base).daemon.unwrap()["ops_register_ok"], 7);
    }

    #[test]
    fn cgroup_baselines_are_summed() {
        let mut b = Baseline::default();
        b.scopes
            .insert(cgroup_key(1), (10, raw(&[("smcd_client", 2)])));
        b.scopes
            .insert(cgroup_key(2), (20, raw(&[("smcd_client", 3)])));
        let scope = |ids: &[u64]| Scope {
            key: String::new(),
            cgroup: None,
            ids: Some(ids.iter().copied().collect()),
        };
        let (t, r) = scope_base(&b, &scope(&[1, 2, 3])).unwrap();
        assert_eq!((t, r.p("smcd_client")), (10, 5));
        assert!(scope_base(&b, &scope(&[4])).is_none());
        assert!(scope_base(
            &b,
            &Scope {
                key: String::new(),
                cgroup: None,
                ids: None
            }
        )
        .is_none());
    }

    #[test]
    fn abbreviations() {
        assert_eq!(abbrev(999), "999");
        assert_eq!(abbrev(1536), "1.50K");
        assert_eq!(abbrev(75 << 20), "75.0M");
        assert_eq!(abbrev(300 << 30), "300G");
    }

    #[test]
    fn folding_a_directory() {
        use smc_stats::{Identity, ProcStats};
        let dir = std::env::temp_dir().join(format!("smc-stats-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        // A file of a process that is gone (pid 0x7fff_fff0 does not exist).
        // SAFETY: all-zero is a valid ProcStats (atomics only).
        let a: Box<ProcStats> = unsafe { Box::new(std::mem::zeroed()) };
        a.init(
            &Identity {
                pid: 0x7fff_fff0,
                cgroup_id: 42,
                start_time: 1,
                pid_ns: 0,
            },
            procstats::VALID_SIDE_REASONS,
        );
        a.smcd_client
            .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
        a.fallback(true, 0x0301_0000);
        fs::write(dir.join("2147483632"), a.to_bytes()).unwrap();
        let s = scan_procs(&dir);
        assert_eq!((s.stale_folded, s.exited_aggregates), (1, 1));
        assert!(!dir.join("2147483632").exists());
        assert!(dir.join("exited-42").exists());
        let (sum, open) = s.sum(Some(&[42].into()));
        assert_eq!(sum.get("smcd_client"), 2);
        assert_eq!(sum.get("fallback_server"), 1);
        assert_eq!(sum.reasons_server[&0x0301_0000], 1);
        assert_eq!(open, 0);
        // Read again: the same figures, from the aggregate alone.
        let again = scan_procs(&dir);
        assert_eq!(again.sum(None).0.get("smcd_client"), 2);
        assert_eq!(again.stale_folded, 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    /// A FIFO, a symbolic link to /dev/zero and a huge file where the reader looks: the scan
    /// completes (bounded wait: it used to block forever in `read` on the FIFO), skips them with
    /// warnings, and still counts the real file.
    #[test]
    fn hostile_entries_are_skipped() {
        let dir = std::env::temp_dir().join(format!("smc-stats-hostile-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let mut agg = procstats::new_aggregate(9);
        agg[24..32].copy_from_slice(&5u64.to_le_bytes()); // smcd_client
        fs::write(dir.join(procstats::aggregate_name(9)), agg).unwrap();
        let fifo = std::ffi::CString::new(dir.join("4000001").to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::os::unix::fs::symlink("/dev/zero", dir.join("exited-4000002")).unwrap();
        fs::File::create(dir.join("4000003"))
            .unwrap()
            .set_len(1 << 33)
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let d = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(scan_procs(&d));
        });
        let s = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("scan_procs did not complete (blocked on a planted entry)");
        assert_eq!(s.sum(None).0.get("smcd_client"), 5);
        for name in ["4000001", "exited-4000002", "4000003"] {
            assert!(
                s.warnings.iter().any(|w| w.contains(name)),
                "no warning about {name}: {:?}",
                s.warnings
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn aggregates_of_removed_cgroups_are_merged() {
        let dir = std::env::temp_dir().join(format!("smc-stats-prune-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let n = PRUNE_AGGREGATES_ABOVE as u64 + 3;
        for i in 0..n {
            // Ids no cgroup has.
            let id = u64::MAX - i;
            let mut b = procstats::new_aggregate(id);
            b[24..32].copy_from_slice(&1u64.to_le_bytes()); // smcd_client
            fs::write(dir.join(procstats::aggregate_name(id)), b).unwrap();
        }
        let s = scan_procs(&dir);
        assert!(s.warnings.is_empty(), "{:?}", s.warnings);
        assert_eq!(s.exited_aggregates, 1);
        assert_eq!(s.sum(None).0.get("smcd_client"), n);
        assert_eq!(s.sum(Some(&[0].into())).0.get("smcd_client"), n);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn container_subdirectories_are_read() {
        let dir = std::env::temp_dir().join(format!("smc-stats-ctr-{}", std::process::id()));
        for (sub, id) in [("ctr-a", 7u64), ("ctr-b", 8), (".hidden", 9)] {
            fs::create_dir_all(dir.join(sub)).unwrap();
            let mut b = procstats::new_aggregate(id);
            b[24..32].copy_from_slice(&1u64.to_le_bytes()); // smcd_client
            fs::write(dir.join(sub).join(procstats::aggregate_name(id)), b).unwrap();
        }
        let s = scan_procs(&dir);
        assert_eq!(s.exited_aggregates, 2);
        assert_eq!(s.sum(Some(&[7].into())).0.get("smcd_client"), 1);
        assert_eq!(s.sum(Some(&[8].into())).0.get("smcd_client"), 1);
        assert_eq!(s.sum(None).0.get("smcd_client"), 2);
        fs::remove_dir_all(&dir).unwrap();
    }
}
