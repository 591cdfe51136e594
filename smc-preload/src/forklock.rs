//! Process-global mutexes that a forked child can use.
//!
//! After `fork` in a threaded process the child has one thread; a mutex that another thread
//! of the parent held at that moment stays locked in the child forever. Every global lock of
//! the library is a [`ForkMutex`]: [`after_fork_child`] (run in the child, single-threaded)
//! replaces each one that is held by a fresh lock around fresh data (the old data may be
//! half-updated; it is leaked, never touched again). One that is free is kept as is.
//!
//! None of these locks is held across I/O that waits; the daemon connection has its own
//! replacement ([`crate::setup`]).

use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};

/// A global mutex, created on first use with `init`, reset in a forked child when held.
pub struct ForkMutex<T> {
    cur: AtomicPtr<Mutex<T>>,
    init: fn() -> T,
}

impl<T> ForkMutex<T> {
    pub const fn new(init: fn() -> T) -> ForkMutex<T> {
        ForkMutex {
            cur: AtomicPtr::new(std::ptr::null_mut()),
            init,
        }
    }

    fn get(&self) -> &Mutex<T> {
        let p = self.cur.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: published below and never freed.
            return unsafe { &*p };
        }
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

    /// Locks it (a poisoned lock is taken as is: the data stays usable).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.get().lock().unwrap_or_else(|e| e.into_inner())
    }

    /// In the child after fork (single-threaded): a lock held by a thread of the parent is
    /// replaced by a fresh one.
    pub fn after_fork(&self) {
        let p = self.cur.load(Ordering::Acquire);
        if p.is_null() {
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

/// Every global lock of the library, reset in a forked child (see the module documentation).
pub fn after_fork_child() {
    crate::setup::after_fork_locks();
    crate::dmbs::after_fork_locks();
    crate::stats::after_fork_locks();
    crate::epoll::after_fork_locks();
    crate::lifecycle::after_fork_locks();
}

#[cfg(test)]
mod tests {
    use super::*;

    static M: ForkMutex<Vec<u32>> = ForkMutex::new(Vec::new);

    #[test]
    fn a_held_lock_is_replaced_and_a_free_one_kept() {
        M.lock().push(1);
        M.after_fork();
        assert_eq!(*M.lock(), vec![1], "free: kept with its data");
        let g = M.lock();
        // As in a child whose other thread held it at the fork.
        M.after_fork();
        assert!(M.lock().is_empty(), "held: a fresh lock around fresh data");
        drop(g);
    }
}
