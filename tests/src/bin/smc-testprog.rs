//! Test program driven by the integration tests: TCP client/server with the SMC opt-in, byte-stream
//! integrity checks (seeded random chunk sizes, SHA-256), splice reads and a stalled reader.
//!
//! ```text
//! smc-testprog pair ADDR [--client-opt] [--server-opt]        -> "client=<flags> server=<flags>"
//! smc-testprog server ADDR [--opt-in] [--splice] [--reply N]  -> prints "PORT <p>", then "SHA <hex> <bytes>"
//! smc-testprog client ADDR:PORT BYTES SEED [--opt-in] [--max-chunk K]  -> "OK <bytes> <hex>"
//! smc-testprog stall ADDR                                      -> "QUEUED <bytes>" (reader never reads)
//! smc-testprog sink ADDR [--opt-in]        -> "PORT <p>"; accepts one connection and never reads;
//!                                             at a line on stdin: "INQ <bytes> state=<flags>/<bytes>"
//! smc-testprog flood ADDR:PORT [--opt-in] [--shortcut] [--limit N]
//!     -> "SHORTCUT <0|errno> QUEUED <bytes> state=<flags>/<bytes>": writes (non-blocking) until
//!        EAGAIN or N bytes, after `setsockopt(SMC_SO_SHORTCUT, 1)` on its own socket
//! smc-testprog duplex ROUNDS --reader block|poll|epoll --writer poll|epoll
//!     -> "OK rounds=<n>", or "STALL <who> round=<k> ..." (exit 1): see [`duplex`]
//! ```
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    env,
    io::{Read as _, Write as _},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    process::exit,
};

use sha2::{Digest as _, Sha256};
use smc_common::bpf::{sock_state, SMC_SO_ENABLE, SMC_SO_SHORTCUT, SOL_SMC_BPF};

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("smc-testprog: {msg}");
    exit(2)
}

/// Asks the eBPF programs to announce SMC for this socket. Fails (ENOPROTOOPT) outside an
/// attached cgroup; the socket then simply stays plain TCP, as the data path does.
fn opt_in(fd: i32) {
    let one: u32 = 1;
    // SAFETY: valid fd and option buffer.
    let r = unsafe {
        libc::setsockopt(
            fd,
            SOL_SMC_BPF,
            SMC_SO_ENABLE,
            (&one as *const u32).cast(),
            4,
        )
    };
    if r != 0 {
        eprintln!("smc-testprog: opt-in: {}", std::io::Error::last_os_error());
    }
}

/// `<flags>` for `pair`, and `<flags>/<bytes redirected>` in stream reports; u32::MAX when the
/// private option does not exist (no attached cgroup).
fn state(fd: i32) -> u32 {
    sock_state(fd).map(|s| s.flags).unwrap_or(u32::MAX)
}

fn state_report(fd: i32) -> String {
    match sock_state(fd) {
        Some(s) => format!("{}/{}", s.flags, s.redirected_bytes),
        None => "none".into(),
    }
}

/// A socket that opted in before listen/connect (std has no hook between socket() and connect()).
fn raw_socket(addr: &SocketAddr) -> i32 {
    let fam = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(fam, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        die("socket");
    }
    fd
}

fn sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: `sockaddr_storage` is plain integers, for which all-zero bytes are valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as u16,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in`; `ss` is a
            // live local.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as u16,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: 0,
            };
            // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in6`; `ss` is a
            // live local.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

fn listen(addr: &str, opt: bool) -> TcpListener {
    let addr: SocketAddr = addr.parse().unwrap_or_else(|e| die(format!("{addr}: {e}")));
    let fd = raw_socket(&addr);
    let one: i32 = 1;
    // SAFETY: `fd` is our socket; `one` is a live int of the length passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const i32).cast(),
            4,
        )
    };
    if opt {
        opt_in(fd);
    }
    let (ss, len) = sockaddr(&addr);
    // SAFETY: `ss` holds an address of `len` bytes; `fd` is our socket.
    if unsafe { libc::bind(fd, (&ss as *const libc::sockaddr_storage).cast(), len) } != 0
        // SAFETY: `fd` is our socket.
        || unsafe { libc::listen(fd, 128) } != 0
    {
        die(format!(
            "bind/listen {addr}: {}",
            std::io::Error::last_os_error()
        ));
    }
    use std::os::fd::FromRawFd as _;
    // SAFETY: `fd` is an open socket nothing else owns; the listener takes it over.
    unsafe { TcpListener::from_raw_fd(fd) }
}

fn connect(addr: &str, opt: bool) -> TcpStream {
    let addr: SocketAddr = addr.parse().unwrap_or_else(|e| die(format!("{addr}: {e}")));
    let fd = raw_socket(&addr);
    if opt {
        opt_in(fd);
    }
    let (ss, len) = sockaddr(&addr);
    // SAFETY: `ss` holds an address of `len` bytes; `fd` is our socket.
    if unsafe { libc::connect(fd, (&ss as *const libc::sockaddr_storage).cast(), len) } != 0 {
        die(format!(
            "connect {addr}: {}",
            std::io::Error::last_os_error()
        ));
    }
    use std::os::fd::FromRawFd as _;
    // SAFETY: `fd` is an open socket nothing else owns; the stream takes it over.
    unsafe { TcpStream::from_raw_fd(fd) }
}

/// xorshift64*: deterministic data and chunk sizes from a seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
}

fn has(args: &[String], flag: &str) -> bool {
    args.iter().any(|a| a == flag)
}

fn value(args: &[String], flag: &str) -> Option<u64> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
}

/// Reads the stream to EOF (reads of seeded random sizes, or splice through a pipe), returning
/// (bytes, sha256 hex).
fn drain(s: &mut TcpStream, use_splice: bool) -> (u64, String) {
    let mut h = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    let mut sizes = Rng(0x9e37_79b9_7f4a_7c15);
    if use_splice {
        let mut p = [0i32; 2];
        // SAFETY: `p` has room for the 2 fds pipe writes.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        loop {
            // SAFETY: `s` and the pipe's write end are open fds; no offsets (null) are passed.
            let n = unsafe {
                libc::splice(
                    s.as_raw_fd(),
                    std::ptr::null_mut(),
                    p[1],
                    std::ptr::null_mut(),
                    1 << 16,
                    0,
                )
            };
            if n < 0 {
                die(format!("splice: {}", std::io::Error::last_os_error()));
            }
            if n == 0 {
                break;
            }
            let mut left = n as usize;
            while left > 0 {
                // SAFETY: reads at most `buf.len()` bytes into the writable `buf` from our pipe.
                let r = unsafe { libc::read(p[0], buf.as_mut_ptr().cast(), left.min(buf.len())) };
                if r <= 0 {
                    die("pipe read");
                }
                h.update(&buf[..r as usize]);
                left -= r as usize;
            }
            total += n as u64;
        }
    } else {
        loop {
            let want = (sizes.next() % buf.len() as u64) as usize + 1;
            let n = match s.read(&mut buf[..want]) {
                Ok(n) => n,
                // sockmap's receive path (tcp_bpf_recvmsg) returns EAGAIN to a *blocking* reader
                // when a FIN arrives while it waits with an empty psock queue (kernel 6.18);
                // the next read sees the EOF. Counted and reported, not hidden.
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    SPURIOUS_EAGAIN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
                Err(e) => die(format!("read: {e}")),
            };
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            total += n as u64;
        }
    }
    (total, hex(&h.finalize()))
}

static SPURIOUS_EAGAIN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn spurious() -> u64 {
    SPURIOUS_EAGAIN.load(std::sync::atomic::Ordering::Relaxed)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Sends `bytes` seeded bytes in seeded random chunk sizes; returns their sha256.
fn send_stream(s: &mut TcpStream, bytes: u64, seed: u64, max_chunk: usize) -> String {
    let mut data = Rng(seed | 1);
    let mut sizes = Rng(seed.rotate_left(17) | 1);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; max_chunk];
    let mut left = bytes;
    while left > 0 {
        let n = ((sizes.next() % max_chunk as u64) + 1).min(left) as usize;
        data.fill(&mut buf[..n]);
        h.update(&buf[..n]);
        s.write_all(&buf[..n])
            .unwrap_or_else(|e| die(format!("write: {e}")));
        left -= n as u64;
    }
    hex(&h.finalize())
}

fn main() {
    let args: Vec<String> = env::args().collect();
    let cmd = args.get(1).map(String::as_str).unwrap_or("");
    match cmd {
        "pair" => {
            let addr = &args[2];
            let l = listen(addr, has(&args, "--server-opt"));
            let local = l.local_addr().unwrap();
            let c = connect(&local.to_string(), has(&args, "--client-opt"));
            let (a, _) = l.accept().unwrap();
            println!(
                "client={} server={} port={}",
                state(c.as_raw_fd()),
                state(a.as_raw_fd()),
                local.port()
            );
        }
        "server" => {
            let l = listen(&args[2], has(&args, "--opt-in"));
            println!("PORT {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            let (mut s, _) = l.accept().unwrap();
            let (n, sha) = drain(&mut s, has(&args, "--splice"));
            if let Some(reply) = value(&args, "--reply") {
                send_stream(&mut s, reply, 7, 65536);
            }
            let _ = s.shutdown(Shutdown::Write);
            println!(
                "SHA {sha} {n} state={} eagain={}",
                state_report(s.as_raw_fd()),
                spurious()
            );
        }
        "client" => {
            let bytes: u64 = args[3].parse().unwrap_or_else(|_| die("BYTES"));
            let seed: u64 = args[4].parse().unwrap_or_else(|_| die("SEED"));
            let max_chunk = value(&args, "--max-chunk").unwrap_or(65536) as usize;
            let mut s = connect(&args[2], has(&args, "--opt-in"));
            let sha = send_stream(&mut s, bytes, seed, max_chunk);
            s.shutdown(Shutdown::Write).unwrap();
            // The half-closed stream still carries the server's reply.
            let (back, back_sha) = drain(&mut s, false);
            println!(
                "OK {bytes} {sha} back={back} {back_sha} state={} eagain={}",
                state_report(s.as_raw_fd()),
                spurious()
            );
        }
        "stall" => {
            let l = listen(&args[2], false);
            let local = l.local_addr().unwrap();
            let mut c = connect(&local.to_string(), false);
            let (_reader, _) = l.accept().unwrap();
            c.set_nonblocking(true).unwrap();
            let buf = vec![0u8; 65536];
            let mut queued = 0u64;
            let limit = value(&args, "--limit").unwrap_or(1 << 30);
            while queued < limit {
                match c.write(&buf) {
                    Ok(n) => queued += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => die(format!("write: {e}")),
                }
            }
            println!("QUEUED {queued}");
        }
        "sink" => {
            let l = listen(&args[2], has(&args, "--opt-in"));
            println!("PORT {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            let (s, _) = l.accept().unwrap();
            let mut line = String::new();
            let _ = std::io::stdin().read_line(&mut line);
            let mut inq: libc::c_int = 0;
            // SAFETY: valid fd and out buffer.
            if unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut inq) } != 0 {
                die(format!("SIOCINQ: {}", std::io::Error::last_os_error()));
            }
            println!("INQ {inq} state={}", state_report(s.as_raw_fd()));
        }
        "flood" => {
            let mut c = connect(&args[2], has(&args, "--opt-in"));
            let mut res = 0;
            if has(&args, "--shortcut") {
                let one: u32 = 1;
                // SAFETY: valid fd and option buffer.
                let r = unsafe {
                    libc::setsockopt(
                        c.as_raw_fd(),
                        SOL_SMC_BPF,
                        SMC_SO_SHORTCUT,
                        (&one as *const u32).cast(),
                        4,
                    )
                };
                if r != 0 {
                    res = std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
                }
            }
            c.set_nonblocking(true).unwrap();
            let buf = vec![0x5au8; 65536];
            let mut queued = 0u64;
            let limit = value(&args, "--limit").unwrap_or(64 << 20);
            while queued < limit {
                let n = buf.len().min((limit - queued) as usize);
                match c.write(&buf[..n]) {
                    Ok(n) => queued += n as u64,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => die(format!("write: {e}")),
                }
            }
            println!(
                "SHORTCUT {res} QUEUED {queued} state={}",
                state_report(c.as_raw_fd())
            );
        }
        "duplex" => duplex(&args),
        _ => die("usage: smc-testprog pair|server|client|stall|sink|flood|duplex ..."),
    }
}

/// How a `duplex` thread waits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum WaitKind {
    Block,
    Poll,
    Epoll,
}

fn wait_kind(args: &[String], flag: &str) -> WaitKind {
    let v = args
        .iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str);
    match v {
        Some("block") => WaitKind::Block,
        Some("poll") => WaitKind::Poll,
        Some("epoll") => WaitKind::Epoll,
        _ => die(format!("{flag} block|poll|epoll")),
    }
}

/// A generous bound on one wait: the condition it waits for holds long before (a liveness
/// check, not a speed threshold).
const DUPLEX_WAIT_MS: i32 = 5_000;

/// Waits for `events` on `fd` with `kind` (poll, or a private epoll instance `ep`); false when
/// the wait timed out.
fn wait_for(kind: WaitKind, fd: i32, ep: i32, events: i16) -> bool {
    match kind {
        WaitKind::Poll | WaitKind::Block => {
            let mut p = libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            // SAFETY: one pollfd.
            let r = unsafe { libc::poll(&mut p, 1, DUPLEX_WAIT_MS) };
            if r < 0 {
                die(format!("poll: {}", std::io::Error::last_os_error()));
            }
            r > 0
        }
        WaitKind::Epoll => {
            // SAFETY: zeroed events are valid.
            let mut evs: [libc::epoll_event; 4] = unsafe { std::mem::zeroed() };
            // SAFETY: valid buffer.
            let r = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 4, DUPLEX_WAIT_MS) };
            if r < 0 {
                die(format!("epoll_wait: {}", std::io::Error::last_os_error()));
            }
            r > 0
        }
    }
}

/// A private epoll instance watching `fd` for `events` (level-triggered), or -1 for poll.
fn epoll_of(kind: WaitKind, fd: i32, events: i16) -> i32 {
    if kind != WaitKind::Epoll {
        return -1;
    }
    // SAFETY: plain syscalls on our fds.
    unsafe {
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        let mut ev = libc::epoll_event {
            events: events as u32,
            u64: fd as u64,
        };
        if ep < 0 || libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) != 0 {
            die(format!("epoll: {}", std::io::Error::last_os_error()));
        }
        ep
    }
}

/// Lost-wakeup reproduction (issue 10): two threads wait on one end `a` of a connection at
/// once, as a full-duplex program does. The reader thread waits for data (`--reader`: blocked
/// in `read`, or non-blocking reads with `poll`/its own epoll instance for `POLLIN`), the main
/// thread fills the send ring with non-blocking writes and then waits for room (`--writer`:
/// `poll` or its own epoll instance for `POLLOUT`). Each round the peer end `b` (a thread of
/// this process) reads everything the writer wrote, which frees the ring and rings the room
/// doorbell, and then sends the reader one byte. Every wait must end because its condition
/// came true: a wait that times out although the fd is ready is a wakeup that another waiter
/// of the same end consumed, reported as `STALL` (exit 1).
fn duplex(args: &[String]) {
    use std::sync::mpsc;
    let rounds: u64 = args
        .get(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| die("ROUNDS"));
    let rkind = wait_kind(args, "--reader");
    let wkind = wait_kind(args, "--writer");
    if wkind == WaitKind::Block {
        die("--writer poll|epoll");
    }
    let l = listen("127.0.0.1:0", false);
    let addr = l.local_addr().unwrap().to_string();
    let acc = std::thread::spawn(move || l.accept().map(|(s, _)| s));
    let a = connect(&addr, false);
    let b = acc
        .join()
        .unwrap_or_else(|_| die("accept thread"))
        .unwrap_or_else(|e| die(format!("accept: {e}")));
    let afd = a.as_raw_fd();
    // The peer: per round, read what the writer reports it wrote, then one byte to the reader.
    let (to_peer, peer_rx) = mpsc::channel::<u64>();
    let (drained_tx, drained_rx) = mpsc::channel::<()>();
    let peer = std::thread::spawn(move || {
        let mut b = b;
        let mut buf = vec![0u8; 1 << 16];
        let mut round = 0u64;
        while let Ok(n) = peer_rx.recv() {
            // Even rounds: the reader's byte first, then (the reader asleep again, now the
            // latest sleeper) the room; odd rounds the other way round. Each time give the
            // waiters of `a` the time to go to sleep, so that the round goes through the
            // doorbells (correctness never depends on it: every wait is checked for its
            // condition).
            let byte_first = round.is_multiple_of(2);
            round += 1;
            let pause = || std::thread::sleep(std::time::Duration::from_millis(1));
            let byte = |b: &mut TcpStream| {
                b.write_all(&[0x5a])
                    .unwrap_or_else(|e| die(format!("peer write: {e}")))
            };
            pause();
            if byte_first {
                byte(&mut b);
                pause();
            }
            let mut left = n;
            while left > 0 {
                let k = (left as usize).min(buf.len());
                match b.read(&mut buf[..k]) {
                    Ok(0) => die("peer: EOF"),
                    Ok(r) => left -= r as u64,
                    Err(e) => die(format!("peer read: {e}")),
                }
            }
            if !byte_first {
                pause();
                byte(&mut b);
            }
            if drained_tx.send(()).is_err() {
                break;
            }
        }
        b
    });
    // The reader thread: `rounds` bytes, one per round.
    let reader = std::thread::spawn(move || {
        let ep = epoll_of(rkind, afd, libc::POLLIN);
        let flags = if rkind == WaitKind::Block {
            0
        } else {
            libc::MSG_DONTWAIT
        };
        let mut got = 0u64;
        while got < rounds {
            let mut c = [0u8; 64];
            // SAFETY: valid buffer.
            let r = unsafe { libc::recv(afd, c.as_mut_ptr().cast(), c.len(), flags) };
            if r > 0 {
                got += r as u64;
                continue;
            }
            let e = std::io::Error::last_os_error();
            if r == 0 || e.raw_os_error() != Some(libc::EAGAIN) {
                die(format!("reader: recv {r}: {e}"));
            }
            if !wait_for(rkind, afd, ep, libc::POLLIN) {
                let mut n: libc::c_int = 0;
                // SAFETY: valid out pointer.
                unsafe { libc::ioctl(afd, libc::FIONREAD, &mut n) };
                if n > 0 {
                    println!("STALL reader round={got} readable={n} after {DUPLEX_WAIT_MS} ms");
                    std::io::stdout().flush().ok();
                    exit(1);
                }
            }
        }
        if ep >= 0 {
            // SAFETY: our fd.
            unsafe { libc::close(ep) };
        }
    });
    let ep = epoll_of(wkind, afd, libc::POLLOUT);
    let chunk = vec![0xa5u8; 1 << 16];
    for round in 0..rounds {
        // Fill the send ring until it is full.
        let mut wrote = 0u64;
        loop {
            // SAFETY: valid buffer.
            let r = unsafe {
                libc::send(
                    afd,
                    chunk.as_ptr().cast(),
                    chunk.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if r > 0 {
                wrote += r as u64;
                continue;
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EAGAIN) {
                die(format!("writer: send: {e}"));
            }
            break;
        }
        to_peer.send(wrote).unwrap_or_else(|_| die("peer gone"));
        // The peer empties the ring: room must come.
        if !wait_for(wkind, afd, ep, libc::POLLOUT) {
            // SAFETY: valid buffer.
            let r = unsafe {
                libc::send(
                    afd,
                    chunk.as_ptr().cast(),
                    1,
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            println!(
                "STALL writer round={round} wrote={wrote} then poll timed out after \
                 {DUPLEX_WAIT_MS} ms; a write now gives {r}"
            );
            std::io::stdout().flush().ok();
            exit(1);
        }
        // The next round starts when the peer has read it all (an empty ring).
        drained_rx.recv().unwrap_or_else(|_| die("peer gone"));
    }
    drop(to_peer);
    reader.join().unwrap_or_else(|_| die("reader thread"));
    let _b = peer.join().unwrap_or_else(|_| die("peer thread"));
    println!("OK rounds={rounds}");
}
