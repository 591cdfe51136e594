//! Connection setup: opting sockets in, asking the eBPF programs whether the peer announced
//! SMC, and the CLC handshake (SMC-D v2 over loopback-ism) over the TCP connection itself, with
//! DMBs from the loopback-ism daemon.
//!
//! Client (in `connect`): peer not SMC → plain TCP, not a byte sent (PEERNOSMC). Otherwise
//! Proposal → Accept (attach the server's DMB, register ours) → Confirm; or Decline / timeout →
//! plain TCP. Server (in `accept`): peek for a CLC eyecatcher (anything else: plain, nothing
//! consumed) → Proposal → register DMB → Accept → Confirm → attach the client's DMB.
//!
//! Timeouts: a side that gave up waiting sends a Decline and, because the other side answers
//! every CLC message exactly once before any data, skips that one late CLC message at its first
//! read ([`Obj::Skip`]).

use crate::conn::{Conn, Release, Role};
use crate::fdtable::{self, Slot, TAG_TCP};
use crate::obj::{Obj, Skip};
use crate::shm::Mapping;
use crate::{debug, real, stats};
use smc_common::bpf::{
    SockState, SMC_SO_ENABLE, SMC_SO_SHORTCUT, SMC_SO_STATE, SOCK_PEER_SMC, SOL_SMC_BPF,
};
use smc_common::clc::{
    self, AcceptConfirm, AcceptConfirmV2, ClcMessage, Decline, GidChid, Proposal, ProposalV2Ext,
    SmcType, SmcdV2Ext, HEADER_LEN, LOOPBACK_CHID, SMC_RELEASE_1, SMC_V2,
};
use smc_common::diag::Diag;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn clc_timeout() -> Duration {
    static T: OnceLock<u64> = OnceLock::new();
    Duration::from_millis(*T.get_or_init(|| env_u64("SMC_CLC_TIMEOUT_MS", 2000)))
}

/// How long `connect` waits for a non-blocking connect to complete before leaving the
/// decision to the first operation.
pub fn connect_wait_ms() -> i32 {
    static T: OnceLock<u64> = OnceLock::new();
    *T.get_or_init(|| env_u64("SMC_CONNECT_WAIT_MS", 200)) as i32
}

/// Default DMB size code (6 = 1 MiB).
fn default_size_code() -> u8 {
    static T: OnceLock<u8> = OnceLock::new();
    *T.get_or_init(|| {
        let v = env_u64("SMC_DMB_SIZE", 1 << 20);
        smc_common::cdc::dmb_size_code(v.min(u32::MAX as u64) as u32)
    })
}

/// The daemon's socket, from the environment at load time (servers such as nginx clear the
/// environment of their workers).
fn daemon_path() -> &'static std::path::Path {
    static P: OnceLock<std::path::PathBuf> = OnceLock::new();
    P.get_or_init(smc_ism::default_socket_path)
}

/// Read every environment knob now, at load time, while the environment is the one the
/// program was started with.
pub fn init_env() {
    let _ = daemon_path();
    let _ = clc_timeout();
    let _ = connect_wait_ms();
    let _ = default_size_code();
    let _ = assume_peer();
    let _ = short_bytes();
    let _ = no_shortcut();
    let _ = crate::conn::tune();
    let _ = crate::log::enabled();
    let _ = crate::stats::procs_dir();
}

fn no_shortcut() -> bool {
    static OFF: OnceLock<bool> = OnceLock::new();
    *OFF.get_or_init(|| std::env::var_os("SMC_NO_SHORTCUT").is_some_and(|v| v == "1"))
}

/// Fallback reason counted when the short-connection policy keeps a connection on TCP (not a
/// Linux diagnosis code).
pub const POLICY_SHORT: u32 = 0x7F00_0001;

/// Short-connection policy: client connections whose whole life moved fewer than
/// `SMC_SHORT_BYTES` (default 16 KiB) bytes lose more to the handshake than they gain. After 8
/// such SMC connections in a row, new client connections stay on TCP (no SMC option in the
/// SYN), except every 256th, which probes SMC again. `SMC_SHORT_BYTES=0` disables the policy.
static SHORT_RUN: AtomicU64 = AtomicU64::new(0);
static SKIPPED: AtomicU64 = AtomicU64::new(0);

fn short_bytes() -> u64 {
    static T: OnceLock<u64> = OnceLock::new();
    *T.get_or_init(|| env_u64("SMC_SHORT_BYTES", 16 * 1024))
}

/// A client SMC connection ended having moved `bytes`.
pub fn note_client_conn_bytes(bytes: u64) {
    if bytes < short_bytes() {
        SHORT_RUN.fetch_add(1, Ordering::Relaxed);
    } else {
        SHORT_RUN.store(0, Ordering::Relaxed);
    }
}

/// Whether the policy keeps this new client connection on TCP.
pub fn policy_keeps_tcp() -> bool {
    if short_bytes() == 0 || SHORT_RUN.load(Ordering::Relaxed) < 8 {
        return false;
    }
    let n = SKIPPED.fetch_add(1, Ordering::Relaxed);
    if n % 256 == 255 {
        return false; // probe
    }
    stats::fallback(false, POLICY_SHORT);
    true
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
    let one: u32 = 1;
    let e0 = real::errno();
    // SAFETY: valid option buffer.
    let r = unsafe {
        real::setsockopt(
            fd,
            SOL_SMC_BPF,
            SMC_SO_ENABLE,
            &one as *const u32 as *const libc::c_void,
            4,
        )
    };
    let e = real::errno();
    real::set_errno(e0);
    if r != 0 {
        if e == libc::ENOPROTOOPT || e == libc::EOPNOTSUPP {
            NO_BPF.store(true, Ordering::Relaxed);
            crate::ops::disable("no eBPF programs attached to this cgroup (ENOPROTOOPT)");
        }
        return false;
    }
    true
}

fn sock_state(fd: i32) -> Option<SockState> {
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
    real::set_errno(e0);
    (r == 0).then_some(st)
}

fn assume_peer() -> bool {
    static A: OnceLock<bool> = OnceLock::new();
    *A.get_or_init(|| std::env::var_os("SMC_PRELOAD_ASSUME_PEER").is_some_and(|v| v == "1"))
}

fn peer_smc(fd: i32) -> bool {
    if assume_peer() {
        return true;
    }
    sock_state(fd).is_some_and(|s| s.flags & SOCK_PEER_SMC != 0)
}

/// The eBPF state of an established SMC connection's TCP socket.
pub fn looks_like_smc_conn(fd: i32) -> bool {
    use smc_common::bpf::{SOCK_OPTED_IN, SOCK_SHORTCUT};
    let want = SOCK_OPTED_IN | SOCK_PEER_SMC | SOCK_SHORTCUT;
    sock_state(fd).is_some_and(|s| s.flags & want == want)
}

fn shortcut(fd: i32) {
    if no_shortcut() {
        return;
    }
    let one: u32 = 1;
    let e0 = real::errno();
    // SAFETY: valid option buffer.
    unsafe {
        real::setsockopt(
            fd,
            SOL_SMC_BPF,
            SMC_SO_SHORTCUT,
            &one as *const u32 as *const libc::c_void,
            4,
        )
    };
    real::set_errno(e0);
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
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer.
    let r = unsafe { libc::getpeername(fd, &mut ss as *mut _ as *mut libc::sockaddr, &mut len) };
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

fn hints() -> &'static Mutex<HashMap<i32, i32>> {
    static H: OnceLock<Mutex<HashMap<i32, i32>>> = OnceLock::new();
    H.get_or_init(|| Mutex::new(HashMap::new()))
}
static HINTS_N: AtomicU64 = AtomicU64::new(0);

pub fn note_rcvbuf(fd: i32, v: i32) {
    let mut h = hints().lock().unwrap_or_else(|e| e.into_inner());
    if h.insert(fd, v).is_none() {
        HINTS_N.fetch_add(1, Ordering::Relaxed);
    }
}

fn size_code_for(fd: i32, listener: Option<i32>) -> u8 {
    if HINTS_N.load(Ordering::Relaxed) > 0 {
        let h = hints().lock().unwrap_or_else(|e| e.into_inner());
        let v = h.get(&fd).or_else(|| listener.and_then(|l| h.get(&l)));
        if let Some(&v) = v {
            if v > 0 {
                return smc_common::cdc::dmb_size_code(v as u32);
            }
        }
    }
    default_size_code()
}

// ---------------------------------------------------------------------------------------
// the loopback-ism device

struct Dev {
    client: Option<smc_ism::Client>,
    gid: Option<smc_ism::Gid>,
    /// Do not retry a dead daemon before this instant.
    retry_after: Option<Instant>,
}

fn dev() -> &'static Mutex<Dev> {
    static D: OnceLock<Mutex<Dev>> = OnceLock::new();
    D.get_or_init(|| {
        Mutex::new(Dev {
            client: None,
            gid: None,
            retry_after: None,
        })
    })
}

fn with_dev<T>(
    f: impl FnOnce(&mut smc_ism::Client) -> Result<T, smc_ism::IsmError>,
) -> Result<T, u32> {
    let mut d = dev().lock().unwrap_or_else(|e| e.into_inner());
    if d.client.is_none() {
        if d.retry_after.is_some_and(|t| Instant::now() < t) {
            return Err(Diag::NoSmcdDev.code());
        }
        match smc_ism::Client::connect(daemon_path()) {
            Ok(c) => {
                d.client = Some(c);
                d.retry_after = None;
            }
            Err(e) => {
                debug!("loopback-ism daemon unreachable: {e}");
                d.retry_after = Some(Instant::now() + Duration::from_secs(1));
                return Err(Diag::NoSmcdDev.code());
            }
        }
    }
    let c = d.client.as_mut().expect("client");
    match f(c) {
        Ok(v) => Ok(v),
        Err(e) => {
            debug!("loopback-ism: {e}");
            let code = e.decline_reason().diagnosis();
            if e.is_unavailable() {
                d.client = None;
                d.retry_after = Some(Instant::now() + Duration::from_secs(1));
            }
            Err(code)
        }
    }
}

fn local_gid() -> Result<smc_ism::Gid, u32> {
    {
        let d = dev().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = d.gid {
            return Ok(g);
        }
    }
    let g = with_dev(|c| c.query_gid())?;
    dev().lock().unwrap_or_else(|e| e.into_inner()).gid = Some(g);
    Ok(g)
}

pub fn after_fork_child() {
    // smc_ism::Client reconnects by itself in a child; nothing cached here is per process
    // except the stats area, which `stats::get` reopens by pid.
}

struct DmbRelease {
    own: u64,
    peer: u64,
}

impl Release for DmbRelease {
    fn release(&self) {
        let own = self.own;
        let peer = self.peer;
        let _ = with_dev(|c| {
            let _ = c.detach_dmb(peer);
            c.unregister_dmb(own)
        });
    }
}

// ---------------------------------------------------------------------------------------
// CLC I/O over the TCP socket (blocking with deadlines, whatever O_NONBLOCK says)

fn peer_id() -> [u8; 8] {
    static P: OnceLock<[u8; 8]> = OnceLock::new();
    *P.get_or_init(|| {
        let mut b = [0u8; 8];
        // SAFETY: valid buffer.
        unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
        b
    })
}

fn system_eid() -> [u8; 32] {
    clc::padded32(b"SMC-RS-LOOPBACK")
}

enum IoErr {
    Timeout,
    Eof,
    Err,
}

fn wait_fd(fd: i32, events: i16, deadline: Instant) -> Result<(), IoErr> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Err(IoErr::Timeout);
        }
        let ms = (deadline - now).as_millis().max(1) as i32;
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one pollfd.
        let r = unsafe { real::poll(&mut p, 1, ms) };
        if r > 0 {
            return Ok(());
        }
        if r < 0 && real::errno() != libc::EINTR {
            return Err(IoErr::Err);
        }
    }
}

fn send_all(fd: i32, mut b: &[u8], deadline: Instant) -> Result<(), IoErr> {
    while !b.is_empty() {
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
        if r < 0 && (e == libc::EAGAIN || e == libc::EINTR) {
            wait_fd(fd, libc::POLLOUT, deadline)?;
            continue;
        }
        return Err(IoErr::Err);
    }
    Ok(())
}

fn recv_exact(fd: i32, buf: &mut [u8], peek: bool, deadline: Instant) -> Result<(), IoErr> {
    let mut got = 0;
    while got < buf.len() {
        let flags = libc::MSG_DONTWAIT | if peek { libc::MSG_PEEK } else { 0 };
        let (p, n) = if peek {
            (buf.as_mut_ptr(), buf.len())
        } else {
            (buf[got..].as_mut_ptr(), buf.len() - got)
        };
        // SAFETY: valid buffer.
        let r = unsafe { real::recv(fd, p as *mut libc::c_void, n, flags) };
        if r > 0 {
            if peek {
                if r as usize >= buf.len() {
                    return Ok(());
                }
                // Not all there yet: wait for more (poll says readable while bytes are
                // queued, so sleep briefly instead).
                if Instant::now() >= deadline {
                    return Err(IoErr::Timeout);
                }
                std::thread::sleep(Duration::from_micros(50));
                continue;
            }
            got += r as usize;
            continue;
        }
        if r == 0 {
            return Err(IoErr::Eof);
        }
        let e = real::errno();
        if e == libc::EAGAIN || e == libc::EINTR {
            wait_fd(fd, libc::POLLIN, deadline)?;
            continue;
        }
        return Err(IoErr::Err);
    }
    Ok(())
}

fn is_eyecatcher(b: &[u8]) -> bool {
    b.len() >= 4 && (b[..4] == clc::EYECATCHER_SMCR || b[..4] == clc::EYECATCHER_SMCD)
}

/// Read one whole CLC message. `Ok(None)`: the stream does not start with a CLC message
/// (nothing consumed).
fn read_clc(fd: i32, deadline: Instant) -> Result<Option<ClcMessage>, (IoErr, u32)> {
    let mut hdr = [0u8; HEADER_LEN];
    recv_exact(fd, &mut hdr, true, deadline).map_err(|e| (e, Diag::TimeoutCl.code()))?;
    if !is_eyecatcher(&hdr) {
        return Ok(None);
    }
    let len = clc::message_len(&hdr).map_err(|e| (IoErr::Err, e.diag().code()))?;
    let mut buf = vec![0u8; len];
    recv_exact(fd, &mut buf, false, deadline).map_err(|e| (e, Diag::TimeoutCl.code()))?;
    clc::decode(&buf)
        .map(Some)
        .map_err(|e| (IoErr::Err, e.diag().code()))
}

fn send_msg(fd: i32, m: &ClcMessage) -> bool {
    match m.encode() {
        Ok(b) => send_all(fd, &b, Instant::now() + clc_timeout()).is_ok(),
        Err(_) => false,
    }
}

fn send_decline(fd: i32, code: u32) {
    let d = Decline::new(SMC_V2, code, peer_id());
    let _ = send_msg(fd, &ClcMessage::Decline(d));
}

fn proposal(gid: smc_ism::Gid) -> Proposal {
    Proposal {
        version: SMC_V2,
        typev1: SmcType::N,
        typev2: SmcType::D,
        peer_id: peer_id(),
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: 0,
        ism_chid: 0,
        ip_prefix: None,
        v2: Some(ProposalV2Ext {
            release: SMC_RELEASE_1,
            seid: true,
            roce_gid: [0; 16],
            max_conns: 0,
            max_links: 0,
            feature_mask: clc::FEATURE_EMULATED_ISM,
            ueids: Vec::new(),
            smcd: Some(SmcdV2Ext {
                system_eid: system_eid(),
                gidchids: vec![
                    GidChid {
                        gid: gid.gid,
                        chid: LOOPBACK_CHID,
                    },
                    GidChid {
                        gid: gid.gid_ext,
                        chid: LOOPBACK_CHID,
                    },
                ],
            }),
        }),
    }
}

fn accept_confirm(gid: smc_ism::Gid, dmb: &smc_ism::Dmb) -> AcceptConfirm {
    AcceptConfirm {
        version: SMC_V2,
        first_contact: false,
        gid: gid.gid,
        token: dmb.token,
        dmbe_idx: dmb.idx,
        dmbe_size: dmb.size_code,
        link_id: 0,
        v2: Some(AcceptConfirmV2 {
            chid: LOOPBACK_CHID,
            eid: system_eid(),
            gid_ext: gid.gid_ext,
            fce: None,
        }),
    }
}

fn fallback(fd: i32, server: bool, code: u32, why: &str) {
    debug!(
        "fd {fd}: {} fallback to TCP: {why} ({code:#010x} {})",
        if server { "server" } else { "client" },
        Diag::from_code(code).map_or("?", |d| d.name())
    );
    stats::fallback(server, code);
    drop(fdtable::replace(fd, Slot::Tag(TAG_TCP)));
}

fn skip_state(fd: i32, server: bool) {
    drop(fdtable::replace(
        fd,
        Slot::Obj(Arc::new(Obj::Skip(Skip::new(server)))),
    ));
}

fn nonblocking(fd: i32) -> bool {
    // SAFETY: F_GETFL has no argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

fn install(fd: i32, own: smc_ism::Dmb, peer: smc_ism::Dmb, role: Role, nonblock: bool) -> bool {
    let (Ok(om), Ok(pm)) = (
        Mapping::map_fd(&own.fd, own.size),
        Mapping::map_fd(&peer.fd, peer.size),
    ) else {
        return false;
    };
    let rel = DmbRelease {
        own: own.token,
        peer: peer.token,
    };
    let mut c = match Conn::new(om, pm, role, nonblock, Some(Box::new(rel))) {
        Ok(c) => c,
        Err(_) => return false,
    };
    c.own_token = own.token;
    c.peer_token = peer.token;
    drop(own);
    drop(peer);
    shortcut(fd);
    let o = Arc::new(Obj::Conn(c));
    drop(fdtable::replace(fd, Slot::Obj(o.clone())));
    crate::epoll::on_convert(fd, &o);
    stats::smc(role == Role::Server);
    debug!("fd {fd}: SMC-D established as {role:?}");
    true
}

/// Client side, right after the TCP connection is established.
pub fn client_after_connect(fd: i32, _was_nonblocking: bool) {
    if !peer_smc(fd) {
        fallback(
            fd,
            false,
            Diag::PeerNoSmc.code(),
            "peer did not announce SMC",
        );
        return;
    }
    let gid = match local_gid() {
        Ok(g) => g,
        Err(code) => {
            send_decline(fd, code);
            fallback(fd, false, code, "no loopback-ism device");
            return;
        }
    };
    if !send_msg(fd, &ClcMessage::Proposal(proposal(gid))) {
        stats::handshake_error();
        fallback(fd, false, Diag::IntErr.code(), "cannot send proposal");
        return;
    }
    let deadline = Instant::now() + clc_timeout();
    let acc = match read_clc(fd, deadline) {
        Ok(Some(ClcMessage::Accept(a))) => a,
        Ok(Some(ClcMessage::Decline(d))) => {
            fallback(fd, false, d.diagnosis, "declined by the server");
            return;
        }
        Ok(Some(_)) | Ok(None) => {
            send_decline(fd, Diag::SyncErr.code());
            stats::handshake_error();
            // A non-CLC answer cannot be un-read; the connection is unusable either way.
            fallback(
                fd,
                false,
                Diag::SyncErr.code(),
                "unexpected answer to proposal",
            );
            return;
        }
        Err((IoErr::Timeout, code)) => {
            send_decline(fd, code);
            stats::handshake_error();
            stats::fallback(false, code);
            debug!("fd {fd}: client timeout waiting for accept, fallback (skip late CLC)");
            skip_state(fd, false);
            return;
        }
        Err((_, code)) => {
            stats::handshake_error();
            fallback(fd, false, code, "error reading accept");
            return;
        }
    };
    let peer_gid = acc.sender_gid();
    if peer_gid.gid != gid.gid || peer_gid.gid_ext != gid.gid_ext {
        send_decline(fd, Diag::NoSmcdDev.code());
        fallback(
            fd,
            false,
            Diag::NoSmcdDev.code(),
            "server on another device",
        );
        return;
    }
    let peer = match with_dev(|c| c.attach_dmb(acc.token, fd)) {
        Ok(d) => d,
        Err(code) => {
            send_decline(fd, code);
            fallback(fd, false, code, "attach of the server's DMB failed");
            return;
        }
    };
    let own = match with_dev(|c| c.register_dmb(size_code_for(fd, None), fd)) {
        Ok(d) => d,
        Err(code) => {
            let t = peer.token;
            let _ = with_dev(|c| c.detach_dmb(t));
            send_decline(fd, code);
            fallback(fd, false, code, "register of our DMB failed");
            return;
        }
    };
    let conf = accept_confirm(gid, &own);
    let (ot, pt) = (own.token, peer.token);
    if !install(fd, own, peer, Role::Client, nonblocking(fd)) {
        let _ = with_dev(|c| {
            let _ = c.detach_dmb(pt);
            c.unregister_dmb(ot)
        });
        send_decline(fd, Diag::IntErr.code());
        fallback(fd, false, Diag::IntErr.code(), "mapping failed");
        return;
    }
    if !send_msg(fd, &ClcMessage::Confirm(conf)) {
        // The server will time out and decline; our ring sees it as a protocol error.
        stats::handshake_error();
    }
}

/// Server side, right after accept: `fd` is the accepted socket.
pub fn server_after_accept(lfd: i32, fd: i32, nonblock_flag: bool) {
    if !peer_smc(fd) {
        fallback(
            fd,
            true,
            Diag::PeerNoSmc.code(),
            "peer did not announce SMC",
        );
        return;
    }
    let deadline = Instant::now() + clc_timeout();
    let prop = match read_clc(fd, deadline) {
        Ok(Some(ClcMessage::Proposal(p))) => p,
        Ok(Some(ClcMessage::Decline(d))) => {
            fallback(fd, true, d.diagnosis, "client declined");
            return;
        }
        Ok(Some(_)) => {
            send_decline(fd, Diag::SyncErr.code());
            stats::handshake_error();
            fallback(fd, true, Diag::SyncErr.code(), "unexpected CLC message");
            return;
        }
        Ok(None) => {
            fallback(
                fd,
                true,
                Diag::PeerNoSmc.code(),
                "no CLC message from the client",
            );
            return;
        }
        Err((IoErr::Timeout, code)) => {
            stats::handshake_error();
            stats::fallback(true, code);
            debug!("fd {fd}: server timeout waiting for proposal, fallback (skip late CLC)");
            skip_state(fd, true);
            return;
        }
        Err((_, code)) => {
            stats::handshake_error();
            fallback(fd, true, code, "error reading proposal");
            return;
        }
    };
    let decline = |code: u32, why: &str| {
        send_decline(fd, code);
        fallback(fd, true, code, why);
    };
    if prop.version < SMC_V2 || !prop.typev2.smcd() {
        return decline(Diag::ModeUnsupp.code(), "proposal without SMC-D v2");
    }
    let gid = match local_gid() {
        Ok(g) => g,
        Err(code) => return decline(code, "no loopback-ism device"),
    };
    let offered = prop
        .v2
        .as_ref()
        .and_then(|v| v.smcd.as_ref())
        .map(|s| s.devices())
        .unwrap_or_default();
    if !offered
        .iter()
        .any(|d| d.chid == LOOPBACK_CHID && d.gid.gid == gid.gid && d.gid.gid_ext == gid.gid_ext)
    {
        return decline(Diag::NoSmcdDev.code(), "client on another device");
    }
    let own = match with_dev(|c| c.register_dmb(size_code_for(fd, Some(lfd)), fd)) {
        Ok(d) => d,
        Err(code) => return decline(code, "register of our DMB failed"),
    };
    let ot = own.token;
    if !send_msg(fd, &ClcMessage::Accept(accept_confirm(gid, &own))) {
        let _ = with_dev(|c| c.unregister_dmb(ot));
        stats::handshake_error();
        fallback(fd, true, Diag::IntErr.code(), "cannot send accept");
        return;
    }
    let deadline = Instant::now() + clc_timeout() * 2;
    let conf = match read_clc(fd, deadline) {
        Ok(Some(ClcMessage::Confirm(c))) => c,
        Ok(Some(ClcMessage::Decline(d))) => {
            let _ = with_dev(|c| c.unregister_dmb(ot));
            fallback(fd, true, d.diagnosis, "client declined after accept");
            return;
        }
        Err((IoErr::Timeout, code)) => {
            let _ = with_dev(|c| c.unregister_dmb(ot));
            send_decline(fd, code);
            stats::handshake_error();
            stats::fallback(true, code);
            skip_state(fd, true);
            return;
        }
        _ => {
            let _ = with_dev(|c| c.unregister_dmb(ot));
            send_decline(fd, Diag::SyncErr.code());
            stats::handshake_error();
            fallback(fd, true, Diag::SyncErr.code(), "bad confirm");
            return;
        }
    };
    let peer = match with_dev(|c| c.attach_dmb(conf.token, fd)) {
        Ok(d) => d,
        Err(code) => {
            // The client already switched: it must not continue on TCP either. Tell it
            // (it aborts on a non-doorbell byte) and abort our side.
            let _ = with_dev(|c| c.unregister_dmb(ot));
            send_decline(fd, code);
            stats::handshake_error();
            fallback(fd, true, code, "attach of the client's DMB failed");
            set_linger_reset(fd);
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
            return;
        }
    };
    let nb = nonblock_flag || nonblocking(fd);
    if !install(fd, own, peer, Role::Server, nb) {
        let _ = with_dev(|c| c.unregister_dmb(ot));
        stats::handshake_error();
        fallback(fd, true, Diag::IntErr.code(), "mapping failed");
        set_linger_reset(fd);
        // SAFETY: plain syscall.
        unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
    }
}

fn set_linger_reset(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: valid option.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
}

/// A connection that fell back after a timeout: consume the one late CLC message, if any,
/// before the application reads (and decline a late proposal).
pub fn skip_late_clc(fd: i32, s: &Skip) {
    let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
    if s.done() {
        return;
    }
    let mut hdr = [0u8; HEADER_LEN];
    // SAFETY: valid buffer.
    let r = unsafe {
        real::recv(
            fd,
            hdr.as_mut_ptr() as *mut libc::c_void,
            HEADER_LEN,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r <= 0 {
        return; // nothing yet: decide at the next operation
    }
    let r = r as usize;
    if !is_eyecatcher(&hdr[..r.min(4)]) && r >= 4 {
        s.state.store(1, Ordering::Release);
        drop(fdtable::replace(fd, Slot::Tag(TAG_TCP)));
        return;
    }
    if r < HEADER_LEN {
        return;
    }
    if let Ok(Some(m)) = read_clc(fd, Instant::now() + clc_timeout()) {
        if s.server {
            if let ClcMessage::Proposal(_) = m {
                send_decline(fd, Diag::TimeoutCl.code());
            }
        }
    }
    s.state.store(1, Ordering::Release);
    drop(fdtable::replace(fd, Slot::Tag(TAG_TCP)));
}
