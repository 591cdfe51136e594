//! Process-global mutexes that a forked child can use.
//!
//! After `fork` in a threaded process the child has one thread; a mutex that another thread
//! of the parent held at that moment stays locked in the child forever. Every global lock of
//! the library is a [`ForkMutex`]: [`after_fork_all`] (run by the crate root's
//! `after_fork_child` in the child, single-threaded, before anything else locks) replaces each
//! one that is held by a fresh lock around fresh data (the old data may be half-updated; it is
//! leaked, never touched again). One that is free is kept as is. A `ForkMutex` puts itself on
//! the list [`after_fork_all`] walks before its first use, so no lock can be forgotten there
//! (seen: a child hung for ever closing a descriptor in its fork handler, on the CLC byte list
//! a thread of its parent held at the fork).
//!
//! None of these locks is held across I/O that waits; the daemon connection has its own
//! replacement ([`crate::setup`]).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// A global mutex, created on first use with `init`, reset in a forked child when held.
pub struct ForkMutex<T> {
    cur: AtomicPtr<Mutex<T>>,
    init: fn() -> T,
    /// On the list of [`after_fork_all`] (done before `cur` is first published).
    listed: ForkOnce<()>,
}

/// What [`after_fork_all`] resets.
trait AfterFork: Sync {
    fn after_fork(&self, light: bool);
}

impl<T: Send + 'static> AfterFork for ForkMutex<T> {
    fn after_fork(&self, light: bool) {
        ForkMutex::after_fork(self, light)
    }
}

/// One used [`ForkMutex`] on the push-only list (nodes are never freed nor removed, so a
/// reader never sees a node go away).
struct Listed {
    m: &'static dyn AfterFork,
    next: *mut Listed,
}

static LISTED: AtomicPtr<Listed> = AtomicPtr::new(std::ptr::null_mut());

fn list(m: &'static dyn AfterFork) {
    let node = Box::into_raw(Box::new(Listed {
        m,
        next: std::ptr::null_mut(),
    }));
    let mut head = LISTED.load(Ordering::Acquire);
    loop {
        // SAFETY: `node` is ours until the exchange below publishes it.
        unsafe { (*node).next = head };
        match LISTED.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

/// In the child after fork (single-threaded): every [`ForkMutex`] used so far that a thread of
/// the parent held is replaced by a fresh one. A lock listed twice (its listing raced a fork,
/// see [`ForkOnce`]) is reset twice: the second finds it free and keeps it.
///
/// `light`: the child of a signal handler of a single-threaded process (`ops::fork`), which
/// must not allocate (the handler may have interrupted `malloc`): nothing is replaced. The
/// only thread of its parent was the forking one, and a lock it held then (none is taken while
/// a handler would run there, `signals::crit_enter`) is one the fork itself holds, released by
/// it in the child (`dmbs::after_fork_child`). Before, a fresh lock was allocated for it there:
/// `tests/redteam/sigsafe.c execonly`, 1-18 of 50 children aborted in `malloc`'s checks.
pub fn after_fork_all(light: bool) {
    let mut p = LISTED.load(Ordering::Acquire);
    while !p.is_null() {
        // SAFETY: nodes are published complete by `list` and never freed.
        let n = unsafe { &*p };
        n.m.after_fork(light);
        p = n.next;
    }
}

impl<T: Send + 'static> ForkMutex<T> {
    pub const fn new(init: fn() -> T) -> ForkMutex<T> {
        ForkMutex {
            cur: AtomicPtr::new(std::ptr::null_mut()),
            init,
            listed: ForkOnce::new(),
        }
    }

    fn get(&'static self) -> &'static Mutex<T> {
        let p = self.cur.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published below and never freed.
            return unsafe { &*p };
        }
        // Listed before the lock exists: a lock that can be held is always on the list.
        self.listed.get_or_init(|| list(self));
        let fresh = Box::into_raw(Box::new(Mutex::new((self.init)())));
        match self.cur.compare_exchange(
            std::ptr::null_mut(),
            fresh,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            // SAFETY: just published; never freed.
            Ok(_) => unsafe { &*fresh },
            Err(other) => {
                // SAFETY: ours, never published.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: published by the winner, never freed.
                unsafe { &*other }
            }
        }
    }

    /// Locks it (a poisoned lock is taken as is: the data stays usable). While it is held, a
    /// handler of the program that a signal brings to this thread is deferred until it is
    /// released ([`crate::signals::crit_enter`], as for the ring and slot locks): a handler
    /// that called us there (a `fork`, whose preparation takes these locks, or a `close`)
    /// would wait for ever for a lock its own thread holds (red team round 15, finding 9: a
    /// `fork` from a handler that interrupted `dmbs::keep`).
    pub fn lock(&'static self) -> ForkGuard<T> {
        crate::signals::crit_enter();
        let g = self.get().lock().unwrap_or_else(|e| e.into_inner());
        ForkGuard(std::mem::ManuallyDrop::new(g))
    }

    /// [`ForkMutex::lock`] for a lock already in use; `None` for one never used (whose data is
    /// then still `init`'s): a caller that must not allocate (a `fork` from a signal handler)
    /// does not create it.
    pub fn lock_if_used(&'static self) -> Option<ForkGuard<T>> {
        if self.cur.load(Ordering::Acquire).is_null() {
            return None;
        }
        Some(self.lock())
    }

    /// In the child after fork (single-threaded): a lock held by a thread of the parent is
    /// replaced by a fresh one (not when `light`: see [`after_fork_all`]).
    fn after_fork(&self, light: bool) {
        let p = self.cur.load(Ordering::Acquire);
        if p.is_null() || light {
            return;
        }
        // SAFETY: published, never freed.
        let held = matches!(unsafe { &*p }.try_lock(), Err(TryLockError::WouldBlock));
        if held {
            let fresh = Box::into_raw(Box::new(Mutex::new((self.init)())));
            // The old one is leaked: its holder does not exist here.
            self.cur.store(fresh, Ordering::Release);
        }
    }
}

/// The guard of a [`ForkMutex`]: unlocks, then lets deferred signal handlers run.
pub struct ForkGuard<T: 'static>(std::mem::ManuallyDrop<MutexGuard<'static, T>>);

impl<T> std::ops::Deref for ForkGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for ForkGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> ForkGuard<T> {
    /// In a forked child, for a guard the forking thread held across the `fork`: the lock stays
    /// as it is (the child's [`after_fork_all`] replaced it already), the signal deferral ends.
    pub fn leak(self) {
        let mut me = std::mem::ManuallyDrop::new(self);
        // SAFETY: taken once; `me` is never dropped, so the guard is not dropped twice.
        let g = unsafe { std::mem::ManuallyDrop::take(&mut me.0) };
        std::mem::forget(g);
        crate::signals::crit_exit();
    }
}

impl<T> Drop for ForkGuard<T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) };
        crate::signals::crit_exit();
    }
}

/// A value computed once per memory image, like [`std::sync::OnceLock`], that a forked child
/// can use. A `OnceLock` that a thread of the parent was initialising at the fork stays
/// "being initialised" in the child for ever, and the child's first use waits for a thread
/// that does not exist there (seen: forked children hung in the statistics' identity). Here the
/// initialiser's pid is recorded: a process that finds another process's initialisation in
/// progress (its parent's, copied by `fork`) computes the value itself; threads of one process
/// wait for each other. A `vfork` child shares the memory and the cached pid
/// ([`crate::pid`]), so it waits for its parent's thread as a thread of the parent would.
pub struct ForkOnce<T> {
    /// [`EMPTY`], [`DONE`], or `pid << 1` of the process whose thread is computing the value.
    state: AtomicU64,
    val: UnsafeCell<MaybeUninit<T>>,
}

const EMPTY: u64 = 0;
const DONE: u64 = 1;

// SAFETY: the value is written once, by the one thread that won the state, before `DONE` is
// published with Release; readers read it only after seeing `DONE` with Acquire.
unsafe impl<T: Send + Sync> Sync for ForkOnce<T> {}

impl<T> ForkOnce<T> {
    pub const fn new() -> ForkOnce<T> {
        ForkOnce {
            state: AtomicU64::new(EMPTY),
            val: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }

    /// The value, when it was computed.
    pub fn get(&self) -> Option<&T> {
        if self.state.load(Ordering::Acquire) == DONE {
            // SAFETY: `DONE` is published only after the value was written, never undone.
            Some(unsafe { (*self.val.get()).assume_init_ref() })
        } else {
            None
        }
    }

    /// The value, computed by `f` when nobody did. Another thread of this process computing it
    /// is waited for (yielding: values here take microseconds).
    pub fn get_or_init(&self, f: impl FnOnce() -> T) -> &T {
        let mut f = Some(f);
        loop {
            if let Some(v) = self.get() {
                return v;
            }
            let s = self.state.load(Ordering::Acquire);
            let me = u64::from(crate::pid()) << 1;
            if s == me {
                std::thread::yield_now();
                continue;
            }
            // Empty, or another process's thread was computing it (our parent's, before fork).
            if self
                .state
                .compare_exchange(s, me, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            // Reset to empty if `f` unwinds, so that the other threads do not wait for ever.
            struct Undo<'a>(&'a AtomicU64);
            impl Drop for Undo<'_> {
                fn drop(&mut self) {
                    self.0.store(EMPTY, Ordering::Release);
                }
            }
            let undo = Undo(&self.state);
            let Some(f) = f.take() else {
                continue;
            };
            let v = f();
            // SAFETY: this thread won the state; nobody reads the value before `DONE`.
            let v = unsafe { (*self.val.get()).write(v) };
            std::mem::forget(undo);
            self.state.store(DONE, Ordering::Release);
            return v;
        }
    }

    /// Sets the value when nobody did; `Err(value)` when it was set or is being set.
    pub fn set(&self, v: T) -> Result<(), T> {
        let me = u64::from(crate::pid()) << 1;
        loop {
            let s = self.state.load(Ordering::Acquire);
            if s == DONE || s == me {
                return Err(v);
            }
            if self
                .state
                .compare_exchange(s, me, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                // SAFETY: this thread won the state; nobody reads the value before `DONE`.
                unsafe { (*self.val.get()).write(v) };
                self.state.store(DONE, Ordering::Release);
                return Ok(());
            }
        }
    }
}

impl<T> Drop for ForkOnce<T> {
    fn drop(&mut self) {
        if *self.state.get_mut() == DONE {
            // SAFETY: `DONE`: the value was written; dropped once, here.
            unsafe { self.val.get_mut().assume_init_drop() };
        }
    }
}

impl<T> Default for ForkOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static M: ForkMutex<Vec<u32>> = ForkMutex::new(Vec::new);

    #[test]
    fn a_held_lock_is_replaced_and_a_free_one_kept() {
        M.lock().push(1);
        M.after_fork(false);
        assert_eq!(*M.lock(), vec![1], "free: kept with its data");
        let g = M.lock();
        // As in a child whose other thread held it at the fork.
        M.after_fork(false);
        assert!(M.lock().is_empty(), "held: a fresh lock around fresh data");
        drop(g);
    }

    static N: ForkMutex<u32> = ForkMutex::new(|| 0);

    fn on_list(m: &'static ForkMutex<u32>) -> bool {
        let mut p = LISTED.load(Ordering::Acquire);
        while !p.is_null() {
            // SAFETY: nodes are never freed.
            let n = unsafe { &*p };
            if std::ptr::addr_eq(n.m as *const dyn AfterFork, m as *const ForkMutex<u32>) {
                return true;
            }
            p = n.next;
        }
        false
    }

    /// The hang this list fixes: a lock no module remembered to reset in the fork handler
    /// stayed held in the child. Every lock that was ever locked is on the list.
    #[test]
    fn a_lock_is_on_the_after_fork_list_once_it_was_used() {
        assert!(!on_list(&N), "unused: not listed (nothing to reset)");
        *N.lock() += 1;
        assert!(on_list(&N), "used: listed");
        *N.lock() += 1;
        let listed = {
            let mut k = 0;
            let mut p = LISTED.load(Ordering::Acquire);
            while !p.is_null() {
                // SAFETY: nodes are never freed.
                let n = unsafe { &*p };
                k += usize::from(std::ptr::addr_eq(
                    n.m as *const dyn AfterFork,
                    &N as *const ForkMutex<u32>,
                ));
                p = n.next;
            }
            k
        };
        assert_eq!(listed, 1, "listed once, not at every use");
    }

    /// A thread of this process is inside `get_or_init` when another forks: the child (one
    /// thread, the initialiser absent) computes the value itself instead of waiting for ever,
    /// and the parent gets the initialiser's value.
    #[test]
    fn a_child_forked_during_initialisation_computes_the_value_itself() {
        static O: ForkOnce<u32> = ForkOnce::new();
        let (inside_tx, inside_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            *O.get_or_init(|| {
                inside_tx.send(()).unwrap();
                go_rx.recv().unwrap();
                1
            })
        });
        inside_rx.recv().unwrap();
        // SAFETY: the child only calls `get_or_init` (atomics, its own closure) and `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            crate::reset_pid();
            let v = *O.get_or_init(|| 2);
            // SAFETY: leaving the forked child without running the harness's exit handlers.
            unsafe { libc::_exit(if v == 2 { 0 } else { 1 }) };
        }
        let mut st = 0;
        // The child would hang here if it waited for the parent's initialiser.
        // SAFETY: our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
            "child status {st}"
        );
        go_tx.send(()).unwrap();
        assert_eq!(t.join().unwrap(), 1);
        assert_eq!(O.get(), Some(&1));
        assert_eq!(O.set(3), Err(3));
    }

    #[test]
    fn a_once_drops_its_value() {
        let v = std::sync::Arc::new(());
        let o = ForkOnce::new();
        o.get_or_init(|| v.clone());
        assert_eq!(std::sync::Arc::strong_count(&v), 2);
        drop(o);
        assert_eq!(std::sync::Arc::strong_count(&v), 1);
    }
}
