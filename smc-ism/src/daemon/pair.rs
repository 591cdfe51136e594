//! `OP_PAIR`: both ends of a TCP connection ask for their DMBs at once; the second request to
//! arrive completes both.
//!
//! The first request *parks* here (its socket kept open, so that its connection can be checked
//! again), keyed by its 4-tuple in its network namespace and by its socket cookie. The second
//! finds it by the mirrored 4-tuple (same namespace: then the parked socket still being
//! established proves that the two sockets are the two ends of one connection, as only one
//! connection can hold a 4-tuple in a namespace), or — for a connection between namespaces,
//! whose addresses may be translated — by the peer cookie the kernel's connection table gives
//! for its own socket (the proof `OP_REGISTER` records). It then takes one DMB for each end
//! (from the owner's pool when one may be reused for this peer, else registered),
//! attaches each to the other end, answers its own request and hands the parked end's answer to
//! that end's task ([`Deferred`]), which records the references and sends the reply. A parked
//! request that finds no partner within its wait is answered `NoPeer`.
//!
//! Pools: an owner gives a DMB back with `OP_RELEASE` and `RELEASE_POOL_OWN`: it stays
//! registered (owner reference held, quota charged), unbound; nobody may attach it. It is bound
//! to a new connection of its owner only when no attach is held and the one client connection
//! that ever attached it (if any) is the new connection's other end: then no process but the
//! two ends can map it, so its reuse shows nobody bytes it could not see anyway. A DMB
//! attached by two client connections, or released by one that may still write into it
//! (`RELEASE_TAINT_PEER`), is never bound again.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::mpsc;

use crate::sys::TcpIdentity;

use super::registry::{CgroupUsage, ClientIdentity, DmbObj, Fail, RefKind, Registry, UidUsage};

/// A client connection's pooled DMBs (token, when pooled), oldest first. The pool holds their
/// owner references.
pub(crate) type Pool = Arc<Mutex<VecDeque<(u64, std::time::Instant)>>>;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request waiting for the other end of its connection.
pub(crate) struct Parked {
    /// The client connection that asked.
    pub conn: u64,
    /// Its request's sequence number.
    pub seq: u32,
    pub size_code: u8,
    pub who: TcpIdentity,
    /// The socket it passed, kept until it is paired (see the module docs).
    pub sock: OwnedFd,
    pub pool: Pool,
    pub uid: Arc<UidUsage>,
    /// Its quota bucket when the socket's own cgroup cannot be found.
    pub cg: Arc<CgroupUsage>,
    /// Who its client is (recorded with its DMB: who may adopt it).
    pub ident: ClientIdentity,
    /// Its client's page of local state slots, when it asked for a slot.
    pub slots: Option<Arc<super::registry::StateSlots>>,
    /// Its task's queue of answers.
    pub tx: mpsc::UnboundedSender<Deferred>,
    /// Counts it against its uid's parked requests while it lives.
    pub _charge: ParkCharge,
}

/// Requests of one uid that wait for their peers at most (each keeps its socket open in the
/// daemon).
pub(crate) const MAX_PARKED_PER_UID: u64 = 4096;

/// One parked request of a uid ([`UidUsage::parked`]); released on drop.
pub(crate) struct ParkCharge(Arc<UidUsage>);

impl ParkCharge {
    /// Charges one parked request to `uid`, unless it has [`MAX_PARKED_PER_UID`].
    pub(crate) fn new(uid: &Arc<UidUsage>) -> Option<ParkCharge> {
        use std::sync::atomic::Ordering::AcqRel;
        if uid.parked.fetch_add(1, AcqRel) >= MAX_PARKED_PER_UID {
            uid.parked.fetch_sub(1, AcqRel);
            return None;
        }
        Some(ParkCharge(uid.clone()))
    }
}

impl Drop for ParkCharge {
    fn drop(&mut self) {
        self.0
            .parked
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

type TupleKey = (u64, SocketAddr, SocketAddr);

/// The parked requests, by id, 4-tuple and socket cookie.
#[derive(Default)]
pub(crate) struct Rendezvous {
    next: u64,
    entries: HashMap<u64, Parked>,
    by_tuple: HashMap<TupleKey, u64>,
    by_cookie: HashMap<u64, u64>,
    /// Requests refused instead of parked (the daemon out of descriptors, parking quotas), by
    /// 4-tuple, with when: the other end's request is answered at once instead of waiting for
    /// a peer that will not come (an event-loop server waits for its `PAIR`). The oldest
    /// [`REFUSED_MAX`], for [`proto::PAIR_PARK_MAX_MS`], each with its socket's cookie.
    refused: VecDeque<(TupleKey, Option<u64>, std::time::Instant)>,
}

/// Refused requests remembered at most (see [`Rendezvous::refuse`]).
const REFUSED_MAX: usize = 4096;

fn tuple_key(netns: Option<u64>, local: SocketAddr, peer: SocketAddr) -> TupleKey {
    (netns.unwrap_or(0), local, peer)
}

impl Rendezvous {
    /// Parks `p`; its id.
    pub(crate) fn insert(&mut self, p: Parked) -> u64 {
        self.next += 1;
        let id = self.next;
        self.by_tuple
            .insert(tuple_key(p.who.netns_cookie, p.who.local, p.who.peer), id);
        if let Some(c) = p.who.cookie {
            self.by_cookie.insert(c, id);
        }
        self.entries.insert(id, p);
        id
    }

    /// Removes and returns the parked request `id`, if it is still there.
    pub(crate) fn take(&mut self, id: u64) -> Option<Parked> {
        let p = self.entries.remove(&id)?;
        let k = tuple_key(p.who.netns_cookie, p.who.local, p.who.peer);
        if self.by_tuple.get(&k) == Some(&id) {
            self.by_tuple.remove(&k);
        }
        if let Some(c) = p.who.cookie {
            if self.by_cookie.get(&c) == Some(&id) {
                self.by_cookie.remove(&c);
            }
        }
        Some(p)
    }

    /// The parked request of the other end of `who`'s connection in `who`'s namespace.
    pub(crate) fn take_mirror(&mut self, who: &TcpIdentity) -> Option<Parked> {
        let id = *self
            .by_tuple
            .get(&tuple_key(who.netns_cookie, who.peer, who.local))?;
        self.take(id)
    }

    /// Remembers that the request of `who` was refused rather than parked.
    pub(crate) fn refuse(&mut self, who: &TcpIdentity) {
        let now = std::time::Instant::now();
        let ttl = std::time::Duration::from_millis(crate::proto::PAIR_PARK_MAX_MS as u64);
        while self
            .refused
            .front()
            .is_some_and(|&(_, _, at)| now.duration_since(at) > ttl)
            || self.refused.len() >= REFUSED_MAX
        {
            self.refused.pop_front();
        }
        let k = tuple_key(who.netns_cookie, who.local, who.peer);
        self.refused.push_back((k, who.cookie, now));
    }

    /// Whether a request from the other end of `who`'s 4-tuple was refused: the cookie of the
    /// socket it passed (`None` inside: not known). Whether that socket is the other end of
    /// `who`'s connection is the caller's to check: another uid may have refused requests of
    /// its own sockets made from the same 4-tuple before.
    pub(crate) fn refused_mirror(&self, who: &TcpIdentity) -> Option<Option<u64>> {
        let k = tuple_key(who.netns_cookie, who.peer, who.local);
        self.refused
            .iter()
            .find(|(r, _, _)| *r == k)
            .map(|&(_, cookie, _)| cookie)
    }

    /// Forgets the refusals from the other end of `who`'s 4-tuple.
    pub(crate) fn forget_refused_mirror(&mut self, who: &TcpIdentity) {
        let k = tuple_key(who.netns_cookie, who.peer, who.local);
        self.refused.retain(|(r, _, _)| *r != k);
    }

    /// The parked request whose socket has cookie `cookie`.
    pub(crate) fn take_cookie(&mut self, cookie: u64) -> Option<Parked> {
        let id = *self.by_cookie.get(&cookie)?;
        self.take(id)
    }
}

/// A reference granted to a parked request's client by another task: released when dropped
/// unless that client's task took it ([`Grant::take`]).
pub(crate) struct Grant {
    reg: Arc<Registry>,
    pub dmb: Arc<DmbObj>,
    kind: RefKind,
    /// A new reference (else one the client holds already: its pooled DMB).
    new_ref: bool,
    armed: bool,
}

impl Grant {
    pub(crate) fn new(reg: Arc<Registry>, dmb: Arc<DmbObj>, kind: RefKind, new_ref: bool) -> Self {
        Grant {
            reg,
            dmb,
            kind,
            new_ref,
            armed: true,
        }
    }

    /// The DMB, and whether the reference is new to the client.
    pub(crate) fn take(mut self) -> (Arc<DmbObj>, bool) {
        self.armed = false;
        (self.dmb.clone(), self.new_ref)
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.armed && self.new_ref {
            self.reg.release(self.dmb.token, self.kind, false);
        }
    }
}

/// What another task sends a parked request's task.
pub(crate) enum Deferred {
    /// Paired: its own DMB (owner) and the peer's (attach).
    Paired { seq: u32, own: Grant, peer: Grant },
    /// Its partner could not be served (the failure is the partner's, e.g. a quota).
    Failed { seq: u32, fail: Fail },
}

impl Deferred {
    pub(crate) fn seq(&self) -> u32 {
        match self {
            Deferred::Paired { seq, .. } | Deferred::Failed { seq, .. } => *seq,
        }
    }
}

/// Whether `a` and `b` are the two ends of one connection by their 4-tuples in one network
/// namespace (the caller checks that `a`'s socket is still established).
pub(crate) fn same_ns_mirror(a: &TcpIdentity, b: &TcpIdentity) -> bool {
    a.local == b.peer
        && a.peer == b.local
        && a.cookie != b.cookie
        && matches!((a.netns_cookie, b.netns_cookie), (Some(x), Some(y)) if x == y)
}
