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
//!   R's `O_ASYNC` adds [`WAIT_ASYNC`] (W rings once per look of R, [`ASYNC_RUNG`]), so that
//!   R's kernel sends `SIGIO` as data arrives.
//! - `R.dmb[32..]`: the data ring.
//!
//! Local state ([`Shared`]) lives in `MAP_SHARED` memory the daemon keeps with our DMB: a
//! 256-byte slot of a sealed page it shares among this process's connection ends (`PAIR`), or a
//! sealed 4 KiB page of its own (`REGISTER`), so threads and forked children see the same
//! cursors, locks and flags, and a process the socket moves to (`SCM_RIGHTS`, `exec`) shares
//! it too ([`Conn::adopt`]).
//!
//! Split as Linux `net/smc` splits it: this file holds the connection, its shared state and its
//! readiness; `smc_cdc` the cursors of the CDC headers, `smc_rx` reads, `smc_tx` writes,
//! `smc_close` shutdown and the last close, `smc_wake` doorbells and the blocking waits,
//! `smc_switch` the switch to TCP before an exec into an image without the library.

use crate::iov::IovCursor;
use crate::real;
use crate::shm::{Mapping, ShmLock};
use smc_common::cdc::{CdcHeader, ConnStateFlags, Cursor, CursorWord, ProdFlags, Ring};
use smc_common::urg::{self, UrgRx, UrgState, UrgWord};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The owner of this DMB is switching the connection to TCP ([`Conn::switch_to_tcp`]): its
/// marker is on the way over the socket. A peer that only writes would never read it: its
/// writes and shutdown look here and drain the socket ([`Conn::notice_switch`]).
pub const WAIT_SWITCH: u64 = 4;

/// The reader of this DMB sleeps waiting for data.
pub const WAIT_DATA: u64 = 1;
/// The writer into this DMB sleeps waiting for room.
pub const WAIT_SPACE: u64 = 2;
/// The reader of this DMB has `O_ASYNC` on (`F_SETFL`, `FIOASYNC`): a write rings the
/// doorbell while [`ASYNC_RUNG`] is clear, so that the reader's kernel sends `SIGIO` (or the
/// `F_SETSIG` signal) to the socket's owner as data arrives, as TCP's `sock_def_readable`
/// does. Set and cleared by the reader only; the writer never swaps it off.
pub const WAIT_ASYNC: u64 = 8;
/// Set by the writer with the doorbell it rang for [`WAIT_ASYNC`]; cleared by the reader when
/// it reads ([`Conn::async_looked`]): one doorbell per arrival after the reader last looked,
/// however many writes come before it looks again (queued doorbells stay bounded).
pub const ASYNC_RUNG: u64 = 16;
/// The owner of this DMB switched the connection to TCP alone ([`Conn::switch_to_tcp`], with
/// [`FEATURE_SWITCH_ALONE`]): neither ring held an unread byte, and its final cursors are
/// published. The writer sends no control byte any more (its guard, [`Conn::ctl_begin`],
/// refuses), answers at its next operation without a marker of its own, and continues on TCP.
/// Set with [`WAIT_SWITCH`], by a CAS that finds no control send of the writer in flight.
///
/// [`FEATURE_SWITCH_ALONE`]: smc_common::clc::FEATURE_SWITCH_ALONE
pub const WAIT_ALONE: u64 = 32;
/// The owner of this DMB finished its part of a switch to TCP for its socket's ACKs (with
/// [`FEATURE_SWITCH_FRESH_ACKS`], [`F_FRESH_ACKS_OK`]): the peer acknowledged every switch byte
/// it sent (none is left to send or to send again), and its socket's delayed ACKs are a fresh
/// connection's again (`TCP_QUICKACK`: not in ping-pong mode). Set once, by the owner, with a
/// futex wake on the low half of the word; at the end of a two-sided switch each end waits for
/// the other's before it continues ([`Conn::switch_to_tcp`]).
///
/// [`FEATURE_SWITCH_FRESH_ACKS`]: smc_common::clc::FEATURE_SWITCH_FRESH_ACKS
pub const WAIT_ACKS_FRESH: u64 = 128;
/// Set by the writer before a control byte that the owner may not read as one (an urgent
/// doorbell, which the owner's kernel takes out of the stream unless `SO_OOBINLINE` is on):
/// the counts below no longer say exactly what the owner reads; it drains as without the
/// feature, and never switches alone. Sticky.
pub const CTL_UNCOUNTED: u64 = 64;
/// One control send (doorbell, urgent doorbell, switch marker) of the writer in flight: taken
/// before the byte goes to the socket, given back after ([`Conn::ctl_begin`], bits 16..32).
const CTL_INFLIGHT_ONE: u64 = 1 << 16;
const CTL_INFLIGHT_MASK: u64 = 0xffff << 16;
/// One control byte the writer sent to the owner (bits 32..64, wrapping): the owner's drains
/// read at most what this count says it has not read yet, so never a data byte behind the
/// peer's switch marker.
const CTL_SENT_ONE: u64 = 1 << 32;

/// A reclaim leaves this much of the send ring after our producer cursor in place, so the next
/// writes land on existing pages.
const RECLAIM_WARM: u32 = 16 * 1024;
/// A blocking wait for data that has slept this long gives the send ring's idle pages back.
const RECLAIM_IDLE_MS: i32 = 10;
const PAGE: usize = 4096;
/// poll/epoll waiters (whose sleep this library does not time) give the pages back before
/// sleeping once this much was written since the last reclaim and the peer consumed it all.
const RECLAIM_ARMED_MIN: u32 = 256 * 1024;

/// Where the bits 0..32 of a wait word lie in its 8 bytes.
#[cfg(target_endian = "little")]
const WAIT_LO_OFF: usize = 0;
#[cfg(target_endian = "big")]
const WAIT_LO_OFF: usize = 4;

/// The byte we send as a doorbell (never the first byte of a CLC eyecatcher, 0xE2).
pub const DOORBELL: u8 = 0x01;

// Local flags (Shared::flags).
/// One call in this many of those that find nothing and do not wait reads the TCP socket for
/// the peer's end ([`Conn::probe_peer_gone`]).
pub const IDLE_PROBE: u32 = 16;

/// Directions for [`Conn::note_dir`].
pub const DIR_RX: u32 = 1;
pub const DIR_TX: u32 = 2;

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
/// The final close ([`Conn::final_close`]) finished: no process writes into either DMB or the
/// local state page for this connection any more. [`F_CLOSED`] is set when it starts, and the
/// process that runs it may be preempted before its last write into the peer's DMB (its close
/// flags) while another process that held the connection releases its DMB references: that
/// release must not take [`F_CLOSED`] for "nobody writes here any more" (it pooled our DMB and
/// untainted the peer's, the daemon bound both to a new connection, and the late close flags
/// landed in that connection's header: its server swallowed its reply as written after the
/// peer's close, and its client read EOF with no byte: what one CI run of the fork stress test
/// showed; not reproduced on demand in 40 runs).
pub const F_CLOSE_DONE: u32 = 1 << 14;
/// `SO_OOBINLINE` is on (as the kernel holds it for the socket: read when the connection is
/// set up, kept by `setsockopt`): urgent bytes stay in the stream.
pub const F_OOBINLINE: u32 = 1 << 15;
/// The writer set `urg_data_pending`/`urg_data_present` in the peer's header (an urgent send):
/// the next ordinary write clears them.
pub const F_URG_FLAGS: u32 = 1 << 16;
/// A switch to TCP read bytes of the peer's stream from the socket into our ring while our
/// own waited for room (`smc_switch`'s stash): until the program read them, its reads take them
/// there (the producer cursor is our local state's, not the peer's) before the socket's.
pub const F_STASH: u32 = 1 << 17;
/// `TCP_INQ` is on (as the kernel holds it for the socket: read when the connection is set
/// up, kept by `setsockopt`): a successful `recvmsg` carries a `TCP_CM_INQ` message. (A high
/// bit: other branches add flags after 16.)
pub const F_TCP_INQ: u32 = 1 << 24;
/// `O_ASYNC` is on for the socket (as the kernel holds it for the open file: read when the
/// connection is set up, kept by `F_SETFL` and `FIOASYNC`): [`WAIT_ASYNC`] is set in our
/// DMB, and a read clears [`ASYNC_RUNG`] ([`Conn::async_looked`]).
pub const F_ASYNC: u32 = 1 << 26;
/// Both ends count their control bytes and may switch to TCP alone (the handshake negotiated
/// [`smc_common::clc::FEATURE_SWITCH_ALONE`]).
pub const F_ALONE_OK: u32 = 1 << 27;
/// The peer switched the connection to TCP alone ([`WAIT_ALONE`] in its DMB): this end must
/// switch too, before anything else goes into the rings; its marker may still be on its way.
pub const F_PEER_ALONE: u32 = 1 << 28;
/// An end that switches alone may leave bytes of its own unread in the peer's ring: it sends
/// them again after its marker, with their count (the handshake negotiated
/// [`smc_common::clc::FEATURE_SWITCH_ALONE_RESEND`]); the peer drops what it had read of them.
pub const F_ALONE_RESEND: u32 = 1 << 29;
/// Both ends say when their socket's delayed ACKs are a fresh connection's again after a
/// switch to TCP ([`WAIT_ACKS_FRESH`]; the handshake negotiated
/// [`smc_common::clc::FEATURE_SWITCH_FRESH_ACKS`]).
pub const F_FRESH_ACKS_OK: u32 = 1 << 30;
/// This end shut its writing after the stream was reset (TCP's socket in CLOSE): the error
/// the reset left is the one of the state it came in (`tcp_reset`: `EPIPE` in CLOSE_WAIT),
/// not `ECONNRESET` as after a shutdown that came first ([`Conn::reset_errno`]).
pub const F_SHUT_WR_AFTER_RESET: u32 = 1 << 31;
/// The connection continues on TCP: the peer's marker was read, the peer switched alone, or
/// this end switched (see [`E_TCP`]).
pub const F_TO_TCP: u32 = F_PEER_SWITCH | F_PEER_ALONE | F_SWITCHED;

/// This project's CDC extension (a reserved bit of Linux's `conn_state_flags` byte, which
/// Linux ignores): the writer of this consumer word shut its reading side (`SHUT_RD`). With
/// `peer_done_writing` its TCP socket would be in FIN_WAIT with `RCV_SHUTDOWN`, where the kernel
/// answers new data with a reset (`tcp_rcv_state_process`, `TCPAbortOnData`): our next write
/// is taken and goes nowhere, the peer reads `ECONNRESET`, and we `EPIPE` from then on, as
/// after the peer's close ([`F_WROTE_AFTER_CLOSE`]).
pub const PEER_DONE_READING: u8 = 0x10;

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
    /// The task id (`gettid`) of the one waiter that sleeps in poll on the TCP socket, 0: none.
    /// A waiter that finds it set to a task that no longer exists takes over.
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
    /// Processes whose [`Conn`] of this end is alive (see [`Conn::unheld`]): `refs` counts
    /// fds, and a thread still inside a call (or stopped there) keeps using the rings and
    /// this page after the last fd of its process closed; within one process its `Arc`
    /// keeps the `Conn`, across processes this count does.
    holders: AtomicU32,
    /// The reader's urgent record ([`smc_common::urg::UrgRx`], packed): TCP's `urg_data` and
    /// `urg_seq`, changed under `rx_lock`.
    urg_rx: AtomicU64,
    /// The writer's last urgent word ([`smc_common::urg::UrgWord`] as its type word), changed
    /// under `tx_lock`.
    urg_tx: AtomicU64,
    /// The socket's `SO_PEEK_OFF` (an `i32`; negative: off), as TCP's `sk_peek_off`: a
    /// `MSG_PEEK` starts this far past the read position and moves it on, a read moves it
    /// back (`smc_rx`). Shared like the socket by every process holding it.
    peek_off: AtomicU32,
}

/// [`Shared::ksleep`]: a drain of the doorbells is under way.
const DRAINING: u32 = 1 << 31;
/// A waiter that left doorbells to other sleepers waits at most this long for one of them to
/// drain them (they were woken by those very doorbells); then it drains them itself (a
/// sleeper that does not run — stopped, or killed while asleep — must not stall the others).
pub const SETTLE_MAX_MS: u64 = 20;

// It fits the slot the daemon hands out (`smc_ism::proto::STATE_SLOT`).
const _: () = assert!(std::mem::size_of::<Shared>() <= smc_ism::proto::STATE_SLOT as usize);

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
    /// A yield that let another task run ends the spin ([`spin_pause`]).
    pub give_way: bool,
}

/// A `sched_yield` inside a spin that took longer than this let another task run on our CPU
/// (alone on it, the call returns in well under a microsecond; handing the CPU to another task
/// and getting it back takes a few, docs/PERF.md): that task wanted the CPU the spin holds.
const YIELD_TAKEN_NS: u64 = 2_000;
/// After a spin that gave the CPU away, the thread's next `2^streak` waits sleep at once,
/// `streak` growing with each such spin in a row up to this.
const GIVE_WAY_MAX_SHIFT: u32 = 10;

thread_local! {
    /// This thread's record of spins that gave the CPU away: waits left that sleep without
    /// spinning, and how many spins in a row gave way (see [`spin_pause`]).
    static GAVE_WAY: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// Whether this thread's next wait may spin: not while it backs off after spins that gave the
/// CPU to other tasks ([`spin_pause`]); each call counts one wait of the back-off.
#[inline]
pub fn spin_allowed() -> bool {
    GAVE_WAY
        .try_with(|g| {
            let (skip, streak) = g.get();
            if skip == 0 {
                return true;
            }
            g.set((skip - 1, streak));
            false
        })
        .unwrap_or(true)
}

/// A spin of this thread ended in success (what it waited for came) without giving the CPU
/// away: the back-off is over.
#[inline]
pub fn spin_won() {
    let _ = GAVE_WAY.try_with(|g| {
        if g.get() != (0, 0) {
            g.set((0, 0));
        }
    });
}

fn gave_way() {
    let _ = GAVE_WAY.try_with(|g| {
        let streak = (g.get().1 + 1).min(GIVE_WAY_MAX_SHIFT);
        g.set((1 << streak, streak));
    });
}

/// One spin iteration: a pause, and every `spin_yield` iterations a `sched_yield`. True when
/// that yield let another task run on this CPU: the spin takes time another task wants (other
/// processes pinned to the same core, a loaded machine), so the caller stops spinning and
/// sleeps, and the thread's next waits sleep at once ([`spin_allowed`], a back-off doubling
/// with each spin in a row that gives way) until a spin succeeds without giving way
/// ([`spin_won`]). Like the kernel's adaptive mutex, which spins only while nobody else needs
/// the CPU. `SMC_SPIN_GIVE_WAY=0`: spin the whole budget regardless.
#[inline]
pub fn spin_pause(i: u32) -> bool {
    let t = tune();
    let y = t.spin_yield;
    if y != 0 && i.is_multiple_of(y) {
        let t0 = Instant::now();
        // SAFETY: plain syscall.
        unsafe { libc::sched_yield() };
        if t.give_way && t0.elapsed().as_nanos() as u64 > YIELD_TAKEN_NS {
            gave_way();
            return true;
        }
    } else {
        std::hint::spin_loop();
    }
    false
}

pub fn tune() -> &'static Tune {
    static T: crate::forklock::ForkOnce<Tune> = crate::forklock::ForkOnce::new();
    T.get_or_init(|| {
        let cfg = crate::util::config::config();
        let spin_us = cfg.spin_us;
        // SAFETY: plain sysconf.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        let spin_yield = cfg.spin_yield;
        let room_us = cfg.spin_room_us;
        Tune {
            spin_max_ns: if cpus > 1 { spin_us * 1000 } else { 0 },
            spin_yield,
            spin_room_ns: if cpus > 1 { room_us * 1000 } else { 0 },
            give_way: cfg.spin_give_way,
        }
    })
}

/// Spin policy: spin the full budget (`SMC_SPIN_US`, default 100 µs) while spinning pays off
/// at least now and then; after 64 waits in a row that had to sleep anyway (an idle or
/// throughput-bound connection) spin only an eighth of it, until a spin succeeds again. Never
/// spins on a single-CPU machine, nor while the thread backs off after spins that gave the CPU
/// to other tasks ([`spin_pause`]).
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

    /// The budget of the next wait in nanoseconds (0: sleep at once).
    pub fn budget(&self) -> u64 {
        let t = tune();
        if t.spin_max_ns == 0 || !spin_allowed() {
            return 0;
        }
        if self.misses.load(Ordering::Relaxed) < 64 {
            t.spin_max_ns
        } else {
            t.spin_max_ns / 8
        }
    }

    pub fn record(&self, hit: bool) {
        if hit {
            spin_won();
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
    /// The process whose holder this object is counted as in [`Shared::holders`] (0: none,
    /// e.g. a forked child's copy of an object only a thread of its parent held).
    holder_pid: AtomicU32,
    /// The `fork` that counted this object's holder for its child last ([`Conn::mark_for_fork`]):
    /// dup'd fds share the object, which is counted once, without a list (a `fork` from a
    /// signal handler must not allocate).
    fork_mark: AtomicU64,
    /// This process's own hold on the connection besides its fd numbers (`smc_close`): calls
    /// in flight (low 32 bits) and the fd references of numbers closed under them (high 32
    /// bits), dropped when the last of those calls returns.
    users: AtomicU64,
    /// Numbers of this process's fd table that name the connection.
    numbers: AtomicU32,
    /// The descriptor our own I/O on the socket goes through ([`Conn::with_io`]): the number
    /// of the call, or a private duplicate of the socket made when a number was closed while
    /// the connection stayed in use.
    io: crate::util::io_path::IoPath,
    /// `send(MSG_ZEROCOPY)` calls of this process on the connection, and how many of their
    /// completions were reported (`smc_tx`, [`Conn::take_zerocopy`]).
    zc_sent: AtomicU32,
    zc_done: AtomicU32,
    /// Calls that found nothing and did not wait ([`Conn::probe_peer_gone`]).
    idle_looks: AtomicU32,
    /// This process's calls on the connection: how often they changed direction (a send after
    /// a receive, or the other way round; the first call counts), and the last direction
    /// (0 none, [`DIR_RX`], [`DIR_TX`]): the round trips the short-connection policy weighs.
    turns: AtomicU32,
    last_dir: AtomicU32,
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
    /// Urgent data not read yet (`EPOLLPRI`).
    pub urgent: bool,
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
        let rings = Conn::rings(&own, &peer)?;
        // The state registered with our DMB (a page, or a slot of one), else an anonymous page
        // (that connection cannot move to another process).
        let shared = match state {
            Some(m) if m.len() >= std::mem::size_of::<Shared>() => m,
            _ => Arc::new(Mapping::anon_shared(4096)?),
        };
        let c = Conn::local(own, peer, shared, rings, role, release);
        c.holder_pid.store(crate::pid(), Ordering::Relaxed);
        let s = c.sh();
        s.magic.store(SHARED_MAGIC, Ordering::Relaxed);
        s.refs.store(1, Ordering::Relaxed);
        s.holders.store(1, Ordering::Relaxed);
        s.role
            .store(u32::from(role == Role::Server), Ordering::Relaxed);
        if nonblock {
            s.flags.fetch_or(F_NONBLOCK, Ordering::Relaxed);
        }
        s.urg_rx.store(0, Ordering::Relaxed);
        s.urg_tx.store(0, Ordering::Relaxed);
        s.peek_off.store(-1i32 as u32, Ordering::Relaxed);
        // Type byte of the header we write (no urgent word yet) (without touching the peer's wait bits).
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
        let rings = Conn::rings(&own, &peer)?;
        if state.len() < std::mem::size_of::<Shared>() {
            return Err(bad());
        }
        let mut c = Conn::local(own, peer, state, rings, Role::Client, release);
        let s = c.sh();
        if s.magic.load(Ordering::Acquire) != SHARED_MAGIC {
            return Err(bad());
        }
        s.holders.fetch_add(1, Ordering::AcqRel);
        c.holder_pid.store(crate::pid(), Ordering::Relaxed);
        if s.role.load(Ordering::Relaxed) == 1 {
            c.role = Role::Server;
        }
        Ok(c)
    }

    /// The rings over our DMB `own` (rx) and the peer's `peer` (tx); `EINVAL` for a DMB size
    /// no ring fits.
    fn rings(own: &Mapping, peer: &Mapping) -> std::io::Result<(Ring, Ring)> {
        let bad = || std::io::Error::from_raw_os_error(libc::EINVAL);
        Ok((
            Ring::for_dmb(own.len()).ok_or_else(bad)?,
            Ring::for_dmb(peer.len()).ok_or_else(bad)?,
        ))
    }

    /// The connection over its DMBs and state page, with this process's own fields fresh (no
    /// tokens, calls, fd numbers or holder yet): what [`Conn::new`] and [`Conn::adopt`] share;
    /// the state page is theirs to set up or check.
    fn local(
        own: Arc<Mapping>,
        peer: Arc<Mapping>,
        shared: Arc<Mapping>,
        (rx, tx): (Ring, Ring),
        role: Role,
        release: Option<Box<dyn Release>>,
    ) -> Conn {
        Conn {
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
            holder_pid: AtomicU32::new(0),
            fork_mark: AtomicU64::new(0),
            zc_sent: AtomicU32::new(0),
            zc_done: AtomicU32::new(0),
            idle_looks: AtomicU32::new(0),
            turns: AtomicU32::new(0),
            last_dir: AtomicU32::new(0),
            users: AtomicU64::new(0),
            numbers: AtomicU32::new(0),
            io: crate::util::io_path::IoPath::new(),
        }
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
        // SAFETY: a shared mapping (a page, or a slot of one) of at least one Shared (all
        // atomics, zero-valid), checked when the connection was made; slots are 256-aligned.
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

    /// The half of our wait word that holds its bits 0..32, for a futex.
    #[inline]
    fn own_wait_lo(&self) -> &AtomicU32 {
        // SAFETY: inside the 8-byte word at offset 24 of the header, 4-byte aligned.
        unsafe { &*(self.own.as_ptr().add(24 + WAIT_LO_OFF) as *const AtomicU32) }
    }

    /// The half of the peer's wait word that holds its bits 0..32, for a futex.
    #[inline]
    fn peer_wait_lo(&self) -> &AtomicU32 {
        // SAFETY: as above.
        unsafe { &*(self.peer.as_ptr().add(24 + WAIT_LO_OFF) as *const AtomicU32) }
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

    /// The peer shut its writing, then reset the connection (a close with our bytes unread,
    /// or `SO_LINGER {1, 0}`, after its `shutdown(SHUT_WR)`): TCP's reader got the FIN before
    /// the reset, so its reads are at the end of the stream (`SOCK_DONE`), and the reset left
    /// `EPIPE` pending in CLOSE_WAIT (`tcp_reset`; `ECONNRESET` once we shut our writing too).
    /// An abort never sets `peer_done_writing` itself (`Conn::final_close`), so both flags
    /// together say that order.
    fn fin_before_reset(&self) -> bool {
        let ps = self.peer_state();
        self.flags() & F_PROTO == 0
            && ps.contains(ConnStateFlags::PEER_DONE_WRITING)
            && ps.contains(ConnStateFlags::PEER_CONN_ABORT)
    }

    /// The errno the peer's reset leaves pending (see [`Conn::fin_before_reset`]).
    fn reset_errno(&self) -> Errno {
        let f = self.flags();
        if self.fin_before_reset() && (f & F_SHUT_WR == 0 || f & F_SHUT_WR_AFTER_RESET != 0) {
            libc::EPIPE
        } else {
            libc::ECONNRESET
        }
    }

    /// The whole readiness picture, without locks or syscalls.
    pub fn readiness(&self) -> Readiness {
        let f = self.flags();
        if f & F_TO_TCP != 0 {
            // Continues on TCP: the caller's next read or write switches and asks the socket.
            return Readiness {
                readable: 1,
                writable: 1,
                ..Readiness::default()
            };
        }
        // Flags before cursors: a peer sets closed after its last producer update.
        let ps = self.peer_state();
        let (readable, urgent) = self.readable_urg();
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
            urgent,
            hup,
            rcv_shut,
        }
    }
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

    /// The last fd of the connection closed in every process and its [`Conn::final_close`]
    /// finished ([`F_CLOSE_DONE`]): nobody reads or writes its rings or its local state page
    /// any more.
    pub fn closed_everywhere(&self) -> bool {
        self.flags() & F_CLOSE_DONE != 0
    }

    /// Before `fork`: the child's copy of this object will be a holder too (once per object,
    /// however many fds name it); [`Conn::holder_forked`] in the child, [`Conn::leave_holders`]
    /// in the parent if the fork failed.
    pub fn add_holder(&self) {
        self.sh().holders.fetch_add(1, Ordering::AcqRel);
    }

    /// Before `fork` number `seq` (unique in this process, never 0): true the first time for
    /// this object, whose holder the fork then counts once ([`Conn::add_holder`]).
    pub fn mark_for_fork(&self, seq: u64) -> bool {
        self.fork_mark.swap(seq, Ordering::AcqRel) != seq
    }

    /// After fork `seq` failed: true once for an object [`Conn::mark_for_fork`] marked, whose
    /// holder count is then given back ([`Conn::leave_holders`]).
    pub fn unmark_for_fork(&self, seq: u64) -> bool {
        self.fork_mark
            .compare_exchange(seq, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// In the child after `fork`: this copy is the holder [`Conn::add_holder`] counted.
    pub fn holder_forked(&self) {
        self.holder_pid.store(crate::pid(), Ordering::Relaxed);
    }

    /// This process's object stops holding the connection (its drop, or a failed fork's
    /// count); no-op for a copy that was never counted.
    pub fn leave_holders(&self) {
        let s = self.sh();
        let mut old = s.holders.load(Ordering::Acquire);
        while old > 0 {
            match s
                .holders
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(o) => old = o,
            }
        }
    }

    /// A receive ([`DIR_RX`]) or send ([`DIR_TX`]) call: one more turn when the direction
    /// changed (threads racing may miss one: the count is an estimate).
    pub(super) fn note_dir(&self, dir: u32) {
        if self.last_dir.load(Ordering::Relaxed) != dir {
            self.last_dir.store(dir, Ordering::Relaxed);
            self.turns.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// How often this process's calls changed direction on the connection (see
    /// [`Conn::note_dir`]).
    pub fn turns(&self) -> u32 {
        self.turns.load(Ordering::Relaxed)
    }

    /// Another process holds this end too (besides the caller's object).
    pub fn held_elsewhere(&self) -> bool {
        self.sh().holders.load(Ordering::Acquire) > 1
    }

    /// No process but the caller's (whose object is going) holds this end any more: no
    /// thread anywhere is inside a call on it. With [`Conn::closed_everywhere`], nobody
    /// writes into either DMB or the state page again (they may be pooled). A forked child
    /// whose thread was inside `recv` across the last close stored its consumer cursor into
    /// the page and the peer's DMB after both were bound to the next connection between the
    /// same two processes: that connection lost bytes, the child read its bytes
    /// (`tests/redteam/rt4.c recvfault`, `sendstop`).
    pub fn unheld(&self) -> bool {
        self.sh().holders.load(Ordering::Acquire) == 0
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
        if self.holder_pid.swap(0, Ordering::AcqRel) == crate::pid() {
            self.leave_holders();
        }
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

mod smc_cdc;
mod smc_close;
mod smc_rx;
mod smc_switch;
mod smc_tx;
mod smc_wake;

pub use crate::util::io_path::{IO_GONE, NO_IO};
pub use smc_close::{TCP_CLOSE, TCP_CLOSE_WAIT, TCP_ESTABLISHED, TCP_FIN_WAIT2};
pub use smc_switch::{send_fresh, Switched, TailUndo};

#[cfg(test)]
mod tests;
