//! `smc-ctl daemon`: runs the loopback-ism device (`smc_ism::spawn`) in the foreground until
//! SIGTERM/SIGINT. Under systemd (`Type=notify`, `$NOTIFY_SOCKET` set) it reports `READY=1` once
//! its socket accepts connections, and `STOPPING=1` when it shuts down.
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
    /// Once DMB files hold half of the daemon's descriptor limit: the age in milliseconds
    /// after which a DMB's memfd and state page are kept without a descriptor (shelved in a
    /// mapping of the daemon, opened again when needed), or `never`; `0`: every DMB at
    /// registration (a client's: once its server attached it). Any age when descriptors run
    /// short, but never a client's DMB before its server's attach (a minute at most). Default
    /// 1000.
    #[arg(long, value_name = "MS|never", value_parser = parse_shelve)]
    shelve_after_ms: Option<Shelve>,
    /// DMB files shelved at most (default: as many as `vm.max_map_count` less 4096 allows, a
    /// mapping each); beyond, new ones keep their descriptors.
    #[arg(long, value_name = "N")]
    max_shelved: Option<u64>,
    /// Holder processes at most (`smc-ism-holder`, children of the daemon that keep the DMB
    /// files its own shelf has no room for, each within its own `vm.max_map_count`); 0: none.
    /// Default 16.
    #[arg(long, value_name = "N")]
    max_holders: Option<u32>,
    /// Serve the figures of `smc-ctl stats` and the daemon's own as Prometheus text on
    /// http://ADDR/metrics (a local address, e.g. 127.0.0.1:9464). Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// The data path's per-process statistics directory (for --metrics, and where each client
    /// uid gets its own `uid-<n>` subdirectory).
    #[arg(long, default_value_os_t = smc_stats::default_dir())]
    procs_dir: PathBuf,
}

#[derive(Clone, Copy)]
struct Shelve(Option<u64>);

fn parse_shelve(s: &str) -> Result<Shelve, String> {
    if s == "never" {
        return Ok(Shelve(None));
    }
    s.parse()
        .map(|ms| Shelve(Some(ms)))
        .map_err(|e| format!("{s}: milliseconds or `never` ({e})"))
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
    if let Some(Shelve(v)) = a.shelve_after_ms {
        cfg.shelve_after_ms = v;
    }
    cfg.max_shelved = a.max_shelved;
    if let Some(v) = a.max_holders {
        cfg.max_holders = v;
    }
    // A process of another uid cannot create its statistics directory under a root-owned one:
    // the daemon makes it when a client of that uid connects.
    let procs = a.procs_dir.clone();
    cfg.client_hook = Some(smc_ism::ClientHook::new(move |uid, gid| {
        if let Err(e) = smc_stats::ensure_uid_dir(&procs, uid, gid) {
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
    // SIGTERM and SIGINT are blocked in every thread (the daemon's threads inherit the mask)
    // and taken by sigwait below.
    let set = signal_set(&[libc::SIGTERM, libc::SIGINT]);
    // SAFETY: a valid, initialised signal set; no old mask wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let handle = smc_ism::spawn(cfg).with_context(|| format!("daemon on {}", path.display()))?;
    notify(&format!(
        "READY=1\nSTATUS=loopback-ism device on {} (GID {})\nMAINPID={}",
        path.display(),
        handle.gid(),
        std::process::id()
    ));
    let mut sig: libc::c_int = 0;
    // SAFETY: valid set and output pointer.
    unsafe { libc::sigwait(&set, &mut sig) };
    log::info!("signal {sig}: stopping");
    notify("STOPPING=1");
    handle
        .shutdown()
        .with_context(|| format!("daemon on {}", path.display()))
}

fn signal_set(sigs: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the zeroed set; sigaddset with valid signal numbers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in sigs {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// `sd_notify(3)`: one datagram to `$NOTIFY_SOCKET` (a path, or `@name` for an abstract
/// socket). Nothing when the variable is unset; a failure is logged, never fatal.
pub fn notify(state: &str) {
    let Some(sock) = std::env::var_os("NOTIFY_SOCKET").filter(|s| !s.is_empty()) else {
        return;
    };
    if let Err(e) = send_notify(sock.as_encoded_bytes(), state.as_bytes()) {
        log::warn!("sd_notify to {}: {e}", sock.to_string_lossy());
    }
}

fn send_notify(path: &[u8], msg: &[u8]) -> std::io::Result<()> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    if path.is_empty() || path.len() >= sa.sun_path.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // `@name`: the abstract namespace (a leading NUL).
    let abstract_ns = path[0] == b'@';
    for (i, b) in path.iter().enumerate() {
        sa.sun_path[i] = if i == 0 && abstract_ns {
            0
        } else {
            *b as libc::c_char
        };
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + usize::from(!abstract_ns);
    // SAFETY: plain socket syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: msg and sa are valid for the given lengths.
    let r = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            libc::MSG_NOSIGNAL,
            (&sa as *const libc::sockaddr_un).cast(),
            len as libc::socklen_t,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
