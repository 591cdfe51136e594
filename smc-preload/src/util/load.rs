//! Whether the machine has a CPU to spare for a spin: the system-wide count of runnable tasks
//! (`/proc/loadavg`'s fourth field, `running/total`, the kernel's `nr_running()`), sampled at
//! most every [`SAMPLE_MS`] per process, against the CPUs online.
//!
//! A wait that spins keeps its CPU busy for a peer that runs elsewhere; that pays only while a
//! CPU is free for that peer. With more runnable tasks than CPUs (several busy processes per
//! core), each spin takes the time of a task that would have answered: at 20 000 connections
//! over 10 processes on 2 cores the ping p99 was 8.7 ms spinning and 1.1 ms with
//! `SMC_SPIN_US=0` (PERF.md, 2026-12-01). A spinner counts as running itself, so the
//! spinners of a loaded machine stop each other.

use std::sync::atomic::{AtomicU64, Ordering};

/// How long a sample is used, in milliseconds.
pub const SAMPLE_MS: u64 = 10;

/// The last sample: `(ms << 20) | running` (`running` clamped below 2^20), 0: none yet.
static SAMPLE: AtomicU64 = AtomicU64::new(0);

/// True while the runnable tasks (this thread among them) are no more than the CPUs online:
/// a spin takes no CPU another task waits for. True as well when the count cannot be read.
pub fn cpu_to_spare(cpus: u64) -> bool {
    let now = coarse_ms();
    let v = SAMPLE.load(Ordering::Relaxed);
    let running = if v != 0 && now.wrapping_sub(v >> 20) < SAMPLE_MS {
        v & 0xf_ffff
    } else {
        let Some(r) = running_now() else {
            return true;
        };
        let r = r.min(0xf_ffff);
        SAMPLE.store((now << 20) | r, Ordering::Relaxed);
        r
    };
    running <= cpus
}

/// `CLOCK_MONOTONIC_COARSE` in milliseconds (a vDSO read of the last tick).
fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1000) + ts.tv_nsec as u64 / 1_000_000
}

/// The runnable tasks now, from `/proc/loadavg` (`0.85 1.03 0.91 3/105 6452`), errno kept.
fn running_now() -> Option<u64> {
    let e0 = super::real::errno();
    let mut buf = [0u8; 128];
    // SAFETY: a NUL-terminated path; the descriptor is ours and closed below.
    let fd = unsafe { libc::open(c"/proc/loadavg".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    let n = if fd >= 0 {
        // SAFETY: `buf` is writable for its length; `fd` is ours. The real `read`: a file.
        let n = unsafe { super::real::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: our descriptor, closed once.
        unsafe { super::real::close(fd) };
        n
    } else {
        -1
    };
    super::real::set_errno(e0);
    let text = buf.get(..usize::try_from(n).ok()?)?;
    parse_running(text)
}

/// The `running` of `running/total`, the fourth field of `/proc/loadavg`.
fn parse_running(text: &[u8]) -> Option<u64> {
    let field = text.split(|b| *b == b' ').nth(3)?;
    let running = field.split(|b| *b == b'/').next()?;
    std::str::from_utf8(running).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_loadavg() {
        assert_eq!(parse_running(b"0.85 1.03 0.91 3/105 6452\n"), Some(3));
        assert_eq!(parse_running(b"0.85 1.03 0.91"), None);
        assert_eq!(parse_running(b"0.85 1.03 0.91 x/105 6452\n"), None);
        assert!(running_now().is_some_and(|r| r >= 1));
    }
}
