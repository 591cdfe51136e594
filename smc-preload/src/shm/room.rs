//! Room for the application's own memory mappings.
//!
//! Each SMC-D connection end maps its DMB, the peer's and its local state: three of the
//! process's `vm.max_map_count` mappings. When they run out, our `mmap` fails and the
//! handshake declines with `MEM`, but the application is left with none either: its next
//! `malloc` that needs a mapping (a thread's arena, a large block) aborts the program (seen in
//! CI: `scale_smc::mappings_exhausted_fall_back_with_mem`, "memory allocation of 37392 bytes
//! failed"). So the first handshake of the process sets [`RESERVE_MAPS`] mappings aside (one
//! anonymous region, its pages alternately inaccessible: one mapping each); a mapping of ours
//! that fails for lack of room gives them back ([`on_map_error`]) and no connection maps
//! anything more ([`exhausted`]: `MEM` at once) until the reserve can be set aside again, at
//! most once per [`REARM`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Mappings set aside for the application.
pub const RESERVE_MAPS: usize = 16;
/// How often a new reserve is tried while exhausted.
const REARM: Duration = Duration::from_secs(1);

/// The reserve of this process.
struct Room {
    /// The reserve's address (0: none).
    reserve: AtomicUsize,
    /// When the reserve was given back (monotonic µs, 0: not exhausted).
    exhausted_at: AtomicU64,
}

static ROOM: Room = Room::new();

fn now_us() -> u64 {
    // SAFETY: a zeroed timespec is valid output space.
    let mut t: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64) * 1_000_000 + (t.tv_nsec as u64) / 1000 + 1
}

impl Room {
    const fn new() -> Room {
        Room {
            reserve: AtomicUsize::new(0),
            exhausted_at: AtomicU64::new(0),
        }
    }

    /// Sets the reserve aside if there is none (the first handshake of the process, or a retry at
    /// most once per [`REARM`] after it was given back). Cheap once set.
    fn arm(&self) {
        if self.reserve.load(Ordering::Acquire) != 0 {
            return;
        }
        let at = self.exhausted_at.load(Ordering::Acquire);
        if at != 0 && now_us().saturating_sub(at) < REARM.as_micros() as u64 {
            return;
        }
        let len = RESERVE_MAPS * 4096;
        // SAFETY: a fresh private anonymous region chosen by the kernel, never accessed.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            self.exhausted_at.store(now_us(), Ordering::Release);
            return;
        }
        let mut split = true;
        for i in (1..RESERVE_MAPS).step_by(2) {
            // SAFETY: a page of our own region; only its protection changes.
            if unsafe { libc::mprotect(p.cast::<u8>().add(i * 4096).cast(), 4096, libc::PROT_READ) }
                != 0
            {
                split = false;
                break;
            }
        }
        if !split
            || self
                .reserve
                .compare_exchange(0, p as usize, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            // No room for all of it (the mappings ran out meanwhile), or another thread set one.
            // SAFETY: our own region, never handed out.
            unsafe { libc::munmap(p, len) };
            if !split {
                self.exhausted_at.store(now_us(), Ordering::Release);
            }
            return;
        }
        self.exhausted_at.store(0, Ordering::Release);
    }

    /// Whether no connection may map anything now (the reserve was given back and not set aside
    /// again).
    #[inline]
    fn exhausted(&self) -> bool {
        self.exhausted_at.load(Ordering::Relaxed) != 0
    }

    /// A mapping of ours failed with `e`: when for lack of room (`ENOMEM`), the reserve goes back
    /// to the application and mapping stops ([`exhausted`]).
    fn on_map_error(&self, e: &std::io::Error) {
        if e.raw_os_error() != Some(libc::ENOMEM) {
            return;
        }
        self.exhausted_at.store(now_us(), Ordering::Release);
        let p = self.reserve.swap(0, Ordering::AcqRel);
        if p != 0 {
            crate::debug!(
                "out of memory mappings: {RESERVE_MAPS} given back to the application; new \
                 connections stay TCP (MEM) for now"
            );
            // SAFETY: our own region, never handed out.
            unsafe { libc::munmap(p as *mut libc::c_void, RESERVE_MAPS * 4096) };
        }
    }
}

/// Sets the reserve aside if there is none (the first handshake of the process, or a retry at
/// most once per [`REARM`] after it was given back). Cheap once set.
pub fn arm() {
    ROOM.arm()
}

/// Whether no connection may map anything now (the reserve was given back and not set aside
/// again).
#[inline]
pub fn exhausted() -> bool {
    ROOM.exhausted()
}

/// A mapping of ours failed with `e`: when for lack of room (`ENOMEM`), the reserve goes back
/// to the application and mapping stops ([`exhausted`]).
pub fn on_map_error(e: &std::io::Error) {
    ROOM.on_map_error(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_is_given_back_on_enomem_and_set_aside_again_later() {
        let r = Room::new();
        r.arm();
        assert_ne!(r.reserve.load(Ordering::Acquire), 0);
        assert!(!r.exhausted());
        r.on_map_error(&std::io::Error::from_raw_os_error(libc::EACCES));
        assert!(!r.exhausted(), "only ENOMEM counts");
        r.on_map_error(&std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert!(r.exhausted());
        assert_eq!(r.reserve.load(Ordering::Acquire), 0);
        r.arm();
        assert!(r.exhausted(), "not again within REARM");
        r.exhausted_at.store(1, Ordering::Release);
        r.arm();
        assert!(!r.exhausted());
        assert_ne!(r.reserve.load(Ordering::Acquire), 0);
        r.on_map_error(&std::io::Error::from_raw_os_error(libc::ENOMEM));
    }
}
