//! `smc-ctl agent`: the per-node Kubernetes agent. It enables the pods selected by a label or an
//! annotation without an API server:
//! - **pod cgroups** come from the filesystem: the kubelet's tree under the cgroup v2 root,
//!   `kubepods.slice/[kubepods-<qos>.slice/]kubepods-[<qos>-]pod<uid_>.slice` (systemd driver)
//!   or `kubepods/[<qos>/]pod<uid>` (cgroupfs driver), rescanned every `--interval-ms`;
//! - **pod metadata** (namespace, name, labels, annotations) comes from `--pods-dir`: every
//!   `*.json` file there holding a Pod or a PodList, such as the kubelet's own `/pods` endpoint
//!   serves it (the DaemonSet's `pod-lister` container writes it there), or static pod
//!   manifests in JSON. A pod whose metadata is not there (yet) is left as it is.
//!
//! A selected pod's cgroup is attached (`smc-ctl attach`, its containers inherit the programs);
//! a pod whose cgroup disappears is forgotten (its defunct links unpinned); a pod that loses
//! its label is detached. Attachments outlive the agent (a restarted agent adopts them) unless
//! `--detach-on-exit`. With `--metrics ADDR` it serves the figures of `smc-ctl stats` per
//! enabled pod, labelled `namespace`, `pod`, `uid` (the same families as the daemon's
//! host-wide `--metrics`).
use std::{
    collections::BTreeMap,
    fs,
    io::{Read as _, Write as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde_json::Value;
use smc_common::bpf::Mode;

use crate::{bpf, sys};

/// The default selector: label or annotation `smc-rs.io/enabled=true`.
const DEFAULT_SELECTOR: &str = "smc-rs.io/enabled=true";
/// A pod metadata file larger than this is skipped (a PodList of a full node is far smaller).
const MAX_POD_FILE: u64 = 64 << 20;

#[derive(Args)]
pub struct AgentArgs {
    /// The directory holding the kubelet's `kubepods.slice` or `kubepods` (default: the cgroup
    /// v2 root).
    #[arg(long, value_name = "DIR")]
    cgroup_root: Option<PathBuf>,
    /// Pod metadata: `*.json` files each holding a Pod or a PodList (e.g. the kubelet's
    /// `/pods`).
    #[arg(long, value_name = "DIR", default_value = "/run/smc/pods")]
    pods_dir: PathBuf,
    /// Enable the pods with this label (KEY=VALUE).
    #[arg(long, value_name = "KEY=VALUE", default_value = DEFAULT_SELECTOR)]
    label: String,
    /// Enable the pods with this annotation (KEY=VALUE).
    #[arg(long, value_name = "KEY=VALUE", default_value = DEFAULT_SELECTOR)]
    annotation: String,
    /// Mode of the attached pods (see `smc-ctl attach --help`).
    #[arg(long, value_enum, default_value = "ism")]
    mode: crate::ModeArg,
    /// Rescan period of the pod cgroups and metadata, in milliseconds.
    #[arg(long, value_name = "MS", default_value = "1000")]
    interval_ms: u64,
    /// Serve the per-pod figures as Prometheus text on http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// The loopback-ism daemon's socket.
    #[arg(long, default_value_os_t = smc_ism::default_socket_path())]
    socket: PathBuf,
    /// The data path's per-process statistics directory.
    #[arg(long, default_value_os_t = smc_stats::default_dir())]
    procs_dir: PathBuf,
    /// Detach the pods this agent enabled when it stops (SIGTERM/SIGINT).
    #[arg(long)]
    detach_on_exit: bool,
}

/// What a node agent knows of a pod.
#[derive(Clone, Debug, Default, PartialEq)]
struct PodMeta {
    namespace: String,
    name: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// The pods of one JSON document (a Pod, or a PodList's `items`), by UID.
fn pods_of_json(v: &Value, out: &mut BTreeMap<String, PodMeta>) {
    if let Some(items) = v["items"].as_array() {
        for p in items {
            pods_of_json(p, out);
        }
        return;
    }
    let md = &v["metadata"];
    let Some(uid) = md["uid"].as_str() else {
        return;
    };
    out.insert(
        uid.to_ascii_lowercase(),
        PodMeta {
            namespace: md["namespace"].as_str().unwrap_or("default").to_string(),
            name: md["name"].as_str().unwrap_or("").to_string(),
            labels: string_map(&md["labels"]),
            annotations: string_map(&md["annotations"]),
        },
    );
}

/// What tells a file changed: mtime (s, ns), size, inode.
type Stamp = (i64, i64, u64, u64);

/// The pod metadata files, re-read only when they change.
#[derive(Default)]
struct PodSource {
    files: BTreeMap<PathBuf, (Stamp, BTreeMap<String, PodMeta>)>,
    warned: BTreeMap<PathBuf, String>,
}

impl PodSource {
    fn read(&mut self, dir: &Path) -> BTreeMap<String, PodMeta> {
        let mut seen = Vec::new();
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let Ok(md) = fs::metadata(&p) else { continue };
            if !md.is_file() {
                continue;
            }
            seen.push(p.clone());
            let stamp = (md.mtime(), md.mtime_nsec(), md.size(), md.ino());
            if self.files.get(&p).is_some_and(|(s, _)| *s == stamp) {
                continue;
            }
            let parsed = if md.size() > MAX_POD_FILE {
                Err(format!("larger than {MAX_POD_FILE} bytes"))
            } else {
                fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice::<Value>(&b).map_err(|e| e.to_string()))
            };
            match parsed {
                Ok(v) => {
                    let mut pods = BTreeMap::new();
                    pods_of_json(&v, &mut pods);
                    self.warned.remove(&p);
                    self.files.insert(p, (stamp, pods));
                }
                Err(e) => {
                    // Half-written (a writer without rename) or broken: keep what it held, say
                    // so once.
                    if self.warned.get(&p) != Some(&e) {
                        log::warn!("pod metadata {}: {e}", p.display());
                        self.warned.insert(p, e);
                    }
                }
            }
        }
        self.files.retain(|p, _| seen.contains(p));
        self.files
            .values()
            .flat_map(|(_, pods)| pods.iter().map(|(u, m)| (u.clone(), m.clone())))
            .collect()
    }
}

/// `KEY=VALUE` (or `KEY`, meaning any value).
fn parse_selector(s: &str) -> Selector {
    match s.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (s.to_string(), None),
    }
}

fn matches(m: &BTreeMap<String, String>, (k, v): &Selector) -> bool {
    !k.is_empty()
        && m.get(k)
            .is_some_and(|have| v.as_ref().is_none_or(|v| v == have))
}

/// The pod cgroups under `root` (`kubepods.slice` and `kubepods`, at most three levels), with
/// their UIDs.
fn pod_cgroups(root: &Path) -> BTreeMap<String, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<(PathBuf, usize)> = ["kubepods.slice", "kubepods"]
        .iter()
        .map(|d| (root.join(d), 1))
        .collect();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(rel) = dir.strip_prefix(root) else {
            continue;
        };
        if let Some(pod) = smc_cgroup::pod_of_cgroup(rel) {
            out.insert(pod.uid, dir);
            continue;
        }
        if depth >= 3 {
            continue;
        }
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    out
}

/// A pod cgroup the agent has seen.
#[derive(Clone, Debug)]
struct Tracked {
    dir: PathBuf,
    meta: Option<PodMeta>,
    /// Attached (by this agent, or adopted from a previous one).
    attached: bool,
    /// The last attach error said, not to repeat it every scan.
    error: Option<String>,
}

struct Agent {
    root: PathBuf,
    label: Selector,
    annotation: Selector,
    mode: Mode,
    source: PodSource,
    pods: BTreeMap<String, Tracked>,
}

type Selector = (String, Option<String>);

/// A pod is selected by its label or its annotation.
fn selected(m: &PodMeta, label: &Selector, annotation: &Selector) -> bool {
    matches(&m.labels, label) || matches(&m.annotations, annotation)
}

impl Agent {
    /// One pass: new pods attached, gone ones forgotten, deselected ones detached.
    fn scan(&mut self, pods_dir: &Path) {
        let metas = self.source.read(pods_dir);
        let found = pod_cgroups(&self.root);
        // Gone: the kubelet removed the pod's cgroup; its links are defunct.
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|u| !found.contains_key(*u))
            .cloned()
            .collect();
        for uid in gone {
            if let Some(t) = self.pods.remove(&uid) {
                if t.attached {
                    // Another attach or detach may have unpinned the defunct links already.
                    match bpf::detach(&t.dir) {
                        Ok(msg) => log::info!("pod {} gone: {msg}", name_of(&uid, &t)),
                        Err(e) => log::debug!("pod {} gone: {e:#}", name_of(&uid, &t)),
                    }
                    println!("forgot pod {} ({})", name_of(&uid, &t), t.dir.display());
                }
            }
        }
        for (uid, dir) in found {
            let meta = metas.get(&uid).cloned();
            let t = self.pods.entry(uid.clone()).or_insert_with(|| Tracked {
                dir: dir.clone(),
                meta: None,
                attached: false,
                error: None,
            });
            if meta.is_some() {
                t.meta = meta;
            }
            // Without metadata nothing is decided (it may come later).
            let Some(want) = t
                .meta
                .as_ref()
                .map(|m| selected(m, &self.label, &self.annotation))
            else {
                continue;
            };
            let name = name_of(&uid, t);
            if want && !t.attached {
                let res = match bpf::enabled_by(&t.dir) {
                    Ok(Some((by, _))) if by != t.dir => {
                        Err(anyhow::anyhow!("already enabled by {}", by.display()))
                    }
                    _ => bpf::attach(&t.dir, self.mode, None),
                };
                match res {
                    Ok(msg) => {
                        println!("enabled pod {name}: {msg}");
                        t.attached = true;
                        t.error = None;
                    }
                    Err(e) => {
                        let e = format!("{e:#}");
                        if t.error.as_ref() != Some(&e) {
                            eprintln!("warning: pod {name}: not enabled: {e}");
                            t.error = Some(e);
                        }
                    }
                }
            } else if !want && t.attached {
                match bpf::detach(&t.dir) {
                    Ok(msg) => println!("disabled pod {name} (no longer selected): {msg}"),
                    Err(e) => eprintln!("warning: pod {name}: detach: {e:#}"),
                }
                t.attached = false;
            }
        }
    }

    /// The enabled pods: (labels, cgroup).
    fn enabled(&self) -> Vec<(crate::stats::Labels, PathBuf)> {
        self.pods
            .iter()
            .filter(|(_, t)| t.attached)
            .map(|(uid, t)| {
                let m = t.meta.clone().unwrap_or_default();
                (
                    vec![
                        ("namespace".to_string(), m.namespace),
                        ("pod".to_string(), m.name),
                        ("uid".to_string(), uid.clone()),
                    ],
                    t.dir.clone(),
                )
            })
            .collect()
    }
}

fn name_of(uid: &str, t: &Tracked) -> String {
    match &t.meta {
        Some(m) => format!("{}/{} ({uid})", m.namespace, m.name),
        None => uid.to_string(),
    }
}

type Shared = Arc<Mutex<Vec<(crate::stats::Labels, PathBuf)>>>;

/// Serves `GET /metrics`: the families of every enabled pod, computed at each scrape (the pod
/// list is copied out of the lock first).
fn serve_metrics(l: std::net::TcpListener, pods: Shared, procs_dir: PathBuf, socket: PathBuf) {
    for s in l.incoming() {
        let Ok(mut s) = s else { continue };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") && req.len() < 16 << 10 {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(k) => req.extend_from_slice(&buf[..k]),
            }
        }
        let line = String::from_utf8_lossy(&req);
        let path = line.split_whitespace().nth(1).unwrap_or("");
        let (status, body) = if line.starts_with("GET ") && (path == "/metrics" || path == "/") {
            let list = pods.lock().map(|g| g.clone()).unwrap_or_default();
            let sets: Vec<_> = list
                .into_iter()
                .filter_map(|(labels, dir)| {
                    crate::stats::cgroup_families(&procs_dir, &socket, &dir).map(|f| (labels, f))
                })
                .collect();
            ("200 OK", crate::stats::render_metrics(&sets))
        } else {
            ("404 Not Found", "not found\n".to_string())
        };
        let _ = write!(
            s,
            "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}

/// Waits until `fd` is readable or `timeout` passes: whether it is.
fn readable(fd: &impl std::os::fd::AsFd, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd as _;
    let mut p = libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, ms) > 0 }
}

/// `smc-ctl agent`.
pub fn run(a: AgentArgs) -> Result<()> {
    sys::require_root()?;
    let root = match &a.cgroup_root {
        Some(d) => sys::check_cgroup2_dir(d)?,
        None => sys::cgroup2_root()?,
    };
    let label = parse_selector(&a.label);
    let annotation = parse_selector(&a.annotation);
    if label.0.is_empty() && annotation.0.is_empty() {
        bail!("give --label or --annotation (KEY=VALUE)");
    }
    let sig = sys::SignalFd::new(&[libc::SIGTERM, libc::SIGINT])?;
    let shared: Shared = Arc::default();
    if let Some(addr) = a.metrics {
        let l = std::net::TcpListener::bind(addr).with_context(|| format!("--metrics {addr}"))?;
        let (pods, procs, sock) = (shared.clone(), a.procs_dir.clone(), a.socket.clone());
        std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve_metrics(l, pods, procs, sock))?;
    }
    let mut agent = Agent {
        root,
        label,
        annotation,
        mode: a.mode.into(),
        source: PodSource::default(),
        pods: BTreeMap::new(),
    };
    println!(
        "watching pod cgroups under {} and pod metadata in {} (label {}, annotation {})",
        agent.root.display(),
        a.pods_dir.display(),
        a.label,
        a.annotation
    );
    let interval = Duration::from_millis(a.interval_ms.max(10));
    loop {
        agent.scan(&a.pods_dir);
        if let Ok(mut g) = shared.lock() {
            *g = agent.enabled();
        }
        if readable(&sig, interval) {
            let n = sig.take()?;
            log::info!("signal {n}: stopping");
            break;
        }
    }
    if a.detach_on_exit {
        for (uid, t) in &agent.pods {
            if t.attached {
                match bpf::detach(&t.dir) {
                    Ok(msg) => println!("pod {}: {msg}", name_of(uid, t)),
                    Err(e) => eprintln!("warning: pod {}: detach: {e:#}", name_of(uid, t)),
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_from_pod_and_pod_list() {
        let list = serde_json::json!({
            "kind": "PodList",
            "items": [
                {"metadata": {"uid": "AAAAAAAA-0000-4000-8000-000000000001", "name": "a",
                  "namespace": "ns", "labels": {"smc-rs.io/enabled": "true"}}},
                {"metadata": {"uid": "aaaaaaaa-0000-4000-8000-000000000002", "name": "b",
                  "annotations": {"x": "1", "n": 3}}},
                {"metadata": {"name": "no-uid"}},
            ]
        });
        let mut m = BTreeMap::new();
        pods_of_json(&list, &mut m);
        assert_eq!(m.len(), 2);
        let a = &m["aaaaaaaa-0000-4000-8000-000000000001"];
        assert_eq!((a.namespace.as_str(), a.name.as_str()), ("ns", "a"));
        let b = &m["aaaaaaaa-0000-4000-8000-000000000002"];
        assert_eq!(b.namespace, "default");
        assert_eq!(b.annotations.len(), 1, "non-string values are skipped");
        let sel = parse_selector(DEFAULT_SELECTOR);
        assert!(matches(&a.labels, &sel));
        assert!(!matches(&b.labels, &sel));
        assert!(matches(&b.annotations, &parse_selector("x")));
        assert!(!matches(&b.annotations, &parse_selector("x=2")));
    }
}
