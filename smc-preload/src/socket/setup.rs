//! Connection setup: opting sockets in, asking the eBPF programs whether the peer announced
//! SMC, and the CLC handshake (SMC-D v2 over loopback-ism) over the TCP connection itself, with
//! DMBs from the loopback-ism daemon.
//!
//! The protocol logic is `smc_common::handshake` (sans-IO), driven over the socket by
//! [`crate::handshake::Driver`]. Client (in `connect`): peer not SMC → plain TCP, not a byte
//! sent (PEERNOSMC). Otherwise Proposal → Accept (attach the server's DMB, register ours) →
//! Confirm; or Decline / timeout → plain TCP. Server (in `accept`): a stream that does not
//! start with a CLC eyecatcher stays plain (nothing consumed); Proposal → register DMB →
//! Accept → Confirm → attach the client's DMB.
//!
//! After a fallback the stream is either in sync (plain TCP), or CLC messages of the peer may
//! follow: after a timeout while the peer had to answer (client waiting for the Accept, server
//! for the Proposal) the Decline the machine sent is the peer's answer, and the late message
//! (then the peer's own timeout Decline) is skipped at the first read ([`Obj::Skip`]); after
//! any other Decline of ours, a Decline of the peer that crossed it is (also after a server
//! withdrew its Accept when its wait for the Confirm ended, see
//! [`smc_common::handshake`] *Withdrawn accept*); anything else (the server timed out waiting
//! for the Confirm of a client that cannot be told of a withdrawal — it may already be on SMC
//! —, or bytes that do not frame as CLC) resets the connection: never a byte of the wrong
//! stream.

use crate::conn::{Conn, Role};
use crate::daemon::{release_dmbs, with_dev, DmbRelease};
use crate::fdtable::{self, Slot, TAG_TCP};
use crate::forklock::ForkMutex;
use crate::forklock::ForkOnce;
use crate::handshake::{clc_timeout, machine, peer_id};
use crate::handshake::{Driver, HeldDmb, Outcome, Progress};
use crate::obj::{Obj, Skip};
use crate::policy::{note_dest, Dest};
use crate::util::config::config;
use crate::{debug, real, stats};
use smc_common::bpf::{
    SockState, SMC_SO_ENABLE, SMC_SO_SHORTCUT, SMC_SO_STATE, SMC_SO_TCP, SOCK_PEER_SMC,
    SOCK_QUARANTINED, SOCK_SAME_HOST, SOL_SMC_BPF,
};
use smc_common::clc::MsgType;
use smc_common::diag::Diag;
use smc_common::handshake::{Fallback, FallbackReason, Handshake};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long `connect` waits for a non-blocking connect to complete before leaving the
/// decision to the first operation.
pub fn connect_wait_ms() -> i32 {
    config().connect_wait_ms.min(i32::MAX as u64) as i32
}

/// Default DMB size code: `SMC_DMB_SIZE`, else what TCP on this host holds for a connection
/// whose reader does not read ([`tcp_capacity`]), rounded up to a size code (8 MiB, code 9,
/// with Debian's defaults), at least 1 MiB. Codes above 6 are used only with a peer that
/// offers the large-DMB extension (and a daemon that registers them).
fn default_size_code() -> u8 {
    static T: ForkOnce<u8> = ForkOnce::new();
    *T.get_or_init(|| {
        let v = config()
            .dmb_size
            .unwrap_or_else(|| tcp_capacity().max(1 << 20));
        smc_common::cdc::dmb_size_code_large(v.min(u32::MAX as u64) as u32)
    })
}

/// What loopback TCP holds in one direction before its reader reads: the sender's largest
/// send buffer (`net.ipv4.tcp_wmem` max) plus the receiver's initial receive buffer
/// (`tcp_rmem` default; autotuning grows it only as the reader reads). On Debian's defaults
/// loopback TCP holds a little less than this bound (docs/PERF.md, *Ring size*).
fn tcp_capacity() -> u64 {
    let field = |path: &str, i: usize| -> Option<u64> {
        std::fs::read_to_string(path)
            .ok()?
            .split_whitespace()
            .nth(i)?
            .parse()
            .ok()
    };
    let w = field("/proc/sys/net/ipv4/tcp_wmem", 2).unwrap_or(4 << 20);
    let r = field("/proc/sys/net/ipv4/tcp_rmem", 1).unwrap_or(128 << 10);
    w.saturating_add(r)
}

/// `code`, capped at what the daemon registers (6 for daemons without the extension; 6 when
/// it cannot be asked, the registration then fails anyway).
fn clamp_to_device(code: u8) -> u8 {
    if code <= smc_common::cdc::DMB_MAX_SIZE_CODE {
        return code;
    }
    code.min(with_dev(|c| c.max_size_code()).unwrap_or(smc_common::cdc::DMB_MAX_SIZE_CODE))
}

/// What load time settles beyond the environment ([`crate::util::config`]): the default DMB
/// size from this host's TCP buffers.
pub fn init_env() {
    let _ = default_size_code();
}

/// The server handshake continues after `accept` returns when its client's next message is not
/// there yet (`SMC_ACCEPT_ASYNC=0`: it completes inside `accept` for blocking sockets).
fn accept_async() -> bool {
    config().accept_async
}

fn no_shortcut() -> bool {
    config().no_shortcut
}

/// Without attached eBPF programs every opt-in fails with ENOPROTOOPT: stop trying.
static NO_BPF: AtomicBool = AtomicBool::new(false);

/// `setsockopt(SMC_SO_ENABLE)`; false when nothing is attached (the socket stays plain).
pub fn opt_in(fd: i32) -> bool {
    if assume_peer() {
        // Test mode without eBPF: both ends are known to run the library.
        return true;
    }
    if NO_BPF.load(Ordering::Relaxed) {
        return false;
    }
    if let Err(e) = set_bpf_opt(fd, SMC_SO_ENABLE, 1) {
        if e == libc::ENOPROTOOPT || e == libc::EOPNOTSUPP {
            NO_BPF.store(true, Ordering::Relaxed);
            disable("no eBPF programs attached to this cgroup (ENOPROTOOPT)");
        }
        return false;
    }
    // The handshake needs the programs' answer about this socket (did the peer announce?). A
    // process whose `getsockopt` is refused (a seccomp filter or LSM: sandboxed programs)
    // would take an announced peer for one without SMC and read its Proposal as application
    // bytes (red team rt25 `rt25_sandbox.sh gsopt server`: 6 of 6 connections broke, the
    // server read `e2 d4 c3 d9` as a length): it does not announce at all, as without eBPF.
    if let Err(e) = sock_state_or_errno(fd) {
        if e != libc::ENOPROTOOPT && e != libc::EOPNOTSUPP {
            let _ = set_bpf_opt(fd, SMC_SO_ENABLE, 0);
            debug!("fd {fd}: the eBPF state cannot be read (errno {e}): TCP, no SMC announced");
            return false;
        }
    }
    // The statistics file now, not at the first decision: a process at its descriptor limit
    // (an event loop that accepted or connected everything at once) may have none to spare by
    // then, and its figures would stay in an anonymous page nobody reads.
    let _ = crate::stats::get();
    true
}

fn sock_state(fd: i32) -> Option<SockState> {
    sock_state_or_errno(fd).ok()
}

/// [`sock_state`], or the errno of the `getsockopt` that did not answer (errno preserved).
fn sock_state_or_errno(fd: i32) -> Result<SockState, i32> {
    let mut st = SockState::default();
    let mut len = std::mem::size_of::<SockState>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer.
    let r = unsafe {
        real::getsockopt(
            fd,
            SOL_SMC_BPF,
            SMC_SO_STATE,
            &mut st as *mut SockState as *mut libc::c_void,
            &mut len,
        )
    };
    let e = real::errno();
    real::set_errno(e0);
    if r == 0 {
        Ok(st)
    } else {
        Err(e)
    }
}

fn assume_peer() -> bool {
    config().assume_peer
}

/// What the programs saw of the peer: no SMC announcement, one from another host, or one from
/// this host (the only peer our loopback-ism device can serve).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PeerSmc {
    No,
    Remote,
    SameHost,
    /// A passive socket the eBPF quarantine took before we claimed it (its listener was
    /// withdrawn for an exec into an image without the data path, `smc_common::bpf`
    /// [`SOCK_QUARANTINED`]): its client's Proposal is stripped off the stream (or, when the
    /// quarantine map was full, still comes). Declined as [`PeerSmc::Remote`]'s: a Proposal
    /// that comes is answered, and the client's application bytes end the wait for one that
    /// does not.
    Quarantined,
    /// The programs' answer was refused (a seccomp filter or LSM that denies `getsockopt`:
    /// `EPERM`, `EACCES`, `ENOSYS`), not "nothing attached" (`ENOPROTOOPT`). [`opt_in`] keeps
    /// such a process from announcing, so this is a listener that opted in before the filter
    /// came (a server that sandboxes itself after `listen`): its announcement is withdrawn (no
    /// later client proposes), and the connection continues as [`PeerSmc::No`]'s (a client
    /// that announced before that reads no Accept and falls back; its Proposal reaches the
    /// application, as before: the residual of red team rt25 `rt25_sandbox.sh gsopt late`).
    Unknown,
}

fn peer_smc(fd: i32) -> PeerSmc {
    if assume_peer() {
        return PeerSmc::SameHost;
    }
    match sock_state_or_errno(fd) {
        Ok(s) if s.flags & SOCK_QUARANTINED != 0 => PeerSmc::Quarantined,
        Ok(s) if s.flags & SOCK_PEER_SMC == 0 => PeerSmc::No,
        Ok(s) if s.flags & SOCK_SAME_HOST != 0 => PeerSmc::SameHost,
        Ok(_) => PeerSmc::Remote,
        Err(libc::ENOPROTOOPT | libc::EOPNOTSUPP) => PeerSmc::No,
        Err(_) => PeerSmc::Unknown,
    }
}

/// The CLC machine of a server whose client announced SMC: a client on another host (a Linux
/// host with SMC announces exactly this option) gets a Decline for its Proposal, never our GID.
fn machine_for(server: bool, size_code: u8, peer: PeerSmc) -> Handshake {
    let m = machine(server, size_code);
    if matches!(peer, PeerSmc::Remote | PeerSmc::Quarantined) {
        m.device_unavailable(Diag::NoSmcdDev)
    } else {
        m
    }
}

/// What the eBPF state of a socket that came from elsewhere (`SCM_RIGHTS`, `exec`) says of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum SmcLook {
    /// Not an SMC connection: one end did not announce SMC, or the connection stays TCP.
    No,
    /// An established SMC connection whose doorbells take the shortcut.
    Yes,
    /// Both ends announced SMC and it did not stay TCP, but its doorbells do not take the
    /// shortcut: an SMC connection with the shortcut off (`SMC_NO_SHORTCUT=1`), or a server
    /// end whose client was gone before its DMB could be attached (no grant). Only the daemon
    /// can tell (`OP_ADOPT`); if it knows no DMB of the socket, the socket is TCP's.
    Maybe,
}

/// The eBPF state of an established SMC connection's TCP socket.
pub fn smc_conn_look(fd: i32) -> SmcLook {
    use smc_common::bpf::{SOCK_OPTED_IN, SOCK_SHORTCUT, SOCK_TCP};
    let Some(s) = sock_state(fd) else {
        return SmcLook::No;
    };
    let both = SOCK_OPTED_IN | SOCK_PEER_SMC;
    if s.flags & both != both || s.flags & SOCK_TCP != 0 {
        SmcLook::No
    } else if s.flags & SOCK_SHORTCUT != 0 {
        SmcLook::Yes
    } else {
        SmcLook::Maybe
    }
}

/// Withdraw (`false`) or restore (`true`) the SMC announcement of listener `fd`'s SYN-ACKs
/// (`SMC_SO_ENABLE` on a listening socket; see `smc_common::bpf::MAP_LISTENERS`), errno
/// preserved. Whether the programs took it.
pub fn announce(fd: i32, on: bool) -> bool {
    set_bpf_opt(fd, SMC_SO_ENABLE, on.into()).is_ok()
}

fn shortcut(fd: i32) {
    if !no_shortcut() {
        set_bpf_flag(fd, SMC_SO_SHORTCUT);
    }
}

/// The connection stays TCP after both ends announced SMC: out of the SOCKHASH (see
/// `smc_common::bpf::SMC_SO_TCP`), so that it reads and writes as plain TCP.
fn leave_shortcut(fd: i32) {
    set_bpf_flag(fd, SMC_SO_TCP);
}

/// The connection switches to TCP mid-stream (`Conn::switch_to_tcp`): the doorbell shortcut
/// off and, through the daemon (root: `OP_LEAVE_SHORTCUT`), the socket out of the SOCKHASH, so
/// that it reads and writes as plain TCP for whatever image holds it (a SOCKHASH member reads
/// through `tcp_bpf`, see `member.rs`; an established SMC-D socket gets no more `sock_ops`
/// callbacks that would take it out). False when that could not be done. `vforked`: the
/// caller runs in a `vfork` child, whose descriptor table is a copy that may no longer hold
/// (or may reuse) the number of its parent's daemon connection: the request goes over a
/// connection of its own, closed after it.
pub(crate) fn leave_shortcut_for_tcp(fd: i32, vforked: bool) -> bool {
    // Best effort, as `set_bpf_flag`: the daemon's answer below is what counts.
    let _ = set_bpf_opt(fd, SMC_SO_SHORTCUT, 0);
    leave_shortcut(fd);
    let r = request_for_tcp(vforked, |d| d.leave_shortcut(fd));
    if let Err(e) = &r {
        debug!("fd {fd}: the daemon did not take the socket out of the SOCKHASH: {e}");
    }
    r.is_ok()
}

/// A daemon request of a connection going (or staying) TCP: over the process's connection
/// ([`crate::daemon::with_dev_for_tcp`]), or, `vforked`, over one of its own, closed after it
/// (a `vfork` child's descriptor table may not hold its parent's). Errors as decline codes.
fn request_for_tcp<T>(
    vforked: bool,
    f: impl FnOnce(&smc_ism::SharedClient) -> Result<T, smc_ism::IsmError>,
) -> Result<T, u32> {
    if vforked {
        f(&smc_ism::SharedClient::new(
            crate::util::config::daemon_path(),
        ))
        .map_err(|e| e.decline_reason().diagnosis())
    } else {
        crate::daemon::with_dev_for_tcp(f)
    }
}

/// The daemon quarantines the connections queued at listener `fd`, whose announcement was
/// just withdrawn for an exec into an image without the data path (`smc_ism` `OP_SWEEP`; see
/// `lifecycle::Withdrawn::sweep_unless_served`). `vforked`: as [`leave_shortcut_for_tcp`]. A
/// daemon that cannot leaves them as before (they are read by that image with their clients'
/// Proposals; logged).
pub(crate) fn sweep_listener(fd: i32, vforked: bool) {
    let e0 = real::errno();
    if let Err(e) = request_for_tcp(vforked, |d| d.sweep(fd)) {
        debug!("fd {fd}: the daemon did not sweep the listener's queue: {e}");
    }
    real::set_errno(e0);
}

/// Before the FIN of client socket `fd` (`shutdown` for writing, or `close`) whose wait for
/// the server's Accept expired and that read nothing of its server since ([`Skip::sweep_peer`]):
/// the server end may still lie in its listener's queue, unaccepted, with our Proposal (and our
/// Decline) in its stream. Should that listener go to an image without the data path later,
/// the exec's sweep could no longer quarantine it once our FIN made it `CLOSE_WAIT` (a sockmap
/// takes only established sockets), and that image would read our CLC bytes (red team round 20,
/// `rt20_greet.py hc`). So the daemon quarantines it now, unless a data path claimed it
/// (`smc_ism` `OP_SWEEP` of a client socket): a data path that accepts it later continues on
/// TCP with us, without CLC. Once per connection, never from a signal handler; a daemon that
/// cannot leaves it as before (logged). Errno preserved.
pub(crate) fn sweep_peer_before_fin(fd: i32, s: &Skip) {
    if s.server
        || s.done()
        || crate::signals::in_handler()
        || !s.sweep_peer.swap(false, Ordering::AcqRel)
    {
        return;
    }
    let e0 = real::errno();
    // Bounded: a daemon busy with other sweeps (a burst of such closes) must not hold up the
    // program's close for long; the FIN then goes as before.
    const WAIT: std::time::Duration = std::time::Duration::from_millis(100);
    match request_for_tcp(false, |d| d.sweep_peer(fd, WAIT)) {
        Ok(()) => debug!("fd {fd}: before our FIN, the daemon swept the server end"),
        Err(e) => debug!("fd {fd}: the daemon did not sweep the server end: {e:#x}"),
    }
    real::set_errno(e0);
}

/// `setsockopt(fd, SOL_SMC_BPF, name, 1)`, errno preserved (outside an attached cgroup the
/// kernel refuses it, which changes nothing).
fn set_bpf_flag(fd: i32, name: i32) {
    let _ = set_bpf_opt(fd, name, 1);
}

/// `setsockopt(fd, SOL_SMC_BPF, name, value)`, errno preserved: `Err(errno)` when the programs
/// did not take it.
fn set_bpf_opt(fd: i32, name: i32, value: u32) -> Result<(), i32> {
    let e0 = real::errno();
    // SAFETY: valid option buffer.
    let r = unsafe {
        real::setsockopt(
            fd,
            SOL_SMC_BPF,
            name,
            &value as *const u32 as *const libc::c_void,
            4,
        )
    };
    let e = real::errno();
    real::set_errno(e0);
    if r == 0 {
        Ok(())
    } else {
        Err(e)
    }
}

/// SO_ERROR (consumes it).
pub fn so_error(fd: i32) -> i32 {
    let mut v: i32 = 0;
    let mut len = 4 as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            &mut v as *mut i32 as *mut libc::c_void,
            &mut len,
        )
    };
    real::set_errno(e0);
    if r != 0 {
        -1
    } else {
        if v != 0 {
            // Put it back for the application: we cannot, so remember nothing and report.
        }
        v
    }
}

/// Whether the socket is connected, without consuming SO_ERROR (0 = connected).
pub fn so_error_peek(fd: i32) -> i32 {
    // SAFETY: `libc::sockaddr_storage` is plain integers, for which all-zero bytes are a valid
    // value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer.
    let r = unsafe { real::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
    real::set_errno(e0);
    if r == 0 {
        0
    } else {
        -1
    }
}

pub fn count_pending() {
    stats::pending();
}

// ---------------------------------------------------------------------------------------
// SO_RCVBUF hints

static HINTS: ForkMutex<HashMap<i32, i32>> = ForkMutex::new(HashMap::new);

fn hints() -> &'static ForkMutex<HashMap<i32, i32>> {
    &HINTS
}
static HINTS_N: AtomicU64 = AtomicU64::new(0);

/// Turns the socket's own `SO_PEEK_OFF` off: an SMC connection keeps the value for its
/// stream (`Conn::set_peek_off`), and the library's peeks at the socket (the doorbell
/// channel, the switch marker) must start at its read position.
pub fn peek_off_off(fd: i32) {
    crate::util::set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, -1);
}

pub fn note_rcvbuf(fd: i32, v: i32) {
    let mut h = hints().lock();
    if h.insert(fd, v).is_none() {
        HINTS_N.fetch_add(1, Ordering::Relaxed);
    }
}

/// A new socket on `fd`: a hint left by an earlier socket of that number does not apply.
pub fn forget_rcvbuf(fd: i32) {
    if HINTS_N.load(Ordering::Relaxed) > 0 {
        let mut h = hints().lock();
        if h.remove(&fd).is_some() {
            HINTS_N.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

fn size_code_for(fd: i32, listener: Option<i32>) -> u8 {
    if HINTS_N.load(Ordering::Relaxed) > 0 {
        let h = hints().lock();
        let v = h
            .get(&fd)
            .or_else(|| listener.and_then(|l| h.get(&l)))
            .copied();
        drop(h);
        if let Some(v) = v {
            if v > 0 {
                return clamp_to_device(smc_common::cdc::dmb_size_code_large(v as u32));
            }
        }
    }
    clamp_to_device(default_size_code())
}

/// In the child of a `fork` from a handler of a single-threaded process
/// ([`crate::ops::child_must_not_allocate`]): only what needs no allocation. Its handshakes
/// are the forking thread's, whose interrupted code carries them on if the child returns
/// from the handler; its daemon connection is made anew at its first use (by pid).
pub fn after_fork_child_of_handler() {
    ACCEPTING.store(0, Ordering::SeqCst);
    crate::daemon::forget_parents_releases();
}

pub fn after_fork_child() {
    // The threads of the parent waiting in `accept` do not exist here.
    ACCEPTING.store(0, Ordering::SeqCst);
    crate::daemon::after_fork_child();
    // A handshake still in the table: `fork` finished every one under way before forking
    // (`ops::fork`), so another thread of the parent started this one meanwhile (or a
    // pending connect's handshake, `Obj::Pending` decided or being decided). That thread does
    // not exist here, the parent carries the handshake on, and a second driver on the same
    // stream would steal its CLC messages: the child's copy of the fd cannot take part (reads
    // ECONNRESET, writes EPIPE) and waits for nothing (its lock may be held forever).
    // A skip whose lock a thread of the parent held (it was peeking at the stream): the same
    // skip with a free lock.
    let mut stuck = Vec::new();
    let mut skips = Vec::new();
    fdtable::for_each_object(|fd, o| match &**o {
        Obj::Handshake(h) => stuck.push((fd, h.server)),
        Obj::Pending(p) if p.lock.try_lock().map_or(true, |done| *done) => {
            stuck.push((fd, false));
        }
        Obj::Skip(s) if matches!(s.lock.try_lock(), Err(std::sync::TryLockError::WouldBlock)) => {
            skips.push((
                fd,
                s.state.load(Ordering::Acquire),
                s.server,
                s.sweep_peer.load(Ordering::Acquire),
            ));
        }
        _ => {}
    });
    for (fd, server) in stuck {
        drop(fdtable::replace(
            fd,
            Slot::Obj(Arc::new(Obj::Orphan(Skip::new(server)))),
        ));
    }
    for (fd, state, server, sweep) in skips {
        let s = Skip::new(server);
        s.state.store(state, Ordering::Release);
        s.sweep_peer.store(sweep, Ordering::Release);
        drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Skip(s)))));
    }
}

// ---------------------------------------------------------------------------------------
// the handshake

/// Counts a fallback and leaves the fd plain TCP. `member`: both ends had announced SMC, so the
/// socket is in the SOCKHASH until its next outgoing segment and its reads need
/// [`crate::member`] until then.
fn fallback(fd: i32, server: bool, code: u32, why: &str, member: bool) {
    debug!(
        "fd {fd}: {} fallback to TCP: {why} ({code:#010x} {})",
        if server { "server" } else { "client" },
        Diag::from_code(code).map_or("?", |d| d.name())
    );
    stats::fallback(server, code);
    if member {
        drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Tcp))));
        fdtable::epoll_refresh(fd);
    } else {
        settle_plain(fd);
    }
}

/// The fd is plain TCP for good: nothing to look up on its calls any more. It keeps its tag
/// only while an epoll set tracks it (so that its close cleans that up).
pub(crate) fn settle_plain(fd: i32) {
    let s = if fdtable::epoll_member(fd) {
        Slot::Tag(TAG_TCP)
    } else {
        Slot::Empty
    };
    drop(fdtable::replace(fd, s));
    fdtable::epoll_refresh(fd);
}

/// Sockets of this process that were SMC-D connections and go on as plain TCP sockets while
/// an epoll set of ours tracks them (their slot keeps the tag, [`settle_plain`]): a later
/// `connect` of such a socket (after `connect(AF_UNSPEC)`) must not opt in again, since its
/// eBPF socket state still says what the first connection's handshake found (the flags are
/// only ever added to). Forgotten when the number closes ([`unretire`]).
static RETIRED: ForkMutex<Vec<i32>> = ForkMutex::new(Vec::new);
static RETIRED_N: AtomicU64 = AtomicU64::new(0);

/// The socket of `fd`, once an SMC-D connection, continues as a plain TCP socket that may
/// connect again (`connect(AF_UNSPEC)`): it no longer announces SMC (its next SYN carries no
/// option, so that no server expects a CLC message from it), its number is plain (tagged only
/// while an epoll set tracks it), and its `connect`s go straight to the kernel.
pub(crate) fn retire(fd: i32) {
    // Outside an attached cgroup nothing announces SMC anyway.
    let _ = set_bpf_opt(fd, SMC_SO_ENABLE, 0);
    settle_plain(fd);
    if fdtable::raw(fd) & !1 == TAG_TCP {
        let mut v = RETIRED.lock();
        if !v.contains(&fd) {
            v.push(fd);
        }
        RETIRED_N.store(v.len() as u64, Ordering::Relaxed);
    }
}

/// Whether `fd` is a socket [`retire`]d while an epoll set tracks it.
pub(crate) fn retired(fd: i32) -> bool {
    RETIRED_N.load(Ordering::Relaxed) != 0 && RETIRED.lock().contains(&fd)
}

/// The number `fd` closes (or names something else now): it is no retired socket any more.
pub(crate) fn unretire(fd: i32) {
    if RETIRED_N.load(Ordering::Relaxed) != 0 {
        let mut v = RETIRED.lock();
        v.retain(|&x| x != fd);
        RETIRED_N.store(v.len() as u64, Ordering::Relaxed);
    }
}

/// `alone`: the switch-alone features negotiated (switch alone, and with our unread bytes);
/// `fresh`: the fresh-ACKs feature of the switch to TCP.
fn install(
    fd: i32,
    own: HeldDmb,
    peer: HeldDmb,
    role: Role,
    nonblock: bool,
    alone: (bool, bool),
    fresh: bool,
) -> bool {
    let (ot, pt) = (own.token, peer.token);
    let rel = DmbRelease {
        own: ot,
        peer: pt,
        own_id: own.id,
        peer_id: peer.id,
        own_state: own.state.is_some(),
    };
    let mut c = match Conn::new(
        own.map,
        peer.map,
        own.state,
        role,
        nonblock,
        Some(Box::new(rel)),
    ) {
        Ok(c) => c,
        Err(_) => {
            release_dmbs(Some(ot), Some(pt).filter(|&t| t != 0));
            return false;
        }
    };
    c.own_token = ot;
    c.peer_token = pt;
    if alone.0 {
        // Both ends count their control bytes and may switch to TCP alone.
        c.enable_switch_alone();
        if alone.1 {
            c.enable_alone_resend();
        }
    }
    if fresh {
        c.enable_fresh_acks();
    }
    // The CLC exchange (a message received, one sent back within the delayed-ACK time) put the
    // socket in ping-pong (delayed-ACK) mode, where a fresh TCP connection is not: out of it,
    // and, the shortcut carrying the doorbells, nothing over TCP puts it back before a switch to
    // TCP, whose first bytes (the peer's marker) and those of an image the peer execs after a
    // switch alone are then acknowledged at once, as a fresh connection's first data (see
    // `Conn::acks_fresh`). Our last CLC message went out whole (nothing of ours was
    // unacknowledged before it: no Nagle). The server's delayed ACK of the Confirm goes now.
    crate::util::set_sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
    // Set before the connection became SMC (or inherited from the listener).
    c.set_rcvlowat(fd);
    c.set_oobinline(fd);
    c.set_tcp_inq(fd);
    // O_ASYNC set before the connection became SMC (an accepted socket does not inherit it).
    // SAFETY: F_GETFL has no argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl >= 0 && fl & libc::O_ASYNC != 0 {
        c.set_async(true);
    }
    // SO_PEEK_OFF, as the socket holds it (set before, or inherited from the listener): the
    // stream's from now on, the socket's own off.
    let e0 = real::errno();
    let po = crate::util::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF);
    real::set_errno(e0);
    if let Some(v) = po.filter(|&v| v >= 0) {
        c.set_peek_off(v);
        peek_off_off(fd);
    }
    shortcut(fd);
    let o = Arc::new(Obj::Conn(c));
    drop(fdtable::replace(fd, Slot::Obj(o.clone())));
    fdtable::epoll_refresh(fd);
    stats::smc(role == Role::Server);
    debug!("fd {fd}: SMC-D established as {role:?}");
    true
}

/// Reset a connection whose byte stream can no longer be trusted (both ends must stop): the
/// peer sees EOF (then RST), our application `ECONNRESET` then EOF, `EPIPE` on writes.
fn reset(fd: i32) {
    crate::util::set_linger_reset(fd);
    // SAFETY: plain syscall.
    unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
    drop(fdtable::replace(
        fd,
        Slot::Obj(Arc::new(Obj::Orphan(Skip::new(false)))),
    ));
}

/// The end of a handshake that fell back: count it and leave the stream usable (plain TCP),
/// skipping (one late CLC message) or reset, as the machine's verdict requires.
fn after_fallback(
    fd: i32,
    server: bool,
    fb: Fallback,
    awaited: Option<MsgType>,
    lost: Option<crate::handshake::Lost>,
) {
    let code = match fb.reason {
        // Count the peer's own reason, as before (Linux records PEERDECL).
        FallbackReason::DeclinedByPeer { diag } => diag,
        r => r.diag_code(),
    };
    // A withdrawal (`Driver::withdraw`: the socket leaves the process mid-handshake) is a
    // decision, not an error.
    let error = match fb.reason {
        FallbackReason::Timeout | FallbackReason::Aborted => true,
        FallbackReason::DeclinedByUs { diag } => diag != Diag::OptUnsupp,
        _ => false,
    };
    if error {
        stats::handshake_error();
    }
    // Both ends announced SMC (the handshake ran), so the socket is in the SOCKHASH: it leaves
    // it now, through the daemon, rather than at its next outgoing segment. Until then the
    // kernel reads it through `tcp_bpf`, which is not quite TCP: `FIONREAD` counts only its
    // own queue (0 where TCP says 3: conformance `oob_two_before_read` with a 1 ms CLC
    // timer), a signal ends a blocking read with `EAGAIN`, a bad buffer reads 0. `member.rs`
    // still corrects what it can when the daemon cannot do it.
    leave_shortcut_for_tcp(fd, false);
    if fb.in_sync {
        if fb.sent_decline.is_some() {
            // Our Decline answered the peer's message; the peer's timer may have expired
            // meanwhile, and its own Decline may cross ours: skipped if it comes.
            fallback(fd, server, code, &format!("{:?}", fb.reason), true);
            drop(fdtable::replace(
                fd,
                Slot::Obj(Arc::new(Obj::Skip(Skip::decline_only(server)))),
            ));
            return;
        }
        return fallback(fd, server, code, &format!("{:?}", fb.reason), true);
    }
    match (fb.reason, awaited) {
        // The socket is at EOF or broken: the application learns it from the socket itself,
        // but only after what the peer sent before it went, which may be CLC messages (its
        // late answer, the Decline of its own timeout: seen with a client that came back
        // after its server had given up, declined and reset): skipped, never read as data.
        // Not a fallback: no connection goes on over TCP (counted as a handshake error only,
        // as Linux counts `srv_hshake_err_cnt`; haproxy resets the backend connection it just
        // opened when its client goes away, before the backend read the Confirm).
        (FallbackReason::Aborted, _) => {
            debug!(
                "fd {fd}: {} handshake: connection lost ({code:#010x})",
                if server { "server" } else { "client" }
            );
            drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Tcp))));
            fdtable::epoll_refresh(fd);
            let o = match lost {
                // Our read took the socket's error, with nothing queued before it (nor to
                // come: the connection is reset): the application's next read or write
                // reports it, not EOF or EPIPE (red team round 30 `rt30c_multi.py skillq`:
                // every client of a server killed with them queued read EOF). Or a server's
                // client left: its first write passes (red team round 30 `rt30c_abrupt.c
                // cnbgreet`: a greeting server's first write said EPIPE, SIGPIPE).
                Some(l) => Obj::Orphan(Skip::lost(server, l)),
                None => Obj::Skip(Skip::new(server)),
            };
            drop(fdtable::replace(fd, Slot::Obj(Arc::new(o))));
        }
        // Our decline answers the message the peer waits for; its late message (and a
        // Decline of its own timeout after it) is skipped.
        (FallbackReason::Timeout, Some(MsgType::Accept | MsgType::Proposal)) => {
            debug!(
                "fd {fd}: timeout waiting for {awaited:?}: fallback, skip the late CLC messages"
            );
            stats::fallback(server, code);
            let skip = if server || awaited != Some(MsgType::Accept) {
                Skip::new(server)
            } else {
                Skip::after_accept_timeout()
            };
            drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Skip(skip)))));
        }
        _ => {
            debug!(
                "fd {fd}: handshake out of sync ({:?}, awaited {awaited:?}): connection reset",
                fb.reason
            );
            stats::fallback(server, code);
            reset(fd);
        }
    }
}

/// Client side, right after the TCP connection is established. `nonblock`: O_NONBLOCK of the
/// socket, when the caller knows it.
pub fn client_after_connect(fd: i32, nonblock: Option<bool>, dest: Option<Dest>) {
    let Some(mut d) = client_driver(fd, dest) else {
        return;
    };
    let Progress::Done(out) = d.step(true) else {
        unreachable!("a blocking step finishes")
    };
    let nb = nonblock.unwrap_or_else(|| crate::util::nonblocking(fd));
    finish(fd, false, out, nb);
}

/// Blocking `connect` calls of opted-in sockets under way (`ops::connect`, from the kernel's
/// connect to the return): such a call drives its client handshake to its end inside the call
/// ([`client_after_connect`]) with a driver of the calling thread's own, and the fd has no
/// object in the table until it is decided. An `exec` by another thread of the process ends that thread and would hand the
/// next image a socket in the middle of its handshake, whose server's Accept it then reads as
/// data (red team rt25 `rt25.c texec_during_handshake`: the image read 130 bytes of
/// `e2 d4 c3 c4 ...`, the server's library reset the connection; TCP: `ping`, `pong`). Such an
/// exec waits for them first ([`wait_for_driven_handshakes`]). Per slot: the fd + 1 and the
/// driving thread (pid in the high 32 bits, tid in the low). No allocation.
const DRIVING_MAX: usize = 16;
static DRIVING_FD: [std::sync::atomic::AtomicI32; DRIVING_MAX] =
    [const { std::sync::atomic::AtomicI32::new(0) }; DRIVING_MAX];
static DRIVING_BY: [AtomicU64; DRIVING_MAX] = [const { AtomicU64::new(0) }; DRIVING_MAX];

fn this_thread() -> u64 {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() } as u32 as u64;
    (crate::pid() as u64) << 32 | tid
}

/// A slot of [`DRIVING_FD`] held while a blocking `connect` of an opted-in socket, or an
/// `accept` on a listener that announces, drives its handshake (none when all are taken: an
/// exec then does not wait for that one, as before).
pub(crate) struct BlockingDrive(Option<usize>);

impl BlockingDrive {
    pub(crate) fn enter(fd: i32) -> Self {
        for (i, slot) in DRIVING_FD.iter().enumerate() {
            if slot
                .compare_exchange(0, fd + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                if let Some(by) = DRIVING_BY.get(i) {
                    by.store(this_thread(), Ordering::Release);
                }
                return Self(Some(i));
            }
        }
        Self(None)
    }
}

impl Drop for BlockingDrive {
    fn drop(&mut self) {
        let Some(i) = self.0 else { return };
        if let (Some(by), Some(slot)) = (DRIVING_BY.get(i), DRIVING_FD.get(i)) {
            by.store(0, Ordering::Release);
            slot.store(0, Ordering::Release);
        }
    }
}

/// Before this process's own `exec`: waits until the client handshakes other threads of it
/// drive inside a blocking `connect` ([`BlockingDrive`]) are decided, at most
/// `2 x SMC_CLC_TIMEOUT_MS + 1 s` in all; then they are settled as any other (SMC-D: switched
/// or handed on; TCP: skipped). Also when the fd is close-on-exec: a duplicate of it may be
/// inherited. No allocation.
pub fn wait_for_driven_handshakes() {
    let deadline = Instant::now() + clc_timeout() * 2 + Duration::from_secs(1);
    for i in 0..DRIVING_MAX {
        wait_for_driven_slot(i, None, deadline);
    }
}

/// Before `fd` is duplicated (`dup`, `dup2`, `F_DUPFD`): a handshake another thread drives on
/// it inside a blocking `connect` is waited for (bounded as above), so that the copy names the
/// decided connection, not the plain socket the table holds until then (red team rt25
/// `rt25_texec.py`: a `dup2` onto fd 20 during that handshake, then an exec).
pub fn wait_for_driven_handshake_of(fd: i32) {
    if DRIVING_FD.iter().all(|s| s.load(Ordering::Relaxed) == 0) {
        return;
    }
    let deadline = Instant::now() + clc_timeout() * 2 + Duration::from_secs(1);
    for i in 0..DRIVING_MAX {
        wait_for_driven_slot(i, Some(fd), deadline);
    }
}

/// Waits while slot `i` of [`DRIVING_FD`] holds a handshake (on `fd`, when given) that another
/// thread of this process drives: not a thread's own (a call from a handler that interrupted
/// its connect), nor another process's (slots copied by `fork`).
fn wait_for_driven_slot(i: usize, fd: Option<i32>, deadline: Instant) {
    let (Some(slot), Some(by)) = (DRIVING_FD.get(i), DRIVING_BY.get(i)) else {
        return;
    };
    let f = slot.load(Ordering::Acquire);
    if f == 0 || fd.is_some_and(|fd| fd + 1 != f) {
        return;
    }
    let owner = by.load(Ordering::Acquire);
    if owner == this_thread() || owner >> 32 != crate::pid() as u64 {
        return;
    }
    debug!(
        "fd {}: another thread drives its handshake: waiting for it",
        f - 1
    );
    while slot.load(Ordering::Acquire) == f && Instant::now() < deadline {
        // SAFETY: no descriptors: a 1 ms sleep.
        unsafe { real::poll(std::ptr::null_mut(), 0, 1) };
    }
}

/// The client's handshake driver once its TCP connect completed; `None` when the server did
/// not announce SMC (the fd falls back: plain TCP). Whether the server is on this host cannot
/// be told yet (its end becomes established when our ACK arrives, maybe after connect
/// returned): the server decides that (see `server_after_accept`) and declines a Proposal from
/// another host.
fn client_driver(fd: i32, dest: Option<Dest>) -> Option<Driver> {
    if matches!(peer_smc(fd), PeerSmc::No | PeerSmc::Unknown) {
        note_dest(dest, false);
        fallback(
            fd,
            false,
            Diag::PeerNoSmc.code(),
            "peer did not announce SMC",
            false,
        );
        return None;
    }
    note_dest(dest, true);
    let sc = size_code_for(fd, None);
    Some(Driver::new(machine(false, sc), fd, false, sc))
}

/// Server side, right after accept: `fd` is the accepted socket, `nonblock` its O_NONBLOCK.
/// A blocking socket (thread- or process-per-connection servers) completes the handshake here
/// while no other connection waits in the listener's queue; a non-blocking one (an event
/// loop), or a blocking one with others queued behind it, runs it as far as the client's
/// messages are there, and the rest happens at the fd's next operation or poll
/// ([`Obj::Handshake`]): an accept loop is never held up by a client that announces SMC and
/// stays silent (`SMC_ACCEPT_ASYNC=0`: every accepted socket completes it here). An fd that leaves the process before its first operation (passed
/// with `SCM_RIGHTS`, kept across `exec`) is decided before it goes ([`settle_leaving`]).
pub fn server_after_accept(lfd: i32, fd: i32, nonblock: bool) {
    let peer = peer_smc(fd);
    if peer == PeerSmc::Unknown && announce(lfd, false) {
        debug!("fd {lfd}: the eBPF state cannot be read (getsockopt refused): the listener no longer announces SMC");
    }
    if matches!(peer, PeerSmc::No | PeerSmc::Unknown) {
        fallback(
            fd,
            true,
            Diag::PeerNoSmc.code(),
            "peer did not announce SMC",
            false,
        );
        return;
    }
    let sc = size_code_for(fd, Some(lfd));
    if peer == PeerSmc::Remote {
        debug!("fd {fd}: the client announced SMC from another host: its Proposal is declined");
    }
    if peer == PeerSmc::Quarantined {
        debug!("fd {fd}: quarantined before we claimed it: a Proposal that comes is declined");
    }

    let mut d = Driver::new(machine_for(true, sc, peer), fd, true, sc);
    // Not waiting here for: a client from another host (one that announces SMC and then stays
    // silent would stall the accept loop for everyone: its Proposal is answered at the
    // connection's first operation); a client of this very process in its own handshake (it
    // connected to our listener and continues at its next operation, maybe in this thread:
    // waiting for its Confirm here could wait for ourselves).
    let mut own_client = own_client_handshake(fd);
    let block = !(own_client || nonblock && accept_async()) && peer == PeerSmc::SameHost;
    // A blocking socket (thread- or process-per-connection servers) waits here for its
    // client's CLC messages, but only while nobody else waits to be accepted: a client that
    // announces SMC and stays silent must not hold up the connections queued behind it.
    // Handed back undecided, its handshake continues at its first operation.
    let alone = block && accept_async();
    // A daemon that does not answer the attach of a client that confirmed is waited for at
    // the fd's next operation, not here: the accept loop goes on meanwhile.
    d.defer_daemon(true);
    let mut step = d.step(block && !alone);
    let mut slice = 1;
    while alone && matches!(step, Progress::WouldBlock) {
        // Our own client's `connect` notes its port only when the kernel's connect returned,
        // and this accept may have woken before that: looked at again between short waits
        // (1, 2, 4 … 100 ms), as waiting for its Confirm here would wait for a client that its
        // own thread drives (a thread that may wait for this accept: a stall of the CLC
        // timeout, then TCP).
        if own_client_handshake(fd) {
            own_client = true;
            debug!("fd {fd}: the client is a connection of this process: its handshake continues at the next operation");
            break;
        }
        // Connections accepted earlier are still in their handshakes: their clients wait for
        // our answers, which this thread gives only after this accept. If one of them is a
        // process that also holds this client (an asyncio client blocked in the write of its
        // first connection), each side would wait for the other until the CLC timeout.
        if crate::handshake::deferred_client_may_wait() {
            debug!("fd {fd}: other accepted connections are in their handshakes: this one continues at its next operation");
            break;
        }
        if !crate::handshake::wait_readable_unless(fd, lfd, slice) {
            debug!("fd {fd}: another connection waits to be accepted: the handshake continues at the next operation");
            break;
        }
        slice = (slice * 2).min(100);
        step = d.step(false);
    }
    match step {
        Progress::Done(out) => finish(fd, true, out, nonblock),
        Progress::WouldBlock => {
            d.defer_daemon(false);
            d.count_deferred();
            debug!("fd {fd}: server handshake continues at the next operation");
            let o = Arc::new(Obj::Handshake(crate::obj::Handshake::new(
                Box::new(d),
                nonblock,
                true,
                own_client,
            )));
            if own_client {
                note_own_end(true, port_of(fd, true), fd, &o);
            }
            drop(fdtable::replace(fd, Slot::Obj(o)));
        }
    }
}

/// Local ports of this process's client connections whose handshake is under way
/// ([`client_start`]), and of its SMC listeners: a connect to our own listener, and the accept
/// of our own client, must not wait for the other end inside the call.
static OWN_CLIENTS: ForkMutex<Vec<u16>> = ForkMutex::new(Vec::new);
static OWN_CLIENTS_N: AtomicU64 = AtomicU64::new(0);

/// Accepted sockets of this process whose client is a connection of this process too, left
/// undecided by `accept` (it must not wait for a client that may be its own thread): the
/// client's port, the server's fd and its object. The client drives them
/// ([`nudge_own_peer`]). At most 64; dead and decided ones are pruned as they are seen.
type OwnEnd = (u16, i32, std::sync::Weak<Obj>);
static OWN_SERVERS: ForkMutex<Vec<OwnEnd>> = ForkMutex::new(Vec::new);
static OWN_SERVERS_N: AtomicU64 = AtomicU64::new(0);
/// Likewise the client ends (by their port) of this process's connections to its own
/// listeners, left undecided by a non-blocking `connect`: their server ends drive them, so that
/// a server that speaks first (its write waits for the Confirm) in the thread that also holds
/// the client is not left waiting for a client nobody drives.
static OWN_CLIENT_ENDS: ForkMutex<Vec<OwnEnd>> = ForkMutex::new(Vec::new);
static OWN_CLIENT_ENDS_N: AtomicU64 = AtomicU64::new(0);

/// The undecided ends of this process's own connections that the other end, a server end
/// (`server`) or a client end, drives.
fn own_ends(server: bool) -> (&'static ForkMutex<Vec<OwnEnd>>, &'static AtomicU64) {
    if server {
        (&OWN_CLIENT_ENDS, &OWN_CLIENT_ENDS_N)
    } else {
        (&OWN_SERVERS, &OWN_SERVERS_N)
    }
}

/// Remembers an undecided end (`server`: a server end, for its client to drive; else a
/// client end, for its server) of a connection of this process to itself, by the client's
/// port.
fn note_own_end(server: bool, client_port: Option<u16>, fd: i32, o: &Arc<Obj>) {
    let Some(p) = client_port else { return };
    let (list, n) = own_ends(!server);
    let mut v = list.lock();
    v.retain(|(_, _, w)| w.strong_count() > 0);
    if v.len() >= 64 {
        v.remove(0);
    }
    v.push((p, fd, Arc::downgrade(o)));
    n.store(v.len() as u64, Ordering::Relaxed);
}

/// Drive, without waiting, the undecided other end of our own connection `fd` (a server end
/// when `server`, else a client end) when it is a socket of this process (true when it was
/// stepped). Skipped while another thread drives it (its lock is held). The other end's number
/// is used only while our table still holds that very object there, and a close of it waits
/// until we are done ([`crate::obj::Handshake::nudged`]), so the step never reads or writes a
/// file that reused the number.
fn nudge_own_peer(fd: i32, server: bool) -> bool {
    // The client's port: its local one, or the server's peer port.
    let Some(port) = port_of(fd, server) else {
        return false;
    };
    let (list, n) = own_ends(server);
    let found = {
        let mut v = list.lock();
        v.retain(|(_, _, w)| w.strong_count() > 0);
        n.store(v.len() as u64, Ordering::Relaxed);
        v.iter()
            .find(|(p, _, _)| *p == port)
            .and_then(|(_, sfd, w)| Some((*sfd, w.upgrade()?)))
    };
    let Some((sfd, o)) = found else {
        return false;
    };
    let Obj::Handshake(sh) = &*o else {
        return false;
    };
    let Ok(g) = sh.driver.try_lock() else {
        return false;
    };
    if g.is_none() {
        return false;
    }
    sh.nudged.store(true, Ordering::SeqCst);
    // The number it was noted under, or another one naming it now: a `dup` then `close` of
    // that number moved it (and the number may name another socket now). Without this, its
    // server waited out the CLC timeout for a Confirm nobody drove, then fell back to TCP.
    let sfd = if fdtable::get(sfd).is_some_and(|x| Arc::ptr_eq(&x, &o)) {
        Some(sfd)
    } else {
        let mut now = None;
        fdtable::for_each_object(|f, x| {
            if now.is_none() && Arc::ptr_eq(x, &o) {
                now = Some(f);
            }
        });
        if let Some(f) = now {
            let mut v = list.lock();
            if let Some(e) = v
                .iter_mut()
                .find(|(_, _, w)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&o)))
            {
                e.1 = f;
            }
        }
        now
    };
    let stepped = if let Some(sfd) = sfd {
        let mut g = g;
        let step = match g.as_mut() {
            Some(d) => {
                d.set_fd(sfd);
                d.step(false)
            }
            None => Progress::WouldBlock,
        };
        if settle(sfd, sh, g, step) {
            debug!("fd {sfd}: handshake decided by the other end of its own process, fd {fd}");
        }
        true
    } else {
        drop(g);
        false
    };
    sh.nudged.store(false, Ordering::SeqCst);
    stepped
}

fn port_of(fd: i32, peer: bool) -> Option<u16> {
    // SAFETY: a zeroed sockaddr_storage is valid; out pointers are ours.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr;
    let e0 = real::errno();
    // SAFETY: valid out buffers.
    let r = unsafe {
        if peer {
            real::getpeername(fd, p, &mut len)
        } else {
            libc::getsockname(fd, p, &mut len)
        }
    };
    real::set_errno(e0);
    if r != 0 {
        return None;
    }
    match ss.ss_family as i32 {
        // SAFETY: the family says which layout it is.
        libc::AF_INET => Some(u16::from_be(unsafe {
            (*(p as *const libc::sockaddr_in)).sin_port
        })),
        libc::AF_INET6 => {
            // SAFETY: as above.
            Some(u16::from_be(unsafe {
                (*(p as *const libc::sockaddr_in6)).sin6_port
            }))
        }
        _ => None,
    }
}

fn own_client_handshake(fd: i32) -> bool {
    if OWN_CLIENTS_N.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let Some(p) = port_of(fd, true) else {
        return false;
    };
    OWN_CLIENTS.lock().contains(&p)
}

/// The object of our listener `fd` (its port is one of this process's own listeners while
/// it lives, [`crate::obj::Listen`]).
pub fn listener_obj(fd: i32) -> Obj {
    Obj::Listener(crate::obj::Listen::new(port_of(fd, false)))
}

/// Whether this process has one thread ([`crate::util::one_thread`]). A blocking connect to
/// our own listener in such a process can only be accepted by this thread, after the call.
pub fn single_threaded() -> bool {
    crate::util::one_thread()
}

/// Threads of this process inside an `accept` on a listener of ours (a blocking one waits
/// there for the next connection).
static ACCEPTING: AtomicU64 = AtomicU64::new(0);

/// Held by a thread for the duration of its `accept` on a listener of ours
/// ([`accept_waiter`]).
pub struct AcceptWaiter(());

impl Drop for AcceptWaiter {
    fn drop(&mut self) {
        ACCEPTING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts the calling thread as accepting until the guard drops.
pub fn accept_waiter() -> AcceptWaiter {
    ACCEPTING.fetch_add(1, Ordering::SeqCst);
    AcceptWaiter(())
}

/// How long a blocking connect to our own listener waits inside the call while no thread of
/// this process is in `accept` on one of our listeners ([`client_connect_own`]).
const OWN_CONNECT_IDLE: Duration = Duration::from_millis(50);

/// A blocking connect to a listener of this process, in a process with other threads: the
/// handshake ends within the call, as for any server, while another thread is in `accept` (or
/// gets there within [`OWN_CONNECT_IDLE`]). When none does, the thread that accepts may be
/// this one, after the call (a worker thread waits for something else): waiting on would take
/// the CLC timeout and a fallback, so the handshake goes on at the fd's next operation, as
/// after a non-blocking connect, and the accepting end drives it ([`nudge_own_peer`]).
pub fn client_connect_own(fd: i32, dest: Option<Dest>) {
    let Some(mut d) = client_driver(fd, dest) else {
        return;
    };
    let mut idle_since = Instant::now();
    let mut slice = Duration::from_micros(50);
    loop {
        let now = Instant::now();
        if let Progress::Done(out) = d.step_until(Some(Some(now + slice))) {
            return finish(fd, false, out, false);
        }
        let now = Instant::now();
        if ACCEPTING.load(Ordering::SeqCst) > 0 {
            idle_since = now;
        } else if now.duration_since(idle_since) >= OWN_CONNECT_IDLE {
            break;
        }
        slice = (slice * 2).min(Duration::from_millis(5));
    }
    // Known to an accept from now on; one that took the connection meanwhile waits for our
    // Confirm in short slices and finds it among ours between them (`server_after_accept`).
    let port = port_of(fd, false);
    note_own_client(port);
    debug!(
        "fd {fd}: no thread accepts our own listener: the handshake continues at the next \
         operation"
    );
    client_continues(fd, d, false, Some(port));
}

/// Whether `dest` is one of our own listeners' ports.
pub fn to_own_listener(dest: Option<Dest>) -> bool {
    dest.is_some_and(|d| crate::obj::own_listener_port(d.port()))
}

fn forget_own_client(port: Option<u16>) {
    if let Some(p) = port {
        let mut v = OWN_CLIENTS.lock();
        if let Some(i) = v.iter().position(|&x| x == p) {
            v.swap_remove(i);
        }
        OWN_CLIENTS_N.store(v.len() as u64, Ordering::Relaxed);
    }
}

/// Client side of a connection that is established, without waiting for the server inside
/// the call: the Proposal goes out, the rest happens at the fd's next operation or poll
/// ([`Obj::Handshake`]) — a non-blocking connect returns at once, also when the server accepts
/// much later or is this very thread. `nonblock`: O_NONBLOCK of the socket.
pub fn client_start(fd: i32, nonblock: bool, dest: Option<Dest>) {
    let Some(mut d) = client_driver(fd, dest) else {
        return;
    };
    // Known before the Proposal goes out: our accepting thread must find it.
    let peer_local = to_own_listener(dest);
    let port = if peer_local { port_of(fd, false) } else { None };
    note_own_client(port);
    match d.step(false) {
        Progress::Done(out) => {
            forget_own_client(port);
            finish(fd, false, out, nonblock)
        }
        Progress::WouldBlock => {
            debug!("fd {fd}: client handshake continues at the next operation");
            client_continues(fd, d, nonblock, peer_local.then_some(port));
        }
    }
}

/// `port` (a client connection's local port) belongs to a connection of this process to its
/// own listener whose handshake is under way: an accept of it must not wait for it.
fn note_own_client(port: Option<u16>) {
    if let Some(p) = port {
        let mut v = OWN_CLIENTS.lock();
        v.push(p);
        OWN_CLIENTS_N.store(v.len() as u64, Ordering::Relaxed);
    }
}

/// The client handshake `d` of `fd` goes on at the fd's next operation ([`Obj::Handshake`]);
/// `own`: the server end is a socket of this process (`Some` of the client's port), which
/// drives it ([`nudge_own_peer`]).
fn client_continues(fd: i32, d: Driver, nonblock: bool, own: Option<Option<u16>>) {
    let o = Arc::new(Obj::Handshake(crate::obj::Handshake::new(
        Box::new(d),
        nonblock,
        false,
        own.is_some(),
    )));
    if let Some(port) = own {
        note_own_end(false, port, fd, &o);
    }
    drop(fdtable::replace(fd, Slot::Obj(o)));
    fdtable::epoll_refresh(fd);
}

/// Carry an accepted connection's handshake on. `block`: wait for the client (until done);
/// otherwise only what is there. True when it is decided (the fd's slot changed).
pub fn progress(fd: i32, h: &crate::obj::Handshake, block: bool) -> bool {
    progress_until(fd, h, block.then_some(None))
}

/// As [`progress`]; `wait` as in [`Driver::step_until`] (`Some(Some(t))`: wait until `t` at
/// most).
pub fn progress_until(fd: i32, h: &crate::obj::Handshake, wait: Option<Option<Instant>>) -> bool {
    progress_or_withdraw(fd, h, wait, Before::Step, false)
}

/// How long a close of a handshake whose other end is a socket of this process drives both
/// ends to their decision ([`decide_own_before_close`]): the other end's driver may be held
/// by another thread for a step.
const OWN_CLOSE_WAIT: Duration = Duration::from_millis(100);

/// Before the close of `fd`, whose handshake `h` is undecided: when the other end is a socket
/// of this process, both ends are driven to their decision (the close then is an SMC-D
/// connection's, or a fallback's that skipped the late CLC messages), at most
/// [`OWN_CLOSE_WAIT`]. Another end is left alone: waiting for it would hold up the close.
pub fn decide_own_before_close(fd: i32, h: &crate::obj::Handshake) {
    // A call of another thread driving it right now (its step holds the driver for as long as
    // it waits) decides it: the close goes on as for any call under way (`ops::forget_slot`).
    if h.peer_local
        && h.calls.load(Ordering::SeqCst) == 0
        && own_ends(h.server).1.load(Ordering::Relaxed) > 0
    {
        progress_until(fd, h, Some(Some(Instant::now() + OWN_CLOSE_WAIT)));
    }
}

/// The application's close of a socket whose handshake is still under way (no other number
/// names it, no call drives it), as TCP's close: a FIN, now. Over TCP the close sends its FIN at
/// once; here the daemon may still hold the socket for the `PAIR` it was passed, so that the
/// FIN waited until the daemon let go of it, and the peer's CLC message that came meanwhile,
/// unread, made that last close a reset. A server whose client closed at once (a health check)
/// then read a reset where TCP's reads the FIN (`rt30c_abrupt.c cnbgreet`: 2 of 10 read
/// `ECONNRESET` after their greeting). So the peer's CLC messages already there are read, and
/// the socket is shut down for writing, unless the application asked for a reset (`SO_LINGER`
/// on with 0 s).
pub fn end_before_close(fd: i32, h: &crate::obj::Handshake) {
    if h.shared.load(Ordering::SeqCst) || h.calls.load(Ordering::SeqCst) != 0 {
        return;
    }
    let e0 = real::errno();
    // At most the peer's answer and a Decline after it.
    for _ in 0..4 {
        match crate::handshake::skip_one(fd, true) {
            Some(Some(t)) => debug!("fd {fd}: close: the peer's {t:?}, unread, read first"),
            _ => break,
        }
    }
    let mut lg = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: a valid out buffer and its length.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            std::ptr::from_mut(&mut lg).cast(),
            &mut len,
        )
    };
    if r != 0 || lg.l_onoff == 0 || lg.l_linger != 0 {
        // SAFETY: plain syscall on the application's socket, which it is closing.
        unsafe { real::shutdown(fd, libc::SHUT_WR) };
    }
    real::set_errno(e0);
}

/// As [`progress_until`], for a call that goes on with the connection once it is decided:
/// when another thread closed the number meanwhile, the decision is made on the private
/// duplicate that took the handshake's I/O, and left in [`crate::obj::Handshake::moved`] for
/// the call to continue on and then close.
pub fn progress_call(fd: i32, h: &crate::obj::Handshake, wait: Option<Option<Instant>>) -> bool {
    progress_or_withdraw(fd, h, wait, Before::Step, true)
}

/// A non-blocking write on a client handshake still waiting for its server's Accept: TCP
/// takes the bytes at once (the connection is established, queued at the listener), so the
/// client stops waiting for the Accept as at the end of its accept wait (Decline
/// `TIMEOUT_CL`, [`crate::handshake::Driver::accept_wait_over`]) and the write goes on TCP.
/// Before, it said `EAGAIN`, where a program that has just connected does not expect it
/// (CPython's `test_ssl`: a non-blocking TLS client's ClientHello to a listener of its own
/// thread, `SSLWantWriteError` in place of "want read"). A client whose connect completes for
/// the program only once decided (a non-blocking connect to another process's listener)
/// writes after that and never comes here; a client of its own process's listener is
/// writable at once. True when decided (as [`progress_call`]).
pub fn write_before_accept(fd: i32, h: &crate::obj::Handshake) -> bool {
    progress_or_withdraw(fd, h, None, Before::AcceptWaitOver, true)
}

/// What a call does to the handshake before its step ([`progress_or_withdraw`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Before {
    /// Nothing: the step alone.
    Step,
    /// Decline at our next message ([`crate::handshake::Driver::withdraw`]).
    Withdraw,
    /// A client stops waiting for its Accept ([`write_before_accept`]).
    AcceptWaitOver,
}

/// One call driving a handshake ([`crate::obj::Handshake::calls`]).
struct Driving<'a>(&'a crate::obj::Handshake);

impl Drop for Driving<'_> {
    fn drop(&mut self) {
        self.0.calls.fetch_sub(1, Ordering::SeqCst);
    }
}

/// [`progress_until`] after `before`; `continues`: as [`progress_call`].
fn progress_or_withdraw(
    fd: i32,
    h: &crate::obj::Handshake,
    wait: Option<Option<Instant>>,
    before: Before,
    continues: bool,
) -> bool {
    // Registered before the number is checked, as a close empties the slot before it looks for
    // calls (`ops::forget_slot`): either that close sees this call and redirects the
    // handshake's I/O to a private duplicate first, or this call sees the number closed and
    // does not touch the handshake (the call goes to what the number names now).
    h.calls.fetch_add(1, Ordering::SeqCst);
    let _driving = Driving(h);
    std::sync::atomic::fence(Ordering::SeqCst);
    if !fdtable::get(fd).is_some_and(|o| matches!(&*o, Obj::Handshake(x) if std::ptr::eq(x, h))) {
        return true;
    }
    // From a program's signal handler the interrupted code may be this very thread inside a
    // step of the handshake, holding its driver (red team rt13 `rt13_sigio.c`: a `SIGIO`
    // handler's `recv(MSG_DONTWAIT)` during the client's first `send` waited for ever): the
    // handshake is then simply not decided yet, as for any other holder that is busy.
    let mut g = if crate::signals::in_handler() {
        match h.driver.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return false,
        }
    } else {
        h.driver.lock().unwrap_or_else(|e| e.into_inner())
    };
    let Some(d) = g.as_mut() else {
        return true;
    };
    match before {
        Before::Step => {}
        Before::Withdraw => d.withdraw(),
        Before::AcceptWaitOver => d.accept_wait_over(),
    }
    // The handshake's I/O goes through the fd of this call: the one it started on may have
    // been closed after a dup, and its number reused by another file. (Once a number was
    // closed under a call, through the private duplicate instead: `Handshake::io`.)
    d.set_fd(fd);
    // A client of our own listener: the server end may be an accepted socket of this process
    // that no thread touches yet (its thread waits for something else): it answers our
    // Proposal only when driven, so we drive it as far as it goes without waiting. Likewise a
    // server end drives its client end of this process, which confirms only when driven (the
    // server may speak first, in the thread that holds the client).
    let own = || h.peer_local && own_ends(h.server).1.load(Ordering::Relaxed) > 0;
    if own() {
        nudge_own_peer(h.io.now(fd), h.server);
    }
    let mut step = match wait {
        // A call that waits: the other end may be an accepted socket of ours that no thread
        // drives (its thread may be this one, or wait for us elsewhere): wait in short slices
        // and drive it in between.
        Some(limit) if h.peer_local => {
            let mut slice = Duration::from_micros(50);
            loop {
                let now = Instant::now();
                let until = limit.map_or(now + slice, |l| l.min(now + slice));
                let s = d.step_until(Some(Some(until)));
                if matches!(s, Progress::Done(_)) || limit.is_some_and(|l| Instant::now() >= l) {
                    break s;
                }
                if own() {
                    nudge_own_peer(h.io.now(fd), h.server);
                }
                slice = (slice * 2).min(Duration::from_millis(5));
            }
        }
        _ => d.step_until(wait),
    };
    if own() && matches!(step, Progress::WouldBlock) && nudge_own_peer(h.io.now(fd), h.server) {
        step = d.step(false);
    }
    settle_as(fd, h, g, step, continues)
}

/// The end of one step of `h`'s driver (`g`: its lock, held): the decision is applied when
/// there is one. True when decided.
fn settle(
    fd: i32,
    h: &crate::obj::Handshake,
    g: std::sync::MutexGuard<'_, Option<Box<Driver>>>,
    step: Progress,
) -> bool {
    settle_as(fd, h, g, step, false)
}

/// [`settle`]; `continues`: as [`progress_call`].
fn settle_as(
    fd: i32,
    h: &crate::obj::Handshake,
    mut g: std::sync::MutexGuard<'_, Option<Box<Driver>>>,
    step: Progress,
    continues: bool,
) -> bool {
    match step {
        Progress::WouldBlock => false,
        Progress::Done(out) => {
            let d = g.take();
            // Pairs with the fence of `ops::forget_slot`: either its close of the number sees
            // this decision under way and waits for it (then closes what the number became),
            // or this sees the number closed, and that close is moving the handshake's I/O to
            // a private duplicate (this call is counted in `calls`): the decision goes there.
            let deciding = !h.io.redirected();
            if deciding {
                h.deciding.store(true, Ordering::SeqCst);
                std::sync::atomic::fence(Ordering::SeqCst);
                let ours = fdtable::get(fd)
                    .is_some_and(|o| matches!(&*o, Obj::Handshake(x) if std::ptr::eq(x, h)));
                if !ours {
                    h.deciding.store(false, Ordering::SeqCst);
                    wait_redirected(&h.io);
                }
            }
            // The number was closed under this step: the handshake's I/O went to our private
            // duplicate, and so does its decision; the number (whatever it names now) is not
            // touched.
            let moved = h.io.take_private();
            let at = moved.unwrap_or(fd);
            if h.peer_local && !h.server {
                forget_own_client(port_of(at, false));
            }
            let old = match moved {
                Some(p) => match fdtable::get(p).as_deref() {
                    Some(Obj::Private(w)) => w.upgrade(),
                    _ => None,
                },
                None if h.shared.load(Ordering::Relaxed) => fdtable::get(fd)
                    .filter(|o| matches!(&**o, Obj::Handshake(x) if std::ptr::eq(x, h))),
                None => None,
            };
            if let Some(p) = moved {
                debug!(
                    "fd {fd}: closed while a call drove its handshake: decided on our duplicate \
                     {p}"
                );
                drop(fdtable::replace(p, Slot::Empty));
            }
            finish(at, h.server, out, h.nonblock.load(Ordering::Relaxed));
            if let Some(old) = &old {
                share_decision(at, old);
            }
            if deciding {
                h.deciding.store(false, Ordering::SeqCst);
            }
            if let Some(p) = moved {
                // An object the call goes on with.
                if fdtable::raw(p) < 8 {
                    drop(fdtable::replace(p, Slot::Obj(Arc::new(Obj::Tcp))));
                }
                let ino = crate::obj::socket_ino(p).unwrap_or(0);
                if continues {
                    *h.moved.lock().unwrap_or_else(|e| e.into_inner()) = Some((p, ino));
                } else {
                    crate::fdtable::close_moved(p, ino);
                }
            }
            drop(g);
            drop(d);
            true
        }
    }
}

/// Waits until a close of the number a handshake was driven through has moved the handshake's
/// I/O off it (that close saw the call driving it: `ops::forget_slot`). Microseconds (one
/// `fcntl`); bounded at 2 s for a closing thread that never gets there.
fn wait_redirected(io: &crate::util::io_path::IoPath) {
    let start = Instant::now();
    let mut i = 0u32;
    while !io.redirected() && start.elapsed() < Duration::from_secs(2) {
        i += 1;
        if i < 64 {
            std::hint::spin_loop();
        } else if i < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// `fd` is about to be shared with another process (passed with `SCM_RIGHTS`, inherited across
/// `exec`), which cannot continue its handshake: our driver and the DMB mappings stay in this
/// process, and the CLC bytes still to come would reach the other one as data. So it is
/// decided first, declining wherever the protocol still allows it ([`Driver::withdraw`]): it
/// travels as plain TCP with its stream in sync. Only a server whose Accept is out already
/// ends on SMC when its client confirms (then the other process gets an SMC connection, which
/// fails cleanly there). Waits at most the CLC timeout for the peer's next message or for a
/// non-blocking connect to complete. errno is preserved.
pub fn settle_leaving(fd: i32) {
    settle_leaving_to(fd, false);
}

/// [`settle_leaving`]; `receiver_runs_library`: the process the fd goes to runs the library and
/// adopts an SMC connection (`SCM_RIGHTS` to a worker with the library): a server's handshake
/// is then driven to its end instead of declined, and the connection travels as SMC-D if it
/// ends there. Node's `cluster` primary (round robin) accepts each connection and passes it on
/// at once: about half of them were declined before (red team rt12 `rt12_node.js`).
pub fn settle_leaving_to(fd: i32, receiver_runs_library: bool) {
    let Some(o) = fdtable::get(fd) else { return };
    let e0 = real::errno();
    match &*o {
        Obj::Handshake(h) if h.server && receiver_runs_library => {
            debug!("fd {fd}: passed on during its handshake to a process with the library: completed first");
            progress_or_withdraw(fd, h, Some(None), Before::Step, false);
        }
        Obj::Handshake(h) => {
            debug!("fd {fd}: leaves the process during its handshake: declined, stays TCP");
            progress_or_withdraw(fd, h, Some(None), Before::Withdraw, false);
        }
        Obj::Pending(p) => {
            let mut done = p.lock.lock().unwrap_or_else(|e| e.into_inner());
            if !*done {
                let mut pfd = libc::pollfd {
                    fd,
                    events: libc::POLLOUT,
                    revents: 0,
                };
                let ms = clc_timeout().as_millis().min(i32::MAX as u128) as i32;
                // SAFETY: one pollfd.
                if unsafe { real::poll(&mut pfd, 1, ms) } > 0 {
                    *done = true;
                    drop(done);
                    debug!("fd {fd}: leaves the process before its handshake: declined, stays TCP");
                    if so_error(fd) != 0 {
                        settle_plain(fd);
                    } else {
                        client_declines(fd, p.dest);
                    }
                    if p.shared.load(Ordering::Relaxed) {
                        share_decision(fd, &o);
                    }
                } else {
                    debug!(
                        "fd {fd}: leaves the process while its connect is still under way: \
                         its handshake cannot be settled"
                    );
                }
            }
        }
        _ => {}
    }
    // A fallback (perhaps just decided above) with late CLC messages still to skip: the
    // receiver, or libc, could not skip them (red team rt12 `rt12_skip_scm.py`: a pre-fork
    // worker read the client's late Proposal, 4 to 8 of 30 connections with a 1 ms CLC timer).
    if let Some(o) = fdtable::get(fd) {
        if let Obj::Skip(s) = &*o {
            skip_before_libc(fd, &o, s);
        }
    }
    real::set_errno(e0);
}

/// A client whose connection is established declines instead of proposing (the server waits
/// for a CLC message: a Decline is its answer), and stays on TCP.
fn client_declines(fd: i32, dest: Option<Dest>) {
    if matches!(peer_smc(fd), PeerSmc::No | PeerSmc::Unknown) {
        note_dest(dest, false);
        fallback(
            fd,
            false,
            Diag::PeerNoSmc.code(),
            "peer did not announce SMC",
            false,
        );
        return;
    }
    let sc = size_code_for(fd, None);
    let mut d = Driver::new(machine(false, sc), fd, false, sc);
    d.withdraw();
    if let Progress::Done(out) = d.step(true) {
        finish(fd, false, out, crate::util::nonblocking(fd));
    }
}

/// A decided handshake: switch the fd to SMC, or leave it plain / skipping / reset.
fn finish(fd: i32, server: bool, out: Outcome, nonblock: bool) {
    finish_outcome(fd, server, out, nonblock);
    // An epoll set that watched the handshake for the application hands the fd back to it.
    fdtable::epoll_refresh(fd);
}

fn finish_outcome(fd: i32, server: bool, out: Outcome, nonblock: bool) {
    let role = if server { Role::Server } else { Role::Client };
    match out {
        Outcome::Fallback { fb, awaited, lost } => after_fallback(fd, server, fb, awaited, lost),
        Outcome::Established { own, peer, est } => {
            let alone = est.feature_mask & smc_common::clc::FEATURE_SWITCH_ALONE != 0;
            let resend =
                alone && est.feature_mask & smc_common::clc::FEATURE_SWITCH_ALONE_RESEND != 0;
            let fresh = est.feature_mask & smc_common::clc::FEATURE_SWITCH_FRESH_ACKS != 0;
            if !install(fd, own, peer, role, nonblock, (alone, resend), fresh) {
                // The peer is on SMC already: neither end may continue on this stream.
                broken(fd, server, "local state mapping failed");
            }
        }
        Outcome::Broken(why) => broken(fd, server, why),
    }
}

/// The peer switched to SMC but we cannot: tell it (an established end aborts on any byte
/// that is not a doorbell) and reset our side.
fn broken(fd: i32, server: bool, why: &str) {
    let code = Diag::IntErr.code();
    let decl = smc_common::clc::Decline::new(smc_common::clc::SMC_V2, code, peer_id());
    let _ = crate::util::send_all(fd, &decl.encode(), Instant::now() + clc_timeout());
    stats::handshake_error();
    debug!("fd {fd}: {why}: connection reset");
    stats::fallback(server, code);
    reset(fd);
}

/// A connection that fell back after a Decline of ours: consume the CLC messages of the peer
/// that crossed it ([`Skip`]), as far as they are there, before the application reads. `io`:
/// the descriptor to read them through (`fd`, or a private duplicate of its socket); `o`: the
/// skip's object at `fd`, which becomes plain TCP there when done (only while the number still
/// holds it). True when done.
pub fn skip_late_clc(io: i32, fd: i32, o: &Arc<Obj>, s: &Skip) -> bool {
    let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let st = s.state.load(Ordering::Acquire);
        if st == crate::obj::SKIP_DONE {
            return true;
        }
        match crate::handshake::skip_one(io, st == crate::obj::SKIP_LATE) {
            None => return false, // not there yet (or partial): decide at the next operation
            Some(None) => break,
            Some(Some(t)) => {
                debug!("fd {fd}: late CLC message skipped ({t:?})");
                if t == MsgType::Decline {
                    break; // the peer's last CLC message
                }
                s.state.store(crate::obj::SKIP_DECLINE, Ordering::Release);
            }
        }
    }
    s.state.store(crate::obj::SKIP_DONE, Ordering::Release);
    // Both ends announced SMC: the socket may still be a SOCKHASH member (see `member`).
    fdtable::replace_if(fd, o, Slot::Obj(Arc::new(Obj::Tcp)));
    true
}

/// libc is about to read `fd` itself (stdio after `fdopen`, aio), where no late CLC message can
/// be skipped any more: the skip is finished first, waiting at most one CLC timeout for the
/// peer's messages to arrive (its late message, then at most a Decline at its own timeout).
/// Nothing may come at all (the peer sent its last CLC byte already, and the program speaks
/// first): then the wait ends at that bound. Before, stdio read the late Proposal as data
/// (conformance `fdopen_stdio_server` with a 1 ms CLC timer: `fgets` gave `e2 d4 c3 d9 01`).
pub fn skip_before_libc(fd: i32, o: &Arc<Obj>, s: &Skip) {
    let deadline = std::time::Instant::now()
        + std::time::Duration::from_millis(crate::util::config::config().clc_timeout_ms.max(1));
    let e0 = real::errno();
    while !skip_late_clc(fd, fd, o, s) {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || s.waited_out.load(Ordering::Acquire) {
            debug!("fd {fd}: libc takes it with late CLC messages maybe still to come");
            s.waited_out.store(true, Ordering::Release);
            break;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of our own.
        let r = unsafe { real::poll(&mut p, 1, left.as_millis().clamp(1, 10) as i32) };
        if r > 0 {
            // Part of a CLC message is there: the rest is a moment away.
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    real::set_errno(e0);
}

/// Whether a read of `fd` with CLC messages still to skip waits for them (a blocking read: not
/// `dontwait`, and the socket is blocking).
pub fn skip_read_blocks(fd: i32, dontwait: bool) -> bool {
    !dontwait && !crate::util::nonblocking(fd)
}

/// How the wait of [`skip_before_read`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipWait {
    /// Decided: the read goes on with the application's data.
    Decided,
    /// Ended by an error (a receive timeout, a signal without `SA_RESTART`), errno set.
    Failed,
    /// A signal handler (with `SA_RESTART`) closed the number or made it name another file
    /// while the read waited: the kernel restarts such a call by looking the number up again
    /// (`EBADF`, or the call on the new file), so the caller starts the call again on it.
    Renamed,
}

/// A blocking read of a connection with CLC messages still to skip ([`skip_late_clc`] could
/// not decide yet): waits, through `io`, until it can decide (without the skip's lock: a
/// writer thread of the same socket is never held up).
///
/// The wait sleeps in `poll`, which no signal restarts, never in a blocking `recv` on `io`:
/// `io` may be our private duplicate of the socket, and a `recv` the kernel restarts after a
/// handler (`SA_RESTART`) goes on there although the handler closed the number or made it
/// name /dev/null with `dup2`, for ever when the peer waits too (conformance
/// `close_from_a_handler_during_a_blocking_call` with a CLC timer of 1 ms: the client's read
/// waited for the server's late Accept, which a server that had seen the client's Decline never
/// sends; TCP's restarted read finds the number closed, `EBADF`, or the new file).
pub fn skip_before_read(io: i32, fd: i32, o: &Arc<Obj>, s: &Skip) -> SkipWait {
    // A signal caught here and restarted still counts for the rest of the call (the read that
    // follows decides with it: `member::recv`).
    loop {
        if skip_late_clc(io, fd, o, s) {
            return SkipWait::Decided;
        }
        let timeo = crate::member::has_rcvtimeo(io);
        if !timeo {
            // A socket with a receive timeout is never restarted: its `recv` below ends with
            // `EINTR` at a signal and with `EAGAIN` at the timeout, as TCP's.
            let mut p = libc::pollfd {
                fd: io,
                events: libc::POLLIN,
                revents: 0,
            };
            let e0 = real::errno();
            // SAFETY: one pollfd of our own.
            let r = unsafe { real::poll(&mut p, 1, -1) };
            let e = real::errno();
            real::set_errno(e0);
            if r < 0 {
                if e != libc::EINTR {
                    real::set_errno(e);
                    return SkipWait::Failed;
                }
                if crate::signals::interrupted() {
                    real::set_errno(libc::EINTR);
                    return SkipWait::Failed;
                }
                if !still_names(fd, o, io) {
                    return SkipWait::Renamed;
                }
                continue;
            }
        }
        match crate::handshake::wait_head(io) {
            Ok(()) => {}
            // A signal ends the read with EINTR as it ends TCP's: its handler has no
            // SA_RESTART, or the socket has a receive timeout (never restarted).
            Err(libc::EINTR) if !crate::signals::interrupted() && !timeo => {}
            Err(e) if e == libc::EAGAIN && !timeo => {
                // tcp_bpf's spurious EAGAIN of a blocking read (see `member`): wait, decide.
                let mut p = libc::pollfd {
                    fd: io,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd of our own.
                unsafe { real::poll(&mut p, 1, 100) };
            }
            Err(e) => {
                real::set_errno(e);
                return SkipWait::Failed;
            }
        }
    }
}

/// Whether the number `fd` still names the object `o` and the socket `io` is a descriptor of
/// (errno preserved).
fn still_names(fd: i32, o: &Arc<Obj>, io: i32) -> bool {
    if !fdtable::get(fd).is_some_and(|x| Arc::ptr_eq(&x, o)) {
        return false;
    }
    // A close or dup2 the library never saw (a raw system call) leaves the slot as it was.
    io == fd || crate::obj::socket_ino(fd).is_some_and(|i| Some(i) == crate::obj::socket_ino(io))
}

// ---------------------------------------------------------------------------------------------
// The process's switch, and fd objects moving on

pub fn disable(why: &str) {
    if crate::policy::switch_off() {
        crate::debug!("SMC disabled for this process: {why}");
        // Our listeners stop announcing; connections they accept from now on whose client saw
        // an earlier announcement are declined (`handshake::machine`), never left reading CLC.
        withdraw_all_listeners();
    }
}

/// Withdraws the announcement of every listener of ours (SMC disabled for this process).
pub fn withdraw_all_listeners() {
    fdtable::for_each_object(|fd, o| {
        if matches!(&**o, Obj::Listener(_)) {
            announce(fd, false);
        }
    });
}

/// Decide a pending client socket (non-blocking connect not complete when connect returned).
pub fn resolve_pending(fd: i32) {
    let Some(o) = fdtable::get(fd) else { return };
    let Obj::Pending(p) = &*o else { return };
    let dest = p.dest;
    let mut done = p.lock.lock().unwrap_or_else(|e| e.into_inner());
    if *done {
        return;
    }
    // Connected yet?
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    let e0 = real::errno();
    // SAFETY: one pollfd.
    let r = unsafe { real::poll(&mut pfd, 1, 0) };
    real::set_errno(e0);
    if r <= 0 {
        return; // still connecting: stay pending
    }
    *done = true;
    drop(done);
    if so_error(fd) != 0 {
        settle_plain(fd);
    } else {
        client_start(fd, true, dest);
    }
    if p.shared.load(Ordering::Relaxed) {
        share_decision(fd, &o);
    }
}

/// `fd`'s slot moved on from `old` (a pending connect or a handshake that other fds name too,
/// after a `dup`): every other fd whose slot still holds `old` gets what `fd` has now (the
/// connection with its own reference, the handshake that continues, or the TCP tag), so that
/// no fd keeps an object that will never be decided (its reads would go to the TCP socket:
/// CLC bytes or doorbells as data, or a wait for data that travels in the rings).
pub(crate) fn share_decision(fd: i32, old: &Arc<Obj>) {
    let mut others = Vec::new();
    fdtable::for_each_object(|ofd, o| {
        if ofd != fd && Arc::ptr_eq(o, old) {
            others.push(ofd);
        }
    });
    for ofd in others {
        // Only a slot that still holds `old` (not closed and reused meanwhile).
        if fdtable::get(ofd).is_some_and(|o| Arc::ptr_eq(&o, old)) {
            copy_slot(fd, ofd);
            fdtable::epoll_refresh(ofd);
        }
    }
}

/// `to` names what `from` names now (after `dup`, `dup2`, a decision shared with the fds of a
/// `dup`, ...): the TCP tag, or the object with its own reference.
pub(crate) fn copy_slot(from: i32, to: i32) {
    wait_for_driven_handshake_of(from);
    let v = fdtable::raw(from) & !1;
    if v == 0 {
        if fdtable::raw(to) != 0 {
            drop(fdtable::replace(to, Slot::Empty));
        }
        return;
    }
    if v < 8 {
        drop(fdtable::replace(to, Slot::Tag(v)));
        return;
    }
    if let Some(o) = fdtable::get(from) {
        match &*o {
            Obj::Conn(c) => c.add_ref(1),
            // The decision will be copied here too (share_decision).
            Obj::Handshake(h) => h.shared.store(true, Ordering::Relaxed),
            Obj::Pending(p) => p.shared.store(true, Ordering::Relaxed),
            Obj::Epoll(_) => {
                // A dup'd epoll fd is the same instance, but our bookkeeping is keyed by fd:
                // keep it simple and let the copy go to the kernel unemulated only when it has
                // no SMC member (rare; documented).
            }
            // A copy of our private descriptor is the application's own (plain) socket fd.
            Obj::Private(_) => {
                drop(fdtable::replace(to, Slot::Empty));
                return;
            }
            _ => {}
        }
        drop(fdtable::replace(to, Slot::Obj(o)));
    }
}
