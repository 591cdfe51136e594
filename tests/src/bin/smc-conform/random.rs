//! Random call sequences (`random_calls_*`): one connected pair driven by a seeded generator
//! through the calls a program mixes on a stream socket — writes (`write`, `writev`, `send` with
//! flags, `sendmsg`), reads (`read`, `readv`, `recv` with `MSG_PEEK`/`MSG_WAITALL`/`MSG_TRUNC`/
//! `MSG_DONTWAIT`, `recvmsg`), `poll`, level-triggered epoll, `FIONREAD`, `SO_RCVLOWAT`,
//! `SO_ERROR`, `shutdown` of either side, `dup` + `close` of the old number, and a final `close`
//! with or without unread bytes — and logs every observable. Both ends are non-blocking and
//! driven from one thread, so the trace is a function of the seed alone: over TCP, and under
//! the data path, which must produce the same trace.
//!
//! The generator keeps the pair inside what both transports hold without a partial write
//! (at most 16 KiB unread per direction), and before a call that observes an end's receive
//! side it waits, unlogged, until what the model says was sent to that end has arrived
//! (`settle`): loopback TCP delivers in the sender's system call nearly always, the rings
//! always, and the wait removes the rare softirq deferral from the comparison.
//! `SMC_CONFORM_SEED=N` replaces the scenario's seed (hunting by hand with many seeds).

use super::*;

/// xorshift64*: small, seedable, the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below((hi - lo + 1) as u64) as usize
    }
}

const MAX_UNREAD: usize = 16 * 1024;
/// The generator's pick for a close of the end.
const CLOSE: u64 = 1000;

/// One end of the pair, as the model sees it.
struct End {
    fd: c_int,
    name: &'static str,
    /// Bytes this end wrote that the other has not read (model).
    unread_by_peer: usize,
    shut_wr: bool,
    shut_rd: bool,
    closed: bool,
    ep: c_int,
}

pub fn run(default_seed: u64) {
    run_with(default_seed, false)
}

/// [`run`] with urgent data among the calls too (`random_urgent_*`): `send(MSG_OOB)`,
/// `recv(MSG_OOB)`, `SIOCATMARK`, `SO_OOBINLINE`, and a close with `SO_LINGER {1, 0}`.
pub fn run_urgent(default_seed: u64) {
    run_with(default_seed, true)
}

fn run_with(default_seed: u64, urgent: bool) {
    URGENT.store(urgent, Ordering::Relaxed);
    let seed = std::env::var("SMC_CONFORM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_seed);
    // A write to a reset connection must give EPIPE, not end the process.
    // SAFETY: plain signal disposition.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let mut rng = Rng::new(seed);
    let (c, s) = pair_settled();
    set_nonblock(c, true);
    set_nonblock(s, true);
    // Without Nagle: TCP would hold a small write while an earlier one waits for its
    // (delayed) ACK, so what a read or a reset finds would depend on the delayed-ACK timer;
    // the data path never holds bytes back.
    let one: c_int = 1;
    for fd in [c, s] {
        setsockopt_raw(fd, libc::IPPROTO_TCP, libc::TCP_NODELAY, &one);
    }
    let mut ends = [
        End {
            fd: c,
            name: "c",
            unread_by_peer: 0,
            shut_wr: false,
            shut_rd: false,
            closed: false,
            ep: -1,
        },
        End {
            fd: s,
            name: "s",
            unread_by_peer: 0,
            shut_wr: false,
            shut_rd: false,
            closed: false,
            ep: -1,
        },
    ];
    let mut stream: u64 = seed;
    let ops = 200;
    for step in 0..ops {
        let e = rng.below(2) as usize;
        let o = 1 - e;
        if ends[e].closed {
            continue;
        }
        // The last steps: a close now and then (with or without unread bytes), then the
        // other end's view of it.
        let k = if step > ops - 12 && rng.below(6) == 0 {
            CLOSE
        } else if urgent {
            rng.below(112)
        } else {
            rng.below(100)
        };
        let fd = ends[e].fd;
        let who = ends[e].name;
        match k {
            // writes
            0..=27 => {
                let cap = MAX_UNREAD.saturating_sub(ends[e].unread_by_peer);
                if cap == 0 {
                    continue;
                }
                let n = rng.range(1, cap.min(4096));
                let mut b = vec![0u8; n];
                for x in b.iter_mut() {
                    stream = stream
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    *x = (stream >> 56) as u8;
                }
                let how = rng.below(5);
                let (what, ret) = match how {
                    // SAFETY: valid buffer.
                    0 => ("write", unsafe { libc::write(fd, b.as_ptr().cast(), n) }),
                    1 => {
                        let half = n / 2;
                        let iov = [
                            libc::iovec {
                                iov_base: b.as_ptr() as *mut _,
                                iov_len: half,
                            },
                            libc::iovec {
                                iov_base: b[half..].as_ptr() as *mut _,
                                iov_len: n - half,
                            },
                        ];
                        // SAFETY: two iovecs over `b`.
                        ("writev", unsafe { libc::writev(fd, iov.as_ptr(), 2) })
                    }
                    2 => (
                        "send(NOSIGNAL)",
                        // SAFETY: valid buffer.
                        unsafe { libc::send(fd, b.as_ptr().cast(), n, libc::MSG_NOSIGNAL) },
                    ),
                    // (Not `MSG_MORE`: TCP holds such bytes until the next push, the data path
                    // moves them at once; a shutdown by the peer in between then sees them at
                    // another time: a difference of timing, not of the bytes.)
                    3 => (
                        "send(DONTWAIT)",
                        // SAFETY: valid buffer.
                        unsafe {
                            libc::send(
                                fd,
                                b.as_ptr().cast(),
                                n,
                                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                            )
                        },
                    ),
                    _ => {
                        let mut iov = libc::iovec {
                            iov_base: b.as_ptr() as *mut _,
                            iov_len: n,
                        };
                        // SAFETY: plain old data.
                        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
                        m.msg_iov = &mut iov;
                        m.msg_iovlen = 1;
                        // SAFETY: a msghdr over `b`.
                        ("sendmsg", unsafe {
                            libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL)
                        })
                    }
                };
                r(&format!("{who} {what} {n}"), ret);
                if ret > 0 {
                    ends[e].unread_by_peer += ret as usize;
                }
            }
            // reads
            28..=57 => {
                settle(&ends, e);
                let n = rng.range(1, 8192);
                let flags_pick = rng.below(9);
                let consumed = match flags_pick {
                    0 => rd(&format!("{who} read {n}"), fd, n),
                    1 => recv_l(&format!("{who} recv {n} PEEK"), fd, n, libc::MSG_PEEK).min(0),
                    2 => recv_l(&format!("{who} recv {n} WAITALL"), fd, n, libc::MSG_WAITALL),
                    3 => recv_l(&format!("{who} recv {n} TRUNC"), fd, n, libc::MSG_TRUNC),
                    4 => recv_l(
                        &format!("{who} recv {n} DONTWAIT"),
                        fd,
                        n,
                        libc::MSG_DONTWAIT,
                    ),
                    5 => recvmsg_d(&format!("{who} recvmsg {n}"), fd, n, 0),
                    6 => readv_l(&format!("{who} readv {n}"), fd, n),
                    7 => recv_l(
                        &format!("{who} recv {n} PEEK|WAITALL"),
                        fd,
                        n,
                        libc::MSG_PEEK | libc::MSG_WAITALL,
                    )
                    .min(0),
                    _ => recv_l(&format!("{who} recv 0"), fd, 0, 0).min(0),
                };
                if consumed > 0 {
                    let c = consumed as usize;
                    ends[o].unread_by_peer = ends[o].unread_by_peer.saturating_sub(c);
                }
            }
            // readiness
            58..=65 => {
                settle(&ends, e);
                let ev = libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP | libc::POLLPRI;
                pl(&format!("{who} poll"), fd, ev, 0);
            }
            66..=70 => {
                settle(&ends, e);
                if ends[e].ep < 0 {
                    let ep = ep_create();
                    let ev = (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP) as u32;
                    ep_ctl(
                        &format!("{who} epoll_ctl ADD"),
                        ep,
                        libc::EPOLL_CTL_ADD,
                        fd,
                        ev,
                        0,
                    );
                    ends[e].ep = ep;
                }
                ep_wait(&format!("{who} epoll_wait"), ends[e].ep, 4, 0, &|_| {
                    who.to_string()
                });
            }
            71..=76 => {
                settle(&ends, e);
                inq(&format!("{who} FIONREAD"), fd);
            }
            77..=79 => {
                let v = rng.range(1, 4096) as c_int;
                r(
                    &format!("{who} SO_RCVLOWAT {v}"),
                    setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_RCVLOWAT, &v) as isize,
                );
            }
            80..=82 => {
                settle(&ends, e);
                so_error(&format!("{who} SO_ERROR"), fd);
            }
            // shutdowns, rare and late (what comes after one is mostly errors)
            83..=85 if step > ops * 2 / 3 && rng.below(3) == 0 => {
                let how = match rng.below(3) {
                    0 => libc::SHUT_RD,
                    1 => libc::SHUT_WR,
                    _ => libc::SHUT_RDWR,
                };
                // SAFETY: plain syscall.
                let ret = unsafe { libc::shutdown(fd, how) };
                r(&format!("{who} shutdown {how}"), ret as isize);
                if ret == 0 {
                    if how != libc::SHUT_RD {
                        ends[e].shut_wr = true;
                    }
                    if how != libc::SHUT_WR {
                        ends[e].shut_rd = true;
                    }
                }
            }
            83..=85 => continue,
            // a new number for the same socket, the old one closed
            86..=88 => {
                // SAFETY: plain syscalls.
                let d = unsafe { libc::dup(fd) };
                assert!(d >= 0, "dup");
                close(fd);
                if ends[e].ep >= 0 {
                    // The epoll entry named the old number's file, which lives on through `d`:
                    // the registration stays (as the kernel keeps it), nothing to log.
                }
                log(format!("{who} dup+close"));
                ends[e].fd = d;
            }
            // a blocking read of what is there, when something is (never waits)
            89..=99 => {
                settle(&ends, e);
                let avail = ends[o].unread_by_peer;
                if avail == 0 || ends[e].shut_rd || urgent {
                    continue;
                }
                set_nonblock(fd, false);
                let n = rng.range(1, avail);
                rd(&format!("{who} blocking read {n}"), fd, n);
                set_nonblock(fd, true);
                // A blocking read returns what is there (at least 1 byte), up to n.
                ends[o].unread_by_peer = avail.saturating_sub(n.min(avail));
                // The model cannot know how much it took if less than n arrived: settle
                // guaranteed all of `avail` is there, so it took n.
            }
            100..=102 => {
                if ends[e].shut_wr {
                    continue;
                }
                // One urgent byte after what is queued (not counted by the model: outside
                // the stream unless SO_OOBINLINE, and settle waits for the stream only).
                send_oob(&format!("{who} send OOB"), fd, b"!");
            }
            103..=105 => {
                settle(&ends, e);
                recv_l(&format!("{who} recv 1 OOB"), fd, 1, libc::MSG_OOB);
            }
            106..=108 => {
                settle(&ends, e);
                atmark(&format!("{who} SIOCATMARK"), fd);
            }
            109 => {
                let v: c_int = rng.below(2) as c_int;
                r(
                    &format!("{who} SO_OOBINLINE {v}"),
                    setsockopt_raw(fd, libc::SOL_SOCKET, libc::SO_OOBINLINE, &v) as isize,
                );
            }
            110..=111 if step > ops - 12 => {
                linger0(fd);
                close(fd);
                log(format!(
                    "{who} close linger0 (unread here {})",
                    ends[o].unread_by_peer
                ));
                if ends[e].ep >= 0 {
                    close(ends[e].ep);
                    ends[e].ep = -1;
                }
                ends[e].closed = true;
            }
            110..=111 => continue,
            _ => {
                close(fd);
                log(format!(
                    "{who} close (unread here {})",
                    ends[o].unread_by_peer
                ));
                if ends[e].ep >= 0 {
                    close(ends[e].ep);
                    ends[e].ep = -1;
                }
                ends[e].closed = true;
            }
        }
    }
    // The survivor's view of the end: what is left, then EOF or reset.
    for e in 0..2 {
        if ends[e].closed {
            continue;
        }
        let o = 1 - e;
        settle(&ends, e);
        let fd = ends[e].fd;
        let who = ends[e].name;
        pl(
            &format!("{who} final poll"),
            fd,
            libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
            0,
        );
        if ends[o].closed || ends[o].shut_wr {
            for _ in 0..6 {
                if rd(&format!("{who} final read"), fd, 65536) <= 0 {
                    break;
                }
            }
        }
        so_error(&format!("{who} final SO_ERROR"), fd);
    }
    for e in &ends {
        if !e.closed {
            close(e.fd);
        }
        if e.ep >= 0 {
            close(e.ep);
        }
    }
}

/// Urgent data in the sequence: the model's byte counts are a bound, not exact (an urgent
/// byte inline or not, one that a later urgent byte pushed into the stream), so
/// [`settle`] waits 5 ms at most instead of 2 s (loopback delivers within the sender's call), and no blocking read is made (one that asks
/// for more than the stream holds before a mark, with `SO_RCVLOWAT`, would wait for ever, as
/// over TCP).
static URGENT: AtomicBool = AtomicBool::new(false);

/// Waits (unlogged, bounded) until end `e` has received what the model says its peer sent it,
/// and the peer's end of writing (FIN) or close when it had one.
fn settle(ends: &[End; 2], e: usize) {
    let o = 1 - e;
    let want = ends[o].unread_by_peer;
    let peer_done = ends[o].shut_wr || ends[o].closed;
    // `SMC_CONFORM_SETTLE_MS`: a shorter bound, for hunting by hand.
    let bound = std::env::var("SMC_CONFORM_SETTLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(
            if URGENT.load(Ordering::Relaxed) {
                Duration::from_millis(5)
            } else {
                Duration::from_secs(2)
            },
            Duration::from_millis,
        );
    let t = Instant::now();
    while t.elapsed() < bound {
        let mut v: c_int = 0;
        // SAFETY: FIONREAD writes one int.
        let rc = unsafe { libc::ioctl(ends[e].fd, libc::FIONREAD, &mut v) };
        let (_, rev) = poll_raw(ends[e].fd, libc::POLLIN | libc::POLLRDHUP, 0);
        // Both directions shut or reset: nothing more arrives (a reset drops what was on its
        // way, which the model does not know).
        let over = rev & (libc::POLLHUP | libc::POLLERR) != 0;
        let bytes_ok = rc < 0 || v as usize >= want || over;
        let end_ok = !peer_done || rev & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0;
        if bytes_ok && end_ok {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Logged `readv` of up to `n` bytes into two buffers.
fn readv_l(what: &str, fd: c_int, n: usize) -> isize {
    let half = n / 2;
    let mut a = vec![0u8; half.max(1)];
    let mut b = vec![0u8; (n - half).max(1)];
    let iov = [
        libc::iovec {
            iov_base: a.as_mut_ptr().cast(),
            iov_len: half,
        },
        libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: n - half,
        },
    ];
    // SAFETY: two iovecs over our buffers.
    let k = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
    let e = errno();
    if k > 0 {
        let mut all = a[..half.min(k as usize)].to_vec();
        if k as usize > half {
            all.extend_from_slice(&b[..k as usize - half]);
        }
        log(format!("{what} = {k} [{}]", digest(&all)));
    } else {
        set_errno(e);
        r(what, k);
    }
    set_errno(e);
    k
}

/// Logged `recvmsg` of up to `n` bytes: result, digest and `msg_flags`.
fn recvmsg_d(what: &str, fd: c_int, n: usize, flags: c_int) -> isize {
    let (k, v, mf) = recvmsg_raw(fd, n, flags);
    let e = errno();
    if k >= 0 {
        log(format!("{what} = {k} [{}] flags {mf:#x}", digest(&v)));
    } else {
        r(what, k);
    }
    set_errno(e);
    k
}
