//! smc_cdc: the cursors of both rings as the CDC headers carry them: the peer's producer and
//! consumer cursors accepted after validation (`Ring::accept_peer_prod`/`accept_peer_cons`),
//! ours published into the peer's header, the flags of the consumer word.

use super::*;

impl Conn {
    /// Our consumer cursor and the peer's validated producer cursor in our ring, one
    /// consistent snapshot; `None` on a protocol violation.
    ///
    /// Lock-free: readiness checks (poll, epoll, the other direction's waiter) run this while a
    /// reader under `rx_lock` advances the consumer cursor and other threads accept newer
    /// producer cursors. The peer's word is judged against the consumer cursor and the last
    /// accepted producer cursor *of the moment it was read*: both are read before and after it,
    /// and a check that fails while either of them moved is retried, never taken for a
    /// violation. (Judged against a consumer cursor read a moment too early, an honest producer
    /// cursor looked more than a ring ahead and reset the connection: issue 10.) Both words only
    /// move forward, and the peer's producer cursor is based on a consumer cursor we stored
    /// before we published it, so equal values before and after mean the check was exact.
    pub(super) fn rx_cursors(&self) -> Option<(Cursor, Cursor)> {
        let s = self.sh();
        if self.flags() & F_STASH != 0 {
            // What a switch to TCP read for the program: the producer cursor is ours.
            let (c, p) = (
                s.cons.load(Ordering::Acquire),
                s.peer_prod.load(Ordering::Acquire),
            );
            return Some((unpack(c), unpack(p)));
        }
        for _ in 0..SNAPSHOT_TRIES {
            let cons_w = s.cons.load(Ordering::Acquire);
            let last_w = s.peer_prod.load(Ordering::Acquire);
            let new = self.own_hdr().load_prod().cursor;
            let (cons, last) = (unpack(cons_w), unpack(last_w));
            if new == last {
                return Some((cons, new));
            }
            match self.rx.accept_peer_prod(cons, last, new) {
                Ok(c) => {
                    advance(&s.peer_prod, self.rx, last_w, c);
                    return Some((cons, c));
                }
                Err(_)
                    if s.cons.load(Ordering::Acquire) != cons_w
                        || s.peer_prod.load(Ordering::Acquire) != last_w => {}
                Err(e) => {
                    self.protocol_error(format_args!(
                        "peer producer cursor {new:?} rejected ({e}): our consumer cursor \
                         {cons:?}, last accepted producer cursor {last:?}, ring {}",
                        self.rx.len()
                    ));
                    return None;
                }
            }
        }
        // Still moving after all these tries: nothing new this time (the caller looks again).
        let cons = unpack(s.cons.load(Ordering::Acquire));
        Some((cons, unpack(s.peer_prod.load(Ordering::Acquire))))
    }

    /// Our producer cursor and the peer's validated consumer cursor in its ring (our send
    /// ring), one consistent snapshot; `None` on a protocol violation. Lock-free like
    /// [`rx_cursors`](Self::rx_cursors): the writer under `tx_lock` advances the producer
    /// cursor meanwhile, so the peer's word is judged against the producer cursor and last
    /// accepted consumer cursor of the moment it was read.
    pub(super) fn tx_cursors(&self) -> Option<(Cursor, Cursor)> {
        let s = self.sh();
        for _ in 0..SNAPSHOT_TRIES {
            let prod_w = s.prod.load(Ordering::Acquire);
            let last_w = s.peer_cons.load(Ordering::Acquire);
            let new = self.own_hdr().load_cons().cursor;
            let (prod, last) = (unpack(prod_w), unpack(last_w));
            if new == last {
                return Some((prod, new));
            }
            match self.tx.accept_peer_cons(prod, last, new) {
                Ok(c) => {
                    advance(&s.peer_cons, self.tx, last_w, c);
                    return Some((prod, c));
                }
                Err(_)
                    if s.prod.load(Ordering::Acquire) != prod_w
                        || s.peer_cons.load(Ordering::Acquire) != last_w => {}
                Err(e) => {
                    self.protocol_error(format_args!(
                        "peer consumer cursor {new:?} rejected ({e}): our producer cursor \
                         {prod:?}, last accepted consumer cursor {last:?}, ring {}",
                        self.tx.len()
                    ));
                    return None;
                }
            }
        }
        let prod = unpack(s.prod.load(Ordering::Acquire));
        Some((prod, unpack(s.peer_cons.load(Ordering::Acquire))))
    }

    /// Readable bytes (0 on protocol error).
    pub(super) fn avail(&self) -> u32 {
        match self.rx_cursors() {
            Some((cons, p)) => self.rx.readable(cons, p).unwrap_or(0),
            None => 0,
        }
    }

    /// Bytes readable as poll and blocking reads count them (the urgent byte at the mark does
    /// not count, unless `SO_OOBINLINE`), and whether urgent data is pending (`EPOLLPRI`).
    /// Lock-free, nothing stored: the writer's newest urgent word is taken into a copy of the
    /// record ([`Conn::urg_take`]).
    pub(super) fn readable_urg(&self) -> (u32, bool) {
        let Some((cons, prod)) = self.rx_cursors() else {
            return (0, false);
        };
        let avail = self.rx.readable(cons, prod).unwrap_or(0);
        let (rx, skip) = self.urg_take(cons, prod);
        if !rx.marked() {
            return (avail, false);
        }
        let cons = self.rx.add(cons, skip);
        let avail = avail.saturating_sub(skip);
        (
            urg::readable(rx, cons, avail, self.oobinline()),
            rx.pending(),
        )
    }

    /// A call that looks at the receive side (`poll`, epoll, `SIOCATMARK`, `FIONREAD`) takes
    /// a newer urgent word into the record, as TCP takes each urgent pointer when it arrives:
    /// the older urgent byte a later one drops (`tcp_check_urg`, at the read position when the
    /// later one came) is known only while the word still names it, and it holds the two
    /// newest (random call sequences with urgent data, seeds 978, 1670: a third urgent byte
    /// after such a look kept the oldest in the stream). Only when the word changed, and not
    /// while a read of ours holds the ring (it takes the word itself).
    pub fn urg_note(&self, fd: i32) {
        if self.own_hdr().load_urg().seq == self.urg_rx().seen || self.rx_on_tcp() {
            return;
        }
        if let Some(_g) = self.sh().rx_lock.try_lock() {
            if !self.rx_on_tcp() {
                if let Some((cons, prod)) = self.rx_cursors() {
                    self.urg_sync(fd, cons, prod);
                }
            }
        }
    }

    /// The reader's urgent record.
    pub(super) fn urg_rx(&self) -> UrgRx {
        UrgRx::from_u64(self.sh().urg_rx.load(Ordering::Acquire))
    }

    /// Both our directions are shut and the peer reset the stream (its abort flag): the
    /// reset its write drew (TCP in FIN_WAIT with `RCV_SHUTDOWN`, `Conn::send`), whose
    /// urgent byte may lie past the producer cursor.
    fn reset_by_urgent_write(&self) -> bool {
        self.flags() & (F_SHUT_RD | F_SHUT_WR) == F_SHUT_RD | F_SHUT_WR
            && self.peer_state().contains(ConnStateFlags::PEER_CONN_ABORT)
    }

    /// `SO_OOBINLINE`, as the kernel holds it for the socket ([`F_OOBINLINE`]).
    pub(super) fn oobinline(&self) -> bool {
        self.flags() & F_OOBINLINE != 0
    }

    /// Takes `SO_OOBINLINE` from the socket (`getsockopt`), when the connection is set up.
    pub fn set_oobinline(&self, fd: i32) {
        self.note_oobinline(
            self.sockopt_int(fd, libc::SO_OOBINLINE)
                .is_some_and(|v| v != 0),
        );
    }

    /// The program's `setsockopt(SO_OOBINLINE)` succeeded with `on`: urgent bytes that arrived
    /// before it are taken first under the old setting, as TCP took them when they arrived
    /// (`tcp_check_urg` keeps an older urgent byte at the read position in the stream while
    /// inline, drops it when not; random call sequences with urgent data, seed 351: a peek
    /// after inline was turned off missed the older byte TCP had kept). Not while another
    /// call of ours reads (it takes them itself, under the setting it finds).
    pub fn oobinline_changed(&self, fd: i32, on: bool) {
        if on != self.oobinline() && !self.rx_on_tcp() {
            if let Some(_g) = self.sh().rx_lock.try_lock() {
                if !self.rx_on_tcp() {
                    if let Some((cons, prod)) = self.rx_cursors() {
                        self.urg_sync(fd, cons, prod);
                    }
                }
            }
        }
        self.note_oobinline(on);
    }

    /// `SO_OOBINLINE` is `on` for the socket.
    pub fn note_oobinline(&self, on: bool) {
        if on {
            self.set_flag(F_OOBINLINE);
        } else {
            self.sh().flags.fetch_and(!F_OOBINLINE, Ordering::AcqRel);
        }
    }

    /// Takes `TCP_INQ` from the socket (`getsockopt`), when the connection is set up.
    pub fn set_tcp_inq(&self, fd: i32) {
        let on = self
            .sockopt_int_at(fd, libc::IPPROTO_TCP, libc::TCP_INQ)
            .is_some_and(|v| v != 0);
        self.note_tcp_inq(on);
    }

    /// `setsockopt(TCP_INQ)` succeeded on the socket with this value.
    pub fn note_tcp_inq(&self, on: bool) {
        if on {
            self.set_flag(F_TCP_INQ);
        } else {
            self.sh().flags.fetch_and(!F_TCP_INQ, Ordering::AcqRel);
        }
    }

    /// The `TCP_CM_INQ` value a `recvmsg` reports, `None` when `TCP_INQ` is off: as
    /// `tcp_inq_hint`, the bytes still queued, plus one once the peer's FIN came (its sequence
    /// number counts until read; at the end of the stream the value is 1).
    pub fn inq_hint(&self) -> Option<i32> {
        if self.flags() & F_TCP_INQ == 0 {
            return None;
        }
        let ps = self.peer_state();
        let avail = self
            .rx_cursors()
            .and_then(|(cons, prod)| self.rx.readable(cons, prod).ok())
            .unwrap_or(0);
        let fin = ps.any_close_or_done() && !ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        Some((avail as i32).saturating_add(i32::from(fin)))
    }

    /// The reader's urgent record with the writer's newest urgent word taken, for a reader at
    /// `cons` holding the producer cursor `prod` (loaded before the word), and the bytes TCP
    /// drops at `cons` on the way (older urgent bytes, see [`urg::arrival`]). Nothing is
    /// stored: [`Conn::urg_sync`] does, under `rx_lock`.
    pub(super) fn urg_take(&self, cons: Cursor, prod: Cursor) -> (UrgRx, u32) {
        let rx = self.urg_rx();
        if self.flags() & F_STASH != 0 {
            // The peer's urgent words are about the rings it no longer writes.
            return (rx, 0);
        }
        let w = self.own_hdr().load_urg();
        if w.seq == 0 || w.seq == rx.seen {
            return (rx, 0);
        }
        let inline = self.oobinline();
        let mut avail = self.rx.readable(cons, prod).unwrap_or(0);
        let mut a = urg::arrival(self.rx, rx, cons, avail, w, inline);
        if a == urg::Arrival::NotYet {
            // The writer stores the word right before the producer cursor that covers its
            // byte: a newer cursor is a moment away.
            for _ in 0..SNAPSHOT_TRIES {
                std::hint::spin_loop();
                if let Some((_, p)) = self.rx_cursors() {
                    avail = self.rx.readable(cons, p).unwrap_or(avail);
                }
                a = urg::arrival(self.rx, rx, cons, avail, w, inline);
                if a != urg::Arrival::NotYet {
                    break;
                }
            }
            if a == urg::Arrival::NotYet && self.reset_by_urgent_write() {
                // The write that drew our reset named its urgent byte past the producer
                // cursor (`Conn::send`): TCP took that segment's urgent pointer before it
                // dropped the text and reset. Its mark is taken as if the byte were there; no
                // read reaches past the cursor (what is skipped stays within the bytes there).
                if let urg::Arrival::New { skip, rx } =
                    urg::arrival(self.rx, rx, cons, self.rx.len(), w, inline)
                {
                    a = urg::Arrival::New {
                        skip: skip.min(avail),
                        rx,
                    };
                }
            }
            if a == urg::Arrival::NotYet {
                // Still not: the urgent byte before it may be under the cursor.
                if let Some(pw) = urg::previous(w) {
                    a = urg::arrival(self.rx, rx, cons, avail, pw, inline);
                }
            }
        }
        match a {
            urg::Arrival::New { skip, mut rx } => {
                rx.byte = self.ring_byte(rx.pos);
                (rx, skip)
            }
            urg::Arrival::Invalid => {
                crate::debug!(
                    "{}: urgent word {w:?} ignored (outside the unread bytes)",
                    self.describe()
                );
                (UrgRx { seen: w.seq, ..rx }, 0)
            }
            urg::Arrival::Nothing | urg::Arrival::NotYet => (rx, 0),
        }
    }

    /// Under `rx_lock`, for a reader at `cons` holding the producer cursor `prod`: takes the
    /// writer's newest urgent word into the record (dropping the older urgent bytes TCP drops,
    /// which moves the consumer cursor) and returns the consumer cursor and the record.
    pub(super) fn urg_sync(&self, fd: i32, cons: Cursor, prod: Cursor) -> (Cursor, UrgRx) {
        let old = self.urg_rx();
        let (rx, skip) = self.urg_take(cons, prod);
        let mut cons = cons;
        if skip > 0 {
            cons = self.rx.add(cons, skip);
            self.sh().cons.store(pack(cons), Ordering::Release);
            let empty = self.rx.readable(cons, prod).map_or(true, |n| n == 0);
            self.after_consume(fd, cons, empty);
        }
        if rx != old {
            self.sh().urg_rx.store(rx.to_u64(), Ordering::Release);
        }
        (cons, rx)
    }

    /// Stores the reader's urgent record (under `rx_lock`).
    pub(super) fn set_urg_rx(&self, rx: UrgRx) {
        self.sh().urg_rx.store(rx.to_u64(), Ordering::Release);
    }

    /// The byte at `pos` in our ring.
    fn ring_byte(&self, pos: Cursor) -> u8 {
        let off = self.rx.offset(pos);
        // SAFETY: `own` is our mapped DMB, longer than its CDC header; `off` is below the
        // ring's length (`Ring::offset`), so the byte is inside the mapping. Read volatile:
        // the memory is shared (the writer does not write bytes it has published).
        unsafe {
            std::ptr::read_volatile(self.own.as_ptr().add(smc_common::cdc::CDC_HEADER_LEN + off))
        }
    }

    /// Room in the peer's ring.
    pub(super) fn room(&self) -> u32 {
        match self.tx_cursors() {
            Some((prod, c)) => self.tx.free_space(prod, c).unwrap_or(0),
            None => 0,
        }
    }

    /// Publish our consumer cursor into the peer's header (keeping the flags there).
    pub(super) fn publish_cons(&self, c: Cursor) {
        let w = self.peer_hdr().cons_atomic();
        let mut old = w.load(Ordering::Relaxed);
        loop {
            let mut cw = CursorWord::from_u64(old);
            cw.cursor = c;
            match w.compare_exchange_weak(old, cw.to_u64(), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(o) => old = o,
            }
        }
        self.sh().cons_pub.store(pack(c), Ordering::Release);
    }

    pub(super) fn update_peer_flags(&self, set_p: u8, clr_p: u8, set_s: u8) {
        let w = self.peer_hdr().cons_atomic();
        let mut old = w.load(Ordering::Relaxed);
        loop {
            let mut cw = CursorWord::from_u64(old);
            cw.prod_flags = ProdFlags((cw.prod_flags.0 | set_p) & !clr_p);
            cw.conn_state = ConnStateFlags(cw.conn_state.0 | set_s);
            let new = cw.to_u64();
            if new == old {
                return;
            }
            match w.compare_exchange_weak(old, new, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return,
                Err(o) => old = o,
            }
        }
    }

    /// Cursor snapshot for diagnostics: (cons, cons_pub, peer_prod, prod, peer_cons).
    pub fn cursors(&self) -> [Cursor; 5] {
        let s = self.sh();
        [
            unpack(s.cons.load(Ordering::Relaxed)),
            unpack(s.cons_pub.load(Ordering::Relaxed)),
            unpack(s.peer_prod.load(Ordering::Relaxed)),
            unpack(s.prod.load(Ordering::Relaxed)),
            unpack(s.peer_cons.load(Ordering::Relaxed)),
        ]
    }

    /// `TCP_INFO`'s byte counts of the stream (`tcpi_bytes_sent`, `tcpi_bytes_acked`,
    /// `tcpi_bytes_received`), as TCP counts them over loopback: what we put into the peer's
    /// ring is sent and acknowledged (it sits in the peer's receive queue), plus a client's
    /// SYN (a server's SYN-ACK is acknowledged in SYN_RECV, where `tcp_rcv_state_process` does
    /// not count it) and our FIN, once sent and not reset; what the
    /// peer put into ours is received, read or not. From the cursors (both start at 0 and only
    /// move forward; `Shared::rx_bytes`/`tx_bytes` are statistics a fork takes away): exact
    /// up to 2^16 times the ring's size (then they start again from 0, as the cursors' wrap
    /// counts do). `None` on a protocol violation.
    pub fn tcp_bytes(&self) -> Option<(u64, u64, u64)> {
        let total = |c: Cursor, len: u32| u64::from(c.wrap) * u64::from(len) + u64::from(c.count);
        let (prod, _) = self.tx_cursors()?;
        let (_, peer_prod) = self.rx_cursors()?;
        let sent = total(prod, self.tx.len());
        let fin = self
            .stream_ends()
            .is_some_and(|(reset, our_fin, _)| our_fin && !reset);
        Some((
            sent,
            sent + u64::from(self.role == Role::Client) + u64::from(fin),
            total(peer_prod, self.rx.len()),
        ))
    }

    /// Edge-detection token for epoll ET emulation: changes whenever the peer moved a cursor
    /// or a flag that matters.
    pub fn edge_token(&self) -> (u64, u64) {
        // Only our own calls' flags: the doorbell channel's EOF or reset follows the peer's
        // flags (already an edge), and a new readiness bit is an edge by itself.
        let own = self.flags() & (F_SHUT_RD | F_SHUT_WR | F_WROTE_AFTER_CLOSE);
        (
            self.own_hdr().prod_atomic().load(Ordering::Acquire) ^ ((own as u64) << 40),
            self.own_hdr().cons_atomic().load(Ordering::Acquire),
        )
    }
}
