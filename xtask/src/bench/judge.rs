//! Judging a run: where its processes go, what its counters must show (shortcut: little TCP;
//! SMC-D: most connections on SMC-D; fallback: nothing accelerated), and the verdict.
use std::collections::BTreeMap;

use super::cases::Case;
use super::report;
use super::report::COLUMNS;
use serde_json::{json, Value};
use smc_common::diag::POLICY_SHORT;

/// Where a process of a run is placed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// The plain cgroup, started as is.
    Plain,
    /// The cgroup attached with `--mode shortcut`, started as is.
    Shortcut,
    /// The cgroup attached with `--mode ism`, started with `smc-ctl run`.
    Smc,
}

/// What the counters of a run must show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Plain,
    Shortcut,
    Smcd,
    /// Under `smc-ctl run` with the short-connection policy on: the client connections are
    /// SMC-D or kept on TCP by the policy.
    SmcdPolicy,
    /// Fallback row, client in the shortcut cgroup: the data must still go through TCP.
    FallbackShortcut,
    /// Fallback row, client under `smc-ctl run`: no SMC-D connection, fallback decided.
    FallbackSmcd,
}

/// Largest share of plain TCP's data segments a shortcut run may still send through TCP.
pub(crate) const MAX_ACCELERATED_TCP_SHARE: f64 = 0.2;
/// Smallest share of the connections that must be SMC-D in an SMC-D run.
pub(crate) const MIN_SMCD_COVERAGE: f64 = 0.9;
/// Smallest share of plain TCP's data segments a fallback run must send through TCP.
pub(crate) const MIN_FALLBACK_TCP_SHARE: f64 = 0.5;

/// One repetition of one case in one mode.
pub(crate) struct Outcome {
    pub(crate) server_cmd: Vec<String>,
    pub(crate) client_cmd: Vec<String>,
    pub(crate) metrics: BTreeMap<String, f64>,
    pub(crate) error: Option<String>,
    /// Deltas over the client run: host-wide eBPF counters, the private daemon's counters, the
    /// namespace's TCP counters; `smc-ctl stats --json` of the run's processes when it exists.
    pub(crate) ebpf: BTreeMap<String, f64>,
    pub(crate) daemon: BTreeMap<String, f64>,
    pub(crate) netns: BTreeMap<String, f64>,
    pub(crate) datapath: BTreeMap<String, f64>,
    /// The data path's per-process statistics of the run, summed over its processes.
    pub(crate) preload: BTreeMap<String, f64>,
    /// TCP data segments per unit of work, against plain TCP's in the same case.
    pub(crate) tcp_share: Option<f64>,
    pub(crate) verdict: Verdict,
    pub(crate) seconds: f64,
}

#[derive(Clone, Debug)]
pub(crate) enum Verdict {
    Ok,
    Failed(String),
    FellBack(String),
    NotFallback(String),
}

impl Verdict {
    pub(crate) fn short(&self) -> String {
        match self {
            Verdict::Ok => "ok".into(),
            Verdict::Failed(e) => format!("FAILED ({e})"),
            Verdict::FellBack(e) => format!("fell back ({e})"),
            Verdict::NotFallback(e) => format!("not a fallback ({e})"),
        }
    }
}

impl Outcome {
    pub(crate) fn summary(&self) -> String {
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

    pub(crate) fn to_json(&self, case: &Case, col: &str, rep: usize) -> Value {
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

    pub(crate) fn units(&self, case: &Case) -> Option<f64> {
        match case.units {
            Some(k) => self.metrics.get(k).copied().filter(|u| *u > 0.0),
            None => Some(1.0),
        }
    }

    /// Segments with payload the namespace's TCP sent: `TCPOrigDataSent` counts the FINs too,
    /// two per connection (`ActiveOpens`), which are no payload.
    pub(crate) fn data_segs(&self) -> f64 {
        (get(&self.netns, "TcpExt.TCPOrigDataSent") - 2.0 * get(&self.netns, "Tcp.ActiveOpens"))
            .max(0.0)
    }

    /// TCP payload segments per unit of work.
    pub(crate) fn segs_per_unit(&self, case: &Case) -> Option<f64> {
        if self.error.is_some() {
            return None;
        }
        Some(self.data_segs() / self.units(case)?)
    }
}

/// Where server and client run in a column, and what the counters must show.
pub(crate) fn placement(fallback: bool, col: usize) -> (Place, Place, Expect) {
    match (fallback, col) {
        (_, 0) => (Place::Plain, Place::Plain, Expect::Plain),
        (false, 1) => (Place::Shortcut, Place::Shortcut, Expect::Shortcut),
        (false, _) => (Place::Smc, Place::Smc, Expect::Smcd),
        (true, 1) => (Place::Plain, Place::Shortcut, Expect::FallbackShortcut),
        (true, _) => (Place::Plain, Place::Smc, Expect::FallbackSmcd),
    }
}

pub(crate) fn get(m: &BTreeMap<String, f64>, k: &str) -> f64 {
    m.get(k).copied().unwrap_or(0.0)
}

pub(crate) fn median(mut v: Vec<f64>) -> Option<f64> {
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
pub(crate) fn judge_case(
    ci: usize,
    case: &Case,
    outcomes: &mut BTreeMap<(usize, usize), Vec<Outcome>>,
) {
    let reference = outcomes
        .get(&(ci, 0))
        .and_then(|os| median(os.iter().filter_map(|o| o.segs_per_unit(case)).collect()))
        .filter(|r| *r > 0.0);
    for col in 0..COLUMNS.len() {
        let expect = match placement(case.fallback, col).2 {
            Expect::Smcd if case.policy_tcp => Expect::SmcdPolicy,
            e => e,
        };
        for o in outcomes.get_mut(&(ci, col)).into_iter().flatten() {
            o.tcp_share = reference.and_then(|r| o.segs_per_unit(case).map(|s| s / r));
            o.verdict = judge(expect, o);
        }
    }
}

pub(crate) fn judge(expect: Expect, o: &Outcome) -> Verdict {
    if let Some(e) = &o.error {
        return Verdict::Failed(e.clone());
    }
    let share = o.tcp_share;
    let pct = |s: f64| format!("{:.0}%", s * 100.0);
    let p = &o.preload;
    let smcd = get(p, "smcd_client") + get(p, "smcd_server");
    let fallback = get(p, "fallback_client") + get(p, "fallback_server");
    // Attaches, and connection ends served by a PAIR (each attaches the peer's DMB).
    let attached = get(&o.daemon, "ops.attach.ok")
        + get(&o.daemon, "ops.attach_peer.ok")
        + get(&o.daemon, "ops.pair.ok");
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
        Expect::SmcdPolicy => {
            let client = get(p, "smcd_client") + get(p, "fallback_client");
            let kept =
                get(p, "smcd_client") + get(p, &format!("fallback_reason_{POLICY_SHORT:#010x}"));
            if p.get("processes").is_none() {
                Verdict::FellBack("no data path statistics (was the library loaded?)".into())
            } else if client <= 0.0 || kept / client < MIN_SMCD_COVERAGE {
                Verdict::FellBack(format!(
                    "only {} of the client connections SMC-D or kept on TCP by the policy{}",
                    pct(if client > 0.0 { kept / client } else { 0.0 }),
                    reasons()
                ))
            } else {
                Verdict::Ok
            }
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

/// Figures computed from the counters of a run, per unit of work (connection or request):
/// `ebpf_ns_per_unit` / `ebpf_runs_per_unit` (the `smc_*` programs' run time and runs,
/// `kernel.bpf_stats_enabled`; host-wide, but the bench holds the test lock), and the daemon's
/// mean handling time of a REGISTER, an ATTACH and a PAIR request (`daemon_register_us`,
/// `daemon_attach_us`, `daemon_pair_us`: a PAIR is one per connection end, its DMB and the
/// peer's).
/// Always present (0 where nothing ran), so that every column has the row.
pub(crate) fn derived_metrics(case: &Case, o: &mut Outcome) {
    let units = o.units(case).unwrap_or(0.0);
    let (mut ns, mut runs) = (0.0, 0.0);
    for (k, v) in &o.ebpf {
        if k.starts_with("prog.") && k.ends_with(".run_time_ns") {
            ns += v;
        } else if k.starts_with("prog.") && k.ends_with(".run_cnt") {
            runs += v;
        }
    }
    let per = |x: f64| if units > 0.0 { x / units } else { 0.0 };
    o.metrics.insert("ebpf_ns_per_unit".into(), per(ns));
    o.metrics.insert("ebpf_runs_per_unit".into(), per(runs));
    for op in ["register", "attach", "pair"] {
        let n = get(&o.daemon, &format!("ops.{op}.requests"));
        let t = get(&o.daemon, &format!("ops.{op}.nanos"));
        let us = if n > 0.0 { t / n / 1000.0 } else { 0.0 };
        o.metrics.insert(format!("daemon_{op}_us"), us);
    }
}
