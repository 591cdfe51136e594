//! Leaves any layer may use: the real libc functions ([`real`]), `SMC_DEBUG` lines ([`log`]),
//! the environment knobs read once at load ([`config`]), who holds the other end of a Unix socket
//! ([`unix_peer`]), the descriptor our I/O on a socket goes
//! through ([`io_path`]), fork-safe globals ([`forklock`]), the allocator that keeps the program's signal handlers off `malloc` ([`handler_alloc`]), which signals interrupt a blocking call ([`signals`]), the calls a `siglongjmp` left ([`unwound`]), the
//! cached pid ([`pid`]), a socket write that must go out whole before a deadline ([`send_all`]),
//! small `/proc` files read without allocating ([`read_small`], [`one_thread`]).

pub mod config;
pub mod forklock;
pub mod handler_alloc;
pub mod io_path;
pub mod log;
pub mod real;
pub mod signals;
pub mod unix_peer;
pub mod unwound;

use std::sync::atomic::{AtomicU32, Ordering};

pub(crate) static PID: AtomicU32 = AtomicU32::new(0);

/// Our pid (cached; reset in the child after fork).
pub fn pid() -> u32 {
    let p = PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: plain syscall.
    let p = unsafe { libc::getpid() } as u32;
    PID.store(p, Ordering::Relaxed);
    p
}

/// Cache our own pid again (child after fork). It is stored at once rather than forgotten: a
/// `vfork` child shares this memory, and [`crate::lifecycle::in_vfork_child`] tells it apart by
/// comparing its pid with the cached one, so the cache must never be filled lazily by a child.
pub fn reset_pid() {
    // SAFETY: plain syscall.
    PID.store(unsafe { libc::getpid() } as u32, Ordering::Relaxed);
}

/// Socket cookie of `fd` (errno preserved).
pub fn sock_cookie(fd: libc::c_int) -> Option<u64> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_COOKIE,
            &mut v as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    };
    real::set_errno(e0);
    (r == 0).then_some(v)
}

/// Sends all of `b` on the socket `fd` (non-blocking sends, `poll` for room in between, no
/// SIGPIPE) before `deadline`: a CLC message, or the bytes of a switch to TCP. False on an
/// error or at the deadline. errno is preserved.
pub fn send_all(fd: i32, b: &[u8], deadline: std::time::Instant) -> bool {
    send_all_io(&io_path::IoPath::new(), fd, b, deadline)
}

/// [`send_all`] through `io` ([`io_path::IoPath`]): each send on the descriptor our I/O goes
/// through at that moment, each wait for room at most 100 ms before it is looked up again.
pub fn send_all_io(io: &io_path::IoPath, fd: i32, b: &[u8], deadline: std::time::Instant) -> bool {
    send_all_with(io, fd, b, deadline, None)
}

/// [`send_all`] that, while it waits for room, calls `reader` with the socket whenever it is
/// readable (until `reader` returns false): the bytes of a switch to TCP sent again, while the
/// peer's program may be writing back what it reads.
pub fn send_all_reading(
    fd: i32,
    b: &[u8],
    deadline: std::time::Instant,
    reader: Option<&mut dyn FnMut(i32) -> bool>,
) -> bool {
    send_all_with(&io_path::IoPath::new(), fd, b, deadline, reader)
}

fn send_all_with(
    io: &io_path::IoPath,
    fd: i32,
    mut b: &[u8],
    deadline: std::time::Instant,
    mut reader: Option<&mut dyn FnMut(i32) -> bool>,
) -> bool {
    let e0 = real::errno();
    let ok = loop {
        if b.is_empty() {
            break true;
        }
        let r = io.with(fd, |fd| {
            // SAFETY: valid buffer of its length.
            unsafe {
                real::send(
                    fd,
                    b.as_ptr() as *const libc::c_void,
                    b.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            }
        });
        if r > 0 {
            b = b.get(r as usize..).unwrap_or_default();
            continue;
        }
        let e = real::errno();
        if r < 0 && e == libc::EINTR {
            continue;
        }
        if r < 0 && e == libc::EAGAIN {
            let now = std::time::Instant::now();
            if now >= deadline {
                crate::debug!("fd {fd}: send: no room before the deadline");
                break false;
            }
            let mut p = libc::pollfd {
                fd: io.now(fd),
                events: libc::POLLOUT | if reader.is_some() { libc::POLLIN } else { 0 },
                revents: 0,
            };
            let ms = (deadline - now).as_millis().clamp(1, 100) as i32;
            // SAFETY: one pollfd.
            unsafe { real::poll(&mut p, 1, ms) };
            if p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                if let Some(r) = reader.as_mut() {
                    if !r(p.fd) {
                        reader = None;
                    }
                }
            }
            continue;
        }
        crate::debug!("fd {fd}: send failed: {r}, errno {e}");
        break false;
    };
    real::set_errno(e0);
    ok
}

/// A private TCP connection over 127.0.0.1 (a listener on an ephemeral port, closed once
/// connected): `(reader, writer)`, both close-on-exec, the writer non-blocking; the reader's
/// receive buffer and the writer's send buffer asked for `room` bytes each (as far as the
/// host's limits allow). `None` when any step fails (nothing is left open).
pub fn loopback_pair(room: usize) -> Option<(i32, i32)> {
    let e0 = real::errno();
    let r = loopback_pair_steps(room);
    real::set_errno(e0);
    r
}

fn loopback_pair_steps(room: usize) -> Option<(i32, i32)> {
    struct Fd(i32);
    impl Drop for Fd {
        fn drop(&mut self) {
            if self.0 >= 0 {
                // SAFETY: our own descriptor.
                unsafe { real::close(self.0) };
            }
        }
    }
    let sock = || {
        // SAFETY: plain system call.
        let fd = unsafe { real::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        (fd >= 0).then_some(Fd(fd))
    };
    let room = i32::try_from(room.saturating_add(64 << 10)).unwrap_or(i32::MAX);
    let l = sock()?;
    // SAFETY: sockaddr_in is plain data.
    let mut a: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    a.sin_family = libc::AF_INET as libc::sa_family_t;
    a.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let pa = std::ptr::from_mut(&mut a).cast::<libc::sockaddr>();
    // SAFETY: `a` is a valid sockaddr_in of `len` bytes, written back by getsockname.
    let ok = unsafe {
        libc::bind(l.0, pa, len) == 0
            && real::listen(l.0, 8) == 0
            && libc::getsockname(l.0, pa, &mut len) == 0
    };
    if !ok {
        return None;
    }
    let rd = sock()?;
    set_buffer(rd.0, libc::SO_RCVBUFFORCE, libc::SO_RCVBUF, room);
    // Any local process may connect to the listener between its `listen` and our `connect`,
    // and fill its queue so that our SYN is dropped (red team rt15 `rt15_steal.c` FILL: a
    // blocking connect held the exec 134 s): the connect and the accept have a deadline, and a
    // connection that is not ours is closed and skipped.
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(LOOPBACK_PAIR_WAIT_MS);
    set_nonblock(rd.0, true);
    set_nonblock(l.0, true);
    // SAFETY: as above (the listener's address).
    if unsafe { real::connect(rd.0, pa, len) } != 0
        && (real::errno() != libc::EINPROGRESS || !connected_by(rd.0, deadline))
    {
        return None;
    }
    set_nonblock(rd.0, false);
    let mut wr = None;
    for _ in 0..8 {
        if !wait_until(l.0, libc::POLLIN, deadline) {
            return None;
        }
        // SAFETY: plain system call; no address wanted.
        let a = unsafe {
            real::accept4(
                l.0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            )
        };
        if a < 0 {
            continue;
        }
        let a = Fd(a);
        // The connection accepted must be ours: its peer's address is our reader's own.
        if same_name(rd.0, a.0) {
            wr = Some(a);
            break;
        }
    }
    let wr = wr?;
    set_buffer(wr.0, libc::SO_SNDBUFFORCE, libc::SO_SNDBUF, room);
    let r = (rd.0, wr.0);
    std::mem::forget(rd);
    std::mem::forget(wr);
    Some(r)
}

/// How long [`loopback_pair`] waits for its own connection (on loopback it is there at once
/// unless another process fills the listener's queue).
const LOOPBACK_PAIR_WAIT_MS: u64 = 200;

/// `O_NONBLOCK` on or off for our own descriptor.
fn set_nonblock(fd: i32, on: bool) {
    // SAFETY: plain system calls on our own descriptor.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let fl = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            real::fcntl(fd, libc::F_SETFL, fl as libc::c_ulong);
        }
    }
}

/// Waits until `fd` reports `ev` or `deadline` passes; whether it did.
fn wait_until(fd: i32, ev: i16, deadline: std::time::Instant) -> bool {
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut p = libc::pollfd {
            fd,
            events: ev,
            revents: 0,
        };
        let ms = i32::try_from(left.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let r = unsafe { real::poll(&mut p, 1, ms) };
        if r > 0 {
            return p.revents & (ev | libc::POLLERR | libc::POLLHUP) != 0;
        }
        if r == 0 || (r < 0 && real::errno() != libc::EINTR) || left.is_zero() {
            return false;
        }
    }
}

/// A non-blocking connect under way on `fd` completed before `deadline`, without error.
fn connected_by(fd: i32, deadline: std::time::Instant) -> bool {
    wait_until(fd, libc::POLLOUT, deadline)
        && crate::util::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR) == Some(0)
}

/// Whether `rd`'s own address (getsockname) is `wr`'s peer's (getpeername), IPv4.
fn same_name(rd: i32, wr: i32) -> bool {
    // SAFETY: sockaddr_in is plain data.
    let (mut a, mut b): (libc::sockaddr_in, libc::sockaddr_in) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    let mut la = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let mut lb = la;
    // SAFETY: valid sockaddr_in buffers of the lengths given.
    let ok = unsafe {
        libc::getsockname(rd, std::ptr::from_mut(&mut a).cast(), &mut la) == 0
            && real::getpeername(wr, std::ptr::from_mut(&mut b).cast(), &mut lb) == 0
    };
    ok && a.sin_family == b.sin_family
        && a.sin_port == b.sin_port
        && a.sin_addr.s_addr == b.sin_addr.s_addr
}

/// A socket buffer of `v` bytes: beyond `net.core.[rw]mem_max` where the process may
/// (`CAP_NET_ADMIN`: `force`), else as far as that limit allows (`plain`).
fn set_buffer(fd: i32, force: i32, plain: i32, v: libc::c_int) {
    // SAFETY: a valid int and its length.
    let r = unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            force,
            (&v as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        set_sockopt_int(fd, libc::SOL_SOCKET, plain, v);
    }
}

/// Sets an `int` socket option of `fd` (`setsockopt` at `level`); errno preserved (a failure
/// changes nothing the caller relies on).
pub fn set_sockopt_int(fd: i32, level: i32, name: i32, v: libc::c_int) {
    let e0 = real::errno();
    // SAFETY: a valid int and its length.
    unsafe {
        real::setsockopt(
            fd,
            level,
            name,
            (&v as *const libc::c_int).cast::<libc::c_void>(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    real::set_errno(e0);
}

/// `SO_LINGER {1, 0}`: the close (or shutdown) of `fd` sends a reset. errno preserved.
pub fn set_linger_reset(fd: i32) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    let e0 = real::errno();
    // SAFETY: valid option buffer and its length.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast::<libc::c_void>(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    real::set_errno(e0);
}

/// Whether `fd`'s open file is non-blocking (`O_NONBLOCK`). errno is kept.
pub fn nonblocking(fd: i32) -> bool {
    let e0 = real::errno();
    // SAFETY: plain system call; F_GETFL has no argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    real::set_errno(e0);
    fl >= 0 && fl & libc::O_NONBLOCK != 0
}

/// `TCP_INFO` of the TCP socket `fd`; `None` when it fails. errno is kept.
pub fn tcp_info(fd: i32) -> Option<libc::tcp_info> {
    let e0 = real::errno();
    // SAFETY: `tcp_info` is plain old data; all zeroes is a valid value.
    let mut ti: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a valid out buffer and its length.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            std::ptr::from_mut(&mut ti).cast::<libc::c_void>(),
            &mut len,
        )
    };
    real::set_errno(e0);
    (r == 0).then_some(ti)
}

/// The TCP state of `fd` (`tcpi_state`, `include/net/tcp_states.h`), asking only for the first
/// bytes of `tcp_info` (the kernel copies as much as asked for); `None` when it fails. errno is
/// kept.
pub fn tcp_state(fd: i32) -> Option<u8> {
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast::<libc::c_void>(),
            &mut len,
        )
    };
    real::set_errno(e0);
    (r == 0 && len >= 1).then_some(info[0])
}

/// An `int` socket option of `fd` (`getsockopt` at `level`); `None` when it fails (errno as
/// `getsockopt` left it).
pub fn sockopt_int(fd: i32, level: i32, name: i32) -> Option<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        real::getsockopt(
            fd,
            level,
            name,
            (&mut v as *mut libc::c_int).cast::<libc::c_void>(),
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// Set once a socket of this process had `SO_PEEK_OFF` turned on by the application (see
/// [`recv_peek_head`]).
static PEEK_OFF_SEEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The application set `SO_PEEK_OFF` to `v` on one of its sockets.
pub fn note_peek_off(v: libc::c_int) {
    if v >= 0 {
        PEEK_OFF_SEEN.store(true, Ordering::Relaxed);
    }
}

/// The application's `SO_PEEK_OFF` of `fd` when it is on (never asked in a process that did not
/// turn it on anywhere).
pub fn peek_off_of(fd: i32) -> Option<libc::c_int> {
    if !PEEK_OFF_SEEN.load(Ordering::Relaxed) {
        return None;
    }
    let e0 = real::errno();
    let v = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF).filter(|&v| v >= 0);
    real::set_errno(e0);
    v
}

/// A `recv` with `MSG_PEEK` in `flags` that looks at the head of the socket's stream, as the
/// library's own peeks must (a CLC message, the head of a fallback's stream), and leaves the
/// application's `SO_PEEK_OFF` where it was: with the option on, the kernel starts a peek at
/// the offset and moves it past what was peeked. Only a process that turned the option on pays
/// the two extra `setsockopt`s and one `getsockopt`.
///
/// # Safety
/// `buf` is valid for writes of `len` bytes.
pub unsafe fn recv_peek_head(
    fd: i32,
    buf: *mut libc::c_void,
    len: usize,
    flags: libc::c_int,
) -> isize {
    let off = peek_off_of(fd);
    if off.is_some() {
        set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, -1);
    }
    // SAFETY: the caller's buffer.
    let r = unsafe { real::recv(fd, buf, len, flags) };
    if let Some(v) = off {
        // errno of the peek kept (`set_sockopt_int` preserves it).
        set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PEEK_OFF, v);
    }
    r
}

/// Reads `path` (a small `/proc` file) into `buf` with one `read`, without allocating (callers
/// may run in a signal handler or a `vfork` child): the bytes read, `None` when unreadable.
pub fn read_small<'a>(path: &std::ffi::CStr, buf: &'a mut [u8]) -> Option<&'a [u8]> {
    // SAFETY: a NUL-terminated path; our descriptor, closed below.
    let fd = unsafe { real::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `buf` is writable for its length; `fd` is ours.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    buf.get(..usize::try_from(n).ok()?)
}

/// Whether this process has one thread: field 20 of `/proc/self/stat` (false when
/// unreadable), without allocating.
pub fn one_thread() -> bool {
    let mut buf = [0u8; 1024];
    let Some(line) = read_small(c"/proc/self/stat", &mut buf) else {
        return false;
    };
    // The fields after the command name (which may hold spaces and parentheses): the state is
    // field 3, the number of threads field 20.
    let Some(close) = line.iter().rposition(|&b| b == b')') else {
        return false;
    };
    line.get(close + 1..)
        .and_then(|rest| {
            rest.split(|&b| b == b' ')
                .filter(|f| !f.is_empty())
                .nth(20 - 3)
        })
        .is_some_and(|f| f == b"1")
}
