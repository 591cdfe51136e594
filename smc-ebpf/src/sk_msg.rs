//! The `sk_msg` program on the SOCKHASH: the shortcut between same-host peer sockets.
use aya_ebpf::{
    bindings::{sk_action, BPF_F_INGRESS},
    helpers::generated::bpf_get_netns_cookie,
    macros::sk_msg,
    programs::SkMsgContext,
};
use smc_common::bpf::{Counter, SOCK_SHORTCUT};

use crate::{
    key::ctx_key,
    maps::{count, SMC_PEERS, SMC_SOCKHASH, SMC_SOCK_STATE},
};

#[sk_msg]
pub fn smc_sk_msg(ctx: SkMsgContext) -> u32 {
    // SAFETY: the program's context, non-null and valid for this run; the verifier checks every
    // field load made through it.
    let md = unsafe { &*ctx.msg };
    // SAFETY: the union holds the `sk` pointer (its other member pads it to 8 bytes); the kernel
    // fills it with the sending socket, a full socket the verifier types `PTR_TO_SOCKET`.
    let sk = unsafe { md.__bindgen_anon_3.sk };
    let state = SMC_SOCK_STATE.get(sk, false);
    let Some(state) = state.filter(|s| s.flags & SOCK_SHORTCUT != 0) else {
        count(Counter::MsgPassNotEnabled, 1);
        return sk_action::SK_PASS;
    };
    // SAFETY: the program's context, which `bpf_get_netns_cookie` takes as is: the namespace
    // of the sending socket.
    let netns = unsafe { bpf_get_netns_cookie(ctx.msg.cast()) };
    let Some(key) = ctx_key!(ctx.msg, netns) else {
        count(Counter::MsgPassNoPeer, 1);
        return sk_action::SK_PASS;
    };
    // The peer must be a registered socket of this host: otherwise (other host, peer outside an
    // attached cgroup) the message goes to TCP untouched. Redirecting to a missing key would drop
    // it (EACCES for the sender). Its key: the mirrored tuple in this namespace, or in the one
    // the pairing of a connection between two namespaces recorded (never another namespace that
    // merely rebuilt the tuple: red team rt22 `hijack`).
    let mut peer = key.mirror();
    // SAFETY: only whether the entry exists is used, the value is not read.
    if unsafe { SMC_PEERS.get(&peer) }.is_none() {
        let ns = if key.is_loopback() {
            0
        } else {
            // SAFETY: a hash map value, allocated for this run (RCU); one field read by value.
            unsafe { SMC_PEERS.get(&key) }.map_or(0, |e| e.peer_netns)
        };
        peer = peer.in_netns(ns);
        // SAFETY: only whether the entry exists is used, the value is not read.
        if ns == 0 || ns == netns || unsafe { SMC_PEERS.get(&peer) }.is_none() {
            count(Counter::MsgPassNoPeer, 1);
            return sk_action::SK_PASS;
        }
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
