//! The I/O layer of the CLC handshake: drives [`smc_common::handshake`] (the one
//! implementation of the protocol logic, sans-IO) over the TCP socket of one connection and
//! carries out its actions against the loopback-ism daemon.
//!
//! The machine decides what to send, what to expect, when to decline and with which code; this
//! module only frames CLC messages on the byte stream (never consuming a byte that is not part
//! of a complete CLC message), registers / attaches / maps DMBs, and reports timeouts and I/O
//! errors as inputs. What to do with the stream after a fallback (plain TCP, skip one late CLC
//! message, or reset) is decided by the caller from [`Fallback::in_sync`] and the message that
//! was awaited ([`Outcome::Fallback`]).
//!
//! [`Driver::step`] runs until the machine is finished or, when not allowed to block, until it
//! waits for a peer message that is not there yet, so a handshake can progress across several
//! calls (an event-loop server is never held up waiting for its client).

use crate::daemon::{self, with_dev};
use crate::forklock::{ForkMutex, ForkOnce};
use crate::real;
use crate::shm::Mapping;
use crate::util::config::config;
use crate::util::io_path::IoPath;
use smc_common::clc::{self, MsgType, HEADER_LEN};
use smc_common::diag::Diag;
use smc_common::handshake::{
    Action, Config, DmbFailure, Established, Fallback, Handshake, Input, LocalDmb,
};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Larger than any CLC message (a proposal is at most 652 bytes).
const MAX_MSG: usize = 1024;

/// The longest sleep of a wait for the peer before the descriptor it waits on is looked up
/// again (see [`wait_readable`]).
const IO_SLICE: Duration = Duration::from_millis(100);

/// How long a handshake waits for the peer's next CLC message (`SMC_CLC_TIMEOUT_MS`).
pub(crate) fn clc_timeout() -> Duration {
    Duration::from_millis(config().clc_timeout_ms)
}

/// How long a client waits for its server's Accept (`SMC_ACCEPT_WAIT_MS`, at most the CLC
/// timeout). A server's library answers the Proposal only once its program accepted the
/// connection (it never sees the socket before), while a TCP client's `connect` completes and
/// its first bytes are queued before that: a client that waited on until a busy server
/// accepted had its non-blocking `send` say `EAGAIN` and a `connect` with a timeout fail where
/// TCP succeeds (red team rt16 `rt16_lateaccept.py`). It declines instead (TCP, the server
/// finds the Decline behind the Proposal and answers nothing).
pub(crate) fn accept_wait() -> Duration {
    Duration::from_millis(config().accept_wait_ms).min(clc_timeout())
}

/// How long a server whose client confirmed (the client is on SMC-D from then on) waits for a
/// daemon that does not answer the attach of the client's DMB before it resets the
/// connection: ten CLC timeouts (20 s by default).
pub(crate) fn committed_wait() -> Duration {
    clc_timeout() * 10
}

/// Accepted sockets of this process whose handshake continues after `accept` returned
/// (`setup::server_after_accept`): a blocking `accept` does not wait for its own client while any
/// is undecided. Counted by a token the handshake's driver holds until it goes (decided, or
/// the fd closed); a forked child's copy of a driver counts in the child.
pub(crate) static DEFERRED_SERVERS: AtomicU64 = AtomicU64::new(0);

/// One count of [`DEFERRED_SERVERS`], for as long as it lives, and its entry in [`QUIET`]
/// while its handshake has received nothing of its client.
pub(crate) struct DeferredServer {
    id: u64,
}

/// Deferred server handshakes whose next step is their client's (its Proposal, or its Confirm
/// after our Accept): (token id, number, the handshake's I/O path). Such a client waits for
/// nothing of ours (a non-blocking connect left idle: its library sends the Proposal at its
/// first operation; a client that has our Accept confirms and goes on) as long as the socket
/// holds nothing; it need not stop a blocking `accept` from waiting for its own client
/// ([`deferred_client_may_wait`]).
static QUIET: ForkMutex<Vec<(u64, i32, std::sync::Weak<IoPath>)>> = ForkMutex::new(Vec::new);
/// Looked at by [`deferred_client_may_wait`] only up to this many; with more, it says yes.
const QUIET_MAX: usize = 64;

impl DeferredServer {
    pub(crate) fn new() -> DeferredServer {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DEFERRED_SERVERS.fetch_add(1, Ordering::Relaxed);
        DeferredServer {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Whether its handshake is quiet (see [`QUIET`]) after a step.
    fn set_quiet(&self, fd: i32, io: &Arc<IoPath>, quiet: bool) {
        let mut q = QUIET.lock();
        let at = q.iter().position(|e| e.0 == self.id);
        match (at, quiet) {
            (None, true) if q.len() <= QUIET_MAX => q.push((self.id, fd, Arc::downgrade(io))),
            (Some(i), false) => {
                q.swap_remove(i);
            }
            _ => {}
        }
    }
}

impl Drop for DeferredServer {
    fn drop(&mut self) {
        DEFERRED_SERVERS.fetch_sub(1, Ordering::Relaxed);
        let mut q = QUIET.lock();
        if let Some(i) = q.iter().position(|e| e.0 == self.id) {
            q.swap_remove(i);
        }
    }
}

/// Whether an accepted connection of this process whose handshake continues after its
/// `accept` may have a client that waits for our answer: any deferred server handshake but a
/// quiet one ([`QUIET`]) whose socket still holds nothing. A blocking `accept` does not wait for
/// its own client then (that client's process may be the one waiting, blocked on its other
/// connection). Before, one idle client (a non-blocking connect never used) made every later
/// accept of the process leave its handshake to the connection's first operation, and the
/// clients of an accept loop that hands connections to busy workers waited out the CLC
/// timeout in `connect`, then fell back (10 sequential connects: 10 s instead of 0.01 s).
pub(crate) fn deferred_client_may_wait() -> bool {
    let all = DEFERRED_SERVERS.load(Ordering::Relaxed);
    if all == 0 {
        return false;
    }
    let q = QUIET.lock();
    if q.len() as u64 != all {
        return true;
    }
    q.iter().any(|(_, fd, io)| {
        io.upgrade().is_none_or(|io| {
            io.with(*fd, |f| {
                let mut n: libc::c_int = 0;
                // SAFETY: FIONREAD writes one int to our local.
                let r = unsafe {
                    real::ioctl(
                        f,
                        libc::FIONREAD as libc::c_ulong,
                        std::ptr::from_mut(&mut n) as libc::c_ulong,
                    )
                };
                r != 0 || n != 0
            })
        })
    })
}

/// Our CLC peer id (random per process).
pub(crate) fn peer_id() -> [u8; 8] {
    static P: ForkOnce<[u8; 8]> = ForkOnce::new();
    *P.get_or_init(|| {
        let mut b = [0u8; 8];
        // SAFETY: valid buffer.
        unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
        b
    })
}

/// The state machine for one connection, with our device (or declining for want of one).
pub(crate) fn machine(server: bool, size_code: u8) -> Handshake {
    let (gid, unavailable) = match daemon::local_gid() {
        Ok(g) => (g, None),
        Err(code) => (
            smc_ism::Gid::default(),
            Some(Diag::from_code(code).unwrap_or(Diag::NoSmcdDev)),
        ),
    };
    let mut cfg = Config::loopback(smc_common::clc::Gid {
        gid: gid.gid,
        gid_ext: gid.gid_ext,
    });
    cfg.peer_id = peer_id();
    cfg.dmb_size_code = size_code;
    let m = if server {
        Handshake::server(cfg, true)
    } else {
        Handshake::client(cfg, true)
    };
    match unavailable {
        Some(d) => m.device_unavailable(d),
        // SMC was disabled after this connection's listener announced it (io_uring set up).
        None if !crate::policy::enabled() => m.device_unavailable(Diag::NoSmcdDev),
        None => m,
    }
}

/// A DMB we hold a daemon reference on (`token`; 0: none, a stand-in), mapped. Its memfd is
/// closed once mapped: the mapping keeps the memory. `id`: the daemon's id of it (0: not
/// known), under which its mapping may be kept for a later connection ([`crate::dmbs`]).
pub struct HeldDmb {
    pub token: u64,
    pub id: u64,
    pub map: Arc<Mapping>,
    /// Our own DMB: the local state page registered with it (see [`crate::shm::state_page`]),
    /// or the one the daemon keeps with it (`PAIR`).
    pub state: Option<Arc<Mapping>>,
}

impl HeldDmb {
    /// Map a DMB the daemon granted (`own`: ours, else the peer's), or take the mapping kept
    /// of it. Our own DMB from a `PAIR` (`id` known) may be a pooled one, whose memory and
    /// local state page still hold its earlier connection's header and state (cursors, close
    /// flags): both are cleared, whether its mapping was kept here or not (the daemon's pool
    /// may outlive our cache of mappings). Our own DMB's local state page: the one kept with
    /// its mapping, else the one the daemon sent with it (`PAIR`): the page the daemon keeps
    /// with the DMB is the one we use, never another (a process our socket moves to adopts
    /// that page), so a page we cannot map fails the DMB.
    ///
    /// The DMB's descriptors go to `closing`: closed once the step that maps it has sent its
    /// CLC message ([`Driver::step_until`]), not before it on the peer's critical path.
    fn map(d: smc_ism::Dmb, own: bool, closing: &mut Vec<OwnedFd>) -> Result<HeldDmb, u64> {
        let r = HeldDmb::map_now(&d, own);
        let smc_ism::Dmb { fd, state, .. } = d;
        closing.push(fd);
        closing.extend(state);
        r
    }

    /// Server, after its client confirmed: map the client's DMB, which may no longer fail for
    /// want of a mapping (the client is on SMC-D already: a failure resets the connection).
    /// `slot`, the mapping held for it since before our Accept, is unmapped first; the room
    /// set aside for the application does not stop it ([`crate::shm::room::exhausted`]), and
    /// should the kernel still refuse (another thread took the slot's place), that room is
    /// given back and the mapping tried once more.
    fn map_committed(
        d: smc_ism::Dmb,
        slot: Option<Mapping>,
        closing: &mut Vec<OwnedFd>,
    ) -> Result<HeldDmb, u64> {
        drop(slot);
        let r = committed_map(|| d.map()).map(|m| HeldDmb {
            token: d.token,
            id: d.id,
            map: Arc::new(m),
            state: None,
        });
        let smc_ism::Dmb { fd, state, .. } = d;
        closing.push(fd);
        closing.extend(state);
        r.map_err(|_| d.token)
    }

    fn map_now(d: &smc_ism::Dmb, own: bool) -> Result<HeldDmb, u64> {
        // Out of mappings (`shm::room`): none of ours may take the application's last ones.
        let failed = |e: std::io::Error| {
            crate::shm::room::on_map_error(&e);
            d.token
        };
        let (map, kept_state) = match crate::dmbs::take(own, d.id, d.size) {
            Some((m, st)) => (m, st),
            None if crate::shm::room::exhausted() => return Err(d.token),
            None => (Arc::new(d.map().map_err(failed)?), None),
        };
        let state = match (kept_state, &d.state) {
            (Some(s), _) => Some(s),
            (None, Some(_)) if own && crate::shm::room::exhausted() => return Err(d.token),
            (None, Some(_)) if own => Some(Arc::new(d.map_state().map_err(failed)?)),
            (None, _) => None,
        };
        if own && d.id != 0 {
            crate::dmbs::clear_header(&map);
            if let Some(st) = &state {
                crate::dmbs::clear_state(st);
            }
        }
        Ok(HeldDmb {
            token: d.token,
            id: d.id,
            map,
            state,
        })
    }
}

/// How a handshake ended.
pub enum Outcome {
    /// SMC-D: our DMB (registered, mapped) and the peer's (attached, mapped).
    Established {
        est: Established,
        own: HeldDmb,
        peer: HeldDmb,
    },
    /// Plain TCP; `awaited` is the message we were waiting for when it ended, if any; `lost`:
    /// the connection ended during the handshake in a way the application must still see
    /// as TCP's would show it ([`Lost`]).
    Fallback {
        fb: Fallback,
        awaited: Option<MsgType>,
        lost: Option<Lost>,
    },
    /// The server could not attach or map the DMB of a client that confirmed (and so is on
    /// SMC already): neither end may continue on this stream.
    Broken(&'static str),
}

/// A connection that ended during its handshake ([`Outcome::Fallback`]), for the application's
/// next calls (`crate::obj::Skip::lost`).
#[derive(Clone, Copy, Debug)]
pub struct Lost {
    /// The socket error a read of ours took from the socket (`sock_error`: a reset while we
    /// waited for the peer's message), which the application's next read or write reports.
    pub err: i32,
    /// The first write takes its bytes: the reset came while a call of the application waited
    /// for the handshake (TCP would have finished it before), or a server's client closed or
    /// reset (TCP's accepted socket takes the program's first write before the client's end
    /// could have answered it).
    pub write_passes: bool,
    /// A server whose client closed (its FIN) during the handshake: as over TCP, where the FIN
    /// is all that came, reads say EOF, the first write takes its bytes (the closed client
    /// answers them with a reset, `EPIPE` in `CLOSE_WAIT`), and the next write reports `err`
    /// (`EPIPE`, with `SIGPIPE`).
    pub left: bool,
}

/// What one call of [`Driver::step`] reached.
pub enum Progress {
    /// Waiting for a peer message that has not arrived yet (only when not blocking).
    WouldBlock,
    Done(Outcome),
}

/// What a request sent ahead asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ahead {
    Register,
    AttachPeer,
    /// `OP_PAIR`: our DMB and the peer's in one request, answered once both ends asked.
    Pair,
}

/// How long a server waits in the daemon for its client's `PAIR` (sent right after the
/// client's proposal, so normally there already) before it registers alone: a client that
/// does not pair (pipelining off) costs an event loop at most this.
const SERVER_PAIR_WAIT: Duration = Duration::from_millis(100);

/// The head of the stream after a CLC message ([`Driver::head_of_stream`]).
enum Head {
    Decline(Vec<u8>),
    Eof,
    Other,
}

/// What the socket holds.
enum Rd {
    /// One whole CLC message (consumed).
    Msg(usize),
    /// Bytes that do not frame as a CLC message (`n` bytes peeked into the buffer, nothing
    /// consumed).
    NotClc(usize),
    /// A partial message or nothing yet.
    Nothing,
    /// Orderly EOF or a socket error.
    Gone,
}

pub struct Driver {
    m: Handshake,
    fd: i32,
    /// The descriptor our I/O goes through when not `fd` (a private duplicate, once another
    /// thread closed the number while a call of ours drove the handshake): shared with the
    /// handshake's object ([`crate::obj::Handshake::io`]), which redirects it.
    io: Arc<IoPath>,
    server: bool,
    /// The size code of our DMB (as configured in the machine).
    size_code: u8,
    /// A daemon request sent ahead of the machine asking for it, so that its round trip
    /// overlaps waiting for the peer: our registration (the client's right after its proposal;
    /// the server's when the proposal is not there yet), the server's attach of the client's
    /// DMB by connection (right after its accept: the client registered while the accept was
    /// in flight).
    ahead: Option<(Ahead, smc_ism::Ticket)>,
    todo: VecDeque<Action>,
    own: Option<HeldDmb>,
    peer: Option<HeldDmb>,
    /// The local state page sent with our registration (its memfd went to the daemon), or an
    /// anonymous one: taken with our DMB, while we can still decline (after the client's
    /// confirm, for the server, or our own, for the client, no mapping may fail).
    state: Option<Mapping>,
    /// Server: the client's DMB the daemon attached with our `PAIR` (checked against the
    /// confirmed token).
    paired: Option<HeldDmb>,
    /// Server: the daemon records what the socket of our registration proves, for our attach
    /// of the client's DMB (`FEATURE_RECORDED_PROOF`; asked once). That attach (without a
    /// pairing) comes after the client confirmed, when we can no longer decline: a daemon out
    /// of descriptors, which cannot receive the socket passed with it, takes the record.
    record: Option<bool>,
    /// Server: a descriptor held from our registration until the attach of the client's DMB,
    /// for its memfd (closed just before that reply is read), so that an application at
    /// `RLIMIT_NOFILE` (it takes every descriptor freed meanwhile) does not leave the confirmed
    /// connection without one.
    reserve: Option<OwnedFd>,
    /// Server: a mapping held from before our Accept until the client's DMB is mapped after
    /// its Confirm (unmapped just before: [`HeldDmb::map_committed`]), so that a process whose
    /// mappings ran out meanwhile (`vm.max_map_count`: the handshakes under way took them) can
    /// still map it. A registration of ours alone takes one (a shared anonymous page: a
    /// mapping of its own, never merged with a neighbour); with a `PAIR` the mapping of the
    /// client's DMB it brought stands in for it (unmapped when the client confirmed another).
    map_slot: Option<Mapping>,
    /// The message awaited and the deadline for it.
    wait: Option<(MsgType, Instant)>,
    started: bool,
    /// Wait at most this long for a peer message (the server's Confirm: twice).
    timeout: Duration,
    /// Server: its wait for the Confirm ended once already and the client had decided to
    /// confirm (`smc_common::cdc::CdcHeader::claim_withdraw` lost): the Confirm is a moment
    /// away, one more timeout is waited for it.
    withdraw_lost: bool,
    /// Server: the client confirmed (it is on SMC-D from then on) but the daemon did not
    /// answer the attach of its DMB: the confirmed handshake and until when the daemon is
    /// waited for ([`committed_wait`]) before the connection is reset.
    committed: Option<(Established, Instant)>,
    /// A step does not wait for the daemon in that case ([`Progress::WouldBlock`]): the
    /// caller is an accept that must not hold up its loop.
    defer_daemon: bool,
    /// An accepted socket handed back undecided: counted until the driver goes (decided or
    /// closed), see [`DeferredServer`].
    deferred: Option<DeferredServer>,
    /// Descriptors of DMBs mapped in this step, closed at its end ([`HeldDmb::map`]).
    closing: Vec<OwnedFd>,
    /// The CLC bytes this end sent and consumed so far: a fallback records them
    /// ([`note_clc_bytes`]) for `TCP_INFO`.
    clc_sent: u64,
    clc_received: u64,
    /// How the connection ended during the handshake ([`Outcome::Fallback`]'s `lost`).
    lost: Option<Lost>,
    /// This step waited for the peer (the call that drives it was under way when what came
    /// then arrived).
    waited: bool,
    buf: [u8; MAX_MSG],
}

/// Why the server has no DMB of its client yet.
#[derive(Debug)]
enum AttachErr {
    /// The daemon refused it, or it could not be mapped: the connection cannot go on.
    Failed(&'static str),
    /// The daemon did not answer (stopped, hung, restarting): worth another try.
    Unanswered,
}

impl Driver {
    pub fn new(m: Handshake, fd: i32, server: bool, size_code: u8) -> Driver {
        // Mappings set aside for the application before any of ours (`shm::room`).
        crate::shm::room::arm();
        Driver {
            m,
            fd,
            io: Arc::new(IoPath::new()),
            server,
            size_code,
            ahead: None,
            todo: VecDeque::new(),
            own: None,
            peer: None,
            state: None,
            paired: None,
            record: None,
            reserve: None,
            map_slot: None,
            wait: None,
            started: false,
            timeout: clc_timeout(),
            withdraw_lost: false,
            committed: None,
            defer_daemon: false,
            deferred: None,
            closing: Vec::new(),
            lost: None,
            waited: false,
            clc_sent: 0,
            clc_received: 0,
            buf: [0; MAX_MSG],
        }
    }

    /// This server handshake continues after `accept` returned ([`DeferredServer`]).
    pub fn count_deferred(&mut self) {
        if self.deferred.is_none() {
            let d = DeferredServer::new();
            d.set_quiet(self.fd, &self.io, self.quiet());
            self.deferred = Some(d);
        }
    }

    /// Whether a step returns [`Progress::WouldBlock`] instead of waiting for a daemon that
    /// does not answer the attach of a client that confirmed (see `committed`).
    pub fn defer_daemon(&mut self, on: bool) {
        self.defer_daemon = on;
    }

    /// Another CLC timeout than `SMC_CLC_TIMEOUT_MS`.
    pub fn with_timeout(mut self, t: Duration) -> Driver {
        self.timeout = t;
        self
    }

    /// Run the handshake as far as it goes. `block`: wait for peer messages (up to the CLC
    /// timeout each); otherwise return [`Progress::WouldBlock`] when one is not there yet.
    /// The fd the handshake's I/O goes through from now on (another fd of the same socket).
    pub fn set_fd(&mut self, fd: i32) {
        self.fd = fd;
    }

    /// Where the handshake's I/O goes once the number is closed under it (see `io`).
    pub fn io_path(&self) -> Arc<IoPath> {
        self.io.clone()
    }

    /// The socket is handed to another process: decline at our next message where the
    /// protocol allows it ([`Handshake::withdraw`]).
    pub fn withdraw(&mut self) {
        self.m.withdraw(smc_common::diag::Diag::OptUnsupp);
    }

    /// A client waiting for its server's Accept stops waiting: its next step that finds no
    /// Accept there declines as at the end of the accept wait (`TIMEOUT_CL`); an Accept
    /// already there is taken as usual ([`crate::setup::write_before_accept`]).
    pub fn accept_wait_over(&mut self) {
        if !self.server && self.committed.is_none() && self.m.waiting_for() == Some(MsgType::Accept)
        {
            self.wait = Some((MsgType::Accept, Instant::now()));
        }
    }

    pub fn step(&mut self, block: bool) -> Progress {
        self.step_until(block.then_some(None))
    }

    /// As [`Driver::step`]; `wait`: `None` does not wait for the peer, `Some(None)` waits (up to
    /// the CLC timeout of each message), `Some(Some(t))` waits until `t` at most.
    pub fn step_until(&mut self, wait: Option<Option<Instant>>) -> Progress {
        self.waited = false;
        let p = self.step_inner(wait);
        // After the step's CLC message went out (see [`HeldDmb::map`]).
        self.closing.clear();
        if let Some(d) = &self.deferred {
            d.set_quiet(self.fd, &self.io, self.quiet());
        }
        p
    }

    /// A server handshake whose next step is its client's: it waits for the client's Proposal
    /// or Confirm, with nothing of ours to do (no daemon answer awaited, nothing committed).
    fn quiet(&self) -> bool {
        self.server
            && self.committed.is_none()
            && self.todo.is_empty()
            && matches!(
                self.m.waiting_for(),
                Some(MsgType::Proposal | MsgType::Confirm)
            )
    }

    fn step_inner(&mut self, wait: Option<Option<Instant>>) -> Progress {
        let block = wait.is_some();
        let limit = wait.flatten();
        if !self.started {
            self.started = true;
            let a = self.m.start();
            self.todo.extend(a);
        }
        loop {
            while let Some(a) = self.todo.pop_front() {
                if let Some(out) = self.act(a) {
                    return Progress::Done(out);
                }
                if self.committed.is_some() {
                    return self.attach_committed(block);
                }
            }
            if self.committed.is_some() {
                return self.attach_committed(block);
            }
            let Some(t) = self.m.waiting_for() else {
                // Finished without a terminal action carried out, or waiting for a DMB (which
                // is registered synchronously): cannot happen; end it rather than spin.
                let a = self.m.handle(Input::Abort);
                if a.is_empty() {
                    return Progress::Done(self.fallback_now(Fallback {
                        reason: smc_common::handshake::FallbackReason::Aborted,
                        sent_decline: None,
                        in_sync: false,
                    }));
                }
                self.todo.extend(a);
                continue;
            };
            let deadline = match self.wait {
                Some((w, d)) if w == t => d,
                _ => {
                    // The server's Confirm comes after its client attached and registered; a
                    // client's Accept only once its server's program accepted (`accept_wait`).
                    let n = if t == MsgType::Confirm { 2 } else { 1 };
                    let mut span = self.timeout * n;
                    if !self.server && t == MsgType::Accept {
                        span = span.min(accept_wait());
                    }
                    let d = Instant::now() + span;
                    self.wait = Some((t, d));
                    d
                }
            };
            let input_len = match self.read_msg() {
                Rd::Msg(n) => Some(n),
                Rd::NotClc(n) => {
                    if t == MsgType::Accept && !self.server && peer_quarantined(self.fd) {
                        return Progress::Done(self.quarantined_server());
                    }
                    if t == MsgType::Proposal {
                        // The client announced SMC but speaks no CLC: nothing was sent and
                        // nothing consumed, plain TCP as if it had not announced it.
                        return Progress::Done(self.fallback_now(Fallback {
                            reason: smc_common::handshake::FallbackReason::PeerNoSmc,
                            sent_decline: None,
                            in_sync: true,
                        }));
                    }
                    // Bytes we cannot frame: the machine declines, out of sync.
                    Some(n)
                }
                Rd::Gone => {
                    if self.server && matches!(t, MsgType::Proposal | MsgType::Confirm) {
                        // The client closed or died. Its reset (a close with our Accept
                        // unread, or with linger 0): as over TCP when it came after the
                        // program's first write. Its FIN (it has the library, which never
                        // half-closes before its handshake is decided: it can read nothing
                        // again): as over TCP, where the FIN is all that came (`left`).
                        self.lost = Some(match self.lost {
                            Some(l) => Lost {
                                write_passes: true,
                                ..l
                            },
                            None => Lost {
                                err: libc::EPIPE,
                                write_passes: true,
                                left: true,
                            },
                        });
                    }
                    let a = self.m.handle(Input::Abort);
                    self.todo.extend(a);
                    continue;
                }
                Rd::Nothing => {
                    if self.server && t == MsgType::Proposal {
                        // The proposal is on its way: pair (or register) meanwhile.
                        self.send_ahead(Ahead::Pair);
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        if t == MsgType::Accept && !self.server && peer_quarantined(self.fd) {
                            return Progress::Done(self.quarantined_server());
                        }
                        if t == MsgType::Confirm && self.server && !self.withdraw_lost {
                            match self.claim_withdraw() {
                                Some(true) => {
                                    crate::debug!(
                                        "fd {}: no Confirm: the Accept is withdrawn (Decline),                                          TCP",
                                        self.fd
                                    );
                                    let a = self.m.handle(Input::AcceptWithdrawn);
                                    self.todo.extend(a);
                                    continue;
                                }
                                Some(false) => {
                                    crate::debug!(
                                        "fd {}: no Confirm yet, but the client decided to                                          confirm: waiting for it",
                                        self.fd
                                    );
                                    self.withdraw_lost = true;
                                    self.wait = Some((t, now + self.timeout));
                                    continue;
                                }
                                None => {}
                            }
                        }
                        let a = self.m.handle(Input::Timeout);
                        self.todo.extend(a);
                        continue;
                    }
                    if !block || limit.is_some_and(|l| now >= l) {
                        return Progress::WouldBlock;
                    }
                    wait_readable(
                        &self.io,
                        self.fd,
                        limit.map_or(deadline, |l| l.min(deadline)),
                    );
                    self.waited = true;
                    if crate::signals::wait_interrupted() {
                        // The application's call ends with EINTR; the handshake goes on at
                        // its next call.
                        return Progress::WouldBlock;
                    }
                    None
                }
            };
            if let Some(n) = input_len {
                let msg = self.buf[..n].to_vec();
                if self.server
                    && t == MsgType::Proposal
                    && msg.get(4) == Some(&(MsgType::Proposal as u8))
                {
                    // A client that gave up waiting before its Proposal was read (accepted
                    // late) sent its timeout Decline behind it: the Decline is the answer, and
                    // no Accept goes out, which the client would have to skip, or which would
                    // reach its socket after its close (a reset).
                    match self.head_of_stream() {
                        Head::Decline(d) => {
                            crate::debug!(
                                "fd {}: the client declined before its Proposal was read: no \
                                 answer, TCP",
                                self.fd
                            );
                            let a = self.m.handle(Input::Message(&d));
                            self.todo.extend(a);
                            continue;
                        }
                        Head::Eof => {
                            // The client's socket closed behind its Proposal (a client with
                            // the library never half-closes before its handshake is decided):
                            // it went away before we accepted. Nothing is answered, and the
                            // daemon is not asked (it would refuse the socket as proof, no
                            // longer established: `INTERR`); an Accept sent now would draw a
                            // reset where TCP's program reads the end of the stream. As Linux
                            // counts it: a handshake error, the program reads EOF.
                            crate::debug!(
                                "fd {}: the client closed behind its Proposal: no answer",
                                self.fd
                            );
                            return Progress::Done(self.fallback_now(Fallback {
                                reason: smc_common::handshake::FallbackReason::Aborted,
                                sent_decline: None,
                                in_sync: false,
                            }));
                        }
                        Head::Other => {}
                    }
                }
                if crate::log::enabled()
                    && (msg.get(4) != Some(&(t as u8)) || clc::decode(&msg).is_err())
                {
                    // What broke the handshake, for the reset's log line.
                    crate::debug!(
                        "fd {}: handshake: awaiting {t:?}, read {} bytes: {:02x?}",
                        self.fd,
                        msg.len(),
                        msg.get(..48).unwrap_or(&msg)
                    );
                }
                let a = self.m.handle(Input::Message(&msg));
                self.todo.extend(a);
            }
        }
    }

    /// A client whose server was quarantined (an image without the data path accepted the
    /// connection, and the eBPF verdict stripped our Proposal off its stream): plain TCP in
    /// sync, no Decline (the image would read it: the verdict strips one, but a lone CLC
    /// message stripped while it waits in a blocking read wakes it with `EAGAIN`, `tcp_bpf`),
    /// and the bytes that came instead of the Accept are its application's.
    fn quarantined_server(&mut self) -> Outcome {
        crate::debug!(
            "fd {}: the server end is quarantined (taken over by an image without the data path): TCP",
            self.fd
        );
        self.fallback_now(Fallback {
            reason: smc_common::handshake::FallbackReason::PeerNoSmc,
            sent_decline: None,
            in_sync: true,
        })
    }

    /// The fallback outcome, for an end decided outside the machine.
    fn fallback_now(&mut self, fb: Fallback) -> Outcome {
        self.release_all();
        self.note_clc_bytes();
        Outcome::Fallback {
            fb,
            awaited: None,
            lost: self.lost,
        }
    }

    /// Carry out one action; `Some` when it is terminal.
    fn act(&mut self, a: Action) -> Option<Outcome> {
        match a {
            Action::Send(b) => {
                if !self.server && b.get(4).copied() == Some(MsgType::Proposal as u8) {
                    self.pair_before_proposal();
                }
                if self.server
                    && b.get(4).copied() == Some(MsgType::Decline as u8)
                    && self.io.with(self.fd, peer_finished)
                {
                    // The client's FIN came behind its CLC messages: no reader waits for our
                    // Decline (a client with the library never half-closes before its
                    // handshake is decided, and one that declined needs none). Sent, it
                    // would draw a reset from a client that is gone, and the program's first
                    // write would fail with EPIPE (SIGPIPE) where TCP's succeeds (red team
                    // rt24 `rt24_kill.py nbconn greetsig`: the server killed by signal 13).
                    crate::debug!(
                        "fd {}: handshake: the client finished sending: no Decline",
                        self.fd
                    );
                    return None;
                }
                if !crate::util::send_all_io(&self.io, self.fd, &b, Instant::now() + self.timeout) {
                    crate::debug!("fd {}: handshake: sending our CLC message failed", self.fd);
                    // A reset: the send took its error, or left it (`tcp_bpf`, which the next
                    // writes of the application went through: `ECONNRESET` at each, red team
                    // round 31 `rt31x_left.c nbrst`); taken here, for the application's next
                    // call, once ([`Lost`]).
                    if self.lost.is_none() {
                        if let Some(e) = self.io.with(self.fd, reset_error) {
                            self.lost = Some(Lost {
                                err: e,
                                write_passes: self.server,
                                left: false,
                            });
                        }
                    }
                    let a = self.m.handle(Input::Abort);
                    // Whatever the machine wanted next is moot: the socket is broken.
                    self.todo.clear();
                    self.todo.extend(a);
                    return None;
                }
                self.clc_sent += b.len() as u64;
                match (self.server, self.m.waiting_for()) {
                    (false, Some(MsgType::Accept)) => self.send_ahead(Ahead::Pair),
                    (true, Some(MsgType::Confirm)) if self.paired.is_none() => {
                        self.send_ahead(Ahead::AttachPeer)
                    }
                    _ => {}
                }
                None
            }
            Action::RegisterDmb { size_code } => {
                let mut decline = None;
                let input = match self.register(size_code) {
                    Ok(_) if !self.server && !self.claim_confirm() => {
                        // The server withdrew its Accept before we could confirm (we read it
                        // late): no Confirm; its Decline follows the Accept.
                        crate::debug!(
                            "fd {}: the server withdrew its Accept: no Confirm, its Decline                              is read",
                            self.fd
                        );
                        self.release_all();
                        Input::AcceptWithdrawn
                    }
                    Ok(l) => Input::DmbRegistered(l),
                    Err(f) => {
                        // A server that withdrew its Accept released its DMB (the attach of
                        // a client that does not pair fails): its Decline, already behind the
                        // Accept, is the answer, and ours would follow its last CLC message.
                        decline = if self.server {
                            None
                        } else {
                            self.queued_decline()
                        };
                        match &decline {
                            Some(_) => Input::AcceptWithdrawn,
                            // The client went away meanwhile (the daemon refuses a socket no
                            // longer established as proof): as its FIN right behind the
                            // Proposal, a handshake the client abandoned, not `INTERR`.
                            None if self.server && self.io.with(self.fd, peer_finished) => {
                                crate::debug!(
                                    "fd {}: the client closed during our registration",
                                    self.fd
                                );
                                Input::Abort
                            }
                            None => Input::DmbFailed(f),
                        }
                    }
                };
                let mut a = self.m.handle(input);
                if let Some(d) = decline {
                    a.extend(self.m.handle(Input::Message(&d)));
                }
                self.todo.extend(a);
                None
            }
            Action::ReleaseDmb(l) => {
                if let Some(o) = self.own.take_if(|o| o.token == l.token) {
                    daemon::release_dmbs(Some(o.token), None);
                }
                None
            }
            Action::Established(est) => {
                if self.server && self.peer.is_none() {
                    match self.attach_client(&est) {
                        Ok(()) => {}
                        Err(AttachErr::Failed(why)) => {
                            self.release_all();
                            return Some(Outcome::Broken(why));
                        }
                        Err(AttachErr::Unanswered) => {
                            // The client is on SMC-D already: a reset would end its
                            // connection, so the daemon is waited for (bounded).
                            crate::debug!(
                                "fd {}: the daemon does not answer the attach of the client's \
                                 DMB: waiting for it",
                                self.fd
                            );
                            self.committed = Some((est, Instant::now() + committed_wait()));
                            return None;
                        }
                    }
                }
                Some(self.established(est))
            }
            Action::Fallback(fb) => {
                let awaited = self.wait.map(|(t, _)| t);
                self.release_all();
                self.note_clc_bytes();
                Some(Outcome::Fallback {
                    fb,
                    awaited,
                    lost: self.lost,
                })
            }
        }
    }

    /// Both DMBs are there: the connection.
    fn established(&mut self, est: Established) -> Outcome {
        match (self.own.take(), self.peer.take()) {
            (Some(own), Some(peer)) => Outcome::Established { est, own, peer },
            // The machine only establishes with the DMB we registered.
            (own, peer) => {
                self.own = own;
                self.peer = peer;
                self.release_all();
                Outcome::Broken("internal: DMBs missing")
            }
        }
    }

    /// Server, after its client confirmed: attach the client's DMB again until the daemon
    /// answers or `committed` expires (then the connection is reset: never a hang). `block`:
    /// wait between tries (unless the daemon wait is deferred); otherwise one try per step.
    fn attach_committed(&mut self, block: bool) -> Progress {
        loop {
            let Some((est, deadline)) = self.committed.take() else {
                self.release_all();
                return Progress::Done(Outcome::Broken("internal: no confirmed handshake"));
            };
            match self.attach_client(&est) {
                Ok(()) => {
                    crate::debug!(
                        "fd {}: the daemon answered: the client's DMB is attached",
                        self.fd
                    );
                    return Progress::Done(self.established(est));
                }
                Err(AttachErr::Failed(why)) => {
                    self.release_all();
                    return Progress::Done(Outcome::Broken(why));
                }
                Err(AttachErr::Unanswered) if Instant::now() >= deadline => {
                    self.release_all();
                    return Progress::Done(Outcome::Broken(
                        "the daemon did not answer the attach of the client's DMB",
                    ));
                }
                Err(AttachErr::Unanswered) => {
                    self.committed = Some((est, deadline));
                    if !block || self.defer_daemon {
                        return Progress::WouldBlock;
                    }
                    // A try that reached a stopped daemon waited for its timeout; one that
                    // found it unreachable (or within the back-off after a timeout) did not.
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// Client, right before its Confirm: decides against the server's withdrawal of its Accept
    /// in the server's DMB (`smc_common::cdc` *Handshake arbitration*). False: withdrawn.
    fn claim_confirm(&self) -> bool {
        self.peer
            .as_ref()
            .is_none_or(|p| dmb_header(&p.map).claim_confirm())
    }

    /// Server, its wait for the Confirm over: withdraws its Accept in its own DMB unless the
    /// client decided to confirm first. `None`: no withdrawal possible (the client did not
    /// offer it, or no DMB of ours): the wait ends as a timeout.
    fn claim_withdraw(&self) -> Option<bool> {
        if !self.m.may_withdraw_accept() {
            return None;
        }
        let own = self.own.as_ref()?;
        Some(dmb_header(&own.map).claim_withdraw())
    }

    /// A whole CLC Decline at the head of the stream (consumed), without waiting.
    fn queued_decline(&mut self) -> Option<Vec<u8>> {
        match self.head_of_stream() {
            Head::Decline(d) => Some(d),
            Head::Eof | Head::Other => None,
        }
    }

    /// What is at the head of the stream now, without waiting: a whole CLC Decline
    /// (consumed), the peer's end of the stream, or anything else (nothing, part of a
    /// message, another message, data).
    fn head_of_stream(&mut self) -> Head {
        let (fd, io) = (self.fd, &self.io);
        let Ok(n) = io.with(fd, |fd| {
            recv(fd, &mut self.buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        }) else {
            return Head::Other;
        };
        if n == 0 {
            return Head::Eof;
        }
        self.decline_at_head(n).map_or(Head::Other, Head::Decline)
    }

    /// [`Driver::head_of_stream`] of `n` bytes peeked into the buffer: a whole Decline there is
    /// consumed.
    fn decline_at_head(&mut self, n: usize) -> Option<Vec<u8>> {
        let (fd, io) = (self.fd, &self.io);
        let hdr = self.buf.get(..n)?.first_chunk::<HEADER_LEN>()?;
        if hdr[..4] != clc::EYECATCHER_SMCR[..] && hdr[..4] != clc::EYECATCHER_SMCD[..] {
            return None;
        }
        if MsgType::from_u8(hdr[4]) != Some(MsgType::Decline) {
            return None;
        }
        let len = clc::message_len(hdr).ok().filter(|&l| l <= n)?;
        match io.with(fd, |fd| recv(fd, &mut self.buf[..len], libc::MSG_DONTWAIT)) {
            Ok(r) if r == len => {
                self.clc_received += len as u64;
                Some(self.buf[..len].to_vec())
            }
            _ => None,
        }
    }

    /// A fallback: what this end's handshake sent and consumed of the stream, for `TCP_INFO`.
    fn note_clc_bytes(&mut self) {
        let (sent, received) = (self.clc_sent, self.clc_received);
        self.clc_sent = 0;
        self.clc_received = 0;
        let fd = self.fd;
        self.io
            .with(fd, |io| note_clc_bytes(io, fd, sent, received));
    }

    /// Give back what we hold (a handshake that did not finish, or fell back), including what
    /// a request sent ahead may have been granted.
    fn release_all(&mut self) {
        self.reserve = None;
        self.map_slot = None;
        let mut own = self.own.take().map(|o| o.token).filter(|&t| t != 0);
        let mut peer = self.peer.take().map(|p| p.token).filter(|&t| t != 0);
        if let Some(p) = self.paired.take() {
            daemon::release_dmbs(None, Some(p.token));
        }
        if let Some((kind, t)) = self.ahead.take() {
            match kind {
                // It may wait for a peer that will not come: never waited for here (what it is
                // granted, if anything, is given back when its reply comes).
                Ahead::Pair => {
                    let _ = with_dev(|c| {
                        c.abandon(t);
                        Ok(())
                    });
                }
                Ahead::AttachPeer | Ahead::Register => {
                    if let Ok(d) = with_dev(|c| c.finish_dmb(t)) {
                        match kind {
                            Ahead::AttachPeer => peer = peer.or(Some(d.token)),
                            _ => own = own.or(Some(d.token)),
                        }
                    }
                }
            }
        }
        if own.is_some() || peer.is_some() {
            daemon::release_dmbs(own, peer);
        }
    }

    /// Start the daemon request the next step will need, unless one is out already (a
    /// `Pair` becomes a `Register` with a daemon that does not pair) or, but for a `Pair`, the
    /// daemon connection has no room for it without reading another's reply (whose memfd this
    /// process would then hold across the application's calls, one per handshake under way:
    /// an event loop that opens its connections at once, at its descriptor limit, found none
    /// left for its own sockets). That step then sends it itself.
    fn send_ahead(&mut self, kind: Ahead) {
        // A `PAIR` goes regardless: the peer's own waits for it in the daemon.
        if self.ahead.is_some()
            || !daemon::pipelining()
            || (kind != Ahead::Pair && !with_dev(|c| Ok(c.has_room())).unwrap_or(false))
        {
            return;
        }
        let fd = self.fd;
        let sc = self.size_code;
        let park = if self.server {
            SERVER_PAIR_WAIT
        } else {
            self.timeout
        };
        let pairing = if self.server {
            daemon::server_pairing()
        } else {
            daemon::pairing()
        };
        let (kind, t) = match kind {
            Ahead::Pair if pairing => {
                let rel = daemon::take_releases();
                let t = self.io.with(fd, |fd| {
                    with_dev(|c| c.pair_start_releasing(sc, park, fd, &rel))
                });
                if t.is_err() {
                    daemon::release_each(&rel);
                }
                (kind, t)
            }
            Ahead::Register | Ahead::Pair => (Ahead::Register, self.register_start(sc)),
            Ahead::AttachPeer => {
                let own = self.recorded_own();
                let r = &mut self.reserve;
                let t = self.io.with(fd, |fd| {
                    with_dev(|c| c.attach_peer_start_reserved(fd, own, r))
                });
                (kind, t)
            }
        };
        self.ahead = t.ok().map(|t| (kind, t));
    }

    /// Client: our `PAIR` goes out before the proposal when it can go at once
    /// ([`smc_ism::SharedClient::pair_start_now`]): the server usually asked already (it pairs
    /// when it finds no proposal yet after `accept`), so the daemon answers both ends while the
    /// proposal travels, and the server sends its accept as soon as it read the proposal.
    /// Sent after the proposal (by [`Driver::send_ahead`]) the pairing waited for the sending
    /// of the proposal (which runs the server's receive path) and then for the daemon. Never
    /// waits: a request that would (no connection or features yet, a full socket, a stalled
    /// daemon) goes after the proposal as before.
    fn pair_before_proposal(&mut self) {
        if self.ahead.is_some() || !daemon::pipelining() || !daemon::pairing_env() {
            return;
        }
        let (fd, sc, park) = (self.fd, self.size_code, self.timeout);
        let rel = daemon::take_releases();
        let t = self
            .io
            .with(fd, |fd| with_dev(|c| c.pair_start_now(sc, park, fd, &rel)));
        match t {
            Ok(Some(t)) => self.ahead = Some((Ahead::Pair, t)),
            _ => daemon::untake_releases(rel),
        }
    }

    /// Whether our registration asks the daemon to record its proof (see `record`). A daemon
    /// that does not answer is asked again next time (and backed off from by `with_dev`).
    fn record(&mut self) -> bool {
        if !self.server {
            return false;
        }
        if let Some(r) = self.record {
            return r;
        }
        match with_dev(|c| c.features()) {
            Ok(f) => *self
                .record
                .insert(f & smc_ism::proto::FEATURE_RECORDED_PROOF != 0),
            Err(_) => false,
        }
    }

    /// The token of our registration when its proof was recorded (see `record`), else 0.
    fn recorded_own(&mut self) -> u64 {
        match self.own.as_ref().map(|o| o.token) {
            Some(own) if self.record() => own,
            _ => 0,
        }
    }

    /// Sends our registration. The first one carries a fresh local state page (the daemon
    /// keeps it for a process our socket may move to); a repeated one (another size code) goes
    /// without, and that connection cannot move. The server asks the daemon to record its
    /// proof (see `record`).
    fn register_start(&mut self, sc: u8) -> Result<smc_ism::Ticket, u32> {
        let fd = self.fd;
        let record = self.record();
        if self.state.is_none() {
            if let Ok((sfd, map)) = crate::shm::state_page() {
                let t = self.io.with(fd, |fd| {
                    with_dev(|c| c.register_dmb_start_with(sc, fd, Some(sfd.as_raw_fd()), record))
                });
                if t.is_ok() {
                    self.state = Some(map);
                }
                return t;
            }
        }
        self.io.with(fd, |fd| {
            with_dev(|c| c.register_dmb_start_with(sc, fd, None, record))
        })
    }

    /// Registers and waits for the reply.
    fn register_now(&mut self, sc: u8) -> Result<smc_ism::Dmb, u32> {
        self.register_start(sc)
            .and_then(|t| with_dev(|c| c.finish_dmb(t)))
    }

    /// Finish a `PAIR` sent ahead (the server sends one now if none is out): our DMB and the
    /// peer's, mapped. `None`: no pairing (not offered, no peer, refused, or a size we did not
    /// ask for): the caller registers and attaches alone, what a pair granted is given back.
    fn finish_pair(&mut self, size_code: u8) -> Option<(LocalDmb, HeldDmb, HeldDmb)> {
        let t = match self.take_ahead(Ahead::Pair) {
            Some(t) => t,
            None if self.server
                && self.ahead.is_none()
                && daemon::pipelining()
                && daemon::server_pairing() =>
            {
                let fd = self.fd;
                let rel = daemon::take_releases();
                let t = self.io.with(fd, |fd| {
                    with_dev(|c| c.pair_start_releasing(size_code, SERVER_PAIR_WAIT, fd, &rel))
                });
                if t.is_err() {
                    daemon::release_each(&rel);
                }
                t.ok()?
            }
            None => return None,
        };
        // The client waits at most what is left of the CLC timeout (the peer's answer came,
        // so its pair did too); the server what it told the daemon.
        let wait = if self.server {
            SERVER_PAIR_WAIT + Duration::from_millis(50)
        } else {
            self.timeout
        };
        // (The error goes through `with_dev`, which backs off from a daemon that timed out.)
        let mut unpaired = false;
        let r = with_dev(|c| {
            c.finish_pair(t, Some(wait)).inspect_err(|e| {
                unpaired = matches!(e, smc_ism::IsmError::NoPeer | smc_ism::IsmError::Timeout)
            })
        });
        let Ok((own, peer)) = r else {
            if unpaired && self.server {
                // Our client's PAIR never came (it does not pair, or the daemon, out of
                // descriptors, could not take it): the next servers register alone for a
                // while instead of waiting for theirs in turn.
                daemon::server_unpaired();
            }
            return None;
        };
        if own.size_code != size_code {
            daemon::release_dmbs(Some(own.token), Some(peer.token));
            return None;
        }
        let l = LocalDmb {
            token: own.token,
            idx: own.idx,
            size_code: own.size_code,
        };
        let mut peer_files = Vec::new();
        let mapped = (
            HeldDmb::map(own, true, &mut self.closing),
            HeldDmb::map(peer, false, &mut peer_files),
        );
        if self.server && self.reserve.is_none() && mapped.1.is_ok() {
            // The server holds the descriptor of the client's DMB until the client confirmed:
            // should it confirm another DMB (its pair's answer unusable), the memfd of that
            // one comes into it (see `reserve`).
            self.reserve = peer_files.pop();
        }
        self.closing.append(&mut peer_files);
        match mapped {
            (Ok(mut o), Ok(p)) => {
                if o.state.is_none() {
                    // The daemon had no local state for it (no descriptor for a page): an
                    // anonymous page now, while we can still decline, not when the connection
                    // is installed after the point of no return (a reset, should it fail).
                    let page = if crate::shm::room::exhausted() {
                        Err(std::io::Error::from_raw_os_error(libc::ENOMEM))
                    } else {
                        Mapping::anon_shared(4096).inspect_err(crate::shm::room::on_map_error)
                    };
                    match page {
                        Ok(m) => o.state = Some(Arc::new(m)),
                        Err(_) => {
                            self.reserve = None;
                            daemon::release_dmbs(Some(o.token), Some(p.token));
                            return None;
                        }
                    }
                }
                Some((l, o, p))
            }
            (o, p) => {
                self.reserve = None;
                let tok = |r: Result<HeldDmb, u64>| match r {
                    Ok(h) => h.token,
                    Err(t) => t,
                };
                daemon::release_dmbs(Some(tok(o)), Some(tok(p)));
                None
            }
        }
    }

    /// The request sent ahead, if it is of this kind.
    fn take_ahead(&mut self, kind: Ahead) -> Option<smc_ism::Ticket> {
        match self.ahead.take() {
            Some((k, t)) if k == kind => Some(t),
            other => {
                self.ahead = other;
                None
            }
        }
    }

    /// Register (and map) our DMB; the client also attaches and maps the server's (before it
    /// confirms, so that a refused attach is still a clean decline).
    fn register(&mut self, size_code: u8) -> Result<LocalDmb, DmbFailure> {
        if let Some((l, own, peer)) = self.finish_pair(size_code) {
            // The client checks the peer's DMB against the accept; the server after the confirm.
            let want = self.m.peer_dmb().map(|p| p.token);
            if self.server {
                self.own = Some(own);
                self.paired = Some(peer);
                return Ok(l);
            }
            if want == Some(peer.token) {
                self.own = Some(own);
                self.peer = Some(peer);
                return Ok(l);
            }
            crate::debug!(
                "fd {}: the daemon paired us with another DMB than the accept names: \
                 registering and attaching alone",
                self.fd
            );
            daemon::release_dmbs(Some(own.token), Some(peer.token));
        }
        let fd = self.fd;
        // Client: the attach goes out first, then the registration sent with the proposal is
        // collected (its reply is there by now), then the attach's.
        let attach = if self.server {
            None
        } else {
            let p = self.m.peer_dmb().ok_or(DmbFailure::Internal)?;
            Some(
                self.io
                    .with(fd, |fd| with_dev(|c| c.attach_dmb_start(p.token, fd))),
            )
        };
        let own = match self.take_ahead(Ahead::Register) {
            Some(t) => match with_dev(|c| c.finish_dmb(t)) {
                Ok(d) if d.size_code == size_code => Ok(d),
                Ok(d) => {
                    daemon::release_dmbs(Some(d.token), None);
                    self.register_now(size_code)
                }
                Err(_) => self.register_now(size_code),
            },
            None => self.register_now(size_code),
        };
        let peer = attach.map(|a| a.and_then(|t| with_dev(|c| c.finish_dmb(t))));
        let own = match own {
            Ok(d) => d,
            Err(code) => {
                if let Some(Ok(p)) = peer {
                    daemon::release_dmbs(None, Some(p.token));
                }
                return Err(failure(code));
            }
        };
        let l = LocalDmb {
            token: own.token,
            idx: own.idx,
            size_code: own.size_code,
        };
        let closing = &mut self.closing;
        let peer = peer.map(|r| r.map(|d| HeldDmb::map(d, false, closing)));
        let own = HeldDmb::map(own, true, &mut self.closing);
        let (mut own, peer) = match (own, peer) {
            (Ok(o), None) => (o, None),
            (Ok(o), Some(Ok(Ok(p)))) => (o, Some(p)),
            // The machine never learns of `own` unless it is reported: give back all here.
            (o, p) => {
                let ot = match o {
                    Ok(o) => o.token,
                    Err(t) => t,
                };
                let (pt, why) = match p {
                    Some(Ok(Ok(p))) => (Some(p.token), DmbFailure::Mem),
                    Some(Ok(Err(t))) => (Some(t), DmbFailure::Mem),
                    Some(Err(code)) => (None, failure(code)),
                    None => (None, DmbFailure::Mem),
                };
                daemon::release_dmbs(Some(ot), pt);
                return Err(why);
            }
        };
        match self.reserve_rest() {
            Ok((reserve, state, slot)) => {
                own.state = Some(Arc::new(state));
                self.own = Some(own);
                self.peer = peer;
                self.reserve = reserve;
                self.map_slot = slot;
                Ok(l)
            }
            Err(code) => {
                daemon::release_dmbs(Some(own.token), peer.map(|p| p.token));
                Err(failure(code))
            }
        }
    }

    /// What this end needs once it can no longer decline (the server after its accept, the
    /// client after its confirm), taken while it still can: the local state page (the one
    /// registered, else an anonymous one), and for the server a descriptor for the memfd of
    /// the client's DMB (see `reserve`) and a mapping for it (see `map_slot`). `Err`: the
    /// decline code.
    fn reserve_rest(&mut self) -> Result<(Option<OwnedFd>, Mapping, Option<Mapping>), u32> {
        let mem = Diag::Mem.code();
        let (fd, slot) = if self.server {
            let fd = with_dev(|c| c.reserve())?;
            if crate::shm::room::exhausted() {
                return Err(mem);
            }
            let slot = Mapping::anon_shared(4096)
                .inspect_err(crate::shm::room::on_map_error)
                .map_err(|_| mem)?;
            (Some(fd), Some(slot))
        } else {
            (None, None)
        };
        let state = match self.state.take() {
            Some(m) => m,
            None => Mapping::anon_shared(4096).map_err(|_| mem)?,
        };
        Ok((fd, state, slot))
    }

    /// Server, after the confirm: the client's DMB, from the attach sent ahead when it is the
    /// confirmed one, else attached by the confirmed token; mapped. A client that already
    /// closed (it wrote and left at once) released its DMB: its close is recorded in ours, and
    /// a private stand-in takes its place (our reads see its data, then EOF; writes `EPIPE`).
    fn attach_client(&mut self, est: &Established) -> Result<(), AttachErr> {
        let fd = self.fd;
        let token = est.peer_token;
        if let Some(p) = self.paired.take() {
            if p.token == token {
                self.peer = Some(p);
                self.reserve = None;
                return Ok(());
            }
            daemon::release_dmbs(None, Some(p.token));
            // Its mapping goes now: the place of the one to be made (see `map_slot`).
            drop(p);
        }
        let mut reserve = self.reserve.take();
        let own = self.recorded_own();
        let ahead = match self.take_ahead(Ahead::AttachPeer) {
            Some(t) => match with_dev(|c| c.finish_dmb_reserved(t, &mut reserve)) {
                Ok(d) if d.token == token => Some(d),
                Ok(d) => {
                    // A DMB the client gave up (it registered again).
                    daemon::release_dmbs(None, Some(d.token));
                    None
                }
                Err(_) => {
                    // Expected now and then, not an error: the daemon saw our attach before
                    // the client's registration (two daemon connections, no order between
                    // them). It logged "unknown or released DMB token" above.
                    crate::debug!(
                        "fd {fd}: the attach sent ahead found no DMB of the client yet: \
                         attaching by the confirmed token {token:#x}"
                    );
                    None
                }
            },
            None => None,
        };
        let d = match ahead {
            Some(d) => Ok(d),
            None => with_dev(|c| {
                let t = self.io.with(fd, |fd| {
                    c.attach_dmb_start_reserved(token, fd, own, &mut reserve)
                })?;
                c.finish_dmb_reserved(t, &mut reserve)
            }),
        };
        let d = match d {
            Ok(d) => d,
            Err(code) => {
                // Another try (a daemon that did not answer) has the descriptor again.
                self.reserve = reserve;
                let gone = self
                    .own
                    .as_ref()
                    .is_some_and(|o| crate::conn::peer_closed_in(&o.map));
                if !gone {
                    if code == Diag::NoSmcdDev.code() {
                        return Err(AttachErr::Unanswered);
                    }
                    return Err(AttachErr::Failed("attach of the client's DMB failed"));
                }
                self.map_slot = None;
                let map = committed_map(|| Mapping::anon_shared(est.peer_dmb_size as usize))
                    .map_err(|_| AttachErr::Failed("no memory for a stand-in DMB"))?;
                self.peer = Some(HeldDmb {
                    token: 0,
                    id: 0,
                    map: Arc::new(map),
                    state: None,
                });
                return Ok(());
            }
        };
        match HeldDmb::map_committed(d, self.map_slot.take(), &mut self.closing) {
            Ok(p) => {
                self.peer = Some(p);
                Ok(())
            }
            Err(t) => {
                daemon::release_dmbs(None, Some(t));
                Err(AttachErr::Failed("mapping of the client's DMB failed"))
            }
        }
    }

    /// Frame one CLC message from the socket without consuming anything else.
    fn read_msg(&mut self) -> Rd {
        let (fd, io) = (self.fd, &self.io);
        let n = match io.with(fd, |fd| {
            recv(fd, &mut self.buf, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        }) {
            Ok(0) => {
                crate::debug!("fd {fd}: handshake: the peer closed (EOF) before its CLC message");
                return Rd::Gone;
            }
            Ok(n) => n,
            Err(e) if e == libc::EAGAIN || e == libc::EWOULDBLOCK => return Rd::Nothing,
            Err(e) => {
                crate::debug!(
                    "fd {fd}: handshake: reading the peer's CLC message failed: errno {e}"
                );
                // A peek reports the socket's error only when nothing is queued, and takes it:
                // TCP's next read would have said so, ours would say EOF.
                if !matches!(e, libc::EINTR | libc::EBADF | libc::EFAULT | libc::ENOMEM) {
                    self.lost = Some(Lost {
                        err: e,
                        write_passes: self.waited,
                        left: false,
                    });
                }
                return Rd::Gone;
            }
        };
        let eye = &self.buf[..n.min(4)];
        if eye != &clc::EYECATCHER_SMCD[..eye.len()] && eye != &clc::EYECATCHER_SMCR[..eye.len()] {
            return Rd::NotClc(n);
        }
        if n < HEADER_LEN {
            return Rd::Nothing;
        }
        let Some(hdr) = self.buf.first_chunk::<HEADER_LEN>() else {
            return Rd::Nothing;
        };
        let len = match clc::message_len(hdr) {
            Ok(l) if l <= MAX_MSG => l,
            _ => return Rd::NotClc(n),
        };
        if n < len {
            return Rd::Nothing;
        }
        // Consume exactly this message (application bytes may follow a decline).
        match io.with(fd, |fd| recv(fd, &mut self.buf[..len], libc::MSG_DONTWAIT)) {
            Ok(r) if r == len => {
                self.clc_received += len as u64;
                Rd::Msg(len)
            }
            r => {
                crate::debug!(
                    "fd {fd}: handshake: {n} bytes peeked, but consuming the {len}-byte CLC \
                     message got {r:?}"
                );
                Rd::Gone
            }
        }
    }
}

/// Whether the server end of client socket `fd`'s connection is quarantined
/// (`SMC_SO_PEER_QUARANTINED`): an image without the data path took it over, our Proposal was
/// stripped off its stream and no Accept will come. Asked only when the Accept did not come
/// in time or bytes came instead of it. Errno preserved.
fn peer_quarantined(fd: i32) -> bool {
    let mut v = 0u32;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    let e0 = crate::real::errno();
    // SAFETY: valid out buffer of `len` bytes.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            smc_common::bpf::SOL_SMC_BPF,
            smc_common::bpf::SMC_SO_PEER_QUARANTINED,
            (&mut v as *mut u32).cast(),
            &mut len,
        )
    };
    crate::real::set_errno(e0);
    r == 0 && v == 1
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// A mapping the server makes after its client confirmed (see [`HeldDmb::map_committed`]):
/// `map` once more after an `ENOMEM` that gave the application's room back.
fn committed_map(map: impl Fn() -> std::io::Result<Mapping>) -> std::io::Result<Mapping> {
    match map() {
        Err(e) if e.raw_os_error() == Some(libc::ENOMEM) => {
            crate::shm::room::on_map_error(&e);
            crate::debug!("out of mappings after the client's confirm: the room given back");
            map()
        }
        r => r,
    }
}

/// The CDC header of a mapped DMB.
fn dmb_header(m: &Mapping) -> &smc_common::cdc::CdcHeader {
    // SAFETY: a DMB mapping is page aligned and at least 16 KiB, valid while `m` lives; its
    // header is accessed only atomically (by both ends).
    unsafe { smc_common::cdc::CdcHeader::from_ptr(m.as_ptr()) }
}

/// The decline reason for a daemon error.
fn failure(code: u32) -> DmbFailure {
    match Diag::from_code(code) {
        Some(Diag::MaxDmb) => DmbFailure::MaxDmb,
        Some(Diag::Mem) => DmbFailure::Mem,
        Some(Diag::NoSmcdDev) => DmbFailure::NoDevice,
        _ => DmbFailure::Internal,
    }
}

/// The error of a socket whose connection was reset (or timed out), taken from it
/// (`SO_ERROR`), or `ECONNRESET` when a call took it already; `None` while the connection
/// stands (`TCP_INFO` state not `TCP_CLOSE`). errno is kept.
fn reset_error(fd: i32) -> Option<i32> {
    let e0 = crate::real::errno();
    let e = crate::util::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(0);
    crate::real::set_errno(e0);
    if e != 0 {
        Some(e)
    } else {
        (crate::util::tcp_state(fd) == Some(crate::conn::TCP_CLOSE)).then_some(libc::ECONNRESET)
    }
}

fn recv(fd: i32, buf: &mut [u8], flags: i32) -> Result<usize, i32> {
    loop {
        match recv_once(fd, buf, flags) {
            Err(libc::EINTR) => {}
            r => return r,
        }
    }
}

/// One `recv` (a peek looks at the head of the stream: [`crate::util::recv_peek_head`]);
/// `EINTR` is the caller's.
fn recv_once(fd: i32, buf: &mut [u8], flags: i32) -> Result<usize, i32> {
    let r = if flags & libc::MSG_PEEK != 0 {
        // SAFETY: valid buffer.
        unsafe { crate::util::recv_peek_head(fd, buf.as_mut_ptr().cast(), buf.len(), flags) }
    } else {
        // SAFETY: valid buffer.
        unsafe { real::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags) }
    };
    if r >= 0 {
        Ok(r as usize)
    } else {
        Err(real::errno())
    }
}

/// What the socket holds for a caller that found no whole CLC message at its last look.
#[derive(PartialEq, Eq)]
enum Queued {
    /// Nothing (or an error: the next read tells it).
    Nothing,
    /// The start of a CLC message, not all of it: the socket is readable, but the rest is
    /// still on its way.
    Partial,
    /// A whole message, or bytes that are no CLC message: the next read decides at once.
    Decidable,
}

/// Peeks at the socket (never consuming): see [`Queued`]. A message that arrived whole
/// between the caller's read and this look is `Decidable` (it is not waited for).
fn queued(fd: i32) -> Queued {
    let mut buf = [0u8; MAX_MSG];
    let n = match recv(fd, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(n) if n > 0 => n,
        _ => return Queued::Nothing,
    };
    let eye = &buf[..n.min(4)];
    if eye != &clc::EYECATCHER_SMCD[..eye.len()] && eye != &clc::EYECATCHER_SMCR[..eye.len()] {
        return Queued::Decidable;
    }
    let Some(hdr) = buf.get(..n).and_then(|b| b.first_chunk::<HEADER_LEN>()) else {
        return Queued::Partial;
    };
    match clc::message_len(hdr) {
        Ok(l) if l <= n => Queued::Decidable,
        Ok(l) if l <= MAX_MSG => Queued::Partial,
        _ => Queued::Decidable,
    }
}

/// Wait until the socket is readable or `deadline`; a partial message already queued makes
/// it readable at once, so then pause briefly instead (a whole one returns at once).
///
/// Through `io` ([`IoPath`]): the sleep is at most [`IO_SLICE`], after which the caller looks
/// again, so that a number closed during it (the kernel's `poll` then looks at whatever the
/// number names, or at nothing) costs at most that.
fn wait_readable(io: &IoPath, fd: i32, deadline: Instant) {
    let now = Instant::now();
    if now >= deadline {
        return;
    }
    match io.with(fd, queued) {
        Queued::Decidable => return,
        Queued::Partial => {
            std::thread::sleep(Duration::from_micros(20));
            return;
        }
        Queued::Nothing => {}
    }
    let ms = (deadline - now)
        .min(IO_SLICE)
        .as_millis()
        .clamp(1, i32::MAX as u128) as i32;
    let mut p = libc::pollfd {
        fd: io.now(fd),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd.
    unsafe { real::poll(&mut p, 1, ms) };
}

/// Wait up to `ms` for `fd` to be readable, unless `other` is or becomes readable first (then
/// false, at once).
pub fn wait_readable_unless(fd: i32, other: i32, ms: i32) -> bool {
    let mut p = [
        libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: other,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    // A partial message makes `fd` readable: only `other` is asked then, without waiting. A
    // whole one (it arrived since the caller looked) is read at once, without a pause.
    let partial = match queued(fd) {
        Queued::Nothing => false,
        Queued::Partial => true,
        Queued::Decidable => return true,
    };
    let (n, ms) = if partial { (1, 0) } else { (2, ms) };
    // SAFETY: `n` ≤ 2 pollfds of our array.
    unsafe { real::poll(p.as_mut_ptr().add(2 - n), n as libc::nfds_t, ms) };
    if p[1].revents & libc::POLLIN != 0 {
        return false;
    }
    if partial {
        std::thread::sleep(Duration::from_micros(20));
    }
    true
}

/// Consume one whole CLC message if the socket starts with one (of any type when `any`, else
/// only a Decline). `Some(Some(type))`: that message was consumed; `Some(None)`: the stream
/// does not start with one (application data, or its end); `None`: not decidable yet (errno
/// from the peek when nothing is there).
pub fn skip_one(fd: i32, any: bool) -> Option<Option<MsgType>> {
    // A socket error must stay for the application's own call: a read, even a peek, takes it
    // (`sock_error`) and the next read would say EOF. Only data is looked at: none yet is
    // `None`; an error or the end with nothing before it is not a CLC message.
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of our own, no wait.
    match unsafe { real::poll(&mut p, 1, 0) } {
        1 => {}
        // Not readable: nothing there, or only an urgent byte at the head.
        0 if at_urgent_mark(fd) => return Some(None),
        _ => return None,
    }
    if p.revents & libc::POLLERR != 0 {
        // A peek finds queued bytes before it looks at the error: only an empty queue is left
        // alone.
        let mut queued: libc::c_int = 0;
        // SAFETY: SIOCINQ writes one int to our local.
        let r = unsafe {
            real::ioctl(
                fd,
                libc::FIONREAD as libc::c_ulong,
                std::ptr::from_mut(&mut queued) as libc::c_ulong,
            )
        };
        if r != 0 || queued <= 0 {
            return Some(None);
        }
    } else if p.revents & libc::POLLIN == 0 {
        return if p.revents & libc::POLLHUP != 0 {
            Some(None)
        } else {
            None
        };
    }
    let mut buf = [0u8; MAX_MSG];
    let n = match recv(fd, &mut buf, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(n) => n,
        // A peek passes over an urgent byte at the head: nothing else is there.
        Err(_) if at_urgent_mark(fd) => return Some(None),
        Err(_) => return None,
    };
    if n == 0 {
        return Some(None);
    }
    let eye = &buf[..n.min(4)];
    if eye != &clc::EYECATCHER_SMCD[..eye.len()] && eye != &clc::EYECATCHER_SMCR[..eye.len()] {
        return Some(None);
    }
    if n < HEADER_LEN {
        return None;
    }
    let hdr = buf.first_chunk::<HEADER_LEN>()?;
    let len = match clc::message_len(hdr) {
        Ok(l) if l <= MAX_MSG => l,
        _ => return Some(None),
    };
    let Some(t) = MsgType::from_u8(hdr[4]).filter(|&t| any || t == MsgType::Decline) else {
        return Some(None);
    };
    if n < len {
        return None;
    }
    if recv(fd, &mut buf[..len], libc::MSG_DONTWAIT) == Ok(len) {
        note_clc_bytes(fd, fd, 0, len as u64);
    }
    Some(Some(t))
}

/// Whether the head of `fd`'s stream is an urgent byte (`SIOCATMARK`; errno preserved). The
/// peer's CLC messages all come before its first application byte, and everything before
/// that byte was read: no CLC message can come any more. TCP's read passes over such a byte
/// (read out of band already, or not) and so ends the urgency; a skip that waited on for a
/// Decline said `EAGAIN` without that read, and the byte kept its mark (conformance
/// `oob_second_after_first_seen`, `oob_recv_none_twice_peek` with a 1 ms CLC timer:
/// `recv(MSG_OOB)` gave the urgent byte again where TCP says `EINVAL`, `SIOCATMARK` 1 where
/// TCP says 0).
fn at_urgent_mark(fd: i32) -> bool {
    let e0 = real::errno();
    let mut v: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int to our local.
    let r = unsafe {
        real::ioctl(
            fd,
            real::SIOCATMARK,
            std::ptr::from_mut(&mut v) as libc::c_ulong,
        )
    };
    real::set_errno(e0);
    r == 0 && v != 0
}

/// Blocks (a blocking socket) until [`skip_one`] can decide: the stream starts with a whole
/// CLC message, with something else, or ends. Consumes nothing. `Err`: the errno that ended
/// the wait (a receive timeout, a socket error, a signal: `EINTR`).
pub fn wait_head(fd: i32) -> Result<(), i32> {
    let mut buf = [0u8; MAX_MSG];
    let n = recv_once(fd, &mut buf, libc::MSG_PEEK)?;
    let eye = &buf[..n.min(4)];
    if n == 0
        || (eye != &clc::EYECATCHER_SMCD[..eye.len()] && eye != &clc::EYECATCHER_SMCR[..eye.len()])
    {
        return Ok(());
    }
    let mut n = n;
    if n < HEADER_LEN {
        n = recv_once(
            fd,
            &mut buf[..HEADER_LEN],
            libc::MSG_PEEK | libc::MSG_WAITALL,
        )?;
        if n < HEADER_LEN {
            return Ok(()); // the stream ends inside it
        }
    }
    let Some(hdr) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(());
    };
    match clc::message_len(hdr) {
        Ok(len) if len <= MAX_MSG && n < len => {
            recv_once(fd, &mut buf[..len], libc::MSG_PEEK | libc::MSG_WAITALL)?;
            Ok(())
        }
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------
// the CLC bytes of connections that fell back

/// A socket whose connection fell back to TCP after CLC bytes went over it.
struct ClcBytes {
    cookie: u64,
    /// The number it fell back on (forgotten when that number closes).
    fd: i32,
    sent: u64,
    received: u64,
}

/// The CLC bytes of connections that fell back: the kernel's `TCP_INFO` byte counts include
/// them (the handshake's messages both ways, the late ones skipped after it), TCP without the
/// handshake has none, so `getsockopt(TCP_INFO)` takes them out (conformance
/// `tcp_info_byte_counts` with a 1 ms CLC timer: `bytes_acked 100269` where TCP says 100001).
/// By socket cookie (a number `dup`ed from it finds it too, a number reused for another socket
/// does not), kept until the number it fell back on closes; at most [`CLC_BYTES_MAX`] (the
/// oldest go first: its counts are then the kernel's).
static CLC_BYTES: ForkMutex<Vec<ClcBytes>> = ForkMutex::new(Vec::new);
/// `CLC_BYTES.len()`: the calls of every other socket look at this only.
static CLC_BYTES_N: AtomicUsize = AtomicUsize::new(0);
const CLC_BYTES_MAX: usize = 4096;

/// `sent` and `received` CLC bytes went over the socket `io` (the number `fd`, or a private
/// duplicate of its socket) of a connection that fell back.
pub(crate) fn note_clc_bytes(io: i32, fd: i32, sent: u64, received: u64) {
    if sent == 0 && received == 0 {
        return;
    }
    let Some(cookie) = crate::util::sock_cookie(io) else {
        return;
    };
    let mut v = CLC_BYTES.lock();
    if let Some(e) = v.iter_mut().find(|e| e.cookie == cookie) {
        e.sent += sent;
        e.received += received;
    } else {
        if v.len() >= CLC_BYTES_MAX {
            v.remove(0);
        }
        v.push(ClcBytes {
            cookie,
            fd,
            sent,
            received,
        });
    }
    CLC_BYTES_N.store(v.len(), Ordering::Relaxed);
}

/// The CLC bytes (sent, received) that went over the socket of `fd`, if its connection fell
/// back after some. errno is preserved.
pub(crate) fn clc_bytes(fd: i32) -> Option<(u64, u64)> {
    if CLC_BYTES_N.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let cookie = crate::util::sock_cookie(fd)?;
    let v = CLC_BYTES.lock();
    v.iter()
        .find(|e| e.cookie == cookie)
        .map(|e| (e.sent, e.received))
}

/// Whether any connection that fell back has CLC bytes recorded.
pub(crate) fn clc_bytes_any() -> bool {
    CLC_BYTES_N.load(Ordering::Relaxed) != 0
}

/// The numbers `lo..=hi` close (or name other files from now on).
pub(crate) fn forget_clc_bytes(lo: i64, hi: i64) {
    if !clc_bytes_any() {
        return;
    }
    let mut v = CLC_BYTES.lock();
    v.retain(|e| !(lo..=hi).contains(&i64::from(e.fd)));
    CLC_BYTES_N.store(v.len(), Ordering::Relaxed);
}

/// Whether the peer of the TCP socket `fd` sent its FIN (`CLOSE_WAIT`: our side still open).
fn peer_finished(fd: i32) -> bool {
    crate::util::tcp_state(fd) == Some(crate::conn::TCP_CLOSE_WAIT)
}

#[cfg(test)]
mod tests;
