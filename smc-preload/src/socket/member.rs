//! Reads of a connection that stays TCP after both ends announced SMC ([`Obj::Tcp`]).
//!
//! Such a socket went into the eBPF SOCKHASH at ESTABLISHED (it might have become SMC-D) and
//! leaves it at its next outgoing segment once the data path said `SMC_SO_TCP` (a sockmap member
//! can only be removed from `sock_ops`). Until then the kernel reads it through `tcp_bpf`, which
//! differs from TCP at two edges when data (and FIN) arrive while a read starts on an empty
//! queue: a *blocking* read can fail with `EAGAIN`, and a read can return 0 while bytes are still
//! queued. Both are corrected here; everything else is the kernel's answer unchanged.
//!
//! [`Obj::Tcp`]: crate::obj::Obj::Tcp

use crate::real;
use libc::{c_int, c_void, iovec, ssize_t};

/// `recvmsg` on `fd` into `iov`, corrected for the two `tcp_bpf` edges.
///
/// # Safety
/// `iov` describes writable memory.
pub unsafe fn recv(fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.as_ptr() as *mut iovec;
    m.msg_iovlen = iov.len() as _;
    loop {
        // SAFETY: the caller's buffers.
        let r = unsafe { real::recvmsg(fd, &mut m, flags) };
        if r > 0 {
            return r;
        }
        let e = real::errno();
        if r == 0 {
            if iov.iter().all(|v| v.iov_len == 0) || !bytes_queued(fd, flags) {
                return 0;
            }
            continue; // 0 with bytes still queued: not the end of the stream
        }
        if e != libc::EAGAIN || flags & libc::MSG_DONTWAIT != 0 || nonblocking(fd) {
            real::set_errno(e);
            return -1;
        }
        // A blocking read said EAGAIN: spurious unless a receive timeout expired.
        if !readable(fd, 0) && has_rcvtimeo(fd) {
            real::set_errno(e);
            return -1;
        }
        // Otherwise wait like the blocking read would have (an interrupted wait retries the read,
        // which then reports the signal as the kernel does).
        readable(fd, -1);
    }
}

/// Whether bytes are queued for a read of `flags` (a peek starts at the application's
/// `SO_PEEK_OFF` when it set one). Asked with `SIOCINQ`, not a peek: a peek would move that
/// offset.
fn bytes_queued(fd: c_int, flags: c_int) -> bool {
    let e0 = real::errno();
    let mut q: c_int = 0;
    // SAFETY: SIOCINQ writes one int to our local.
    let r = unsafe {
        real::ioctl(
            fd,
            libc::FIONREAD as libc::c_ulong,
            std::ptr::from_mut(&mut q) as libc::c_ulong,
        )
    };
    let from = if flags & libc::MSG_PEEK != 0 {
        crate::util::peek_off_of(fd).unwrap_or(0)
    } else {
        0
    };
    real::set_errno(e0);
    r == 0 && q > from
}

fn readable(fd: c_int, timeout_ms: c_int) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd of our own.
    unsafe { real::poll(&mut p, 1, timeout_ms) > 0 }
}

fn nonblocking(fd: c_int) -> bool {
    // SAFETY: F_GETFL has no argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

pub(crate) fn has_rcvtimeo(fd: c_int) -> bool {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: valid out buffer.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &mut tv as *mut libc::timeval as *mut c_void,
            &mut len,
        )
    };
    r == 0 && (tv.tv_sec != 0 || tv.tv_usec != 0)
}
