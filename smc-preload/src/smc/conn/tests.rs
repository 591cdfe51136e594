use super::*;
use std::os::fd::AsRawFd;
use std::sync::Arc;

fn iov(b: &[u8]) -> [libc::iovec; 1] {
    [libc::iovec {
        iov_base: b.as_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }]
}

fn iov_mut(b: &mut [u8]) -> [libc::iovec; 1] {
    [libc::iovec {
        iov_base: b.as_mut_ptr() as *mut libc::c_void,
        iov_len: b.len(),
    }]
}

/// Deterministic stream content: byte i of the stream.
fn byte_at(seed: u64, i: u64) -> u8 {
    let x = (i / 8).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ seed;
    let x = x ^ (x >> 29);
    (x.wrapping_mul(0xBF58_476D_1CE4_E5B9) >> ((i % 8) * 8)) as u8
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn hello() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    assert_eq!(a.send(fa.as_raw_fd(), &iov(b"hello"), 0), Ok(5));
    let mut buf = [0u8; 16];
    assert_eq!(b.recv(fb.as_raw_fd(), &iov_mut(&mut buf), 0), Ok(5));
    assert_eq!(&buf[..5], b"hello");
    assert_eq!(
        b.recv(fb.as_raw_fd(), &iov_mut(&mut buf), libc::MSG_DONTWAIT),
        Err(libc::EAGAIN)
    );
}

#[test]
fn nonblocking_fill_and_partial() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    a.set_nonblocking(true);
    let big = vec![7u8; 100_000];
    let ring = a.tx_ring_len() as usize;
    assert_eq!(a.send(fa.as_raw_fd(), &iov(&big), 0), Ok(ring));
    assert_eq!(a.send(fa.as_raw_fd(), &iov(&big), 0), Err(libc::EAGAIN));
    assert_eq!(a.readiness().writable, 0);
    assert_eq!(b.readiness().readable as usize, ring);
    assert_eq!(b.inq() as usize, ring);
    let mut buf = vec![0u8; 1000];
    assert_eq!(b.recv(fb.as_raw_fd(), &iov_mut(&mut buf), 0), Ok(1000));
    // Only part consumed and under the 10% rule: not necessarily published yet, but the
    // ring drained fully must be.
    let mut rest = vec![0u8; ring];
    assert_eq!(
        b.recv(fb.as_raw_fd(), &iov_mut(&mut rest), 0),
        Ok(ring - 1000)
    );
    assert_eq!(a.readiness().writable as usize, ring);
}

#[test]
fn peek_waitall_trunc() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    assert_eq!(a.send(fa, &iov(b"abcdef"), 0), Ok(6));
    let mut buf = [0u8; 4];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), libc::MSG_PEEK), Ok(4));
    assert_eq!(&buf, b"abcd");
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), libc::MSG_TRUNC), Ok(4));
    let mut buf2 = [0u8; 8];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf2), 0), Ok(2));
    assert_eq!(&buf2[..2], b"ef");
    // WAITALL across two writes from another thread.
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            a.send(fa, &iov(b"1234"), 0).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            a.send(fa, &iov(b"5678"), 0).unwrap();
        });
        let mut w = [0u8; 8];
        assert_eq!(b.recv(fb, &iov_mut(&mut w), libc::MSG_WAITALL), Ok(8));
        assert_eq!(&w, b"12345678");
    });
}

#[test]
fn readv_writev_multi_iov() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let parts: [&[u8]; 3] = [b"ab", b"", b"cdefg"];
    let v: Vec<libc::iovec> = parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect();
    assert_eq!(a.send(fa.as_raw_fd(), &v, 0), Ok(7));
    let mut x = [0u8; 3];
    let mut y = [0u8; 10];
    let rv = [iov_mut(&mut x)[0], iov_mut(&mut y)[0]];
    assert_eq!(b.recv(fb.as_raw_fd(), &rv, 0), Ok(7));
    assert_eq!(&x, b"abc");
    assert_eq!(&y[..4], b"defg");
}

fn stream(a: &Conn, b: &Conn, fa: i32, fb: i32, total: u64, seed: u64) {
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = Rng(seed | 1);
            let mut off = 0u64;
            let mut buf = vec![0u8; 300_000];
            while off < total {
                let n = (rng.next() % 200_000 + 1).min(total - off) as usize;
                for (i, x) in buf[..n].iter_mut().enumerate() {
                    *x = byte_at(seed, off + i as u64);
                }
                let mut sent = 0;
                while sent < n {
                    let r = a.send(fa, &iov(&buf[sent..n]), 0).unwrap();
                    sent += r;
                }
                off += n as u64;
            }
            a.shutdown(fa, libc::SHUT_WR).unwrap();
        });
        let mut rng = Rng(seed.rotate_left(7) | 1);
        let mut off = 0u64;
        let mut buf = vec![0u8; 300_000];
        loop {
            let n = (rng.next() % 100_000) as usize + 1;
            let r = b.recv(fb, &iov_mut(&mut buf[..n]), 0).unwrap();
            if r == 0 {
                break;
            }
            for (i, x) in buf[..r].iter().enumerate() {
                assert_eq!(*x, byte_at(seed, off + i as u64), "at {}", off + i as u64);
            }
            off += r as u64;
        }
        assert_eq!(off, total);
    });
}

#[test]
fn stream_two_threads_small_ring() {
    let (a, b, fa, fb) = test_pair(16384, 32768).unwrap();
    stream(&a, &b, fa.as_raw_fd(), fb.as_raw_fd(), 32 << 20, 42);
    // And back the other way on the same connection.
    stream(&b, &a, fb.as_raw_fd(), fa.as_raw_fd(), 8 << 20, 43);
}

#[test]
fn stream_two_threads_big_ring_no_spin() {
    let (a, b, fa, fb) = test_pair(1 << 20, 1 << 20).unwrap();
    a.spin.misses.store(1000, Ordering::Relaxed);
    b.spin.misses.store(1000, Ordering::Relaxed);
    stream(&a, &b, fa.as_raw_fd(), fb.as_raw_fd(), 64 << 20, 7);
}

#[test]
fn shutdown_wr_then_eof_and_epipe() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    a.send(fa, &iov(b"xyz"), 0).unwrap();
    a.shutdown(fa, libc::SHUT_WR).unwrap();
    assert_eq!(
        a.send(fa, &iov(b"no"), libc::MSG_NOSIGNAL),
        Err(libc::EPIPE)
    );
    let mut buf = [0u8; 8];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(3));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(0));
    assert!(b.readiness().rd_eof);
    // Half-close: b can still write to a.
    assert_eq!(b.send(fb, &iov(b"back"), 0), Ok(4));
    assert_eq!(a.recv(fa, &iov_mut(&mut buf), 0), Ok(4));
}

#[test]
fn blocked_reader_woken_by_shutdown() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    b.spin.misses.store(1000, Ordering::Relaxed);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            a.shutdown(fa, libc::SHUT_WR).unwrap();
        });
        let mut buf = [0u8; 8];
        assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(0));
    });
}

#[test]
fn close_with_unread_data_resets_peer() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    b.send(fb, &iov(b"unread"), 0).unwrap();
    a.send(fa, &iov(b"last"), 0).unwrap();
    a.final_close(fa);
    let mut buf = [0u8; 8];
    // Bytes already in the ring are still delivered, then ECONNRESET, then EOF.
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(4));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Err(libc::ECONNRESET));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(0));
    assert_eq!(b.send(fb, &iov(b"x"), libc::MSG_NOSIGNAL), Err(libc::EPIPE));
}

#[test]
fn graceful_close_is_eof() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    a.send(fa, &iov(b"bye"), 0).unwrap();
    a.final_close(fa);
    let mut buf = [0u8; 8];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(3));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(0));
    // As on TCP: the first write after the peer's close is accepted (it is what makes the
    // peer answer with a reset), the next one fails.
    assert_eq!(b.send(fb, &iov(b"x"), libc::MSG_NOSIGNAL), Ok(1));
    assert_eq!(b.send(fb, &iov(b"x"), libc::MSG_NOSIGNAL), Err(libc::EPIPE));
}

#[test]
fn peer_death_is_eof_not_hang() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let fbr = fb.as_raw_fd();
    b.spin.misses.store(1000, Ordering::Relaxed);
    a.send(fa.as_raw_fd(), &iov(b"partial"), 0).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            // The peer vanishes without any CDC flag: only its socket closes.
            drop(a);
            drop(fa);
        });
        let mut buf = [0u8; 64];
        assert_eq!(b.recv(fbr, &iov_mut(&mut buf), 0), Ok(7));
        assert_eq!(b.recv(fbr, &iov_mut(&mut buf), 0), Ok(0));
    });
}

#[test]
fn blocked_writer_wakes_when_reader_consumes() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    a.spin.misses.store(1000, Ordering::Relaxed);
    let data = vec![1u8; 40_000];
    std::thread::scope(|s| {
        let h = s.spawn(|| a.send(fa, &iov(&data), 0));
        std::thread::sleep(Duration::from_millis(50));
        let mut got = 0;
        let mut buf = vec![0u8; 5000];
        while got < data.len() {
            got += b.recv(fb, &iov_mut(&mut buf), 0).unwrap();
        }
        assert_eq!(h.join().unwrap(), Ok(40_000));
    });
}

#[test]
fn rcvtimeo() {
    let (_a, b, _fa, fb) = test_pair(16384, 16384).unwrap();
    let tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: valid option.
    unsafe {
        libc::setsockopt(
            fb.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    let t = Instant::now();
    let mut buf = [0u8; 4];
    assert_eq!(
        b.recv(fb.as_raw_fd(), &iov_mut(&mut buf), 0),
        Err(libc::EAGAIN)
    );
    let el = t.elapsed();
    assert!(
        el >= Duration::from_millis(95) && el < Duration::from_secs(2),
        "{el:?}"
    );
}

#[test]
fn forged_cursor_is_rejected() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    a.send(fa, &iov(b"ok"), 0).unwrap();
    // The "peer" writes a producer cursor far beyond one ring ahead.
    a.peer_hdr()
        .store_prod(CursorWord::from_cursor(Cursor::new(9, 5)));
    let mut buf = [0u8; 8];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Err(libc::ECONNRESET));
    // Out-of-range count too.
    let (a, b, _fa, fb) = test_pair(16384, 16384).unwrap();
    a.peer_hdr()
        .store_prod(CursorWord::from_cursor(Cursor::new(0, 1 << 30)));
    assert_eq!(
        b.recv(fb.as_raw_fd(), &iov_mut(&mut buf), 0),
        Err(libc::ECONNRESET)
    );
    let _ = a;
}

#[test]
fn two_readers_threads_share_cursor() {
    let (a, b, fa, fb) = test_pair(65536, 65536).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let total = 4u64 << 20;
    let b = Arc::new(b);
    let counted = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..3 {
            let b = b.clone();
            let counted = counted.clone();
            s.spawn(move || {
                let mut buf = vec![0u8; 7000];
                loop {
                    let r = b.recv(fb, &iov_mut(&mut buf), 0).unwrap();
                    if r == 0 {
                        break;
                    }
                    // Every byte of this stream is its offset mod 251: readers see disjoint,
                    // in-order chunks, so consecutive bytes of one chunk must follow.
                    for w in buf[..r].windows(2) {
                        assert_eq!(w[1], ((w[0] as u32 + 1) % 251) as u8);
                    }
                    counted.fetch_add(r as u64, Ordering::Relaxed);
                }
            });
        }
        let data: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let mut off = 0;
        while off < data.len() {
            off += a
                .send(fa, &iov(&data[off..(off + 12345).min(data.len())]), 0)
                .unwrap();
        }
        a.shutdown(fa, libc::SHUT_WR).unwrap();
    });
    assert_eq!(counted.load(Ordering::Relaxed), total);
}

#[test]
fn fork_child_writes_parent_reads() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let total = 8u64 << 20;
    // SAFETY: the child only uses async-signal-safe-enough code paths (no locks held here).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut buf = vec![0u8; 100_000];
        let mut off = 0u64;
        while off < total {
            let n = (total - off).min(buf.len() as u64) as usize;
            for (i, x) in buf[..n].iter_mut().enumerate() {
                *x = byte_at(5, off + i as u64);
            }
            let mut s = 0;
            while s < n {
                s += a.send(fa, &iov(&buf[s..n]), 0).unwrap();
            }
            off += n as u64;
        }
        a.shutdown(fa, libc::SHUT_WR).unwrap();
        // SAFETY: in the forked child: leave without running the parent's destructors or atexit
        // handlers.
        unsafe { libc::_exit(0) };
    }
    let mut buf = vec![0u8; 50_000];
    let mut off = 0u64;
    loop {
        let r = b.recv(fb, &iov_mut(&mut buf), 0).unwrap();
        if r == 0 {
            break;
        }
        for (i, x) in buf[..r].iter().enumerate() {
            assert_eq!(*x, byte_at(5, off + i as u64));
        }
        off += r as u64;
    }
    assert_eq!(off, total);
    let mut st = 0;
    // SAFETY: `st` is a writable int; `pid` is our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert_eq!(st, 0);
}

#[test]
fn fork_parent_and_child_share_reader_cursor() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    a.send(fa, &iov(b"0123456789"), 0).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(4));
    // SAFETY: see above.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut c = [0u8; 3];
        let ok = b.recv(fb, &iov_mut(&mut c), 0) == Ok(3) && &c == b"456";
        // SAFETY: the child only uses its copy of this test's state and leaves with `_exit`.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let mut st = 0;
    // SAFETY: in the forked child: leave without running the parent's destructors or atexit
    // handlers.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    assert_eq!(st, 0);
    let mut rest = [0u8; 8];
    assert_eq!(b.recv(fb, &iov_mut(&mut rest), 0), Ok(3));
    // SAFETY: `st` is a writable int; `pid` is our child.
    assert_eq!(&rest[..3], b"789");
}

/// Resident pages of a mapping (`mincore`: for a shared memfd mapping, the file's pages).
fn resident(m: &Mapping) -> usize {
    let pages = m.len().div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: the mapping is ours and page aligned; `v` has one byte per page.
    let r = unsafe { libc::mincore(m.as_ptr() as *mut libc::c_void, m.len(), v.as_mut_ptr()) };
    assert_eq!(r, 0);
    v.iter().filter(|&&b| b & 1 != 0).count() * 4096
}

/// A drained ring's pages go back (the reader sees them as zeros), the data that is still
/// unread does not, and the stream stays byte-exact across reclaims and wraps.
#[test]
fn reclaim_gives_drained_pages_back() {
    let dmb = 4 << 20;
    let (a, b, fa, fb) = test_pair(dmb, dmb).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let mut pos = 0u64;
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    for round in 0..12 {
        // 3 MiB in, 2 MiB (first rounds) or everything out.
        let chunk: Vec<u8> = (0..3u64 << 20).map(|i| byte_at(7, pos + i)).collect();
        let mut off = 0;
        while off < chunk.len() {
            let n = a
                .send(fa, &iov(&chunk[off..]), libc::MSG_DONTWAIT)
                .unwrap_or(0);
            off += n;
            if n == 0 {
                let n = b.recv(fb, &iov_mut(&mut buf), 0).unwrap();
                assert!(buf[..n]
                    .iter()
                    .enumerate()
                    .all(|(i, &x)| x == byte_at(7, got + i as u64)));
                got += n as u64;
            }
        }
        pos += chunk.len() as u64;
        let keep = if round % 2 == 0 { 1u64 << 20 } else { 0 };
        while pos - got > keep {
            let want = ((pos - got - keep) as usize).min(buf.len());
            let n = b.recv(fb, &iov_mut(&mut buf[..want]), 0).unwrap();
            assert!(buf[..n]
                .iter()
                .enumerate()
                .all(|(i, &x)| x == byte_at(7, got + i as u64)));
            got += n as u64;
        }
        assert!(a.reclaim_due());
        let before = resident(&b.own);
        let freed = a.reclaim_tx();
        let after = resident(&b.own);
        // Done for this producer cursor only when the peer read everything: with bytes unread,
        // the next idle wait looks again (their pages free up without a write of ours).
        assert_eq!(a.reclaim_due(), keep > 0, "round {round}");
        // Everything but the header page, the unread bytes and the warm window went back.
        let bound = 4096 + keep as usize + RECLAIM_WARM as usize + 2 * 4096;
        assert!(
            after <= bound,
            "round {round}: {after} resident > {bound} (before {before}, freed {freed})"
        );
        assert!(freed > 0);
    }
    let n = a.reclaim_tx();
    assert_eq!(n as u64 % 4096, 0);
    while got < pos {
        let n = b.recv(fb, &iov_mut(&mut buf), 0).unwrap();
        assert!(buf[..n]
            .iter()
            .enumerate()
            .all(|(i, &x)| x == byte_at(7, got + i as u64)));
        got += n as u64;
    }
}

/// Full duplex on one connection: each end has a writer thread and a reader thread, plus a
/// thread that asks for readiness in a loop (as a poll/epoll waiter or the other direction's
/// waiter does, without the ring locks). Small rings wrap often. Returns the errors seen.
fn full_duplex(ring: usize, total: u64, pollers: usize) -> Vec<String> {
    let (a, b, fa, fb) = test_pair(ring, ring).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let errors = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicU32::new(0);
    std::thread::scope(|s| {
        for (me, fd, seed_tx, seed_rx) in [(&a, fa, 1u64, 2u64), (&b, fb, 2, 1)] {
            let errors = &errors;
            let done = &done;
            s.spawn(move || {
                let mut rng = Rng((seed_tx * 77) | 1);
                let mut off = 0u64;
                let mut buf = vec![0u8; 3 * ring];
                while off < total {
                    let n = (rng.next() % (3 * ring as u64) + 1).min(total - off) as usize;
                    for (i, x) in buf[..n].iter_mut().enumerate() {
                        *x = byte_at(seed_tx, off + i as u64);
                    }
                    match me.send(fd, &iov(&buf[..n]), libc::MSG_NOSIGNAL) {
                        Ok(k) => off += k as u64,
                        Err(e) => {
                            errors.lock().unwrap().push(format!(
                                "send errno {e} at {off}, cursors {:?}",
                                me.cursors()
                            ));
                            me.shutdown(fd, libc::SHUT_RDWR).unwrap();
                            break;
                        }
                    }
                }
                let _ = me.shutdown(fd, libc::SHUT_WR);
                done.fetch_add(1, Ordering::Relaxed);
            });
            s.spawn(move || {
                let mut rng = Rng((seed_rx * 91) | 1);
                let mut off = 0u64;
                let mut buf = vec![0u8; 3 * ring];
                loop {
                    let n = (rng.next() % (3 * ring as u64)) as usize + 1;
                    match me.recv(fd, &iov_mut(&mut buf[..n]), 0) {
                        Ok(0) => break,
                        Ok(r) => {
                            for (i, x) in buf[..r].iter().enumerate() {
                                assert_eq!(*x, byte_at(seed_rx, off + i as u64));
                            }
                            off += r as u64;
                        }
                        Err(e) => {
                            errors.lock().unwrap().push(format!(
                                "recv errno {e} at {off}, cursors {:?}",
                                me.cursors()
                            ));
                            me.shutdown(fd, libc::SHUT_RDWR).unwrap();
                            break;
                        }
                    }
                }
                if off != total && errors.lock().unwrap().is_empty() {
                    errors
                        .lock()
                        .unwrap()
                        .push(format!("short read {off} of {total}"));
                }
                done.fetch_add(1, Ordering::Relaxed);
            });
            for _ in 0..pollers {
                s.spawn(move || {
                    while done.load(Ordering::Relaxed) < 4 {
                        let r = me.readiness();
                        if r.error {
                            break;
                        }
                    }
                });
            }
        }
    });
    errors.into_inner().unwrap()
}

/// Readiness checks made without the ring locks (a poller, the other direction's waiter)
/// validate the peer's cursors against our own cursors as another thread moves them; that must
/// never be taken for a protocol violation (it reset about one long full-duplex connection in
/// 30, issue 10).
#[test]
fn full_duplex_with_lockless_readiness_never_resets() {
    let e = full_duplex(16384, 32 << 20, 1);
    assert!(e.is_empty(), "{e:?}");
}

/// `MSG_PEEK|MSG_WAITALL` for more than the ring holds returns the full ring: the peer cannot
/// send more until we read (it used to wait forever; TCP's larger buffer holds such a peek).
#[test]
fn peek_waitall_larger_than_ring_returns_what_the_ring_holds() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // A bound on the wait, so that a regression fails instead of hanging.
    let tv = libc::timeval {
        tv_sec: 10,
        tv_usec: 0,
    };
    for (fd, opt) in [(fb, libc::SO_RCVTIMEO), (fa, libc::SO_SNDTIMEO)] {
        // SAFETY: valid option buffer.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                &tv as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
    }
    let ring = b.rx_ring_len() as usize;
    let data: Vec<u8> = (0..3 * ring).map(|i| (i % 253) as u8).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut off = 0;
            while off < data.len() {
                match a.send(fa, &iov(&data[off..]), 0) {
                    Ok(n) => off += n,
                    Err(_) => return,
                }
            }
            // The last peek (less than a ring left) returns at EOF.
            a.shutdown(fa, libc::SHUT_WR).unwrap();
        });
        let mut got = 0;
        let mut buf = vec![0u8; 2 * ring];
        while got < data.len() {
            let n = b
                .recv(fb, &iov_mut(&mut buf), libc::MSG_PEEK | libc::MSG_WAITALL)
                .unwrap();
            assert!(n > 0 && n <= ring, "peeked {n}");
            assert_eq!(&buf[..n], &data[got..got + n]);
            // Consume what was peeked, in full or in part.
            let k = n.div_ceil(2).max(1);
            assert_eq!(b.recv(fb, &iov_mut(&mut buf[..k]), 0), Ok(k));
            got += k;
        }
    });
}

/// The shared "last accepted" cursor only moves forward: a thread that validated an older
/// cursor and stores it late must not pull it back behind what another thread already
/// accepted (a reader consumed up to that point; behind it, the next honest cursor would look
/// more than a ring ahead).
#[test]
fn accepted_cursor_never_moves_back() {
    let ring = Ring::new(1000).unwrap();
    let w = AtomicU64::new(pack(Cursor::new(3, 100)));
    let seen = w.load(Ordering::Relaxed);
    // Thread A accepted 3:900 and stored it; thread B, which read the same old value, accepted
    // 3:500 and stores it afterwards.
    advance(&w, ring, seen, Cursor::new(3, 900));
    advance(&w, ring, seen, Cursor::new(3, 500));
    assert_eq!(unpack(w.load(Ordering::Relaxed)), Cursor::new(3, 900));
    // In the other order the later, further cursor wins over a stale expectation.
    let w = AtomicU64::new(seen);
    advance(&w, ring, seen, Cursor::new(3, 500));
    advance(&w, ring, seen, Cursor::new(4, 50));
    assert_eq!(unpack(w.load(Ordering::Relaxed)), Cursor::new(4, 50));
    // Across the wrap counter's roll-over.
    let w = AtomicU64::new(pack(Cursor::new(0xFFFF, 900)));
    let seen = w.load(Ordering::Relaxed);
    advance(&w, ring, seen, Cursor::new(0, 300));
    advance(&w, ring, seen, Cursor::new(0xFFFF, 950));
    assert_eq!(unpack(w.load(Ordering::Relaxed)), Cursor::new(0, 300));
}

/// A reset noticed by a blocking write that had already written part of its buffer: that call
/// returns the partial count and the *next* write reports `ECONNRESET` (then `EPIPE`), as TCP
/// does (`sk_err` stays pending across a partial `sendmsg`). Found by the hostile-peer fuzz
/// (`tests/tests/hostile_peer.rs`): the report was consumed by the partial call, so an echo
/// server's `write_all` saw only `EPIPE` and never learnt that the peer reset the connection.
#[test]
fn reset_during_partial_write_is_reported_by_the_next_write() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let ring = a.tx_ring_len();
    let data = vec![3u8; 40_000];
    std::thread::scope(|s| {
        let h = s.spawn(|| a.send(fa, &iov(&data), libc::MSG_NOSIGNAL));
        // The writer filled the ring (and waits for room): part of its buffer is written.
        let t = Instant::now();
        while b.inq() < ring {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the writer wrote nothing"
            );
            std::thread::yield_now();
        }
        // The peer forges a consumer cursor far ahead (a reset) and rings.
        b.peer_hdr()
            .store_cons(CursorWord::from_cursor(Cursor::new(9, 5)));
        b.ring_doorbell(fb);
        assert_eq!(h.join().unwrap(), Ok(ring as usize));
    });
    assert_eq!(
        a.send(fa, &iov(b"x"), libc::MSG_NOSIGNAL),
        Err(libc::ECONNRESET)
    );
    assert_eq!(a.send(fa, &iov(b"x"), libc::MSG_NOSIGNAL), Err(libc::EPIPE));
}

/// A connection end adopted from its state page (as by a process its socket moved to) shares
/// the first end's state: role, references, and the references that travelled with the socket
/// are taken once each. A page without the state's magic is refused.
#[test]
fn adopted_end_shares_state_and_takes_travelling_references() {
    let own = crate::shm::memfd("own", 64 << 10).unwrap();
    let peer = crate::shm::memfd("peer", 64 << 10).unwrap();
    let map = |fd: &std::os::fd::OwnedFd| Mapping::new(fd.as_raw_fd(), 64 << 10).unwrap();
    let (sfd, state) = crate::shm::state_page().unwrap();
    let a = Conn::new(
        map(&own),
        map(&peer),
        Some(state.into()),
        Role::Server,
        false,
        None,
    )
    .unwrap();
    // The sender passes the socket on: one reference travels.
    a.add_ref(1);
    a.mark_in_flight();
    let b = Conn::adopt(
        map(&own),
        map(&peer),
        Mapping::new(sfd.as_raw_fd(), 4096).unwrap(),
        None,
    )
    .unwrap();
    assert_eq!(b.role, Role::Server);
    assert!(b.take_in_flight(), "the travelling reference is there");
    assert!(!b.take_in_flight(), "only once");
    assert!(!a.take_in_flight());
    // Two fds in all (the sender's, now the receiver's): the second close is the last.
    assert!(!a.drop_ref());
    assert!(b.drop_ref());
    // A page that is not a connection's state.
    let (other, _m) = crate::shm::state_page().unwrap();
    assert!(Conn::adopt(
        map(&own),
        map(&peer),
        Mapping::new(other.as_raw_fd(), 4096).unwrap(),
        None
    )
    .is_err());
}

/// A final close under way in another process (`F_CLOSED` set, its close flags not yet in the
/// peer's DMB) is not "closed everywhere": a process that releases its references meanwhile
/// must not pool our DMB nor untaint the peer's (the late close flags would land in the next
/// connection bound to them). Only a finished final close is.
#[test]
fn a_final_close_under_way_is_not_closed_everywhere() {
    let (a, _b, fa, _fb) = test_pair(16384, 16384).unwrap();
    assert!(!a.closed_everywhere());
    // Where another process's final close stands after its first step.
    a.set_flag(F_CLOSED);
    assert!(!a.closed_everywhere());
    let (c, d, fc, fd) = test_pair(16384, 16384).unwrap();
    c.final_close(fc.as_raw_fd());
    assert!(c.closed_everywhere());
    // Its close flags reached the peer before it counted as finished.
    let r = d.readiness();
    assert!(r.rd_eof && !r.error, "{r:?}");
    let mut buf = [0u8; 8];
    assert_eq!(d.recv(fd.as_raw_fd(), &iov_mut(&mut buf), 0), Ok(0));
    drop(fa);
}

/// A process that shares the connection and was killed while it slept as the poller (on the
/// TCP socket) leaves the poller word behind: the next waiter finds its task gone and takes
/// over (before, every later wait of every other holder slept its half-second safety net,
/// since nobody would bump the futex again).
#[test]
fn a_killed_poller_is_taken_over() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let poller = |want: Option<u32>| {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            let p = b.sh().poller.load(Ordering::Acquire);
            if want.map_or(p != 0, |w| p == w) || Instant::now() > end {
                return p;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    // SAFETY: the child only blocks in recv until it is killed.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let mut buf = [0u8; 16];
        let _ = b.recv(fb, &iov_mut(&mut buf), 0);
        // SAFETY: in the forked child: leave without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    /// Kills and reaps the child when dropped (also when an assertion fails first).
    struct Child(libc::pid_t);
    impl Drop for Child {
        fn drop(&mut self) {
            // SAFETY: our child.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }
    let child = Child(pid);
    assert_eq!(poller(None), pid as u32, "the child sleeps as the poller");
    drop(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            tx.send(super::smc_wake::gettid()).unwrap();
            let mut buf = [0u8; 16];
            b.recv(fb, &iov_mut(&mut buf), 0).map(|n| buf[..n].to_vec())
        });
        let tid = rx.recv().unwrap();
        assert_eq!(
            poller(Some(tid)),
            tid,
            "the reader took the dead poller's place"
        );
        assert_eq!(a.send(fa, &iov(b"after"), 0), Ok(5));
        assert_eq!(reader.join().unwrap(), Ok(b"after".to_vec()));
    });
}

/// A forked child's object of the connection (counted by `ops::fork`) keeps it held after
/// this process's object went, though the final close finished: a thread of the child may
/// still be inside a call on it (`tests/redteam/rt4.c recvfault`), so neither DMB nor the
/// state page may be pooled yet.
#[test]
fn a_holder_in_another_process_keeps_the_end_held() {
    let (a, _b, fa, _fb) = test_pair(16384, 16384).unwrap();
    assert!(!a.unheld(), "our own object holds it");
    a.add_holder();
    a.final_close(fa.as_raw_fd());
    assert!(a.closed_everywhere());
    // Our object goes (what its drop does first): the child's is still there.
    a.leave_holders();
    assert!(!a.unheld());
    // The child's goes.
    a.leave_holders();
    assert!(a.unheld());
    // Never below zero.
    a.leave_holders();
    assert!(a.unheld());
}

#[test]
fn a_close_under_calls_in_flight_leaves_its_reference_to_the_last_call() {
    let (a, _b, _fa, _fb) = test_pair(16384, 16384).unwrap();
    // No call in flight: the close drops its reference itself.
    assert!(!a.defer_close());
    // Two calls in flight, two numbers closed under them (a dup and the original).
    a.call_enter();
    a.call_enter();
    assert!(a.calls_in_flight());
    assert!(a.defer_close());
    assert!(a.defer_close());
    // The first call out leaves them to the second; the last one out takes both.
    assert_eq!(a.call_leave(), 0);
    assert_eq!(a.call_leave(), 2);
    assert!(!a.calls_in_flight());
    // Taken once: a new call and its end owe nothing.
    a.call_enter();
    assert_eq!(a.call_leave(), 0);
}

#[test]
fn the_own_io_moves_off_the_callers_number_once_redirected() {
    let (a, _b, fa, _fb) = test_pair(16384, 16384).unwrap();
    let fd = fa.as_raw_fd();
    assert_eq!(a.with_io(fd, |io| io), fd, "the caller's number by default");
    assert!(!a.io_redirected());
    // SAFETY: plain dup of our own socketpair end.
    let p = unsafe { libc::dup(fd) };
    assert!(p >= 0);
    assert!(a.set_private_io(p));
    assert!(!a.set_private_io(p), "once");
    assert_eq!(a.with_io(fd, |io| io), p);
    assert_eq!(a.io_now(fd), p);
    assert_eq!(a.private_io(), Some(p));
    // A dup2 onto the private number moves it.
    assert!(a.move_private_io(p, IO_GONE));
    assert_eq!(a.with_io(fd, |io| io), IO_GONE);
    assert_eq!(a.private_io(), None);
    // SAFETY: our own descriptor.
    unsafe { libc::close(p) };
}

/// Doorbell bytes queued on `fd` (read and counted).
fn queued_bells(fd: i32) -> usize {
    let mut buf = [0u8; 64];
    // SAFETY: valid buffer.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    n.max(0) as usize
}

#[test]
fn o_async_rings_once_per_read() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // Without O_ASYNC and nobody asleep: no doorbell.
    assert_eq!(a.send(fa, &iov(b"x"), 0), Ok(1));
    assert_eq!(queued_bells(fb), 0);
    b.set_async(true);
    // One doorbell for the first arrival, none for the ones before the reader looks.
    for _ in 0..3 {
        assert_eq!(a.send(fa, &iov(b"abc"), 0), Ok(3));
    }
    assert_eq!(queued_bells(fb), 1);
    let mut buf = [0u8; 64];
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(10));
    // The read looked: the next arrival rings again; a read that finds nothing too.
    assert_eq!(a.send(fa, &iov(b"d"), 0), Ok(1));
    assert_eq!(queued_bells(fb), 1);
    // A doorbell left queued is drained by the read that clears the bit.
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(1));
    assert_eq!(a.send(fa, &iov(b"e"), 0), Ok(1));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(1));
    assert_eq!(queued_bells(fb), 0);
    assert_eq!(
        b.recv(fb, &iov_mut(&mut buf), libc::MSG_DONTWAIT),
        Err(libc::EAGAIN)
    );
    // The peer's FIN rings too.
    assert_eq!(a.shutdown(fa, libc::SHUT_WR), Ok(()));
    assert_eq!(queued_bells(fb), 1);
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(0));
    // Off: silent again.
    b.set_async(false);
    let (c, d, fc, fd) = test_pair(16384, 16384).unwrap();
    let (fc, fd) = (fc.as_raw_fd(), fd.as_raw_fd());
    d.set_async(true);
    d.set_async(false);
    assert_eq!(c.send(fc, &iov(b"x"), 0), Ok(1));
    assert_eq!(queued_bells(fd), 0);
}

#[test]
fn peek_offset_across_the_ring_end() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // Bring both cursors close to the ring's end, so the next bytes wrap.
    let ring = b.rx_ring_len() as usize;
    let fill = vec![1u8; ring - 4];
    assert_eq!(a.send(fa, &iov(&fill), 0), Ok(ring - 4));
    let mut sink = vec![0u8; ring];
    assert_eq!(b.recv(fb, &iov_mut(&mut sink), 0), Ok(ring - 4));
    assert_eq!(a.send(fa, &iov(b"0123456789"), 0), Ok(10));
    assert_eq!(b.peek_off(), -1);
    b.set_peek_off(0);
    let mut buf = [0u8; 3];
    let peek = libc::MSG_PEEK | libc::MSG_DONTWAIT;
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), peek), Ok(3));
    assert_eq!(&buf, b"012");
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), peek), Ok(3));
    assert_eq!(&buf, b"345");
    assert_eq!(b.peek_off(), 6);
    let mut two = [0u8; 2];
    assert_eq!(b.recv(fb, &iov_mut(&mut two), 0), Ok(2));
    assert_eq!(b.peek_off(), 4);
    let mut rest = [0u8; 10];
    assert_eq!(b.recv(fb, &iov_mut(&mut rest), peek), Ok(4));
    assert_eq!(&rest[..4], b"6789");
    assert_eq!(b.recv(fb, &iov_mut(&mut rest), peek), Err(libc::EAGAIN));
    a.shutdown(fa, libc::SHUT_WR).unwrap();
    assert_eq!(b.recv(fb, &iov_mut(&mut rest), peek), Ok(0));
    assert_eq!(b.recv(fb, &iov_mut(&mut rest), 0), Ok(8));
    assert_eq!(b.peek_off(), 0);
    // The stream's state and counts as TCP_INFO shows them.
    assert_eq!(a.tcp_state(), Some(TCP_FIN_WAIT2));
    assert_eq!(b.tcp_state(), Some(TCP_CLOSE_WAIT));
    let n = (ring + 6) as u64;
    // (sent, acked: a client's SYN and its FIN, received)
    assert_eq!(a.tcp_bytes(), Some((n, n + 2, 0)));
    assert_eq!(b.tcp_bytes(), Some((0, 0, n)));
    b.shutdown(fb, libc::SHUT_WR).unwrap();
    assert_eq!(a.tcp_state(), Some(TCP_CLOSE));
    assert_eq!(b.tcp_state(), Some(TCP_CLOSE));
}

#[test]
fn spin_backs_off_after_giving_way_until_a_spin_wins() {
    // The back-off is the thread's own: a fresh thread starts without one.
    std::thread::spawn(|| {
        assert!(spin_allowed());
        gave_way();
        assert!(!spin_allowed());
        assert!(!spin_allowed());
        assert!(spin_allowed());
        // A second spin in a row that gives way doubles the back-off.
        gave_way();
        for _ in 0..4 {
            assert!(!spin_allowed());
        }
        assert!(spin_allowed());
        // A spin that succeeded without giving way ends the streak.
        spin_won();
        gave_way();
        assert!(!spin_allowed());
        assert!(!spin_allowed());
        assert!(spin_allowed());
        // The back-off stops growing.
        for _ in 0..3 * GIVE_WAY_MAX_SHIFT {
            gave_way();
        }
        let skipped = std::iter::repeat_with(spin_allowed)
            .take_while(|allowed| !allowed)
            .count();
        assert_eq!(skipped, 1 << GIVE_WAY_MAX_SHIFT);
        spin_won();
        assert!(spin_allowed());
    })
    .join()
    .unwrap();
}

/// A spinner that shares its CPU with a busy thread gives the CPU away at one of its yields
/// (the real scheduler: both threads pinned to one CPU).
#[test]
fn spin_gives_way_to_a_thread_on_its_cpu() {
    if tune().spin_yield == 0 || !tune().give_way {
        eprintln!("SMC_SPIN_YIELD=0 or SMC_SPIN_GIVE_WAY=0: nothing to test");
        return;
    }
    // SAFETY: plain syscall.
    let cpu = unsafe { libc::sched_getcpu() }.max(0) as usize;
    let pin = move || {
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET within its size; the calling thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
    };
    let done = std::sync::atomic::AtomicBool::new(false);
    let running = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            pin();
            running.store(true, Ordering::SeqCst);
            while !done.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let gave = s
            .spawn(|| {
                pin();
                while !running.load(Ordering::SeqCst) {
                    // SAFETY: plain syscall.
                    unsafe { libc::sched_yield() };
                }
                let y = tune().spin_yield;
                let gave = (0..100_000).any(|_| spin_pause(y));
                done.store(true, Ordering::Relaxed);
                // Having given way, this thread's next wait sleeps at once.
                gave && !spin_allowed()
            })
            .join()
            .unwrap();
        done.store(true, Ordering::Relaxed);
        assert!(
            gave,
            "100 000 yields on a CPU shared with a busy thread never gave it way (or no back-off)"
        );
    });
}

/// Both ends of a test pair with the switch-alone feature (counted control bytes).
fn alone_pair(
    dmb_a: usize,
    dmb_b: usize,
) -> (Conn, Conn, std::os::fd::OwnedFd, std::os::fd::OwnedFd) {
    let (a, b, fa, fb) = test_pair(dmb_a, dmb_b).unwrap();
    a.enable_switch_alone();
    b.enable_switch_alone();
    (a, b, fa, fb)
}

/// Raw bytes on a socket of the pair (what an image without the library would read).
fn raw_read(fd: i32, want: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    while out.len() < want {
        // SAFETY: valid buffer.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert!(n > 0, "recv {n}");
        out.extend_from_slice(&buf[..n as usize]);
    }
    out
}

fn raw_write(fd: i32, b: &[u8]) {
    // SAFETY: valid buffer.
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), 0) };
    assert_eq!(n, b.len() as isize);
}

#[test]
fn counted_control_bytes_stream_both_ways() {
    // Small rings: the writers wait for room and the readers for data, so doorbells go both
    // ways all the time, each counted, each drained by count.
    let (a, b, fa, fb) = alone_pair(16384, 32768);
    stream(&a, &b, fa.as_raw_fd(), fb.as_raw_fd(), 16 << 20, 44);
    stream(&b, &a, fb.as_raw_fd(), fa.as_raw_fd(), 4 << 20, 45);
    assert!(a.flags() & F_PROTO == 0 && b.flags() & F_PROTO == 0);
    assert!(b.sh().doorbells_rcvd.load(Ordering::Relaxed) > 0);
}

#[test]
fn a_drain_never_reads_past_the_peers_marker() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // Two doorbells, the marker (all counted), then data the peer's next image wrote.
    a.ring_doorbell(fa);
    a.ring_doorbell(fa);
    assert!(a.ctl_begin(true));
    raw_write(fa, &[SWITCH_TCP]);
    a.ctl_end(true, true);
    raw_write(fa, b"data after the marker");
    b.drain(fb);
    assert!(b.flags() & F_PEER_SWITCH != 0, "the marker was read");
    assert!(b.flags() & F_PROTO == 0, "no protocol error");
    assert_eq!(raw_read(fb, 21), b"data after the marker");
}

#[test]
fn an_end_with_nothing_unread_switches_alone_and_the_peer_follows() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    let mut buf = [0u8; 16];
    // Some traffic both ways, all of it read.
    assert_eq!(a.send(fa, &iov(b"ping"), 0), Ok(4));
    assert_eq!(b.recv(fb, &iov_mut(&mut buf), 0), Ok(4));
    assert_eq!(b.send(fb, &iov(b"pong"), 0), Ok(4));
    assert_eq!(a.recv(fa, &iov_mut(&mut buf), 0), Ok(4));
    // `a` leaves for an image without the library; `b` is busy elsewhere: no answer needed.
    let t = Instant::now();
    let dl = t + Duration::from_secs(10);
    assert_eq!(
        a.switch_to_tcp(fa, dl, false, || true, || {}),
        Switched::Tcp
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // Its image writes at once, behind the marker.
    raw_write(fa, b"from the image");
    // `b`'s next call sees it and answers without a marker of its own.
    b.notice_switch(fb);
    assert!(b.switching());
    assert_eq!(b.send(fb, &iov(b"x"), 0), Err(E_TCP));
    assert_eq!(
        b.switch_to_tcp(fb, dl, false, || true, || {}),
        Switched::Tcp
    );
    // Plain TCP both ways now, nothing else on either stream.
    assert_eq!(raw_read(fb, 14), b"from the image");
    raw_write(fb, b"to the image");
    assert_eq!(raw_read(fa, 12), b"to the image");
}

#[test]
fn a_peer_that_wrote_as_the_other_end_switched_alone_sends_it_again() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // `b` wrote as `a` committed (its `after_produce` looked before `a`'s bit): the bytes sit
    // unread in `a`'s ring, `a` switched alone with them (it waits for them over TCP), and
    // sent its marker.
    assert_eq!(b.send(fb, &iov(b"raced"), 0), Ok(5));
    a.own_wait()
        .fetch_or(WAIT_ALONE | WAIT_SWITCH, Ordering::SeqCst);
    assert!(a.ctl_begin(true));
    raw_write(fa, &[SWITCH_TCP]);
    a.ctl_end(true, true);
    // `b`'s next call answers: they go again over TCP, the first bytes `a`'s image reads.
    b.notice_switch(fb);
    assert!(b.peer_went_alone());
    let dl = Instant::now() + Duration::from_secs(10);
    assert_eq!(
        b.switch_to_tcp(fb, dl, false, || true, || {}),
        Switched::Tcp
    );
    raw_write(fb, b"+more");
    assert_eq!(raw_read(fa, 10), b"raced+more");
}

/// An end whose bytes its peer has not (all) read switches alone all the same
/// ([`F_ALONE_RESEND`]): after its marker it sends their count and the bytes from the consumer
/// cursor the peer last published; the peer drops what it read of them from its ring.
#[test]
fn an_end_whose_bytes_the_peer_did_not_read_switches_alone_and_sends_them_again() {
    for read_first in [0usize, 6] {
        let (a, b, fa, fb) = alone_pair(16384, 16384);
        a.enable_alone_resend();
        b.enable_alone_resend();
        let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
        assert_eq!(a.send(fa, &iov(b"hello world"), 0), Ok(11));
        let mut buf = [0u8; 16];
        if read_first > 0 {
            // `b` read some of it; its consumer cursor is not published yet (10 % rule).
            assert_eq!(
                b.recv(fb, &iov_mut(&mut buf[..read_first]), 0),
                Ok(read_first)
            );
        }
        let t = Instant::now();
        let dl = t + Duration::from_secs(10);
        assert_eq!(
            a.switch_to_tcp(fa, dl, false, || true, || {}),
            Switched::Tcp
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        raw_write(fa, b"+from the image");
        b.notice_switch(fb);
        assert!(b.peer_went_alone());
        assert_eq!(
            b.switch_to_tcp(fb, dl, false, || true, || {}),
            Switched::Tcp
        );
        let rest = &b"hello world"[read_first..];
        let mut want = rest.to_vec();
        want.extend_from_slice(b"+from the image");
        assert_eq!(raw_read(fb, want.len()), want, "read first: {read_first}");
        raw_write(fb, b"to the image");
        assert_eq!(raw_read(fa, 12), b"to the image");
    }
}

/// A peer that shut its writing and waits elsewhere: the end that leaves (having read all)
/// switches alone, and its reads on TCP say EOF at once, as TCP's (whose FIN came with the
/// peer's shutdown); the peer answers later and reads what the image writes.
#[test]
fn a_peer_that_shut_its_writing_needs_no_answer_and_its_eof_is_kept() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    a.enable_alone_resend();
    b.enable_alone_resend();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    assert_eq!(b.send(fb, &iov(b"last words"), 0), Ok(10));
    assert_eq!(b.shutdown(fb, libc::SHUT_WR), Ok(()));
    let mut buf = [0u8; 16];
    assert_eq!(a.recv(fa, &iov_mut(&mut buf), 0), Ok(10));
    let t = Instant::now();
    let dl = t + Duration::from_secs(10);
    assert_eq!(
        a.switch_to_tcp(fa, dl, false, || true, || {}),
        Switched::Tcp
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    // SAFETY: valid buffer.
    let n = unsafe { libc::recv(fa, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
    assert_eq!(n, 0, "EOF at once");
    raw_write(fa, b"from the image");
    b.notice_switch(fb);
    assert!(b.peer_went_alone());
    assert_eq!(
        b.switch_to_tcp(fb, dl, false, || true, || {}),
        Switched::Tcp
    );
    assert_eq!(raw_read(fb, 14), b"from the image");
}

/// A count behind the peer's marker that is smaller than what our ring holds unread: the
/// connection is reset, nothing is delivered twice or lost.
#[test]
fn a_count_smaller_than_what_the_ring_holds_resets_the_connection() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    a.enable_alone_resend();
    b.enable_alone_resend();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    assert_eq!(a.send(fa, &iov(b"hello world"), 0), Ok(11));
    // `a` (hostile) commits alone and says it sends 3 bytes again.
    a.own_wait()
        .fetch_or(WAIT_ALONE | WAIT_SWITCH, Ordering::SeqCst);
    assert!(a.ctl_begin(true));
    raw_write(fa, &[SWITCH_TCP]);
    a.ctl_end(true, true);
    raw_write(fa, &3u32.to_le_bytes());
    raw_write(fa, b"rld");
    b.notice_switch(fb);
    let dl = Instant::now() + Duration::from_secs(2);
    assert_eq!(
        b.switch_to_tcp(fb, dl, false, || true, || {}),
        Switched::Reset
    );
}

#[test]
fn a_peer_that_writes_its_wait_word_never_holds_a_doorbell_up() {
    let (a, b, fa, fb) = alone_pair(16384, 16384);
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // `b` (hostile) says 65 535 control sends of `a` are in flight, and flips its count.
    b.own_wait().store(CTL_INFLIGHT_MASK, Ordering::SeqCst);
    a.ring_doorbell(fa);
    assert_eq!(
        queued_bells(fb),
        1,
        "the doorbell went out, never waited for"
    );
    b.own_wait().store(0, Ordering::SeqCst);
    a.ring_doorbell(fa);
    b.own_wait().store(0, Ordering::SeqCst);
    // A drain that finds a byte the count does not cover reads it alone, once.
    b.drain(fb);
    assert_eq!(queued_bells(fb), 0);
    assert!(b.flags() & F_PROTO == 0);
}

/// Both ends hold a ring full of the other's bytes, unread, and switch to TCP at once (a
/// two-sided switch): each sends its bytes again, more than the socket pair buffers, so each
/// must read what the other sends meanwhile or both wait until the deadline and reset. The
/// bytes read meanwhile wait in the reader's ring ([`F_STASH`]) and its reads take them
/// first, then the socket's: each end reads the other's stream whole and in order.
#[test]
fn ends_that_send_each_other_more_than_the_socket_holds_read_meanwhile() {
    let len = 1usize << 20;
    let (a, b, fa, fb) = test_pair(len, len).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    // Three quarters of each ring (so that the reader's ring takes all of it again: a Unix
    // socket's `SIOCOUTQ` counts what its peer did not read, TCP's what it did not acknowledge).
    a.set_nonblocking(true);
    b.set_nonblocking(true);
    let fill = |c: &Conn, fd: i32, seed: u64| {
        let mut sent = Vec::new();
        while sent.len() < 768 << 10 {
            let chunk: Vec<u8> = (0..65536u64)
                .map(|i| byte_at(seed, sent.len() as u64 + i))
                .collect();
            match c.send(fd, &iov(&chunk), 0) {
                Ok(n) => sent.extend_from_slice(&chunk[..n]),
                Err(e) => panic!("send: {e}"),
            }
        }
        sent
    };
    let to_b = fill(&a, fa, 1);
    let to_a = fill(&b, fb, 2);
    assert!(to_b.len() > 512 << 10 && to_a.len() > 512 << 10);
    // The socket pair holds far less than a ring each way.
    for fd in [fa, fb] {
        crate::util::set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, 65536);
        crate::util::set_sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 65536);
    }
    a.set_nonblocking(false);
    b.set_nonblocking(false);
    let dl = Instant::now() + Duration::from_secs(20);
    // Each end's program reads once its switch returned: what the switch read first, then the
    // socket (`E_TCP`), as the other end may still be sending.
    let switch_and_read = |c: &Conn, fd: i32, want: usize| {
        assert_eq!(
            c.switch_to_tcp(fd, dl, false, || true, || {}),
            Switched::Tcp
        );
        let stashed = c.stash_left();
        let mut out = Vec::new();
        let mut buf = vec![0u8; 100_000];
        loop {
            match c.recv(fd, &iov_mut(&mut buf), 0) {
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(E_TCP) => break,
                Err(e) => panic!("recv: {e}"),
            }
        }
        let rest = want - out.len();
        out.extend_from_slice(&raw_read(fd, rest));
        (stashed, out)
    };
    std::thread::scope(|s| {
        let t = s.spawn(|| switch_and_read(&b, fb, to_b.len()));
        let (sa, got_a) = switch_and_read(&a, fa, to_a.len());
        let (sb, got_b) = t.join().unwrap();
        assert!(sa || sb, "nothing was read meanwhile");
        assert!(got_a == to_a, "a read b's bytes wrong");
        assert!(got_b == to_b, "b read a's bytes wrong");
    });
}

/// A blocking peek for more than the bytes before an urgent mark returns those bytes, as TCP's
/// (`tcp_recvmsg_locked` stops a read that copied bytes at the mark); from an offset past the
/// mark it reads on, from the mark it skips the urgent byte. Before, the peek neither copied
/// nor slept (poll counts the bytes past the mark) and spun for ever (red team rt23
/// `peekoob`). Each call runs in a thread with a bound, so that a regression fails.
#[test]
fn a_blocking_peek_stops_at_the_urgent_mark() {
    let (a, b, fa, fb) = test_pair(16384, 16384).unwrap();
    let (fa, fb) = (fa.as_raw_fd(), fb.as_raw_fd());
    assert_eq!(a.send(fa, &iov(&[b'a'; 10]), 0), Ok(10));
    assert_eq!(a.send(fa, &iov(b"X"), libc::MSG_OOB), Ok(1));
    assert_eq!(a.send(fa, &iov(&[b'b'; 200]), 0), Ok(200));
    let b = Arc::new(b);
    let call = |want: usize, flags: i32, peek_off: i32, lowat: u32| -> Vec<u8> {
        let (tx, rx) = std::sync::mpsc::channel();
        let c = Arc::clone(&b);
        std::thread::spawn(move || {
            c.set_peek_off(peek_off);
            c.sh().rcvlowat.store(lowat, Ordering::Relaxed);
            let mut buf = vec![0u8; want];
            let r = c.recv(fb, &iov_mut(&mut buf), flags);
            let _ = tx.send(r.map(|n| buf[..n].to_vec()));
        });
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the call returned")
            .expect("the call succeeded")
    };
    let peek_all = libc::MSG_PEEK | libc::MSG_WAITALL;
    assert_eq!(call(100, peek_all, -1, 1), vec![b'a'; 10]);
    assert_eq!(call(1000, libc::MSG_PEEK, -1, 100), vec![b'a'; 10]);
    assert_eq!(call(50, peek_all, 20, 1), vec![b'b'; 50]);
    assert_eq!(call(50, peek_all, 10, 1), vec![b'b'; 50]);
    // A read stops there too (it always did), and the next one skips the urgent byte.
    assert_eq!(call(100, libc::MSG_WAITALL, -1, 1), vec![b'a'; 10]);
    assert_eq!(call(200, libc::MSG_WAITALL, -1, 1), vec![b'b'; 200]);
}
