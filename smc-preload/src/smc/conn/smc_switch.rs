//! The switch to TCP mid-stream (this project's CDC extension, see DESIGN.md *Switch to TCP*):
//! before an exec into an image without the library both ends agree on final cursors, resend
//! what the reader did not consume over TCP, and continue there.

use super::*;

/// How a switch to TCP ended ([`Conn::switch_to_tcp`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Switched {
    /// Both ends continue on the TCP socket, in order, nothing lost; this call switched it.
    Tcp,
    /// It was switched already (another thread or process of this end did it).
    Already,
    /// It could not be done (the peer did not answer in time, is gone, or broke the
    /// protocol; the socket could not leave the SOCKHASH): the connection was reset, both
    /// ends fail cleanly.
    Reset,
    /// Only with `tail_ok`: the peer had closed, and what it wrote last was in our ring,
    /// unread: those bytes and the end of the stream wait in a private loopback connection
    /// whose reading socket this is (the caller's, to put in place of the connection in the
    /// image that leaves; [`Conn::unread_to_tail`]). The connection continues on TCP for
    /// every other holder, at its end (EOF), unless [`Conn::undo_tail`] gives the bytes back.
    Tail(i32, TailUndo),
}

/// Where our ring's reading stood before [`Conn::unread_to_tail`] took the peer's last bytes
/// out of it: what [`Conn::undo_tail`] needs when the image they were for never ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailUndo(Cursor);

impl Conn {
    /// The handshake negotiated [`smc_common::clc::FEATURE_SWITCH_ALONE`]: before the first
    /// control byte of either end (set up, not yet shared with the peer's application).
    pub fn enable_switch_alone(&self) {
        self.set_flag(F_ALONE_OK);
    }

    /// With [`Conn::enable_switch_alone`]: the handshake negotiated
    /// [`smc_common::clc::FEATURE_SWITCH_ALONE_RESEND`] too ([`F_ALONE_RESEND`]).
    pub fn enable_alone_resend(&self) {
        self.set_flag(F_ALONE_RESEND);
    }

    /// The handshake negotiated [`smc_common::clc::FEATURE_SWITCH_FRESH_ACKS`]: at the end of a
    /// two-sided switch both ends say when their socket's delayed ACKs are a fresh connection's
    /// again, and wait for each other ([`WAIT_ACKS_FRESH`]).
    pub fn enable_fresh_acks(&self) {
        self.set_flag(F_FRESH_ACKS_OK);
    }

    /// Whether this connection continues on TCP (switched).
    pub fn switched(&self) -> bool {
        self.flags() & F_SWITCHED != 0
    }

    /// Whether this connection continues (or is about to continue) on TCP.
    pub fn switching(&self) -> bool {
        self.flags() & (F_SWITCHING | F_TO_TCP) != 0
    }

    /// [`WAIT_ALONE`] seen in the peer's wait word: [`F_PEER_ALONE`], unless the connection
    /// failed already (a reset end answers nothing; a peer that sets the bit then is only
    /// scribbling).
    pub(super) fn peer_alone_seen(&self) {
        if self.flags() & (F_PROTO | F_CLOSED) == 0 {
            self.set_flag(F_PEER_ALONE);
        }
    }

    /// The peer switched alone and this end has not answered yet: the call that saw it
    /// (a write whose bytes the peer will not read from the ring) switches before it returns.
    pub fn peer_went_alone(&self) -> bool {
        self.flags() & (F_PEER_ALONE | F_SWITCHED) == F_PEER_ALONE
    }

    /// Whether the peer started a switch to TCP ([`WAIT_SWITCH`] in its DMB) that this end has
    /// not answered yet.
    pub fn peer_switch_asked(&self) -> bool {
        self.peer_wait().load(Ordering::Relaxed) & WAIT_SWITCH != 0
            && self.flags() & (F_SWITCHING | F_SWITCHED) == 0
    }

    /// [`Conn::peer_switch_asked`], and the peer waits for our answer: a two-sided switch. One
    /// that went alone ([`WAIT_ALONE`]) waits for nothing; it is answered at our next
    /// operation on the connection (red team rt14 `rt14_hostile.c`: a peer that set the bit
    /// and sent no marker held every `waitpid` of ours for a switch wait, 10 s, per
    /// connection).
    pub fn peer_switch_waits(&self) -> bool {
        self.peer_switch_asked()
            && !(self.flags() & F_ALONE_OK != 0
                && self.peer_wait().load(Ordering::Relaxed) & WAIT_ALONE != 0)
    }

    /// The peer started a switch to TCP ([`WAIT_SWITCH`] in its DMB): drain the socket up to
    /// its marker now (when no other thread sleeps on it, which the marker wakes), so that a
    /// write or shutdown answers it ([`F_PEER_SWITCH`]) instead of going on into the ring.
    pub fn notice_switch(&self, fd: i32) {
        let w = self.peer_wait().load(Ordering::Relaxed);
        if w & (WAIT_SWITCH | WAIT_ALONE) != 0 && self.flags() & (F_SWITCHING | F_TO_TCP) == 0 {
            if w & WAIT_ALONE != 0 && self.flags() & F_ALONE_OK != 0 {
                // It switched alone: nothing to wait for, our answer goes first.
                self.peer_alone_seen();
                return;
            }
            self.try_drain(fd);
        }
    }

    /// The stream's `SO_PEEK_OFF` back to the socket, which carries the stream from now on
    /// (the socket's own was off while the rings carried it, `smc_rx`).
    fn peek_off_to_socket(&self, io: i32) {
        let v = self.peek_off();
        if v < 0 {
            return;
        }
        crate::util::set_sockopt_int(io, libc::SOL_SOCKET, libc::SO_PEEK_OFF, v);
    }

    /// Reset the connection at once (both ends fail cleanly): a socket that leaves for an
    /// image without the library from a `vfork` child, which cannot switch it. No allocation.
    pub fn reset_now(&self, fd: i32) {
        self.set_flag(F_PROTO);
        // A reset drops what was not read (as TCP's purges its receive queue).
        self.sh().flags.fetch_and(!F_STASH, Ordering::AcqRel);
        reset_socket(self.io_now(fd));
    }

    /// Switch the connection to plain TCP, mid-stream (this project's CDC extension, see
    /// [`SWITCH_TCP`] and DESIGN.md *Switch to TCP*): for a socket that leaves for an image
    /// that does not run the data path (an `exec` without the library), or because the peer
    /// asked ([`F_PEER_SWITCH`]). Both ends run the same steps; whoever starts, the other
    /// answers at its next operation on the connection (its marker wakes it: any wait on the
    /// socket returns):
    /// 1. under both ring locks, stop the rings ([`F_SWITCHING`]: no doorbell, no drain any
    ///    more) and publish our consumer cursor: it is final;
    /// 2. `leave()`: the doorbell shortcut off and the socket out of the SOCKHASH (after this
    ///    everything we send goes over TCP, and our reads are the kernel's plain TCP ones);
    ///    false: it could not, and the connection is reset instead;
    /// 3. our marker, then wait for the peer's (consuming only doorbells before it);
    /// 4. send the bytes of our send ring the peer did not consume (from its final consumer
    ///    cursor, which it published before its marker, up to our producer cursor): they are
    ///    the first bytes after our marker, before anything we write later;
    /// 5. [`F_SWITCHED`]: every holder of this end, in every process, continues on the socket.
    ///
    /// Bytes in our receive ring that we did not read come from the peer the same way. Waits
    /// at most until `deadline` for the peer; then, or on any violation, the connection is
    /// reset (linger 0): never a hang, never a wrong byte.
    ///
    /// `peer_here` runs once our marker is sent, before the wait for the peer's, unless the
    /// peer's marker came already: the caller switches the peer's end there when this process
    /// holds it too (its marker, its unread bytes, then ours are read here), so that one thread
    /// that holds both ends never waits for itself.
    pub fn switch_to_tcp(
        &self,
        fd: i32,
        deadline: Instant,
        tail_ok: bool,
        leave: impl FnOnce() -> bool,
        peer_here: impl FnOnce(),
    ) -> Switched {
        let s = self.sh();
        let _rg = s.rx_lock.lock();
        let _tg = s.tx_lock.lock();
        let f = self.flags();
        if f & F_SWITCHED != 0 {
            return Switched::Already;
        }
        if f & (F_CLOSED | F_PROTO) != 0 {
            s.flags.fetch_and(!F_PEER_ALONE, Ordering::AcqRel);
            return Switched::Reset;
        }
        self.stop_rings();
        let cons = self.cons_past_oob_byte(fd);
        self.publish_cons(cons);
        // What the peer will send again of ours (a two-sided switch), for the wait below.
        let rx_unread = self
            .rx_cursors()
            .and_then(|(c, p)| self.rx.readable(c, p).ok())
            .unwrap_or(0);
        // The socket itself (a number closed under a call in flight may name another file).
        let io = self.io_now(fd);
        let mut two_sided = false;
        let r = self.switch_steps(io, deadline, tail_ok, leave, peer_here, &mut two_sided);
        if r == Switched::Reset {
            self.set_flag(F_PROTO);
            reset_socket(io);
        } else {
            self.peek_off_to_socket(io);
            if r == Switched::Tcp {
                // Last, after every call on the socket of this switch (each holds the socket,
                // and what the peer's program sends meanwhile waits in its backlog).
                self.say_acks_fresh();
                if two_sided && rx_unread <= FRESH_WAIT_MAX_RESENT {
                    self.await_peer_acks_fresh(io, deadline);
                }
            }
            self.set_flag(F_SWITCHED);
        }
        let clear = if r == Switched::Reset {
            F_SWITCHING | F_PEER_SWITCH | F_PEER_ALONE | F_STASH
        } else {
            F_SWITCHING
        };
        s.flags.fetch_and(!clear, Ordering::AcqRel);
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        if let Some(h) = HOOKS.get() {
            (h.changed_fd)(fd, self);
        }
        r
    }

    /// Our final consumer cursor (under `rx_lock`, the rings stopped): an urgent byte at the
    /// read position that is out of band (read with `MSG_OOB`, or not yet) is passed, as the
    /// next read would pass it (`tcp_recvmsg` skips it): otherwise the writer would send it
    /// again over TCP as an ordinary byte of the stream.
    fn cons_past_oob_byte(&self, fd: i32) -> Cursor {
        let s = self.sh();
        let cons = unpack(s.cons.load(Ordering::Acquire));
        let Some((_, prod)) = self.rx_cursors() else {
            return cons;
        };
        let (cons, rx) = self.urg_sync(fd, cons, prod);
        if self.oobinline() || !rx.at_mark(cons) || self.rx.readable(cons, prod).unwrap_or(0) == 0 {
            return cons;
        }
        let past = self.rx.add(cons, 1);
        s.cons.store(pack(past), Ordering::Release);
        self.set_urg_rx(rx.passed(self.rx, past));
        past
    }

    /// Under both ring locks: [`F_SWITCHING`] (no doorbell goes out, no drain reads the
    /// socket any more), then waits for the doorbells on their way and a drain under way (its
    /// thread checked the flag before we set it).
    fn stop_rings(&self) {
        let s = self.sh();
        self.set_flag(F_SWITCHING);
        fence(Ordering::SeqCst);
        let start = Instant::now();
        let mut i = 0u32;
        while (s.bells.load(Ordering::SeqCst) != 0
            || s.ksleep.load(Ordering::SeqCst) & DRAINING != 0)
            && start.elapsed() < Duration::from_millis(SETTLE_MAX_MS)
        {
            i += 1;
            let _ = spin_pause(i);
        }
    }

    /// `connect(AF_UNSPEC)` on the connection (TCP's `tcp_disconnect`): the peer is reset as
    /// by an abortive close (`peer_conn_abort`, and the socket's own reset), and this end
    /// continues on its TCP socket, now disconnected, for every holder in every process
    /// ([`F_SWITCHED`]: their next call makes their fds plain and goes to the socket, whose
    /// reads say `ECONNRESET` then `ENOTCONN` and writes `EPIPE`, TCP's own answers). The rings
    /// stop first, so that no drain of ours takes the reset's error from the socket and no
    /// doorbell follows. `leave` takes the socket out of the SOCKHASH (so that it reads and
    /// writes as plain TCP when it connects again); `disconnect` is the real call on the socket,
    /// whose result (errno kept) is returned. `None`: the connection was on TCP already
    /// (switched), nothing was done.
    pub fn disconnect(
        &self,
        fd: i32,
        leave: impl FnOnce(i32) -> bool,
        disconnect: impl FnOnce(i32) -> i32,
    ) -> Option<i32> {
        let s = self.sh();
        let _rg = s.rx_lock.lock();
        let _tg = s.tx_lock.lock();
        if self.flags() & F_SWITCHED != 0 {
            return None;
        }
        self.stop_rings();
        crate::debug!(
            "fd {fd}: connect(AF_UNSPEC): the connection is reset (the peer gets ECONNRESET) and \
             continues as a plain TCP socket: {}",
            self.describe()
        );
        self.update_peer_flags(
            0,
            ProdFlags::WRITE_BLOCKED.0,
            ConnStateFlags::PEER_CONN_ABORT.0 | ConnStateFlags::PEER_CONN_CLOSED.0,
        );
        let io = self.io_now(fd);
        leave(io);
        let r = disconnect(io);
        let e = real::errno();
        if r != 0 {
            // Not disconnected (never for a TCP socket): the peer was told of the abort, so
            // the socket must not carry on either.
            reset_socket(io);
        }
        self.peek_off_to_socket(io);
        self.set_flag(F_SWITCHED);
        s.flags.fetch_and(!F_SWITCHING, Ordering::AcqRel);
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        if let Some(h) = HOOKS.get() {
            (h.changed_fd)(fd, self);
        }
        real::set_errno(e);
        Some(r)
    }

    /// `two_sided`: set when both ends sent their marker and the peer waits for our
    /// [`WAIT_ACKS_FRESH`] as we wait for its own.
    fn switch_steps(
        &self,
        fd: i32,
        deadline: Instant,
        tail_ok: bool,
        leave: impl FnOnce() -> bool,
        peer_here: impl FnOnce(),
        two_sided: &mut bool,
    ) -> Switched {
        let alone_ok = self.flags() & F_ALONE_OK != 0;
        if alone_ok && self.peer_wait().load(Ordering::SeqCst) & WAIT_ALONE != 0 {
            // The peer switched alone: our answer, without a marker of ours.
            if !leave() {
                crate::debug!(
                    "fd {fd}: switch to TCP impossible: the socket cannot leave the SOCKHASH"
                );
                return Switched::Reset;
            }
            return self.answer_alone(fd, deadline, !tail_ok);
        }
        if alone_ok && self.peer_closed_clean() {
            // Nothing of the stream is left in the rings: its end (the peer's FIN) is on the
            // socket, behind the peer's last control bytes, read first (while the socket is in
            // the SOCKHASH: leaving it drops the doorbells the peer's redirect queued there).
            let drained = self.drain_ctl(fd, deadline);
            let ok = leave() && drained;
            crate::debug!(
                "fd {fd}: switch to TCP after the peer's close{}: {}",
                if ok { "" } else { " failed" },
                self.describe()
            );
            return if ok { Switched::Tcp } else { Switched::Reset };
        }
        if let Some((n, reset)) = self.peer_ended_unread().filter(|&(n, _)| tail_ok && n > 0) {
            // The peer closed and its last bytes are in our ring, unread: it cannot send them
            // again, so they go to the next image through a connection of their own (red team
            // rt14 `rt14_py.py reply`: an HTTP/1.0 reply the client handed to `cat` at once was
            // lost to a reset 10 of 10). Its control bytes are read first, as above. A peer
            // that closed without reading what we sent it, or aborted, or is gone, reset the
            // connection on TCP, after its bytes: so does the connection of their own (rt15
            // `RT15_EXTRA`: the image got no byte where TCP gives them all, then the reset).
            let drained = self.drain_ctl(fd, deadline);
            let tail = if drained || reset {
                self.unread_to_tail(n, deadline, reset)
            } else {
                None
            };
            let left = leave();
            crate::debug!(
                "fd {fd}: switch to TCP after the peer's close, {n} unread bytes {}: {}",
                if tail.is_some() && left {
                    "handed on in a connection of their own"
                } else {
                    "could not be handed on"
                },
                self.describe()
            );
            return match tail {
                Some((t, undo)) if left => Switched::Tail(t, undo),
                Some((t, _)) => {
                    // SAFETY: our own descriptor, never given out.
                    unsafe { real::close(t) };
                    Switched::Reset
                }
                None => Switched::Reset,
            };
        }
        if self.flags() & (F_PROTO | F_PEER_GONE | F_PEER_RST) != 0 || self.peer_state().any_close()
        {
            // The peer closed (or is gone): what it wrote last is in our ring, and it cannot
            // send it again. (A peer that only shut its writing can: it still runs.)
            crate::debug!(
                "fd {fd}: switch to TCP impossible, the peer closed: {}",
                self.describe()
            );
            // Out of the SOCKHASH all the same, so that the image's reads are plain TCP ones
            // (the reset's ECONNRESET, not the sockmap's EAGAIN).
            let _ = leave();
            return Switched::Reset;
        }
        let mut leave = Some(leave);
        if alone_ok && self.may_switch_alone() {
            if let Some(r) = self.switch_alone(fd, deadline, &mut leave) {
                return r;
            }
        }
        if !leave.take().is_some_and(|f| f()) {
            crate::debug!(
                "fd {fd}: switch to TCP impossible: the socket cannot leave the SOCKHASH"
            );
            return Switched::Reset;
        }
        // A peer that only writes learns it from its next write (`notice_switch`).
        self.own_wait().fetch_or(WAIT_SWITCH, Ordering::SeqCst);
        if !self.ctl_begin(true) {
            // The peer switched alone meanwhile (its marker will tell where its doorbells
            // end): our answer, without a marker of ours.
            return self.answer_alone(fd, deadline, !tail_ok);
        }
        let sent = crate::util::send_all(fd, &[SWITCH_TCP], deadline);
        self.ctl_end(true, sent);
        if !sent {
            crate::debug!("fd {fd}: switch to TCP: our marker could not be sent");
            return Switched::Reset;
        }
        // Sending it put our socket in ping-pong mode (a reply within the delayed-ACK time of
        // what it last received): out of it, so that the peer's switch bytes are acknowledged
        // as they come ([`Conn::acks_fresh`] waits for ours).
        ack_now(fd);
        if self.flags() & F_PEER_SWITCH == 0 {
            // The peer's end may be switched here, by this thread: its end of the switch must
            // not wait for ours, which cannot go on before it returns.
            IN_PEER_HERE.with(|h| {
                let was = h.replace(true);
                peer_here();
                h.set(was);
            });
        }
        let missing = "no marker from the peer in time";
        let Some(n) = self.after_peers_marker(fd, deadline, missing, !tail_ok) else {
            return self.closed_instead(fd, deadline, tail_ok);
        };
        *two_sided = true;
        crate::debug!(
            "fd {fd}: switched to TCP ({n} bytes the peer had not read sent again, {} bytes of \
             the peer's read meanwhile): {}",
            if self.flags() & F_STASH != 0 {
                self.inq()
            } else {
                0
            },
            self.describe()
        );
        Switched::Tcp
    }

    /// Our marker went out, the peer's did not come: when the peer closed instead, before it
    /// saw our switch (its FIN is all the socket holds: it never answered, so everything it
    /// wrote is in our ring), its last bytes are handed on as after any close of the peer
    /// ([`Conn::unread_to_tail`]; red team rt14 `writeclose`, a server that writes and closes
    /// as the client execs: 3 of 60 reset). Else the connection is reset.
    fn closed_instead(&self, fd: i32, deadline: Instant, tail_ok: bool) -> Switched {
        if !tail_ok || self.flags() & F_PEER_SWITCH != 0 || !at_eof(fd) {
            return Switched::Reset;
        }
        match self.peer_ended_unread() {
            Some((0, false)) => {
                crate::debug!("fd {fd}: the peer closed instead of answering, nothing unread");
                Switched::Tcp
            }
            Some((n, reset)) if n > 0 => match self.unread_to_tail(n, deadline, reset) {
                Some((t, undo)) => {
                    crate::debug!(
                        "fd {fd}: the peer closed instead of answering: its {n} unread bytes \
                         are handed on in a connection of their own"
                    );
                    Switched::Tail(t, undo)
                }
                None => Switched::Reset,
            },
            _ => Switched::Reset,
        }
    }

    /// Once our marker is out (or not needed): read up to the peer's (the end of its
    /// doorbells; `missing` says why when it does not come), send again what it did not read
    /// of ours, and our half-close (`peer_done_writing`, a flag in the rings) as TCP's FIN
    /// after the last byte. The count sent again, or `None` (the connection must be reset).
    ///
    /// `stash_ok`: this end stays with the library (not an exec into an image without it): while
    /// our bytes wait for room, what the peer sends meanwhile is read into our ring
    /// ([`Conn::stash_from`]), as a program on TCP reads while it writes.
    fn after_peers_marker(
        &self,
        fd: i32,
        deadline: Instant,
        missing: &str,
        stash_ok: bool,
    ) -> Option<u32> {
        if self.flags() & F_PEER_SWITCH == 0 && !read_to_marker(fd, deadline) {
            crate::debug!("fd {fd}: switch to TCP: {missing}: {}", self.describe());
            return None;
        }
        self.set_flag(F_PEER_SWITCH);
        // Right behind the marker (whoever read it: a drain reads no further).
        if !self.skip_resent(fd, deadline) {
            return None;
        }
        let n = self.resend_unread(fd, deadline, stash_ok)?;
        self.acks_fresh(fd, deadline, stash_ok);
        if self.flags() & F_SHUT_WR != 0 {
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_WR) };
        }
        Some(n)
    }

    /// This end sent its last switch byte (its marker, its count, the bytes it sent again):
    /// its socket's delayed ACKs become a fresh TCP connection's again, for good. Before the
    /// FIN of a `SHUT_WR` (which sends no data).
    ///
    /// The switch's exchange made the socket reply within the delayed-ACK time of what it
    /// received (`tcp_event_data_sent`, ping-pong count 1 = `tcp_pingpong_thresh`), and the
    /// CLC handshake did before: in ping-pong mode the kernel delays the ACK of the peer's
    /// next data (`__tcp_ack_snd_check`: quick ACKs only out of it), so a peer's second small
    /// write waited on Nagle for it, and a peer that then closed with our bytes unread (a
    /// reset) dropped what it had not sent (red team round 18, `rt18_nagle.sh`). A fresh
    /// connection ACKs its first data at once. `TCP_QUICKACK` 1 leaves ping-pong mode, but
    /// only until the socket sends data again within the delayed-ACK time of its last receipt:
    /// a byte of ours still queued behind Nagle (our count or bytes sent again behind our
    /// marker, released when the peer's ACK of the marker comes) or sent again by the tail loss
    /// probe (unacknowledged for 2 RTT plus 2 ticks, the peer's ACK delayed) counts again. So:
    /// 1. wait until the peer acknowledged every byte we sent (`SIOCOUTQ` 0: nothing left to
    ///    send or to send again; the peer is out of ping-pong mode too, it acknowledges as the
    ///    bytes come, at worst after its delayed-ACK time);
    /// 2. `TCP_QUICKACK` 1: from now on only the program's own writes count, as on TCP;
    /// 3. at the end of the switch, after its last call on the socket,
    ///    [`Conn::say_acks_fresh`]: at the end of a two-sided switch the peer does not
    ///    continue (exec its image, return to its program) before it sees it, so that its
    ///    program's first writes find our socket acknowledging at once
    ///    ([`Conn::await_peer_acks_fresh`]).
    ///
    /// The quick-ACK credits (`icsk_ack.quick`, 16 from the first data received, one less per
    /// ACK of new data) are what the socket has left: the CLC messages and the markers took
    /// a few (no doorbell goes over TCP while the shortcut carries them).
    fn acks_fresh(&self, fd: i32, deadline: Instant, stash_ok: bool) {
        let mut stash = |io| self.stash_from(io);
        let acked = all_acked(fd, deadline, if stash_ok { Some(&mut stash) } else { None });
        ack_now(fd);
        if !acked {
            crate::debug!(
                "fd {fd}: switch to TCP: the peer did not acknowledge our switch bytes in time: {}",
                self.describe()
            );
        }
    }

    /// [`WAIT_ACKS_FRESH`] in our wait word (with the feature): our socket acknowledges as a
    /// fresh one ([`Conn::acks_fresh`]) and this switch makes no more calls on it.
    fn say_acks_fresh(&self) {
        if self.flags() & F_FRESH_ACKS_OK != 0 {
            self.own_wait().fetch_or(WAIT_ACKS_FRESH, Ordering::SeqCst);
            crate::shm::futex_wake(self.own_wait_lo(), i32::MAX);
        }
    }

    /// The end of a two-sided switch: waits until the peer's socket acknowledges as a fresh
    /// one ([`WAIT_ACKS_FRESH`], [`Conn::acks_fresh`]), so that nothing our program (or the
    /// image we exec) writes reaches it before: it would find it in ping-pong mode, and a
    /// second small write of ours would wait on Nagle. Not without the feature, nor in the
    /// switch of the peer's end that this thread runs inside ours (`peer_here`: ours cannot
    /// say so before it returns); at most until `deadline` or until the connection ends
    /// (the peer reset it, or closed).
    fn await_peer_acks_fresh(&self, fd: i32, deadline: Instant) {
        if self.flags() & F_FRESH_ACKS_OK == 0 || IN_PEER_HERE.with(|h| h.get()) {
            return;
        }
        let w = self.peer_wait_lo();
        let mut i = 0u32;
        loop {
            let v = w.load(Ordering::SeqCst);
            if u64::from(v) & WAIT_ACKS_FRESH != 0 {
                return;
            }
            let now = Instant::now();
            if now >= deadline || !connected(fd) {
                crate::debug!(
                    "fd {fd}: switch to TCP: the peer did not say its ACKs are fresh: {}",
                    self.describe()
                );
                return;
            }
            if i < 64 {
                i += 1;
                let _ = spin_pause(i);
                continue;
            }
            let ms = deadline
                .saturating_duration_since(now)
                .as_millis()
                .clamp(1, 10) as u64;
            crate::shm::futex_wait(w, v, ms);
        }
    }

    /// The bytes of our send ring the peer did not consume, from the final consumer cursor it
    /// published before it switched up to our producer cursor, sent on the socket (the first
    /// bytes of ours on TCP). Their count, or `None` (the cursor is not valid, or they could
    /// not go out before `deadline`).
    ///
    /// With `stash_ok`, what the peer sends while they wait for room is read into our ring
    /// ([`Conn::stash_from`]): a peer whose next image echoes what it reads fills our socket's
    /// buffer and stops reading, and both ends waited for room until the deadline (`socat` with
    /// `EXEC:cat,nofork` echoing 6 MiB: the client read 0 bytes, `cat` a reset, in about one
    /// run of two).
    fn resend_unread(&self, fd: i32, deadline: Instant, stash_ok: bool) -> Option<u32> {
        let mut msg = Vec::new();
        let n = self.unread_tx(fd, &mut msg)?;
        let mut stash = |io| self.stash_from(io);
        let reader: Option<&mut dyn FnMut(i32) -> bool> =
            if stash_ok { Some(&mut stash) } else { None };
        if !crate::util::send_all_reading(fd, &msg, deadline, reader) {
            crate::debug!(
                "fd {fd}: switch to TCP: {n} unread bytes could not be sent again in time"
            );
            return None;
        }
        Some(n)
    }

    /// Whether bytes of the peer's stream that the switch read from the socket wait in our
    /// ring for the program ([`F_STASH`]): reads take them before the socket's.
    pub fn stash_left(&self) -> bool {
        let s = self.sh();
        self.flags() & F_STASH != 0
            && s.cons.load(Ordering::Acquire) != s.peer_prod.load(Ordering::Acquire)
    }

    /// The connection continues on TCP ([`F_SWITCHED`]) and bytes its switch read still wait
    /// in our ring ([`Conn::stash_left`]): readable for those, everything else (room to write,
    /// urgent data, the end, errors) is the socket's; no wakeup of the rings is armed any more
    /// (the peer's wait word lives in its DMB, which this end no longer writes).
    pub fn on_tcp_with_stash(&self) -> bool {
        self.switched() && self.stash_left()
    }

    /// Reads go to the socket: the connection continues on TCP and our ring holds nothing the
    /// switch read for the program.
    pub(super) fn rx_on_tcp(&self) -> bool {
        self.flags() & F_TO_TCP != 0 && !self.stash_left()
    }

    /// During a switch to TCP (both ring locks held, the rings stopped, the peer's marker and
    /// the bytes it sent again read or coming): reads what the socket holds now into our ring,
    /// which the peer no longer writes ([`F_STASH`]: from our final consumer cursor on, the
    /// producer cursor ours, in our local state; no urgent mark). The program's reads take
    /// these bytes first (`smc_rx`), then the socket's. Never waits. False once nothing more
    /// can be read this way (the ring is full, the socket at its end or failed).
    fn stash_from(&self, io: i32) -> bool {
        let s = self.sh();
        if self.flags() & F_STASH == 0 {
            s.peer_prod
                .store(s.cons.load(Ordering::Acquire), Ordering::Release);
            self.set_urg_rx(UrgRx::default());
            self.set_flag(F_STASH);
        }
        let cons = unpack(s.cons.load(Ordering::Acquire));
        let mut prod = unpack(s.peer_prod.load(Ordering::Acquire));
        let Ok(room) = self.rx.free_space(prod, cons) else {
            return false;
        };
        // SAFETY: `own` is our mapped DMB, longer than its CDC header.
        let base = unsafe { self.own.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        let e0 = real::errno();
        let mut more = room > 0;
        for (off, len) in self.rx.segments(prod, room) {
            if len == 0 || !more {
                continue;
            }
            // SAFETY: the segment lies inside our ring, which we map writable; nobody else
            // writes it any more (the peer switched, our ring locks are held).
            let r = unsafe {
                real::recv(
                    io,
                    base.add(off) as *mut libc::c_void,
                    len,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                prod = self.rx.add(prod, r as u32);
                s.peer_prod.store(pack(prod), Ordering::Release);
                if (r as usize) < len {
                    break;
                }
                continue;
            }
            let e = real::errno();
            // At the socket's end or error: the program reads it there after these bytes.
            more = r < 0 && (e == libc::EAGAIN || e == libc::EINTR);
            break;
        }
        real::set_errno(e0);
        more && self.rx.free_space(prod, cons).is_ok_and(|n| n > 0)
    }

    /// Appends to `out` the bytes of our send ring from the consumer cursor the peer last
    /// published (its final one once it switched) to our producer cursor; their count, or
    /// `None` when that cursor is not valid.
    fn unread_tx(&self, fd: i32, out: &mut Vec<u8>) -> Option<u32> {
        let s = self.sh();
        let prod = unpack(s.prod.load(Ordering::Acquire));
        let last = unpack(s.peer_cons.load(Ordering::Acquire));
        let new = self.own_hdr().load_cons().cursor;
        let Ok(pc) = self.tx.accept_peer_cons(prod, last, new) else {
            crate::debug!(
                "fd {fd}: switch to TCP: the peer's final consumer cursor {new:?} is not valid"
            );
            return None;
        };
        let n = self.tx.diff(pc, prod).unwrap_or(0);
        // SAFETY: `peer` is the peer's mapped DMB, longer than its CDC header.
        let base = unsafe { self.peer.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        out.reserve(n as usize);
        for (off, len) in self.tx.segments(pc, n) {
            if len == 0 {
                continue;
            }
            // SAFETY: the segment lies inside the peer's ring, which we map.
            out.extend_from_slice(unsafe { std::slice::from_raw_parts(base.add(off), len) });
        }
        Some(n)
    }

    /// Just after the peer's marker was read: when the peer switched alone and sends again
    /// what we had not read of it ([`F_ALONE_RESEND`]), its count (4 bytes), then the bytes
    /// of them we read from our ring already are dropped: the rest are the next bytes of the
    /// stream. Under `rx_lock`, our consumer cursor final. False (the connection must be
    /// reset) when they do not come in time or the count does not fit what our ring holds.
    fn skip_resent(&self, fd: i32, deadline: Instant) -> bool {
        if self.flags() & F_ALONE_RESEND == 0
            || self.peer_wait().load(Ordering::SeqCst) & WAIT_ALONE == 0
        {
            return true;
        }
        let mut cnt = [0u8; 4];
        if !recv_exact(fd, &mut cnt, deadline) {
            crate::debug!(
                "fd {fd}: switch to TCP: the count after the peer's marker did not come: {}",
                self.describe()
            );
            return false;
        }
        let n = u32::from_le_bytes(cnt);
        // What we did not read of our ring is the end of what it sent again.
        let unread = self
            .rx_cursors()
            .and_then(|(cons, prod)| self.rx.readable(cons, prod).ok());
        let Some(skip) = unread.and_then(|u| n.checked_sub(u)) else {
            crate::debug!(
                "fd {fd}: switch to TCP: the peer sends {n} bytes again, fewer than our ring \
                 holds unread ({unread:?}): {}",
                self.describe()
            );
            self.set_flag(F_PROTO);
            return false;
        };
        if skip > self.rx.len() {
            self.set_flag(F_PROTO);
            return false;
        }
        let mut left = skip as usize;
        let mut buf = [0u8; 4096];
        while left > 0 {
            let k = left.min(buf.len());
            if !recv_exact(fd, &mut buf[..k], deadline) {
                crate::debug!(
                    "fd {fd}: switch to TCP: {skip} bytes the peer sent again did not come: {}",
                    self.describe()
                );
                return false;
            }
            left -= k;
        }
        true
    }

    /// The peer switched alone ([`WAIT_ALONE`]; the socket left the SOCKHASH already): read up
    /// to its marker (the end of its doorbells), send again what it did not read of ours
    /// (normally nothing: it switched alone because it had read everything; bytes we produced
    /// as it committed), and continue on TCP. No marker of ours: the peer does not wait for
    /// one, and its next image reads this stream as data.
    fn answer_alone(&self, fd: i32, deadline: Instant, stash_ok: bool) -> Switched {
        // The peer's marker follows its commit by its last doorbells and one daemon request:
        // it does not wait for us, so it does not get the whole switch wait (a fifth of it,
        // one CLC timeout by default). A peer that sets the bit and never sends one (red team
        // rt14 `rt14_hostile.c exec 3 alone`) held an exec 10 s per connection.
        let now = Instant::now();
        let deadline = deadline.min(now + deadline.saturating_duration_since(now) / 5);
        let missing = "the peer switched alone, its marker did not come";
        let Some(n) = self.after_peers_marker(fd, deadline, missing, stash_ok) else {
            return Switched::Reset;
        };
        crate::debug!(
            "fd {fd}: switched to TCP after the peer, which switched alone ({n} bytes sent \
             again): {}",
            self.describe()
        );
        Switched::Tcp
    }

    /// Under both ring locks, the rings stopped: the peer closed its end cleanly (its close
    /// flags, no abort, no reset), every control byte of it is counted, and neither ring holds
    /// a byte not read: this end continues on TCP without an answer (red team rt14
    /// `rt14_py.py closed`: a client that read the whole reply of a server that closed, then
    /// handed its socket to `cat`, got a reset 3 of 3 where TCP gives EOF).
    fn peer_closed_clean(&self) -> bool {
        self.peer_closed_unread() == Some(0)
    }

    /// Under both ring locks, the rings stopped: the peer closed its end cleanly, every control
    /// byte of it is counted and it read everything we wrote: how many bytes of its stream our
    /// ring still holds unread (no urgent byte among them), or `None`.
    fn peer_closed_unread(&self) -> Option<u32> {
        self.peer_ended_unread()
            .and_then(|(n, reset)| (!reset).then_some(n))
    }

    /// Under both ring locks, the rings stopped: the peer will not write again (it closed,
    /// aborted or is gone) and every control byte of it is counted: how many bytes of its
    /// stream our ring still holds unread (no urgent byte among them), and whether TCP would
    /// have reset the connection after them (the peer did not close cleanly, or closed with
    /// bytes of ours unread: `tcp_close` sends a reset then), or `None`.
    fn peer_ended_unread(&self) -> Option<(u32, bool)> {
        if self.flags() & F_PROTO != 0
            || self.own_wait().load(Ordering::SeqCst) & CTL_UNCOUNTED != 0
        {
            return None;
        }
        let ps = self.peer_state();
        let gone = self.flags() & (F_PEER_RST | F_PEER_GONE) != 0;
        let closed = ps.contains(ConnStateFlags::PEER_CONN_CLOSED);
        let aborted = ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        if !(closed || aborted || gone) {
            return None;
        }
        let tx_read = self.tx_cursors().is_some_and(|(prod, cons)| prod == cons);
        let (cons, prod) = self.rx_cursors()?;
        let unread = self.rx.readable(cons, prod).ok()?;
        if unread > 0 && self.readable_urg().1 {
            return None;
        }
        Some((unread, gone || aborted || !tx_read))
    }

    /// Under both ring locks, the rings stopped, the peer closed ([`Conn::peer_closed_unread`]
    /// says `n` > 0): the `n` bytes our ring holds unread go into a private loopback TCP
    /// connection made for them, followed by its end (FIN), and count as read here. The
    /// socket of that connection that reads them, for the caller to put in place of this
    /// connection's in the next image; `None` when it could not be made or they did not fit
    /// into its buffers before `deadline` (the caller resets then, as before).
    fn unread_to_tail(&self, n: u32, deadline: Instant, reset: bool) -> Option<(i32, TailUndo)> {
        let (cons, prod) = self.rx_cursors()?;
        if self.rx.readable(cons, prod).ok()? != n {
            return None;
        }
        let (rd, wr) = crate::util::loopback_pair(n as usize)?;
        // SAFETY: `own` is our mapped DMB, longer than its CDC header.
        let base = unsafe { self.own.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN) };
        // Nobody reads the new connection before the image runs: once its buffers are full no
        // waiting makes room (loopback delivers as it sends), so a send that finds no room
        // fails after a moment instead of the whole switch wait.
        let deadline = deadline.min(Instant::now() + std::time::Duration::from_millis(100));
        let mut ok = true;
        for (off, len) in self.rx.segments(cons, n) {
            if len == 0 {
                continue;
            }
            // SAFETY: the segment lies inside our ring, which we map; its writer closed.
            let b = unsafe { std::slice::from_raw_parts(base.add(off), len) };
            if !crate::util::send_all(wr, b, deadline) {
                ok = false;
                break;
            }
        }
        if ok && reset {
            // Its end is a reset, once every byte reached `rd` (a reset discards what it
            // has not sent yet).
            ok = sent_out(wr, deadline);
            crate::util::set_linger_reset(wr);
        }
        // SAFETY: our own descriptor; its bytes and FIN (or reset) stay queued for `rd`.
        unsafe { real::close(wr) };
        if !ok {
            // SAFETY: as above.
            unsafe { real::close(rd) };
            return None;
        }
        self.sh().cons.store(pack(prod), Ordering::Release);
        self.publish_cons(prod);
        Some((rd, TailUndo(cons)))
    }

    /// The exec whose image was to read the peer's last bytes ([`Switched::Tail`]) failed:
    /// they are unread in our ring again and the connection is back on it for every holder of
    /// this end (a `vfork` or `fork` child whose exec failed leaves them to its parent, as on
    /// TCP, where the socket still holds them; red team rt15 `rt15_tail forkfail`: 5 of 5
    /// lost). Our published consumer cursor stays where it is (the peer closed and does not
    /// look back). False when the connection moved on meanwhile (reset, closed, or the
    /// cursor no longer behind ours): nothing changes then.
    pub fn undo_tail(&self, u: TailUndo) -> bool {
        let s = self.sh();
        let _rg = s.rx_lock.lock();
        let _tg = s.tx_lock.lock();
        if self.flags() & (F_SWITCHED | F_PROTO | F_CLOSED) != F_SWITCHED {
            return false;
        }
        let now = unpack(s.cons.load(Ordering::Acquire));
        if self.rx.readable(u.0, now).is_err() {
            return false;
        }
        s.cons.store(pack(u.0), Ordering::Release);
        s.flags.fetch_and(!F_SWITCHED, Ordering::AcqRel);
        crate::debug!("the exec that was to read the peer's last bytes failed: back in the ring");
        s.wake_seq.fetch_add(1, Ordering::AcqRel);
        crate::shm::futex_wake(&s.wake_seq, i32::MAX);
        true
    }

    /// Under both ring locks, the rings stopped and our consumer cursor final: whether this
    /// end may switch without its peer's answer. Neither ring may hold an unread byte (what
    /// the peer wrote we read, what we wrote it read), nor either end have shut a side but our
    /// writing (whose FIN we send ourselves), and every control byte of the peer must be
    /// counted ([`CTL_UNCOUNTED`]).
    fn may_switch_alone(&self) -> bool {
        if self.flags() & (F_PEER_SWITCH | F_PEER_ALONE | F_SHUT_RD) != 0
            || self.own_wait().load(Ordering::SeqCst) & CTL_UNCOUNTED != 0
        {
            return false;
        }
        // A peer that only shut its writing still reads what we send: its stream ended, and
        // its FIN, which goes only when it answers, is stood in for (`switch_alone`).
        let ps = self.peer_state();
        if ps.any_close() || ps.0 & PEER_DONE_READING != 0 {
            return false;
        }
        let rx_empty = self
            .rx_cursors()
            .is_some_and(|(cons, prod)| self.rx.readable(cons, prod) == Ok(0));
        // What the peer did not read of ours goes again after our marker
        // ([`F_ALONE_RESEND`]), unless an urgent byte is among it (it would arrive inline).
        let f = self.flags();
        let tx_read = self.tx_cursors().is_some_and(|(prod, cons)| prod == cons)
            || f & F_ALONE_RESEND != 0 && f & F_URG_FLAGS == 0;
        rx_empty && tx_read
    }

    /// Switch alone (this project's CDC extension with [`smc_common::clc::FEATURE_SWITCH_ALONE`]):
    /// commit [`WAIT_ALONE`] in our wait word (no control send of the peer in flight: its
    /// guard refuses every one after it), read the peer's control bytes up to its count, leave
    /// the SOCKHASH, send our marker (unless the peer switched alone too), and continue on TCP
    /// without waiting for the peer: it answers at its next operation, reads up to our marker
    /// and sends over TCP whatever it writes from then on. `None`: not committed (a control
    /// send of the peer stayed in flight), the two-sided switch follows; `leave` untouched.
    fn switch_alone(
        &self,
        fd: i32,
        deadline: Instant,
        leave: &mut Option<impl FnOnce() -> bool>,
    ) -> Option<Switched> {
        let w = self.own_wait();
        let start = Instant::now();
        let mut cur = w.load(Ordering::SeqCst);
        let mut i = 0u32;
        loop {
            if cur & CTL_UNCOUNTED != 0 {
                return None;
            }
            if cur & CTL_INFLIGHT_MASK != 0 {
                if start.elapsed() > Duration::from_millis(SETTLE_MAX_MS) {
                    return None;
                }
                i += 1;
                let _ = spin_pause(i);
                cur = w.load(Ordering::SeqCst);
                continue;
            }
            match w.compare_exchange_weak(
                cur,
                cur | WAIT_ALONE | WAIT_SWITCH,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => break,
                Err(x) => cur = x,
            }
        }
        fence(Ordering::SeqCst);
        // Dekker with the peer's `after_produce`: bytes it produced before our commit are
        // seen here (it sends them again over TCP when it answers); after it, it sees our bit.
        let late = self
            .rx_cursors()
            .and_then(|(cons, prod)| self.rx.readable(cons, prod).ok())
            .unwrap_or(0);
        let ok = self.drain_ctl(fd, deadline);
        let left = leave.take().is_some_and(|f| f());
        if !ok || !left {
            crate::debug!(
                "fd {fd}: switch to TCP alone: {}: {}",
                if ok {
                    "the socket cannot leave the SOCKHASH"
                } else {
                    "the peer's doorbells did not all come"
                },
                self.describe()
            );
            return Some(Switched::Reset);
        }
        if self.flags() & F_PEER_SWITCH != 0 && !self.skip_resent(fd, deadline) {
            return Some(Switched::Reset);
        }
        let mut resent = 0;
        if self.ctl_begin(true) {
            let mut msg = vec![SWITCH_TCP];
            if self.flags() & F_ALONE_RESEND != 0 {
                // What the peer did not read of ours, from the cursor it last published (its
                // final one when it switched too: its marker came before our commit), with
                // its count; one send with the marker (a second small segment would wait
                // for the peer's delayed ACK of the first: Nagle).
                msg.extend_from_slice(&[0; 4]);
                match self.unread_tx(fd, &mut msg) {
                    Some(n) => {
                        resent = n;
                        msg[1..5].copy_from_slice(&n.to_le_bytes());
                    }
                    None => {
                        self.ctl_end(true, false);
                        return Some(Switched::Reset);
                    }
                }
            }
            let sent = crate::util::send_all(fd, &msg, deadline);
            self.ctl_end(true, sent);
            if !sent {
                crate::debug!("fd {fd}: switch to TCP alone: our marker could not be sent");
                return Some(Switched::Reset);
            }
        }
        // The peer answers when it will: nothing to wait for but its kernel's ACK (and nothing
        // to read meanwhile: its doorbells and marker come first, read by the peer's answer).
        self.acks_fresh(fd, deadline, false);
        if self.flags() & F_SHUT_WR != 0 {
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_WR) };
        }
        if self
            .peer_state()
            .contains(ConnStateFlags::PEER_DONE_WRITING)
            && late == 0
        {
            // The peer shut its writing and we read all it wrote: its FIN goes only when it
            // answers, maybe much later (it waits elsewhere). Our reads on TCP end now, as
            // over TCP, where its FIN came with its shutdown (`SHUT_RD`: an empty receive
            // queue reads as EOF; red team rt14 `shut`/`shutfirst`: reset after the switch
            // wait before).
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RD) };
        }
        if late > 0 && self.flags() & F_PEER_SWITCH == 0 && !inq_reaches(fd, late, deadline) {
            // The peer wrote as we committed and has not answered (it sends them again at
            // its next operation): bounded like the two-sided switch.
            crate::debug!(
                "fd {fd}: switch to TCP alone: {late} bytes the peer wrote as we switched did \
                 not come again in time: {}",
                self.describe()
            );
            return Some(Switched::Reset);
        }
        crate::debug!(
            "fd {fd}: switched to TCP alone{} ({resent} bytes the peer had not read sent \
             again): {}",
            if late > 0 {
                " (the peer sent again what it wrote as we switched)"
            } else {
                ""
            },
            self.describe()
        );
        Some(Switched::Tcp)
    }

    /// Reads the peer's control bytes on the socket (still read through the SOCKHASH) until
    /// we have read as many as it counted in our wait word (its guard sends none after our
    /// [`WAIT_ALONE`]); its marker among them (it started the two-sided switch before our
    /// commit) must be the last. False at the deadline, at EOF, or on anything else.
    fn drain_ctl(&self, fd: i32, deadline: Instant) -> bool {
        let e0 = real::errno();
        let mut buf = [0u8; 256];
        let ok = loop {
            let Some(n) = self.ctl_unread() else {
                break false;
            };
            if n == 0 {
                break true;
            }
            let want = (n as usize).min(buf.len());
            let Some(got) = recv_some(fd, &mut buf[..want], deadline) else {
                break false;
            };
            self.sh()
                .doorbells_rcvd
                .fetch_add(got as u64, Ordering::AcqRel);
            let bytes = &buf[..got];
            match bytes.iter().position(|&b| b != DOORBELL) {
                None => {}
                Some(i) if bytes[i] == SWITCH_TCP && i + 1 == got && got == n as usize => {
                    // The peer's marker, its last control byte: it switches two-sided.
                    self.set_flag(F_PEER_SWITCH);
                }
                Some(_) => break false,
            }
        };
        real::set_errno(e0);
        ok
    }
}

thread_local! {
    /// This thread runs the switch of the peer's end inside the switch of ours (`peer_here`).
    static IN_PEER_HERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A two-sided switch waits for the peer's [`WAIT_ACKS_FRESH`] only when the peer sends again
/// at most this many bytes of ours, which our socket takes whether or not anyone reads it. The
/// peer says it once its kernel acknowledged its last switch byte: with more, that needs the
/// reader that only our next image is, and both waited for each other until the deadline and
/// the connection was reset (an inetd-style `cat` echo of 6 MiB the server had not read: 4 of
/// 4; `socat EXEC:cat,nofork`: 1 run of 2). Bulk to read is no exchange of small writes,
/// which is what a peer socket in delayed-ACK mode would hold back.
const FRESH_WAIT_MAX_RESENT: u32 = 32 << 10;

/// `SIOCOUTQNSD` (`linux/sockios.h`): the bytes of the send queue not sent yet.
const SIOCOUTQNSD: libc::c_ulong = 0x894B;

/// Whether the peer's kernel acknowledged every byte written to `fd` (`SIOCOUTQ` 0: none left
/// to send or to send again) before `deadline`, or what is left is held by the peer's receive
/// window (a full segment or more not sent yet: bulk, which only the peer's program frees by
/// reading, after its switch; Nagle holds less than a segment, and what was sent the peer's
/// kernel acknowledges within its delayed-ACK time); false at the deadline, or at once when
/// the connection ended (a reset purges what was not acknowledged). Sleeps in steps of 1 ms
/// after a short spin (on loopback the ACK is usually processed before our `send` returns).
/// `reader` (while it returns true) reads what arrives meanwhile ([`Conn::stash_from`]). errno
/// is kept.
fn all_acked(fd: i32, deadline: Instant, mut reader: Option<&mut dyn FnMut(i32) -> bool>) -> bool {
    let e0 = real::errno();
    let mss = crate::util::sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_MAXSEG)
        .filter(|&m| m > 0)
        .unwrap_or(536);
    let mut i = 0u32;
    let ok = loop {
        let Some(q) = ioctl_int(fd, libc::TIOCOUTQ as libc::c_ulong) else {
            break false;
        };
        if q == 0 {
            break true;
        }
        let mut nsd: libc::c_int = 0;
        // SAFETY: SIOCOUTQNSD writes one int to our local.
        let r = unsafe {
            real::ioctl(
                fd,
                SIOCOUTQNSD,
                std::ptr::from_mut(&mut nsd) as libc::c_ulong,
            )
        };
        if r == 0 && nsd >= mss {
            break true;
        }
        if Instant::now() >= deadline || !connected(fd) {
            break false;
        }
        if let Some(r) = reader.as_mut() {
            if !r(fd) {
                reader = None;
            }
        }
        i += 1;
        if i < 64 {
            let _ = spin_pause(i);
        } else {
            // SAFETY: no descriptors: a 1 ms sleep.
            unsafe { real::poll(std::ptr::null_mut(), 0, 1) };
        }
    };
    real::set_errno(e0);
    ok
}

/// Whether the socket's TCP state still carries the stream both ways or our half-close
/// (ESTABLISHED, FIN_WAIT1, FIN_WAIT2), as `TCP_INFO` says. errno is kept.
pub(super) fn connected(fd: i32) -> bool {
    // TCP_ESTABLISHED 1, TCP_FIN_WAIT1 4, TCP_FIN_WAIT2 5 (`include/net/tcp_states.h`).
    crate::util::tcp_info(fd).is_some_and(|ti| matches!(ti.tcpi_state, 1 | 4 | 5))
}

/// Whether everything written to `fd` left its send queue (`SIOCOUTQ` 0) before `deadline`.
fn sent_out(fd: i32, deadline: Instant) -> bool {
    let mut i = 0u32;
    loop {
        let mut q: libc::c_int = 0;
        // SAFETY: SIOCOUTQ writes one int.
        let r = unsafe {
            real::ioctl(
                fd,
                libc::TIOCOUTQ as libc::c_ulong,
                std::ptr::from_mut(&mut q) as libc::c_ulong,
            )
        };
        if r != 0 || q == 0 {
            return r == 0;
        }
        if Instant::now() >= deadline {
            return false;
        }
        i += 1;
        let _ = spin_pause(i);
    }
}

/// Reads up to `buf.len()` (> 0) bytes from the socket, waiting for some until `deadline` at
/// most; how many, or `None` at EOF, an error or the deadline. errno is the caller's to keep.
fn recv_some(fd: i32, buf: &mut [u8], deadline: Instant) -> Option<usize> {
    loop {
        // SAFETY: a valid buffer of its length.
        let r = unsafe {
            real::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if r > 0 {
            return Some(r as usize);
        }
        if r == 0 {
            return None;
        }
        let e = real::errno();
        if (e != libc::EAGAIN && e != libc::EINTR) || !wait_fd(fd, libc::POLLIN, deadline) {
            return None;
        }
    }
}

/// Reads exactly `buf.len()` bytes from the socket, waiting until `deadline` at most.
fn recv_exact(fd: i32, buf: &mut [u8], deadline: Instant) -> bool {
    let e0 = real::errno();
    let mut got = 0;
    let ok = loop {
        if got == buf.len() {
            break true;
        }
        match recv_some(fd, &mut buf[got..], deadline) {
            Some(n) => got += n,
            None => break false,
        }
    };
    real::set_errno(e0);
    ok
}

/// A socket queue size (`SIOCOUTQ`/`TIOCOUTQ`: bytes sent but not acknowledged;
/// `SIOCINQ`/`FIONREAD`: bytes to read), or `None` when the ioctl fails.
fn ioctl_int(fd: i32, req: libc::c_ulong) -> Option<libc::c_int> {
    let mut q: libc::c_int = 0;
    // SAFETY: both requests write one int to our local.
    let r = unsafe { real::ioctl(fd, req, std::ptr::from_mut(&mut q) as libc::c_ulong) };
    (r == 0).then_some(q)
}

/// Waits until the socket holds at least `n` bytes to read (`SIOCINQ`), until `deadline`.
fn inq_reaches(fd: i32, n: u32, deadline: Instant) -> bool {
    let e0 = real::errno();
    let ok = loop {
        let Some(q) = ioctl_int(fd, libc::FIONREAD as libc::c_ulong) else {
            break false;
        };
        if q >= 0 && q as u32 >= n {
            break true;
        }
        let now = Instant::now();
        if now >= deadline {
            break false;
        }
        ack_now(fd);
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; the wait is cut to 10 ms (more bytes wake nobody once
        // some are queued).
        unsafe { real::poll(&mut p, 1, 10) };
    };
    real::set_errno(e0);
    ok
}

/// The program's first write on a connection that its call switched to TCP just before (a
/// peer that switched alone, whose next image may already write), made by `send`: it goes
/// out as a fresh TCP connection's first bytes would, not as a reply. Its result; errno is
/// `send`'s.
///
/// Sent within the delayed-ACK time (`ato`) of the peer's marker, the last data the socket
/// received, the bytes count as a reply (`tcp_event_data_sent`) and put the socket in ping-pong
/// mode, where a fresh TCP connection whose first bytes are its own is not (its `ato` is 0
/// until it receives data): the peer's answer is then acknowledged late, a second small write
/// of the peer waits for that ACK (Nagle), and a peer that closes with our bytes unread (a
/// reset) drops it (red team round 19: the peer of an inetd handler that switched alone
/// before the client's request, 1 in about 400 connections lost the handler's second and third
/// writes). `TCP_QUICKACK` after the send leaves that mode, but too late when the peer's
/// answer came first: our thread was preempted by the woken peer between the send and the
/// option, and the answer, queued unread, holds the ACK back (the CI's `after` case, 1 of
/// 10 once; 1 in about 600 connections beside a test run here). So, unless data of the
/// program came after the marker (then the socket's last receipt is what TCP's would be), the
/// write first waits out what is left of that time: at most [`REPLY_TIME_MAX`], once per
/// switched connection; then `TCP_QUICKACK` after the send as before. What comes from the
/// peer between the send and the option is then acknowledged at once. Not a non-blocking
/// write (`nonblock`), which TCP never holds up (an event loop's pass over 20 such sockets took
/// 35 ms against 0.2 ms: red team round 31 `rt31x_abc.c many`): it keeps the race, as before.
pub fn send_fresh(fd: i32, nonblock: bool, send: impl FnOnce() -> isize) -> isize {
    if !nonblock {
        out_of_reply_time(fd);
    }
    let r = send();
    let e = real::errno();
    ack_now(fd);
    real::set_errno(e);
    r
}

/// The longest [`send_fresh`] waits before its bytes: the kernel's longest delayed-ACK time
/// (`TCP_DELACK_MAX`, 200 ms; the usual `ato` is `TCP_ATO_MIN`, 40 ms).
const REPLY_TIME_MAX: Duration = Duration::from_millis(200);

/// Waits (at most [`REPLY_TIME_MAX`]) until data sent on `fd` would not be a reply to the
/// last data it received (`TCP_INFO`: `tcpi_last_data_recv`, ms, at least `tcpi_ato`, us),
/// unless or until bytes to read are queued (the program's, received after the switch: a peer
/// that writes meanwhile kept it waiting 119-200 ms, red team round 31 `rt31x_abc.c stream`).
/// errno is kept.
fn out_of_reply_time(fd: i32) {
    let end = Instant::now() + REPLY_TIME_MAX;
    loop {
        if ioctl_int(fd, libc::FIONREAD as libc::c_ulong).is_some_and(|q| q > 0) {
            return;
        }
        let Some(ti) = crate::util::tcp_info(fd) else {
            return;
        };
        let since_us = u64::from(ti.tcpi_last_data_recv).saturating_mul(1000);
        let ato_us = u64::from(ti.tcpi_ato);
        let now = Instant::now();
        if since_us >= ato_us || now >= end {
            return;
        }
        // One more millisecond: both are jiffies, rounded to what `TCP_INFO` shows. In slices
        // of at most 2 ms, to see the peer's bytes come.
        let left = Duration::from_micros(ato_us - since_us + 1000)
            .min(end - now)
            .min(Duration::from_millis(2));
        std::thread::sleep(left);
    }
}

/// Our delayed ACK, if one is pending, goes now (`TCP_QUICKACK`, not sticky): the peer's next
/// small segment of the switch (a marker, a count) may wait for it (Nagle) — up to the
/// delayed-ACK timer, 40 ms, which a switch wait of 5 short CLC timeouts does not hold.
fn ack_now(fd: i32) {
    crate::util::set_sockopt_int(fd, libc::IPPROTO_TCP, libc::TCP_QUICKACK, 1);
}

/// Waits for `ev` on `fd` until `deadline`; false when it passed.
fn wait_fd(fd: i32, ev: i16, deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    if ev & libc::POLLIN != 0 {
        ack_now(fd);
    }
    let ms = (deadline - now).as_millis().min(1000) as i32 + 1;
    let mut p = libc::pollfd {
        fd,
        events: ev,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { real::poll(&mut p, 1, ms) };
    true
}

/// Consumes doorbells up to and including the peer's [`SWITCH_TCP`] marker, nothing after it
/// (peeks first). False at the deadline, at EOF or an error, or on any other byte.
fn read_to_marker(fd: i32, deadline: Instant) -> bool {
    let e0 = real::errno();
    let mut buf = [0u8; 256];
    let ok = loop {
        // SAFETY: valid buffer.
        let r = unsafe {
            real::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if r == 0 {
            break false;
        }
        if r < 0 {
            let e = real::errno();
            if e != libc::EAGAIN && e != libc::EINTR {
                break false;
            }
            if !wait_fd(fd, libc::POLLIN, deadline) {
                break false;
            }
            continue;
        }
        let n = r as usize;
        let stop = buf[..n].iter().position(|&b| b != DOORBELL);
        let take = stop.map_or(n, |i| i + 1);
        if stop.is_some_and(|i| buf[i] != SWITCH_TCP) {
            break false;
        }
        // SAFETY: valid buffer; consumes exactly what was peeked (doorbells, the marker).
        let got = unsafe {
            real::recv(
                fd,
                buf.as_mut_ptr() as *mut libc::c_void,
                take,
                libc::MSG_DONTWAIT,
            )
        };
        if got != take as isize {
            break false;
        }
        if stop.is_some() {
            break true;
        }
    };
    real::set_errno(e0);
    ok
}

/// Whether the socket's next read is its end (the peer's FIN, nothing before it).
fn at_eof(fd: i32) -> bool {
    let e0 = real::errno();
    let mut b = 0u8;
    // SAFETY: a valid one-byte buffer.
    let r = unsafe {
        real::recv(
            fd,
            std::ptr::from_mut(&mut b).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    real::set_errno(e0);
    r == 0
}

/// Resets the TCP connection of `fd`, which stays open (it goes on to an image without the
/// library): `connect(AF_UNSPEC)` disconnects it, the peer gets a reset and this socket's next
/// read says ECONNRESET (then ENOTCONN), never a clean end of stream. Else linger 0 and
/// shutdown (the peer gets a reset; our reads say EOF).
fn reset_socket(fd: i32) {
    // SAFETY: a zeroed sockaddr is valid; AF_UNSPEC is 0.
    let sa: libc::sockaddr = unsafe { std::mem::zeroed() };
    let e0 = real::errno();
    // SAFETY: a valid address of its length.
    let r = unsafe {
        real::connect(
            fd,
            &sa,
            std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    };
    if r != 0 {
        crate::util::set_linger_reset(fd);
    }
    // Also after a disconnect: a socket still in the SOCKHASH is read by `tcp_bpf`, which waits
    // for its ingress queue on a disconnected socket unless the receive side is shut (a Python
    // handler exec'd from a `vfork` child blocked in `read` for ever); on a closed socket the
    // kernel still marks it shut (`inet_shutdown`, then `ENOTCONN`).
    // SAFETY: plain syscall.
    unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
    real::set_errno(e0);
}
