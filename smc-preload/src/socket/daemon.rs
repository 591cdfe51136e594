//! The loopback-ism device of this process: its connection to the daemon (`smc-ism`), which
//! registers, attaches and releases DMBs (what `smc_ism.c` does with an ISM device in Linux),
//! the releases of short connections' DMBs that wait for the next request, the adoption of a
//! connection that moved in from another process, and when a handshake asks the daemon ahead
//! of need or for both ends' DMBs at once (pipelining, pairing).

use crate::conn::{Conn, Release};
use crate::debug;
use crate::forklock::{ForkMutex, ForkOnce};
use crate::util::config::config;
use smc_common::diag::Diag;
use std::os::fd::AsRawFd as _;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

/// Daemon requests sent ahead of need (`SMC_PIPELINE=0` disables, for measurements).
pub(crate) fn pipelining() -> bool {
    config().pipeline
}

/// `SMC_PAIR` (on unless `0`), without asking the daemon.
pub(crate) fn pairing_env() -> bool {
    config().pair
}

/// Daemon `PAIR` requests (both ends' DMBs in one request each) when the daemon offers them
/// (`SMC_PAIR=0` disables, for measurements).
pub(crate) fn pairing() -> bool {
    pairing_env() && with_dev(|c| c.features()).is_ok_and(|f| f & smc_ism::proto::FEATURE_PAIR != 0)
}

/// Until when (ms since [`epoch_ms`]'s epoch) this process's servers do not pair: one waited
/// in vain for its client's `PAIR` ([`server_unpaired`]).
static SERVER_UNPAIRED_UNTIL: AtomicU64 = AtomicU64::new(0);

/// Whether a server end pairs: [`pairing`], unless a server of this process waited in vain for
/// its client's `PAIR` within the last second (clients that do not pair, or a daemon out of
/// descriptors that dropped their requests): each such wait holds an event loop up to
/// `SERVER_PAIR_WAIT`, so the next servers register alone meanwhile (the daemon still serves a
/// client's `PAIR` waiting for them then).
pub(crate) fn server_pairing() -> bool {
    epoch_ms() >= SERVER_UNPAIRED_UNTIL.load(Ordering::Relaxed) && pairing()
}

/// A server waited in vain for its client's `PAIR`: see [`server_pairing`].
pub(crate) fn server_unpaired() {
    SERVER_UNPAIRED_UNTIL.store(epoch_ms() + 1000, Ordering::Relaxed);
}

/// The loopback-ism device of this process: one daemon connection shared by every thread
/// ([`smc_ism::SharedClient`]: no lock is held while a thread waits for the daemon, so
/// concurrent handshakes overlap their round trips), its GID once known, and the back-off
/// after the daemon was unreachable. One per process: a forked child makes its own
/// ([`after_fork_child`]) and never touches its parent's, whose state a thread that does not
/// exist in the child may have been using.
struct Dev {
    client: smc_ism::SharedClient,
    /// The process it belongs to.
    pid: u32,
    gid: ForkOnce<smc_ism::Gid>,
    /// Milliseconds since [`epoch_ms`]'s epoch before which a dead daemon is not retried (0: none).
    retry_after: AtomicU64,
    /// Requests in a row that timed out ([`back_off_ms`]); 0 after any answer.
    timeouts: AtomicU32,
    /// The back-off is for a daemon that is gone (refused, disconnected), not one that
    /// answered late ([`with_dev_for_tcp`]).
    gone: AtomicBool,
    /// The last request of [`with_dev_for_tcp`] timed out (cleared by its next answer).
    for_tcp_timed_out: AtomicBool,
}

/// How long new handshakes decline `NOSMCDDEV` without asking the daemon after a request
/// failed as *unavailable*: a second for a daemon that is gone (refused, disconnected, shutting
/// down: reconnecting costs every handshake a failed attempt), and for one that did not answer
/// in time (`timeout`, the `in_row`-th such failure in a row, from 1) 16 ms doubling with each
/// timeout in a row up to ~1 s. Before, one timeout — a `PAIR` answered 50 ms late under load,
/// a pairing whose peer never came — made every handshake of the process decline for a whole
/// second: 520 to 3 266 of 20 000 connections `NOSMCDDEV` in the scale bench under load
/// (docs/PERF.md, tenth session), at ~2 500 handshakes a second.
fn back_off_ms(timeout: bool, in_row: u32) -> u64 {
    if timeout {
        16u64 << (in_row.clamp(1, 7) - 1)
    } else {
        1000
    }
}

static DEV: AtomicPtr<Dev> = AtomicPtr::new(std::ptr::null_mut());

fn epoch_ms() -> u64 {
    static EPOCH: ForkOnce<Instant> = ForkOnce::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

fn new_dev(pid: u32) -> *mut Dev {
    let client = smc_ism::SharedClient::new(crate::util::config::daemon_path());
    client.set_state_slots(crate::util::config::config().state_slots);
    Box::into_raw(Box::new(Dev {
        client,
        pid,
        gid: ForkOnce::new(),
        retry_after: AtomicU64::new(0),
        timeouts: AtomicU32::new(0),
        gone: AtomicBool::new(false),
        for_tcp_timed_out: AtomicBool::new(false),
    }))
}

/// This process's device (made on first use; a new one in a forked child).
fn dev() -> &'static Dev {
    let pid = crate::pid();
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published below and never freed (a replaced one is leaked).
    if let Some(d) = unsafe { p.as_ref() } {
        if d.pid == pid {
            return d;
        }
    }
    let fresh = new_dev(pid);
    match DEV.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        Ok(old) => {
            // SAFETY: published, never freed; a parent's instance in a forked child.
            if let Some(o) = unsafe { old.as_ref() } {
                o.client.forget_after_fork();
            }
            // SAFETY: just published, never freed.
            unsafe { &*fresh }
        }
        Err(other) => {
            // SAFETY: ours, never published.
            drop(unsafe { Box::from_raw(fresh) });
            // SAFETY: published by the winner, never freed.
            unsafe { &*other }
        }
    }
}

/// Whether `fd` is this process's connection to the daemon: an application's `close` or
/// `close_range` must not close it (a forked child that closes every inherited descriptor
/// would take it away from under a request, or, after the number was reused by a socket of
/// its own, have us read and close that socket).
pub(crate) fn is_daemon_fd(fd: i32) -> bool {
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published and never freed (a replaced one is leaked).
    match unsafe { p.as_ref() } {
        Some(d) => fd >= 0 && d.pid == crate::pid() && d.client.raw_fd() == fd,
        None => false,
    }
}

/// This process's daemon connection when it lies in `first..=last`.
pub(crate) fn daemon_fd_in(first: libc::c_uint, last: libc::c_uint) -> Option<i32> {
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published and never freed (a replaced one is leaked).
    let d = unsafe { p.as_ref() }?;
    let fd = d.client.raw_fd();
    (fd >= 0 && d.pid == crate::pid() && (first..=last).contains(&(fd as libc::c_uint)))
        .then_some(fd)
}

/// After the application found no descriptor left (`EMFILE`): the memfds this process holds
/// for other handshakes' daemon replies not taken yet are closed (those handshakes decline
/// with `MEM`); true when there were any, so that the call may be tried again. Nothing when
/// this process has no daemon connection.
pub(crate) fn give_back_descriptors() -> bool {
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published by `dev`, never freed.
    let Some(d) = (unsafe { p.as_ref() }) else {
        return false;
    };
    d.pid == crate::pid() && d.client.give_back_filed() > 0
}

/// Whether this process is not the one `d` belongs to although it found `d` as its own: a
/// process that did not come from our `fork` (a raw `clone` or `syscall(SYS_fork)`, after
/// which no fork handler ran and the cached pid is its parent's), or a `vfork` child. Its
/// requests would interleave with its parent's on the one daemon socket, each reading the
/// other's replies (red team round 15, finding 10: 98 and 99 of 100 connections of parent and
/// raw-forked child failed). Such a process asks the daemon nothing: its handshakes decline
/// `NOSMCDDEV` and stay TCP. One `getpid` per request.
fn not_ours(d: &Dev) -> bool {
    // SAFETY: plain syscall.
    (unsafe { libc::getpid() }) as u32 != d.pid
}

/// Whether this process may start SMC handshakes at all: not one that found its parent's
/// daemon connection ([`not_ours`]). Asked before a client announces SMC: one that announced
/// and then declined for want of a daemon (`NOSMCDDEV`) left its server's pairing ahead of
/// it waiting in the daemon.
pub(crate) fn usable() -> bool {
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published and never freed (a replaced one is leaked).
    match unsafe { p.as_ref() } {
        Some(d) => !not_ours(d),
        None => true,
    }
}

pub(crate) fn with_dev<T>(
    f: impl FnOnce(&smc_ism::SharedClient) -> Result<T, smc_ism::IsmError>,
) -> Result<T, u32> {
    let d = dev();
    if not_ours(d) {
        return Err(Diag::NoSmcdDev.code());
    }
    let retry = d.retry_after.load(Ordering::Relaxed);
    if retry != 0 && epoch_ms() < retry {
        return Err(Diag::NoSmcdDev.code());
    }
    let r = f(&d.client);
    if r.is_ok() && d.timeouts.load(Ordering::Relaxed) != 0 {
        d.timeouts.store(0, Ordering::Relaxed);
    }
    r.map_err(|e| failed(d, &e))
}

/// A request of [`with_dev`] failed: its decline code; a daemon unavailable is backed off.
fn failed(d: &Dev, e: &smc_ism::IsmError) -> u32 {
    debug!("loopback-ism: {e}");
    if e.is_unavailable() {
        let timeout = matches!(e, smc_ism::IsmError::Timeout);
        let in_row = if timeout {
            d.timeouts.fetch_add(1, Ordering::Relaxed).saturating_add(1)
        } else {
            0
        };
        d.gone.store(!timeout, Ordering::Relaxed);
        d.retry_after
            .store(epoch_ms() + back_off_ms(timeout, in_row), Ordering::Relaxed);
    }
    e.decline_reason().diagnosis()
}

/// As [`with_dev`], for a request that keeps a connection TCP-exact rather than starting a
/// handshake (a fallback's socket out of the SOCKHASH): the back-off after a request answered
/// late does not refuse it (that daemon is there; the back-off spares new handshakes its
/// round trips), unless this kind of request timed out itself, so that a hung daemon costs
/// at most one wait per back-off. Before, a `PAIR` that missed a 1 ms CLC timer made the
/// fallbacks of the next 16 ms stay SOCKHASH members (`tcp_bpf`): `FIONREAD` 0 of 3 queued
/// bytes, a blocking `recv(MSG_OOB)` with nothing urgent waiting forever (conformance
/// `oob_two_before_read`, `oob_recv_none_twice_peek`). An answer leaves the back-off of new
/// handshakes as it is.
pub(crate) fn with_dev_for_tcp<T>(
    f: impl FnOnce(&smc_ism::SharedClient) -> Result<T, smc_ism::IsmError>,
) -> Result<T, u32> {
    let d = dev();
    if not_ours(d) {
        return Err(Diag::NoSmcdDev.code());
    }
    let retry = d.retry_after.load(Ordering::Relaxed);
    if retry != 0
        && epoch_ms() < retry
        && (d.gone.load(Ordering::Relaxed) || d.for_tcp_timed_out.load(Ordering::Relaxed))
    {
        return Err(Diag::NoSmcdDev.code());
    }
    let r = f(&d.client);
    d.for_tcp_timed_out.store(
        matches!(r, Err(smc_ism::IsmError::Timeout)),
        Ordering::Relaxed,
    );
    r.map_err(|e| failed(d, &e))
}

pub(crate) fn local_gid() -> Result<smc_ism::Gid, u32> {
    let d = dev();
    if let Some(g) = d.gid.get() {
        return Ok(*g);
    }
    let g = with_dev(|c| c.query_gid())?;
    let _ = d.gid.set(g);
    Ok(g)
}

/// In the parent after `fork`: the child maps the pages of our local state slots so far (it
/// shares the connections whose slots are there), so our later connection ends must not get a
/// slot of those pages, nor a pooled DMB whose state is such a slot (a child that dropped its
/// privileges would hold their locks and cursors, `tests/redteam/rt6.c slotfork`): our next
/// `PAIR` tells the daemon, whose later slots for us come from new pages
/// (`smc_ism::SharedClient::forked`; a daemon without that feature gives a 4 KiB state page
/// per end from now on, as every fork did before). A process that had no daemon connection
/// at the fork mapped no such page.
pub fn after_fork_parent() {
    let p = DEV.load(Ordering::Acquire);
    // SAFETY: published and never freed (a replaced one is leaked).
    if let Some(d) = unsafe { p.as_ref() } {
        if d.pid == crate::pid() {
            d.client.forked();
        }
    }
}

/// In the child after fork: the parent's pending releases are its own (references of its
/// daemon connection). Allocates nothing (a list never used is not created).
pub fn forget_parents_releases() {
    if let Some(mut v) = PENDING_RELEASES.lock_if_used() {
        v.clear();
    }
    PENDING_N.store(0, Ordering::Relaxed);
}

/// In the child after fork: its own daemon connection (the parent's references stay the
/// parent's); the global locks are reset by [`crate::forklock::after_fork_all`]. Its ends take
/// state slots from the pages of its own daemon connection, which its parent never maps.
pub fn after_fork_child() {
    forget_parents_releases();
    if !DEV.load(Ordering::Acquire).is_null() {
        // Closes our copy of the parent's connection now.
        let _ = dev();
    }
}

/// What an SMC connection gives back to the daemon at its last close: the tokens of our DMB
/// and the peer's (`peer` 0: none), their daemon ids (0: not known), under which a short
/// connection's mappings are kept ([`crate::dmbs`]).
pub(crate) struct DmbRelease {
    pub(crate) own: u64,
    pub(crate) peer: u64,
    pub(crate) own_id: u64,
    pub(crate) peer_id: u64,
    /// The connection's local state page is the one registered with our DMB (kept with it,
    /// and used again with it: the daemon hands that page to a process the socket moves to).
    pub(crate) own_state: bool,
}

impl Release for DmbRelease {
    fn release(&self, c: &Conn) {
        use smc_ism::proto::{RELEASE_POOL_OWN, RELEASE_TAINT_PEER};
        // peer 0: a stand-in for a client that had already gone.
        let peer = Some(self.peer).filter(|&t| t != 0);
        let mut flags = 0;
        if !c.closed_everywhere() || !c.unheld() {
            // Another process (a forked child) still has the connection, or a thread of it
            // is still inside a call, and may write into the peer's ring: never to be bound
            // again.
            flags |= RELEASE_TAINT_PEER;
        } else {
            // Nobody uses the rings any more: a short connection's DMBs are kept for the next
            // connection to the same peer (pooled by the daemon, mapped here).
            let (rx, tx) = c.rings_touched();
            if rx <= crate::dmbs::SMALL && self.own_id != 0 {
                flags |= RELEASE_POOL_OWN;
                let state = self.own_state.then(|| c.state_map().clone());
                crate::dmbs::keep(true, self.own_id, c.own_map().clone(), state);
            }
            if tx <= crate::dmbs::SMALL && self.peer_id != 0 && peer.is_some() {
                crate::dmbs::keep(false, self.peer_id, c.peer_map().clone(), None);
            }
        }
        if flags & RELEASE_POOL_OWN != 0 {
            // A short connection's: sent with the next daemon request (see `defer_release`).
            defer_release(self.own, peer.unwrap_or(0), flags);
        } else {
            flush_releases();
            let _ = with_dev(|d| d.release_flags(Some(self.own), peer, flags));
        }
    }
}

/// Releases of short connections not sent yet (own, peer, flags).
static PENDING_RELEASES: ForkMutex<Vec<(u64, u64, u32)>> = ForkMutex::new(Vec::new);
static PENDING_N: AtomicU64 = AtomicU64::new(0);
/// Pending releases at most (as many as one `PAIR` carries): beyond, they are sent at once.
const PENDING_MAX: usize = smc_ism::proto::PAIR_RELEASES_MAX;

/// The release of a short connection's DMBs waits for the next `PAIR` of this process, which
/// carries it (one record, one wakeup of the daemon: most of a request's cost on a busy host),
/// or until the process waits in poll/select/epoll, or until [`PENDING_MAX`] are pending. Meanwhile the DMBs stay bound to their finished
/// connections, used by nobody (the connection closed in every process); the daemon pools
/// them when the release comes (and releases everything when the process goes).
fn defer_release(own: u64, peer: u64, flags: u32) {
    let full = {
        let mut v = PENDING_RELEASES.lock();
        v.push((own, peer, flags));
        PENDING_N.store(v.len() as u64, Ordering::Relaxed);
        v.len() >= PENDING_MAX
    };
    if full {
        flush_releases();
    }
}

/// The pending releases, taken (to go with a `PAIR`; at most `PAIR_RELEASES_MAX` are pending).
pub(crate) fn take_releases() -> Vec<smc_ism::proto::PairRelease> {
    if PENDING_N.load(Ordering::Relaxed) == 0 {
        return Vec::new();
    }
    let mut v = PENDING_RELEASES.lock();
    PENDING_N.store(0, Ordering::Relaxed);
    std::mem::take(&mut *v)
}

/// Releases taken with [`take_releases`] for a `PAIR` that was not sent: pending again.
pub(crate) fn untake_releases(rel: Vec<smc_ism::proto::PairRelease>) {
    if rel.is_empty() {
        return;
    }
    let mut v = PENDING_RELEASES.lock();
    v.extend(rel);
    PENDING_N.store(v.len() as u64, Ordering::Relaxed);
}

/// Send the pending releases (one record each, no reply).
pub fn flush_releases() {
    if PENDING_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    release_each(&take_releases());
}

/// Send these releases, one record each (no reply).
pub(crate) fn release_each(rel: &[smc_ism::proto::PairRelease]) {
    for &(own, peer, flags) in rel {
        let peer = Some(peer).filter(|&t| t != 0);
        let _ = with_dev(|d| d.release_flags(Some(own), peer, flags));
    }
}

/// The references of an adopted connection ([`adopt`]): two attach references.
struct AdoptedRelease {
    own: u64,
    peer: u64,
}

impl AdoptedRelease {
    fn give_back(&self) {
        release_dmbs(None, Some(self.own));
        // 0: a stand-in, no DMB of the daemon.
        if self.peer != 0 {
            release_dmbs(None, Some(self.peer));
        }
    }
}

impl Release for AdoptedRelease {
    fn release(&self, c: &Conn) {
        if c.closed_everywhere() && c.unheld() {
            self.give_back();
            return;
        }
        // Another process may still have the connection (handed on again): the daemon keeps
        // the references while our socket is held there, until it adopts them.
        use smc_ism::proto::RELEASE_TAINT_PEER;
        flush_releases();
        for t in [self.own, self.peer].into_iter().filter(|&t| t != 0) {
            let _ = with_dev(|d| d.release_flags(None, Some(t), RELEASE_TAINT_PEER));
        }
    }
}

/// The SMC connection of socket `fd`, which moved to this process from another one (passed
/// with `SCM_RIGHTS`, inherited across `exec` or `posix_spawn`): the daemon hands over its
/// DMBs and its local state page only to a process of the registering process's uid, cgroup
/// and pid namespace that holds this very socket (`OP_ADOPT`); from then on it is shared as
/// with a forked child. The reference that travelled with the socket is taken, or one is
/// added. `None` (the caller fails it cleanly) when the daemon refuses or is not there, or
/// anything does not fit.
pub(crate) fn adopt(fd: i32) -> Option<Conn> {
    use smc_ism::proto::{ADOPT_OWN, ADOPT_PEER, ADOPT_STATE};
    let own = match with_dev(|c| c.adopt_dmb(fd, ADOPT_OWN)) {
        Ok(o) => o,
        Err(e) => {
            debug!("fd {fd}: the daemon hands over no own DMB: {e}");
            return None;
        }
    };
    let peer = match with_dev(|c| c.adopt_dmb(fd, ADOPT_PEER)) {
        Ok(p) => Some(p),
        Err(e) => {
            debug!("fd {fd}: the daemon hands over no peer DMB: {e}");
            None
        }
    };
    let rel = AdoptedRelease {
        own: own.token,
        peer: peer.as_ref().map_or(0, |p| p.token),
    };
    let (ot, pt) = (own.token, rel.peer);
    // From here on `rel` gives both references back if anything fails (on drop of the Conn
    // or right here).
    let conn = (|| {
        let o = own.map().ok()?;
        let p = match &peer {
            Some(p) => p.map().ok()?,
            // No peer DMB: its end closed before ours could attach it (a server whose client
            // wrote, closed and gave its DMB back before the attach: no pairing; it was
            // established over a stand-in, `handshake::attach_client`). What it wrote is in
            // our ring, and nothing can be written to it any more: a stand-in again.
            None if crate::conn::peer_closed_in(&o) => {
                debug!("fd {fd}: its peer closed before it attached the peer's DMB: a stand-in");
                crate::shm::Mapping::anon_shared(o.len()).ok()?
            }
            None => return None,
        };
        let st = with_dev(|c| c.adopt_dmb(fd, ADOPT_STATE)).ok()?;
        // The page's size is checked (sealed by its creator, checked by the daemon): a shorter
        // file would fault on access.
        let len = file_size(st.fd.as_raw_fd())?;
        if len < 4096 {
            return None;
        }
        let state = st.map_state().ok()?;
        Some((o, p, state))
    })();
    let Some((o, p, state)) = conn else {
        rel.give_back();
        return None;
    };
    let mut c = match Conn::adopt(o, p, state, Some(Box::new(rel))) {
        Ok(c) => c,
        Err(_) => return None,
    };
    c.own_token = ot;
    c.peer_token = pt;
    if !c.take_in_flight() {
        c.add_ref(1);
    }
    debug!("fd {fd}: adopted the SMC-D connection ({:?})", c.role);
    Some(c)
}

fn file_size(fd: i32) -> Option<u64> {
    // SAFETY: `libc::stat` is plain integers; valid out buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_size as u64)
}

/// Give back our owner reference of `own` and our attach reference of `peer` (one record, no
/// reply awaited, when the daemon offers it).
pub(crate) fn release_dmbs(own: Option<u64>, peer: Option<u64>) {
    let _ = with_dev(|c| c.release_nowait(own, peer));
}

#[cfg(test)]
mod tests {
    use super::back_off_ms;

    #[test]
    fn a_timeout_backs_off_briefly_and_doubles_in_a_row_a_gone_daemon_a_second() {
        assert_eq!(back_off_ms(true, 1), 16);
        assert_eq!(back_off_ms(true, 2), 32);
        assert_eq!(back_off_ms(true, 7), 1024);
        assert_eq!(back_off_ms(true, u32::MAX), 1024);
        assert_eq!(back_off_ms(true, 0), 16);
        assert_eq!(back_off_ms(false, 0), 1000);
        assert_eq!(back_off_ms(false, 9), 1000);
    }
}
