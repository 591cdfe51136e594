//! The model: every figure of a scope as JSON (what `json` prints, `show` formats and the
//! Prometheus text flattens).
use std::collections::BTreeMap;

use serde_json::{json, Value};
use smc_stats::{self as procstats, HIST_NAMES};

use super::baseline::{scope_base, Baseline};
use super::collect::{raw_of, Inputs, Scope};
use super::StatsArgs;
use crate::conns;

pub(crate) fn reasons_list(m: &BTreeMap<String, u64>) -> Vec<Value> {
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

pub(crate) fn hist_obj(h: Option<&Vec<u64>>) -> Value {
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

/// Builds every figure of a scope as JSON (what `json` prints and `show` formats).
pub(crate) fn figures(
    a: &StatsArgs,
    inp: &Inputs,
    scope: &Scope,
    base: Option<&Baseline>,
) -> Value {
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
