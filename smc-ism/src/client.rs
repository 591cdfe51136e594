//! The synchronous client: std, libc, serde_json and smc-common only, no threads, no global
//! state, CLOEXEC fds.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use crate::error::IsmError;
use crate::proto::{self, DmbReply, Header, Status};
use crate::stats::{DmbInfo, DmbList, Stats};
use crate::sys;

use smc_common::cdc::{dmb_size_from_code_large, DMB_MAX_SIZE_CODE, DMB_MAX_SIZE_CODE_LARGE};
/// The device GID (one definition, in the CLC codec): re-exported as `smc_ism::Gid`.
pub use smc_common::clc::Gid;

/// Where the daemon listens unless configured otherwise.
pub const DEFAULT_SOCKET_PATH: &str = "/run/smc/ctl.sock";
/// Environment variable overriding [`DEFAULT_SOCKET_PATH`] for [`Client::connect_default`].
pub const SOCKET_ENV: &str = "SMC_CTL_SOCK";
/// Receive buffer for replies of variable size (stats); the daemon keeps them smaller.
const REPLY_BUF: usize = 256 * 1024;

/// Most requests whose replies are still to be read on one connection: a daemon reply is a
/// record (with an fd), and the socket queues at most `net.unix.max_dgram_qlen` (512) of them.
pub const MAX_INFLIGHT: usize = 64;

/// Default timeout of one request/reply round trip.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// A DMB granted by the daemon (registered or attached). Its `Debug` output leaves the token
/// out, so that logging a `Dmb` never leaks it.
pub struct Dmb {
    /// The token naming the DMB on this host (send it to the peer in the CLC accept/confirm).
    pub token: u64,
    /// The DMB element index for CLC (`dmbe_idx`): always 0, one element per DMB, as Linux
    /// SMC-D sends. The device's slot number is [`Dmb::slot`].
    pub idx: u8,
    /// The device slot (index in the daemon's DMB bitmap), unique among live DMBs.
    pub slot: u32,
    /// Size in bytes (`16 KiB << size_code`).
    pub size: usize,
    /// SMC size code.
    pub size_code: u8,
    /// The DMB's id, never reused by any daemon instance (0: the reply did not say; only
    /// `PAIR` replies do): a mapping kept across uses of a pooled DMB is recognised by it.
    pub id: u64,
    /// The memfd holding the memory: map it `MAP_SHARED` (see [`Dmb::map`]). Sealed against
    /// shrinking and growing.
    pub fd: OwnedFd,
    /// `PAIR`, own DMB: the connection end's local state page the daemon keeps with the DMB
    /// (a sealed 4 KiB memfd; handed to a process the socket moves to, `OP_ADOPT`).
    pub state: Option<OwnedFd>,
    /// The local state is not that whole page but the [`proto::STATE_SLOT`] bytes at this
    /// offset of it ([`proto::PAIR_STATE_SLOT`]; for an `ADOPT_STATE` reply, of [`Dmb::fd`]):
    /// map it with [`Dmb::map_state`].
    pub state_slot: Option<usize>,
}

impl fmt::Debug for Dmb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dmb")
            .field("token", &"<redacted>")
            .field("idx", &self.idx)
            .field("slot", &self.slot)
            .field("size", &self.size)
            .field("size_code", &self.size_code)
            .field("id", &self.id)
            .field("fd", &self.fd)
            .field("state", &self.state)
            .field("state_slot", &self.state_slot)
            .finish()
    }
}

impl Dmb {
    /// Maps the whole DMB read-write, `MAP_SHARED`.
    pub fn map(&self) -> io::Result<DmbMap> {
        DmbMap::new(self.fd.as_raw_fd(), self.size)
    }

    /// Maps the local state that came with this reply: of a `PAIR`'s own DMB, [`Dmb::state`];
    /// of an `ADOPT_STATE`, [`Dmb::fd`]. The whole 4 KiB page, or, for a slot
    /// ([`Dmb::state_slot`]), the page holding it, seen as just the slot (its [`DmbMap::as_ptr`]
    /// and [`DmbMap::len`]).
    pub fn map_state(&self) -> io::Result<DmbMap> {
        let fd = self.state.as_ref().unwrap_or(&self.fd).as_raw_fd();
        let page = proto::STATE_PAGE as usize;
        match self.state_slot {
            None => DmbMap::new(fd, page),
            Some(off) => {
                let slot = proto::STATE_SLOT as usize;
                if !off.is_multiple_of(slot) || off + slot > page {
                    return Err(io::Error::from_raw_os_error(libc::EINVAL));
                }
                DmbMap::view(fd, page, off, slot)
            }
        }
    }
}

/// A `MAP_SHARED` read-write mapping of a DMB (or of other shared memory); unmapped on drop,
/// inherited by `fork` (same pages). The memory is shared with another process: access it with
/// atomics or volatile operations, never through `&[u8]` that is assumed not to change. The
/// data path (`smc-preload`) maps its DMBs with it too.
#[derive(Debug)]
pub struct DmbMap {
    /// The mapping (`map_len` bytes).
    base: NonNull<u8>,
    map_len: usize,
    /// What it shows: `len` bytes from `base + off` (the whole mapping but for a view).
    off: usize,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; concurrent access discipline is the caller's.
unsafe impl Send for DmbMap {}
// SAFETY: as above.
unsafe impl Sync for DmbMap {}

impl DmbMap {
    /// Maps `len` bytes of `fd` read-write, shared.
    pub fn new(fd: RawFd, len: usize) -> io::Result<DmbMap> {
        Self::mmap(fd, libc::MAP_SHARED, len)
    }

    /// Maps `map_len` bytes of `fd` read-write, shared, showing only the `len` bytes at `off`
    /// ([`DmbMap::as_ptr`], [`DmbMap::len`]); the whole mapping is unmapped on drop.
    pub fn view(fd: RawFd, map_len: usize, off: usize, len: usize) -> io::Result<DmbMap> {
        if off.checked_add(len).is_none_or(|end| end > map_len) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut m = Self::mmap(fd, libc::MAP_SHARED, map_len)?;
        m.off = off;
        m.len = len;
        Ok(m)
    }

    /// Anonymous shared memory (zero-filled), shared with children forked later.
    pub fn anon_shared(len: usize) -> io::Result<DmbMap> {
        Self::mmap(-1, libc::MAP_SHARED | libc::MAP_ANONYMOUS, len)
    }

    fn mmap(fd: RawFd, flags: libc::c_int, len: usize) -> io::Result<DmbMap> {
        // SAFETY: a fresh mapping chosen by the kernel (no address hint, so no existing mapping
        // is replaced); the result is checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(DmbMap {
            base: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))?,
            map_len: len,
            off: 0,
            len,
        })
    }

    /// Start of the mapping (of the view).
    pub fn as_ptr(&self) -> *mut u8 {
        // SAFETY: `off + len <= map_len`: within the mapping.
        unsafe { self.base.as_ptr().add(self.off) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether a child forked later inherits the mapping (`madvise` `MADV_DOFORK` /
    /// `MADV_DONTFORK` over the whole mapping, also for a view).
    pub fn set_inherited(&self, on: bool) -> io::Result<()> {
        let advice = if on {
            libc::MADV_DOFORK
        } else {
            libc::MADV_DONTFORK
        };
        // SAFETY: advice over exactly our own mapping (page aligned by mmap, `map_len` bytes);
        // it changes only what fork(2) copies.
        if unsafe { libc::madvise(self.base.as_ptr().cast(), self.map_len, advice) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Always false (DMBs are at least 16 KiB).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DmbMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.map_len);
        }
    }
}

/// One Unix connection to the loopback-ism daemon.
///
/// Synchronous and single-threaded: wrap it in a `Mutex` to share it. Every DMB reference taken
/// through a `Client` belongs to its connection: when the connection closes (the process exits or
/// is killed, or the `Client` is dropped) the daemon releases all of them.
///
/// After `fork()` the child must not talk over the parent's connection: every call checks the
/// pid and, in a child, closes the inherited descriptor and connects anew. References taken by
/// the parent stay the parent's (the child cannot detach/unregister them: `NotHeld`); the child's
/// mappings stay valid regardless.
///
/// If a reply does not arrive within the timeout ([`Client::set_timeout`]), the connection is
/// dropped (the daemon then releases every reference of this client: the only state that stays
/// consistent when a reply may still be in flight) and the call returns [`IsmError::Timeout`].
///
/// When a call fails because the connection broke (daemon stopped or restarted), the connection
/// is dropped and the next call reconnects. `register_dmb`, `attach_dmb`, `query_gid` and
/// `stats` retry once on a reused connection that turns out to be dead; `detach_dmb` and
/// `unregister_dmb` do not, because the references of a closed connection were already released
/// by the daemon: for those, `Disconnected`/`NotHeld` after a daemon restart is benign.
///
/// Requests can be pipelined: [`Client::register_dmb_start`], [`Client::attach_dmb_start`] and
/// [`Client::attach_peer_start`] send a request and return a [`Ticket`]; the reply is read by
/// [`Client::finish_dmb`] (replies of other tickets read on the way are kept for them), so a
/// handshake can overlap a daemon round trip with waiting for its peer. With
/// `MAX_INFLIGHT` (64) replies outstanding, a new request first reads the oldest one (kept).
/// [`Client::release_nowait`] gives references back without waiting for a reply.
#[derive(Debug)]
pub struct Client {
    fd: Option<OwnedFd>,
    path: PathBuf,
    pid: u32,
    seq: u32,
    timeout: Duration,
    /// Compare the pid before every request (see [`Client::set_fork_check`]).
    fork_check: bool,
    /// Bumped at every connection change: tickets of an older connection are void.
    generation: u64,
    /// The daemon's feature mask, once a `QUERY_GID` on this connection told it.
    features: Option<u32>,
    /// The daemon's largest size code, from the same reply.
    max_size_code: Option<u8>,
    /// Requests on this connection whose replies are still to be read, oldest first.
    inflight: VecDeque<u32>,
    /// Replies read before their ticket was finished: (seq, record, fd).
    stash: Vec<(u32, Vec<u8>, Option<OwnedFd>)>,
}

/// A request sent to the daemon whose reply is still to be read ([`Client::finish_dmb`]).
#[derive(Debug)]
#[must_use = "finish the ticket, or the reference it may grant stays held until disconnect"]
pub struct Ticket {
    pub(crate) seq: u32,
    pub(crate) op: u16,
    pub(crate) generation: u64,
    /// A `PAIR`'s: the fork epoch it was sent in (see `SharedClient::forked`).
    pub(crate) epoch: u32,
}

/// Result of one exchange: byte range of the op result in the reply buffer, and the fd.
pub(crate) struct Answer {
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) fd: Option<OwnedFd>,
}

impl Client {
    /// Connects to the daemon at `path`. Fails fast (no retry, no blocking) when the daemon is
    /// not running or its accept backlog is full, so the data path can fall back to TCP.
    pub fn connect(path: &Path) -> Result<Client, IsmError> {
        let fd = open(path, DEFAULT_TIMEOUT)?;
        Ok(Client {
            fd: Some(fd),
            path: path.to_path_buf(),
            pid: std::process::id(),
            seq: 0,
            timeout: DEFAULT_TIMEOUT,
            fork_check: true,
            generation: 0,
            features: None,
            max_size_code: None,
            inflight: VecDeque::new(),
            stash: Vec::new(),
        })
    }

    /// Whether every request first compares the pid (one `getpid` system call) to detect a
    /// forked child (default on). A caller that drops its `Client` in the child of every fork
    /// itself may turn it off.
    pub fn set_fork_check(&mut self, on: bool) {
        self.fork_check = on;
    }

    /// The daemon's feature mask (`proto::FEATURE_*`); asks with `QUERY_GID` the first time on
    /// each connection.
    pub fn features(&mut self) -> Result<u32, IsmError> {
        self.ensure_connected()?;
        if let Some(f) = self.features {
            return Ok(f);
        }
        self.query_gid()?;
        Ok(self.features.unwrap_or(0))
    }

    /// The largest DMB size code the daemon registers (its `QUERY_GID` reply; asked the first
    /// time on each connection).
    pub fn max_size_code(&mut self) -> Result<u8, IsmError> {
        self.ensure_connected()?;
        if let Some(m) = self.max_size_code {
            return Ok(m);
        }
        self.query_gid()?;
        Ok(self.max_size_code.unwrap_or(DMB_MAX_SIZE_CODE))
    }

    /// Sends a `REGISTER` (see [`Client::register_dmb`]) without waiting for the reply.
    pub fn register_dmb_start(
        &mut self,
        size_code: u8,
        sock_fd: RawFd,
    ) -> Result<Ticket, IsmError> {
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        self.start(proto::OP_REGISTER, &payload, Some(sock_fd))
    }

    /// Sends an `ATTACH` (see [`Client::attach_dmb`]) without waiting for the reply.
    pub fn attach_dmb_start(&mut self, token: u64, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        self.start(proto::OP_ATTACH, &token.to_le_bytes(), Some(sock_fd))
    }

    /// Sends an `ATTACH_PEER`: attach the DMB that the other end of `sock_fd`'s connection
    /// registered, without knowing its token (same mirror proof as an attach, and both ends in
    /// one network namespace). The caller checks the token it gets against the peer's CLC
    /// message. [`IsmError::UnknownOp`] when the daemon does not offer it.
    pub fn attach_peer_start(&mut self, sock_fd: RawFd) -> Result<Ticket, IsmError> {
        if self.features()? & proto::FEATURE_ATTACH_PEER == 0 {
            return Err(IsmError::UnknownOp);
        }
        self.start(proto::OP_ATTACH_PEER, &[], Some(sock_fd))
    }

    /// `OP_ADOPT`: for a process that now holds `sock_fd`, a connected TCP socket another
    /// process (or an earlier image of this one) registered a DMB with: attaches that DMB
    /// ([`proto::ADOPT_OWN`], its receive ring), the other end's DMB ([`proto::ADOPT_PEER`], its
    /// send ring), or gets the local state page the owner handed over at registration
    /// ([`proto::ADOPT_STATE`]; its [`Dmb::size`] is the DMB's, the page is 4 KiB). Only a
    /// client of the registering client's uid, cgroup and pid namespace gets it
    /// ([`IsmError::BadProof`] otherwise); [`IsmError::StaleToken`] when there is none (any
    /// more). [`IsmError::UnknownOp`] when the daemon does not offer it.
    pub fn adopt_dmb(&mut self, sock_fd: RawFd, which: u8) -> Result<Dmb, IsmError> {
        self.adopt_dmb_with(sock_fd, which, false)
    }

    /// [`Client::adopt_dmb`]; `slot_ok`: a local state that is a slot is taken too (see
    /// [`proto::ADOPT_FLAG_SLOT`], [`Dmb::state_slot`]), when the daemon offers it.
    pub fn adopt_dmb_with(
        &mut self,
        sock_fd: RawFd,
        which: u8,
        slot_ok: bool,
    ) -> Result<Dmb, IsmError> {
        let f = self.features()?;
        if f & proto::FEATURE_ADOPT == 0 {
            return Err(IsmError::UnknownOp);
        }
        let mut payload = [0u8; 8];
        payload[0] = which;
        if slot_ok && f & proto::FEATURE_STATE_SLOTS != 0 {
            payload[1] = proto::ADOPT_FLAG_SLOT;
        }
        let t = self.start(proto::OP_ADOPT, &payload, Some(sock_fd))?;
        // A state page comes with no reference.
        let op = if which == proto::ADOPT_STATE { 0 } else { t.op };
        self.finish_dmb_as(t, op)
    }

    /// `REGISTER` that also hands the daemon `state_fd` (see
    /// [`crate::SharedClient::register_dmb_state_start`]).
    pub fn register_dmb_state(
        &mut self,
        size_code: u8,
        sock_fd: RawFd,
        state_fd: RawFd,
    ) -> Result<Dmb, IsmError> {
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        self.ensure_connected()?;
        let mut reply = [0u8; 128];
        let seq = self.send_request_fds(proto::OP_REGISTER, &payload, &[sock_fd, state_fd])?;
        let a = self.reply(seq, proto::OP_REGISTER, &mut reply)?;
        self.dmb_answer(proto::OP_REGISTER, &reply, a)
    }

    /// Reads the reply of a `*_start` request.
    pub fn finish_dmb(&mut self, t: Ticket) -> Result<Dmb, IsmError> {
        let op = t.op;
        self.finish_dmb_as(t, op)
    }

    /// As [`Client::finish_dmb`]; `op` tells which reference a grant gave (see `dmb_answer`).
    fn finish_dmb_as(&mut self, t: Ticket, op: u16) -> Result<Dmb, IsmError> {
        if t.generation != self.generation || self.fd.is_none() {
            // The daemon released whatever it granted when that connection closed.
            return Err(IsmError::Disconnected);
        }
        let mut buf = [0u8; 128];
        let a = self.reply(t.seq, t.op, &mut buf)?;
        self.dmb_answer(op, &buf, a)
    }

    /// Gives back the owner reference of `own` and the attach reference of `peer` without
    /// waiting for the daemon (one record, no reply) when the daemon offers it; otherwise
    /// `detach_dmb` and `unregister_dmb`.
    pub fn release_nowait(&mut self, own: Option<u64>, peer: Option<u64>) -> Result<(), IsmError> {
        let want = proto::FEATURE_RELEASE | proto::FEATURE_NOREPLY;
        if self.features()? & want != want {
            let r = peer.map_or(Ok(()), |p| self.detach_dmb(p));
            let r2 = own.map_or(Ok(()), |o| self.unregister_dmb(o));
            return r.and(r2);
        }
        let mut payload = [0u8; 16];
        payload[0..8].copy_from_slice(&own.unwrap_or(0).to_le_bytes());
        payload[8..16].copy_from_slice(&peer.unwrap_or(0).to_le_bytes());
        self.send_request(proto::OP_RELEASE | proto::NOREPLY_BIT, &payload, None)
            .map(|_| ())
    }

    fn start(&mut self, op: u16, payload: &[u8], pass: Option<RawFd>) -> Result<Ticket, IsmError> {
        self.ensure_connected()?;
        // Replies not read would fill our socket: the daemon blocks sending them and stops
        // reading, our next request blocks sending, and the round trip times out. Beyond
        // [`MAX_INFLIGHT`] the oldest reply is read now and kept for its ticket.
        while self.inflight.len() >= MAX_INFLIGHT {
            self.stash_oldest()?;
        }
        let seq = self.send_request(op, payload, pass)?;
        Ok(Ticket {
            seq,
            op,
            generation: self.generation,
            epoch: 0,
        })
    }

    /// Forgets the connection (and everything in flight on it).
    fn disconnect(&mut self) {
        self.fd = None;
        self.features = None;
        self.max_size_code = None;
        self.inflight.clear();
        self.stash.clear();
        self.generation = self.generation.wrapping_add(1);
    }

    /// Connects to `$SMC_CTL_SOCK`, or [`DEFAULT_SOCKET_PATH`].
    pub fn connect_default() -> Result<Client, IsmError> {
        Client::connect(&default_socket_path())
    }

    /// The socket path this client connects to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the timeout of one round trip (default [`DEFAULT_TIMEOUT`]); applies to the current
    /// and future connections.
    pub fn set_timeout(&mut self, timeout: Duration) -> Result<(), IsmError> {
        self.timeout = timeout;
        if let Some(fd) = &self.fd {
            set_timeouts(fd.as_raw_fd(), timeout).map_err(IsmError::Io)?;
        }
        Ok(())
    }

    /// The device GID (CHID is [`smc_common::clc::LOOPBACK_CHID`]).
    pub fn query_gid(&mut self) -> Result<Gid, IsmError> {
        let mut buf = [0u8; 128];
        let a = self.transact(proto::OP_QUERY_GID, &[], None, &mut buf, true)?;
        if a.end - a.start < proto::GID_REPLY_LEN {
            return Err(IsmError::Protocol("short QUERY_GID reply"));
        }
        self.features = Some(proto::get_u32(&buf, a.start + 20));
        self.max_size_code = Some(buf[a.start + 18].min(DMB_MAX_SIZE_CODE_LARGE));
        Ok(Gid {
            gid: proto::get_u64(&buf, a.start),
            gid_ext: proto::get_u64(&buf, a.start + 8),
        })
    }

    /// Registers a new DMB of `16 KiB << size_code` bytes (`size_code <=`
    /// [`Client::max_size_code`]), zero-filled, with
    /// refcount 1 held by this client. `sock_fd` is the caller's connected TCP socket of the
    /// connection the DMB is for: the daemon records its addresses (the attach proof) and closes
    /// its copy at once.
    pub fn register_dmb(&mut self, size_code: u8, sock_fd: RawFd) -> Result<Dmb, IsmError> {
        let mut payload = [0u8; 8];
        payload[0] = size_code;
        self.dmb_op(proto::OP_REGISTER, &payload, sock_fd)
    }

    /// Attaches to the peer's DMB named by `token` (from the peer's CLC message); takes one
    /// reference. `sock_fd` must be our end of the very TCP connection the owner registered with.
    pub fn attach_dmb(&mut self, token: u64, sock_fd: RawFd) -> Result<Dmb, IsmError> {
        self.dmb_op(proto::OP_ATTACH, &token.to_le_bytes(), sock_fd)
    }

    /// Drops one attachment reference this client holds on `token`.
    pub fn detach_dmb(&mut self, token: u64) -> Result<(), IsmError> {
        let mut buf = [0u8; 64];
        self.transact(
            proto::OP_DETACH,
            &token.to_le_bytes(),
            None,
            &mut buf,
            false,
        )
        .map(|_| ())
    }

    /// Drops the owner reference this client holds on `token` (from `register_dmb`). After it,
    /// no new attach succeeds; the memory is freed when the last attachment is gone.
    pub fn unregister_dmb(&mut self, token: u64) -> Result<(), IsmError> {
        let mut buf = [0u8; 64];
        self.transact(
            proto::OP_UNREGISTER,
            &token.to_le_bytes(),
            None,
            &mut buf,
            false,
        )
        .map(|_| ())
    }

    /// The daemon's counters.
    pub fn stats(&mut self) -> Result<Stats, IsmError> {
        let mut buf = vec![0u8; REPLY_BUF];
        let a = self.transact(proto::OP_STATS, &[], None, &mut buf, true)?;
        serde_json::from_slice(&buf[a.start..a.end])
            .map_err(|_| IsmError::Protocol("bad STATS payload"))
    }

    /// Every live DMB on the device, in slot order (several requests of at most
    /// [`proto::LIST_PAGE_MAX`] entries; the list is not one atomic snapshot). Tokens are
    /// included only when this process connected as root.
    pub fn list_dmbs(&mut self) -> Result<Vec<DmbInfo>, IsmError> {
        let mut out = Vec::new();
        let mut start = 0u32;
        let mut buf = vec![0u8; REPLY_BUF];
        loop {
            let mut payload = [0u8; 8];
            payload[0..4].copy_from_slice(&start.to_le_bytes());
            payload[4..8].copy_from_slice(&proto::LIST_PAGE_MAX.to_le_bytes());
            let a = self.transact(proto::OP_LIST, &payload, None, &mut buf, true)?;
            let page: DmbList = serde_json::from_slice(&buf[a.start..a.end])
                .map_err(|_| IsmError::Protocol("bad LIST payload"))?;
            out.extend(page.dmbs);
            match page.next {
                Some(n) if n > start => start = n,
                Some(_) => return Err(IsmError::Protocol("LIST does not advance")),
                None => return Ok(out),
            }
        }
    }

    /// Blocks until the daemon's state changes (its [`Stats::generation`] differs from
    /// `generation`) or `timeout` expires, then returns the current stats.
    pub fn wait_change(&mut self, generation: u64, timeout: Duration) -> Result<Stats, IsmError> {
        let ms = timeout.as_millis().min(60_000) as u32;
        let mut payload = [0u8; 16];
        payload[0..8].copy_from_slice(&generation.to_le_bytes());
        payload[8..12].copy_from_slice(&ms.to_le_bytes());
        self.ensure_connected()?;
        let fd = self.raw()?;
        let long = Duration::from_millis(ms as u64) + self.timeout;
        set_timeouts(fd, long).map_err(IsmError::Io)?;
        let mut buf = vec![0u8; REPLY_BUF];
        let r = self.transact(proto::OP_WAIT, &payload, None, &mut buf, false);
        if let Some(fd) = &self.fd {
            let _ = set_timeouts(fd.as_raw_fd(), self.timeout);
        }
        let a = r?;
        serde_json::from_slice(&buf[a.start..a.end])
            .map_err(|_| IsmError::Protocol("bad WAIT payload"))
    }

    /// Waits until `pred` holds for the daemon's stats, for at most `timeout`, without polling:
    /// each round blocks in the daemon until its state changes. Returns the stats that satisfied
    /// `pred`, or [`IsmError::Timeout`].
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&Stats) -> bool,
    ) -> Result<Stats, IsmError> {
        let deadline = Instant::now() + timeout;
        let mut s = self.stats()?;
        loop {
            if pred(&s) {
                return Ok(s);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(IsmError::Timeout);
            }
            s = self.wait_change(s.generation, deadline - now)?;
        }
    }

    /// Sends one raw record (for tests and tools) and returns the reply status, the whole reply
    /// record and any fd. The record is sent as is: no header is added.
    pub fn raw_request(
        &mut self,
        record: &[u8],
        pass: Option<RawFd>,
    ) -> Result<(Status, Vec<u8>, Option<OwnedFd>), IsmError> {
        self.ensure_connected()?;
        if !self.inflight.is_empty() {
            return Err(IsmError::Protocol("raw_request with requests in flight"));
        }
        let fd = self.raw()?;
        if let Err(e) = sys::send_record(fd, record, pass.as_slice(), 0) {
            return Err(self.send_failed(e));
        }
        let mut buf = vec![0u8; REPLY_BUF];
        let r = match sys::recv_record(fd, &mut buf, 0) {
            Ok(r) => r,
            Err(e) => return Err(self.broken(e)),
        };
        if r.len == 0 {
            self.disconnect();
            return Err(IsmError::Disconnected);
        }
        buf.truncate(r.len);
        if r.len < proto::HEADER_LEN + proto::STATUS_LEN {
            return Err(IsmError::Protocol("short reply"));
        }
        let status = Status::from_u32(proto::get_u32(&buf, proto::HEADER_LEN));
        Ok((status, buf, r.fd))
    }

    fn dmb_op(&mut self, op: u16, payload: &[u8], sock_fd: RawFd) -> Result<Dmb, IsmError> {
        let mut buf = [0u8; 128];
        let a = self.transact(op, payload, Some(sock_fd), &mut buf, true)?;
        self.dmb_answer(op, &buf, a)
    }

    /// The DMB a reply to `op` granted; one whose memfd this process had no descriptor for
    /// gives its reference back and fails with `Mem` (see [`granted_without_memfd`]).
    fn dmb_answer(&mut self, op: u16, buf: &[u8], a: Answer) -> Result<Dmb, IsmError> {
        if let Some(token) = granted_without_memfd(buf, &a) {
            let (own, peer) = granted_ref(op, token);
            if own.is_some() || peer.is_some() {
                let _ = self.release_nowait(own, peer);
            }
            return Err(IsmError::Mem {
                errno: libc::EMFILE,
            });
        }
        dmb_answer(buf, a)
    }

    /// Makes sure we have a connection of our own; true if it was (re)made just now.
    fn ensure_connected(&mut self) -> Result<bool, IsmError> {
        if self.fork_check {
            let pid = std::process::id();
            if pid != self.pid {
                // Forked child: the inherited connection is the parent's. Close our copy only.
                self.disconnect();
                self.pid = pid;
            }
        }
        if self.fd.is_none() {
            let fd = open(&self.path, self.timeout)?;
            self.disconnect();
            self.fd = Some(fd);
            return Ok(true);
        }
        Ok(false)
    }

    fn raw(&self) -> Result<RawFd, IsmError> {
        self.fd
            .as_ref()
            .map(|f| f.as_raw_fd())
            .ok_or(IsmError::Disconnected)
    }

    /// Drops the connection after a transport error and classifies it.
    fn broken(&mut self, e: io::Error) -> IsmError {
        self.disconnect();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => IsmError::Timeout,
            Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN) => {
                IsmError::Disconnected
            }
            _ => IsmError::Io(e),
        }
    }

    /// A failed send: nothing was sent (SEQPACKET sends are atomic). Only a dead connection is
    /// dropped; a bad fd to pass or a send timeout leave it intact (dropping it would release
    /// every reference this client holds).
    fn send_failed(&mut self, e: io::Error) -> IsmError {
        match e.raw_os_error() {
            Some(libc::EPIPE) | Some(libc::ECONNRESET) | Some(libc::ENOTCONN) => self.broken(e),
            Some(libc::EAGAIN) => IsmError::Timeout,
            _ => IsmError::NotSent(e),
        }
    }

    fn transact(
        &mut self,
        op: u16,
        payload: &[u8],
        pass: Option<RawFd>,
        reply: &mut [u8],
        retry: bool,
    ) -> Result<Answer, IsmError> {
        let fresh = self.ensure_connected()?;
        match self.exchange(op, payload, pass, reply) {
            Err(IsmError::Disconnected) if retry && !fresh => {
                self.ensure_connected()?;
                self.exchange(op, payload, pass, reply)
            }
            r => r,
        }
    }

    fn exchange(
        &mut self,
        op: u16,
        payload: &[u8],
        pass: Option<RawFd>,
        reply: &mut [u8],
    ) -> Result<Answer, IsmError> {
        let seq = self.send_request(op, payload, pass)?;
        self.reply(seq, op, reply)
    }

    /// Sends one request; its seq is queued for a reply unless it carries `NOREPLY_BIT`.
    fn send_request(
        &mut self,
        op: u16,
        payload: &[u8],
        pass: Option<RawFd>,
    ) -> Result<u32, IsmError> {
        self.send_request_fds(op, payload, pass.as_slice())
    }

    fn send_request_fds(
        &mut self,
        op: u16,
        payload: &[u8],
        pass: &[RawFd],
    ) -> Result<u32, IsmError> {
        let fd = self.raw()?;
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut req = [0u8; proto::HEADER_LEN + 32];
        let n = proto::HEADER_LEN + payload.len();
        Header::new(op, payload.len(), seq).encode(&mut req);
        req[proto::HEADER_LEN..n].copy_from_slice(payload);
        if let Err(e) = sys::send_record(fd, &req[..n], pass, 0) {
            return Err(self.send_failed(e));
        }
        if op & proto::NOREPLY_BIT == 0 {
            self.inflight.push_back(seq);
        }
        Ok(seq)
    }

    /// Reads the oldest outstanding reply into the stash (for its ticket's finish).
    fn stash_oldest(&mut self) -> Result<(), IsmError> {
        if self.inflight.is_empty() {
            return Ok(());
        }
        // Only DMB requests are pipelined: their replies are short.
        let mut buf = [0u8; 1024];
        let (seq, len, fd) = self.read_next(&mut buf)?;
        self.stash.push((seq, buf[..len].to_vec(), fd));
        Ok(())
    }

    /// Reads the next reply record into `buf`: the oldest outstanding request's (anything else
    /// breaks the connection). Returns its seq, length and passed fd.
    fn read_next(&mut self, buf: &mut [u8]) -> Result<(u32, usize, Option<OwnedFd>), IsmError> {
        let bad = |s: &mut Client, what| {
            s.disconnect();
            Err(IsmError::Protocol(what))
        };
        let fd = self.raw()?;
        let r = match sys::recv_record(fd, buf, 0) {
            Ok(r) => r,
            Err(e) => return Err(self.broken(e)),
        };
        if r.len == 0 {
            self.disconnect();
            return Err(IsmError::Disconnected);
        }
        if r.truncated {
            return bad(self, "reply too large");
        }
        let Some(h) = Header::decode(&buf[..r.len]) else {
            return bad(self, "short reply");
        };
        if self.inflight.front() != Some(&h.seq) {
            return bad(self, "reply out of sequence");
        }
        self.inflight.pop_front();
        Ok((h.seq, r.len, r.fd))
    }

    /// Reads the reply to `seq` into `reply`; replies to earlier requests read on the way are
    /// kept for their tickets (the daemon answers one connection's requests in order).
    fn reply(&mut self, seq: u32, op: u16, reply: &mut [u8]) -> Result<Answer, IsmError> {
        if let Some(i) = self.stash.iter().position(|(s, _, _)| *s == seq) {
            let (_, rec, fd) = self.stash.swap_remove(i);
            if rec.len() > reply.len() {
                return Err(IsmError::Protocol("reply too large"));
            }
            reply[..rec.len()].copy_from_slice(&rec);
            return self.check_reply(seq, op, reply, rec.len(), fd);
        }
        loop {
            let (s, len, fd) = self.read_next(reply)?;
            if s == seq {
                return self.check_reply(seq, op, reply, len, fd);
            }
            // Another ticket's reply: keep it for its finish.
            self.stash.push((s, reply[..len].to_vec(), fd));
        }
    }

    /// Validates a reply record of `len` bytes in `reply`.
    fn check_reply(
        &mut self,
        seq: u32,
        op: u16,
        reply: &[u8],
        len: usize,
        fd: Option<OwnedFd>,
    ) -> Result<Answer, IsmError> {
        let r = check_reply(seq, op, reply, len, fd);
        if let Err(IsmError::Protocol(_)) = r {
            self.disconnect();
        }
        r
    }
}

/// Validates the reply record of `len` bytes in `reply` to request `seq` of `op`. A
/// [`IsmError::Protocol`] error means the connection can no longer be trusted.
pub(crate) fn check_reply(
    seq: u32,
    op: u16,
    reply: &[u8],
    len: usize,
    fd: Option<OwnedFd>,
) -> Result<Answer, IsmError> {
    let Some(h) = Header::decode(&reply[..len]) else {
        return Err(IsmError::Protocol("short reply"));
    };
    if h.magic != proto::MAGIC || h.version != proto::VERSION {
        return Err(IsmError::Protocol("bad reply header"));
    }
    if h.seq != seq || h.op != op | proto::REPLY_BIT {
        return Err(IsmError::Protocol("reply out of sequence"));
    }
    let end = proto::HEADER_LEN + h.len as usize;
    if end != len || (h.len as usize) < proto::STATUS_LEN {
        return Err(IsmError::Protocol("bad reply length"));
    }
    let status = Status::from_u32(proto::get_u32(reply, proto::HEADER_LEN));
    let detail = proto::get_u32(reply, proto::HEADER_LEN + 4);
    if status != Status::Ok {
        return Err(IsmError::from_status(status, detail));
    }
    Ok(Answer {
        start: proto::HEADER_LEN + proto::STATUS_LEN,
        end,
        fd,
    })
}

/// The token of the reference a successful REGISTER/ATTACH reply granted when its memfd did
/// not arrive: the daemon always sends one, so the kernel dropped it (`MSG_CTRUNC`: this
/// process is at `RLIMIT_NOFILE`). Not a protocol error: the caller gives the reference back
/// and reports `Mem` (the connection falls back to TCP with that decline), keeping the daemon
/// connection and every other reference it holds.
pub(crate) fn granted_without_memfd(buf: &[u8], a: &Answer) -> Option<u64> {
    if a.fd.is_some() {
        return None;
    }
    let r = DmbReply::decode(buf.get(a.start..a.end)?)?;
    (r.token != 0).then_some(r.token)
}

/// The reference a grant of `token` in reply to `op` gave the connection, as `(own, peer)` for
/// a release: the owner's for `REGISTER`, an attach one for `ATTACH`, `ATTACH_PEER` and an
/// `ADOPT` of a DMB, none for op 0 (an `ADOPT` of a state page).
pub(crate) fn granted_ref(op: u16, token: u64) -> (Option<u64>, Option<u64>) {
    match op {
        proto::OP_REGISTER => (Some(token), None),
        0 => (None, None),
        _ => (None, Some(token)),
    }
}

/// The DMB a successful REGISTER/ATTACH reply grants (for an `ADOPT_STATE` asked with
/// [`proto::ADOPT_FLAG_SLOT`]: where the state is, [`Dmb::state_slot`]).
pub(crate) fn dmb_answer(buf: &[u8], a: Answer) -> Result<Dmb, IsmError> {
    let fd = a.fd.ok_or(IsmError::Protocol("DMB reply without memfd"))?;
    let r = buf.get(a.start..a.end).unwrap_or(&[]);
    let mut d = dmb_of(r, 0, fd)?;
    if r.len() >= proto::ADOPT_STATE_REPLY_LEN && proto::get_u32(r, 28) & proto::STATE_IS_SLOT != 0
    {
        d.state_slot = Some(proto::get_u32(r, 24) as usize);
    }
    Ok(d)
}

/// One DMB of a reply: its [`DmbReply`] at the start of `r`, with `id` and `fd`.
pub(crate) fn dmb_of(r: &[u8], id: u64, fd: OwnedFd) -> Result<Dmb, IsmError> {
    let r = DmbReply::decode(r).ok_or(IsmError::Protocol("short DMB reply"))?;
    let size = dmb_size_from_code_large(r.size_code)
        .ok_or(IsmError::Protocol("bad size code in reply"))? as usize;
    if size as u64 != r.size {
        return Err(IsmError::Protocol("inconsistent DMB size"));
    }
    Ok(Dmb {
        token: r.token,
        idx: r.idx,
        slot: r.slot,
        size,
        size_code: r.size_code,
        id,
        fd,
        state: None,
        state_slot: None,
    })
}

/// `$SMC_CTL_SOCK` or [`DEFAULT_SOCKET_PATH`].
pub fn default_socket_path() -> PathBuf {
    std::env::var_os(SOCKET_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_PATH))
}

/// A `sockaddr_un` for `path`.
pub(crate) fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "unusable unix socket path (empty, NUL, or longer than 107 bytes)",
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

pub(crate) fn set_timeouts(fd: RawFd, t: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: t.as_secs() as libc::time_t,
        tv_usec: t.subsec_micros() as libc::suseconds_t,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval.
        sys::cvt(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        })?;
    }
    Ok(())
}

/// Opens a connection: non-blocking connect (a full backlog fails at once instead of blocking),
/// then blocking mode with send/receive timeouts.
pub(crate) fn open(path: &Path, timeout: Duration) -> Result<OwnedFd, IsmError> {
    let (addr, len) = unix_addr(path).map_err(IsmError::Unavailable)?;
    // SAFETY: plain socket syscall.
    let raw = sys::cvt(unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    })
    .map_err(IsmError::Unavailable)?;
    // SAFETY: freshly created, owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    loop {
        // SAFETY: addr is a valid sockaddr_un of length len.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if r == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(IsmError::Unavailable(e));
    }
    // SAFETY: fcntl on our fd.
    unsafe {
        let fl = sys::cvt(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL)).map_err(IsmError::Io)?;
        sys::cvt(libc::fcntl(
            fd.as_raw_fd(),
            libc::F_SETFL,
            fl & !libc::O_NONBLOCK,
        ))
        .map_err(IsmError::Io)?;
    }
    set_timeouts(fd.as_raw_fd(), timeout).map_err(IsmError::Io)?;
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_missing_fails_fast() {
        let t = Instant::now();
        let e = Client::connect(Path::new("/nonexistent-dir/ctl.sock")).unwrap_err();
        assert!(e.is_unavailable(), "{e:?}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
