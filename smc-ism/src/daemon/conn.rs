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

use crate::client::CHID_LOOPBACK;
use crate::proto::{self, DmbReply, Header, Status};
use crate::sys::{self, TcpIdentity};

use super::registry::{CgroupUsage, DmbObj, Fail, RefKind, Registry};

/// State shared by all connection tasks.
pub(crate) struct Shared {
    pub reg: Registry,
    pub events: Events,
}

/// A generation counter with waiters: every state change bumps it; `WAIT` requests sleep until
/// it moves. Free of the missed wakeup of seed 000: a waiter creates its `Notified` future
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

/// Closes a proof socket right away. A socket with SO_LINGER on could block close(2) for the
/// linger time if ours is the last reference, so such a close goes to a blocking thread.
fn close_proof(fd: OwnedFd) {
    if sys::lingers(fd.as_fd()) {
        tokio::task::spawn_blocking(move || drop(fd));
    } else {
        drop(fd);
    }
}

struct Conn<'a> {
    shared: &'a Shared,
    /// The caller is root (SO_PEERCRED uid 0 when it connected): may see tokens.
    root: bool,
    cg: Arc<CgroupUsage>,
    held: HashMap<u64, Held>,
}

/// Serves one client until it disconnects or the daemon stops, then releases everything it held.
pub(crate) async fn serve_conn(shared: Arc<Shared>, fd: OwnedFd, mut stop: watch::Receiver<bool>) {
    let cred = sys::peer_cred(fd.as_fd()).ok();
    let cg_path = cred
        .map(|c| read_cgroup(c.pid))
        .unwrap_or_else(|| "/".to_owned());
    let mut conn = Conn {
        shared: &shared,
        root: cred.is_some_and(|c| c.uid == 0),
        cg: shared.reg.cgroup(&cg_path),
        held: HashMap::new(),
    };
    // SAFETY: the OwnedFd is moved into the AsyncFd, which neither replaces nor closes it while
    // registered.
    match unsafe { AsyncFd::register(fd) } {
        Ok(afd) => {
            log::debug!(
                "client connected: pid {:?} uid {:?} cgroup {}",
                cred.map(|c| c.pid),
                cred.map(|c| c.uid),
                cg_path
            );
            conn.run(&afd, &mut stop).await;
        }
        Err(e) => log::warn!("cannot register client socket with the reactor: {e}"),
    }
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
            let r = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                r = recv(afd, &mut buf) => r,
            };
            let r = match r {
                Ok(r) if r.len == 0 => return, // EOF (or an empty record: treated alike)
                Ok(r) => r,
                Err(e) => {
                    log::debug!("client recv: {e}");
                    return;
                }
            };
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
                r = send(afd, &out, pass.as_ref().map(|d| d.memfd.as_raw_fd())) => r,
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
        let hdr = Header::decode(rec);
        let (raw_op, seq) = hdr.map(|h| (h.op, h.seq)).unwrap_or((0, 0));
        let noreply = raw_op & proto::NOREPLY_BIT != 0
            && hdr.is_some_and(|h| h.magic == proto::MAGIC && h.version == proto::VERSION)
            && matches!(
                raw_op & !proto::NOREPLY_BIT,
                proto::OP_DETACH | proto::OP_UNREGISTER | proto::OP_RELEASE
            );
        let op = if noreply {
            raw_op & !proto::NOREPLY_BIT
        } else {
            raw_op
        };
        let invalid = if truncated || rec.len() > proto::MAX_REQUEST {
            Some(Fail::Oversized)
        } else {
            match hdr {
                None => Some(Fail::Malformed),
                Some(h) if h.magic != proto::MAGIC => Some(Fail::Malformed),
                Some(h) if h.version != proto::VERSION => Some(Fail::BadVersion),
                Some(h) if h.len as usize != rec.len() - proto::HEADER_LEN => Some(Fail::Malformed),
                Some(_) if raw_op & proto::NOREPLY_BIT != 0 && !noreply => Some(Fail::Malformed),
                Some(_) if !matches!(op, proto::OP_QUERY_GID..=proto::OP_MAX) => {
                    Some(Fail::UnknownOp)
                }
                Some(_) => None,
            }
        };
        if let Some(f) = invalid {
            if let Some(fd) = fd {
                close_proof(fd);
            }
            c.invalid.record(false);
            c.failures.count(f);
            if !noreply {
                fail_reply(out, op & !proto::REPLY_BIT, seq, f);
            }
            return None;
        }
        let payload = &rec[proto::HEADER_LEN..];
        // Only REGISTER, ATTACH and ATTACH_PEER take an fd; anything else passed is closed now.
        let fd = match op {
            proto::OP_REGISTER | proto::OP_ATTACH | proto::OP_ATTACH_PEER => fd,
            _ => {
                if let Some(fd) = fd {
                    close_proof(fd);
                }
                None
            }
        };
        let (counter, result): (_, Result<Option<Arc<DmbObj>>, Fail>) = match op {
            proto::OP_QUERY_GID => {
                let mut b = [0u8; proto::GID_REPLY_LEN];
                b[0..8].copy_from_slice(&reg.gid.gid.to_le_bytes());
                b[8..16].copy_from_slice(&reg.gid.gid_ext.to_le_bytes());
                b[16..18].copy_from_slice(&CHID_LOOPBACK.to_le_bytes());
                b[18] = crate::client::MAX_SIZE_CODE;
                b[20..24].copy_from_slice(&proto::FEATURES.to_le_bytes());
                c.query_gid.record(true);
                encode_reply(out, op, seq, Status::Ok, 0, &b);
                return None;
            }
            proto::OP_REGISTER => (&c.register, self.register(payload, fd).map(Some)),
            proto::OP_ATTACH => (&c.attach, self.attach(payload, fd).map(Some)),
            proto::OP_ATTACH_PEER => (&c.attach, self.attach_peer(fd).map(Some)),
            proto::OP_RELEASE => {
                // Counted as the unregister and the detach it stands for.
                if payload.len() < 16 {
                    c.invalid.record(false);
                    c.failures.count(Fail::Malformed);
                    if !noreply {
                        fail_reply(out, op, seq, Fail::Malformed);
                    }
                    return None;
                }
                let own = proto::get_u64(payload, 0);
                let peer = proto::get_u64(payload, 8);
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
            proto::OP_DETACH => (
                &c.detach,
                self.release(payload, RefKind::Attach).map(|_| None),
            ),
            proto::OP_UNREGISTER => (
                &c.unregister,
                self.release(payload, RefKind::Owner).map(|_| None),
            ),
            proto::OP_STATS | proto::OP_WAIT => {
                let counter = if op == proto::OP_STATS {
                    &c.stats
                } else {
                    &c.wait
                };
                if op == proto::OP_WAIT {
                    if payload.len() < 16 {
                        c.wait.record(false);
                        c.failures.count(Fail::Malformed);
                        fail_reply(out, op, seq, Fail::Malformed);
                        return None;
                    }
                    let since = proto::get_u64(payload, 0);
                    let ms = proto::get_u32(payload, 8).min(60_000);
                    tokio::select! {
                        _ = self.shared.events.wait_change(since, Duration::from_millis(ms as u64)) => {}
                        _ = stop.wait_for(|s| *s) => {}
                    }
                }
                counter.record(true);
                let stats = reg.stats(self.shared.events.generation());
                match serde_json::to_vec(&stats) {
                    Ok(json) => encode_reply(out, op, seq, Status::Ok, 0, &json),
                    Err(_) => fail_reply(out, op, seq, Fail::Internal),
                }
                return None;
            }
            proto::OP_LIST => {
                if payload.len() < 8 {
                    c.list.record(false);
                    c.failures.count(Fail::Malformed);
                    fail_reply(out, op, seq, Fail::Malformed);
                    return None;
                }
                let start = proto::get_u32(payload, 0);
                let max = proto::get_u32(payload, 4).clamp(1, proto::LIST_PAGE_MAX);
                let list = reg.list(start, max as usize, self.root);
                c.list.record(true);
                match serde_json::to_vec(&list) {
                    Ok(json) => encode_reply(out, op, seq, Status::Ok, 0, &json),
                    Err(_) => fail_reply(out, op, seq, Fail::Internal),
                }
                return None;
            }
            _ => unreachable!("op range checked above"),
        };
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

    /// Inspects the proof socket and closes it before anything else happens.
    fn proof(&self, fd: Option<OwnedFd>) -> Result<TcpIdentity, Fail> {
        let fd = fd.ok_or(Fail::BadSocket)?;
        let id = sys::inspect_tcp(fd.as_fd()).map_err(|_| Fail::BadSocket);
        close_proof(fd);
        id
    }

    fn register(&mut self, payload: &[u8], fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let id = self.proof(fd);
        if payload.len() < 8 {
            return Err(Fail::Malformed);
        }
        let size_code = payload[0];
        if size_code > crate::client::MAX_SIZE_CODE {
            return Err(Fail::BadSize);
        }
        let dmb = self.shared.reg.register(size_code, id?, &self.cg)?;
        self.held.entry(dmb.token).or_default().owner = true;
        Ok(dmb)
    }

    fn attach(&mut self, payload: &[u8], fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let id = self.proof(fd);
        if payload.len() < 8 {
            return Err(Fail::Malformed);
        }
        let token = proto::get_u64(payload, 0);
        let dmb = self.shared.reg.attach(token, &id?, &self.cg)?;
        self.held.entry(token).or_default().attaches += 1;
        Ok(dmb)
    }

    /// Attaches the DMB the other end of the caller's connection registered.
    fn attach_peer(&mut self, fd: Option<OwnedFd>) -> Result<Arc<DmbObj>, Fail> {
        let id = self.proof(fd)?;
        let dmb = self.shared.reg.attach_peer(&id, &self.cg)?;
        self.held.entry(dmb.token).or_default().attaches += 1;
        Ok(dmb)
    }

    fn release(&mut self, payload: &[u8], kind: RefKind) -> Result<(), Fail> {
        if payload.len() < 8 {
            return Err(Fail::Malformed);
        }
        self.release_token(proto::get_u64(payload, 0), kind)
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
        self.shared
            .reg
            .counters
            .clients_connected
            .fetch_sub(1, AcqRel);
        self.shared.events.bump();
    }
}
