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
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::client::{self, check_reply, dmb_answer, Dmb, Gid, Ticket, DEFAULT_TIMEOUT};
use crate::error::IsmError;
use crate::proto::{self, Header};
use crate::sys;

/// Generations are unique across instances: a ticket of an instance forgotten at a fork never
/// matches the child's new one.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// Largest reply record read through a shared client (DMB and GID replies are far smaller).
const REPLY_MAX: usize = 256;

/// A reply filed for its ticket's waiter.
type Filed = (Vec<u8>, Option<OwnedFd>);

struct State {
    /// The connection (shared with a reader that reads it without the lock).
    fd: Option<Arc<OwnedFd>>,
    generation: u64,
    seq: u32,
    features: Option<u32>,
    /// The daemon's largest size code, from the same `QUERY_GID` reply.
    max_size_code: Option<u8>,
    /// Requests whose replies are still to be read, oldest first.
    inflight: VecDeque<u32>,
    /// Replies read for tickets not finished yet.
    filed: HashMap<u32, Filed>,
    /// A thread is reading the socket.
    reading: bool,
    /// Requests whose waiter gave up (timeout): their replies are dropped when read (a
    /// reference they grant stays held until the connection closes, as with an unfinished
    /// [`Ticket`]).
    abandoned: Vec<u32>,
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
                inflight: VecDeque::new(),
                filed: HashMap::new(),
                reading: false,
                abandoned: Vec::new(),
            }),
            changed: Condvar::new(),
            raw: AtomicI32::new(-1),
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

    /// Forgets the connection and everything in flight on it; wakes every waiter.
    fn disconnect(&self, st: &mut State) {
        // `raw` first: a fork between the two must not leave the child a number that this
        // close frees and another thread may reuse ([`SharedClient::forget_after_fork`] would
        // close that file in the child).
        self.raw.store(-1, Ordering::SeqCst);
        st.fd = None;
        st.features = None;
        st.max_size_code = None;
        st.inflight.clear();
        st.filed.clear();
        st.abandoned.clear();
        st.generation = GENERATION.fetch_add(1, Ordering::Relaxed);
        self.changed.notify_all();
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
        let reused = self.lock().fd.is_some();
        match self.send_once(op, payload, pass) {
            // A connection the daemon closed (it restarted): once more on a new one.
            Err(IsmError::Disconnected) if reused => self.send_once(op, payload, pass),
            r => r,
        }
    }

    fn send_once(&self, op: u16, payload: &[u8], pass: &[RawFd]) -> Result<Ticket, IsmError> {
        let mut st = self.connection()?;
        // At most MAX_INFLIGHT replies outstanding: an event loop with hundreds of handshakes
        // under way would otherwise fill the socket with replies, the daemon would block
        // sending them and stop reading, and this request would fail (as `Client` does: the
        // oldest reply is read and filed for its ticket first).
        let deadline = Instant::now() + self.timeout;
        loop {
            while st.inflight.len() >= client::MAX_INFLIGHT {
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
            let mut req = [0u8; proto::HEADER_LEN + 32];
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
                    // releases expect no reply, so `MAX_INFLIGHT` does not bound them). Wait for
                    // room without the lock, within the timeout, then send again (with the seq of
                    // that moment): a transient backlog is not a missing device.
                    let Some(conn) = st.fd.clone() else {
                        return Err(IsmError::Disconnected);
                    };
                    drop(st);
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() || !sys::wait_writable(conn.as_raw_fd(), left) {
                        return Err(IsmError::Timeout);
                    }
                    st = self.lock();
                    if !st.fd.as_ref().is_some_and(|f| Arc::ptr_eq(f, &conn)) {
                        return Err(IsmError::Disconnected);
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
            }
            return Ok(Ticket {
                seq,
                op,
                generation: st.generation,
            });
        }
    }

    /// Reads the oldest outstanding reply, without the lock while waiting, and files it for its
    /// ticket (or drops it when its waiter gave up). The caller saw no other reader.
    fn read_one<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, Result<(), IsmError>) {
        let Some(fd) = st.fd.clone() else {
            return (st, Err(IsmError::Disconnected));
        };
        st.reading = true;
        let generation = st.generation;
        drop(st);
        // The wait: without the lock. SO_RCVTIMEO bounds it.
        let mut buf = vec![0u8; REPLY_MAX];
        let r = sys::recv_record(fd.as_raw_fd(), &mut buf, 0);
        drop(fd);
        let mut st = self.lock();
        st.reading = false;
        self.changed.notify_all();
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
        let seq = Header::decode(&buf[..r.len]).map(|h| h.seq);
        if r.truncated || seq.is_none() || st.inflight.front().copied() != seq {
            self.disconnect(&mut st);
            return (st, Err(IsmError::Protocol("reply out of sequence")));
        }
        st.inflight.pop_front();
        buf.truncate(r.len);
        let seq = seq.unwrap_or(0);
        if let Some(i) = st.abandoned.iter().position(|&s| s == seq) {
            st.abandoned.swap_remove(i);
        } else {
            st.filed.insert(seq, (buf, r.fd));
        }
        (st, Ok(()))
    }

    /// Waits for the reply of `t` (bounded by the timeout): the record, and where its result
    /// and fd are.
    fn finish(&self, t: Ticket) -> Result<(Vec<u8>, client::Answer), IsmError> {
        let deadline = Instant::now() + self.timeout;
        let mut st = self.lock();
        loop {
            if st.generation != t.generation || st.fd.is_none() {
                // The daemon released whatever it granted when that connection closed.
                return Err(IsmError::Disconnected);
            }
            if let Some((rec, fd)) = st.filed.remove(&t.seq) {
                let r = check_reply(t.seq, t.op, &rec, rec.len(), fd);
                if let Err(IsmError::Protocol(_)) = r {
                    self.disconnect(&mut st);
                }
                return r.map(|a| (rec, a));
            }
            let (g, r) = self.wait_step(st, deadline);
            st = g;
            if !r? {
                if st.inflight.contains(&t.seq) {
                    st.abandoned.push(t.seq);
                }
                return Err(IsmError::Timeout);
            }
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
            let (g, r) = self.read_one(st);
            return (g, r.map(|()| true));
        }
        let now = Instant::now();
        if now >= deadline {
            return (st, Ok(false));
        }
        let g = self
            .changed
            .wait_timeout(st, deadline - now)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
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

    /// The device GID (see [`crate::Client::query_gid`]); also learns the feature mask.
    pub fn query_gid(&self) -> Result<Gid, IsmError> {
        let (buf, a) = self.transact(proto::OP_QUERY_GID, &[], None)?;
        if a.end - a.start < proto::GID_REPLY_LEN {
            return Err(IsmError::Protocol("short QUERY_GID reply"));
        }
        let features = proto::get_u32(&buf, a.start + 20);
        let max = buf[a.start + 18].min(smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE);
        let mut st = self.lock();
        st.features = Some(features);
        st.max_size_code = Some(max);
        drop(st);
        Ok(Gid {
            gid: proto::get_u64(&buf, a.start),
            gid_ext: proto::get_u64(&buf, a.start + 8),
        })
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
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        self.send(proto::OP_REGISTER, &payload, &[sock_fd, state_fd])
    }

    /// `OP_ADOPT` and its reply (see [`crate::Client::adopt_dmb`]): `which` is
    /// [`proto::ADOPT_OWN`], [`proto::ADOPT_PEER`] or [`proto::ADOPT_STATE`].
    pub fn adopt_dmb(&self, sock_fd: RawFd, which: u8) -> Result<Dmb, IsmError> {
        if self.features()? & proto::FEATURE_ADOPT == 0 {
            return Err(IsmError::UnknownOp);
        }
        let mut payload = [0u8; 8];
        payload[0] = which;
        let t = self.send(proto::OP_ADOPT, &payload, &[sock_fd])?;
        self.finish_dmb(t)
    }

    /// Sends an `ATTACH` without waiting (see [`crate::Client::attach_dmb_start`]).
    pub fn attach_dmb_start(&self, token: u64, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        self.send(proto::OP_ATTACH, &token.to_le_bytes(), &[sock_fd])
    }

    /// Sends an `ATTACH_PEER` without waiting (see [`crate::Client::attach_peer_start`]).
    pub fn attach_peer_start(&self, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        if self.features()? & proto::FEATURE_ATTACH_PEER == 0 {
            return Err(IsmError::UnknownOp);
        }
        self.send(proto::OP_ATTACH_PEER, &[], &[sock_fd])
    }

    /// Waits for the reply of a `*_start` request: the DMB it granted.
    pub fn finish_dmb(&self, t: Ticket) -> Result<Dmb, IsmError> {
        let (buf, a) = self.finish(t)?;
        dmb_answer(&buf, a)
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
}
