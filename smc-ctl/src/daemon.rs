//! `smc-ctl daemon`: runs the loopback-ism device (`smc_ism::serve`) in the foreground.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use clap::Args;

#[derive(Args)]
pub struct DaemonArgs {
    /// Unix socket the data path connects to.
    #[arg(long, default_value = smc_ism::DEFAULT_SOCKET_PATH)]
    socket: PathBuf,
    /// Permission bits of the socket (octal).
    #[arg(long, default_value = "666", value_parser = parse_octal)]
    socket_mode: u32,
    /// Directory holding the persistent GID.
    #[arg(long, default_value = smc_ism::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// Live DMBs on the host at most.
    #[arg(long)]
    max_dmbs: Option<u32>,
    /// Bytes of all live DMBs at most.
    #[arg(long)]
    max_total_bytes: Option<u64>,
    /// Live DMBs per cgroup at most.
    #[arg(long)]
    cgroup_max_dmbs: Option<u32>,
    /// Bytes of live DMBs per cgroup at most.
    #[arg(long)]
    cgroup_max_bytes: Option<u64>,
    /// Serve the figures of `smc-ctl stats` and the daemon's own as Prometheus text on
    /// http://ADDR/metrics (a local address, e.g. 127.0.0.1:9464). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// The data path's per-process statistics directory (for --metrics, and where each client
    /// uid gets its own `uid-<n>` subdirectory).
    #[arg(long, default_value_os_t = smc_common::procstats::default_dir())]
    procs_dir: PathBuf,
}

fn parse_octal(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8).map_err(|e| format!("{s}: not an octal mode ({e})"))
}

pub fn run(a: DaemonArgs) -> Result<()> {
    let mut cfg = smc_ism::DaemonConfig {
        socket_path: a.socket,
        socket_mode: a.socket_mode,
        state_dir: a.state_dir,
        ..Default::default()
    };
    if let Some(v) = a.max_dmbs {
        cfg.max_dmbs = v;
    }
    if let Some(v) = a.max_total_bytes {
        cfg.max_total_bytes = v;
    }
    if let Some(v) = a.cgroup_max_dmbs {
        cfg.cgroup_max_dmbs = v;
    }
    if let Some(v) = a.cgroup_max_bytes {
        cfg.cgroup_max_bytes = v;
    }
    // A process of another uid cannot create its statistics directory under a root-owned one:
    // the daemon makes it when a client of that uid connects.
    let procs = a.procs_dir.clone();
    cfg.client_hook = Some(smc_ism::ClientHook::new(move |uid, gid| {
        if let Err(e) = smc_common::procstats::ensure_uid_dir(&procs, uid, gid) {
            log::warn!(
                "statistics directory of uid {uid} in {}: {e}",
                procs.display()
            );
        }
    }));
    if let Some(addr) = a.metrics {
        if !addr.ip().is_loopback() {
            log::warn!("--metrics {addr}: not a loopback address; the figures describe this host's traffic");
        }
        cfg.metrics_addr = Some(addr);
        let (procs, sock) = (a.procs_dir.clone(), cfg.socket_path.clone());
        cfg.metrics_hook = Some(smc_ism::MetricsHook::new(move || {
            crate::stats::prometheus(&procs, &sock)
        }));
    }
    let path = cfg.socket_path.clone();
    smc_ism::run_blocking(cfg).with_context(|| format!("daemon on {}", path.display()))
}
