//! Wakeups: doorbells (one byte over the TCP socket, rung when the other end's wait bit was
//! set), their drains, the sleepers of a connection (one poller on the TCP socket, the others
//! on a futex), and the blocking wait of a read or write.

use super::*;
use crate::util::unwound;

impl Conn {
    /// Send a doorbell byte (non-blocking, no SIGPIPE).
    pub fn ring_doorbell(&self, fd: i32) {
        let s = self.sh();
        // Dekker with the switch to TCP: either it sees us here and waits, or we see its flag
        // and stay silent (no doorbell may follow its marker on the stream).
        s.bells.fetch_add(1, Ordering::SeqCst);
        if s.flags.load(Ordering::SeqCst) & (F_SWITCHING | F_SWITCHED) == 0 && self.ctl_begin(true)
        {
            let sent = self.ring_doorbell_now(fd);
            self.ctl_end(true, sent);
        }
        s.bells.fetch_sub(1, Ordering::SeqCst);
    }

    /// Before a control byte (doorbell, urgent doorbell, switch marker) goes to the socket,
    /// with [`F_ALONE_OK`]: one send in flight and, when `counted`, one more byte sent, in the
    /// peer's wait word (else [`CTL_UNCOUNTED`]). False when the peer switched alone
    /// ([`WAIT_ALONE`]): nothing may go out any more (its next image reads this socket as
    /// data); [`F_PEER_ALONE`] is set, the caller's connection switches at its next look.
    pub(super) fn ctl_begin(&self, counted: bool) -> bool {
        if self.flags() & F_ALONE_OK == 0 {
            return true;
        }
        let w = self.peer_wait();
        let mut cur = w.load(Ordering::SeqCst);
        let mut tries = 0u32;
        loop {
            if cur & WAIT_ALONE != 0 {
                self.peer_alone_seen();
                return false;
            }
            if cur & CTL_INFLIGHT_MASK == CTL_INFLIGHT_MASK {
                // 65 535 sends in flight: no process has that many threads ringing at once, so
                // the peer wrote it (a hostile peer writes its own wait word as it likes). Never
                // waited for: the byte goes out as if counted (`ctl_end` then takes one from a
                // word only this connection reads, its counts already meaningless).
                return true;
            }
            let new = if counted {
                cur.wrapping_add(CTL_INFLIGHT_ONE)
                    .wrapping_add(CTL_SENT_ONE)
            } else {
                (cur | CTL_UNCOUNTED).wrapping_add(CTL_INFLIGHT_ONE)
            };
            match w.compare_exchange_weak(cur, new, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(x) => cur = x,
            }
            tries += 1;
            if tries > 10_000 {
                // The word never held still: only a peer that writes it in a loop does that.
                return true;
            }
        }
    }

    /// After the control byte of [`Conn::ctl_begin`] (true): the send is no longer in flight;
    /// a counted byte that did not go out is taken back.
    pub(super) fn ctl_end(&self, counted: bool, sent: bool) {
        if self.flags() & F_ALONE_OK == 0 {
            return;
        }
        let d = if counted && !sent {
            CTL_INFLIGHT_ONE.wrapping_add(CTL_SENT_ONE)
        } else {
            CTL_INFLIGHT_ONE
        };
        self.peer_wait().fetch_sub(d, Ordering::SeqCst);
    }

    /// With [`F_ALONE_OK`]: how many control bytes the peer sent that we have not read (its
    /// count in our wait word against ours); `None` without the feature, after an uncounted
    /// byte ([`CTL_UNCOUNTED`]), or for a count no peer could have made (read as without
    /// the feature: a peer that breaks the protocol breaks only its own connection).
    pub(super) fn ctl_unread(&self) -> Option<u32> {
        if self.flags() & F_ALONE_OK == 0 {
            return None;
        }
        let w = self.own_wait().load(Ordering::SeqCst);
        if w & CTL_UNCOUNTED != 0 {
            return None;
        }
        let sent = (w >> 32) as u32;
        let got = self.sh().doorbells_rcvd.load(Ordering::Acquire) as u32;
        Some(sent.wrapping_sub(got)).filter(|&n| n < 1 << 30)
    }

    /// One doorbell byte on the socket now; whether it went out.
    pub(super) fn ring_doorbell_now(&self, fd: i32) -> bool {
        let b = [DOORBELL];
        // SAFETY: valid buffer.
        let r = self.with_io(fd, |io| unsafe {
            real::send(
                io,
                b.as_ptr() as *const libc::c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        });
        if r == 1 {
            self.sh().doorbells_sent.fetch_add(1, Ordering::Relaxed);
        }
        r == 1
    }

    /// An urgent send published its byte (word and producer cursor): one doorbell sent as a
    /// real TCP urgent byte (`MSG_OOB`), past the `sk_msg` shortcut (switched off around it:
    /// a redirected message lands as ordinary data), so that the reader's kernel sends
    /// `SIGURG` to the socket's owner (`F_SETOWN`) as TCP's `tcp_check_urg` does, and
    /// `POLL_PRI` to an `O_ASYNC` owner. The reader needs nothing of it: its drains read past
    /// it like any doorbell (out of band the kernel skips it and clears its urgent state as
    /// the read passes it; with `SO_OOBINLINE` it is a doorbell byte in the stream). Called
    /// under `tx_lock`, so two urgent sends do not switch the shortcut under each other;
    /// doorbells other threads ring meanwhile go over TCP, which the reader drains as well.
    /// Counted in `bells` as a doorbell: a switch to TCP sends its marker after it.
    pub(super) fn ring_urgent(&self, fd: i32) {
        let s = self.sh();
        s.bells.fetch_add(1, Ordering::SeqCst);
        // Out of the counts: the reader's kernel takes it out of the stream unless
        // `SO_OOBINLINE` is on, so the reader could not tell whether it read it.
        if s.flags.load(Ordering::SeqCst) & (F_SWITCHING | F_SWITCHED) == 0 && self.ctl_begin(false)
        {
            let shortcut = !crate::util::config::config().no_shortcut;
            let b = [DOORBELL];
            let e0 = real::errno();
            let r = self.with_io(fd, |io| {
                if shortcut {
                    set_shortcut(io, 0);
                }
                // SAFETY: valid buffer.
                let r = unsafe {
                    real::send(
                        io,
                        b.as_ptr() as *const libc::c_void,
                        1,
                        libc::MSG_OOB | libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                    )
                };
                if shortcut {
                    set_shortcut(io, 1);
                }
                r
            });
            real::set_errno(e0);
            if r == 1 {
                s.doorbells_sent.fetch_add(1, Ordering::Relaxed);
            }
            self.ctl_end(false, r == 1);
        }
        s.bells.fetch_sub(1, Ordering::SeqCst);
    }

    /// `O_ASYNC` on or off for the socket ([`F_ASYNC`], [`WAIT_ASYNC`] in our DMB for the
    /// writer).
    pub fn set_async(&self, on: bool) {
        if on {
            self.own_wait().fetch_and(!ASYNC_RUNG, Ordering::SeqCst);
            self.own_wait().fetch_or(WAIT_ASYNC, Ordering::SeqCst);
            self.set_flag(F_ASYNC);
        } else {
            self.sh().flags.fetch_and(!F_ASYNC, Ordering::AcqRel);
            self.own_wait()
                .fetch_and(!(WAIT_ASYNC | ASYNC_RUNG), Ordering::SeqCst);
        }
    }

    /// A read of an `O_ASYNC` end, before it looks at the ring: the writer's next bytes ring
    /// again ([`ASYNC_RUNG`] off, Dekker with [`Conn::after_produce`]: bytes produced before
    /// this are seen by the read, the ones after it ring), and the doorbell rung for the
    /// earlier ones is drained (no thread of ours may ever sleep on the socket to drain it).
    pub(super) fn async_looked(&self, fd: i32) {
        if self.own_wait().fetch_and(!ASYNC_RUNG, Ordering::SeqCst) & ASYNC_RUNG != 0 {
            self.try_drain(fd);
        }
        fence(Ordering::SeqCst);
    }

    /// Consume doorbell bytes waiting on the TCP socket; note EOF / reset. Waiters asleep on
    /// the futex are woken (the ring state may have changed). Only [`Conn::try_drain`] (and the
    /// last close) call it: a drain behind the back of a thread asleep on the socket would
    /// take its wakeup.
    pub(super) fn drain(&self, fd: i32) {
        self.drain_to(fd, false);
    }

    /// [`Conn::drain`]; `to_end`: read until the socket says `EAGAIN`, EOF or an error even
    /// after a short read (an EOF behind the doorbells is noticed now).
    pub(crate) fn drain_to(&self, fd: i32, to_end: bool) {
        self.drain_bytes(fd, to_end);
        let s = self.sh();
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        if s.waiters.load(Ordering::Acquire) > 0 {
            crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        }
    }

    /// At the final close: an urgent doorbell of the peer ([`Conn::ring_urgent`]) that no
    /// read passed over yet is still in the socket's receive queue, out of band, where the
    /// drain's peek does not see it (TCP's read skips the urgent byte; a peek leaves it).
    /// Counted as unread data by `tcp_close`, it turned our FIN into a reset, and the peer's
    /// socket held `ECONNRESET` for its `SO_ERROR` after a close that TCP makes silently
    /// (random call sequences with urgent data, seed 83). At the mark a read of one byte
    /// passes over it (and takes at most one doorbell behind it, which the close drops
    /// anyway). Nothing after a switch marker: the stream is data there.
    pub(super) fn pass_urgent_doorbell(&self, fd: i32) {
        if self.flags() & (F_SWITCHING | F_PEER_SWITCH | F_SWITCHED) != 0 || self.io_gone() {
            return;
        }
        let e0 = real::errno();
        self.with_io(fd, |io| {
            let mut v: libc::c_int = 0;
            // SAFETY: SIOCATMARK writes one int to our local.
            let r = unsafe {
                real::ioctl(
                    io,
                    real::SIOCATMARK,
                    std::ptr::from_mut(&mut v) as libc::c_ulong,
                )
            };
            if r == 0 && v != 0 {
                let mut b = [0u8; 1];
                // SAFETY: valid one-byte buffer.
                unsafe {
                    real::recv(
                        io,
                        b.as_mut_ptr() as *mut libc::c_void,
                        1,
                        libc::MSG_DONTWAIT,
                    )
                };
            }
        });
        real::set_errno(e0);
    }

    pub(super) fn drain_bytes(&self, fd: i32, to_end: bool) {
        let mut buf = [0u8; 256];
        loop {
            // After the peer's switch marker the stream is data: never drained. No descriptor
            // of ours names the socket any more (`IO_GONE`): nothing to drain.
            if self.flags() & (F_SWITCHING | F_PEER_SWITCH | F_SWITCHED) != 0 || self.io_gone() {
                return;
            }
            let e0 = real::errno();
            // With the counts (`F_ALONE_OK`), only the control bytes the peer counted are read:
            // never a data byte behind its switch marker. None counted: a peek, for the end of
            // the stream or an error. A byte the count does not cover (a peer that breaks the
            // protocol: its marker is counted and comes before any data) is read alone and
            // judged as without the counts.
            let (want, counted) = match self.ctl_unread() {
                Some(0) => (0, true),
                Some(n) => ((n as usize).min(buf.len()), true),
                None => (buf.len(), false),
            };
            let r = if want == 0 {
                // SAFETY: valid buffer.
                let p = self.with_io(fd, |io| unsafe {
                    real::recv(
                        io,
                        buf.as_mut_ptr() as *mut libc::c_void,
                        1,
                        libc::MSG_PEEK | libc::MSG_DONTWAIT,
                    )
                });
                if p > 0 {
                    // Counted meanwhile (its sender's count came after our look), or one byte
                    // alone. No second look: a peer that flips its count must not keep us here.
                    let again = match self.ctl_unread() {
                        Some(n) if n > 0 => (n as usize).min(buf.len()),
                        _ => 1,
                    };
                    // SAFETY: valid buffer, `again` at most its length.
                    self.with_io(fd, |io| unsafe {
                        real::recv(
                            io,
                            buf.as_mut_ptr() as *mut libc::c_void,
                            again,
                            libc::MSG_DONTWAIT,
                        )
                    })
                } else {
                    p
                }
            } else {
                // SAFETY: valid buffer, `want` at most its length.
                self.with_io(fd, |io| unsafe {
                    real::recv(
                        io,
                        buf.as_mut_ptr() as *mut libc::c_void,
                        want,
                        libc::MSG_DONTWAIT,
                    )
                })
            };
            if r > 0 {
                let n = r as usize;
                self.sh()
                    .doorbells_rcvd
                    .fetch_add(n as u64, Ordering::Relaxed);
                if let Some(i) = buf[..n].iter().position(|&b| b == SWITCH_TCP) {
                    if buf[..i].iter().all(|&b| b == DOORBELL) && i + 1 == n {
                        // The peer switches to TCP: nothing follows its marker until we
                        // answered with ours (our next operation does, `switch_to_tcp`).
                        self.set_flag(F_PEER_SWITCH);
                        crate::debug!("fd {fd}: the peer switches the connection to TCP");
                        if let Some(h) = HOOKS.get() {
                            (h.changed_fd)(fd, self);
                        }
                        real::set_errno(e0);
                        return;
                    }
                }
                if buf[..n].iter().any(|&b| b != DOORBELL) {
                    // Anything but a doorbell (e.g. a late CLC Decline) on an established SMC
                    // connection: we cannot honour it, abort rather than deliver wrong bytes.
                    self.protocol_error(format_args!(
                        "fd {fd}: {n} bytes on the doorbell channel that are not doorbells \
                         (first {:#04x})",
                        buf[..n]
                            .iter()
                            .find(|&&b| b != DOORBELL)
                            .copied()
                            .unwrap_or(0)
                    ));
                }
                if (n < buf.len() || counted) && !to_end {
                    real::set_errno(e0);
                    return;
                }
                continue;
            }
            let e = real::errno();
            real::set_errno(e0);
            if r == 0
                && self.flags() & F_REAL_SHUT != 0
                && self.with_io(fd, super::smc_switch::connected)
            {
                // The end of the stream is our own: we shut the socket both ways after the
                // program's `SHUT_RDWR` (`Conn::shutdown`), and its kernel has not seen the
                // peer's FIN (FIN_WAIT). Nothing about the peer: before, this was taken for
                // the peer's process gone with our bytes unread, a reset (random call
                // sequences, seed 169: `SO_ERROR` said ECONNRESET after a shutdown with bytes
                // unread both ways, where TCP says 0 until the peer's next write).
            } else if r == 0 {
                // Without a close in the CDC header, the peer's process ended (killed, exited,
                // exec'd without the library) and its kernel closed the socket. TCP resets the
                // connection when the closing end leaves bytes unread: ours, in its ring.
                let ps = self.peer_state();
                let unread =
                    !ps.any_close() && self.tx_cursors().is_some_and(|(prod, cons)| prod != cons);
                if unread {
                    self.peer_gone(
                        fd,
                        F_PEER_RST,
                        "EOF on the TCP socket with our bytes unread in the peer's ring (a reset)",
                    );
                } else {
                    self.peer_gone(fd, 0, "EOF on the TCP socket");
                }
            } else if e == libc::EAGAIN || e == libc::EINTR {
                // nothing more
            } else if e == libc::ECONNRESET || e == libc::EPIPE || e == libc::ETIMEDOUT {
                self.peer_gone(fd, F_PEER_RST, "error on the TCP socket");
                crate::debug!("fd {fd}: the TCP socket said errno {e}");
            } else if self.flags() & F_REAL_SHUT == 0 {
                self.peer_gone(fd, 0, "error on the TCP socket");
                crate::debug!("fd {fd}: the TCP socket said errno {e}");
            }
            return;
        }
    }

    /// Register as a sleeper on the TCP socket (the doorbell channel), before the last
    /// recheck of the rings that precedes the real `poll`/`epoll_wait`. Several threads may
    /// sleep on the socket at once (full duplex: one waits for data, one for room; or several
    /// poll/epoll waiters) and one doorbell wakes them all, but the kernel re-checks the
    /// socket before it returns: a doorbell drained by one of them before another looked would
    /// be lost to that one. So doorbells are drained only when no sleeper is left
    /// ([`Conn::try_drain`]): the last one out drains. A drain that runs while a thread
    /// registers makes the newcomer wait for its end, so that its recheck comes after every
    /// doorbell the drain takes (whose ring changes came before them).
    pub fn sleep_enter(&self) {
        let s = self.sh();
        if s.ksleep.fetch_add(1, Ordering::SeqCst) & DRAINING != 0 {
            let start = Instant::now();
            let mut i = 0u32;
            // A drain is one non-blocking recv; bounded in case its thread died in it.
            while s.ksleep.load(Ordering::SeqCst) & DRAINING != 0 {
                if start.elapsed() >= Duration::from_millis(SETTLE_MAX_MS) {
                    s.ksleep.fetch_and(!DRAINING, Ordering::SeqCst);
                    break;
                }
                i += 1;
                let _ = spin_pause(i);
            }
        }
    }

    /// Unregister after the sleep; `rang`: the kernel reported the socket readable. Drains the
    /// doorbells when no other sleeper is left; true when they were left to the others — the
    /// caller must then not sleep on the socket again before [`Conn::settled`] (it would
    /// return at once).
    #[must_use]
    pub fn sleep_leave(&self, fd: i32, rang: bool) -> bool {
        let s = self.sh();
        // Never below zero (the count of a sleeper that died is healed by a forced drain).
        let _ = s
            .ksleep
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                (v & !DRAINING != 0).then(|| v - 1)
            });
        rang && !self.try_drain(fd)
    }

    /// A call that does not wait found nothing to report (`EAGAIN`, an empty poll): the
    /// peer's end may be gone without a close in the CDC header (its process died, or exec'd
    /// without the library), which only the TCP socket says (EOF, or a reset), and only a wait
    /// would read it. Every [`IDLE_PROBE`]th such call (the first one too) reads it without
    /// waiting: a loop of non-blocking reads or zero-timeout polls sees the end as on TCP,
    /// a few calls late at most (as if the FIN were still on its way), for one system call
    /// per [`IDLE_PROBE`] calls. True when something changed (data, the end or a reset may be
    /// there now: look again).
    pub fn probe_peer_gone(&self, fd: i32) -> bool {
        if !self
            .idle_looks
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(IDLE_PROBE)
        {
            return false;
        }
        let f0 = self.flags() & (F_PEER_GONE | F_PEER_RST);
        self.try_drain_to(fd, true) && self.flags() & (F_PEER_GONE | F_PEER_RST) != f0
    }

    /// Drain the doorbells if no thread sleeps on the socket (they were all woken and left).
    /// Whether it did.
    pub fn try_drain(&self, fd: i32) -> bool {
        self.try_drain_to(fd, false)
    }

    /// [`Conn::try_drain`]; `to_end`: as [`Conn::drain_to`].
    pub fn try_drain_to(&self, fd: i32, to_end: bool) -> bool {
        let s = self.sh();
        if s.ksleep
            .compare_exchange(0, DRAINING, Ordering::SeqCst, Ordering::Relaxed)
            .is_err()
        {
            return false;
        }
        self.drain_to(fd, to_end);
        s.ksleep.fetch_and(!DRAINING, Ordering::SeqCst);
        true
    }

    /// Whether doorbells left to other sleepers ([`Conn::sleep_leave`] said true; `seq` is
    /// the `wake_seq` read after that) are gone: someone drained (or the socket holds no
    /// doorbell any more), or nobody sleeps on the socket now and we drained them.
    pub fn settled(&self, fd: i32, seq: u32) -> bool {
        self.sh().wake_seq.load(Ordering::Acquire) != seq
            || !self.doorbells_queued(fd)
            || self.try_drain(fd)
    }

    /// The `wake_seq` to pass to [`Conn::settled`].
    pub fn wake_seq(&self) -> u32 {
        self.sh().wake_seq.load(Ordering::Acquire)
    }

    /// Sleep (futex) until [`Conn::settled`], at most `max_ms`; true when settled.
    pub fn await_settled(&self, fd: i32, seq: u32, max_ms: u64) -> bool {
        let s = self.sh();
        if self.settled(fd, seq) {
            return true;
        }
        s.waiters.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wait(&s.wake_seq, seq, max_ms);
        s.waiters.fetch_sub(1, Ordering::AcqRel);
        self.settled(fd, seq)
    }

    /// The other sleepers did not take the doorbells they were woken by within
    /// [`SETTLE_MAX_MS`]: one of them does not run (stopped, or killed while asleep, which
    /// leaves its count behind). Drain anyway, and heal one stale count.
    pub fn force_drain(&self, fd: i32) {
        let s = self.sh();
        // A DRAINING bit set for that long was left by a drainer that died: taken over.
        let v = s.ksleep.fetch_or(DRAINING, Ordering::SeqCst);
        crate::debug!(
            "fd {fd}: doorbells drained after {SETTLE_MAX_MS} ms with {} sleepers",
            v & !DRAINING
        );
        self.drain(fd);
        let _ = s
            .ksleep
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                let n = if v & !DRAINING != 0 { v - 1 } else { v };
                Some(n & !DRAINING)
            });
    }

    /// Full wait for [`Conn::settled`] of a thread that can sleep on nothing else.
    pub(super) fn settle(&self, fd: i32, seq: u32) {
        if !self.await_settled(fd, seq, SETTLE_MAX_MS) {
            self.force_drain(fd);
        }
    }

    /// Whether doorbell bytes are queued on the socket (EOF and errors count as no: they are
    /// not consumed by a drain).
    pub(super) fn doorbells_queued(&self, fd: i32) -> bool {
        let mut b = [0u8; 1];
        let e0 = real::errno();
        // SAFETY: valid buffer.
        let r = self.with_io(fd, |io| unsafe {
            real::recv(
                io,
                b.as_mut_ptr() as *mut libc::c_void,
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        });
        real::set_errno(e0);
        r > 0
    }

    /// The TCP socket (the doorbell channel) reached EOF or an error: the peer is gone.
    /// Logged once, with whether the peer had said goodbye in its CDC header.
    pub(super) fn peer_gone(&self, fd: i32, extra: u32, what: &str) {
        let old = self.set_flag(F_PEER_GONE | extra);
        if old & (F_PEER_GONE | extra) != F_PEER_GONE | extra {
            let ps = self.peer_state();
            if !ps.any_close_or_done() || ps.contains(ConnStateFlags::PEER_CONN_ABORT) || extra != 0
            {
                crate::debug!(
                    "fd {fd}: {what}{}: {}",
                    if ps.any_close_or_done() {
                        ""
                    } else {
                        " before the peer closed or shut down in the CDC header"
                    },
                    self.describe()
                );
            }
            // What the connection reports changed without a doorbell: an epoll set of ours
            // that parked it (its registration is edge-triggered, and the EOF or reset may have
            // been drained here, by another waiter) checks it again.
            if let Some(h) = HOOKS.get() {
                (h.changed_fd)(fd, self);
            }
        }
    }

    /// An `int` socket option of the connection's socket at `SOL_SOCKET` (through its I/O
    /// path), the caller's `errno` kept; `None` when `getsockopt` fails.
    pub(super) fn sockopt_int(&self, fd: i32, opt: i32) -> Option<libc::c_int> {
        self.sockopt_int_at(fd, libc::SOL_SOCKET, opt)
    }

    /// As [`Conn::sockopt_int`] at another `level`.
    pub(super) fn sockopt_int_at(&self, fd: i32, level: i32, opt: i32) -> Option<libc::c_int> {
        let e0 = real::errno();
        let v = self.with_io(fd, |io| crate::util::sockopt_int(io, level, opt));
        real::set_errno(e0);
        v
    }

    /// SO_RCVTIMEO / SO_SNDTIMEO of the socket in ms (-1: none).
    pub(super) fn sock_timeout(&self, fd: i32, opt: i32) -> i64 {
        let mut tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        };
        let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
        let e0 = real::errno();
        // SAFETY: valid out pointers.
        let r = self.with_io(fd, |io| unsafe {
            real::getsockopt(
                io,
                libc::SOL_SOCKET,
                opt,
                &mut tv as *mut _ as *mut libc::c_void,
                &mut len,
            )
        });
        real::set_errno(e0);
        if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
            -1
        } else {
            tv.tv_sec * 1000 + (tv.tv_usec + 999) / 1000
        }
    }

    /// Condition for a waiter: data (at least `need` bytes, or EOF) or room.
    pub(super) fn ready_for(&self, data: bool, need: u32) -> bool {
        let r = self.readiness();
        if data {
            r.readable >= need || r.rd_eof || r.error
        } else {
            r.writable > 0 || r.wr_closed || r.error
        }
    }

    /// Block until data (`data`) or room is there, the deadline passes, or a signal arrives.
    /// Spins adaptively first, then announces itself with the wait bit and sleeps in `poll` on
    /// the TCP socket, where the peer's doorbell lands.
    pub fn wait(&self, fd: i32, data: bool, need: u32, deadline: Option<Instant>) -> Woke {
        let s = self.sh();
        // Noted as asleep, with the depth of this frame and what it holds while asleep: a
        // signal handler that leaves it by `siglongjmp` runs none of the releases below, its
        // thread does them at its next entry (`util::unwound`).
        let depth = 0u8;
        let asleep = unwound::asleep(
            self as *const Conn as usize,
            std::hint::black_box(&depth) as *const u8 as usize,
        );
        let hold = |what: u8| {
            if let Some(a) = &asleep {
                a.hold(what);
            }
        };
        let release = |what: u8| {
            if let Some(a) = &asleep {
                a.release(what);
            }
        };
        // A signal handled from here on (asleep, or between two sleeps) may end the call.
        crate::signals::wait_begins();
        // Spin first when waiting for data: a peer that answers within the budget costs no
        // syscall on either side (request/response). A writer that filled the ring does not
        // spin (SMC_SPIN_ROOM_US, default 0): the reader has a whole ring to copy, and on a
        // small machine the spinning writer takes the CPU the reader needs (docs/PERF.md).
        let budget = if data {
            self.spin.budget()
        } else {
            tune().spin_room_ns
        };
        if budget > 0 {
            let start = Instant::now();
            let mut i = 0u32;
            loop {
                if self.ready_for(data, need) {
                    s.spin_hits.fetch_add(1, Ordering::Relaxed);
                    if data {
                        self.spin.record(true);
                    }
                    return Woke::Ready;
                }
                i += 1;
                if i & 31 == 0 && start.elapsed().as_nanos() as u64 >= budget {
                    break;
                }
                if spin_pause(i) {
                    // Another task wants this CPU: sleep, and let it run.
                    break;
                }
            }
            if data {
                self.spin.record(false);
            }
        }
        // Whether the call ends with `EINTR` for a signal that came while it slept: when the
        // signal's handler has no `SA_RESTART`, and always on a socket with a timeout
        // (`deadline`: SO_RCVTIMEO/SO_SNDTIMEO), which the kernel never restarts
        // (sock_intr_errno, signal(7)). A call the kernel would restart goes on, unless its
        // number no longer names the connection (the handler closed it, or made it name another
        // file): the kernel's restart looks the number up again (`EBADF`, or the call on the
        // new file), which the caller does on `EINTR` (`ops::restarted`; red team `inflight.c
        // recv close 1`: a `SIGALRM` timeout that closes the connection left the read waiting
        // for the peer, TCP `EBADF` at once).
        let renamed = || asleep.as_ref().is_some_and(unwound::Asleep::renamed);
        let ends_call = || crate::signals::interrupted() || deadline.is_some() || renamed();
        loop {
            // Announce, then recheck (the other side swaps the bit after changing the ring).
            if data {
                self.own_wait().fetch_or(WAIT_DATA, Ordering::SeqCst);
            } else {
                self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
                self.update_peer_flags(ProdFlags::WRITE_BLOCKED.0, 0, 0);
            }
            fence(Ordering::SeqCst);
            if self.ready_for(data, need) {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Ready;
            }
            // A handler of ours ran since the wait began: asleep on the futex (a second thread
            // blocked in `recv` of one connection, signalled: before, it slept on), in a poll
            // that did not say `EINTR` (below), or between two sleeps, where the kernel's
            // call would have been asleep too.
            if crate::signals::caught() && ends_call() {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Intr;
            }
            // Pre-sleep duty: the writer into our ring may wait for a cursor we have not
            // published yet.
            if let Some(_g) = s.rx_lock.try_lock() {
                let cons = unpack(s.cons.load(Ordering::Acquire));
                self.after_consume(fd, cons, true);
            }
            let mut timeout = match deadline {
                None => -1,
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        if !data {
                            self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                        }
                        return Woke::Timeout;
                    }
                    (d - now).as_millis().min(i32::MAX as u128) as i32 + 1
                }
            };
            if self.flags() & (F_PEER_GONE | F_REAL_SHUT) != 0 {
                // The TCP socket is at EOF and always readable: sleep instead of spinning.
                timeout = if timeout < 0 { 1 } else { timeout.min(1) };
                std::thread::sleep(Duration::from_millis(timeout as u64));
                continue;
            }
            // One poller per connection end sleeps on the TCP socket (and drains the
            // doorbells); every other waiter (thread or process) sleeps on a futex that the
            // poller bumps after each wakeup, so no doorbell is consumed behind a sleeper's back.
            let seq = s.wake_seq.load(Ordering::Acquire);
            let me = gettid();
            if let Err(poller) =
                s.poller
                    .compare_exchange(0, me, Ordering::AcqRel, Ordering::Relaxed)
            {
                s.waiters.fetch_add(1, Ordering::AcqRel);
                hold(unwound::WAITER);
                let mut slept_out = false;
                if !self.ready_for(data, need) {
                    let t = if timeout < 0 { 500 } else { timeout.min(500) };
                    let t0 = Instant::now();
                    crate::shm::futex_wait(&s.wake_seq, seq, t as u64);
                    slept_out = t0.elapsed() >= Duration::from_millis(t as u64);
                }
                release(unwound::WAITER);
                s.waiters.fetch_sub(1, Ordering::AcqRel);
                let ready = self.ready_for(data, need);
                // Nobody bumped `wake_seq` while we slept (to the end, or we are still not
                // ready): is there a poller at all?
                if s.wake_seq.load(Ordering::Acquire) == seq
                    && (slept_out || !ready)
                    && (!task_alive(poller) || not_polling(poller))
                {
                    // The poller died asleep (its process killed, its thread cancelled): the
                    // word names a task that no longer exists and nobody would ever bump
                    // `wake_seq` again. Or a thread of ours that no longer sleeps in `poll`
                    // holds it: it left its wait by `siglongjmp` out of a signal handler
                    // (`util::unwound` releases it only at that thread's next entry) — or runs
                    // a handler inside it, when a second poller is harmless (several threads
                    // may sleep on the socket, `sleep_enter`; its own release then finds the
                    // word taken). Taken over (every later wait would otherwise cost half a
                    // second).
                    crate::debug!(
                        "fd {fd}: the poller (task {poller}) is gone or not asleep in poll: \
                         another waiter takes over"
                    );
                    let _ =
                        s.poller
                            .compare_exchange(poller, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
                if ready {
                    if !data {
                        self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                    }
                    return Woke::Ready;
                }
                continue;
            }
            hold(unwound::POLLER);
            // A safety net: a lost wakeup (there should be none) costs at most half a second.
            timeout = if timeout < 0 { 500 } else { timeout.min(500) };
            // Idle: after a short first sleep, give the send ring's pages back.
            let reclaim = data && self.reclaim_due();
            if reclaim {
                timeout = timeout.min(RECLAIM_IDLE_MS);
            }
            // The sleep holds the socket: a number closed meanwhile is only looked at.
            let mut pfd = libc::pollfd {
                fd: self.io_now(fd),
                events: libc::POLLIN,
                revents: 0,
            };
            // Other threads (the application's poll/epoll) may sleep on the socket too: the
            // last one to leave drains the doorbells (see `sleep_enter`).
            self.sleep_enter();
            hold(unwound::KSLEEP);
            let slept = !self.ready_for(data, need);
            let (r, e) = if !slept {
                (0, 0)
            } else {
                s.sleeps.fetch_add(1, Ordering::Relaxed);
                let e0 = real::errno();
                // SAFETY: one valid pollfd.
                let r = unsafe { real::poll(&mut pfd, 1, timeout) };
                let e = real::errno();
                real::set_errno(e0);
                (r, e)
            };
            release(unwound::KSLEEP);
            let left = self.sleep_leave(fd, r > 0);
            if slept && r == 0 && reclaim {
                self.reclaim_tx();
            }
            // Ours unless a waiter took it over meanwhile (it believed us gone: never while
            // we live, but a task id can come back to another task).
            release(unwound::POLLER);
            let _ = s
                .poller
                .compare_exchange(me, 0, Ordering::AcqRel, Ordering::Relaxed);
            s.wake_seq.fetch_add(1, Ordering::AcqRel);
            if s.waiters.load(Ordering::Acquire) > 0 {
                crate::shm::futex_wake(&s.wake_seq, i32::MAX);
            }
            // EINTR as TCP says it (`ends_call`; a handler that is not ours says nothing to
            // `caught`). The poll need not say `EINTR` when a handler of ours ran: it looks its
            // number up again at each wakeup, so when the number was closed or `dup2`ed over
            // while it slept (Java's close of a socket a thread reads: `dup2` of a dead
            // socketpair end over it, then a signal to the reader) the signal's wakeup finds
            // the new file ready and returns 1 (before: the read slept on for ever, the signal
            // spent; TCP: `EINTR`); that is seen at the top of the loop.
            if r < 0 && e == libc::EINTR && ends_call() {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Intr;
            }
            if left && !self.ready_for(data, need) {
                // The doorbells are the other sleepers' to drain: sleeping on the socket now
                // would return at once.
                self.settle(fd, s.wake_seq.load(Ordering::Acquire));
            }
            if self.ready_for(data, need) {
                if !data {
                    self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, 0);
                }
                return Woke::Ready;
            }
        }
    }

    /// A wait of this thread on the connection was left by a jump (`siglongjmp` out of a
    /// signal handler) while it held `held` (`util::unwound`): given back as its end would
    /// have. The poller role goes (the futex waiters are woken: one of them takes it), the
    /// counts as a sleeper on the socket and as a futex waiter are dropped.
    pub fn forget_sleeper(&self, fd: i32, held: u8) {
        let s = self.sh();
        if held & unwound::KSLEEP != 0 {
            // Not "rang": the doorbells are drained by the next sleeper, whose poll returns at
            // once.
            let _ = self.sleep_leave(fd, false);
        }
        if held & unwound::WAITER != 0 {
            s.waiters.fetch_sub(1, Ordering::AcqRel);
        }
        if held & unwound::POLLER != 0 {
            let _ = s
                .poller
                .compare_exchange(gettid(), 0, Ordering::AcqRel, Ordering::Relaxed);
            s.wake_seq.fetch_add(1, Ordering::AcqRel);
            if s.waiters.load(Ordering::Acquire) > 0 {
                crate::shm::futex_wake(&s.wake_seq, i32::MAX);
            }
        }
    }

    /// Announce that this process is about to sleep in poll/epoll waiting for data
    /// (`data`) and/or room (`space`), so the peer rings the doorbell. The caller rechecks
    /// readiness afterwards.
    pub fn arm(&self, fd: i32, data: bool, space: bool) {
        if data {
            self.own_wait().fetch_or(WAIT_DATA, Ordering::SeqCst);
        }
        if space && self.room() == 0 {
            self.peer_wait().fetch_or(WAIT_SPACE, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
        if let Some(_g) = self.sh().rx_lock.try_lock() {
            let cons = unpack(self.sh().cons.load(Ordering::Acquire));
            self.after_consume(fd, cons, true);
        }
        if data {
            let s = self.sh();
            let prod = unpack(s.prod.load(Ordering::Relaxed));
            let last = unpack(s.tx_reclaimed.load(Ordering::Relaxed));
            let drained = unpack(s.peer_cons.load(Ordering::Relaxed)) == prod;
            if drained
                && self
                    .tx
                    .diff(last, prod)
                    .map_or(true, |d| d >= RECLAIM_ARMED_MIN)
            {
                self.reclaim_tx();
            }
        }
    }
}

/// Whether task `tid`, a thread of this process, is blocked in a system call other than the
/// `poll`/`ppoll` a poller sleeps in (`/proc/self/task/TID/syscall`; false when unknown: a
/// task of another process, one running in user space, no such file).
fn not_polling(tid: u32) -> bool {
    let e0 = real::errno();
    let st = std::fs::read_to_string(format!("/proc/self/task/{tid}/syscall"));
    real::set_errno(e0);
    let Some(Ok(nr)) = st
        .as_deref()
        .ok()
        .and_then(|s| s.split_whitespace().next())
        .map(str::parse::<libc::c_long>)
    else {
        return false;
    };
    #[cfg(target_arch = "x86_64")]
    let poll = nr == libc::SYS_poll;
    #[cfg(not(target_arch = "x86_64"))]
    let poll = false;
    nr >= 0 && !poll && nr != libc::SYS_ppoll
}

/// The calling thread's kernel task id (never 0): the [`Shared::poller`] word.
pub(super) fn gettid() -> u32 {
    // SAFETY: gettid(2) has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Whether task `tid` (a thread of this or another process sharing the connection) still
/// exists. A task we may not signal exists; a task id reused by an unrelated task reads as
/// alive (the waiter then keeps its half-second sleeps, as before this check).
fn task_alive(tid: u32) -> bool {
    if tid == 0 || tid > i32::MAX as u32 {
        return false;
    }
    let e0 = real::errno();
    // SAFETY: signal 0 only checks that the task exists (kill(2) accepts any thread's id).
    let r = unsafe { libc::kill(tid as libc::pid_t, 0) };
    let alive = r == 0 || real::errno() != libc::ESRCH;
    real::set_errno(e0);
    alive
}

/// `setsockopt(io, SOL_SMC_BPF, SMC_SO_SHORTCUT, on)` (the `sk_msg` redirect of this
/// socket's messages; off is always accepted, on again because the daemon granted it when the
/// connection was set up).
fn set_shortcut(io: i32, on: u32) {
    // SAFETY: a valid 4-byte option buffer.
    unsafe {
        real::setsockopt(
            io,
            smc_common::bpf::SOL_SMC_BPF,
            smc_common::bpf::SMC_SO_SHORTCUT,
            &on as *const u32 as *const libc::c_void,
            4,
        )
    };
}
