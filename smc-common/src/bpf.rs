//! The contract between the eBPF programs and userspace: map keys and values, counter indices,
//! and the private socket-option channel (`setsockopt`/`getsockopt` at [`SOL_SMC_BPF`]).
//!
//! A process inside an attached cgroup talks to the programs about its *own* sockets with plain
//! socket options at a private level; the cgroup sockopt programs answer them and bypass the
//! kernel. Outside an attached cgroup the kernel answers `ENOPROTOOPT`, which tells the data path
//! that nothing is attached and the connection stays plain TCP.

/// Private socket-option level answered by the cgroup sockopt programs ("SMC\0").
pub const SOL_SMC_BPF: i32 = 0x534d_4300;
/// `setsockopt(fd, SOL_SMC_BPF, SMC_SO_ENABLE, &1u32, 4)`: this socket (and the sockets accepted
/// from it, when it is a listener) announces SMC in its SYN / SYN-ACK. `&0u32` on a listener
/// withdraws the announcement from its SYN-ACKs (before an `exec` that may not run the data
/// path, see [`MAP_LISTENERS`]); `&1u32` on a listening socket that announced before restores it.
pub const SMC_SO_ENABLE: i32 = 1;
/// `setsockopt(fd, SOL_SMC_BPF, SMC_SO_SHORTCUT, &1u32, 4)`: messages this socket sends are
/// redirected by `sk_msg` to its same-host peer (used for the data path's own control traffic).
/// Refused (`EPERM`) unless the loopback-ism daemon granted it ([`SOCK_SHORTCUT_GRANTED`], set
/// at a verified attach) or the shortcut is on already (a `shortcut`-mode cgroup): a redirected
/// message lands in the peer's receive queue without its receive-buffer bound, so a process
/// may not switch it on for a connection that is not a verified SMC-D pair. `&0u32` (off) is
/// always accepted.
pub const SMC_SO_SHORTCUT: i32 = 2;
/// `getsockopt(fd, SOL_SMC_BPF, SMC_SO_STATE, &mut SockState, 8)`: what the programs know about
/// this socket.
pub const SMC_SO_STATE: i32 = 3;
/// `setsockopt(fd, SOL_SMC_BPF, SMC_SO_TCP, &1u32, 4)`: this connection stays plain TCP (its
/// CLC handshake fell back). In an ism-mode cgroup the socket leaves the SOCKHASH at its next
/// outgoing segment (a sockmap member may only be removed from `sock_ops`), so that its reads
/// and writes are the kernel's plain TCP ones again.
pub const SMC_SO_TCP: i32 = 4;
/// `getsockopt(fd, SOL_SMC_BPF, SMC_SO_PEER_QUARANTINED, &mut u32, 4)`: on a client socket, 1
/// when the server end of its connection is quarantined ([`SOCK_QUARANTINED`]): no data path
/// will answer its Proposal (which the verdict strips), so the client continues on TCP in sync,
/// sending no Decline, and bytes that come instead of an Accept are the server's application
/// bytes (a server that speaks first).
pub const SMC_SO_PEER_QUARANTINED: i32 = 5;
/// `getsockopt(fd, SOL_SMC_BPF, SMC_SO_CGROUP, &mut u64, 8)`, on any socket of a process in
/// an attached cgroup: the caller's cgroup v2 id (`bpf_get_current_cgroup_id`, the inode of its
/// cgroup directory), which the data path records in its statistics file without reading
/// `/proc/self/cgroup` and `/proc/self/mountinfo` (the latter grows with every mount of the
/// host: a fresh process paid for it before its first connection).
pub const SMC_SO_CGROUP: i32 = 6;

/// The socket asked to announce SMC ([`SMC_SO_ENABLE`]).
pub const SOCK_OPTED_IN: u32 = 1 << 0;
/// Our SYN or SYN-ACK carried the SMC option.
pub const SOCK_OPT_SENT: u32 = 1 << 1;
/// The peer's SYN or SYN-ACK carried the SMC option.
pub const SOCK_PEER_SMC: u32 = 1 << 2;
/// The other end of this connection is a socket on this host.
pub const SOCK_SAME_HOST: u32 = 1 << 3;
/// Messages of this socket take the `sk_msg` shortcut to its peer.
pub const SOCK_SHORTCUT: u32 = 1 << 4;
/// The data path decided that this connection stays TCP ([`SMC_SO_TCP`]); it also voids
/// [`SOCK_SHORTCUT_GRANTED`].
pub const SOCK_TCP: u32 = 1 << 5;
/// The loopback-ism daemon (root) found this socket to be the exact peer (socket cookie) of a
/// registered DMB's socket at an attach, and wrote this bit through the pinned socket storage:
/// [`SMC_SO_SHORTCUT`] may enable the redirect. No socket option sets it.
pub const SOCK_SHORTCUT_GRANTED: u32 = 1 << 6;
/// The passive (accepted) end of a connection whose both ends announced SMC: its client sends
/// a CLC Proposal first.
pub const SOCK_PASSIVE: u32 = 1 << 7;
/// A process of the data path asked for this passive socket's state ([`SMC_SO_STATE`], the
/// first thing its `accept` does): it reads the client's CLC messages itself, so no sweep may
/// quarantine the socket any more. Set with one atomic `or` that also tells whether a sweep came
/// first ([`SOCK_QUARANTINE_TRY`]).
pub const SOCK_CLAIMED: u32 = 1 << 8;
/// A sweep ([`SWEEP_PROG`]) tried to quarantine this socket: set with one atomic `or`; the
/// sweep quarantines it only when that `or` found no [`SOCK_CLAIMED`], and a claim whose `or`
/// found this bit answers [`SOCK_QUARANTINED`]. Exactly one of the two sees the other.
pub const SOCK_QUARANTINE_TRY: u32 = 1 << 9;
/// The socket is in [`MAP_QUARANTINE`]: the verdict strips its client's Proposal (and a Decline
/// right behind it) off the stream, so the image without the data path that accepts it reads
/// only the client's application bytes. A data path that accepts such a socket treats it as
/// plain TCP (its client times out waiting for the Accept and continues on TCP).
pub const SOCK_QUARANTINED: u32 = 1 << 10;

/// A listening socket counted in [`MAP_LISTENERS`] (set at its `listen`, when it opted in):
/// as announcing while [`SOCK_OPTED_IN`] is set, as withdrawn otherwise; uncounted when it
/// leaves the listening state (its close).
pub const SOCK_LISTEN_COUNTED: u32 = 1 << 11;

/// Per-socket state, kept in socket storage and returned by [`SMC_SO_STATE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockState {
    /// `SOCK_*` bits.
    pub flags: u32,
    /// Version of this struct's layout ([`SOCK_STATE_VERSION`]).
    pub version: u32,
    /// Bytes this socket sent through the `sk_msg` shortcut.
    pub redirected_bytes: u64,
    /// Messages this socket sent through the `sk_msg` shortcut.
    pub redirected_msgs: u64,
    /// A passive socket whose client announced SMC ([`SOCK_PASSIVE`]): its local address
    /// (IPv6 in network byte order, IPv4 v4-mapped) and port (host byte order), recorded at
    /// ESTABLISHED, which tell the quarantine sweep the listener it came from.
    pub local_ip: [u32; 4],
    pub local_port: u32,
    pub _pad: u32,
}

/// Layout version of [`SockState`].
pub const SOCK_STATE_VERSION: u32 = 3;

/// A TCP socket: its network namespace and its connection as seen from it. Addresses are IPv6
/// in network byte order (IPv4 is stored v4-mapped, `::ffff:a.b.c.d`, so that an `AF_INET6`
/// socket talking to an `AF_INET` one produces matching keys); ports in host byte order.
///
/// A 4-tuple is unique only within one network namespace, and a process with a user namespace
/// makes a network namespace of its own and any tuple in it (another's tuples are in
/// `/proc/net/tcp`): keyed by the 4-tuple alone, such a process's sockets replaced another
/// tenant's in the SOCKHASH and `SMC_PEERS` (red team rt22 `hijack`). With the namespace in
/// the key they never collide; the peer of a connection between two namespaces (veth) is found
/// through [`MAP_PAIRS`], by its initial sequence numbers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKey {
    pub local_ip: [u32; 4],
    pub remote_ip: [u32; 4],
    pub local_port: u32,
    pub remote_port: u32,
    /// `bpf_get_netns_cookie` (`SO_NETNS_COOKIE`) of the socket's network namespace; 0 in the
    /// keys of [`MAP_PAIRS`].
    pub netns: u64,
}

impl SockKey {
    /// The same connection as seen from the other end, in the same network namespace.
    pub const fn mirror(&self) -> Self {
        SockKey {
            local_ip: self.remote_ip,
            remote_ip: self.local_ip,
            local_port: self.remote_port,
            remote_port: self.local_port,
            netns: self.netns,
        }
    }

    /// This key in the network namespace `netns`.
    pub const fn in_netns(&self, netns: u64) -> Self {
        SockKey { netns, ..*self }
    }

    /// Whether both addresses are loopback ones (`127.0.0.0/8` v4-mapped, `::1`): such a
    /// connection never leaves its network namespace.
    pub const fn is_loopback(&self) -> bool {
        const fn lo(a: &[u32; 4]) -> bool {
            let b = a[3].to_ne_bytes();
            (ListenerKey::is_v4_mapped(a) && b[0] == 127)
                || (a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == u32::from_ne_bytes([0, 0, 0, 1]))
        }
        lo(&self.local_ip) && lo(&self.remote_ip)
    }
}

/// An address as the eBPF programs key it ([`SockKey`], [`ListenerKey`]): IPv6 in network byte
/// order, IPv4 v4-mapped (`::ffff:a.b.c.d`), as the `u32` words of those 16 bytes in memory.
#[cfg(feature = "std")]
pub fn key_ip(ip: std::net::IpAddr) -> [u32; 4] {
    let o = match ip {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        std::net::IpAddr::V6(v6) => v6.octets(),
    };
    let (words, _) = o.as_chunks::<4>();
    core::array::from_fn(|i| words.get(i).map_or(0, |w| u32::from_ne_bytes(*w)))
}

#[cfg(feature = "std")]
impl SockKey {
    /// The key of the connection end `local` talking to `peer`, in the network namespace of
    /// cookie `netns` ([`netns_cookie`]).
    pub fn new(local: std::net::SocketAddr, peer: std::net::SocketAddr, netns: u64) -> Self {
        SockKey {
            local_ip: key_ip(local.ip()),
            remote_ip: key_ip(peer.ip()),
            local_port: u32::from(local.port()),
            remote_port: u32::from(peer.port()),
            netns,
        }
    }
}

// The socket helpers below call libc's `getsockopt`: not for smc-preload, whose own calls go
// through its `real` table (libc's symbol in the library is its interposer).

/// What the eBPF programs know about the socket `fd` ([`SMC_SO_STATE`]); `None` outside an
/// attached cgroup (`ENOPROTOOPT`) or for no socket.
#[cfg(feature = "std")]
pub fn sock_state(fd: std::os::fd::RawFd) -> Option<SockState> {
    let mut st = SockState::default();
    let mut len = core::mem::size_of::<SockState>() as libc::socklen_t;
    // SAFETY: a plain getsockopt into an out buffer of `len` bytes (a bad `fd` fails).
    let r = unsafe {
        libc::getsockopt(
            fd,
            SOL_SMC_BPF,
            SMC_SO_STATE,
            core::ptr::from_mut(&mut st).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(st)
}

/// The network namespace cookie of the socket `sock` (`SO_NETNS_COOKIE`, Linux 5.14+): what
/// the eBPF programs' `bpf_get_netns_cookie` gives for it, the `netns` of [`SockKey`] and
/// [`ListenerKey`].
#[cfg(feature = "std")]
pub fn netns_cookie(sock: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u64> {
    use std::os::fd::AsRawFd as _;
    let mut cookie = 0u64;
    let mut len = core::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `sock` is an open descriptor for the call, and the out buffer has `len` bytes.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_NETNS_COOKIE,
            core::ptr::from_mut(&mut cookie).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cookie)
}

/// The cookie of the calling thread's network namespace ([`netns_cookie`] of a Unix socket
/// made for the purpose: any socket has its namespace's cookie, and a Unix one needs no
/// interface up).
#[cfg(feature = "std")]
pub fn own_netns_cookie() -> std::io::Result<u64> {
    use std::os::fd::{AsFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: plain socket(2); its result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor that nothing else owns.
    let s = unsafe { OwnedFd::from_raw_fd(fd) };
    netns_cookie(s.as_fd())
}

/// Key of [`MAP_PAIRS`]: a connection between two network namespaces as seen from one end,
/// with the first sequence numbers of each direction (`snd_una` and `rcv_nxt` at ESTABLISHED:
/// each end's initial sequence number plus one). The other end looks its peer up by its own
/// view mirrored ([`PairKey::peer`]). A process of another namespace can rebuild the 4-tuple,
/// but not the two 32-bit sequence numbers, which only the two ends (and their namespaces'
/// traffic) see.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PairKey {
    /// The 4-tuple, with `netns` 0.
    pub tuple: SockKey,
    /// This end's first sequence number (its ISN + 1).
    pub local_seq: u32,
    /// The other end's first sequence number (its ISN + 1).
    pub remote_seq: u32,
}

impl PairKey {
    /// The key under which the other end recorded itself.
    pub const fn peer(&self) -> Self {
        PairKey {
            tuple: self.tuple.mirror(),
            local_seq: self.remote_seq,
            remote_seq: self.local_seq,
        }
    }
}

/// Value of [`MAP_PAIRS`]: which socket, in which network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairEntry {
    pub netns: u64,
    pub cookie: u64,
}

/// Key of [`MAP_LISTENERS`]: a listening address and port in one network namespace. A
/// listener bound to a wildcard address has that wildcard ([`ListenerKey::V4_ANY`] for
/// `0.0.0.0`, all zeros for `::`); a connection's listener is looked up by the connection's
/// local address first, then by the wildcards ([`ListenerKey::candidates`]). Keyed by the port
/// alone, another program's listener on the same port at another address (127.0.0.2, `[::1]`)
/// announced for a listener that had withdrawn (red team round 20, `rt20_alias.py`, also as
/// uid nobody: 10 of 10 Proposals read by the image without the library).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ListenerKey {
    /// `bpf_get_netns_cookie` of the listener's network namespace.
    pub netns: u64,
    /// Local address: IPv6 in network byte order, IPv4 v4-mapped (`::ffff:a.b.c.d`).
    pub addr: [u32; 4],
    /// Local port, host byte order.
    pub port: u32,
    pub _pad: u32,
}

impl ListenerKey {
    /// `0.0.0.0` v4-mapped (`::ffff:0.0.0.0`), as stored in memory.
    pub const V4_ANY: [u32; 4] = [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), 0];

    /// Whether `addr` is v4-mapped (`::ffff:a.b.c.d`).
    #[inline(always)]
    pub const fn is_v4_mapped(addr: &[u32; 4]) -> bool {
        addr[0] == 0 && addr[1] == 0 && addr[2] == Self::V4_ANY[2]
    }

    /// The keys that may hold the listener of a connection to `addr`:`port`, most specific
    /// first: the address itself, then the IPv4 wildcard (a v4-mapped address only), then the
    /// IPv6 wildcard (which a dual-stack listener also has for IPv4).
    #[inline(always)]
    pub fn candidates(netns: u64, addr: [u32; 4], port: u32) -> [ListenerKey; 3] {
        let k = |addr| ListenerKey {
            netns,
            addr,
            port,
            _pad: 0,
        };
        let any = if Self::is_v4_mapped(&addr) {
            Self::V4_ANY
        } else {
            [0; 4]
        };
        [k(addr), k(any), k([0; 4])]
    }

    /// Whether a connection to `addr` (this key's port) came through this listener: its
    /// address, or a wildcard that covers it.
    #[inline(always)]
    pub const fn covers(&self, addr: &[u32; 4]) -> bool {
        let a = &self.addr;
        let same = a[0] == addr[0] && a[1] == addr[1] && a[2] == addr[2] && a[3] == addr[3];
        let v6_any = a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == 0;
        let v4_any = a[0] == Self::V4_ANY[0]
            && a[1] == Self::V4_ANY[1]
            && a[2] == Self::V4_ANY[2]
            && a[3] == Self::V4_ANY[3];
        same || v6_any || (v4_any && Self::is_v4_mapped(addr))
    }
}

/// Value of the same-host map: which socket holds a key, and what it is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerEntry {
    /// `bpf_get_socket_cookie` of the socket.
    pub cookie: u64,
    /// `SOCK_*` bits at the time of recording.
    pub flags: u32,
    pub _pad: u32,
    /// The network namespace of the peer socket when it is in another one (a connection between
    /// two namespaces on this host, paired by [`MAP_PAIRS`]), else 0: the peer's entry is the
    /// mirrored key in this namespace, or in that one. Written by the kernel (this socket's or
    /// its peer's `sock_ops`), never by another socket's owner.
    pub peer_netns: u64,
}

/// Mode of an attached cgroup.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The `sk_msg` shortcut for every same-host connection of the cgroup.
    Shortcut = 1,
    /// The shared-memory data path; the shortcut carries only its control traffic.
    Ism = 2,
}

/// Name of the sock_ops program for each mode, as exported by `smc-ebpf`.
pub const SOCKOPS_PROG_SHORTCUT: &str = "smc_sockops_shortcut";
pub const SOCKOPS_PROG_ISM: &str = "smc_sockops_ism";
pub const SK_MSG_PROG: &str = "smc_sk_msg";
pub const SETSOCKOPT_PROG: &str = "smc_setsockopt";
pub const GETSOCKOPT_PROG: &str = "smc_getsockopt";
/// The stream verdict on [`MAP_QUARANTINE`].
pub const VERDICT_PROG: &str = "smc_quarantine_verdict";
/// The `iter/tcp` program that quarantines the queued connections of a withdrawn listener
/// (pinned as an iterator link: `PIN_ROOT/iter/smc_sweep`; reading it runs the sweep in the
/// reader's network namespace).
pub const SWEEP_PROG: &str = "smc_sweep";

/// Map names (also the names under the pin directory).
pub const MAP_SOCK_STATE: &str = "SMC_SOCK_STATE";
pub const MAP_PEERS: &str = "SMC_PEERS";
/// Established sockets of `ism`-mode cgroups whose connection cannot become SMC-D (not both
/// ends announced SMC), by 4-tuple: for same-host detection and `conns` only. They get no state callback (for a short connection it was a
/// measurable share of its cost), so closed ones are not removed: LRU eviction bounds them, and
/// a stale entry only ever names a 4-tuple that was a socket of this host.
pub const MAP_TCP_PEERS: &str = "SMC_TCP_PEERS";
pub const MAP_SOCKHASH: &str = "SMC_SOCKHASH";
/// Established sockets of attached cgroups whose addresses are not loopback ones, by
/// [`PairKey`] (4-tuple and first sequence numbers, no namespace; value [`PairEntry`]): the
/// later end of a connection between two network namespaces finds the earlier one here and
/// writes each end's [`PeerEntry::peer_netns`]. LRU, never removed.
pub const MAP_PAIRS: &str = "SMC_PAIRS";
/// Entries of [`MAP_PAIRS`]: an entry is needed only from one end's ESTABLISHED to the
/// other's (the same host: microseconds), so this bounds the handshakes of non-loopback
/// connections under way at once, not the live connections.
pub const MAX_PAIRS: u32 = 16384;
/// Per attached cgroup settings of `smc-ctl attach` (cgroup storage, one `u32` of
/// `CONFIG_*` bits per cgroup and attach type, keyed `{cgroup inode, attach type}`): the kernel
/// makes the entry, zeroed, when a program using the map is attached to a cgroup, and each run
/// of that attachment reads its own (`bpf_get_local_storage`, no lookup); `attach` writes it
/// for the sock_ops and getsockopt attachments. Zero is the behaviour before the map existed.
pub const MAP_CONFIG: &str = "SMC_CGROUP_CONFIG";
/// [`MAP_CONFIG`] bit: sockets of this cgroup whose connection cannot become SMC-D (not both
/// ends announced SMC) leave no record in [`MAP_TCP_PEERS`], and `SMC_SO_STATE` on a socket
/// without socket storage answers without looking for one (`smc-ctl attach --tcp-records off`).
/// Such connections then neither count in `same_host_pairs` nor show their eBPF flags in
/// `smc-ctl conns`; nothing that decides a connection reads those records.
pub const CONFIG_NO_TCP_RECORDS: u32 = 1 << 0;
/// Listening sockets that opted in, by [`ListenerKey`]; the value counts them
/// ([`LISTENERS_ANNOUNCING`] each that announces, [`LISTENERS_WITHDRAWN`] each that withdrew,
/// see [`listeners_announce`]). A SYN-ACK is built on a request socket, which has no socket
/// storage and whose listener the program cannot reach, so the listeners' opt-in is looked up
/// here by the request's network namespace, local address and port (see [`ListenerKey`]).
/// Counted at `listen` ([`SOCK_LISTEN_COUNTED`]), moved by [`SMC_SO_ENABLE`] on a counted
/// listener, uncounted at its close (its state callback). Counts, not one flag per key: with a
/// flag, an `SO_REUSEPORT` sibling's `listen` (or an `IPV6_V6ONLY` `[::]` listener beside a
/// dual-stack one) announced again for a listener that had withdrawn before an exec, and a
/// closed listener's entry stayed and announced for a later withdrawn wildcard listener of the
/// port (red team round 30: the image without the library read the Proposals, up to 30 of 30).
/// A SYN-ACK without an entry carries no option (so an LRU eviction can only make a connection
/// stay TCP).
pub const MAP_LISTENERS: &str = "SMC_LISTENERS";
/// [`MAP_LISTENERS`] value: one listener of the key that announces.
pub const LISTENERS_ANNOUNCING: u64 = 1;
/// [`MAP_LISTENERS`] value: one listener of the key that withdrew (the upper half).
pub const LISTENERS_WITHDRAWN: u64 = 1 << 32;

/// What a [`MAP_LISTENERS`] value says of its key: `None` when no listener of ours is counted
/// there (the next, less specific key decides), else whether a SYN-ACK announces: only while
/// no listener of the key withdrew (any of them may get the connection: an `SO_REUSEPORT`
/// group, or both `[::]` listeners of a port).
#[inline(always)]
pub const fn listeners_announce(v: u64) -> Option<bool> {
    let announcing = v as u32;
    let withdrawn = (v >> 32) as u32;
    if announcing == 0 && withdrawn == 0 {
        None
    } else {
        Some(withdrawn == 0)
    }
}
/// Entries of [`MAP_LISTENERS`].
pub const MAX_LISTENERS: u32 = 16384;
pub const MAP_COUNTERS: &str = "SMC_COUNTERS";
/// The switch of `smc-ctl trace` (an array of one `u32`): non-zero makes the programs write a
/// line at each decision about a connection (why it did or did not get the SMC option, why it
/// stays TCP) into [`MAP_LOGS`]. Zero, the default, costs one array lookup per decision.
pub const MAP_TRACE: &str = "SMC_TRACE";
/// aya-log's ring buffer of those lines (the name is aya-log's).
pub const MAP_LOGS: &str = "AYA_LOGS";
/// Passive sockets whose client announced SMC but whose listener went over to an image that
/// does not run the data path before any process of ours accepted them (a SOCKHASH keyed by
/// socket cookie, `u64`): its stream verdict ([`VERDICT_PROG`]) strips the CLC Proposal and
/// Decline their clients send, which that image would read as request bytes (issue 10 item 3;
/// red team `rt10.c listener_backlog_exec`, `rt18_queued.py`). Filled by the sweep that the
/// daemon runs before such an exec ([`SWEEP_PROG`]) and by `sock_ops` for a connection
/// established after its listener withdrew whose SYN-ACK still announced SMC. A socket leaves
/// it when it closes.
pub const MAP_QUARANTINE: &str = "SMC_QUARANTINE";
/// Where the verdict is in each quarantined socket's stream (LRU hash by socket cookie, `u32`:
/// [`QUARANTINE_AT_PROPOSAL`], [`QUARANTINE_AT_DECLINE`], [`QUARANTINE_DONE`]). An entry evicted
/// or missing: done (the verdict passes everything).
pub const MAP_QUARANTINE_AT: &str = "SMC_QUARANTINE_AT";
/// Entries of [`MAP_QUARANTINE`] and [`MAP_QUARANTINE_AT`].
pub const MAX_QUARANTINED: u32 = 16384;
/// The stream's first bytes are due: a whole Proposal there is stripped.
pub const QUARANTINE_AT_PROPOSAL: u32 = 0;
/// The Proposal was stripped: a whole Decline next (the client's, after its wait for an Accept
/// that never comes) is stripped too.
pub const QUARANTINE_AT_DECLINE: u32 = 1;
/// Application bytes began: everything passes.
pub const QUARANTINE_DONE: u32 = 2;
/// The listener, or the one socket, a sweep is about (an array of one [`SweepConfig`]), written
/// by the daemon before it reads the sweep iterator (one sweep at a time).
pub const MAP_SWEEP: &str = "SMC_SWEEP";

/// The value of [`MAP_SWEEP`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepConfig {
    /// The listener's [`ListenerKey`]: network namespace cookie, local address and port.
    /// Unused when [`SweepConfig::cookie`] is set.
    pub listener: ListenerKey,
    /// Not 0: the sweep is about one passive socket only, the one of this socket cookie: the
    /// server end of a client's connection whose Accept did not come and that is about to
    /// half-close or close it (its FIN would make that socket `CLOSE_WAIT`, which no sweep
    /// can quarantine any more). Its listener may still announce.
    pub cookie: u64,
}

/// Entries of the same-host maps and of the SOCKHASH: sockets, two per connection. Issue 14's
/// 65 536 connections are 131 072 sockets; the same-host maps are LRU (an evicted live entry
/// makes its connection's same-host checks fail), and `MAP_TCP_PEERS` keeps closed sockets
/// until evicted, hence twice that. Each LRU map preallocates its entries (about 36 MB each:
/// `memlock` 35 652 480 bytes).
pub const MAX_SOCKETS: u32 = 262_144;

/// Per-CPU counters, indices into [`MAP_COUNTERS`]. Keep [`Counter::ALL`] in order.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// TCP sockets of an attached cgroup that reached ESTABLISHED (either side).
    SocketsEstablished = 0,
    /// Active opens (connect) that reached ESTABLISHED.
    ActiveEstablished,
    /// Passive opens (accept) that reached ESTABLISHED.
    PassiveEstablished,
    /// `SMC_SO_ENABLE` requests.
    OptIn,
    /// SYNs we wrote the SMC option into.
    SynOptSent,
    /// SYN-ACKs we wrote the SMC option into.
    SynAckOptSent,
    /// Listeners that saw the SMC option in a peer's SYN.
    SynOptReceived,
    /// Clients that saw the SMC option in the peer's SYN-ACK.
    SynAckOptReceived,
    /// Connections whose both ends are sockets on this host.
    SameHostPairs,
    /// Sockets put into the SOCKHASH.
    ShortcutSockets,
    /// Messages redirected by `sk_msg` to the peer.
    MsgRedirected,
    /// Bytes redirected by `sk_msg` to the peer.
    BytesRedirected,
    /// Messages passed to TCP: the sender is not enabled for the shortcut.
    MsgPassNotEnabled,
    /// Messages passed to TCP: the peer is not in the SOCKHASH (other host, outside the cgroup).
    MsgPassNoPeer,
    /// Messages passed to TCP: the redirect failed.
    MsgPassRedirectFailed,
    /// `SMC_SO_STATE` queries.
    StateQueries,
    /// Sockets of an attached cgroup that closed after ESTABLISHED (in `ism` mode: those whose
    /// both ends announced SMC; the others are not watched).
    SocketsClosed,
    /// Sockets taken out of the SOCKHASH again: their data path decided to stay TCP.
    ShortcutSocketsLeft,
    /// Sockets put into [`MAP_QUARANTINE`] (by a sweep or at ESTABLISHED).
    Quarantined,
    /// CLC messages the quarantine verdict stripped off a stream.
    ClcStripped,
}

impl Counter {
    pub const ALL: [Counter; 20] = [
        Counter::SocketsEstablished,
        Counter::ActiveEstablished,
        Counter::PassiveEstablished,
        Counter::OptIn,
        Counter::SynOptSent,
        Counter::SynAckOptSent,
        Counter::SynOptReceived,
        Counter::SynAckOptReceived,
        Counter::SameHostPairs,
        Counter::ShortcutSockets,
        Counter::MsgRedirected,
        Counter::BytesRedirected,
        Counter::MsgPassNotEnabled,
        Counter::MsgPassNoPeer,
        Counter::MsgPassRedirectFailed,
        Counter::StateQueries,
        Counter::SocketsClosed,
        Counter::ShortcutSocketsLeft,
        Counter::Quarantined,
        Counter::ClcStripped,
    ];
    pub const COUNT: u32 = Self::ALL.len() as u32;

    /// Stable snake_case name, used in `status --json` and `stats`.
    pub const fn name(self) -> &'static str {
        match self {
            Counter::SocketsEstablished => "sockets_established",
            Counter::ActiveEstablished => "active_established",
            Counter::PassiveEstablished => "passive_established",
            Counter::OptIn => "opt_in",
            Counter::SynOptSent => "syn_opt_sent",
            Counter::SynAckOptSent => "synack_opt_sent",
            Counter::SynOptReceived => "syn_opt_received",
            Counter::SynAckOptReceived => "synack_opt_received",
            Counter::SameHostPairs => "same_host_pairs",
            Counter::ShortcutSockets => "shortcut_sockets",
            Counter::MsgRedirected => "msg_redirected",
            Counter::BytesRedirected => "bytes_redirected",
            Counter::MsgPassNotEnabled => "msg_pass_not_enabled",
            Counter::MsgPassNoPeer => "msg_pass_no_peer",
            Counter::MsgPassRedirectFailed => "msg_pass_redirect_failed",
            Counter::StateQueries => "state_queries",
            Counter::SocketsClosed => "sockets_closed",
            Counter::ShortcutSocketsLeft => "shortcut_sockets_left",
            Counter::Quarantined => "quarantined",
            Counter::ClcStripped => "clc_stripped",
        }
    }
}

/// A decision line of `smc-ctl trace`: the programs write the code and the ports (one aya-log
/// record `"<code> <local port> <remote port>"`), `smc-ctl trace` the words.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TraceReason {
    ConnectNotOptedIn = 1,
    ConnectAnnounces = 2,
    ListenNotOptedIn = 3,
    ListenAnnounces = 4,
    SynAckPeerSynWithout = 5,
    SynAckListenerWithdrew = 6,
    EstablishedNotOptedIn = 7,
    EstablishedPeerDidNotAnnounce = 8,
    EstablishedBothAnnounced = 9,
    EstablishedBothAnnouncedSameHost = 10,
    LeftSockhash = 11,
    DataPathTcp = 12,
    ShortcutRefused = 13,
    SynAckCookie = 14,
    EstablishedQuarantined = 15,
}

impl TraceReason {
    pub const ALL: [TraceReason; 15] = [
        TraceReason::ConnectNotOptedIn,
        TraceReason::ConnectAnnounces,
        TraceReason::ListenNotOptedIn,
        TraceReason::ListenAnnounces,
        TraceReason::SynAckPeerSynWithout,
        TraceReason::SynAckListenerWithdrew,
        TraceReason::EstablishedNotOptedIn,
        TraceReason::EstablishedPeerDidNotAnnounce,
        TraceReason::EstablishedBothAnnounced,
        TraceReason::EstablishedBothAnnouncedSameHost,
        TraceReason::LeftSockhash,
        TraceReason::DataPathTcp,
        TraceReason::ShortcutRefused,
        TraceReason::SynAckCookie,
        TraceReason::EstablishedQuarantined,
    ];

    pub fn from_code(code: u32) -> Option<TraceReason> {
        TraceReason::ALL.into_iter().find(|r| *r as u32 == code)
    }

    /// Where the decision was taken (the line's first word).
    pub const fn event(self) -> &'static str {
        use TraceReason::*;
        match self {
            ConnectNotOptedIn | ConnectAnnounces => "connect",
            ListenNotOptedIn | ListenAnnounces => "listen",
            SynAckPeerSynWithout | SynAckListenerWithdrew | SynAckCookie => "SYN-ACK",
            EstablishedNotOptedIn
            | EstablishedPeerDidNotAnnounce
            | EstablishedBothAnnounced
            | EstablishedBothAnnouncedSameHost
            | EstablishedQuarantined => "established",
            LeftSockhash => "sock_ops",
            DataPathTcp | ShortcutRefused => "setsockopt",
        }
    }

    /// Whether the line names the remote port too (a listener has none).
    pub const fn has_remote(self) -> bool {
        !matches!(
            self,
            TraceReason::ListenNotOptedIn
                | TraceReason::ListenAnnounces
                | TraceReason::DataPathTcp
                | TraceReason::ShortcutRefused
        )
    }

    /// Why.
    pub const fn text(self) -> &'static str {
        use TraceReason::*;
        match self {
            ConnectNotOptedIn => {
                "socket did not opt in (SMC_SO_ENABLE): no SMC option, stays TCP"
            }
            ConnectAnnounces => "SYN announces SMC",
            ListenNotOptedIn => {
                "socket did not opt in (SMC_SO_ENABLE): its SYN-ACKs carry no SMC option"
            }
            ListenAnnounces => "announces SMC",
            SynAckPeerSynWithout => {
                "the peer's SYN did not announce SMC: no SMC option, stays TCP"
            }
            SynAckListenerWithdrew => {
                "the listener withdrew SMC (SMC_SO_ENABLE 0): no SMC option, stays TCP"
            }
            SynAckCookie => {
                "a SYN cookie (the listener's queue was full): the connection keeps no state \
                 until its ACK, so no SMC option, stays TCP"
            }
            EstablishedNotOptedIn => "socket did not opt in (SMC_SO_ENABLE): stays TCP",
            EstablishedPeerDidNotAnnounce => "the peer did not announce SMC: stays TCP",
            EstablishedBothAnnounced => {
                "both ends announced SMC, the peer is not (yet) known on this host: the data path decides"
            }
            EstablishedBothAnnouncedSameHost => {
                "both ends announced SMC, same host: the data path decides"
            }
            EstablishedQuarantined => {
                "our SYN-ACK announced SMC but the listener withdrew since: quarantined, the \
                 client's CLC messages are stripped off the stream"
            }
            LeftSockhash => "the data path chose TCP (SMC_SO_TCP): left the SOCKHASH",
            DataPathTcp => "the data path fell back to TCP (SMC_SO_TCP)",
            ShortcutRefused => {
                "SMC_SO_SHORTCUT refused (not granted by the daemon, or the connection stays TCP)"
            }
        }
    }
}

/// The TCP experimental option that announces SMC: kind 254, length 6, ExID "SMCR" in EBCDIC.
pub const TCPOPT_SMC: [u8; 6] = [254, 6, 0xE2, 0xD4, 0xC3, 0xD9];
/// Layout version of everything pinned; a pin directory with another version is refused.
pub const PIN_LAYOUT_VERSION: u32 = 7;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers without padding holes.
    unsafe impl aya::Pod for super::SockState {}
    // SAFETY: plain `#[repr(C)]` integers without padding holes.
    unsafe impl aya::Pod for super::SockKey {}
    // SAFETY: plain `#[repr(C)]` integers without padding holes.
    unsafe impl aya::Pod for super::PeerEntry {}
    // SAFETY: plain `#[repr(C)]` integers without padding holes.
    unsafe impl aya::Pod for super::PairKey {}
    // SAFETY: plain `#[repr(C)]` integers without padding holes.
    unsafe impl aya::Pod for super::PairEntry {}
}

#[cfg(test)]
mod tests {
    #[test]
    fn listener_keys_cover_their_addresses_and_wildcards() {
        use super::ListenerKey;
        let v4 = |a: [u8; 4]| {
            [
                0,
                0,
                u32::from_ne_bytes([0, 0, 0xff, 0xff]),
                u32::from_ne_bytes(a),
            ]
        };
        let lo = v4([127, 0, 0, 1]);
        let key = |addr| ListenerKey {
            netns: 7,
            addr,
            port: 80,
            _pad: 0,
        };
        let c = ListenerKey::candidates(7, lo, 80);
        assert_eq!(c[0].addr, lo);
        assert_eq!(c[1].addr, ListenerKey::V4_ANY);
        assert_eq!(c[2].addr, [0; 4]);
        assert_eq!(ListenerKey::candidates(7, [1, 2, 3, 4], 80)[1].addr, [0; 4]);
        assert!(key(lo).covers(&lo));
        assert!(!key(v4([127, 0, 0, 2])).covers(&lo));
        assert!(key(ListenerKey::V4_ANY).covers(&lo));
        assert!(!key(ListenerKey::V4_ANY).covers(&[1, 2, 3, 4]));
        assert!(key([0; 4]).covers(&lo) && key([0; 4]).covers(&[1, 2, 3, 4]));
    }

    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(core::mem::size_of::<SockState>(), 48);
        assert_eq!(core::mem::size_of::<ListenerKey>(), 32);
    }

    #[test]
    fn listener_counts_announce_only_while_none_of_the_key_withdrew() {
        use super::{listeners_announce, LISTENERS_ANNOUNCING as A, LISTENERS_WITHDRAWN as W};
        assert_eq!(
            listeners_announce(0),
            None,
            "nobody counted: the next key decides"
        );
        assert_eq!(listeners_announce(A), Some(true));
        assert_eq!(listeners_announce(2 * A), Some(true));
        // An SO_REUSEPORT sibling announcing beside one that withdrew: no option for either.
        assert_eq!(listeners_announce(A + W), Some(false));
        assert_eq!(listeners_announce(W), Some(false));
        // The moves of the programs, with wrapping adds: withdraw, announce again, close.
        let withdraw = W.wrapping_sub(A);
        let v = (2 * A).wrapping_add(withdraw);
        assert_eq!(v, A + W);
        let v = v.wrapping_add(A.wrapping_sub(W));
        assert_eq!(v, 2 * A);
        let v = v
            .wrapping_add(A.wrapping_neg())
            .wrapping_add(A.wrapping_neg());
        assert_eq!(listeners_announce(v), None, "both closed: {v:#x}");
        assert_eq!(core::mem::size_of::<SockKey>(), 48);
        assert_eq!(core::mem::size_of::<PeerEntry>(), 24);
        assert_eq!(core::mem::size_of::<PairKey>(), 56);
        assert_eq!(core::mem::size_of::<PairEntry>(), 16);
        for (i, c) in Counter::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }

    #[test]
    fn mirror_is_an_involution() {
        let k = SockKey {
            local_ip: [0, 0, 0xffff_0000u32.to_be(), 0x7f00_0001u32.to_be()],
            remote_ip: [1, 2, 3, 4],
            local_port: 80,
            remote_port: 40000,
            netns: 9,
        };
        assert_eq!(k.mirror().mirror(), k);
        assert_ne!(k.mirror(), k);
        assert_eq!(k.mirror().netns, 9);
        let p = PairKey {
            tuple: k.in_netns(0),
            local_seq: 5,
            remote_seq: 7,
        };
        assert_eq!(p.peer().peer(), p);
        assert_eq!(
            (p.peer().local_seq, p.peer().tuple),
            (7, k.mirror().in_netns(0))
        );
    }

    #[cfg(feature = "std")]
    #[test]
    fn keys_of_socket_addresses() {
        let l: std::net::SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let p: std::net::SocketAddr = "127.0.0.2:80".parse().unwrap();
        let k = SockKey::new(l, p, 7);
        // v4-mapped, network byte order in memory (as smc-ebpf's v4_mapped).
        assert_eq!(k.local_ip[2], u32::from_ne_bytes([0, 0, 0xff, 0xff]));
        assert_eq!(k.local_ip[3], u32::from_ne_bytes([127, 0, 0, 1]));
        assert_eq!((k.local_port, k.remote_port, k.netns), (40000, 80, 7));
        assert_eq!(SockKey::new(p, l, 7), k.mirror());
        let v6: std::net::SocketAddr = "[::ffff:127.0.0.1]:40000".parse().unwrap();
        assert_eq!(SockKey::new(v6, p, 7), k);
        assert!(k.is_loopback());
        let one: std::net::SocketAddr = "[::1]:1".parse().unwrap();
        assert_eq!(
            key_ip(one.ip()),
            [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])]
        );
    }

    #[cfg(feature = "std")]
    #[test]
    fn netns_cookies() {
        use std::os::fd::AsFd as _;
        let own = own_netns_cookie().unwrap();
        assert_ne!(own, 0);
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert_eq!(netns_cookie(udp.as_fd()).unwrap(), own);
    }

    #[test]
    fn loopback_keys() {
        let v4 = |a: [u8; 4]| {
            [
                0,
                0,
                u32::from_ne_bytes([0, 0, 0xff, 0xff]),
                u32::from_ne_bytes(a),
            ]
        };
        let k = |l, r| SockKey {
            local_ip: l,
            remote_ip: r,
            ..SockKey::default()
        };
        assert!(k(v4([127, 0, 0, 1]), v4([127, 1, 2, 3])).is_loopback());
        let one6 = [0, 0, 0, u32::from_ne_bytes([0, 0, 0, 1])];
        assert!(k(one6, one6).is_loopback());
        assert!(!k(v4([10, 0, 0, 1]), v4([127, 0, 0, 1])).is_loopback());
        assert!(!k(v4([10, 0, 0, 1]), v4([10, 0, 0, 2])).is_loopback());
    }
}
