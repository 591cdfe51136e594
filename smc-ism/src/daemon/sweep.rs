//! `OP_SWEEP`: the quarantine of a withdrawn listener's queued connections (issue 10 item 3,
//! `smc-ebpf`'s `quarantine.rs`). A process of the data path that execs an image without it
//! withdraws the SMC announcement of the listeners that image inherits, then asks for this
//! sweep, passing the listener: the daemon writes the listener's key (network namespace cookie
//! and port) into the pinned `SMC_SWEEP` map and reads the pinned `iter/tcp` link in the
//! listener's network namespace. Each passive socket of that port whose client announced SMC
//! and that no process of ours claimed yet goes into the quarantine, whose stream verdict
//! strips its client's CLC Proposal and Decline, so the new image never reads them.
//!
//! Authority: holding the listener (it comes along as the proof, as the socket of
//! `OP_LEAVE_SHORTCUT`). The sweep touches only sockets of that listener's port in its
//! network namespace whose listener is withdrawn (the programs check `SMC_LISTENERS` again),
//! and of those only the ones no data path claimed: a sweep asked for by anyone who holds the
//! listener changes nothing but what an image without the data path would read.
//!
//! A sweep of one socket: a client whose Accept did not come passes its connected socket
//! before it half-closes or closes it. The daemon finds the server end in the pinned same-host
//! maps (the mirrored 4-tuple; its socket cookie) and sweeps for that cookie alone, in the
//! client socket's network namespace: the programs quarantine it when it is a passive socket
//! whose client announced SMC and that no data path claimed, while it is still ESTABLISHED
//! (after the client's FIN it would be `CLOSE_WAIT`, which a sockmap refuses). Authority is
//! holding the client socket: the one socket it reaches is its own connection's other end.
use std::io::{self, Read as _};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use smc_common::bpf::{
    ListenerKey, PeerEntry, SockKey, SweepConfig, MAP_PEERS, MAP_SWEEP, MAP_TCP_PEERS, SWEEP_PROG,
};

use super::grant::{
    bpf, key_addr, open_pinned, peer_cookie_of, peer_entry, sock_addr, BPF_MAP_UPDATE_ELEM,
};
use crate::sys;

/// `ioctl(sock, SIOCGSKNS)`: an fd of the socket's network namespace.
const SIOCGSKNS: libc::c_ulong = 0x894C;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_ANY: u64 = 0;

/// One sweep at a time: `SMC_SWEEP` holds one listener or socket.
static SWEEPING: Mutex<()> = Mutex::new(());

/// The turn of the next sweep, waited for on the request path without taking a worker.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Per uid, the lock its sweeps take before they wait for [`TURN`].
type UidTurns = std::collections::HashMap<u32, std::sync::Arc<tokio::sync::Mutex<()>>>;
static QUEUED: Mutex<Option<UidTurns>> = Mutex::new(None);

/// Why a sweep was not made.
#[derive(Debug)]
pub(crate) enum SweepError {
    /// The passed socket is not a listening TCP socket.
    NotListener,
    /// Neither a listening TCP socket nor a connected one.
    NotTcp,
    /// The pinned map or iterator is missing (programs of an older build) or the kernel refused.
    Io(io::Error),
}

impl std::fmt::Display for SweepError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SweepError::NotListener => f.write_str("not a listening TCP socket"),
            SweepError::NotTcp => f.write_str("not a listening or connected TCP socket"),
            SweepError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for SweepError {
    fn from(e: io::Error) -> Self {
        SweepError::Io(e)
    }
}

/// The listener's key as the programs write it (`set_listener`): its network namespace's
/// cookie, its local address (IPv4 v4-mapped; a wildcard as bound) and port.
fn listener_key(listener: BorrowedFd<'_>) -> Result<ListenerKey, SweepError> {
    let accepting = sys::getsockopt::<libc::c_int>(listener, libc::SOL_SOCKET, libc::SO_ACCEPTCONN)
        .map_err(|_| SweepError::NotListener)?;
    let proto = sys::getsockopt::<libc::c_int>(listener, libc::SOL_SOCKET, libc::SO_PROTOCOL)
        .map_err(|_| SweepError::NotListener)?;
    if accepting != 1 || proto != libc::IPPROTO_TCP {
        return Err(SweepError::NotListener);
    }
    // SAFETY: plain old data, all-zero valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        libc::getsockname(
            listener.as_raw_fd(),
            std::ptr::from_mut(&mut ss).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(SweepError::NotListener);
    }
    let (addr, port) = key_addr(&ss).ok_or(SweepError::NotListener)?;
    let netns = smc_common::bpf::netns_cookie(listener)?;
    Ok(ListenerKey {
        netns,
        addr,
        port,
        _pad: 0,
    })
}

/// The socket cookie of the server end of the connected TCP socket `client`, from the pinned
/// same-host maps next to the socket-storage map (`SMC_PEERS`, then `SMC_TCP_PEERS`), keyed by
/// the connection as that end sees it. `None` when neither holds it (another host's server,
/// an entry evicted or gone with its socket).
fn peer_cookie(sock_state_map: &Path, client: BorrowedFd<'_>) -> Result<Option<u64>, SweepError> {
    let proto = sys::getsockopt::<libc::c_int>(client, libc::SOL_SOCKET, libc::SO_PROTOCOL)
        .map_err(|_| SweepError::NotTcp)?;
    if proto != libc::IPPROTO_TCP {
        return Err(SweepError::NotTcp);
    }
    // A client that stopped waiting for this answer sent its FIN already (its server end is
    // `CLOSE_WAIT` now, which no sweep can quarantine): a sweep queued behind others costs
    // nothing then.
    if !sys::still_established(client) {
        return Ok(None);
    }
    let (Some((lip, lport)), Some((rip, rport))) =
        (sock_addr(client, false), sock_addr(client, true))
    else {
        return Err(SweepError::NotTcp);
    };
    let netns = smc_common::bpf::netns_cookie(client)?;
    let own = SockKey {
        local_ip: lip,
        remote_ip: rip,
        local_port: lport,
        remote_port: rport,
        netns,
    };
    let maps: Vec<OwnedFd> = [MAP_PEERS, MAP_TCP_PEERS]
        .into_iter()
        .filter_map(|name| open_pinned(&sock_state_map.with_file_name(name)))
        .filter(|(_, info)| {
            info[0] == BPF_MAP_TYPE_LRU_HASH
                && info[2] as usize == std::mem::size_of::<SockKey>()
                && info[3] as usize == std::mem::size_of::<PeerEntry>()
        })
        .map(|(map, _)| map)
        .collect();
    let lookup = |key: &SockKey| {
        maps.iter()
            .find_map(|map| peer_entry(map.as_fd(), key).filter(|e| e.cookie != 0))
    };
    // The server end: the mirrored key in the client's namespace, or in the one the kernel
    // paired the client with (a connection between two namespaces).
    Ok(peer_cookie_of(&own, lookup))
}

/// Writes `value` into the pinned `SMC_SWEEP` array (next to the socket-storage map).
fn set_config(sock_state_map: &Path, value: SweepConfig) -> Result<(), SweepError> {
    let path = sock_state_map.with_file_name(MAP_SWEEP);
    let (map, info) = open_pinned(&path)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no pinned SMC_SWEEP map"))?;
    if info[0] != BPF_MAP_TYPE_ARRAY || info[3] as usize != std::mem::size_of_val(&value) {
        return Err(
            io::Error::new(io::ErrorKind::InvalidData, "SMC_SWEEP of another layout").into(),
        );
    }
    let index = 0u32;
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = &index as *const u32 as u64;
    attr[2] = &value as *const SweepConfig as u64;
    attr[3] = BPF_ANY;
    if bpf(BPF_MAP_UPDATE_ELEM, &mut attr) != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(())
}

/// The sweep's pinned iterator: `<pin root>/iter/smc_sweep`, the socket-storage map being
/// `<pin root>/maps/SMC_SOCK_STATE`.
fn iter_path(sock_state_map: &Path) -> Option<PathBuf> {
    Some(
        sock_state_map
            .parent()?
            .parent()?
            .join("iter")
            .join(SWEEP_PROG),
    )
}

/// Opens the iterator (the kernel binds it to the opener's network namespace) and reads it to
/// its end: that runs the program once per TCP socket of the namespace. It writes nothing.
fn run_iter(path: &Path) -> io::Result<()> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = [0u8; 64];
    for _ in 0..64 {
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            // More than a million sockets without output: the kernel pauses the read.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The inode of a network namespace file.
fn ns_ino(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: plain old data, all-zero valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out buffer.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.st_ino)
}

/// Quarantines the queued connections of the listening socket `sock`, or the server end of
/// the connected client socket `sock` (see the module docs). Runs the iterator in the socket's
/// network namespace: in a thread of its own that enters it when it is not the daemon's (the
/// thread ends there; no worker changes namespace).
pub(crate) fn sweep(sock_state_map: &Path, sock: BorrowedFd<'_>) -> Result<(), SweepError> {
    let config = match listener_key(sock) {
        Ok(listener) => SweepConfig {
            listener,
            cookie: 0,
        },
        Err(SweepError::NotListener) => match peer_cookie(sock_state_map, sock)? {
            Some(cookie) => SweepConfig {
                listener: ListenerKey::default(),
                cookie,
            },
            // Not a server end of ours: nothing to quarantine.
            None => return Ok(()),
        },
        Err(e) => return Err(e),
    };
    let iter = iter_path(sock_state_map)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no pin root"))?;
    // SAFETY: an ioctl that returns a new fd of the socket's network namespace (or -1).
    let ns = unsafe { libc::ioctl(sock.as_raw_fd(), SIOCGSKNS as _) };
    if ns < 0 {
        return Err(io::Error::last_os_error().into());
    }
    // SAFETY: a new fd of ours.
    let ns = unsafe { OwnedFd::from_raw_fd(ns) };
    let own = std::fs::File::open("/proc/thread-self/ns/net")?;
    let foreign = ns_ino(ns.as_fd())? != ns_ino(own.as_fd())?;
    let _one = SWEEPING.lock().unwrap_or_else(|p| p.into_inner());
    set_config(sock_state_map, config)?;
    if !foreign {
        return Ok(run_iter(&iter)?);
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns of this (short-lived) thread into a network namespace fd.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            run_iter(&iter)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("sweep thread panicked")))
    })?;
    Ok(())
}

/// [`sweep`] off the daemon's async workers: a sweep reads the listener's network namespace's
/// whole TCP table (a namespace that holds thousands of sockets, any uid's, in a user namespace
/// of its own), and waited for the previous one on the `SWEEPING` lock. Run on the workers,
/// a few callers that kept asking for sweeps held all of them (two on two cores), and every
/// other client's requests waited: red team rt22 `sweepns`, 8 connections of uid nobody
/// sweeping a namespace of 15 000 listeners made root's short connections wait up to 226 ms
/// (8 ms without) and 16 of 400 ends fell back to TCP. Callers wait for their turn here, one
/// blocking thread sweeps. Returns the listener (to the closer) with the outcome.
///
/// Each uid has at most one sweep in that queue (its others wait behind it, on a lock of its
/// own): a uid with many daemon connections asking for sweeps of a namespace of thousands of
/// sockets otherwise queued before everyone else's (rt22 `PROBE=sweep`: root's sweep before
/// an exec waited 89 ms, at most 102, behind 16 of nobody's connections; 2 ms alone).
pub(crate) async fn sweep_off_workers(
    sock_state_map: &Path,
    listener: OwnedFd,
    uid: u32,
) -> (Option<OwnedFd>, Result<(), SweepError>) {
    let mine = {
        let mut q = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
        q.get_or_insert_with(UidTurns::new)
            .entry(uid)
            .or_default()
            .clone()
    };
    let outcome = {
        let _mine = mine.lock().await;
        sweep_in_turn(sock_state_map, listener).await
    };
    let mut q = QUEUED.lock().unwrap_or_else(|p| p.into_inner());
    // The last of this uid's sweeps (the map's and ours are the only references) takes its
    // entry out.
    if std::sync::Arc::strong_count(&mine) == 2 {
        if let Some(q) = q.as_mut() {
            q.remove(&uid);
        }
    }
    outcome
}

async fn sweep_in_turn(
    sock_state_map: &Path,
    listener: OwnedFd,
) -> (Option<OwnedFd>, Result<(), SweepError>) {
    let _turn = TURN.lock().await;
    let map = sock_state_map.to_path_buf();
    match tokio::task::spawn_blocking(move || {
        let r = sweep(&map, listener.as_fd());
        (listener, r)
    })
    .await
    {
        Ok((l, r)) => (Some(l), r),
        Err(_) => (None, Err(io::Error::other("sweep task failed").into())),
    }
}
