//! Test client/server for the data-path integration tests (`tests/tests/preload_*.rs`).
//!
//! Protocol: the client sends a 16-byte header (seed u64 LE, bytes the server must send u64 LE),
//! then streams its own bytes and shuts down writing; the server streams back the requested
//! number of bytes concurrently and shuts down writing. Both print SHA-256 of what they sent
//! and received, so the test compares the two ends.
//!
//! ```text
//! preload-prog server PORT thread|fork|epoll|poll [MAX_CONNS]
//! preload-prog client HOST PORT SEND RECV SEED
//! preload-prog storm HOST PORT THREADS FORKS BYTES [stops=N] [stop_children=N] [close=1]
//!                    [ballast=MIB]
//! preload-prog share HOST PORT BYTES READERS
//! preload-prog sigfork N
//! preload-prog sigepoll N
//! preload-prog sigclose N close|dup2|close_range|fork_exec|close_inflight [mt][epoll]
//! ```
//!
//! `storm`: THREADS threads make connections back to back (each sends 4 KiB, receives BYTES,
//! both checked) while the main thread forks FORKS children, at most 8 at a time; each child
//! makes one such connection and exits (0: exact, 1: wrong bytes, 2: an error such as a
//! reset). A child not done 30 s after its fork is killed and counted as hung (its
//! stacks are printed first when `gdb` is installed). At `stops`
//! (default 1) points, the first after FORKS/4 forks and the others spread over the rest, it
//! prints `PHASE stop` and waits for a line on stdin (the test stops the daemon), forks
//! `stop_children` (default 16) more, prints `PHASE cont` and waits again (the daemon
//! continues). With `close=1` each child first closes every descriptor it inherited above 2
//! (`close_range`, as a program about to `exec` does), the threads' connections among them.
//! `ballast=MIB` touches that much memory first, so that each fork takes longer (the page
//! tables are copied) while the threads go on. At the end: `STORM forks=<n> ok=<n> bad=<n>
//! reset=<n> hung=<n> conns=<n> badconns=<n> resetconns=<n>` (`bad`: every call succeeded but
//! the bytes were wrong; `reset`: a call failed). A failed connection prints `STORM-BAD pid
//! <pid>: <why>` on stderr.
//!
//! `share`: asks the server for BYTES of the counter stream (seed bit 63: 8-byte words
//! `offset / 8 ^ mask`, so that 15 bytes tell where they are) and reads the connection in this
//! process and in children forked meanwhile (at most READERS at a time, each does 1 to 20 reads
//! of random sizes, closes its descriptor and exits). Every chunk is placed in the stream and
//! marked in a bitmap shared by all: `SHARE total= read= dup= bad= small= holes= reads= forks=`
//! (`dup`: bytes read twice; `bad`: chunks that are no piece of the stream; `small`: bytes of
//! chunks too short to place, which must equal the `holes` left in the bitmap).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};

struct Gen {
    rng: smc_harness::Rng,
    buf: Vec<u8>,
}

impl Gen {
    fn new(seed: u64) -> Gen {
        Gen {
            rng: smc_harness::Rng::with_state(seed),
            buf: Vec::new(),
        }
    }
    fn next(&mut self) -> u64 {
        self.rng.next_u64()
    }
    /// Next chunk of the stream, of a random size up to `max`.
    fn chunk(&mut self, max: usize, remaining: u64) -> &[u8] {
        let n = ((self.next() % max as u64) + 1).min(remaining) as usize;
        self.buf.clear();
        while self.buf.len() < n {
            let v = self.next().to_le_bytes();
            self.buf.extend_from_slice(&v);
        }
        self.buf.truncate(n);
        &self.buf
    }
}

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn send_stream(w: &mut impl Write, seed: u64, total: u64) -> std::io::Result<String> {
    let mut g = Gen::new(seed);
    let mut h = Sha256::new();
    let mut sent = 0u64;
    while sent < total {
        let c = g.chunk(256 * 1024, total - sent).to_vec();
        w.write_all(&c)?;
        h.update(&c);
        sent += c.len() as u64;
    }
    Ok(hex(&h.finalize()))
}

fn recv_stream(r: &mut impl Read, seed: u64) -> std::io::Result<(u64, String)> {
    let mut g = Gen::new(seed);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 300 * 1024];
    let mut total = 0u64;
    loop {
        let n = (g.next() % buf.len() as u64) as usize + 1;
        let k = r.read(&mut buf[..n])?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        total += k as u64;
    }
    Ok((total, hex(&h.finalize())))
}

fn serve_blocking(s: TcpStream) -> std::io::Result<String> {
    let mut s = s;
    let mut hdr = [0u8; 16];
    s.read_exact(&mut hdr)?;
    let seed = u64::from_le_bytes(hdr[..8].try_into().unwrap());
    let want = u64::from_le_bytes(hdr[8..].try_into().unwrap());
    // A dup'd fd for the writer thread: exercises dup + two threads on one connection.
    let mut w = s.try_clone()?;
    let t = std::thread::spawn(move || -> std::io::Result<String> {
        let sha = if seed & COUNTER_STREAM != 0 {
            send_counter(&mut w, seed ^ 0x5555, want)?
        } else {
            send_stream(&mut w, seed ^ 0x5555, want)?
        };
        w.shutdown(Shutdown::Write)?;
        Ok(sha)
    });
    let (rx, sha_rx) = recv_stream(&mut s, seed ^ 0xAAAA)?;
    let sha_tx = t.join().unwrap()?;
    Ok(format!(
        "CONN rx={rx} sha_rx={sha_rx} tx={want} sha_tx={sha_tx}"
    ))
}

/// One connection with a single thread, non-blocking, driven by poll().
fn serve_poll(s: TcpStream) -> std::io::Result<String> {
    let fd = s.as_raw_fd();
    let mut hdr = [0u8; 16];
    let mut s2 = &s;
    s2.read_exact(&mut hdr)?;
    s.set_nonblocking(true)?;
    let seed = u64::from_le_bytes(hdr[..8].try_into().unwrap());
    let want = u64::from_le_bytes(hdr[8..].try_into().unwrap());
    let mut g = Gen::new(seed ^ 0x5555);
    let mut hs = Sha256::new();
    let mut hr = Sha256::new();
    let mut sent = 0u64;
    let mut pending: Vec<u8> = Vec::new();
    let mut rx = 0u64;
    let mut rd_open = true;
    let mut wr_open = true;
    let mut buf = vec![0u8; 128 * 1024];
    while rd_open || wr_open {
        let mut pfd = libc::pollfd {
            fd,
            events: (if rd_open { libc::POLLIN } else { 0 })
                | (if wr_open { libc::POLLOUT } else { 0 }),
            revents: 0,
        };
        // SAFETY: one pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 10_000) };
        if r == 0 {
            return Err(std::io::Error::other(
                "poll timeout (no readiness for 10 s)",
            ));
        }
        if r < 0 {
            continue;
        }
        if rd_open && pfd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
            loop {
                match s2.read(&mut buf) {
                    Ok(0) => {
                        rd_open = false;
                        break;
                    }
                    Ok(n) => {
                        hr.update(&buf[..n]);
                        rx += n as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        if wr_open && pfd.revents & libc::POLLOUT != 0 {
            loop {
                if pending.is_empty() {
                    if sent == want {
                        s.shutdown(Shutdown::Write)?;
                        wr_open = false;
                        break;
                    }
                    let c = g.chunk(100_000, want - sent).to_vec();
                    sent += c.len() as u64;
                    hs.update(&c);
                    pending = c;
                }
                match s2.write(&pending) {
                    Ok(n) => {
                        pending.drain(..n);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(format!(
        "CONN rx={rx} sha_rx={} tx={want} sha_tx={}",
        hex(&hr.finalize()),
        hex(&hs.finalize())
    ))
}

struct EConn {
    s: TcpStream,
    hdr: Vec<u8>,
    seed: u64,
    want: u64,
    g: Option<Gen>,
    sent: u64,
    pending: Vec<u8>,
    hs: Sha256,
    hr: Sha256,
    rx: u64,
    rd_open: bool,
    wr_open: bool,
}

/// Edge-triggered epoll server, one thread, many connections.
fn serve_epoll(l: TcpListener, max: usize) -> std::io::Result<()> {
    l.set_nonblocking(true)?;
    // SAFETY: plain syscalls.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    let lfd = l.as_raw_fd();
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: u64::MAX,
    };
    // SAFETY: `ep` and `lfd` are open fds of this thread; `ev` is a live epoll_event the kernel
    // copies.
    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, lfd, &mut ev) };
    let mut conns: std::collections::HashMap<u64, EConn> = Default::default();
    let mut next_id = 0u64;
    let mut done = 0usize;
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut buf = vec![0u8; 128 * 1024];
    while done < max {
        // SAFETY: `evs` holds 64 writable epoll_events, the count passed.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 64, 20_000) };
        if n == 0 {
            return Err(std::io::Error::other("epoll_wait: no event for 20 s"));
        }
        for e in evs.iter().take(n.max(0) as usize) {
            let (events, id) = (e.events, e.u64);
            if id == u64::MAX {
                while let Ok((s, _)) = l.accept() {
                    s.set_nonblocking(true)?;
                    let mut ev = libc::epoll_event {
                        events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET | libc::EPOLLRDHUP)
                            as u32,
                        u64: next_id,
                    };
                    // SAFETY: `ep` and `s` are open fds we own; `ev` is a live epoll_event the
                    // kernel copies.
                    unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
                    conns.insert(
                        next_id,
                        EConn {
                            s,
                            hdr: Vec::new(),
                            seed: 0,
                            want: 0,
                            g: None,
                            sent: 0,
                            pending: Vec::new(),
                            hs: Sha256::new(),
                            hr: Sha256::new(),
                            rx: 0,
                            rd_open: true,
                            wr_open: true,
                        },
                    );
                    next_id += 1;
                }
                continue;
            }
            let Some(c) = conns.get_mut(&id) else {
                continue;
            };
            let _ = events;
            // Edge-triggered: drain reads and fill writes until EAGAIN.
            let mut s = &c.s;
            while c.rd_open {
                match s.read(&mut buf) {
                    Ok(0) => c.rd_open = false,
                    Ok(k) => {
                        let mut data = &buf[..k];
                        if c.hdr.len() < 16 {
                            let t = (16 - c.hdr.len()).min(data.len());
                            c.hdr.extend_from_slice(&data[..t]);
                            data = &data[t..];
                            if c.hdr.len() == 16 {
                                c.seed = u64::from_le_bytes(c.hdr[..8].try_into().unwrap());
                                c.want = u64::from_le_bytes(c.hdr[8..].try_into().unwrap());
                                c.g = Some(Gen::new(c.seed ^ 0x5555));
                            }
                        }
                        c.hr.update(data);
                        c.rx += data.len() as u64;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            while c.wr_open {
                let Some(g) = c.g.as_mut() else { break };
                if c.pending.is_empty() {
                    if c.sent == c.want {
                        c.s.shutdown(Shutdown::Write)?;
                        c.wr_open = false;
                        break;
                    }
                    let rem = c.want - c.sent;
                    let ch = g.chunk(100_000, rem).to_vec();
                    c.sent += ch.len() as u64;
                    c.hs.update(&ch);
                    c.pending = ch;
                }
                match s.write(&c.pending) {
                    Ok(k) => {
                        c.pending.drain(..k);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
            if !c.rd_open && !c.wr_open {
                let c = conns.remove(&id).unwrap();
                println!(
                    "CONN rx={} sha_rx={} tx={} sha_tx={}",
                    c.rx,
                    hex(&c.hr.finalize()),
                    c.want,
                    hex(&c.hs.finalize())
                );
                done += 1;
            }
        }
    }
    Ok(())
}

/// How one storm connection ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StormEnd {
    Exact,
    /// Every call succeeded but the bytes received were not the server's stream.
    Wrong,
    /// A call failed (a reset, a refused connection, ...).
    Error,
}

/// One storm connection: sends 4 KiB, receives `bytes`; whether both are exact.
fn storm_conn(host: &str, port: u16, seed: u64, bytes: u64, want_sha: &str) -> StormEnd {
    let run = || -> std::io::Result<StormEnd> {
        let mut s = TcpStream::connect((host, port))?;
        let mut hdr = [0u8; 16];
        hdr[..8].copy_from_slice(&seed.to_le_bytes());
        hdr[8..].copy_from_slice(&bytes.to_le_bytes());
        s.write_all(&hdr)?;
        send_stream(&mut s, seed ^ 0xAAAA, 4096)?;
        s.shutdown(Shutdown::Write)?;
        // At most one byte more than the server sends: a stream that carries CLC bytes as
        // data (the server read a late Decline as the request header) fails at once instead
        // of streaming for ever.
        let (n, sha) = recv_stream(&mut (&mut s).take(bytes + 1), seed)?;
        if n != bytes || sha != want_sha {
            eprintln!(
                "STORM-BAD pid {}: {n} bytes received, sha {sha}",
                std::process::id()
            );
            return Ok(StormEnd::Wrong);
        }
        Ok(StormEnd::Exact)
    };
    run().unwrap_or_else(|e| {
        eprintln!("STORM-BAD pid {}: {e}", std::process::id());
        StormEnd::Error
    })
}

/// The stacks of a hung child on stderr (which the test does not read), when `gdb` is installed: where it hung is the first
/// thing a failed run must tell.
fn dump_stacks(pid: libc::pid_t) {
    let _ = std::process::Command::new("gdb")
        .args([
            "-batch",
            "-p",
            &pid.to_string(),
            "-ex",
            "thread apply all bt",
        ])
        .stdout(std::io::stderr())
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Options of `storm` after its positional arguments.
struct StormOpts {
    stops: usize,
    stop_children: usize,
    close: bool,
    ballast_mib: usize,
}

impl StormOpts {
    fn parse(args: &[String]) -> StormOpts {
        let mut o = StormOpts {
            stops: 1,
            stop_children: 16,
            close: false,
            ballast_mib: 0,
        };
        for a in args {
            match a.split_once('=') {
                Some(("stops", v)) => o.stops = v.parse().unwrap(),
                Some(("stop_children", v)) => o.stop_children = v.parse().unwrap(),
                Some(("close", v)) => o.close = v == "1",
                Some(("ballast", v)) => o.ballast_mib = v.parse().unwrap(),
                _ => panic!("storm: unknown option {a:?}"),
            }
        }
        o
    }
}

fn storm(host: &str, port: u16, threads: usize, forks: usize, bytes: u64, opts: &StormOpts) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let seed = 0x5eed;
    // What the server sends for `seed` (preload-prog server: the stream of seed ^ 0x5555).
    let want = send_stream(&mut std::io::sink(), seed ^ 0x5555, bytes).unwrap();
    let ballast = vec![1u8; opts.ballast_mib << 20];
    let stop = Arc::new(AtomicBool::new(false));
    let conns = Arc::new(AtomicU64::new(0));
    let bad_conns = Arc::new(AtomicU64::new(0));
    let reset_conns = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..threads {
        let (stop, conns, bad, reset) = (
            stop.clone(),
            conns.clone(),
            bad_conns.clone(),
            reset_conns.clone(),
        );
        let (host, want) = (host.to_string(), want.clone());
        workers.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match storm_conn(&host, port, seed, bytes, &want) {
                    StormEnd::Exact => {}
                    StormEnd::Wrong => {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    StormEnd::Error => {
                        reset.fetch_add(1, Ordering::Relaxed);
                    }
                }
                conns.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let (mut ok, mut bad, mut reset, mut hung) = (0u64, 0u64, 0u64, 0u64);
    let mut live: Vec<(libc::pid_t, Instant)> = Vec::new();
    let mut reap = |live: &mut Vec<(libc::pid_t, Instant)>, max: usize| {
        while live.len() > max {
            live.retain(|&(pid, at)| {
                let mut st = 0;
                // SAFETY: our child.
                let r = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) };
                if r == pid {
                    match (libc::WIFEXITED(st), libc::WEXITSTATUS(st)) {
                        (true, 0) => ok += 1,
                        (true, 2) => reset += 1,
                        _ => bad += 1,
                    }
                    return false;
                }
                if at.elapsed() > Duration::from_secs(30) {
                    dump_stacks(pid);
                    // SAFETY: our child.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                        libc::waitpid(pid, &mut st, 0);
                    }
                    hung += 1;
                    return false;
                }
                true
            });
            if live.len() > max {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    let phase = |what: &str| {
        println!("PHASE {what}");
        std::io::stdout().flush().unwrap();
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    };
    // After how many of the FORKS children each stop starts: the first after a quarter, the
    // others spread over the rest.
    let starts: Vec<usize> = (0..opts.stops)
        .map(|k| forks / 4 + k * (forks - forks / 4) / opts.stops)
        .collect();
    let (mut total, mut no_fork) = (0usize, 0u64);
    for n in 0..=forks {
        if starts.contains(&n) {
            phase("stop");
            for _ in 0..opts.stop_children {
                reap(&mut live, 7);
                no_fork += storm_fork(&mut live, opts, || {
                    storm_conn(host, port, seed, bytes, &want)
                });
                total += 1;
            }
            phase("cont");
        }
        if n == forks {
            break;
        }
        reap(&mut live, 7);
        no_fork += storm_fork(&mut live, opts, || {
            storm_conn(host, port, seed, bytes, &want)
        });
        total += 1;
    }
    reap(&mut live, 0);
    drop(ballast);
    // A failed fork counts as a child that failed.
    let reset = reset + no_fork;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    println!(
        "STORM forks={total} ok={ok} bad={bad} reset={reset} hung={hung} conns={} badconns={} \
         resetconns={}",
        conns.load(Ordering::Relaxed),
        bad_conns.load(Ordering::Relaxed),
        reset_conns.load(Ordering::Relaxed)
    );
}

/// Forks one storm child that runs `conn` and exits with how it ended (0 exact, 1 wrong, 2
/// error); 1 when the fork failed.
fn storm_fork(
    live: &mut Vec<(libc::pid_t, std::time::Instant)>,
    opts: &StormOpts,
    conn: impl FnOnce() -> StormEnd,
) -> u64 {
    // SAFETY: the child only makes one connection and leaves with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        if opts.close {
            // SAFETY: closing descriptors this child does not use (its stdio stays).
            unsafe { libc::close_range(3, u32::MAX, 0) };
        }
        let code = match conn() {
            StormEnd::Exact => 0,
            StormEnd::Wrong => 1,
            StormEnd::Error => 2,
        };
        // SAFETY: leaving the child without running the parent's exit handlers twice.
        unsafe { libc::_exit(code) };
    }
    if pid < 0 {
        return 1;
    }
    live.push((pid, std::time::Instant::now()));
    0
}

/// Seed bit of the request header: the server sends the counter stream ([`counter_byte`])
/// instead of the seed's random one.
const COUNTER_STREAM: u64 = 1 << 63;
const COUNTER_MASK: u64 = 0x9E37_79B9_7F4A_7C15;

/// Byte `p` of the counter stream: 8-byte little-endian words `p / 8 ^ COUNTER_MASK`, so that
/// any 15 bytes of it tell where they are.
fn counter_byte(p: u64) -> u8 {
    ((p / 8) ^ COUNTER_MASK).to_le_bytes()[(p % 8) as usize]
}

/// Sends `total` bytes of the counter stream in writes of random sizes (up to 64 KiB).
fn send_counter(w: &mut impl Write, seed: u64, total: u64) -> std::io::Result<String> {
    let mut g = Gen::new(seed);
    let mut h = Sha256::new();
    let mut sent = 0u64;
    let mut buf = Vec::new();
    while sent < total {
        let n = ((g.next() % 65536) + 1).min(total - sent);
        buf.clear();
        buf.extend((sent..sent + n).map(counter_byte));
        w.write_all(&buf)?;
        h.update(&buf);
        sent += n;
    }
    Ok(hex(&h.finalize()))
}

/// Where a chunk read from the counter stream of `total` bytes starts, if it can tell (a
/// chunk of 15 bytes or more always can; a chunk that matches nowhere is `Err`).
fn counter_position(c: &[u8], total: u64) -> Result<Option<u64>, ()> {
    for k in 0..8usize {
        let Some(w) = c.get(k..k + 8) else { break };
        let v = u64::from_le_bytes(w.try_into().unwrap()) ^ COUNTER_MASK;
        let Some(p) = v.checked_mul(8).and_then(|x| x.checked_sub(k as u64)) else {
            continue;
        };
        if p.checked_add(c.len() as u64).is_some_and(|e| e <= total)
            && c.iter()
                .enumerate()
                .all(|(i, &b)| b == counter_byte(p + i as u64))
        {
            return Ok(Some(p));
        }
    }
    if c.len() >= 15 {
        Err(())
    } else {
        Ok(None)
    }
}

/// What the readers of `share` record, in a page shared by all of them.
#[repr(C)]
struct ShareArea {
    read: std::sync::atomic::AtomicU64,
    /// Bytes of chunks too short to place (counted, checked against the holes at the end).
    small: std::sync::atomic::AtomicU64,
    /// Bytes read twice.
    dup: std::sync::atomic::AtomicU64,
    /// Chunks that are not a piece of the stream.
    bad: std::sync::atomic::AtomicU64,
    reads: std::sync::atomic::AtomicU64,
}

/// `share`: one connection read by this process and by children it forks meanwhile (at most
/// READERS at a time, each doing a few reads and leaving), every chunk placed in the stream
/// and marked in a bitmap shared by all: each byte must come exactly once, to one of them.
fn share(host: &str, port: u16, total: u64, readers: usize) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let words = (total as usize).div_ceil(64);
    let len = std::mem::size_of::<ShareArea>() + words * 8;
    // SAFETY: a fresh anonymous shared mapping (zero-filled), checked below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(base, libc::MAP_FAILED, "mmap");
    // SAFETY: the mapping starts with a zeroed ShareArea (atomics only) and then `words`
    // zeroed u64 words; it lives until the process exits.
    let (area, bits) = unsafe {
        (
            &*(base as *const ShareArea),
            std::slice::from_raw_parts(
                (base as *const u8).add(std::mem::size_of::<ShareArea>()) as *const AtomicU64,
                words,
            ),
        )
    };
    let mut s = TcpStream::connect((host, port)).expect("connect");
    let mut hdr = [0u8; 16];
    hdr[..8].copy_from_slice(&COUNTER_STREAM.to_le_bytes());
    hdr[8..].copy_from_slice(&total.to_le_bytes());
    s.write_all(&hdr).expect("header");
    s.shutdown(Shutdown::Write).expect("shutdown");
    let fd = s.as_raw_fd();
    // One read of up to 64 KiB, recorded; false at EOF.
    let read_one = |g: &mut Gen, buf: &mut [u8]| -> bool {
        let n = (g.next() % buf.len() as u64) as usize + 1;
        // SAFETY: `buf` is ours, `n` within it.
        let r = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), n, 0) };
        assert!(r >= 0, "recv: {}", std::io::Error::last_os_error());
        if r == 0 {
            return false;
        }
        let c = &buf[..r as usize];
        area.reads.fetch_add(1, Ordering::Relaxed);
        area.read.fetch_add(c.len() as u64, Ordering::Relaxed);
        match counter_position(c, total) {
            Err(()) => {
                area.bad.fetch_add(1, Ordering::Relaxed);
            }
            Ok(None) => {
                area.small.fetch_add(c.len() as u64, Ordering::Relaxed);
            }
            Ok(Some(p)) => {
                for i in p..p + c.len() as u64 {
                    let m = 1u64 << (i % 64);
                    if bits[(i / 64) as usize].fetch_or(m, Ordering::Relaxed) & m != 0 {
                        area.dup.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        true
    };
    let mut g = Gen::new(std::process::id() as u64);
    let mut buf = vec![0u8; 65536];
    let mut live: Vec<libc::pid_t> = Vec::new();
    let mut forks = 0u64;
    loop {
        live.retain(|&p| {
            let mut st = 0;
            // SAFETY: our child.
            let r = unsafe { libc::waitpid(p, &mut st, libc::WNOHANG) };
            if r == p {
                assert!(
                    libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                    "reader {p} failed: {st:#x}"
                );
            }
            r != p
        });
        if live.len() < readers {
            let reads = g.next() % 20 + 1;
            // SAFETY: the child only reads the connection, records in the shared page, closes
            // its descriptor and leaves with _exit.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                let mut g = Gen::new(std::process::id() as u64 ^ 0x5ade);
                for _ in 0..reads {
                    if !read_one(&mut g, &mut buf) {
                        break;
                    }
                }
                // SAFETY: our copy of the connection's descriptor; then leave.
                unsafe {
                    libc::close(fd);
                    libc::_exit(0);
                }
            }
            assert!(pid > 0, "fork");
            live.push(pid);
            forks += 1;
        }
        if !read_one(&mut g, &mut buf) {
            break;
        }
    }
    for p in live {
        let mut st = 0;
        // SAFETY: our child.
        unsafe { libc::waitpid(p, &mut st, 0) };
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "reader {p} failed: {st:#x}"
        );
    }
    let mut holes = 0u64;
    for (i, w) in bits.iter().enumerate() {
        let v = w.load(Ordering::Relaxed);
        let valid = (total - i as u64 * 64).min(64);
        let mask = if valid == 64 { !0 } else { (1u64 << valid) - 1 };
        holes += (!v & mask).count_ones() as u64;
    }
    println!(
        "SHARE total={total} read={} dup={} bad={} small={} holes={holes} reads={} forks={forks}",
        area.read.load(Ordering::Relaxed),
        area.dup.load(Ordering::Relaxed),
        area.bad.load(Ordering::Relaxed),
        area.small.load(Ordering::Relaxed),
        area.reads.load(Ordering::Relaxed),
    );
}

/// `sigfork`: children forked from the `SIGALRM` handler so far.
static SIG_FORKS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn fork_from_handler(_: libc::c_int) {
    // SAFETY: fork is async-signal-safe; the child only leaves with `_exit`.
    let p = unsafe { libc::fork() };
    if p == 0 {
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    if p > 0 {
        SIG_FORKS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `sigfork N`: N connections to its own listener back to back (4 bytes each way), while a
/// `SIGALRM` every 200 µs forks a child from its handler (which leaves at once): the handler
/// interrupts connects, accepts, handshakes and the library's locks anywhere. Prints `SIGFORK
/// conns=<n> forks=<yes|no> badchildren=<n>` (children that did not exit with 0).
fn sigfork(n: usize) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    // SAFETY: a zeroed sigaction with our handler; SA_RESTART as a program would.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = fork_from_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let it = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 200,
            },
            it_value: libc::timeval {
                tv_sec: 0,
                tv_usec: 200,
            },
        };
        libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut());
    }
    let mut done = 0;
    let mut bad_children = 0;
    for _ in 0..n {
        let mut c = TcpStream::connect(addr).expect("connect");
        let (mut s, _) = l.accept().expect("accept");
        c.write_all(b"ping").expect("write");
        let mut b = [0u8; 4];
        s.read_exact(&mut b).expect("read");
        s.write_all(&b).expect("write back");
        c.read_exact(&mut b).expect("read back");
        assert_eq!(&b, b"ping");
        done += 1;
        bad_children += reap(libc::WNOHANG);
    }
    // SAFETY: stops the timer.
    unsafe {
        let off: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
    }
    bad_children += reap(0);
    let forks = SIG_FORKS.load(std::sync::atomic::Ordering::Relaxed) > 0;
    println!(
        "SIGFORK conns={done} forks={} badchildren={bad_children}",
        if forks { "yes" } else { "no" }
    );
}

/// `sigclose`: the connections the `SIGALRM` handler closes, in order, and how many it did.
static SIG_FDS: [std::sync::atomic::AtomicI32; 100] =
    [const { std::sync::atomic::AtomicI32::new(-1) }; 100];
static SIG_NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// 0 close, 1 dup2 of /dev/null over the number, 2 close_range of the number, 3 a fork whose
/// child execs `/bin/true` (the parent closes); then the descriptor of /dev/null shifted by 8.
static SIG_MODE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);
static SIG_FAILED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// `sigclose`: handler calls done (the connections up to there are closed).
static SIG_DONE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" {
    static environ: *const *const libc::c_char;
}

extern "C" fn goodbye_from_handler(_: libc::c_int) {
    use std::sync::atomic::Ordering::Relaxed;
    // SAFETY: errno is this thread's; saved and restored as a handler must.
    let e = unsafe { *libc::__errno_location() };
    let i = SIG_NEXT.fetch_add(1, Relaxed);
    if let Some(fd) = SIG_FDS
        .get(i)
        .map(|f| f.load(Relaxed))
        .filter(|&fd| fd >= 0)
    {
        let mode = SIG_MODE.load(Relaxed);
        // SAFETY: async-signal-safe calls on our own descriptors.
        let ok = unsafe {
            libc::send(fd, b"BYE\n".as_ptr().cast(), 4, libc::MSG_NOSIGNAL) == 4
                && match mode & 7 {
                    0 => libc::close(fd) == 0,
                    1 => libc::dup2(mode >> 3, fd) == fd,
                    2 => libc::syscall(libc::SYS_close_range, fd, fd, 0) == 0,
                    _ => {
                        let p = libc::fork();
                        if p == 0 {
                            let argv = [c"/bin/true".as_ptr(), std::ptr::null()];
                            libc::execve(c"/bin/true".as_ptr(), argv.as_ptr(), environ);
                            libc::_exit(99);
                        }
                        p > 0 && libc::close(fd) == 0
                    }
                }
        };
        if !ok {
            SIG_FAILED.fetch_add(1, Relaxed);
        }
    }
    SIG_DONE.fetch_add(1, Relaxed);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

/// `sigclose N MODE [mt]`: N connections (at most 100) to a server process forked first, each
/// greeted; then a `SIGALRM` every 200 µs whose handler sends `BYE\n` on the next one and closes
/// it (`close`, `dup2` of /dev/null over it, `close_range` of it; `fork_exec`: forks a child
/// that execs `/bin/true` with the connections not closed yet, then closes; `close_inflight`:
/// `close` while a thread of ours is blocked in `recv` on the connection, which the server
/// answers with `ok` once it read the goodbye), while the main code does
/// nothing but allocate and free (the handler lands inside `malloc` and `free`). `mt`: an idle
/// second thread (glibc's `malloc` then takes its arena lock); `epoll`: the connections are in
/// an epoll set, which the main code also waits on (timeout 0) at each turn. The server reads each connection
/// to its end, and this process waits for it with a raw `wait4` before it calls the library
/// again. Prints `SIGCLOSE handled=<n> failed=<handler calls that failed> exact=<connections
/// that carried exactly BYE\n then EOF> badchildren=<children that did not exit 0>`.
fn sigclose(n: usize, mode: &str, opts: &str) {
    use std::sync::atomic::Ordering::Relaxed;
    let (mt, epoll) = (opts.contains("mt"), opts.contains("epoll"));
    let n = n.min(SIG_FDS.len());
    let inflight = mode == "close_inflight";
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    let (mut rd, wr) = {
        let mut p = [0; 2];
        // SAFETY: valid out array.
        assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
        // SAFETY: fresh descriptors we own.
        unsafe {
            (
                std::fs::File::from_raw_fd(p[0]),
                std::fs::File::from_raw_fd(p[1]),
            )
        }
    };
    // SAFETY: the child only serves and leaves with `_exit`.
    let server = unsafe { libc::fork() };
    if server == 0 {
        drop(rd);
        let mut wr = wr;
        let mut conns = Vec::new();
        for _ in 0..n {
            let (mut s, _) = l.accept().expect("accept");
            s.write_all(b"hello").expect("greet");
            conns.push(s);
        }
        let mut exact = 0;
        if inflight {
            // Each goodbye first, then the readers' answer: the handler's closes came while
            // the readers' calls were under way.
            let mut bye = vec![false; conns.len()];
            for (s, b) in conns.iter_mut().zip(bye.iter_mut()) {
                let mut v = [0u8; 4];
                *b = s.read_exact(&mut v).is_ok() && v == *b"BYE\n";
            }
            for s in conns.iter_mut() {
                let _ = s.write_all(b"ok");
            }
            for (mut s, b) in conns.into_iter().zip(bye) {
                let mut v = Vec::new();
                if s.read_to_end(&mut v).is_ok() && v.is_empty() && b {
                    exact += 1;
                }
            }
        } else {
            for mut s in conns {
                let mut v = Vec::new();
                if s.read_to_end(&mut v).is_ok() && v == b"BYE\n" {
                    exact += 1;
                }
            }
        }
        let _ = writeln!(wr, "{exact}");
        // SAFETY: leaves the child.
        unsafe { libc::_exit(0) };
    }
    drop(wr);
    drop(l);
    let mut conns = Vec::new();
    for slot in &SIG_FDS[..n] {
        let mut c = TcpStream::connect(addr).expect("connect");
        let mut b = [0u8; 5];
        c.read_exact(&mut b).expect("greeting");
        slot.store(c.as_raw_fd(), Relaxed);
        conns.push(c.into_raw_fd());
    }
    let null = std::fs::File::open("/dev/null").expect("/dev/null");
    let m = match mode {
        "close" | "close_inflight" => 0,
        "dup2" => 1,
        "close_range" => 2,
        _ => 3,
    };
    SIG_MODE.store(m | (null.as_raw_fd() << 3), Relaxed);
    if mt {
        std::thread::spawn(|| loop {
            std::thread::park();
        });
    }
    // `close_inflight`: a thread per connection blocked in `recv` on it (SIGALRM blocked
    // there, so that the handler runs in the main code), answered after the handler closed.
    let tids: std::sync::Arc<Vec<std::sync::atomic::AtomicI32>> = std::sync::Arc::new(
        (0..n)
            .map(|_| std::sync::atomic::AtomicI32::new(0))
            .collect(),
    );
    let readers: Vec<_> = SIG_FDS[..if inflight { n } else { 0 }]
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let fd = f.load(Relaxed);
            let tids = tids.clone();
            std::thread::spawn(move || {
                // SAFETY: a local signal set; this thread's mask.
                unsafe {
                    let mut set: libc::sigset_t = std::mem::zeroed();
                    libc::sigemptyset(&mut set);
                    libc::sigaddset(&mut set, libc::SIGALRM);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                }
                // SAFETY: plain call.
                tids[i].store(unsafe { libc::gettid() }, Relaxed);
                let mut b = [0u8; 2];
                // SAFETY: valid buffer.
                let got = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 2, libc::MSG_WAITALL) };
                got == 2 && b == *b"ok"
            })
        })
        .collect();
    // Every reader asleep in its `recv` before the first close (else it reads a closed number).
    for t in tids.iter().take(readers.len()) {
        loop {
            let tid = t.load(Relaxed);
            let asleep = tid != 0
                && std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))
                    .ok()
                    .and_then(|st| st.rsplit_once(") ").map(|(_, r)| r.starts_with('S')))
                    .unwrap_or(false);
            if asleep {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
    // SAFETY: a zeroed sigaction with our handler; an interval timer.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = goodbye_from_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let t = libc::timeval {
            tv_sec: 0,
            tv_usec: 200,
        };
        let it = libc::itimerval {
            it_interval: t,
            it_value: t,
        };
        libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut());
    }
    // Allocations of mixed sizes (small ones in glibc's per-thread cache, larger ones in the
    // arena) and frees, until the handler went through every connection.
    let mut slots: Vec<Vec<u8>> = (0..256).map(|_| Vec::new()).collect();
    let mut r = 12345u32;
    // `epoll`: every connection in an epoll set, waited on (timeout 0) at each turn too.
    let ep = if epoll {
        // SAFETY: plain call.
        unsafe { libc::epoll_create1(0) }
    } else {
        -1
    };
    for f in SIG_FDS[..if epoll { n } else { 0 }].iter() {
        let fd = f.load(Relaxed);
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: valid event.
        unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 16];
    // Events the set reported for a number closed before the wait began: none (a closed
    // number's registration goes with its socket; one the handler closes during the wait may
    // still be reported by it, as by the kernel's on its way out to the handler).
    let mut events = 0;
    while SIG_NEXT.load(Relaxed) < n {
        if ep >= 0 {
            // Closed for sure: the calls done (with a second thread, others may run).
            let closed = SIG_DONE
                .load(Relaxed)
                .saturating_sub(if mt { 2 } else { 0 })
                .min(n);
            // SAFETY: valid buffer of 16 events.
            let k = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), 16, 0) }.max(0) as usize;
            events += evs[..k.min(16)]
                .iter()
                .filter(|e| {
                    let fd = e.u64 as i32;
                    SIG_FDS[..closed].iter().any(|f| f.load(Relaxed) == fd)
                })
                .count();
        }
        r = r.wrapping_mul(1_103_515_245).wrapping_add(12345);
        let j = (r >> 8) as usize % slots.len();
        let size = if (r >> 16).is_multiple_of(3) {
            (r >> 4) as usize % 200_000 + 1
        } else {
            (r >> 4) as usize % 2000 + 1
        };
        let mut v = Vec::with_capacity(size);
        v.push(1u8);
        slots[j] = v;
    }
    // SAFETY: stops the timer.
    unsafe {
        let off: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
    }
    drop(slots);
    let readers_ok = readers.into_iter().all(|r| r.join().unwrap_or(false));
    // The server sees every EOF before this process calls the library again (a raw system
    // call waits for it): the handler's close reaches the peer at once, as TCP's.
    let mut st = 0;
    // SAFETY: our server child; a local status.
    unsafe { libc::syscall(libc::SYS_wait4, server, &mut st, 0, 0usize) };
    // The children the handler forked (`fork_exec`): each execs `/bin/true`, which exits 0.
    let mut bad_children = 0;
    // SAFETY: reaps our own children into a local status.
    while unsafe { libc::syscall(libc::SYS_wait4, -1, &mut st, 0, 0usize) } > 0 {
        if !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 {
            bad_children += 1;
        }
    }
    for c in conns {
        // SAFETY: our numbers: closed by the handler already (EBADF here) or naming /dev/null
        // after its dup2 (closed here).
        unsafe { libc::close(c) };
    }
    let mut exact = String::new();
    rd.read_to_string(&mut exact).expect("server's count");
    println!(
        "SIGCLOSE handled={} failed={} exact={} badchildren={bad_children}{}{}",
        SIG_NEXT.load(Relaxed).min(n),
        SIG_FAILED.load(Relaxed),
        exact.trim(),
        if readers_ok { "" } else { " readers=failed" },
        if events == 0 {
            String::new()
        } else {
            format!(" epoll_events={events}")
        }
    );
}

/// Reaps exited children (every one with `flags` 0; those done with `WNOHANG`): how many did
/// not exit with status 0 (a child of `sigfork` only calls `_exit(0)`).
fn reap(flags: libc::c_int) -> usize {
    let mut bad = 0;
    loop {
        let mut st = 0;
        // SAFETY: reaps our own children into a local status.
        if unsafe { libc::waitpid(-1, &mut st, flags) } <= 0 {
            return bad;
        }
        if !libc::WIFEXITED(st) || libc::WEXITSTATUS(st) != 0 {
            bad += 1;
        }
    }
}

/// `sigepoll`: the epoll set and the connection its `SIGALRM` handler changes.
static SIG_EPOLL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static SIG_EPOLL_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);
static SIG_EPOLL_N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

extern "C" fn epoll_from_handler(_: libc::c_int) {
    use std::sync::atomic::Ordering::Relaxed;
    let n = SIG_EPOLL_N.fetch_add(1, Relaxed);
    let mut ev = libc::epoll_event {
        events: if n.is_multiple_of(2) {
            libc::EPOLLIN as u32
        } else {
            (libc::EPOLLIN | libc::EPOLLOUT) as u32
        },
        u64: 2,
    };
    // SAFETY: epoll_ctl is a system call; the numbers are the program's own, `ev` is local.
    unsafe {
        libc::epoll_ctl(
            SIG_EPOLL.load(Relaxed),
            libc::EPOLL_CTL_MOD,
            SIG_EPOLL_FD.load(Relaxed),
            &mut ev,
        )
    };
}

/// `sigepoll N`: two connections to its own listener in one epoll set; N rounds of a byte sent
/// on the first and waited for with `epoll_wait`, while a `SIGALRM` every 200 µs changes the
/// second's interest from its handler (`epoll_ctl` is a system call): the handler interrupts the
/// program's waits anywhere. Prints `SIGEPOLL rounds=<n> handled=<yes|no>`.
fn sigepoll(n: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().unwrap();
    let c1 = TcpStream::connect(addr).expect("connect");
    let (mut s1, _) = l.accept().expect("accept");
    let c2 = TcpStream::connect(addr).expect("connect");
    let (_s2, _) = l.accept().expect("accept");
    // SAFETY: plain epoll calls on our own descriptors with local events.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    for (fd, tag) in [(c1.as_raw_fd(), 1u64), (c2.as_raw_fd(), 2)] {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: tag,
        };
        // SAFETY: as above.
        let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(r, 0);
    }
    SIG_EPOLL.store(ep, Relaxed);
    SIG_EPOLL_FD.store(c2.as_raw_fd(), Relaxed);
    // SAFETY: a zeroed sigaction with our handler; SA_RESTART as a program would; a timer.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = epoll_from_handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigaction(libc::SIGALRM, &sa, std::ptr::null_mut());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 200,
        };
        let it = libc::itimerval {
            it_interval: tv,
            it_value: tv,
        };
        libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut());
    }
    let mut c1 = c1;
    let mut rounds = 0;
    let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
    for _ in 0..n {
        s1.write_all(b"x").expect("write");
        let mut got = false;
        while !got {
            // SAFETY: `evs` is writable for its length.
            let r = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, 1000) };
            if r < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            assert!(r > 0, "epoll_wait: {r} {}", std::io::Error::last_os_error());
            got = evs[..r as usize].iter().any(|e| e.u64 == 1);
        }
        let mut b = [0u8; 1];
        c1.read_exact(&mut b).expect("read");
        assert_eq!(&b, b"x");
        rounds += 1;
    }
    // SAFETY: stops the timer.
    unsafe {
        let off: libc::itimerval = std::mem::zeroed();
        libc::setitimer(libc::ITIMER_REAL, &off, std::ptr::null_mut());
    }
    let handled = SIG_EPOLL_N.load(Relaxed) > 0;
    println!(
        "SIGEPOLL rounds={rounds} handled={}",
        if handled { "yes" } else { "no" }
    );
    drop(c2);
}

/// An epoll set shared by `fork`: the parent registers its connection (data 7; `et`:
/// edge-triggered) only after the fork, the peer writes, and the child waits on the set (1.5 s)
/// and reads, twice. One line per round: what the child's `epoll_wait` returned and with which
/// data (red team rt25 `rt25.c ep_add_after_fork`).
fn epfork(et: bool) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let c = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
    let (mut s, _) = l.accept().expect("accept");
    s.write_all(b"h").unwrap();
    let mut b = [0u8; 1];
    (&c).read_exact(&mut b).unwrap();
    let cfd = c.as_raw_fd();
    // SAFETY: plain epoll calls on our own descriptors with local events.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    assert!(ep >= 0);
    let (go_r, go_w) = pipe_pair();
    let (back_r, back_w) = pipe_pair();
    std::io::stdout().flush().unwrap();
    // SAFETY: the child only waits on the set, reads, writes to its pipes and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        for round in 0..2 {
            let mut x = [0u8; 1];
            // SAFETY: valid buffer.
            if unsafe { libc::read(go_r, x.as_mut_ptr().cast(), 1) } != 1 {
                // SAFETY: exit without destructors (fork child).
                unsafe { libc::_exit(1) };
            }
            let mut ev = [libc::epoll_event { events: 0, u64: 0 }; 4];
            // SAFETY: 4 entries.
            let n = unsafe { libc::epoll_wait(ep, ev.as_mut_ptr(), 4, 1500) };
            let mut buf = [0u8; 64];
            let got = if n > 0 {
                // SAFETY: valid buffer.
                unsafe { libc::recv(cfd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) }
            } else {
                -9
            };
            let data = if n > 0 { ev[0].u64 } else { 0 };
            println!("round {round}: epoll_wait {n} data {data:#x} read {got}");
            std::io::stdout().flush().unwrap();
            // SAFETY: valid buffer.
            unsafe { libc::write(back_w, b"k".as_ptr().cast(), 1) };
        }
        // SAFETY: exit without destructors (fork child).
        unsafe { libc::_exit(0) };
    }
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32 | if et { libc::EPOLLET as u32 } else { 0 },
        u64: 7,
    };
    // SAFETY: our own set and connection, a local event.
    let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, cfd, &mut ev) };
    assert_eq!(r, 0);
    for msg in [&b"one"[..], b"two"] {
        s.write_all(msg).unwrap();
        let mut x = [0u8; 1];
        // SAFETY: valid buffers of our pipes.
        unsafe {
            libc::write(go_w, b"g".as_ptr().cast(), 1);
            libc::read(back_r, x.as_mut_ptr().cast(), 1);
        }
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
}

fn pipe_pair() -> (libc::c_int, libc::c_int) {
    let mut p = [0; 2];
    // SAFETY: two ints for the kernel to fill.
    assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
    (p[0], p[1])
}

/// A program that takes a descriptor table of its own (`how`: `close_range` with
/// `CLOSE_RANGE_UNSHARE` over its whole range, as daemons do at start, or `unshare` with
/// `CLONE_FILES`), with an idle second thread when `threads` is 2, then makes loopback
/// connections, closes them and makes more at the same numbers: each line what a step read
/// (red team round 29).
fn unshare_then_connect(how: &str, threads: u32) {
    if threads == 2 {
        std::thread::spawn(|| loop {
            std::thread::park();
        });
    }
    // SAFETY: plain system calls on this process's own table.
    let r = unsafe {
        if how == "close_range" {
            libc::close_range(3, u32::MAX, libc::CLOSE_RANGE_UNSHARE as i32)
        } else {
            libc::unshare(libc::CLONE_FILES)
        }
    };
    println!("{how}: {r}");
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    for round in 0..4 {
        let mut c = TcpStream::connect(l.local_addr().unwrap()).expect("connect");
        let (mut s, _) = l.accept().expect("accept");
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(b"back").unwrap();
        let mut got = [0u8; 16];
        let n = c.read(&mut got).unwrap();
        println!(
            "round {round}: server read {:?}, client read {:?}",
            String::from_utf8_lossy(&b),
            String::from_utf8_lossy(&got[..n])
        );
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    match a.get(1).map(String::as_str) {
        Some("unshare") => unshare_then_connect(
            a.get(2).map(String::as_str).unwrap_or("close_range"),
            a.get(3).and_then(|v| v.parse().ok()).unwrap_or(1),
        ),
        Some("epfork") => epfork(a.get(2).is_some_and(|m| m == "et")),
        Some("sigfork") => sigfork(a.get(2).and_then(|v| v.parse().ok()).unwrap_or(2000)),
        Some("sigepoll") => sigepoll(a.get(2).and_then(|v| v.parse().ok()).unwrap_or(20000)),
        Some("sigclose") => sigclose(
            a.get(2).and_then(|v| v.parse().ok()).unwrap_or(100),
            a.get(3).map(String::as_str).unwrap_or("close"),
            a.get(4).map(String::as_str).unwrap_or(""),
        ),
        Some("server") => {
            let port: u16 = a[2].parse().unwrap();
            let mode = a.get(3).map(String::as_str).unwrap_or("thread");
            let max: usize = a.get(4).map(|v| v.parse().unwrap()).unwrap_or(usize::MAX);
            let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
            println!("READY {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            if mode == "epoll" {
                serve_epoll(l, max).expect("epoll server");
                return;
            }
            let mut handles = Vec::new();
            for (i, s) in l.incoming().enumerate() {
                let s = s.expect("accept");
                match mode {
                    "fork" => {
                        // SAFETY: the child only serves this connection and exits.
                        let pid = unsafe { libc::fork() };
                        if pid == 0 {
                            drop(l);
                            let r = serve_poll(s);
                            match r {
                                Ok(line) => println!("{line}"),
                                Err(e) => println!("ERR {e}"),
                            }
                            std::io::stdout().flush().unwrap();
                            // SAFETY: in the forked child: leave without running the parent's
                            // atexit handlers or destructors.
                            unsafe { libc::_exit(0) };
                        }
                        drop(s);
                    }
                    "poll" => match serve_poll(s) {
                        Ok(line) => println!("{line}"),
                        Err(e) => println!("ERR {e}"),
                    },
                    _ => {
                        // Joined as they finish: a joinable thread's stack (2 MiB and a guard
                        // page) stays mapped until it is joined, and a long run would reach
                        // vm.max_map_count.
                        let (done, running): (Vec<_>, Vec<_>) = handles
                            .drain(..)
                            .partition(|h: &std::thread::JoinHandle<()>| h.is_finished());
                        handles = running;
                        for h in done {
                            h.join().unwrap();
                        }
                        handles.push(std::thread::spawn(move || {
                            match serve_blocking(s) {
                                Ok(line) => println!("{line}"),
                                Err(e) => println!("ERR {e}"),
                            }
                            std::io::stdout().flush().unwrap();
                        }))
                    }
                }
                std::io::stdout().flush().unwrap();
                if i + 1 >= max {
                    break;
                }
            }
            for h in handles {
                h.join().unwrap();
            }
            if mode == "fork" {
                // Reap the children.
                loop {
                    let mut st = 0;
                    // SAFETY: `st` is a writable int for the child's status.
                    if unsafe { libc::wait(&mut st) } < 0 {
                        break;
                    }
                }
            }
        }
        Some("client") => {
            let host = &a[2];
            let port: u16 = a[3].parse().unwrap();
            let send: u64 = a[4].parse().unwrap();
            let recv: u64 = a[5].parse().unwrap();
            let seed: u64 = a[6].parse().unwrap();
            let s = TcpStream::connect((host.as_str(), port)).expect("connect");
            let mut w = s.try_clone().unwrap();
            let mut hdr = [0u8; 16];
            hdr[..8].copy_from_slice(&seed.to_le_bytes());
            hdr[8..].copy_from_slice(&recv.to_le_bytes());
            w.write_all(&hdr).unwrap();
            let t = std::thread::spawn(move || {
                let sha = send_stream(&mut w, seed ^ 0xAAAA, send).expect("send");
                w.shutdown(Shutdown::Write).unwrap();
                sha
            });
            let mut r = s;
            let res = recv_stream(&mut r, seed);
            let sha_tx = t.join().unwrap();
            match res {
                Ok((rx, sha_rx)) => {
                    println!("CLIENT rx={rx} sha_rx={sha_rx} tx={send} sha_tx={sha_tx}")
                }
                Err(e) => println!("CLIENT ERR {e}"),
            }
        }
        Some("storm") => {
            let port: u16 = a[3].parse().unwrap();
            let threads: usize = a[4].parse().unwrap();
            let forks: usize = a[5].parse().unwrap();
            let bytes: u64 = a[6].parse().unwrap();
            storm(
                &a[2],
                port,
                threads,
                forks,
                bytes,
                &StormOpts::parse(&a[7..]),
            );
        }
        Some("share") => {
            let port: u16 = a[3].parse().unwrap();
            let total: u64 = a[4].parse().unwrap();
            let readers: usize = a[5].parse().unwrap();
            share(&a[2], port, total, readers);
        }
        Some("sink") => {
            // Connect, read until EOF or error, report how it ended.
            let host = &a[2];
            let port: u16 = a[3].parse().unwrap();
            let s = TcpStream::connect((host.as_str(), port)).expect("connect");
            let mut r = s;
            let mut buf = vec![0u8; 65536];
            let mut total = 0u64;
            loop {
                match r.read(&mut buf) {
                    Ok(0) => {
                        println!("SINK EOF {total}");
                        break;
                    }
                    Ok(n) => total += n as u64,
                    Err(e) => {
                        println!("SINK ERR {} {total}", e.raw_os_error().unwrap_or(0));
                        break;
                    }
                }
            }
        }
        Some("source") => {
            // Accept one connection and write forever (until killed or EPIPE).
            let port: u16 = a[2].parse().unwrap();
            let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
            println!("READY {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            let (s, _) = l.accept().unwrap();
            let fd = s.into_raw_fd();
            // SAFETY: `fd` came from `into_raw_fd` just above: we own it and nothing else closes
            // it.
            let mut s = unsafe { TcpStream::from_raw_fd(fd) };
            let buf = vec![7u8; 65536];
            let mut total = 0u64;
            loop {
                match s.write(&buf) {
                    Ok(n) => total += n as u64,
                    Err(e) => {
                        println!("SOURCE ERR {} {total}", e.raw_os_error().unwrap_or(0));
                        break;
                    }
                }
            }
        }
        Some("exec-server") => {
            // Accept one connection and exec ourselves with it inherited.
            let port: u16 = a[2].parse().unwrap();
            let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
            println!("READY {}", l.local_addr().unwrap().port());
            std::io::stdout().flush().unwrap();
            let (s, _) = l.accept().unwrap();
            // Let the client's bytes (and doorbells) arrive first.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let fd = s.into_raw_fd();
            // SAFETY: clearing FD_CLOEXEC on our own fd.
            unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
            let exe = std::env::current_exe().unwrap();
            let err = std::os::unix::process::CommandExt::exec(
                std::process::Command::new(exe).args(["readfd", &fd.to_string()]),
            );
            panic!("exec: {err}");
        }
        Some("readfd") => {
            let fd: i32 = a[2].parse().unwrap();
            let mut buf = vec![0u8; 65536];
            let mut total = 0usize;
            let err = loop {
                // SAFETY: valid buffer.
                let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                if r < 0 {
                    break std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                }
                if r == 0 {
                    break 0;
                }
                total += r as usize;
            };
            println!("READFD total={total} err={err}");
        }
        _ => {
            eprintln!("usage: preload-prog server PORT MODE [MAX] | client HOST PORT SEND RECV SEED | sink HOST PORT | source PORT");
            std::process::exit(2);
        }
    }
}
