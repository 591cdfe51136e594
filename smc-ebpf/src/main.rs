//! eBPF side of the SMC accelerator.
//!
//! - `smc_sockops_{shortcut,ism}` (`sock_ops`, one per cgroup mode): writes the SMC experimental
//!   TCP option into the SYN / SYN-ACK of sockets that opted in, records whether the peer announced
//!   SMC, records established sockets so that same-host pairs are recognised, and puts sockets into
//!   the SOCKHASH for the `sk_msg` shortcut.
//! - `smc_sk_msg` (`sk_msg` on the SOCKHASH): redirects a message to the same-host peer socket when
//!   the sender is enabled for the shortcut and the peer is registered; passes it to TCP otherwise.
//! - `smc_setsockopt` / `smc_getsockopt` (cgroup sockopt): the unprivileged per-socket channel at
//!   the private level `SOL_SMC_BPF`.
#![no_std]
#![no_main]

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{
        bpf_map_type::BPF_MAP_TYPE_SK_STORAGE, bpf_sock, bpf_sock_ops, sk_action, BPF_F_INGRESS,
        BPF_F_NO_PREALLOC, BPF_SK_STORAGE_GET_F_CREATE, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_HDR_OPT_LEN_CB, BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB,
        BPF_SOCK_OPS_STATE_CB_FLAG, BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_SOCK_OPS_TCP_LISTEN_CB,
        BPF_SOCK_OPS_WRITE_HDR_OPT_CB, BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG,
    },
    helpers::generated::{
        bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_load_hdr_opt, bpf_map_delete_elem,
        bpf_reserve_hdr_opt, bpf_setsockopt, bpf_sk_storage_get, bpf_store_hdr_opt,
    },
    macros::{btf_map, cgroup_sockopt, map, sk_msg, sock_ops},
    maps::{LruHashMap, PerCpuArray, SockHash},
    programs::{SkMsgContext, SockOpsContext, SockoptContext},
};
use smc_common::bpf::{
    Counter, ListenerKey, PeerEntry, SockKey, SockState, MAX_LISTENERS, MAX_SOCKETS, SMC_SO_ENABLE,
    SMC_SO_SHORTCUT, SMC_SO_STATE, SMC_SO_TCP, SOCK_OPTED_IN, SOCK_OPT_SENT, SOCK_PEER_SMC,
    SOCK_SAME_HOST, SOCK_SHORTCUT, SOCK_SHORTCUT_GRANTED, SOCK_STATE_VERSION, SOCK_TCP,
    SOL_SMC_BPF, TCPOPT_SMC,
};

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const SOL_TCP: i32 = 6;
const TCP_SAVE_SYN: i32 = 27;
const TCP_CLOSE: u32 = 7;
const TCPHDR_SYN: u32 = 0x02;
const TCPHDR_ACK: u32 = 0x10;
const BPF_LOAD_HDR_OPT_TCP_SYN: u32 = 1;
const BPF_TCP_LISTEN: u32 = 10;

/// Socket storage (the BTF layout of aya-ebpf's `SkStorage`, with a `get` that creates on
/// demand). Not `BPF_F_CLONE`: a socket accepted from a listener that opted in gets storage at
/// ESTABLISHED only when it may become SMC-D (or later from its own setsockopt); cloning it for
/// every accepted socket cost a fallback or policy-kept connection an allocation and an RCU
/// free (the header-option callback flags, inherited by the kernel, carry the opt-in).
#[repr(C)]
pub struct SockStorage<T> {
    r#type: *const [i32; BPF_MAP_TYPE_SK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}
// SAFETY: placeholder pointers patched by the loader, never dereferenced.
unsafe impl<T> Sync for SockStorage<T> {}

impl<T> SockStorage<T> {
    pub const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            map_flags: ptr::null(),
        }
    }

    /// The storage of `sk`, created zeroed when `create`.
    #[inline(always)]
    fn get(&self, sk: *mut bpf_sock, create: bool) -> Option<&mut T> {
        if sk.is_null() {
            return None;
        }
        let flags = if create {
            BPF_SK_STORAGE_GET_F_CREATE as u64
        } else {
            0
        };
        let p = unsafe {
            bpf_sk_storage_get(
                ptr::from_ref(self).cast_mut().cast(),
                sk.cast(),
                ptr::null_mut(),
                flags,
            )
        };
        unsafe { p.cast::<T>().as_mut() }
    }
}

#[btf_map]
static SMC_SOCK_STATE: SockStorage<SockState> = SockStorage::new();

/// Established sockets of attached cgroups by 4-tuple. LRU: a socket whose cgroup was detached
/// before it closed is never removed by the STATE callback; eviction bounds such leftovers.
#[map]
static SMC_PEERS: LruHashMap<SockKey, PeerEntry> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);

/// Established sockets of ism-mode cgroups whose connection cannot become SMC-D
/// (`MAP_TCP_PEERS`): no state callback removes them, LRU eviction does.
#[map]
static SMC_TCP_PEERS: LruHashMap<SockKey, PeerEntry> = LruHashMap::with_max_entries(MAX_SOCKETS, 0);

/// The entry of `key` in either same-host map.
#[inline(always)]
fn peer_entry(key: &SockKey) -> Option<*mut PeerEntry> {
    SMC_PEERS
        .get_ptr_mut(key)
        .or_else(|| SMC_TCP_PEERS.get_ptr_mut(key))
}

/// Listeners that announce SMC (`MAP_LISTENERS`): a SYN-ACK carries the option only when its
/// listener's entry says so.
#[map]
static SMC_LISTENERS: LruHashMap<ListenerKey, u32> = LruHashMap::with_max_entries(MAX_LISTENERS, 0);

#[inline(always)]
fn set_listener(netns: u64, port: u32, on: bool) {
    let key = ListenerKey {
        netns,
        port,
        _pad: 0,
    };
    let _ = SMC_LISTENERS.insert(&key, &u32::from(on), 0);
}

/// Whether the listener of the request socket `ops` still announces SMC.
#[inline(always)]
fn listener_announces(ops: *mut bpf_sock_ops) -> bool {
    // SAFETY: `ops` is the program's context; the helper accepts it as is.
    let netns = unsafe { bpf_get_netns_cookie(ops.cast()) };
    let key = ListenerKey {
        netns,
        port: unsafe { (*ops).local_port },
        _pad: 0,
    };
    // SAFETY: a plain map lookup; the value is read once.
    unsafe { SMC_LISTENERS.get(&key) }.is_some_and(|v| *v != 0)
}

#[map]
static SMC_SOCKHASH: SockHash<SockKey> = SockHash::with_max_entries(MAX_SOCKETS, 0);

#[map]
static SMC_COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[inline(always)]
fn count(c: Counter, n: u64) {
    if let Some(p) = SMC_COUNTERS.get_ptr_mut(c as u32) {
        unsafe { *p += n };
    }
}

/// IPv4 address (as loaded from the context, i.e. network byte order in memory) as v4-mapped IPv6.
#[inline(always)]
fn v4_mapped(ip4: u32) -> [u32; 4] {
    [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), ip4]
}

/// `remote_port` of sock_ops / sk_msg contexts holds the big-endian port, shifted into the upper
/// half on some kernels: normalise to host byte order.
#[inline(always)]
fn remote_port_host(raw: u32) -> u32 {
    let be = if raw > 0xffff { raw >> 16 } else { raw };
    u16::from_be(be as u16) as u32
}

#[inline(always)]
fn key_of(
    family: u32,
    l4: u32,
    r4: u32,
    l6: [u32; 4],
    r6: [u32; 4],
    lport: u32,
    rport: u32,
) -> Option<SockKey> {
    let (local_ip, remote_ip) = match family {
        AF_INET => (v4_mapped(l4), v4_mapped(r4)),
        AF_INET6 => (l6, r6),
        _ => return None,
    };
    Some(SockKey {
        local_ip,
        remote_ip,
        local_port: lport,
        remote_port: remote_port_host(rport),
    })
}

/// Reads a context field with one load at a constant offset from the context pointer (the
/// verifier rejects loads through a context pointer the compiler has moved).
macro_rules! ctx_read {
    ($ptr:expr, $($field:tt)+) => {
        unsafe { ptr::read_volatile(ptr::addr_of!((*$ptr).$($field)+)) }
    };
}

macro_rules! ctx_key {
    ($p:expr) => {
        key_of(
            ctx_read!($p, family),
            ctx_read!($p, local_ip4),
            ctx_read!($p, remote_ip4),
            [
                ctx_read!($p, local_ip6[0]),
                ctx_read!($p, local_ip6[1]),
                ctx_read!($p, local_ip6[2]),
                ctx_read!($p, local_ip6[3]),
            ],
            [
                ctx_read!($p, remote_ip6[0]),
                ctx_read!($p, remote_ip6[1]),
                ctx_read!($p, remote_ip6[2]),
                ctx_read!($p, remote_ip6[3]),
            ],
            ctx_read!($p, local_port),
            ctx_read!($p, remote_port),
        )
    };
}

#[inline(always)]
fn ops_key(ops: *const bpf_sock_ops) -> Option<SockKey> {
    ctx_key!(ops)
}

/// Key of a full socket (`struct bpf_sock`: `src_*` local, `dst_*` remote).
#[inline(always)]
fn sock_key(sk: *const bpf_sock) -> Option<SockKey> {
    key_of(
        ctx_read!(sk, family),
        ctx_read!(sk, src_ip4),
        ctx_read!(sk, dst_ip4),
        [
            ctx_read!(sk, src_ip6[0]),
            ctx_read!(sk, src_ip6[1]),
            ctx_read!(sk, src_ip6[2]),
            ctx_read!(sk, src_ip6[3]),
        ],
        [
            ctx_read!(sk, dst_ip6[0]),
            ctx_read!(sk, dst_ip6[1]),
            ctx_read!(sk, dst_ip6[2]),
            ctx_read!(sk, dst_ip6[3]),
        ],
        ctx_read!(sk, src_port),
        ctx_read!(sk, dst_port) as u32,
    )
}

#[inline(always)]
fn ops_sk(ops: &bpf_sock_ops) -> *mut bpf_sock {
    unsafe { ops.__bindgen_anon_2.sk }
}

/// Looks for the SMC option in the current packet, or in the (saved) SYN with `from_syn`.
#[inline(always)]
fn has_smc_option(ops: *mut bpf_sock_ops, from_syn: bool) -> bool {
    let mut buf = TCPOPT_SMC;
    let flags = if from_syn {
        BPF_LOAD_HDR_OPT_TCP_SYN as u64
    } else {
        0
    };
    let ret = unsafe { bpf_load_hdr_opt(ops, buf.as_mut_ptr().cast(), buf.len() as u32, flags) };
    ret == TCPOPT_SMC.len() as i64 && buf == TCPOPT_SMC
}

#[sock_ops]
pub fn smc_sockops_shortcut(ctx: SockOpsContext) -> u32 {
    sockops(&ctx, true);
    1
}

#[sock_ops]
pub fn smc_sockops_ism(ctx: SockOpsContext) -> u32 {
    sockops(&ctx, false);
    1
}

#[inline(always)]
fn sockops(ctx: &SockOpsContext, shortcut_mode: bool) {
    let ops_ptr = ctx.ops;
    let ops = unsafe { &*ops_ptr };
    match ops.op {
        BPF_SOCK_OPS_TCP_CONNECT_CB | BPF_SOCK_OPS_TCP_LISTEN_CB => {
            let opted = SMC_SOCK_STATE
                .get(ops_sk(ops), false)
                .is_some_and(|s| s.flags & SOCK_OPTED_IN != 0);
            if !opted {
                return;
            }
            if ops.op == BPF_SOCK_OPS_TCP_LISTEN_CB {
                // SAFETY: the program's context, accepted by the helper as is.
                let netns = unsafe { bpf_get_netns_cookie(ops_ptr.cast()) };
                set_listener(netns, ops.local_port, true);
                // Keep the SYN, so that PASSIVE_ESTABLISHED can read the peer's option from it.
                let mut one: i32 = 1;
                unsafe {
                    bpf_setsockopt(
                        ops_ptr.cast::<c_void>(),
                        SOL_TCP,
                        TCP_SAVE_SYN,
                        ptr::from_mut(&mut one).cast(),
                        4,
                    )
                };
            }
            let _ = ctx.set_cb_flags(
                (ops.bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) as i32,
            );
        }
        BPF_SOCK_OPS_HDR_OPT_LEN_CB | BPF_SOCK_OPS_WRITE_HDR_OPT_CB => {
            let syn = ops.skb_tcp_flags & TCPHDR_SYN != 0;
            if !syn {
                // An established socket that may become SMC-D (ism mode): waiting for its
                // data path to decide.
                settle(ctx, ops);
                return;
            }
            let synack = ops.skb_tcp_flags & TCPHDR_ACK != 0;
            // A SYN-ACK carries the option only when the peer's SYN did and its listener still
            // announces (it withdraws before an exec that may not run the data path).
            if synack && (!has_smc_option(ops_ptr, true) || !listener_announces(ops_ptr)) {
                return;
            }
            if ops.op == BPF_SOCK_OPS_HDR_OPT_LEN_CB {
                unsafe { bpf_reserve_hdr_opt(ops_ptr, TCPOPT_SMC.len() as u32, 0) };
            } else {
                let opt = TCPOPT_SMC;
                let ret =
                    unsafe { bpf_store_hdr_opt(ops_ptr, opt.as_ptr().cast(), opt.len() as u32, 0) };
                if ret == 0 {
                    count(
                        if synack {
                            Counter::SynAckOptSent
                        } else {
                            Counter::SynOptSent
                        },
                        1,
                    );
                }
            }
        }
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB | BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => {
            established(ctx, ops, shortcut_mode);
        }
        BPF_SOCK_OPS_STATE_CB => {
            let new_state = ctx.arg(1);
            if new_state == TCP_CLOSE {
                if let Some(key) = ops_key(ops_ptr) {
                    // A socket also "closes" when it enters TIME_WAIT, possibly before its owner
                    // asked for its state: keep what the peer's ESTABLISHED told the entry.
                    let same_host = unsafe { SMC_PEERS.get(&key) }
                        .is_some_and(|e| e.flags & SOCK_SAME_HOST != 0);
                    if same_host {
                        if let Some(state) = SMC_SOCK_STATE.get(ops_sk(ops), false) {
                            state.flags |= SOCK_SAME_HOST;
                        }
                    }
                    let _ = SMC_PEERS.remove(&key);
                }
                count(Counter::SocketsClosed, 1);
            }
        }
        _ => {}
    }
}

#[inline(always)]
fn established(ctx: &SockOpsContext, ops: &bpf_sock_ops, shortcut_mode: bool) {
    let ops_ptr = ctx.ops;
    let active = ops.op == BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB;
    count(Counter::SocketsEstablished, 1);
    count(
        if active {
            Counter::ActiveEstablished
        } else {
            Counter::PassiveEstablished
        },
        1,
    );
    // The header-option flag is set only on sockets (and listeners) that opted in.
    let wrote_opt = ops.bpf_sock_ops_cb_flags & BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG != 0;
    let mut flags = 0u32;
    let mut both_announced = false;
    if wrote_opt {
        flags |= SOCK_OPTED_IN;
        // Active: our SYN carried the option, the SYN-ACK being processed says if the peer's
        // did. Passive: the saved SYN; our SYN-ACK carried the option only if the SYN did.
        let peer = has_smc_option(ops_ptr, !active);
        if active || peer {
            flags |= SOCK_OPT_SENT;
        }
        if peer {
            both_announced = true;
            flags |= SOCK_PEER_SMC;
            count(
                if active {
                    Counter::SynAckOptReceived
                } else {
                    Counter::SynOptReceived
                },
                1,
            );
        }
    }
    // Watch for the close of the sockets the data path or the shortcut may use (those of an
    // ism-mode cgroup whose connection cannot become SMC-D go to SMC_TCP_PEERS, unwatched).
    // No more header-option callbacks, except for a socket that goes into the SOCKHASH in ism
    // mode: its outgoing segments tell when the data path has decided (see `settle`).
    let tracked = shortcut_mode || both_announced;
    let keep_hdr = both_announced && !shortcut_mode;
    let hdr = if keep_hdr {
        BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG
    } else {
        0
    };
    let state_cb = if tracked {
        BPF_SOCK_OPS_STATE_CB_FLAG
    } else {
        0
    };
    let cb = (ops.bpf_sock_ops_cb_flags & !BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) | hdr | state_cb;
    if cb != ops.bpf_sock_ops_cb_flags {
        let _ = ctx.set_cb_flags(cb as i32);
    }

    let Some(mut key) = ops_key(ops_ptr) else {
        return;
    };
    let cookie = unsafe { bpf_get_socket_cookie(ops_ptr.cast()) };
    let mirror = key.mirror();
    if let Some(peer) = peer_entry(&mirror) {
        flags |= SOCK_SAME_HOST;
        count(Counter::SameHostPairs, 1);
        // Tell the end that was established first (it learns it in getsockopt).
        unsafe { (*peer).flags |= SOCK_SAME_HOST };
    }
    if shortcut_mode {
        flags |= SOCK_SHORTCUT;
    }
    let entry = PeerEntry {
        cookie,
        flags,
        _pad: 0,
    };
    let _ = if tracked {
        SMC_PEERS.insert(&key, &entry, 0)
    } else {
        SMC_TCP_PEERS.insert(&key, &entry, 0)
    };

    // Socket storage exists already for an active socket that opted in (created by its
    // setsockopt); an accepted one gets it here when it may become SMC-D. The others of an
    // ism-mode cgroup get none: creating and freeing it is most of what these programs cost a
    // short connection (nginx + wrk `Connection: close`: 0.89× plain TCP with it, 0.97×
    // without); `SMC_SO_STATE` answers for them from their same-host entry.
    if let Some(state) = SMC_SOCK_STATE.get(ops_sk(ops), tracked) {
        state.version = SOCK_STATE_VERSION;
        state.flags |= flags;
    }
    // In shortcut mode every socket goes into the SOCKHASH; in ism mode only those that may
    // become SMC-D (both ends announced SMC), which enable the redirect for themselves after
    // their CLC handshake. A socket in a sockmap reads and writes through tcp_bpf, which is not
    // quite plain TCP (a blocking read can return EAGAIN, or 0 before the last bytes, when
    // data and FIN arrive while it starts): a connection that stays TCP must not be there.
    if shortcut_mode || both_announced {
        if SMC_SOCKHASH
            .update(&mut key, unsafe { &mut *ops_ptr }, 0)
            .is_ok()
        {
            count(Counter::ShortcutSockets, 1);
        }
    }
}

/// An ism-mode socket in the SOCKHASH whose data path has decided: SMC-D (the shortcut carries
/// its doorbells) keeps it; TCP ([`SMC_SO_TCP`]) takes it out, so that it reads and writes as
/// plain TCP (tcp_bpf differs at the edges). Either way no more header-option callbacks.
#[inline(always)]
fn settle(ctx: &SockOpsContext, ops: &bpf_sock_ops) {
    let Some(state) = SMC_SOCK_STATE.get(ops_sk(ops), false) else {
        return;
    };
    let flags = state.flags;
    if flags & (SOCK_TCP | SOCK_SHORTCUT) == 0 {
        return;
    }
    if flags & SOCK_SHORTCUT == 0 {
        if let Some(key) = ops_key(ctx.ops) {
            // SAFETY: the map definition is what the helper takes; the key lives here.
            let ret = unsafe {
                bpf_map_delete_elem(
                    ptr::from_ref(&SMC_SOCKHASH).cast_mut().cast(),
                    ptr::from_ref(&key).cast(),
                )
            };
            if ret == 0 {
                count(Counter::ShortcutSocketsLeft, 1);
            }
        }
    }
    let _ =
        ctx.set_cb_flags((ops.bpf_sock_ops_cb_flags & !BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) as i32);
}

#[sk_msg]
pub fn smc_sk_msg(ctx: SkMsgContext) -> u32 {
    let md = unsafe { &*ctx.msg };
    let sk = unsafe { md.__bindgen_anon_3.sk };
    let state = SMC_SOCK_STATE.get(sk, false);
    let Some(state) = state.filter(|s| s.flags & SOCK_SHORTCUT != 0) else {
        count(Counter::MsgPassNotEnabled, 1);
        return sk_action::SK_PASS;
    };
    let Some(key) = ctx_key!(ctx.msg) else {
        count(Counter::MsgPassNoPeer, 1);
        return sk_action::SK_PASS;
    };
    let mut peer = key.mirror();
    // The peer must be a registered socket of this host: otherwise (other host, peer outside an
    // attached cgroup) the message goes to TCP untouched. Redirecting to a missing key would drop
    // it (EACCES for the sender).
    if unsafe { SMC_PEERS.get(&peer) }.is_none() {
        count(Counter::MsgPassNoPeer, 1);
        return sk_action::SK_PASS;
    }
    let size = md.size as u64;
    let ret = SMC_SOCKHASH.redirect_msg(&ctx, &mut peer, BPF_F_INGRESS as u64);
    if ret as u32 == sk_action::SK_PASS {
        count(Counter::MsgRedirected, 1);
        count(Counter::BytesRedirected, size);
        state.redirected_msgs += 1;
        state.redirected_bytes += size;
        sk_action::SK_PASS
    } else {
        // Not in the SOCKHASH (e.g. ism-mode peer that did not opt in): plain TCP.
        count(Counter::MsgPassRedirectFailed, 1);
        sk_action::SK_PASS
    }
}

#[cgroup_sockopt(setsockopt)]
pub fn smc_setsockopt(ctx: SockoptContext) -> i32 {
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_SMC_BPF {
        return 1;
    }
    let optval = unsafe { so.__bindgen_anon_2.optval } as *const u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    if unsafe { optval.add(4) } > end {
        return 0; // EPERM: malformed
    }
    let on = unsafe { ptr::read_unaligned(optval.cast::<u32>()) } != 0;
    let sk = unsafe { so.__bindgen_anon_1.sk };
    let Some(state) = SMC_SOCK_STATE.get(sk, true) else {
        return 0;
    };
    state.version = SOCK_STATE_VERSION;
    let bit = match so.optname {
        SMC_SO_ENABLE => {
            count(Counter::OptIn, 1);
            SOCK_OPTED_IN
        }
        SMC_SO_SHORTCUT => {
            // A redirected message lands in the peer's receive queue without its receive-buffer
            // bound: only a socket the daemon granted (the exact peer of a registered DMB's
            // socket, checked by root at the attach) may switch it on, and not once its
            // connection stays TCP; in a shortcut-mode cgroup it is on already (a no-op).
            let f = state.flags;
            if on && f & SOCK_SHORTCUT == 0 && (f & SOCK_SHORTCUT_GRANTED == 0 || f & SOCK_TCP != 0)
            {
                return 0; // EPERM
            }
            SOCK_SHORTCUT
        }
        SMC_SO_TCP => SOCK_TCP,
        _ => return 0,
    };
    if on {
        state.flags |= bit;
        if bit == SOCK_TCP {
            state.flags &= !SOCK_SHORTCUT_GRANTED;
        }
    } else {
        state.flags &= !bit;
    }
    // SAFETY: `sk` is the sockopt context's full socket (checked non-null by the storage get).
    if bit == SOCK_OPTED_IN && unsafe { (*sk).state } == BPF_TCP_LISTEN {
        // SAFETY: the program's context, accepted by the helper as is.
        let netns = unsafe { bpf_get_netns_cookie(ctx.sockopt.cast()) };
        set_listener(netns, unsafe { (*sk).src_port }, on);
    }
    // Handled here: the kernel must not see this private level.
    so.optlen = -1;
    1
}

#[cgroup_sockopt(getsockopt)]
pub fn smc_getsockopt(ctx: SockoptContext) -> i32 {
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_SMC_BPF || so.optname != SMC_SO_STATE {
        return 1;
    }
    count(Counter::StateQueries, 1);
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *mut u8;
    // A caller may ask for the whole struct or only its first 8 bytes (flags, version).
    let full = unsafe { optval.add(core::mem::size_of::<SockState>()) } <= end;
    if !full && unsafe { optval.add(8) } > end {
        return 0;
    }
    let sk = unsafe { so.__bindgen_anon_1.sk };
    let state = match SMC_SOCK_STATE.get(sk, false) {
        Some(s) => {
            // The active end is established before its peer: learn "same host" late.
            if s.flags & SOCK_SAME_HOST == 0 && !sk.is_null() {
                if let Some(key) = sock_key(sk) {
                    let own = peer_entry(&key)
                        .is_some_and(|e| unsafe { (*e).flags } & SOCK_SAME_HOST != 0);
                    if own || peer_entry(&key.mirror()).is_some() {
                        s.flags |= SOCK_SAME_HOST;
                    }
                }
            }
            *s
        }
        None => {
            // No storage (never opted in, ism mode): what its ESTABLISHED recorded.
            let mut st = SockState {
                version: SOCK_STATE_VERSION,
                ..SockState::default()
            };
            if !sk.is_null() {
                if let Some(key) = sock_key(sk) {
                    if let Some(e) = peer_entry(&key) {
                        st.flags = unsafe { (*e).flags };
                    }
                    if st.flags & SOCK_SAME_HOST == 0 && peer_entry(&key.mirror()).is_some() {
                        st.flags |= SOCK_SAME_HOST;
                    }
                }
            }
            st
        }
    };
    let size = if full {
        unsafe { ptr::write_unaligned(optval.cast::<SockState>(), state) };
        core::mem::size_of::<SockState>()
    } else {
        unsafe { ptr::write_unaligned(optval.cast::<[u32; 2]>(), [state.flags, state.version]) };
        8
    };
    // Two separate 4-byte stores: a merged 8-byte store is rejected by the verifier.
    unsafe { ptr::write_volatile(&mut so.optlen, size as i32) };
    unsafe { ptr::write_volatile(&mut so.retval, 0) };
    1
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
