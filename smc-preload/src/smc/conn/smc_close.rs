//! smc_close: `shutdown`, the references of the fds that name the connection, and its final
//! close.
//!
//! As a TCP socket, an SMC connection lives as long as its open file: while an fd names it
//! (in any process, `Shared::refs`) and while a call that started on it is under way — a
//! blocked `recv` keeps it open after another thread closed the number (the kernel's `fdget`
//! holds the file). Here a call registers ([`Conn::call_enter`]); a close of a number while
//! calls of this process are in flight leaves its reference to the last of them
//! ([`Conn::defer_close`], [`Conn::call_leave`]), which then makes the final close. From that
//! close on, the number may name another file at any moment: our own I/O on the socket (the
//! doorbells, their drains, the waits, the socket options we read) goes through a private
//! duplicate of the socket ([`Conn::with_io`]), made before the number was closed and closed
//! with the connection's object (as the kernel drops the call's file reference).

use super::*;

const CALLS: u64 = 0xFFFF_FFFF;
const DEFERRED: u64 = 1 << 32;

impl Conn {
    /// Runs `f` with the descriptor our I/O on the socket goes through: `fd` (the number of the
    /// call), or, once a number of the connection was closed while it stayed in use, the
    /// private duplicate of the socket ([`Conn::set_private_io`] waits for every call made
    /// through a number before that number may close). Only for short, non-blocking calls.
    #[inline]
    pub fn with_io<R>(&self, fd: i32, f: impl FnOnce(i32) -> R) -> R {
        self.io.with(fd, f)
    }

    /// The descriptor a sleep in `poll` uses (see [`crate::util::io_path::IoPath::now`]).
    #[inline]
    pub fn io_now(&self, fd: i32) -> i32 {
        self.io.now(fd)
    }

    /// The private duplicate of the socket, if one was made.
    pub fn private_io(&self) -> Option<i32> {
        self.io.private()
    }

    /// Whether our I/O no longer goes through the caller's number.
    pub fn io_redirected(&self) -> bool {
        self.io.redirected()
    }

    /// Whether no descriptor of this process names the socket for us any more.
    pub fn io_gone(&self) -> bool {
        self.io.gone()
    }

    /// From now on our I/O goes through `p` (see [`crate::util::io_path::IoPath::set_private`]).
    pub fn set_private_io(&self, p: i32) -> bool {
        self.io.set_private(p)
    }

    /// Moves our I/O from the private duplicate `old` to `new` (see [`crate::util::io_path::IoPath::move_private`]).
    pub fn move_private_io(&self, old: i32, new: i32) -> bool {
        self.io.move_private(old, new)
    }

    /// Takes the private duplicate for closing (the connection's object goes).
    pub fn take_private_io(&self) -> Option<i32> {
        self.io.take_private()
    }

    /// A call of this process starts on the connection (it holds the connection open, as the
    /// kernel's `fdget` holds the file). The caller checks afterwards that its number still
    /// names the connection, else it leaves at once: a close that did not see it may have
    /// dropped the reference already.
    #[inline]
    pub fn call_enter(&self) {
        self.users.fetch_add(1, Ordering::SeqCst);
    }

    /// The call ends. Returns the fd references closed under the calls in flight that the
    /// caller, the last of them, must now drop (each as a close would).
    #[inline]
    #[must_use]
    pub fn call_leave(&self) -> u32 {
        let mut u = self.users.fetch_sub(1, Ordering::SeqCst).wrapping_sub(1);
        loop {
            if u & CALLS != 0 || u < DEFERRED {
                return 0;
            }
            match self
                .users
                .compare_exchange(u, 0, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return (u >> 32) as u32,
                Err(now) => u = now,
            }
        }
    }

    /// A number of this process that named the connection was closed (its slot is already
    /// empty): when calls of this process are in flight, its reference stays until the last
    /// of them returns ([`Conn::call_leave`]) and this says true; false: drop it now.
    pub fn defer_close(&self) -> bool {
        let mut u = self.users.load(Ordering::SeqCst);
        loop {
            if u & CALLS == 0 {
                return false;
            }
            match self
                .users
                .compare_exchange(u, u + DEFERRED, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return true,
                Err(now) => u = now,
            }
        }
    }

    /// Whether calls of this process are in flight on the connection.
    pub fn calls_in_flight(&self) -> bool {
        self.users.load(Ordering::SeqCst) & CALLS != 0
    }

    /// A number of this process's fd table names the connection now (`add`) or no more;
    /// returns how many name it after the change.
    pub fn count_number(&self, add: bool) -> u32 {
        if add {
            self.numbers.fetch_add(1, Ordering::AcqRel) + 1
        } else {
            let mut n = self.numbers.load(Ordering::Acquire);
            while n > 0 {
                match self.numbers.compare_exchange_weak(
                    n,
                    n - 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => return n - 1,
                    Err(o) => n = o,
                }
            }
            0
        }
    }

    /// Numbers of this process's fd table that name the connection.
    pub fn numbers(&self) -> u32 {
        self.numbers.load(Ordering::Acquire)
    }

    /// In a forked child: the calls in flight were the parent's threads' (they do not exist
    /// here), and so were the references they held back.
    pub fn forget_calls_after_fork(&self) {
        self.users.store(0, Ordering::SeqCst);
        self.io.forget_calls_after_fork();
    }
}

/// TCP states as `tcp_info.tcpi_state` numbers them (`include/net/tcp_states.h`).
pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_FIN_WAIT2: u8 = 5;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_CLOSE_WAIT: u8 = 8;

impl Conn {
    /// The state a TCP socket would be in after what this stream went through, as
    /// `TCP_INFO`'s `tcpi_state` and the calls that look at it (`getpeername`, `shutdown`)
    /// show it; `None` once the connection continues on TCP (the socket's own state is the
    /// truth then). Our TCP socket sees none of the stream's ends (a `shutdown` goes into the
    /// CDC header, a reset too): it stays ESTABLISHED, or CLOSE_WAIT after the peer's close.
    ///
    /// On loopback the peer's kernel acknowledges a FIN at once (or within its delayed-ACK
    /// time, `TCP_DELACK_MIN`), so the transient states (FIN_WAIT1, LAST_ACK, CLOSING) are
    /// never shown: after our `SHUT_WR` FIN_WAIT2, after the peer's CLOSE_WAIT, after both
    /// CLOSE (TCP's socket went to TIME_WAIT, whose full socket `tcp_done` leaves in CLOSE, or
    /// through LAST_ACK to CLOSE), and after a reset either way (the peer's abort, our write
    /// after its close or its `SHUT_RDWR`, a protocol error) CLOSE (`tcp_reset`). The peer's
    /// `SHUT_RD` or ours sends nothing: no change.
    pub fn tcp_state(&self) -> Option<u8> {
        let (reset, our_fin, peer_fin) = self.stream_ends()?;
        Some(match (reset, our_fin, peer_fin) {
            (true, _, _) | (false, true, true) => TCP_CLOSE,
            (false, true, false) => TCP_FIN_WAIT2,
            (false, false, true) => TCP_CLOSE_WAIT,
            (false, false, false) => TCP_ESTABLISHED,
        })
    }

    /// How the stream ended so far: (reset either way, our FIN (`SHUT_WR`), the peer's FIN
    /// or close); `None` once the connection continues on TCP.
    pub(super) fn stream_ends(&self) -> Option<(bool, bool, bool)> {
        let f = self.flags();
        if f & F_TO_TCP != 0 {
            return None;
        }
        let ps = self.peer_state();
        let abort = ps.contains(ConnStateFlags::PEER_CONN_ABORT);
        let graceful = ps.any_close_or_done() && !abort;
        let reset =
            abort || f & (F_PROTO | F_WROTE_AFTER_CLOSE) != 0 || (f & F_PEER_RST != 0 && !graceful);
        let peer_fin = ps.any_close_or_done() || f & (F_PEER_GONE | F_PEER_RST) != 0;
        Some((reset, f & F_SHUT_WR != 0, peer_fin))
    }

    /// The stream was reset and no FIN of the peer came before (TCP: CLOSE without
    /// `SOCK_DONE`, which only `tcp_fin` sets): the peer aborted (a close with our bytes
    /// unread, `SO_LINGER {1, 0}`) or its process ended with them unread, or a protocol error.
    pub(super) fn reset_without_fin(&self) -> bool {
        let Some((reset, _, _)) = self.stream_ends() else {
            return false;
        };
        let ps = self.peer_state();
        let fin = ps.contains(ConnStateFlags::PEER_DONE_WRITING)
            || (ps.contains(ConnStateFlags::PEER_CONN_CLOSED)
                && !ps.contains(ConnStateFlags::PEER_CONN_ABORT))
            || self.flags() & (F_PEER_GONE | F_PEER_RST) == F_PEER_GONE;
        reset && !fin
    }

    /// shutdown(2).
    pub fn shutdown(&self, fd: i32, how: i32) -> Result<(), Errno> {
        let f = match how {
            libc::SHUT_RD => F_SHUT_RD,
            libc::SHUT_WR => F_SHUT_WR,
            libc::SHUT_RDWR => F_SHUT_RD | F_SHUT_WR,
            _ => return Err(libc::EINVAL),
        };
        // A stream already reset: TCP's socket is in CLOSE, where `inet_shutdown` shuts it
        // (and says ENOTCONN) but `tcp_shutdown` sends nothing: the peer learns of no FIN.
        // Before, our `peer_done_writing` reached a peer whose stream this end's write had
        // reset, and it read that as a FIN before the reset: 0 where TCP says ECONNRESET
        // (random call sequences, seeds 2356, 2631).
        let silent = matches!(self.stream_ends(), Some((true, _, _)));
        let old = self.set_flag(f);
        if silent {
            // Nothing for the peer. The reset's error stays the one it left (random call
            // sequences, seed 3181: EPIPE in CLOSE_WAIT, where a write after this shutdown
            // said ECONNRESET).
            if f & F_SHUT_WR != 0 && old & F_SHUT_WR == 0 {
                self.set_flag(F_SHUT_WR_AFTER_RESET);
            }
        } else if f & F_SHUT_RD != 0 && old & F_SHUT_RD == 0 {
            // The writer learns that new bytes would be answered with a reset once we shut
            // our writing too ([`PEER_DONE_READING`]); what it wrote before stays readable.
            self.update_peer_flags(0, 0, PEER_DONE_READING);
        }
        if f & F_SHUT_WR != 0 && old & F_SHUT_WR == 0 && !silent {
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
            self.with_io(fd, |io| unsafe { real::shutdown(io, libc::SHUT_RDWR) });
        }
        Ok(())
    }

    /// The last fd of this connection (in every process) is being closed.
    pub fn final_close(&self, fd: i32) {
        let old = self.set_flag(F_CLOSED);
        if old & F_CLOSED != 0 {
            return;
        }
        // Unread data, or SO_LINGER {1, 0}: TCP sends a reset, the peer sees ECONNRESET. Not
        // once both FINs went (our `SHUT_WR` and the peer's end, no reset), nor once the peer
        // reset the stream (its abort, our write after its close): that socket is in CLOSE
        // (TIME_WAIT's full socket, after LAST_ACK, or `tcp_reset`), whose close sends
        // nothing (random call sequences, seeds 360, 374, 396: the peer's `SO_ERROR` said
        // ECONNRESET after such a close, a second error where TCP has reported its one). A
        // protocol error of ours still aborts.
        let ends = self.stream_ends();
        let done_both_ways = match ends {
            Some((false, true, true)) => true,
            Some((true, _, _)) => self.flags() & F_PROTO == 0,
            _ => false,
        };
        // After a reset our socket sends no FIN either: the close says only closed, never
        // `peer_done_writing` for the first time, which the peer would read as a FIN that came
        // before the reset (end of stream) — our write drew the reset of a peer that shut
        // both ways, and its reads must say ECONNRESET, as TCP's, which dropped the bytes
        // and reset (random call sequences, seeds 303, 328: the read said 0).
        let reset = matches!(ends, Some((true, _, _)));
        let unread = if done_both_ways { 0 } else { self.avail() };
        let linger0 = !done_both_ways && self.with_io(fd, linger_zero);
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
        } else if reset {
            ConnStateFlags::PEER_CONN_CLOSED.0
        } else {
            ConnStateFlags::PEER_CONN_CLOSED.0 | ConnStateFlags::PEER_DONE_WRITING.0
        };
        {
            let _g = self.sh().tx_lock.lock();
            self.update_peer_flags(0, ProdFlags::WRITE_BLOCKED.0, st);
        }
        // Wake the peer if it waits for data; the TCP FIN that follows wakes it too. A peer
        // that closed its end waits for nothing, whatever wait it announced last: a doorbell
        // would reach a closed socket, which answers it with a reset in place of our FIN (seen
        // in a capture). `WAIT_SPACE` is our own writers' bit (no one of ours waits any more),
        // and the word's other bits (control counts, `O_ASYNC`) ask for no doorbell: one rung
        // for them reached a server that had not read our Confirm yet ahead of it, through
        // the `sk_msg` shortcut, and the server read it as a broken CLC message and reset the
        // connection (conformance `close_with_ring_full_before_server_confirms`).
        let ps = self.peer_state();
        let peer_closed = ps.contains(ConnStateFlags::PEER_CONN_CLOSED)
            || ps.contains(ConnStateFlags::PEER_CONN_ABORT)
            || self.flags() & F_PEER_GONE != 0;
        if self
            .peer_wait()
            .fetch_and(!(WAIT_DATA | WAIT_SPACE), Ordering::SeqCst)
            & WAIT_DATA
            != 0
            && !peer_closed
        {
            self.ring_doorbell(fd);
        }
        // Unread doorbells in our receive queue would turn our FIN into a RST.
        self.drain(fd);
        self.pass_urgent_doorbell(fd);
        // Last: from here on the DMBs and the state page may be pooled and bound to another
        // connection (see `F_CLOSE_DONE`).
        self.set_flag(F_CLOSE_DONE);
    }

    /// Whether one fd reference is left anywhere (this process's close of it is the last).
    pub fn last_holder(&self) -> bool {
        self.sh().refs.load(Ordering::Acquire) == 1
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
