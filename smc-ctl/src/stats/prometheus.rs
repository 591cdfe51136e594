//! Prometheus text exposition of the figures (the `smc-ctl daemon --metrics` hook).
use std::path::{Path, PathBuf};

use super::collect::{gather, Scope};
use super::model::figures;
use super::text::n;
use super::StatsArgs;

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
