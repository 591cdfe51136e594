//! The cgroup sockopt programs: the unprivileged per-socket channel at the private level
//! `SOL_SMC_BPF` (`setsockopt` switches a socket's bits, `getsockopt` reads its state).
use core::ptr;

use aya_ebpf::{
    helpers::generated::{bpf_get_current_cgroup_id, bpf_get_netns_cookie},
    macros::cgroup_sockopt,
    programs::SockoptContext,
};
use smc_common::bpf::{
    Counter, SockState, TraceReason, LISTENERS_ANNOUNCING, LISTENERS_WITHDRAWN, SMC_SO_CGROUP,
    SMC_SO_ENABLE, SMC_SO_PEER_QUARANTINED, SMC_SO_SHORTCUT, SMC_SO_STATE, SMC_SO_TCP,
    SOCK_CLAIMED, SOCK_LISTEN_COUNTED, SOCK_OPTED_IN, SOCK_PASSIVE, SOCK_QUARANTINED,
    SOCK_QUARANTINE_TRY, SOCK_SAME_HOST, SOCK_SHORTCUT, SOCK_SHORTCUT_GRANTED, SOCK_STATE_VERSION,
    SOCK_TCP, SOL_SMC_BPF,
};

use crate::{
    key::sock_key,
    maps::{
        count, count_listener, no_tcp_records, peer_entry, peer_of, tcp_peer_entry, trace,
        SMC_QUARANTINE_AT, SMC_SOCK_STATE,
    },
    quarantine::flags_or,
};

const BPF_TCP_LISTEN: u32 = 10;

#[cgroup_sockopt(setsockopt)]
pub fn smc_setsockopt(ctx: SockoptContext) -> i32 {
    // SAFETY: the program's context, non-null and valid for this run; the verifier checks every
    // field access through it (only `optlen` is written here, which setsockopt allows).
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_SMC_BPF {
        return 1;
    }
    // SAFETY: the union holds the `optval` pointer (its other member pads it to 8 bytes), the
    // start of the kernel's copy of the caller's option (`PTR_TO_PACKET`).
    let optval = unsafe { so.__bindgen_anon_2.optval } as *const u8;
    // SAFETY: as `optval`: the end of that copy (`PTR_TO_PACKET_END`).
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *const u8;
    if optval.wrapping_add(4) > end {
        return 0; // EPERM: malformed
    }
    // SAFETY: `[optval, optval + 4)` lies within the option buffer (checked against its end
    // just above, which the verifier also requires); the caller's bytes have no alignment.
    let on = unsafe { ptr::read_unaligned(optval.cast::<u32>()) } != 0;
    // SAFETY: the union holds the `sk` pointer; the kernel sets it to the socket being
    // configured, a full socket the verifier types `PTR_TO_SOCKET` (never null).
    let sk = unsafe { so.__bindgen_anon_1.sk };
    // SAFETY: the program's context, which `bpf_get_netns_cookie` takes as is: the namespace
    // of the socket being configured.
    let netns = unsafe { bpf_get_netns_cookie(ctx.sockopt.cast()) };
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
                trace!(
                    TraceReason::ShortcutRefused,
                    sock_key(sk, netns).map_or(0, |k| k.local_port),
                    0
                );
                return 0; // EPERM
            }
            SOCK_SHORTCUT
        }
        SMC_SO_TCP => {
            if on {
                trace!(
                    TraceReason::DataPathTcp,
                    sock_key(sk, netns).map_or(0, |k| k.local_port),
                    0
                );
            }
            SOCK_TCP
        }
        _ => return 0,
    };
    let was = state.flags;
    if on {
        state.flags |= bit;
        if bit == SOCK_TCP {
            state.flags &= !SOCK_SHORTCUT_GRANTED;
        }
    } else {
        state.flags &= !bit;
    }
    // A counted listener (it opted in before its `listen`) that withdraws or announces again
    // moves from one count of its key to the other. One that was not counted has no header
    // option callbacks (set at `listen` only when opted in): it can never announce, and its
    // key is left to the listeners that can (before, any listener's opt-in wrote the key's
    // flag and announced for a withdrawn sibling of it: red team round 30).
    let moves =
        bit == SOCK_OPTED_IN && was & SOCK_LISTEN_COUNTED != 0 && (was & SOCK_OPTED_IN != 0) != on;
    // SAFETY: `sk` is the sockopt context's full socket (non-null: the storage get above
    // returned a value for it); the verifier checks the `bpf_sock` field load.
    if moves && unsafe { (*sk).state } == BPF_TCP_LISTEN {
        if let Some(k) = sock_key(sk, netns) {
            let delta = if on {
                LISTENERS_ANNOUNCING.wrapping_sub(LISTENERS_WITHDRAWN)
            } else {
                LISTENERS_WITHDRAWN.wrapping_sub(LISTENERS_ANNOUNCING)
            };
            count_listener(netns, k.local_ip, k.local_port, delta);
        }
    }
    // Handled here: the kernel must not see this private level.
    so.optlen = -1;
    1
}

#[cgroup_sockopt(getsockopt)]
pub fn smc_getsockopt(ctx: SockoptContext) -> i32 {
    // SAFETY: the program's context, non-null and valid for this run; the verifier checks every
    // field access through it (getsockopt may write `optlen` and `retval`).
    let so = unsafe { &mut *ctx.sockopt };
    if so.level != SOL_SMC_BPF {
        return 1;
    }
    if so.optname == SMC_SO_CGROUP {
        return current_cgroup(so);
    }
    // SAFETY: the program's context, which `bpf_get_netns_cookie` takes as is: the namespace
    // of the socket asked.
    let netns = unsafe { bpf_get_netns_cookie(ctx.sockopt.cast()) };
    if so.optname == SMC_SO_PEER_QUARANTINED {
        return peer_quarantined(so, netns);
    }
    if so.optname != SMC_SO_STATE {
        return 1;
    }
    count(Counter::StateQueries, 1);
    // SAFETY: the union holds the `optval` pointer, the start of the kernel's buffer for the
    // option value (`PTR_TO_PACKET`, writable in getsockopt).
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    // SAFETY: as `optval`: the end of that buffer (`PTR_TO_PACKET_END`).
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *mut u8;
    // A caller may ask for the whole struct or only its first 8 bytes (flags, version).
    let full = optval.wrapping_add(core::mem::size_of::<SockState>()) <= end;
    if !full && optval.wrapping_add(8) > end {
        return 0;
    }
    // SAFETY: the union holds the `sk` pointer, the socket asked (`PTR_TO_SOCKET`); it is
    // still checked for null below before its fields are read.
    let sk = unsafe { so.__bindgen_anon_1.sk };
    let state = match SMC_SOCK_STATE.get(sk, false) {
        Some(s) if s.flags & SOCK_PASSIVE != 0 => claim(s),
        Some(s) => {
            // The active end is established before its peer: learn "same host" late.
            if s.flags & SOCK_SAME_HOST == 0 && !sk.is_null() {
                if let Some(key) = sock_key(sk, netns) {
                    let own = peer_entry(&key)
                        // SAFETY: a non-null hash map value, allocated for this run (RCU);
                        // one field is read by value.
                        .is_some_and(|e| unsafe { (*e).flags } & SOCK_SAME_HOST != 0);
                    if own || peer_entry(&key.mirror()).is_some() {
                        s.flags |= SOCK_SAME_HOST;
                    }
                }
            }
            *s
        }
        None => {
            // No storage (its connection cannot become SMC-D, ism mode): what its ESTABLISHED
            // recorded; with `--tcp-records off` it recorded nothing (no peer SMC either way).
            let mut st = SockState {
                version: SOCK_STATE_VERSION,
                ..SockState::default()
            };
            if !sk.is_null() && !no_tcp_records() {
                if let Some(key) = sock_key(sk, netns) {
                    if let Some(e) = tcp_peer_entry(&key) {
                        // SAFETY: a non-null hash map value, allocated for this run (RCU).
                        st.flags = unsafe { (*e).flags };
                    }
                    if st.flags & SOCK_SAME_HOST == 0 && tcp_peer_entry(&key.mirror()).is_some() {
                        st.flags |= SOCK_SAME_HOST;
                    }
                }
            }
            st
        }
    };
    let size = if full {
        // SAFETY: `full`: the buffer holds `size_of::<SockState>()` bytes from `optval` (checked
        // against its end, as the verifier requires); the caller's buffer has no alignment.
        unsafe { ptr::write_unaligned(optval.cast::<SockState>(), state) };
        core::mem::size_of::<SockState>()
    } else {
        // SAFETY: the buffer holds at least 8 bytes from `optval` (checked above).
        unsafe { ptr::write_unaligned(optval.cast::<[u32; 2]>(), [state.flags, state.version]) };
        8
    };
    // Two separate 4-byte stores: a merged 8-byte store is rejected by the verifier.
    // SAFETY: `so` is the context, whose `optlen` and `retval` getsockopt programs may write.
    unsafe { ptr::write_volatile(&mut so.optlen, size as i32) };
    // SAFETY: as above.
    unsafe { ptr::write_volatile(&mut so.retval, 0) };
    1
}

/// The state of a passive socket whose client announced SMC, asked by the data path that
/// accepted it: claimed ([`SOCK_CLAIMED`]) with one atomic `or`, which also tells whether a
/// sweep quarantined it first (see `crate::quarantine`): then the answer says
/// [`SOCK_QUARANTINED`] (the sweep sets that bit itself a moment later).
#[inline(always)]
fn claim(s: &mut SockState) -> SockState {
    let old = flags_or(s, SOCK_CLAIMED);
    let mut st = *s;
    st.flags = old | SOCK_CLAIMED;
    if old & SOCK_QUARANTINE_TRY != 0 {
        st.flags |= SOCK_QUARANTINED;
    }
    st
}

/// [`SMC_SO_PEER_QUARANTINED`]: whether the server end of the asking client's connection is in
/// the quarantine (its recorded cookie has a verdict position, see `crate::quarantine`).
#[inline(always)]
/// [`SMC_SO_CGROUP`]: the calling task's cgroup v2 id (nothing of the socket is read).
fn current_cgroup(so: &mut aya_ebpf::bindings::bpf_sockopt) -> i32 {
    // SAFETY: the union holds the `optval` pointer, the start of the kernel's buffer for the
    // option value (`PTR_TO_PACKET`, writable in getsockopt).
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    // SAFETY: as `optval`: the end of that buffer (`PTR_TO_PACKET_END`).
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *mut u8;
    if optval.wrapping_add(8) > end {
        return 0;
    }
    // SAFETY: a helper without arguments; cgroup sockopt programs may call it.
    let id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: the buffer holds at least 8 bytes from `optval` (checked above); the caller's
    // buffer has no alignment.
    unsafe { ptr::write_unaligned(optval.cast::<u64>(), id) };
    // SAFETY: `so` is the context, whose `optlen` and `retval` getsockopt programs may write.
    unsafe { ptr::write_volatile(&mut so.optlen, 8) };
    // SAFETY: as above.
    unsafe { ptr::write_volatile(&mut so.retval, 0) };
    1
}

fn peer_quarantined(so: &mut aya_ebpf::bindings::bpf_sockopt, netns: u64) -> i32 {
    // SAFETY: the union holds the `optval` pointer, the start of the kernel's buffer for the
    // option value (`PTR_TO_PACKET`, writable in getsockopt).
    let optval = unsafe { so.__bindgen_anon_2.optval } as *mut u8;
    // SAFETY: as `optval`: the end of that buffer (`PTR_TO_PACKET_END`).
    let end = unsafe { so.__bindgen_anon_3.optval_end } as *mut u8;
    if optval.wrapping_add(4) > end {
        return 0;
    }
    // SAFETY: the union holds the `sk` pointer, the socket asked (`PTR_TO_SOCKET`); checked
    // for null before use.
    let sk = unsafe { so.__bindgen_anon_1.sk };
    let mut yes = 0u32;
    if !sk.is_null() {
        if let Some(e) = sock_key(sk, netns).and_then(|k| peer_of(&k, false)) {
            // SAFETY: a non-null hash map value, allocated for this run (RCU); read by value.
            let cookie = unsafe { (*e).cookie };
            // SAFETY: only whether the entry exists is used.
            if unsafe { SMC_QUARANTINE_AT.get(&cookie) }.is_some() {
                yes = 1;
            }
        }
    }
    // SAFETY: the buffer holds at least 4 bytes from `optval` (checked above).
    unsafe { ptr::write_unaligned(optval.cast::<u32>(), yes) };
    // Two separate 4-byte stores: a merged 8-byte store is rejected by the verifier.
    // SAFETY: `so` is the context, whose `optlen` and `retval` getsockopt programs may write.
    unsafe { ptr::write_volatile(&mut so.optlen, 4) };
    // SAFETY: as above.
    unsafe { ptr::write_volatile(&mut so.retval, 0) };
    1
}
