//! Socket keys ([`SockKey`]: network namespace and 4-tuple) from the program contexts.
use aya_ebpf::{
    bindings::{bpf_sock, bpf_sock_ops},
    helpers::generated::bpf_get_netns_cookie,
};
use smc_common::bpf::SockKey;

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;

/// IPv4 address (as loaded from the context, i.e. network byte order in memory) as v4-mapped IPv6.
#[inline(always)]
fn v4_mapped(ip4: u32) -> [u32; 4] {
    [0, 0, u32::from_ne_bytes([0, 0, 0xff, 0xff]), ip4]
}

/// `remote_port` of sock_ops / sk_msg contexts holds the big-endian port, shifted into the upper
/// half on some kernels: normalise to host byte order.
#[inline(always)]
pub fn remote_port_host(raw: u32) -> u32 {
    let be = if raw > 0xffff { raw >> 16 } else { raw };
    u16::from_be(be as u16) as u32
}

#[inline(always)]
pub fn key_of(
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
        netns: 0,
    })
}

/// Reads a context field with one load at a constant offset from the context pointer (the
/// verifier rejects loads through a context pointer the compiler has moved).
///
/// `$ptr` must be the program's context (`bpf_sock_ops`, `sk_msg_md`) or a non-null `bpf_sock`
/// taken from it.
macro_rules! ctx_read {
    ($ptr:expr, $($field:tt)+) => {
        // SAFETY: `$ptr` is a kernel object the program was handed for this run (see above):
        // valid, aligned and not freed while the program runs; the verifier checks each field
        // load (offset, size, readability) at load time, and `addr_of!` makes no reference.
        unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*$ptr).$($field)+)) }
    };
}
pub(crate) use ctx_read;

/// The key of a context with the sock_ops / sk_msg field names (`local_*` / `remote_*`), in
/// the network namespace `$netns`.
macro_rules! ctx_key {
    ($p:expr, $netns:expr) => {
        $crate::key::key_of(
            $crate::key::ctx_read!($p, family),
            $crate::key::ctx_read!($p, local_ip4),
            $crate::key::ctx_read!($p, remote_ip4),
            [
                $crate::key::ctx_read!($p, local_ip6[0]),
                $crate::key::ctx_read!($p, local_ip6[1]),
                $crate::key::ctx_read!($p, local_ip6[2]),
                $crate::key::ctx_read!($p, local_ip6[3]),
            ],
            [
                $crate::key::ctx_read!($p, remote_ip6[0]),
                $crate::key::ctx_read!($p, remote_ip6[1]),
                $crate::key::ctx_read!($p, remote_ip6[2]),
                $crate::key::ctx_read!($p, remote_ip6[3]),
            ],
            $crate::key::ctx_read!($p, local_port),
            $crate::key::ctx_read!($p, remote_port),
        )
        .map(|k| k.in_netns($netns))
    };
}
pub(crate) use ctx_key;

#[inline(always)]
pub fn ops_key(ops: *const bpf_sock_ops) -> Option<SockKey> {
    // SAFETY: `ops` is the program's context, which `bpf_get_netns_cookie` takes as is (the
    // verifier checks the argument is the context); it is the namespace of the context's socket.
    let netns = unsafe { bpf_get_netns_cookie(ops.cast_mut().cast()) };
    ctx_key!(ops, netns)
}

/// Key of a full socket (`struct bpf_sock`: `src_*` local, `dst_*` remote) of the network
/// namespace `netns` (the caller's `bpf_get_netns_cookie` of the context that gave `sk`).
#[inline(always)]
pub fn sock_key(sk: *const bpf_sock, netns: u64) -> Option<SockKey> {
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
    .map(|k| k.in_netns(netns))
}
