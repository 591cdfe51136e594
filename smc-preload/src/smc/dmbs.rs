//! Mappings of DMBs kept across connections.
//!
//! A short connection's DMBs go back to the daemon's pool of the owner's daemon connection
//! (`RELEASE_POOL_OWN`) instead of being freed, and the daemon binds one again for a new
//! connection between the same two processes (see `smc_ism::proto`, `OP_PAIR`). Each end then
//! finds the memory already mapped here, by the DMB's id (never reused by any daemon): no
//! `mmap`, no `munmap`, no page faults for the pages the rings use, no memfd to create or free.
//! What is kept is bounded ([`KEEP_MAX`] per side) and only for connections whose rings stayed
//! within [`SMALL`] bytes (so only a few pages each), and entries unused for [`KEEP_IDLE`] are
//! dropped at the next use of the cache (the daemon frees pooled DMBs after a second too).
//!
//! Our own DMB's entry keeps the connection's local state page with it when that page is the one
//! the daemon keeps with the DMB (see `smc_ism::proto`, `PAIR_OWN_STATE`): the next connection
//! on that DMB uses it again (cleared), so that a process its socket moves to (`OP_ADOPT`) still
//! gets the page the connection uses.
//!
//! Only a connection that closed in every process is kept ([`crate::conn::Conn::closed_everywhere`]):
//! while another process (a forked child) may still use its rings, our DMB is not pooled and
//! the peer's is reported as possibly still written (`RELEASE_TAINT_PEER`), so the daemon never
//! binds either again. A forked child starts with an empty cache (its daemon connection, and so
//! its pool, is its own).

use crate::forklock::ForkMutex;
use crate::shm::Mapping;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Kept mappings per side (own DMBs, peers' DMBs) at most; as many as the daemon pools.
pub const KEEP_MAX: usize = 64;
/// A ring written no further than this is kept (its pages stay and are used again).
pub const SMALL: u64 = 64 * 1024;
/// Kept mappings unused this long are dropped.
const KEEP_IDLE: Duration = Duration::from_secs(2);

/// DMB id, its mapping, the local state page kept with our own DMB, last use.
type Entry = (u64, Arc<Mapping>, Option<Arc<Mapping>>, Instant);

struct Kept {
    pid: u32,
    own: VecDeque<Entry>,
    peer: VecDeque<Entry>,
}

static KEPT: ForkMutex<Kept> = ForkMutex::new(|| Kept {
    pid: 0,
    own: VecDeque::new(),
    peer: VecDeque::new(),
});

/// Entries of another process (a forked child's inherited ones) and unused ones go; returned
/// to be dropped (unmapped) outside the lock.
fn prune(k: &mut Kept, now: Instant) -> Vec<Entry> {
    let pid = crate::pid();
    let mut gone = Vec::new();
    if k.pid != pid {
        k.pid = pid;
        // A forked child's copy of the parent's entries (a fork we did not see: ours empties
        // the child's cache, see [`before_fork`]): their ranges may be mapped here or not;
        // unmapping them could take whatever this process mapped there since (a DMB, its
        // statistics page). Forgotten, never dropped.
        for e in k.own.drain(..).chain(k.peer.drain(..)) {
            std::mem::forget(e);
        }
    }
    for q in [&mut k.own, &mut k.peer] {
        while q
            .front()
            .is_some_and(|e| now.duration_since(e.3) >= KEEP_IDLE)
        {
            if let Some(e) = q.pop_front() {
                gone.push(e);
            }
        }
    }
    gone
}

/// The kept mapping of DMB `id` (our own with `own`, else a peer's) of `len` bytes, taken out
/// of the cache, with the local state page kept with it (the caller clears both, see
/// [`clear_header`] and [`clear_state`]).
pub fn take(own: bool, id: u64, len: usize) -> Option<(Arc<Mapping>, Option<Arc<Mapping>>)> {
    if id == 0 {
        return None;
    }
    let now = Instant::now();
    let (found, gone) = {
        let mut k = KEPT.lock();
        let gone = prune(&mut k, now);
        let q = if own { &mut k.own } else { &mut k.peer };
        let found = q
            .iter()
            .position(|e| e.0 == id)
            .and_then(|i| q.remove(i))
            .map(|e| (e.1, e.2));
        (found, gone)
    };
    drop(gone);
    found.filter(|(m, _)| m.len() == len)
}

/// Keep the mapping of DMB `id` (with our own DMB: its local state page) for a later
/// connection.
pub fn keep(own: bool, id: u64, m: Arc<Mapping>, state: Option<Arc<Mapping>>) {
    if id == 0 {
        return;
    }
    // Kept for a later connection of this process only: a child forked meanwhile (one that
    // drops its privileges, say) must not map the rings and state of our next connections
    // (`tests/redteam/rt6.c keptfork`): see [`before_fork`].
    let now = Instant::now();
    let gone = {
        let mut k = KEPT.lock();
        let mut gone = prune(&mut k, now);
        let q = if own { &mut k.own } else { &mut k.peer };
        q.push_back((id, m, state, now));
        if q.len() > KEEP_MAX {
            if let Some(e) = q.pop_front() {
                gone.push(e);
            }
        }
        gone
    };
    drop(gone);
}

/// The cache held across a `fork` ([`before_fork`]); `None`: a cache never used (a `fork`
/// from a signal handler does not create it).
pub(crate) struct ForkHold {
    kept: Option<crate::forklock::ForkGuard<Kept>>,
}

/// Before this process forks (our `fork`, with the table frozen): the kept mappings are made
/// `MADV_DONTFORK` for the fork alone, so that the child (one that drops its privileges, say)
/// gets none of the memory of this process's later connections (`tests/redteam/rt6.c
/// keptfork`). A mapping that cannot be marked is dropped (unmapped) first; from a signal
/// handler it is kept instead (dropping frees memory, which a handler that interrupted
/// `malloc` must not: `madvise` fails only on a range that is not mapped, never on ours). The
/// cache stays locked until [`after_fork_parent`]; in the child it is a fresh, empty one
/// ([`crate::forklock::after_fork_all`]). Done at the fork rather than at each keep and take:
/// two `madvise` per mapping per fork instead of per connection (3 mappings each way, on every
/// short connection).
pub(crate) fn before_fork() -> ForkHold {
    let handler = crate::signals::in_handler();
    let mut kept = if handler {
        KEPT.lock_if_used()
    } else {
        Some(KEPT.lock())
    };
    if let Some(k) = kept.as_deref_mut() {
        for q in [&mut k.own, &mut k.peer] {
            if handler {
                for e in q.iter() {
                    let _ = e.1.set_inherited(false);
                    if let Some(st) = &e.2 {
                        let _ = st.set_inherited(false);
                    }
                }
                continue;
            }
            q.retain(|e| {
                e.1.set_inherited(false).is_ok()
                    && e.2.as_ref().is_none_or(|s| s.set_inherited(false).is_ok())
            });
        }
    }
    ForkHold { kept }
}

/// In the parent after the fork: the kept mappings are inherited again by default (a taken one
/// becomes a connection's, which its children hold).
pub(crate) fn after_fork_parent(h: ForkHold) {
    let Some(kept) = &h.kept else { return };
    for q in [&kept.own, &kept.peer] {
        for e in q {
            let _ = e.1.set_inherited(true);
            if let Some(st) = &e.2 {
                let _ = st.set_inherited(true);
            }
        }
    }
}

/// In the child: the hold is on the parent's lock, replaced here already; never released.
/// `light` (the child of a handler of a single-threaded process, which must not allocate): the
/// lock was left as it is ([`crate::forklock::after_fork_all`]), so it is released here, its
/// entries forgotten without a free (their mappings are not the child's: `MADV_DONTFORK`).
pub(crate) fn after_fork_child(h: ForkHold, light: bool) {
    let Some(mut kept) = h.kept else { return };
    if light {
        std::mem::forget(std::mem::take(&mut kept.own));
        std::mem::forget(std::mem::take(&mut kept.peer));
        drop(kept);
    } else {
        kept.leak();
    }
}

/// Zero the local state of our own DMB before our connection uses it (a pooled DMB's page, or
/// its slot of a shared page, kept with it by the daemon, holds its earlier connection's
/// state). Only the state's own bytes: a slot's page holds other connections' slots.
pub fn clear_state(st: &Mapping) {
    // SAFETY: a mapping of ours (a page, or the view of one slot: `st.len()` bytes from
    // `as_ptr`) that nobody uses: a new DMB's state, or a pooled one's,
    // whose earlier connection closed in every process (only then is the DMB pooled), and the
    // daemon bound the DMB to our new connection, so no other process was handed the page
    // since (an adopted DMB is never bound again).
    unsafe { std::ptr::write_bytes(st.as_ptr(), 0, st.len()) };
}

/// Zero a reused DMB's CDC header (cursors, flags, wakeup bits of its earlier connection)
/// before the peer learns that it is ours again.
pub fn clear_header(m: &Mapping) {
    let p = m.as_ptr() as *const std::sync::atomic::AtomicU64;
    for i in 0..smc_common::cdc::CDC_HEADER_LEN / 8 {
        // SAFETY: a DMB mapping is page aligned and at least 16 KiB; the header's 32 bytes
        // are accessed only atomically.
        unsafe { &*p.add(i) }.store(0, std::sync::atomic::Ordering::Release);
    }
}
