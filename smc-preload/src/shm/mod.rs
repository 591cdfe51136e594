//! Shared-memory helpers: mappings, memfds, and a process-shared futex lock.

pub mod room;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// A `MAP_SHARED` mapping, unmapped on drop. Inherited by `fork` (same pages).
pub use smc_ism::DmbMap as Mapping;

/// A zero-filled memfd of `len` bytes (for tests and local state).
pub fn memfd(name: &str, len: usize) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).unwrap_or_default();
    // SAFETY: valid C string.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: valid fd.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// A connection's local state page: a 4 KiB memfd sealed against shrinking and growing (so
/// that no process holding it can make the others' accesses fault), mapped. The fd goes to the
/// daemon with the registration and is closed then; the mapping keeps the memory.
pub fn state_page() -> io::Result<(OwnedFd, Mapping)> {
    if room::exhausted() {
        return Err(io::Error::from_raw_os_error(libc::ENOMEM));
    }
    // SAFETY: valid C string; the real call (no fd bookkeeping for our own fd).
    let fd = unsafe {
        crate::real::memfd_create(
            c"smc-state".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain calls on our fd.
    let ok = unsafe {
        libc::ftruncate(fd.as_raw_fd(), 4096) == 0
            && libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW,
            ) == 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    let map = Mapping::new(fd.as_raw_fd(), 4096).inspect_err(room::on_map_error)?;
    Ok((fd, map))
}

pub fn futex_wait(word: &AtomicU32, val: u32, timeout_ms: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ms / 1000) as libc::time_t,
        tv_nsec: ((timeout_ms % 1000) * 1_000_000) as libc::c_long,
    };
    // SAFETY: shared (not PRIVATE) futex on a valid u32; works across processes mapping it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        )
    };
}

pub fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: as above.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            n,
            0usize,
            0usize,
            0u32,
        )
    };
}

/// A lock in shared memory for threads of several processes. The word is `0` when free, else
/// the holder's pid, with [`WAITERS`] set when a waiter may sleep on it. The holder is named by
/// the very compare-and-swap that takes the lock: a lock whose holder died (a process that no
/// longer exists) is taken over after [`TAKEOVER_MS`], one held by a live process never is.
/// (The holder's pid used to be stored in a second word after the lock was taken: a waiter
/// that looked between the two found the pid of the *previous* holder, a forked child that
/// had exited since, and took the lock over from a live holder: two readers copied from the
/// same consumer cursor.)
#[repr(C)]
pub struct ShmLock {
    word: AtomicU32,
}

/// [`ShmLock`]: a waiter may sleep on the word (the unlock wakes one). Pids are below 2^22.
const WAITERS: u32 = 1 << 31;
/// [`ShmLock`]: a holder that does not exist any more is replaced after this long.
pub const TAKEOVER_MS: u64 = 500;

impl ShmLock {
    /// Takes the lock. While a thread holds one, the program's signal handlers wait until it
    /// is released (`signals::crit_enter`): a handler that ran inside and called us on the same
    /// connection would wait for ever for its own thread.
    pub fn lock(&self) -> ShmGuard<'_> {
        let me = crate::pid();
        crate::signals::crit_enter();
        if self
            .word
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow(me);
        }
        ShmGuard { l: self }
    }

    pub fn try_lock(&self) -> Option<ShmGuard<'_>> {
        crate::signals::crit_enter();
        let r = self
            .word
            .compare_exchange(0, crate::pid(), Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| ShmGuard { l: self });
        if r.is_none() {
            crate::signals::crit_exit();
        }
        r
    }

    #[cold]
    fn lock_slow(&self, me: u32) {
        for _ in 0..200 {
            std::hint::spin_loop();
            if self
                .word
                .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
        // Taken after sleeping: with the waiters bit, others may still sleep on the word.
        let mine = me | WAITERS;
        // The holder we wait for, and since when.
        let mut seen: Option<(u32, std::time::Instant)> = None;
        loop {
            let v = self.word.load(Ordering::Relaxed);
            if v == 0 {
                if self
                    .word
                    .compare_exchange(0, mine, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                continue;
            }
            let held = v | WAITERS;
            if v != held
                && self
                    .word
                    .compare_exchange(v, held, Ordering::Relaxed, Ordering::Relaxed)
                    .is_err()
            {
                continue;
            }
            // Not holding this lock while asleep: a handler may run meanwhile (unless another
            // lock of ours is held), and what was deferred runs now.
            crate::signals::crit_exit();
            futex_wait(&self.word, held, 100);
            crate::signals::crit_enter();
            let holder = v & !WAITERS;
            match seen {
                Some((h, since)) if h == holder => {
                    if since.elapsed() >= std::time::Duration::from_millis(TAKEOVER_MS)
                        && !process_exists(holder)
                        // Only from that very holder: nobody else can hold the lock meanwhile.
                        && self
                            .word
                            .compare_exchange(held, mine, Ordering::Acquire, Ordering::Relaxed)
                            .is_ok()
                    {
                        return;
                    }
                }
                _ => seen = Some((holder, std::time::Instant::now())),
            }
        }
    }

    fn unlock(&self) {
        if self.word.swap(0, Ordering::Release) & WAITERS != 0 {
            futex_wake(&self.word, 1);
        }
    }
}

/// Whether process `pid` exists (a zombie still does: it is gone once reaped).
fn process_exists(pid: u32) -> bool {
    let e0 = crate::real::errno();
    // SAFETY: kill with signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    let gone = r != 0 && crate::real::errno() == libc::ESRCH;
    crate::real::set_errno(e0);
    !gone
}

pub struct ShmGuard<'a> {
    l: &'a ShmLock,
}

impl Drop for ShmGuard<'_> {
    fn drop(&mut self) {
        self.l.unlock();
        crate::signals::crit_exit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A page shared with forked children: a lock and what its holders check with it.
    #[repr(C)]
    struct Area {
        lock: ShmLock,
        /// 1 while a holder is inside.
        inside: AtomicU32,
        /// Holders that found another one inside.
        broken: AtomicU32,
        /// Set by a holder right before it unlocks.
        released: AtomicU32,
        /// Set by a holder once it holds the lock.
        holding: AtomicU32,
        rounds: AtomicU64,
    }

    fn area(m: &Mapping) -> &Area {
        // SAFETY: a fresh zero-filled shared page; `Area` is atomics only (zero-valid) and fits.
        unsafe { &*(m.as_ptr() as *const Area) }
    }

    fn fork_child(f: impl FnOnce()) -> libc::pid_t {
        // SAFETY: the child only touches shared atomics and the lock (no allocation, no lock a
        // thread of the test harness may hold) and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            crate::reset_pid();
            f();
            // SAFETY: leaving the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        assert!(pid > 0, "fork");
        pid
    }

    fn reap(pid: libc::pid_t) {
        let mut st = 0;
        // SAFETY: `pid` is our child; `st` a writable int.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    }

    #[test]
    fn a_lock_left_by_a_dead_process_is_taken_over() {
        let m = Mapping::anon_shared(4096).unwrap();
        let a = area(&m);
        let c = fork_child(|| std::mem::forget(a.lock.lock()));
        reap(c);
        // Its holder is gone: taken over (after TAKEOVER_MS), and named after us.
        let g = a.lock.lock();
        assert_eq!(a.lock.word.load(Ordering::Relaxed) & !WAITERS, crate::pid());
        drop(g);
        assert_eq!(a.lock.word.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_lock_held_by_a_live_process_is_never_taken_over() {
        let m = Mapping::anon_shared(4096).unwrap();
        let a = area(&m);
        // The previous holder exited: a waiter must still not take the lock from the current
        // one, however long it holds it.
        let gone = fork_child(|| drop(a.lock.lock()));
        reap(gone);
        let holder = fork_child(|| {
            let g = a.lock.lock();
            a.holding.store(1, Ordering::SeqCst);
            // Held for longer than TAKEOVER_MS, until the parent has waited that long.
            while a.holding.load(Ordering::SeqCst) != 2 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            a.released.store(1, Ordering::SeqCst);
            drop(g);
        });
        while a.holding.load(Ordering::SeqCst) != 1 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::scope(|s| {
            let w = s.spawn(|| {
                let _g = a.lock.lock();
                a.released.load(Ordering::SeqCst)
            });
            std::thread::sleep(std::time::Duration::from_millis(3 * TAKEOVER_MS));
            a.holding.store(2, Ordering::SeqCst);
            assert_eq!(
                w.join().unwrap(),
                1,
                "the waiter took a lock its holder still held"
            );
        });
        reap(holder);
    }

    /// Many short-lived processes take the lock in turn (so the previous holder has often
    /// exited), more than the CPUs can run at once (so holders are preempted anywhere): no two
    /// are ever inside at once. Before the holder was named by the CAS that takes the lock,
    /// this saw two holders at once in 1 of 9 runs of 3000 processes.
    #[test]
    fn processes_that_come_and_go_never_hold_the_lock_together() {
        let m = Mapping::anon_shared(4096).unwrap();
        let a = area(&m);
        let mut live = Vec::new();
        let (workers, at_once) = (600, 16);
        for i in 0..workers {
            while live.len() >= at_once {
                // Only our own children (other tests fork too).
                live.retain(|&p| {
                    let mut st = 0;
                    // SAFETY: `p` is our child; `st` a writable int.
                    unsafe { libc::waitpid(p, &mut st, libc::WNOHANG) != p }
                });
                if live.len() >= at_once {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            }
            live.push(fork_child(|| {
                for _ in 0..(100 + i % 50) {
                    let g = a.lock.lock();
                    if a.inside.swap(1, Ordering::SeqCst) != 0 {
                        a.broken.fetch_add(1, Ordering::SeqCst);
                    }
                    for _ in 0..200 {
                        std::hint::spin_loop();
                    }
                    a.inside.store(0, Ordering::SeqCst);
                    a.rounds.fetch_add(1, Ordering::Relaxed);
                    drop(g);
                }
            }));
        }
        for p in live {
            reap(p);
        }
        assert!(a.rounds.load(Ordering::Relaxed) >= workers * 100);
        assert_eq!(a.broken.load(Ordering::SeqCst), 0, "two holders at once");
    }
}
