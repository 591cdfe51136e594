//! The cgroup sockopt programs: the unprivileged per-socket channel at the private level
//! `SOL_SMC_BPF` (`setsockopt` switches a socket's bits, `getsockopt` reads its state).
use core::ptr;

use aya_ebpf::{
    helpers::generated::bpf_get_netns_cookie, macros::cgroup_sockopt, programs::SockoptContext,
};
use smc_common::bpf::{
    Counter, SockState, SMC_SO_ENABLE, SMC_SO_SHORTCUT, SMC_SO_STATE, SMC_SO_TCP, SOCK_OPTED_IN,
    SOCK_SAME_HOST, SOCK_SHORTCUT, SOCK_SHORTCUT_GRANTED, SOCK_STATE_VERSION, SOCK_TCP,
    SOL_SMC_BPF,
};

use crate::{
    key::sock_key,
    maps::{count, peer_entry, set_listener, SMC_SOCK_STATE},
};

const BPF_TCP_LISTEN: u32 = 10;

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
