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
use std::cell::Cell;

thread_local! {
    /// The application's `msghdr` of the `recvmsg` this thread is in ([`with_msg`]), and
    /// whether a read here filled its name, control and flags.
    static APP_MSG: Cell<(*mut libc::msghdr, bool)> = const { Cell::new((std::ptr::null_mut(), false)) };
}

/// Runs `f` (the data path's handling of the application's `recvmsg` with `msg`): a read of a
/// member socket in it takes the kernel's name, control messages (`TCP_INQ`, timestamps) and
/// flags (`MSG_CTRUNC`) into `msg`, as the kernel's `recvmsg` would. The bool: whether one did
/// (the caller leaves them then).
pub fn with_msg<R>(msg: *mut libc::msghdr, f: impl FnOnce() -> R) -> (R, bool) {
    let old = APP_MSG.with(|c| c.replace((msg, false)));
    let r = f();
    let filled = APP_MSG.with(|c| c.replace(old)).1;
    (r, filled)
}

/// `recvmsg` on `fd` into `iov`, corrected for the two `tcp_bpf` edges.
///
/// # Safety
/// `iov` describes writable memory; a `msghdr` given to [`with_msg`] around this call is the
/// application's, valid as `recvmsg(2)` requires.
pub unsafe fn recv(fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = iov.as_ptr() as *mut iovec;
    m.msg_iovlen = iov.len() as _;
    let app = APP_MSG.with(|c| c.get().0);
    loop {
        if !app.is_null() {
            // SAFETY: the application's msghdr (this function's contract); read only here.
            let a = unsafe { &*app };
            m.msg_name = a.msg_name;
            m.msg_namelen = a.msg_namelen;
            m.msg_control = a.msg_control;
            m.msg_controllen = a.msg_controllen;
            m.msg_flags = 0;
        }
        // A signal that ended a wait of this call already (the data path's own, before it
        // came here) ends it, as it would have ended TCP's blocking read; the kernel's read
        // would wait on (the handler ran already).
        if crate::signals::caught()
            && (crate::signals::interrupted() || has_rcvtimeo(fd))
            && flags & libc::MSG_DONTWAIT == 0
            && !crate::util::nonblocking(fd)
        {
            real::set_errno(libc::EINTR);
            return -1;
        }
        let r = match iov {
            // The application's `recv`/`read` stays a `recvfrom` (no name, no control): a
            // sandbox that allows the call the application made may refuse `recvmsg` (red team
            // rt25 `rt25_sandbox.sh recvmsg client`: every read of a connection that fell back
            // said `EPERM`, TCP none).
            [one] if app.is_null() => {
                // SAFETY: the caller's buffer (this function's contract); no address asked.
                unsafe {
                    real::recvfrom(
                        fd,
                        one.iov_base,
                        one.iov_len,
                        flags,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                    )
                }
            }
            // SAFETY: the caller's buffers.
            _ => unsafe { real::recvmsg(fd, &mut m, flags) },
        };
        let e = real::errno();
        let done =
            r > 0 || (r == 0 && (iov.iter().all(|v| v.iov_len == 0) || !bytes_queued(fd, flags)));
        if done && !app.is_null() {
            // SAFETY: as above; what the kernel wrote for it goes back.
            let a = unsafe { &mut *app };
            a.msg_namelen = m.msg_namelen;
            a.msg_controllen = m.msg_controllen;
            a.msg_flags = m.msg_flags;
            APP_MSG.with(|c| c.set((app, true)));
        }
        if done {
            real::set_errno(e);
            return r;
        }
        if r == 0 {
            continue; // 0 with bytes still queued: not the end of the stream
        }
        if e != libc::EAGAIN || flags & libc::MSG_DONTWAIT != 0 || crate::util::nonblocking(fd) {
            real::set_errno(e);
            return -1;
        }
        // A blocking read said EAGAIN: spurious unless a receive timeout expired, or a signal
        // ended its wait (`tcp_bpf` says EAGAIN then, where TCP says EINTR or restarts).
        if crate::signals::caught() && (crate::signals::interrupted() || has_rcvtimeo(fd)) {
            real::set_errno(libc::EINTR);
            return -1;
        }
        if !readable(fd, 0) && has_rcvtimeo(fd) {
            real::set_errno(e);
            return -1;
        }
        // Otherwise wait like the blocking read would have. A signal that ends TCP's read
        // (its handler has no SA_RESTART, or the socket has a receive timeout) ends this one
        // with EINTR: the read made again would not see it (it was handled already) and would
        // wait on.
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd of our own.
        if unsafe { real::poll(&mut p, 1, -1) } < 0
            && real::errno() == libc::EINTR
            && (crate::signals::interrupted() || has_rcvtimeo(fd))
        {
            real::set_errno(libc::EINTR);
            return -1;
        }
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
