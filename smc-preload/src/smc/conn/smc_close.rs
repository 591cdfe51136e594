//! smc_close: `shutdown`, the references of the fds that name the connection, and its final
//! close.

use super::*;

impl Conn {
    /// shutdown(2).
    pub fn shutdown(&self, fd: i32, how: i32) -> Result<(), Errno> {
        let f = match how {
            libc::SHUT_RD => F_SHUT_RD,
            libc::SHUT_WR => F_SHUT_WR,
            libc::SHUT_RDWR => F_SHUT_RD | F_SHUT_WR,
            _ => return Err(libc::EINVAL),
        };
        let old = self.set_flag(f);
        if f & F_SHUT_WR != 0 && old & F_SHUT_WR == 0 {
            // Wait for in-flight writers so the flag follows their last cursor.
            let _g = self.sh().tx_lock.lock();
            self.update_peer_flags(0, 0, ConnStateFlags::PEER_DONE_WRITING.0);
            self.after_produce(fd);
            // The reader may sleep without WAIT_DATA if it saw no data yet: ring anyway when
            // it announced itself.
        }
        let now = old | f;
        if now & (F_SHUT_RD | F_SHUT_WR) == (F_SHUT_RD | F_SHUT_WR) && old & F_REAL_SHUT == 0 {
            // Neither direction needs doorbells any more: shut the TCP socket too, which also
            // wakes local threads sleeping on it.
            self.set_flag(F_REAL_SHUT);
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
        }
        Ok(())
    }

    /// The last fd of this connection (in every process) is being closed.
    pub fn final_close(&self, fd: i32) {
        let old = self.set_flag(F_CLOSED);
        if old & F_CLOSED != 0 {
            return;
        }
        // Unread data, or SO_LINGER {1, 0}: TCP sends a reset, the peer sees ECONNRESET.
        let unread = self.avail();
        let linger0 = linger_zero(fd);
        if unread > 0 || linger0 {
            crate::debug!(
                "fd {fd}: closed with {unread} unread bytes{}: abort (the peer gets \
                 ECONNRESET): {}",
                if linger0 { " and SO_LINGER {1, 0}" } else { "" },
                self.describe()
            );
        }
        let st = if unread > 0 || linger0 {
            ConnStateFlags::PEER_CONN_ABORT.0 | ConnStateFlags::PEER_CONN_CLOSED.0
        } else {
            ConnStateFlags::PEER_CONN_CLOSED.0 | ConnStateFlags::PEER_DONE_WRITING.0
        };
        {
            let _g = self.sh().tx_lock.lock();
            self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, st);
        }
        // Wake the peer if it waits; the TCP FIN that follows wakes it too.
        if self
            .peer_wait()
            .fetch_and(!(WAIT_DATA | WAIT_SPACE), Ordering::SeqCst)
            != 0
        {
            self.ring_doorbell(fd);
        }
        // Unread doorbells in our receive queue would turn our FIN into a RST.
        self.drain(fd);
        // Last: from here on the DMBs and the state page may be pooled and bound to another
        // connection (see `F_CLOSE_DONE`).
        self.set_flag(F_CLOSE_DONE);
    }

    /// Count one more fd referring to this connection (dup, fork).
    pub fn add_ref(&self, n: u32) {
        self.sh().refs.fetch_add(n, Ordering::AcqRel);
    }

    /// Drop one fd reference; true if it was the last one anywhere.
    pub fn drop_ref(&self) -> bool {
        let s = self.sh();
        let mut old = s.refs.load(Ordering::Acquire);
        loop {
            if old == 0 {
                return false;
            }
            match s
                .refs
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return old == 1,
                Err(o) => old = o,
            }
        }
    }

    /// Drop one fd reference unless it is the last one anywhere; whether it was dropped.
    pub fn drop_ref_unless_last(&self) -> bool {
        let s = self.sh();
        let mut old = s.refs.load(Ordering::Acquire);
        while old > 1 {
            match s
                .refs
                .compare_exchange_weak(old, old - 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return true,
                Err(o) => old = o,
            }
        }
        false
    }
}
