//! A daemon connection shared by the threads of a process, with no lock held while a thread
//! waits for the daemon.
//!
//! [`crate::Client`] is single-threaded: a process that shares one behind a `Mutex` makes every
//! thread's handshake wait behind another thread's round trip (up to its timeout), and a `fork`
//! while a thread holds that mutex leaves the child with a lock nobody will release.
//! `SharedClient` keeps the pipelining design of the client (requests answered in order,
//! [`Ticket`]s finished in any order) but takes its mutex only to send a request
//! (`MSG_DONTWAIT`: a daemon that does not read its socket fails the request at once rather
//! than blocking the sender) and to file a reply. One waiting thread at a time reads the socket,
//! without the mutex; replies to other tickets it reads on the way are handed to their waiters.
//! So concurrent handshakes overlap their round trips, and no lock is ever held across a wait.
//!
//! References granted through it belong to its connection, as with [`crate::Client`]: when the
//! connection closes (a broken daemon connection, the process exits) the daemon releases them;
//! the next request connects anew. A timeout does not close it (other threads' references
//! stay valid): the request is abandoned.
//!
//! It does not handle `fork` itself: a child must not use its parent's instance (make a new one
//! and forget the old one with [`SharedClient::forget_after_fork`]).

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::client::{self, check_reply, dmb_answer, dmb_of, Dmb, Gid, Ticket, DEFAULT_TIMEOUT};
use crate::error::IsmError;
use crate::proto::{self, Header};
use crate::sys;

/// Generations are unique across instances: a ticket of an instance forgotten at a fork never
/// matches the child's new one.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Largest reply record read through a shared client (DMB and GID replies are far smaller).
const REPLY_MAX: usize = 256;

/// A reply filed for its ticket's waiter: the record, the fds that came with it, and a
/// placeholder descriptor taken again for the ticket's reserve when the reply brought no fd
/// (see `reserves`). `reserved`: the request was sent with a reserve (a waiter that can no
/// longer decline), whose memfd is never given back ([`SharedClient::give_back_filed`]).
struct Filed {
    rec: Vec<u8>,
    fd: Option<OwnedFd>,
    extra: Vec<OwnedFd>,
    reserve: Option<OwnedFd>,
    reserved: bool,
}

struct State {
    /// The connection (shared with a reader that reads it without the lock).
    fd: Option<Arc<OwnedFd>>,
    generation: u64,
    seq: u32,
    features: Option<u32>,
    /// The daemon's largest size code, from the same `QUERY_GID` reply.
    max_size_code: Option<u8>,
    /// The device GID, from the same reply: one `QUERY_GID` per connection answers both
    /// [`SharedClient::features`] and [`SharedClient::query_gid`] (a fresh process's first
    /// handshake asked twice, one more round trip to a daemon that had just accepted it).
    gid: Option<Gid>,
    /// Requests whose replies are still to be read, oldest first.
    inflight: VecDeque<u32>,
    /// How many of them are `PAIR` requests (answered when their peer asks: they do not count
    /// against [`client::MAX_INFLIGHT`], whose replies would otherwise fill the socket).
    pairs: usize,
    /// Replies read for tickets not finished yet.
    filed: HashMap<u32, Filed>,
    /// A thread is reading the socket.
    reading: bool,
    /// Requests whose waiter gave up (timeout, [`SharedClient::abandon`]), with their op:
    /// their replies are dropped when read, and the references they grant given back.
    abandoned: Vec<(u32, u16)>,
    /// References granted by abandoned requests, given back with the next request (not
    /// while the lock is held).
    to_release: Vec<(u64, u64)>,
    /// Descriptors held for the memfd of a request's reply, by seq: the reader closes one only
    /// once that very reply is the next to read and reads it at once, so that a process at
    /// `RLIMIT_NOFILE` (its application took every free descriptor meanwhile) still receives
    /// it.
    reserves: HashMap<u32, OwnedFd>,
    /// Threads asleep on `changed` (counted under the lock): a notification with none costs a
    /// `futex` system call for nothing (std's `Condvar` makes one on every `notify_all`), on
    /// the path from a daemon reply to the CLC message it lets a handshake send.
    waiters: usize,
}

/// A thread-safe daemon connection; see the module documentation.
pub struct SharedClient {
    path: PathBuf,
    timeout: Duration,
    state: Mutex<State>,
    /// Signalled when a reply is filed, the reader leaves, or the connection changes.
    changed: Condvar,
    /// The connection's descriptor, for [`SharedClient::forget_after_fork`] (-1: none).
    raw: AtomicI32,
    /// Ask for local state slots ([`SharedClient::set_state_slots`]).
    state_slots: std::sync::atomic::AtomicBool,
    /// How many times this process forked ([`SharedClient::forked`]).
    fork_epoch: AtomicU32,
    /// The fork epoch the daemon was last told of ([`proto::PAIR_FLAG_NEW_SLOT_PAGE`]).
    told_epoch: AtomicU32,
}

impl std::fmt::Debug for SharedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedClient")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SharedClient {
    /// A client of the daemon at `path`; it connects at the first request.
    pub fn new(path: &Path) -> SharedClient {
        SharedClient {
            path: path.to_path_buf(),
            timeout: DEFAULT_TIMEOUT,
            state: Mutex::new(State {
                fd: None,
                generation: GENERATION.fetch_add(1, Ordering::Relaxed),
                seq: 0,
                features: None,
                max_size_code: None,
                gid: None,
                inflight: VecDeque::new(),
                pairs: 0,
                filed: HashMap::new(),
                reading: false,
                abandoned: Vec::new(),
                to_release: Vec::new(),
                reserves: HashMap::new(),
                waiters: 0,
            }),
            changed: Condvar::new(),
            raw: AtomicI32::new(-1),
            state_slots: std::sync::atomic::AtomicBool::new(false),
            fork_epoch: AtomicU32::new(0),
            told_epoch: AtomicU32::new(0),
        }
    }

    /// The descriptor of the daemon connection (-1: none), so that a library using this
    /// client can keep an application's `close`/`close_range` off it.
    pub fn raw_fd(&self) -> RawFd {
        self.raw.load(Ordering::SeqCst)
    }

    /// Connects now when not connected (fails fast when the daemon is not there).
    pub fn connect(&self) -> Result<(), IsmError> {
        self.connection().map(|_| ())
    }

    /// In a forked child (one thread), for the parent's instance that the child will never use
    /// again: closes the child's copy of the connection so that the daemon sees the parent's
    /// connection close when the parent closes it. The instance must be leaked, not dropped,
    /// and not used afterwards (its state may have been held by a thread that does not exist
    /// in the child).
    pub fn forget_after_fork(&self) {
        let fd = self.raw.swap(-1, Ordering::Relaxed);
        if fd >= 0 {
            // SAFETY: our descriptor; the instance is leaked by the contract above, so its
            // `OwnedFd` never closes this number again.
            unsafe { libc::close(fd) };
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the threads waiting on `changed`, if any (`st`: the state, locked: a waiter
    /// counts itself under the lock before it sleeps, so none is missed).
    fn wake(&self, st: &State) {
        if st.waiters > 0 {
            self.changed.notify_all();
        }
    }

    /// Forgets the connection and everything in flight on it; wakes every waiter.
    fn disconnect(&self, st: &mut State) {
        // `raw` first: a fork between the two must not leave the child a number that this
        // close frees and another thread may reuse ([`SharedClient::forget_after_fork`] would
        // close that file in the child).
        self.raw.store(-1, Ordering::SeqCst);
        st.fd = None;
        st.features = None;
        st.max_size_code = None;
        st.gid = None;
        st.inflight.clear();
        st.pairs = 0;
        st.filed.clear();
        st.abandoned.clear();
        // The daemon released everything the connection held.
        st.to_release.clear();
        st.reserves.clear();
        st.generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        self.wake(st);
    }

    /// The state with a connection (made outside the lock when there is none).
    fn connection(&self) -> Result<MutexGuard<'_, State>, IsmError> {
        {
            let st = self.lock();
            if st.fd.is_some() {
                return Ok(st);
            }
        }
        let fd = client::open(&self.path, self.timeout)?;
        let mut st = self.lock();
        if st.fd.is_none() {
            self.disconnect(&mut st);
            self.raw.store(fd.as_raw_fd(), Ordering::Relaxed);
            st.fd = Some(Arc::new(fd));
        }
        Ok(st)
    }

    /// Sends one request without waiting for its reply (a full socket buffer is waited on,
    /// within the timeout); its seq is queued for a reply unless it carries `NOREPLY_BIT`.
    fn send(&self, op: u16, payload: &[u8], pass: &[RawFd]) -> Result<Ticket, IsmError> {
        self.send_reserved(op, payload, pass, &mut None)
    }

    /// As `send`; `reserve` (taken when the request is sent) is held for the reply's memfd.
    fn send_reserved(
        &self,
        op: u16,
        payload: &[u8],
        pass: &[RawFd],
        reserve: &mut Option<OwnedFd>,
    ) -> Result<Ticket, IsmError> {
        self.flush_releases();
        let reused = self.lock().fd.is_some();
        match self.send_once_reserved(op, payload, pass, reserve) {
            // A connection the daemon closed (it restarted): once more on a new one.
            Err(IsmError::Disconnected) if reused => {
                self.send_once_reserved(op, payload, pass, reserve)
            }
            r => r,
        }
    }

    fn send_once(&self, op: u16, payload: &[u8], pass: &[RawFd]) -> Result<Ticket, IsmError> {
        self.send_once_reserved(op, payload, pass, &mut None)
    }

    fn send_once_reserved(
        &self,
        op: u16,
        payload: &[u8],
        pass: &[RawFd],
        reserve: &mut Option<OwnedFd>,
    ) -> Result<Ticket, IsmError> {
        let mut st = self.connection()?;
        // At most MAX_INFLIGHT replies outstanding: an event loop with hundreds of handshakes
        // under way would otherwise fill the socket with replies, the daemon would block
        // sending them and stop reading, and this request would fail (as `Client` does: the
        // oldest reply is read and filed for its ticket first).
        let deadline = Instant::now() + self.timeout;
        loop {
            while st.inflight.len() - st.pairs >= client::MAX_INFLIGHT {
                let (g, r) = self.wait_step(st, deadline);
                st = g;
                if !r? {
                    return Err(IsmError::Timeout);
                }
                if st.fd.is_none() {
                    return Err(IsmError::Disconnected);
                }
            }
            let Some(fd) = st.fd.as_ref().map(|f| f.as_raw_fd()) else {
                return Err(IsmError::Disconnected);
            };
            let seq = st.seq.wrapping_add(1);
            let mut req = [0u8; proto::MAX_REQUEST];
            let n = proto::HEADER_LEN + payload.len();
            if n > req.len() {
                return Err(IsmError::Protocol("request too large"));
            }
            Header::new(op, payload.len(), seq).encode(&mut req);
            req[proto::HEADER_LEN..n].copy_from_slice(payload);
            if let Err(e) = sys::send_record(fd, &req[..n], pass, libc::MSG_DONTWAIT) {
                if e.raw_os_error() == Some(libc::EAGAIN) {
                    // The socket's send buffer is full: the daemon is behind (a burst of
                    // registrations and releases, e.g. when many handshakes decline at once; the
                    // releases expect no reply, so `MAX_INFLIGHT` does not bound them), or it
                    // waits to send us replies nobody reads (cancelled pairs): those are read
                    // meanwhile. Wait for room without the lock, within the timeout, then send
                    // again (with the seq of that moment): a transient backlog is not a missing
                    // device.
                    let Some(conn) = st.fd.clone() else {
                        return Err(IsmError::Disconnected);
                    };
                    let reading = st.reading;
                    drop(st);
                    let left = deadline.saturating_duration_since(Instant::now());
                    let want = if reading {
                        libc::POLLOUT
                    } else {
                        libc::POLLOUT | libc::POLLIN
                    };
                    let ev = if left.is_zero() {
                        0
                    } else {
                        sys::wait_for(conn.as_raw_fd(), want, left)
                    };
                    if ev == 0 {
                        return Err(IsmError::Timeout);
                    }
                    st = self.lock();
                    if !st.fd.as_ref().is_some_and(|f| Arc::ptr_eq(f, &conn)) {
                        return Err(IsmError::Disconnected);
                    }
                    if ev & libc::POLLIN != 0 && !st.reading {
                        let (g, r) = self.read_one(st, deadline);
                        st = g;
                        r?;
                    }
                    continue;
                }
                return Err(match e.raw_os_error() {
                    Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN) => {
                        self.disconnect(&mut st);
                        IsmError::Disconnected
                    }
                    _ => IsmError::NotSent(e),
                });
            }
            st.seq = seq;
            if op & proto::NOREPLY_BIT == 0 {
                st.inflight.push_back(seq);
                if op == proto::OP_PAIR {
                    st.pairs += 1;
                }
                if let Some(r) = reserve.take() {
                    st.reserves.insert(seq, r);
                }
            }
            return Ok(Ticket {
                seq,
                op,
                generation: st.generation,
                epoch: 0,
            });
        }
    }

    /// Reads the next reply, without the lock while waiting, and files it for its ticket (or
    /// drops it when its waiter gave up). The caller saw no other reader. Nothing is read when
    /// none comes before `deadline` (a `PAIR` reply may take that long; not an error).
    fn read_one<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> (MutexGuard<'a, State>, Result<(), IsmError>) {
        let Some(fd) = st.fd.clone() else {
            return (st, Err(IsmError::Disconnected));
        };
        st.reading = true;
        let generation = st.generation;
        let reserves = !st.reserves.is_empty();
        drop(st);
        // The wait: without the lock. SO_RCVTIMEO bounds it, or an earlier deadline (a reply
        // already there is read at once).
        let mut buf = vec![0u8; REPLY_MAX];
        // A descriptor held for the memfd of the reply that is next (replies may come out of
        // order: its seq is peeked, its fds left queued) is freed just before it is read.
        let mut had_reserve = false;
        if reserves {
            let left = deadline.saturating_duration_since(Instant::now());
            if !sys::wait_readable(fd.as_raw_fd(), left.min(self.timeout)) {
                // Nothing came in time (one wait, as below): nothing read.
                drop(fd);
                let mut st = self.lock();
                st.reading = false;
                self.wake(&st);
                return (st, Ok(()));
            }
            if let Some(next) = sys::peek_seq(fd.as_raw_fd()) {
                let res = self.lock().reserves.remove(&next);
                had_reserve = res.is_some();
                drop(res);
            }
        }
        let mut r = sys::recv_record(fd.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT);
        if r.as_ref()
            .is_err_and(|e| e.raw_os_error() == Some(libc::EAGAIN))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left < self.timeout && !sys::wait_readable(fd.as_raw_fd(), left) {
                drop(fd);
                let mut st = self.lock();
                st.reading = false;
                self.wake(&st);
                return (st, Ok(()));
            }
            r = sys::recv_record(fd.as_raw_fd(), &mut buf, 0);
        }
        // A reply without a memfd (a refusal) leaves the ticket's reserve to be taken again,
        // at once, for its next request (the slot freed above is still free).
        let reserve_back = match &r {
            Ok(rec) if had_reserve && rec.fd.is_none() => sys::placeholder_fd(),
            _ => None,
        };
        drop(fd);
        let mut st = self.lock();
        st.reading = false;
        self.wake(&st);
        if st.generation != generation {
            return (st, Ok(())); // the connection changed meanwhile: what was read is void
        }
        let r = match r {
            Ok(r) => r,
            // The daemon is slow (stopped, overloaded): nothing was read, the connection stays.
            // Closing it would make the daemon release every reference of this process,
            // among them the DMBs of other threads' handshakes that their peers are about to
            // attach by token (their connections would be reset); the waiter gives its request
            // up instead (`abandoned`).
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return (st, Ok(())),
            Err(e) => {
                self.disconnect(&mut st);
                let e = match e.raw_os_error() {
                    Some(libc::EAGAIN) => IsmError::Timeout,
                    Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN) => {
                        IsmError::Disconnected
                    }
                    _ => IsmError::Io(e),
                };
                return (st, Err(e));
            }
        };
        if r.len == 0 {
            self.disconnect(&mut st);
            return (st, Err(IsmError::Disconnected));
        }
        // Replies come in request order, except those of PAIR requests (answered when the
        // peer asks): any outstanding request may be answered.
        let seq = Header::decode(&buf[..r.len]).map(|h| h.seq);
        let at = seq.and_then(|s| st.inflight.iter().position(|&x| x == s));
        let (Some(seq), Some(at), false) = (seq, at, r.truncated) else {
            self.disconnect(&mut st);
            return (st, Err(IsmError::Protocol("reply out of sequence")));
        };
        st.inflight.remove(at);
        if Header::decode(&buf[..r.len]).is_some_and(|h| h.op == proto::OP_PAIR | proto::REPLY_BIT)
        {
            st.pairs = st.pairs.saturating_sub(1);
        }
        buf.truncate(r.len);
        if let Some(i) = st.abandoned.iter().position(|&(s, _)| s == seq) {
            let (_, op) = st.abandoned.swap_remove(i);
            if let Some(g) = granted(&buf, op) {
                st.to_release.push(g);
            }
        } else {
            let f = Filed {
                rec: buf,
                fd: r.fd,
                extra: r.extra,
                reserve: reserve_back,
                reserved: had_reserve,
            };
            st.filed.insert(seq, f);
        }
        (st, Ok(()))
    }

    /// Waits for the reply of `t` (bounded by `wait`, else the timeout): the record, where its
    /// result and first fd are, and its further fds.
    fn finish_within(
        &self,
        t: Ticket,
        wait: Option<Duration>,
    ) -> Result<(Vec<u8>, client::Answer, Vec<OwnedFd>), IsmError> {
        self.finish_reserved(t, wait, &mut None)
    }

    /// As `finish_within`; `reserve` gets the placeholder taken again for the ticket's
    /// reserve (a refusal), or the reserve itself when the reply did not come in time.
    fn finish_reserved(
        &self,
        t: Ticket,
        wait: Option<Duration>,
        reserve: &mut Option<OwnedFd>,
    ) -> Result<(Vec<u8>, client::Answer, Vec<OwnedFd>), IsmError> {
        let deadline = Instant::now() + wait.unwrap_or(self.timeout);
        let mut st = self.lock();
        loop {
            if st.generation != t.generation || st.fd.is_none() {
                // The daemon released whatever it granted when that connection closed.
                return Err(IsmError::Disconnected);
            }
            if let Some(Filed {
                rec,
                fd,
                extra,
                reserve: back,
                ..
            }) = st.filed.remove(&t.seq)
            {
                if back.is_some() {
                    *reserve = back;
                }
                let r = check_reply(t.seq, t.op, &rec, rec.len(), fd);
                if let Err(IsmError::Protocol(_)) = r {
                    self.disconnect(&mut st);
                }
                return r.map(|a| (rec, a, extra));
            }
            let (g, r) = self.wait_step(st, deadline);
            st = g;
            if !r? {
                // The descriptor held for its memfd goes back to the caller, for another try.
                if let Some(res) = st.reserves.remove(&t.seq) {
                    *reserve = Some(res);
                }
                if st.inflight.contains(&t.seq) {
                    st.abandoned.push((t.seq, t.op));
                    if t.op == proto::OP_PAIR {
                        // It may still wait for its peer in the daemon: no longer.
                        drop(st);
                        self.cancel(t.seq);
                    }
                }
                return Err(IsmError::Timeout);
            }
        }
    }

    /// `OP_CANCEL` of the `PAIR` `seq` (no reply).
    fn cancel(&self, seq: u32) {
        let mut payload = [0u8; 8];
        payload[0..4].copy_from_slice(&seq.to_le_bytes());
        let _ = self.send_once(proto::OP_CANCEL | proto::NOREPLY_BIT, &payload, &[]);
    }

    fn finish(&self, t: Ticket) -> Result<(Vec<u8>, client::Answer), IsmError> {
        self.finish_within(t, None).map(|(rec, a, _)| (rec, a))
    }

    /// The reply of `t` is no longer wanted: dropped when it comes (now, if it is there), and
    /// whatever it grants given back; a waiting `PAIR` is cancelled. Never waits.
    pub fn abandon(&self, t: Ticket) {
        let mut st = self.lock();
        if st.generation != t.generation || st.fd.is_none() {
            return; // the daemon released everything of that connection
        }
        let mut cancel = false;
        st.reserves.remove(&t.seq);
        if let Some(f) = st.filed.remove(&t.seq) {
            if let Some(g) = granted(&f.rec, t.op) {
                st.to_release.push(g);
            }
        } else if st.inflight.contains(&t.seq) {
            st.abandoned.push((t.seq, t.op));
            cancel = t.op == proto::OP_PAIR;
        }
        drop(st);
        if cancel {
            self.cancel(t.seq);
        }
        self.flush_releases();
    }

    /// Gives back what abandoned requests were granted (one record each, no reply).
    fn flush_releases(&self) {
        let todo = {
            let mut st = self.lock();
            if st.to_release.is_empty() {
                return;
            }
            std::mem::take(&mut st.to_release)
        };
        for (own, peer) in todo {
            let mut payload = [0u8; 16];
            payload[0..8].copy_from_slice(&own.to_le_bytes());
            payload[8..16].copy_from_slice(&peer.to_le_bytes());
            let _ = self.send_once(proto::OP_RELEASE | proto::NOREPLY_BIT, &payload, &[]);
        }
    }

    /// One step of waiting for the daemon: read the oldest reply when no other thread reads,
    /// else wait for the reader's news. `Ok(false)`: `deadline` passed.
    fn wait_step<'a>(
        &'a self,
        st: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> (MutexGuard<'a, State>, Result<bool, IsmError>) {
        if !st.reading {
            if Instant::now() >= deadline {
                return (st, Ok(false));
            }
            let (g, r) = self.read_one(st, deadline);
            return (g, r.map(|()| true));
        }
        let now = Instant::now();
        if now >= deadline {
            return (st, Ok(false));
        }
        let mut st = st;
        st.waiters += 1;
        let mut g = self
            .changed
            .wait_timeout(st, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
        g.waiters = g.waiters.saturating_sub(1);
        (g, Ok(true))
    }

    fn transact(
        &self,
        op: u16,
        payload: &[u8],
        pass: Option<RawFd>,
    ) -> Result<(Vec<u8>, client::Answer), IsmError> {
        let t = self.send(op, payload, pass.as_slice())?;
        self.finish(t)
    }

    /// The device GID (see [`crate::Client::query_gid`]); also learns the feature mask. Asks
    /// once per daemon connection.
    pub fn query_gid(&self) -> Result<Gid, IsmError> {
        if let Some(g) = self.connection()?.gid {
            return Ok(g);
        }
        let (buf, a) = self.transact(proto::OP_QUERY_GID, &[], None)?;
        if a.end - a.start < proto::GID_REPLY_LEN {
            return Err(IsmError::Protocol("short QUERY_GID reply"));
        }
        let features = proto::get_u32(&buf, a.start + 20);
        let max = buf[a.start + 18].min(smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE);
        let gid = Gid {
            gid: proto::get_u64(&buf, a.start),
            gid_ext: proto::get_u64(&buf, a.start + 8),
        };
        let mut st = self.lock();
        st.features = Some(features);
        st.max_size_code = Some(max);
        st.gid = Some(gid);
        drop(st);
        Ok(gid)
    }

    /// The daemon's feature mask (asks with `QUERY_GID` the first time on each connection).
    pub fn features(&self) -> Result<u32, IsmError> {
        if let Some(f) = self.connection()?.features {
            return Ok(f);
        }
        self.query_gid()?;
        Ok(self.lock().features.unwrap_or(0))
    }

    /// The largest DMB size code the daemon registers (see [`crate::Client::max_size_code`]).
    pub fn max_size_code(&self) -> Result<u8, IsmError> {
        if let Some(m) = self.connection()?.max_size_code {
            return Ok(m);
        }
        self.query_gid()?;
        Ok(self.lock().max_size_code.unwrap_or(6))
    }

    /// Sends a `REGISTER` without waiting (see [`crate::Client::register_dmb_start`]).
    pub fn register_dmb_start(&self, size_code: u8, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        self.send(proto::OP_REGISTER, &payload, &[sock_fd])
    }

    /// Sends a `REGISTER` that also hands the daemon `state_fd`, the memfd of this end's local
    /// state page (4 KiB), kept with the DMB for a process the socket moves to
    /// ([`SharedClient::adopt_dmb`]). A daemon that does not keep it closes it.
    pub fn register_dmb_state_start(
        &self,
        size_code: u8,
        sock_fd: RawFd,
        state_fd: RawFd,
    ) -> Result<Ticket, IsmError> {
        self.register_dmb_start_with(size_code, sock_fd, Some(state_fd), false)
    }

    /// Sends a `REGISTER`, with the local state page `state_fd` (see
    /// [`SharedClient::register_dmb_state_start`]), and, `record`, asking the daemon to record
    /// what `sock_fd` proves, for this client's later attach of the peer's DMB
    /// ([`SharedClient::attach_dmb_start_reserved`]) whose socket it may not be able to
    /// receive, when it offers that ([`proto::FEATURE_RECORDED_PROOF`]; otherwise `record` is
    /// ignored).
    pub fn register_dmb_start_with(
        &self,
        size_code: u8,
        sock_fd: RawFd,
        state_fd: Option<RawFd>,
        record: bool,
    ) -> Result<Ticket, IsmError> {
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        if record && self.features()? & proto::FEATURE_RECORDED_PROOF != 0 {
            payload[1] = proto::REGISTER_RECORD_PROOF;
        }
        match state_fd {
            Some(s) => self.send(proto::OP_REGISTER, &payload, &[sock_fd, s]),
            None => self.send(proto::OP_REGISTER, &payload, &[sock_fd]),
        }
    }

    /// The local state of the DMBs `PAIR` registers for this client may be a slot of a page
    /// shared with its other connection ends (256 bytes instead of a 4 KiB page each; see
    /// [`proto::PAIR_STATE_SLOT`]), and an `ADOPT_STATE` takes one (map them with
    /// [`Dmb::map_state`]); when the daemon offers it ([`proto::FEATURE_STATE_SLOTS`]).
    pub fn set_state_slots(&self, on: bool) {
        self.state_slots.store(on, Ordering::Relaxed);
    }

    /// This process forked (call it in the parent): a child maps the pages of our state slots
    /// so far. The next `PAIR` says so ([`proto::PAIR_FLAG_NEW_SLOT_PAGE`]): our later slots
    /// come from new pages and no pooled DMB with a slot on an older one is bound for us
    /// again. A daemon without [`proto::FEATURE_NEW_SLOT_PAGE`] gets no more slot requests (a
    /// page of its own per end). A `PAIR` sent before the fork whose reply names a slot is
    /// refused ([`SharedClient::finish_pair`]).
    pub fn forked(&self) {
        self.fork_epoch.fetch_add(1, Ordering::SeqCst);
    }

    /// The state-slot flags of a `PAIR` (see [`SharedClient::forked`]) and the fork epoch they
    /// were chosen in.
    fn pair_slot_flags(&self, features: u32) -> (u8, u32) {
        let epoch = self.fork_epoch.load(Ordering::SeqCst);
        if !self.state_slots.load(Ordering::Relaxed) || features & proto::FEATURE_STATE_SLOTS == 0 {
            return (0, epoch);
        }
        if self.told_epoch.load(Ordering::SeqCst) == epoch {
            return (proto::PAIR_FLAG_STATE_SLOT, epoch);
        }
        if features & proto::FEATURE_NEW_SLOT_PAGE == 0 {
            return (0, epoch);
        }
        (
            proto::PAIR_FLAG_STATE_SLOT | proto::PAIR_FLAG_NEW_SLOT_PAGE,
            epoch,
        )
    }

    /// A `PAIR` with `flags` went out: the daemon knows of the forks up to `epoch`.
    fn pair_sent(&self, flags: u8, epoch: u32) {
        if flags & proto::PAIR_FLAG_NEW_SLOT_PAGE != 0 {
            self.told_epoch.fetch_max(epoch, Ordering::SeqCst);
        }
    }

    /// Whether to ask for state slots (see [`SharedClient::set_state_slots`]).
    fn slots_wanted(&self) -> Result<bool, IsmError> {
        Ok(self.state_slots.load(Ordering::Relaxed)
            && self.features()? & proto::FEATURE_STATE_SLOTS != 0)
    }

    /// `OP_ADOPT` and its reply (see [`crate::Client::adopt_dmb`]): `which` is
    /// [`proto::ADOPT_OWN`], [`proto::ADOPT_PEER`] or [`proto::ADOPT_STATE`] (a slot, when
    /// [`SharedClient::set_state_slots`]: [`Dmb::state_slot`]).
    pub fn adopt_dmb(&self, sock_fd: RawFd, which: u8) -> Result<Dmb, IsmError> {
        if self.features()? & proto::FEATURE_ADOPT == 0 {
            return Err(IsmError::UnknownOp);
        }
        let mut payload = [0u8; 8];
        payload[0] = which;
        if which == proto::ADOPT_STATE && self.slots_wanted()? {
            payload[1] = proto::ADOPT_FLAG_SLOT;
        }
        let t = self.send(proto::OP_ADOPT, &payload, &[sock_fd])?;
        // A state page comes with no reference.
        let op = if which == proto::ADOPT_STATE { 0 } else { t.op };
        self.finish_dmb_as(t, &mut None, op)
    }

    /// `OP_LEAVE_SHORTCUT`: the daemon takes `sock_fd` out of the eBPF SOCKHASH (its SMC-D
    /// connection continues on plain TCP). `UnknownOp` from a daemon that does not offer it.
    pub fn leave_shortcut(&self, sock_fd: RawFd) -> Result<(), IsmError> {
        if self.features()? & proto::FEATURE_LEAVE_SHORTCUT == 0 {
            return Err(IsmError::UnknownOp);
        }
        self.transact(proto::OP_LEAVE_SHORTCUT, &[], Some(sock_fd))
            .map(|_| ())
    }

    /// `OP_SWEEP`: the daemon quarantines the connections queued at the listening socket
    /// `listener_fd`, whose announcement the caller withdrew (see [`proto::OP_SWEEP`]).
    /// `UnknownOp` from a daemon that does not offer it.
    pub fn sweep(&self, listener_fd: RawFd) -> Result<(), IsmError> {
        if self.features()? & proto::FEATURE_SWEEP == 0 {
            return Err(IsmError::UnknownOp);
        }
        self.transact(proto::OP_SWEEP, &[], Some(listener_fd))
            .map(|_| ())
    }

    /// `OP_SWEEP` of a connected client socket `sock_fd`: the daemon quarantines the server
    /// end of its connection when no data path claimed it (see [`proto::OP_SWEEP`]). Waits at
    /// most `wait` for the answer (a daemon busy with other sweeps: the caller goes on, and
    /// the daemon skips the sweep once the socket is no longer established). `UnknownOp` from
    /// a daemon that does not offer it.
    pub fn sweep_peer(&self, sock_fd: RawFd, wait: Duration) -> Result<(), IsmError> {
        if self.features()? & proto::FEATURE_SWEEP_PEER == 0 {
            return Err(IsmError::UnknownOp);
        }
        let t = self.send(proto::OP_SWEEP, &[], &[sock_fd])?;
        self.finish_within(t, Some(wait)).map(|_| ())
    }

    /// Sends an `ATTACH` without waiting (see [`crate::Client::attach_dmb_start`]).
    pub fn attach_dmb_start(&self, token: u64, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        self.send(proto::OP_ATTACH, &token.to_le_bytes(), &[sock_fd])
    }

    /// Sends an `ATTACH` of `token` passing `sock_fd`, as [`SharedClient::attach_dmb_start`],
    /// for the caller that can no longer decline (a server past its CLC accept):
    /// - `own` (≠ 0), its registration recorded with `REGISTER_RECORD_PROOF`
    ///   ([`SharedClient::register_dmb_start_with`]), proves it when the daemon, out of
    ///   descriptors, cannot receive `sock_fd`;
    /// - `reserve`, a descriptor the caller held since its registration
    ///   ([`SharedClient::reserve`]), is closed just before the reply is read, so that its memfd
    ///   has a free descriptor even when the process is at `RLIMIT_NOFILE`. Taken when the
    ///   request is sent; finish with [`SharedClient::finish_dmb_reserved`], which gives it back
    ///   when the reply brought no memfd or did not come in time.
    pub fn attach_dmb_start_reserved(
        &self,
        token: u64,
        sock_fd: RawFd,
        own: u64,
        reserve: &mut Option<OwnedFd>,
    ) -> Result<Ticket, IsmError> {
        let mut payload = [0u8; 16];
        payload[0..8].copy_from_slice(&token.to_le_bytes());
        payload[8..16].copy_from_slice(&own.to_le_bytes());
        let len = if own != 0 { 16 } else { 8 };
        self.send_reserved(proto::OP_ATTACH, &payload[..len], &[sock_fd], reserve)
    }

    /// Sends an `ATTACH_PEER` passing `sock_fd`, with `own` and `reserve` as
    /// [`SharedClient::attach_dmb_start_reserved`].
    pub fn attach_peer_start_reserved(
        &self,
        sock_fd: RawFd,
        own: u64,
        reserve: &mut Option<OwnedFd>,
    ) -> Result<Ticket, IsmError> {
        if self.features()? & proto::FEATURE_ATTACH_PEER == 0 {
            return Err(IsmError::UnknownOp);
        }
        let payload = own.to_le_bytes();
        let len = if own != 0 { 8 } else { 0 };
        self.send_reserved(proto::OP_ATTACH_PEER, &payload[..len], &[sock_fd], reserve)
    }

    /// Sends an `ATTACH_PEER` without waiting (see [`crate::Client::attach_peer_start`]).
    pub fn attach_peer_start(&self, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        if self.features()? & proto::FEATURE_ATTACH_PEER == 0 {
            return Err(IsmError::UnknownOp);
        }
        self.send(proto::OP_ATTACH_PEER, &[], &[sock_fd])
    }

    /// Waits for the reply of a `*_start` request: the DMB it granted. A granted DMB whose
    /// memfd this process had no descriptor for (the kernel dropped it, `MSG_CTRUNC`) is given
    /// back at once: `Mem` (`EMFILE`).
    pub fn finish_dmb(&self, t: Ticket) -> Result<Dmb, IsmError> {
        self.finish_dmb_reserved(t, &mut None)
    }

    /// As [`SharedClient::finish_dmb`] for a request sent with a reserve: when the reply brought
    /// no memfd (a refusal) or did not come in time, `reserve` holds a descriptor again for the
    /// next request, if one could be taken.
    pub fn finish_dmb_reserved(
        &self,
        t: Ticket,
        reserve: &mut Option<OwnedFd>,
    ) -> Result<Dmb, IsmError> {
        let op = t.op;
        self.finish_dmb_as(t, reserve, op)
    }

    /// As [`SharedClient::finish_dmb_reserved`]; `op` tells which reference a grant gave
    /// (`client::granted_ref`).
    fn finish_dmb_as(
        &self,
        t: Ticket,
        reserve: &mut Option<OwnedFd>,
        op: u16,
    ) -> Result<Dmb, IsmError> {
        let (buf, a, _) = self.finish_reserved(t, None, reserve)?;
        if let Some(token) = client::granted_without_memfd(&buf, &a) {
            let (own, peer) = client::granted_ref(op, token);
            if own.is_some() || peer.is_some() {
                let _ = self.release_nowait(own, peer);
            }
            return Err(IsmError::Mem {
                errno: libc::EMFILE,
            });
        }
        dmb_answer(&buf, a)
    }

    /// A descriptor held for the memfd of a later reply (see
    /// [`SharedClient::attach_dmb_start_reserved`]): `Mem` when this process has none to
    /// spare.
    pub fn reserve(&self) -> Result<OwnedFd, IsmError> {
        sys::placeholder_fd().ok_or_else(|| IsmError::Mem {
            errno: std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EMFILE),
        })
    }

    /// Closes the memfds of the replies filed for tickets whose waiters have not taken them yet
    /// (read by another thread or handshake on the way to its own): each such waiter then finds
    /// its DMBs granted without their memfds, gives the references back and fails with `Mem`
    /// ([`SharedClient::finish_dmb`], [`SharedClient::finish_pair`]), as when the kernel
    /// dropped them; not those of requests sent with a reserve (their waiters can no longer
    /// decline). For an application that found no descriptor left (`EMFILE`) while these held
    /// some. Returns how many.
    pub fn give_back_filed(&self) -> usize {
        let mut fds = Vec::new();
        {
            let mut st = self.lock();
            for f in st.filed.values_mut().filter(|f| !f.reserved) {
                fds.extend(f.fd.take());
                fds.append(&mut f.extra);
            }
        }
        // Closed without the lock.
        let n = fds.len();
        drop(fds);
        n
    }

    /// Whether a request can be sent now without first reading an outstanding reply (fewer
    /// than `client::MAX_INFLIGHT` of those that count are outstanding). A reply read for
    /// another ticket is filed with its memfd, which then takes a descriptor of this process
    /// until that ticket's waiter takes it: a request that is only an optimisation (sent ahead
    /// of need) is not worth that descriptor, which an application at its `RLIMIT_NOFILE`
    /// needs for itself.
    pub fn has_room(&self) -> bool {
        let st = self.lock();
        st.inflight.len() - st.pairs < client::MAX_INFLIGHT
    }

    /// Whether the daemon records a registration's proof for a later attach
    /// ([`proto::FEATURE_RECORDED_PROOF`]; asks with `QUERY_GID` the first time on a
    /// connection).
    pub fn recorded_proof(&self) -> bool {
        self.features()
            .is_ok_and(|f| f & proto::FEATURE_RECORDED_PROOF != 0)
    }

    /// Sends a `PAIR` without waiting (see [`crate::proto`]): the daemon answers once the
    /// other end of `sock_fd`'s connection asks too (at most `park` later: then
    /// [`IsmError::NoPeer`]). [`IsmError::UnknownOp`] when the daemon does not offer it.
    pub fn pair_start(
        &self,
        size_code: u8,
        park: Duration,
        sock_fd: RawFd,
    ) -> Result<Ticket, IsmError> {
        self.pair_start_releasing(size_code, park, sock_fd, &[])
    }

    /// As [`SharedClient::pair_start`], with releases the daemon handles first (at most
    /// [`proto::PAIR_RELEASES_MAX`]; more are sent as `OP_RELEASE` records before it).
    pub fn pair_start_releasing(
        &self,
        size_code: u8,
        park: Duration,
        sock_fd: RawFd,
        releases: &[proto::PairRelease],
    ) -> Result<Ticket, IsmError> {
        if self.features()? & proto::FEATURE_PAIR == 0 {
            return Err(IsmError::UnknownOp);
        }
        let (carried, before) = if releases.len() > proto::PAIR_RELEASES_MAX {
            releases.split_at(proto::PAIR_RELEASES_MAX)
        } else {
            (releases, &[][..])
        };
        for &(own, peer, flags) in before {
            let _ = self.release_flags(
                Some(own).filter(|&t| t != 0),
                Some(peer).filter(|&t| t != 0),
                flags,
            );
        }
        let (flags, epoch) = self.pair_slot_flags(self.features()?);
        let (payload, n) = pair_payload(size_code, flags, park, carried);
        let mut t = self.send(proto::OP_PAIR, &payload[..n], &[sock_fd])?;
        self.pair_sent(flags, epoch);
        t.epoch = epoch;
        Ok(t)
    }

    /// As [`SharedClient::pair_start_releasing`], but only if the request goes at once:
    /// `Ok(None)` (nothing sent) when the connection is not made yet, its features are not
    /// known yet (that would be a round trip), the releases do not fit in the record, the
    /// replies outstanding are at their bound, or the socket would not take the record without
    /// waiting. For a client that asks before its proposal goes out: the proposal must never
    /// wait for the daemon (a stalled daemon would hold it up past its server's CLC timeout).
    pub fn pair_start_now(
        &self,
        size_code: u8,
        park: Duration,
        sock_fd: RawFd,
        releases: &[proto::PairRelease],
    ) -> Result<Option<Ticket>, IsmError> {
        if releases.len() > proto::PAIR_RELEASES_MAX {
            return Ok(None);
        }
        let mut st = self.lock();
        let (Some(fd), Some(features)) = (st.fd.as_ref().map(|f| f.as_raw_fd()), st.features)
        else {
            return Ok(None);
        };
        if features & proto::FEATURE_PAIR == 0
            || st.inflight.len() - st.pairs >= client::MAX_INFLIGHT
        {
            return Ok(None);
        }
        let (flags, epoch) = self.pair_slot_flags(features);
        let (payload, len) = pair_payload(size_code, flags, park, releases);
        let seq = st.seq.wrapping_add(1);
        let mut req = [0u8; proto::MAX_REQUEST];
        let n = proto::HEADER_LEN + len;
        if n > req.len() {
            return Ok(None);
        }
        Header::new(proto::OP_PAIR, len, seq).encode(&mut req);
        req[proto::HEADER_LEN..n].copy_from_slice(&payload[..len]);
        // Any failure (a full socket, a connection the daemon closed) leaves the request to the
        // ordinary path, which waits or reconnects as it does for every request.
        if sys::send_record(fd, &req[..n], &[sock_fd], libc::MSG_DONTWAIT).is_err() {
            return Ok(None);
        }
        st.seq = seq;
        st.inflight.push_back(seq);
        st.pairs += 1;
        let generation = st.generation;
        drop(st);
        self.pair_sent(flags, epoch);
        Ok(Some(Ticket {
            seq,
            op: proto::OP_PAIR,
            generation,
            epoch,
        }))
    }

    /// Waits (at most `wait`, else the client's timeout) for the reply of a `PAIR`: our DMB and
    /// the peer's (attached), each with its id; ours with its local state page ([`Dmb::state`])
    /// when the daemon keeps one.
    pub fn finish_pair(&self, t: Ticket, wait: Option<Duration>) -> Result<(Dmb, Dmb), IsmError> {
        let asked_in = t.epoch;
        let (buf, a, mut extra) = self.finish_within(t, wait)?;
        let r = buf.get(a.start..a.end).unwrap_or(&[]);
        if r.len() < proto::PAIR_REPLY_LEN {
            return Err(IsmError::Protocol("short PAIR reply"));
        }
        let want = 2 + usize::from(proto::get_u32(r, 64) & proto::PAIR_OWN_STATE != 0);
        if usize::from(a.fd.is_some()) + extra.len() < want {
            // The kernel dropped memfds (this process at `RLIMIT_NOFILE`), or they were given
            // back ([`SharedClient::give_back_filed`]): both references go back, `Mem`.
            let own = Some(proto::get_u64(r, 0)).filter(|&t| t != 0);
            let peer = Some(proto::get_u64(r, 32)).filter(|&t| t != 0);
            let _ = self.release_nowait(own, peer);
            return Err(IsmError::Mem {
                errno: libc::EMFILE,
            });
        }
        let own_fd =
            a.fd.ok_or(IsmError::Protocol("PAIR reply without memfds"))?;
        let mut extra = std::mem::take(&mut extra).into_iter();
        let peer_fd = extra
            .next()
            .ok_or(IsmError::Protocol("PAIR reply without the peer's memfd"))?;
        let mut own = dmb_of(&r[0..24], proto::get_u64(r, 24), own_fd)?;
        let flags = proto::get_u32(r, 64);
        if flags & proto::PAIR_OWN_STATE != 0 {
            own.state = Some(
                extra
                    .next()
                    .ok_or(IsmError::Protocol("PAIR reply without the state page"))?,
            );
            if flags & proto::PAIR_STATE_SLOT != 0 {
                own.state_slot = Some(proto::get_u32(r, 68) as usize);
            }
        }
        let peer = dmb_of(&r[32..56], proto::get_u64(r, 56), peer_fd)?;
        if own.state_slot.is_some() && asked_in != self.fork_epoch.load(Ordering::SeqCst) {
            // Asked before this process forked: the slot may be on a page the child maps.
            let _ = self.release_nowait(Some(own.token), Some(peer.token));
            return Err(IsmError::SlotAcrossFork);
        }
        Ok((own, peer))
    }

    /// `REGISTER` and its reply (see [`crate::Client::register_dmb`]).
    pub fn register_dmb(&self, size_code: u8, sock_fd: RawFd) -> Result<Dmb, IsmError> {
        let t = self.register_dmb_start(size_code, sock_fd)?;
        self.finish_dmb(t)
    }

    /// `ATTACH` and its reply (see [`crate::Client::attach_dmb`]).
    pub fn attach_dmb(&self, token: u64, sock_fd: RawFd) -> Result<Dmb, IsmError> {
        let t = self.attach_dmb_start(token, sock_fd)?;
        self.finish_dmb(t)
    }

    /// Gives back the owner reference of `own` and the attach reference of `peer` without
    /// waiting (one record, no reply); a daemon without `RELEASE`/`NOREPLY` gets `DETACH` and
    /// `UNREGISTER` with their replies.
    pub fn release_nowait(&self, own: Option<u64>, peer: Option<u64>) -> Result<(), IsmError> {
        let want = proto::FEATURE_RELEASE | proto::FEATURE_NOREPLY;
        if self.features()? & want != want {
            let mut r = Ok(());
            if let Some(p) = peer {
                r = self
                    .transact(proto::OP_DETACH, &p.to_le_bytes(), None)
                    .map(|_| ());
            }
            if let Some(o) = own {
                let r2 = self.transact(proto::OP_UNREGISTER, &o.to_le_bytes(), None);
                r = r.and(r2.map(|_| ()));
            }
            return r;
        }
        let mut payload = [0u8; 16];
        payload[0..8].copy_from_slice(&own.unwrap_or(0).to_le_bytes());
        payload[8..16].copy_from_slice(&peer.unwrap_or(0).to_le_bytes());
        self.send(proto::OP_RELEASE | proto::NOREPLY_BIT, &payload, &[])
            .map(|_| ())
    }

    /// As [`SharedClient::release_nowait`], with `RELEASE_*` flags (ignored by a daemon
    /// without [`proto::FEATURE_POOL`]: `own` is then freed, as without them).
    pub fn release_flags(
        &self,
        own: Option<u64>,
        peer: Option<u64>,
        flags: u32,
    ) -> Result<(), IsmError> {
        if flags == 0 || self.features()? & proto::FEATURE_POOL == 0 {
            return self.release_nowait(own, peer);
        }
        let mut payload = [0u8; 24];
        payload[0..8].copy_from_slice(&own.unwrap_or(0).to_le_bytes());
        payload[8..16].copy_from_slice(&peer.unwrap_or(0).to_le_bytes());
        payload[16..20].copy_from_slice(&flags.to_le_bytes());
        self.send(proto::OP_RELEASE | proto::NOREPLY_BIT, &payload, &[])
            .map(|_| ())
    }
}

/// The references a successful reply of `op` grants: (own, peer) tokens, 0 for none.
fn granted(rec: &[u8], op: u16) -> Option<(u64, u64)> {
    let h = Header::decode(rec)?;
    let base = proto::HEADER_LEN + proto::STATUS_LEN;
    if h.op != op | proto::REPLY_BIT
        || proto::get_u32(rec, proto::HEADER_LEN) != proto::Status::Ok as u32
        || rec.len() < base + proto::DMB_REPLY_LEN
    {
        return None;
    }
    let first = proto::get_u64(rec, base);
    match op {
        proto::OP_REGISTER => Some((first, 0)),
        proto::OP_ATTACH | proto::OP_ATTACH_PEER => Some((0, first)),
        proto::OP_PAIR => Some((first, proto::get_u64(rec, base + 32))),
        _ => None,
    }
}

/// The payload of an `OP_PAIR` request: DMB size code, the state-slot flags, the park time (at
/// most `PAIR_PARK_MAX_MS`) and the releases it carries (at most `PAIR_RELEASES_MAX`, 24 bytes
/// each); the buffer and its used length.
fn pair_payload(
    size_code: u8,
    flags: u8,
    park: Duration,
    releases: &[proto::PairRelease],
) -> ([u8; 16 + 24 * proto::PAIR_RELEASES_MAX], usize) {
    let mut payload = [0u8; 16 + 24 * proto::PAIR_RELEASES_MAX];
    payload[0] = size_code;
    payload[1] = flags;
    let ms = park.as_millis().min(proto::PAIR_PARK_MAX_MS as u128) as u32;
    payload[4..8].copy_from_slice(&ms.to_le_bytes());
    let carried = &releases[..releases.len().min(proto::PAIR_RELEASES_MAX)];
    for (i, &(own, peer, flags)) in carried.iter().enumerate() {
        let o = 16 + 24 * i;
        payload[o..o + 8].copy_from_slice(&own.to_le_bytes());
        payload[o + 8..o + 16].copy_from_slice(&peer.to_le_bytes());
        payload[o + 16..o + 20].copy_from_slice(&flags.to_le_bytes());
    }
    (payload, 16 + 24 * carried.len())
}
