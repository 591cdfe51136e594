//! The real libc functions, found with `dlsym(RTLD_NEXT, ..)` on first use and cached.
//!
//! Inside this library every libc call on a socket must go through here: a plain `libc::read`
//! from a preloaded library resolves to our own exported `read` and would recurse.

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, msghdr, nfds_t, off_t, pollfd,
    sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::atomic::{AtomicUsize, Ordering};

fn resolve(name: &'static [u8]) -> usize {
    // SAFETY: `name` is NUL-terminated; dlsym is thread-safe.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const libc::c_char) };
    if !p.is_null() {
        return p as usize;
    }
    // RTLD_NEXT finds nothing only when no object after this library defines the symbol: in
    // practice a libc older than the function (`memfd_create`: glibc 2.27; `close_range`,
    // `execveat`: 2.34; `epoll_pwait2`: 2.35), called by the library itself (`shm` creates
    // memfds) or by a program that found our export. (A `dlopen`ed copy of this library finds
    // libc through RTLD_NEXT too: libc is its dependency.) Those four are system calls with
    // the same arguments: a shim makes the call itself. Any other: the default search order
    // finds the main program's definition if it has one; our own export (this library is
    // preloaded) would recurse until the stack overflows, so that, or nothing, aborts with a
    // message.
    if let Some(shim) = syscall_shim(name) {
        return shim;
    }
    // SAFETY: `name` is NUL-terminated; dlsym is thread-safe.
    let p2 = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr() as *const libc::c_char) };
    if p2.is_null() || is_ours(p2) {
        let msg = b"smc-preload: cannot resolve a libc symbol (libc too old?)\n";
        // SAFETY: a valid buffer, through libc's `syscall` (always resolvable).
        unsafe {
            syscall(
                libc::SYS_write,
                2,
                msg.as_ptr() as libc::c_long,
                msg.len() as libc::c_long,
                0,
                0,
                0,
            )
        };
        // SAFETY: abort has no preconditions; nothing can be done without the libc symbol.
        unsafe { libc::abort() };
    }
    p2 as usize
}

/// Whether `p` lies in this library (our own export of a symbol).
fn is_ours(p: *mut c_void) -> bool {
    // SAFETY: zeroed Dl_info is valid output space; dladdr only reads the loader's tables.
    let (mut a, mut b): (libc::Dl_info, libc::Dl_info) = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `resolve` is a function of this library.
    unsafe {
        libc::dladdr(p, &mut a) != 0
            && libc::dladdr(resolve as *const c_void, &mut b) != 0
            && a.dli_fbase == b.dli_fbase
    }
}

/// The system-call shim for a function a too-old libc lacks (see [`resolve`]).
fn syscall_shim(name: &[u8]) -> Option<usize> {
    extern "C" fn memfd_create_sys(name: *const libc::c_char, flags: c_uint) -> c_int {
        // SAFETY: the caller's arguments, as the system call takes them.
        unsafe {
            syscall(
                libc::SYS_memfd_create,
                name as libc::c_long,
                flags as libc::c_long,
                0,
                0,
                0,
                0,
            ) as c_int
        }
    }
    extern "C" fn close_range_sys(first: c_uint, last: c_uint, flags: c_int) -> c_int {
        // SAFETY: as above.
        unsafe {
            syscall(
                libc::SYS_close_range,
                first as libc::c_long,
                last as libc::c_long,
                flags as libc::c_long,
                0,
                0,
                0,
            ) as c_int
        }
    }
    extern "C" fn execveat_sys(
        dirfd: c_int,
        path: *const libc::c_char,
        argv: *const *const libc::c_char,
        envp: *const *const libc::c_char,
        flags: c_int,
    ) -> c_int {
        // SAFETY: as above.
        unsafe {
            syscall(
                libc::SYS_execveat,
                dirfd as libc::c_long,
                path as libc::c_long,
                argv as libc::c_long,
                envp as libc::c_long,
                flags as libc::c_long,
                0,
            ) as c_int
        }
    }
    extern "C" fn epoll_pwait2_sys(
        ep: c_int,
        ev: *mut epoll_event,
        max: c_int,
        t: *const timespec,
        mask: *const sigset_t,
    ) -> c_int {
        // The kernel's sigsetsize argument: 8 bytes (64 signals), as glibc passes it.
        // SAFETY: as above.
        unsafe {
            syscall(
                libc::SYS_epoll_pwait2,
                ep as libc::c_long,
                ev as libc::c_long,
                max as libc::c_long,
                t as libc::c_long,
                mask as libc::c_long,
                8,
            ) as c_int
        }
    }
    extern "C" fn pidfd_getfd_sys(pidfd: c_int, targetfd: c_int, flags: c_uint) -> c_int {
        // SAFETY: as above.
        unsafe {
            syscall(
                libc::SYS_pidfd_getfd,
                pidfd as libc::c_long,
                targetfd as libc::c_long,
                flags as libc::c_long,
                0,
                0,
                0,
            ) as c_int
        }
    }
    let f: usize = match name {
        b"memfd_create\0" => memfd_create_sys as *const () as usize,
        b"close_range\0" => close_range_sys as *const () as usize,
        b"execveat\0" => execveat_sys as *const () as usize,
        b"epoll_pwait2\0" => epoll_pwait2_sys as *const () as usize,
        b"pidfd_getfd\0" => pidfd_getfd_sys as *const () as usize,
        _ => return None,
    };
    Some(f)
}

/// The address of libc's `vfork`, for the interposed `vfork`'s jump (it cannot be called from
/// a function that returns: the child would return through our frame, which the parent then
/// finds clobbered). `fork` when libc has none (POSIX lets `vfork` be `fork`).
pub fn vfork_addr() -> usize {
    static PTR: AtomicUsize = AtomicUsize::new(0);
    let mut p = PTR.load(Ordering::Relaxed);
    if p == 0 {
        // SAFETY: a NUL-terminated name; dlsym is thread-safe.
        let v = unsafe { libc::dlsym(libc::RTLD_NEXT, c"vfork".as_ptr()) };
        p = if v.is_null() {
            resolve(b"fork\0")
        } else {
            v as usize
        };
        PTR.store(p, Ordering::Relaxed);
    }
    p
}

/// The address of libc's `clone`, for the interposed `clone`'s jump (its arguments, variadic
/// ones included, must reach it as the caller passed them).
pub fn clone_addr() -> usize {
    static PTR: AtomicUsize = AtomicUsize::new(0);
    let mut p = PTR.load(Ordering::Relaxed);
    if p == 0 {
        p = resolve(b"clone\0");
        PTR.store(p, Ordering::Relaxed);
    }
    p
}

macro_rules! real_fns {
    ($( $name:ident ( $($arg:ident : $t:ty),* ) -> $ret:ty ; )*) => {
        $(
            #[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
            #[inline]
            pub unsafe fn $name($($arg: $t),*) -> $ret {
                static PTR: AtomicUsize = AtomicUsize::new(0);
                let mut p = PTR.load(Ordering::Relaxed);
                if p == 0 {
                    p = resolve(concat!(stringify!($name), "\0").as_bytes());
                    PTR.store(p, Ordering::Relaxed);
                }
                // SAFETY: the symbol has this C signature in glibc.
                let f: unsafe extern "C" fn($($t),*) -> $ret = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller passes the arguments with the meaning the libc function
                // gives them.
                unsafe { f($($arg),*) }
            }
        )*
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    unshare(flags: c_int) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t;
    preadv2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    pwritev2(fd: c_int, iov: *const iovec, cnt: c_int, off: off_t, flags: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int, t: *mut timespec) -> c_int;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, n: c_uint, flags: c_int) -> c_int;
    poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, t: *const timespec, mask: *const sigset_t) -> c_int;
    select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *mut timeval) -> c_int;
    pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, t: *const timespec, mask: *const sigset_t) -> c_int;
    epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut epoll_event) -> c_int;
    epoll_wait(ep: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(ep: c_int, ev: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    epoll_pwait2(ep: c_int, ev: *mut epoll_event, max: c_int, t: *const timespec, mask: *const sigset_t) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(fd: c_int, fd2: c_int) -> c_int;
    dup3(fd: c_int, fd2: c_int, flags: c_int) -> c_int;
    fork() -> libc::pid_t;
    sendfile(out: c_int, inp: c_int, off: *mut off_t, n: size_t) -> ssize_t;
    splice(fin: c_int, offin: *mut libc::loff_t, fout: c_int, offout: *mut libc::loff_t, n: size_t, flags: c_uint) -> ssize_t;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    __sysv_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    sigset(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    execve(path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    execv(path: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    execvp(file: *const libc::c_char, argv: *const *const libc::c_char) -> c_int;
    execvpe(file: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    fexecve(fd: c_int, argv: *const *const libc::c_char, envp: *const *const libc::c_char) -> c_int;
    execveat(dirfd: c_int, path: *const libc::c_char, argv: *const *const libc::c_char, envp: *const *const libc::c_char, flags: c_int) -> c_int;
    posix_spawn(pid: *mut libc::pid_t, path: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
    fclose(f: *mut libc::FILE) -> c_int;
    system(cmd: *const libc::c_char) -> c_int;
    popen(cmd: *const libc::c_char, mode: *const libc::c_char) -> *mut libc::FILE;
    posix_spawn_file_actions_adddup2(fa: *mut libc::posix_spawn_file_actions_t, fd: c_int, newfd: c_int) -> c_int;
    fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE;
    aio_read(cb: *mut libc::aiocb) -> c_int;
    aio_write(cb: *mut libc::aiocb) -> c_int;
    aio_read64(cb: *mut libc::aiocb) -> c_int;
    aio_write64(cb: *mut libc::aiocb) -> c_int;
    lio_listio(mode: c_int, list: *const *mut libc::aiocb, n: c_int, sev: *mut libc::sigevent) -> c_int;
    lio_listio64(mode: c_int, list: *const *mut libc::aiocb, n: c_int, sev: *mut libc::sigevent) -> c_int;
    creat(path: *const libc::c_char, mode: libc::mode_t) -> c_int;
    creat64(path: *const libc::c_char, mode: libc::mode_t) -> c_int;
    pipe(fds: *mut c_int) -> c_int;
    pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    socketpair(d: c_int, t: c_int, p: c_int, sv: *mut c_int) -> c_int;
    eventfd(init: c_uint, flags: c_int) -> c_int;
    timerfd_create(clock: c_int, flags: c_int) -> c_int;
    signalfd(fd: c_int, mask: *const sigset_t, flags: c_int) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    memfd_create(name: *const libc::c_char, flags: c_uint) -> c_int;
    pidfd_getfd(pidfd: c_int, targetfd: c_int, flags: c_uint) -> c_int;
    inotify_init() -> c_int;
    inotify_init1(flags: c_int) -> c_int;
    waitpid(pid: libc::pid_t, status: *mut c_int, options: c_int) -> libc::pid_t;
    wait4(pid: libc::pid_t, status: *mut c_int, options: c_int, ru: *mut libc::rusage) -> libc::pid_t;
    waitid(idtype: libc::idtype_t, id: libc::id_t, info: *mut libc::siginfo_t, options: c_int) -> c_int;
    sigsuspend(mask: *const sigset_t) -> c_int;
    pause() -> c_int;
    posix_spawnp(pid: *mut libc::pid_t, file: *const libc::c_char, fa: *const libc::posix_spawn_file_actions_t, at: *const libc::posix_spawnattr_t, argv: *const *mut libc::c_char, envp: *const *mut libc::c_char) -> c_int;
}

/// `fcntl` and `ioctl` are variadic; their third argument is an integer or a pointer, passed in
/// the same register either way on the ABIs we build for.
#[allow(clippy::missing_safety_doc)]
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    static PTR: AtomicUsize = AtomicUsize::new(0);
    let mut p = PTR.load(Ordering::Relaxed);
    if p == 0 {
        p = resolve(b"fcntl\0");
        PTR.store(p, Ordering::Relaxed);
    }
    // SAFETY: `p` is the non-null address of libc's `fcntl` (resolve aborts otherwise), which has
    // this variadic C signature.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(p) };
    // SAFETY: the caller passes the arguments with the meaning fcntl(2) gives them.
    unsafe { f(fd, cmd, arg) }
}

#[allow(clippy::missing_safety_doc)]
pub unsafe fn ioctl(fd: c_int, req: c_ulong, arg: c_ulong) -> c_int {
    static PTR: AtomicUsize = AtomicUsize::new(0);
    let mut p = PTR.load(Ordering::Relaxed);
    if p == 0 {
        p = resolve(b"ioctl\0");
        PTR.store(p, Ordering::Relaxed);
    }
    // SAFETY: `p` is the non-null address of libc's `ioctl` (resolve aborts otherwise), which has
    // this variadic C signature.
    let f: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int = unsafe { std::mem::transmute(p) };
    // SAFETY: the caller passes the arguments with the meaning ioctl(2) gives them.
    unsafe { f(fd, req, arg) }
}

/// `open`/`openat` are variadic: the mode is read only with `O_CREAT`/`O_TMPFILE`, and passed on
/// in the same register either way.
macro_rules! real_open {
    ($( $name:ident ( $($arg:ident : $t:ty),* ) ; )*) => {
        $(
            #[allow(clippy::missing_safety_doc)]
            pub unsafe fn $name($($arg: $t),*) -> c_int {
                static PTR: AtomicUsize = AtomicUsize::new(0);
                let mut p = PTR.load(Ordering::Relaxed);
                if p == 0 {
                    p = resolve(concat!(stringify!($name), "\0").as_bytes());
                    PTR.store(p, Ordering::Relaxed);
                }
                // SAFETY: the symbol is glibc's variadic function of this name.
                let f: unsafe extern "C" fn($($t),*, ...) -> c_int = unsafe { std::mem::transmute(p) };
                real_open!(@call f, $($arg),*)
            }
        )*
    };
    (@call $f:ident, $first:ident, $($rest:ident),*) => {
        // SAFETY: the caller's arguments.
        unsafe { $f($first, $($rest),*) }
    };
}

real_open! {
    open(path: *const libc::c_char, flags: c_int, mode: c_uint);
    open64(path: *const libc::c_char, flags: c_int, mode: c_uint);
    openat(dirfd: c_int, path: *const libc::c_char, flags: c_int, mode: c_uint);
    openat64(dirfd: c_int, path: *const libc::c_char, flags: c_int, mode: c_uint);
}

/// `syscall(2)` is variadic; six arguments are what the kernel takes (extra ones are ignored).
#[allow(clippy::missing_safety_doc, clippy::too_many_arguments)]
pub unsafe fn syscall(
    n: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    static PTR: AtomicUsize = AtomicUsize::new(0);
    let mut p = PTR.load(Ordering::Relaxed);
    if p == 0 {
        p = resolve(b"syscall\0");
        PTR.store(p, Ordering::Relaxed);
    }
    // SAFETY: glibc's `syscall` has this (variadic) C signature.
    let f: unsafe extern "C" fn(libc::c_long, ...) -> libc::c_long =
        unsafe { std::mem::transmute(p) };
    // SAFETY: the caller's arguments.
    unsafe { f(n, a1, a2, a3, a4, a5, a6) }
}

/// errno of the calling thread.
pub fn errno() -> c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { *libc::__errno_location() }
}

/// Set errno of the calling thread.
pub fn set_errno(e: c_int) {
    // SAFETY: always valid for the calling thread.
    unsafe { *libc::__errno_location() = e }
}

/// `SIOCATMARK` (`asm-generic/sockios.h`; the libc crate does not define it).
pub const SIOCATMARK: libc::c_ulong = 0x8905;

#[cfg(test)]
mod tests {
    use super::*;

    /// The shims make the system call themselves: a memfd and an epoll_pwait2 through them
    /// work as libc's would (what a libc older than the functions gets).
    #[test]
    fn syscall_shims_work_and_our_own_symbols_are_told_apart() {
        let p = syscall_shim(b"memfd_create\0").expect("a shim");
        // SAFETY: the shim has memfd_create's C signature.
        let f: unsafe extern "C" fn(*const libc::c_char, c_uint) -> c_int =
            unsafe { std::mem::transmute(p) };
        // SAFETY: a NUL-terminated name.
        let fd = unsafe { f(c"shim-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0, "memfd_create through the shim: {}", errno());
        let p = syscall_shim(b"epoll_pwait2\0").expect("a shim");
        // SAFETY: the shim has epoll_pwait2's C signature.
        let w: unsafe extern "C" fn(
            c_int,
            *mut epoll_event,
            c_int,
            *const timespec,
            *const sigset_t,
        ) -> c_int = unsafe { std::mem::transmute(p) };
        // SAFETY: plain syscall.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        let t = timespec {
            tv_sec: 0,
            tv_nsec: 1000,
        };
        let mut ev = [epoll_event { events: 0, u64: 0 }; 1];
        // SAFETY: one event, a valid timespec, no mask.
        let n = unsafe { w(ep, ev.as_mut_ptr(), 1, &t, std::ptr::null()) };
        assert_eq!(n, 0);
        // SAFETY: our fds.
        unsafe {
            libc::close(fd);
            libc::close(ep);
        }
        assert!(syscall_shim(b"read\0").is_none());
        assert!(is_ours(resolve as *const () as *mut c_void));
        assert!(!is_ours(libc::read as *const () as *mut c_void));
    }
}
