//! References kept for a socket handed on (issue 10, red team round 27).
//!
//! A DMB lives while some client connection holds a reference to it, and references do not
//! travel between client connections: a process that takes a socket over (`SCM_RIGHTS`, an
//! `exec`'d image, a `pass_fds` child) takes its own with `OP_ADOPT`, and a forked child takes
//! none (it maps what its parent mapped). So when every holder of a reference lets go of it
//! (closes its number after handing the socket on, execs, exits after forking) before the
//! process that has the socket now adopted it, the DMBs would be freed under a connection
//! that is still in use: the adopter fails, a forked child loses the connection's identity.
//!
//! Instead, a reference given up by a client that may have handed its socket on (a release
//! with `RELEASE_TAINT_PEER`, or any reference of a client connection that closed) is kept
//! here while the client's end of the connection is still held by a process: its socket,
//! looked up by `sock_diag` (same cookie), is a full socket of a connection that still has an
//! inode (after the last close of a socket it has none). The sweep asks again, at growing
//! intervals, and releases the reference once nobody holds the socket. The lookup is made in
//! the network namespace of the sockets the releasing client passed: the daemon's own, or a
//! container's through the sock_diag socket that client connection keeps there
//! ([`diag::NsHandle`], taken with its first socket of that namespace; a kept reference holds
//! it, and with it the namespace, until it is released). A client whose sockets came from
//! several namespaces has its ends looked up in each of them (at most [`CLIENT_NS_MAX`]; the
//! cookie makes the match exact).
//!
//! Bounds: `DaemonConfig::max_kept` references at most, and `uid_max_kept` of them let go of
//! by clients of one uid (root: only the former); beyond, a reference is released at once, as
//! without the keeping, and counted (`failures.kept_full`). So one uid that hands on sockets
//! by the ten thousand (adopting each many times over) fills its own share, not the daemon's:
//! another uid's hand-ons are still kept. The sweep's lookups are bounded too
//! ([`LOOKS_PER_TURN`] every [`TURN_EVERY`] at most: ~10 000 `sock_diag` exchanges a second
//! however many references are kept). Each kept DMB stays charged, as before, to its
//! owner's cgroup and uid, so holding sockets keeps memory only within the quotas of whoever
//! holds them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::diag;
use super::registry::RefKind;
use crate::sys::TcpIdentity;

/// The first look again after a reference was kept, and the longest interval between looks.
const FIRST_LOOK: Duration = Duration::from_millis(100);
const LONGEST_LOOK: Duration = Duration::from_secs(2);
/// Lookups (one `sock_diag` exchange each) in one turn of the sweep at most: however many
/// references are kept (a uid's share is 65 536), the daemon spends ~10 ms a turn on them; the
/// rest are looked at in the next turns (a socket let go of is then found a little later).
const LOOKS_PER_TURN: usize = 1024;
/// Turns that look sockets up come this often at most (the sweep runs every 10 ms while it
/// shelves files): at most ~10 000 lookups a second.
const TURN_EVERY: Duration = Duration::from_millis(100);

/// The network namespaces of the sockets a client connection passed (registrations, attaches,
/// adoptions): where the ends of its references are looked up, each with its handle when it
/// is not the daemon's. Empty: no socket with a namespace cookie passed yet (the ends' own
/// records say where they are).
#[derive(Default)]
pub(crate) struct ClientNs(Vec<(u64, Option<Arc<diag::NsHandle>>)>);

/// Namespaces recorded per client connection at most (a process with sockets in more is rare:
/// a reference whose end is in none of them is released at once, as without the keeping).
const CLIENT_NS_MAX: usize = 8;

impl ClientNs {
    /// Records a socket passed from namespace `cookie`; `handle` makes the handle of that
    /// namespace when it is not `own` (called once per namespace and client connection).
    pub(crate) fn note(
        &mut self,
        cookie: Option<u64>,
        own: Option<u64>,
        handle: impl FnOnce(u64) -> Option<Arc<diag::NsHandle>>,
    ) {
        let Some(cookie) = cookie else { return };
        if self.0.len() >= CLIENT_NS_MAX || self.0.iter().any(|(c, _)| *c == cookie) {
            return;
        }
        let h = if Some(cookie) == own {
            None
        } else {
            handle(cookie)
        };
        self.0.push((cookie, h));
    }

    /// The namespaces to look an end up in: each recorded one, or (none recorded) the end's
    /// own record's.
    pub(crate) fn candidates(&self) -> Vec<(Option<u64>, Option<Arc<diag::NsHandle>>)> {
        if self.0.is_empty() {
            return vec![(None, None)];
        }
        self.0.iter().map(|(c, h)| (Some(*c), h.clone())).collect()
    }
}

/// What [`HandedOn::keep`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Kept: the caller does not release the reference.
    Kept,
    /// Nobody holds the end (or it cannot be looked up): release it.
    NotHeld,
    /// A bound is full: release it (counted).
    Full,
}

struct Kept {
    token: u64,
    kind: RefKind,
    /// The uid of the client that let go of it (its share of the bound).
    uid: u32,
    /// The end of the connection the releasing client had.
    end: TcpIdentity,
    /// The lookup's way into `end`'s namespace when it is not the daemon's.
    ns: Option<Arc<diag::NsHandle>>,
    next: Instant,
    wait: Duration,
}

#[derive(Default)]
struct KeptSet {
    /// The references not being looked up now.
    refs: Vec<Kept>,
    /// All kept references (also those [`HandedOn::due`] is looking up).
    total: usize,
    /// Kept references by the uid that let go of them (uids with none are removed).
    per_uid: HashMap<u32, usize>,
    /// When [`HandedOn::due`] last looked sockets up.
    last_turn: Option<Instant>,
}

impl KeptSet {
    fn push(&mut self, k: Kept) {
        *self.per_uid.entry(k.uid).or_default() += 1;
        self.total += 1;
        self.refs.push(k);
    }

    fn forget(&mut self, uid: u32) {
        self.total = self.total.saturating_sub(1);
        if let Some(n) = self.per_uid.get_mut(&uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_uid.remove(&uid);
            }
        }
    }
}

/// The references kept for sockets handed on.
pub(crate) struct HandedOn {
    own_netns: Option<u64>,
    max: usize,
    uid_max: usize,
    kept: Mutex<KeptSet>,
}

impl HandedOn {
    /// At most `max` references kept, `uid_max` of them let go of by one uid other than root.
    pub(crate) fn new(max: usize, uid_max: usize) -> HandedOn {
        HandedOn {
            own_netns: smc_common::bpf::own_netns_cookie().ok(),
            max,
            uid_max,
            kept: Mutex::new(KeptSet::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KeptSet> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a reference let go of by `uid` finds room.
    fn room(&self, set: &KeptSet, uid: u32) -> bool {
        set.total < self.max
            && (uid == 0 || set.per_uid.get(&uid).copied().unwrap_or(0) < self.uid_max)
    }

    /// Keeps reference `kind` of `token` (the caller does not release it) when `end`, the
    /// releasing client's end of the connection, is still held by a process (looked up through
    /// `ns` when it is in another namespace) and the bounds leave room for `uid`, the releasing
    /// client's.
    pub(crate) fn keep(
        &self,
        token: u64,
        kind: RefKind,
        uid: u32,
        end: TcpIdentity,
        ns: Option<Arc<diag::NsHandle>>,
    ) -> Keep {
        // A full share costs no lookup (a uid at its bound may release by the thousand).
        if !self.room(&self.lock(), uid) {
            return Keep::Full;
        }
        if diag::socket_held(&end, self.own_netns, ns.as_deref()) != Some(true) {
            return Keep::NotHeld;
        }
        let mut v = self.lock();
        if !self.room(&v, uid) {
            return Keep::Full;
        }
        v.push(Kept {
            token,
            kind,
            uid,
            end,
            ns,
            next: Instant::now() + FIRST_LOOK,
            wait: FIRST_LOOK,
        });
        Keep::Kept
    }

    /// How many references are kept.
    pub(crate) fn len(&self) -> usize {
        self.lock().total
    }

    /// The kept references whose socket nobody holds any more (or that can no longer be
    /// looked up): to be released by the caller. The lookups run without the lock.
    pub(crate) fn due(&self) -> Vec<(u64, RefKind)> {
        let now = Instant::now();
        let looks: Vec<Kept> = {
            let mut v = self.lock();
            if v.last_turn
                .is_some_and(|t| now.duration_since(t) < TURN_EVERY)
                || v.refs.iter().all(|k| k.next > now)
            {
                return Vec::new();
            }
            v.last_turn = Some(now);
            let mut due = Vec::new();
            let mut wait = Vec::with_capacity(v.refs.len());
            for k in std::mem::take(&mut v.refs) {
                if k.next <= now && due.len() < LOOKS_PER_TURN {
                    due.push(k);
                } else {
                    wait.push(k);
                }
            }
            v.refs = wait;
            due
        };
        let mut gone = Vec::new();
        let mut still = Vec::new();
        for mut k in looks {
            if diag::socket_held(&k.end, self.own_netns, k.ns.as_deref()) == Some(true) {
                k.wait = (k.wait * 2).min(LONGEST_LOOK);
                k.next = now + k.wait;
                still.push(k);
            } else {
                gone.push(k);
            }
        }
        let mut v = self.lock();
        for k in &gone {
            v.forget(k.uid);
        }
        v.refs.extend(still);
        gone.into_iter().map(|k| (k.token, k.kind)).collect()
    }
}
