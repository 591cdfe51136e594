//! The descriptor our own I/O on one socket goes through.
//!
//! As long as the application keeps the number a call was made on, our I/O on the socket (the
//! CLC messages of a handshake, doorbells, their drains, the socket options we read) goes
//! through that number. Once another thread closes the number while the socket stays in use
//! (a call of this process still drives a handshake on it, or is blocked on the connection),
//! the number may name another file at any moment: from then on our I/O goes through a private
//! duplicate of the socket, made before the number was closed ([`IoPath::set_private`] waits
//! for every system call already made through the number). One definition for the SMC
//! connection (`Conn`) and for a handshake under way (`obj::Handshake`).

use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Our I/O goes through the number the caller names.
pub const NO_IO: i32 = -1;
/// No descriptor of this process names the socket any more (a close behind our back, or none
/// could be made): our I/O on it fails (`EBADF`), as on a socket that went.
pub const IO_GONE: i32 = -2;

#[derive(Debug)]
pub struct IoPath {
    /// [`NO_IO`], a private duplicate of the socket, or [`IO_GONE`].
    fd: AtomicI32,
    /// System calls under way through a descriptor loaded by [`IoPath::with`].
    busy: AtomicU32,
}

impl Default for IoPath {
    fn default() -> Self {
        IoPath::new()
    }
}

impl IoPath {
    pub const fn new() -> IoPath {
        IoPath {
            fd: AtomicI32::new(NO_IO),
            busy: AtomicU32::new(0),
        }
    }

    /// Runs `f` with the descriptor our I/O goes through: `fd` (the number of the call), or,
    /// once redirected, the private duplicate. Only for short, non-blocking calls: a redirect
    /// waits for them before the number may close.
    #[inline]
    pub fn with<R>(&self, fd: i32, f: impl FnOnce(i32) -> R) -> R {
        self.busy.fetch_add(1, Ordering::SeqCst);
        let p = self.fd.load(Ordering::SeqCst);
        let r = f(if p == NO_IO { fd } else { p });
        self.busy.fetch_sub(1, Ordering::Release);
        r
    }

    /// The descriptor a sleep in `poll` uses. Not protected: a number closed during the sleep
    /// is only looked at by the kernel (`poll` reads no file); callers sleep in slices and load
    /// it again after each.
    #[inline]
    pub fn now(&self, fd: i32) -> i32 {
        let p = self.fd.load(Ordering::Acquire);
        if p == NO_IO {
            fd
        } else {
            p
        }
    }

    /// The private duplicate, if one was made.
    pub fn private(&self) -> Option<i32> {
        let p = self.fd.load(Ordering::Acquire);
        (p >= 0).then_some(p)
    }

    /// Whether our I/O no longer goes through the caller's number.
    pub fn redirected(&self) -> bool {
        self.fd.load(Ordering::Acquire) != NO_IO
    }

    /// Whether no descriptor names the socket for us any more.
    pub fn gone(&self) -> bool {
        self.fd.load(Ordering::Relaxed) == IO_GONE
    }

    /// From now on our I/O goes through `p` (a private duplicate, or [`IO_GONE`]); returns when
    /// no system call through a caller's number is under way any more, so that the number may
    /// close. False (and nothing changed) when it was redirected already.
    pub fn set_private(&self, p: i32) -> bool {
        if self
            .fd
            .compare_exchange(NO_IO, p, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        self.wait_idle();
        true
    }

    /// Moves our I/O from the private duplicate `old` to `new` (the application is about to
    /// make `old`'s number name another file, `dup2`); waits as [`IoPath::set_private`].
    pub fn move_private(&self, old: i32, new: i32) -> bool {
        if self
            .fd
            .compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false;
        }
        self.wait_idle();
        true
    }

    /// Takes the private duplicate for closing (its owner goes).
    pub fn take_private(&self) -> Option<i32> {
        let p = self.fd.swap(IO_GONE, Ordering::SeqCst);
        (p >= 0).then_some(p)
    }

    /// In a forked child: the calls under way were the parent's threads'.
    pub fn forget_calls_after_fork(&self) {
        self.busy.store(0, Ordering::SeqCst);
    }

    /// Waits until no system call through a descriptor loaded before now is under way. Each is
    /// one non-blocking system call, over in microseconds, but its thread may be preempted
    /// between loading the number and making the call: on a loaded machine (CI, 2 vCPUs and a
    /// dozen runnable threads) that took over 100 ms once, and the call then reached the file
    /// that had taken the number. So the wait yields, then sleeps in 1 ms steps, for up to
    /// 2 s; the bound is for a call that never ends its part (a signal handler of the same
    /// thread closing the number it interrupted), which then costs those 2 s.
    fn wait_idle(&self) {
        let start = Instant::now();
        let mut i = 0u32;
        while self.busy.load(Ordering::SeqCst) != 0 {
            i += 1;
            if i <= 64 {
                std::hint::spin_loop();
            } else if i <= 256 {
                std::thread::yield_now();
            } else if start.elapsed() < Duration::from_secs(2) {
                std::thread::sleep(Duration::from_millis(1));
            } else {
                crate::debug!(
                    "a system call through a number being closed did not end within 2 s: \
                     closing it anyway"
                );
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_once_and_moves_only_from_the_current_duplicate() {
        let io = IoPath::new();
        assert_eq!(io.with(5, |f| f), 5);
        assert!(!io.redirected());
        assert!(io.set_private(900));
        assert!(!io.set_private(901), "a second redirect changes nothing");
        assert_eq!(io.with(5, |f| f), 900);
        assert_eq!(io.now(5), 900);
        assert!(!io.move_private(901, 902), "only from the duplicate in use");
        assert!(io.move_private(900, IO_GONE));
        assert!(io.gone());
        assert_eq!(io.private(), None);
        assert_eq!(io.take_private(), None);
    }
}
