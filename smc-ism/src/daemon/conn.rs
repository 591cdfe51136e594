//! One client connection: parse records, run ops, track the references this client holds, and
//! release all of them when the connection closes.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::sync::{watch, Notify};

use crate::proto::{self, DmbReply, Header, Status};
use crate::sys::{self, TcpIdentity};
use smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE;
use smc_common::clc::LOOPBACK_CHID;

use super::closer::Closer;
use super::diag::{self, CgroupKeys};
use super::registry::{CgroupUsage, ClientIdentity, DmbObj, Fail, RefKind, Registry, UidUsage};

/// State shared by all connection tasks.
pub(crate) struct Shared {
    pub reg: Registry,
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
    /// The last proof socket cgroup id and its quota bucket (a process's sockets nearly always
    /// share one cgroup: no global lookup per registration).
    cg_last: Option<(u64, Arc<CgroupUsage>)>,
    /// The kernel dropped the fds passed with the current request (`MSG_CTRUNC`: the daemon is
    /// out of descriptors): its missing socket is a `Mem` failure, not a client's error.
    fds_dropped: bool,
    held: HashMap<u64, Held>,
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
    if let (Some(hook), Some(c)) = (shared.client_hook.clone(), cred) {
        // Before the first reply: a client that waits for it finds the hook's work done.
        let _ = tokio::task::spawn_blocking(move || (hook.0)(c.uid, c.gid)).await;
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
    let mut conn = Conn {
        shared: &shared,
        uid,
        cg,
        ident,
        second: None,
        pass_state: false,
        cg_last: None,
        fds_dropped: false,
        held: HashMap::new(),
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
            conn.run(&afd, &mut stop).await;
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

async fn recv(afd: &AsyncFd<OwnedFd>, buf: &mut [u8]) -> io::Result<sys::Received> {
    loop {
        let mut g = afd.readable().await?;
        match g.try_io(|inner| sys::recv_record(inner.as_raw_fd(), buf, libc::MSG_DONTWAIT)) {
            Ok(r) => return r,
            Err(_would_block) => continue,
        }
    }
}

async fn send(afd: &AsyncFd<OwnedFd>, data: &[u8], pass: Option<RawFd>) -> io::Result<()> {
    loop {
        let mut g = afd.writable().await?;
        match g.try_io(|inner| {
            sys::send_record(inner.as_raw_fd(), data, pass.as_slice(), libc::MSG_DONTWAIT)
        }) {
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
    async fn run(&mut self, afd: &AsyncFd<OwnedFd>, stop: &mut watch::Receiver<bool>) {
        let mut buf = vec![0u8; proto::MAX_REQUEST + 1];
        let mut out = Vec::with_capacity(64);
        loop {
            // A uid whose handed-over fds do not close is not read from until they do: its
            // further fds wait in its own socket buffer, not in the daemon's fd table.
            while self.shared.closer.over_limit(self.uid.uid) {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            let r = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                r = recv(afd, &mut buf) => r,
            };
            let r = match r {
                Ok(r) if r.len == 0 => {
                    // EOF (or an empty record: treated alike)
                    self.dispose(r.fd);
                    r.extra.into_iter().for_each(|f| self.dispose(Some(f)));
                    return;
                }
                Ok(mut r) => {
                    // No request takes more than two fds (REGISTER: the socket and a state
                    // page); the second is kept for `handle`, which disposes of it unless the
                    // request is a REGISTER.
                    let mut extra = std::mem::take(&mut r.extra).into_iter();
                    self.second = extra.next();
                    for f in extra {
                        self.dispose(Some(f));
                    }
                    r
                }
                Err(e) => {
                    log::debug!("client recv: {e}");
                    return;
                }
            };
            self.fds_dropped = r.fds_dropped;
            let pass = self
                .handle(&buf[..r.len], r.truncated, r.fd, &mut out, stop)
                .await;
            if out.is_empty() {
                // A request that wants no reply (NOREPLY_BIT).
                continue;
            }
            // A client that stops reading its replies must not hold up the daemon's shutdown.
            let res = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                r = send(afd, &out, pass.as_ref().and_then(|d| {
                    if self.pass_state {
                        d.state.as_ref().map(|s| s.as_raw_fd())
                    } else {
                        Some(d.memfd.as_raw_fd())
                    }
                })) => r,
            };
            drop(pass);
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

    /// Handles one record, writes the reply into `out`; returns the DMB whose memfd goes along.
    async fn handle(
        &mut self,
        rec: &[u8],
        truncated: bool,
        fd: Option<OwnedFd>,
        out: &mut Vec<u8>,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<Arc<DmbObj>> {
        let reg = &self.shared.reg;
        let c = &reg.counters;
        out.clear();
        let d = proto::decode_request(rec, truncated);
        let (op, seq, noreply) = (d.op, d.seq, d.noreply);
        self.pass_state = false;
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
                        return None;
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
                return None;
            }
            R::Register { size_code } => {
                (&c.register, self.register(size_code, fd, state).map(Some))
            }
            R::Attach { token } => (&c.attach, self.attach(token, fd).map(Some)),
            R::AttachPeer => (&c.attach, self.attach_peer(fd).map(Some)),
            R::Adopt { which } => (&c.attach, self.adopt(which, fd).map(Some)),
            R::Release { own, peer } => {
                // Counted as the unregister and the detach it stands for.
                let mut res = Ok(());
                for (token, kind, counter) in [
                    (peer, RefKind::Attach, &c.detach),
                    (own, RefKind::Owner, &c.unregister),
                ] {
                    if token == 0 {
                        continue;
                    }
                    match self.release_token(token, kind) {
                        Ok(()) => counter.record(true),
                        Err(f) => {
                            counter.record(false);
                            c.failures.count(f);
                            res = Err(f);
                        }
                    }
                }
                self.shared.events.bump();
                if !noreply {
                    match res {
                        Ok(()) => encode_reply(out, op, seq, Status::Ok, 0, &[]),
                        Err(f) => fail_reply(out, op, seq, f),
                    }
                }
                return None;
            }
            R::Detach { token } => (
                &c.detach,
                self.release_token(token, RefKind::Attach).map(|_| None),
            ),
            R::Unregister { token } => (
                &c.unregister,
                self.release_token(token, RefKind::Owner).map(|_| None),
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
                return None;
            }
            R::List { start, max } => {
                let list = reg.list(start, max as usize, Some(self.uid.uid));
                c.list.record(true);
                match serde_json::to_vec(&list) {
                    Ok(json) => encode_reply(out, op, seq, Status::Ok, 0, &json),
                    Err(_) => fail_reply(out, op, seq, Fail::Internal),
                }
                return None;
            }
        };
        counter.add_time(t0.elapsed());
        match result {
            Ok(dmb) => {
                counter.record(true);
                self.shared.events.bump();
                if noreply {
                    return None;
                }
                match &dmb {
                    Some(d) => encode_reply(out, op, seq, Status::Ok, 0, &dmb_result(d)),
                    None => encode_reply(out, op, seq, Status::Ok, 0, &[]),
                }
                dmb
            }
            Err(f) => {
                counter.record(false);
                c.failures.count(f);
                if !noreply {
                    fail_reply(out, op, seq, f);
                }
                None
            }
        }
    }

    /// Hands a client's fd to the closer (never closed on this worker: its last close may
    /// block).
    fn dispose(&self, fd: Option<OwnedFd>) {
        if let Some(fd) = fd {
            self.shared.closer.close(self.uid.uid, fd);
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

    /// The socket a request passed, or why there is none.
    fn passed<T>(&self, fd: Option<T>) -> Result<T, Fail> {
        match fd {
            Some(fd) => Ok(fd),
            None if self.fds_dropped => Err(Fail::Memfd(libc::EMFILE)),
            None => Err(Fail::BadSocket),
        }
    }

    fn register(
        &mut self,
        size_code: u8,
        fd: Option<OwnedFd>,
        state: Option<OwnedFd>,
    ) -> Result<Arc<DmbObj>, Fail> {
        // A state page is kept only if it is one (a shmem file of its size); anything else
        // goes to the closer, and the DMB is registered without it.
        let state = match state {
            Some(s) if sys::is_state_page(s.as_fd(), proto::STATE_PAGE) => Some(s),
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
        self.dispose(Some(fd));
        let (id, info) = res.map_err(|_| Fail::BadSocket)?;
        let cg = self.bucket(info.owner_cgroup);
        let dmb = sh.reg.register(
            size_code,
            id,
            info.peer_cookie,
            &cg,
            &self.uid,
            &self.ident,
            state,
        )?;
        self.held.entry(dmb.token).or_default().owner = true;
        Ok(dmb)
    }

    /// Inspects the attacher's socket (and its cgroup, when the configuration compares
    /// cgroups). The caller hands the socket to the closer.
    fn proof(&mut self, fd: &Option<OwnedFd>) -> Result<(TcpIdentity, Option<String>), Fail> {
        let fd = self.passed(fd.as_ref())?;
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
        let key = cg.map(|c| self.bucket(Some(c)).path.clone());
        Ok((id, key))
    }

    /// The attacher's socket proved to be the exact peer of the DMB owner's socket: it may
    /// enable the `sk_msg` shortcut (see `grant`); then it goes to the closer.
    fn granted(&self, fd: Option<OwnedFd>) {
        if let (Some(f), Some(map)) = (fd.as_ref(), self.shared.sock_state_map.as_deref()) {
            super::grant::grant_shortcut(map, f.as_fd());
        }
        self.dispose(fd);
    }

    fn attach(&mut self, token: u64, fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let proof = self.proof(&fd);
        let dmb = proof.and_then(|(id, cg)| self.shared.reg.attach(token, &id, cg.as_deref()));
        match dmb {
            Ok(dmb) => {
                self.granted(fd);
                self.held.entry(token).or_default().attaches += 1;
                Ok(dmb)
            }
            Err(f) => {
                self.dispose(fd);
                Err(f)
            }
        }
    }

    /// Attaches the DMB the other end of the caller's connection registered.
    fn attach_peer(&mut self, fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let proof = self.proof(&fd);
        let dmb = proof.and_then(|(id, cg)| self.shared.reg.attach_peer(&id, cg.as_deref()));
        match dmb {
            Ok(dmb) => {
                self.granted(fd);
                self.held.entry(dmb.token).or_default().attaches += 1;
                Ok(dmb)
            }
            Err(f) => {
                self.dispose(fd);
                Err(f)
            }
        }
    }

    /// Attaches a DMB of the connection whose socket moved to the caller (`OP_ADOPT`).
    /// (`ADOPT_STATE`: the state page registered with it, no reference taken.)
    fn adopt(&mut self, which: u8, fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let proof = self.proof(&fd);
        self.dispose(fd);
        let (id, _) = proof?;
        let dmb = self
            .shared
            .reg
            .adopt(&id, which, self.uid.uid, &self.ident)?;
        if which == proto::ADOPT_STATE {
            self.pass_state = true;
        } else {
            self.held.entry(dmb.token).or_default().attaches += 1;
        }
        Ok(dmb)
    }

    fn release_token(&mut self, token: u64, kind: RefKind) -> Result<(), Fail> {
        let h = self.held.get_mut(&token).ok_or(Fail::NotHeld)?;
        match kind {
            RefKind::Owner if h.owner => h.owner = false,
            RefKind::Attach if h.attaches > 0 => h.attaches -= 1,
            _ => return Err(Fail::NotHeld),
        }
        if !h.owner && h.attaches == 0 {
            self.held.remove(&token);
        }
        self.shared.reg.release(token, kind);
        Ok(())
    }

    /// Releases every reference of this client; called once, from `Drop`.
    fn release_all(&mut self) {
        let mut n = 0u64;
        for (token, h) in self.held.drain() {
            for _ in 0..h.attaches {
                self.shared.reg.release(token, RefKind::Attach);
                n += 1;
            }
            if h.owner {
                self.shared.reg.release(token, RefKind::Owner);
                n += 1;
            }
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

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        self.release_all();
        self.uid.conns.fetch_sub(1, AcqRel);
        self.shared
            .reg
            .counters
            .clients_connected
            .fetch_sub(1, AcqRel);
        self.shared.events.bump();
    }
}
