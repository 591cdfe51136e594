//! The quarantine: a connection whose client announced SMC (and so sends a CLC Proposal first)
//! but that an image *without* the data path accepts must never show that image a CLC byte
//! (issue 10 item 3). A listener withdraws its announcement before such an exec
//! (`SMC_SO_ENABLE` 0), but that reaches only the SYN-ACKs sent after it: connections already
//! queued in its backlog were announced, and their clients' Proposals lie in (or are on their
//! way to) their receive queues, which no process can reach without accepting them.
//!
//! - [`smc_sweep`] (`iter/tcp`, run by the daemon in the listener's network namespace just
//!   before the exec, `smc_ism`'s `OP_SWEEP`): every passive socket of the withdrawn listener
//!   ([`SweepConfig`]) whose client announced SMC and that no process of ours claimed yet goes
//!   into [`SMC_QUARANTINE`]. A sweep of one socket ([`SweepConfig::cookie`], asked by the
//!   client of a connection whose Accept did not come, before its FIN) does the same for that
//!   socket alone, while it is still ESTABLISHED.
//! - `sock_ops` does the same at ESTABLISHED for a connection whose SYN-ACK still announced SMC
//!   while its listener withdrew before the handshake's last ACK ([`quarantine_established`]).
//! - [`smc_quarantine_verdict`] (stream verdict on that map) strips the client's Proposal off
//!   the head of the stream, and the Decline the client sends after it waited in vain for an
//!   Accept, then passes everything. The client continues on TCP (its Accept wait ends,
//!   `TIMEOUT_CL`); the image reads exactly the client's application bytes.
//!
//! A claim ([`SOCK_CLAIMED`], the data path's first `SMC_SO_STATE` of the socket) and a sweep
//! each set their bit with one atomic `or` and look at the other's: exactly one wins. A data
//! path that finds its socket quarantined declines as for a peer it cannot serve (a Proposal
//! that still arrives, because the map was full, is answered; a stripped one never comes and
//! the client's application bytes end the wait).
use core::{ffi::c_void, intrinsics::AtomicOrdering, ptr};

use aya_ebpf::{
    bindings::{bpf_sock_ops, sk_action, BPF_ANY},
    helpers::generated::{
        bpf_get_socket_cookie, bpf_map_update_elem, bpf_sk_storage_get, bpf_skc_to_tcp_sock,
    },
    macros::stream_verdict,
    programs::SkBuffContext,
};
use smc_common::{
    bpf::{
        listeners_announce, Counter, ListenerKey, SockKey, SockState, QUARANTINE_AT_DECLINE,
        QUARANTINE_AT_PROPOSAL, QUARANTINE_DONE, SOCK_CLAIMED, SOCK_PASSIVE, SOCK_PEER_SMC,
        SOCK_QUARANTINED, SOCK_QUARANTINE_TRY, SOCK_STATE_VERSION,
    },
    clc_wire::{
        DECLINE_V1_LEN, DECLINE_V2_LEN, EYECATCHER_SMCD, EYECATCHER_SMCR, HEADER_LEN, MSG_DECLINE,
        MSG_PROPOSAL, PROPOSAL_MAX_LEN, PROPOSAL_MIN_LEN, TRAILER_LEN,
    },
};

use crate::maps::{
    count, SMC_LISTENERS, SMC_QUARANTINE, SMC_QUARANTINE_AT, SMC_SOCK_STATE, SMC_SWEEP,
};

/// `state.flags |= bits` as one atomic operation (a sequentially consistent `or`, BPF's
/// `BPF_ATOMIC | BPF_OR | BPF_FETCH`), the old flags returned: the claim and the sweep decide
/// with it which came first. The BPF target has no atomic read-modify-write methods in `core`
/// (its spec says no compare-and-swap), so the intrinsic is called directly; and 32-bit atomics
/// need the ALU32 instructions this object is not built for, so the `or` covers the 8 bytes of
/// `flags` and `version`, leaving `version` (the upper half, little-endian) as it is.
#[inline(always)]
pub fn flags_or(state: &mut SockState, bits: u32) -> u32 {
    let word = ptr::from_mut(state).cast::<u64>();
    // SAFETY: `SockState` is `repr(C)` with `flags: u32, version: u32` first and `u64` fields
    // after: 8-aligned, its first 8 bytes are those two fields. The storage value lives for the
    // program run; other CPUs change `flags` with atomic operations or whole-field stores only.
    let old = unsafe {
        core::intrinsics::atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(word, u64::from(bits))
    };
    old as u32
}

// What `flags_or` relies on.
const _: () = assert!(cfg!(target_endian = "little"));
const _: () = assert!(core::mem::offset_of!(SockState, flags) == 0);
const _: () = assert!(core::mem::offset_of!(SockState, version) == 4);
const _: () = assert!(core::mem::align_of::<SockState>() == 8);

fn is_eyecatcher(b: [u8; 4]) -> bool {
    b == EYECATCHER_SMCR || b == EYECATCHER_SMCD
}

/// The length of the whole CLC message of type `want` at `off`, when one lies there complete.
#[inline(always)]
fn clc_frame(ctx: &SkBuffContext, off: u32, len: u32, want: u8) -> Option<u32> {
    let hdr: [u8; HEADER_LEN] = ctx.load(off as usize).ok()?;
    if !is_eyecatcher([hdr[0], hdr[1], hdr[2], hdr[3]]) || hdr[4] != want {
        return None;
    }
    let n = u16::from_be_bytes([hdr[5], hdr[6]]) as usize;
    let fits = if want == MSG_PROPOSAL {
        (PROPOSAL_MIN_LEN..=PROPOSAL_MAX_LEN).contains(&n)
    } else {
        n == DECLINE_V1_LEN || n == DECLINE_V2_LEN
    };
    if !fits || off as usize + n > len as usize {
        return None;
    }
    let trail: [u8; TRAILER_LEN] = ctx.load(off as usize + n - TRAILER_LEN).ok()?;
    is_eyecatcher(trail).then_some(n as u32)
}

#[stream_verdict]
pub fn smc_quarantine_verdict(ctx: SkBuffContext) -> u32 {
    // SAFETY: the program's context, which the sk_skb variant of the helper takes as is (the
    // socket cookie of the skb's socket, the quarantined one).
    let cookie = unsafe { bpf_get_socket_cookie(ctx.skb.skb.cast()) };
    let Some(at) = SMC_QUARANTINE_AT.get_ptr_mut(&cookie) else {
        return sk_action::SK_PASS;
    };
    // SAFETY: a non-null hash map value (`u32`), allocated for this run (RCU); only the
    // socket's own verdict writes it, one skb at a time (the socket's receive path is serial).
    let mut stage = unsafe { *at };
    let len = ctx.len();
    let mut off = 0u32;
    // A Proposal, then a Decline: at most two messages, both at the head of the stream (an
    // skb queued before the socket was accepted may hold both and the first application bytes).
    for _ in 0..2 {
        let want = match stage {
            QUARANTINE_AT_PROPOSAL => MSG_PROPOSAL,
            QUARANTINE_AT_DECLINE => MSG_DECLINE,
            _ => break,
        };
        if off >= len {
            break;
        }
        match clc_frame(&ctx, off, len, want) {
            Some(n) => {
                off += n;
                stage += 1;
                count(Counter::ClcStripped, 1);
            }
            None => {
                // Application bytes begin here: nothing after them is stripped.
                stage = QUARANTINE_DONE;
                break;
            }
        }
    }
    // SAFETY: as the load above.
    unsafe { *at = stage };
    if off == 0 {
        sk_action::SK_PASS
    } else if off >= len {
        sk_action::SK_DROP
    } else if ctx.skb.adjust_room(-(off as i32), 0, 0).is_ok() {
        // sk_skb's adjust_room pops `off` bytes off the front of the data.
        sk_action::SK_PASS
    } else {
        // Cannot happen but under memory pressure (the pull of the popped bytes): the bytes
        // pass whole, as before there was a quarantine.
        sk_action::SK_PASS
    }
}

/// Puts the passive socket `sk` (a BTF `struct sock` pointer, `cookie` its socket cookie) into
/// the quarantine: its verdict starts at the Proposal. Whether the map took it (a full map, or
/// a socket no longer ESTABLISHED, does not).
#[inline(always)]
fn enter(sk: *mut c_void, mut cookie: u64) -> bool {
    let _ = SMC_QUARANTINE_AT.insert(&cookie, &QUARANTINE_AT_PROPOSAL, 0);
    // SAFETY: the map pointer is the SOCKHASH definition, which the loader relocates to the
    // map; the key is a `u64` on the stack (the map's key type); `sk` is a full TCP socket the
    // verifier types as a BTF socket pointer, which a sockmap update from an iterator takes.
    let ret = unsafe {
        bpf_map_update_elem(
            ptr::from_ref(&SMC_QUARANTINE).cast_mut().cast(),
            ptr::from_mut(&mut cookie).cast(),
            sk,
            BPF_ANY as u64,
        )
    };
    if ret == 0 {
        count(Counter::Quarantined, 1);
        true
    } else {
        let _ = SMC_QUARANTINE_AT.remove(&cookie);
        false
    }
}

/// `iter/tcp`: one run per TCP socket of the reader's network namespace. aya-ebpf 0.2 has no
/// macro for iterators; the section name is what the loader (and the kernel) expect.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub fn smc_sweep(ctx: *mut c_void) -> i32 {
    // SAFETY: the context is `struct bpf_iter__tcp { meta; sk_common; uid }`, each member
    // 8 bytes; the verifier types the load at offset 8 as a nullable `sock_common` pointer.
    let skc = unsafe { ptr::read_volatile(ctx.cast::<*mut c_void>().add(1)) };
    if skc.is_null() {
        return 0;
    }
    // SAFETY: `skc` is the iterator's socket (BTF pointer); the helper returns null unless it
    // is a full TCP socket (request and time-wait sockets are not).
    let tp = unsafe { bpf_skc_to_tcp_sock(skc) };
    if tp.is_null() {
        return 0;
    }
    let Some(cfg) = SMC_SWEEP.get(0) else {
        return 0;
    };
    let one = cfg.cookie;
    let listener = &cfg.listener;
    // A listener sweep: the listener announces again (an exec that failed restored it):
    // nothing to do. (A sweep of one socket is the client's: its listener may announce.)
    if one == 0 {
        // SAFETY: the value of a hash map lookup stays allocated for this run (RCU); read once.
        let v = unsafe { SMC_LISTENERS.get(listener) }.copied();
        if v.is_some_and(|v| listeners_announce(v) == Some(true)) {
            return 0;
        }
    }
    // SAFETY: the map pointer is the socket storage definition; `tp` is a full socket (BTF
    // pointer), which the tracing variant of the helper takes; no value is created.
    let st = unsafe {
        bpf_sk_storage_get(
            ptr::from_ref(&SMC_SOCK_STATE).cast_mut().cast(),
            tp.cast(),
            ptr::null_mut(),
            0,
        )
    }
    .cast::<SockState>();
    if st.is_null() {
        return 0;
    }
    // SAFETY: a non-null storage value of `SockState`, alive while the socket is (the iterator
    // holds it, locked).
    let f = unsafe { ptr::read_volatile(ptr::addr_of!((*st).flags)) };
    let want = SOCK_PASSIVE | SOCK_PEER_SMC;
    if f & want != want || f & (SOCK_CLAIMED | SOCK_QUARANTINE_TRY) != 0 {
        return 0;
    }
    // SAFETY: `tp` is a full socket (BTF pointer), which the tracing variant of the helper
    // takes (only sockets with our state get here: they have a cookie already).
    let cookie = unsafe { bpf_get_socket_cookie(tp.cast()) };
    if one != 0 {
        if cookie != one {
            return 0;
        }
    } else {
        // Of this listener: its port, and its address or a wildcard that covers the socket's
        // (recorded at ESTABLISHED; a listener of the same port at another address is
        // another's).
        // SAFETY: as above; plain fields of the value, read by value.
        let (port, ip) = unsafe {
            (
                ptr::read_volatile(ptr::addr_of!((*st).local_port)),
                ptr::read_volatile(ptr::addr_of!((*st).local_ip)),
            )
        };
        if port != listener.port || !listener.covers(&ip) {
            return 0;
        }
        // And only a connection whose own listener is withdrawn too (the most specific entry of
        // its address, as `listener_announces`): a wildcard covers connections of other listeners
        // of the port, e.g. an `IPV6_V6ONLY` `[::]` listener, which any uid may bind next to
        // another uid's IPv4 listener of that port, those of the IPv4 one (red team rt22
        // `sweepv6`: uid nobody's sweeps quarantined 51 of root's 100 queued connections, which
        // fell back to TCP).
        for k in ListenerKey::candidates(listener.netns, ip, port) {
            // SAFETY: the value of a hash map lookup stays allocated for this run (RCU); read
            // once, by value.
            match unsafe { SMC_LISTENERS.get(&k) }.and_then(|v| listeners_announce(*v)) {
                Some(true) => return 0,
                Some(false) => break,
                None => {}
            }
        }
    }
    // SAFETY: as above.
    let old = flags_or(unsafe { &mut *st }, SOCK_QUARANTINE_TRY);
    if old & SOCK_CLAIMED != 0 {
        return 0;
    }
    if enter(tp.cast(), cookie) {
        // SAFETY: as above.
        flags_or(unsafe { &mut *st }, SOCK_QUARANTINED);
    }
    0
}

/// At ESTABLISHED of a passive socket whose client's SYN announced SMC but whose listener
/// withdrew after our SYN-ACK said so: the client saw the option (its own entry says so) and
/// sends a Proposal that no data path of ours will answer. `flags`: the bits recorded.
#[inline(always)]
pub fn quarantine_established(
    ops: *mut bpf_sock_ops,
    state: Option<&mut SockState>,
    flags: u32,
    key: &SockKey,
) {
    let Some(state) = state else {
        return;
    };
    state.version = SOCK_STATE_VERSION;
    state.local_ip = key.local_ip;
    state.local_port = key.local_port;
    state.flags |= flags | SOCK_PASSIVE | SOCK_QUARANTINE_TRY;
    // SAFETY: the context, which the sock_ops variant of the helper takes as is.
    let mut cookie = unsafe { bpf_get_socket_cookie(ops.cast()) };
    let _ = SMC_QUARANTINE_AT.insert(&cookie, &QUARANTINE_AT_PROPOSAL, 0);
    // SAFETY: the context, valid for this run; `bpf_sock_hash_update` takes it as is.
    let ops = unsafe { &mut *ops };
    if SMC_QUARANTINE.update(&mut cookie, ops, 0).is_ok() {
        state.flags |= SOCK_QUARANTINED;
        count(Counter::Quarantined, 1);
    } else {
        let _ = SMC_QUARANTINE_AT.remove(&cookie);
    }
}
