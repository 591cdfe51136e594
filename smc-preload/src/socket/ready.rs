//! Readiness of one SMC connection, shared by the `poll`/`select` emulation ([`crate::poll`])
//! and the epoll emulation ([`crate::epoll`]): the event bits, the mask computed from the
//! rings ([`conn_mask`]), arming the wakeups before a sleep ([`arm`]), the spin policy of the
//! waits, their deadlines, and draining the doorbells of a wait that is over ([`settle`]).

use crate::conn::Conn;
use crate::fdtable::InCall;
use crate::obj::Obj;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const IN: u32 = libc::EPOLLIN as u32;
pub const OUT: u32 = libc::EPOLLOUT as u32;
pub const ERR: u32 = libc::EPOLLERR as u32;
pub const HUP: u32 = libc::EPOLLHUP as u32;
pub const RDHUP: u32 = libc::EPOLLRDHUP as u32;
pub const PRI: u32 = libc::EPOLLPRI as u32;
pub const RDNORM: u32 = libc::EPOLLRDNORM as u32;
pub const WRNORM: u32 = libc::EPOLLWRNORM as u32;

/// While a handshake is undecided, a blocking `poll` or `epoll_wait` wakes at least this often
/// to let one whose peer went quiet time out (and fall back) as it would in a read.
pub const HS_TICK_MS: i32 = 100;

/// Readiness of an SMC connection as epoll/poll bits (they share values).
pub fn conn_mask(c: &Conn) -> u32 {
    if c.on_tcp_with_stash() {
        // What our ring says: the bytes the switch read; the rest is the socket's
        // ([`conn_mask_at`]).
        return IN | RDNORM;
    }
    let r = c.readiness();
    let mut m = 0;
    // SO_RCVLOWAT: readable from that many bytes on (tcp_poll), or at EOF/error.
    if (r.readable > 0 && r.readable >= c.rcvlowat()) || r.rd_eof || r.error {
        m |= IN | RDNORM;
    }
    if r.rcv_shut || r.error {
        m |= RDHUP;
    }
    if r.writable > 0 || r.wr_closed {
        m |= OUT | WRNORM;
    }
    // An error pending, or completions of `send(MSG_ZEROCOPY)` on the error queue.
    if r.error || c.take_zerocopy(false).is_some() {
        m |= ERR;
    }
    // Urgent data not read yet (tcp_poll: `urg_data & TCP_URG_VALID`).
    if r.urgent {
        m |= PRI;
    }
    if r.hup {
        m |= HUP;
    }
    m
}

/// [`conn_mask`] of connection `c` named by `fd`, with the socket's own answer for a
/// connection that continues on TCP with bytes its switch read still in our ring
/// ([`Conn::on_tcp_with_stash`]): readable for those, and writable, urgent, at its end or
/// failed as one `poll` of the socket without waiting says. Before, such a connection said
/// writable at once, and a writer paced by `poll(POLLOUT)` spun (red team round 21 `wbusy`:
/// 1 064 491 `EAGAIN` in 2 s; TCP sleeps).
pub fn conn_mask_at(c: &Conn, fd: i32) -> u32 {
    c.urg_note(fd);
    let m = conn_mask(c);
    if !c.on_tcp_with_stash() {
        return m;
    }
    let mut p = libc::pollfd {
        fd: c.io_now(fd),
        events: (OUT | WRNORM | PRI | RDHUP) as i16,
        revents: 0,
    };
    let e0 = crate::real::errno();
    // SAFETY: one live pollfd; no wait.
    let r = unsafe { crate::real::poll(&mut p, 1, 0) };
    crate::real::set_errno(e0);
    let k = if r > 0 { p.revents as u16 as u32 } else { 0 };
    m | (k & (OUT | WRNORM | PRI | RDHUP | ERR | HUP))
}

/// Arm the wakeups of `c` for the events the caller waits for, then recheck. A connection
/// that continues on TCP arms nothing: its socket's events wake the waiter.
pub fn arm(c: &Conn, fd: i32, events: u32) -> u32 {
    if c.on_tcp_with_stash() {
        return conn_mask_at(c, fd);
    }
    c.arm(
        fd,
        events & (IN | RDNORM | RDHUP | PRI) != 0,
        events & (OUT | WRNORM) != 0,
    );
    conn_mask(c)
}

/// Process-wide spin policy of poll/select/epoll waits.
static SPIN: crate::conn::Spin = crate::conn::Spin::new();

pub fn spin_budget() -> u64 {
    SPIN.budget()
}

pub fn spin_result(hit: bool) {
    SPIN.record(hit)
}

/// Remaining milliseconds until `deadline` for a real poll (-1: infinite).
pub fn remaining_ms(deadline: Option<Instant>) -> i32 {
    match deadline {
        None => -1,
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                0
            } else {
                ((d - now).as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
            }
        }
    }
}

pub fn deadline_ms(timeout: i32) -> Option<Instant> {
    if timeout < 0 {
        None
    } else {
        Some(Instant::now() + Duration::from_millis(timeout as u64))
    }
}

/// Waits until the doorbells that this thread's last sleep left to the other sleepers of a
/// connection (`(obj, fd, wake_seq)`, from [`Conn::sleep_leave`]) are drained — they were woken
/// by them, the last of them drains — so that the next sleep on those sockets does not return
/// at once. At most [`crate::conn::SETTLE_MAX_MS`], then they are drained anyway. Stops early
/// (true) when `ready` says the wait is over for other reasons.
pub fn settle(pending: &mut Vec<(Arc<Obj>, i32, u32)>, mut ready: impl FnMut() -> bool) -> bool {
    // Held as calls in flight; a connection whose number was closed meanwhile (and that has
    // no private duplicate of its socket) is not drained through that number.
    let mut calls = Vec::with_capacity(pending.len());
    pending.retain(|(o, fd, _)| match InCall::enter(*fd, o.clone()) {
        Some(call) => {
            calls.push(call);
            true
        }
        None => o.conn().is_some_and(|c| c.io_redirected()),
    });
    let start = Instant::now();
    loop {
        pending.retain(|(o, fd, seq)| !o.conn().is_some_and(|c| c.settled(*fd, *seq)));
        let Some((o, fd, seq)) = pending.first() else {
            return false;
        };
        if ready() {
            return true;
        }
        if start.elapsed() >= Duration::from_millis(crate::conn::SETTLE_MAX_MS) {
            for (o, fd, _) in pending.drain(..) {
                if let Some(c) = o.conn() {
                    c.force_drain(fd);
                }
            }
            return false;
        }
        if let Some(c) = o.conn() {
            c.await_settled(*fd, *seq, 1);
        }
    }
}
