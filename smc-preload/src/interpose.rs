//! The exported libc symbols. Each is a thin wrapper around [`crate::ops`].
#![allow(clippy::missing_safety_doc)]

use crate::ops;
use libc::{c_int, c_uint, c_ulong, c_void, iovec, size_t, sockaddr, socklen_t, ssize_t};

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::socket` has the contract of
    // libc's `socket`.
    unsafe { ops::socket(domain, ty, proto) }
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::connect` has the contract of
    // libc's `connect`.
    unsafe { ops::connect(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::listen` has the contract of
    // libc's `listen`.
    unsafe { ops::listen(fd, backlog) }
}

#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::accept4` has the contract of
    // libc's `accept`.
    unsafe { ops::accept4(fd, addr, len, 0, false) }
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::accept4` has the contract of
    // libc's `accept4`.
    unsafe { ops::accept4(fd, addr, len, flags, true) }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::close` has the contract of
    // libc's `close`.
    unsafe { ops::close(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::close_range` has the contract
    // of libc's `close_range`.
    unsafe { ops::close_range(first, last, flags) }
}

/// A thread that takes a descriptor table of its own (`CLONE_FILES`) closes and re-points its
/// numbers there only: noted, so that those leave the process's sockets alone.
#[no_mangle]
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    // SAFETY: an integer argument, passed on unchanged.
    let r = unsafe { crate::real::unshare(flags) };
    if r == 0 && flags & libc::CLONE_FILES != 0 {
        crate::lifecycle::fd_table_unshared();
    }
    r
}

/// glibc's `closefrom` closes through its internal `close_range`, which we would not see: our
/// daemon connection and private duplicates closed behind our back, the daemon's next request
/// written into whatever file took its number (`tests/redteam/rt5.c closefrom_pair`).
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    // SAFETY: integer argument only; `ops::closefrom` has the contract of glibc's `closefrom`.
    unsafe { ops::closefrom(lowfd) }
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::shutdown` has the contract of
    // libc's `shutdown`.
    unsafe { ops::shutdown(fd, how) }
}

extern "C" {
    /// glibc's "buffer overflow detected" abort.
    fn __chk_fail() -> !;
}

/// The `_chk` variants' check, as glibc makes it before the call: a length beyond the buffer
/// the compiler saw aborts the program.
#[inline]
fn chk(n: size_t, buflen: size_t) {
    if n > buflen {
        // SAFETY: glibc's own abort path for this case.
        unsafe { __chk_fail() }
    }
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::read` has the contract of
    // libc's `read`.
    unsafe { ops::read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    chk(n, buflen);
    // SAFETY: the application's arguments, passed on unchanged after the `_chk` length check:
    // `ops::read` has the contract of libc's `read`.
    unsafe { ops::read(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::write` has the contract of
    // libc's `write`.
    unsafe { ops::write(fd, buf, n) }
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::readv` has the contract of
    // libc's `readv`.
    unsafe { ops::readv(fd, iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::writev` has the contract of
    // libc's `writev`.
    unsafe { ops::writev(fd, iov, cnt) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::preadv2` has the contract
    // of libc's `preadv2`.
    unsafe { ops::preadv2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: as `preadv2` (the same function where `off_t` is 64 bits).
    unsafe { ops::preadv2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::pwritev2` has the
    // contract of libc's `pwritev2`.
    unsafe { ops::pwritev2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: as `pwritev2` (the same function where `off_t` is 64 bits).
    unsafe { ops::pwritev2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::recv` has the contract of
    // libc's `recv`.
    unsafe { ops::recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    chk(n, buflen);
    // SAFETY: the application's arguments, passed on unchanged after the `_chk` length check:
    // `ops::recv` has the contract of libc's `recv`.
    unsafe { ops::recv(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::send` has the contract of
    // libc's `send`.
    unsafe { ops::send(fd, buf, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::recvfrom` has the contract of
    // libc's `recvfrom`.
    unsafe { ops::recvfrom(fd, buf, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    chk(n, buflen);
    // SAFETY: the application's arguments, passed on unchanged after the `_chk` length check:
    // `ops::recvfrom` has the contract of libc's `recvfrom`.
    unsafe { ops::recvfrom(fd, buf, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sendto` has the contract of
    // libc's `sendto`.
    unsafe { ops::sendto(fd, buf, n, flags, addr, alen) }
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::recvmsg` has the contract of
    // libc's `recvmsg`.
    unsafe { ops::recvmsg(fd, msg, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sendmsg` has the contract of
    // libc's `sendmsg`.
    unsafe { ops::sendmsg(fd, msg, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
    t: *mut libc::timespec,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::recvmmsg` has the contract of
    // libc's `recvmmsg`.
    unsafe { ops::recvmmsg(fd, msgs, n, flags, t) }
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sendmmsg` has the contract of
    // libc's `sendmmsg`.
    unsafe { ops::sendmmsg(fd, msgs, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::poll` has the contract of
    // libc's `poll`.
    unsafe { ops::poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    timeout: c_int,
    _fdslen: size_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged after the `_chk` length check:
    // `ops::poll` has the contract of libc's `poll`.
    unsafe { ops::poll(fds, n, timeout) }
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::ppoll` has the contract of
    // libc's `ppoll`.
    unsafe { ops::ppoll(fds, n, t, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
    _fdslen: size_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged after the `_chk` length check:
    // `ops::ppoll` has the contract of libc's `ppoll`.
    unsafe { ops::ppoll(fds, n, t, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::select` has the contract of
    // libc's `select`.
    unsafe { ops::select(n, r, w, e, t) }
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::pselect` has the contract of
    // libc's `pselect`.
    unsafe { ops::pselect(n, r, w, e, t, mask) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(
    ep: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::epoll_ctl` has the contract
    // of libc's `epoll_ctl`.
    unsafe { ops::epoll_ctl(ep, op, fd, ev) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(
    ep: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::epoll_wait` has the contract
    // of libc's `epoll_wait`.
    unsafe { ops::epoll_wait(ep, ev, max, timeout, None) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    ep: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    let m = if mask.is_null() { None } else { Some(mask) };
    // SAFETY: the application's arguments, passed on unchanged: `ops::epoll_wait` has the contract
    // of libc's `epoll_pwait`.
    unsafe { ops::epoll_wait(ep, ev, max, timeout, m) }
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    ep: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    crate::daemon::flush_releases();
    let ms = || {
        if t.is_null() {
            -1
        } else {
            // SAFETY: `t` is non-null (checked above) and, by epoll_pwait2's contract, points to
            // the application's timespec.
            let t = unsafe { &*t };
            (t.tv_sec * 1000 + (t.tv_nsec + 999_999) / 1_000_000).clamp(0, i32::MAX as i64) as c_int
        }
    };
    let m = if mask.is_null() { None } else { Some(mask) };
    if crate::epoll::wants(ep).is_none() {
        // SAFETY: the application's arguments, passed on unchanged to libc's function of the
        // same name and signature.
        let kernel_wait = || unsafe { crate::real::epoll_pwait2(ep, ev, max, t, mask) };
        // SAFETY: `ev`/`max` are the application's event array (epoll_pwait2's contract), `m`
        // its signal mask or None.
        return unsafe { crate::epoll::plain_wait(ep, ev, max, ms, m, kernel_wait) };
    }
    let ms = ms();
    // SAFETY: the application's arguments, the timeout in ms: `ops::epoll_wait` has the contract of
    // libc's `epoll_pwait`.
    unsafe { ops::epoll_wait(ep, ev, max, ms, m) }
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::ioctl` has the contract of
    // libc's `ioctl`.
    unsafe { ops::ioctl(fd, req, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::fcntl` has the contract of
    // libc's `fcntl`.
    unsafe { ops::fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::fcntl` has the contract of
    // libc's `fcntl64`.
    unsafe { ops::fcntl(fd, cmd, arg) }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::dup` has the contract of
    // libc's `dup`.
    unsafe { ops::dup(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, fd2: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::dup3` has the contract of
    // libc's `dup2`.
    unsafe { ops::dup3(fd, fd2, 0, false) }
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, fd2: c_int, flags: c_int) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::dup3` has the contract of
    // libc's `dup3`.
    unsafe { ops::dup3(fd, fd2, flags, true) }
}

#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::fork` has the contract of
    // libc's `fork`.
    unsafe { ops::fork() }
}

/// `vfork`: the handshakes under way are decided first (`ops::before_vfork`), then libc's
/// `vfork` runs as if called by the application. A jump, not a call: the child returns from
/// `vfork` on the parent's stack, so no frame of ours may lie between it and its caller (the
/// parent would come back to a frame the child's calls overwrote). The hook's frame is gone
/// before the jump; `vfork` has no arguments and clobbers the caller-saved registers anyway.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: the stack is 16-byte aligned for the call (8 for the return address, 8 more),
    // restored before the jump, and `rax` holds the hook's answer: libc's `vfork`.
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {hook}",
        "add rsp, 8",
        "jmp rax",
        hook = sym vfork_hook,
    )
}

/// As for x86_64: the link register is saved around the hook, restored before the jump.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: `x29`/`x30` saved and restored on a 16-byte aligned stack; `x0` holds the hook's
    // answer: libc's `vfork`.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-16]!",
        "mov x29, sp",
        "bl {hook}",
        "ldp x29, x30, [sp], #16",
        "br x0",
        hook = sym vfork_hook,
    )
}

/// `clone(2)` (glibc's wrapper: `fn, stack, flags, arg, ...`): a child that shares our memory
/// and runs until it execs (`CLONE_VM | CLONE_VFORK`, a hand-made `vfork`) gets what `vfork`
/// gets first ([`vfork_hook`]); any other clone goes to libc's untouched. The argument
/// registers (the variadic ones too) and the stack are as the caller left them at the jump.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn clone() -> c_int {
    // SAFETY: the six argument registers are saved and restored around the hook (the seventh
    // argument stays on the caller's stack, untouched); 6 pushes and 8 bytes more keep the
    // call 16-byte aligned; `rax` holds the hook's answer: libc's `clone`.
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        "sub rsp, 8",
        "mov edi, edx",
        "call {hook}",
        "add rsp, 8",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "jmp rax",
        hook = sym clone_hook,
    )
}

/// As for x86_64: the argument registers `x0`-`x7` and the frame are saved around the hook.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn clone() -> c_int {
    // SAFETY: `x0`-`x7`, `x29`, `x30` saved and restored on a 16-byte aligned stack; `x16`
    // holds the hook's answer: libc's `clone`.
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-80]!",
        "stp x0, x1, [sp, #16]",
        "stp x2, x3, [sp, #32]",
        "stp x4, x5, [sp, #48]",
        "stp x6, x7, [sp, #64]",
        "mov x29, sp",
        "mov w0, w2",
        "bl {hook}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x2, x3, [sp, #32]",
        "ldp x4, x5, [sp, #48]",
        "ldp x6, x7, [sp, #64]",
        "ldp x29, x30, [sp], #80",
        "br x16",
        hook = sym clone_hook,
    )
}

/// The interposed `clone`'s work before libc's (see [`clone`]); returns libc's `clone`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" fn clone_hook(flags: c_int) -> usize {
    let vfork_like = libc::CLONE_VM | libc::CLONE_VFORK;
    if flags & vfork_like == vfork_like {
        ops::before_vfork();
    }
    crate::real::clone_addr()
}

/// The interposed `vfork`'s work before libc's (see [`vfork`]); returns libc's `vfork`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
extern "C" fn vfork_hook() -> usize {
    ops::before_vfork();
    crate::real::vfork_addr()
}

#[no_mangle]
pub unsafe extern "C" fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
) -> libc::pid_t {
    lifecycle::wait_child(pid, lifecycle::WaitOptions::Pid(options), |nohang| {
        let o = if nohang {
            options | libc::WNOHANG
        } else {
            options
        };
        // SAFETY: the application's arguments, with `o` its options (plus `WNOHANG`).
        let r = unsafe { crate::real::waitpid(pid, status, o) };
        (!(nohang && r == 0)).then_some(r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn wait(status: *mut c_int) -> libc::pid_t {
    lifecycle::wait_child(-1, lifecycle::WaitOptions::Pid(0), |nohang| {
        let o = if nohang { libc::WNOHANG } else { 0 };
        // SAFETY: the application's status pointer; `wait` is `waitpid(-1, status, 0)`.
        let r = unsafe { crate::real::waitpid(-1, status, o) };
        (!(nohang && r == 0)).then_some(r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn wait4(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
    ru: *mut libc::rusage,
) -> libc::pid_t {
    lifecycle::wait_child(pid, lifecycle::WaitOptions::Pid(options), |nohang| {
        let o = if nohang {
            options | libc::WNOHANG
        } else {
            options
        };
        // SAFETY: the application's arguments, with `o` its options (plus `WNOHANG`).
        let r = unsafe { crate::real::wait4(pid, status, o, ru) };
        (!(nohang && r == 0)).then_some(r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn waitid(
    idtype: libc::idtype_t,
    id: libc::id_t,
    info: *mut libc::siginfo_t,
    options: c_int,
) -> c_int {
    let pid = if idtype == libc::P_PID {
        libc::pid_t::try_from(id).unwrap_or(-1)
    } else {
        -1
    };
    lifecycle::wait_child(pid, lifecycle::WaitOptions::Id(options), |nohang| {
        if !nohang {
            // SAFETY: the application's arguments, passed on unchanged.
            return Some(unsafe { crate::real::waitid(idtype, id, info, options) });
        }
        // A `WNOHANG` call that found no child leaves `si_pid` 0 (POSIX: zero it first to
        // tell); into our own record when the application gave none.
        // SAFETY: siginfo_t is plain data.
        let mut own: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let to = if info.is_null() {
            &mut own as *mut _
        } else {
            info
        };
        // SAFETY: `to` is the application's record (valid by its contract) or ours.
        unsafe { std::ptr::write_bytes(to, 0, 1) };
        // SAFETY: as above, the options plus `WNOHANG`.
        let r = unsafe { crate::real::waitid(idtype, id, to, options | libc::WNOHANG) };
        // SAFETY: `to` was written by the kernel (or zeroed above).
        (r != 0 || unsafe { (*to).si_pid() } != 0).then_some(r)
    })
}

#[no_mangle]
pub unsafe extern "C" fn sigsuspend(mask: *const libc::sigset_t) -> c_int {
    lifecycle::suspend_answering(mask).unwrap_or_else(|| {
        // SAFETY: the application's argument, passed on unchanged.
        unsafe { crate::real::sigsuspend(mask) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn pause() -> c_int {
    lifecycle::suspend_answering(std::ptr::null()).unwrap_or_else(|| {
        // SAFETY: no arguments.
        unsafe { crate::real::pause() }
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    n: size_t,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sendfile` has the contract of
    // libc's `sendfile`.
    unsafe { ops::sendfile(out, inp, off, n) }
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    inp: c_int,
    off: *mut libc::off_t,
    n: size_t,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sendfile` has the contract of
    // libc's `sendfile64`.
    unsafe { ops::sendfile(out, inp, off, n) }
}

#[no_mangle]
pub unsafe extern "C" fn splice(
    fin: c_int,
    offin: *mut libc::loff_t,
    fout: c_int,
    offout: *mut libc::loff_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::splice` has the contract of
    // libc's `splice`.
    unsafe { ops::splice(fin, offin, fout, offout, n, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::setsockopt` has the contract
    // of libc's `setsockopt`.
    unsafe { ops::setsockopt(fd, level, name, val, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::getsockopt` has the contract
    // of libc's `getsockopt`.
    unsafe { ops::getsockopt(fd, level, name, val, len) }
}

#[no_mangle]
pub unsafe extern "C" fn getpeername(
    fd: c_int,
    addr: *mut libc::sockaddr,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::getpeername` has the
    // contract of libc's `getpeername`.
    unsafe { ops::getpeername(fd, addr, len) }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::sigaction` has the contract
    // of libc's `sigaction`.
    unsafe { ops::sigaction(sig, act, old) }
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the application's arguments, passed on unchanged: `ops::signal` has the contract of
    // libc's `signal`.
    unsafe { ops::signal(sig, h) }
}

macro_rules! signal_like {
    ($($name:ident),*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
                // SAFETY: the application's arguments, passed on unchanged: `ops::signal_like`
                // has the contract of libc's function of this name, which it calls.
                unsafe { ops::signal_like(sig, h, |s, h| crate::real::$name(s, h)) }
            }
        )*
    };
}

signal_like!(sysv_signal, __sysv_signal, bsd_signal, sigset);

// ---------------------------------------------------------------------------------------------
// exec: listeners stop announcing SMC across it (see `lifecycle`)

use crate::lifecycle;
use libc::c_char;

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::execve` has the
    // contract of libc's `execve`.
    unsafe { lifecycle::execve(path, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::execv` has the contract
    // of libc's `execv`.
    unsafe { lifecycle::execv(path, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::execvp` has the
    // contract of libc's `execvp`.
    unsafe { lifecycle::execvp(file, argv) }
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::execvpe` has the
    // contract of libc's `execvpe`.
    unsafe { lifecycle::execvpe(file, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::fexecve` has the
    // contract of libc's `fexecve`.
    unsafe { lifecycle::fexecve(fd, argv, envp) }
}

#[no_mangle]
pub unsafe extern "C" fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::execveat` has the
    // contract of libc's `execveat`.
    unsafe { lifecycle::execveat(dirfd, path, argv, envp, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::posix_spawn` has the
    // contract of libc's `posix_spawn`.
    unsafe { lifecycle::posix_spawn(pid, path, fa, at, argv, envp, false) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::posix_spawn` has the
    // contract of libc's `posix_spawnp`.
    unsafe { lifecycle::posix_spawn(pid, file, fa, at, argv, envp, true) }
}

#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    // SAFETY: the application's argument, passed on unchanged: `lifecycle::system` has the
    // contract of libc's `system`.
    unsafe { lifecycle::system(cmd) }
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::popen` has the
    // contract of libc's `popen`.
    unsafe { lifecycle::popen(cmd, mode) }
}

// ---------------------------------------------------------------------------------------------
// closes we would not see otherwise, and the calls that hand out fd numbers (a slot still
// holding an object at a new number is stale: see `ops::fd_created`)

#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    // SAFETY: the application's arguments, passed on unchanged: `ops::syscall` has the
    // contract of libc's `syscall`.
    unsafe { ops::syscall(n, a1, a2, a3, a4, a5, a6) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged:
    // `lifecycle::posix_spawn_file_actions_adddup2` has the contract of libc's.
    unsafe { lifecycle::posix_spawn_file_actions_adddup2(fa, fd, newfd) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    // SAFETY: the application's arguments, passed on unchanged: `lifecycle::fdopen` has the
    // contract of libc's `fdopen`.
    unsafe { lifecycle::fdopen(fd, mode) }
}

// POSIX aio: the requests that read or write; `aio_error`, `aio_return`, `aio_suspend`,
// `aio_cancel` and `aio_fsync` move no bytes of the stream and are not interposed. The 64
// forms take `struct aiocb64`, whose first fields (all we read) are those of `struct aiocb`.

#[no_mangle]
pub unsafe extern "C" fn aio_read(cb: *mut libc::aiocb) -> c_int {
    // SAFETY: the application's control block, as libc's `aio_read` takes it.
    unsafe {
        lifecycle::aio_takes(cb.cast());
        crate::real::aio_read(cb)
    }
}

#[no_mangle]
pub unsafe extern "C" fn aio_read64(cb: *mut libc::aiocb) -> c_int {
    // SAFETY: as above (`aio_read64`).
    unsafe {
        lifecycle::aio_takes(cb.cast());
        crate::real::aio_read64(cb)
    }
}

#[no_mangle]
pub unsafe extern "C" fn aio_write(cb: *mut libc::aiocb) -> c_int {
    // SAFETY: as above (`aio_write`).
    unsafe {
        lifecycle::aio_takes(cb.cast());
        crate::real::aio_write(cb)
    }
}

#[no_mangle]
pub unsafe extern "C" fn aio_write64(cb: *mut libc::aiocb) -> c_int {
    // SAFETY: as above (`aio_write64`).
    unsafe {
        lifecycle::aio_takes(cb.cast());
        crate::real::aio_write64(cb)
    }
}

#[no_mangle]
pub unsafe extern "C" fn lio_listio(
    mode: c_int,
    list: *const *mut libc::aiocb,
    n: c_int,
    sev: *mut libc::sigevent,
) -> c_int {
    // SAFETY: the application's list of `n` control blocks, as libc's `lio_listio` takes it.
    unsafe {
        lifecycle::lio_takes(list.cast(), n);
        crate::real::lio_listio(mode, list, n, sev)
    }
}

#[no_mangle]
pub unsafe extern "C" fn lio_listio64(
    mode: c_int,
    list: *const *mut libc::aiocb,
    n: c_int,
    sev: *mut libc::sigevent,
) -> c_int {
    // SAFETY: as above (`lio_listio64`).
    unsafe {
        lifecycle::lio_takes(list.cast(), n);
        crate::real::lio_listio64(mode, list, n, sev)
    }
}

/// `_exit(2)`: the library's part of an exit without exit handlers
/// ([`crate::before_underscore_exit`]), then the process ends as glibc's `_exit` ends it
/// (`exit_group`). glibc's own `exit` and `posix_spawn` reach its internal `_exit`, not this.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    crate::before_underscore_exit();
    loop {
        // SAFETY: integer argument only; `exit_group` does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status as libc::c_long) };
    }
}

/// `_Exit(3)`: the same as [`_exit`] (glibc makes it an alias).
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: as `_exit`.
    unsafe { _exit(status) }
}

#[no_mangle]
pub unsafe extern "C" fn fclose(f: *mut libc::FILE) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged: `ops::fclose` has the
    // contract of libc's `fclose`.
    unsafe { ops::fclose(f) }
}

/// A call that returns a new fd (or -1).
macro_rules! creates_fd {
    ($( $name:ident ( $($arg:ident : $t:ty),* ) ; )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $t),*) -> c_int {
                // SAFETY: the application's arguments, passed on unchanged to libc's function of
                // the same name and signature.
                let r = unsafe { crate::real::$name($($arg),*) };
                if r >= 0 {
                    let e = crate::real::errno();
                    ops::fd_created(r);
                    crate::real::set_errno(e);
                }
                r
            }
        )*
    };
}

/// A call that fills an array of two new fds.
macro_rules! creates_fd_pair {
    ($( $name:ident ( $($arg:ident : $t:ty),* ) => $fds:ident ; )*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $t),*) -> c_int {
                // SAFETY: the application's arguments, passed on unchanged to libc's function of
                // the same name and signature.
                let r = unsafe { crate::real::$name($($arg),*) };
                if r == 0 && !$fds.is_null() {
                    let e = crate::real::errno();
                    // SAFETY: the call succeeded, so it filled both entries.
                    let (a, b) = unsafe { (*$fds, *$fds.add(1)) };
                    ops::fd_created(a);
                    ops::fd_created(b);
                    crate::real::set_errno(e);
                }
                r
            }
        )*
    };
}

creates_fd! {
    open(path: *const c_char, flags: c_int, mode: c_uint);
    open64(path: *const c_char, flags: c_int, mode: c_uint);
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint);
    openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint);
    creat(path: *const c_char, mode: libc::mode_t);
    creat64(path: *const c_char, mode: libc::mode_t);
    eventfd(init: c_uint, flags: c_int);
    timerfd_create(clock: c_int, flags: c_int);
    signalfd(fd: c_int, mask: *const libc::sigset_t, flags: c_int);
    epoll_create(size: c_int);
    epoll_create1(flags: c_int);
    memfd_create(name: *const c_char, flags: c_uint);
    inotify_init();
    inotify_init1(flags: c_int);
}

/// `pidfd_getfd(2)` (glibc 2.36): a duplicate of another process's descriptor, which that
/// process's library never saw leave (`lifecycle::fd_taken_from_another_process`).
#[no_mangle]
pub unsafe extern "C" fn pidfd_getfd(pidfd: c_int, targetfd: c_int, flags: c_uint) -> c_int {
    // SAFETY: the application's arguments, passed on unchanged to libc's function of the same
    // name and signature (or the system call where libc has none).
    let r = unsafe { crate::real::pidfd_getfd(pidfd, targetfd, flags) };
    if r >= 0 {
        let e = crate::real::errno();
        ops::fd_created(r);
        crate::real::set_errno(e);
        lifecycle::fd_taken_from_another_process(r);
    }
    r
}

creates_fd_pair! {
    pipe(fds: *mut c_int) => fds;
    pipe2(fds: *mut c_int, flags: c_int) => fds;
    socketpair(d: c_int, t: c_int, p: c_int, sv: *mut c_int) => sv;
}

// ---------------------------------------------------------------------------------------------
// dprintf, vdprintf: glibc writes their output through its internal `write`, which we would
// not see (the bytes would go into an SMC connection's TCP socket, which carries doorbells).
// Variadic, so defined in C (`interpose_variadic.c`, compiled by build.rs), which asks and
// writes through the two functions below. rustc's version script keeps the C symbols of the
// cdylib local: each libc name is exported here as a jump to its C definition (the arguments,
// registers and stack, untouched: a tail call).

/// `interpose_variadic.c` asks whether the library handles the bytes of `fd`
/// ([`ops::handles_writes`]): 1 (it formats and writes them itself) or 0 (libc's function).
#[no_mangle]
pub extern "C" fn smc_preload_fd_emulated(fd: c_int) -> c_int {
    c_int::from(ops::handles_writes(fd))
}

/// `interpose_variadic.c` writes formatted output: all `len` bytes of `buf` through our
/// `write` ([`ops::write_all`]); 0, or -1 with errno.
#[no_mangle]
pub unsafe extern "C" fn smc_preload_write_all(
    fd: c_int,
    buf: *const c_char,
    len: size_t,
) -> c_int {
    let bytes: &[u8] = if buf.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller's buffer of `len` readable bytes (the output vasprintf made), not
        // written while this call runs.
        unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) }
    };
    match ops::write_all(fd, bytes) {
        Ok(()) => 0,
        Err(e) => {
            crate::real::set_errno(e.errno());
            -1
        }
    }
}

extern "C" {
    fn smc_preload_c_dprintf();
    fn smc_preload_c_vdprintf();
    fn smc_preload_c_dprintf_chk();
    fn smc_preload_c_vdprintf_chk();
    fn smc_preload_c_execl();
    fn smc_preload_c_execlp();
    fn smc_preload_c_execle();
}

/// Exports `$name` as a jump to the C function `$target` of the same signature (never called
/// from Rust: the empty parameter list only names the symbol).
#[cfg(target_arch = "x86_64")]
macro_rules! jump_to_c {
    ($($name:ident => $target:ident;)*) => {
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!("jmp {f}", f = sym $target)
            }
        )*
    };
}

#[cfg(target_arch = "aarch64")]
macro_rules! jump_to_c {
    ($($name:ident => $target:ident;)*) => {
        $(
            #[unsafe(naked)]
            #[no_mangle]
            pub unsafe extern "C" fn $name() {
                core::arch::naked_asm!("b {f}", f = sym $target)
            }
        )*
    };
}

/// Elsewhere the four stay libc's (glibc's behaviour on an SMC fd: the connection resets).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
macro_rules! jump_to_c {
    ($($name:ident => $target:ident;)*) => {};
}

jump_to_c! {
    dprintf => smc_preload_c_dprintf;
    vdprintf => smc_preload_c_vdprintf;
    __dprintf_chk => smc_preload_c_dprintf_chk;
    __vdprintf_chk => smc_preload_c_vdprintf_chk;
    execl => smc_preload_c_execl;
    execlp => smc_preload_c_execlp;
    execle => smc_preload_c_execle;
}
