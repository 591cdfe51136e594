//! One client connection: parse records, run ops, track the references this client holds, and
//! release all of them when the connection closes.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch, Notify};

use crate::proto::{self, DmbReply, Header, Status};
use crate::sys::{self, TcpIdentity};
use smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE;
use smc_common::clc::LOOPBACK_CHID;

use super::closer::Closer;
use super::diag::{self, CgroupKeys};
use super::pair::{self, Deferred, Grant, Parked, Pool, Rendezvous};
use super::registry::{
    Attacher, BindMiss, CgroupUsage, ClientIdentity, DmbObj, Fail, LocalState, RefKind, Registry,
    StateSlots, UidUsage,
};
use super::shelf::KeptFile;

/// What an attacher's socket proved: its identity, and its cgroup's quota key when the
/// configuration compares cgroups.
type Proof = (TcpIdentity, Option<String>);

/// State shared by all connection tasks.
pub(crate) struct Shared {
    /// Shared with the grants of parked requests (`pair::Grant`), which release through it.
    pub reg: Arc<Registry>,
    pub events: Events,
    /// Closes every fd a client handed over, off the request path.
    pub closer: Closer,
    /// Quota keys of cgroup ids.
    pub keys: CgroupKeys,
    /// The daemon's own network namespace cookie.
    pub own_netns: Option<u64>,
    /// The pinned eBPF same-host map, for peers in another network namespace.
    pub peers_map: Option<std::path::PathBuf>,
    /// Run for each new client before it is served.
    pub client_hook: Option<super::ClientHook>,
    /// The pinned eBPF socket storage, for the shortcut grant (see `grant`).
    pub sock_state_map: Option<std::path::PathBuf>,
    /// `OP_PAIR` requests waiting for the other end of their connection.
    pub rdv: Mutex<Rendezvous>,
    /// The next client connection id (never reused).
    pub next_conn: AtomicU64,
    /// Pooled DMBs per client connection at most.
    pub pool_max: usize,
    /// How long a DMB stays pooled unused before it is freed.
    pub pool_idle: Duration,
}

/// A generation counter with waiters: every state change bumps it; `WAIT` requests sleep until
/// it moves. No wakeup is missed: a waiter creates its `Notified` future
/// *before* checking the generation, and tokio guarantees that `notify_waiters()` wakes every
/// `Notified` created before the call, polled or not. The `waiters` count (SeqCst on both sides)
/// only spares the notify when nobody waits.
pub(crate) struct Events {
    gen: AtomicU64,
    waiters: AtomicUsize,
    notify: Notify,
}

struct WaiterGuard<'a>(&'a AtomicUsize);

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

impl Events {
    pub(crate) fn new() -> Events {
        Events {
            gen: AtomicU64::new(1),
            waiters: AtomicUsize::new(0),
            notify: Notify::new(),
        }
    }

    pub(crate) fn generation(&self) -> u64 {
        self.gen.load(SeqCst)
    }

    pub(crate) fn bump(&self) {
        self.gen.fetch_add(1, SeqCst);
        if self.waiters.load(SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    async fn wait_change(&self, since: u64, timeout: Duration) {
        self.waiters.fetch_add(1, SeqCst);
        let _guard = WaiterGuard(&self.waiters);
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.notify.notified();
            if self.gen.load(SeqCst) != since {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }
}

/// References one client holds on one token.
#[derive(Default)]
struct Held {
    owner: bool,
    attaches: u32,
}

/// Reads the caller's cgroup v2 path ("0::" line of /proc/PID/cgroup); on a v1-only host the
/// systemd hierarchy; "/" if neither. Sampled once, when the client connects.
pub(crate) fn read_cgroup(pid: i32) -> String {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
        return "/".to_owned();
    };
    s.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .or_else(|| {
            s.lines()
                .find_map(|l| l.split_once(":name=systemd:").map(|(_, p)| p))
        })
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/".to_owned())
}

/// Inode of the pid namespace of `pid` (as the daemon sees it), sampled when it connects.
fn read_pidns(pid: i32) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

struct Conn<'a> {
    shared: &'a Shared,
    arc: Arc<Shared>,
    /// This client connection (unique for the daemon's life).
    id: u64,
    /// Its DMBs given back for reuse (it holds their owner references through the pool).
    pool: Pool,
    /// Answers to its parked `PAIR` requests, sent by other tasks.
    tx: mpsc::UnboundedSender<Deferred>,
    /// Its parked `PAIR` requests: (seq, park id, deadline).
    parked: Vec<(u32, u64, tokio::time::Instant)>,
    /// The caller's uid (SO_PEERCRED when it connected; unforgeable), with its usage.
    uid: Arc<UidUsage>,
    /// Quota bucket when the proof socket's cgroup cannot be found (the caller's cgroup when
    /// it connected).
    cg: Arc<CgroupUsage>,
    /// The caller's cgroup (as `cg`) and pid namespace, recorded with the DMBs it registers:
    /// an adopter must share them.
    ident: ClientIdentity,
    /// The second fd passed with the current request (a `REGISTER`'s state page).
    second: Option<OwnedFd>,
    /// The reply to the current request passes the DMB's state page, not its memfd.
    pass_state: bool,
    /// ... and says where in it the state is (`ADOPT_FLAG_SLOT`).
    state_off_reply: bool,
    /// The memfd the reply to the current request passes, taken with its reference (an
    /// attach: see `Registry::attach_passing`); else it is taken (or opened again) for the
    /// reply.
    pass_fd: Option<PassFd>,
    /// The page of local state slots its DMBs get (`PAIR_FLAG_STATE_SLOT`).
    slots: Arc<StateSlots>,
    /// The last proof socket cgroup id and its quota bucket (a process's sockets nearly always
    /// share one cgroup: no global lookup per registration).
    cg_last: Option<(u64, Arc<CgroupUsage>)>,
    /// The kernel dropped the fds passed with the current request (`MSG_CTRUNC`: the daemon is
    /// out of descriptors): its missing socket is a `Mem` failure, not a client's error.
    fds_dropped: bool,
    /// Fds handed over with the current request, to go to the closer once its reply is sent
    /// ([`Conn::flush_closes`]): waking a closer thread is a system call and a thread to run on
    /// a busy machine, which the reply (a handshake waiting for it) need not wait for.
    closing: Vec<(u32, OwnedFd)>,
    /// Of the fds this client handed over, those the closer has not closed yet (see
    /// [`Conn::read_pause`]).
    closes_outstanding: Arc<super::closer::Outstanding>,
    held: HashMap<u64, Held>,
    /// The proofs made of the sockets of this client's registrations that asked for it
    /// (`REGISTER_RECORD_PROOF`), by token: they prove its later attach of the peer's DMB when
    /// the socket passed with that attach did not arrive (this daemon out of descriptors, a
    /// server past its CLC accept that can no longer decline). No socket is kept (its FIN
    /// would wait for us); each goes at that attach's success or with its owner reference.
    recorded: HashMap<u64, Proof>,
    /// The network namespace of the sockets this client passed: where the ends of its
    /// references are looked up when it lets go of them (`handed_on`).
    netns: super::handed_on::ClientNs,
}

/// Serves one client until it disconnects or the daemon stops, then releases everything it held.
/// `uid` is already charged with this connection (released when it ends).
pub(crate) async fn serve_conn(
    shared: Arc<Shared>,
    fd: OwnedFd,
    cred: Option<libc::ucred>,
    uid: Arc<UidUsage>,
    mut stop: watch::Receiver<bool>,
) {
    if let (Some(hook), Some(c)) = (shared.client_hook.as_ref(), cred) {
        // Before the first reply: a client that waits for it finds the hook's work done. On
        // this task, as `read_cgroup` below: a few calls on a local directory (a blocking-pool
        // thread to run them cost a new process's first reply two thread hops).
        (hook.0)(c.uid, c.gid);
    }
    let cg_path = cred
        .map(|c| read_cgroup(c.pid))
        .unwrap_or_else(|| "/".to_owned());
    let uid_n = uid.uid;
    let cg = shared.reg.cgroup(&cg_path);
    let ident = ClientIdentity {
        cgroup: cg.clone(),
        pidns: cred.and_then(|c| read_pidns(c.pid)),
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut conn = Conn {
        shared: &shared,
        arc: shared.clone(),
        id: shared.next_conn.fetch_add(1, Relaxed),
        pool: Pool::default(),
        tx,
        parked: Vec::new(),
        uid,
        cg,
        ident,
        second: None,
        pass_state: false,
        state_off_reply: false,
        pass_fd: None,
        slots: Arc::default(),
        cg_last: None,
        fds_dropped: false,
        closing: Vec::new(),
        closes_outstanding: Arc::default(),
        held: HashMap::new(),
        recorded: HashMap::new(),
        netns: Default::default(),
    };
    // SAFETY: the OwnedFd is moved into the AsyncFd, which neither replaces nor closes it while
    // registered.
    let fd = match unsafe { AsyncFd::register(fd) } {
        Ok(afd) => {
            log::debug!(
                "client connected: pid {:?} uid {:?} cgroup {}",
                cred.map(|c| c.pid),
                cred.map(|c| c.uid),
                cg_path
            );
            conn.run(&afd, &mut stop, &mut rx).await;
            afd.into_inner()
        }
        Err(e) => {
            let (fd, e) = e.into_parts();
            log::warn!("cannot register client socket with the reactor: {e}");
            fd
        }
    };
    // Fds the client sent and we did not read are released with its socket: not here.
    shared.closer.close(uid_n, fd);
    // `conn` drops here: everything it holds is released (also if the task panicked).
}

/// The next record of a client, once there is one and `may_read` still says yes (`None`
/// otherwise: asked again after the wait, not before it, as a task that waits here long may
/// find its uid over its closes by then; a record brings up to 253 fds, each a descriptor of
/// the daemon's from its receipt until the closer closes it).
async fn recv(
    afd: &AsyncFd<OwnedFd>,
    buf: &mut [u8],
    may_read: impl Fn() -> bool,
) -> io::Result<Option<sys::Received>> {
    loop {
        let mut g = afd.readable().await?;
        if !may_read() {
            return Ok(None);
        }
        match g.try_io(|inner| sys::recv_record(inner.as_raw_fd(), buf, libc::MSG_DONTWAIT)) {
            Ok(r) => return r.map(Some),
            Err(_would_block) => continue,
        }
    }
}

async fn send(afd: &AsyncFd<OwnedFd>, data: &[u8], pass: &[RawFd]) -> io::Result<()> {
    loop {
        let mut g = afd.writable().await?;
        match g.try_io(|inner| sys::send_record(inner.as_raw_fd(), data, pass, libc::MSG_DONTWAIT))
        {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

fn encode_reply(out: &mut Vec<u8>, op: u16, seq: u32, status: Status, detail: u32, result: &[u8]) {
    out.clear();
    out.resize(proto::HEADER_LEN, 0);
    Header::new(op | proto::REPLY_BIT, proto::STATUS_LEN + result.len(), seq).encode(out);
    out.extend_from_slice(&(status as u32).to_le_bytes());
    out.extend_from_slice(&detail.to_le_bytes());
    out.extend_from_slice(result);
}

fn fail_reply(out: &mut Vec<u8>, op: u16, seq: u32, f: Fail) {
    let (s, d) = f.status();
    encode_reply(out, op, seq, s, d, &[]);
}

/// The `PAIR` result: own DMB and id, peer DMB and id.
fn pair_result(own: &DmbObj, peer: &DmbObj) -> [u8; proto::PAIR_REPLY_LEN] {
    let mut b = [0u8; proto::PAIR_REPLY_LEN];
    b[0..24].copy_from_slice(&dmb_result(own));
    b[24..32].copy_from_slice(&own.id.to_le_bytes());
    b[32..56].copy_from_slice(&dmb_result(peer));
    b[56..64].copy_from_slice(&peer.id.to_le_bytes());
    if let Some(st) = &own.state {
        let (flags, off) = match st.slot_off() {
            Some(off) => (proto::PAIR_OWN_STATE | proto::PAIR_STATE_SLOT, off),
            None => (proto::PAIR_OWN_STATE, 0),
        };
        b[64..68].copy_from_slice(&flags.to_le_bytes());
        b[68..72].copy_from_slice(&off.to_le_bytes());
    }
    b
}

/// An fd that goes with a reply: a DMB's memfd, or the state page registered with it, open
/// until the reply is sent (also when the file is shelved meanwhile: see `shelf`).
type PassFd = Arc<OwnedFd>;

/// The memfd of `d` for a reply (opened again when shelved: see [`Registry::reopen`]). Should
/// that fail, the reply goes without it: the client gives the references back and declines
/// with `MEM` (a request no server past its accept makes: its attach gets the descriptor kept,
/// `Registry::attach_passing`).
fn pass_memfd(reg: &Registry, d: &DmbObj) -> Option<PassFd> {
    reg.reopen(&d.memfd)
        .map_err(|e| reopen_failed(reg, "a DMB's memfd", &e))
        .ok()
}

/// The state page of `d` (or the page of its slot) for a reply (as [`pass_memfd`]).
fn pass_state(reg: &Registry, d: &DmbObj) -> Option<PassFd> {
    d.state.as_ref().and_then(|s| {
        reg.reopen(s.file())
            .map_err(|e| reopen_failed(reg, "a state page", &e))
            .ok()
    })
}

/// A shelved file could not be opened again for a reply: counted, and said (rate-limited).
fn reopen_failed(reg: &Registry, what: &str, e: &io::Error) {
    static LOG: super::registry::RateLog = super::registry::RateLog::new();
    reg.counters.failures.reopen.fetch_add(1, Relaxed);
    LOG.note(|n| {
        log::warn!(
            "{what} cannot be opened again: {e}; {n} reply(ies) went without a file since the \
             last such line (their clients give the DMBs back and decline MEM)"
        )
    });
}

/// The fds of a `PAIR` reply: own memfd, peer memfd, own state page (if it has one: see
/// [`proto::PAIR_OWN_STATE`]).
fn pair_pass(reg: &Registry, own: Arc<DmbObj>, peer: Arc<DmbObj>) -> Vec<PassFd> {
    let mut v: Vec<PassFd> = pass_memfd(reg, &own).into_iter().collect();
    v.extend(pass_memfd(reg, &peer));
    if own.state.is_some() {
        v.extend(pass_state(reg, &own));
    }
    v
}

/// `PAIR` requests of one client that wait for their peers at most (each keeps its socket
/// open in the daemon); beyond, `NoPeer` at once.
const MAX_PARKED: usize = 2048;

/// Descriptors the daemon keeps free below its limit when a `PAIR` would wait for its peer
/// (see `pair`): more than a new DMB leaves (`registry::RECEIVE_HEADROOM`), so that a parked
/// request's peer finds one to complete the pair.
const PARK_HEADROOM: u64 = 64;

/// A `PAIR`'s answer: our DMB and the peer's.
type PairDmbs = (Arc<DmbObj>, Arc<DmbObj>);

/// What woke a client's task.
enum Event {
    Request(io::Result<sys::Received>),
    Deferred(Deferred),
    /// A parked `PAIR` may have waited long enough.
    Expired,
}

fn dmb_result(d: &DmbObj) -> [u8; proto::DMB_REPLY_LEN] {
    let mut b = [0u8; proto::DMB_REPLY_LEN];
    DmbReply {
        token: d.token,
        slot: d.slot(),
        idx: 0,
        size_code: d.size_code,
        size: d.size,
    }
    .encode(&mut b);
    b
}

impl Conn<'_> {
    async fn run(
        &mut self,
        afd: &AsyncFd<OwnedFd>,
        stop: &mut watch::Receiver<bool>,
        rx: &mut mpsc::UnboundedReceiver<Deferred>,
    ) {
        let mut buf = vec![0u8; proto::MAX_REQUEST + 1];
        let mut out = Vec::with_capacity(96);
        loop {
            // A uid whose handed-over fds do not close is not read from until they do: its
            // further fds wait in its own socket buffer, not in the daemon's fd table.
            while let Some(pause) = self.read_pause() {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return,
                    _ = self.closes_outstanding.none_left.notified() => {}
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            let pool_next = pair::lock(&self.pool)
                .front()
                .map(|p| tokio::time::Instant::from_std(p.1 + self.shared.pool_idle));
            let next = self.parked.iter().map(|p| p.2).chain(pool_next).min();
            let ev = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                Some(d) = rx.recv() => Event::Deferred(d),
                _ = tokio::time::sleep_until(next.unwrap_or_else(tokio::time::Instant::now)),
                    if next.is_some() => Event::Expired,
                r = recv(afd, &mut buf, || self.read_pause().is_none()) => match r {
                    Ok(None) => continue, // paused: see `read_pause`
                    Ok(Some(r)) => Event::Request(Ok(r)),
                    Err(e) => Event::Request(Err(e)),
                },
            };
            out.clear();
            let pass = match ev {
                Event::Deferred(d) => self.deferred(d, &mut out),
                Event::Expired => {
                    self.expire_pool();
                    self.expire(&mut out);
                    Vec::new()
                }
                Event::Request(r) => {
                    let r = match r {
                        Ok(r) if r.len == 0 => {
                            // EOF (or an empty record: treated alike)
                            self.dispose(r.fd);
                            r.extra.into_iter().for_each(|f| self.dispose(Some(f)));
                            return;
                        }
                        Ok(r) if r.extra.len() > 1 => {
                            // No request takes more than two fds (REGISTER: the socket and a
                            // state page). More is no client of ours: its connection ends, its
                            // fds go to the closer at once (counted before the next read of
                            // any connection of its uid: see `recv`). Before, each idle
                            // connection of one uid took a record of 253 fds past the uid's
                            // limit of closes (red team round 35, finding 2: 80 records, the
                            // daemon at its descriptor limit, every other process refused).
                            self.shared.reg.counters.failures.count(Fail::Malformed);
                            static LOG: super::registry::RateLog = super::registry::RateLog::new();
                            LOG.note(|n| {
                                log::warn!(
                                    "client of uid {} passed {} fds with one request (at most \
                                     2): disconnected ({n} since the last such line)",
                                    self.uid.uid,
                                    r.extra.len() + 1
                                )
                            });
                            self.dispose(r.fd);
                            r.extra.into_iter().for_each(|f| self.dispose(Some(f)));
                            self.flush_closes();
                            return;
                        }
                        Ok(mut r) => {
                            // The second fd is kept for `handle`, which disposes of it unless
                            // the request is a REGISTER.
                            self.second = r.extra.pop();
                            r
                        }
                        Err(e) => {
                            log::debug!("client recv: {e}");
                            return;
                        }
                    };
                    self.fds_dropped = r.fds_dropped;
                    self.handle(&buf[..r.len], r.truncated, r.fd, &mut out, stop)
                        .await
                }
            };
            if out.is_empty() {
                // A request that wants no reply (NOREPLY_BIT), or a PAIR that waits.
                self.flush_closes();
                continue;
            }
            let fds: Vec<RawFd> = pass.iter().map(|f| f.as_raw_fd()).collect();
            // A client that stops reading its replies must not hold up the daemon's shutdown.
            let res = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                r = send(afd, &out, &fds) => r,
            };
            drop(pass);
            self.flush_closes();
            if let Err(e) = res {
                // The reference stays recorded in `held` and is released below with the rest.
                log::debug!("client send: {e}");
                self.shared
                    .reg
                    .counters
                    .failures
                    .send_failed
                    .fetch_add(1, Relaxed);
                return;
            }
        }
    }

    /// How long to wait before reading this client's next request, if at all: while its uid
    /// has [`PER_UID_PENDING`](super::closer::PER_UID_PENDING) closes outstanding, and while
    /// the daemon has fewer than [`PARK_HEADROOM`] descriptors left and this connection any
    /// close outstanding. Each request read installs the socket it passes; refused at the
    /// limit, that socket is closed on a closer thread, and a client that pipelines hundreds of
    /// requests (512 connects in flight) filled the table with refused sockets faster than the
    /// closer ran: the next process's connection to the daemon found no descriptor and was
    /// refused, all its connections `NOSMCDDEV` for a second (`scale_smc`
    /// `daemon_out_of_descriptors_*`, 3 of 60 runs all TCP). Closes of live sockets take
    /// microseconds: the wait ends when they are done (`Outstanding::none_left`); one that
    /// blocks (`SO_LINGER`) holds up only the connection that handed it over.
    fn read_pause(&self) -> Option<Duration> {
        if self.shared.closer.over_limit(self.uid.uid) {
            return Some(Duration::from_millis(50));
        }
        (self.closes_outstanding.any() && sys::near_fd_limit(PARK_HEADROOM))
            .then_some(Duration::from_millis(50))
    }

    /// The answer to one of our parked `PAIR` requests, from the task that paired it.
    fn deferred(&mut self, d: Deferred, out: &mut Vec<u8>) -> Vec<PassFd> {
        let seq = d.seq();
        self.parked.retain(|p| p.0 != seq);
        let c = &self.shared.reg.counters;
        match d {
            Deferred::Paired { seq, own, peer } => {
                let (own, own_new) = own.take();
                let (peer, peer_new) = peer.take();
                if own_new {
                    self.held.entry(own.token).or_default().owner = true;
                }
                if peer_new {
                    self.held.entry(peer.token).or_default().attaches += 1;
                }
                c.pair.record(true);
                encode_reply(
                    out,
                    proto::OP_PAIR,
                    seq,
                    Status::Ok,
                    0,
                    &pair_result(&own, &peer),
                );
                pair_pass(&self.shared.reg, own, peer)
            }
            Deferred::Failed { seq, fail } => {
                c.pair.record(false);
                c.failures.count(fail);
                fail_reply(out, proto::OP_PAIR, seq, fail);
                Vec::new()
            }
        }
    }

    /// Frees the DMBs pooled longer than `pool_idle` unused.
    fn expire_pool(&mut self) {
        let now = std::time::Instant::now();
        let idle = self.shared.pool_idle;
        let old: Vec<u64> = {
            let mut p = pair::lock(&self.pool);
            let mut v = Vec::new();
            while p.front().is_some_and(|e| e.1 + idle <= now) {
                if let Some((t, _)) = p.pop_front() {
                    v.push(t);
                }
            }
            v
        };
        if !old.is_empty() {
            for t in old {
                self.shared.reg.release(t, RefKind::Owner, false);
            }
            self.shared.events.bump();
        }
    }

    /// Answers the first of our parked `PAIR` requests whose wait is over (`NoPeer`), unless
    /// another task took it meanwhile (its answer is on its way).
    fn expire(&mut self, out: &mut Vec<u8>) {
        let now = tokio::time::Instant::now();
        let Some(i) = self.parked.iter().position(|p| p.2 <= now) else {
            return;
        };
        let (seq, id, _) = self.parked.swap_remove(i);
        let taken = pair::lock(&self.shared.rdv).take(id);
        if let Some(p) = taken {
            self.dispose(Some(p.sock));
            let c = &self.shared.reg.counters;
            c.pair.record(false);
            c.failures.count(Fail::NoPeer);
            fail_reply(out, proto::OP_PAIR, seq, Fail::NoPeer);
        }
    }

    /// Handles one record, writes the reply into `out` (nothing for a request that wants
    /// none, or a `PAIR` that waits); returns the fds that go along.
    async fn handle(
        &mut self,
        rec: &[u8],
        truncated: bool,
        fd: Option<OwnedFd>,
        out: &mut Vec<u8>,
        stop: &mut watch::Receiver<bool>,
    ) -> Vec<PassFd> {
        let reg = &self.shared.reg;
        let c = &reg.counters;
        out.clear();
        let d = proto::decode_request(rec, truncated);
        let (op, seq, noreply) = (d.op, d.seq, d.noreply);
        self.pass_state = false;
        self.state_off_reply = false;
        self.pass_fd = None;
        let second = self.second.take();
        let state = match d.request {
            Ok(proto::Request::Register { .. }) => second,
            _ => {
                self.dispose(second);
                None
            }
        };
        // Only REGISTER, ATTACH and ATTACH_PEER take an fd; anything else passed is disposed
        // of now, before any work.
        let (fd, req) = match d.request {
            Ok(req) if req.takes_socket() => (fd, req),
            other => {
                self.dispose(fd);
                match other {
                    Ok(req) => (None, req),
                    Err(e) => {
                        let f = Fail::from_status(e.status);
                        if e.header {
                            c.invalid.record(false);
                        } else {
                            self.op_counter(op).record(false);
                        }
                        c.failures.count(f);
                        if !noreply {
                            fail_reply(out, op, seq, f);
                        }
                        return Vec::new();
                    }
                }
            }
        };
        use proto::Request as R;
        let t0 = std::time::Instant::now();
        let (counter, result): (_, Result<Option<Arc<DmbObj>>, Fail>) = match req {
            R::QueryGid => {
                let mut b = [0u8; proto::GID_REPLY_LEN];
                b[0..8].copy_from_slice(&reg.gid.gid.to_le_bytes());
                b[8..16].copy_from_slice(&reg.gid.gid_ext.to_le_bytes());
                b[16..18].copy_from_slice(&LOOPBACK_CHID.to_le_bytes());
                b[18] = DMB_MAX_SIZE_CODE_LARGE;
                b[20..24].copy_from_slice(&proto::FEATURES.to_le_bytes());
                c.query_gid.record(true);
                encode_reply(out, op, seq, Status::Ok, 0, &b);
                return Vec::new();
            }
            R::Register { size_code, record } => (
                &c.register,
                self.register(size_code, record, fd, state).map(Some),
            ),
            R::Attach { token, own } => (&c.attach, self.attach(Some(token), own, fd).map(Some)),
            R::AttachPeer { own } => (&c.attach_peer, self.attach(None, own, fd).map(Some)),
            R::Adopt { which, slot_ok } => (&c.attach, self.adopt(which, slot_ok, fd).map(Some)),
            R::Pair {
                size_code,
                park_ms,
                releases,
                n_releases,
                state_slot,
                new_slot_page,
            } => {
                if new_slot_page {
                    // Before the releases it carries: a DMB they pool must not be bound again
                    // with a slot on a page its forked child maps.
                    self.slots.new_page();
                }
                // The releases it carries first (a pooled DMB among them may serve this pair).
                let mut released = false;
                for &(own, peer, flags) in releases.iter().take(n_releases as usize) {
                    let _ = self.release(own, peer, flags);
                    released = true;
                }
                if released {
                    self.shared.events.bump();
                }
                let slots = state_slot.then(|| self.slots.clone());
                let r = self.pair(size_code, park_ms, fd, seq, slots);
                c.pair.add_time(t0.elapsed());
                return match r {
                    Ok(Some((own, peer))) => {
                        c.pair.record(true);
                        self.shared.events.bump();
                        encode_reply(out, op, seq, Status::Ok, 0, &pair_result(&own, &peer));
                        pair_pass(&self.shared.reg, own, peer)
                    }
                    // Parked: answered when the other end asks, or at the end of the wait.
                    Ok(None) => Vec::new(),
                    Err(f) => {
                        c.pair.record(false);
                        c.failures.count(f);
                        fail_reply(out, op, seq, f);
                        Vec::new()
                    }
                };
            }
            R::LeaveShortcut | R::Sweep => {
                // The caller's own socket (it holds it: it passed it). LEAVE_SHORTCUT: out of
                // the SOCKHASH, its connection continues on plain TCP (harmless for anyone
                // else: a redirect to it fails over to TCP). SWEEP: a listener whose queued
                // connections go into the quarantine (`sweep.rs`).
                let (fd, r) = match (fd, self.shared.sock_state_map.as_deref()) {
                    (Some(f), Some(map)) if matches!(req, R::Sweep) => {
                        let (f, r) = super::sweep::sweep_off_workers(map, f, self.uid.uid).await;
                        let r = r.map_err(|e| {
                            log::warn!("sweep: {e}");
                            Fail::Internal
                        });
                        (f, r)
                    }
                    (fd, map) => {
                        let r = match (fd.as_ref(), map) {
                            (Some(f), Some(map))
                                if super::grant::leave_sockhash(map, f.as_fd()) =>
                            {
                                Ok(())
                            }
                            // The kernel dropped the socket: this daemon is out of descriptors.
                            (None, _) if self.fds_dropped => Err(Fail::FdLimit),
                            _ => Err(Fail::Internal),
                        };
                        (fd, r)
                    }
                };
                // Answered once the daemon's copy is closed: the library sweeps right before
                // its own close of the socket (`sweep_peer_before_fin`), and leaves the
                // shortcut before it hands the socket on; a copy still open here made that
                // close not the last, and a `SO_LINGER {1, 0}` close reset the connection only
                // when the closer got to it (conformance
                // `close_with_ring_full_before_server_confirms` with a 1 ms CLC timer: the
                // server's poll saw no `ERR|HUP`).
                if let Some(f) = fd {
                    let _ = self.shared.closer.close_awaited(self.uid.uid, f).await;
                }
                match r {
                    Ok(()) => encode_reply(out, op, seq, Status::Ok, 0, &[]),
                    Err(f) => {
                        c.failures.count(f);
                        fail_reply(out, op, seq, f);
                    }
                }
                return Vec::new();
            }
            R::Cancel { seq: which } => {
                // No reply of its own: the cancelled PAIR gets its answer (Cancelled).
                if let Some(i) = self.parked.iter().position(|p| p.0 == which) {
                    let (_, id, _) = self.parked.swap_remove(i);
                    let taken = pair::lock(&self.shared.rdv).take(id);
                    if let Some(p) = taken {
                        self.dispose(Some(p.sock));
                        encode_reply(out, proto::OP_PAIR, which, Status::Cancelled, 0, &[]);
                    }
                }
                return Vec::new();
            }
            R::Release { own, peer, flags } => {
                let res = self.release(own, peer, flags);
                self.shared.events.bump();
                if !noreply {
                    match res {
                        Ok(()) => encode_reply(out, op, seq, Status::Ok, 0, &[]),
                        Err(f) => fail_reply(out, op, seq, f),
                    }
                }
                return Vec::new();
            }
            R::Detach { token } => (
                &c.detach,
                self.release_token(token, RefKind::Attach, false, false)
                    .map(|_| None),
            ),
            R::Unregister { token } => (
                &c.unregister,
                self.release_token(token, RefKind::Owner, false, false)
                    .map(|_| None),
            ),
            R::Stats | R::Wait { .. } => {
                let counter = if op == proto::OP_STATS {
                    &c.stats
                } else {
                    &c.wait
                };
                if let R::Wait {
                    generation: since,
                    timeout_ms: ms,
                } = req
                {
                    // Whatever was passed with it is not kept open across the wait.
                    self.flush_closes();
                    tokio::select! {
                        _ = self.shared.events.wait_change(since, Duration::from_millis(ms as u64)) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }
                counter.record(true);
                let stats = reg.stats(self.shared.events.generation(), self.uid.uid == 0);
                match serde_json::to_vec(&stats) {
                    Ok(json) => encode_reply(out, op, seq, Status::Ok, 0, &json),
                    Err(_) => fail_reply(out, op, seq, Fail::Internal),
                }
                return Vec::new();
            }
            R::List { start, max } => {
                let list = reg.list(start, max as usize, Some(self.uid.uid));
                c.list.record(true);
                match serde_json::to_vec(&list) {
                    Ok(json) => encode_reply(out, op, seq, Status::Ok, 0, &json),
                    Err(_) => fail_reply(out, op, seq, Fail::Internal),
                }
                return Vec::new();
            }
        };
        counter.add_time(t0.elapsed());
        match result {
            Ok(dmb) => {
                counter.record(true);
                self.shared.events.bump();
                if noreply {
                    return Vec::new();
                }
                match &dmb {
                    Some(d) if self.state_off_reply => {
                        let mut b = [0u8; proto::ADOPT_STATE_REPLY_LEN];
                        b[..proto::DMB_REPLY_LEN].copy_from_slice(&dmb_result(d));
                        if let Some(off) = d.state.as_ref().and_then(LocalState::slot_off) {
                            b[24..28].copy_from_slice(&off.to_le_bytes());
                            b[28..32].copy_from_slice(&proto::STATE_IS_SLOT.to_le_bytes());
                        }
                        encode_reply(out, op, seq, Status::Ok, 0, &b)
                    }
                    Some(d) => encode_reply(out, op, seq, Status::Ok, 0, &dmb_result(d)),
                    None => encode_reply(out, op, seq, Status::Ok, 0, &[]),
                }
                match dmb {
                    Some(d) if self.pass_state => pass_state(reg, &d).into_iter().collect(),
                    Some(d) => match self.pass_fd.take() {
                        Some(f) => vec![f],
                        None => pass_memfd(reg, &d).into_iter().collect(),
                    },
                    None => Vec::new(),
                }
            }
            Err(f) => {
                counter.record(false);
                c.failures.count(f);
                if !noreply {
                    fail_reply(out, op, seq, f);
                }
                Vec::new()
            }
        }
    }

    /// `OP_RELEASE` (also carried by `OP_PAIR`): our owner reference of `own` (kept in our
    /// pool with `RELEASE_POOL_OWN` when it may be reused) and attach reference of `peer` (0:
    /// none). Counted as the unregister and the detach it stands for (a DMB kept in the pool
    /// too: the connection's use of it ended).
    fn release(&mut self, own: u64, peer: u64, flags: u32) -> Result<(), Fail> {
        let c = &self.shared.reg.counters;
        let mut res = Ok(());
        // Another process may still use the connection (the library's word): the references
        // stay while our end's socket is held (`handed_on`).
        let taint = flags & proto::RELEASE_TAINT_PEER != 0;
        if own != 0 && flags & proto::RELEASE_POOL_OWN != 0 && self.pool_own(own) {
            c.unregister.record(true);
        } else if own != 0 {
            match self.release_token(own, RefKind::Owner, false, taint) {
                Ok(()) => c.unregister.record(true),
                Err(f) => {
                    c.unregister.record(false);
                    c.failures.count(f);
                    res = Err(f);
                }
            }
        }
        if peer != 0 {
            match self.release_token(peer, RefKind::Attach, taint, taint) {
                Ok(()) => c.detach.record(true),
                Err(f) => {
                    c.detach.record(false);
                    c.failures.count(f);
                    res = Err(f);
                }
            }
        }
        res
    }

    /// Hands a client's fd to the closer (never closed on this worker: its last close may
    /// block), once the reply to the current request is sent ([`Conn::flush_closes`]).
    fn dispose(&mut self, fd: Option<OwnedFd>) {
        if let Some(fd) = fd {
            self.closing.push((self.uid.uid, fd));
        }
    }

    /// The fds disposed of since the last call go to the closer (one wakeup for all).
    fn flush_closes(&mut self) {
        if !self.closing.is_empty() {
            self.shared
                .closer
                .close_all_counted(std::mem::take(&mut self.closing), &self.closes_outstanding);
        }
    }

    fn op_counter(&self, op: u16) -> &super::registry::OpCounter {
        let c = &self.shared.reg.counters;
        match op {
            proto::OP_QUERY_GID => &c.query_gid,
            proto::OP_REGISTER => &c.register,
            proto::OP_ATTACH | proto::OP_ATTACH_PEER | proto::OP_ADOPT => &c.attach,
            proto::OP_DETACH => &c.detach,
            proto::OP_UNREGISTER => &c.unregister,
            proto::OP_STATS => &c.stats,
            proto::OP_WAIT => &c.wait,
            proto::OP_LIST => &c.list,
            proto::OP_PAIR => &c.pair,
            _ => &c.invalid,
        }
    }

    /// The quota bucket of cgroup `id` (the attached cgroup it belongs to).
    fn bucket(&mut self, id: Option<u64>) -> Arc<CgroupUsage> {
        let Some(id) = id else {
            return self.cg.clone();
        };
        if let Some((last, cg)) = &self.cg_last {
            if *last == id {
                return cg.clone();
            }
        }
        let cg = match self.shared.keys.key(id) {
            Some(k) => self.shared.reg.cgroup(&k),
            None => self.cg.clone(),
        };
        self.cg_last = Some((id, cg.clone()));
        cg
    }

    /// This client as an attacher (see [`Registry::attach`]).
    fn attacher(&self) -> Attacher<'_> {
        Attacher {
            conn: self.id,
            uid: self.uid.uid,
            ident: &self.ident,
        }
    }

    /// The socket a request passed, or why there is none.
    fn passed<T>(&self, fd: Option<T>) -> Result<T, Fail> {
        match fd {
            Some(fd) => Ok(fd),
            None if self.fds_dropped => Err(Fail::FdLimit),
            None => Err(Fail::BadSocket),
        }
    }

    fn register(
        &mut self,
        size_code: u8,
        record: bool,
        fd: Option<OwnedFd>,
        state: Option<OwnedFd>,
    ) -> Result<Arc<DmbObj>, Fail> {
        // A state page is kept only if it is one (a shmem file of its size); anything else
        // goes to the closer, and the DMB is registered without it.
        let state = match state {
            Some(s) if sys::is_state_page(s.as_fd(), proto::STATE_PAGE) => {
                Some(LocalState::Page(KeptFile::new(s, proto::STATE_PAGE)))
            }
            other => {
                self.dispose(other);
                None
            }
        };
        let fd = self.passed(fd)?;
        let sh = self.shared;
        let res = sys::inspect_tcp(fd.as_fd()).map(|id| {
            let info =
                diag::conn_info(fd.as_fd(), &id, sh.own_netns, sh.peers_map.as_deref(), true);
            (id, info)
        });
        let (id, info) = match res {
            Ok(r) => r,
            Err(_) => {
                self.dispose(Some(fd));
                return Err(Fail::BadSocket);
            }
        };
        self.note_netns(fd.as_fd(), &id);
        if info.no_descriptor {
            // The peer's cookie could not be looked up for want of a descriptor: registered
            // without it, the DMB could never be attached (a decline INTERR, or a reset of a
            // server past its accept). Declined with MEM now instead.
            self.dispose(Some(fd));
            drop(state);
            return Err(Fail::FdLimit);
        }
        let cg = self.bucket(info.owner_cgroup);
        // A registration that records its proof is a server's before its accept: the attach it
        // waits for is its client's, which can still decline (its files may be shelved
        // meanwhile). Any other may be a client's, attached by a server past its accept.
        let dmb = match sh.reg.register(
            size_code,
            id,
            info.peer_cookie,
            !record,
            &cg,
            &self.uid,
            &self.ident,
            state,
        ) {
            Ok(d) => d,
            Err(f) => {
                self.dispose(Some(fd));
                return Err(f);
            }
        };
        self.held.entry(dmb.token).or_default().owner = true;
        // The other end may wait in a PAIR (a peer of a newer version): it gets its DMB and
        // this one now.
        let partner = {
            let mut rdv = pair::lock(&sh.rdv);
            rdv.take_mirror(&id)
                .or_else(|| info.peer_cookie.and_then(|c| rdv.take_cookie(c)))
        };
        if let Some(y) = partner {
            if pair_proof(&y, &id, info.peer_cookie) {
                // Its failure is the parked end's (answered so): ours stands.
                let _ = self.serve_parked(y, &dmb, &id, None);
            } else {
                fail_parked(sh, y, Fail::NoPeer);
            }
        }
        if record {
            // Bounded like the registrations themselves (quotas): one per DMB it owns.
            if let Ok(p) = self.proof(fd.as_fd()) {
                self.recorded.insert(dmb.token, p);
            }
        }
        self.dispose(Some(fd));
        Ok(dmb)
    }

    /// `PAIR`: `Some((own, peer))` when the other end asked already (its answer goes to its
    /// task), `None` when this request waits for it (parked).
    fn pair(
        &mut self,
        size_code: u8,
        park_ms: u32,
        fd: Option<OwnedFd>,
        seq: u32,
        slots: Option<Arc<StateSlots>>,
    ) -> Result<Option<PairDmbs>, Fail> {
        let fd = self.passed(fd)?;
        let sh = self.shared;
        let xid = match sys::inspect_tcp(fd.as_fd()) {
            Ok(i) => i,
            Err(_) => {
                self.dispose(Some(fd));
                return Err(Fail::BadSocket);
            }
        };
        self.note_netns(fd.as_fd(), &xid);
        let mut partner = pair::lock(&sh.rdv).take_mirror(&xid);
        // Between namespaces (a loopback connection never is) the kernel's connection table
        // says who the other end is.
        let mut x_peer_cookie = None;
        if partner.is_none() {
            if let Some(token) = sh.reg.peer_token(&xid) {
                // The other end registered with OP_REGISTER (an older data path): attach it.
                let r = self.pair_registered(size_code, &xid, fd.as_fd(), token, slots);
                if r.is_ok() {
                    self.granted(Some(fd));
                } else {
                    self.dispose(Some(fd));
                }
                return r.map(Some);
            }
            let loopback = xid.local.ip().is_loopback() && xid.peer.ip().is_loopback();
            if !loopback {
                x_peer_cookie = diag::conn_info(
                    fd.as_fd(),
                    &xid,
                    sh.own_netns,
                    sh.peers_map.as_deref(),
                    false,
                )
                .peer_cookie;
            }
        }
        // Whether room was made for this request to wait (see `Registry::make_room`).
        let mut made_room = false;
        // Whether a refusal found for the other end was of this connection's other end.
        let mut refusal_ours: Option<bool> = None;
        let y = loop {
            let y = match partner.take() {
                Some(y) => y,
                None => {
                    let mut rdv = pair::lock(&sh.rdv);
                    let found = rdv
                        .take_mirror(&xid)
                        .or_else(|| x_peer_cookie.and_then(|c| rdv.take_cookie(c)));
                    match found {
                        Some(y) => y,
                        None => {
                            // Waiting keeps the socket open: not with the daemon at its
                            // descriptor limit, where the peer's request may have been dropped
                            // by the kernel (no socket, so nobody can tell it that its peer
                            // is gone) and would keep this one waiting in vain.
                            // The other end's was refused: it will not come. If that refused
                            // request was this connection's other end (the socket the kernel's
                            // table names as this one's peer, asked outside the rendezvous's
                            // lock): another uid could have had requests of sockets of its own
                            // from the same 4-tuple refused before (its own connection from
                            // that port to this server, then closed) and so turned this
                            // connection away (red team round 35, item 3: `NoPeer` for each
                            // server end that asked first, 5 of 5).
                            if let Some(cookie) = rdv.refused_mirror(&xid) {
                                match refusal_ours {
                                    None => {
                                        drop(rdv);
                                        refusal_ours = Some(match cookie {
                                            None => true,
                                            Some(c) => {
                                                let peer = x_peer_cookie.or_else(|| {
                                                    diag::conn_info(
                                                        fd.as_fd(),
                                                        &xid,
                                                        sh.own_netns,
                                                        None,
                                                        false,
                                                    )
                                                    .peer_cookie
                                                });
                                                peer == Some(c)
                                            }
                                        });
                                        continue;
                                    }
                                    Some(true) => {
                                        rdv.forget_refused_mirror(&xid);
                                        drop(rdv);
                                        self.dispose(Some(fd));
                                        return Err(Fail::NoPeer);
                                    }
                                    Some(false) => {} // not this connection's: waits as any
                                }
                            }
                            if sys::near_fd_limit(PARK_HEADROOM) {
                                if !made_room {
                                    // Room first (files of other DMBs shelved), outside the
                                    // rendezvous's lock; then the rendezvous again: the peer
                                    // may have asked meanwhile.
                                    made_room = true;
                                    drop(rdv);
                                    sh.reg.make_room(PARK_HEADROOM);
                                    continue;
                                }
                                rdv.refuse(&xid);
                                drop(rdv);
                                self.dispose(Some(fd));
                                return Err(Fail::FdLimit);
                            }
                            // Bounded per client and per uid: each waits with its socket open.
                            let charge = (self.parked.len() < MAX_PARKED)
                                .then(|| pair::ParkCharge::new(&self.uid))
                                .flatten();
                            let Some(charge) = charge else {
                                rdv.refuse(&xid);
                                drop(rdv);
                                self.dispose(Some(fd));
                                return Err(Fail::NoPeer);
                            };
                            let id = rdv.insert(Parked {
                                _charge: charge,
                                conn: self.id,
                                seq,
                                size_code,
                                who: xid,
                                sock: fd,
                                pool: self.pool.clone(),
                                uid: self.uid.clone(),
                                cg: self.cg.clone(),
                                ident: self.ident.clone(),
                                slots,
                                tx: self.tx.clone(),
                            });
                            drop(rdv);
                            let wait = Duration::from_millis(park_ms as u64);
                            self.parked
                                .push((seq, id, tokio::time::Instant::now() + wait));
                            return Ok(None);
                        }
                    }
                }
            };
            if pair_proof(&y, &xid, x_peer_cookie) {
                break y;
            }
            // Its connection is gone (or it was not our peer after all): it gets NoPeer, we
            // wait for our peer.
            fail_parked(sh, y, Fail::NoPeer);
        };
        let r = self.complete(size_code, &xid, fd.as_fd(), y, slots);
        if r.is_ok() {
            self.granted(Some(fd));
        } else {
            self.dispose(Some(fd));
        }
        r.map(Some)
    }

    /// Pairs our request (`xid`, socket `xfd`) with the parked `y`: a DMB for each end, each
    /// attached by the other; `y`'s answer goes to its task.
    fn complete(
        &mut self,
        size_code: u8,
        xid: &TcpIdentity,
        xfd: BorrowedFd<'_>,
        y: Parked,
        slots: Option<Arc<StateSlots>>,
    ) -> Result<PairDmbs, Fail> {
        let sh = self.shared;
        let Some(y_cookie) = y.who.cookie else {
            fail_parked(sh, y, Fail::BadProof);
            return Err(Fail::BadProof);
        };
        let cg = self.cg.clone();
        let own = own_dmb(
            sh,
            &self.pool,
            size_code,
            xid,
            xfd,
            y_cookie,
            y.conn,
            slots.as_deref(),
            &self.uid,
            &cg,
            &self.ident,
        );
        let own = match own {
            Ok(o) => o,
            Err(f) => {
                fail_parked(sh, y, f);
                return Err(f);
            }
        };
        self.held.entry(own.token).or_default().owner = true;
        match self.serve_parked(y, &own, xid, Some(xfd)) {
            Ok(peer) => Ok((own, peer)),
            Err(f) => {
                let _ = self.release_token(own.token, RefKind::Owner, false, false);
                Err(f)
            }
        }
    }

    /// The parked `y` gets its DMB (pooled or new) and attaches `x_own` (ours, bound to our
    /// socket `xid`); with our socket `x_attach`, we attach its DMB too (returned, else
    /// `x_own`). `y`'s answer (or failure) goes to its task; its socket is granted the
    /// shortcut and closed. `Err`: failed (y was answered so), and why (the failure is ours
    /// too: a `Mem` of the daemon is not an internal error).
    fn serve_parked(
        &mut self,
        y: Parked,
        x_own: &Arc<DmbObj>,
        xid: &TcpIdentity,
        x_attach: Option<BorrowedFd<'_>>,
    ) -> Result<Arc<DmbObj>, Fail> {
        let sh = self.shared;
        let Some(x_cookie) = xid.cookie else {
            fail_parked(sh, y, Fail::BadProof);
            return Err(Fail::BadProof);
        };
        let y_own = own_dmb(
            sh,
            &y.pool,
            y.size_code,
            &y.who,
            y.sock.as_fd(),
            x_cookie,
            self.id,
            y.slots.as_deref(),
            &y.uid,
            &y.cg,
            &y.ident,
        );
        let y_own = match y_own {
            Ok(o) => o,
            Err(f) => {
                fail_parked(sh, y, f);
                return Err(f);
            }
        };
        let y_grant_own = Grant::new(self.arc.reg.clone(), y_own.clone(), RefKind::Owner, true);
        // y attaches ours (the proof: its socket is the other end of ours).
        let y_peer = match sh.reg.attach(
            x_own.token,
            &y.who,
            attacher_cg(sh, y.sock.as_fd(), &y.who).as_deref(),
            Attacher {
                conn: y.conn,
                uid: y.uid.uid,
                ident: &y.ident,
            },
        ) {
            Ok(d) => Grant::new(self.arc.reg.clone(), d, RefKind::Attach, true),
            Err(f) => {
                drop(y_grant_own);
                fail_parked(sh, y, f);
                return Err(f);
            }
        };
        // We attach y's.
        let x_peer = if let Some(xfd) = x_attach {
            match sh.reg.attach(
                y_own.token,
                xid,
                attacher_cg(sh, xfd, xid).as_deref(),
                self.attacher(),
            ) {
                Ok(d) => {
                    self.held.entry(d.token).or_default().attaches += 1;
                    d
                }
                Err(f) => {
                    drop(y_peer);
                    drop(y_grant_own);
                    fail_parked(sh, y, f);
                    return Err(f);
                }
            }
        } else {
            x_own.clone()
        };
        if let Some(map) = sh.sock_state_map.as_deref() {
            super::grant::grant_shortcut(map, y.sock.as_fd());
        }
        let Parked {
            seq, sock, uid, tx, ..
        } = y;
        self.closing.push((uid.uid, sock));
        // A closed queue (its client left) drops the grants: released then.
        let _ = tx.send(Deferred::Paired {
            seq,
            own: y_grant_own,
            peer: y_peer,
        });
        sh.events.bump();
        Ok(x_peer)
    }

    /// `PAIR` of ours whose other end registered with `OP_REGISTER`: our DMB (pooled only if
    /// nobody ever attached it) and an attach of theirs.
    fn pair_registered(
        &mut self,
        size_code: u8,
        xid: &TcpIdentity,
        xfd: BorrowedFd<'_>,
        token: u64,
        slots: Option<Arc<StateSlots>>,
    ) -> Result<PairDmbs, Fail> {
        let sh = self.shared;
        let peer = sh.reg.attach(
            token,
            xid,
            attacher_cg(sh, xfd, xid).as_deref(),
            self.attacher(),
        )?;
        self.held.entry(token).or_default().attaches += 1;
        let info = diag::conn_info(xfd, xid, sh.own_netns, sh.peers_map.as_deref(), false);
        let Some(pc) = info.peer_cookie else {
            let _ = self.release_token(token, RefKind::Attach, false, false);
            return Err(Fail::PeerUnknown);
        };
        let cg = self.cg.clone();
        match own_dmb(
            sh,
            &self.pool,
            size_code,
            xid,
            xfd,
            pc,
            u64::MAX,
            slots.as_deref(),
            &self.uid,
            &cg,
            &self.ident,
        ) {
            Ok(own) => {
                self.held.entry(own.token).or_default().owner = true;
                Ok((own, peer))
            }
            Err(f) => {
                let _ = self.release_token(token, RefKind::Attach, false, false);
                Err(f)
            }
        }
    }

    /// `OP_RELEASE` with `RELEASE_POOL_OWN`: our DMB `token` goes into our pool (which holds
    /// its owner reference from now on). False when it may not be reused (it is released then
    /// by the caller).
    fn pool_own(&mut self, token: u64) -> bool {
        if self.shared.pool_max == 0 || !self.held.get(&token).is_some_and(|h| h.owner) {
            return false;
        }
        if !self.shared.reg.pool(token) {
            return false;
        }
        if let Some(h) = self.held.get_mut(&token) {
            h.owner = false;
            if h.attaches == 0 {
                self.held.remove(&token);
                super::registry::shrink_sparse(&mut self.held);
            }
        }
        let evicted = {
            let mut p = pair::lock(&self.pool);
            p.push_back((token, std::time::Instant::now()));
            if p.len() > self.shared.pool_max {
                p.pop_front()
            } else {
                None
            }
        };
        if let Some((old, _)) = evicted {
            self.shared.reg.release(old, RefKind::Owner, false);
        }
        true
    }

    /// Records the network namespace of socket `sock` (identity `id`) this client passed: the
    /// first one of a namespace other than the daemon's gets this connection a way to look up
    /// its ends there (`handed_on`).
    fn note_netns(&mut self, sock: BorrowedFd<'_>, id: &TcpIdentity) {
        let own = self.shared.own_netns;
        let uid = self.uid.uid;
        self.netns.note(id.netns_cookie, own, |cookie| {
            diag::ns_handle(sock, cookie, uid)
                .map_err(|e| log::debug!("no sock_diag socket in namespace {cookie:#x}: {e}"))
                .ok()
        });
    }

    /// Inspects the attacher's socket (and its cgroup, when the configuration compares
    /// cgroups). The caller hands the socket to the closer.
    fn proof(&mut self, fd: BorrowedFd<'_>) -> Result<Proof, Fail> {
        let sh = self.shared;
        let res = sys::inspect_tcp(fd.as_fd()).map(|id| {
            let cg = if sh.reg.needs_attacher_cgroup() {
                diag::socket_cgroup(fd.as_fd(), &id, sh.own_netns)
            } else {
                None
            };
            (id, cg)
        });
        let (id, cg) = res.map_err(|_| Fail::BadSocket)?;
        self.note_netns(fd, &id);
        let key = cg.map(|c| self.bucket(Some(c)).path.clone());
        Ok((id, key))
    }

    /// The attacher's socket proved to be the exact peer of the DMB owner's socket: it may
    /// enable the `sk_msg` shortcut (see `grant`); then it goes to the closer.
    fn granted(&mut self, fd: Option<OwnedFd>) {
        if let (Some(f), Some(map)) = (fd.as_ref(), self.shared.sock_state_map.as_deref()) {
            super::grant::grant_shortcut(map, f.as_fd());
        }
        self.dispose(fd);
    }

    /// The proof of this client's registration `own` (it holds the owner reference) that its
    /// registry record keeps (the owner's socket): for an attach of the peer's DMB by a
    /// server past its accept whose socket the daemon could not receive, when `own` came with
    /// a `PAIR` (no proof recorded: see `recorded`) and the server attaches the DMB its client
    /// registered alone after all.
    fn owner_proof(&self, own: u64) -> Option<Proof> {
        if !self.held.get(&own).is_some_and(|h| h.owner) {
            return None;
        }
        self.shared.reg.owner_proof(own)
    }

    /// Attaches the DMB `token`, or (`None`) the one the other end of the caller's connection
    /// registered. The proof is the socket passed, or, when the kernel dropped it (this daemon
    /// out of descriptors) and `own` names a registration of this client whose proof was
    /// recorded, that record (one that came with a `PAIR`: its registry record, see
    /// [`Conn::owner_proof`]). The reply passes the memfd's descriptor taken with the
    /// reference (a DMB that waited for this attach kept it: nothing to open at the limit).
    /// A passed socket, the exact peer of the DMB owner's socket, may
    /// enable the `sk_msg` shortcut (see `grant`); then it goes to the closer.
    fn attach(
        &mut self,
        token: Option<u64>,
        own: u64,
        fd: Option<OwnedFd>,
    ) -> Result<Arc<DmbObj>, Fail> {
        let (sock, proof) = match fd {
            Some(sock) => {
                let p = self.proof(sock.as_fd());
                (Some(sock), p)
            }
            None => {
                let rec = if self.fds_dropped && own != 0 {
                    self.recorded
                        .get(&own)
                        .cloned()
                        .or_else(|| self.owner_proof(own))
                } else {
                    None
                };
                match rec {
                    Some(p) => (None, Ok(p)),
                    None => {
                        return Err(self
                            .passed(None::<OwnedFd>)
                            .err()
                            .unwrap_or(Fail::BadSocket))
                    }
                }
            }
        };
        let by = self.attacher();
        let dmb = proof.and_then(|(id, cg)| match token {
            Some(t) => self.shared.reg.attach_passing(t, &id, cg.as_deref(), by),
            None => self.shared.reg.attach_peer(&id, cg.as_deref(), by),
        });
        if dmb.is_ok() {
            self.granted(sock);
        } else {
            self.dispose(sock);
        }
        let (dmb, fd) = dmb?;
        self.pass_fd = fd;
        self.held.entry(dmb.token).or_default().attaches += 1;
        if own != 0 {
            self.recorded.remove(&own);
        }
        Ok(dmb)
    }

    /// Attaches a DMB of the connection whose socket moved to the caller (`OP_ADOPT`).
    /// (`ADOPT_STATE`: the state page registered with it, no reference taken.)
    fn adopt(
        &mut self,
        which: u8,
        slot_ok: bool,
        fd: Option<OwnedFd>,
    ) -> Result<Arc<DmbObj>, Fail> {
        let sock = self.passed(fd)?;
        // Also a socket whose peer closed meanwhile (`CLOSE_WAIT`): the bytes it sent before
        // are in its DMB, to be read as TCP reads them.
        let id = sys::inspect_tcp_moved(sock.as_fd()).map_err(|_| Fail::BadSocket);
        if let Ok(id) = &id {
            self.note_netns(sock.as_fd(), id);
        }
        self.dispose(Some(sock));
        let dmb = self
            .shared
            .reg
            .adopt(&id?, which, slot_ok, self.uid.uid, &self.ident)?;
        if which == proto::ADOPT_STATE {
            self.pass_state = true;
            self.state_off_reply = slot_ok;
        } else {
            self.held.entry(dmb.token).or_default().attaches += 1;
        }
        Ok(dmb)
    }

    /// Drops our reference `kind` of `token`. `handed_on`: the connection may be used by
    /// another process now (see [`super::handed_on`]).
    fn release_token(
        &mut self,
        token: u64,
        kind: RefKind,
        taint: bool,
        handed_on: bool,
    ) -> Result<(), Fail> {
        let h = self.held.get_mut(&token).ok_or(Fail::NotHeld)?;
        match kind {
            RefKind::Owner if h.owner => h.owner = false,
            RefKind::Attach if h.attaches > 0 => h.attaches -= 1,
            _ => return Err(Fail::NotHeld),
        }
        if !h.owner && h.attaches == 0 {
            self.held.remove(&token);
            super::registry::shrink_sparse(&mut self.held);
        }
        if kind == RefKind::Owner {
            self.recorded.remove(&token);
        }
        if handed_on {
            self.shared
                .reg
                .release_or_keep(token, kind, taint, self.uid.uid, &self.netns);
        } else {
            self.shared.reg.release(token, kind, taint);
        }
        Ok(())
    }

    /// Releases every reference of this client, its pool and its parked requests; called
    /// once, from `Drop`.
    fn release_all(&mut self) {
        for (_, id, _) in std::mem::take(&mut self.parked) {
            let taken = pair::lock(&self.shared.rdv).take(id);
            if let Some(p) = taken {
                self.dispose(Some(p.sock));
            }
        }
        self.recorded.clear();
        let mut n = 0u64;
        // A connection whose socket another process holds now (a forked child, an exec'd
        // image, a receiver of `SCM_RIGHTS`) keeps its references until that process adopts
        // it or lets go (see `handed_on`).
        for (token, h) in self.held.drain() {
            for _ in 0..h.attaches {
                self.shared.reg.release_or_keep(
                    token,
                    RefKind::Attach,
                    false,
                    self.uid.uid,
                    &self.netns,
                );
                n += 1;
            }
            if h.owner {
                self.shared.reg.release_or_keep(
                    token,
                    RefKind::Owner,
                    false,
                    self.uid.uid,
                    &self.netns,
                );
                n += 1;
            }
        }
        let pooled: Vec<u64> = pair::lock(&self.pool).drain(..).map(|e| e.0).collect();
        for token in pooled {
            self.shared.reg.release(token, RefKind::Owner, false);
            n += 1;
        }
        if n > 0 {
            self.shared
                .reg
                .counters
                .released_on_disconnect
                .fetch_add(n, Relaxed);
        }
    }
}

/// The quota key of an attacher's socket, when the configuration compares cgroups.
fn attacher_cg(sh: &Shared, fd: BorrowedFd<'_>, id: &TcpIdentity) -> Option<String> {
    if !sh.reg.needs_attacher_cgroup() {
        return None;
    }
    diag::socket_cgroup(fd, id, sh.own_netns)
        .and_then(|c| sh.keys.key(c))
        .map(|k| sh.reg.cgroup(&k).path.clone())
}

/// Whether the parked `y` is the other end of `xid`'s connection: the mirrored 4-tuple in one
/// namespace while `y`'s socket is still established, or the peer cookie the kernel gave for
/// `xid`'s socket.
fn pair_proof(y: &Parked, xid: &TcpIdentity, x_peer_cookie: Option<u64>) -> bool {
    if pair::same_ns_mirror(&y.who, xid) {
        return sys::still_established(y.sock.as_fd());
    }
    x_peer_cookie.is_some() && x_peer_cookie == y.who.cookie
}

/// The parked `y` cannot be served: its task answers `fail`; its socket is closed.
fn fail_parked(sh: &Shared, y: Parked, fail: Fail) {
    let Parked {
        seq, sock, uid, tx, ..
    } = y;
    sh.closer.close(uid.uid, sock);
    let _ = tx.send(Deferred::Failed { seq, fail });
}

/// A DMB for the end `who` (socket `sock`) of a connection whose other end is the socket
/// `peer_cookie` of client connection `peer_conn`: from `pool` when one may be bound for that
/// peer ([`Registry::bind_pooled`]), else registered (charged to the socket's cgroup, or
/// `cg`, and `uid`) with a new local state for the owner (see [`proto::PAIR_OWN_STATE`]: the
/// next slot of `slots`, else a page of its own; `client`: the owner's client, who alone may
/// adopt it). The owner reference is the caller's to record for the owner.
#[allow(clippy::too_many_arguments)]
fn own_dmb(
    sh: &Shared,
    pool: &Pool,
    size_code: u8,
    who: &TcpIdentity,
    sock: BorrowedFd<'_>,
    peer_cookie: u64,
    peer_conn: u64,
    slots: Option<&StateSlots>,
    uid: &Arc<UidUsage>,
    cg: &Arc<CgroupUsage>,
    client: &ClientIdentity,
) -> Result<Arc<DmbObj>, Fail> {
    let mut gone = Vec::new();
    let epoch = slots.map(StateSlots::epoch);
    let bound = {
        let mut p = pair::lock(pool);
        let mut found = None;
        let mut i = 0;
        while i < p.len() {
            match sh
                .reg
                .bind_pooled(p[i].0, size_code, *who, peer_cookie, peer_conn, epoch)
            {
                Ok(d) => {
                    p.remove(i);
                    found = Some(d);
                    break;
                }
                Err(BindMiss::Gone) => {
                    if let Some((t, _)) = p.remove(i) {
                        gone.push(t);
                    }
                }
                Err(BindMiss::NotNow) => i += 1,
            }
        }
        found
    };
    // The pool held their owner references.
    for t in gone {
        sh.reg.release(t, RefKind::Owner, false);
    }
    if let Some(d) = bound {
        // The pool's owner reference passes to the connection.
        return Ok(d);
    }
    let info = diag::conn_info(sock, who, sh.own_netns, sh.peers_map.as_deref(), true);
    let bucket = info
        .owner_cgroup
        .and_then(|id| sh.keys.key(id))
        .map_or_else(|| cg.clone(), |k| sh.reg.cgroup(&k));
    // The owner's local state, kept with the DMB for a process its socket may move to
    // (`OP_ADOPT`) and handed to the owner with the reply; a pooled DMB keeps it. Without one
    // (no memory for it) the connection works but cannot move.
    let state = match slots {
        Some(s) => s.take(),
        None => sys::create_state_memfd(proto::STATE_PAGE)
            .ok()
            .map(|f| LocalState::Page(KeptFile::new(f, proto::STATE_PAGE))),
    };
    sh.reg.register(
        size_code,
        *who,
        Some(peer_cookie),
        true,
        &bucket,
        uid,
        client,
        state,
    )
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.release_all();
        self.flush_closes();
        self.uid.conns.fetch_sub(1, AcqRel);
        self.shared
            .reg
            .counters
            .clients_connected
            .fetch_sub(1, AcqRel);
        self.shared.events.bump();
    }
}
