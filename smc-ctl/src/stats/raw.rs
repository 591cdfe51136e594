//! Raw counters of one scope: what a baseline stores and differences apply to.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use smc_stats::Snapshot;

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

pub(crate) fn sub_map(
    cur: &BTreeMap<String, u64>,
    base: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    cur.iter()
        .map(|(k, &v)| {
            let b = base.get(k).copied().unwrap_or(0);
            // A counter below its baseline was reset at its source: count from zero.
            (k.clone(), if v >= b { v - b } else { v })
        })
        .collect()
}

impl Raw {
    pub(crate) fn minus(&self, base: &Raw) -> Raw {
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

    pub(crate) fn p(&self, k: &str) -> u64 {
        self.procs.get(k).copied().unwrap_or(0)
    }

    /// Adds the data path's figures of `o` (cgroup baselines are summed over a scope).
    pub(crate) fn add_procs(&mut self, o: &Raw) {
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

pub(crate) fn code_key(code: u32) -> String {
    format!("{code:#010x}")
}

pub(crate) fn raw_from_snapshot(s: &Snapshot) -> Raw {
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
