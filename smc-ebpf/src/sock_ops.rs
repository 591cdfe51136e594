//! The `sock_ops` programs (one per cgroup mode): the SMC experimental TCP option in SYN /
//! SYN-ACK, same-host pairs at ESTABLISHED, SOCKHASH membership, and the close of tracked sockets.
use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{
        bpf_sock, bpf_sock_ops, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB, BPF_SOCK_OPS_HDR_OPT_LEN_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_SOCK_OPS_TCP_CONNECT_CB, BPF_SOCK_OPS_TCP_LISTEN_CB, BPF_SOCK_OPS_WRITE_HDR_OPT_CB,
        BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG,
    },
    helpers::generated::{
        bpf_get_socket_cookie, bpf_load_hdr_opt, bpf_map_delete_elem, bpf_reserve_hdr_opt,
        bpf_setsockopt, bpf_store_hdr_opt,
    },
    macros::sock_ops,
    programs::SockOpsContext,
};
use smc_common::bpf::{
    Counter, PairEntry, PairKey, PeerEntry, SockKey, TraceReason, LISTENERS_ANNOUNCING,
    LISTENERS_WITHDRAWN, SOCK_LISTEN_COUNTED, SOCK_OPTED_IN, SOCK_OPT_SENT, SOCK_PASSIVE,
    SOCK_PEER_SMC, SOCK_SAME_HOST, SOCK_SHORTCUT, SOCK_STATE_VERSION, SOCK_TCP, TCPOPT_SMC,
};

use crate::{
    key::{ctx_read, ops_key, remote_port_host},
    maps::{
        count, count_listener, listener_announces, no_tcp_records, peer_entry, tcp_peer_entry,
        trace, SMC_PAIRS, SMC_PEERS, SMC_SOCKHASH, SMC_SOCK_STATE, SMC_TCP_PEERS,
    },
    quarantine::quarantine_established,
};

const SOL_TCP: i32 = 6;
const TCP_SAVE_SYN: i32 = 27;
const TCP_CLOSE: u32 = 7;
const TCP_LISTEN: u32 = 10;
const TCPHDR_SYN: u32 = 0x02;
const TCPHDR_ACK: u32 = 0x10;
const BPF_LOAD_HDR_OPT_TCP_SYN: u32 = 1;
/// `args[0]` of the header-option callbacks: the SYN-ACK carries a SYN cookie
/// (`include/uapi/linux/bpf.h`).
const BPF_WRITE_HDR_TCP_SYNACK_COOKIE: u32 = 2;

#[inline(always)]
fn ops_sk(ops: &bpf_sock_ops) -> *mut bpf_sock {
    // SAFETY: the union holds the `sk` pointer (its other member pads it to 8 bytes); the
    // verifier types it `PTR_TO_SOCKET_OR_NULL`, and every user checks it for null.
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
    // SAFETY: `ops` is the program's context (the helper's first argument must be); `buf` is a
    // writable stack buffer of `buf.len()` bytes, into which the helper copies at most that many
    // bytes of the option whose kind and magic `buf` holds.
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
    // SAFETY: the program's context, non-null and valid for this run; the verifier checks every
    // field load made through it (the writable fields are only written through helpers).
    let ops = unsafe { &*ops_ptr };
    match ops.op {
        BPF_SOCK_OPS_TCP_CONNECT_CB | BPF_SOCK_OPS_TCP_LISTEN_CB => {
            let opted = SMC_SOCK_STATE
                .get(ops_sk(ops), false)
                .is_some_and(|s| s.flags & SOCK_OPTED_IN != 0);
            let listen = ops.op == BPF_SOCK_OPS_TCP_LISTEN_CB;
            if !opted {
                if listen {
                    trace!(TraceReason::ListenNotOptedIn, ops.local_port, 0);
                } else {
                    trace!(
                        TraceReason::ConnectNotOptedIn,
                        ops.local_port,
                        remote_port_host(ops.remote_port)
                    );
                }
                return;
            }
            let mut state_cb = 0;
            if listen {
                trace!(TraceReason::ListenAnnounces, ops.local_port, 0);
                // Counted as announcing (a listener that opted in), once: uncounted at its
                // close, which the state callback reports.
                if let Some(st) = SMC_SOCK_STATE.get(ops_sk(ops), false) {
                    if st.flags & SOCK_LISTEN_COUNTED == 0 {
                        if let Some(k) = ops_key(ops_ptr) {
                            st.flags |= SOCK_LISTEN_COUNTED;
                            count_listener(
                                k.netns,
                                k.local_ip,
                                ops.local_port,
                                LISTENERS_ANNOUNCING,
                            );
                            state_cb = BPF_SOCK_OPS_STATE_CB_FLAG;
                        }
                    }
                }
                // Keep the SYN, so that PASSIVE_ESTABLISHED can read the peer's option from it.
                let mut one: i32 = 1;
                // SAFETY: `ops_ptr` is the context (`bpf_setsockopt` is allowed in sock_ops on a
                // full socket; a listener is one); `optval` points to 4 bytes on the stack.
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
            if !listen {
                trace!(
                    TraceReason::ConnectAnnounces,
                    ops.local_port,
                    remote_port_host(ops.remote_port)
                );
            }
            let _ = ctx.set_cb_flags(
                (ops.bpf_sock_ops_cb_flags | BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG | state_cb) as i32,
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
            if synack {
                // Said once per SYN-ACK: at the length callback, not again at the write.
                let len_cb = ops.op == BPF_SOCK_OPS_HDR_OPT_LEN_CB;
                if !has_smc_option(ops_ptr, true) {
                    if len_cb {
                        trace!(
                            TraceReason::SynAckPeerSynWithout,
                            ops.local_port,
                            remote_port_host(ops.remote_port)
                        );
                    }
                    return;
                }
                if ctx.arg(0) == BPF_WRITE_HDR_TCP_SYNACK_COOKIE {
                    // A SYN cookie: the server keeps nothing of this SYN (no request socket,
                    // no saved SYN), so its accepted socket could not tell that both ends
                    // announced, and would hand the client's CLC Proposal to the application
                    // as data. As Linux (`cookie_tcp_reqsk_alloc`: `smc_ok` 0), no option.
                    if len_cb {
                        trace!(
                            TraceReason::SynAckCookie,
                            ops.local_port,
                            remote_port_host(ops.remote_port)
                        );
                    }
                    return;
                }
                if !listener_announces(ops_ptr) {
                    if len_cb {
                        trace!(
                            TraceReason::SynAckListenerWithdrew,
                            ops.local_port,
                            remote_port_host(ops.remote_port)
                        );
                    }
                    return;
                }
            }
            if ops.op == BPF_SOCK_OPS_HDR_OPT_LEN_CB {
                // SAFETY: the context; reserving option space is what HDR_OPT_LEN_CB is for
                // (elsewhere the helper returns an error, it never writes memory).
                unsafe { bpf_reserve_hdr_opt(ops_ptr, TCPOPT_SMC.len() as u32, 0) };
            } else {
                let opt = TCPOPT_SMC;
                // SAFETY: the context; `opt` is `opt.len()` readable bytes on the stack that the
                // helper copies into the space reserved at HDR_OPT_LEN_CB (or fails: -ENOSPC).
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
            if ctx.arg(0) == TCP_LISTEN {
                // A counted listener leaves the listening state (its close; `shutdown`): its
                // key no longer counts it (a closed listener's entry announced for a later
                // withdrawn listener of the port before: red team round 30).
                if let Some(st) = SMC_SOCK_STATE.get(ops_sk(ops), false) {
                    if st.flags & SOCK_LISTEN_COUNTED != 0 {
                        st.flags &= !SOCK_LISTEN_COUNTED;
                        if let Some(k) = ops_key(ops_ptr) {
                            let one = if st.flags & SOCK_OPTED_IN != 0 {
                                LISTENERS_ANNOUNCING
                            } else {
                                LISTENERS_WITHDRAWN
                            };
                            count_listener(k.netns, k.local_ip, ops.local_port, one.wrapping_neg());
                        }
                    }
                }
                let _ = ctx
                    .set_cb_flags((ops.bpf_sock_ops_cb_flags & !BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
                return;
            }
            if new_state == TCP_CLOSE {
                if let Some(key) = ops_key(ops_ptr) {
                    // A socket also "closes" when it enters TIME_WAIT, possibly before its owner
                    // asked for its state: keep what the peer's ESTABLISHED told the entry.
                    // SAFETY: the looked-up value stays allocated for this run (RCU); one field
                    // is read by value.
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
    let mut withdrawn_late = false;
    if wrote_opt {
        flags |= SOCK_OPTED_IN;
        // Active: our SYN carried the option, the SYN-ACK being processed says if the peer's
        // did. Passive: the saved SYN; our SYN-ACK carried the option only if the SYN did and
        // the listener still announces (one that withdrew, before an exec into an image
        // without the library, sent none: its client falls back and sends no Proposal, and an
        // accept of ours that waited for one declined it into the client's stream; red team
        // rt14 `rt14_listen.py pass`, 5 of 5). A withdrawal between the SYN-ACK and this
        // callback (one round trip) is taken for a SYN-ACK without the option.
        let syn_opt = has_smc_option(ops_ptr, !active);
        let peer = syn_opt && (active || listener_announces(ops_ptr));
        if active || peer {
            flags |= SOCK_OPT_SENT;
        }
        // Withdrawn between our SYN-ACK and now: if that SYN-ACK announced SMC (its client's
        // entry says it saw the option), the client's Proposal is on its way (below).
        withdrawn_late = !active && syn_opt && !peer;
        if peer {
            both_announced = true;
            flags |= SOCK_PEER_SMC;
            if !active {
                flags |= SOCK_PASSIVE;
            }
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
    // Neither flag is inherited: a listener that opted in has both (the state callback reports
    // its close), an accepted socket gets what it needs here.
    let inherited = BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG;
    let cb = (ops.bpf_sock_ops_cb_flags & !inherited) | hdr | state_cb;
    if cb != ops.bpf_sock_ops_cb_flags {
        let _ = ctx.set_cb_flags(cb as i32);
    }

    let Some(mut key) = ops_key(ops_ptr) else {
        return;
    };
    // `--tcp-records off`: a connection that cannot become SMC-D neither looks for its peer's
    // record nor leaves one (two lookups and a store in 262 144-entry maps, most of what these
    // programs cost it); only `conns` and the `same_host_pairs` count read them.
    let quarantine = withdrawn_late && client_announced(&key, ops_ptr);
    // A quarantined socket leaves its record too: its client looks its cookie up
    // (`SMC_SO_PEER_QUARANTINED`).
    let record = tracked || quarantine || !no_tcp_records();
    if record {
        record_established(&key, ops_ptr, tracked, shortcut_mode, &mut flags);
    }
    trace_established(&key, wrote_opt, both_announced, flags);

    // Socket storage exists already for an active socket that opted in (created by its
    // setsockopt); an accepted one gets it here when it may become SMC-D. The others of an
    // ism-mode cgroup get none: creating and freeing it is most of what these programs cost a
    // short connection (nginx + wrk `Connection: close`: 0.89× plain TCP with it, 0.97×
    // without); `SMC_SO_STATE` answers for them from their same-host entry.
    let state = SMC_SOCK_STATE.get(ops_sk(ops), tracked || quarantine);
    if quarantine {
        trace!(
            TraceReason::EstablishedQuarantined,
            key.local_port,
            key.remote_port
        );
        quarantine_established(ops_ptr, state, flags, &key);
    } else if let Some(state) = state {
        state.version = SOCK_STATE_VERSION;
        state.flags |= flags;
        if flags & SOCK_PASSIVE != 0 {
            state.local_ip = key.local_ip;
            state.local_port = key.local_port;
        }
    }
    // In shortcut mode every socket goes into the SOCKHASH; in ism mode only those that may
    // become SMC-D (both ends announced SMC), which enable the redirect for themselves after
    // their CLC handshake. A socket in a sockmap reads and writes through tcp_bpf, which is not
    // quite plain TCP (a blocking read can return EAGAIN, or 0 before the last bytes, when
    // data and FIN arrive while it starts): a connection that stays TCP must not be there.
    if (shortcut_mode || both_announced)
        && SMC_SOCKHASH
            // SAFETY: the context, valid for this run; `bpf_sock_hash_update` takes it as is.
            .update(&mut key, unsafe { &mut *ops_ptr }, 0)
            .is_ok()
    {
        count(Counter::ShortcutSockets, 1);
    }
}

/// This connection as [`SMC_PAIRS`] keys it from this end: 4-tuple without namespace, first
/// sequence numbers of each direction (`snd_una` and `rcv_nxt` at ESTABLISHED: the two initial
/// sequence numbers plus one; data in a SYN, TCP Fast Open, shifts one of them and such a
/// connection between two namespaces is not paired).
#[inline(always)]
fn pair_key(key: &SockKey, ops_ptr: *mut bpf_sock_ops) -> PairKey {
    PairKey {
        tuple: key.in_netns(0),
        local_seq: ctx_read!(ops_ptr, snd_una),
        remote_seq: ctx_read!(ops_ptr, rcv_nxt),
    }
}

/// The peer of a connection between two network namespaces, as its end established first
/// recorded itself in [`SMC_PAIRS`] (under its view of the same tuple and sequence numbers):
/// `(namespace, cookie)`. A process of another namespace that rebuilds the tuple does not know
/// the two sequence numbers, so it is never found here for someone else's connection.
#[inline(always)]
fn paired_peer(key: &SockKey, ops_ptr: *mut bpf_sock_ops) -> Option<(u64, u64)> {
    if key.is_loopback() {
        return None;
    }
    // SAFETY: the value of a hash map lookup stays allocated for this run (RCU); read by value.
    let p = unsafe { SMC_PAIRS.get(&pair_key(key, ops_ptr).peer()) }?;
    let (netns, cookie) = (p.netns, p.cookie);
    (netns != key.netns).then_some((netns, cookie))
}

/// Whether the client of this passive socket announced SMC (its same-host entry says the
/// SYN-ACK it saw carried the option): the mirrored entry of this namespace, or the one the
/// pairing finds in another.
#[inline(always)]
fn client_announced(key: &SockKey, ops_ptr: *mut bpf_sock_ops) -> bool {
    let peer = match paired_peer(key, ops_ptr) {
        Some((netns, _)) => key.mirror().in_netns(netns),
        None => key.mirror(),
    };
    // SAFETY: the value of a hash map lookup stays allocated for this run (RCU); one field is
    // read by value.
    unsafe { SMC_PEERS.get(&peer) }.is_some_and(|e| e.flags & SOCK_PEER_SMC != 0)
}

/// The same-host records of an established socket: `SAME_HOST` from its peer's entry (and into
/// it), then its own entry, in `SMC_PEERS` when `tracked`, else in `SMC_TCP_PEERS`. The peer is
/// the mirrored key in this socket's network namespace; else, for addresses that are not
/// loopback ones, the end of a connection between two namespaces that [`SMC_PAIRS`] pairs with
/// this one by sequence numbers: each end's entry then records the other's namespace
/// (`peer_netns`), and this socket records itself there for a peer established later.
#[inline(always)]
fn record_established(
    key: &SockKey,
    ops_ptr: *mut bpf_sock_ops,
    tracked: bool,
    shortcut_mode: bool,
    flags: &mut u32,
) {
    // SAFETY: the context, which the sock_ops variant of the helper takes as is.
    let cookie = unsafe { bpf_get_socket_cookie(ops_ptr.cast()) };
    let find = |k: &SockKey| {
        if tracked {
            peer_entry(k)
        } else {
            tcp_peer_entry(k)
        }
    };
    let mut peer = find(&key.mirror());
    let mut peer_netns = 0;
    if peer.is_none() && !key.is_loopback() {
        if let Some((netns, c)) = paired_peer(key, ops_ptr) {
            // SAFETY: a non-null hash map value, allocated for this run (RCU); one field read
            // by value.
            peer = find(&key.mirror().in_netns(netns)).filter(|e| unsafe { (**e).cookie } == c);
            if let Some(e) = peer {
                peer_netns = netns;
                // SAFETY: as above; the earlier end's entry learns where its peer is (a
                // concurrent replacement of that entry, its socket closed, loses it).
                unsafe { (*e).peer_netns = key.netns };
            }
        }
        let own = PairEntry {
            netns: key.netns,
            cookie,
        };
        let _ = SMC_PAIRS.insert(&pair_key(key, ops_ptr), &own, 0);
    }
    if let Some(peer) = peer {
        *flags |= SOCK_SAME_HOST;
        count(Counter::SameHostPairs, 1);
        // Tell the end that was established first (it learns it in getsockopt).
        // SAFETY: `peer` is a non-null hash map value, allocated for this run (RCU). The update
        // is not atomic: a concurrent replacement of the entry may lose the bit, which
        // getsockopt derives again from the mirrored entry.
        unsafe { (*peer).flags |= SOCK_SAME_HOST };
    }
    if shortcut_mode {
        *flags |= SOCK_SHORTCUT;
    }
    let entry = PeerEntry {
        cookie,
        flags: *flags,
        _pad: 0,
        peer_netns,
    };
    if tracked {
        let _ = SMC_PEERS.insert(key, &entry, 0);
    } else if let Some(old) = SMC_TCP_PEERS.get_ptr_mut(key) {
        // The 4-tuple of an earlier socket (never removed: no close callback), which short
        // connections from one client to one server reuse as soon as the ephemeral ports wrap:
        // overwritten in place. An insert would take a fresh element from the LRU (evicting
        // when the map is full, as it always is on a busy host) and free the old one: that was
        // more than half of this program's time on such a connection.
        // SAFETY: a non-null hash map value of `PeerEntry`'s size, allocated for this run (RCU);
        // the key's socket is this one, the only writer besides its peer's later same-host bit.
        unsafe { *old = entry };
    } else {
        let _ = SMC_TCP_PEERS.insert(key, &entry, 0);
    }
}

/// The decision line of an established socket for `smc-ctl trace`.
#[inline(always)]
fn trace_established(key: &SockKey, wrote_opt: bool, both_announced: bool, flags: u32) {
    if !wrote_opt {
        trace!(
            TraceReason::EstablishedNotOptedIn,
            key.local_port,
            key.remote_port
        );
    } else if !both_announced {
        trace!(
            TraceReason::EstablishedPeerDidNotAnnounce,
            key.local_port,
            key.remote_port
        );
    } else {
        trace!(
            if flags & SOCK_SAME_HOST != 0 {
                TraceReason::EstablishedBothAnnouncedSameHost
            } else {
                TraceReason::EstablishedBothAnnounced
            },
            key.local_port,
            key.remote_port
        );
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
            // SAFETY: the map pointer is the SOCKHASH definition, which the loader relocates
            // to the map; `key` is a `SockKey` on the stack, the map's key type. Deleting from
            // a SOCKHASH is allowed in sock_ops.
            let ret = unsafe {
                bpf_map_delete_elem(
                    ptr::from_ref(&SMC_SOCKHASH).cast_mut().cast(),
                    ptr::from_ref(&key).cast(),
                )
            };
            if ret == 0 {
                count(Counter::ShortcutSocketsLeft, 1);
            }
            trace!(TraceReason::LeftSockhash, key.local_port, key.remote_port);
        }
    }
    let _ =
        ctx.set_cb_flags((ops.bpf_sock_ops_cb_flags & !BPF_SOCK_OPS_WRITE_HDR_OPT_CB_FLAG) as i32);
}
