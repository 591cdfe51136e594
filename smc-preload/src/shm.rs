//! Shared-memory helpers: mappings, memfds, and a process-shared futex lock.

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
    let map = Mapping::new(fd.as_raw_fd(), 4096)?;
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

/// A lock in shared memory for threads of several processes. `0` free, `1` held, `2` held with
/// waiters. The holder's pid is kept so that a lock left by a process that died is taken over.
#[repr(C)]
pub struct ShmLock {
    word: AtomicU32,
    owner: AtomicU32,
}

impl ShmLock {
    pub fn lock(&self) -> ShmGuard<'_> {
        let me = crate::pid();
        if self
            .word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow(me);
        }
        self.owner.store(me, Ordering::Relaxed);
        ShmGuard { l: self }
    }

    pub fn try_lock(&self) -> Option<ShmGuard<'_>> {
        if self
            .word
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            self.owner.store(crate::pid(), Ordering::Relaxed);
            Some(ShmGuard { l: self })
        } else {
            None
        }
    }

    #[cold]
    fn lock_slow(&self, _me: u32) {
        for _ in 0..200 {
            std::hint::spin_loop();
            if self
                .word
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
        let mut waited_ms = 0u64;
        loop {
            if self.word.swap(2, Ordering::Acquire) == 0 {
                return;
            }
            futex_wait(&self.word, 2, 100);
            waited_ms += 100;
            if waited_ms >= 500 {
                // A holder that died leaves the lock held forever: take it over.
                let owner = self.owner.load(Ordering::Relaxed);
                if owner != 0
                    // SAFETY: kill with signal 0 only checks that the process exists.
                    && unsafe { libc::kill(owner as libc::pid_t, 0) } != 0
                    && crate::real::errno() == libc::ESRCH
                {
                    self.word.store(2, Ordering::Release);
                    return;
                }
                waited_ms = 0;
            }
        }
    }

    fn unlock(&self) {
        if self.word.swap(0, Ordering::Release) == 2 {
            futex_wake(&self.word, 1);
        }
    }
}

pub struct ShmGuard<'a> {
    l: &'a ShmLock,
}

impl Drop for ShmGuard<'_> {
    fn drop(&mut self) {
        self.l.unlock();
    }
}
