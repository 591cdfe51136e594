//! The behaviour behind every interposed libc function. `interpose` only exports thin
//! `extern "C"` wrappers around these, so tests can call them directly.
//!
//! Every function starts with the fast path: an fd whose table slot holds no object goes
//! straight to the real libc function.

#![allow(clippy::missing_safety_doc)]
// Safety of every `pub unsafe fn` here: the pointer arguments are the application's, with the
// meaning and validity the libc function of the same name requires.

use crate::conn::Conn;
use crate::fdtable::InCall;
use crate::fdtable::{self, Slot, TAG_TCP};
use crate::obj::Obj;
use crate::real;
use crate::real::SIOCATMARK;
use crate::setup::SkipWait;
use crate::{daemon, epoll, lifecycle, policy, poll, setup, stats};
use libc::{c_int, c_void, iovec, size_t, sockaddr, socklen_t, ssize_t};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

#[inline]
fn fail(e: c_int) -> ssize_t {
    real::set_errno(e);
    -1
}

#[inline]
fn slow(fd: c_int) -> bool {
    fdtable::raw(fd) >= 8 && !lifecycle::vfork_shadowed(fd)
}

/// The connection object of `fd` if it is SMC, resolving a pending connect or completing a
/// server handshake first.
#[inline]
fn conn_of(fd: c_int) -> Option<Arc<Obj>> {
    conn_of_op(fd, Op::Other)
}

/// `FIONREAD` on a connection that continues on TCP while bytes its switch read wait in our
/// ring (`Conn::stash_left`): those plus what the socket holds, as TCP counts its queue.
fn stashed_inq(fd: c_int) -> Option<c_int> {
    let o = fdtable::get(fd)?;
    let c = o.conn()?;
    if !c.switched() || !c.stash_left() {
        return None;
    }
    let mut q: c_int = 0;
    // SAFETY: FIONREAD writes one int to our local.
    let r = unsafe {
        real::ioctl(
            c.io_now(fd),
            libc::FIONREAD,
            std::ptr::from_mut(&mut q) as u64,
        )
    };
    Some((c.inq() as c_int).saturating_add(if r == 0 { q } else { 0 }))
}

/// Whether `fd` names a connection that continues on TCP with bytes of the stream its switch
/// read from the socket still in our ring (`Conn::stash_left`): [`conn_of`] says `None` for
/// it (everything but a read goes to the socket), but a call that reads it (`splice`,
/// `sendfile` from it) must take those bytes first, through a read ([`hold`] with
/// [`Op::Read`]). Before, they read the socket and skipped the stash (red team rt21 `splice`:
/// 2.5 of 7 MiB, the bytes out of order).
fn stash_at(fd: c_int) -> bool {
    fdtable::get(fd).is_some_and(|o| o.conn().is_some_and(|c| c.stash_left()))
}

/// How long a non-blocking write on an accepted socket waits for its handshake (see
/// [`conn_of_op`]) before it says `EAGAIN`.
const SERVER_WRITE_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// What an operation on an fd whose handshake is under way may wait for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    /// A read (`dontwait`: `MSG_DONTWAIT`): waits for the handshake only when blocking.
    Read { dontwait: bool },
    /// A `MSG_OOB` read: as a read, except that a fallback still skipping the peer's late CLC
    /// messages does not wait for them (urgent data is out of band, the messages in band: TCP
    /// says `EINVAL` at once when nothing urgent is there).
    ReadOob { dontwait: bool },
    /// A write (`dontwait`: `MSG_DONTWAIT` / `SPLICE_F_NONBLOCK`): as a read. A non-blocking
    /// write on a client whose handshake is under way says `EAGAIN`: for the program its
    /// connect is still under way (poll/epoll report it writable once decided); on an accepted
    /// socket it waits at most [`SERVER_WRITE_WAIT`] for the client's Confirm, then `EAGAIN`
    /// (and the fd is writable again once decided).
    Write { dontwait: bool },
    /// Anything else (shutdown, `FIONREAD`, reads of a file into a socket, ...): completes the
    /// handshake first, except a non-blocking client of our own listener (which may be served
    /// by this very thread).
    Other,
}

/// A call whose number another thread closed while the call drove its connection's handshake:
/// the handshake went on, and was decided, on a private duplicate of the socket
/// ([`setup::progress_call`]); the call goes on with the connection there, as a call on TCP
/// goes on with the socket it started on, and the duplicate is closed when the call ends (the
/// reference the application's close left to the call).
struct Moved {
    fd: c_int,
    ino: u64,
}

/// The duplicates calls of this process go on with right now ([`Moved`]): a forked child
/// closes its copies (the calls are its parent's threads', [`conns_after_fork_child`]).
static MOVED: crate::forklock::ForkMutex<Vec<(c_int, u64)>> =
    crate::forklock::ForkMutex::new(Vec::new);

impl Moved {
    fn new(fd: c_int, ino: u64) -> Moved {
        MOVED.lock().push((fd, ino));
        Moved { fd, ino }
    }
}

impl Drop for Moved {
    fn drop(&mut self) {
        MOVED.lock().retain(|&(p, _)| p != self.fd);
        if let Some(o) = fdtable::get(self.fd) {
            if let Obj::Skip(s) = &*o {
                // Late CLC messages already there go before the close: unread, they would
                // make it a reset.
                setup::skip_late_clc(self.fd, self.fd, &o, s);
            }
        }
        crate::fdtable::close_moved(self.fd, self.ino);
    }
}

/// For a call of kind `op` about to look at `fd`: when its socket's handshake is under way, it
/// is driven first, as the call's own lookup would; `Some` when another thread closed the
/// number meanwhile and the connection was decided on our duplicate ([`Moved`]): the caller
/// makes its whole call there instead, as a TCP call goes on with the socket it started on
/// (`tests/redteam/rt7.c`: `sendfile`, `splice`, `sendmmsg`, `recvmmsg`, `shutdown`, `ioctl`).
fn moved_first(fd: c_int, op: Op) -> Option<Moved> {
    if !matches!(fdtable::get(fd).as_deref(), Some(Obj::Handshake(_))) {
        return None;
    }
    conn_of_call(fd, op).err()
}

/// As [`conn_of`], for an operation of kind `op`. `None` with `EAGAIN` set, or `Some` of a
/// handshake still under way with `EAGAIN` set, means: report `EAGAIN`.
#[inline]
fn conn_of_op(fd: c_int, op: Op) -> Option<Arc<Obj>> {
    match conn_of_call(fd, op) {
        Ok(o) => o,
        Err(m) => {
            // This call does not go on with the connection: it closes now, and the call goes
            // to what the number names now.
            drop(m);
            conn_of_op(fd, op)
        }
    }
}

thread_local! {
    /// [`conn_of_call`] switched the connection of a write to TCP just now: the write goes to
    /// the socket, as [`crate::conn::send_fresh`] sends them ([`send_iov`]).
    static WRITE_SWITCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// As [`conn_of_op`], for a call that can go on with the connection on another descriptor
/// when its number was closed under it ([`Moved`]).
#[inline]
fn conn_of_call(fd: c_int, op: Op) -> Result<Option<Arc<Obj>>, Moved> {
    unpark_closes();
    let Some(mut o) = fdtable::get(fd) else {
        return Ok(None);
    };
    if let Obj::Pending(_) = &*o {
        drop(o);
        setup::resolve_pending(fd);
        let Some(n) = fdtable::get(fd) else {
            return Ok(None);
        };
        o = n;
    }
    if let Obj::Conn(c) = &*o {
        // A peer that started a switch to TCP is answered by any operation, also a write or
        // a shutdown that would not read the socket.
        c.notice_switch(fd);
    }
    Ok(match &*o {
        Obj::Conn(c) if c.switching() => {
            // The peer switches the connection to TCP (or it did): our answer first; then
            // the call goes to the socket.
            if crate::lifecycle::continue_on_tcp(fd, &o) {
                if matches!(op, Op::Write { .. }) {
                    WRITE_SWITCHED.with(|w| w.set(true));
                }
                // Bytes of the stream the switch read from the socket: reads take them first.
                let stash = c.stash_left() && matches!(op, Op::Read { .. } | Op::ReadOob { .. });
                stash.then(|| o.clone())
            } else {
                Some(o)
            }
        }
        Obj::Conn(_) => Some(o),
        Obj::Pending(_) => None,
        Obj::Handshake(h) => {
            let nonblock = h.nonblock.load(Ordering::Relaxed);
            let wait = match op {
                Op::Read { dontwait } | Op::ReadOob { dontwait } | Op::Write { dontwait }
                    if !dontwait && !nonblock =>
                {
                    Some(None)
                }
                // An accepted socket is writable at once, as on TCP: its client's Confirm is
                // normally a moment away, so a non-blocking write waits a little for it
                // rather than say EAGAIN where TCP would not.
                Op::Write { .. } if h.server && h.out_while_undecided() => {
                    Some(Some(std::time::Instant::now() + SERVER_WRITE_WAIT))
                }
                Op::Read { .. } | Op::ReadOob { .. } | Op::Write { .. } => None,
                Op::Other => (h.server || !h.peer_local || !nonblock).then_some(None),
            };
            // (Not a write: TCP's takes its bytes at once, never interrupted.)
            let blocking_read = wait == Some(None) && matches!(op, Op::Read { .. });
            let decided = if blocking_read {
                crate::signals::interruptible(|| setup::progress_call(fd, h, wait))
            } else {
                setup::progress_call(fd, h, wait)
            }
                // A non-blocking write before the Accept: TCP takes the bytes at once.
                || (matches!(op, Op::Write { .. })
                    && wait.is_none()
                    && !h.server
                    && setup::write_before_accept(fd, h));
            if !decided {
                // Still waiting for the peer: nothing to read yet, no room to write yet.
                if matches!(op, Op::Write { .. }) {
                    h.write_waits.store(true, Ordering::Relaxed);
                }
                // A blocking read whose wait a signal ended (its handler ran, no
                // `SA_RESTART`): EINTR, as TCP's says (red team round 31 `rt31x_eintr.c
                // recv`: the read waited on for ever, 3 of 3).
                let intr =
                    blocking_read && crate::signals::caught() && crate::signals::interrupted();
                real::set_errno(if intr { libc::EINTR } else { libc::EAGAIN });
                return Ok(Some(o));
            }
            let moved = h.moved.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((fd, ino)) = moved {
                return Err(Moved::new(fd, ino));
            }
            drop(o);
            // Decided: SMC-D, plain TCP, or a fallback whose peer may still send a late CLC
            // message (`Skip`: it must be skipped before this very call reads).
            let Some(o) = fdtable::get(fd) else {
                return Ok(None);
            };
            match &*o {
                Obj::Conn(_) => Some(o),
                Obj::Skip(_) => {
                    drop(o);
                    return conn_of_call(fd, op);
                }
                _ => None,
            }
        }
        Obj::Skip(s) => {
            match op {
                // A write never waits for the peer's late CLC messages, nor an urgent read.
                Op::Write { .. } | Op::ReadOob { .. } | Op::Other => {
                    setup::skip_late_clc(fd, fd, &o, s);
                }
                Op::Read { dontwait } => {
                    if !setup::skip_late_clc(fd, fd, &o, s) {
                        if !setup::skip_read_blocks(fd, dontwait) {
                            // Nothing to read yet: the head of the stream is nothing, or part
                            // of a CLC message, which must not be read as data.
                            real::set_errno(libc::EAGAIN);
                            return Ok(Some(o));
                        }
                        // The read waits for the peer. As on TCP, where the kernel holds the
                        // file for the whole call, another thread's close of the number (or
                        // a dup2 over it) must not end it nor send it to another file: it
                        // waits, and then reads, through a private duplicate of the socket.
                        let p = dup_private(fd, Arc::downgrade(&o));
                        if p < 0 {
                            // None can be made (the descriptor limit): through the number.
                            return match setup::skip_before_read(fd, fd, &o, s) {
                                SkipWait::Decided => Ok(None),
                                SkipWait::Failed => Ok(Some(o)),
                                SkipWait::Renamed => {
                                    drop(o);
                                    conn_of_call(fd, op)
                                }
                            };
                        }
                        let m = Moved::new(p, crate::obj::socket_ino(p).unwrap_or(0));
                        match setup::skip_before_read(p, fd, &o, s) {
                            SkipWait::Decided => return Err(m),
                            SkipWait::Failed => {
                                // The error of the wait (a receive timeout), kept across the
                                // close.
                                let e = real::errno();
                                drop(m);
                                real::set_errno(e);
                                return Ok(Some(o));
                            }
                            SkipWait::Renamed => {
                                // The call starts again on what the number names now, as
                                // the kernel's restart does; our duplicate goes first (it
                                // may hold the socket's last reference: the peer reads EOF).
                                drop(m);
                                drop(o);
                                return conn_of_call(fd, op);
                            }
                        }
                    }
                }
            }
            None
        }
        _ => None,
    })
}

/// Data calls (a write: its buffers) on an orphaned SMC connection (inherited across exec), or
/// on a connection that ended during its handshake ([`Skip::lost`]).
///
/// An ended one answers as TCP's: after a reset that came while the write that drove the
/// handshake waited for it (`drove`: TCP would have finished that write before; a later call
/// came after the reset, as TCP's would: red team round 31 `rt31x_lost.c bconn`), or after its
/// client left a server ([`Skip::left`]), the first write takes all its bytes (TCP queued them;
/// the reset dropped them, or the closed client answers them with one). The next write, or read
/// (but a server's whose client left: EOF, the socket's), reports the error, once; after that
/// the kernel's socket answers (`None`), at EOF and `EPIPE` as TCP's.
///
/// [`Skip::lost`]: crate::obj::Skip::lost
/// [`Skip::left`]: crate::obj::Skip::left
fn orphan(fd: c_int, write: Option<&[iovec]>, drove: bool) -> Option<ssize_t> {
    let o = fdtable::get(fd)?;
    let Obj::Orphan(s) = &*o else { return None };
    if s.lost != 0 {
        let passes = || {
            s.state
                .compare_exchange(
                    crate::obj::LOST_WAITED,
                    0,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
        };
        match write {
            Some(iov) if (drove || s.left) && passes() => {
                let n = iov.iter().fold(0usize, |a, v| a.saturating_add(v.iov_len));
                return Some(n.min(MAX_RW_COUNT) as ssize_t);
            }
            None if s.left => return None,
            _ => {}
        }
        let first =
            s.state.swap(crate::obj::LOST_REPORTED, Ordering::AcqRel) != crate::obj::LOST_REPORTED;
        fdtable::replace_if(fd, &o, Slot::Obj(Arc::new(Obj::Tcp)));
        if first && s.left {
            // The kernel's own error, if the reset came behind the FIN (the read said EOF and
            // left it): reported here, once.
            let _ = crate::util::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ERROR);
            // TCP's socket was reset by the closed client's answer to the first write, so its
            // later writes say `EPIPE` too; ours had sent nothing: unless a CLC byte of ours
            // reached the client before its close (then it reset), the kernel would take the
            // next write (1 of 6 in CI under load, `rt31_left.c nbclose wsww`). Its write side
            // ends here instead (the client is gone; reads still say EOF).
            if write.is_some() {
                // SAFETY: plain syscall on the application's socket.
                unsafe { real::shutdown(fd, libc::SHUT_WR) };
            }
        }
        return first.then(|| fail(s.lost));
    }
    if write.is_some() {
        return Some(fail(libc::EPIPE));
    }
    if s.state.swap(1, Ordering::AcqRel) == 0 {
        crate::debug!(
            "fd {fd}: read gives ECONNRESET: an SMC connection this process cannot serve (it \
             was inherited across exec or received from another process)"
        );
        return Some(fail(libc::ECONNRESET));
    }
    Some(0)
}

/// The kernel's `access_ok` part that costs nothing: no buffer in the first 64 KiB (NULL and
/// small-integer pointers; below `vm.mmap_min_addr`) or beyond the user address space. Such a
/// call gets `EFAULT` like from the kernel instead of a fault inside the library; an unmapped
/// pointer elsewhere still faults in the copy.
fn user_range_ok(iov: &[iovec]) -> bool {
    const USER_END: usize = 0x0000_8000_0000_0000;
    iov.iter().all(|v| {
        let b = v.iov_base as usize;
        v.iov_len == 0 || (!low_ptr(b) && b.checked_add(v.iov_len).is_some_and(|e| e <= USER_END))
    })
}

/// The most one call moves (`MAX_RW_COUNT`). `send`/`recv`/`sendto`/`recvfrom` take their
/// length as at most this before they check the buffer (`import_ubuf`): a `recv` into a buffer
/// said to be `SIZE_MAX` bytes reads what is there (red team round 29). `read`, `readv` and
/// the msghdr calls check the whole length first (`vfs_read`, `__import_iovec`): `EFAULT`.
const MAX_RW_COUNT: usize = (i32::MAX as usize) & !0xfff;

/// A pointer in the first 64 KiB (NULL and small integers, below `vm.mmap_min_addr`): the
/// kernel's copy from or to it fails with `EFAULT`; ours would fault. Calls with such an
/// argument go to the kernel or fail with `EFAULT` (red team round 29: `SIGSEGV` for a
/// `recvmsg`, `readv`, `epoll_wait`, `FIONREAD`, `poll` or `select` given `(void *)8`).
pub(crate) fn low_ptr(p: usize) -> bool {
    p < 0x1_0000
}

/// The errno `e` in place of [`crate::conn::E_TCP`], which no application may see.
fn not_e_tcp(e: i32) -> impl Fn(i32) -> i32 {
    move |x| if x == crate::conn::E_TCP { e } else { x }
}

fn ret(r: Result<usize, i32>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

// ---------------------------------------------------------------------------------------
// data path

pub unsafe fn recv_iov(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    // The signals this call's waits catch, from here on (`signals::caught`): a wait that
    // restarted after one leaves it to the rest of the call.
    crate::signals::wait_begins();
    // SAFETY: the caller's contract.
    unsafe { recv_iov_call(fd, iov, flags) }
}

/// [`recv_iov`] once its signals are being noted (it goes on here when the call moves to
/// another descriptor).
unsafe fn recv_iov_call(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    // (An urgent read looks at no error: TCP's says `EINVAL` when no urgent byte is there.)
    let oob = flags & libc::MSG_OOB != 0;
    if !oob {
        if let Some(r) = orphan(fd, None, false) {
            return Some(r);
        }
    }
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    let op = if flags & libc::MSG_OOB != 0 {
        Op::ReadOob { dontwait }
    } else {
        Op::Read { dontwait }
    };
    let found = conn_of_call(fd, op);
    let found = match found {
        Ok(f) => f,
        Err(m) => {
            // SAFETY: the caller's buffers; the call goes on with its connection on `m.fd`.
            let r = unsafe { recv_iov_call(m.fd, iov, flags) }
                // SAFETY: as above (a plain TCP socket).
                .unwrap_or_else(|| unsafe { crate::member::recv(m.fd, iov, flags) });
            drop(m);
            return Some(r);
        }
    };
    let Some(o) = found else {
        // A handshake that a reset ended while this read waited for it, or looked at it.
        if !oob {
            if let Some(r) = orphan(fd, None, false) {
                return Some(r);
            }
        }
        // A connection that fell back after its handshake started (skipped or not).
        let member = fdtable::get(fd).is_some_and(|o| matches!(&*o, Obj::Tcp | Obj::Skip(_)));
        if member && flags & libc::MSG_OOB != 0 {
            // `tcp_bpf` reads a SOCKHASH member's urgent byte as in-band data, and a `MSG_OOB`
            // read on its empty queue waits for in-band bytes (TCP answers at once: the byte,
            // `EINVAL` or `EAGAIN`): the socket leaves the SOCKHASH first (once; a socket no
            // longer in it is left as it is).
            setup::leave_shortcut_for_tcp(fd, false);
        }
        // SAFETY: the caller's buffers.
        return member.then(|| unsafe { crate::member::recv(fd, iov, flags) });
    };
    if o.conn().is_none() {
        // A server handshake still waiting for its client (non-blocking): EAGAIN.
        return Some(-1);
    }
    let Some(call) = InCall::enter(fd, o) else {
        // The number was closed meanwhile: the call goes to what it names now.
        // SAFETY: the caller's buffers.
        return unsafe { recv_iov_call(fd, iov, flags) };
    };
    // SAFETY: the caller's buffers.
    let r = unsafe { recv_in(&call, fd, iov, flags) };
    if restarted(&call, r) {
        drop(call);
        // SAFETY: the caller's buffers.
        return unsafe { recv_iov_call(fd, iov, flags) };
    }
    Some(r)
}

/// A call on a connection that a signal interrupted (`EINTR`) after its number stopped naming
/// the connection (a handler of this thread closed it, or made it name another file), where
/// the signal's action would restart it: the kernel restarts a system call by looking its
/// number up again, so the caller makes the call anew on what the number names now (`EBADF`
/// when nothing); the connection's close, deferred under this call, is done as it ends.
fn restarted(call: &InCall, r: ssize_t) -> bool {
    r < 0
        && real::errno() == libc::EINTR
        && !call.still_named()
        && crate::signals::caught()
        && !crate::signals::interrupted()
}

/// A read on the connection of `call`, made through the number `fd` (which another thread may
/// have closed since: the connection stays `call`'s, never what the number names now).
unsafe fn recv_in(call: &InCall, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    let (c, o) = (call.conn(), call.obj());
    if flags & libc::MSG_TRUNC == 0 && !user_range_ok(iov) {
        return fail(libc::EFAULT);
    }
    match c.recv(fd, iov, flags) {
        Err(crate::conn::E_TCP) if crate::lifecycle::continue_on_tcp(fd, o) => {
            if c.stash_left() {
                // The switch this call made read bytes of the stream from the socket: they
                // come first (`E_TCP`: another thread took them meanwhile).
                match c.recv(fd, iov, flags) {
                    Err(crate::conn::E_TCP) => {}
                    // SAFETY: the caller's buffers, past the `n` bytes the stash filled.
                    Ok(n) if n > 0 => return unsafe { stash_then_socket(c, fd, iov, flags, n) },
                    r => return ret(r),
                }
            }
            // SAFETY: the caller's buffers.
            unsafe { crate::member::recv(c.io_now(fd), iov, flags) }
        }
        // Reset instead: the call fails as the connection does (never `E_TCP` itself).
        Err(crate::conn::E_TCP) => ret(c.recv(fd, iov, flags).map_err(not_e_tcp(libc::ECONNRESET))),
        Ok(n) if n > 0 && c.flags() & crate::conn::F_TO_TCP != 0 => {
            // SAFETY: the caller's buffers, past the `n` bytes the stash filled.
            unsafe { stash_then_socket(c, fd, iov, flags, n) }
        }
        r => {
            answer_alone_now(fd, c, o);
            ret(r)
        }
    }
}

/// A read of a connection that continues on TCP took `n` bytes from what its switch read into
/// our ring (the stash, `Conn::stash_left`). A call that waits for more than that (a blocking
/// `MSG_WAITALL`, `SO_RCVLOWAT`) goes on at the socket for the rest of its buffers, as TCP
/// reads on from its queue: before, it returned the stash's bytes short (red team rt21
/// `waitall`), and a `MSG_PEEK` with `MSG_WAITALL` slept forever (`peekwaitall`). A peek peeks
/// on at the socket only when it saw the whole stash (no `SO_PEEK_OFF`).
unsafe fn stash_then_socket(
    c: &crate::conn::Conn,
    fd: c_int,
    iov: &[iovec],
    flags: c_int,
    n: usize,
) -> ssize_t {
    let want: usize = iov.iter().map(|v| v.iov_len).sum();
    let nonblock = flags & libc::MSG_DONTWAIT != 0 || c.nonblocking();
    let target = if flags & libc::MSG_WAITALL != 0 {
        want
    } else {
        (c.rcvlowat() as usize).min(want)
    };
    let peek = flags & libc::MSG_PEEK != 0;
    // A read that emptied the stash, or a peek that saw all of it from its start.
    let whole = if peek {
        c.peek_off() < 0 && c.inq() as usize == n
    } else {
        !c.stash_left()
    };
    if n >= target || nonblock || flags & libc::MSG_TRUNC != 0 || !whole {
        return n as ssize_t;
    }
    // The rest of the caller's buffers, past the `n` bytes filled.
    let mut rest: Vec<iovec> = Vec::with_capacity(iov.len());
    let mut skip = n;
    for v in iov {
        if skip >= v.iov_len {
            skip -= v.iov_len;
            continue;
        }
        rest.push(iovec {
            // SAFETY: inside the caller's buffer `v` (`skip < v.iov_len`).
            iov_base: unsafe { (v.iov_base as *mut u8).add(skip) } as *mut c_void,
            iov_len: v.iov_len - skip,
        });
        skip = 0;
    }
    let e0 = real::errno();
    // SAFETY: the caller's buffers, past what was filled.
    let r = unsafe { crate::member::recv(c.io_now(fd), &rest, flags) };
    if r > 0 {
        return n as ssize_t + r;
    }
    // The end, a timeout, a signal or an error after bytes: the bytes (as TCP's read returns
    // what it copied).
    real::set_errno(e0);
    n as ssize_t
}

/// The peer switched to TCP alone and this call saw it (a write whose bytes it will not read
/// from the ring, a doorbell its guard refused): the switch now, before the call returns,
/// not at the next one (which may never come while the peer's next image waits for them).
fn answer_alone_now(fd: c_int, c: &crate::conn::Conn, o: &Arc<Obj>) {
    if c.peer_went_alone() {
        let e0 = real::errno();
        crate::lifecycle::continue_on_tcp(fd, o);
        real::set_errno(e0);
    }
}

/// A call made of several reads or writes (`recvmmsg`, `sendmmsg`, `sendfile`, `splice`) on a
/// connection reset during its handshake ([`orphan`]): the error first, once, as TCP's first
/// read or write of the call reports it (red team round 31 `rt31x_lost.c rmmsg`, `smmsg`,
/// `sendfile`, `splice`, `splicew`: EOF or `EPIPE` first, the error at the next call). Not a
/// server's whose client left (the socket's, as before).
fn orphan_composed(fd: c_int) -> Option<ssize_t> {
    if !slow(fd) {
        return None;
    }
    let o = fdtable::get(fd)?;
    let Obj::Orphan(s) = &*o else { return None };
    if s.lost == 0 || s.left {
        return None;
    }
    drop(o);
    orphan(fd, None, false)
}

/// The connection at `fd`, held for a call made of several reads or writes (`sendfile`,
/// `splice`, `recvmmsg`, `sendmmsg`): as the kernel holds the file for the whole system call,
/// each part goes to this connection even when another thread closes the number meanwhile and
/// it names another file (`tests/redteam/rt5.c sendfile_reuse`, `splice_reuse`,
/// `sendmmsg_reuse`, `recvmmsg_reuse`). `None`: not an established SMC connection (yet).
fn hold(fd: c_int, op: Op) -> Option<InCall> {
    let o = conn_of_op(fd, op)?;
    o.conn()?;
    InCall::enter(fd, o)
}

/// `write(fd, b)` for a part of a composed call: on the held connection `call` when there is
/// one ([`hold`]).
unsafe fn write_part(call: Option<&InCall>, fd: c_int, b: &[u8]) -> ssize_t {
    match call {
        Some(call) => {
            let v = [iovec {
                iov_base: b.as_ptr() as *mut c_void,
                iov_len: b.len(),
            }];
            // SAFETY: `v` is the caller's `b`, readable.
            unsafe { send_in(call, fd, &v, 0) }
        }
        // SAFETY: `b` is readable for its length.
        None => unsafe { write(fd, b.as_ptr() as *const c_void, b.len()) },
    }
}

pub unsafe fn send_iov(fd: c_int, iov: &[iovec], flags: c_int) -> Option<ssize_t> {
    if let Some(r) = orphan(fd, Some(iov), false) {
        if r < 0 && flags & libc::MSG_NOSIGNAL == 0 && real::errno() == libc::EPIPE {
            crate::conn::raise_sigpipe();
        }
        return Some(r);
    }
    if !user_range_ok(iov) {
        // Whatever the socket of ours is now (a connection, a handshake, a fallback still
        // skipping late CLC messages): `EFAULT`, as from TCP. A fallback's socket may still be
        // a SOCKHASH member, whose writes `tcp_bpf` takes, and it said 0 for such a buffer
        // (conformance `bad_pointer_write` with a 1 ms CLC timeout, and the shortcut column).
        return Some(fail(libc::EFAULT));
    }
    WRITE_SWITCHED.with(|w| w.set(false));
    let found = conn_of_call(
        fd,
        Op::Write {
            dontwait: flags & libc::MSG_DONTWAIT != 0,
        },
    );
    let o = match found {
        Ok(Some(o)) => o,
        Ok(None) => {
            if !WRITE_SWITCHED.with(|w| w.replace(false)) {
                // A handshake that a reset ended while this write waited for it.
                return orphan(fd, Some(iov), true);
            }
            // This write switched the connection to TCP (the peer switched, maybe alone, and
            // its next image may be writing already): its bytes go to the socket here, and
            // the socket acknowledges as a fresh connection's after them.
            // SAFETY: plain old data.
            let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
            h.msg_iov = iov.as_ptr() as *mut iovec;
            h.msg_iovlen = iov.len() as _;
            let nb = flags & libc::MSG_DONTWAIT != 0 || crate::util::nonblocking(fd);
            // SAFETY: the caller's buffers (a plain TCP socket now).
            let r = crate::conn::send_fresh(fd, nb, || unsafe { real::sendmsg(fd, &h, flags) });
            return Some(r);
        }
        Err(m) => {
            // SAFETY: the caller's buffers; the call goes on with its connection on `m.fd`.
            let r = unsafe { send_iov(m.fd, iov, flags) }.unwrap_or_else(|| {
                // SAFETY: plain old data.
                let mut h: libc::msghdr = unsafe { std::mem::zeroed() };
                h.msg_iov = iov.as_ptr() as *mut iovec;
                h.msg_iovlen = iov.len() as _;
                // SAFETY: the caller's buffers (a plain TCP socket).
                unsafe { real::sendmsg(m.fd, &h, flags) }
            });
            drop(m);
            return Some(r);
        }
    };
    if o.conn().is_none() {
        // A handshake still waiting for its peer (non-blocking): EAGAIN, and not one byte
        // onto the TCP stream, which still carries CLC messages.
        return Some(-1);
    }
    let Some(call) = InCall::enter(fd, o) else {
        // The number was closed meanwhile: the call goes to what it names now.
        // SAFETY: the caller's buffers.
        return unsafe { send_iov(fd, iov, flags) };
    };
    crate::signals::wait_begins();
    // SAFETY: the caller's buffers.
    let r = unsafe { send_in(&call, fd, iov, flags) };
    if restarted(&call, r) {
        drop(call);
        // SAFETY: the caller's buffers.
        return unsafe { send_iov(fd, iov, flags) };
    }
    Some(r)
}

/// A write on the connection of `call`, made through the number `fd` (see [`recv_in`]).
unsafe fn send_in(call: &InCall, fd: c_int, iov: &[iovec], flags: c_int) -> ssize_t {
    let (c, o) = (call.conn(), call.obj());
    if !user_range_ok(iov) {
        return fail(libc::EFAULT);
    }
    match c.send(fd, iov, flags) {
        Err(crate::conn::E_TCP) if crate::lifecycle::continue_on_tcp(fd, o) => {
            // SAFETY: plain old data.
            let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
            m.msg_iov = iov.as_ptr() as *mut iovec;
            m.msg_iovlen = iov.len() as _;
            let io = c.io_now(fd);
            // The program's first bytes on TCP, right after the switch's exchange: sent as a
            // fresh connection's, not as a reply to the peer's marker (ping-pong mode).
            let nb = flags & libc::MSG_DONTWAIT != 0 || crate::util::nonblocking(io);
            // SAFETY: the caller's buffers.
            crate::conn::send_fresh(io, nb, || unsafe { real::sendmsg(io, &m, flags) })
        }
        Err(crate::conn::E_TCP) => ret(c.send(fd, iov, flags).map_err(not_e_tcp(libc::EPIPE))),
        r => {
            answer_alone_now(fd, c, o);
            ret(r)
        }
    }
}

/// `read`/`readv` of nothing on one of our sockets: `sock_read_iter` returns 0 before the
/// protocol sees the call (never waits, never `EAGAIN`), unlike a `recv` of nothing, which
/// `tcp_recvmsg` treats as a read. Also a `writev` of nothing (`vfs_writev`).
fn reads_nothing(fd: c_int, v: &[iovec]) -> bool {
    v.iter().all(|i| i.iov_len == 0)
        && fdtable::get(fd).is_some_and(|o| !matches!(&*o, Obj::Epoll(_) | Obj::Private(_)))
}

pub unsafe fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    if slow(fd) {
        let v = [iovec {
            iov_base: buf,
            iov_len: n,
        }];
        if reads_nothing(fd, &v) {
            return 0;
        }
        // SAFETY: `v` describes the caller's buffer of `n` writable bytes (read(2)'s contract).
        if let Some(r) = unsafe { recv_iov(fd, &v, 0) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `read`.
    unsafe { real::read(fd, buf, n) }
}

pub unsafe fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    if slow(fd) {
        let v = [iovec {
            iov_base: buf as *mut c_void,
            iov_len: n,
        }];
        // SAFETY: `v` describes the caller's buffer of `n` readable bytes (write(2)'s contract).
        if let Some(r) = unsafe { send_iov(fd, &v, 0) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `write`.
    unsafe { real::write(fd, buf, n) }
}

/// Why [`write_all`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteAllError {
    /// A write failed with this errno; the bytes before it were written.
    Write(c_int),
    /// A write of a non-empty buffer wrote nothing (not seen on a socket; no endless loop).
    NoProgress,
}

impl WriteAllError {
    /// The errno the application sees.
    pub fn errno(self) -> c_int {
        match self {
            WriteAllError::Write(e) => e,
            WriteAllError::NoProgress => libc::EIO,
        }
    }
}

/// Whether the library handles the bytes [`write`](fn@write) sends on `fd` (its slot holds an object:
/// an SMC connection, a handshake under way, ...). `dprintf`/`vdprintf` ask it
/// (`interpose_variadic.c`): glibc writes their output through its internal `write`, which
/// the interposition never sees, so for these fds the library formats and writes it itself.
/// The same test as [`write`](fn@write)'s, with the same answers in a `vfork` child and with the data
/// path off (connections open then stay on it): the bytes go where a `write` of them would.
#[inline]
pub fn handles_writes(fd: c_int) -> bool {
    slow(fd)
}

/// All of `buf` through [`write`](fn@write), looping on short writes as glibc's `FILE` flush does
/// (`_IO_new_file_write`): a failed write ends it (`EINTR` and `EAGAIN` too, as in glibc).
/// For `dprintf`/`vdprintf` on an fd of [`handles_writes`].
pub fn write_all(fd: c_int, mut buf: &[u8]) -> Result<(), WriteAllError> {
    while !buf.is_empty() {
        // SAFETY: `buf` is `buf.len()` readable bytes.
        let n = unsafe { write(fd, buf.as_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(WriteAllError::Write(real::errno()));
        }
        if n == 0 {
            return Err(WriteAllError::NoProgress);
        }
        buf = buf.get(n as usize..).unwrap_or_default();
    }
    Ok(())
}

unsafe fn iov_slice<'a>(iov: *const iovec, cnt: c_int) -> Result<&'a [iovec], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    if low_ptr(iov as usize) {
        return Err(libc::EFAULT);
    }
    // SAFETY: `iov` is non-null and, by the caller's contract, points to `cnt` iovecs (`0 < cnt <=
    // UIO_MAXIOV`, checked above).
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

/// The iovecs of a msghdr: as [`iov_slice`], but more than `UIO_MAXIOV` is `EMSGSIZE`
/// (`__copy_msghdr`), and the length is the kernel's `size_t` (not truncated to an int).
unsafe fn msg_iov_slice<'a>(iov: *const iovec, cnt: usize) -> Result<&'a [iovec], c_int> {
    if cnt > libc::UIO_MAXIOV as usize {
        return Err(libc::EMSGSIZE);
    }
    // SAFETY: the caller's contract, `cnt <= UIO_MAXIOV` fits an int.
    unsafe { iov_slice(iov, cnt as c_int) }
}

pub unsafe fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if slow(fd) {
        // SAFETY: `iov`/`cnt` are the caller's iovec array (readv(2)'s contract).
        let v = match unsafe { iov_slice(iov, cnt) } {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        if reads_nothing(fd, v) {
            return 0;
        }
        // SAFETY: `v` is the caller's iovecs over writable buffers (readv(2)'s contract).
        if let Some(r) = unsafe { recv_iov(fd, v, 0) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `readv`.
    unsafe { real::readv(fd, iov, cnt) }
}

pub unsafe fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    if slow(fd) {
        // SAFETY: `iov`/`cnt` are the caller's iovec array (writev(2)'s contract).
        let v = match unsafe { iov_slice(iov, cnt) } {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        // A vector of nothing is 0 before the socket is reached (`vfs_writev`), also after a
        // shutdown or a reset: no `EPIPE`, no `SIGPIPE` (red team round 29; `write` and
        // `sendmsg` of nothing do reach it).
        if reads_nothing(fd, v) {
            return 0;
        }
        // SAFETY: `v` is the caller's iovecs over readable buffers (writev(2)'s contract).
        if let Some(r) = unsafe { send_iov(fd, v, 0) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `writev`.
    unsafe { real::writev(fd, iov, cnt) }
}

/// The `RWF_*` flags a socket takes (`kiocb_set_rw_flags`): `RWF_ATOMIC` and `RWF_DONTCACHE`
/// need file support it has not, unknown bits are refused: `EOPNOTSUPP`.
const RWF_SOCKET: c_int = libc::RWF_HIPRI
    | libc::RWF_DSYNC
    | libc::RWF_SYNC
    | libc::RWF_NOWAIT
    | libc::RWF_APPEND
    | libc::RWF_NOAPPEND;

/// The iovecs and `send`/`recv` flags of a `preadv2`/`pwritev2` at the current position
/// (offset -1) on one of our sockets, as `do_readv`/`do_writev` and `sock_read_iter`/
/// `sock_write_iter` take them: `Ok(None)` for a call of nothing (0 at once).
unsafe fn rw2_args<'a>(
    iov: *const iovec,
    cnt: c_int,
    flags: c_int,
) -> Result<Option<(&'a [iovec], c_int)>, c_int> {
    // SAFETY: the caller's iovec array (preadv2(2)'s contract).
    let v = unsafe { iov_slice(iov, cnt) }?;
    if v.iter().all(|i| i.iov_len == 0) {
        return Ok(None);
    }
    if flags & !RWF_SOCKET != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let f = if flags & libc::RWF_NOWAIT != 0 {
        libc::MSG_DONTWAIT
    } else {
        0
    };
    Ok(Some((v, f)))
}

/// Whether `fd` is one of our connections (established, in its handshake or fallen back).
pub(crate) fn is_stream(fd: c_int) -> bool {
    fdtable::get(fd).is_some_and(|o| {
        matches!(
            &*o,
            Obj::Conn(_)
                | Obj::Handshake(_)
                | Obj::Pending(_)
                | Obj::Skip(_)
                | Obj::Tcp
                | Obj::Orphan(_)
        )
    })
}

/// `preadv2(2)`: at offset -1 a socket reads as `readv` (`RWF_NOWAIT`: without waiting);
/// other offsets go to the kernel (`ESPIPE`, `EINVAL` below -1).
pub unsafe fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    if off == -1 && slow(fd) && is_stream(fd) {
        // SAFETY: the caller's iovec array (preadv2(2)'s contract).
        match unsafe { rw2_args(iov, cnt, flags) } {
            Err(e) => return fail(e),
            Ok(None) => return 0,
            Ok(Some((v, f))) => {
                // SAFETY: the caller's iovecs over writable buffers.
                if let Some(r) = unsafe { recv_iov(fd, v, f) } {
                    return r;
                }
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
    // libc's `preadv2`.
    unsafe { real::preadv2(fd, iov, cnt, off, flags) }
}

/// `pwritev2(2)`: at offset -1 a socket writes as `writev` (`RWF_NOWAIT`: without waiting);
/// other offsets go to the kernel.
pub unsafe fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: libc::off_t,
    flags: c_int,
) -> ssize_t {
    if off == -1 && slow(fd) && is_stream(fd) {
        // SAFETY: the caller's iovec array (pwritev2(2)'s contract).
        match unsafe { rw2_args(iov, cnt, flags) } {
            Err(e) => return fail(e),
            Ok(None) => return 0,
            Ok(Some((v, f))) => {
                // SAFETY: the caller's iovecs over readable buffers.
                if let Some(r) = unsafe { send_iov(fd, v, f) } {
                    return r;
                }
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
    // libc's `pwritev2`.
    unsafe { real::pwritev2(fd, iov, cnt, off, flags) }
}

pub unsafe fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    if slow(fd) && flags & libc::MSG_ERRQUEUE == 0 {
        let v = [iovec {
            iov_base: buf,
            iov_len: n.min(MAX_RW_COUNT),
        }];
        // SAFETY: `v` describes the caller's buffer of `n` writable bytes (recv(2)'s contract).
        if let Some(r) = unsafe { recv_iov(fd, &v, flags) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `recv`.
    unsafe { real::recv(fd, buf, n, flags) }
}

pub unsafe fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    if slow(fd) {
        let v = [iovec {
            iov_base: buf as *mut c_void,
            iov_len: n.min(MAX_RW_COUNT),
        }];
        // SAFETY: `v` describes the caller's buffer of `n` readable bytes (send(2)'s contract).
        if let Some(r) = unsafe { send_iov(fd, &v, flags) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `send`.
    unsafe { real::send(fd, buf, n, flags) }
}

pub unsafe fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    if slow(fd) && flags & libc::MSG_ERRQUEUE == 0 {
        let v = [iovec {
            iov_base: buf,
            iov_len: n.min(MAX_RW_COUNT),
        }];
        // SAFETY: `v` describes the caller's buffer of `n` writable bytes (recvfrom(2)'s contract).
        if let Some(r) = unsafe { recv_iov(fd, &v, flags) } {
            // TCP leaves the address untouched but reports length 0 (`move_addr_to_user`, only
            // with an address: a length it cannot read is its `EFAULT`, after the read).
            if !addr.is_null() && r >= 0 && (alen.is_null() || bad_user_ptr(alen)) {
                return fail(libc::EFAULT);
            }
            if !addr.is_null() && !alen.is_null() && r >= 0 {
                // SAFETY: `alen` is non-null (checked) and the caller's writable socklen_t
                // (recvfrom(2)'s contract).
                unsafe { *alen = 0 };
            }
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `recvfrom`.
    unsafe { real::recvfrom(fd, buf, n, flags, addr, alen) }
}

pub unsafe fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    if slow(fd) {
        let v = [iovec {
            iov_base: buf as *mut c_void,
            iov_len: n.min(MAX_RW_COUNT),
        }];
        // SAFETY: `v` describes the caller's buffer of `n` readable bytes (sendto(2)'s contract).
        if let Some(r) = unsafe { send_iov(fd, &v, flags) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `sendto`.
    unsafe { real::sendto(fd, buf, n, flags, addr, alen) }
}

/// The control data of a successful read on the connection at `fd` (`tcp_recvmsg`): a
/// `TCP_CM_INQ` message when `TCP_INQ` is on, written as `put_cmsg` writes it (cut to the
/// buffer with `MSG_CTRUNC`, nothing and `MSG_CTRUNC` without room for a header); else none.
/// Sets `msg_controllen` to the bytes used and adds to `msg_flags`.
fn put_control(fd: c_int, m: &mut libc::msghdr) {
    let inq = fdtable::get(fd)
        .as_deref()
        .and_then(Obj::conn)
        .and_then(Conn::inq_hint);
    let avail = m.msg_controllen;
    m.msg_controllen = 0;
    let Some(inq) = inq else { return };
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let data = std::mem::size_of::<c_int>();
    let align = std::mem::size_of::<usize>();
    let space = hdr + data.div_ceil(align) * align;
    let p = m.msg_control as *mut u8;
    if p.is_null() || avail < hdr {
        m.msg_flags |= libc::MSG_CTRUNC;
        return;
    }
    if (p as usize) < 0x1_0000 {
        // copy_to_user fails: put_cmsg gives up, tcp_recvmsg does not care.
        return;
    }
    let mut cmlen = hdr + data;
    if avail < cmlen {
        m.msg_flags |= libc::MSG_CTRUNC;
        cmlen = avail;
    }
    // SAFETY: plain old data.
    let mut h: libc::cmsghdr = unsafe { std::mem::zeroed() };
    h.cmsg_len = cmlen as _;
    h.cmsg_level = libc::SOL_TCP;
    h.cmsg_type = libc::TCP_CM_INQ;
    let v = inq.to_ne_bytes();
    // SAFETY: the caller's control buffer of `avail >= cmlen` bytes (recvmsg(2)'s contract):
    // a header, then what fits of the value; unaligned writes.
    unsafe {
        std::ptr::write_unaligned(p as *mut libc::cmsghdr, h);
        std::ptr::copy_nonoverlapping(v.as_ptr(), p.add(hdr), cmlen - hdr);
    }
    m.msg_controllen = space.min(avail) as _;
}

/// `msg_flags` of a successful read with `flags` into `v`: a `MSG_OOB` read returned the
/// urgent byte (`MSG_OOB`, and `MSG_TRUNC` for an empty buffer, as `tcp_recv_urg`); others 0.
fn oob_msg_flags(v: &[iovec], flags: c_int) -> c_int {
    if flags & libc::MSG_OOB == 0 {
        0
    } else if v.iter().all(|i| i.iov_len == 0) {
        libc::MSG_OOB | libc::MSG_TRUNC
    } else {
        libc::MSG_OOB
    }
}

pub unsafe fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    unpark_closes();
    if slow(fd) && flags & libc::MSG_ERRQUEUE == 0 && !low_ptr(msg as usize) {
        // SAFETY: `msg` is non-null (checked above) and the caller's msghdr (recvmsg(2)'s
        // contract): its iovec array, as the caller gave it.
        let v = match unsafe { msg_iov_slice((*msg).msg_iov, (*msg).msg_iovlen) } {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        // SAFETY: `v` is the caller's iovecs over writable buffers (recvmsg(2)'s contract); a
        // read of a member socket in it fills the caller's msghdr, which is valid.
        let (r, filled) = crate::member::with_msg(msg, || unsafe { recv_iov(fd, v, flags) });
        if let Some(r) = r {
            if r >= 0 && !filled {
                // SAFETY: as above; no other reference to it is live.
                let m = unsafe { &mut *msg };
                m.msg_namelen = 0;
                m.msg_flags = oob_msg_flags(v, flags);
                put_control(fd, m);
            }
            return r;
        }
    }
    if slow(fd) && flags & libc::MSG_ERRQUEUE != 0 && !msg.is_null() {
        if let Some(c) = conn_of(fd).as_deref().and_then(Obj::conn) {
            // SAFETY: `msg` is non-null (checked) and the caller's writable msghdr.
            if let Some(r) = unsafe { zerocopy_notification(c, fd, &mut *msg) } {
                return r;
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `recvmsg`.
    let r = unsafe { real::recvmsg(fd, msg, flags) };
    if r >= 0 && !msg.is_null() {
        // SAFETY: the kernel filled the application's msghdr.
        unsafe { lifecycle::fds_received(&*msg, fd_created) };
    }
    r
}

/// `linux/errqueue.h` (not in the libc crate).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;

/// `recvmsg(MSG_ERRQUEUE)` on an SMC connection with completions of `send(MSG_ZEROCOPY)`
/// pending ([`Conn::take_zerocopy`]): TCP's notification, one control message
/// (`IP_RECVERR`/`IPV6_RECVERR`, `SO_EE_ORIGIN_ZEROCOPY`, the id range in `ee_info..=ee_data`,
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the bytes were copied, as on loopback), no data. `None`:
/// nothing pending (the kernel's error queue answers).
///
/// # Safety
/// `m` is the caller's msghdr, its control buffer `msg_controllen` writable bytes.
unsafe fn zerocopy_notification(c: &Conn, fd: c_int, m: &mut libc::msghdr) -> Option<ssize_t> {
    c.take_zerocopy(false)?;
    // SAFETY: a zeroed sockaddr_storage is valid; out pointers are ours.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut sl = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: valid out buffers.
    unsafe { libc::getsockname(fd, (&mut ss as *mut libc::sockaddr_storage).cast(), &mut sl) };
    let (level, ty) = if c_int::from(ss.ss_family) == libc::AF_INET6 {
        (libc::SOL_IPV6, libc::IPV6_RECVERR)
    } else {
        (libc::SOL_IP, libc::IP_RECVERR)
    };
    let ee_len = std::mem::size_of::<libc::sock_extended_err>();
    // SAFETY: CMSG_SPACE is arithmetic.
    let space = unsafe { libc::CMSG_SPACE(ee_len as u32) } as usize;
    m.msg_flags = libc::MSG_ERRQUEUE;
    m.msg_namelen = 0;
    if m.msg_control.is_null() || m.msg_controllen < space {
        // TCP dequeues the notification all the same and says the control data was cut.
        c.take_zerocopy(true)?;
        m.msg_controllen = 0;
        m.msg_flags |= libc::MSG_CTRUNC;
        return Some(0);
    }
    let (lo, hi) = c.take_zerocopy(true)?;
    let ee = libc::sock_extended_err {
        ee_errno: 0,
        ee_origin: SO_EE_ORIGIN_ZEROCOPY,
        ee_type: 0,
        ee_code: SO_EE_CODE_ZEROCOPY_COPIED,
        ee_pad: 0,
        ee_info: lo,
        ee_data: hi,
    };
    // SAFETY: the control buffer holds at least CMSG_SPACE(ee_len) bytes (checked above), so
    // the first header and its data fit; the caller's buffer may be unaligned for the data, so
    // it is written unaligned.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(m);
        if h.is_null() {
            return Some(0);
        }
        (*h).cmsg_level = level;
        (*h).cmsg_type = ty;
        (*h).cmsg_len = libc::CMSG_LEN(ee_len as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<libc::sock_extended_err>(), ee);
    }
    m.msg_controllen = space as _;
    Some(0)
}

pub unsafe fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    if slow(fd) && !low_ptr(msg as usize) {
        // SAFETY: `msg` is non-null (checked above) and the caller's msghdr (sendmsg(2)'s
        // contract).
        let m = unsafe { &*msg };
        // SAFETY: the msghdr's iovec array, as the caller gave it (sendmsg(2)'s contract).
        let v = match unsafe { msg_iov_slice(m.msg_iov, m.msg_iovlen) } {
            Ok(v) => v,
            Err(e) => return fail(e),
        };
        // SAFETY: `v` is the caller's iovecs over readable buffers (sendmsg(2)'s contract).
        if let Some(r) = unsafe { send_iov(fd, v, flags) } {
            return r;
        }
    }
    if low_ptr(msg as usize) || !fdtable::any_objects() {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `sendmsg`.
        return unsafe { real::sendmsg(fd, msg, flags) };
    }
    // SAFETY: the application's msghdr (checked non-null).
    let passing = unsafe { lifecycle::fds_sending(fd, &*msg) };
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `sendmsg`.
    let r = unsafe { real::sendmsg(fd, msg, flags) };
    if r < 0 {
        let e = real::errno();
        lifecycle::fds_not_sent(passing);
        real::set_errno(e);
    }
    r
}

pub unsafe fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
    t: *mut libc::timespec,
) -> c_int {
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    if slow(fd) && !low_ptr(msgs as usize) && flags & libc::MSG_ERRQUEUE == 0 {
        if let Some(r) = orphan_composed(fd) {
            return r as c_int;
        }
        if let Some(m) = moved_first(fd, Op::Read { dontwait }) {
            // SAFETY: the caller's arguments, on the connection's own descriptor.
            return unsafe { recvmmsg(m.fd, msgs, n, flags, t) };
        }
        if let Some(call) = hold(fd, Op::Read { dontwait }) {
            // As `__sys_recvmmsg`: every message blocks unless MSG_DONTWAIT (MSG_WAITFORONE:
            // from the second on); the timeout is looked at only after a message, and what is
            // left of it written back.
            let deadline = if t.is_null() {
                None
            } else {
                // SAFETY: `t` is non-null and the caller's timespec (recvmmsg(2)'s contract).
                let ts = unsafe { *t };
                if ts.tv_sec < 0 || !(0..1_000_000_000).contains(&ts.tv_nsec) {
                    return fail(libc::EINVAL) as c_int;
                }
                let d = std::time::Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32);
                Some(std::time::Instant::now().checked_add(d))
            };
            let mut f = flags & !libc::MSG_WAITFORONE;
            let mut done = 0u32;
            while done < n {
                // SAFETY: `msgs` is non-null (checked above) and, by recvmmsg(2)'s contract,
                // holds `n > done` writable mmsghdrs.
                let mh = unsafe { &mut *msgs.add(done as usize) };
                let m = &mut mh.msg_hdr;
                // SAFETY: the msghdr's iovec array, as the caller gave it.
                let r = match unsafe { msg_iov_slice(m.msg_iov, m.msg_iovlen) } {
                    Ok(v) => {
                        // SAFETY: the caller's iovecs over writable buffers.
                        unsafe { recv_in(&call, fd, v, f) }
                    }
                    Err(e) => fail(e),
                };
                if r < 0 {
                    if done > 0 {
                        break;
                    }
                    return -1;
                }
                m.msg_namelen = 0;
                // SAFETY: as above (the same iovec array).
                m.msg_flags = match unsafe { msg_iov_slice(m.msg_iov, m.msg_iovlen) } {
                    Ok(v) => oob_msg_flags(v, f),
                    Err(_) => 0,
                };
                put_control(fd, m);
                mh.msg_len = r as u32;
                done += 1;
                if flags & libc::MSG_WAITFORONE != 0 {
                    f |= libc::MSG_DONTWAIT;
                }
                if let Some(d) = deadline {
                    let left = d.map_or(std::time::Duration::MAX, |d| {
                        d.saturating_duration_since(std::time::Instant::now())
                    });
                    // SAFETY: `t` is non-null (a deadline exists) and the caller's writable
                    // timespec.
                    unsafe {
                        (*t).tv_sec = left.as_secs().min(i64::MAX as u64) as libc::time_t;
                        (*t).tv_nsec = left.subsec_nanos() as libc::c_long;
                    }
                    if left.is_zero() {
                        break;
                    }
                }
            }
            return done as c_int;
        }
        // (Its handshake, driven just now, may have met the reset.)
        if let Some(r) = orphan_composed(fd) {
            return r as c_int;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `recvmmsg`.
    unsafe { real::recvmmsg(fd, msgs, n, flags, t) }
}

pub unsafe fn sendmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    n: libc::c_uint,
    flags: c_int,
) -> c_int {
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    if slow(fd) && !low_ptr(msgs as usize) {
        if let Some(r) = orphan_composed(fd) {
            return r as c_int;
        }
        if let Some(m) = moved_first(fd, Op::Write { dontwait }) {
            // SAFETY: the caller's arguments, on the connection's own descriptor.
            return unsafe { sendmmsg(m.fd, msgs, n, flags) };
        }
        if let Some(call) = hold(fd, Op::Write { dontwait }) {
            let mut done = 0u32;
            while done < n {
                // SAFETY: `msgs` is non-null (checked above) and, by sendmmsg(2)'s contract,
                // holds `n > done` mmsghdrs (their `msg_len` written back).
                let mh = unsafe { &mut *msgs.add(done as usize) };
                let m = &mh.msg_hdr;
                // SAFETY: the msghdr's iovec array, as the caller gave it.
                let r = match unsafe { msg_iov_slice(m.msg_iov, m.msg_iovlen) } {
                    Ok(v) => {
                        // SAFETY: the caller's iovecs over readable buffers.
                        unsafe { send_in(&call, fd, v, flags) }
                    }
                    Err(e) => fail(e),
                };
                if r < 0 {
                    if done > 0 {
                        break;
                    }
                    return -1;
                }
                mh.msg_len = r as u32;
                done += 1;
            }
            return done as c_int;
        }
        // (Its handshake, driven just now, may have met the reset.)
        if let Some(r) = orphan_composed(fd) {
            return r as c_int;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `sendmmsg`.
    unsafe { real::sendmmsg(fd, msgs, n, flags) }
}

// ---------------------------------------------------------------------------------------
// connection setup

pub unsafe fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: integer arguments only.
    let mut fd = unsafe { real::socket(domain, ty, proto) };
    if fd < 0 && real::errno() == libc::EMFILE && daemon::give_back_descriptors() {
        // Descriptors the library held for other handshakes (their memfds) are free again.
        // SAFETY: integer arguments only.
        fd = unsafe { real::socket(domain, ty, proto) };
    }
    if fd >= 0 {
        let tcp = (domain == libc::AF_INET || domain == libc::AF_INET6)
            && ty & 0xf == libc::SOCK_STREAM
            && (proto == 0 || proto == libc::IPPROTO_TCP);
        fd_created(fd);
        // Not in a thread with a table of its own: the slots describe the process's table
        // (its sockets stay plain TCP, never announced: `lifecycle::fd_table_unshared`).
        if tcp && policy::enabled() && !lifecycle::own_table_thread() {
            fdtable::set_tag(fd, TAG_TCP);
            setup::forget_rcvbuf(fd);
        }
    }
    fd
}

pub unsafe fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let raw = fdtable::raw(fd);
    if raw != 0 && !addr.is_null() && len as usize >= std::mem::size_of::<libc::sa_family_t>() {
        // SAFETY: `addr` is non-null and, by connect(2)'s contract, readable for `len` bytes,
        // which hold at least the family.
        let family = unsafe { std::ptr::read_unaligned(addr as *const libc::sa_family_t) };
        if c_int::from(family) == libc::AF_UNSPEC {
            // SAFETY: the caller's arguments.
            return unsafe { disconnect(fd, addr, len) };
        }
    }
    let tagged = raw & !1 == TAG_TCP && !lifecycle::vfork_shadowed(fd);
    if !tagged || !policy::enabled() || setup::retired(fd) || !daemon::usable() {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `connect`.
        return unsafe { real::connect(fd, addr, len) };
    }
    // SAFETY: `addr`/`len` are the caller's address (connect(2)'s contract); `Dest::of` reads at
    // most `len` bytes of it (or nothing if null).
    let dest = unsafe { policy::Dest::of(addr, len) };
    if policy::policy_keeps_tcp(dest) || policy::known_no_smc(dest) {
        drop(fdtable::replace(fd, Slot::Empty));
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `connect`.
        return unsafe { real::connect(fd, addr, len) };
    }
    let opted = setup::opt_in(fd);
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `connect`.
    let r = unsafe { real::connect(fd, addr, len) };
    if !opted {
        return r;
    }
    // Connected: another thread's exec or dup of `fd` waits for the rest of this call (the
    // handshake it drives) to end. Not while the kernel's connect itself waits (a SYN to an
    // unreachable host may take minutes; no CLC byte has gone yet).
    let _drive = (r == 0).then(|| setup::BlockingDrive::enter(fd));
    let e = real::errno();
    if r == 0 {
        // A TCP connect that completes at once was blocking (a non-blocking one always says
        // EINPROGRESS). To a listener of a process with no other thread, only this thread can
        // accept, after the call: waiting here for the Accept would take the CLC timeout
        // (conformance `connect_own_listener_one_thread`), so the handshake goes on at the
        // next operation, driving the accepted end. With other threads, one of them may be
        // accepting: the handshake ends within the call as usual, unless none of them comes
        // to `accept` (`connect_own_listener_idle_thread`).
        if setup::to_own_listener(dest) && setup::single_threaded() {
            setup::client_start(fd, false, dest);
        } else if setup::to_own_listener(dest) {
            setup::client_connect_own(fd, dest);
        } else {
            setup::client_after_connect(fd, Some(false), dest);
        }
        real::set_errno(e);
        return 0;
    }
    if e == libc::EINPROGRESS || e == libc::EINTR {
        // Same-host connects usually complete within the call: the Proposal goes out now, the
        // rest at the next operation or poll; a non-blocking connect never waits for the
        // server (which may accept much later, or be this thread).
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd.
        let pr = unsafe { real::poll(&mut pfd, 1, 0) };
        if pr > 0 {
            if setup::so_error_peek(fd) == 0 {
                setup::client_start(fd, e == libc::EINPROGRESS, dest);
            } else {
                setup::settle_plain(fd);
            }
        } else {
            setup::count_pending();
            drop(fdtable::replace(
                fd,
                Slot::Obj(Arc::new(Obj::Pending(crate::obj::Pending {
                    lock: std::sync::Mutex::new(false),
                    dest,
                    shared: std::sync::atomic::AtomicBool::new(false),
                }))),
            ));
            epoll::refresh(fd);
        }
        real::set_errno(e);
        return r;
    }
    real::set_errno(e);
    r
}

/// `connect(fd, {AF_UNSPEC})` (TCP's `tcp_disconnect`) on a socket of ours. An SMC-D
/// connection is reset for its peer as by an abortive close and continues, in every process
/// that holds it, as the plain TCP socket the kernel disconnected (`Conn::disconnect`); that
/// socket, like one that fell back, may connect again, as plain TCP ([`setup::retire`]). A
/// socket that never connected only does not opt in.
unsafe fn disconnect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged: the contract of libc's `connect`.
    let real_connect = |io: c_int| unsafe { real::connect(io, addr, len) };
    let Some(o) = fdtable::get(fd) else {
        return real_connect(fd);
    };
    match &*o {
        Obj::Conn(_) => {
            let Some(call) = InCall::enter(fd, o.clone()) else {
                // The number was closed meanwhile: the call goes to what it names now.
                // SAFETY: the caller's arguments.
                return unsafe { connect(fd, addr, len) };
            };
            let c = call.conn();
            let r = match c.disconnect(
                fd,
                |s| setup::leave_shortcut_for_tcp(s, false),
                real_connect,
            ) {
                Some(r) => {
                    stats::conn_closed(c);
                    r
                }
                None => real_connect(c.io_now(fd)),
            };
            let e = real::errno();
            let mut fds = Vec::new();
            fdtable::for_each_object(|ofd, x| {
                if Arc::ptr_eq(x, &o) {
                    fds.push(ofd);
                }
            });
            for ofd in fds {
                if fdtable::get(ofd).is_some_and(|x| Arc::ptr_eq(&x, &o)) {
                    setup::retire(ofd);
                }
            }
            drop(call);
            real::set_errno(e);
            r
        }
        Obj::Tcp | Obj::Skip(_) => {
            // Fell back: a plain TCP socket from now on (a late CLC message of the old peer
            // never comes: the kernel drops the receive queue).
            let r = real_connect(fd);
            let e = real::errno();
            setup::retire(fd);
            real::set_errno(e);
            r
        }
        _ => real_connect(fd),
    }
}

pub unsafe fn listen(fd: c_int, backlog: c_int) -> c_int {
    let tagged = fdtable::raw(fd) & !1 == TAG_TCP && !lifecycle::vfork_shadowed(fd);
    if tagged && policy::enabled() && daemon::usable() && setup::opt_in(fd) {
        // SAFETY: integer arguments only.
        let r = unsafe { real::listen(fd, backlog) };
        if r == 0 {
            drop(fdtable::replace(
                fd,
                Slot::Obj(Arc::new(setup::listener_obj(fd))),
            ));
        }
        return r;
    }
    // SAFETY: integer arguments only.
    unsafe { real::listen(fd, backlog) }
}

pub unsafe fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
    flags: c_int,
    four: bool,
) -> c_int {
    let call = || {
        if four {
            // SAFETY: the caller's arguments, passed on unchanged: this function has the
            // contract of libc's `accept4`.
            unsafe { real::accept4(fd, addr, alen, flags) }
        } else {
            // SAFETY: the caller's arguments, passed on unchanged: this function has the
            // contract of libc's `accept`.
            unsafe { real::accept(fd, addr, alen) }
        }
    };
    // A thread in `accept` on our listener is counted while it waits there: a blocking
    // connect of this process to that listener waits for its handshake within the call only
    // when one is (`setup::someone_accepting`).
    let listener = slow(fd) && fdtable::get(fd).is_some_and(|o| matches!(&*o, Obj::Listener(_)));
    let waiter = listener.then(setup::accept_waiter);
    let mut r = call();
    if r < 0 && real::errno() == libc::EMFILE && daemon::give_back_descriptors() {
        // Descriptors the library held for other handshakes (their memfds) are free again.
        r = call();
    }
    drop(waiter);
    if r < 0 {
        return r;
    }
    let e = real::errno();
    fd_created(r);
    if slow(fd) {
        if let Some(o) = fdtable::get(fd) {
            if let Obj::Listener(_) = &*o {
                // Also when SMC was disabled since: a client that saw the listener's
                // announcement sends a Proposal, which the machine then declines.
                // accept() never makes the new socket non-blocking; accept4 may.
                let nb = four && flags & libc::SOCK_NONBLOCK != 0;
                // Another thread's exec or dup of `r` waits for the handshake this call drives
                // (the fd has no object in the table until it is decided), as for a blocking
                // connect (red team round 30, `rt30b_texec.c`: an exec while another thread
                // was inside `accept` handed the image the client's Proposal or Confirm as
                // data, 7 of 10 runs).
                let _drive = setup::BlockingDrive::enter(r);
                setup::server_after_accept(fd, r, nb);
            }
        }
    }
    real::set_errno(e);
    r
}

// ---------------------------------------------------------------------------------------
// fd lifetime

/// The kernel just handed out `fd` (open, pipe, eventfd, ...): a slot still holding an object
/// there is stale, its close happened behind our back.
pub fn fd_created(fd: c_int) {
    // The bookkeeping of a number a handler closed goes before the new file gets any.
    unpark_closes();
    if fd >= 0 && lifecycle::own_table_thread() {
        // A number of this thread's own table (red team round 29): whatever the process's
        // table has or gets there later is not this file; its calls go to libc.
        lifecycle::vfork_shadow(fd);
    } else if fd >= 0 && fdtable::raw(fd) != 0 {
        if lifecycle::own_fd_table() {
            // In this thread's own table only (a vfork child, an unshared table): the
            // process's socket at that number is not stale; the number is this thread's.
            lifecycle::vfork_shadow(fd);
        } else {
            forget_stale(fd);
        }
    }
}

/// Our part of closing `fd` (before the real close).
pub(crate) fn forget_fd(fd: c_int) {
    forget_slot(fd, fd)
}

/// Our part of a close of `fd` that happened behind our back (a raw system call, `fclose` of an
/// `fdopen`ed socket, a runtime's own close): the number already names something else, so no
/// I/O on it (`io_fd` -1); the peer learns of the close from the TCP socket's end.
pub fn forget_stale(fd: c_int) {
    crate::debug!("fd {fd}: reused before we saw its close: the stale connection is dropped");
    forget_slot(fd, -1)
}

fn forget_slot(fd: c_int, io_fd: c_int) {
    // A call of this thread left by a jump (`siglongjmp` out of a signal handler) is released
    // first: the close of its connection is not deferred to it (`util::unwound`).
    crate::obj::reap_unwound();
    setup::unretire(fd);
    match fdtable::replace(fd, Slot::Empty) {
        Slot::Obj(o) if matches!(&*o, Obj::Private(_)) => {
            if io_fd >= 0 {
                // Ours, never the application's (callers keep it from closing them): put back.
                drop(fdtable::replace(fd, Slot::Obj(o)));
            } else if let Obj::Private(w) = &*o {
                // Closed behind our back (a raw system call): the connection's (or handshake's)
                // own I/O has no descriptor any more.
                if let Some(owner) = w.upgrade() {
                    owner.move_private_io(fd, crate::conn::IO_GONE);
                }
            }
        }
        Slot::Obj(o) => {
            if let (Obj::Skip(s), true) = (&*o, io_fd >= 0) {
                // Late CLC messages already there go before the close: unread, they would
                // make it a reset.
                setup::skip_late_clc(io_fd, fd, &o, s);
            }
            if let Obj::Handshake(h) = &*o {
                // Its client (a connection of ours) may be driving it through this number
                // right now: the number is closed only after that step (microseconds).
                let mut i = 0u32;
                while h.nudged.load(Ordering::SeqCst) && i < 100_000 {
                    std::thread::yield_now();
                    i += 1;
                }
                // Pairs with the fence of `setup::progress_call`: a call that registered before
                // the slot was emptied is seen here, one that did not sees the slot empty and
                // leaves the handshake alone. A call drives it through this number right now:
                // the number is free for the application from now on, so the handshake's I/O
                // (and its decision) moves to a private duplicate of the socket first.
                std::sync::atomic::fence(Ordering::SeqCst);
                // A call applies its decision to this number right now (`setup::settle_as`):
                // after it, what the number became is closed too (below).
                let mut i = 0u32;
                while h.deciding.load(Ordering::SeqCst) && i < 2_000_000 {
                    std::thread::yield_now();
                    i += 1;
                }
                if h.calls.load(Ordering::SeqCst) > 0 && !h.io.redirected() {
                    crate::debug!(
                        "fd {fd}: closed while a call drives its handshake: the handshake goes \
                         on through a private duplicate"
                    );
                    let p = if io_fd >= 0 {
                        dup_private(fd, Arc::downgrade(&o))
                    } else {
                        -1
                    };
                    if p < 0 {
                        h.io.set_private(crate::conn::IO_GONE);
                    } else if !h.io.set_private(p) {
                        crate::fdtable::close_private(p);
                    }
                }
            }
            let kept = epoll::on_close(fd, io_fd >= 0, Some(&o));
            if let Obj::Conn(c) = &*o {
                // Pairs with the one in `InCall::enter`: a call that registered before the slot
                // was emptied is seen here, one that did not sees the slot empty and leaves.
                std::sync::atomic::fence(Ordering::SeqCst);
                if c.defer_close() {
                    // A call of this process is under way on the connection (a thread blocked
                    // in recv): as on TCP it goes on, and the connection closes when it returns
                    // (`InCall`). The number is free for the application from now on, so the
                    // call's own I/O moves to a private duplicate of the socket first.
                    crate::debug!(
                        "fd {fd}: closed while a call is under way on it: the connection stays \
                         open until that call returns"
                    );
                    if io_fd >= 0 {
                        private_io(fd, &o, c);
                    } else if c.numbers() == 0 {
                        // Closed behind our back: the number names something else already.
                        c.set_private_io(crate::conn::IO_GONE);
                    }
                } else {
                    if kept {
                        // An epoll registration of the number lives on with the connection (as
                        // TCP's with the open file): its drains go through our own descriptor.
                        private_io(fd, &o, c);
                    }
                    crate::obj::release_ref(fd, io_fd, c);
                }
            }
            if matches!(&*o, Obj::Handshake(_)) && fdtable::raw(fd) >= 8 {
                // The decision a call applied to this number while it was being closed (the
                // number is not free before the real close): closed as well.
                forget_slot(fd, io_fd);
            }
        }
        Slot::Tag(_) => {
            epoll::on_close(fd, io_fd >= 0, None);
        }
        Slot::Empty => {}
    }
}

/// A private duplicate of the socket of `c` (an SMC connection whose number `fd` is about to
/// close while the connection stays in use in this process), for its own I/O from now on
/// ([`Conn::with_io`]). At a high number, out of the way of the application's lowest-free
/// allocations; the number is marked ours ([`Obj::Private`]). None can be made (the process at
/// its descriptor limit): the connection's I/O fails as on a socket that went.
fn private_io(fd: c_int, o: &Arc<Obj>, c: &Conn) {
    if c.io_redirected() {
        return;
    }
    let p = dup_private(fd, Arc::downgrade(o));
    if p < 0 {
        crate::debug!("fd {fd}: no descriptor left for the connection's own I/O");
        c.set_private_io(crate::conn::IO_GONE);
        return;
    }
    if !c.set_private_io(p) {
        crate::fdtable::close_private(p);
    }
}

/// The lowest number our private duplicates take: half the soft `RLIMIT_NOFILE`, between 3 and
/// 1024 (out of the way of the program's low numbers). Allocates nothing (also from a handler).
fn private_base() -> c_int {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out pointer.
    let cur = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        lim.rlim_cur.min(i32::MAX as u64) as c_int
    } else {
        1024
    };
    (cur / 2).clamp(3, 1024)
}

/// A close-on-exec duplicate of `fd` at a high number, marked ours for the connection `owner`
/// (-1: none could be made).
fn dup_private(fd: c_int, owner: std::sync::Weak<Obj>) -> c_int {
    let e0 = real::errno();
    let base = private_base();
    // SAFETY: plain fcntl on a number that names the socket (the close has not happened).
    let mut p = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, base as libc::c_ulong) };
    if p < 0 {
        // SAFETY: as above.
        p = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    }
    real::set_errno(e0);
    if p >= 0 {
        if fdtable::raw(p) != 0 {
            forget_stale(p);
        }
        fdtable::set_private(p, owner);
    }
    p
}

/// The application makes `p`, one of our private descriptors, name another file (`dup2` onto
/// a number it believes free): the connection's own I/O moves to a new duplicate first.
fn move_private(p: c_int) {
    let Some(o) = fdtable::get(p) else { return };
    let Obj::Private(w) = &*o else { return };
    let owner = w.upgrade();
    let p2 = dup_private(p, w.clone());
    drop(fdtable::replace(p, Slot::Empty));
    let moved = owner
        .as_deref()
        .is_some_and(|o| o.move_private_io(p, if p2 >= 0 { p2 } else { crate::conn::IO_GONE }));
    if !moved && p2 >= 0 {
        crate::fdtable::close_private(p2);
    }
}

// ---------------------------------------------------------------------------------------------
// closes made by a program's signal handler

/// The object of a number a program's signal handler closed (`close`, `dup2` over it,
/// `close_range`), whose memory and bookkeeping wait for [`unpark_closes`].
struct Parked {
    /// 0: free; 1: being filled or emptied; 2: parked.
    state: AtomicU32,
    /// The private duplicate a call under way on the connection goes on through, marked
    /// [`fdtable::TAG_PRIVATE_PENDING`] until its object is made here (-1: none).
    private: AtomicI32,
    /// The process that parked it (a child forked since holds no reference of it).
    pid: AtomicU32,
    /// The number the handler closed.
    fd: AtomicI32,
    /// The object's reference the number held (`Arc::into_raw`).
    obj: AtomicUsize,
}

/// Closes parked at most at once; beyond, a handler's close does its whole work at once.
const PARKED_MAX: usize = 1024;
static PARKED: [Parked; PARKED_MAX] = [const {
    Parked {
        state: AtomicU32::new(0),
        private: AtomicI32::new(-1),
        pid: AtomicU32::new(0),
        fd: AtomicI32::new(-1),
        obj: AtomicUsize::new(0),
    }
}; PARKED_MAX];
/// Entries of [`PARKED`] in use: while 0, [`unpark_closes`] is one load.
static PARKED_N: AtomicUsize = AtomicUsize::new(0);

/// Called by a program's signal handler, `close` (or `dup2`, `close_range`) of a number whose
/// socket is ours does only what allocates and frees nothing and takes no lock the code it
/// interrupted may hold: the number's reference leaves the table, an SMC connection's close
/// toward the peer is made at once when it was the last reference anywhere (its flags in the
/// shared state, the doorbell: the peer reads EOF as soon as the caller's real close sends the
/// FIN), and the object's memory and the bookkeeping kept under the number go at this process's
/// next call into the library outside a handler ([`unpark_closes`]). The handler may have
/// interrupted `malloc` half way: an allocation or a free then corrupted the heap of a
/// single-threaded process (`tests/redteam/sigsafe.c close`: aborts in `malloc`'s checks, 3 of 3
/// runs) and waited for ever for the arena lock in a multi-threaded one (2 of 2 hung). True
/// when parked (the caller closes or replaces the number); false: not an object this applies to
/// (a handshake under way, a fallback skipping late CLC messages, a connection with a call in
/// flight or switching to TCP: as before), or no room (the caller goes on as outside a handler).
fn park_for_handler(fd: c_int) -> bool {
    let Some(o) = fdtable::get(fd) else {
        return false;
    };
    match &*o {
        Obj::Private(_) | Obj::Handshake(_) | Obj::Pending(_) | Obj::Skip(_) => return false,
        // A switch to TCP waits for the peer.
        Obj::Conn(c) if c.switching() || c.peer_switch_waits() => return false,
        _ => {}
    }
    // No lock is waited for here, not even the epoll sets' member list: another thread may
    // hold it while it waits for `malloc`'s arena lock, which the code this handler
    // interrupted may hold (`preload-prog sigclose 100 close mt+epoll`: 1 of 6 runs hung so).
    // A registration of the number in an epoll set that TCP keeps while another number names
    // the socket goes with this number's close (at [`unpark_closes`]).
    let Some(e) = PARKED.iter().find(|e| {
        e.state
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }) else {
        return false;
    };
    match fdtable::replace(fd, Slot::Empty) {
        // Not the last reference (`o` is one): nothing is freed.
        Slot::Obj(x) if Arc::ptr_eq(&x, &o) => drop(x),
        // Replaced meanwhile by another thread: put back as it was.
        other => {
            drop(fdtable::replace(fd, other));
            e.state.store(0, Ordering::Release);
            return false;
        }
    }
    let mut private = -1;
    if let Obj::Conn(c) = &*o {
        // Pairs with the one in `InCall::enter` (as in `forget_slot`).
        std::sync::atomic::fence(Ordering::SeqCst);
        if c.defer_close() {
            // A call of this process is under way on the connection (another thread's, or the
            // one this handler interrupted): it goes on, and the connection closes when it
            // returns, its I/O through a private duplicate (another thread blocked in `recv`
            // while this one's handler interrupted `malloc`: the ordinary close allocated the
            // duplicate's object, hung on the arena lock, `sigsafe.c close RECVTHREADS=1` 1 of
            // 2 runs).
            if !c.io_redirected() {
                private = handler_private_io(fd, c);
            }
        } else if c.drop_ref() && !c.switched() {
            // The last reference anywhere (`obj::release_ref` but the policy's note): counted
            // first (the state page may be pooled after the close).
            if stats::ready() {
                stats::conn_closed(c);
            }
            c.final_close(fd);
        }
    }
    e.private.store(private, Ordering::Relaxed);
    e.pid.store(crate::pid(), Ordering::Relaxed);
    e.fd.store(fd, Ordering::Relaxed);
    e.obj.store(Arc::into_raw(o) as usize, Ordering::Relaxed);
    e.state.store(2, Ordering::Release);
    PARKED_N.fetch_add(1, Ordering::AcqRel);
    true
}

/// [`private_io`] from a signal handler: the duplicate is marked ours by a tag (no object is
/// allocated; [`unpark_closes`] makes it); -1 when none could be made there (the call's I/O
/// then fails as on a socket that went).
fn handler_private_io(fd: c_int, c: &Conn) -> c_int {
    let e0 = real::errno();
    let base = private_base();
    // SAFETY: plain fcntl on a number that names the socket (the close has not happened).
    let p = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, base as libc::c_ulong) };
    real::set_errno(e0);
    // Only at a number with a slot already and nothing in it: the tag allocates nothing.
    if p < 0 || !fdtable::has_slot(p) || fdtable::raw(p) != 0 {
        if p >= 0 {
            // SAFETY: our duplicate, just made.
            unsafe { real::close(p) };
            real::set_errno(e0);
        }
        c.set_private_io(crate::conn::IO_GONE);
        return -1;
    }
    crate::obj::set_close_private(fdtable::close_private);
    fdtable::set_tag(p, fdtable::TAG_PRIVATE_PENDING);
    if !c.set_private_io(p) {
        drop(fdtable::replace(p, Slot::Empty));
        // SAFETY: our duplicate, just made.
        unsafe { real::close(p) };
        real::set_errno(e0);
        return -1;
    }
    p
}

/// The rest of the closes a program's signal handler made ([`park_for_handler`]), at a call
/// into the library outside a handler (one load while there are none).
#[inline]
pub fn unpark_closes() {
    if PARKED_N.load(Ordering::Acquire) != 0 {
        unpark_slow();
    }
}

#[cold]
fn unpark_slow() {
    if crate::signals::in_handler() || lifecycle::in_vfork_child() {
        return;
    }
    for e in &PARKED {
        if PARKED_N.load(Ordering::Acquire) == 0 {
            return;
        }
        if e.state
            .compare_exchange(2, 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let (pid, fd, obj, private) = (
            e.pid.load(Ordering::Relaxed),
            e.fd.load(Ordering::Relaxed),
            e.obj.load(Ordering::Relaxed),
            e.private.load(Ordering::Relaxed),
        );
        e.state.store(0, Ordering::Release);
        PARKED_N.fetch_sub(1, Ordering::AcqRel);
        let pending = private >= 0 && fdtable::raw(private) & !1 == fdtable::TAG_PRIVATE_PENDING;
        if pid != crate::pid() {
            // Parked by the parent before this child's fork: the child's copy of the object
            // was never counted as held here (as any object no number of the child names),
            // nor is the duplicate for the parent's call.
            if pending {
                drop(fdtable::replace(private, Slot::Empty));
                let e0 = real::errno();
                // SAFETY: our copy of the parent's duplicate.
                unsafe { real::close(private) };
                real::set_errno(e0);
            }
            continue;
        }
        // SAFETY: the reference `park_for_handler` took with `Arc::into_raw`, given back once
        // (the entry was claimed above).
        let o = unsafe { Arc::from_raw(obj as *const Obj) };
        if pending {
            // The duplicate's object, which a handler could not allocate.
            fdtable::set_private(private, Arc::downgrade(&o));
        }
        // What was kept under the number for this socket (no new file there was given any:
        // only a call into the library does, which comes here first).
        epoll::on_close(fd, false, Some(&o));
        setup::unretire(fd);
        forget_clc_bytes(fd as i64, fd as i64);
        drop(o);
    }
}

pub unsafe fn close(fd: c_int) -> c_int {
    if fdtable::raw(fd) >= 8 && crate::signals::in_handler() {
        if !lifecycle::own_fd_table() && park_for_handler(fd) {
            // SAFETY: the caller's argument: the number closes now (the rest of our part at
            // [`unpark_closes`]).
            return unsafe { real::close(fd) };
        }
    } else {
        unpark_closes();
    }
    // (`own_fd_table` costs a system call: asked last, only when it matters.)
    if fdtable::maybe_private(fd) && crate::fdtable::is_private(fd) && !lifecycle::own_fd_table() {
        // Ours, never handed to the application: for it that number is not open.
        return fail(libc::EBADF) as c_int;
    }
    if fdtable::raw(fd) == 0 && lifecycle::shadowing_now() {
        lifecycle::vfork_shadow(fd);
    }
    if fdtable::raw(fd) != 0 {
        if lifecycle::own_fd_table() {
            // A table of this thread's own (a vfork child, an unshared one): the number may
            // name another file next, here only.
            lifecycle::vfork_shadow(fd);
        } else {
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Handshake(h) = &*o {
                    // The other end is a socket of this process: the handshake is decided
                    // first, driving that end (microseconds), so that the close is the
                    // connection's (a close with the other end's CLC message unread would
                    // reset it, where TCP sends a FIN).
                    setup::decide_own_before_close(fd, h);
                }
                if let Some(Obj::Handshake(h)) = fdtable::get(fd).as_deref() {
                    setup::end_before_close(fd, h);
                }
                sweep_before_close(fd, &o);
                if let Obj::Conn(c) = &*o {
                    if c.last_holder() && c.peer_switch_waits() {
                        // The peer asked to switch to TCP and waits for our answer (its
                        // marker, and what it did not read of ours, over TCP): our last close
                        // answers first, so that our bytes reach its next image before our
                        // FIN (red team rt14 `writeclose`: a server that wrote and closed at
                        // once while its client handed its end on lost every record, 6 of
                        // 40 runs).
                        lifecycle::continue_on_tcp(fd, &o);
                    }
                }
            }
            forget_fd(fd);
        }
    }
    if daemon::is_daemon_fd(fd) && !lifecycle::own_fd_table() {
        // Ours, never handed to the application: for it that number is not open.
        return fail(libc::EBADF) as c_int;
    }
    forget_clc_bytes(fd as i64, fd as i64);
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `close`.
    unsafe { real::close(fd) }
}

/// `closefrom(3)`: every number from `lowfd` on, through our [`close_range`] (which keeps our
/// own descriptors); where the kernel has no `close_range`, one `close` per number below the
/// descriptor limit, as glibc's fallback does.
pub unsafe fn closefrom(lowfd: c_int) {
    let first = lowfd.max(0) as libc::c_uint;
    // SAFETY: integer arguments only.
    if unsafe { close_range(first, libc::c_uint::MAX, 0) } == 0 {
        return;
    }
    let e = real::errno();
    // SAFETY: a zeroed rlimit is valid; getrlimit fills it.
    let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    let lim = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0 {
        rl.rlim_cur.min(1 << 20) as c_int
    } else {
        1024
    };
    for fd in lowfd.max(0)..lim {
        if !daemon::is_daemon_fd(fd) && !crate::fdtable::is_private(fd) {
            // SAFETY: integer argument only.
            unsafe { close(fd) };
        }
    }
    real::set_errno(e);
}

/// Before a close of `fd` that may be its socket's last (and send its FIN): a client whose
/// Accept did not come has its server end swept first ([`setup::sweep_peer_before_fin`]), by
/// `close`, `close_range`, `dup2` onto it and `fclose` alike (and `_exit`, the exit hook).
fn sweep_before_close(fd: c_int, o: &Obj) {
    if let Obj::Skip(s) = o {
        setup::sweep_peer_before_fin(fd, s);
    }
}

pub unsafe fn close_range(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    if crate::signals::in_handler() {
        if flags == 0 && fdtable::any_objects() && !lifecycle::own_fd_table() {
            // SAFETY: the caller's arguments.
            return unsafe { close_range_in_handler(first, last) };
        }
    } else {
        unpark_closes();
    }
    // SAFETY: the caller's arguments.
    unsafe { close_range_ordinary(first, last, flags) }
}

unsafe fn close_range_ordinary(first: libc::c_uint, last: libc::c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_UNSHARE as c_int != 0 {
        // The kernel gives this thread a table of its own first, and closes in it.
        lifecycle::fd_table_unshared();
    }
    let closing = flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && !lifecycle::own_fd_table();
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 && !closing && fdtable::any_objects() {
        // Closed in this thread's own table only: the numbers of our sockets in the range may
        // name other files there next.
        let hi = (last as u64).min(fdtable::MAX_FDS as u64 - 1);
        if (first as u64) <= hi {
            lifecycle::vfork_shadow_range(first as c_int, hi as c_int);
        }
    }
    // Our own descriptors in the range (private duplicates of sockets) stay open.
    let mut ours: Vec<libc::c_uint> = Vec::new();
    if closing && fdtable::any_objects() {
        let hi = (last as u64).min(fdtable::MAX_FDS as u64 - 1);
        for (fd, o) in fdtable::all_objects() {
            if (fd as u64) >= first as u64 && (fd as u64) <= hi && !matches!(&*o, Obj::Private(_)) {
                sweep_before_close(fd, &o);
                forget_fd(fd);
            }
        }
        // Collected after those closes: a close under a call in flight makes a private
        // duplicate, possibly inside the range (`tests/redteam/rt5.c close_range_inflight`).
        for (fd, o) in fdtable::all_objects() {
            if (fd as u64) >= first as u64 && (fd as u64) <= hi && matches!(&*o, Obj::Private(_)) {
                ours.push(fd as libc::c_uint);
            }
        }
    }
    if closing {
        forget_clc_bytes(first as i64, last as i64);
    }
    // Our daemon connection may lie in the range (it may even have been opened by the closes
    // above, which give DMBs back): the range is closed around it.
    if closing {
        if let Some(d) = daemon::daemon_fd_in(first, last) {
            ours.push(d as libc::c_uint);
        }
    }
    close_range_around(first, last, flags, &mut ours)
}

/// `close_range(first, last, flags)` of every number but `ours` (our own numbers in the range,
/// any order: sorted here). Allocates nothing (also from a signal handler).
fn close_range_around(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
    ours: &mut [libc::c_uint],
) -> c_int {
    if ours.is_empty() {
        // SAFETY: integer arguments only (close_range(2)).
        return unsafe { real::close_range(first, last, flags) };
    }
    ours.sort_unstable();
    let mut from = first;
    for &d in ours.iter() {
        if d > from {
            // SAFETY: integer arguments only (close_range(2)).
            let r = unsafe { real::close_range(from, d - 1, flags) };
            if r != 0 {
                return r;
            }
        }
        if d == libc::c_uint::MAX {
            return 0;
        }
        from = from.max(d + 1);
    }
    if from <= last {
        // SAFETY: integer arguments only (close_range(2)).
        return unsafe { real::close_range(from, last, flags) };
    }
    0
}

/// `close_range(first, last, 0)` called by a program's signal handler: each of our objects in
/// the range is parked ([`park_for_handler`]), and the range is closed around our own
/// descriptors (the parked ones among them) without allocating. An object that cannot be
/// parked, or more of our descriptors in the range than this keeps, and the work is done as
/// outside a handler.
unsafe fn close_range_in_handler(first: libc::c_uint, last: libc::c_uint) -> c_int {
    const KEEP_MAX: usize = 256;
    let hi = (last as u64).min(fdtable::MAX_FDS as u64 - 1);
    let in_range = |fd: i32| (fd as u64) >= first as u64 && (fd as u64) <= hi;
    let mut all = true;
    fdtable::for_each_object(|fd, o| {
        if in_range(fd) && !matches!(&**o, Obj::Private(_)) {
            all &= park_for_handler(fd);
        }
    });
    let mut keep = [0 as libc::c_uint; KEEP_MAX];
    let mut n = 0;
    fdtable::for_each_object(|fd, o| {
        if in_range(fd) && matches!(&**o, Obj::Private(_)) {
            if let Some(k) = keep.get_mut(n) {
                *k = fd as libc::c_uint;
                n += 1;
            } else {
                all = false;
            }
        }
    });
    if let Some(d) = daemon::daemon_fd_in(first, last) {
        if let Some(k) = keep.get_mut(n) {
            *k = d as libc::c_uint;
            n += 1;
        } else {
            all = false;
        }
    }
    if !all {
        // SAFETY: the caller's arguments; the objects left take the ordinary way.
        return unsafe { close_range_ordinary(first, last, 0) };
    }
    close_range_around(first, last, 0, keep.get_mut(..n).unwrap_or_default())
}

pub unsafe fn dup(fd: c_int) -> c_int {
    unpark_closes();
    // SAFETY: an fd number only.
    let r = unsafe { real::dup(fd) };
    if r >= 0 && (fdtable::raw(fd) != 0 || fdtable::raw(r) != 0) && !lifecycle::own_fd_table() {
        setup::copy_slot(fd, r);
    }
    r
}

pub unsafe fn dup3(fd: c_int, fd2: c_int, flags: c_int, three: bool) -> c_int {
    if fd == fd2 || (fdtable::raw(fd) | fdtable::raw(fd2) != 0 && lifecycle::own_fd_table()) {
        if fd != fd2 && fdtable::raw(fd2) != 0 {
            // A vfork child's own table: the number names what it dup'd there, in it only.
            lifecycle::vfork_shadow(fd2);
        }
        let r = if three {
            // SAFETY: integer arguments only (dup3(2)).
            unsafe { real::dup3(fd, fd2, flags) }
        } else {
            // SAFETY: fd numbers only (dup2(2)).
            unsafe { real::dup2(fd, fd2) }
        };
        if r >= 0 && fd != fd2 {
            // Where the parent's connections are in this table, for an exec (the slots are
            // the parent's).
            let e = real::errno();
            lifecycle::vfork_dup(fd, fd2);
            real::set_errno(e);
        }
        return r;
    }
    if fdtable::raw(fd2) >= 8 && fd != fd2 && crate::signals::in_handler() && fcntl_valid(fd) {
        // From a program's signal handler: what fd2 names is closed as by `close`.
        park_for_handler(fd2);
    } else {
        unpark_closes();
    }
    if (0..=2).contains(&fd2) && fdtable::raw(fd) >= 8 {
        lifecycle::std_stream_takes(fd);
    }
    // The old content of fd2 is closed by dup2: do our close part first, while fd2 still
    // names that socket.
    if fdtable::raw(fd2) >= 8 && crate::fdtable::is_private(fd2) {
        if fcntl_valid(fd) {
            move_private(fd2);
        }
    } else if fdtable::raw(fd2) != 0 && fcntl_valid(fd) {
        // (Not from a signal handler: `fdtable::get` takes the slot's lock, which the
        // interrupted code may hold; the sweep is never made from a handler anyway.)
        if !crate::signals::in_handler() {
            if let Some(o) = fdtable::get(fd2) {
                sweep_before_close(fd2, &o);
            }
        }
        forget_fd(fd2);
    }
    let r = if three {
        // SAFETY: integer arguments only (dup3(2)).
        unsafe { real::dup3(fd, fd2, flags) }
    } else {
        // SAFETY: fd numbers only (dup2(2)).
        unsafe { real::dup2(fd, fd2) }
    };
    if r >= 0 && fd != fd2 && !crate::signals::in_handler() {
        // What fd2 named is closed (from a handler: at the parked close's end).
        forget_clc_bytes(fd2 as i64, fd2 as i64);
    }
    if r >= 0 && fdtable::raw(fd) != 0 {
        setup::copy_slot(fd, r);
    }
    r
}

/// The numbers `lo..=hi` close (or name other files next): the CLC bytes recorded for the
/// connections that fell back on them go ([`crate::handshake::clc_bytes`]). Not in a table of
/// this thread's own (a vfork child shares our memory, not our numbers).
fn forget_clc_bytes(lo: i64, hi: i64) {
    if crate::handshake::clc_bytes_any() && !lifecycle::own_fd_table() {
        crate::handshake::forget_clc_bytes(lo, hi);
    }
}

fn fcntl_valid(fd: c_int) -> bool {
    let e0 = real::errno();
    // SAFETY: F_GETFD has no argument.
    let ok = unsafe { real::fcntl(fd, libc::F_GETFD, 0) } >= 0;
    real::set_errno(e0);
    ok
}

pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: libc::c_ulong) -> c_int {
    unpark_closes();
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `fcntl`.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r < 0 || fdtable::raw(fd) == 0 {
        return r;
    }
    match cmd {
        // Not in a vfork child, whose numbers are not its parent's (`in_vfork_child`, a system
        // call, asked only where it matters: `F_GETFL`/`F_SETFL` are an event loop's calls per
        // connection).
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC if !lifecycle::own_fd_table() => {
            setup::copy_slot(fd, r)
        }
        libc::F_SETFL => {
            if let Some(o) = fdtable::get(fd) {
                let on = arg as c_int & libc::O_NONBLOCK != 0;
                match &*o {
                    Obj::Conn(c) if !lifecycle::own_fd_table() => {
                        c.set_nonblocking(on);
                        // O_ASYNC: the kernel took it (`sock_fasync`); the writer must ring.
                        let asy = arg as c_int & libc::O_ASYNC != 0;
                        if asy != (c.flags() & crate::conn::F_ASYNC != 0) {
                            c.set_async(asy);
                        }
                    }
                    Obj::Handshake(h) if !lifecycle::own_fd_table() => {
                        h.nonblock.store(on, Ordering::Relaxed)
                    }
                    _ => {}
                }
            }
        }
        _ => {}
    }
    r
}

pub unsafe fn ioctl(fd: c_int, req: libc::c_ulong, arg: libc::c_ulong) -> c_int {
    if slow(fd) && req == libc::FIONBIO as libc::c_ulong {
        if let Some(o) = fdtable::get(fd) {
            if let Obj::Handshake(h) = &*o {
                // SAFETY: the caller's arguments, passed on unchanged: this function has the
                // contract of libc's `ioctl`.
                let r = unsafe { real::ioctl(fd, req, arg) };
                if r == 0 && arg != 0 {
                    h.nonblock
                        // SAFETY: FIONBIO's argument is the caller's int pointer, non-null
                        // (checked) and just read by the kernel without EFAULT.
                        .store(unsafe { *(arg as *const c_int) } != 0, Ordering::Relaxed);
                }
                return r;
            }
        }
    }
    if slow(fd)
        && arg != 0
        && low_ptr(arg as usize)
        && matches!(req, libc::FIONREAD | libc::TIOCOUTQ | SIOCATMARK)
    {
        // A pointer the kernel cannot write to: its `EFAULT` (NULL keeps its own paths below).
        // SAFETY: the caller's arguments, passed on unchanged.
        return unsafe { real::ioctl(fd, req, arg) };
    }
    if slow(fd) {
        if let Some(m) = moved_first(fd, Op::Other) {
            // SAFETY: the caller's arguments, on the connection's own descriptor.
            return unsafe { ioctl(m.fd, req, arg) };
        }
        if req == libc::FIONREAD && arg != 0 {
            if let Some(n) = stashed_inq(fd) {
                // SAFETY: FIONREAD's argument is the caller's writable int pointer (ioctl's
                // contract), non-null (checked).
                unsafe { *(arg as *mut c_int) = n };
                return 0;
            }
        }
        if let Some(o) = conn_of(fd) {
            let Some(c) = o.conn() else {
                // A handshake still waiting for its peer: nothing to read or unsent yet.
                if matches!(req, libc::FIONREAD | libc::TIOCOUTQ) && arg != 0 {
                    // SAFETY: the application's int, as for the real ioctl.
                    unsafe { *(arg as *mut c_int) = 0 };
                    return 0;
                }
                // SAFETY: the caller's arguments, passed on unchanged: this function has the
                // contract of libc's `ioctl`.
                return unsafe { real::ioctl(fd, req, arg) };
            };
            match req {
                libc::FIONREAD => {
                    if arg == 0 {
                        return fail(libc::EFAULT) as c_int;
                    }
                    c.urg_note(fd);
                    // SAFETY: FIONREAD's argument is the caller's writable int pointer (ioctl's
                    // contract), non-null (checked).
                    unsafe { *(arg as *mut c_int) = c.inq() as c_int };
                    return 0;
                }
                SIOCATMARK => {
                    if arg == 0 {
                        return fail(libc::EFAULT) as c_int;
                    }
                    c.urg_note(fd);
                    // SAFETY: SIOCATMARK's argument is the caller's writable int pointer
                    // (ioctl's contract), non-null (checked).
                    unsafe { *(arg as *mut c_int) = c_int::from(c.at_mark()) };
                    return 0;
                }
                libc::TIOCOUTQ => {
                    if arg == 0 {
                        return fail(libc::EFAULT) as c_int;
                    }
                    // SIOCOUTQ: TCP counts the bytes its peer's kernel has not acknowledged,
                    // 0 on loopback once they sit in the peer's receive queue. A write here puts
                    // its bytes straight into the peer's receive ring (the DMB) or waits for
                    // room, so nothing is ever in flight: 0, as TCP.
                    // SAFETY: TIOCOUTQ's argument is the caller's writable int pointer (ioctl's
                    // contract), non-null (checked).
                    unsafe { *(arg as *mut c_int) = 0 };
                    return 0;
                }
                libc::FIONBIO => {
                    // SAFETY: the caller's arguments, passed on unchanged: this function has the
                    // contract of libc's `ioctl`.
                    let r = unsafe { real::ioctl(fd, req, arg) };
                    if r == 0 && arg != 0 {
                        // SAFETY: FIONBIO's argument is the caller's int pointer, non-null
                        // (checked) and just read by the kernel without EFAULT.
                        c.set_nonblocking(unsafe { *(arg as *const c_int) } != 0);
                    }
                    return r;
                }
                libc::FIOASYNC => {
                    // SAFETY: the caller's arguments, passed on unchanged: this function has the
                    // contract of libc's `ioctl`.
                    let r = unsafe { real::ioctl(fd, req, arg) };
                    if r == 0 && arg != 0 {
                        // SAFETY: FIOASYNC's argument is the caller's int pointer, non-null
                        // (checked) and just read by the kernel without EFAULT.
                        c.set_async(unsafe { *(arg as *const c_int) } != 0);
                    }
                    return r;
                }
                _ => {}
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `ioctl`.
    unsafe { real::ioctl(fd, req, arg) }
}

pub unsafe fn shutdown(fd: c_int, how: c_int) -> c_int {
    if slow(fd) {
        if let Some(m) = moved_first(fd, Op::Other) {
            // SAFETY: integer arguments only, on the connection's own descriptor.
            return unsafe { shutdown(m.fd, how) };
        }
        if let Some(o) = conn_of(fd) {
            // (A handshake still waiting for its peer is shut as a TCP socket: the peer's
            // machine sees the end of the stream and falls back or resets.)
            if o.conn().is_some() {
                let Some(call) = InCall::enter(fd, o) else {
                    // Closed meanwhile: the call goes to what the number names now.
                    // SAFETY: integer arguments only.
                    return unsafe { shutdown(fd, how) };
                };
                let c = call.conn();
                // `inet_shutdown` on a socket in CLOSE (reset, or both FINs) still shuts it
                // but says ENOTCONN.
                let closed = c.tcp_state() == Some(crate::conn::TCP_CLOSE);
                return match c.shutdown(fd, how) {
                    Ok(()) if closed => {
                        crate::epoll::conn_changed(fd, c);
                        fail(libc::ENOTCONN) as c_int
                    }
                    Ok(()) => {
                        // TCP wakes the socket's waiters at a shutdown; ours may be parked.
                        crate::epoll::conn_changed(fd, c);
                        0
                    }
                    Err(e) => fail(e) as c_int,
                };
            }
        }
        if how != libc::SHUT_RD {
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Skip(s) = &*o {
                    setup::sweep_peer_before_fin(fd, s);
                }
            }
        }
    }
    // SAFETY: integer arguments only.
    unsafe { real::shutdown(fd, how) }
}

/// In a forked child: the calls in flight on our connections were the parent's threads' (they do
/// not exist here), and a private duplicate of a socket whose connection no number of the child
/// names is closed (it would hold the socket open for as long as the child lives).
pub fn conns_after_fork_child() {
    // Duplicates calls of the parent went on with: the child's copies go (the calls do not
    // exist here; the peer must see the close when the parent's call ends, not when the child
    // exits).
    let moved = std::mem::take(&mut *MOVED.lock());
    for (p, ino) in moved {
        crate::fdtable::close_moved(p, ino);
    }
    let mut gone = Vec::new();
    fdtable::for_each_object(|fd, o| match &**o {
        Obj::Conn(c) => c.forget_calls_after_fork(),
        Obj::Handshake(h) => {
            h.calls.store(0, Ordering::SeqCst);
            h.io.forget_calls_after_fork();
        }
        Obj::Private(w)
            if w.upgrade()
                .is_none_or(|x| x.conn().is_none_or(|c| c.numbers() == 0)) =>
        {
            gone.push((fd, w.clone()));
        }
        _ => {}
    });
    for (p, w) in gone {
        if let Some(owner) = w.upgrade() {
            owner.move_private_io(p, crate::conn::IO_GONE);
        }
        crate::fdtable::close_private(p);
    }
}

/// Epoll sets a `fork` holds at most ([`hold_epoll_sets`]); a process with more holds the
/// first ones and leaves the others as a set busy at the fork is left.
const FORK_SETS_MAX: usize = 32;

/// Each epoll set of the (frozen) table once, without allocating (a `fork` from a signal
/// handler must not).
fn epoll_sets() -> [Option<Arc<Obj>>; FORK_SETS_MAX] {
    let mut sets: [Option<Arc<Obj>>; FORK_SETS_MAX] = std::array::from_fn(|_| None);
    let mut n = 0;
    fdtable::for_each_object(|_, o| {
        if !matches!(&**o, Obj::Epoll(_)) || sets.iter().flatten().any(|x| Arc::ptr_eq(x, o)) {
            return;
        }
        if let Some(free) = sets.get_mut(n) {
            *free = Some(o.clone());
            n += 1;
        }
    });
    sets
}

/// The locks of `sets`, all of them, or as many as could be taken within 100 ms: each is
/// taken only when free (no wait while holding others, so no order between them matters), and
/// all are let go to try again when one is busy (its holder may wait for the table this
/// thread froze for the fork: bounded, the residual is a set its thread held).
fn hold_epoll_sets(
    sets: &[Option<Arc<Obj>>; FORK_SETS_MAX],
) -> [Option<impl Sized + '_>; FORK_SETS_MAX] {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
    loop {
        let mut all = true;
        let held = std::array::from_fn(|i| match sets.get(i).and_then(|o| o.as_deref()) {
            Some(Obj::Epoll(s)) => {
                let g = s.try_hold();
                all &= g.is_some();
                g
            }
            _ => None,
        });
        if all || std::time::Instant::now() >= deadline {
            return held;
        }
        drop(held);
        std::thread::yield_now();
    }
}

/// How long a `fork` drives the handshakes under way before it forks, in all.
const FORK_HANDSHAKE_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Numbers the forks of this process (the marks of [`Conn::mark_for_fork`]).
static FORK_SEQ: AtomicU64 = AtomicU64::new(0);

/// The fork under way came from a handler of a single-threaded process
/// ([`crate::signals::in_handler_of_single_thread`]): set by the parent before it forks, read
/// by the child's fork handlers.
static FORK_LIGHT: AtomicBool = AtomicBool::new(false);

/// In a child just forked: whether it must skip the work that allocates. The child of a
/// handler of a single-threaded process may hold a heap that the handler interrupted half way
/// through an update, and it has nothing to do for other threads of its parent (there were
/// none): its copies are the forking thread's, whose interrupted code carries them on if the
/// child returns from the handler.
pub fn child_must_not_allocate() -> bool {
    FORK_LIGHT.load(Ordering::Relaxed) || crate::signals::in_handler_of_single_thread()
}

/// Drives the handshakes under way to their decision before a `fork` or `vfork`, within
/// [`FORK_HANDSHAKE_WAIT`] in all; not one that another thread is driving now (it stays that
/// thread's: red team round 15, finding 11, `fork` waited up to 1.8 s for other threads'
/// handshakes). Not from a signal handler (the caller checks).
fn decide_handshakes_for_fork() {
    let until = std::time::Instant::now() + FORK_HANDSHAKE_WAIT;
    for (fd, o) in fdtable::all_objects() {
        if let Obj::Handshake(h) = &*o {
            if !matches!(
                h.driver.try_lock(),
                Err(std::sync::TryLockError::WouldBlock)
            ) {
                setup::progress_until(fd, h, Some(Some(until)));
            }
        }
    }
}

/// Before `vfork` (the interposed `vfork` calls this, then jumps to libc's; see
/// `interpose::vfork`): the child runs in our memory until it execs, with a copy of our
/// descriptor table, and whatever it `dup2`s onto its standard fds (an inetd-style child,
/// CPython's `subprocess` with `stdin=conn`, close-on-exec or not) the next image inherits.
/// The child cannot drive a handshake (its driver and daemon client are ours), and an image
/// without the library that inherits one undecided reads the peer's CLC messages as data
/// (red team round 30: an accept loop that accepts non-blocking and `vfork`s `cat` on the
/// connection at once: `cat` echoed the client's Proposal, or the client was reset). So every
/// handshake under way is decided first, as for `fork`; the child's exec then finds an SMC-D
/// connection (adopted, or switched to TCP for an image without the library) or a fallback,
/// whose late CLC messages, where they are there already, are skipped here too. Errno is
/// preserved (the application's `vfork` has not run yet).
pub fn before_vfork() {
    if crate::signals::in_handler() || lifecycle::in_vfork_child() || !fdtable::any_objects() {
        return;
    }
    let e = real::errno();
    decide_handshakes_for_fork();
    for (fd, o) in fdtable::all_objects() {
        if let Obj::Skip(s) = &*o {
            setup::skip_late_clc(fd, fd, &o, s);
        }
    }
    real::set_errno(e);
}

pub unsafe fn fork() -> libc::pid_t {
    // Handshakes under way are finished first: parent and child must agree on what the fd is
    // (a fork-per-connection server forks right after `accept`, and its child serves the
    // connection). One the child finds undecided it cannot use (`setup::after_fork_child`:
    // ECONNRESET), the parent carries it on. Bounded: within `FORK_HANDSHAKE_WAIT` in all;
    // not one that another thread is driving now (it stays that thread's: red team round 15,
    // finding 11, `fork` waited up to 1.8 s for other threads' handshakes); and none from a
    // signal handler (a handshake's step may ask the daemon, whose client the interrupted code
    // may hold, or wait for an accept of the very code the handler interrupted: every `fork`
    // of a SIGALRM handler interrupting a loop of connections hung, 3 of 3 runs).
    if !crate::signals::in_handler() {
        decide_handshakes_for_fork();
    }
    // From here to the fork the table stands still for the other threads: the child's copy
    // names exactly the connections counted here. Nothing below allocates or frees: a `fork`
    // from a signal handler may run inside an interrupted `malloc` (`preload-prog sigfork`:
    // ~100 of 300 such children aborted in glibc's heap checks).
    let frozen = fdtable::freeze_for_fork();
    let seq = FORK_SEQ.fetch_add(1, Ordering::Relaxed) + 1;
    // Each connection object's holder once (dup'd fds share it): the child's copy holds it too.
    fdtable::for_each_object(|_, o| match &**o {
        Obj::Conn(c) => {
            c.add_ref(1);
            if c.mark_for_fork(seq) {
                c.add_holder();
            }
        }
        Obj::Epoll(s) => s.before_fork(),
        _ => {}
    });
    // Any epoll set (also one the library has not seen yet) is shared with the child.
    crate::epoll::before_fork_of_a_set();
    // Each epoll set's lock, held across the fork: a thread of this process inside one at the
    // fork left the child's copy locked for ever (red team round 15, finding 8: 31 of 100
    // children that used their parent's set hung, two threads of the parent busy on it).
    let sets = epoll_sets();
    let held = hold_epoll_sets(&sets);
    let kept = crate::dmbs::before_fork();
    FORK_LIGHT.store(
        crate::signals::in_handler_of_single_thread(),
        Ordering::Relaxed,
    );
    // SAFETY: fork(2) has no arguments; the child only resets our per-process state before
    // returning.
    let r = unsafe { real::fork() };
    drop(held);
    if r == 0 {
        crate::dmbs::after_fork_child(kept, child_must_not_allocate());
        crate::reset_pid();
        lifecycle::shadows_after_fork();
        fdtable::for_each_object(|_, o| {
            if let Obj::Conn(c) = &**o {
                c.holder_forked();
            }
        });
    } else if r > 0 {
        crate::dmbs::after_fork_parent(kept);
        fdtable::for_each_object(|_, o| {
            if let Obj::Epoll(s) = &**o {
                s.after_fork_parent(r as u32);
            }
        });
    } else {
        crate::dmbs::after_fork_parent(kept);
        // The table still stands still: the same objects as counted above.
        fdtable::for_each_object(|_, o| {
            if let Obj::Conn(c) = &**o {
                c.drop_ref();
                if c.unmark_for_fork(seq) {
                    c.leave_holders();
                }
            }
        });
    }
    // The clones go while the table still holds every object: none of them is the last.
    drop(sets);
    drop(frozen);
    if r == 0 {
        fdtable::unlock_all_after_fork();
        if !child_must_not_allocate() {
            setup::after_fork_child();
            conns_after_fork_child();
        }
        FORK_LIGHT.store(false, Ordering::Relaxed);
    } else {
        FORK_LIGHT.store(false, Ordering::Relaxed);
        if r > 0 {
            daemon::after_fork_parent();
        }
    }
    r
}

// ---------------------------------------------------------------------------------------
// syscall(2) and fclose(3): closes behind the application's calls

/// `syscall(2)`: the closes, dups and the io_uring setup that runtimes issue through it are
/// seen; everything else goes straight to libc.
///
/// # Safety
/// The arguments of the system call `n`, as the caller passed them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn syscall(
    n: libc::c_long,
    a1: libc::c_long,
    a2: libc::c_long,
    a3: libc::c_long,
    a4: libc::c_long,
    a5: libc::c_long,
    a6: libc::c_long,
) -> libc::c_long {
    let data_call = matches!(
        n,
        libc::SYS_read
            | libc::SYS_write
            | libc::SYS_readv
            | libc::SYS_writev
            | libc::SYS_recvfrom
            | libc::SYS_sendto
            | libc::SYS_recvmsg
            | libc::SYS_sendmsg
    );
    if data_call && !is_stream(a1 as c_int) {
        // Not one of our connections: the system call itself. The library's own messages to
        // its daemon go this way (`smc_ism::sys`: our `sendmsg` would take the socket it
        // passes for an application's `SCM_RIGHTS` and deadlock on its handshake).
        // SAFETY: the caller's arguments, with the meaning the system call gives them.
        return unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) };
    }
    match n {
        // SAFETY: an fd number only; close has the contract of close(2).
        libc::SYS_close => unsafe { close(a1 as c_int) as libc::c_long },
        // SAFETY: an integer argument only, with the meaning unshare(2) gives it.
        libc::SYS_unshare => unsafe {
            let r = real::syscall(n, a1, a2, a3, a4, a5, a6);
            if r == 0 && a1 & libc::CLONE_FILES as libc::c_long != 0 {
                lifecycle::fd_table_unshared();
            }
            r
        },
        // SAFETY: fd numbers and flags only; close_range has the contract of close_range(2).
        libc::SYS_close_range => unsafe {
            close_range(a1 as libc::c_uint, a2 as libc::c_uint, a3 as c_int) as libc::c_long
        },
        // SAFETY: an fd number only; dup has the contract of dup(2).
        libc::SYS_dup => unsafe { dup(a1 as c_int) as libc::c_long },
        // SAFETY: fd numbers only; dup3 has the contract of dup2(2).
        libc::SYS_dup2 => unsafe { dup3(a1 as c_int, a2 as c_int, 0, false) as libc::c_long },
        // SAFETY: fd numbers and flags only; dup3 has the contract of dup3(2).
        libc::SYS_dup3 => unsafe {
            dup3(a1 as c_int, a2 as c_int, a3 as c_int, true) as libc::c_long
        },
        // The data calls on our connections, made through `syscall` (a program that bypasses
        // libc's wrappers): they go where the wrappers go.
        // Each `ops` function has the contract of that system call's libc wrapper, with its
        // errno convention (-1 and `errno`), which is `syscall`'s too.
        // SAFETY: the caller's arguments, with the meaning `read(2)` gives them.
        libc::SYS_read => unsafe {
            read(a1 as c_int, a2 as *mut libc::c_void, a3 as libc::size_t) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `write(2)` gives them.
        libc::SYS_write => unsafe {
            write(a1 as c_int, a2 as *const libc::c_void, a3 as libc::size_t) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `readv(2)` gives them.
        libc::SYS_readv => unsafe {
            readv(a1 as c_int, a2 as *const libc::iovec, a3 as c_int) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `writev(2)` gives them.
        libc::SYS_writev => unsafe {
            writev(a1 as c_int, a2 as *const libc::iovec, a3 as c_int) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `recvfrom(2)` gives them.
        libc::SYS_recvfrom => unsafe {
            recvfrom(
                a1 as c_int,
                a2 as *mut libc::c_void,
                a3 as libc::size_t,
                a4 as c_int,
                a5 as *mut libc::sockaddr,
                a6 as *mut libc::socklen_t,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `sendto(2)` gives them.
        libc::SYS_sendto => unsafe {
            sendto(
                a1 as c_int,
                a2 as *const libc::c_void,
                a3 as libc::size_t,
                a4 as c_int,
                a5 as *const libc::sockaddr,
                a6 as libc::socklen_t,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `recvmsg(2)` gives them.
        libc::SYS_recvmsg => unsafe {
            recvmsg(a1 as c_int, a2 as *mut libc::msghdr, a3 as c_int) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `sendmsg(2)` gives them.
        libc::SYS_sendmsg => unsafe {
            sendmsg(a1 as c_int, a2 as *const libc::msghdr, a3 as c_int) as libc::c_long
        },
        // The socket calls the data path takes part in, made through `syscall` (a program
        // or runtime that bypasses libc's wrappers): they go where the wrappers go. Each has
        // the contract of its wrapper, with `syscall`'s errno convention.
        // SAFETY: the caller's arguments, with the meaning `connect(2)` gives them.
        libc::SYS_connect => unsafe {
            connect(
                a1 as c_int,
                a2 as *const libc::sockaddr,
                a3 as libc::socklen_t,
            ) as libc::c_long
        },
        // SAFETY: integer arguments only (`listen(2)`).
        libc::SYS_listen => unsafe { listen(a1 as c_int, a2 as c_int) as libc::c_long },
        // SAFETY: the caller's arguments, with the meaning `accept(2)` gives them.
        libc::SYS_accept => unsafe {
            accept4(
                a1 as c_int,
                a2 as *mut libc::sockaddr,
                a3 as *mut libc::socklen_t,
                0,
                false,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `accept4(2)` gives them.
        libc::SYS_accept4 => unsafe {
            accept4(
                a1 as c_int,
                a2 as *mut libc::sockaddr,
                a3 as *mut libc::socklen_t,
                a4 as c_int,
                true,
            ) as libc::c_long
        },
        // SAFETY: integer arguments only (`shutdown(2)`).
        libc::SYS_shutdown => unsafe { shutdown(a1 as c_int, a2 as c_int) as libc::c_long },
        // SAFETY: the caller's arguments, with the meaning `fcntl(2)` gives them.
        libc::SYS_fcntl => unsafe {
            fcntl(a1 as c_int, a2 as c_int, a3 as libc::c_ulong) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `ioctl(2)` gives them.
        libc::SYS_ioctl => unsafe {
            ioctl(a1 as c_int, a2 as libc::c_ulong, a3 as libc::c_ulong) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `getsockopt(2)` gives them.
        libc::SYS_getsockopt => unsafe {
            getsockopt(
                a1 as c_int,
                a2 as c_int,
                a3 as c_int,
                a4 as *mut libc::c_void,
                a5 as *mut libc::socklen_t,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `setsockopt(2)` gives them.
        libc::SYS_setsockopt => unsafe {
            setsockopt(
                a1 as c_int,
                a2 as c_int,
                a3 as c_int,
                a4 as *const libc::c_void,
                a5 as libc::socklen_t,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `poll(2)` gives them.
        libc::SYS_poll => unsafe {
            poll(a1 as *mut libc::pollfd, a2 as libc::nfds_t, a3 as c_int) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `epoll_ctl(2)` gives them.
        libc::SYS_epoll_ctl => unsafe {
            epoll_ctl(
                a1 as c_int,
                a2 as c_int,
                a3 as c_int,
                a4 as *mut libc::epoll_event,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `epoll_wait(2)` gives them.
        libc::SYS_epoll_wait => unsafe {
            epoll_wait(
                a1 as c_int,
                a2 as *mut libc::epoll_event,
                a3 as c_int,
                a4 as c_int,
                None,
            ) as libc::c_long
        },
        // SAFETY: the caller's arguments, with the meaning `epoll_pwait(2)` gives them (the
        // kernel's sixth argument, the mask's size, is the wrapper's to pass).
        libc::SYS_epoll_pwait => unsafe {
            epoll_wait(
                a1 as c_int,
                a2 as *mut libc::epoll_event,
                a3 as c_int,
                a4 as c_int,
                (a5 != 0).then_some(a5 as *const libc::sigset_t),
            ) as libc::c_long
        },
        libc::SYS_pidfd_getfd => {
            // SAFETY: the caller's arguments, with the meaning the system call gives them.
            let r = unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) };
            if r >= 0 {
                let e = real::errno();
                fd_created(r as c_int);
                real::set_errno(e);
                lifecycle::fd_taken_from_another_process(r as c_int);
            }
            r
        }
        libc::SYS_io_uring_setup => {
            // SAFETY: the caller's arguments, with the meaning the system call gives them.
            let r = unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) };
            if r >= 0 {
                fd_created(r as c_int);
                lifecycle::io_uring_seen();
            }
            r
        }
        // SAFETY: the caller's arguments, with the meaning the system call gives them.
        _ => unsafe { real::syscall(n, a1, a2, a3, a4, a5, a6) },
    }
}

/// `fclose(3)`: a `FILE` made by `fdopen` on one of our sockets closes it inside libc.
///
/// # Safety
/// `f` is the caller's `FILE`.
pub unsafe fn fclose(f: *mut libc::FILE) -> c_int {
    if !f.is_null() && fdtable::any_objects() {
        // SAFETY: a valid FILE (the caller's contract).
        let fd = unsafe { libc::fileno(f) };
        if fd >= 0 && fdtable::raw(fd) != 0 && !lifecycle::in_vfork_child() {
            // The fd still names the socket: our close part runs as for close(2).
            if let Some(o) = fdtable::get(fd) {
                sweep_before_close(fd, &o);
            }
            forget_fd(fd);
        }
    }
    // SAFETY: as above.
    unsafe { real::fclose(f) }
}

// ---------------------------------------------------------------------------------------
// readiness

/// More entries than `RLIMIT_NOFILE` are `EINVAL` in `poll`/`ppoll` (`do_sys_poll`), before any
/// is read. The limit is asked only for sets of more than 64 entries (one system call).
fn poll_too_many(n: libc::nfds_t) -> bool {
    if n <= 64 {
        return false;
    }
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) == 0 && n > rl.rlim_cur }
}

/// A `timespec` the kernel refuses (`timespec64_valid`): negative seconds, nanoseconds outside
/// `0..1e9`. Null (no timeout) is valid.
fn ts_invalid(t: *const libc::timespec) -> bool {
    // SAFETY: non-null, the caller's timespec by ppoll/pselect's contract.
    !t.is_null() && unsafe { (*t).tv_sec < 0 || !(0..1_000_000_000).contains(&(*t).tv_nsec) }
}

fn einval() -> c_int {
    err(libc::EINVAL)
}

/// -1 with errno `e`, for the calls that return an int.
fn err(e: c_int) -> c_int {
    real::set_errno(e);
    -1
}

pub unsafe fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    unpark_closes();
    daemon::flush_releases();
    if fdtable::any_objects() && !low_ptr(fds as usize) && n > 0 {
        if poll_too_many(n) {
            return einval();
        }
        // SAFETY: `fds` is non-null (checked) and, by poll(2)'s contract, points to `n` pollfds.
        let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        if poll::any_smc(s) {
            // SAFETY: `s` is the caller's pollfd array; no signal mask.
            return unsafe { poll::poll_emul(s, timeout, None) };
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `poll`.
    unsafe { real::poll(fds, n, timeout) }
}

fn ts_ms(t: *const libc::timespec) -> c_int {
    if t.is_null() {
        return -1;
    }
    // SAFETY: `t` is non-null (checked above); the callers pass ppoll/pselect's timespec, valid by
    // their contract.
    let t = unsafe { &*t };
    let ms = t.tv_sec * 1000 + (t.tv_nsec + 999_999) / 1_000_000;
    ms.clamp(0, i32::MAX as i64) as c_int
}

pub unsafe fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    unpark_closes();
    daemon::flush_releases();
    if fdtable::any_objects() && !low_ptr(fds as usize) && n > 0 {
        if poll_too_many(n) {
            return einval();
        }
        // SAFETY: `fds` is non-null (checked) and, by ppoll(2)'s contract, points to `n` pollfds.
        let s = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
        if poll::any_smc(s) {
            if ts_invalid(t) {
                return einval();
            }
            if bad_user_ptr(mask) {
                return err(libc::EFAULT);
            }
            let m = if mask.is_null() { None } else { Some(mask) };
            // SAFETY: `s` is the caller's pollfd array; `m` its signal mask (non-null) or None.
            return unsafe { poll::poll_emul(s, ts_ms(t), m) };
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `ppoll`.
    unsafe { real::ppoll(fds, n, t, mask) }
}

pub unsafe fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    unpark_closes();
    daemon::flush_releases();
    // SAFETY: `r`/`w`/`e` are the caller's fd_sets or null (select(2)'s contract).
    if unsafe { poll::select_has_smc(nfds, r, w, e) } {
        // The timeout in microseconds, as the kernel takes it (`kern_select`: whole seconds out
        // of `tv_usec` first; negative seconds or microseconds are `EINVAL`).
        let total_us = if t.is_null() {
            None
        } else {
            // SAFETY: `t` is non-null (checked above) and the caller's timeval (select(2)'s
            // contract).
            let tv = unsafe { &*t };
            let sec = tv.tv_sec.saturating_add(tv.tv_usec / 1_000_000);
            if sec < 0 || tv.tv_usec % 1_000_000 < 0 {
                return einval();
            }
            Some(
                (sec as u128)
                    .saturating_mul(1_000_000)
                    .saturating_add((tv.tv_usec % 1_000_000) as u128),
            )
        };
        let ms = total_us.map_or(-1, |us| us.div_ceil(1000).min(i32::MAX as u128) as c_int);
        let start = std::time::Instant::now();
        // SAFETY: `r`/`w`/`e` are the caller's fd_sets or null (select(2)'s contract).
        let res = unsafe { poll::select_emul(nfds, r, w, e, ms, None) };
        if let Some(us) = total_us {
            // What is left of the caller's time, never more than it gave (red team round 29:
            // rounded up to the millisecond, it grew).
            let left = us.saturating_sub(start.elapsed().as_micros());
            // SAFETY: `t` is non-null (`total_us` is) and the caller's writable timeval:
            // Linux's select(2) updates it too.
            let tv = unsafe { &mut *t };
            tv.tv_sec = (left / 1_000_000).min(libc::time_t::MAX as u128) as libc::time_t;
            tv.tv_usec = (left % 1_000_000) as libc::suseconds_t;
        }
        return res;
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `select`.
    unsafe { real::select(nfds, r, w, e, t) }
}

pub unsafe fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    unpark_closes();
    daemon::flush_releases();
    // SAFETY: `r`/`w`/`e` are the caller's fd_sets or null (pselect(2)'s contract).
    if unsafe { poll::select_has_smc(nfds, r, w, e) } {
        if bad_user_ptr(mask) {
            return err(libc::EFAULT);
        }
        if ts_invalid(t) {
            return einval();
        }
        let m = if mask.is_null() { None } else { Some(mask) };
        // SAFETY: `r`/`w`/`e` are the caller's fd_sets or null; `m` its signal mask (non-null) or
        // None.
        return unsafe { poll::select_emul(nfds, r, w, e, ts_ms(t), m) };
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `pselect`.
    unsafe { real::pselect(nfds, r, w, e, t, mask) }
}

pub unsafe fn epoll_ctl(ep: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int {
    unpark_closes();
    if fdtable::raw(fd) != 0 || fdtable::raw(ep) != 0 {
        // SAFETY: `ev` is the caller's epoll_event or null (epoll_ctl(2)'s contract).
        if let Some(r) = unsafe { epoll::ctl(ep, op, fd, ev) } {
            return r;
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `epoll_ctl`.
    unsafe { real::epoll_ctl(ep, op, fd, ev) }
}

pub unsafe fn epoll_wait(
    ep: c_int,
    ev: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: Option<*const libc::sigset_t>,
) -> c_int {
    // The process may sleep now: releases it kept back go out first.
    unpark_closes();
    daemon::flush_releases();
    if let Some(so) = epoll::wants(ep) {
        // SAFETY: `ev`/`max` are the caller's event array (epoll_wait(2)'s contract); `mask` its
        // signal mask or None.
        return unsafe { epoll::wait(&so, ep, ev, max, timeout, mask) };
    }
    let kernel_wait = || match mask {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `epoll_wait`.
        None => unsafe { real::epoll_wait(ep, ev, max, timeout) },
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `epoll_pwait`.
        Some(m) => unsafe { real::epoll_pwait(ep, ev, max, timeout, m) },
    };
    // SAFETY: `ev`/`max` are the caller's event array (epoll_wait(2)'s contract), `mask` its
    // signal mask or None.
    unsafe { epoll::plain_wait(ep, ev, max, || timeout, mask, kernel_wait) }
}

// ---------------------------------------------------------------------------------------
// sendfile / splice

const XFER: usize = 64 * 1024;

/// For a call that writes into `fd` after taking bytes from elsewhere (sendfile, splice):
/// whether `fd` is an SMC connection, or `Err` (errno `EAGAIN`) when a non-blocking one is
/// still in its handshake: nothing may be taken from the source then.
fn write_target(fd: c_int, dontwait: bool) -> Result<bool, ()> {
    if !slow(fd) {
        return Ok(false);
    }
    match conn_of_op(fd, Op::Write { dontwait }) {
        Some(o) if o.conn().is_some() => Ok(true),
        Some(_) => Err(()),
        None => Ok(false),
    }
}

/// The open file behind `fd` as `fdget` and `do_splice` see it: its status flags and
/// whether it is a pipe (or FIFO), or `EBADF` (not open, or an `O_PATH` descriptor).
fn file_of(fd: c_int) -> Result<(c_int, bool), c_int> {
    // SAFETY: an integer command without argument.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 || fl & libc::O_PATH != 0 {
        return Err(libc::EBADF);
    }
    // SAFETY: plain old data, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    let fifo =
        unsafe { libc::fstat(fd, &mut st) } == 0 && st.st_mode & libc::S_IFMT == libc::S_IFIFO;
    Ok((fl, fifo))
}

/// A pointer the kernel's `copy_from_user` would refuse at no cost (see [`user_range_ok`]).
fn bad_user_ptr<T>(p: *const T) -> bool {
    !p.is_null() && (p as usize) < 0x1_0000
}

/// `do_sendfile`'s checks when the source is one of our connections, before any byte moves:
/// a socket cannot be read at an offset (`ESPIPE`), the target must be open for writing
/// (`EBADF`), and a socket feeds only a pipe (`splice_direct_to_actor` takes regular files
/// and block devices only: `EINVAL`).
fn sendfile_from_socket_check(out: c_int, off: *const libc::off_t) -> Result<(), c_int> {
    if bad_user_ptr(off) {
        return Err(libc::EFAULT);
    }
    if !off.is_null() {
        return Err(libc::ESPIPE);
    }
    let (fl, fifo) = file_of(out)?;
    if fl & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    if !fifo {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// `splice(2)`'s checks (`SYSCALL_DEFINE6(splice)`, `__do_splice`, `do_splice`) when one end
/// is one of our connections, before any byte moves: `Ok(true)` when nothing is to move
/// (`len` 0), `Ok(false)` to go on. A socket has no offset (`EINVAL`), a pipe none either
/// (`ESPIPE`), and one end must be a pipe (`EINVAL`).
fn splice_check(
    fin: c_int,
    offin: *const libc::loff_t,
    fout: c_int,
    offout: *const libc::loff_t,
    n: size_t,
    flags: libc::c_uint,
) -> Result<bool, c_int> {
    const SPLICE_F_ALL: libc::c_uint =
        libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MORE | libc::SPLICE_F_GIFT;
    if n == 0 {
        return Ok(true);
    }
    if flags & !SPLICE_F_ALL != 0 {
        return Err(libc::EINVAL);
    }
    let (ifl, ipipe) = file_of(fin)?;
    let (ofl, opipe) = file_of(fout)?;
    if (ipipe && !offin.is_null()) || (opipe && !offout.is_null()) {
        return Err(libc::ESPIPE);
    }
    if bad_user_ptr(offin) || bad_user_ptr(offout) {
        return Err(libc::EFAULT);
    }
    if ifl & libc::O_ACCMODE == libc::O_WRONLY || ofl & libc::O_ACCMODE == libc::O_RDONLY {
        return Err(libc::EBADF);
    }
    // One end is our socket: no FMODE_PREAD/FMODE_PWRITE, so an offset for it is EINVAL, and
    // without a pipe at the other end there is nothing to splice through.
    if ipipe && !offout.is_null() || opipe && !offin.is_null() || !ipipe && !opipe {
        return Err(libc::EINVAL);
    }
    Ok(false)
}

pub unsafe fn sendfile(out: c_int, inp: c_int, off: *mut libc::off_t, n: size_t) -> ssize_t {
    if let Some(r) = orphan_composed(out) {
        return r;
    }
    if slow(out) {
        if let Some(m) = moved_first(out, Op::Write { dontwait: false }) {
            // SAFETY: the caller's arguments, on the connection's own descriptor.
            return unsafe { sendfile(m.fd, inp, off, n) };
        }
    }
    if slow(inp) {
        if let Some(m) = moved_first(inp, Op::Other) {
            // SAFETY: as above.
            return unsafe { sendfile(out, m.fd, off, n) };
        }
    }
    let in_smc = slow(inp) && (conn_of(inp).is_some() || stash_at(inp));
    if in_smc {
        if let Err(e) = sendfile_from_socket_check(out, off) {
            return fail(e);
        }
    }
    let Ok(out_smc) = write_target(out, false) else {
        return -1;
    };
    // (Its handshake, driven just now, may have met the reset.)
    if let Some(r) = orphan_composed(out) {
        return r;
    }
    if !out_smc && !in_smc {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `sendfile`.
        return unsafe { real::sendfile(out, inp, off, n) };
    }
    if bad_user_ptr(off) {
        return fail(libc::EFAULT);
    }
    stats::special(stats::Special::Sendfile);
    // A NULL offset reads at the file's own offset and moves it only by what was written (a
    // plain read would consume bytes the socket may not take).
    let pos = if off.is_null() && !in_smc {
        // SAFETY: integer arguments only.
        let p = unsafe { libc::lseek(inp, 0, libc::SEEK_CUR) };
        (p >= 0).then_some(p)
    } else {
        None
    };
    let advance = |done: usize| {
        if let Some(p) = pos {
            // SAFETY: plain lseek on the caller's fd.
            unsafe { libc::lseek(inp, p + done as i64, libc::SEEK_SET) };
        }
    };
    // Each connection is held for the whole call: its parts never go to another file that
    // took a number closed meanwhile (see [`hold`]).
    let out_call = if out_smc {
        hold(out, Op::Write { dontwait: false })
    } else {
        None
    };
    let in_call = if in_smc {
        hold(inp, Op::Read { dontwait: false })
    } else {
        None
    };
    let mut buf = vec![0u8; XFER.min(n.max(1))];
    let mut done = 0usize;
    while done < n {
        let want = (n - done).min(buf.len());
        let r = if in_smc {
            // sendfile from a socket: like read(); only a non-blocking first read may fail.
            let f = if done > 0 { libc::MSG_DONTWAIT } else { 0 };
            match &in_call {
                Some(call) => {
                    let v = [iovec {
                        iov_base: buf.as_mut_ptr() as *mut c_void,
                        iov_len: want,
                    }];
                    // SAFETY: `v` is `want <= buf.len()` bytes of our own `buf`.
                    unsafe { recv_in(call, inp, &v, f) }
                }
                // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`.
                None => unsafe { recv(inp, buf.as_mut_ptr() as *mut c_void, want, f) },
            }
        } else if let Some(p) = pos {
            // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`.
            unsafe { libc::pread(inp, buf.as_mut_ptr() as *mut c_void, want, p + done as i64) }
        } else if off.is_null() {
            // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`.
            unsafe { real::read(inp, buf.as_mut_ptr() as *mut c_void, want) }
        } else {
            // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`; `off` is non-null
            // (checked) and the caller's offset (sendfile(2)'s contract).
            unsafe {
                libc::pread(
                    inp,
                    buf.as_mut_ptr() as *mut c_void,
                    want,
                    *off + done as i64,
                )
            }
        };
        if r < 0 {
            if done > 0 {
                break;
            }
            return -1;
        }
        if r == 0 {
            break;
        }
        let mut w = 0usize;
        while w < r as usize {
            // SAFETY: `w < r <= buf.len()`: the `r - w` bytes of our own `buf` not yet written.
            let x = unsafe { write_part(out_call.as_ref(), out, &buf[w..r as usize]) };
            if x < 0 {
                if done + w > 0 {
                    // Bytes read but not written are lost for a socket source; for a file we
                    // report what was written and the offset says where to resume.
                    done += w;
                    if !off.is_null() {
                        // SAFETY: `off` is non-null (checked) and the caller's writable offset
                        // (sendfile(2)'s contract).
                        unsafe { *off += done as i64 };
                    }
                    advance(done);
                    return done as ssize_t;
                }
                return -1;
            }
            w += x as usize;
        }
        done += w;
    }
    if !off.is_null() && !in_smc {
        // SAFETY: `off` is non-null (checked) and the caller's writable offset (sendfile(2)'s
        // contract).
        unsafe { *off += done as i64 };
    }
    advance(done);
    done as ssize_t
}

/// Whether `fd` has `events` now (a poll that does not wait).
fn poll_now(fd: c_int, events: libc::c_short) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    unsafe { real::poll(&mut p, 1, 0) > 0 }
}

/// Waits until the pipe `fd` has room (false: the wait failed, errno set, e.g. EINTR).
fn wait_writable(fd: c_int) -> bool {
    let mut pf = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { real::poll(&mut pf, 1, -1) >= 0 }
}

/// Moves `data` into the pipe `fout` as `splice(2)` from a socket does: what the pipe takes
/// (all of it, or the part that fits), waiting only while it is full and neither
/// `SPLICE_F_NONBLOCK` (`nb`) nor the pipe's `O_NONBLOCK` says not to. Through a private pipe
/// and the kernel's own pipe-to-pipe splice: a plain `write` of all of `data` into a blocking
/// pipe with less room waits for a reader, which in a proxy is the very thread that called
/// (haproxy `option splice-response` through a pipe of its own: 20 of 60 transfers of 5 MB
/// hung).
fn into_pipe(fout: c_int, data: &[u8], nb: bool) -> ssize_t {
    let mut p = [-1 as c_int; 2];
    // SAFETY: a valid array of two descriptors for the result.
    if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
        // No descriptor for the private pipe (EMFILE): one page at most, written once the
        // pipe has a free slot (a write of at most PIPE_BUF bytes then never waits).
        // SAFETY: a plain fcntl on the caller's descriptor.
        let wait = !nb && unsafe { real::fcntl(fout, libc::F_GETFL, 0) } & libc::O_NONBLOCK == 0;
        loop {
            if poll_now(fout, libc::POLLOUT) {
                let n = data.len().min(libc::PIPE_BUF);
                // SAFETY: `n` bytes of `data`.
                return unsafe { real::write(fout, data.as_ptr() as *const c_void, n) };
            }
            if !wait {
                return fail(libc::EAGAIN);
            }
            if !wait_writable(fout) {
                return -1;
            }
        }
    }
    let [rd, wr] = p;
    // SAFETY: our own pipe, non-blocking: it takes what fits (at least one page), the rest of
    // `data` stays unconsumed in the ring.
    let w = unsafe { real::write(wr, data.as_ptr() as *const c_void, data.len()) };
    // SAFETY: a plain fcntl on the caller's descriptor.
    let wait = !nb && unsafe { real::fcntl(fout, libc::F_GETFL, 0) } & libc::O_NONBLOCK == 0;
    let r = if w <= 0 {
        w
    } else {
        loop {
            // SAFETY: both ends are pipes, no offsets; our pipe holds `w` bytes. Our end's
            // O_NONBLOCK makes this splice never wait (`do_splice`): the wait is below.
            let r = unsafe {
                real::splice(
                    rd,
                    std::ptr::null_mut(),
                    fout,
                    std::ptr::null_mut(),
                    w as usize,
                    libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
                )
            };
            if r >= 0 || !wait || real::errno() != libc::EAGAIN {
                break r;
            }
            if !wait_writable(fout) {
                break -1;
            }
        }
    };
    let e = real::errno();
    // SAFETY: our own two descriptors, closed once.
    unsafe {
        real::close(rd);
        real::close(wr);
    }
    real::set_errno(e);
    r
}

pub unsafe fn splice(
    fin: c_int,
    offin: *mut libc::loff_t,
    fout: c_int,
    offout: *mut libc::loff_t,
    n: size_t,
    flags: libc::c_uint,
) -> ssize_t {
    let nb = flags & libc::SPLICE_F_NONBLOCK != 0;
    if let Some(r) = orphan_composed(fin).or_else(|| orphan_composed(fout)) {
        return r;
    }
    if slow(fout) {
        if let Some(m) = moved_first(fout, Op::Write { dontwait: nb }) {
            // SAFETY: the caller's arguments, on the connection's own descriptor.
            return unsafe { splice(fin, offin, m.fd, offout, n, flags) };
        }
    }
    if slow(fin) {
        if let Some(m) = moved_first(fin, Op::Other) {
            // SAFETY: as above.
            return unsafe { splice(m.fd, offin, fout, offout, n, flags) };
        }
    }
    let Ok(out_smc) = write_target(fout, nb) else {
        return -1;
    };
    let in_smc = slow(fin) && (conn_of(fin).is_some() || stash_at(fin));
    // (A handshake driven just now may have met the reset.)
    if let Some(r) = orphan_composed(fin).or_else(|| orphan_composed(fout)) {
        return r;
    }
    if !out_smc && !in_smc {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
        // libc's `splice`.
        return unsafe { real::splice(fin, offin, fout, offout, n, flags) };
    }
    match splice_check(fin, offin, fout, offout, n, flags) {
        Ok(true) => return 0,
        Ok(false) => {}
        Err(e) => return fail(e),
    }
    stats::special(stats::Special::Splice);
    let want = n.min(XFER);
    let mut buf = vec![0u8; want.max(1)];
    if in_smc {
        // SPLICE_F_NONBLOCK is for the pipe (`wait_for_space`; the socket waits by its own
        // O_NONBLOCK, `tcp_splice_read`): a full pipe says EAGAIN before anything is read.
        if nb && !poll_now(fout, libc::POLLOUT) {
            return fail(libc::EAGAIN);
        }
        // Held for the whole call (see [`hold`]): the bytes consumed are those peeked.
        let in_call = hold(fin, Op::Read { dontwait: false });
        let rd = |p: *mut c_void, len: usize, f: c_int| match &in_call {
            Some(call) => {
                let v = [iovec {
                    iov_base: p,
                    iov_len: len,
                }];
                // SAFETY: `v` is `len` bytes of our own `buf`, or nothing with MSG_TRUNC.
                unsafe { recv_in(call, fin, &v, f) }
            }
            // SAFETY: as above.
            None => unsafe { recv(fin, p, len, f) },
        };
        // Peek first so that bytes the pipe cannot take stay in the ring.
        let r = rd(buf.as_mut_ptr() as *mut c_void, want, libc::MSG_PEEK);
        if r <= 0 {
            return r;
        }
        let w = if offout.is_null() {
            into_pipe(fout, buf.get(..r as usize).unwrap_or_default(), nb)
        } else {
            let x =
                // SAFETY: writes `r <= buf.len()` bytes of our own `buf`; `offout` is non-null
                // (checked) and the caller's offset (splice(2)'s contract).
                unsafe { libc::pwrite(fout, buf.as_ptr() as *const c_void, r as usize, *offout) };
            if x > 0 {
                // SAFETY: `offout` is non-null (checked) and the caller's writable offset
                // (splice(2)'s contract).
                unsafe { *offout += x as i64 };
            }
            x
        };
        if w <= 0 {
            return w;
        }
        // Consume exactly what went out (MSG_TRUNC discards the bytes without copying them:
        // the null buffer is never touched).
        let _ = rd(
            std::ptr::null_mut(),
            w as usize,
            libc::MSG_TRUNC | libc::MSG_DONTWAIT,
        );
        return w;
    }
    // Into an SMC socket from a pipe or file: read only what the ring takes now (bytes taken
    // from a pipe cannot be put back), then write all of it.
    let mut want = want;
    let out_call = conn_of(fout).and_then(|o| InCall::enter(fout, o));
    if let Some(call) = &out_call {
        let c = call.conn();
        {
            loop {
                let r = c.readiness();
                if r.wr_closed || r.error || r.writable > 0 {
                    if !r.wr_closed && !r.error {
                        want = want.min(r.writable as usize);
                    }
                    break;
                }
                if nb || c.nonblocking() {
                    return fail(libc::EAGAIN);
                }
                match c.wait(fout, false, 1, None) {
                    crate::conn::Woke::Intr => return fail(libc::EINTR),
                    _ => continue,
                }
            }
        }
    }
    // SPLICE_F_NONBLOCK: an empty pipe says EAGAIN, whether or not its file is O_NONBLOCK
    // (`read` waits by the file's flag only).
    if nb && offin.is_null() && !poll_now(fin, libc::POLLIN) {
        return fail(libc::EAGAIN);
    }
    let r = if offin.is_null() {
        // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`.
        unsafe { real::read(fin, buf.as_mut_ptr() as *mut c_void, want) }
    } else {
        // SAFETY: reads at most `want <= buf.len()` bytes into our own `buf`; `offin` is non-null
        // (checked) and the caller's offset (splice(2)'s contract).
        let x = unsafe { libc::pread(fin, buf.as_mut_ptr() as *mut c_void, want, *offin) };
        if x > 0 {
            // SAFETY: `offin` is non-null (checked) and the caller's writable offset (splice(2)'s
            // contract).
            unsafe { *offin += x as i64 };
        }
        x
    };
    if r <= 0 {
        return r;
    }
    let mut w = 0usize;
    while w < r as usize {
        // SAFETY: `w < r <= buf.len()`: the `r - w` bytes of our own `buf` not yet written.
        let x = unsafe { write_part(out_call.as_ref(), fout, &buf[w..r as usize]) };
        if x < 0 {
            return if w > 0 { w as ssize_t } else { -1 };
        }
        w += x as usize;
    }
    w as ssize_t
}

// ---------------------------------------------------------------------------------------
// options and signals

/// `getsockopt(2)`: `SO_ERROR` of an SMC connection reports (and clears) the error pending on
/// the data path, as TCP's `sk_err`; everything else is the TCP socket's own.
pub unsafe fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `getsockopt`.
    let r = unsafe { real::getsockopt(fd, level, name, val, len) };
    if r != 0 || val.is_null() || len.is_null() {
        return r;
    }
    if level == libc::IPPROTO_TCP && name == libc::TCP_INFO {
        if slow(fd) {
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Conn(c) = &*o {
                    // SAFETY: the kernel just wrote `*len` bytes of `tcp_info` through `val`.
                    unsafe { tcp_info_of_stream(c, val as *mut u8, *len as usize) };
                    return r;
                }
            }
        }
        // A connection that fell back (plain by now, or still skipping late CLC messages).
        if let Some((sent, received)) = crate::handshake::clc_bytes(fd) {
            // SAFETY: the kernel just wrote `*len` bytes of `tcp_info` through `val`.
            unsafe { tcp_info_without_clc(val as *mut u8, *len as usize, sent, received) };
        }
        return r;
    }
    if !slow(fd) {
        return r;
    }
    if level == libc::SOL_SOCKET && name == libc::SO_PEEK_OFF {
        if let Some(o) = fdtable::get(fd) {
            if let Obj::Conn(c) = &*o {
                // The kernel wrote the socket's own value (off: we keep it, see setsockopt).
                // SAFETY: `val`/`len` were valid for the kernel's write (it succeeded); only an
                // int that fits the length it reported is written.
                unsafe {
                    if *len as usize >= 4 {
                        std::ptr::write_unaligned(val as *mut c_int, c.peek_off());
                    }
                }
            }
        }
        return r;
    }
    if level != libc::SOL_SOCKET || name != libc::SO_ERROR {
        return r;
    }
    let Some(o) = fdtable::get(fd) else { return r };
    if let Obj::Orphan(s) = &*o {
        if s.lost == 0 {
            return r;
        }
        // A connection that ended during its handshake: its error is the socket's own until a
        // call reported it ([`orphan`]); the kernel's (the reset that our CLC message drew, or
        // none) is not (the real call above took it). A server's whose client left, before
        // its first write: none, as TCP's, whose closed client has nothing to answer yet (red
        // team round 31 `rt31x_left.c nbclose ewewr`: `EPIPE` where TCP says 0, 11 of 20).
        let e = if s.left && s.state.load(Ordering::Acquire) == crate::obj::LOST_WAITED {
            0
        } else if s.state.swap(crate::obj::LOST_REPORTED, Ordering::AcqRel)
            != crate::obj::LOST_REPORTED
        {
            fdtable::replace_if(fd, &o, Slot::Obj(Arc::new(Obj::Tcp)));
            s.lost
        } else {
            return r;
        };
        // SAFETY: as below: the kernel's write of an int through `val` succeeded.
        unsafe {
            if *len as usize >= 4 {
                std::ptr::write_unaligned(val as *mut c_int, e);
            }
        }
        return r;
    }
    let Obj::Conn(c) = &*o else { return r };
    // An error this connection already reported (a read's ECONNRESET, a write's EPIPE) is the
    // event the TCP socket's own `sk_err` stands for too: TCP's read would have taken it, ours
    // never reads that socket's error, so it is not reported a second time here.
    let reported = c.flags() & (crate::conn::F_RST_REPORTED | crate::conn::F_EPIPE_REPORTED) != 0;
    let e = c.take_so_error();
    let e = if e == 0 && reported {
        Some(0)
    } else {
        (e != 0).then_some(e)
    };
    // The kernel just wrote the TCP socket's own error through `val` (with `len` ≥ 4 then).
    // SAFETY: `val`/`len` were valid for the kernel's write (it succeeded); only an int that fits
    // the length it reported is written.
    unsafe {
        if let Some(e) = e {
            if !val.is_null() && !len.is_null() && *len as usize >= 4 {
                std::ptr::write_unaligned(val as *mut c_int, e);
            }
        }
    }
    r
}

/// `TCP_INFO` of an SMC connection: the kernel's answer about the TCP socket (which carried
/// the CLC handshake and carries doorbells, not the stream), with what the stream shows put
/// in: `tcpi_state` ([`Conn::tcp_state`]) and the byte counts ([`Conn::tcp_bytes`]).
/// Timing, window and segment fields stay the socket's.
///
/// # Safety
/// `info` points to `len` writable bytes.
unsafe fn tcp_info_of_stream(c: &Conn, info: *mut u8, len: usize) {
    // Offsets in `struct tcp_info` (`include/uapi/linux/tcp.h`).
    const STATE: usize = 0;
    const BYTES_ACKED: usize = 120;
    const BYTES_RECEIVED: usize = 128;
    const BYTES_SENT: usize = 200;
    let Some(st) = c.tcp_state() else { return };
    let put = |off: usize, v: u64| {
        if len >= off + 8 {
            // SAFETY: inside the caller's `len` bytes (checked).
            unsafe { std::ptr::write_unaligned(info.add(off) as *mut u64, v) };
        }
    };
    if len > STATE {
        // SAFETY: inside the caller's `len` bytes (checked).
        unsafe { *info.add(STATE) = st };
    }
    if let Some((sent, acked, received)) = c.tcp_bytes() {
        put(BYTES_ACKED, acked);
        put(BYTES_RECEIVED, received);
        put(BYTES_SENT, sent);
    }
}

/// `TCP_INFO` of a connection that fell back to TCP: the kernel's answer without the CLC
/// bytes its handshake sent (`tcpi_bytes_acked`, `tcpi_bytes_sent`) and received
/// (`tcpi_bytes_received`), as TCP without the handshake counts (never below 0). Segment
/// counts stay the kernel's (a CLC message may share a segment with others).
///
/// # Safety
/// `info` points to `len` writable bytes.
unsafe fn tcp_info_without_clc(info: *mut u8, len: usize, sent: u64, received: u64) {
    const BYTES_ACKED: usize = 120;
    const BYTES_RECEIVED: usize = 128;
    const BYTES_SENT: usize = 200;
    for (off, minus) in [
        (BYTES_ACKED, sent),
        (BYTES_RECEIVED, received),
        (BYTES_SENT, sent),
    ] {
        if len >= off + 8 {
            // SAFETY: inside the caller's `len` bytes (checked).
            unsafe {
                let p = info.add(off) as *mut u64;
                p.write_unaligned(p.read_unaligned().saturating_sub(minus));
            }
        }
    }
}

/// `getpeername(2)`: `ENOTCONN` once an SMC connection's stream ended as TCP's would have
/// ended in CLOSE (a reset, or both ends' FIN: `inet_getname`); else the TCP socket's truth.
pub unsafe fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if slow(fd) {
        if let Some(o) = fdtable::get(fd) {
            if let Obj::Conn(c) = &*o {
                if c.tcp_state() == Some(crate::conn::TCP_CLOSE) {
                    return fail(libc::ENOTCONN) as c_int;
                }
            }
        }
    }
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of
    // libc's `getpeername`.
    unsafe { real::getpeername(fd, addr, len) }
}

pub unsafe fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged: this function has the contract of libc's
    // `setsockopt`.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0
        && level == libc::SOL_SOCKET
        && name == libc::SO_PEEK_OFF
        && !val.is_null()
        && len as usize >= 4
    {
        // SAFETY: `val` is non-null with `len >= 4` (checked) and the kernel just read it
        // without EFAULT.
        crate::util::note_peek_off(unsafe { std::ptr::read_unaligned(val as *const c_int) });
    }
    if r == 0
        && level == libc::SOL_SOCKET
        && name == libc::SO_PEEK_OFF
        && fdtable::raw(fd) != 0
        && !val.is_null()
        && len as usize >= 4
    {
        // SAFETY: `val` is non-null with `len >= 4` (checked) and the kernel just read it
        // without EFAULT.
        let v = unsafe { std::ptr::read_unaligned(val as *const c_int) };
        if let Some(c) = fdtable::get(fd).as_deref().and_then(Obj::conn) {
            // The stream's peeks are ours (`smc_rx`); the socket's own stays off, for the
            // library's peeks at the doorbell channel.
            c.set_peek_off(v);
            setup::peek_off_off(fd);
        }
    }
    if r == 0
        && level == libc::SOL_SOCKET
        && name == libc::SO_RCVBUF
        && fdtable::raw(fd) != 0
        && !val.is_null()
        && len as usize >= 4
    {
        // SAFETY: `val` is non-null with `len >= 4` (checked) and the kernel just read it without
        // EFAULT.
        setup::note_rcvbuf(fd, unsafe { *(val as *const c_int) });
    }
    if r == 0
        && level == libc::SOL_SOCKET
        && name == libc::SO_OOBINLINE
        && fdtable::raw(fd) != 0
        && !val.is_null()
        && len as usize >= 4
    {
        // Urgent bytes stay in the stream from now on (a socket still in its handshake takes
        // the kernel's value when it becomes SMC).
        if let Some(c) = fdtable::get(fd).as_deref().and_then(Obj::conn) {
            // SAFETY: `val` is non-null with `len >= 4` (checked) and the kernel just read it
            // without EFAULT.
            c.oobinline_changed(
                fd,
                unsafe { std::ptr::read_unaligned(val as *const c_int) } != 0,
            );
            epoll::conn_changed(fd, c);
        }
    }
    if r == 0
        && level == libc::IPPROTO_TCP
        && name == libc::TCP_INQ
        && fdtable::raw(fd) != 0
        && !val.is_null()
        && len as usize >= 4
    {
        // A socket still in its handshake takes the kernel's value when it becomes SMC.
        if let Some(c) = fdtable::get(fd).as_deref().and_then(Obj::conn) {
            // SAFETY: `val` is non-null with `len >= 4` (checked) and the kernel just read it
            // without EFAULT.
            c.note_tcp_inq(unsafe { std::ptr::read_unaligned(val as *const c_int) } != 0);
        }
    }
    if r == 0 && level == libc::SOL_SOCKET && name == libc::SO_RCVLOWAT && fdtable::raw(fd) != 0 {
        // A socket still in its handshake takes the value when it becomes SMC.
        if let Some(c) = fdtable::get(fd).as_deref().and_then(Obj::conn) {
            c.set_rcvlowat(fd);
            // A lower mark can make it readable now (tcp_set_rcvlowat wakes the readers): the
            // epoll sets check it again (a poll finds it at its next tick).
            epoll::conn_changed(fd, c);
        }
    }
    r
}

pub unsafe fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // A vfork child shares our memory: it installs what it asks, unwrapped, and notes nothing.
    if lifecycle::in_vfork_child() {
        // SAFETY: the caller's arguments, passed on unchanged: this function has the contract
        // of libc's `sigaction`.
        return unsafe { real::sigaction(sig, act, old) };
    }
    let (r, prev) = if act.is_null() {
        // SAFETY: as above (a query).
        (
            unsafe { real::sigaction(sig, act, old) },
            crate::signals::previous(sig),
        )
    } else {
        // SAFETY: `act` is non-null (checked) and the caller's sigaction (sigaction's contract).
        let a = unsafe { std::ptr::read(act) };
        // The program's handler runs through our trampoline (which notes the signal for the
        // EINTR decision of a blocking call, see `signals`).
        let (ours, prev) = crate::signals::wrap(sig, &a);
        // SAFETY: `ours` is a valid sigaction; `old` is the caller's (or null).
        let r = unsafe { real::sigaction(sig, &ours, old) };
        if r == 0 {
            crate::signals::note(sig, a.sa_sigaction, a.sa_flags);
        }
        (r, prev)
    };
    if r == 0 && !old.is_null() {
        // SAFETY: `old` is the caller's sigaction, just written by libc.
        crate::signals::unwrap_old(unsafe { &mut *old }, prev);
    }
    r
}

pub unsafe fn signal(sig: c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's arguments: this function has the contract of libc's `signal`.
    unsafe { through_libc(sig, h, |s, h| real::signal(s, h)) }
}

/// `sysv_signal`, `__sysv_signal` (a `-std=c99` program's `signal`), `bsd_signal`, `sigset`:
/// each as `signal`.
///
/// # Safety
/// The contract of libc's function of that name.
pub unsafe fn signal_like(
    sig: c_int,
    h: libc::sighandler_t,
    real_fn: unsafe fn(c_int, libc::sighandler_t) -> libc::sighandler_t,
) -> libc::sighandler_t {
    // SAFETY: as above.
    unsafe { through_libc(sig, h, |s, h| real_fn(s, h)) }
}

/// libc's own function first (it checks the arguments and chooses the flags: `signal`'s BSD
/// semantics and a prior `siginterrupt`, `sysv_signal`'s one-shot handler, `sigset`'s
/// `SIG_HOLD`); then the action it installed again through our `sigaction`, so that the
/// handler runs through the trampoline (see `signals`). The old handler is the program's.
unsafe fn through_libc(
    sig: c_int,
    h: libc::sighandler_t,
    f: impl FnOnce(c_int, libc::sighandler_t) -> libc::sighandler_t,
) -> libc::sighandler_t {
    let prev = crate::signals::previous(sig);
    let old = f(sig, h);
    if old == libc::SIG_ERR || lifecycle::in_vfork_child() {
        return old;
    }
    // SAFETY: a zeroed sigaction is valid output space; querying only.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; no new action.
    if unsafe { real::sigaction(sig, std::ptr::null(), &mut cur) } == 0 {
        // SAFETY: `cur` is a valid sigaction.
        unsafe { sigaction(sig, &cur, std::ptr::null_mut()) };
    }
    // SAFETY: a zeroed sigaction is valid.
    let mut o: libc::sigaction = unsafe { std::mem::zeroed() };
    o.sa_sigaction = old;
    crate::signals::unwrap_old(&mut o, prev);
    o.sa_sigaction
}

/// For tests: install a connection at `fd` (e.g. a socketpair end).
pub fn install_conn(fd: c_int, c: Conn) -> Arc<Obj> {
    let o = Arc::new(Obj::Conn(c));
    drop(fdtable::replace(fd, Slot::Obj(o.clone())));
    epoll::on_convert(fd, &o);
    o
}

/// At load: SMC connections inherited from another image cannot be served (their rings and
/// local state stay with it); make them fail cleanly (reads `ECONNRESET`, writes `EPIPE`)
/// instead of reading doorbells as data or waiting forever for bytes that travel in rings.
/// They are recognised by the eBPF socket state (opted in, peer SMC, shortcut enabled after a
/// handshake). Inherited across an `exec` of this very pid whose old image had live SMC
/// connections (its statistics file says so), the old image is gone: the socket is shut down
/// too, so the peer learns it at once. Inherited by a new process (`posix_spawn`, `fork` +
/// `exec`: an inetd-style server, a child that inherited fds without `O_CLOEXEC`), the
/// connection may still be served by the process that made it: only our view is an orphan.
/// `socks`: the sockets this image found open ([`lifecycle::inherited_sockets`]; every fd, 0 to
/// 2 too: an inetd-style handler gets its connection as stdin and stdout).
pub fn adopt_orphans_after_exec(socks: &[c_int]) {
    let mut old_image_gone: Option<bool> = None;
    // Sockets adopted in this scan, by cookie, with their fd.
    let mut adopted: Vec<(u64, c_int)> = Vec::new();
    for &fd in socks {
        let look = setup::smc_conn_look(fd);
        if look == setup::SmcLook::No {
            continue;
        }
        let ck = lifecycle::cookie(fd);
        // Another number of a socket adopted just now (`dup2(conn, 0); dup2(conn, 1)`):
        // shared as `dup` shares it; the reference that travelled with this number is the one
        // the copy counted.
        if let Some(&(_, same)) = ck.and_then(|ck| adopted.iter().find(|(c, _)| *c == ck)) {
            setup::copy_slot(same, fd);
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Conn(c) = &*o {
                    if c.take_in_flight() {
                        c.drop_ref();
                    }
                }
            }
            continue;
        }
        // The image that made it, or the process that spawned us, handed it over.
        if let Some(c) = daemon::adopt(fd) {
            drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Conn(c)))));
            if let Some(ck) = ck {
                adopted.push((ck, fd));
            }
            if (0..=2).contains(&fd) {
                // A standard stream (an inetd-style handler): stdio bypasses us, TCP it is.
                lifecycle::std_stream_takes(fd);
            }
            continue;
        }
        if look == setup::SmcLook::Maybe {
            // The daemon knows no DMB of it: TCP's (see `SmcLook::Maybe`).
            continue;
        }
        let gone = *old_image_gone.get_or_insert_with(same_pid_image_had_conns);
        crate::debug!(
            "fd {fd}: SMC connection inherited from another image: fails cleanly{}",
            if gone {
                " (its old image is gone: shut down)"
            } else {
                ""
            }
        );
        if gone {
            // The peer learns it at once (EOF on its doorbell channel), and so does any poll
            // of ours (POLLIN|POLLHUP).
            // SAFETY: plain syscall.
            unsafe { real::shutdown(fd, libc::SHUT_RDWR) };
        }
        drop(fdtable::replace(
            fd,
            Slot::Obj(Arc::new(Obj::Orphan(crate::obj::Skip::new(false)))),
        ));
    }
}

/// Whether the image this pid ran before its `exec` had live SMC connections (its statistics
/// file, in the top directory or its uid's own, says so).
fn same_pid_image_had_conns() -> bool {
    let dir = crate::stats::procs_dir();
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    let pid = crate::pid();
    let top = format!("{dir}/{pid}");
    let own = format!("{dir}/{}/{pid}", smc_stats::uid_dir_name(euid));
    let Some(b) = [top, own].iter().find_map(|p| std::fs::read(p).ok()) else {
        return false;
    };
    let Some(v) = smc_stats::Snapshot::parse(&b) else {
        return false;
    };
    v.pid == pid as u64 && v.get("smcd_client") + v.get("smcd_server") > v.get("closed_conns")
}

#[cfg(test)]
mod signal_tests {
    use super::*;

    static RAN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    extern "C" fn on_usr2(_: c_int) {
        RAN.fetch_add(1, Ordering::SeqCst);
    }

    /// The program's handler runs (through our trampoline), `sigaction` reports it back as
    /// installed, and the signal's own SA_RESTART decides (read from the kernel).
    #[test]
    fn a_wrapped_handler_runs_reports_itself_and_decides_by_its_own_flags() {
        // SAFETY: zeroed sigactions are valid; valid pointers throughout.
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_usr2 as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            assert_eq!(sigaction(libc::SIGUSR2, &act, std::ptr::null_mut()), 0);
            let mut old: libc::sigaction = std::mem::zeroed();
            assert_eq!(sigaction(libc::SIGUSR2, std::ptr::null(), &mut old), 0);
            assert_eq!(
                old.sa_sigaction, on_usr2 as *const () as usize,
                "our handler shown"
            );
            assert_eq!(old.sa_flags & libc::SA_SIGINFO, 0);
            crate::signals::wait_begins();
            libc::raise(libc::SIGUSR2);
            assert_eq!(RAN.load(Ordering::SeqCst), 1, "the program's handler ran");
            assert!(!crate::signals::interrupted(), "SA_RESTART: restarted");
            // siginterrupt-like change behind sigaction: the kernel's flags decide.
            let mut k: libc::sigaction = std::mem::zeroed();
            real::sigaction(libc::SIGUSR2, std::ptr::null(), &mut k);
            k.sa_flags &= !libc::SA_RESTART;
            real::sigaction(libc::SIGUSR2, &k, std::ptr::null_mut());
            crate::signals::wait_begins();
            libc::raise(libc::SIGUSR2);
            assert_eq!(RAN.load(Ordering::SeqCst), 2);
            assert!(crate::signals::interrupted(), "no SA_RESTART: EINTR");
            let dfl: libc::sigaction = std::mem::zeroed();
            assert_eq!(sigaction(libc::SIGUSR2, &dfl, &mut old), 0);
            assert_eq!(old.sa_sigaction, on_usr2 as *const () as usize);
        }
    }
}
