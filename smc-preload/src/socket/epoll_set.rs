//! The state of an emulated epoll set, apart from the code that works on it ([`crate::epoll`]).
//!
//! The objects hold sets (`Obj::Epoll`) and a set's entries hold objects (its connections): the
//! state is generic over the object type so that it sits below [`crate::obj`], which names
//! `EpollSet<Obj>`, and the epoll code above both works on that same instantiation.

use crate::forklock::ForkOnce;
use crate::shm::Mapping;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize};
use std::sync::{Arc, Mutex};

/// How an entry is registered with the kernel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// As the application asked (its events and data): plain TCP or a candidate not connected.
    App,
    /// Connect or handshake under way: our tag, edge-triggered; nothing reaches the application.
    Undecided,
    /// An SMC connection: our tag, readiness computed from the rings.
    Emulated,
}

/// A registered fd.
pub struct Entry<O> {
    pub(super) events: u32,
    pub(super) data: u64,
    pub(super) mode: Mode,
    /// The connection, once the fd is SMC (emulated); `None` while it is only a candidate.
    pub(super) obj: Option<Arc<O>>,
    pub(super) last_token: (u64, u64),
    pub(super) last_mask: u32,
    pub(super) disabled: bool,
    /// On the ready list (emulated entries only).
    pub(super) hot: bool,
    /// When it last reported, or went on the ready list (`epoll::now_us`).
    pub(super) active_us: u32,
    /// The pass of the wait call that last checked it (at most one report per call).
    pub(super) seen: u32,
    /// The pass in which it was reported (a re-check in that pass would report it twice).
    pub(super) reported: u32,
    /// The bits it showed at its last check.
    pub(super) last_seen: u32,
}

/// The part of a set its waits and `epoll_ctl` change together (under [`EpollSet::inner`]).
pub struct EpInner<O> {
    pub(super) entries: HashMap<i32, Entry<O>>,
    /// Emulated entries to check at the next wait (each at most once: `Entry::hot`).
    pub(super) ready: VecDeque<i32>,
    /// Entries whose doorbells the kernel reported while another waiter of the connection slept
    /// on its socket (it drains them): `(fd, connection, wake_seq)`. A wait makes sure they
    /// were drained before it parks anything (the drain may find the peer gone).
    pub(super) undrained: Vec<(i32, Arc<O>, u32)>,
    pub(super) pass: u32,
    /// Epoll sets registered in this one (their fds): before a wait sleeps, each is made
    /// kernel-ready when it has something to report ([`crate::epoll::prepare_indirect`]).
    pub(super) nested: Vec<i32>,
    /// Emulated entries whose number was closed while another fd of this process still names
    /// the connection: as the kernel keeps a registration while its open file lives, they
    /// report under their data until the connection's last number closes; checked at every
    /// wait (by the number they had: their kernel registration still carries it).
    pub(super) closed: Vec<(i32, Entry<O>)>,
}

impl<O> Default for EpInner<O> {
    fn default() -> Self {
        EpInner {
            entries: HashMap::new(),
            ready: VecDeque::new(),
            undrained: Vec::new(),
            pass: 0,
            nested: Vec::new(),
            closed: Vec::new(),
        }
    }
}

/// An epoll instance that watches SMC connections (the object of its fd: `Obj::Epoll`).
pub struct EpollSet<O> {
    pub(super) inner: Mutex<EpInner<O>>,
    /// Emulated entries.
    pub(super) smc: AtomicUsize,
    /// Undecided entries (their events are ours to handle).
    pub(super) undecided: AtomicUsize,
    /// A registration with our tag was made: from then on every wait is ours, so that an event
    /// still carrying the tag (queued before its entry went) never reaches the application.
    pub(super) tagged: AtomicBool,
    /// Threads of this process asleep in the kernel wait of this set.
    pub(super) sleeping: AtomicU32,
    /// This process waited on the set at least once (its copies' processes learn it at fork).
    pub(super) waited_once: AtomicBool,
    /// The process whose copy of the set this is (a `fork` child finds its parent's pid here
    /// until its first wait).
    pub(super) owner: AtomicU32,
    /// Other processes may hold a copy (a `fork` happened): waits consult `EpollSet::sharing`.
    pub(super) forked: AtomicBool,
    /// The process that last recorded in the fork page that it waits on the set.
    pub(super) noted: AtomicU32,
    /// The copies could not be told apart (no fork page, or a full one): always `Sharing::Shared`.
    pub(super) always_shared: AtomicBool,
    /// The last sharing a wait found (`epoll::Sharing` as u32) and when the processes named in the
    /// fork page were last checked for life (`epoll::now_ms`).
    pub(super) last_sharing: AtomicU32,
    pub(super) pruned_ms: std::sync::atomic::AtomicU64,
    /// A page shared with the copies in other processes (made before the first `fork` that
    /// copies the set): one word per process holding a copy, its pid and whether it waited on
    /// the set (`epoll::WAITED`).
    pub(super) fork_page: ForkOnce<Option<Mapping>>,
}
