//! Full-duplex soak of a byte stream: many connections, a few at a time, both ends writing and
//! reading at once, random sizes, every byte verified, the socket API mixed per connection.
//!
//! ```text
//! smc-soak server PORT CONNS [RCVBUF]         serve CONNS connections, then print the summary
//! smc-soak client HOST PORT [options]         run the connections, print the summary
//!   --conns N         connections (default 16)
//!   --par C           at a time (default 4)
//!   --bytes B         bytes each way per connection (default 64 MiB; suffixes k, m, g)
//!   --max-chunk M     largest single read/write (default 1 MiB); sizes are random in 1..=M
//!   --seed S          stream seed (default 1)
//!   --modes LIST      comma list of APIs (default all): rw vec sr msg poll epoll epoll1
//!   --stall-secs T    a connection without progress for T s is a stall (default 120)
//!   --rcvbuf B        SO_RCVBUF before connect (under the data path: the ring size)
//!   --watch           a third thread per end polls the socket for readiness (POLLIN|POLLOUT,
//!                     no timeout) while the writer and the reader work, as an event loop
//!                     watching worker threads would
//! ```
//!
//! The client sends a 40-byte header per connection (index, seed, bytes client→server, bytes
//! server→client, the server's API mode), then each end runs its mode:
//! - `rw`: blocking `read`/`write`, a writer thread and a reader thread;
//! - `vec`: blocking `readv`/`writev` with 1..8 random iovecs;
//! - `sr`: `send`/`recv` with flags: `MSG_DONTWAIT` now and then (then `poll`), `MSG_WAITALL`,
//!   and a `MSG_PEEK` now and then whose bytes are verified too;
//! - `msg`: `sendmsg`/`recvmsg` with several iovecs;
//! - `poll`: non-blocking fd, each thread `poll`s for its direction;
//! - `epoll`: non-blocking fd, each thread has its own edge-triggered epoll instance;
//! - `epoll1`: non-blocking fd, one thread, one edge-triggered epoll for both directions.
//!
//! Each direction is a seeded pseudo-random stream (a byte's value depends only on the seed and
//! its offset), so the reader regenerates and compares whatever sizes the reads return. Every
//! failure prints one `FAIL` line; the summary line is
//! `SOAK role=.. conns=.. bytes=.. resets=.. errors=.. short=.. diff_bytes=.. peek_diff=..
//! lost_wakeups=.. stalls=.. elapsed=..`.
//! A "lost wakeup" is a wait (poll/epoll) that timed out after 10 s although the operation
//! then made progress.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use smc_harness::Rng;
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, IntoRawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MODES: [&str; 7] = ["rw", "vec", "sr", "msg", "poll", "epoll", "epoll1"];
const HDR: usize = 40;
/// A wait longer than this that then makes progress counts as a lost wakeup.
const WAIT_MS: i32 = 10_000;

#[derive(Default)]
struct Tally {
    conns: AtomicU64,
    bytes: AtomicU64,
    resets: AtomicU64,
    errors: AtomicU64,
    short: AtomicU64,
    diff: AtomicU64,
    peek_diff: AtomicU64,
    lost_wakeups: AtomicU64,
    stalls: AtomicU64,
}

impl Tally {
    fn line(&self, role: &str, t0: Instant) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let el = t0.elapsed().as_secs_f64();
        format!(
            "SOAK role={role} conns={} bytes={} resets={} errors={} short={} diff_bytes={} \
             peek_diff={} lost_wakeups={} stalls={} elapsed={el:.1}s MBps={:.0}",
            g(&self.conns),
            g(&self.bytes),
            g(&self.resets),
            g(&self.errors),
            g(&self.short),
            g(&self.diff),
            g(&self.peek_diff),
            g(&self.lost_wakeups),
            g(&self.stalls),
            g(&self.bytes) as f64 / el.max(1e-9) / 1e6,
        )
    }
}

/// splitmix64 of `x`.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Bytes `off..off+buf.len()` of the stream `seed`.
fn fill(seed: u64, off: u64, buf: &mut [u8]) {
    let mut i = 0usize;
    let mut pos = off;
    while i < buf.len() {
        let w = mix(seed ^ (pos / 8).wrapping_mul(0xD6E8_FEB8_6659_FD93)).to_le_bytes();
        let s = (pos % 8) as usize;
        let n = (8 - s).min(buf.len() - i);
        buf[i..i + n].copy_from_slice(&w[s..s + n]);
        i += n;
        pos += n as u64;
    }
}

/// The generator of a run's `seed`, for sizes and choices.
fn rng(seed: u64) -> Rng {
    Rng::with_state(mix(seed))
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn errname(e: i32) -> String {
    match e {
        libc::ECONNRESET => "ECONNRESET".into(),
        libc::EPIPE => "EPIPE".into(),
        libc::ETIMEDOUT => "ETIMEDOUT".into(),
        _ => format!("{}", std::io::Error::from_raw_os_error(e)),
    }
}

enum Io {
    Done(usize),
    Again,
    Err(i32),
}

fn io_of(r: isize) -> Io {
    if r >= 0 {
        return Io::Done(r as usize);
    }
    match errno() {
        libc::EAGAIN | libc::EINTR => Io::Again,
        e => Io::Err(e),
    }
}

/// Split `len` bytes into 1..=8 random pieces.
fn pieces(rng: &mut Rng, len: usize) -> Vec<usize> {
    let k = (rng.below(8) as usize + 1).min(len.max(1));
    let mut cuts: Vec<usize> = (0..k - 1)
        .map(|_| rng.below(len as u64 + 1) as usize)
        .collect();
    cuts.push(0);
    cuts.push(len);
    cuts.sort_unstable();
    cuts.windows(2).map(|w| w[1] - w[0]).collect()
}

fn iovecs(base: *mut u8, sizes: &[usize]) -> Vec<libc::iovec> {
    let mut off = 0;
    sizes
        .iter()
        .map(|&n| {
            let v = libc::iovec {
                // SAFETY: off + n is within the caller's buffer (the sizes sum to its length).
                iov_base: unsafe { base.add(off) } as *mut libc::c_void,
                iov_len: n,
            };
            off += n;
            v
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Rw,
    Vec,
    Sr,
    Msg,
    Poll,
    Epoll,
    Epoll1,
}

impl Mode {
    fn from_index(i: u64) -> Mode {
        match i % MODES.len() as u64 {
            0 => Mode::Rw,
            1 => Mode::Vec,
            2 => Mode::Sr,
            3 => Mode::Msg,
            4 => Mode::Poll,
            5 => Mode::Epoll,
            _ => Mode::Epoll1,
        }
    }
    fn name(self) -> &'static str {
        MODES[self as usize]
    }
    fn nonblocking(self) -> bool {
        matches!(self, Mode::Poll | Mode::Epoll | Mode::Epoll1)
    }
}

/// One write attempt of `buf` with the API of `mode`.
fn write_once(mode: Mode, fd: i32, buf: &mut [u8], rng: &mut Rng) -> Io {
    let n = buf.len();
    let p = buf.as_mut_ptr();
    // SAFETY (all arms): the pointers and iovecs cover `buf` only.
    let r = match mode {
        // SAFETY: `p` and `n` cover `buf` only.
        Mode::Rw | Mode::Poll | Mode::Epoll | Mode::Epoll1 => unsafe {
            libc::write(fd, p as *const libc::c_void, n)
        },
        Mode::Vec => {
            let iov = iovecs(p, &pieces(rng, n));
            // SAFETY: the iovecs cover disjoint pieces of `buf`; `iov` lives across the call.
            unsafe { libc::writev(fd, iov.as_ptr(), iov.len() as i32) }
        }
        Mode::Sr => {
            let fl = if rng.below(4) == 0 {
                libc::MSG_DONTWAIT
            } else {
                0
            };
            // SAFETY: `p` and `n` cover `buf` only.
            unsafe { libc::send(fd, p as *const libc::c_void, n, fl | libc::MSG_NOSIGNAL) }
        }
        Mode::Msg => {
            let mut iov = iovecs(p, &pieces(rng, n));
            // SAFETY: zeroed msghdr is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = iov.as_mut_ptr();
            m.msg_iovlen = iov.len() as _;
            // SAFETY: `m` points at `iov`, whose iovecs cover `buf` only; both live across the
            // call.
            unsafe { libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL) }
        }
    };
    io_of(r)
}

/// One read attempt into `buf` with the API of `mode`; `peek` asks for `MSG_PEEK`.
fn read_once(mode: Mode, fd: i32, buf: &mut [u8], rng: &mut Rng, peek: bool) -> Io {
    let n = buf.len();
    let p = buf.as_mut_ptr();
    // SAFETY (all arms): the pointers and iovecs cover `buf` only.
    let r = match mode {
        // SAFETY: `p` and `n` cover the writable `buf` only.
        Mode::Rw | Mode::Poll | Mode::Epoll | Mode::Epoll1 => unsafe {
            libc::read(fd, p as *mut libc::c_void, n)
        },
        Mode::Vec => {
            let iov = iovecs(p, &pieces(rng, n));
            // SAFETY: the iovecs cover disjoint pieces of the writable `buf`; `iov` lives across
            // the call.
            unsafe { libc::readv(fd, iov.as_ptr(), iov.len() as i32) }
        }
        Mode::Sr => {
            let mut fl = match rng.below(4) {
                0 => libc::MSG_DONTWAIT,
                1 => libc::MSG_WAITALL,
                _ => 0,
            };
            if peek {
                fl |= libc::MSG_PEEK;
            }
            // SAFETY: `p` and `n` cover the writable `buf` only.
            unsafe { libc::recv(fd, p as *mut libc::c_void, n, fl) }
        }
        Mode::Msg => {
            let mut iov = iovecs(p, &pieces(rng, n));
            // SAFETY: zeroed msghdr is valid.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = iov.as_mut_ptr();
            m.msg_iovlen = iov.len() as _;
            let fl = if rng.below(8) == 0 {
                libc::MSG_WAITALL
            } else {
                0
            };
            // SAFETY: `m` points at `iov`, whose iovecs cover the writable `buf` only; both live
            // across the call.
            unsafe { libc::recvmsg(fd, &mut m, fl) }
        }
    };
    io_of(r)
}

/// The writing half of one connection end.
struct Writer {
    mode: Mode,
    fd: i32,
    seed: u64,
    total: u64,
    off: u64,
    max: usize,
    rng: Rng,
    buf: Vec<u8>,
    /// Bytes of `buf` not written yet: `buf[pos..len]`.
    pos: usize,
    len: usize,
    shut: bool,
}

/// The reading half of one connection end.
struct Reader {
    mode: Mode,
    fd: i32,
    seed: u64,
    expect: u64,
    off: u64,
    max: usize,
    rng: Rng,
    buf: Vec<u8>,
    exp: Vec<u8>,
    diff: u64,
    peek_diff: u64,
    eof: bool,
}

enum Step {
    Progress,
    Again,
    Finished,
    Failed(i32),
}

impl Writer {
    fn step(&mut self) -> Step {
        if self.pos == self.len {
            if self.off == self.total {
                if !self.shut {
                    self.shut = true;
                    // SAFETY: plain syscall.
                    if unsafe { libc::shutdown(self.fd, libc::SHUT_WR) } != 0 {
                        return Step::Failed(errno());
                    }
                }
                return Step::Finished;
            }
            let n = (self.rng.size(self.max) as u64).min(self.total - self.off) as usize;
            fill(self.seed, self.off, &mut self.buf[..n]);
            self.pos = 0;
            self.len = n;
        }
        match write_once(
            self.mode,
            self.fd,
            &mut self.buf[self.pos..self.len],
            &mut self.rng,
        ) {
            Io::Done(0) => Step::Failed(libc::EIO),
            Io::Done(k) => {
                self.pos += k;
                self.off += k as u64;
                Step::Progress
            }
            Io::Again => Step::Again,
            Io::Err(e) => Step::Failed(e),
        }
    }
}

fn count_diff(a: &[u8], b: &[u8]) -> u64 {
    if a == b {
        0
    } else {
        a.iter().zip(b).filter(|(x, y)| x != y).count() as u64
    }
}

impl Reader {
    fn step(&mut self) -> Step {
        if self.eof {
            return Step::Finished;
        }
        let n = self.rng.size(self.max);
        let peek = self.mode == Mode::Sr && self.rng.below(16) == 0;
        match read_once(self.mode, self.fd, &mut self.buf[..n], &mut self.rng, peek) {
            Io::Done(0) => {
                if peek {
                    // A peek at EOF; the next plain read says it.
                    return Step::Progress;
                }
                self.eof = true;
                Step::Finished
            }
            Io::Done(k) => {
                let k = k.min(n);
                let room = self.expect.saturating_sub(self.off) as usize;
                let cmp = k.min(room);
                fill(self.seed, self.off, &mut self.exp[..cmp]);
                let d = count_diff(&self.buf[..cmp], &self.exp[..cmp]) + (k - cmp) as u64;
                if peek {
                    self.peek_diff += d;
                } else {
                    self.diff += d;
                    self.off += k as u64;
                }
                Step::Progress
            }
            Io::Again => Step::Again,
            Io::Err(e) => Step::Failed(e),
        }
    }
}

/// How a thread waits when its operation says EAGAIN.
enum Waiter {
    Poll(i16),
    Epoll(i32),
}

impl Waiter {
    fn new(mode: Mode, fd: i32, events: i16) -> std::io::Result<Waiter> {
        if mode != Mode::Epoll && mode != Mode::Epoll1 {
            return Ok(Waiter::Poll(events));
        }
        // SAFETY: plain syscalls.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ev = libc::epoll_event {
            events: (events as u32
                & (libc::POLLIN as u32 | libc::POLLOUT as u32 | libc::POLLRDHUP as u32))
                | libc::EPOLLET as u32,
            u64: fd as u64,
        };
        // SAFETY: valid event.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: our fd.
            unsafe { libc::close(ep) };
            return Err(e);
        }
        Ok(Waiter::Epoll(ep))
    }

    /// Wait up to `WAIT_MS`; false on timeout.
    fn wait(&self, fd: i32) -> bool {
        match self {
            Waiter::Poll(ev) => {
                let mut p = libc::pollfd {
                    fd,
                    events: *ev,
                    revents: 0,
                };
                // SAFETY: one pollfd.
                let r = unsafe { libc::poll(&mut p, 1, WAIT_MS) };
                r != 0
            }
            Waiter::Epoll(ep) => {
                // SAFETY: zeroed events are valid.
                let mut evs: [libc::epoll_event; 4] = unsafe { std::mem::zeroed() };
                // SAFETY: valid buffer.
                let r = unsafe { libc::epoll_wait(*ep, evs.as_mut_ptr(), 4, WAIT_MS) };
                r != 0
            }
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Waiter::Epoll(ep) = self {
            // SAFETY: our fd.
            unsafe { libc::close(*ep) };
        }
    }
}

/// Outcome of one half.
#[derive(Default, Debug)]
struct Half {
    err: Option<i32>,
    lost_wakeups: u64,
    stalled: bool,
}

/// Drive `step` until it finishes or fails, waiting with `w` on EAGAIN.
fn drive(mut step: impl FnMut() -> Step, w: &Waiter, fd: i32, stall: Duration) -> Half {
    let mut h = Half::default();
    let mut last = Instant::now();
    let mut timed_out = false;
    loop {
        match step() {
            Step::Progress => {
                if timed_out {
                    h.lost_wakeups += 1;
                    timed_out = false;
                }
                last = Instant::now();
            }
            Step::Finished => return h,
            Step::Failed(e) => {
                h.err = Some(e);
                return h;
            }
            Step::Again => {
                if last.elapsed() > stall {
                    h.stalled = true;
                    return h;
                }
                if !w.wait(fd) {
                    timed_out = true;
                }
            }
        }
    }
}

struct End {
    idx: u64,
    role: &'static str,
    mode: Mode,
    fd: i32,
    tx_seed: u64,
    rx_seed: u64,
    tx_bytes: u64,
    rx_bytes: u64,
    max: usize,
    stall: Duration,
    watch: bool,
}

/// Run one connection end to completion (closes the fd) and add its figures to `t`.
fn run_end(e: End, t: &Tally) {
    let fd = e.fd;
    if e.mode.nonblocking() {
        // SAFETY: plain fcntl on our fd.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
        }
    }
    let salt = if e.role == "client" { 1 } else { 2 };
    let mut wr = Writer {
        mode: e.mode,
        fd,
        seed: e.tx_seed,
        total: e.tx_bytes,
        off: 0,
        max: e.max,
        rng: rng(e.tx_seed ^ salt),
        buf: vec![0; e.max],
        pos: 0,
        len: 0,
        shut: false,
    };
    let mut rd = Reader {
        mode: e.mode,
        fd,
        seed: e.rx_seed,
        expect: e.rx_bytes,
        off: 0,
        max: e.max,
        rng: rng(e.rx_seed ^ salt ^ 0x100),
        buf: vec![0; e.max],
        exp: vec![0; e.max],
        diff: 0,
        peek_diff: 0,
        eof: false,
    };
    let stall = e.stall;
    let halves_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = e.watch.then(|| {
        let halves_done = Arc::clone(&halves_done);
        std::thread::spawn(move || {
            while !halves_done.load(Ordering::Relaxed) {
                let mut p = libc::pollfd {
                    fd,
                    events: libc::POLLIN | libc::POLLOUT,
                    revents: 0,
                };
                // SAFETY: one pollfd; then a plain syscall.
                unsafe {
                    libc::poll(&mut p, 1, 0);
                    libc::sched_yield();
                }
            }
        })
    });
    let (wh, rh, wr, rd) = if e.mode == Mode::Epoll1 {
        match Waiter::new(e.mode, fd, libc::POLLIN | libc::POLLOUT) {
            Err(x) => {
                let h = Half {
                    err: x.raw_os_error(),
                    ..Half::default()
                };
                (h, Half::default(), wr, rd)
            }
            Ok(w) => {
                let mut wdone = false;
                let mut rdone = false;
                let mut werr = None;
                let mut rerr = None;
                let h = drive(
                    || {
                        let mut progress = false;
                        // Edge-triggered: each direction runs until EAGAIN before we wait.
                        while !wdone {
                            match wr.step() {
                                Step::Progress => progress = true,
                                Step::Again => break,
                                Step::Finished => wdone = true,
                                Step::Failed(x) => {
                                    werr = Some(x);
                                    wdone = true;
                                }
                            }
                        }
                        while !rdone {
                            match rd.step() {
                                Step::Progress => progress = true,
                                Step::Again => break,
                                Step::Finished => rdone = true,
                                Step::Failed(x) => {
                                    rerr = Some(x);
                                    rdone = true;
                                    // Nothing more will be read: let the writer fail too
                                    // rather than wait for room forever.
                                    // SAFETY: plain syscall.
                                    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
                                }
                            }
                        }
                        if wdone && rdone {
                            Step::Finished
                        } else if progress {
                            Step::Progress
                        } else {
                            Step::Again
                        }
                    },
                    &w,
                    fd,
                    stall,
                );
                let wh = Half {
                    err: werr,
                    lost_wakeups: h.lost_wakeups,
                    stalled: h.stalled && !wdone,
                };
                let rh = Half {
                    err: rerr,
                    stalled: h.stalled && !rdone,
                    ..Half::default()
                };
                (wh, rh, wr, rd)
            }
        }
    } else {
        let mode = e.mode;
        let wt = std::thread::spawn(move || {
            let h = match Waiter::new(mode, fd, libc::POLLOUT) {
                Ok(w) => drive(|| wr.step(), &w, fd, stall),
                Err(x) => Half {
                    err: x.raw_os_error(),
                    ..Half::default()
                },
            };
            if h.err.is_some() || h.stalled {
                // Wake and fail the reader rather than leave it waiting.
                // SAFETY: plain syscall.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
            (h, wr)
        });
        let rh = match Waiter::new(mode, fd, libc::POLLIN) {
            Ok(w) => drive(|| rd.step(), &w, fd, stall),
            Err(x) => Half {
                err: x.raw_os_error(),
                ..Half::default()
            },
        };
        if rh.err.is_some() || rh.stalled {
            // SAFETY: plain syscall.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        let (wh, wr) = wt.join().expect("writer thread");
        (wh, rh, wr, rd)
    };
    halves_done.store(true, Ordering::Relaxed);
    if let Some(w) = watcher {
        let _ = w.join();
    }
    // SAFETY: our fd, closed once.
    unsafe { libc::close(fd) };
    let mut bad = Vec::new();
    for (dir, h) in [("tx", &wh), ("rx", &rh)] {
        if let Some(x) = h.err {
            if x == libc::ECONNRESET || x == libc::EPIPE {
                t.resets.fetch_add(1, Ordering::Relaxed);
            } else {
                t.errors.fetch_add(1, Ordering::Relaxed);
            }
            bad.push(format!("{dir}_err={}", errname(x)));
        }
        if h.stalled {
            t.stalls.fetch_add(1, Ordering::Relaxed);
            bad.push(format!("{dir}_stalled"));
        }
    }
    let short = rh.err.is_none() && !rh.stalled && rd.off != rd.expect;
    if short {
        t.short.fetch_add(1, Ordering::Relaxed);
        bad.push("rx_short".into());
    }
    for (dir, h) in [("tx", &wh), ("rx", &rh)] {
        if h.lost_wakeups > 0 {
            bad.push(format!("{dir}_lost_wakeups={}", h.lost_wakeups));
        }
    }
    if rd.diff > 0 || rd.peek_diff > 0 {
        bad.push(format!("diff={} peek_diff={}", rd.diff, rd.peek_diff));
    }
    t.diff.fetch_add(rd.diff, Ordering::Relaxed);
    t.peek_diff.fetch_add(rd.peek_diff, Ordering::Relaxed);
    t.lost_wakeups
        .fetch_add(wh.lost_wakeups + rh.lost_wakeups, Ordering::Relaxed);
    t.bytes.fetch_add(wr.off + rd.off, Ordering::Relaxed);
    t.conns.fetch_add(1, Ordering::Relaxed);
    if !bad.is_empty() {
        println!(
            "FAIL role={} conn={} mode={} tx={}/{} rx={}/{} {}",
            e.role,
            e.idx,
            e.mode.name(),
            wr.off,
            wr.total,
            rd.off,
            rd.expect,
            bad.join(" ")
        );
    }
}

fn parse_size(s: &str) -> u64 {
    let (num, mul) = match s.as_bytes().last().map(u8::to_ascii_lowercase) {
        Some(b'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some(b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| usage(&format!("bad size {s:?}")))
        * mul
}

fn usage(msg: &str) -> ! {
    eprintln!(
        "smc-soak: {msg}\nusage: smc-soak server PORT CONNS | smc-soak client HOST PORT \
         [--conns N] [--par C] [--bytes B] [--max-chunk M] [--seed S] [--modes LIST] \
         [--stall-secs T]"
    );
    std::process::exit(2)
}

fn read_exact(fd: i32, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: within buf.
        let r = unsafe {
            libc::read(
                fd,
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
            )
        };
        if r == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(std::io::Error::last_os_error());
        }
        got += r as usize;
    }
    Ok(())
}

fn write_all(fd: i32, buf: &[u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        // SAFETY: within buf.
        let r = unsafe {
            libc::send(
                fd,
                buf[done..].as_ptr() as *const libc::c_void,
                buf.len() - done,
                libc::MSG_NOSIGNAL,
            )
        };
        if r < 0 {
            if errno() == libc::EINTR {
                continue;
            }
            return Err(std::io::Error::last_os_error());
        }
        done += r as usize;
    }
    Ok(())
}

fn set_rcvbuf(fd: i32, b: u64) {
    let v = b.min(i32::MAX as u64) as i32;
    // SAFETY: valid option buffer.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &v as *const i32 as *const libc::c_void,
            4,
        )
    };
}

/// A TCP connection to `host:port`, with `SO_RCVBUF` set before the connect when asked.
fn connect(host: &str, port: u16, rcvbuf: Option<u64>) -> std::io::Result<TcpStream> {
    let Some(b) = rcvbuf else {
        return TcpStream::connect((host, port));
    };
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))?
        .find(std::net::SocketAddr::is_ipv4)
        .ok_or_else(|| std::io::Error::other("no IPv4 address"))?;
    let std::net::SocketAddr::V4(a) = addr else {
        return Err(std::io::Error::other("no IPv4 address"));
    };
    // SAFETY: plain syscalls; the fd is owned by the TcpStream made from it.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd);
        set_rcvbuf(fd, b);
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        if libc::connect(
            fd,
            &sin as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

fn server(args: &[String]) {
    let port: u16 = args
        .first()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage("server PORT CONNS"));
    let conns: u64 = args
        .get(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage("server PORT CONNS"));
    let rcvbuf = args.get(2).map(|v| parse_size(v));
    let stall = Duration::from_secs(120);
    let l = TcpListener::bind(("127.0.0.1", port)).expect("bind");
    if let Some(b) = rcvbuf {
        set_rcvbuf(l.as_raw_fd(), b);
    }
    println!("READY {}", l.local_addr().expect("local addr").port());
    let t = Arc::new(Tally::default());
    let t0 = Instant::now();
    let mut hs = Vec::new();
    for _ in 0..conns {
        let (s, _) = match l.accept() {
            Ok(x) => x,
            Err(e) => {
                println!("FAIL role=server accept: {e}");
                t.errors.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        let t = Arc::clone(&t);
        hs.push(std::thread::spawn(move || {
            let fd = s.into_raw_fd();
            let mut h = [0u8; HDR];
            if let Err(e) = read_exact(fd, &mut h) {
                println!("FAIL role=server header: {e}");
                t.errors.fetch_add(1, Ordering::Relaxed);
                // SAFETY: our fd.
                unsafe { libc::close(fd) };
                return;
            }
            let w = |i: usize| u64::from_le_bytes(h[i * 8..i * 8 + 8].try_into().expect("8"));
            let (idx, seed, c2s, s2c, smode) = (w(0), w(1), w(2), w(3), w(4));
            let max = ((smode >> 8) & ((1 << 40) - 1)) as usize;
            run_end(
                End {
                    idx,
                    role: "server",
                    mode: Mode::from_index(smode & 0xff),
                    fd,
                    tx_seed: mix(seed ^ mix(idx) ^ 2),
                    rx_seed: mix(seed ^ mix(idx) ^ 1),
                    tx_bytes: s2c,
                    rx_bytes: c2s,
                    max: max.clamp(1, 64 << 20),
                    stall,
                    watch: smode & (1 << 63) != 0,
                },
                &t,
            );
        }));
        hs.retain(|h| !h.is_finished());
    }
    for h in hs {
        let _ = h.join();
    }
    println!("{}", t.line("server", t0));
}

fn client(args: &[String]) {
    let host = args
        .first()
        .cloned()
        .unwrap_or_else(|| usage("client HOST PORT"));
    let port: u16 = args
        .get(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage("client HOST PORT"));
    let mut conns = 16u64;
    let mut par = 4u64;
    let mut bytes = 64u64 << 20;
    let mut max = 1usize << 20;
    let mut seed = 1u64;
    let mut modes: Vec<Mode> = (0..MODES.len() as u64).map(Mode::from_index).collect();
    let mut stall_secs = 120u64;
    let mut rcvbuf = None;
    let mut watch = false;
    let mut i = 2;
    while i < args.len() {
        if args[i] == "--watch" {
            watch = true;
            i += 1;
            continue;
        }
        let v = args
            .get(i + 1)
            .unwrap_or_else(|| usage(&format!("{} needs a value", args[i])));
        match args[i].as_str() {
            "--conns" => conns = parse_size(v),
            "--par" => par = parse_size(v).max(1),
            "--bytes" => bytes = parse_size(v),
            "--max-chunk" => max = parse_size(v).clamp(1, 64 << 20) as usize,
            "--seed" => seed = parse_size(v),
            "--stall-secs" => stall_secs = parse_size(v),
            "--rcvbuf" => rcvbuf = Some(parse_size(v)),
            "--modes" => {
                modes = v
                    .split(',')
                    .map(|m| {
                        MODES
                            .iter()
                            .position(|x| x == &m)
                            .map(|p| Mode::from_index(p as u64))
                            .unwrap_or_else(|| usage(&format!("unknown mode {m:?}")))
                    })
                    .collect()
            }
            o => usage(&format!("unknown option {o}")),
        }
        i += 2;
    }
    let t = Arc::new(Tally::default());
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let workers: Vec<_> = (0..par.min(conns))
        .map(|_| {
            let (t, next, host, modes) = (
                Arc::clone(&t),
                Arc::clone(&next),
                host.clone(),
                modes.clone(),
            );
            std::thread::spawn(move || loop {
                let idx = next.fetch_add(1, Ordering::Relaxed);
                if idx >= conns {
                    return;
                }
                let nm = modes.len() as u64;
                let mode = modes[(idx % nm) as usize];
                // The server's mode walks through the list at another pace: every pair shows up.
                let smode = modes[((idx + idx / nm) % nm) as usize];
                let s = match connect(&host, port, rcvbuf) {
                    Ok(s) => s,
                    Err(e) => {
                        println!("FAIL role=client conn={idx} connect: {e}");
                        t.errors.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                };
                let fd = s.into_raw_fd();
                let mut h = [0u8; HDR];
                let words = [
                    idx,
                    seed,
                    bytes,
                    bytes,
                    smode as u64 | (max as u64) << 8 | u64::from(watch) << 63,
                ];
                for (k, v) in words.iter().enumerate() {
                    h[k * 8..k * 8 + 8].copy_from_slice(&v.to_le_bytes());
                }
                if let Err(e) = write_all(fd, &h) {
                    println!("FAIL role=client conn={idx} header: {e}");
                    t.errors.fetch_add(1, Ordering::Relaxed);
                    // SAFETY: our fd.
                    unsafe { libc::close(fd) };
                    continue;
                }
                run_end(
                    End {
                        idx,
                        role: "client",
                        mode,
                        fd,
                        tx_seed: mix(seed ^ mix(idx) ^ 1),
                        rx_seed: mix(seed ^ mix(idx) ^ 2),
                        tx_bytes: bytes,
                        rx_bytes: bytes,
                        max,
                        stall: Duration::from_secs(stall_secs),
                        watch,
                    },
                    &t,
                );
            })
        })
        .collect();
    for w in workers {
        let _ = w.join();
    }
    println!("{}", t.line("client", t0));
}

fn main() {
    // Writes to a reset connection must fail with EPIPE, not kill us.
    // SAFETY: plain signal disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("server") => server(&args[1..]),
        Some("client") => client(&args[1..]),
        _ => usage("server or client?"),
    }
}
