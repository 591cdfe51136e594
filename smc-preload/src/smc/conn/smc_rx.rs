//! smc_rx: reading our ring (copy out, the consumer cursor, `SO_RCVLOWAT`).

use super::*;

impl Conn {
    /// After consuming: publish the consumer cursor if the 10% rule says so, the ring is
    /// drained, or the writer waits; ring the doorbell if it was waiting.
    pub(super) fn after_consume(&self, fd: i32, cons: Cursor, ring_empty: bool) {
        if self.flags() & F_STASH != 0 {
            // Bytes a switch to TCP read from the socket: the peer is not told (it left the
            // rings; its DMB may serve another connection once it let it go).
            return;
        }
        let s = self.sh();
        let published = unpack(s.cons_pub.load(Ordering::Acquire));
        let peer_flags = self.own_hdr().load_cons().prod_flags;
        let writer_waits = self.own_wait().load(Ordering::Relaxed) & WAIT_SPACE != 0;
        if cons != published
            && (ring_empty || writer_waits || self.rx.need_cons_update(published, cons, peer_flags))
        {
            self.publish_cons(cons);
        }
        fence(Ordering::SeqCst);
        if self.own_wait().load(Ordering::Relaxed) & WAIT_SPACE != 0 {
            if unpack(s.cons_pub.load(Ordering::Acquire)) != cons {
                self.publish_cons(cons);
            }
            if self.own_wait().fetch_and(!WAIT_SPACE, Ordering::SeqCst) & WAIT_SPACE != 0 {
                self.ring_doorbell(fd);
            }
        }
    }

    /// Takes the socket's `SO_RCVLOWAT` as the kernel holds it (after it clamped the value):
    /// poll/select/epoll report `IN` from that many bytes on, and a blocking read waits for
    /// that many (or the bytes asked for, when fewer), as `tcp_poll` and `tcp_recvmsg` do.
    pub fn set_rcvlowat(&self, fd: i32) {
        let v = self
            .sockopt_int(fd, libc::SO_RCVLOWAT)
            .map_or(1, |v| v.max(1) as u32);
        self.sh().rcvlowat.store(v, Ordering::Relaxed);
    }

    /// The bytes that make the connection readable: `SO_RCVLOWAT`, at most a full ring (the
    /// peer cannot send more before we read; TCP caps it at half its largest buffer).
    pub fn rcvlowat(&self) -> u32 {
        self.sh()
            .rcvlowat
            .load(Ordering::Relaxed)
            .clamp(1, self.rx.len().max(1))
    }

    /// `SO_PEEK_OFF` as the socket holds it (negative: off).
    pub fn peek_off(&self) -> i32 {
        self.sh().peek_off.load(Ordering::Relaxed) as i32
    }

    /// `setsockopt(SO_PEEK_OFF)` succeeded with `v` (`sk_set_peek_off`: any value, negative
    /// turns it off), or the value the socket held when the connection was set up.
    /// No lock (a signal handler may call it while its thread holds `rx_lock`): a peek in
    /// flight elsewhere moves on from whichever value it read, as `sk_peek_offset_fwd` does.
    pub fn set_peek_off(&self, v: i32) {
        self.sh().peek_off.store(v as u32, Ordering::Relaxed);
    }

    /// Bytes readable now (FIONREAD / SIOCINQ): up to the urgent mark while it is ahead
    /// (`tcp_inq`).
    pub fn inq(&self) -> u32 {
        let Some((cons, prod)) = self.rx_cursors() else {
            return 0;
        };
        let avail = self.rx.readable(cons, prod).unwrap_or(0);
        let (rx, skip) = self.urg_take(cons, prod);
        urg::inq(
            self.rx,
            rx,
            self.rx.add(cons, skip),
            avail.saturating_sub(skip),
            self.oobinline(),
        )
    }

    /// `SIOCATMARK`: whether the read position is at the urgent mark.
    pub fn at_mark(&self) -> bool {
        let Some((cons, prod)) = self.rx_cursors() else {
            return false;
        };
        let (rx, skip) = self.urg_take(cons, prod);
        rx.at_mark(self.rx.add(cons, skip))
    }

    /// `recv(MSG_OOB)` (`tcp_recv_urg`): the urgent byte while it was not read (`MSG_PEEK`
    /// leaves it so), `EINVAL` when there is none or `SO_OOBINLINE` is on. Never waits.
    /// Returns the bytes (1, or 0 for an empty buffer) and the `msg_flags` of the call.
    pub fn recv_oob(
        &self,
        fd: i32,
        iov: &[libc::iovec],
        flags: i32,
    ) -> Result<(usize, i32), Errno> {
        if self.rx_on_tcp() {
            return Err(E_TCP);
        }
        let s = self.sh();
        s.rx_calls.fetch_add(1, Ordering::Relaxed);
        self.note_dir(DIR_RX);
        let _g = s.rx_lock.lock();
        if self.rx_on_tcp() {
            return Err(E_TCP);
        }
        let Some((cons, prod)) = self.rx_cursors() else {
            return Err(libc::EINVAL);
        };
        let (_, mut rx) = self.urg_sync(fd, cons, prod);
        if self.oobinline() || rx.state != UrgState::Valid {
            return Err(libc::EINVAL);
        }
        if self.reset_without_fin() {
            // `tcp_recv_urg`: a socket reset before any FIN of the peer (CLOSE without
            // `SOCK_DONE`) has no urgent byte to give (random call sequences with urgent data,
            // seed 7: the byte came back after the peer's close with our bytes unread, where
            // TCP says ENOTCONN).
            return Err(libc::ENOTCONN);
        }
        if flags & libc::MSG_PEEK == 0 {
            rx.state = UrgState::Read;
            self.set_urg_rx(rx);
        }
        let mut cur = IovCursor::new(iov);
        if cur.remaining() == 0 {
            return Ok((0, libc::MSG_OOB | libc::MSG_TRUNC));
        }
        if flags & libc::MSG_TRUNC == 0 {
            let b = [rx.byte];
            // SAFETY: one byte from a local; the iovecs are the caller's buffers.
            unsafe { cur.fill_from(b.as_ptr(), 1) };
        }
        Ok((1, libc::MSG_OOB))
    }

    /// recv/read/recvmsg. `nonblock` is the call's own MSG_DONTWAIT; the fd's O_NONBLOCK is
    /// known here.
    pub fn recv(&self, fd: i32, iov: &[libc::iovec], flags: i32) -> Result<usize, Errno> {
        if flags & libc::MSG_OOB != 0 {
            return self.recv_oob(fd, iov, flags).map(|(n, _)| n);
        }
        let peek = flags & libc::MSG_PEEK != 0;
        let trunc = flags & libc::MSG_TRUNC != 0;
        let local = self.sh().flags.load(Ordering::Relaxed);
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || local & F_NONBLOCK != 0;
        let async_io = local & F_ASYNC != 0;
        let mut cur = IovCursor::new(iov);
        let want = cur.remaining();
        let waitall = flags & libc::MSG_WAITALL != 0 && !nonblock;
        // MSG_PEEK|MSG_WAITALL waits for `want` bytes, but never for more than the ring holds:
        // the peer cannot send more until we read (TCP's autotuned buffer would hold them;
        // waiting for them here hung forever, issue 10).
        let peek_all = want.min(self.rx.len() as usize);
        // SO_RCVLOWAT: a blocking read returns once this many bytes were read (tcp_recvmsg's
        // target: the low-water mark or the bytes asked for, whichever is less; all of them
        // with MSG_WAITALL). A non-blocking one returns what is there.
        let target = if nonblock {
            1
        } else if waitall {
            want
        } else {
            (self.rcvlowat() as usize).min(want)
        };
        // What a MSG_PEEK must find before it returns (it cannot read on to wait for more).
        // Bytes a switch to TCP read into the ring ([`F_STASH`]): nothing more comes into the
        // ring, so a peek takes what is there (the caller peeks on at the socket for the rest,
        // `ops::recv_in`); before, a peek for more than the stash held slept on the socket,
        // which its bytes keep readable: 100% CPU until the timeout (red team rt21 `peekwaitall`).
        let peek_need = if self.flags() & F_STASH != 0 {
            1
        } else if waitall {
            peek_all
        } else {
            target.min(self.rx.len() as usize)
        };
        let s = self.sh();
        s.rx_calls.fetch_add(1, Ordering::Relaxed);
        self.note_dir(DIR_RX);
        let mut done = 0usize;
        // SO_RCVTIMEO is only looked up once we have to sleep.
        let mut deadline: Option<Option<Instant>> = None;
        // A peek that waited for more than there is and gave up (timeout or signal): it
        // returns the bytes there are, as TCP's peek returns what it copied before the wait;
        // with none, the error of the wait.
        let mut gave_up: Option<Errno> = None;
        // SO_PEEK_OFF (`sk_peek_offset`): where a peek starts past the read position, read
        // under `rx_lock` (0 when off or for a read).
        let mut poff = 0u32;
        // The urgent byte a peek that starts at the mark skips (see below), for the wait's
        // count of what it needs.
        let mut pskip: u32;
        loop {
            if self.rx_on_tcp() {
                return if done > 0 { Ok(done) } else { Err(E_TCP) };
            }
            if async_io {
                // Each look at the ring (also after a wait a doorbell ended).
                self.async_looked(fd);
            }
            {
                let _g = s.rx_lock.lock();
                if self.rx_on_tcp() {
                    // Switched while we waited for the lock: the ring's bytes come over TCP.
                    continue;
                }
                // Under rx_lock our consumer cursor stands still.
                let (cons, prod) = match self.rx_cursors() {
                    Some(cp) => cp,
                    None => {
                        let c = unpack(s.cons.load(Ordering::Acquire));
                        (c, c)
                    }
                };
                // Urgent data (tcp_recvmsg_locked): a read that copied bytes stops at the
                // mark; one that starts there skips the urgent byte (unless SO_OOBINLINE).
                let (cons, rx) = self.urg_sync(fd, cons, prod);
                let avail = self.rx.readable(cons, prod).unwrap_or(0);
                if want == 0 && avail > 0 {
                    // `tcp_recvmsg` with nothing asked for and bytes queued: 0, nothing
                    // consumed (not even an urgent byte at the read position).
                    return Ok(0);
                }
                if done > 0 && rx.at_mark(cons) {
                    return Ok(done);
                }
                let (skip, lim) = urg::read_plan(self.rx, rx, cons, avail, self.oobinline());
                let start = self.rx.add(cons, skip);
                if peek {
                    poff = self.peek_off().max(0) as u32;
                }
                if !peek && skip > 0 {
                    // The urgent byte is consumed (out of band): the mark is passed.
                    s.cons.store(pack(start), Ordering::Release);
                    self.set_urg_rx(rx.passed(self.rx, start));
                    self.after_consume(fd, start, lim == 0);
                }
                // What a peek finds past its offset (the read position for a read), and
                // whether the urgent mark ends it. `tcp_recvmsg_locked` stops a read that
                // copied bytes at the mark, a peek too: it returns what lies before the mark,
                // however many it wanted. A peek that starts past the mark (`SO_PEEK_OFF`)
                // reads on past it; one that starts at the mark skips the urgent byte (unless
                // `SO_OOBINLINE`). Before, a blocking peek for more than the bytes before a
                // mark (`MSG_WAITALL`, `SO_RCVLOWAT`) neither copied nor slept: poll counts
                // the bytes past the mark, so it looked again, at 100% CPU for ever (red team
                // rt23 `peekoob`; a hostile peer had only to write an urgent word).
                let rest = avail.saturating_sub(skip);
                let mut cut = false;
                pskip = 0;
                let plim = if !peek {
                    lim
                } else if lim < rest {
                    if poff < lim {
                        cut = true;
                        lim - poff
                    } else {
                        if poff == lim && !self.oobinline() {
                            pskip = 1;
                        }
                        rest.saturating_sub(poff.saturating_add(pskip))
                    }
                } else {
                    lim.saturating_sub(poff)
                };
                if plim > 0
                    && !(peek
                        && !cut
                        && (plim as usize) < peek_need
                        && gave_up.is_none()
                        && !self.readiness().rd_eof)
                {
                    if peek {
                        let n = (plim as usize).min(want);
                        if !trunc {
                            self.copy_out(self.rx.add(start, poff + pskip), n, &mut cur);
                        }
                        // `sk_peek_offset_fwd`: the next peek starts after these bytes.
                        let po = self.peek_off();
                        if po >= 0 {
                            s.peek_off
                                .store(po.saturating_add(n as i32) as u32, Ordering::Relaxed);
                        }
                        return Ok(n);
                    }
                    let n = (lim as usize).min(want - done);
                    if !trunc {
                        self.copy_out(start, n, &mut cur);
                    }
                    let nc = self.rx.add(start, n as u32);
                    s.cons.store(pack(nc), Ordering::Release);
                    if rx.marked() {
                        self.set_urg_rx(rx.passed(self.rx, nc));
                    }
                    s.rx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    // `sk_peek_offset_bwd`: the peek offset counts from the read position.
                    let po = self.peek_off();
                    if po > 0 {
                        s.peek_off
                            .store(po.saturating_sub(n as i32).max(0) as u32, Ordering::Relaxed);
                    }
                    if avail as usize == self.rx.len() as usize {
                        s.rx_full.fetch_add(1, Ordering::Relaxed);
                    }
                    self.after_consume(fd, nc, n as u32 == lim && lim + skip == avail);
                    done += n;
                    if done >= target {
                        return Ok(done);
                    }
                    continue;
                }
            }
            // Nothing (more) to read.
            if let Some(e) = gave_up {
                return Err(e);
            }
            let r = self.readiness();
            // The bytes a look again needs: one for a read, past the offset for a peek.
            let need = if peek {
                poff.saturating_add(pskip)
                    .saturating_add((peek_need as u32).max(1))
            } else {
                1
            };
            if r.readable >= need {
                continue;
            }
            if r.error && r.readable == 0 {
                if done > 0 {
                    return Ok(done);
                }
                let f = self.flags();
                let ps = self.peer_state();
                let graceful =
                    ps.any_close_or_done() && !ps.contains(ConnStateFlags::PEER_CONN_ABORT);
                if f & F_WROTE_AFTER_CLOSE != 0 && f & F_PROTO == 0 && graceful {
                    // TCP: the peer's FIN came before the reset our write drew (`SOCK_DONE`),
                    // so a read is at the end of the stream; the `EPIPE` the reset left stays
                    // pending for the next write or `SO_ERROR`.
                    return Ok(0);
                }
                if self.fin_before_reset() {
                    // The peer's FIN came before its reset (`SOCK_DONE`): the end of the
                    // stream; the reset's error stays pending for `SO_ERROR` or a write.
                    return Ok(0);
                }
                let old = self.set_flag(F_RST_REPORTED);
                if old & F_RST_REPORTED == 0 {
                    crate::debug!("fd {fd}: read gives ECONNRESET: {}", self.describe());
                }
                return Err(libc::ECONNRESET);
            }
            if r.rd_eof {
                if peek && r.readable > poff.saturating_add(pskip) {
                    continue;
                }
                return Ok(done);
            }
            if nonblock {
                if done == 0 && self.probe_peer_gone(fd) {
                    continue; // the peer's end or reset, seen on the TCP socket
                }
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            let dl = *deadline
                .get_or_insert_with(|| deadline_of(self.sock_timeout(fd, libc::SO_RCVTIMEO)));
            let woke = self.wait(fd, true, need, dl);
            if want == 0 {
                // `tcp_recvmsg` with nothing asked for waits once (data, the end, a timeout
                // or a signal) and returns 0 whatever woke it.
                return Ok(0);
            }
            let e = match woke {
                Woke::Ready => continue,
                Woke::Timeout => libc::EAGAIN,
                Woke::Intr => libc::EINTR,
            };
            if done > 0 {
                return Ok(done);
            }
            if peek {
                // Look once more: the bytes there are now, if any, are the answer.
                gave_up = Some(e);
                continue;
            }
            return Err(e);
        }
    }

    pub(super) fn copy_out(&self, cons: Cursor, n: usize, cur: &mut IovCursor<'_>) {
        // SAFETY: `own` is our mapped DMB, longer than its CDC header (`Ring::for_dmb` accepted its
        // length), so the ring starts inside the mapping.
        let base = unsafe { self.own.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        for (off, len) in self.rx.segments(cons, n as u32) {
            if len > 0 {
                // SAFETY: segments are inside the ring; the iovecs are the caller's buffers.
                unsafe { cur.fill_from(base.add(off), len) };
            }
        }
    }
}
