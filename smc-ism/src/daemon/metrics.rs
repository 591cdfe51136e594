//! Optional Prometheus text exposition (`GET /metrics`) on a local TCP address
//! ([`DaemonConfig::metrics_addr`](super::DaemonConfig::metrics_addr), off by default).
//!
//! The daemon's own counters (`smc_ism_*`) plus whatever the configured
//! [`MetricsHook`] renders (`smc-ctl daemon --metrics` adds the eBPF counters and the data
//! path's figures, the same as `smc-ctl stats json`). Minimal HTTP/1.x: one request per
//! connection, a bounded request head, a deadline, a bounded number of concurrent scrapes.
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use super::conn::Shared;

/// Renders extra Prometheus text (complete `# HELP`/`# TYPE`/sample lines) for each scrape. It
/// runs on a blocking thread, so it may read files and maps.
#[derive(Clone)]
pub struct MetricsHook(pub Arc<dyn Fn() -> String + Send + Sync>);

impl MetricsHook {
    /// Wraps a renderer.
    pub fn new(f: impl Fn() -> String + Send + Sync + 'static) -> MetricsHook {
        MetricsHook(Arc::new(f))
    }
}

impl std::fmt::Debug for MetricsHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MetricsHook(..)")
    }
}

const MAX_HEAD: usize = 8192;
const DEADLINE: Duration = Duration::from_secs(5);
const MAX_CONCURRENT: usize = 8;

/// A Prometheus label value escaped as the text format wants (backslash, double quote,
/// newline); `smc-ctl`'s metric families use it too.
pub fn escape_label_value(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The daemon's own figures as Prometheus text.
pub(crate) fn render_daemon(shared: &Shared) -> String {
    // The metrics address is the administrator's: everything, as root sees it.
    let stats = shared.reg.stats(shared.events.generation(), true);
    let mut out = String::new();
    for (k, val) in stats.figures() {
        let kind = if crate::Stats::is_gauge(&k) {
            "gauge"
        } else {
            "counter"
        };
        let _ = writeln!(
            out,
            "# HELP smc_ism_{k} loopback-ism daemon figure {k}\n# TYPE smc_ism_{k} {kind}\nsmc_ism_{k} {val}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP smc_ism_info loopback-ism device identity\n# TYPE smc_ism_info gauge\nsmc_ism_info{{gid=\"{}\"}} 1",
        escape_label_value(&stats.gid)
    );
    type Figure = fn(&crate::CgroupStats) -> u64;
    let figures: [(&str, &str, Figure); 3] = [
        ("dmbs", "live DMBs owned by the cgroup", |c| c.dmbs),
        ("bytes", "bytes of the cgroup's live DMBs", |c| c.bytes),
        (
            "refused",
            "registrations refused by the cgroup's quota",
            |c| c.refused,
        ),
    ];
    for (name, help, get) in figures {
        let _ = writeln!(
            out,
            "# HELP smc_ism_cgroup_{name} {help}\n# TYPE smc_ism_cgroup_{name} gauge"
        );
        for c in &stats.cgroups {
            let _ = writeln!(
                out,
                "smc_ism_cgroup_{name}{{cgroup=\"{}\"}} {}",
                escape_label_value(&c.path),
                get(c)
            );
        }
    }
    out
}

async fn handle(mut s: TcpStream, shared: Arc<Shared>, hook: Option<MetricsHook>) {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
            let n = s.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            head.extend_from_slice(&buf[..n]);
            if head.len() > MAX_HEAD {
                return None;
            }
        }
        Some(())
    };
    if tokio::time::timeout(DEADLINE, read)
        .await
        .ok()
        .flatten()
        .is_none()
    {
        return;
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.lines().next().unwrap_or("").split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, body) = if method != "GET" && method != "HEAD" {
        ("405 Method Not Allowed", "only GET\n".to_string())
    } else if path != "/metrics" && path != "/" {
        ("404 Not Found", "see /metrics\n".to_string())
    } else {
        let sh = shared.clone();
        let body = tokio::task::spawn_blocking(move || {
            let mut b = render_daemon(&sh);
            if let Some(h) = hook {
                b.push_str(&(h.0)());
            }
            b
        })
        .await
        .unwrap_or_default();
        ("200 OK", body)
    };
    let mut resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        resp.extend_from_slice(body.as_bytes());
    }
    let _ = tokio::time::timeout(DEADLINE, s.write_all(&resp)).await;
    let _ = s.shutdown().await;
}

/// Serves scrapes until `stop` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    hook: Option<MetricsHook>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONCURRENT));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => {
                let Ok((s, _)) = r else { continue };
                // Beyond the limit a scrape is closed at once rather than queued.
                let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
                let (sh, h) = (shared.clone(), hook.clone());
                tokio::spawn(async move {
                    handle(s, sh, h).await;
                    drop(permit);
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read as _, Write as _};

    fn get(addr: std::net::SocketAddr, req: &str) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut r = String::new();
        s.read_to_string(&mut r).unwrap();
        r
    }

    #[test]
    fn scrape_has_daemon_figures_and_the_hook() {
        let dir = std::env::temp_dir().join(format!("smc-ism-metrics-{}", std::process::id()));
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let mut cfg = crate::DaemonConfig::with_paths(dir.join("ctl.sock"), dir.join("state"));
        cfg.metrics_addr = Some(port);
        cfg.metrics_hook = Some(MetricsHook::new(|| {
            "# TYPE smc_extra counter\nsmc_extra 42\n".to_string()
        }));
        let d = crate::spawn(cfg).unwrap();
        let mut c = crate::Client::connect(&dir.join("ctl.sock")).unwrap();
        c.query_gid().unwrap();
        let r = get(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK"), "{r}");
        assert!(r.contains("\nsmc_ism_ops_query_gid_ok 1\n"), "{r}");
        assert!(
            r.contains("# TYPE smc_ism_live_dmbs gauge\nsmc_ism_live_dmbs 0\n"),
            "{r}"
        );
        assert!(r.contains("\nsmc_extra 42\n"), "{r}");
        assert!(r.contains("smc_ism_info{gid=\""), "{r}");
        let body = r.split_once("\r\n\r\n").unwrap().1;
        let len: usize = r
            .lines()
            .find_map(|l| l.strip_prefix("Content-Length: "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(body.len(), len);
        assert!(get(port, "GET /x HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(port, "POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // A client that never finishes its request head is dropped, the others still served.
        let _idle = std::net::TcpStream::connect(port).unwrap();
        assert!(get(port, "GET / HTTP/1.0\n\n").starts_with("HTTP/1.1 200"));
        drop(c);
        d.shutdown().unwrap();
        // Stopped with the daemon.
        assert!(std::net::TcpStream::connect(port).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
