//! Which new client connections try SMC at all: the short-connection policy (connections
//! that move a few bytes lose more to the handshake than they gain) and the destinations whose
//! server did not announce SMC.

use crate::forklock::{ForkMutex, ForkOnce};
use crate::stats;
use crate::util::config::config;
use smc_common::diag::Diag;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// SMC disabled for this process (SMC_DISABLE=1, io_uring seen, or nothing attached).
static DISABLED: AtomicBool = AtomicBool::new(false);

/// Turns SMC off for this process; true the first time (`setup::disable` then withdraws the
/// announcements of its listeners).
pub(crate) fn switch_off() -> bool {
    !DISABLED.swap(true, Ordering::Relaxed)
}

pub fn enabled() -> bool {
    !DISABLED.load(Ordering::Relaxed)
}

// Fallback reason counted when the short-connection policy keeps a connection on TCP.
use smc_common::diag::POLICY_SHORT;

/// Short-connection policy: a client connection whose whole life moved fewer than
/// `SMC_SHORT_BYTES` (default 1 MiB) bytes in fewer than `SMC_SHORT_TURNS` (default 8) turns
/// (changes of direction of the process's calls: a request and its answer are 2) loses more to
/// the SMC-D handshake than it gains: the setup costs ~100 µs more than TCP's (docs/PERF.md),
/// a round trip over the rings saves ~20 µs and a byte copied ~0.15 ns, so a connection wins
/// from about 5 round trips or about 700 KB. (Before: fewer than 16 KiB, whatever the round
/// trips: one 16 KiB answer per connection stayed SMC-D at 0.36x of TCP's rate, and a chatty
/// connection of small messages went to TCP.) Learned per destination (address and port):
/// after 8 such SMC connections in a row to one destination, new client connections to it stay
/// on TCP (no SMC option in the SYN), except every 256th (`SMC_SHORT_PROBE`), at most one per
/// 100 ms, which probes SMC again (a long probe resets the run). Another destination of the
/// same process is judged on its own connections (before, one run per process: a process
/// whose long-lived connections to one service ended now and then sent its short ones to
/// another service over SMC-D again each time). `SMC_SHORT_BYTES=0` disables the policy.
struct ShortDest {
    dest: Dest,
    /// Short connections in a row to it.
    run: u32,
    /// New connections kept on TCP (for the probes).
    skipped: u64,
}

/// Destinations the policy learned (at most [`SHORT_SLOTS`]; the one with the shortest run
/// makes room for a new one).
static SHORT_DESTS: ForkMutex<Vec<ShortDest>> = ForkMutex::new(Vec::new);
const SHORT_SLOTS: usize = 64;
/// Short connections in a row that keep new ones to the destination on TCP.
const SHORT_RUN: u32 = 8;
/// How many learned destinations keep connections on TCP now (0: a connect takes no lock).
static SHORT_LEARNED: AtomicU64 = AtomicU64::new(0);

fn short_bytes() -> u64 {
    config().short_bytes
}

/// Whether a client connection that moved `bytes` in `turns` was a short one.
pub fn is_short(bytes: u64, turns: u32) -> bool {
    bytes < short_bytes() && u64::from(turns) < config().short_turns
}

/// A client SMC connection to `dest` ended having moved `bytes` in `turns`.
pub fn note_client_conn(dest: Option<Dest>, bytes: u64, turns: u32) {
    let Some(dest) = dest else { return };
    let short = is_short(bytes, turns);
    let mut v = SHORT_DESTS.lock();
    match v.iter_mut().find(|e| e.dest == dest) {
        Some(e) if short => e.run = e.run.saturating_add(1),
        Some(e) => e.run = 0,
        None if short => {
            let e = ShortDest {
                dest,
                run: 1,
                skipped: 0,
            };
            if v.len() < SHORT_SLOTS {
                v.push(e);
            } else if let Some(i) = (0..v.len()).min_by_key(|&i| v.get(i).map_or(0, |x| x.run)) {
                if let Some(x) = v.get_mut(i) {
                    *x = e;
                }
            }
        }
        None => {}
    }
    let learned = v.iter().filter(|e| e.run >= SHORT_RUN).count();
    SHORT_LEARNED.store(learned as u64, Ordering::Relaxed);
}

/// Every how many connections the policy keeps on TCP one probes SMC again
/// (`SMC_SHORT_PROBE`, default 256; 0: never).
fn short_probe() -> u64 {
    config().short_probe
}

/// At most one policy probe per 100 ms: a probe is a whole SMC handshake, during which a
/// single-threaded event-loop client (wrk, redis-benchmark) waits, so at high connection rates
/// a count alone would make probes a measurable share of its time.
fn probe_due() -> bool {
    static EPOCH: ForkOnce<Instant> = ForkOnce::new();
    static LAST_MS: AtomicU64 = AtomicU64::new(0);
    let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 100;
    let last = LAST_MS.load(Ordering::Relaxed);
    now >= last + 100
        && LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// When the policy learned that connections to `dest` are short: one more of them counted
/// as kept on TCP, and how many were.
fn learned_short(dest: Dest) -> Option<u64> {
    let mut v = SHORT_DESTS.lock();
    let e = v
        .iter_mut()
        .find(|e| e.dest == dest && e.run >= SHORT_RUN)?;
    e.skipped += 1;
    Some(e.skipped)
}

/// Whether the policy keeps this new client connection to `dest` on TCP.
pub fn policy_keeps_tcp(dest: Option<Dest>) -> bool {
    let Some(dest) = dest else { return false };
    if short_bytes() == 0 || SHORT_LEARNED.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let Some(n) = learned_short(dest) else {
        return false;
    };
    let every = short_probe();
    if every != 0 && n % every == 0 && probe_due() {
        return false; // probe
    }
    stats::fallback(false, POLICY_SHORT);
    true
}

/// A connection's destination (address and port), for the non-SMC destination cache.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Dest(u128, u16);

impl Dest {
    /// The destination of `connect(addr, len)`, for AF_INET/AF_INET6.
    ///
    /// # Safety
    /// `addr` is the application's pointer, valid for `len` bytes (or null).
    pub unsafe fn of(addr: *const libc::sockaddr, len: libc::socklen_t) -> Option<Dest> {
        if addr.is_null() {
            return None;
        }
        // SAFETY: the family field is within any sockaddr the caller passes.
        match unsafe { (*addr).sa_family } as i32 {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                // SAFETY: family and length say sockaddr_in.
                let a = unsafe { &*(addr as *const libc::sockaddr_in) };
                Some(Dest(a.sin_addr.s_addr as u128, a.sin_port))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                // SAFETY: family and length say sockaddr_in6.
                let a = unsafe { &*(addr as *const libc::sockaddr_in6) };
                // Bit 127 of a v4 key is never set (s_addr < 2^32): v6 keys are tagged so.
                Some(Dest(
                    u128::from_ne_bytes(a.sin6_addr.s6_addr) | 1 << 127,
                    a.sin6_port,
                ))
            }
            _ => None,
        }
    }

    /// The port (host order).
    pub fn port(&self) -> u16 {
        u16::from_be(self.1)
    }

    /// The peer of the connected socket `fd` (`None`: not connected, not IP; errno kept).
    pub fn peer_of(fd: libc::c_int) -> Option<Dest> {
        if fd < 0 {
            return None;
        }
        // SAFETY: plain integers, for which all-zero bytes are a valid value.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let e0 = crate::util::real::errno();
        // SAFETY: valid out buffer of `len` bytes.
        let r = unsafe {
            crate::util::real::getpeername(
                fd,
                &mut ss as *mut libc::sockaddr_storage as *mut libc::sockaddr,
                &mut len,
            )
        };
        crate::util::real::set_errno(e0);
        if r != 0 {
            return None;
        }
        // SAFETY: the kernel filled `len` bytes of `ss`.
        unsafe {
            Dest::of(
                &ss as *const libc::sockaddr_storage as *const libc::sockaddr,
                len,
            )
        }
    }
}

/// Destinations whose server did not announce SMC: the next client connections to them do not
/// opt in (no SMC option in the SYN, no state query: the cost of a fallback becomes nothing),
/// except every 64th or after a second, which probes again. Counted as PEERNOSMC, the reason
/// learned from the probe. Forgotten when a probe finds the peer SMC-capable.
struct NoSmcDest {
    dest: Dest,
    skips: u32,
    probed: Instant,
}

const NO_SMC_SLOTS: usize = 32;
static NO_SMC_N: AtomicU64 = AtomicU64::new(0);

static NO_SMC_DESTS: ForkMutex<Vec<NoSmcDest>> = ForkMutex::new(Vec::new);

fn no_smc_dests() -> &'static ForkMutex<Vec<NoSmcDest>> {
    &NO_SMC_DESTS
}

/// Whether a new client connection to `dest` stays plain TCP without asking (counted).
pub fn known_no_smc(dest: Option<Dest>) -> bool {
    let Some(dest) = dest else { return false };
    if NO_SMC_N.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let mut v = no_smc_dests().lock();
    let Some(e) = v.iter_mut().find(|e| e.dest == dest) else {
        return false;
    };
    e.skips += 1;
    if e.skips % 64 == 0 || e.probed.elapsed() > Duration::from_secs(1) {
        e.probed = Instant::now();
        return false; // probe
    }
    drop(v);
    stats::fallback(false, Diag::PeerNoSmc.code());
    true
}

/// What a client connection to `dest` learned about its server.
pub(crate) fn note_dest(dest: Option<Dest>, smc_capable: bool) {
    let Some(dest) = dest else { return };
    if smc_capable && NO_SMC_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let mut v = no_smc_dests().lock();
    let at = v.iter().position(|e| e.dest == dest);
    match (at, smc_capable) {
        (Some(i), true) => {
            v.swap_remove(i);
        }
        (Some(i), false) => v[i].probed = Instant::now(),
        (None, true) => return,
        (None, false) => {
            let e = NoSmcDest {
                dest,
                skips: 0,
                probed: Instant::now(),
            };
            if v.len() < NO_SMC_SLOTS {
                v.push(e);
            } else {
                // Replace the entry probed longest ago.
                let old = (0..v.len()).min_by_key(|&i| v[i].probed).unwrap_or(0);
                v[old] = e;
            }
        }
    }
    NO_SMC_N.store(v.len() as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::{is_short, learned_short, note_client_conn, Dest};

    #[test]
    fn the_policy_learns_each_destination_on_its_own() {
        let a = Some(Dest(0x0100_007f, 80));
        let b = Some(Dest(0x0100_007f, 6379));
        for _ in 0..8 {
            note_client_conn(a, 500, 2);
        }
        assert!(learned_short(Dest(0x0100_007f, 80)).is_some());
        // A long connection to another destination does not reset the first one's run, and
        // that destination is not learned from the first one's connections.
        note_client_conn(b, 10 << 20, 2);
        assert!(learned_short(Dest(0x0100_007f, 80)).is_some());
        assert!(learned_short(Dest(0x0100_007f, 6379)).is_none());
        // A long one to the first destination resets its run.
        note_client_conn(a, 100, 40);
        assert!(learned_short(Dest(0x0100_007f, 80)).is_none());
    }

    #[test]
    fn a_request_and_its_answer_is_short_a_conversation_or_a_bulk_transfer_is_not() {
        // One request, one 16 KiB answer: short (it stayed SMC-D at 0.36x of TCP before).
        assert!(is_short(16_500, 2));
        assert!(is_short(900 * 1024, 7));
        // Four round trips of a few bytes each: worth the rings.
        assert!(!is_short(100, 8));
        // One large answer: worth the rings.
        assert!(!is_short(2 << 20, 2));
    }
}
