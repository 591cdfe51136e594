//! The daemon: configuration, listener, accept loop, shutdown.

mod closer;
mod conn;
mod diag;
mod gid;
mod grant;
mod handed_on;
mod holder;
mod metrics;
mod pair;
mod registry;
mod shelf;
mod sweep;

pub use metrics::{escape_label_value, MetricsHook};

use std::fs;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::client::{unix_addr, Gid, DEFAULT_SOCKET_PATH};
use crate::error::IsmError;
use crate::sys;

use conn::{Events, Shared};
use registry::Registry;

/// Default state directory (the GID lives in `<state_dir>/gid`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/smc";

/// Daemon configuration. `Default` gives the production defaults.
#[derive(Clone, Debug)]
pub struct DaemonConfig {
    /// Unix socket path (default [`DEFAULT_SOCKET_PATH`]). Its directory is created (mode 0755)
    /// when missing. A lock file `<socket_path>.lock` guarantees a single daemon per path.
    pub socket_path: PathBuf,
    /// Permission bits of the socket (default 0o666: every local process may use SMC-D; the
    /// authorisation is per operation — see the crate docs). Use 0o660 with `socket_gid` to
    /// restrict SMC-D to a group.
    pub socket_mode: u32,
    /// Group owner of the socket, if set.
    pub socket_gid: Option<u32>,
    /// State directory (default [`DEFAULT_STATE_DIR`]); holds the persistent GID.
    pub state_dir: PathBuf,
    /// Device slots, i.e. live DMBs on the host (at most 1 << 20; default [`default_max_dmbs`]:
    /// what half of the host's memory holds at the 16 KiB a DMB is charged at least, at most
    /// the 262 144 sockets the eBPF maps hold, one DMB per connection end; 262 144 on a host of
    /// 8 GiB or more). A DMB's memfd and its owner's state page cost the daemon a descriptor each
    /// until they are shelved (see `shelve_after_ms`); it raises its `RLIMIT_NOFILE` towards two
    /// per slot.
    pub max_dmbs: u32,
    /// Committed bytes of all live DMBs together (default: half of the host's memory,
    /// `MemTotal`; 8 GiB when unknown). The byte quotas count memory in use, not nominal DMB
    /// sizes: each DMB is charged 16 KiB (or its size, if smaller) when it is registered, and
    /// what its memfd commits beyond that (touched pages, `st_blocks`) as last sampled (see
    /// `commit_sample_ms`). A DMB's pages exist only once written, and the data path gives a
    /// drained ring's pages back, so idle connections cost little whatever their ring size.
    pub max_total_bytes: u64,
    /// Live DMBs owned by one cgroup (default: half of the default `max_dmbs`, so that one
    /// container holding both ends of its connections reaches 65 536 SMC-D connections on a
    /// host of 8 GiB or more, and no single one takes the whole device).
    pub cgroup_max_dmbs: u32,
    /// Committed bytes of live DMBs owned by one cgroup, counted as `max_total_bytes` (default:
    /// a quarter of the host's memory; 4 GiB when unknown).
    pub cgroup_max_bytes: u64,
    /// Committed memory is sampled (one `fstat` per live DMB) at a registration or a stats
    /// request at most this often, in milliseconds (default 1000; 0: every time).
    pub commit_sample_ms: u64,
    /// Refuse registration (decline MEM) when MemAvailable would drop below this (default
    /// 64 MiB; 0 disables the check).
    pub min_available_bytes: u64,
    /// Also require that an attaching client is in the owner's cgroup (default false: SMC-D
    /// between containers of one host is the point of loopback-ism; the mirror proof is what
    /// authorises an attach).
    pub require_same_cgroup: bool,
    /// Connected clients at most; beyond, new connections of uids other than root are closed
    /// at once (default 16384).
    pub max_clients: u64,
    /// Connected clients of one uid at most (root is not limited); beyond, its new
    /// connections are closed at once (default 1024).
    pub uid_max_clients: u64,
    /// Live DMBs registered by one uid at most (root is not limited; default: a quarter of the
    /// default `max_dmbs`, 65 536 on a host of 8 GiB or more).
    /// Beyond, registration is refused with `QuotaDmbs` and detail 2 (decline MAX_DMB).
    pub uid_max_dmbs: u32,
    /// The eBPF same-host map pinned by `smc-ctl` (default
    /// `/sys/fs/bpf/smc/maps/SMC_PEERS`): where the daemon finds the peer socket of a
    /// connection whose other end is in another network namespace. `None`: not used (such
    /// connections cannot be attached and fall back to TCP).
    pub bpf_peers_map: Option<PathBuf>,
    /// The eBPF socket storage pinned by `smc-ctl` (default
    /// `/sys/fs/bpf/smc/maps/SMC_SOCK_STATE`): after a verified attach the daemon marks the
    /// attacher's socket there as allowed to enable the `sk_msg` shortcut (the only way an
    /// `ism`-mode socket gets it). `None` or missing: no grant, doorbells go over TCP.
    pub bpf_sock_state_map: Option<PathBuf>,
    /// The directory of `smc-ctl`'s cgroup link pins (default `/sys/fs/bpf/smc/links`),
    /// named `<cgroup inode>-…`: the attached cgroups, whose quota their sub-cgroups share.
    pub bpf_links_dir: Option<PathBuf>,
    /// Serve Prometheus text exposition (`GET /metrics`) on this TCP address (default: off).
    /// Meant for a local address (e.g. `127.0.0.1:9464`); the figures are not secret (no
    /// tokens) but describe the host's traffic.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Extra figures appended to every scrape (see [`MetricsHook`]).
    pub metrics_hook: Option<MetricsHook>,
    /// Called with each client's uid and gid (`SO_PEERCRED`) on a blocking thread before its
    /// first request is served (see [`ClientHook`]).
    pub client_hook: Option<ClientHook>,
    /// DMBs one client connection may keep pooled for reuse (`OP_RELEASE` with
    /// `RELEASE_POOL_OWN`; default 64, 0: none). They stay registered and charged to their
    /// quotas while pooled.
    pub pool_max_per_client: u32,
    /// Milliseconds a pooled DMB stays unused before it is freed (default 1000): an idle
    /// process does not keep its pool.
    pub pool_idle_ms: u64,
    /// Milliseconds after its registration a DMB's memfd and state page may be *shelved*: kept
    /// in a `PROT_NONE` mapping of the daemon instead of a descriptor, and opened again
    /// through it when a client needs them (`OP_ADOPT`, a pooled DMB bound again), so that
    /// established connections cost the daemon no descriptor (default 1000; 0: every one at
    /// once; `None`: never). They are, once such files hold half of the daemon's descriptors
    /// (any age above three quarters, and at once when only a few are left); never those of a
    /// client's DMB that waits for its first attach (for a minute at most; with 0, shelved at
    /// that attach): a server past its CLC accept makes it, when the daemon may have no
    /// descriptor left to open a shelved file again. Needs
    /// `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE` (`/proc/self/map_files`); without, the
    /// descriptors are kept. Each shelved file costs a mapping (`vm.max_map_count`).
    pub shelve_after_ms: Option<u64>,
    /// Files shelved at most (default `None`: as many as `vm.max_map_count` less a reserve of
    /// 4096 mappings allows). Beyond, new files keep their descriptors, as when the mappings run
    /// out (tests make that case with it; an operator may bound the kernel's memory for them).
    pub max_shelved: Option<u64>,
    /// References kept at most for sockets handed on (default 262 144, about 120 bytes each):
    /// a client that lets go of a DMB reference while its socket is still held by another
    /// process (a forked child, an exec'd image, a receiver of the fd) has the reference kept
    /// until nobody holds the socket, so that the holder keeps the connection. Beyond, such a
    /// reference is released at once (`failures.kept_full`).
    pub max_kept: u32,
    /// Of those, kept for clients of one uid at most (root is not limited; default 65 536):
    /// one uid cannot fill `max_kept` and have another's hand-ons released at once.
    pub uid_max_kept: u32,
    /// Holder processes at most (default 16; 0: none): once the daemon's own shelf is full
    /// (`vm.max_map_count` less its reserve, or `max_shelved`), the background sweep moves
    /// files into holders, child processes that keep them as mappings of their own (each its
    /// own `vm.max_map_count`), forked by a zygote the daemon starts with it
    /// (`smc-ism-zygote`, `smc-ism-holder`). They die with the daemon. See `daemon/holder.rs`.
    pub max_holders: u32,
    /// Files one holder keeps at most (default `None`: as its `vm.max_map_count` less 1024
    /// allows; tests make several holders with it).
    pub holder_max_files: Option<u64>,
}

/// What the daemon does for each new client before serving it, on its task: it must be quick (`smc-ctl
/// daemon` creates the client uid's statistics directory, which a non-root process cannot).
#[derive(Clone)]
pub struct ClientHook(pub Arc<dyn Fn(u32, u32) + Send + Sync>);

impl ClientHook {
    /// Wraps `f(uid, gid)`.
    pub fn new(f: impl Fn(u32, u32) + Send + Sync + 'static) -> ClientHook {
        ClientHook(Arc::new(f))
    }
}

impl std::fmt::Debug for ClientHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientHook(..)")
    }
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            socket_path: PathBuf::from(DEFAULT_SOCKET_PATH),
            socket_mode: 0o666,
            socket_gid: None,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            max_dmbs: default_max_dmbs(host_memory()),
            max_total_bytes: host_memory().map_or(8 << 30, |m| m / 2),
            cgroup_max_dmbs: default_max_dmbs(host_memory()) / 2,
            cgroup_max_bytes: host_memory().map_or(4 << 30, |m| m / 4),
            commit_sample_ms: 1000,
            min_available_bytes: 64 << 20,
            require_same_cgroup: false,
            max_clients: 16384,
            uid_max_clients: 1024,
            uid_max_dmbs: default_max_dmbs(host_memory()) / 4,
            bpf_peers_map: Some(PathBuf::from("/sys/fs/bpf/smc/maps/SMC_PEERS")),
            bpf_sock_state_map: Some(PathBuf::from("/sys/fs/bpf/smc/maps/SMC_SOCK_STATE")),
            bpf_links_dir: Some(PathBuf::from("/sys/fs/bpf/smc/links")),
            metrics_addr: None,
            metrics_hook: None,
            client_hook: None,
            pool_max_per_client: 64,
            pool_idle_ms: 1000,
            shelve_after_ms: Some(1000),
            max_shelved: None,
            max_kept: 1 << 18,
            uid_max_kept: 1 << 16,
            max_holders: 16,
            holder_max_files: None,
        }
    }
}

/// The default device size for a host of `mem` bytes (`MemTotal`; 8 GiB when unknown): the DMBs
/// half of it holds at the 16 KiB a registration is charged, at most
/// [`smc_common::bpf::MAX_SOCKETS`] (the eBPF maps hold that many sockets, i.e. connection ends,
/// each with one DMB), at least 4096. Before, a fixed 65 535 on the host and 4096 per cgroup:
/// nginx with 8000 keep-alive clients in one container got 2048 SMC-D connections, the rest
/// declined `MAX_DMB` (issue 14).
pub fn default_max_dmbs(mem: Option<u64>) -> u32 {
    let half = mem.unwrap_or(8 << 30) / 2;
    (half / (16 << 10)).clamp(4096, smc_common::bpf::MAX_SOCKETS as u64) as u32
}

/// `MemTotal` of `/proc/meminfo`, in bytes.
fn host_memory() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

impl DaemonConfig {
    /// Defaults with another socket path and state directory (tests, unprivileged runs).
    pub fn with_paths(socket_path: impl Into<PathBuf>, state_dir: impl Into<PathBuf>) -> Self {
        DaemonConfig {
            socket_path: socket_path.into(),
            state_dir: state_dir.into(),
            ..DaemonConfig::default()
        }
    }

    fn validate(&self) -> Result<(), IsmError> {
        if self.max_dmbs == 0 || self.max_dmbs > 1 << 20 {
            return Err(IsmError::Config("max_dmbs must be in 1..=1048576".into()));
        }
        if self.socket_mode & !0o777 != 0 {
            return Err(IsmError::Config("socket_mode has bits beyond 0o777".into()));
        }
        unix_addr(&self.socket_path).map_err(|e| IsmError::Setup {
            what: "socket path",
            path: self.socket_path.clone(),
            source: e,
        })?;
        Ok(())
    }
}

fn setup_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> IsmError + 'a {
    move |source| IsmError::Setup {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A bound daemon, before its accept loop runs.
struct Bound {
    shared: Arc<Shared>,
    listener: OwnedFd,
    _lock: fs::File,
    socket_path: PathBuf,
    socket_ino: (u64, u64),
    max_clients: u64,
    uid_max_clients: u64,
    metrics: Option<(std::net::TcpListener, Option<MetricsHook>)>,
    /// Dropped last: the holders go when the last daemon of the process stops.
    _holders: holder::Lease,
}

/// Descriptors the daemon may hold with every slot in use and nothing shelved: per live DMB
/// its memfd and the state page its owner registered with it (kept for `OP_ADOPT`); one
/// socket per client; and room for the listener, the metrics, the closer's queue and the fds
/// of a request being received. With shelves (see `shelf`) an established connection needs
/// none: then this only raises the soft limit as far as it goes.
fn nofile_need(cfg: &DaemonConfig) -> u64 {
    2 * cfg.max_dmbs as u64 + cfg.max_clients + 256
}

/// Raises the soft `RLIMIT_NOFILE` towards what the configuration needs.
fn raise_nofile(cfg: &DaemonConfig) {
    let want = nofile_need(cfg);
    // SAFETY: plain getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return;
        }
        if rl.rlim_cur as u64 >= want {
            return;
        }
        let mut target = rl;
        target.rlim_cur = want.min(rl.rlim_max as u64) as libc::rlim_t;
        if (rl.rlim_max as u64) < want {
            // Root may raise the hard limit too.
            let mut hard = rl;
            hard.rlim_cur = want as libc::rlim_t;
            hard.rlim_max = want as libc::rlim_t;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &hard) == 0 {
                return;
            }
            if cfg.shelve_after_ms.is_some() && shelf::available() {
                log::info!(
                    "RLIMIT_NOFILE hard limit {}: DMB files are shelved (kept without a \
                     descriptor) after {} ms, or sooner when descriptors run short",
                    rl.rlim_max,
                    cfg.shelve_after_ms.unwrap_or(0)
                );
            } else {
                log::warn!(
                    "RLIMIT_NOFILE hard limit {} is below the {} descriptors 2 * max_dmbs + max_clients need",
                    rl.rlim_max,
                    want
                );
            }
        }
        libc::setrlimit(libc::RLIMIT_NOFILE, &target);
    }
}

fn bind(cfg: DaemonConfig) -> Result<Bound, IsmError> {
    cfg.validate()?;
    let gid = gid::load_or_create(&cfg.state_dir)?;
    raise_nofile(&cfg);
    shelf::set_max_shelved(cfg.max_shelved);
    // Forked now, while the daemon is small (see `holder`).
    let holders = holder::start(
        if cfg.shelve_after_ms.is_some() {
            cfg.max_holders
        } else {
            0
        },
        cfg.holder_max_files,
    );

    let path = cfg.socket_path.clone();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(setup_err("creating socket directory", &dir))?;

    // One daemon per socket path: an exclusive flock, released by the kernel when we die.
    let lock_path = PathBuf::from(format!("{}.lock", path.display()));
    let lock = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(setup_err("opening lock file", &lock_path))?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(IsmError::AlreadyRunning(path));
        }
        return Err(setup_err("locking", &lock_path)(e));
    }

    let metrics = match cfg.metrics_addr {
        None => None,
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr).map_err(|source| IsmError::Setup {
                what: "binding the metrics address",
                path: PathBuf::from(addr.to_string()),
                source,
            })?;
            l.set_nonblocking(true).map_err(IsmError::Io)?;
            log::info!(
                "metrics on http://{}/metrics",
                l.local_addr().unwrap_or(addr)
            );
            Some((l, cfg.metrics_hook.clone()))
        }
    };

    // Bind under a temporary name, set owner and mode, then rename into place: the socket is
    // never reachable with the wrong permissions, and a stale socket is replaced atomically.
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "ctl.sock".into()),
        std::process::id()
    ));
    let _ = fs::remove_file(&tmp);
    let (addr, len) = unix_addr(&tmp).map_err(setup_err("socket path", &tmp))?;
    // SAFETY: plain socket syscall.
    let raw = sys::cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })
    .map_err(setup_err("creating socket", &path))?;
    // SAFETY: freshly created, owned here.
    let listener = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: addr is a valid sockaddr_un of length len.
    sys::cvt(unsafe {
        libc::bind(
            listener.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })
    .map_err(setup_err("binding", &tmp))?;
    let finish = || -> io::Result<()> {
        fs::set_permissions(&tmp, fs::Permissions::from_mode(cfg.socket_mode))?;
        if let Some(g) = cfg.socket_gid {
            std::os::unix::fs::chown(&tmp, None, Some(g))?;
        }
        // SAFETY: listen on our socket.
        sys::cvt(unsafe { libc::listen(listener.as_raw_fd(), 1024) })?;
        fs::rename(&tmp, &path)
    };
    if let Err(e) = finish() {
        let _ = fs::remove_file(&tmp);
        return Err(setup_err("setting up socket", &path)(e));
    }
    let md = fs::metadata(&path).map_err(setup_err("stat", &path))?;
    log::info!(
        "loopback-ism daemon listening on {} (GID {gid}, CHID 0xffff, {} slots)",
        path.display(),
        cfg.max_dmbs
    );
    Ok(Bound {
        shared: Arc::new(Shared {
            reg: Arc::new(Registry::new(&cfg, gid)),
            events: Events::new(),
            closer: closer::Closer::new(),
            keys: diag::CgroupKeys::new(cfg.bpf_links_dir.clone()),
            own_netns: smc_common::bpf::own_netns_cookie().ok(),
            peers_map: cfg.bpf_peers_map.clone(),
            client_hook: cfg.client_hook.clone(),
            sock_state_map: cfg.bpf_sock_state_map.clone(),
            rdv: std::sync::Mutex::new(pair::Rendezvous::default()),
            next_conn: std::sync::atomic::AtomicU64::new(1),
            pool_max: cfg.pool_max_per_client as usize,
            pool_idle: Duration::from_millis(cfg.pool_idle_ms),
        }),
        listener,
        _lock: lock,
        socket_path: path,
        socket_ino: (md.dev(), md.ino()),
        max_clients: cfg.max_clients,
        uid_max_clients: cfg.uid_max_clients,
        metrics,
        _holders: holders,
    })
}

impl Bound {
    fn gid(&self) -> Gid {
        self.shared.reg.gid
    }

    async fn run<F: Future<Output = ()>>(self, shutdown: F) -> Result<(), IsmError> {
        // SAFETY: the OwnedFd is moved into the AsyncFd, which neither replaces nor closes it
        // while registered.
        let listener = unsafe { AsyncFd::register(self.listener) }
            .map_err(|e| IsmError::Io(e.into_parts().1))?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let mut tasks = JoinSet::new();
        if let Some((l, hook)) = self.metrics {
            let l = tokio::net::TcpListener::from_std(l).map_err(IsmError::Io)?;
            tasks.spawn(metrics::serve(
                l,
                self.shared.clone(),
                hook,
                stop_rx.clone(),
            ));
        }
        tasks.spawn(sweep(self.shared.clone(), stop_rx.clone()));
        let counters = &self.shared.reg.counters;
        // A descriptor kept free for the accept of a client that would otherwise wait in the
        // listener's backlog while the daemon is at its descriptor limit (see `refuse_at_limit`).
        let mut spare = sys::placeholder_fd();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                Some(r) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = r {
                        log::error!("client task failed: {e}");
                    }
                }
                r = listener.readable() => {
                    let mut guard = r.map_err(IsmError::Io)?;
                    if spare.is_none() {
                        // Before any client takes the descriptor freed meanwhile.
                        spare = sys::placeholder_fd();
                    }
                    let res = guard.try_io(|l| {
                        // SAFETY: accept4 on our listening socket; no address wanted.
                        sys::cvt(unsafe {
                            libc::accept4(
                                l.as_raw_fd(),
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                            )
                        })
                    });
                    match res {
                        Err(_would_block) => {}
                        Ok(Ok(raw)) => {
                            // SAFETY: accept4 returned a new fd that we own.
                            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
                            counters.clients_total.fetch_add(1, Relaxed);
                            // SO_PEERCRED: the uid at connect(), which the client cannot forge.
                            let cred = sys::peer_cred(fd.as_fd()).ok();
                            let uid_n = cred.map(|c| c.uid).unwrap_or(u32::MAX);
                            // Root is never refused (it could stop the daemon anyway); other
                            // uids within the device's and their own limit.
                            let refuse = if uid_n == 0 {
                                None
                            } else if counters.clients_connected.load(Relaxed) >= self.max_clients {
                                Some(&counters.clients_refused)
                            } else {
                                None
                            };
                            let uid = self.shared.reg.uid(uid_n);
                            let refuse = refuse.or_else(|| {
                                let n = uid.conns.fetch_add(1, AcqRel);
                                if uid_n != 0 && n >= self.uid_max_clients {
                                    uid.conns.fetch_sub(1, AcqRel);
                                    Some(&counters.clients_refused_uid)
                                } else {
                                    None
                                }
                            });
                            if let Some(why) = refuse {
                                why.fetch_add(1, Relaxed);
                                log::debug!("client of uid {uid_n} refused: connection limit");
                                close_refused(&self.shared, uid_n, fd);
                                continue;
                            }
                            counters.clients_connected.fetch_add(1, AcqRel);
                            self.shared.events.bump();
                            tasks.spawn(conn::serve_conn(
                                self.shared.clone(),
                                fd,
                                cred,
                                uid,
                                stop_rx.clone(),
                            ));
                        }
                        Ok(Err(e)) => match e.raw_os_error() {
                            Some(libc::EMFILE) | Some(libc::ENFILE)
                                if refuse_at_limit(&listener, &mut spare, &self.shared) => {}
                            Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOBUFS)
                            | Some(libc::ENOMEM) => {
                                static LOG: registry::RateLog = registry::RateLog::new();
                                LOG.note(|n| log::warn!("accept: {e}; backing off ({n} times)"));
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                            _ => log::debug!("accept: {e}"),
                        },
                    }
                }
            }
        }
        log::info!("loopback-ism daemon stopping");
        drop(listener);
        // Remove the socket only if it is still ours (not replaced by a newer daemon).
        if let Ok(md) = fs::metadata(&self.socket_path) {
            if (md.dev(), md.ino()) == self.socket_ino {
                let _ = fs::remove_file(&self.socket_path);
            }
        }
        let _ = stop_tx.send(true);
        while tasks.join_next().await.is_some() {}
        Ok(())
    }
}

/// The daemon found no descriptor for a waiting client (`EMFILE`): with the `spare` one freed,
/// the client is accepted and closed at once, so that its library sees the daemon gone and
/// declines at once (`NOSMCDDEV`, backing off) instead of waiting for the reply to a request
/// nobody reads (two seconds per handshake of every new process while the daemon is at its
/// limit), then the spare is taken again. False when there was no spare, or no client.
fn refuse_at_limit(listener: &AsyncFd<OwnedFd>, spare: &mut Option<OwnedFd>, sh: &Shared) -> bool {
    if spare.take().is_none() {
        *spare = sys::placeholder_fd();
        return false;
    }
    // SAFETY: accept4 on our listening socket; no address wanted.
    let r = unsafe {
        libc::accept4(
            listener.get_ref().as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    let refused = r >= 0;
    if refused {
        // SAFETY: accept4 returned a new fd that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(r) };
        let uid = sys::peer_cred(fd.as_fd()).map_or(u32::MAX, |c| c.uid);
        sh.reg
            .counters
            .clients_refused_fd_limit
            .fetch_add(1, Relaxed);
        static LOG: registry::RateLog = registry::RateLog::new();
        LOG.note(|n| {
            log::warn!(
                "no descriptor for a new client (RLIMIT_NOFILE {}): {n} client(s) refused \
                 since the last such line (their connections stay TCP, NOSMCDDEV)",
                sys::nofile_soft_limit()
            )
        });
        close_refused(sh, uid, fd);
    }
    *spare = sys::placeholder_fd();
    refused
}

/// Closes a client connection refused at accept: here when nothing it sent holds a descriptor
/// (`sys::refused_can_close_here`), else on a closer thread of its uid, as a release there may
/// block. Before, every refused connection went to the closer: behind four closes of `nobody`
/// that never finish (`SO_LINGER`), a flood of refused connects from `nobody` kept a daemon
/// descriptor each, the daemon reached its limit in a second and refused every other process
/// (red team round 35, 5 of 5: root's connections all `NOSMCDDEV` while it lasted).
fn close_refused(sh: &Shared, uid: u32, fd: OwnedFd) {
    if !sys::refused_can_close_here(fd.as_fd()) {
        sh.closer.close(uid, fd);
    }
}

/// The background sweep: the shelves (`Registry::shelve_tick`), every 10 ms while it finds
/// work, else every 100 ms (a turn shelves at most a few hundred files, ~1 ms), and the heap
/// given back after a burst (`Registry::trim_after_burst`).
async fn sweep(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut busy = false;
    loop {
        let tick = Duration::from_millis(if busy { 10 } else { 100 });
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(tick) => {}
        }
        // On a blocking thread: the turn may wait for holder processes (see `holder`).
        let reg = shared.reg.clone();
        let released;
        (busy, released) = tokio::task::spawn_blocking(move || {
            let released = reg.handed_on_tick();
            let busy = reg.shelve_tick();
            if !busy {
                reg.trim_after_burst();
            }
            (busy, released)
        })
        .await
        .unwrap_or((false, 0));
        if released > 0 {
            // Kept references released: DMBs may be gone (`WAIT`ers look again).
            shared.events.bump();
        }
    }
}

/// Runs the daemon until `shutdown` completes: binds the socket (see [`DaemonConfig`]), then
/// serves clients. On shutdown it stops accepting, removes its socket, closes every client
/// connection and returns. Live mappings in client processes are unaffected: they hold their own
/// memfd references and mappings.
pub async fn serve_until<F: Future<Output = ()>>(
    config: DaemonConfig,
    shutdown: F,
) -> Result<(), IsmError> {
    bind(config)?.run(shutdown).await
}

/// Runs the daemon until SIGINT or SIGTERM. This is what `smc-ctl daemon` calls.
pub async fn serve(config: DaemonConfig) -> Result<(), IsmError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(IsmError::Io)?;
    let mut int = signal(SignalKind::interrupt()).map_err(IsmError::Io)?;
    serve_until(config, async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
    .await
}

fn runtime() -> Result<tokio::runtime::Runtime, IsmError> {
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 8);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("smc-ism")
        .enable_all()
        .build()
        .map_err(IsmError::Io)
}

/// Builds a tokio runtime and runs [`serve`] on it, blocking until SIGINT/SIGTERM.
pub fn run_blocking(config: DaemonConfig) -> Result<(), IsmError> {
    runtime()?.block_on(serve(config))
}

/// A daemon running on its own thread (tests, benchmarks, embedding).
#[derive(Debug)]
pub struct DaemonHandle {
    gid: Gid,
    socket_path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), IsmError>>>,
}

/// Starts a daemon on a new thread with its own runtime. Returns once the socket is bound and
/// accepting, so [`Client::connect`](crate::Client::connect) succeeds right away.
pub fn spawn(config: DaemonConfig) -> Result<DaemonHandle, IsmError> {
    let socket_path = config.socket_path.clone();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Gid, IsmError>>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("smc-ism-daemon".into())
        .spawn(move || -> Result<(), IsmError> {
            let rt = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(IsmError::Config(e.to_string())));
                    return Err(e);
                }
            };
            rt.block_on(async move {
                let bound = match bind(config) {
                    Ok(b) => b,
                    Err(e) => {
                        let msg = e.to_string();
                        let _ = ready_tx.send(Err(e));
                        return Err(IsmError::Config(msg));
                    }
                };
                let _ = ready_tx.send(Ok(bound.gid()));
                // On a worker, not on this thread: the worker whose poll finds a client
                // connecting accepts it at once (from `block_on` here, each accept waited for
                // this thread to be woken and scheduled first, one more thread hop before a new
                // process's first reply).
                tokio::spawn(bound.run(async move {
                    let _ = stop_rx.await;
                }))
                .await
                .unwrap_or(Err(IsmError::Internal))
            })
        })
        .map_err(IsmError::Io)?;
    match ready_rx.recv() {
        Ok(Ok(gid)) => Ok(DaemonHandle {
            gid,
            socket_path,
            stop: Some(stop_tx),
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err(IsmError::Internal)
        }
    }
}

impl DaemonHandle {
    /// The device GID.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The socket path it listens on.
    pub fn socket_path(&self) -> &Path {
        &self.socket_path
    }

    /// Stops the daemon and waits for it: when this returns, every client connection is closed
    /// and the socket removed.
    pub fn shutdown(mut self) -> Result<(), IsmError> {
        self.stop_and_join()
    }

    fn stop_and_join(&mut self) -> Result<(), IsmError> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take() {
            Some(t) => t.join().map_err(|_| IsmError::Internal)?,
            None => Ok(()),
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

#[cfg(test)]
mod default_tests {
    use super::default_max_dmbs;

    #[test]
    fn default_max_dmbs_follows_memory_within_the_ebpf_maps() {
        assert_eq!(default_max_dmbs(Some(24 << 30)), 262_144);
        assert_eq!(default_max_dmbs(Some(8 << 30)), 262_144);
        assert_eq!(default_max_dmbs(Some(2 << 30)), 65_536);
        assert_eq!(default_max_dmbs(Some(64 << 20)), 4096);
        assert_eq!(default_max_dmbs(None), 262_144);
    }
}
