//! Every map of the object (names and layouts are the contract with `smc-ctl`, see
//! `smc_common::bpf`), with the small accessors the programs share.
use aya_ebpf::{
    bindings::bpf_sock_ops,
    macros::{btf_map, map},
    maps::{Array, LruHashMap, PerCpuArray, SockHash},
};
// Deprecated by aya, kept on purpose: see `SMC_CGROUP_CONFIG`.
#[allow(deprecated)]
use aya_ebpf::maps::CgroupStorage;
use smc_common::bpf::{
    listeners_announce, Counter, ListenerKey, PairEntry, PairKey, PeerEntry, SockKey, SockState,
    SweepConfig, CONFIG_NO_TCP_RECORDS, MAX_LISTENERS, MAX_PAIRS, MAX_QUARANTINED, MAX_SOCKETS,
};

use crate::{key::ops_key, storage::SockStorage};

#[btf_map]
pub static SMC_SOCK_STATE: SockStorage<SockState> = SockStorage::new();

/// Established sockets of attached cgroups by network namespace and 4-tuple. LRU: a socket whose cgroup was detached
/// before it closed is never removed by the STATE callback; eviction bounds such leftovers.
#[map]
pub static SMC_PEERS: LruHashMap<SockKey, PeerEntry> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);

/// Established sockets of ism-mode cgroups whose connection cannot become SMC-D
/// (`MAP_TCP_PEERS`): no state callback removes them, LRU eviction does.
#[map]
pub static SMC_TCP_PEERS: LruHashMap<SockKey, PeerEntry> =
    LruHashMap::with_max_entries(MAX_SOCKETS, 0);

/// The settings of the attached cgroup whose program runs (`MAP_CONFIG`): one `u32` per
/// cgroup and attach type, made zeroed by the kernel at the attach, written by `smc-ctl attach`.
// The old cgroup storage is the one whose entry belongs to the attachment (the cgroup the
// running program was attached to, not the socket's own cgroup) and whose helper needs no
// lookup; aya marks it deprecated in favour of `BPF_MAP_TYPE_CGRP_STORAGE` (6.2, per cgroup,
// a lookup by cgroup pointer), which would not tell nested attachments apart.
#[allow(deprecated)]
#[map]
pub static SMC_CGROUP_CONFIG: CgroupStorage<u32> = CgroupStorage::new();

/// Whether the attachment running this program keeps no records of connections that cannot
/// become SMC-D (`CONFIG_NO_TCP_RECORDS`).
#[inline(always)]
pub fn no_tcp_records() -> bool {
    #[allow(deprecated)]
    let p = SMC_CGROUP_CONFIG.get_ptr_mut();
    // SAFETY: `bpf_get_local_storage` never returns null for a program attached to a cgroup
    // (the kernel allocates the entry at the attach, before the program can run); checked all
    // the same. The `u32` is read once by value; userspace may rewrite it meanwhile.
    !p.is_null() && unsafe { core::ptr::read_volatile(p) } & CONFIG_NO_TCP_RECORDS != 0
}

/// The entry of `key` in either same-host map.
#[inline(always)]
pub fn peer_entry(key: &SockKey) -> Option<*mut PeerEntry> {
    SMC_PEERS
        .get_ptr_mut(key)
        .or_else(|| SMC_TCP_PEERS.get_ptr_mut(key))
}

/// [`peer_entry`] for a socket that stays TCP (ism mode, not both ends announced): its entry
/// and its peer's are most likely in `SMC_TCP_PEERS`, asked first (each lookup in these large
/// maps is a cache miss; a connection that stays TCP makes three of them).
#[inline(always)]
pub fn tcp_peer_entry(key: &SockKey) -> Option<*mut PeerEntry> {
    SMC_TCP_PEERS
        .get_ptr_mut(key)
        .or_else(|| SMC_PEERS.get_ptr_mut(key))
}

/// The same-host entry of the peer of the socket `key`, in `SMC_PEERS` or `SMC_TCP_PEERS`
/// (`tcp_first`: [`tcp_peer_entry`]'s order): the mirrored key in the socket's network
/// namespace, or, for a connection between two namespaces, in the peer's namespace that the
/// socket's own entry records (`PeerEntry::peer_netns`, written by the kernel when the two ends
/// were paired by their sequence numbers). Never an entry of a namespace that merely holds the
/// same 4-tuple.
#[inline(always)]
pub fn peer_of(key: &SockKey, tcp_first: bool) -> Option<*mut PeerEntry> {
    let find = |k: &SockKey| {
        if tcp_first {
            tcp_peer_entry(k)
        } else {
            peer_entry(k)
        }
    };
    let mirror = key.mirror();
    if let Some(e) = find(&mirror) {
        return Some(e);
    }
    if key.is_loopback() {
        return None;
    }
    // SAFETY: a non-null hash map value, allocated for this run (RCU); one field read by value.
    let ns = unsafe { (*find(key)?).peer_netns };
    if ns == 0 || ns == key.netns {
        return None;
    }
    find(&mirror.in_netns(ns))
}

/// `MAP_PAIRS`: established sockets with addresses that are not loopback ones, by 4-tuple and
/// first sequence numbers, for the pairing of connections between two network namespaces.
#[map]
pub static SMC_PAIRS: LruHashMap<PairKey, PairEntry> = LruHashMap::with_max_entries(MAX_PAIRS, 0);

/// Listeners that opted in, counted by key (`MAP_LISTENERS`): a SYN-ACK carries the option only
/// when its listener's key says so ([`listener_announces`]).
#[map]
pub static SMC_LISTENERS: LruHashMap<ListenerKey, u64> =
    LruHashMap::with_max_entries(MAX_LISTENERS, 0);

/// Adds `delta` (multiples of `LISTENERS_ANNOUNCING` / `LISTENERS_WITHDRAWN`, wrapping for a
/// subtraction) to the count of the listeners at `addr`:`port`, with one atomic add: two
/// listeners of one key (an `SO_REUSEPORT` group) may `listen` or close on two CPUs at once.
#[inline(always)]
pub fn count_listener(netns: u64, addr: [u32; 4], port: u32, delta: u64) {
    let key = ListenerKey {
        netns,
        addr,
        port,
        _pad: 0,
    };
    // Made zero if absent (`BPF_NOEXIST`: an existing count is never reset).
    let _ = SMC_LISTENERS.insert(&key, &0, 1);
    if let Some(v) = SMC_LISTENERS.get_ptr_mut(&key) {
        // SAFETY: a non-null value of the map, 8-aligned, allocated for this run (RCU); other
        // CPUs change it only with atomic adds.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::SeqCst }>(
                v, delta,
            )
        };
    }
}

/// Whether the listener of the request socket `ops` announces SMC: the first key of its address,
/// the wildcard of its family, `::` ([`ListenerKey::candidates`]) that counts a listener of
/// ours decides ([`listeners_announce`]).
#[inline(always)]
pub fn listener_announces(ops: *mut bpf_sock_ops) -> bool {
    let Some(key) = ops_key(ops) else {
        return false;
    };
    for k in ListenerKey::candidates(key.netns, key.local_ip, key.local_port) {
        // SAFETY: the value of a hash map lookup stays allocated for this run (RCU); another
        // CPU may change it concurrently, so it is only read once, by value.
        if let Some(v) = unsafe { SMC_LISTENERS.get(&k) } {
            if let Some(a) = listeners_announce(*v) {
                return a;
            }
        }
    }
    false
}

#[map]
pub static SMC_SOCKHASH: SockHash<SockKey> = SockHash::with_max_entries(MAX_SOCKETS, 0);

/// `MAP_QUARANTINE`: passive sockets whose client's CLC messages the verdict strips (see
/// `crate::quarantine`), by socket cookie.
#[map]
pub static SMC_QUARANTINE: SockHash<u64> = SockHash::with_max_entries(MAX_QUARANTINED, 0);

/// `MAP_QUARANTINE_AT`: where each quarantined stream's verdict is (`QUARANTINE_AT_*`).
#[map]
pub static SMC_QUARANTINE_AT: LruHashMap<u64, u32> =
    LruHashMap::with_max_entries(MAX_QUARANTINED, 0);

/// `MAP_SWEEP`: the withdrawn listener the next sweep is about.
#[map]
pub static SMC_SWEEP: Array<SweepConfig> = Array::with_max_entries(1, 0);

#[map]
pub static SMC_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[inline(always)]
pub fn count(c: Counter, n: u64) {
    if let Some(p) = SMC_COUNTERS.get_ptr_mut(c as u32) {
        // SAFETY: a non-null per-CPU array slot of this CPU: valid for the map's lifetime, and no
        // other program writes it meanwhile (BPF programs run with migration disabled; userspace
        // only reads the counters).
        unsafe { *p += n };
    }
}

/// `MAP_TRACE`: `smc-ctl trace` sets entry 0 while it prints the decision lines.
#[map]
pub static SMC_TRACE: Array<u32> = Array::with_max_entries(1, 0);

/// Whether `smc-ctl trace` is listening: one array lookup (inlined by the verifier).
#[inline(always)]
pub fn tracing() -> bool {
    SMC_TRACE.get(0).is_some_and(|v| *v != 0)
}

/// Writes a decision line: one aya-log record `"<reason> <local port> <remote port>"` into
/// `AYA_LOGS` (`smc-ctl trace` puts the words to the code). A subprogram, not inlined: the
/// record's code exists once instead of at every decision point.
#[inline(never)]
pub fn trace_line(reason: u32, local_port: u32, remote_port: u32) {
    // aya-log does not use the context: the record goes to its ring buffer.
    aya_log_ebpf::info!(&(), "{} {} {}", reason, local_port, remote_port);
}

/// A decision line ([`TraceReason`](smc_common::bpf::TraceReason)) for `smc-ctl trace`, written
/// only while [`tracing`]: `trace!(TraceReason::X, local_port, remote_port)`.
macro_rules! trace {
    ($reason:expr, $local:expr, $remote:expr) => {
        if $crate::maps::tracing() {
            $crate::maps::trace_line($reason as u32, $local, $remote);
        }
    };
}
pub(crate) use trace;
