//! Scenario programs of the differential conformance suite (`tests/tests/conformance.rs`).
//!
//! ```text
//! smc-conform list         one line per scenario: NAME SMC_CONNS (client SMC-D connections the
//!                          data path must make when it runs under `smc-ctl run`)
//! smc-conform NAME         runs the scenario, prints its normalised trace
//! ```
//!
//! A scenario runs both ends itself (threads, 127.0.0.1, a listener on port 0) and prints what
//! the program observes, one line per observable: the call, its result, the errno name, a digest
//! of the bytes, poll/epoll masks, signals delivered. The harness runs the same scenario over
//! plain TCP and under the data path and compares the traces; nothing here knows which it is.
//! Waits are on conditions (readiness, a thread seen sleeping in the kernel) with generous
//! bounds; a watchdog ends a scenario that hangs with its trace so far and `WATCHDOG`.
#![allow(clippy::missing_safety_doc)]
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use libc::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

// ────────────────────────────────────────────────────────────────────────────────────────────
// trace

static TRACE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// In a forked child ([`in_child`]): the pipe its lines go to at once (it may crash).
static CHILD_PIPE: AtomicI32 = AtomicI32::new(-1);

fn log(s: impl Into<String>) {
    let s = s.into();
    let p = CHILD_PIPE.load(Ordering::Relaxed);
    if p >= 0 {
        write_all(p, format!("{s}\n").as_bytes());
        return;
    }
    TRACE.lock().unwrap_or_else(|e| e.into_inner()).push(s);
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn set_errno(e: i32) {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() = e };
}

fn ename(e: i32) -> String {
    let n = match e {
        libc::EAGAIN => "EAGAIN",
        libc::EINTR => "EINTR",
        libc::EPIPE => "EPIPE",
        libc::ECONNRESET => "ECONNRESET",
        libc::ECONNREFUSED => "ECONNREFUSED",
        libc::ECONNABORTED => "ECONNABORTED",
        libc::EINPROGRESS => "EINPROGRESS",
        libc::EALREADY => "EALREADY",
        libc::EISCONN => "EISCONN",
        libc::ENOTCONN => "ENOTCONN",
        libc::EBADF => "EBADF",
        libc::EFAULT => "EFAULT",
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::ETIMEDOUT => "ETIMEDOUT",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ESPIPE => "ESPIPE",
        libc::EMSGSIZE => "EMSGSIZE",
        libc::EEXIST => "EEXIST",
        libc::ENOENT => "ENOENT",
        libc::ENOTSOCK => "ENOTSOCK",
        libc::ENOPROTOOPT => "ENOPROTOOPT",
        libc::ELOOP => "ELOOP",
        0 => "0",
        _ => return format!("errno{e}"),
    };
    n.to_string()
}

/// Logs `what = RET` or `what = -1 ERRNO`; returns `ret` with errno preserved.
fn r(what: &str, ret: isize) -> isize {
    let e = errno();
    if ret < 0 {
        log(format!("{what} = {ret} {}", ename(e)));
    } else {
        log(format!("{what} = {ret}"));
    }
    set_errno(e);
    ret
}

fn digest(b: &[u8]) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for &x in b {
        h ^= x as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

fn mask_names(m: u32) -> String {
    const N: [(u32, &str); 12] = [
        (libc::EPOLLIN as u32, "IN"),
        (libc::EPOLLPRI as u32, "PRI"),
        (libc::EPOLLOUT as u32, "OUT"),
        (libc::EPOLLERR as u32, "ERR"),
        (libc::EPOLLHUP as u32, "HUP"),
        (libc::POLLNVAL as u32, "NVAL"),
        (libc::EPOLLRDNORM as u32, "RDNORM"),
        (libc::EPOLLRDBAND as u32, "RDBAND"),
        (libc::EPOLLWRNORM as u32, "WRNORM"),
        (libc::EPOLLWRBAND as u32, "WRBAND"),
        (libc::EPOLLMSG as u32, "MSG"),
        (libc::EPOLLRDHUP as u32, "RDHUP"),
    ];
    let mut v: Vec<&str> = N
        .iter()
        .filter(|(b, _)| m & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if v.is_empty() {
        v.push("0");
    }
    v.join("|")
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// sockets

fn sa(port: u16) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
        },
        sin_zero: [0; 8],
    }
}

const SALEN: libc::socklen_t = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;

fn tcp_socket() -> c_int {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    fd
}

/// A listener on 127.0.0.1, port chosen by the kernel.
fn listener() -> (c_int, u16) {
    let fd = tcp_socket();
    let a = sa(0);
    // SAFETY: valid address and out buffers.
    unsafe {
        assert_eq!(
            libc::bind(fd, &a as *const _ as *const libc::sockaddr, SALEN),
            0
        );
        assert_eq!(libc::listen(fd, 64), 0);
        let mut b: libc::sockaddr_in = std::mem::zeroed();
        let mut l = SALEN;
        libc::getsockname(fd, &mut b as *mut _ as *mut libc::sockaddr, &mut l);
        (fd, u16::from_be(b.sin_port))
    }
}

fn connect_to(fd: c_int, port: u16) -> c_int {
    let a = sa(port);
    // SAFETY: valid address.
    unsafe { libc::connect(fd, &a as *const _ as *const libc::sockaddr, SALEN) }
}

fn accept_fd(l: c_int) -> c_int {
    // SAFETY: no address wanted.
    unsafe { libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// A connected pair (client, server): blocking connect while a thread blocks in accept.
fn pair() -> (c_int, c_int) {
    let (l, port) = listener();
    let h = std::thread::spawn(move || accept_fd(l));
    let c = tcp_socket();
    assert_eq!(
        connect_to(c, port),
        0,
        "connect: {}",
        std::io::Error::last_os_error()
    );
    let s = h.join().expect("accept thread");
    assert!(s >= 0, "accept: {}", std::io::Error::last_os_error());
    close(l);
    (c, s)
}

/// [`pair`], with both ends' handshakes decided (one byte each way, unlogged): for scenarios
/// about a `recv` blocked on an established connection (the handshake window has scenarios of
/// its own: `dup2_over_recv_in_handshake`, `socket_reuses_number_while_recv_in_handshake`).
fn pair_settled() -> (c_int, c_int) {
    let (c, s) = pair();
    write_all(c, b"s");
    assert_eq!(read_n(s, 1), b"s");
    write_all(s, b"c");
    assert_eq!(read_n(c, 1), b"c");
    (c, s)
}

fn close(fd: c_int) -> c_int {
    // SAFETY: plain syscall.
    unsafe { libc::close(fd) }
}

fn set_nonblock(fd: c_int, on: bool) {
    // SAFETY: plain fcntl.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        let fl = if on {
            fl | libc::O_NONBLOCK
        } else {
            fl & !libc::O_NONBLOCK
        };
        libc::fcntl(fd, libc::F_SETFL, fl);
    }
}

fn wr(fd: c_int, b: &[u8]) -> isize {
    // SAFETY: valid buffer.
    unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) }
}

/// Writes all of `b` (blocking socket), unlogged.
fn write_all(fd: c_int, mut b: &[u8]) {
    while !b.is_empty() {
        let n = wr(fd, b);
        if n < 0 && errno() == libc::EAGAIN {
            poll_raw(fd, libc::POLLOUT, 5000);
            continue;
        }
        assert!(n > 0, "write: {}", std::io::Error::last_os_error());
        b = &b[n as usize..];
    }
}

/// Reads exactly `n` bytes (or until EOF), unlogged; waits for readiness when non-blocking.
fn read_n(fd: c_int, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    let mut got = 0;
    while got < n {
        // SAFETY: valid buffer.
        let k = unsafe { libc::read(fd, v[got..].as_mut_ptr().cast(), n - got) };
        if k < 0 && errno() == libc::EAGAIN {
            poll_raw(fd, libc::POLLIN, 5000);
            continue;
        }
        if k <= 0 {
            break;
        }
        got += k as usize;
    }
    v.truncate(got);
    v
}

/// Logged read of up to `n` bytes: result and digest.
fn rd(what: &str, fd: c_int, n: usize) -> isize {
    let mut v = vec![0u8; n.max(1)];
    // SAFETY: valid buffer.
    let k = unsafe { libc::read(fd, v.as_mut_ptr().cast(), n) };
    let e = errno();
    if k > 0 {
        log(format!("{what} = {k} [{}]", digest(&v[..k as usize])));
    } else {
        r(what, k);
    }
    set_errno(e);
    k
}

fn recv_l(what: &str, fd: c_int, n: usize, flags: c_int) -> isize {
    let mut v = vec![0u8; n.max(1)];
    // SAFETY: valid buffer.
    let k = unsafe { libc::recv(fd, v.as_mut_ptr().cast(), n, flags) };
    let e = errno();
    if k > 0 {
        let shown = (k as usize).min(n);
        log(format!("{what} = {k} [{}]", digest(&v[..shown])));
    } else {
        set_errno(e);
        r(what, k);
    }
    set_errno(e);
    k
}

fn poll_raw(fd: c_int, events: i16, timeout: c_int) -> (c_int, i16) {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd.
    let n = unsafe { libc::poll(&mut p, 1, timeout) };
    (n, p.revents)
}

/// Logged poll of one fd.
fn pl(what: &str, fd: c_int, events: i16, timeout: c_int) -> i16 {
    let (n, rev) = poll_raw(fd, events, timeout);
    if n < 0 {
        r(what, -1);
    } else {
        log(format!("{what} = {n} {}", mask_names(rev as u16 as u32)));
    }
    rev
}

fn getsockopt_int(fd: c_int, level: c_int, name: c_int) -> (c_int, c_int) {
    let mut v: c_int = 0;
    let mut l = 4 as libc::socklen_t;
    // SAFETY: valid out buffers.
    let rc = unsafe { libc::getsockopt(fd, level, name, &mut v as *mut c_int as *mut _, &mut l) };
    (rc, v)
}

fn so_error(what: &str, fd: c_int) {
    let (rc, v) = getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR);
    if rc != 0 {
        r(what, -1);
    } else {
        log(format!("{what} = {}", ename(v)));
    }
}

fn setsockopt_raw<T>(fd: c_int, level: c_int, name: c_int, v: &T) -> c_int {
    // SAFETY: valid option buffer.
    unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            v as *const T as *const libc::c_void,
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    }
}

fn linger0(fd: c_int) {
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    assert_eq!(setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_LINGER, &l), 0);
}

fn tv(ms: i64) -> libc::timeval {
    libc::timeval {
        tv_sec: ms / 1000,
        tv_usec: (ms % 1000) * 1000,
    }
}

fn pipe() -> (c_int, c_int) {
    let mut p = [0; 2];
    // SAFETY: valid out array.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    (p[0], p[1])
}

fn gettid() -> i32 {
    // SAFETY: plain syscall.
    unsafe { libc::gettid() }
}

/// Waits (bounded) until thread `tid` sleeps in the kernel (after it announced that it is about
/// to make a blocking call): the call is then really blocked, not about to start.
fn wait_blocked(tid: &AtomicI32) {
    wait_stat_sleeping(|| {
        let id = tid.load(Ordering::Acquire);
        (id > 0).then(|| format!("/proc/self/task/{id}/stat"))
    });
}

/// Waits (bounded) until the main thread of process `pid` (a forked child that announced that
/// it is about to make a blocking call) sleeps in the kernel.
fn wait_pid_blocked(pid: i32) {
    wait_stat_sleeping(|| Some(format!("/proc/{pid}/stat")));
}

fn wait_stat_sleeping(path: impl Fn() -> Option<String>) {
    let t = Instant::now();
    loop {
        if let Some(p) = path() {
            let st = std::fs::read_to_string(&p).unwrap_or_default();
            // state is the field after the parenthesised name
            if let Some(rest) = st.rsplit_once(") ") {
                if rest.1.starts_with('S') {
                    // Seen sleeping twice 2 ms apart: not a passing lock.
                    std::thread::sleep(Duration::from_millis(2));
                    let st2 = std::fs::read_to_string(&p).unwrap_or_default();
                    if st2.rsplit_once(") ").is_some_and(|r| r.1.starts_with('S')) {
                        return;
                    }
                }
            }
        }
        if t.elapsed() > Duration::from_secs(5) {
            log("(thread never blocked)");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// signals

static SIGPIPES: AtomicU32 = AtomicU32::new(0);
static SIGUSR1S: AtomicU32 = AtomicU32::new(0);
static SIGUSR2S: AtomicU32 = AtomicU32::new(0);
static SIGURGS: AtomicU32 = AtomicU32::new(0);

extern "C" fn on_signal(sig: c_int) {
    match sig {
        libc::SIGPIPE => SIGPIPES.fetch_add(1, Ordering::SeqCst),
        libc::SIGUSR1 => SIGUSR1S.fetch_add(1, Ordering::SeqCst),
        libc::SIGUSR2 => SIGUSR2S.fetch_add(1, Ordering::SeqCst),
        libc::SIGURG => SIGURGS.fetch_add(1, Ordering::SeqCst),
        _ => 0,
    };
}

fn handle(sig: c_int, restart: bool) {
    // SAFETY: a valid sigaction with an async-signal-safe handler.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = on_signal as *const () as usize;
        a.sa_flags = if restart { libc::SA_RESTART } else { 0 };
        libc::sigemptyset(&mut a.sa_mask);
        assert_eq!(libc::sigaction(sig, &a, std::ptr::null_mut()), 0);
    }
}

fn count_sigpipe() {
    handle(libc::SIGPIPE, true);
}

fn log_sigpipes() {
    log(format!("SIGPIPE x{}", SIGPIPES.load(Ordering::SeqCst)));
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// urgent data

/// Logged `send(fd, b, MSG_OOB)`.
fn send_oob(what: &str, fd: c_int, b: &[u8]) -> isize {
    // SAFETY: valid buffer.
    r(what, unsafe {
        libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_OOB)
    })
}

/// `SIOCATMARK` (asm-generic/sockios.h; not in the libc crate).
const SIOCATMARK: libc::c_ulong = 0x8905;

/// Logged `ioctl(SIOCATMARK)`.
fn atmark(what: &str, fd: c_int) {
    let mut v: c_int = -1;
    // SAFETY: SIOCATMARK writes one int.
    let rc = unsafe { libc::ioctl(fd, SIOCATMARK, &mut v) };
    if rc < 0 {
        r(what, -1);
    } else {
        log(format!("{what} = {v}"));
    }
}

/// Logged `ioctl(FIONREAD)`.
fn inq(what: &str, fd: c_int) {
    let mut v: c_int = -1;
    // SAFETY: FIONREAD writes one int.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut v) };
    if rc < 0 {
        r(what, -1);
    } else {
        log(format!("{what} = {v}"));
    }
}

/// `recvmsg(fd, n bytes, flags)`: the result, the bytes and `msg_flags`, errno preserved.
fn recvmsg_raw(fd: c_int, n: usize, flags: c_int) -> (isize, Vec<u8>, c_int) {
    let mut v = vec![0u8; n.max(1)];
    let mut iov = libc::iovec {
        iov_base: v.as_mut_ptr().cast(),
        iov_len: n,
    };
    // SAFETY: plain old data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_flags = 0x5a5a;
    // SAFETY: valid msghdr over a buffer of `n` bytes.
    let k = unsafe { libc::recvmsg(fd, &mut m, flags) };
    let e = errno();
    v.truncate(if k >= 0 { (k as usize).min(n) } else { 0 });
    set_errno(e);
    (k, v, m.msg_flags)
}

/// Logged `recvmsg(fd, n bytes, flags)`: result, bytes and `msg_flags`.
fn recvmsg_l(what: &str, fd: c_int, n: usize, flags: c_int) -> isize {
    let (k, v, mf) = recvmsg_raw(fd, n, flags);
    let e = errno();
    if k >= 0 {
        log(format!(
            "{what} = {k} [{}] [{}] flags {mf:#x}",
            digest(&v),
            String::from_utf8_lossy(&v),
        ));
    } else {
        r(what, k);
    }
    set_errno(e);
    k
}

/// Logged `select` of `fd` in all three sets (timeout in ms).
fn sel_ex(what: &str, fd: c_int, ms: i64) {
    // SAFETY: fd_set manipulation on local sets.
    unsafe {
        let mut rs: libc::fd_set = std::mem::zeroed();
        let mut es: libc::fd_set = std::mem::zeroed();
        libc::FD_SET(fd, &mut rs);
        libc::FD_SET(fd, &mut es);
        let mut t = tv(ms);
        let n = libc::select(fd + 1, &mut rs, std::ptr::null_mut(), &mut es, &mut t);
        if n < 0 {
            r(what, -1);
        } else {
            log(format!(
                "{what} = {n} r {} ex {}",
                libc::FD_ISSET(fd, &rs),
                libc::FD_ISSET(fd, &es)
            ));
        }
    }
}

fn count_sigurg() {
    handle(libc::SIGURG, true);
}

fn log_sigurgs() {
    log(format!("SIGURG x{}", SIGURGS.load(Ordering::SeqCst)));
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// signal-driven I/O (O_ASYNC, F_SETOWN, F_SETSIG)

static SIGIOS: AtomicU32 = AtomicU32::new(0);
static SIGIO_CODE: AtomicI32 = AtomicI32::new(0);
static SIGIO_BAND: AtomicI64 = AtomicI64::new(0);
static SIGIO_FD: AtomicI32 = AtomicI32::new(-1);

/// SA_SIGINFO handler of `SIGIO` and of the `F_SETSIG` signal: counts, and keeps the last
/// `si_code`, `si_band`, `si_fd` (the `sigpoll` member of the union, at offset 16 on 64-bit).
extern "C" fn on_sigio(_sig: c_int, si: *mut libc::siginfo_t, _u: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this signal; `_sigpoll` is { long si_band; int si_fd }
    // at the union's start (offset 16), read as plain integers whatever the signal's origin.
    unsafe {
        let p = si as *const u8;
        SIGIO_CODE.store((*si).si_code, Ordering::SeqCst);
        SIGIO_BAND.store(
            std::ptr::read_unaligned(p.add(16) as *const i64),
            Ordering::SeqCst,
        );
        SIGIO_FD.store(
            std::ptr::read_unaligned(p.add(24) as *const i32),
            Ordering::SeqCst,
        );
    }
    SIGIOS.fetch_add(1, Ordering::SeqCst);
}

/// Counts `sig` (`SIGIO` or an `F_SETSIG` signal) with [`on_sigio`].
fn count_sigio(sig: c_int) {
    // SAFETY: a valid sigaction with an async-signal-safe handler.
    unsafe {
        let mut a: libc::sigaction = std::mem::zeroed();
        a.sa_sigaction = on_sigio as *const () as usize;
        a.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
        libc::sigemptyset(&mut a.sa_mask);
        assert_eq!(libc::sigaction(sig, &a, std::ptr::null_mut()), 0);
    }
}

/// Waits (at most 5 s) until more than `from` signals were counted in `n` (process-directed:
/// delivered to some thread a moment after the event), then logs whether one came.
fn await_signal(what: &str, n: &AtomicU32, from: u32) {
    let t0 = Instant::now();
    while n.load(Ordering::SeqCst) <= from && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    let got = n.load(Ordering::SeqCst) > from;
    log(format!("{what}: {}", if got { "yes" } else { "none" }));
}

/// [`await_signal`] for [`on_sigio`], with the last signal's `si_code`, `si_band` and whether
/// `si_fd` is `fd`.
fn await_sigio_info(what: &str, from: u32, fd: c_int) {
    await_signal(what, &SIGIOS, from);
    log(format!(
        "  si_code {} si_band {} si_fd is the socket {}",
        SIGIO_CODE.load(Ordering::SeqCst),
        mask_names(SIGIO_BAND.load(Ordering::SeqCst) as u32),
        SIGIO_FD.load(Ordering::SeqCst) == fd
    ));
}

/// `fcntl` commands and the owner type the libc crate does not define (`asm-generic/fcntl.h`).
const F_SETSIG: c_int = 10;
const F_SETOWN_EX: c_int = 15;
const F_OWNER_PID: c_int = 1;

/// `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    type_: c_int,
    pid: c_int,
}

/// Logged `fcntl(fd, F_SETOWN_EX, {F_OWNER_PID, getpid()})`.
fn own_ex(what: &str, fd: c_int) {
    let own = FOwnerEx {
        type_: F_OWNER_PID,
        // SAFETY: plain syscall.
        pid: unsafe { libc::getpid() },
    };
    // SAFETY: a valid f_owner_ex.
    r(what, unsafe { libc::fcntl(fd, F_SETOWN_EX, &own) } as isize);
}

/// Logged `fcntl(fd, F_SETOWN, getpid())` and `F_SETFL | O_ASYNC`.
fn own_async(fd: c_int) {
    // SAFETY: plain fcntl calls.
    unsafe {
        r(
            "fcntl(F_SETOWN,pid)",
            libc::fcntl(fd, libc::F_SETOWN, libc::getpid()) as isize,
        );
        let fl = libc::fcntl(fd, libc::F_GETFL);
        r(
            "fcntl(F_SETFL,|O_ASYNC)",
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_ASYNC) as isize,
        );
        log(format!(
            "F_GETFL has O_ASYNC {}",
            libc::fcntl(fd, libc::F_GETFL) & libc::O_ASYNC != 0
        ));
    }
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// epoll

fn ep_create() -> c_int {
    // SAFETY: plain syscall.
    unsafe { libc::epoll_create1(0) }
}

fn ep_ctl(what: &str, ep: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> c_int {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: valid event.
    let rc = unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) };
    r(what, rc as isize) as c_int
}

/// Logged epoll_wait; `name` turns the data of an event into a name.
fn ep_wait(
    what: &str,
    ep: c_int,
    max: usize,
    timeout: c_int,
    name: &dyn Fn(u64) -> String,
) -> Vec<(u64, u32)> {
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; max.max(1)];
    // SAFETY: `max` entries.
    let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), max as c_int, timeout) };
    if n < 0 {
        r(what, -1);
        return Vec::new();
    }
    let v: Vec<(u64, u32)> = evs[..n as usize]
        .iter()
        .map(|e| (e.u64, e.events))
        .collect();
    let shown: Vec<String> = v
        .iter()
        .map(|(d, m)| format!("{}:{}", name(*d), mask_names(*m)))
        .collect();
    log(format!("{what} = {n} [{}]", shown.join(" ")));
    v
}

fn names(list: &'static [&'static str]) -> impl Fn(u64) -> String {
    move |d| {
        list.get(d as usize)
            .map(|s| s.to_string())
            .unwrap_or(format!("#{d}"))
    }
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// a forked child for calls that may crash the process

/// Runs `f` in a forked child; its trace lines come back through a pipe, followed by how the
/// child ended (`exit N` / `signal NAME`).
fn in_child(f: impl FnOnce()) {
    let (rp, wp) = pipe();
    // SAFETY: the child only runs `f` and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        close(rp);
        CHILD_PIPE.store(wp, Ordering::Relaxed);
        f();
        // SAFETY: plain exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    close(wp);
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    let out = read_n(rp, 1 << 20);
    close(rp);
    for l in String::from_utf8_lossy(&out).lines() {
        log(format!("child: {l}"));
    }
    if libc::WIFSIGNALED(st) {
        let s = libc::WTERMSIG(st);
        let n = match s {
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGABRT => "SIGABRT",
            libc::SIGBUS => "SIGBUS",
            libc::SIGPIPE => "SIGPIPE",
            _ => "other",
        };
        log(format!("child ended by {n}"));
    } else {
        log(format!("child exit {}", libc::WEXITSTATUS(st)));
    }
}

// ────────────────────────────────────────────────────────────────────────────────────────────
// scenarios

mod random;
mod scenarios;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(name) = args.get(1) else {
        eprintln!("usage: smc-conform list | smc-conform NAME");
        std::process::exit(2);
    };
    if name == "__serve_fd" {
        let n = |i: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(-1);
        scenarios::serve_inherited_fd(n(2), n(3));
        return;
    }
    if name == "list" {
        for s in scenarios::ALL {
            println!("{} {}", s.name, s.smc);
        }
        return;
    }
    let Some(s) = scenarios::ALL.iter().find(|s| s.name == name) else {
        eprintln!("unknown scenario {name}");
        std::process::exit(2);
    };
    // A failed setup step ends the scenario with its trace so far (the harness shows both).
    std::panic::set_hook(Box::new(|p| {
        log(format!("PANIC: {p}"));
        print_trace();
        // SAFETY: plain exit.
        unsafe { libc::_exit(4) };
    }));
    static DONE: AtomicBool = AtomicBool::new(false);
    if s.name.ends_with("_one_thread") {
        // The scenario is about a process with one thread: no watchdog thread, SIGALRM's
        // default action ends it instead (the harness reports the signal).
        // SAFETY: plain alarm(2).
        unsafe { libc::alarm(20) };
    } else {
        std::thread::spawn(|| {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                std::thread::sleep(Duration::from_millis(50));
                if DONE.load(Ordering::Acquire) {
                    return;
                }
            }
            log("WATCHDOG: the scenario did not finish within 20 s");
            print_trace();
            // SAFETY: plain exit.
            unsafe { libc::_exit(3) };
        });
    }
    (s.run)();
    DONE.store(true, Ordering::Release);
    print_trace();
}

fn print_trace() {
    use std::io::Write as _;
    let t = TRACE.lock().unwrap_or_else(|e| e.into_inner());
    let mut o = std::io::stdout().lock();
    for l in t.iter() {
        let _ = writeln!(o, "{l}");
    }
    let _ = o.flush();
}
