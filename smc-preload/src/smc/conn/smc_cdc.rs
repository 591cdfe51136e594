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
