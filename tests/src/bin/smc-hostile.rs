//! A hostile SMC-D peer and the programs it is turned against (issue 12, `hostile_peer`):
//!
//! ```text
//! smc-hostile victim                 -> "PORT <p>"; per connection "ACCEPT <id> <peer port>",
//!                                       then "END <id> <peer port> <how> rx=<n> tx=<n>" once its
//!                                       fd is closed (how: eof, reset, epipe, errno-<n>); at a
//!                                       line on stdin "VICTIM accepted=<n> ended=<n>", exit 0
//! smc-hostile honest ADDR:PORT SEED  -> "HONEST started port=<local port>" once the first echoed
//!                                       bytes checked out; streams until a line on stdin, then
//!                                       "HONEST ok bytes=<n>" (exit 0) or "HONEST BAD ..." (exit 1)
//! smc-hostile peer ADDR:PORT SECS SEED
//!     -> per connection "ATTACK <n> port=<local port> profile=<p> legit=<ok|bad> iters=<n>
//!        doorbells=<n> holes=<n> junk=<bool> truncate=<refused|ALLOWED> echoed=<n>
//!        echo=<ok|BAD(...)> ended=<victim|timer>" (or "NOSMC <n> port=<p> <why>"), then
//!        "HOSTILE conns=<n> established=<n> legit=<n> victim_ended=<n> iters=<n>
//!        doorbells=<n> holes=<n> echoed=<n>"
//! ```
//!
//! `victim` (an echo server) and `honest` (a checked stream through it) are ordinary socket
//! programs, std and libc only: run under `smc-ctl run`, their connections are SMC-D. The
//! victim serves even connections with a thread each (blocking calls, `poll`, `FIONREAD`,
//! `MSG_PEEK`) and odd ones in one epoll event loop (non-blocking; edge-triggered for every
//! other one), so attacked connections share the epoll set and the process with honest ones.
//!
//! `peer` runs *without* the data path, in an attached cgroup: it opts its socket in, runs the
//! client side of a real CLC handshake itself (`smc_common::handshake`), registers its DMB and
//! attaches the victim's through the loopback-ism daemon with its own TCP socket as proof
//! (`smc_ism::Client`), and maps both as the data path does (`Dmb::map`). It moves 1000 bytes
//! through the rings legitimately (checked), tries to truncate and grow both memfds (sealed:
//! refused), and then writes, in a tight loop for a random while, forged producer and consumer
//! cursors (ahead, behind, beyond the ring, wrapped, torn bytes), connection-state and producer
//! flags and wait bits into the victim's DMB header and its own (which the victim updates),
//! random bytes into the victim's ring, rarely punches holes into the victim's memfd, and rings
//! doorbells over the TCP connection (in one connection of 20, once, a byte that is not a
//! doorbell). Per connection a profile: `chaos` (all of it), `plausible` (only cursors the
//! victim should accept, over a ring filled with a pattern that names each offset: every byte
//! the victim echoes back is checked against the offset it must have come from) or `flags`
//! (flags and wait bits only). A connection ends when the victim closes it or the while is over; then the
//! next one, until SECS.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use smc_harness::Rng;
use std::{
    collections::VecDeque,
    env,
    io::{BufRead as _, Read as _, Write as _},
    net::{Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    process::exit,
    sync::{
        atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use smc_common::{
    bpf::{sock_state, SMC_SO_ENABLE, SOCK_PEER_SMC, SOL_SMC_BPF},
    cdc::{
        ConnStateFlags, Cursor, CursorWord, ProdFlags, Ring, CDC_HEADER_LEN, CONS_WORD_OFFSET,
        PROD_WORD_OFFSET,
    },
    clc::{self, HEADER_LEN},
    handshake::{Action, Config, DmbFailure, Handshake, Input, LocalDmb},
};

fn die(msg: impl std::fmt::Display) -> ! {
    eprintln!("smc-hostile: {msg}");
    exit(2)
}

/// The generator of a run's `seed`.
fn rng(seed: u64) -> Rng {
    Rng::with_state(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// The byte stream of `honest`: the same for writer and checker.
struct Stream {
    rng: Rng,
    word: [u8; 8],
    pos: usize,
}

impl Stream {
    fn new(seed: u64) -> Stream {
        Stream {
            rng: rng(seed),
            word: [0; 8],
            pos: 8,
        }
    }
    fn next_byte(&mut self) -> u8 {
        if self.pos == 8 {
            self.word = self.rng.next_u64().to_le_bytes();
            self.pos = 0;
        }
        self.pos += 1;
        self.word[self.pos - 1]
    }
}

fn how(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ECONNRESET) => "reset".into(),
        Some(libc::EPIPE) => "epipe".into(),
        Some(n) => format!("errno-{n}"),
        None => format!("error-{}", e.kind()),
    }
}

fn say(line: String) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{line}");
    let _ = o.flush();
}

// ───────────────────────────────────────── victim ─────────────────────────────────────────

fn victim() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(format!("bind: {e}")));
    say(format!("PORT {}", l.local_addr().unwrap().port()));
    let accepted = Arc::new(AtomicU64::new(0));
    let ended = Arc::new(AtomicU64::new(0));
    {
        let (accepted, ended) = (accepted.clone(), ended.clone());
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            say(format!(
                "VICTIM accepted={} ended={}",
                accepted.load(Ordering::SeqCst),
                ended.load(Ordering::SeqCst)
            ));
            exit(0);
        });
    }
    // Odd connections are served by one epoll event loop (edge-triggered for every other
    // one), even ones by a thread each.
    let (to_loop, from_accept) = std::sync::mpsc::channel();
    // SAFETY: plain syscall.
    let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if wake < 0 {
        die(format!("eventfd: {}", std::io::Error::last_os_error()));
    }
    {
        let ended = ended.clone();
        std::thread::spawn(move || event_loop(from_accept, wake, &ended));
    }
    for id in 0u64.. {
        let s = match l.accept() {
            Ok((s, _)) => s,
            Err(e) => {
                eprintln!("smc-hostile victim: accept: {e}");
                continue;
            }
        };
        accepted.fetch_add(1, Ordering::SeqCst);
        let port = s.peer_addr().map(|a| a.port()).unwrap_or(0);
        say(format!("ACCEPT {id} {port}"));
        if id % 2 == 1 {
            to_loop.send((id, port, s)).unwrap();
            let one = 1u64;
            // SAFETY: an 8-byte value to our eventfd.
            unsafe { libc::write(wake, (&one as *const u64).cast(), 8) };
            continue;
        }
        let ended = ended.clone();
        std::thread::spawn(move || {
            let (how, rx, tx) = echo(id, s);
            ended.fetch_add(1, Ordering::SeqCst);
            say(format!("END {id} {port} {how} rx={rx} tx={tx}"));
        });
    }
}

/// A connection of the event loop: what it read and still has to echo.
struct EvConn {
    id: u64,
    port: u16,
    s: TcpStream,
    et: bool,
    pending: Vec<u8>,
    off: usize,
    out_armed: bool,
    eof: bool,
    rx: u64,
    tx: u64,
}

fn epoll_ctl(ep: i32, op: i32, fd: i32, events: u32, data: u64) {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: a valid epoll_event.
    if unsafe { libc::epoll_ctl(ep, op, fd, &mut ev) } != 0 {
        die(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
    }
}

/// Echo connections handed over by the accept loop, all in one epoll set, non-blocking.
fn event_loop(
    from_accept: std::sync::mpsc::Receiver<(u64, u16, TcpStream)>,
    wake: i32,
    ended: &AtomicU64,
) {
    // SAFETY: plain syscall.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        die(format!(
            "epoll_create1: {}",
            std::io::Error::last_os_error()
        ));
    }
    epoll_ctl(
        ep,
        libc::EPOLL_CTL_ADD,
        wake,
        libc::EPOLLIN as u32,
        u64::MAX,
    );
    let mut conns: std::collections::HashMap<u64, EvConn> = Default::default();
    let mut buf = vec![0u8; 64 * 1024];
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 64];
    loop {
        // SAFETY: a valid array of the length passed.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            die(format!("epoll_wait: {e}"));
        }
        let mut ready: Vec<u64> = evs[..n as usize].iter().map(|e| e.u64).collect();
        if ready.contains(&u64::MAX) {
            let mut v = 0u64;
            // SAFETY: an 8-byte read from our eventfd.
            unsafe { libc::read(wake, (&mut v as *mut u64).cast(), 8) };
            while let Ok((id, port, s)) = from_accept.try_recv() {
                s.set_nonblocking(true).unwrap();
                let et = id % 4 == 1;
                let events = if et {
                    libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLOUT | libc::EPOLLET
                } else {
                    libc::EPOLLIN | libc::EPOLLRDHUP
                };
                epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), events as u32, id);
                conns.insert(
                    id,
                    EvConn {
                        id,
                        port,
                        s,
                        et,
                        pending: Vec::new(),
                        off: 0,
                        out_armed: false,
                        eof: false,
                        rx: 0,
                        tx: 0,
                    },
                );
                ready.push(id);
            }
        }
        for id in ready {
            let Some(c) = conns.get_mut(&id) else {
                continue;
            };
            if let Some(how) = service(ep, c, &mut buf) {
                let c = conns.remove(&id).unwrap();
                epoll_ctl(ep, libc::EPOLL_CTL_DEL, c.s.as_raw_fd(), 0, 0);
                let (id, port, rx, tx) = (c.id, c.port, c.rx, c.tx);
                drop(c);
                ended.fetch_add(1, Ordering::SeqCst);
                say(format!("END {id} {port} {how} rx={rx} tx={tx}"));
            }
        }
    }
}

/// Echo as far as the socket lets us; `Some(how)` when the connection is over.
fn service(ep: i32, c: &mut EvConn, buf: &mut [u8]) -> Option<String> {
    loop {
        while c.off < c.pending.len() {
            match c.s.write(&c.pending[c.off..]) {
                Ok(n) => {
                    c.off += n;
                    c.tx += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Some(how(&e)),
            }
        }
        let blocked = c.off < c.pending.len();
        if !c.et && blocked != c.out_armed {
            let mut events = libc::EPOLLIN | libc::EPOLLRDHUP;
            if blocked {
                events |= libc::EPOLLOUT;
            }
            epoll_ctl(
                ep,
                libc::EPOLL_CTL_MOD,
                c.s.as_raw_fd(),
                events as u32,
                c.id,
            );
            c.out_armed = blocked;
        }
        if blocked {
            return None;
        }
        c.pending.clear();
        c.off = 0;
        if c.eof {
            return Some("eof".into());
        }
        match c.s.read(buf) {
            Ok(0) => c.eof = true,
            Ok(n) if n > buf.len() => die(format!("read of {} bytes said {n}", buf.len())),
            Ok(n) => {
                c.rx += n as u64;
                c.pending.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Some(how(&e)),
        }
    }
}

/// Echoes until EOF or an error; the stream is closed when this returns.
fn echo(id: u64, mut s: TcpStream) -> (String, u64, u64) {
    let fd = s.as_raw_fd();
    let mut rng = rng(id + 1);
    let mut buf = vec![0u8; 64 * 1024];
    let (mut rx, mut tx) = (0u64, 0u64);
    loop {
        match rng.below(8) {
            0 => {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                    return (how(&std::io::Error::last_os_error()), rx, tx);
                }
            }
            1 => {
                let mut n: libc::c_int = 0;
                // SAFETY: FIONREAD writes one int.
                if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n) } < 0 {
                    return (how(&std::io::Error::last_os_error()), rx, tx);
                }
                if n < 0 {
                    die(format!("FIONREAD said {n}"));
                }
            }
            2 => {
                // SAFETY: valid buffer of the length passed.
                let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), 512, libc::MSG_PEEK) };
                if r < 0 {
                    return (how(&std::io::Error::last_os_error()), rx, tx);
                }
                if r > 512 {
                    die(format!("MSG_PEEK of 512 bytes said {r}"));
                }
            }
            _ => {}
        }
        let n = match s.read(&mut buf) {
            Ok(0) => return ("eof".into(), rx, tx),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return (how(&e), rx, tx),
        };
        if n > buf.len() {
            die(format!("read of {} bytes said {n}", buf.len()));
        }
        rx += n as u64;
        if let Err(e) = s.write_all(&buf[..n]) {
            return (how(&e), rx, tx);
        }
        tx += n as u64;
    }
}

// ───────────────────────────────────────── honest ─────────────────────────────────────────

fn honest(addr: &str, seed: u64) {
    let s = TcpStream::connect(addr).unwrap_or_else(|e| die(format!("connect {addr}: {e}")));
    let port = s.local_addr().unwrap().port();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut s = s.try_clone().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut gen = Stream::new(seed);
            let mut rng = rng(seed ^ 0xABCD);
            let mut buf = Vec::new();
            let mut sent = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let n = rng.range(1, 128 * 1024) as usize;
                buf.clear();
                buf.extend((0..n).map(|_| gen.next_byte()));
                if let Err(e) = s.write_all(&buf) {
                    say(format!("HONEST BAD write after {sent} bytes: {e}"));
                    exit(1);
                }
                sent += n as u64;
                // Paced (not a synchronisation): the victim's echo sleeps and is woken by
                // doorbells now and then, and the stream leaves CPU to the others.
                let pause = rng.below(3);
                if pause > 0 {
                    std::thread::sleep(Duration::from_millis(pause));
                }
            }
            if let Err(e) = s.shutdown(Shutdown::Write) {
                say(format!("HONEST BAD shutdown: {e}"));
                exit(1);
            }
            sent
        })
    };
    std::thread::spawn({
        let stop = stop.clone();
        move || {
            let mut line = String::new();
            let _ = std::io::stdin().lock().read_line(&mut line);
            stop.store(true, Ordering::SeqCst);
        }
    });
    let mut s = s;
    let mut gen = Stream::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    let mut got = 0u64;
    loop {
        let n = match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                say(format!("HONEST BAD read after {got} bytes: {e}"));
                exit(1);
            }
        };
        for (i, b) in buf[..n].iter().enumerate() {
            let want = gen.next_byte();
            if *b != want {
                say(format!(
                    "HONEST BAD byte {} is {b:#04x}, sent {want:#04x}",
                    got + i as u64
                ));
                exit(1);
            }
        }
        if got == 0 {
            say(format!("HONEST started port={port}"));
        }
        got += n as u64;
    }
    let sent = writer.join().unwrap();
    if got != sent {
        say(format!("HONEST BAD sent {sent} bytes, {got} came back"));
        exit(1);
    }
    say(format!("HONEST ok bytes={got}"));
}

// ────────────────────────────────────────── peer ──────────────────────────────────────────

fn check(r: libc::c_int, what: &str) -> std::io::Result<libc::c_int> {
    if r < 0 {
        let e = std::io::Error::last_os_error();
        Err(std::io::Error::new(e.kind(), format!("{what}: {e}")))
    } else {
        Ok(r)
    }
}

/// An opted-in TCP socket connected to `addr` (blocking, 10 s receive timeout).
fn connect_opted_in(addr: SocketAddrV4) -> std::io::Result<OwnedFd> {
    let fd = check(
        // SAFETY: plain syscall.
        unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) },
        "socket",
    )?;
    // SAFETY: a fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let one: u32 = 1;
    check(
        // SAFETY: valid fd and option buffer of the length passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                SOL_SMC_BPF,
                SMC_SO_ENABLE,
                (&one as *const u32).cast(),
                4,
            )
        },
        "opt-in (SMC_SO_ENABLE; is this process in an attached cgroup?)",
    )?;
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    check(
        // SAFETY: valid fd and option buffer of the length passed.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        },
        "SO_RCVTIMEO",
    )?;
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: addr.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(addr.ip().octets()),
        },
        sin_zero: [0; 8],
    };
    check(
        // SAFETY: a valid sockaddr_in of the length passed.
        unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&sin as *const libc::sockaddr_in).cast(),
                std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
            )
        },
        "connect",
    )?;
    Ok(fd)
}

fn local_port(fd: i32) -> u16 {
    // SAFETY: zeroed sockaddr_in is valid.
    let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: valid out pointers.
    unsafe { libc::getsockname(fd, (&mut sin as *mut libc::sockaddr_in).cast(), &mut len) };
    u16::from_be(sin.sin_port)
}

fn peer_announced_smc(fd: i32) -> bool {
    sock_state(fd).is_some_and(|st| st.flags & SOCK_PEER_SMC != 0)
}

fn write_all(fd: i32, mut b: &[u8]) -> std::io::Result<()> {
    while !b.is_empty() {
        // SAFETY: valid buffer of the length passed.
        let r = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
        b = &b[check(r as libc::c_int, "send")? as usize..];
    }
    Ok(())
}

fn read_exact(fd: i32, b: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < b.len() {
        // SAFETY: valid buffer of the length passed.
        let r = unsafe { libc::recv(fd, b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        match check(r as libc::c_int, "recv")? {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "EOF in the CLC handshake",
                ))
            }
            n => got += n as usize,
        }
    }
    Ok(())
}

/// One whole CLC message from the stream.
fn read_clc(fd: i32) -> std::io::Result<Vec<u8>> {
    let mut hdr = [0u8; HEADER_LEN];
    read_exact(fd, &mut hdr)?;
    let len = clc::message_len(&hdr)
        .map_err(|e| std::io::Error::other(format!("CLC header {hdr:02x?}: {e:?}")))?;
    let mut msg = hdr.to_vec();
    msg.resize(len, 0);
    read_exact(fd, &mut msg[HEADER_LEN..])?;
    Ok(msg)
}

/// A DMB mapped by the peer, with the daemon's grant (its memfd) kept alongside.
struct Mapped {
    dmb: smc_ism::Dmb,
    map: smc_ism::DmbMap,
    ring: Ring,
}

impl Mapped {
    fn new(d: smc_ism::Dmb) -> std::io::Result<Mapped> {
        let map = d.map()?;
        let ring = Ring::for_dmb(map.len()).ok_or_else(|| std::io::Error::other("DMB size"))?;
        Ok(Mapped { dmb: d, map, ring })
    }
    /// The 8-byte word at `off` (a multiple of 8 inside the DMB) of shared memory.
    fn word(&self, off: usize) -> &AtomicU64 {
        assert!(off.is_multiple_of(8) && off + 8 <= self.map.len());
        // SAFETY: inside the mapping (checked), 8-byte aligned (the mapping is page aligned),
        // lives as long as `self`; all access to it is atomic.
        unsafe { AtomicU64::from_ptr(self.map.as_ptr().add(off).cast()) }
    }
    fn byte(&self, off: usize) -> &AtomicU8 {
        assert!(off < self.map.len());
        // SAFETY: inside the mapping (checked), lives as long as `self`; accessed atomically.
        unsafe { AtomicU8::from_ptr(self.map.as_ptr().add(off)) }
    }
    fn prod(&self) -> CursorWord {
        CursorWord::from_u64(self.word(PROD_WORD_OFFSET).load(Ordering::Acquire))
    }
    fn cons(&self) -> CursorWord {
        CursorWord::from_u64(self.word(CONS_WORD_OFFSET).load(Ordering::Acquire))
    }
}

/// The wait bits word of a header (offset 24; see smc-preload's `conn.rs`).
const WAIT_WORD: usize = 24;
const WAIT_DATA: u64 = 1;

fn doorbell(fd: i32, byte: u8) -> bool {
    // SAFETY: valid one-byte buffer.
    unsafe {
        libc::send(
            fd,
            (&byte as *const u8).cast(),
            1,
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        ) == 1
    }
}

/// Drains what the victim sent on the TCP socket (its doorbells); true at EOF or an error
/// (the victim closed or reset the connection).
fn drain_gone(fd: i32) -> bool {
    let mut b = [0u8; 512];
    loop {
        // SAFETY: valid buffer of the length passed.
        let r = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        if r == 0 {
            return true;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            return !matches!(e, Some(libc::EAGAIN) | Some(libc::EINTR));
        }
    }
}

/// The legitimate part: `n` bytes into the victim's ring, a doorbell, wait (bounded) for its
/// echo in ours, check it, confirm it. Returns whether the echo was exact.
/// Bytes of the legitimate exchange.
const LEGIT_N: usize = 1000;

fn legit_exchange(fd: i32, own: &Mapped, peer: &Mapped, rng: &mut Rng) -> bool {
    const N: usize = LEGIT_N;
    let data: Vec<u8> = (0..N).map(|_| rng.next_u64() as u8).collect();
    // Our header in the victim's DMB: the type byte (as the data path's `Conn::new`).
    peer.word(0).store(
        u64::from_ne_bytes([0xFE, 0, 0, 0, 0, 0, 0, 0]),
        Ordering::Release,
    );
    for (i, b) in data.iter().enumerate() {
        peer.byte(CDC_HEADER_LEN + i).store(*b, Ordering::Relaxed);
    }
    let prod = peer.ring.add(Cursor::ZERO, N as u32);
    peer.word(PROD_WORD_OFFSET)
        .store(CursorWord::from_cursor(prod).to_u64(), Ordering::Release);
    own.word(WAIT_WORD).fetch_or(WAIT_DATA, Ordering::SeqCst);
    doorbell(fd, 0x01);
    let t = Instant::now();
    while own.ring.readable(Cursor::ZERO, own.prod().cursor) != Ok(N as u32) {
        if t.elapsed() > Duration::from_secs(10) {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 10) };
        if drain_gone(fd) {
            return false;
        }
    }
    let ok = (0..N).all(|i| own.byte(CDC_HEADER_LEN + i).load(Ordering::Relaxed) == data[i]);
    // Confirm what we consumed (our consumer cursor of our ring lives in the victim's header).
    peer.word(CONS_WORD_OFFSET)
        .store(CursorWord::from_cursor(prod).to_u64(), Ordering::Release);
    ok
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Profile {
    Chaos,
    Plausible,
    Flags,
}

/// Forgeries of one cursor word (`cur` its value now, `len` its ring).
fn forge_cursor(rng: &mut Rng, cur: u64, len: u32, legit: u64) -> u64 {
    let ring = Ring::new(len).unwrap();
    let w = CursorWord::from_u64(cur);
    let c = w.cursor;
    let with = |c: Cursor| CursorWord { cursor: c, ..w }.to_u64();
    match rng.below(13) {
        0 => rng.next_u64(),
        1 => [
            0,
            u64::MAX,
            1 << 63,
            len as u64,
            (len as u64) << 16,
            ((len as u64) << 16) | 0xFFFF,
            0x0000_FFFF_FFFF_FFFF,
            0xFFFF,
        ][rng.below(8) as usize],
        // ahead, within one ring
        2 | 3 => with(ring.add(c, rng.range(1, len as u64) as u32)),
        // more than a ring ahead
        4 => with(ring.add(c, len + 1 + rng.below(len as u64) as u32)),
        // behind
        5 => {
            let d = rng.range(1, len as u64) as u32;
            let back = if c.count >= d {
                Cursor::new(c.wrap, c.count - d)
            } else {
                Cursor::new(c.wrap.wrapping_sub(1), c.count % len + len - d)
            };
            with(back)
        }
        // count outside the ring
        6 => with(Cursor::new(
            c.wrap,
            [len, len + 1, len + rng.below(4096) as u32, u32::MAX][rng.below(4) as usize],
        )),
        // wrap counter games
        7 => with(Cursor::new(
            [c.wrap.wrapping_add(1), c.wrap.wrapping_sub(1), 0xFFFF, 0][rng.below(4) as usize],
            c.count,
        )),
        // one flag bit flipped (producer flags, connection state)
        8 => cur ^ (1u64 << rng.range(48, 63)),
        9 => CursorWord {
            conn_state: [
                ConnStateFlags::PEER_DONE_WRITING,
                ConnStateFlags::PEER_CONN_CLOSED,
                ConnStateFlags::PEER_CONN_ABORT,
                ConnStateFlags::EMPTY,
                ConnStateFlags(rng.next_u64() as u8),
            ][rng.below(5) as usize],
            ..w
        }
        .to_u64(),
        10 => CursorWord {
            prod_flags: [
                ProdFlags::WRITE_BLOCKED,
                ProdFlags::CONS_CURS_UPD_REQ,
                ProdFlags::URG_DATA_PENDING,
                ProdFlags::URG_DATA_PRESENT,
                ProdFlags::EMPTY,
                ProdFlags(rng.next_u64() as u8),
            ][rng.below(6) as usize],
            ..w
        }
        .to_u64(),
        // back to the last legitimate value
        _ => legit,
    }
}

/// A cursor the victim should accept: `from` (our last forged-but-valid one) moved forward by
/// at most what `limit` (the other end's published cursor, plus `slack` bytes) allows.
fn plausible_ahead(rng: &mut Rng, ring: Ring, from: Cursor, limit: Cursor, slack: u32) -> Cursor {
    match ring.diff(from, limit) {
        Ok(room) => {
            let room = room.saturating_add(slack).min(ring.len());
            if room == 0 {
                from
            } else {
                ring.add(from, rng.range(1, room as u64) as u32)
            }
        }
        Err(_) => from,
    }
}

/// What a plausible connection writes into the victim's ring: a byte naming its offset.
fn pattern(off: usize) -> u8 {
    (off % 251 + 1) as u8
}

struct Tally {
    /// Bytes the victim echoed that were checked against [`pattern`], and the first mismatch.
    echoed: u64,
    echo_bad: Option<String>,
    iters: u64,
    doorbells: u64,
    /// Holes punched into the victim's DMB (its memfd: pages that read as zeros).
    holes: u64,
    victim_ended: bool,
}

/// The tight loop over one connection's shared memory until `end` or the victim closed it.
fn scribble(
    fd: i32,
    own: &Mapped,
    peer: &Mapped,
    profile: Profile,
    end: Instant,
    junk_at: Option<u64>,
    rng: &mut Rng,
) -> Tally {
    let mut t = Tally {
        echoed: 0,
        echo_bad: None,
        iters: 0,
        doorbells: 0,
        holes: 0,
        victim_ended: false,
    };
    let mut block = 0u64;
    // The last legitimate words (for "restore"), and the forward-only cursors of `plausible`.
    let legit_prod = peer.word(PROD_WORD_OFFSET).load(Ordering::Relaxed);
    let legit_cons = peer.word(CONS_WORD_OFFSET).load(Ordering::Relaxed);
    let mut our_prod = CursorWord::from_u64(legit_prod).cursor;
    let mut our_cons = CursorWord::from_u64(legit_cons).cursor;
    let (vlen, hlen) = (peer.ring.len(), own.ring.len());
    if profile == Profile::Plausible {
        // The victim consumed the legitimate bytes: its whole ring now holds a pattern that
        // names each offset, and every byte it echoes from now on is checked against it.
        for off in 0..vlen as usize {
            peer.byte(CDC_HEADER_LEN + off)
                .store(pattern(off), Ordering::Relaxed);
        }
        fence(Ordering::Release);
    }
    loop {
        for _ in 0..64 {
            t.iters += 1;
            match profile {
                Profile::Chaos => match rng.below(20) {
                    // The victim's DMB: what it reads from us.
                    0..=5 => {
                        let w = peer.word(PROD_WORD_OFFSET);
                        let v = forge_cursor(rng, w.load(Ordering::Relaxed), vlen, legit_prod);
                        w.store(v, Ordering::Release);
                    }
                    6..=11 => {
                        let w = peer.word(CONS_WORD_OFFSET);
                        let v = forge_cursor(rng, w.load(Ordering::Relaxed), hlen, legit_cons);
                        w.store(v, Ordering::Release);
                    }
                    12 => peer.word(WAIT_WORD).store(
                        [0, 1, 2, 3, rng.next_u64()][rng.below(5) as usize],
                        Ordering::SeqCst,
                    ),
                    13 => peer.word(0).store(
                        [rng.next_u64(), 0, 0xFE, u64::MAX][rng.below(4) as usize],
                        Ordering::Release,
                    ),
                    // Torn writes: one byte of the header.
                    14 => peer
                        .byte(rng.below(CDC_HEADER_LEN as u64) as usize)
                        .store(rng.next_u64() as u8, Ordering::Relaxed),
                    // Our own DMB, whose header the victim writes (and compare-and-swaps).
                    15 => {
                        let w = own.word(CONS_WORD_OFFSET);
                        let v = forge_cursor(rng, w.load(Ordering::Relaxed), vlen, 0);
                        w.store(v, Ordering::Release);
                    }
                    16 => {
                        let w = own.word(PROD_WORD_OFFSET);
                        let v = forge_cursor(rng, w.load(Ordering::Relaxed), hlen, 0);
                        w.store(v, Ordering::Release);
                    }
                    17 => own.word(WAIT_WORD).store(
                        [0, 1, 2, 3, rng.next_u64()][rng.below(5) as usize],
                        Ordering::SeqCst,
                    ),
                    18 => own
                        .byte(rng.below(CDC_HEADER_LEN as u64) as usize)
                        .store(rng.next_u64() as u8, Ordering::Relaxed),
                    // The victim's ring: data is data. Rarely a hole punched into its
                    // memfd instead (the header page too): those pages read as zeros.
                    _ if rng.below(512) == 0 => {
                        let pages = (peer.map.len() / 4096) as u64;
                        let off = rng.below(pages) * 4096;
                        let len = rng.range(1, 4) * 4096;
                        // SAFETY: plain syscall on the memfd the daemon gave us.
                        let r = unsafe {
                            libc::fallocate(
                                peer.dmb.fd.as_raw_fd(),
                                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                                off as libc::off_t,
                                len as libc::off_t,
                            )
                        };
                        t.holes += (r == 0) as u64;
                    }
                    _ => peer
                        .byte(CDC_HEADER_LEN + rng.below(vlen as u64) as usize)
                        .store(rng.next_u64() as u8, Ordering::Relaxed),
                },
                Profile::Plausible => match rng.below(8) {
                    // Produce (garbage) into the victim's ring, never more than it has room
                    // for behind the consumer cursor it published into our header.
                    0..=2 => {
                        our_prod = plausible_ahead(
                            rng,
                            peer.ring,
                            our_prod,
                            peer.ring.add(own.cons().cursor, vlen),
                            0,
                        );
                        let mut w = CursorWord::from_u64(
                            peer.word(PROD_WORD_OFFSET).load(Ordering::Relaxed),
                        );
                        w.cursor = our_prod;
                        peer.word(PROD_WORD_OFFSET)
                            .store(w.to_u64(), Ordering::Release);
                    }
                    // Consume what it echoed into our ring, checking every byte: the victim
                    // reads exactly its ring between its cursors, which holds the pattern.
                    3..=4 => {
                        let next = plausible_ahead(rng, own.ring, our_cons, own.prod().cursor, 0);
                        let n = own.ring.diff(our_cons, next).unwrap_or(0);
                        for i in 0..n {
                            let off = own.ring.offset(own.ring.add(our_cons, i));
                            let got = own.byte(CDC_HEADER_LEN + off).load(Ordering::Relaxed);
                            let src = (LEGIT_N as u64 + t.echoed) % vlen as u64;
                            if got != pattern(src as usize) && t.echo_bad.is_none() {
                                t.echo_bad = Some(format!(
                                    "echoed byte {} is {got:#04x}, ring offset {src} holds {:#04x}",
                                    t.echoed,
                                    pattern(src as usize)
                                ));
                            }
                            t.echoed += 1;
                        }
                        our_cons = next;
                        let mut w = peer.cons();
                        w.cursor = our_cons;
                        peer.word(CONS_WORD_OFFSET)
                            .store(w.to_u64(), Ordering::Release);
                    }
                    5 => {
                        let mut w = peer.cons();
                        w.cursor = our_cons;
                        w.prod_flags = [
                            ProdFlags::WRITE_BLOCKED,
                            ProdFlags::CONS_CURS_UPD_REQ,
                            ProdFlags::EMPTY,
                        ][rng.below(3) as usize];
                        peer.word(CONS_WORD_OFFSET)
                            .store(w.to_u64(), Ordering::Release);
                    }
                    6 => peer.word(WAIT_WORD).store(rng.below(4), Ordering::SeqCst),
                    _ => own.word(WAIT_WORD).store(rng.below(4), Ordering::SeqCst),
                },
                Profile::Flags => match rng.below(6) {
                    0..=2 => {
                        let w = peer.word(CONS_WORD_OFFSET);
                        let bit = 1u64 << rng.range(48, 63);
                        w.fetch_xor(bit, Ordering::AcqRel);
                    }
                    3 => {
                        let w = own.word(CONS_WORD_OFFSET);
                        w.fetch_xor(1u64 << rng.range(48, 63), Ordering::AcqRel);
                    }
                    4 => peer.word(WAIT_WORD).store(rng.below(4), Ordering::SeqCst),
                    _ => own.word(WAIT_WORD).store(rng.below(4), Ordering::SeqCst),
                },
            }
        }
        // Wake the victim so that it looks (a doorbell is one 0x01 byte); in some connections,
        // once, a byte that is not a doorbell (a CLC eyecatcher's first byte).
        block += 1;
        let b = if junk_at == Some(block) { 0xE2 } else { 0x01 };
        if (b != 0x01 || rng.below(4) == 0) && doorbell(fd, b) {
            t.doorbells += 1;
        }
        if drain_gone(fd) {
            t.victim_ended = true;
            return t;
        }
        if Instant::now() >= end {
            return t;
        }
    }
}

fn peer(addr: &str, secs: u64, seed: u64) {
    let addr: SocketAddrV4 = match addr.parse::<SocketAddr>() {
        Ok(SocketAddr::V4(a)) => a,
        _ => die(format!("{addr}: an IPv4 ADDR:PORT")),
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut dev = smc_ism::Client::connect(&smc_ism::default_socket_path())
        .unwrap_or_else(|e| die(format!("loopback-ism daemon: {e}")));
    let gid = dev
        .query_gid()
        .unwrap_or_else(|e| die(format!("QUERY_GID: {e}")));
    let mut rng = rng(seed);
    let (mut conns, mut established, mut legit, mut ended, mut iters, mut bells, mut holes) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut echoed = 0u64;
    while Instant::now() < deadline {
        conns += 1;
        let cycle = Instant::now();
        let fd = connect_opted_in(addr).unwrap_or_else(|e| die(e));
        let raw = fd.as_raw_fd();
        let port = local_port(raw);
        match handshake(&mut dev, gid, raw) {
            Err(why) => say(format!("NOSMC {conns} port={port} {why}")),
            Ok((own, peer)) => {
                established += 1;
                let ok = legit_exchange(raw, &own, &peer, &mut rng);
                legit += ok as u64;
                // The first three connections take one profile each, then at random.
                let profile = match (established, rng.below(20)) {
                    (1, _) => Profile::Plausible,
                    (2, _) => Profile::Chaos,
                    (3, _) => Profile::Flags,
                    (_, 0..=9) => Profile::Chaos,
                    (_, 10..=16) => Profile::Plausible,
                    _ => Profile::Flags,
                };
                // The memfds are sealed: neither may be shrunk or grown under the victim
                // (a mapping beyond the end of its file would SIGBUS it).
                let truncated = [&own, &peer].iter().any(|m| {
                    [0, m.map.len() as libc::off_t * 2].iter().any(|&len| {
                        // SAFETY: plain syscall on a memfd the daemon gave us.
                        unsafe { libc::ftruncate(m.dmb.fd.as_raw_fd(), len) == 0 }
                    })
                });
                // A plausible connection lives until the timer: keep it shorter, so that the
                // profiles that end connections get their share of the time.
                let ms = match profile {
                    Profile::Plausible => rng.range(50, 400),
                    _ => rng.range(50, 1500),
                };
                let end = (Instant::now() + Duration::from_millis(ms)).min(deadline);
                let junk_at = (rng.below(20) == 0).then(|| rng.below(2000));
                let t = scribble(raw, &own, &peer, profile, end, junk_at, &mut rng);
                iters += t.iters;
                bells += t.doorbells;
                ended += t.victim_ended as u64;
                holes += t.holes;
                echoed += t.echoed;
                say(format!(
                    "ATTACK {conns} port={port} profile={profile:?} legit={} iters={} \
                     doorbells={} holes={} junk={} truncate={} echoed={} echo={} ended={}",
                    if ok { "ok" } else { "bad" },
                    t.iters,
                    t.doorbells,
                    t.holes,
                    junk_at.is_some(),
                    if truncated { "ALLOWED" } else { "refused" },
                    t.echoed,
                    t.echo_bad
                        .as_deref()
                        .map_or("ok".into(), |b| format!("BAD({b})")),
                    if t.victim_ended { "victim" } else { "timer" }
                ));
                // Our references go back; the victim's mapping keeps its memory.
                let _ = dev.detach_dmb(peer.dmb.token);
                let _ = dev.unregister_dmb(own.dmb.token);
            }
        }
        drop(fd);
        // At most ~50 connections a second: the victim's side of each closed connection
        // stays in TIME_WAIT, and the ports toward one address are finite.
        if let Some(rest) = Duration::from_millis(20).checked_sub(cycle.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    say(format!(
        "HOSTILE conns={conns} established={established} legit={legit} victim_ended={ended} \
         iters={iters} doorbells={bells} holes={holes} echoed={echoed}"
    ));
}

/// The client side of the CLC handshake over `fd`, with our own DMB registered and the
/// victim's attached (our socket as the proof) and both mapped.
fn handshake(
    dev: &mut smc_ism::Client,
    gid: smc_ism::Gid,
    fd: i32,
) -> Result<(Mapped, Mapped), String> {
    if !peer_announced_smc(fd) {
        return Err("the victim did not announce SMC".into());
    }
    let mut cfg = Config::loopback(clc::Gid {
        gid: gid.gid,
        gid_ext: gid.gid_ext,
    });
    // 16 KiB: the smallest ring, so cursors wrap often.
    cfg.dmb_size_code = 0;
    let mut m = Handshake::client(cfg, true);
    let mut todo: VecDeque<Action> = m.start().into();
    let mut dmbs: Option<(smc_ism::Dmb, smc_ism::Dmb)> = None;
    // Our DMB is registered right after the proposal, as the data path's client does (its
    // server attaches it by connection right after its accept).
    let mut ahead: Option<smc_ism::Dmb> = None;
    let mut proposed = false;
    loop {
        while let Some(a) = todo.pop_front() {
            match a {
                Action::Send(b) => {
                    write_all(fd, &b).map_err(|e| e.to_string())?;
                    if !proposed {
                        proposed = true;
                        ahead = dev.register_dmb(0, fd).ok();
                    }
                }
                Action::RegisterDmb { size_code } => {
                    let pd = m.peer_dmb().ok_or("asked to register without a peer DMB")?;
                    let own = match ahead.take() {
                        Some(o) if o.size_code == size_code => Ok(o),
                        other => {
                            if let Some(o) = other {
                                let _ = dev.unregister_dmb(o.token);
                            }
                            dev.register_dmb(size_code, fd)
                        }
                    };
                    let got = own.and_then(|o| {
                        dev.attach_dmb(pd.token, fd)
                            .inspect_err(|_| {
                                let _ = dev.unregister_dmb(o.token);
                            })
                            .map(|p| (o, p))
                    });
                    match got {
                        Ok((o, p)) => {
                            let local = LocalDmb {
                                token: o.token,
                                idx: o.idx,
                                size_code: o.size_code,
                            };
                            dmbs = Some((o, p));
                            todo.extend(m.handle(Input::DmbRegistered(local)));
                        }
                        Err(e) => {
                            eprintln!("smc-hostile: DMB: {e}");
                            todo.extend(m.handle(Input::DmbFailed(DmbFailure::Internal)));
                        }
                    }
                }
                Action::ReleaseDmb(d) => {
                    let _ = dev.unregister_dmb(d.token);
                }
                Action::Established(_) => {
                    let (o, p) = dmbs.take().ok_or("established without DMBs")?;
                    let own = Mapped::new(o).map_err(|e| e.to_string())?;
                    let peer = Mapped::new(p).map_err(|e| e.to_string())?;
                    return Ok((own, peer));
                }
                Action::Fallback(fb) => return Err(format!("fallback: {fb:?}")),
            }
        }
        let msg = read_clc(fd).map_err(|e| e.to_string())?;
        todo.extend(m.handle(Input::Message(&msg)));
    }
}

/// `sweep KIND`: asks the daemon (`SMC_CTL_SOCK` or the default socket) for an `OP_SWEEP` of a
/// socket of its own: `listener` (a listening TCP socket on an ephemeral port), `connected`
/// (an established TCP connection to such a listener), `udp`. Prints `SWEEP ok` or
/// `SWEEP refused <error>`.
fn sweep(kind: &str) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| die(format!("{e}")));
    let addr = l.local_addr().unwrap_or_else(|e| die(format!("{e}")));
    let c;
    let u;
    let fd = match kind {
        "listener" => l.as_raw_fd(),
        "connected" => {
            c = std::net::TcpStream::connect(addr).unwrap_or_else(|e| die(format!("{e}")));
            c.as_raw_fd()
        }
        "udp" => {
            u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap_or_else(|e| die(format!("{e}")));
            u.as_raw_fd()
        }
        other => die(format!("unknown socket kind {other}")),
    };
    let path = env::var_os("SMC_CTL_SOCK")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(smc_ism::default_socket_path);
    match smc_ism::SharedClient::new(&path).sweep(fd) {
        Ok(()) => println!("SWEEP ok"),
        Err(e) => println!("SWEEP refused {e}"),
    }
}

fn main() {
    let args: Vec<String> = env::args().collect();
    let arg = |i: usize| -> &str {
        args.get(i).map(String::as_str).unwrap_or_else(|| {
            die("usage: smc-hostile victim | honest ADDR:PORT SEED | peer ADDR:PORT SECS SEED | sweep listener|connected|udp")
        })
    };
    let num = |i: usize| -> u64 {
        arg(i)
            .parse()
            .unwrap_or_else(|e| die(format!("{}: {e}", arg(i))))
    };
    match arg(1) {
        "victim" => victim(),
        "honest" => honest(arg(2), num(3)),
        "peer" => peer(arg(2), num(3), num(4)),
        "sweep" => sweep(arg(2)),
        other => die(format!("unknown mode {other}")),
    }
}
