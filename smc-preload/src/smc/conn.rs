//! One SMC-D connection as seen from one end: our DMB (receive ring), the peer's DMB (send
//! ring), and the local shared state that every thread and forked process of this end uses.
//!
//! Memory, for one direction (the writer W writes into the DMB owned by the reader R):
//! - `R.dmb[0..32]`: CDC header written by W: producer word = how far W produced into this ring;
//!   consumer word = how far W consumed from *its own* ring, plus W's flags (write_blocked,
//!   peer_done_writing, peer_conn_closed, peer_conn_abort) — as Linux does, flags live in the
//!   consumer word only.
//! - `R.dmb[24..32]` (the header's reserved word, unused by Linux SMC-D) carries the two wakeup
//!   bits of this direction, set and swapped by both ends: [`WAIT_DATA`] (R sleeps waiting for
//!   data) and [`WAIT_SPACE`] (W sleeps waiting for room). Whoever changes the ring state swaps
//!   the bit off and, if it was set, rings the doorbell: one byte over the TCP connection.
//! - `R.dmb[32..]`: the data ring.
//!
//! Local state ([`Shared`]) lives in a `MAP_SHARED` page of a sealed memfd created at handshake
//! time, so threads and forked children see the same cursors, locks and flags; the memfd goes
//! to the daemon with the registration, so that a process the socket moves to (`SCM_RIGHTS`,
//! `exec`) shares it too ([`Conn::adopt`]).

use crate::iov::IovCursor;
use crate::real;
use crate::shm::{Mapping, ShmLock};
use smc_common::cdc::{CdcHeader, ConnStateFlags, Cursor, CursorWord, ProdFlags, Ring};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The reader of this DMB sleeps waiting for data.
pub const WAIT_DATA: u64 = 1;
/// The writer into this DMB sleeps waiting for room.
pub const WAIT_SPACE: u64 = 2;

/// A reclaim leaves this much of the send ring after our producer cursor in place, so the next
/// writes land on existing pages.
const RECLAIM_WARM: u32 = 16 * 1024;
/// A blocking wait for data that has slept this long gives the send ring's idle pages back.
const RECLAIM_IDLE_MS: i32 = 10;
const PAGE: usize = 4096;
/// poll/epoll waiters (whose sleep this library does not time) give the pages back before
/// sleeping once this much was written since the last reclaim and the peer consumed it all.
const RECLAIM_ARMED_MIN: u32 = 256 * 1024;

/// The byte we send as a doorbell (never the first byte of a CLC eyecatcher, 0xE2).
pub const DOORBELL: u8 = 0x01;

// Local flags (Shared::flags).
pub const F_SHUT_RD: u32 = 1 << 0;
pub const F_SHUT_WR: u32 = 1 << 1;
pub const F_PEER_GONE: u32 = 1 << 2;
pub const F_PEER_RST: u32 = 1 << 3;
pub const F_PROTO: u32 = 1 << 4;
pub const F_RST_REPORTED: u32 = 1 << 5;
pub const F_CLOSED: u32 = 1 << 6;
pub const F_NONBLOCK: u32 = 1 << 7;
pub const F_REAL_SHUT: u32 = 1 << 8;
/// A write went out after the peer had closed: TCP's peer answers it with a reset, which in
/// CLOSE_WAIT leaves `EPIPE` pending (`sk_err`) and the socket shut both ways. Set until that
/// error is reported once ([`F_EPIPE_REPORTED`]).
pub const F_WROTE_AFTER_CLOSE: u32 = 1 << 9;
pub const F_EPIPE_REPORTED: u32 = 1 << 10;
/// This end is switching the connection to TCP ([`Conn::switch_to_tcp`]): the rings stand
/// still, no doorbell goes out, nobody drains the socket (the stream after the peer's
/// [`SWITCH_TCP`] marker is data).
pub const F_SWITCHING: u32 = 1 << 11;
/// The peer's [`SWITCH_TCP`] marker was consumed from the socket: this end must switch too.
pub const F_PEER_SWITCH: u32 = 1 << 12;
/// The connection continues on plain TCP, for every holder of this end in every process.
pub const F_SWITCHED: u32 = 1 << 13;

/// This project's CDC extension "switch to TCP" (Linux net/smc has no such message): the one
/// byte, sent on the TCP socket after the sender's last doorbell, that ends the doorbell
/// channel. The sender no longer reads or writes the rings: the consumer cursor it published
/// before is final (the writer into its ring sends the unread bytes from there over TCP), and
/// so is its producer cursor. What follows on the stream is data. See DESIGN.md *Switch to
/// TCP*.
pub const SWITCH_TCP: u8 = 0x02;

/// What [`Conn::recv`] and [`Conn::send`] return once the connection continues on TCP
/// ([`F_PEER_SWITCH`], [`F_SWITCHED`]): the caller switches it ([`Conn::switch_to_tcp`]) and
/// runs the call on the socket. Never an errno the application sees.
pub const E_TCP: Errno = -4096;

const SHARED_MAGIC: u32 = 0x534d_4353; // "SMCS"

/// State of this end of the connection, shared by threads and forked processes.
#[repr(C)]
pub struct Shared {
    magic: AtomicU32,
    /// fds (over all processes) that refer to this connection.
    pub refs: AtomicU32,
    pub rx_lock: ShmLock,
    pub tx_lock: ShmLock,
    /// Our consumer cursor in our ring (packed [`Cursor`]).
    cons: AtomicU64,
    /// The consumer cursor last published to the peer.
    cons_pub: AtomicU64,
    /// Last accepted producer cursor of the peer in our ring.
    peer_prod: AtomicU64,
    /// Our producer cursor in the peer's ring.
    prod: AtomicU64,
    /// Last accepted consumer cursor of the peer (in its ring).
    peer_cons: AtomicU64,
    pub flags: AtomicU32,
    /// Waiters (threads of any process) sleeping on `wake_seq`.
    pub waiters: AtomicU32,
    /// 1 while one waiter sleeps in poll on the TCP socket.
    pub poller: AtomicU32,
    /// Bumped by the poller after each wakeup and by every drain of doorbells (futex word of
    /// the other waiters).
    pub wake_seq: AtomicU32,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub rx_calls: AtomicU64,
    pub tx_calls: AtomicU64,
    pub rx_full: AtomicU64,
    pub tx_full: AtomicU64,
    pub doorbells_sent: AtomicU64,
    pub doorbells_rcvd: AtomicU64,
    pub spin_hits: AtomicU64,
    pub sleeps: AtomicU64,
    /// Our producer cursor when the send ring's idle pages were last given back
    /// ([`Conn::reclaim_tx`]).
    tx_reclaimed: AtomicU64,
    /// Bytes of the send ring given back (hole punching), for diagnostics.
    pub tx_reclaimed_bytes: AtomicU64,
    /// Threads (of any process) asleep in the kernel on the TCP socket — a blocking call's
    /// poller, an application's poll/select/epoll_wait — plus [`DRAINING`] while doorbells are
    /// being drained. See [`Conn::sleep_enter`].
    ksleep: AtomicU32,
    /// References in `refs` that travel with a socket leaving a process (`SCM_RIGHTS`, `exec`,
    /// `posix_spawn`): the process that receives it takes one instead of adding a reference
    /// ([`Conn::take_in_flight`]).
    in_flight: AtomicU32,
    /// 1: this end is the server.
    role: AtomicU32,
    /// The socket's `SO_RCVLOWAT` (0 or 1: any byte), as the kernel holds it
    /// ([`Conn::set_rcvlowat`]); shared like the socket by every process holding it.
    rcvlowat: AtomicU32,
    /// Doorbells being sent right now ([`Conn::ring_doorbell`]): a switch to TCP waits for
    /// them, so that no doorbell follows its marker.
    bells: AtomicU32,
}

/// [`Shared::ksleep`]: a drain of the doorbells is under way.
const DRAINING: u32 = 1 << 31;
/// A waiter that left doorbells to other sleepers waits at most this long for one of them to
/// drain them (they were woken by those very doorbells); then it drains them itself (a
/// sleeper that does not run — stopped, or killed while asleep — must not stall the others).
pub const SETTLE_MAX_MS: u64 = 20;

const _: () = assert!(std::mem::size_of::<Shared>() <= 4096);

fn pack(c: Cursor) -> u64 {
    ((c.wrap as u64) << 32) | c.count as u64
}

fn unpack(v: u64) -> Cursor {
    Cursor::new((v >> 32) as u16, v as u32)
}

/// Errors as errno values.
pub type Errno = i32;

/// How a blocking wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    Ready,
    Timeout,
    Intr,
}

/// Tunables (environment, read once).
pub struct Tune {
    /// Upper bound of the adaptive spin before sleeping, in nanoseconds.
    pub spin_max_ns: u64,
    /// Yield the CPU every this many spin iterations (0: never), so that a peer sharing our
    /// CPU gets to run.
    pub spin_yield: u32,
    /// Spin of a writer waiting for room, in nanoseconds.
    pub spin_room_ns: u64,
}

/// One spin iteration: a pause, and every `spin_yield` iterations a `sched_yield`.
#[inline]
pub fn spin_pause(i: u32) {
    let y = tune().spin_yield;
    if y != 0 && i.is_multiple_of(y) {
        // SAFETY: plain syscall.
        unsafe { libc::sched_yield() };
    } else {
        std::hint::spin_loop();
    }
}

pub fn tune() -> &'static Tune {
    static T: crate::forklock::ForkOnce<Tune> = crate::forklock::ForkOnce::new();
    T.get_or_init(|| {
        let spin_us = std::env::var("SMC_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(100);
        // SAFETY: plain sysconf.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let spin_yield = std::env::var("SMC_SPIN_YIELD")
            .ok()
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(64);
        let room_us = std::env::var("SMC_SPIN_ROOM_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
        Tune {
            spin_max_ns: if cpus > 1 { spin_us * 1000 } else { 0 },
            spin_yield,
            spin_room_ns: if cpus > 1 { room_us * 1000 } else { 0 },
        }
    })
}

/// Spin policy: spin the full budget (`SMC_SPIN_US`, default 100 µs) while spinning pays off
/// at least now and then; after 64 waits in a row that had to sleep anyway (an idle or
/// throughput-bound connection) spin only an eighth of it, until a spin succeeds again. Never
/// spins on a single-CPU machine.
pub struct Spin {
    misses: AtomicU32,
}

impl Default for Spin {
    fn default() -> Self {
        Self::new()
    }
}

impl Spin {
    pub const fn new() -> Spin {
        Spin {
            misses: AtomicU32::new(0),
        }
    }

    pub fn budget(&self) -> u64 {
        let t = tune();
        if self.misses.load(Ordering::Relaxed) < 64 {
            t.spin_max_ns
        } else {
            t.spin_max_ns / 8
        }
    }

    pub fn record(&self, hit: bool) {
        if hit {
            if self.misses.load(Ordering::Relaxed) != 0 {
                self.misses.store(0, Ordering::Relaxed);
            }
        } else {
            let m = self.misses.load(Ordering::Relaxed);
            if m < 1000 {
                self.misses.store(m + 1, Ordering::Relaxed);
            }
        }
    }
}

/// Whether the peer already closed its end, as it records in our DMB's header before it
/// releases its own DMB.
pub fn peer_closed_in(own: &Mapping) -> bool {
    // SAFETY: a DMB mapping is page aligned and at least 32 bytes; read atomically.
    let st = unsafe { CdcHeader::from_ptr(own.as_ptr()) }
        .load_cons()
        .conn_state;
    st.contains(ConnStateFlags::PEER_CONN_CLOSED) || st.contains(ConnStateFlags::PEER_CONN_ABORT)
}

/// Which side of the handshake we were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// What the handshake left for cleanup (daemon tokens), kept opaque here; given the
/// connection as it goes (its mappings may be kept for a later connection).
pub trait Release: Send + Sync {
    fn release(&self, c: &Conn);
}

/// What the socket layer above wants to hear from a connection, registered by it (the epoll
/// emulation, when it makes its first set), as the kernel's socket callbacks
/// (`sk_data_ready`, `sk_state_change`) let the layers above a protocol hear of it. Unset,
/// nobody listens: nothing to tell.
pub struct Hooks {
    /// The readiness changed without a doorbell from the peer (our own `shutdown`, a write
    /// after the peer closed): every fd of the connection.
    pub changed: fn(i32, &Conn),
    /// The same, found by a drain of this fd (the peer gone): the entries of this fd only.
    pub changed_fd: fn(i32, &Conn),
    /// This process wrote on a connection an epoll set parked ([`Conn::epoll_parked`]).
    pub wrote: fn(i32, &Conn),
}

static HOOKS: crate::forklock::ForkOnce<Hooks> = crate::forklock::ForkOnce::new();

/// Registers the socket layer's [`Hooks`] (the first registration stays).
pub fn set_hooks(h: Hooks) {
    let _ = HOOKS.set(h);
}

pub struct Conn {
    own: Arc<Mapping>,
    peer: Arc<Mapping>,
    shared: Arc<Mapping>,
    rx: Ring,
    tx: Ring,
    pub role: Role,
    /// Adaptive spin budget (ns) of this process for this connection.
    spin: Spin,
    release: Option<Box<dyn Release>>,
    /// Informational (for `conns`): the daemon tokens of our DMB and the peer's.
    pub own_token: u64,
    pub peer_token: u64,
    /// An epoll set of this process parked an entry of this connection (its epoll fd and the
    /// entry's fd, packed; 0: none): our next write puts it back on the set's ready list
    /// ([`Hooks::wrote`]).
    pub epoll_parked: AtomicU64,
}

/// Result of a readiness check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// Bytes readable in our ring.
    pub readable: u32,
    /// Room in the peer's ring.
    pub writable: u32,
    /// No more data will come (peer done/closed/gone, or we shut down reading).
    pub rd_eof: bool,
    /// Writing fails (peer closed/gone, or we shut down writing).
    pub wr_closed: bool,
    /// Peer aborted / reset / protocol error.
    pub error: bool,
    /// The peer will never send again and we will never write again.
    pub hup: bool,
    /// Receiving is shut (peer's FIN/close/abort, or our SHUT_RD): TCP's `RCV_SHUTDOWN`.
    pub rcv_shut: bool,
}

impl Conn {
    /// Build a connection over our DMB `own` and the peer's DMB `peer`.
    pub fn new(
        own: impl Into<Arc<Mapping>>,
        peer: impl Into<Arc<Mapping>>,
        state: Option<Arc<Mapping>>,
        role: Role,
        nonblock: bool,
        release: Option<Box<dyn Release>>,
    ) -> std::io::Result<Conn> {
        let (own, peer) = (own.into(), peer.into());
        let rx = Ring::for_dmb(own.len())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        let tx = Ring::for_dmb(peer.len())
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // The state page registered with our DMB, else an anonymous one (that connection
        // cannot move to another process).
        let shared = match state {
            Some(m) if m.len() >= 4096 => m,
            _ => Arc::new(Mapping::anon_shared(4096)?),
        };
        let c = Conn {
            own,
            peer,
            shared,
            rx,
            tx,
            role,
            spin: Spin::new(),
            release,
            own_token: 0,
            peer_token: 0,
            epoll_parked: AtomicU64::new(0),
        };
        let s = c.sh();
        s.magic.store(SHARED_MAGIC, Ordering::Relaxed);
        s.refs.store(1, Ordering::Relaxed);
        s.role
            .store(u32::from(role == Role::Server), Ordering::Relaxed);
        if nonblock {
            s.flags.fetch_or(F_NONBLOCK, Ordering::Relaxed);
        }
        // Type byte of the header we write (without touching the peer's wait bits).
        let tw = c.peer.as_ptr() as *const AtomicU64;
        // SAFETY: the mapping is page aligned and at least 32 bytes.
        unsafe { &*tw }.store(
            u64::from_ne_bytes([0xFE, 0, 0, 0, 0, 0, 0, 0]),
            Ordering::Release,
        );
        Ok(c)
    }

    /// The connection of a socket that moved to this process (`SCM_RIGHTS`, `exec`): its
    /// DMBs and the local state page its first process set up, which the daemon handed over
    /// (`OP_ADOPT`); shared from now on as with a forked child. Nothing is initialised: the
    /// page is live. Refused unless the page carries the state's magic.
    pub fn adopt(
        own: Mapping,
        peer: Mapping,
        state: Mapping,
        release: Option<Box<dyn Release>>,
    ) -> std::io::Result<Conn> {
        let (own, peer, state) = (Arc::new(own), Arc::new(peer), Arc::new(state));
        let bad = || std::io::Error::from_raw_os_error(libc::EINVAL);
        let rx = Ring::for_dmb(own.len()).ok_or_else(bad)?;
        let tx = Ring::for_dmb(peer.len()).ok_or_else(bad)?;
        if state.len() < 4096 {
            return Err(bad());
        }
        let mut c = Conn {
            own,
            peer,
            shared: state,
            rx,
            tx,
            role: Role::Client,
            spin: Spin::new(),
            release,
            own_token: 0,
            peer_token: 0,
            epoll_parked: AtomicU64::new(0),
        };
        let s = c.sh();
        if s.magic.load(Ordering::Acquire) != SHARED_MAGIC {
            return Err(bad());
        }
        if s.role.load(Ordering::Relaxed) == 1 {
            c.role = Role::Server;
        }
        Ok(c)
    }

    /// One more reference travels with the socket to another process (the caller counted it
    /// in `refs`, or the fd's own reference travels, across `exec`).
    pub fn mark_in_flight(&self) {
        self.sh().in_flight.fetch_add(1, Ordering::AcqRel);
    }

    /// Takes a reference that travelled with the socket; false when none is left (the
    /// receiver then adds its own).
    pub fn take_in_flight(&self) -> bool {
        let f = &self.sh().in_flight;
        let mut old = f.load(Ordering::Acquire);
        while old > 0 {
            match f.compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(o) => old = o,
            }
        }
        false
    }

    #[inline]
    pub fn sh(&self) -> &Shared {
        // SAFETY: a private 4 KiB shared mapping holding one Shared (all atomics, zero-valid).
        unsafe { &*(self.shared.as_ptr() as *const Shared) }
    }

    #[inline]
    fn own_hdr(&self) -> &CdcHeader {
        // SAFETY: page-aligned mapping of at least 32 bytes; accessed only atomically.
        unsafe { CdcHeader::from_ptr(self.own.as_ptr()) }
    }

    #[inline]
    fn peer_hdr(&self) -> &CdcHeader {
        // SAFETY: as above.
        unsafe { CdcHeader::from_ptr(self.peer.as_ptr()) }
    }

    #[inline]
    fn own_wait(&self) -> &AtomicU64 {
        // SAFETY: offset 24 of the header, 8-byte aligned.
        unsafe { &*(self.own.as_ptr().add(24) as *const AtomicU64) }
    }

    #[inline]
    fn peer_wait(&self) -> &AtomicU64 {
        // SAFETY: as above.
        unsafe { &*(self.peer.as_ptr().add(24) as *const AtomicU64) }
    }

    pub fn rx_ring_len(&self) -> u32 {
        self.rx.len()
    }

    pub fn tx_ring_len(&self) -> u32 {
        self.tx.len()
    }

    pub fn nonblocking(&self) -> bool {
        self.sh().flags.load(Ordering::Relaxed) & F_NONBLOCK != 0
    }

    pub fn set_nonblocking(&self, on: bool) {
        if on {
            self.sh().flags.fetch_or(F_NONBLOCK, Ordering::Relaxed);
        } else {
            self.sh().flags.fetch_and(!F_NONBLOCK, Ordering::Relaxed);
        }
    }

    fn set_flag(&self, f: u32) -> u32 {
        self.sh().flags.fetch_or(f, Ordering::AcqRel)
    }

    pub fn flags(&self) -> u32 {
        self.sh().flags.load(Ordering::Acquire)
    }

    /// A protocol violation of the peer (or our misreading of it): from now on reads give
    /// `ECONNRESET`, writes `EPIPE`. Logs why, once per connection (`SMC_DEBUG=1`).
    fn protocol_error(&self, why: std::fmt::Arguments<'_>) {
        let old = self.set_flag(F_PROTO);
        if old & F_PROTO == 0 {
            crate::debug!(
                "{}: protocol error, connection reset: {why}",
                self.describe()
            );
        }
    }

    /// One-line identity and cursors of this end, for the debug log.
    pub fn describe(&self) -> String {
        let [cons, cons_pub, peer_prod, prod, peer_cons] = self.cursors();
        let cw = |c: Cursor| format!("{}:{}", c.wrap, c.count);
        format!(
            "conn {:?} own dmb {:#x} peer dmb {:#x} (cons {} published {} peer_prod {} | prod {} \
             peer_cons {}; peer state {:?}; flags {:#x})",
            self.role,
            self.own_token,
            self.peer_token,
            cw(cons),
            cw(cons_pub),
            cw(peer_prod),
            cw(prod),
            cw(peer_cons),
            self.peer_state(),
            self.flags()
        )
    }

    /// The peer's connection-state flags (from the consumer word it writes into our DMB).
    fn peer_state(&self) -> ConnStateFlags {
        self.own_hdr().load_cons().conn_state
    }

    /// Our consumer cursor and the peer's validated producer cursor in our ring, one
    /// consistent snapshot; `None` on a protocol violation.
    ///
    /// Lock-free: readiness checks (poll, epoll, the other direction's waiter) run this while a
    /// reader under `rx_lock` advances the consumer cursor and other threads accept newer
    /// producer cursors. The peer's word is judged against the consumer cursor and the last
    /// accepted producer cursor *of the moment it was read*: both are read before and after it,
    /// and a check that fails while either of them moved is retried, never taken for a
    /// violation. (Judged against a consumer cursor read a moment too early, an honest producer
    /// cursor looked more than a ring ahead and reset the connection: issue 10.) Both words only
    /// move forward, and the peer's producer cursor is based on a consumer cursor we stored
    /// before we published it, so equal values before and after mean the check was exact.
    fn rx_cursors(&self) -> Option<(Cursor, Cursor)> {
        let s = self.sh();
        for _ in 0..SNAPSHOT_TRIES {
            let cons_w = s.cons.load(Ordering::Acquire);
            let last_w = s.peer_prod.load(Ordering::Acquire);
            let new = self.own_hdr().load_prod().cursor;
            let (cons, last) = (unpack(cons_w), unpack(last_w));
            if new == last {
                return Some((cons, new));
            }
            match self.rx.accept_peer_prod(cons, last, new) {
                Ok(c) => {
                    advance(&s.peer_prod, self.rx, last_w, c);
                    return Some((cons, c));
                }
                Err(_)
                    if s.cons.load(Ordering::Acquire) != cons_w
                        || s.peer_prod.load(Ordering::Acquire) != last_w => {}
                Err(e) => {
                    self.protocol_error(format_args!(
                        "peer producer cursor {new:?} rejected ({e}): our consumer cursor \
                         {cons:?}, last accepted producer cursor {last:?}, ring {}",
                        self.rx.len()
                    ));
                    return None;
                }
            }
        }
        // Still moving after all these tries: nothing new this time (the caller looks again).
        let cons = unpack(s.cons.load(Ordering::Acquire));
        Some((cons, unpack(s.peer_prod.load(Ordering::Acquire))))
    }

    /// Our producer cursor and the peer's validated consumer cursor in its ring (our send
    /// ring), one consistent snapshot; `None` on a protocol violation. Lock-free like
    /// [`rx_cursors`](Self::rx_cursors): the writer under `tx_lock` advances the producer
    /// cursor meanwhile, so the peer's word is judged against the producer cursor and last
    /// accepted consumer cursor of the moment it was read.
    fn tx_cursors(&self) -> Option<(Cursor, Cursor)> {
        let s = self.sh();
        for _ in 0..SNAPSHOT_TRIES {
            let prod_w = s.prod.load(Ordering::Acquire);
            let last_w = s.peer_cons.load(Ordering::Acquire);
            let new = self.own_hdr().load_cons().cursor;
            let (prod, last) = (unpack(prod_w), unpack(last_w));
            if new == last {
                return Some((prod, new));
            }
            match self.tx.accept_peer_cons(prod, last, new) {
                Ok(c) => {
                    advance(&s.peer_cons, self.tx, last_w, c);
                    return Some((prod, c));
                }
                Err(_)
                    if s.prod.load(Ordering::Acquire) != prod_w
                        || s.peer_cons.load(Ordering::Acquire) != last_w => {}
                Err(e) => {
                    self.protocol_error(format_args!(
                        "peer consumer cursor {new:?} rejected ({e}): our producer cursor \
                         {prod:?}, last accepted consumer cursor {last:?}, ring {}",
                        self.tx.len()
                    ));
                    return None;
                }
            }
        }
        let prod = unpack(s.prod.load(Ordering::Acquire));
        Some((prod, unpack(s.peer_cons.load(Ordering::Acquire))))
    }

    /// Readable bytes (0 on protocol error).
    fn avail(&self) -> u32 {
        match self.rx_cursors() {
            Some((cons, p)) => self.rx.readable(cons, p).unwrap_or(0),
            None => 0,
        }
    }

    /// Room in the peer's ring.
    fn room(&self) -> u32 {
        match self.tx_cursors() {
            Some((prod, c)) => self.tx.free_space(prod, c).unwrap_or(0),
            None => 0,
        }
    }

    /// The whole readiness picture, without locks or syscalls.
    pub fn readiness(&self) -> Readiness {
        let f = self.flags();
        if f & (F_PEER_SWITCH | F_SWITCHED) != 0 {
            // Continues on TCP: the caller's next read or write switches and asks the socket.
            return Readiness {
                readable: 1,
                writable: 1,
                ..Readiness::default()
            };
        }
        // Flags before cursors: a peer sets closed after its last producer update.
        let ps = self.peer_state();
        let readable = self.avail();
        let f2 = self.flags();
        let f = f | f2;
        let peer_done = ps.any_close_or_done() || f & (F_PEER_GONE | F_PEER_RST) != 0;
        // A TCP reset after the peer said it closed gracefully is only the doorbell channel
        // going away (e.g. a doorbell still unread when it closed): not an error.
        let graceful = ps.any_close_or_done() && !ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        let error = ps.contains(ConnStateFlags::PEER_CONN_ABORT)
            || f & F_PROTO != 0
            || (f & F_PEER_RST != 0 && !graceful);
        let rd_eof = peer_done || f & (F_SHUT_RD | F_PROTO) != 0;
        let wr_closed = f & (F_SHUT_WR | F_PEER_GONE | F_PEER_RST | F_PROTO) != 0 || ps.any_close();
        let writable = if wr_closed { 0 } else { self.room() };
        // As tcp_poll: HUP only when both directions are shut (a reset shuts both); a peer's
        // FIN or graceful close alone is RDHUP, never HUP.
        let reset = error || f & F_WROTE_AFTER_CLOSE != 0;
        let rcv_shut = peer_done || f & (F_SHUT_RD | F_PROTO) != 0;
        let hup = rcv_shut && (f & F_SHUT_WR != 0 || reset);
        Readiness {
            readable,
            writable,
            rd_eof,
            wr_closed,
            error: (error && f & F_RST_REPORTED == 0)
                || f & (F_WROTE_AFTER_CLOSE | F_EPIPE_REPORTED) == F_WROTE_AFTER_CLOSE,
            hup,
            rcv_shut,
        }
    }

    /// Publish our consumer cursor into the peer's header (keeping the flags there).
    fn publish_cons(&self, c: Cursor) {
        let w = self.peer_hdr().cons_atomic();
        let mut old = w.load(Ordering::Relaxed);
        loop {
            let mut cw = CursorWord::from_u64(old);
            cw.cursor = c;
            match w.compare_exchange_weak(old, cw.to_u64(), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(o) => old = o,
            }
        }
        self.sh().cons_pub.store(pack(c), Ordering::Release);
    }

    fn update_peer_flags(&self, set_p: u8, clr_p: u8, set_s: u8) {
        let w = self.peer_hdr().cons_atomic();
        let mut old = w.load(Ordering::Relaxed);
        loop {
            let mut cw = CursorWord::from_u64(old);
            cw.prod_flags = ProdFlags((cw.prod_flags.0 | set_p) & !clr_p);
            cw.conn_state = ConnStateFlags(cw.conn_state.0 | set_s);
            let new = cw.to_u64();
            if new == old {
                return;
            }
            match w.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(o) => old = o,
            }
        }
    }

    /// Send a doorbell byte (non-blocking, no SIGPIPE).
    pub fn ring_doorbell(&self, fd: i32) {
        let s = self.sh();
        // Dekker with the switch to TCP: either it sees us here and waits, or we see its flag
        // and stay silent (no doorbell may follow its marker on the stream).
        s.bells.fetch_add(1, Ordering::SeqCst);
        if s.flags.load(Ordering::SeqCst) & (F_SWITCHING | F_SWITCHED) == 0 {
            self.ring_doorbell_now(fd);
        }
        s.bells.fetch_sub(1, Ordering::SeqCst);
    }

    fn ring_doorbell_now(&self, fd: i32) {
        let b = [DOORBELL];
        // SAFETY: valid buffer.
        let r = unsafe {
            real::send(
                fd,
                b.as_ptr() as *const libc::c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r == 1 {
            self.sh().doorbells_sent.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Consume doorbell bytes waiting on the TCP socket; note EOF / reset. Waiters asleep on
    /// the futex are woken (the ring state may have changed). Only [`Conn::try_drain`] (and the
    /// last close) call it: a drain behind the back of a thread asleep on the socket would
    /// take its wakeup.
    fn drain(&self, fd: i32) {
        self.drain_to(fd, false);
    }

    /// [`Conn::drain`]; `to_end`: read until the socket says `EAGAIN`, EOF or an error even
    /// after a short read (an EOF behind the doorbells is noticed now).
    fn drain_to(&self, fd: i32, to_end: bool) {
        self.drain_bytes(fd, to_end);
        let s = self.sh();
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        if s.waiters.load(Ordering::Acquire) > 0 {
            crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        }
    }

    fn drain_bytes(&self, fd: i32, to_end: bool) {
        let mut buf = [0u8; 256];
        loop {
            // After the peer's switch marker the stream is data: never drained.
            if self.flags() & (F_SWITCHING | F_PEER_SWITCH | F_SWITCHED) != 0 {
                return;
            }
            let e0 = real::errno();
            // SAFETY: valid buffer.
            let r = unsafe {
                real::recv(
                    fd,
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                let n = r as usize;
                self.sh()
                    .doorbells_rcvd
                    .fetch_add(n as u64, Ordering::Relaxed);
                if let Some(i) = buf[..n].iter().position(|&b| b == SWITCH_TCP) {
                    if buf[..i].iter().all(|&b| b == DOORBELL) && i + 1 == n {
                        // The peer switches to TCP: nothing follows its marker until we
                        // answered with ours (our next operation does, `switch_to_tcp`).
                        self.set_flag(F_PEER_SWITCH);
                        crate::debug!("fd {fd}: the peer switches the connection to TCP");
                        if let Some(h) = HOOKS.get() {
                            (h.changed_fd)(fd, self);
                        }
                        real::set_errno(e0);
                        return;
                    }
                }
                if buf[..n].iter().any(|&b| b != DOORBELL) {
                    // Anything but a doorbell (e.g. a late CLC Decline) on an established SMC
                    // connection: we cannot honour it, abort rather than deliver wrong bytes.
                    self.protocol_error(format_args!(
                        "fd {fd}: {n} bytes on the doorbell channel that are not doorbells \
                         (first {:#04x})",
                        buf[..n]
                            .iter()
                            .find(|&&b| b != DOORBELL)
                            .copied()
                            .unwrap_or(0)
                    ));
                }
                if n < buf.len() && !to_end {
                    real::set_errno(e0);
                    return;
                }
                continue;
            }
            let e = real::errno();
            real::set_errno(e0);
            if r == 0 {
                self.peer_gone(fd, 0, "EOF on the TCP socket");
            } else if e == libc::EAGAIN || e == libc::EINTR {
                // nothing more
            } else if e == libc::ECONNRESET || e == libc::EPIPE || e == libc::ETIMEDOUT {
                self.peer_gone(fd, F_PEER_RST, "error on the TCP socket");
                crate::debug!("fd {fd}: the TCP socket said errno {e}");
            } else if self.flags() & F_REAL_SHUT == 0 {
                self.peer_gone(fd, 0, "error on the TCP socket");
                crate::debug!("fd {fd}: the TCP socket said errno {e}");
            }
            return;
        }
    }

    /// Register as a sleeper on the TCP socket (the doorbell channel), before the last
    /// recheck of the rings that precedes the real `poll`/`epoll_wait`. Several threads may
    /// sleep on the socket at once (full duplex: one waits for data, one for room; or several
    /// poll/epoll waiters) and one doorbell wakes them all, but the kernel re-checks the
    /// socket before it returns: a doorbell drained by one of them before another looked would
    /// be lost to that one. So doorbells are drained only when no sleeper is left
    /// ([`Conn::try_drain`]): the last one out drains. A drain that runs while a thread
    /// registers makes the newcomer wait for its end, so that its recheck comes after every
    /// doorbell the drain takes (whose ring changes came before them).
    pub fn sleep_enter(&self) {
        let s = self.sh();
        if s.ksleep.fetch_add(1, Ordering::SeqCst) & DRAINING != 0 {
            let start = Instant::now();
            let mut i = 0u32;
            // A drain is one non-blocking recv; bounded in case its thread died in it.
            while s.ksleep.load(Ordering::SeqCst) & DRAINING != 0 {
                if start.elapsed() >= Duration::from_millis(SETTLE_MAX_MS) {
                    s.ksleep.fetch_and(!DRAINING, Ordering::SeqCst);
                    break;
                }
                i += 1;
                spin_pause(i);
            }
        }
    }

    /// Unregister after the sleep; `rang`: the kernel reported the socket readable. Drains the
    /// doorbells when no other sleeper is left; true when they were left to the others — the
    /// caller must then not sleep on the socket again before [`Conn::settled`] (it would
    /// return at once).
    #[must_use]
    pub fn sleep_leave(&self, fd: i32, rang: bool) -> bool {
        let s = self.sh();
        // Never below zero (the count of a sleeper that died is healed by a forced drain).
        let _ = s
            .ksleep
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                (v & !DRAINING != 0).then(|| v - 1)
            });
        rang && !self.try_drain(fd)
    }

    /// Drain the doorbells if no thread sleeps on the socket (they were all woken and left).
    /// Whether it did.
    pub fn try_drain(&self, fd: i32) -> bool {
        self.try_drain_to(fd, false)
    }

    /// [`Conn::try_drain`]; `to_end`: as [`Conn::drain_to`].
    pub fn try_drain_to(&self, fd: i32, to_end: bool) -> bool {
        let s = self.sh();
        if s.ksleep
            .compare_exchange(0, DRAINING, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.drain_to(fd, to_end);
        s.ksleep.fetch_and(!DRAINING, Ordering::SeqCst);
        true
    }

    /// Whether doorbells left to other sleepers ([`Conn::sleep_leave`] said true; `seq` is
    /// the `wake_seq` read after that) are gone: someone drained (or the socket holds no
    /// doorbell any more), or nobody sleeps on the socket now and we drained them.
    pub fn settled(&self, fd: i32, seq: u32) -> bool {
        self.sh().wake_seq.load(Ordering::Acquire) != seq
            || !self.doorbells_queued(fd)
            || self.try_drain(fd)
    }

    /// The `wake_seq` to pass to [`Conn::settled`].
    pub fn wake_seq(&self) -> u32 {
        self.sh().wake_seq.load(Ordering::Acquire)
    }

    /// Sleep (futex) until [`Conn::settled`], at most `max_ms`; true when settled.
    pub fn await_settled(&self, fd: i32, seq: u32, max_ms: u64) -> bool {
        let s = self.sh();
        if self.settled(fd, seq) {
            return true;
        }
        s.waiters.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wait(&s.wake_seq, seq, max_ms);
        s.waiters.fetch_sub(1, Ordering::AcqRel);
        self.settled(fd, seq)
    }

    /// The other sleepers did not take the doorbells they were woken by within
    /// [`SETTLE_MAX_MS`]: one of them does not run (stopped, or killed while asleep, which
    /// leaves its count behind). Drain anyway, and heal one stale count.
    pub fn force_drain(&self, fd: i32) {
        let s = self.sh();
        // A DRAINING bit set for that long was left by a drainer that died: taken over.
        let v = s.ksleep.fetch_or(DRAINING, Ordering::SeqCst);
        crate::debug!(
            "fd {fd}: doorbells drained after {SETTLE_MAX_MS} ms with {} sleepers",
            v & !DRAINING
        );
        self.drain(fd);
        let _ = s
            .ksleep
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                let n = if v & !DRAINING != 0 { v - 1 } else { v };
                Some(n & !DRAINING)
            });
    }

    /// Full wait for [`Conn::settled`] of a thread that can sleep on nothing else.
    fn settle(&self, fd: i32, seq: u32) {
        if !self.await_settled(fd, seq, SETTLE_MAX_MS) {
            self.force_drain(fd);
        }
    }

    /// Whether doorbell bytes are queued on the socket (EOF and errors count as no: they are
    /// not consumed by a drain).
    fn doorbells_queued(&self, fd: i32) -> bool {
        let mut b = [0u8; 1];
        let e0 = real::errno();
        // SAFETY: valid buffer.
        let r = unsafe {
            real::recv(
                fd,
                b.as_mut_ptr() as *mut libc::c_void,
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        real::set_errno(e0);
        r > 0
    }

    /// The TCP socket (the doorbell channel) reached EOF or an error: the peer is gone.
    /// Logged once, with whether the peer had said goodbye in its CDC header.
    fn peer_gone(&self, fd: i32, extra: u32, what: &str) {
        let old = self.set_flag(F_PEER_GONE | extra);
        if old & (F_PEER_GONE | extra) != F_PEER_GONE | extra {
            let ps = self.peer_state();
            if !ps.any_close_or_done() || ps.contains(ConnStateFlags::PEER_CONN_ABORT) || extra != 0
            {
                crate::debug!(
                    "fd {fd}: {what}{}: {}",
                    if ps.any_close_or_done() {
                        ""
                    } else {
                        " before the peer closed or shut down in the CDC header"
                    },
                    self.describe()
                );
            }
            // What the connection reports changed without a doorbell: an epoll set of ours
            // that parked it (its registration is edge-triggered, and the EOF or reset may have
            // been drained here, by another waiter) checks it again.
            if let Some(h) = HOOKS.get() {
                (h.changed_fd)(fd, self);
            }
        }
    }

    /// After consuming: publish the consumer cursor if the 10% rule says so, the ring is
    /// drained, or the writer waits; ring the doorbell if it was waiting.
    fn after_consume(&self, fd: i32, cons: Cursor, ring_empty: bool) {
        let s = self.sh();
        let published = unpack(s.cons_pub.load(Ordering::Acquire));
        let peer_flags = self.own_hdr().load_cons().prod_flags;
        let writer_waits = self.own_wait().load(Ordering::Relaxed) & WAIT_SPACE != 0;
        if cons != published
            && (ring_empty || writer_waits || self.rx.need_cons_update(published, cons, peer_flags))
        {
            self.publish_cons(cons);
        }
        fence(Ordering::SeqCst);
        if self.own_wait().load(Ordering::Relaxed) & WAIT_SPACE != 0 {
            if unpack(s.cons_pub.load(Ordering::Acquire)) != cons {
                self.publish_cons(cons);
            }
            if self.own_wait().fetch_and(!WAIT_SPACE, Ordering::SeqCst) & WAIT_SPACE != 0 {
                self.ring_doorbell(fd);
            }
        }
    }

    /// After producing: wake the reader if it sleeps.
    fn after_produce(&self, fd: i32) {
        fence(Ordering::SeqCst);
        if self.peer_wait().load(Ordering::Relaxed) & WAIT_DATA != 0
            && self.peer_wait().fetch_and(!WAIT_DATA, Ordering::SeqCst) & WAIT_DATA != 0
        {
            self.ring_doorbell(fd);
        }
    }

    /// Takes the socket's `SO_RCVLOWAT` as the kernel holds it (after it clamped the value):
    /// poll/select/epoll report `IN` from that many bytes on, and a blocking read waits for
    /// that many (or the bytes asked for, when fewer), as `tcp_poll` and `tcp_recvmsg` do.
    pub fn set_rcvlowat(&self, fd: i32) {
        let mut v: libc::c_int = 1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let e0 = real::errno();
        // SAFETY: valid out-pointers of the right size.
        let r = unsafe {
            real::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVLOWAT,
                &mut v as *mut libc::c_int as *mut libc::c_void,
                &mut len,
            )
        };
        real::set_errno(e0);
        let v = if r == 0 { v.max(1) as u32 } else { 1 };
        self.sh().rcvlowat.store(v, Ordering::Relaxed);
    }

    /// The bytes that make the connection readable: `SO_RCVLOWAT`, at most a full ring (the
    /// peer cannot send more before we read; TCP caps it at half its largest buffer).
    pub fn rcvlowat(&self) -> u32 {
        self.sh()
            .rcvlowat
            .load(Ordering::Relaxed)
            .clamp(1, self.rx.len().max(1))
    }

    /// Bytes readable now (FIONREAD / SIOCINQ).
    pub fn inq(&self) -> u32 {
        self.avail()
    }

    /// recv/read/recvmsg. `nonblock` is the call's own MSG_DONTWAIT; the fd's O_NONBLOCK is
    /// known here.
    pub fn recv(&self, fd: i32, iov: &[libc::iovec], flags: i32) -> Result<usize, Errno> {
        if flags & libc::MSG_OOB != 0 {
            return Err(libc::EINVAL);
        }
        let peek = flags & libc::MSG_PEEK != 0;
        let trunc = flags & libc::MSG_TRUNC != 0;
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let mut cur = IovCursor::new(iov);
        let want = cur.remaining();
        let waitall = flags & libc::MSG_WAITALL != 0 && !nonblock;
        // MSG_PEEK|MSG_WAITALL waits for `want` bytes, but never for more than the ring holds:
        // the peer cannot send more until we read (TCP's autotuned buffer would hold them;
        // waiting for them here hung forever, issue 10).
        let peek_all = want.min(self.rx.len() as usize);
        // SO_RCVLOWAT: a blocking read returns once this many bytes were read (tcp_recvmsg's
        // target: the low-water mark or the bytes asked for, whichever is less; all of them
        // with MSG_WAITALL). A non-blocking one returns what is there.
        let target = if nonblock {
            1
        } else if waitall {
            want
        } else {
            (self.rcvlowat() as usize).min(want)
        };
        // What a MSG_PEEK must find before it returns (it cannot read on to wait for more).
        let peek_need = if waitall {
            peek_all
        } else {
            target.min(self.rx.len() as usize)
        };
        let s = self.sh();
        s.rx_calls.fetch_add(1, Ordering::Relaxed);
        if want == 0 {
            return Ok(0);
        }
        let mut done = 0usize;
        // SO_RCVTIMEO is only looked up once we have to sleep.
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            if self.flags() & (F_PEER_SWITCH | F_SWITCHED) != 0 {
                return if done > 0 { Ok(done) } else { Err(E_TCP) };
            }
            {
                let _g = s.rx_lock.lock();
                if self.flags() & (F_PEER_SWITCH | F_SWITCHED) != 0 {
                    // Switched while we waited for the lock: the ring's bytes come over TCP.
                    continue;
                }
                // Under rx_lock our consumer cursor stands still.
                let (cons, avail) = match self.rx_cursors() {
                    Some((c, p)) => (c, self.rx.readable(c, p).unwrap_or(0)),
                    None => (unpack(s.cons.load(Ordering::Acquire)), 0),
                };
                if avail > 0 && !(peek && (avail as usize) < peek_need && !self.readiness().rd_eof)
                {
                    if peek {
                        let n = (avail as usize).min(want);
                        if !trunc {
                            self.copy_out(cons, n, &mut cur);
                        }
                        return Ok(n);
                    }
                    let n = (avail as usize).min(want - done);
                    if !trunc {
                        self.copy_out(cons, n, &mut cur);
                    }
                    let nc = self.rx.add(cons, n as u32);
                    s.cons.store(pack(nc), Ordering::Release);
                    s.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    if avail as usize == self.rx.len() as usize {
                        s.rx_full.fetch_add(1, Ordering::Relaxed);
                    }
                    self.after_consume(fd, nc, n as u32 == avail);
                    done += n;
                    if done >= target {
                        return Ok(done);
                    }
                    continue;
                }
            }
            // Nothing (more) to read.
            let r = self.readiness();
            if r.readable > 0 && !(peek && (r.readable as usize) < peek_need) {
                continue;
            }
            if r.error && r.readable == 0 {
                if done > 0 {
                    return Ok(done);
                }
                if self.flags() & F_WROTE_AFTER_CLOSE != 0
                    && self.set_flag(F_EPIPE_REPORTED) & F_EPIPE_REPORTED == 0
                {
                    return Err(libc::EPIPE);
                }
                let old = self.set_flag(F_RST_REPORTED);
                if old & F_RST_REPORTED == 0 {
                    crate::debug!("fd {fd}: read gives ECONNRESET: {}", self.describe());
                }
                return Err(libc::ECONNRESET);
            }
            if r.rd_eof {
                if peek && r.readable > 0 {
                    continue;
                }
                return Ok(done);
            }
            if nonblock {
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            let need = if peek { peek_need as u32 } else { 1 };
            let dl = *deadline
                .get_or_insert_with(|| deadline_of(self.sock_timeout(fd, libc::SO_RCVTIMEO)));
            match self.wait(fd, true, need, dl) {
                Woke::Ready => {}
                Woke::Timeout => {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    };
                }
                Woke::Intr => {
                    return if done > 0 { Ok(done) } else { Err(libc::EINTR) };
                }
            }
        }
    }

    fn copy_out(&self, cons: Cursor, n: usize, cur: &mut IovCursor<'_>) {
        // SAFETY: `own` is our mapped DMB, longer than its CDC header (`Ring::for_dmb` accepted its
        // length), so the ring starts inside the mapping.
        let base = unsafe { self.own.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        for (off, len) in self.rx.segments(cons, n as u32) {
            if len > 0 {
                // SAFETY: segments are inside the ring; the iovecs are the caller's buffers.
                unsafe { cur.fill_from(base.add(off), len) };
            }
        }
    }

    /// send/write/sendmsg. Returns bytes written; raises SIGPIPE itself unless MSG_NOSIGNAL.
    pub fn send(&self, fd: i32, iov: &[libc::iovec], flags: i32) -> Result<usize, Errno> {
        if flags & libc::MSG_OOB != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let mut cur = IovCursor::new(iov);
        let want = cur.remaining();
        let s = self.sh();
        s.tx_calls.fetch_add(1, Ordering::Relaxed);
        let mut done = 0usize;
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let r0 = self.write_state(done == 0);
            if r0 == Some(0) {
                if want == 0 {
                    return Ok(0);
                }
                if done > 0 {
                    return Ok(done);
                }
                if self.set_flag(F_WROTE_AFTER_CLOSE) & F_WROTE_AFTER_CLOSE == 0 {
                    // EPOLLERR | EPOLLHUP from now on, as TCP's reset would say.
                    if let Some(h) = HOOKS.get() {
                        (h.changed)(fd, self);
                    }
                }
                return Ok(want);
            }
            if let Some(e) = r0 {
                if done > 0 {
                    return Ok(done);
                }
                if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    raise_sigpipe();
                }
                return Err(e);
            }
            if want == 0 {
                return Ok(0);
            }
            {
                let _g = s.tx_lock.lock();
                if self.flags() & (F_PEER_SWITCH | F_SWITCHED) != 0 {
                    continue;
                }
                // Under tx_lock our producer cursor stands still.
                let (prod, room) = match self.tx_cursors() {
                    Some((p, c)) => (p, self.tx.free_space(p, c).unwrap_or(0)),
                    None => (unpack(s.prod.load(Ordering::Acquire)), 0),
                };
                let n = (room as usize).min(want - done);
                if n > 0 {
                    // SAFETY: `peer` is the peer's mapped DMB, longer than its CDC header
                    // (`Ring::for_dmb` accepted its length), so the ring starts inside the mapping.
                    let base = unsafe { self.peer.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
                    for (off, len) in self.tx.segments(prod, n as u32) {
                        if len > 0 {
                            // SAFETY: segments are inside the peer's ring.
                            unsafe { cur.drain_to(base.add(off), len) };
                        }
                    }
                    let np = self.tx.add(prod, n as u32);
                    s.prod.store(pack(np), Ordering::Release);
                    self.peer_hdr().store_prod(CursorWord::from_cursor(np));
                    s.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    done += n;
                }
            }
            if done > 0 {
                self.after_produce(fd);
                if self.epoll_parked.load(Ordering::Relaxed) != 0 {
                    if let Some(h) = HOOKS.get() {
                        (h.wrote)(fd, self);
                    }
                }
            }
            if done == want {
                return Ok(done);
            }
            s.tx_full.fetch_add(1, Ordering::Relaxed);
            if nonblock {
                // The ring is full: ask the peer to ring when it makes room, then look again
                // (Dekker with its consume). An epoll set may have parked this connection, and
                // an edge-triggered application waits for that room after a short write or
                // EAGAIN without any further call that would arm it.
                self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if self.room() > 0 && self.write_state(false).is_none() {
                    continue;
                }
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            let dl = *deadline
                .get_or_insert_with(|| deadline_of(self.sock_timeout(fd, libc::SO_SNDTIMEO)));
            match self.wait(fd, false, 1, dl) {
                Woke::Ready => {}
                Woke::Timeout => {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    };
                }
                Woke::Intr => {
                    return if done > 0 { Ok(done) } else { Err(libc::EINTR) };
                }
            }
        }
    }

    /// `getsockopt(SO_ERROR)`: the error pending on this end (a reset by the peer, or the
    /// `EPIPE` a write after the peer's close left), reported once as TCP reports `sk_err`:
    /// taken, the next read or write does not report it again. 0 if none.
    pub fn take_so_error(&self) -> Errno {
        if !self.readiness().error {
            return 0;
        }
        if self.flags() & F_WROTE_AFTER_CLOSE != 0
            && self.set_flag(F_EPIPE_REPORTED) & F_EPIPE_REPORTED == 0
        {
            return libc::EPIPE;
        }
        if self.set_flag(F_RST_REPORTED) & F_RST_REPORTED == 0 {
            crate::debug!("SO_ERROR gives ECONNRESET: {}", self.describe());
            return libc::ECONNRESET;
        }
        0
    }

    /// `Some(errno)` if writing is impossible. `report`: the call returns that error (it wrote
    /// nothing yet), so a pending reset or broken pipe counts as reported; a call that already
    /// wrote part of its buffer returns that count and leaves the report to the next call, as
    /// TCP leaves `sk_err` pending across a partial `sendmsg`.
    fn write_state(&self, report: bool) -> Option<Errno> {
        let f = self.flags();
        if f & (F_PEER_SWITCH | F_SWITCHED) != 0 {
            return Some(E_TCP);
        }
        if f & F_SHUT_WR != 0 {
            return Some(libc::EPIPE);
        }
        let ps = self.peer_state();
        let graceful = ps.any_close_or_done() && !ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        if f & F_PROTO != 0
            || (f & F_PEER_RST != 0 && !graceful)
            || ps.contains(ConnStateFlags::PEER_CONN_ABORT)
        {
            if !report {
                return Some(libc::ECONNRESET);
            }
            if self.set_flag(F_RST_REPORTED) & F_RST_REPORTED == 0 {
                crate::debug!("write gives ECONNRESET: {}", self.describe());
                return Some(libc::ECONNRESET);
            }
            return Some(libc::EPIPE);
        }
        if ps.any_close() || f & F_PEER_GONE != 0 {
            if f & F_WROTE_AFTER_CLOSE == 0 {
                // TCP takes the first write after the peer's close (the peer answers with a
                // reset): it succeeds, the bytes go nowhere.
                return Some(0);
            }
            if report {
                self.set_flag(F_EPIPE_REPORTED);
            }
            return Some(libc::EPIPE);
        }
        None
    }

    /// SO_RCVTIMEO / SO_SNDTIMEO of the socket in ms (-1: none).
    fn sock_timeout(&self, fd: i32, opt: i32) -> i64 {
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        let e0 = real::errno();
        // SAFETY: valid out pointers.
        let r = unsafe {
            real::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &mut tv as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        real::set_errno(e0);
        if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
            -1
        } else {
            tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000
        }
    }

    /// Condition for a waiter: data (at least `need` bytes, or EOF) or room.
    fn ready_for(&self, data: bool, need: u32) -> bool {
        let r = self.readiness();
        if data {
            r.readable >= need || r.rd_eof || r.error
        } else {
            r.writable > 0 || r.wr_closed || r.error
        }
    }

    /// Block until data (`data`) or room is there, the deadline passes, or a signal arrives.
    /// Spins adaptively first, then announces itself with the wait bit and sleeps in `poll` on
    /// the TCP socket, where the peer's doorbell lands.
    pub fn wait(&self, fd: i32, data: bool, need: u32, deadline: Option<Instant>) -> Woke {
        let s = self.sh();
        // Spin first when waiting for data: a peer that answers within the budget costs no
        // syscall on either side (request/response). A writer that filled the ring does not
        // spin (SMC_SPIN_ROOM_US, default 0): the reader has a whole ring to copy, and on a
        // small machine the spinning writer takes the CPU the reader needs (docs/PERF.md).
        let budget = if data {
            self.spin.budget()
        } else {
            tune().spin_room_ns
        };
        if budget > 0 {
            let start = Instant::now();
            let mut i = 0u32;
            loop {
                if self.ready_for(data, need) {
                    s.spin_hits.fetch_add(1, Ordering::Relaxed);
                    if data {
                        self.spin.record(true);
                    }
                    return Woke::Ready;
                }
                i += 1;
                if i & 31 == 0 && start.elapsed().as_nanos() as u64 >= budget {
                    break;
                }
                spin_pause(i);
            }
            if data {
                self.spin.record(false);
            }
        }
        loop {
            // Announce, then recheck (the other side swaps the bit after changing the ring).
            if data {
                self.own_wait().fetch_or(WAIT_DATA, Ordering::SeqCst);
            } else {
                self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
                self.update_peer_flags(ProdFlags::WRITE_BLOCKED.0, 0, 0);
            }
            fence(Ordering::SeqCst);
            if self.ready_for(data, need) {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Ready;
            }
            // Pre-sleep duty: the writer into our ring may wait for a cursor we have not
            // published yet.
            if let Some(_g) = s.rx_lock.try_lock() {
                let cons = unpack(s.cons.load(Ordering::Acquire));
                self.after_consume(fd, cons, true);
            }
            let mut timeout = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        if !data {
                            self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                        }
                        return Woke::Timeout;
                    }
                    (d - now).as_millis().min(i32::MAX as u128) as i32 + 1
                }
            };
            if self.flags() & (F_PEER_GONE | F_REAL_SHUT) != 0 {
                // The TCP socket is at EOF and always readable: sleep instead of spinning.
                timeout = if timeout < 0 { 1 } else { timeout.min(1) };
                std::thread::sleep(Duration::from_millis(timeout as u64));
                continue;
            }
            // One poller per connection end sleeps on the TCP socket (and drains the
            // doorbells); every other waiter (thread or process) sleeps on a futex that the
            // poller bumps after each wakeup, so no doorbell is consumed behind a sleeper's back.
            let seq = s.wake_seq.load(Ordering::Acquire);
            if s.poller
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                s.waiters.fetch_add(1, Ordering::AcqRel);
                if !self.ready_for(data, need) {
                    let t = if timeout < 0 { 500 } else { timeout.min(500) };
                    crate::shm::futex_wait(&s.wake_seq, seq, t as u64);
                }
                s.waiters.fetch_sub(1, Ordering::AcqRel);
                if self.ready_for(data, need) {
                    if !data {
                        self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                    }
                    return Woke::Ready;
                }
                continue;
            }
            // A safety net: a lost wakeup (there should be none) costs at most half a second.
            timeout = if timeout < 0 { 500 } else { timeout.min(500) };
            // Idle: after a short first sleep, give the send ring's pages back.
            let reclaim = data && self.reclaim_due();
            if reclaim {
                timeout = timeout.min(RECLAIM_IDLE_MS);
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // Other threads (the application's poll/epoll) may sleep on the socket too: the
            // last one to leave drains the doorbells (see `sleep_enter`).
            self.sleep_enter();
            let slept = !self.ready_for(data, need);
            let (r, e) = if !slept {
                (0, 0)
            } else {
                s.sleeps.fetch_add(1, Ordering::Relaxed);
                let e0 = real::errno();
                crate::signals::wait_begins();
                // SAFETY: one valid pollfd.
                let r = unsafe { real::poll(&mut pfd, 1, timeout) };
                let e = real::errno();
                real::set_errno(e0);
                (r, e)
            };
            let left = self.sleep_leave(fd, r > 0);
            if slept && r == 0 && reclaim {
                self.reclaim_tx();
            }
            s.poller.store(0, Ordering::Release);
            s.wake_seq.fetch_add(1, Ordering::AcqRel);
            if s.waiters.load(Ordering::Acquire) > 0 {
                crate::shm::futex_wake(&s.wake_seq, i32::MAX);
            }
            // EINTR as TCP says it: when the signal's handler has no SA_RESTART, and always on a
            // socket with a timeout (`deadline`: SO_RCVTIMEO/SO_SNDTIMEO), which the kernel
            // never restarts (sock_intr_errno, signal(7)).
            if r < 0 && e == libc::EINTR && (crate::signals::interrupted() || deadline.is_some()) {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Intr;
            }
            if left && !self.ready_for(data, need) {
                // The doorbells are the other sleepers' to drain: sleeping on the socket now
                // would return at once.
                self.settle(fd, s.wake_seq.load(Ordering::Acquire));
            }
            if self.ready_for(data, need) {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Ready;
            }
        }
    }

    /// Whether our producer cursor moved by at least a page since the last
    /// [`Conn::reclaim_tx`] (so that there may be pages to give back).
    pub fn reclaim_due(&self) -> bool {
        let s = self.sh();
        let prod = unpack(s.prod.load(Ordering::Relaxed));
        let last = unpack(s.tx_reclaimed.load(Ordering::Relaxed));
        self.tx
            .diff(last, prod)
            .map_or(true, |d| d as usize >= PAGE)
    }

    /// Give back the pages of the send ring (the peer's DMB) that hold no data: the free space
    /// from `RECLAIM_WARM` after our producer cursor up to the peer's published consumer
    /// cursor, page by page (`MADV_REMOVE` on the shared mapping punches a hole in the memfd;
    /// those pages read as zeros and cost nothing until written again). Race-free: the peer
    /// only reads between its consumer cursor and our producer cursor, and we hold the writer
    /// lock, so nobody writes there meanwhile. Skipped when a writer of ours is busy.
    /// Returns the bytes given back.
    pub fn reclaim_tx(&self) -> usize {
        let s = self.sh();
        let Some(_g) = s.tx_lock.try_lock() else {
            return 0;
        };
        // Under the writer lock the producer cursor stands still.
        let Some((prod, cons)) = self.tx_cursors() else {
            return 0;
        };
        s.tx_reclaimed.store(pack(prod), Ordering::Relaxed);
        let free = self.tx.free_space(prod, cons).unwrap_or(0);
        if free <= RECLAIM_WARM {
            return 0;
        }
        let start = self.tx.add(prod, RECLAIM_WARM);
        let mut done = 0;
        for (off, len) in self.tx.segments(start, free - RECLAIM_WARM) {
            let a = (smc_common::cdc::CDC_HEADER_LEN + off).next_multiple_of(PAGE);
            let b = (smc_common::cdc::CDC_HEADER_LEN + off + len) / PAGE * PAGE;
            if len == 0 || b <= a || b > self.peer.len() {
                continue;
            }
            // SAFETY: [a, b) is page aligned inside our mapping of the peer's DMB, past the
            // header page; it holds no data (see above).
            let r = unsafe {
                libc::madvise(
                    self.peer.as_ptr().add(a) as *mut libc::c_void,
                    b - a,
                    libc::MADV_REMOVE,
                )
            };
            if r == 0 {
                done += b - a;
            }
        }
        s.tx_reclaimed_bytes
            .fetch_add(done as u64, Ordering::Relaxed);
        done
    }

    /// Announce that this process is about to sleep in poll/epoll waiting for data
    /// (`data`) and/or room (`space`), so the peer rings the doorbell. The caller rechecks
    /// readiness afterwards.
    pub fn arm(&self, fd: i32, data: bool, space: bool) {
        if data {
            self.own_wait().fetch_or(WAIT_DATA, Ordering::SeqCst);
        }
        if space && self.room() == 0 {
            self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        if let Some(_g) = self.sh().rx_lock.try_lock() {
            let cons = unpack(self.sh().cons.load(Ordering::Acquire));
            self.after_consume(fd, cons, true);
        }
        if data {
            let s = self.sh();
            let prod = unpack(s.prod.load(Ordering::Relaxed));
            let last = unpack(s.tx_reclaimed.load(Ordering::Relaxed));
            let drained = unpack(s.peer_cons.load(Ordering::Relaxed)) == prod;
            if drained
                && self
                    .tx
                    .diff(last, prod)
                    .map_or(true, |d| d >= RECLAIM_ARMED_MIN)
            {
                self.reclaim_tx();
            }
        }
    }

    /// shutdown(2).
    pub fn shutdown(&self, fd: i32, how: i32) -> Result<(), Errno> {
        let f = match how {
            libc::SHUT_RD => F_SHUT_RD,
            libc::SHUT_WR => F_SHUT_WR,
            libc::SHUT_RDWR => F_SHUT_RD | F_SHUT_WR,
            _ => return Err(libc::EINVAL),
        };
        let old = self.set_flag(f);
        if f & F_SHUT_WR != 0 && old & F_SHUT_WR == 0 {
            // Wait for in-flight writers so the flag follows their last cursor.
            let _g = self.sh().tx_lock.lock();
            self.update_peer_flags(0, 0, ConnStateFlags::PEER_DONE_WRITING.0);
            self.after_produce(fd);
            // The reader may sleep without WAIT_DATA if it saw no data yet: ring anyway when
            // it announced itself.
        }
        let now = old | f;
        if now & (F_SHUT_RD | F_SHUT_WR) == (F_SHUT_RD | F_SHUT_WR) && old & F_REAL_SHUT == 0 {
            // Neither direction needs doorbells any more: shut the TCP socket too, which also
            // wakes local threads sleeping on it.
            self.set_flag(F_REAL_SHUT);
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
        }
        Ok(())
    }

    /// The last fd of this connection (in every process) is being closed.
    pub fn final_close(&self, fd: i32) {
        let old = self.set_flag(F_CLOSED);
        if old & F_CLOSED != 0 {
            return;
        }
        // Unread data, or SO_LINGER {1, 0}: TCP sends a reset, the peer sees ECONNRESET.
        let unread = self.avail();
        let linger0 = linger_zero(fd);
        if unread > 0 || linger0 {
            crate::debug!(
                "fd {fd}: closed with {unread} unread bytes{}: abort (the peer gets \
                 ECONNRESET): {}",
                if linger0 { " and SO_LINGER {1, 0}" } else { "" },
                self.describe()
            );
        }
        let st = if unread > 0 || linger0 {
            ConnStateFlags::PEER_CONN_ABORT.0 | ConnStateFlags::PEER_CONN_CLOSED.0
        } else {
            ConnStateFlags::PEER_CONN_CLOSED.0 | ConnStateFlags::PEER_DONE_WRITING.0
        };
        {
            let _g = self.sh().tx_lock.lock();
            self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, st);
        }
        // Wake the peer if it waits; the TCP FIN that follows wakes it too.
        if self
            .peer_wait()
            .fetch_and(!(WAIT_DATA | WAIT_SPACE), Ordering::SeqCst)
            != 0
        {
            self.ring_doorbell(fd);
        }
        // Unread doorbells in our receive queue would turn our FIN into a RST.
        self.drain(fd);
    }

    /// Count one more fd referring to this connection (dup, fork).
    pub fn add_ref(&self, n: u32) {
        self.sh().refs.fetch_add(n, Ordering::AcqRel);
    }

    /// Drop one fd reference; true if it was the last one anywhere.
    pub fn drop_ref(&self) -> bool {
        let s = self.sh();
        let mut old = s.refs.load(Ordering::Acquire);
        loop {
            if old == 0 {
                return false;
            }
            match s
                .refs
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return old == 1,
                Err(o) => old = o,
            }
        }
    }

    /// Drop one fd reference unless it is the last one anywhere; whether it was dropped.
    pub fn drop_ref_unless_last(&self) -> bool {
        let s = self.sh();
        let mut old = s.refs.load(Ordering::Acquire);
        while old > 1 {
            match s
                .refs
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(o) => old = o,
            }
        }
        false
    }

    /// Cursor snapshot for diagnostics: (cons, cons_pub, peer_prod, prod, peer_cons).
    pub fn cursors(&self) -> [Cursor; 5] {
        let s = self.sh();
        [
            unpack(s.cons.load(Ordering::Relaxed)),
            unpack(s.cons_pub.load(Ordering::Relaxed)),
            unpack(s.peer_prod.load(Ordering::Relaxed)),
            unpack(s.prod.load(Ordering::Relaxed)),
            unpack(s.peer_cons.load(Ordering::Relaxed)),
        ]
    }

    /// Edge-detection token for epoll ET emulation: changes whenever the peer moved a cursor
    /// or a flag that matters.
    pub fn edge_token(&self) -> (u64, u64) {
        // Only our own calls' flags: the doorbell channel's EOF or reset follows the peer's
        // flags (already an edge), and a new readiness bit is an edge by itself.
        let own = self.flags() & (F_SHUT_RD | F_SHUT_WR | F_WROTE_AFTER_CLOSE);
        (
            self.own_hdr().prod_atomic().load(Ordering::Acquire) ^ ((own as u64) << 40),
            self.own_hdr().cons_atomic().load(Ordering::Acquire),
        )
    }
}

/// How a switch to TCP ended ([`Conn::switch_to_tcp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switched {
    /// Both ends continue on the TCP socket, in order, nothing lost; this call switched it.
    Tcp,
    /// It was switched already (another thread or process of this end did it).
    Already,
    /// It could not be done (the peer did not answer in time, is gone, or broke the
    /// protocol; the socket could not leave the SOCKHASH): the connection was reset, both
    /// ends fail cleanly.
    Reset,
}

impl Conn {
    /// Whether this connection continues on TCP (switched).
    pub fn switched(&self) -> bool {
        self.flags() & F_SWITCHED != 0
    }

    /// Whether this connection continues (or is about to continue) on TCP.
    pub fn switching(&self) -> bool {
        self.flags() & (F_SWITCHING | F_PEER_SWITCH | F_SWITCHED) != 0
    }

    /// Reset the connection at once (both ends fail cleanly): a socket that leaves for an
    /// image without the library from a `vfork` child, which cannot switch it. No allocation.
    pub fn reset_now(&self, fd: i32) {
        self.set_flag(F_PROTO);
        set_linger_reset(fd);
        // SAFETY: plain syscall.
        unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
    }

    /// Switch the connection to plain TCP, mid-stream (this project's CDC extension, see
    /// [`SWITCH_TCP`] and DESIGN.md *Switch to TCP*): for a socket that leaves for an image
    /// that does not run the data path (an `exec` without the library), or because the peer
    /// asked ([`F_PEER_SWITCH`]). Both ends run the same steps; whoever starts, the other
    /// answers at its next operation on the connection (its marker wakes it: any wait on the
    /// socket returns):
    /// 1. under both ring locks, stop the rings ([`F_SWITCHING`]: no doorbell, no drain any
    ///    more) and publish our consumer cursor: it is final;
    /// 2. `leave()`: the doorbell shortcut off and the socket out of the SOCKHASH (after this
    ///    everything we send goes over TCP, and our reads are the kernel's plain TCP ones);
    ///    false: it could not, and the connection is reset instead;
    /// 3. our marker, then wait for the peer's (consuming only doorbells before it);
    /// 4. send the bytes of our send ring the peer did not consume (from its final consumer
    ///    cursor, which it published before its marker, up to our producer cursor): they are
    ///    the first bytes after our marker, before anything we write later;
    /// 5. [`F_SWITCHED`]: every holder of this end, in every process, continues on the socket.
    ///
    /// Bytes in our receive ring that we did not read come from the peer the same way. Waits
    /// at most until `deadline` for the peer; then, or on any violation, the connection is
    /// reset (linger 0): never a hang, never a wrong byte.
    pub fn switch_to_tcp(
        &self,
        fd: i32,
        deadline: Instant,
        leave: impl FnOnce() -> bool,
    ) -> Switched {
        let s = self.sh();
        let _rg = s.rx_lock.lock();
        let _tg = s.tx_lock.lock();
        let f = self.flags();
        if f & F_SWITCHED != 0 {
            return Switched::Already;
        }
        if f & (F_CLOSED | F_PROTO) != 0 {
            return Switched::Reset;
        }
        self.set_flag(F_SWITCHING);
        fence(Ordering::SeqCst);
        // Doorbells on their way finish first, and so does a drain under way (its thread
        // checked the flag before we set it).
        let start = Instant::now();
        let mut i = 0u32;
        while (s.bells.load(Ordering::SeqCst) != 0
            || s.ksleep.load(Ordering::SeqCst) & DRAINING != 0)
            && start.elapsed() < Duration::from_millis(SETTLE_MAX_MS)
        {
            i += 1;
            spin_pause(i);
        }
        let cons = unpack(s.cons.load(Ordering::Acquire));
        self.publish_cons(cons);
        let r = self.switch_steps(fd, deadline, leave);
        if r == Switched::Reset {
            self.set_flag(F_PROTO);
            set_linger_reset(fd);
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
        } else {
            self.set_flag(F_SWITCHED);
        }
        let clear = if r == Switched::Reset {
            F_SWITCHING | F_PEER_SWITCH
        } else {
            F_SWITCHING
        };
        s.flags.fetch_and(!clear, Ordering::AcqRel);
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        if let Some(h) = HOOKS.get() {
            (h.changed_fd)(fd, self);
        }
        r
    }

    fn switch_steps(&self, fd: i32, deadline: Instant, leave: impl FnOnce() -> bool) -> Switched {
        let s = self.sh();
        if self.flags() & (F_PROTO | F_PEER_GONE | F_PEER_RST) != 0 || self.peer_state().any_close()
        {
            // The peer closed (or is gone): what it wrote last is in our ring, and it cannot
            // send it again. (A peer that only shut its writing can: it still runs.)
            crate::debug!(
                "fd {fd}: switch to TCP impossible, the peer closed: {}",
                self.describe()
            );
            return Switched::Reset;
        }
        if !leave() {
            crate::debug!(
                "fd {fd}: switch to TCP impossible: the socket cannot leave the SOCKHASH"
            );
            return Switched::Reset;
        }
        if !send_all(fd, &[SWITCH_TCP], deadline) {
            crate::debug!("fd {fd}: switch to TCP: our marker could not be sent");
            return Switched::Reset;
        }
        if self.flags() & F_PEER_SWITCH == 0 && !read_to_marker(fd, deadline) {
            crate::debug!(
                "fd {fd}: switch to TCP: no marker from the peer in time: {}",
                self.describe()
            );
            return Switched::Reset;
        }
        self.set_flag(F_PEER_SWITCH);
        // The peer's final consumer cursor of our send ring, published before its marker.
        let prod = unpack(s.prod.load(Ordering::Acquire));
        let last = unpack(s.peer_cons.load(Ordering::Acquire));
        let new = self.own_hdr().load_cons().cursor;
        let Ok(pc) = self.tx.accept_peer_cons(prod, last, new) else {
            crate::debug!(
                "fd {fd}: switch to TCP: the peer's final consumer cursor {new:?} is not valid"
            );
            return Switched::Reset;
        };
        let n = self.tx.diff(pc, prod).unwrap_or(0);
        // SAFETY: `peer` is the peer's mapped DMB, longer than its CDC header.
        let base = unsafe { self.peer.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        for (off, len) in self.tx.segments(pc, n) {
            if len == 0 {
                continue;
            }
            // SAFETY: the segment lies inside the peer's ring, which we map.
            let seg = unsafe { std::slice::from_raw_parts(base.add(off), len) };
            if !send_all(fd, seg, deadline) {
                crate::debug!(
                    "fd {fd}: switch to TCP: {n} unread bytes could not be sent again in time"
                );
                return Switched::Reset;
            }
        }
        if self.flags() & F_SHUT_WR != 0 {
            // Our half-close (`peer_done_writing`, a flag in the rings) becomes TCP's FIN,
            // after the last byte.
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_WR) };
        }
        crate::debug!(
            "fd {fd}: switched to TCP ({n} bytes the peer had not read sent again): {}",
            self.describe()
        );
        Switched::Tcp
    }
}

/// Sends all of `b` on the socket (blocking with poll, no SIGPIPE) before `deadline`.
fn send_all(fd: i32, mut b: &[u8], deadline: Instant) -> bool {
    let e0 = real::errno();
    let ok = loop {
        if b.is_empty() {
            break true;
        }
        // SAFETY: valid buffer.
        let r = unsafe {
            real::send(
                fd,
                b.as_ptr() as *const libc::c_void,
                b.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r > 0 {
            b = &b[r as usize..];
            continue;
        }
        let e = real::errno();
        if r < 0 && e != libc::EAGAIN && e != libc::EINTR {
            break false;
        }
        if !wait_fd(fd, libc::POLLOUT, deadline) {
            break false;
        }
    };
    real::set_errno(e0);
    ok
}

/// Waits for `ev` on `fd` until `deadline`; false when it passed.
fn wait_fd(fd: i32, ev: i16, deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    let ms = (deadline - now).as_millis().min(1000) as i32 + 1;
    let mut p = libc::pollfd {
        fd,
        events: ev,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { real::poll(&mut p, 1, ms) };
    true
}

/// Consumes doorbells up to and including the peer's [`SWITCH_TCP`] marker, nothing after it
/// (peeks first). False at the deadline, at EOF or an error, or on any other byte.
fn read_to_marker(fd: i32, deadline: Instant) -> bool {
    let e0 = real::errno();
    let mut buf = [0u8; 256];
    let ok = loop {
        // SAFETY: valid buffer.
        let r = unsafe {
            real::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r == 0 {
            break false;
        }
        if r < 0 {
            let e = real::errno();
            if e != libc::EAGAIN && e != libc::EINTR {
                break false;
            }
            if !wait_fd(fd, libc::POLLIN, deadline) {
                break false;
            }
            continue;
        }
        let n = r as usize;
        let stop = buf[..n].iter().position(|&b| b != DOORBELL);
        let take = stop.map_or(n, |i| i + 1);
        if stop.is_some_and(|i| buf[i] != SWITCH_TCP) {
            break false;
        }
        // SAFETY: valid buffer; consumes exactly what was peeked (doorbells, the marker).
        let got = unsafe {
            real::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                take,
                libc::MSG_DONTWAIT,
            )
        };
        if got != take as isize {
            break false;
        }
        if stop.is_some() {
            break true;
        }
    };
    real::set_errno(e0);
    ok
}

/// `SO_LINGER {1, 0}`: the close (or shutdown) sends a reset.
fn set_linger_reset(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let e0 = real::errno();
    // SAFETY: valid option buffer.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    real::set_errno(e0);
}

impl Conn {
    /// Our DMB's mapping.
    pub fn own_map(&self) -> &Arc<Mapping> {
        &self.own
    }

    /// The peer's DMB's mapping.
    pub fn peer_map(&self) -> &Arc<Mapping> {
        &self.peer
    }

    /// The local state page's mapping.
    pub fn state_map(&self) -> &Arc<Mapping> {
        &self.shared
    }

    /// The last fd of the connection closed in every process ([`Conn::final_close`] ran):
    /// nobody reads or writes its rings any more.
    pub fn closed_everywhere(&self) -> bool {
        self.flags() & F_CLOSED != 0
    }

    /// How far into each ring the connection wrote (receive ring: as far as the peer's
    /// producer cursor we accepted; send ring: ours), in bytes from its start: the pages it
    /// touched.
    pub fn rings_touched(&self) -> (u64, u64) {
        let [_, _, peer_prod, prod, _] = self.cursors();
        let extent = |c: Cursor, len: u32| {
            if c.wrap > 0 {
                len as u64
            } else {
                c.count.min(len) as u64
            }
        };
        (
            extent(peer_prod, self.rx.len()),
            extent(prod, self.tx.len()),
        )
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(r) = self.release.take() {
            r.release(self);
        }
    }
}

/// Whether the socket has `SO_LINGER {1, 0}` (close sends a reset).
fn linger_zero(fd: i32) -> bool {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out pointers.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &mut l as *mut libc::linger as *mut libc::c_void,
            &mut len,
        )
    };
    real::set_errno(e0);
    r == 0 && l.l_onoff != 0 && l.l_linger == 0
}

/// How often a lock-free cursor snapshot is retried while other threads move the cursors.
const SNAPSHOT_TRIES: u32 = 64;

/// Raise a shared "last accepted" cursor word from `seen` to `c`, unless another thread
/// already took it further: it only ever moves forward (a thread that read an older cursor
/// must not pull it back behind what a reader already consumed or a writer already filled).
fn advance(word: &AtomicU64, ring: Ring, mut seen: u64, c: Cursor) {
    loop {
        match word.compare_exchange_weak(seen, pack(c), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(now) => match ring.diff(unpack(now), c) {
                Ok(d) if d > 0 => seen = now,
                _ => return,
            },
        }
    }
}

fn deadline_of(timeout_ms: i64) -> Option<Instant> {
    if timeout_ms < 0 {
        None
    } else {
        Some(Instant::now() + Duration::from_millis(timeout_ms as u64))
    }
}

/// Send SIGPIPE to the calling thread, as the kernel does for a write to a closed socket.
pub fn raise_sigpipe() {
    // SAFETY: plain syscalls on our own thread.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::pid_t;
        libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, libc::SIGPIPE);
    }
}

/// Two ends of one connection over two fresh memfd DMBs of `dmb_size` bytes, with a Unix
/// socketpair standing in for the TCP socket (doorbells). For tests.
#[doc(hidden)]
pub fn test_pair(
    dmb_a: usize,
    dmb_b: usize,
) -> std::io::Result<(Conn, Conn, std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let ma = crate::shm::memfd("dmb-a", dmb_a)?;
    let mb = crate::shm::memfd("dmb-b", dmb_b)?;
    let a = Conn::new(
        Mapping::new(ma.as_raw_fd(), dmb_a)?,
        Mapping::new(mb.as_raw_fd(), dmb_b)?,
        None,
        Role::Client,
        false,
        None,
    )?;
    let b = Conn::new(
        Mapping::new(mb.as_raw_fd(), dmb_b)?,
        Mapping::new(ma.as_raw_fd(), dmb_a)?,
        None,
        Role::Server,
        false,
        None,
    )?;
    let mut sv = [0i32; 2];
    // SAFETY: valid out array.
    if unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fresh fds.
    Ok((
        a,
        b,
        unsafe { std::os::fd::OwnedFd::from_raw_fd(sv[0]) },
        unsafe { std::os::fd::OwnedFd::from_raw_fd(sv[1]) },
    ))
}

#[cfg(test)]
mod tests;
