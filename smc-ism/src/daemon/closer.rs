//! Closing what clients hand the daemon, off the request path.
//!
//! Every fd a client passes (the proof socket, anything else sent along) and every client
//! connection (whose queue may still hold passed fds) is closed here, never on an async
//! worker. The last `close` of a file runs its release in the closing thread and can block
//! for as long as another process wants: a FUSE file's flush waits for its server, a TCP socket
//! with `SO_LINGER` waits for its unsent data (and the option can be set by the sender after
//! any check the daemon makes, from a copy it kept), a tty waits for its output to drain.
//! `SO_LINGER {1, 0}` set by the daemon would make a blocking close impossible, but it is a
//! property of the socket, not of the daemon's reference: the owner's own close would then
//! reset a legitimate connection. So the closes go to threads that may block.
//!
//! Fairness: the queue is per uid, and one uid occupies at most [`PER_UID_THREADS`] of the at
//! most [`MAX_THREADS`] threads at once, so that a uid whose closes never finish delays only its
//! own. A uid with [`PER_UID_PENDING`] closes outstanding is not read from
//! ([`Closer::over_limit`]): its further fds stay in its own socket buffers, not in the
//! daemon's fd table. Near the daemon's descriptor limit, a client connection with any of its
//! closes outstanding is not read from either ([`Closer::close_all_counted`]; see `conn`).

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// Threads at most.
pub(crate) const MAX_THREADS: usize = 64;
/// Threads one uid may block at once.
pub(crate) const PER_UID_THREADS: usize = 4;
/// Outstanding closes of one uid beyond which its connections are not read.
pub(crate) const PER_UID_PENDING: usize = 256;
/// An idle thread beyond the first exits after this long.
const IDLE_EXIT: Duration = Duration::from_secs(5);

/// One fd to close, and whom to tell once it is closed.
struct Closing {
    fd: OwnedFd,
    done: Option<tokio::sync::oneshot::Sender<()>>,
    /// Counts this close while it is outstanding (see [`Closer::close_all_counted`]).
    counted: Option<Arc<Outstanding>>,
}

/// Closes handed over by one client connection and not done yet; `none_left` is notified each
/// time they are all done.
#[derive(Default)]
pub(crate) struct Outstanding {
    n: AtomicUsize,
    pub(crate) none_left: tokio::sync::Notify,
}

impl Outstanding {
    pub(crate) fn any(&self) -> bool {
        self.n.load(Relaxed) > 0
    }
}

#[derive(Default)]
struct PerUid {
    queue: VecDeque<Closing>,
    busy: usize,
}

#[derive(Default)]
struct State {
    uids: HashMap<u32, PerUid>,
    threads: usize,
    idle: usize,
    closed: u64,
    stop: bool,
}

struct Inner {
    state: Mutex<State>,
    cv: Condvar,
    /// Closes queued or running, of all uids (changed under `state`'s lock): below
    /// [`PER_UID_PENDING`] no uid can be over it, and [`Closer::over_limit`], asked before
    /// every request a client sends, takes no lock while fewer are outstanding.
    outstanding: AtomicUsize,
}

/// The closer pool (see the module docs).
pub(crate) struct Closer {
    inner: Arc<Inner>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Closer {
    pub(crate) fn new() -> Closer {
        Closer {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                cv: Condvar::new(),
                outstanding: AtomicUsize::new(0),
            }),
        }
    }

    /// Closes `fd` on a closer thread, on behalf of `uid`.
    pub(crate) fn close(&self, uid: u32, fd: OwnedFd) {
        self.close_all(vec![(uid, fd)]);
    }

    /// Closes each fd on a closer thread, on behalf of its uid; one thread woken (or started)
    /// per uid among them, not per fd.
    pub(crate) fn close_all(&self, fds: Vec<(u32, OwnedFd)>) {
        self.enqueue(fds.into_iter().map(|(uid, fd)| {
            let c = Closing {
                fd,
                done: None,
                counted: None,
            };
            (uid, c)
        }));
    }

    /// As [`Closer::close_all`], with `outstanding` counting those of them not closed yet:
    /// the descriptors one client connection's requests still hold in the daemon's table.
    pub(crate) fn close_all_counted(
        &self,
        fds: Vec<(u32, OwnedFd)>,
        outstanding: &Arc<Outstanding>,
    ) {
        outstanding.n.fetch_add(fds.len(), Relaxed);
        self.enqueue(fds.into_iter().map(|(uid, fd)| {
            let c = Closing {
                fd,
                done: None,
                counted: Some(outstanding.clone()),
            };
            (uid, c)
        }));
    }

    /// Closes `fd` on a closer thread, on behalf of `uid`, and resolves once it is closed (or
    /// the pool stopped). For a request whose client closes the same socket right after the
    /// reply: answered only once the daemon's reference is gone, the client's close is the
    /// last, as without the daemon (a `SO_LINGER {1, 0}` close resets at once). The wait is
    /// the requesting connection's alone (a close that blocks holds only its own requests).
    pub(crate) fn close_awaited(
        &self,
        uid: u32,
        fd: OwnedFd,
    ) -> tokio::sync::oneshot::Receiver<()> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let c = Closing {
            fd,
            done: Some(tx),
            counted: None,
        };
        self.enqueue(std::iter::once((uid, c)));
        rx
    }

    fn enqueue(&self, fds: impl Iterator<Item = (u32, Closing)>) {
        let mut uids: Vec<u32> = Vec::with_capacity(2);
        {
            let mut s = lock(&self.inner.state);
            for (uid, fd) in fds {
                s.uids.entry(uid).or_default().queue.push_back(fd);
                self.inner.outstanding.fetch_add(1, Relaxed);
                if !uids.contains(&uid) {
                    uids.push(uid);
                }
            }
        }
        for _ in uids {
            self.wake_one();
        }
    }

    /// Wakes an idle closer thread, or starts one when none is idle (below [`MAX_THREADS`]).
    fn wake_one(&self) {
        let mut s = lock(&self.inner.state);
        if s.idle == 0 && s.threads < MAX_THREADS {
            s.threads += 1;
            let inner = self.inner.clone();
            let first = s.threads == 1;
            drop(s);
            let spawned = std::thread::Builder::new()
                .name("smc-ism-closer".into())
                .stack_size(64 << 10)
                .spawn(move || run(&inner, first));
            if spawned.is_err() {
                let mut s = lock(&self.inner.state);
                s.threads -= 1;
                log::warn!("cannot start a closer thread ({} running)", s.threads);
            }
        } else {
            drop(s);
            self.inner.cv.notify_one();
        }
    }

    /// True when `uid` has so many closes outstanding that its requests must wait.
    pub(crate) fn over_limit(&self, uid: u32) -> bool {
        if self.inner.outstanding.load(Relaxed) < PER_UID_PENDING {
            return false;
        }
        lock(&self.inner.state)
            .uids
            .get(&uid)
            .is_some_and(|u| u.queue.len() + u.busy >= PER_UID_PENDING)
    }

    /// Closes done so far (tests, stats).
    #[allow(dead_code)]
    pub(crate) fn closed(&self) -> u64 {
        lock(&self.inner.state).closed
    }
}

impl Drop for Closer {
    fn drop(&mut self) {
        lock(&self.inner.state).stop = true;
        self.inner.cv.notify_all();
    }
}

/// The next fd a thread may close: from a uid below its share of threads.
fn next(s: &mut State) -> Option<(u32, Closing)> {
    let uid = s
        .uids
        .iter()
        .find(|(_, u)| u.busy < PER_UID_THREADS && !u.queue.is_empty())
        .map(|(&uid, _)| uid)?;
    let u = s.uids.get_mut(&uid)?;
    let fd = u.queue.pop_front()?;
    u.busy += 1;
    Some((uid, fd))
}

fn run(inner: &Inner, permanent: bool) {
    let mut s = lock(&inner.state);
    loop {
        if let Some((uid, c)) = next(&mut s) {
            drop(s);
            drop(c.fd); // may block: that is what this thread is for
            if let Some(done) = c.done {
                let _ = done.send(());
            }
            if let Some(o) = c.counted {
                if o.n.fetch_sub(1, Relaxed) == 1 {
                    o.none_left.notify_one();
                }
            }
            s = lock(&inner.state);
            s.closed += 1;
            inner.outstanding.fetch_sub(1, Relaxed);
            if let Some(u) = s.uids.get_mut(&uid) {
                u.busy -= 1;
                if u.busy == 0 && u.queue.is_empty() {
                    s.uids.remove(&uid);
                }
            }
            continue;
        }
        if s.stop {
            break;
        }
        s.idle += 1;
        let (g, timeout) = inner
            .cv
            .wait_timeout(s, IDLE_EXIT)
            .unwrap_or_else(|p| p.into_inner());
        s = g;
        s.idle -= 1;
        if timeout.timed_out() && !permanent && next_exists(&s).is_none() {
            break;
        }
    }
    s.threads -= 1;
}

fn next_exists(s: &State) -> Option<()> {
    s.uids
        .values()
        .any(|u| u.busy < PER_UID_THREADS && !u.queue.is_empty())
        .then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd};

    fn pipe() -> (OwnedFd, OwnedFd) {
        let mut p = [0; 2];
        // SAFETY: pipe2 fills two fds that we own.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: fresh fds.
        unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
    }

    #[test]
    fn closes_everything_it_is_given() {
        let c = Closer::new();
        let mut readers = Vec::new();
        for uid in 0..3 {
            for _ in 0..20 {
                let (r, w) = pipe();
                readers.push(r);
                c.close(uid, w);
            }
        }
        // Every write end is closed once a read sees EOF.
        for r in readers {
            let mut b = [0u8; 1];
            // SAFETY: blocking read of one byte into b.
            let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            assert_eq!(n, 0);
        }
        assert!(!c.over_limit(0));
    }

    #[test]
    fn an_awaited_close_is_done_when_it_resolves() {
        let c = Closer::new();
        for uid in 0..50 {
            let (r, w) = pipe();
            // Busy queues of other uids ahead of it change nothing.
            for _ in 0..3 {
                c.close(uid + 1000, pipe().1);
            }
            c.close_awaited(uid, w).blocking_recv().unwrap();
            // The write end is gone already: a non-blocking read sees EOF, not EAGAIN.
            // SAFETY: fcntl on our own fd.
            unsafe { libc::fcntl(r.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) };
            let mut b = [0u8; 1];
            // SAFETY: read of one byte into b.
            let n = unsafe { libc::read(r.as_raw_fd(), b.as_mut_ptr().cast(), 1) };
            assert_eq!(n, 0, "uid {uid}: the write end was still open");
        }
    }
}
