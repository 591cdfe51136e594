//! The `sk_msg` shortcut grant: after a verified attach the daemon (root) marks the attacher's
//! TCP socket in the eBPF socket storage (`SMC_SOCK_STATE`, pinned by `smc-ctl`) as allowed to
//! enable the shortcut. The cgroup `setsockopt` program lets `SMC_SO_SHORTCUT` switch the
//! redirect on only for a socket so marked (in an `ism`-mode cgroup): a process cannot enable
//! it for a socket that did not prove, at an attach, to be the exact peer (socket cookie) of a
//! registered DMB's socket (issue 12 item 4: a self-enabled redirect puts raw payload into the
//! peer's receive queue with no receive-buffer bound).
//!
//! Userspace updates socket storage with the socket's fd as the key. Without the pinned map
//! (no `smc-ctl attach` on this host yet, another pin directory) nothing is granted: the data
//! path's doorbells then go over plain TCP, as with `SMC_NO_SHORTCUT=1`.
//!
//! The update replaces the whole value (userspace has no atomic OR): it reads the value and
//! writes it back with the bit added while the attacher's data path waits for this attach's
//! reply, so the only concurrent writers of that socket's storage would be another thread of
//! the attacher's process querying the state, whose late `SOCK_SAME_HOST` would be lost (it is
//! set again at the next query).

use std::ffi::CString;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use std::net::{Ipv4Addr, Ipv6Addr};

use smc_common::bpf::{
    key_ip, PeerEntry, SockKey, SockState, SOCK_SHORTCUT_GRANTED, SOCK_STATE_VERSION,
};

/// The socket storage value, [`SockState`]: flags u32, version u32, two u64 counters.
const VALUE_LEN: usize = mem::size_of::<SockState>();

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
pub(super) const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_SK_STORAGE: u32 = 24;
const BPF_ANY: u64 = 0;

pub(super) fn bpf(cmd: libc::c_long, attr: &mut [u64; 16]) -> libc::c_long {
    // SAFETY: `attr` is a zero-padded bpf_attr for `cmd`, whose pointers the callers set to
    // live buffers of the sizes the kernel writes (checked against the map's info first).
    unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            mem::size_of_val(attr),
        )
    }
}

/// The pinned object at `path` (`BPF_OBJ_GET`).
pub(super) fn obj_get(path: &Path) -> Option<OwnedFd> {
    let cpath = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    let mut attr = [0u64; 16];
    attr[0] = cpath.as_ptr() as u64;
    let fd = bpf(BPF_OBJ_GET, &mut attr);
    if fd < 0 {
        return None;
    }
    // SAFETY: a new fd of ours.
    Some(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The pinned map at `path` and its `struct bpf_map_info` (type, id, key_size, value_size, as
/// u32 words first).
pub(super) fn open_pinned(path: &Path) -> Option<(OwnedFd, [u32; 32])> {
    let map = obj_get(path)?;
    let mut info = [0u32; 32];
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64 | ((mem::size_of_val(&info) as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    if bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) != 0 {
        return None;
    }
    Some((map, info))
}

/// The pinned socket-storage map at `path`, when it is one of our layout.
fn open_map(path: &Path) -> Option<OwnedFd> {
    let (map, info) = open_pinned(path)?;
    (info[0] == BPF_MAP_TYPE_SK_STORAGE && info[2] == 4 && info[3] == VALUE_LEN as u32)
        .then_some(map)
}

/// The pinned map opened at most this long ago is used as is: opening it (a path lookup, two
/// `bpf` calls, a close) per grant was a tenth of the daemon's time per connection. A map
/// replaced meanwhile (every cgroup detached, programs loaded again) misses grants for at most
/// this long: their connections' doorbells go over plain TCP, which is correct, only slower.
/// (The old map's memory stays referenced until the worker's next grant.)
const MAP_REOPEN: std::time::Duration = std::time::Duration::from_secs(1);

/// A worker's fd of a pinned map, with the path it was opened at and when.
type CachedMap = std::cell::RefCell<Option<(std::path::PathBuf, std::time::Instant, OwnedFd)>>;

thread_local! {
    /// The socket-storage map ([`grant_shortcut`]).
    static MAP: CachedMap = const { std::cell::RefCell::new(None) };
    /// The SOCKHASH ([`leave_sockhash`]): opened per request, it was three system calls more
    /// per fallback and a descriptor the daemon at its limit did not have.
    static SOCKHASH: CachedMap = const { std::cell::RefCell::new(None) };
    /// The same-host map (`leave_sockhash`'s owner check).
    static PEERS: CachedMap = const { std::cell::RefCell::new(None) };
}

/// `f` with the map `path` as `cache` holds it, opened (by `open`) at most [`MAP_REOPEN`] ago.
fn with_cached<R>(
    cache: &'static std::thread::LocalKey<CachedMap>,
    path: &Path,
    open: fn(&Path) -> Option<OwnedFd>,
    f: impl FnOnce(BorrowedFd<'_>) -> R,
) -> Option<R> {
    cache.with(|cell| {
        let mut c = cell.borrow_mut();
        let fresh = c
            .as_ref()
            .is_some_and(|(p, t, _)| p == path && t.elapsed() < MAP_REOPEN);
        if !fresh {
            *c = open(path).map(|m| (path.to_path_buf(), std::time::Instant::now(), m));
        }
        c.as_ref().map(|(_, _, map)| f(map.as_fd()))
    })
}

/// Marks the socket `sock` (a TCP socket that just proved to be a registered DMB's peer) as
/// allowed to enable the shortcut. False when there is no map (or the kernel refused).
pub(crate) fn grant_shortcut(map_path: &Path, sock: BorrowedFd<'_>) -> bool {
    with_cached(&MAP, map_path, open_map, |map| grant_with(map, sock)).unwrap_or(false)
}

/// The socket-storage value of `sock` (keyed by its descriptor), if it has one.
fn storage_of(map: BorrowedFd<'_>, sock: BorrowedFd<'_>) -> Option<[u8; VALUE_LEN]> {
    let key: i32 = sock.as_raw_fd();
    let mut value = [0u8; VALUE_LEN];
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = &key as *const i32 as u64;
    attr[2] = value.as_mut_ptr() as u64;
    (bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) == 0).then_some(value)
}

fn grant_with(map: BorrowedFd<'_>, sock: BorrowedFd<'_>) -> bool {
    let key: i32 = sock.as_raw_fd();
    let mut value = storage_of(map, sock).unwrap_or_else(|| {
        // No storage yet: a fresh value (version, no other flag).
        let mut v = [0u8; VALUE_LEN];
        v[4..8].copy_from_slice(&SOCK_STATE_VERSION.to_ne_bytes());
        v
    });
    let flags = u32::from_ne_bytes([value[0], value[1], value[2], value[3]]);
    value[0..4].copy_from_slice(&(flags | SOCK_SHORTCUT_GRANTED).to_ne_bytes());
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = &key as *const i32 as u64;
    attr[2] = value.as_ptr() as u64;
    attr[3] = BPF_ANY;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr) == 0
}

const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_TYPE_SOCKHASH: u32 = 18;
/// `size_of::<SockKey>()`: two IPv6 addresses, two u32 ports, the u64 network namespace
/// cookie.
const SOCK_KEY_LEN: usize = mem::size_of::<SockKey>();
/// `size_of::<PeerEntry>()`.
const PEER_ENTRY_LEN: usize = mem::size_of::<PeerEntry>();

/// The pinned SOCKHASH at `path` (next to the socket-storage map: same pin directory,
/// `smc_common::bpf::MAP_SOCKHASH`), when it is one of our layout.
fn open_sockhash(path: &Path) -> Option<OwnedFd> {
    let (map, info) = open_pinned(path)?;
    (info[0] == BPF_MAP_TYPE_SOCKHASH && info[2] == SOCK_KEY_LEN as u32).then_some(map)
}

/// An address as the eBPF programs key it: IPv6 in network byte order, IPv4 v4-mapped; the
/// port in host byte order.
pub(super) fn key_addr(ss: &libc::sockaddr_storage) -> Option<([u32; 4], u32)> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some((key_ip(ip.into()), u16::from_be(a.sin_port) as u32))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let a = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some((key_ip(ip.into()), u16::from_be(a.sin6_port) as u32))
        }
        _ => None,
    }
}

pub(super) fn sock_addr(sock: BorrowedFd<'_>, peer: bool) -> Option<([u32; 4], u32)> {
    // SAFETY: plain old data, all-zero valid.
    let mut ss: libc::sockaddr_storage = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = &mut ss as *mut _ as *mut libc::sockaddr;
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        if peer {
            libc::getpeername(sock.as_raw_fd(), p, &mut len)
        } else {
            libc::getsockname(sock.as_raw_fd(), p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    key_addr(&ss)
}

/// Takes the TCP socket `sock` out of the pinned SOCKHASH (`OP_LEAVE_SHORTCUT`): from then on
/// it reads and writes as plain TCP (no `tcp_bpf`), and nothing is redirected to it. True when
/// it is not (or no longer) a member.
///
/// The SOCKHASH is keyed by network namespace and 4-tuple (`SO_NETNS_COOKIE` of the socket):
/// a process in a namespace of its own (any uid, with a user namespace) that rebuilds another
/// user's loopback tuple there (read from `/proc/net/tcp`) names its own namespace's entry.
/// The entry is deleted only when the same-host record of that key (`SMC_PEERS`, written at
/// ESTABLISHED for every socket that goes into the SOCKHASH) names this very socket
/// (`SO_COOKIE`); with no record (evicted), only for a socket of an attached cgroup (it has
/// socket storage). (Red team rt22 `leave`: uid nobody took 8 of 8 sockets of root's SMC-D
/// connections out when the key had no namespace.)
pub(crate) fn leave_sockhash(sock_state_map: &Path, sock: BorrowedFd<'_>) -> bool {
    let (Some((lip, lport)), Some((rip, rport))) = (sock_addr(sock, false), sock_addr(sock, true))
    else {
        return false;
    };
    let Ok(cookie) = crate::sys::getsockopt::<u64>(sock, libc::SOL_SOCKET, crate::sys::SO_COOKIE)
    else {
        return false;
    };
    let Ok(netns) = smc_common::bpf::netns_cookie(sock) else {
        return false;
    };
    let key = SockKey {
        local_ip: lip,
        remote_ip: rip,
        local_port: lport,
        remote_port: rport,
        netns,
    };
    let peers = sock_state_map.with_file_name(smc_common::bpf::MAP_PEERS);
    let owner = with_cached(&PEERS, &peers, open_peers, |map| {
        peer_entry(map, &key).map(|e| e.cookie)
    });
    let ours = match owner {
        Some(Some(c)) => c == cookie,
        // No record of the tuple: a socket outside the attached cgroups is no member.
        _ => with_cached(&MAP, sock_state_map, open_map, |map| has_storage(map, sock))
            .unwrap_or(false),
    };
    if !ours {
        log::debug!("leave_shortcut: the SOCKHASH entry of that tuple is not the caller's socket");
        return false;
    }
    let path = sock_state_map.with_file_name(smc_common::bpf::MAP_SOCKHASH);
    with_cached(&SOCKHASH, &path, open_sockhash, |map| {
        delete_sock(map, &key)
    })
    .unwrap_or(false)
}

/// The pinned same-host map (`SMC_PEERS`: 48-byte `SockKey`, 24-byte `PeerEntry`).
fn open_peers(path: &Path) -> Option<OwnedFd> {
    let (map, info) = open_pinned(path)?;
    (info[2] == SOCK_KEY_LEN as u32 && info[3] == PEER_ENTRY_LEN as u32).then_some(map)
}

/// The entry of `key` in a same-host map (`SMC_PEERS`, `SMC_TCP_PEERS`), if any. Key and value
/// are the map's `SockKey` and `PeerEntry` (plain integers, any bit pattern valid); a map of
/// another layout would fail the version marker check of smc-ctl before anything is pinned.
pub(super) fn peer_entry(map: BorrowedFd<'_>, key: &SockKey) -> Option<PeerEntry> {
    let mut value = PeerEntry::default();
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = std::ptr::from_ref(key) as u64;
    attr[2] = std::ptr::from_mut(&mut value) as u64;
    (bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) == 0).then_some(value)
}

/// The cookie the eBPF programs recorded for the socket at the other end of the connection
/// end `own`, with `lookup` its same-host map(s) ([`peer_entry`]): the mirrored key in `own`'s
/// network namespace, or in the namespace that `own`'s entry names as its peer's
/// (`peer_netns`, written by the kernel when it paired the two ends of a connection between
/// two namespaces by their sequence numbers). A socket of a third namespace that merely
/// rebuilt the 4-tuple is never named.
pub(super) fn peer_cookie_of(
    own: &SockKey,
    lookup: impl Fn(&SockKey) -> Option<PeerEntry>,
) -> Option<u64> {
    if let Some(e) = lookup(&own.mirror()) {
        return Some(e.cookie);
    }
    let peer_netns = lookup(own)?.peer_netns;
    if peer_netns == 0 || peer_netns == own.netns {
        return None;
    }
    lookup(&own.mirror().in_netns(peer_netns)).map(|e| e.cookie)
}

/// Whether `sock` has a value in the socket-storage map (a socket of an attached cgroup that
/// may have been in the SOCKHASH).
fn has_storage(map: BorrowedFd<'_>, sock: BorrowedFd<'_>) -> bool {
    storage_of(map, sock).is_some()
}

fn delete_sock(map: BorrowedFd<'_>, key: &SockKey) -> bool {
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u32 as u64;
    attr[1] = std::ptr::from_ref(key) as u64;
    let r = bpf(BPF_MAP_DELETE_ELEM, &mut attr);
    // SAFETY: reads the calling thread's errno.
    r == 0 || unsafe { *libc::__errno_location() } == libc::ENOENT
}
