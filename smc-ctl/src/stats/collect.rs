//! Collection: the scope (host or a cgroup), the daemon's view, and every input of one run
//! (per-process files, eBPF counters, daemon, live connections).
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};
use smc_stats::{self as procstats, HIST_BUCKETS};

use super::raw::{raw_from_snapshot, Raw};
use super::StatsArgs;
use crate::procs::{scan_procs, ProcScan};
use crate::{bpf, conns};

pub(crate) struct DaemonView {
    pub(crate) stats: Option<smc_ism::Stats>,
    pub(crate) error: Option<String>,
    /// Live DMBs by size bucket (from the DMB list).
    pub(crate) live_hist: Option<[u64; HIST_BUCKETS]>,
}

pub(crate) fn daemon_view(socket: &Path) -> DaemonView {
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

pub(crate) fn daemon_counters(s: &smc_ism::Stats) -> BTreeMap<String, u64> {
    let mut out = s.figures();
    out.retain(|k, _| !smc_ism::Stats::is_gauge(k));
    out
}

pub(crate) fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Which processes a scope covers.
pub(crate) struct Scope {
    /// `host`, or [`cgroup_key`] of the cgroup: the scope's entry in the baseline.
    pub(crate) key: String,
    pub(crate) cgroup: Option<PathBuf>,
    /// Cgroup ids (the directory and its descendants); `None` = host.
    pub(crate) ids: Option<BTreeSet<u64>>,
}

/// The key of a cgroup's scope (`cgroup:<id>`).
pub(crate) fn cgroup_key(id: u64) -> String {
    format!("cgroup:{id}")
}

pub(crate) fn scope_of(cgroup: Option<&Path>) -> Result<Scope> {
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
pub(crate) struct Inputs {
    pub(crate) scan: ProcScan,
    pub(crate) ebpf: BTreeMap<&'static str, u64>,
    pub(crate) ebpf_loaded: bool,
    pub(crate) daemon: DaemonView,
    pub(crate) conns: Vec<conns::ConnInfo>,
    pub(crate) conn_notes: Option<conns::Notes>,
}

pub(crate) fn gather(a: &StatsArgs, scope: &Scope, ask_daemon: bool) -> Inputs {
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

pub(crate) fn raw_of(inp: &Inputs, scope: &Scope) -> Raw {
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
