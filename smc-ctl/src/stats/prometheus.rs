//! Prometheus text exposition of the figures: the metric families are defined once
//! ([`families`]) and rendered for the host (the `smc-ctl daemon --metrics` hook) or for any set
//! of labelled scopes (`smc-ctl agent --metrics`: one per pod).
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::collect::{gather, scope_of, Scope};
use super::model::figures;
use super::text::n;
use super::StatsArgs;

/// Label pairs of one sample.
pub type Labels = Vec<(String, String)>;

/// One metric family: `smc_<name>` with its type, help and samples.
pub struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(Labels, u64)>,
}

fn args(procs_dir: &Path, socket: &Path) -> StatsArgs {
    StatsArgs {
        action: None,
        details: false,
        absolute: true,
        cgroup: None,
        socket: socket.to_path_buf(),
        procs_dir: procs_dir.to_path_buf(),
        baseline: PathBuf::new(),
        json: false,
    }
}

/// Prometheus text exposition of the host-wide absolute figures (without the daemon's own,
/// which the daemon adds): the metrics hook `smc-ctl daemon --metrics` installs.
pub fn prometheus(procs_dir: &Path, socket: &Path) -> String {
    let a = args(procs_dir, socket);
    let scope = Scope {
        key: "host".into(),
        cgroup: None,
        ids: None,
    };
    // The daemon reports itself: do not ask it for its stats from inside.
    let inp = gather(&a, &scope, false);
    render(&[(Vec::new(), families(&figures(&a, &inp, &scope, None)))])
}

/// The metric families of one cgroup (and its descendants), absolute figures, without the
/// daemon's (host-wide) ones; `None` when the cgroup is gone.
pub fn cgroup_families(procs_dir: &Path, socket: &Path, cgroup: &Path) -> Option<Vec<Family>> {
    let a = args(procs_dir, socket);
    let scope = scope_of(Some(cgroup)).ok()?;
    let inp = gather(&a, &scope, false);
    Some(families(&figures(&a, &inp, &scope, None)))
}

/// The text exposition of labelled sets of families: each family once (`# HELP`, `# TYPE`),
/// with the samples of every set, each carrying its set's labels before its own.
pub fn render(sets: &[(Labels, Vec<Family>)]) -> String {
    let mut order: Vec<(&str, &'static str, &str)> = Vec::new();
    for (_, fams) in sets {
        for f in fams {
            if !order.iter().any(|(name, _, _)| *name == f.name) {
                order.push((&f.name, f.kind, &f.help));
            }
        }
    }
    let mut out = String::new();
    for (name, kind, help) in order {
        out.push_str(&format!(
            "# HELP smc_{name} {help}\n# TYPE smc_{name} {kind}\n"
        ));
        for (set_labels, fams) in sets {
            for f in fams.iter().filter(|f| f.name == name) {
                for (labels, v) in &f.samples {
                    let all: Vec<String> = set_labels
                        .iter()
                        .chain(labels)
                        .map(|(k, v)| format!("{k}=\"{}\"", smc_ism::escape_label_value(v)))
                        .collect();
                    let labels = if all.is_empty() {
                        String::new()
                    } else {
                        format!("{{{}}}", all.join(","))
                    };
                    out.push_str(&format!("smc_{name}{labels} {v}\n"));
                }
            }
        }
    }
    out
}

/// Every metric family of a scope's figures (`figures` JSON).
pub fn families(f: &Value) -> Vec<Family> {
    let mut out = Vec::new();
    let mut metric = |name: &str, kind: &'static str, help: &str, samples: Vec<(Labels, u64)>| {
        out.push(Family {
            name: name.to_string(),
            kind,
            help: help.to_string(),
            samples,
        });
    };
    let l = |pairs: &[(&str, &str)]| -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
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
                    vec![(Vec::new(), v)],
                );
            }
        }
    }
    metric(
        "connections_smcd_open",
        "gauge",
        "SMC-D connections open now",
        vec![(Vec::new(), n(&f["connections"]["smcd_open"]))],
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
                    l(&[
                        ("side", side),
                        ("reason", r["name"].as_str().unwrap_or("?")),
                        ("code", r["code"].as_str().unwrap_or("?")),
                    ]),
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
            vec![(Vec::new(), n(&f["live"][k]))],
        );
    }
    for dir in ["rx", "tx"] {
        if let Some(m) = f[dir]["ring_hist"].as_object() {
            let samples = m.iter().map(|(b, v)| (l(&[("bucket", b)]), n(v))).collect();
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
                vec![(Vec::new(), n(v))],
            );
        }
    }
    out
}
