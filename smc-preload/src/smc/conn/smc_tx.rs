//! smc_tx: writing into the peer's ring (copy in, the producer cursor, the errors a write
//! reports) and giving idle send-ring pages back.

use super::*;

impl Conn {
    /// After producing: wake the reader if it sleeps.
    pub(super) fn after_produce(&self, fd: i32) {
        fence(Ordering::SeqCst);
        let w = self.peer_wait().load(Ordering::Relaxed);
        if w & (WAIT_DATA | WAIT_ASYNC | WAIT_ALONE) != 0 {
            self.wake_reader(fd, w);
        }
    }

    /// The reader sleeps ([`WAIT_DATA`], swapped off) or has `O_ASYNC` on ([`WAIT_ASYNC`]:
    /// one doorbell until it reads again, [`ASYNC_RUNG`]): ring. The reader switched to TCP
    /// alone ([`WAIT_ALONE`]; Dekker with its commit: either it saw these bytes and waits for
    /// them over TCP, or we see its bit here): [`F_PEER_ALONE`], and the call that produced
    /// switches before it returns (it sends them again over TCP).
    #[cold]
    fn wake_reader(&self, fd: i32, w: u64) {
        if w & WAIT_ALONE != 0 && self.flags() & F_ALONE_OK != 0 {
            self.peer_alone_seen();
            return;
        }
        let sleeps = w & WAIT_DATA != 0
            && self.peer_wait().fetch_and(!WAIT_DATA, Ordering::SeqCst) & WAIT_DATA != 0;
        let signal = w & WAIT_ASYNC != 0
            && self.peer_wait().fetch_or(ASYNC_RUNG, Ordering::SeqCst) & ASYNC_RUNG == 0;
        if sleeps || signal {
            self.ring_doorbell(fd);
        }
    }

    /// send/write/sendmsg. Returns bytes written; raises SIGPIPE itself unless MSG_NOSIGNAL.
    ///
    /// `MSG_OOB`: the last byte written is urgent (`tcp_mark_urg`; a write in several parts
    /// marks the end of each part, as TCP marks what it pushes before it waits for room).
    pub fn send(&self, fd: i32, iov: &[libc::iovec], flags: i32) -> Result<usize, Errno> {
        let r = self.send_bytes(fd, iov, flags);
        if flags & libc::MSG_ZEROCOPY != 0 && r.is_ok_and(|n| n > 0) {
            self.zerocopy_sent(fd);
        }
        r
    }

    /// `send(MSG_ZEROCOPY)` wrote bytes: with `SO_ZEROCOPY` on (else TCP ignores the flag), TCP
    /// queues a completion for this call on the socket's error queue (`POLLERR`, read with
    /// `recvmsg(MSG_ERRQUEUE)`), which a program waits for before it reuses its buffer. The
    /// ring took a copy at once, so the completion is due at once: counted here, reported by
    /// [`Conn::take_zerocopy`] as TCP reports a copied range (`SO_EE_CODE_ZEROCOPY_COPIED`).
    fn zerocopy_sent(&self, fd: i32) {
        if self
            .sockopt_int(fd, libc::SO_ZEROCOPY)
            .is_some_and(|on| on != 0)
        {
            self.zc_sent.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Completions of `send(MSG_ZEROCOPY)` calls not reported yet: the range of their ids
    /// (`lo..=hi`, counted from 0 as TCP does), taken (reported) when `take`.
    pub fn take_zerocopy(&self, take: bool) -> Option<(u32, u32)> {
        loop {
            let sent = self.zc_sent.load(Ordering::Acquire);
            let done = self.zc_done.load(Ordering::Acquire);
            if sent == done {
                return None;
            }
            if !take
                || self
                    .zc_done
                    .compare_exchange(done, sent, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                return Some((done, sent.wrapping_sub(1)));
            }
        }
    }

    fn send_bytes(&self, fd: i32, iov: &[libc::iovec], flags: i32) -> Result<usize, Errno> {
        let oob = flags & libc::MSG_OOB != 0;
        let nonblock = flags & libc::MSG_DONTWAIT != 0 || self.nonblocking();
        let mut cur = IovCursor::new(iov);
        let want = cur.remaining();
        let s = self.sh();
        s.tx_calls.fetch_add(1, Ordering::Relaxed);
        self.note_dir(DIR_TX);
        self.notice_switch(fd);
        let mut done = 0usize;
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            let r0 = self.write_state(done == 0);
            if r0 == Some(0) {
                if want == 0 {
                    return Ok(0);
                }
                if done > 0 {
                    return Ok(done);
                }
                if self.set_flag(F_WROTE_AFTER_CLOSE) & F_WROTE_AFTER_CLOSE == 0 {
                    let ps = self.peer_state();
                    if !ps.any_close() && peer_shut_both(ps) {
                        // The peer shut both ways but holds the connection: its kernel would
                        // answer these bytes with a reset, which it reads as `ECONNRESET`.
                        {
                            let _g = s.tx_lock.lock();
                            if oob && want <= self.tx.len() as usize {
                                // TCP's peer takes the urgent pointer of the segment before it
                                // resets (`tcp_urg` comes before the text in
                                // `tcp_rcv_state_process`): the mark moves to this write's
                                // last byte, which never arrives (`EPOLLPRI`, `SIOCATMARK` once
                                // read up to it; random call sequences with urgent data, seeds
                                // 38, 180, 196, 360). The word names it past our producer
                                // cursor; the peer takes it as the reset's mark (before the
                                // abort flag, which tells it so).
                                let prod = unpack(s.prod.load(Ordering::Acquire));
                                let last =
                                    UrgWord::from_type_word(s.urg_tx.load(Ordering::Relaxed));
                                let at = self.tx.add(prod, want as u32 - 1);
                                let w = last.next(self.tx.offset(at) as u32);
                                s.urg_tx.store(w.to_type_word(), Ordering::Relaxed);
                                self.peer_hdr().store_urg(w);
                            }
                            self.update_peer_flags(0, 0, ConnStateFlags::PEER_CONN_ABORT.0);
                        }
                        // Only a reader that waits for data (`WAIT_SPACE` is ours; see
                        // `final_close`).
                        if self
                            .peer_wait()
                            .fetch_and(!(WAIT_DATA | WAIT_SPACE), Ordering::SeqCst)
                            & WAIT_DATA
                            != 0
                        {
                            self.ring_doorbell(fd);
                        }
                    }
                    // EPOLLERR | EPOLLHUP from now on, as TCP's reset would say.
                    if let Some(h) = HOOKS.get() {
                        (h.changed)(fd, self);
                    }
                }
                return Ok(want);
            }
            if let Some(e) = r0 {
                if done > 0 {
                    return Ok(done);
                }
                if e == libc::EPIPE && flags & libc::MSG_NOSIGNAL == 0 {
                    raise_sigpipe();
                }
                return Err(e);
            }
            if want == 0 {
                return Ok(0);
            }
            {
                let _g = s.tx_lock.lock();
                if self.flags() & F_TO_TCP != 0 {
                    continue;
                }
                // Under tx_lock our producer cursor stands still.
                let (prod, room) = match self.tx_cursors() {
                    Some((p, c)) => (p, self.tx.free_space(p, c).unwrap_or(0)),
                    None => (unpack(s.prod.load(Ordering::Acquire)), 0),
                };
                let n = (room as usize).min(want - done);
                if n > 0 && oob && done == 0 {
                    // Linux's `urg_data_pending`: urgent data announced.
                    self.update_peer_flags(ProdFlags::URG_DATA_PENDING.0, 0, 0);
                }
                if n > 0 {
                    // SAFETY: `peer` is the peer's mapped DMB, longer than its CDC header
                    // (`Ring::for_dmb` accepted its length), so the ring starts inside the mapping.
                    let base = unsafe { self.peer.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
                    for (off, len) in self.tx.segments(prod, n as u32) {
                        if len > 0 {
                            // SAFETY: segments are inside the peer's ring.
                            unsafe { cur.drain_to(base.add(off), len) };
                        }
                    }
                    let np = self.tx.add(prod, n as u32);
                    if oob {
                        // The urgent word before the producer cursor that covers its byte.
                        let last = UrgWord::from_type_word(s.urg_tx.load(Ordering::Relaxed));
                        let w = last.next(self.tx.offset(self.tx.add(prod, n as u32 - 1)) as u32);
                        s.urg_tx.store(w.to_type_word(), Ordering::Relaxed);
                        self.peer_hdr().store_urg(w);
                        self.update_peer_flags(ProdFlags::URG_DATA_PRESENT.0, 0, 0);
                        self.set_flag(F_URG_FLAGS);
                    } else if self.flags() & F_URG_FLAGS != 0 {
                        let urg = ProdFlags::URG_DATA_PENDING.with(ProdFlags::URG_DATA_PRESENT);
                        self.update_peer_flags(0, urg.0, 0);
                        s.flags.fetch_and(!F_URG_FLAGS, Ordering::AcqRel);
                    }
                    s.prod.store(pack(np), Ordering::Release);
                    self.peer_hdr().store_prod(CursorWord::from_cursor(np));
                    s.tx_bytes.fetch_add(n as u64, Ordering::Relaxed);
                    done += n;
                    if oob {
                        // Readable now: the reader's kernel may send SIGURG (still under
                        // tx_lock: one urgent doorbell at a time, see `ring_urgent`).
                        self.ring_urgent(fd);
                    }
                }
            }
            if done > 0 {
                self.after_produce(fd);
                if self.epoll_parked.load(Ordering::Relaxed) != 0 {
                    if let Some(h) = HOOKS.get() {
                        (h.wrote)(fd, self);
                    }
                }
            }
            if done == want {
                return Ok(done);
            }
            s.tx_full.fetch_add(1, Ordering::Relaxed);
            if nonblock {
                // The ring is full: ask the peer to ring when it makes room, then look again
                // (Dekker with its consume). An epoll set may have parked this connection, and
                // an edge-triggered application waits for that room after a short write or
                // EAGAIN without any further call that would arm it.
                self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                if self.room() > 0 && self.write_state(false).is_none() {
                    continue;
                }
                return if done > 0 {
                    Ok(done)
                } else {
                    Err(libc::EAGAIN)
                };
            }
            let dl = *deadline
                .get_or_insert_with(|| deadline_of(self.sock_timeout(fd, libc::SO_SNDTIMEO)));
            match self.wait(fd, false, 1, dl) {
                Woke::Ready => {}
                Woke::Timeout => {
                    return if done > 0 {
                        Ok(done)
                    } else {
                        Err(libc::EAGAIN)
                    };
                }
                Woke::Intr => {
                    return if done > 0 { Ok(done) } else { Err(libc::EINTR) };
                }
            }
        }
    }

    /// `getsockopt(SO_ERROR)`: the error pending on this end (a reset by the peer, or the
    /// `EPIPE` a write after the peer's close left), reported once as TCP reports `sk_err`:
    /// taken, the next read or write does not report it again. 0 if none.
    pub fn take_so_error(&self) -> Errno {
        if !self.readiness().error {
            return 0;
        }
        if self.flags() & F_WROTE_AFTER_CLOSE != 0
            && self.set_flag(F_EPIPE_REPORTED) & F_EPIPE_REPORTED == 0
        {
            return libc::EPIPE;
        }
        if self.set_flag(F_RST_REPORTED) & F_RST_REPORTED == 0 {
            let e = self.reset_errno();
            crate::debug!("SO_ERROR gives {}: {}", reset_name(e), self.describe());
            return e;
        }
        0
    }

    /// `Some(errno)` if writing is impossible. `report`: the call returns that error (it wrote
    /// nothing yet), so a pending reset or broken pipe counts as reported; a call that already
    /// wrote part of its buffer returns that count and leaves the report to the next call, as
    /// TCP leaves `sk_err` pending across a partial `sendmsg`.
    pub(super) fn write_state(&self, report: bool) -> Option<Errno> {
        let f = self.flags();
        if f & F_TO_TCP != 0 {
            return Some(E_TCP);
        }
        let ps = self.peer_state();
        let graceful = ps.any_close_or_done() && !ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        let reset = f & F_PROTO != 0
            || (f & F_PEER_RST != 0 && !graceful)
            || ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        if f & F_SHUT_WR != 0 {
            // As TCP's `sk_stream_error`: an error still pending (the peer's reset, or the
            // broken pipe a write after its close left) is the call's error, taken, before
            // our own shutdown's `EPIPE` (random call sequences, seeds 1 and 4: the write
            // after a reset of a half-closed end said EPIPE where TCP says ECONNRESET, and the
            // error stayed pending for a later read).
            if report {
                if reset && self.set_flag(F_RST_REPORTED) & F_RST_REPORTED == 0 {
                    let e = self.reset_errno();
                    crate::debug!("write gives {}: {}", reset_name(e), self.describe());
                    return Some(e);
                }
                if f & F_WROTE_AFTER_CLOSE != 0 {
                    self.set_flag(F_EPIPE_REPORTED);
                }
            }
            return Some(libc::EPIPE);
        }
        if reset {
            if !report {
                return Some(libc::ECONNRESET);
            }
            if self.set_flag(F_RST_REPORTED) & F_RST_REPORTED == 0 {
                let e = self.reset_errno();
                crate::debug!("write gives {}: {}", reset_name(e), self.describe());
                return Some(e);
            }
            return Some(libc::EPIPE);
        }
        if ps.any_close() || f & F_PEER_GONE != 0 || peer_shut_both(ps) {
            if f & F_WROTE_AFTER_CLOSE == 0 {
                // TCP takes the first write after the peer's close (the peer answers with a
                // reset): it succeeds, the bytes go nowhere.
                return Some(0);
            }
            if report {
                self.set_flag(F_EPIPE_REPORTED);
            }
            return Some(libc::EPIPE);
        }
        None
    }

    /// Whether our producer cursor moved by at least a page since the last
    /// [`Conn::reclaim_tx`] that found everything consumed (so that there may be pages to
    /// give back; while the peer had bytes unread, their pages free up without a write of
    /// ours, and each idle wait looks again).
    pub fn reclaim_due(&self) -> bool {
        let s = self.sh();
        let prod = unpack(s.prod.load(Ordering::Relaxed));
        let last = unpack(s.tx_reclaimed.load(Ordering::Relaxed));
        self.tx
            .diff(last, prod)
            .map_or(true, |d| d as usize >= PAGE)
    }

    /// Give back the pages of the send ring (the peer's DMB) that hold no data: the free space
    /// from `RECLAIM_WARM` after our producer cursor up to the peer's published consumer
    /// cursor, page by page (`MADV_REMOVE` on the shared mapping punches a hole in the memfd;
    /// those pages read as zeros and cost nothing until written again). Race-free: the peer
    /// only reads between its consumer cursor and our producer cursor, and we hold the writer
    /// lock, so nobody writes there meanwhile. Skipped when a writer of ours is busy.
    /// Returns the bytes given back.
    pub fn reclaim_tx(&self) -> usize {
        let s = self.sh();
        let Some(_g) = s.tx_lock.try_lock() else {
            return 0;
        };
        // Under the writer lock the producer cursor stands still.
        let Some((prod, cons)) = self.tx_cursors() else {
            return 0;
        };
        // Done for this producer cursor only once the peer consumed everything: otherwise the
        // pages it still had to read become free later, with no write of ours to move the
        // cursor again, and the next idle wait must look again (before, the rings of a
        // connection that went idle right after such a reclaim stayed resident: buffering_smc
        // `idle 1724416`).
        if prod == cons {
            s.tx_reclaimed.store(pack(prod), Ordering::Relaxed);
        }
        let free = self.tx.free_space(prod, cons).unwrap_or(0);
        if free <= RECLAIM_WARM {
            return 0;
        }
        let start = self.tx.add(prod, RECLAIM_WARM);
        let mut done = 0;
        for (off, len) in self.tx.segments(start, free - RECLAIM_WARM) {
            let a = (smc_common::cdc::CDC_HEADER_LEN + off).next_multiple_of(PAGE);
            let b = (smc_common::cdc::CDC_HEADER_LEN + off + len) / PAGE * PAGE;
            if len == 0 || b <= a || b > self.peer.len() {
                continue;
            }
            // SAFETY: [a, b) is page aligned inside our mapping of the peer's DMB, past the
            // header page; it holds no data (see above).
            let r = unsafe {
                libc::madvise(
                    self.peer.as_ptr().add(a) as *mut libc::c_void,
                    b - a,
                    libc::MADV_REMOVE,
                )
            };
            if r == 0 {
                done += b - a;
            }
        }
        s.tx_reclaimed_bytes
            .fetch_add(done as u64, Ordering::Relaxed);
        done
    }
}

/// The peer shut its reading and its writing without closing ([`PEER_DONE_READING`] and
/// `peer_done_writing`): TCP's peer is in FIN_WAIT with `RCV_SHUTDOWN` and resets at new data.
fn peer_shut_both(ps: ConnStateFlags) -> bool {
    ps.contains(ConnStateFlags::PEER_DONE_WRITING) && ps.0 & PEER_DONE_READING != 0
}

/// The name of a reset's errno in the debug log (`ECONNRESET`, or `EPIPE` after the peer's
/// FIN): operators and tests grep for it.
fn reset_name(e: Errno) -> &'static str {
    match e {
        libc::ECONNRESET => "ECONNRESET",
        libc::EPIPE => "EPIPE",
        _ => "an error",
    }
}
