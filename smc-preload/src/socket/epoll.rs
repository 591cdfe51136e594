//! epoll emulation for SMC connections.
//!
//! An SMC fd is registered with the kernel edge-triggered for `EPOLLIN | EPOLLOUT |
//! EPOLLRDHUP` with our own tag as `epoll_data`; the application's events and data are kept
//! here. The kernel registration is only a wakeup: every doorbell (and the channel's EOF or
//! reset) that lands on the socket queues one event for the set, and since the socket is
//! writable the kernel reports it even when another waiter of the connection (a blocking read,
//! a `poll`, another set) drained the doorbell first — so the set needs no share in the
//! connection's sleeper protocol ([`crate::conn::Conn::sleep_enter`]) and its wakeups cannot be
//! taken by others.
//!
//! `epoll_wait` costs in proportion to the ready entries, not the registered ones: each set
//! keeps a ready list of the emulated entries to check — new or modified ones, the ones whose
//! socket the kernel reported, the ones found ready (level-triggered: reported while ready;
//! `EPOLLET`: once per edge, a new edge when the peer moved a cursor or a flag since the last
//! report, or new bits appeared) — and readiness is computed from the rings for those only.
//! An entry found not ready stays on the list unarmed for a few waits (a busy connection then
//! costs its peer no doorbell), and is *parked* when the set sleeps or after
//! [`WARM_US`]: its wakeups are armed (the peer rings a doorbell at its next change), the
//! rings are checked once more, and it leaves the list until the kernel reports its socket or
//! the application writes on it ([`rewarm`]: the answer to a request is then caught by the
//! spin before the next sleep).
//! Changes this process makes itself without the peer (`shutdown`, a write after the peer
//! closed) put the entry back on the list ([`conn_changed`]). `EPOLLONESHOT` entries leave
//! the list when reported, until `EPOLL_CTL_MOD`.
//!
//! A set copied by `fork` and waited on in two processes cannot share the ready list: then
//! both copies check every entry at each wait and sleep at most [`SHARED_TICK_MS`] at a time
//! (an event one process took from the kernel is seen by the other at its next check).
//!
//! A set waited on through another wait (registered in another set, or its fd polled or
//! selected) is seen there only by its kernel readiness. Before such a wait sleeps, every
//! emulated entry of the set is armed and the set is kicked when one would report now
//! ([`prepare_indirect`]): never a missed wakeup, at worst a spurious one.
//!
//! Sockets that may still become SMC are tracked too: a
//! TCP socket not yet connected is registered as the application asked; one whose connect or
//! handshake is under way (`Pending`, `Handshake`) is registered with our tag, edge-triggered,
//! and its events drive the handshake instead of reaching the application (the CLC messages
//! must not look like data: TCP reports `EPOLLIN` only for the peer's bytes). Once decided the
//! fd is emulated (SMC) or registered as the application asked again (TCP).

use crate::epoll_set::{self, Mode};
use crate::fdtable::{self, Slot};
use crate::forklock::ForkMutex;
use crate::forklock::ForkOnce;
use crate::obj::Obj;
use crate::ready::{self, ERR, HUP, IN, OUT, PRI, RDHUP};
use crate::real;
use crate::shm::Mapping;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
/// The kernel's limit on maxevents (`INT_MAX / sizeof(struct epoll_event)`).
const EP_MAX_EVENTS: usize = i32::MAX as usize / std::mem::size_of::<libc::epoll_event>();
/// Kernel events fetched per call at most.
const KBUF: usize = 1024;
/// An entry that reported nothing for this long (µs), without the set sleeping in between, is
/// parked (its wakeups armed) instead of checked again at every wait: a connection busy with
/// requests every few hundred µs stays on the list unarmed and costs its peer no doorbell.
const WARM_US: u32 = 2000;
/// A set waited on by two processes (copied by `fork`) sleeps at most this long at a time.
const SHARED_TICK_MS: i32 = 20;
/// A set with entries kept after their number closed ([`EpInner::closed`]) sleeps at most this
/// long at a time.
const KEPT_TICK_MS: i32 = 200;
/// A set copied by `fork` that only this process waited on so far sleeps at most this long at
/// a time, to notice when the other copy starts waiting too.
const FORKED_TICK_MS: i32 = 100;

/// High 32 bits of the kernel epoll_data of an SMC fd (random per process).
fn cookie() -> u64 {
    static C: ForkOnce<u64> = ForkOnce::new();
    *C.get_or_init(|| {
        let mut b = [0u8; 4];
        // SAFETY: valid buffer.
        unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 4, 0) };
        let v = u32::from_ne_bytes(b) as u64 | 0x8000_0000;
        v << 32
    })
}

fn tag(fd: i32) -> u64 {
    cookie() | fd as u32 as u64
}

/// The set's state lives in [`crate::epoll_set`] (generic over the object type, so that the
/// objects can hold sets); this file works on the sets of [`Obj`] objects.
pub type EpollSet = epoll_set::EpollSet<Obj>;
type EpInner = epoll_set::EpInner<Obj>;
type Entry = epoll_set::Entry<Obj>;

// Generic, as a `Drop` impl must be: [`KEPT`] counts the kept entries of every set.
impl<O> Drop for epoll_set::EpInner<O> {
    fn drop(&mut self) {
        KEPT.fetch_sub(self.closed.len(), Ordering::Relaxed);
    }
}

/// Entries kept in [`EpInner::closed`], over all sets (a hint: a connection's last close looks
/// for them only when there are any).
static KEPT: AtomicUsize = AtomicUsize::new(0);

impl Default for EpollSet {
    fn default() -> Self {
        EpollSet {
            inner: Mutex::new(EpInner::default()),
            smc: AtomicUsize::new(0),
            undecided: AtomicUsize::new(0),
            tagged: AtomicBool::new(false),
            sleeping: AtomicU32::new(0),
            waited_once: AtomicBool::new(false),
            owner: AtomicU32::new(crate::pid()),
            forked: AtomicBool::new(false),
            noted: AtomicU32::new(0),
            always_shared: AtomicBool::new(false),
            last_sharing: AtomicU32::new(Sharing::Alone as u32),
            pruned_ms: std::sync::atomic::AtomicU64::new(0),
            fork_page: ForkOnce::new(),
        }
    }
}

/// How a wait treats the set with respect to copies of it in other processes (`fork`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sharing {
    /// Only this process has it: the ready list is the truth.
    Alone = 0,
    /// A copy exists in another live process that never waited on it: sleeps are capped
    /// ([`FORKED_TICK_MS`]) to notice when it does.
    Forked = 1,
    /// Another live process waited on its copy too: every entry is checked at every wait and
    /// sleeps are capped ([`SHARED_TICK_MS`]): an event the other process took from the kernel
    /// is seen here at the next check.
    Shared = 2,
}

fn epoch() -> Instant {
    static T0: ForkOnce<Instant> = ForkOnce::new();
    *T0.get_or_init(Instant::now)
}

/// Milliseconds since the first call (monotonic).
fn now_ms() -> u64 {
    epoch().elapsed().as_millis() as u64
}

/// Microseconds since the first call, wrapping (compare with `wrapping_sub`).
fn now_us() -> u32 {
    epoch().elapsed().as_micros() as u32
}

/// A fork page word: the pid in the low 32 bits, this bit when that process waited on the set.
const WAITED: u64 = 1 << 32;
/// Dead processes are looked for in the fork page at most this often.
const PRUNE_MS: u64 = 1000;

impl EpollSet {
    fn fork_slots(&self) -> Option<&[std::sync::atomic::AtomicU64]> {
        let m = self.fork_page.get()?.as_ref()?;
        // SAFETY: a page-aligned shared mapping of 4096 bytes made for this purpose, only
        // accessed atomically (by this process and the forked ones that share it).
        Some(unsafe {
            std::slice::from_raw_parts(
                m.as_ptr() as *const std::sync::atomic::AtomicU64,
                m.len() / 8,
            )
        })
    }

    /// Records `pid` (`waited`: it waits on the set) in the fork page; false when it is full.
    fn note_pid(&self, pid: u32, waited: bool) -> bool {
        let Some(slots) = self.fork_slots() else {
            return false;
        };
        let want = pid as u64 | if waited { WAITED } else { 0 };
        for w in slots {
            let v = w.load(Ordering::SeqCst);
            if v as u32 == pid {
                if waited {
                    w.fetch_or(WAITED, Ordering::SeqCst);
                }
                return true;
            }
        }
        slots.iter().any(|w| {
            w.compare_exchange(0, want, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        })
    }

    /// Another process may hold a copy of this set (this one was copied by `fork`, or a child
    /// copied it and may still live).
    fn copied_by_fork(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != crate::pid() || self.forked.load(Ordering::Relaxed)
    }

    /// Held by the thread that forks, across the `fork` (`ops::fork`): the child's copy of the
    /// set is then whole and its lock free. `None` while another thread holds it.
    pub fn try_hold(&self) -> Option<impl Sized + '_> {
        crate::signals::crit_enter();
        let g = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                crate::signals::crit_exit();
                return None;
            }
        };
        Some(SetGuard(std::mem::ManuallyDrop::new(g)))
    }

    /// Before `fork` (in the parent): the page the copies will share. Not made by a `fork` from
    /// a signal handler (it must not allocate): a set without one is treated as shared by
    /// every copy from then on ([`EpollSet::after_fork_parent`]).
    pub fn before_fork(&self) {
        if !crate::signals::in_handler() {
            self.fork_page
                .get_or_init(|| Mapping::anon_shared(4096).ok());
        }
        let me = crate::pid();
        if self.owner.load(Ordering::Relaxed) == me {
            self.note_pid(me, self.waited_once.load(Ordering::Relaxed));
        }
    }

    /// After `fork` in the parent: `child` holds a copy now.
    pub fn after_fork_parent(&self, child: u32) {
        if !self.note_pid(child, false) {
            // No page (or a full one): the copies cannot tell each other apart; both check
            // every entry at every wait from now on.
            self.always_shared.store(true, Ordering::Relaxed);
        }
        self.forked.store(true, Ordering::SeqCst);
    }

    /// How this wait treats the set (see [`Sharing`]); cheap when no `fork` copied it.
    fn sharing(&self) -> Sharing {
        let me = crate::pid();
        if self.owner.load(Ordering::Relaxed) == me && !self.forked.load(Ordering::Relaxed) {
            return Sharing::Alone;
        }
        let Some(slots) = self.fork_slots() else {
            // Copied by a fork without a page (it could not be made): be safe.
            return Sharing::Shared;
        };
        if self.noted.load(Ordering::Relaxed) != me {
            // The first wait of this process on the set since a fork: the copies learn it.
            if !self.note_pid(me, true) {
                self.always_shared.store(true, Ordering::Relaxed);
            }
            self.noted.store(me, Ordering::Relaxed);
            self.owner.store(me, Ordering::Relaxed);
            self.forked.store(true, Ordering::Relaxed);
        }
        let now = now_ms();
        let prune = now.saturating_sub(self.pruned_ms.load(Ordering::Relaxed)) >= PRUNE_MS;
        if prune {
            self.pruned_ms.store(now, Ordering::Relaxed);
        }
        let (mut waiting, mut holding) = (false, false);
        for w in slots {
            let v = w.load(Ordering::SeqCst);
            let pid = v as u32;
            if pid == 0 || pid == me {
                continue;
            }
            if prune && process_gone(pid) {
                let _ = w.compare_exchange(v, 0, Ordering::SeqCst, Ordering::SeqCst);
                continue;
            }
            if v & WAITED != 0 {
                waiting = true;
            } else {
                holding = true;
            }
        }
        let s = if waiting || self.always_shared.load(Ordering::Relaxed) {
            Sharing::Shared
        } else if holding {
            Sharing::Forked
        } else {
            Sharing::Alone
        };
        if s == Sharing::Alone {
            // Every other copy's process is gone: back to the fast path.
            self.forked.store(false, Ordering::Relaxed);
        }
        self.last_sharing.store(s as u32, Ordering::Relaxed);
        s
    }
}

/// Whether no process `pid` exists any more (a zombie still exists until it is reaped).
fn process_gone(pid: u32) -> bool {
    let e0 = real::errno();
    // SAFETY: kill with signal 0 sends nothing (an existence and permission check).
    let gone = unsafe { libc::kill(pid as i32, 0) } != 0 && real::errno() == libc::ESRCH;
    real::set_errno(e0);
    gone
}

/// What registration `fd`'s current state wants, and its connection if emulated.
fn mode_of(fd: i32, app_events: u32) -> (Mode, Option<Arc<Obj>>) {
    if fdtable::raw(fd) < 8 {
        return (Mode::App, None);
    }
    let Some(o) = fdtable::get(fd) else {
        return (Mode::App, None);
    };
    match &*o {
        Obj::Conn(_) => (Mode::Emulated, Some(o)),
        // An exclusive entry cannot be modified later: it stays as the application asked.
        Obj::Pending(_) | Obj::Handshake(_) if app_events & libc::EPOLLEXCLUSIVE as u32 == 0 => {
            (Mode::Undecided, None)
        }
        // A fallback whose peer may still send late CLC messages: they are no data.
        Obj::Skip(s) if !s.done() && app_events & libc::EPOLLEXCLUSIVE as u32 == 0 => {
            (Mode::Undecided, None)
        }
        _ => (Mode::App, None),
    }
}

/// Set before the first registration of ours (with our tag) reaches the kernel: from then on a
/// wait passed straight to the kernel checks what it got ([`after_plain_wait`]).
static EVER_TAGGED: AtomicBool = AtomicBool::new(false);

/// Whether a registration of ours was ever made in this process (a plain wait must then look
/// for our tag in what the kernel returns).
pub fn ever_tagged() -> bool {
    EVER_TAGGED.load(Ordering::Acquire)
}

/// Before a `fork` (`ops::fork`): the epoll sets it copies (any, also one that held nothing
/// of ours yet) are the kernel's sets of both processes, so a registration one of them makes
/// later carries its tag to the other's waits. Both then
/// use one tag cookie (made now, inherited) and look for it in every wait; an event of a
/// registration the other process made is dropped ([`translate`]), never handed to the
/// application as its data (red team rt25 `rt25.c ep_add_after_fork`: the child's
/// `epoll_wait` reported `0xf1e8e69000000004` for an entry whose data was 7). Nothing here
/// allocates (a `fork` from a signal handler).
pub fn before_fork_of_a_set() {
    let _ = cookie();
    EVER_TAGGED.store(true, Ordering::Release);
}

/// The kernel registration for `mode`.
fn kernel_event(fd: i32, mode: Mode, events: u32, data: u64) -> libc::epoll_event {
    if mode != Mode::App && !EVER_TAGGED.load(Ordering::Relaxed) {
        EVER_TAGGED.store(true, Ordering::Release);
    }
    match mode {
        Mode::App => libc::epoll_event { events, u64: data },
        // Every doorbell and the channel's EOF/reset queue an event (edge-triggered); OUT makes
        // the kernel report it even when another waiter drained the doorbell first (the socket
        // carries only doorbells: it is writable).
        Mode::Emulated => libc::epoll_event {
            events: IN | OUT | RDHUP | ET,
            u64: tag(fd),
        },
        // Connect completion (OUT) and the peer's CLC messages (IN), each edge once; urgent
        // data when the application asks for it (a fallback's is TCP's).
        Mode::Undecided => libc::epoll_event {
            events: IN | OUT | RDHUP | ET | (events & PRI),
            u64: tag(fd),
        },
    }
}

/// Count an entry's mode in and out of the set's tallies.
fn tally(set: &EpollSet, mode: Mode, add: bool) {
    if add && mode != Mode::App {
        set.tagged.store(true, Ordering::Relaxed);
    }
    let n = match mode {
        Mode::App => return,
        Mode::Emulated => &set.smc,
        Mode::Undecided => &set.undecided,
    };
    if add {
        n.fetch_add(1, Ordering::Relaxed);
    } else {
        n.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Puts an emulated entry on the ready list (checked at the next wait).
fn make_hot(g: &mut EpInner, fd: i32) {
    if let Some(e) = g.entries.get_mut(&fd) {
        if e.mode == Mode::Emulated && !e.disabled && !e.hot {
            e.hot = true;
            e.active_us = now_us();
            g.ready.push_back(fd);
        }
    }
}

/// Takes an entry off the ready list.
fn unlist(g: &mut EpInner, fd: i32) {
    if let Some(e) = g.entries.get_mut(&fd) {
        if e.hot {
            e.hot = false;
            g.ready.retain(|&x| x != fd);
        }
    }
}

/// Every emulated entry on the ready list (a set shared with another process).
fn all_hot(g: &mut EpInner) {
    let EpInner { entries, ready, .. } = g;
    let now = now_us();
    for (&fd, e) in entries.iter_mut() {
        if e.mode == Mode::Emulated && !e.disabled && !e.hot {
            e.hot = true;
            e.active_us = now;
            ready.push_back(fd);
        }
    }
}

/// fd -> epoll fds that track it.
static MEMBERS: ForkMutex<HashMap<i32, Vec<i32>>> = ForkMutex::new(HashMap::new);
static CREATE: ForkMutex<()> = ForkMutex::new(|| ());

fn members() -> &'static ForkMutex<HashMap<i32, Vec<i32>>> {
    &MEMBERS
}

static MEMBERS_N: AtomicUsize = AtomicUsize::new(0);

/// A set's lock, held. While it is, a handler of the program that a signal brings to this
/// thread is deferred until it is released ([`crate::signals::crit_enter`], as for the
/// `ForkMutex`, ring and slot locks): a handler that forked there left the child a copy of the
/// set locked for ever (its `fork` cannot hold a set its own thread holds), and one that called
/// `epoll_ctl` on the set would wait for its own thread.
pub struct SetGuard<'a, T>(std::mem::ManuallyDrop<std::sync::MutexGuard<'a, T>>);

impl<T> std::ops::Deref for SetGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T> std::ops::DerefMut for SetGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0
    }
}

impl<T> Drop for SetGuard<'_, T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and never used again.
        unsafe { std::mem::ManuallyDrop::drop(&mut self.0) };
        crate::signals::crit_exit();
    }
}

/// Locks an epoll set (see [`SetGuard`]). Red team round 17, `sigsafe.c sendonly EPOLL=1`: a
/// handler's goodbye `send` inside the interrupted `epoll_wait`'s collection hung 2 of 2.
fn lock<T>(m: &Mutex<T>) -> SetGuard<'_, T> {
    crate::signals::crit_enter();
    SetGuard(std::mem::ManuallyDrop::new(
        m.lock().unwrap_or_else(|e| e.into_inner()),
    ))
}

fn set_of(ep: i32, create: bool) -> Option<Arc<Obj>> {
    if let Some(o) = fdtable::get(ep) {
        if let Obj::Epoll(_) = &*o {
            return Some(o);
        }
        return None;
    }
    if !create {
        return None;
    }
    let _g = CREATE.lock();
    if let Some(o) = fdtable::get(ep) {
        return match &*o {
            Obj::Epoll(_) => Some(o),
            _ => None,
        };
    }
    // From the first set on, connections tell us what changed without a doorbell.
    crate::conn::set_hooks(crate::conn::Hooks {
        changed: conn_changed,
        changed_fd: conn_changed_fd,
        wrote: rewarm,
    });
    // And the objects tell us when one changes.
    fdtable::set_hooks(fdtable::Hooks { refresh, is_member });
    let o = Arc::new(Obj::Epoll(EpollSet::default()));
    drop(fdtable::replace(ep, Slot::Obj(o.clone())));
    Some(o)
}

fn as_set(o: &Obj) -> &EpollSet {
    match o {
        Obj::Epoll(s) => s,
        _ => unreachable!(),
    }
}

fn is_set(o: &Obj) -> bool {
    matches!(o, Obj::Epoll(_))
}

/// Whether `fd` is an epoll instance (an fd we know nothing of: its type asked with `fstat`,
/// and then of `/proc` when it has none, once per `EPOLL_CTL_ADD`).
fn is_epoll_fd(fd: i32) -> bool {
    let e0 = real::errno();
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    let r = unsafe { libc::fstat(fd, &mut st) };
    // A socket, pipe or device (what event loops register most, one per connection) is no
    // epoll set: told by one `fstat`, without the walk through `/proc` (an epoll set is an
    // anonymous inode, of no file type on current kernels).
    if r != 0
        || matches!(
            st.st_mode & libc::S_IFMT,
            libc::S_IFSOCK | libc::S_IFIFO | libc::S_IFCHR
        )
    {
        real::set_errno(e0);
        return false;
    }
    let path = format!("/proc/self/fd/{fd}\0");
    let mut buf = [0u8; 32];
    // SAFETY: NUL-terminated path, `buf` writable for its length.
    let n = unsafe { libc::readlink(path.as_ptr().cast(), buf.as_mut_ptr().cast(), buf.len()) };
    real::set_errno(e0);
    n > 0 && buf.get(..n as usize) == Some(b"anon_inode:[eventpoll]".as_slice())
}

/// `inner`, an epoll set, is being registered in `ep` (the kernel judges the call itself):
/// both become sets of ours, `ep`'s waits ours, so that before one sleeps `inner` is made
/// kernel-ready when an emulated entry of it has something to report ([`prepare_indirect`]).
/// Without it the outer wait sees only `inner`'s kernel readiness, which for an SMC entry is
/// its doorbells, rung only while a waiter armed the ring (an outer wait could sleep on data
/// that was there).
fn note_nested(ep: i32, inner: i32, known: Option<&Obj>) {
    if known.is_none() && !is_epoll_fd(inner) {
        return;
    }
    if set_of(inner, true).is_none() {
        return;
    }
    let Some(so) = set_of(ep, true) else {
        return;
    };
    let set = as_set(&so);
    let mut g = lock(&set.inner);
    if !g.nested.contains(&inner) {
        g.nested.push(inner);
    }
    set.tagged.store(true, Ordering::Relaxed);
}

/// Depth of nested sets followed by [`prepare_indirect`] (the kernel allows 5 levels).
const NESTED_MAX: u32 = 5;

/// The set `ep` is about to be waited on through another wait (its fd polled or selected, or
/// registered in a set whose wait is about to sleep), which sees only its kernel readiness:
/// that must never be less than what its own wait would report. Every emulated entry is armed
/// (its peer rings at its next change: a kernel event for the set); when one would report now,
/// the set is kicked (the kernel queues an event for it). The kernel may then call the set
/// ready when no entry reports (a registration's own event): its wait returns nothing —
/// spurious, never a missed wakeup.
pub fn prepare_indirect(ep: i32, depth: u32) {
    let Some(so) = set_of(ep, false) else {
        return;
    };
    let set = as_set(&so);
    let mut ready = None;
    let nested = {
        let mut g = lock(&set.inner);
        for (&fd, e) in g.entries.iter() {
            if e.disabled || e.mode != Mode::Emulated {
                continue;
            }
            let Some(c) = e.obj.as_ref().and_then(|o| o.conn()) else {
                continue;
            };
            let mask = ready::arm(c, fd, e.events) & (e.events | ERR | HUP);
            if reports(e, c, mask).is_some() {
                ready = Some(fd);
                break;
            }
        }
        if ready.is_some() {
            // Armed or not, it is checked at the set's next wait.
            if let Some(fd) = ready {
                make_hot(&mut g, fd);
            }
        }
        // Entries kept after their number closed: armed (their registration has no number to
        // be kicked through; one that reports already is kicked through a live one, if any).
        let mut closed_ready = false;
        for (old, e) in g.closed.iter() {
            if let Some(c) = e.obj.as_ref().and_then(|o| o.conn()) {
                let mask = ready::arm(c, *old, e.events) & (e.events | ERR | HUP);
                closed_ready |= !e.disabled && reports(e, c, mask).is_some();
            }
        }
        if closed_ready && ready.is_none() {
            ready = g
                .entries
                .iter()
                .find(|(_, e)| e.mode == Mode::Emulated)
                .map(|(&fd, _)| fd);
        }
        g.nested.clone()
    };
    if let Some(fd) = ready {
        kick(ep, fd);
    }
    if depth < NESTED_MAX {
        for n in nested {
            if n != ep {
                prepare_indirect(n, depth + 1);
            }
        }
    }
}

/// Our epoll_ctl. Returns `None` when the call is not ours (pass it through).
///
/// # Safety
/// `ev` is the caller's pointer.
pub unsafe fn ctl(ep: i32, op: i32, fd: i32, ev: *mut libc::epoll_event) -> Option<i32> {
    let raw = fdtable::raw(fd) & !1;
    let obj = if raw >= 8 { fdtable::get(fd) } else { None };
    let emulated = obj.as_ref().is_some_and(|o| o.conn().is_some());
    // A fallback still skipping the peer's late CLC messages too: registered as the
    // application asked, a late message woke its waiters with nothing to read.
    let candidate = raw == fdtable::TAG_TCP
        || obj.as_ref().is_some_and(|o| match &**o {
            Obj::Pending(_) | Obj::Handshake(_) => true,
            Obj::Skip(s) => !s.done(),
            _ => false,
        });
    if !emulated && !candidate {
        if op == libc::EPOLL_CTL_DEL && MEMBERS_N.load(Ordering::Relaxed) > 0 {
            if let Some(so) = set_of(ep, false) {
                forget(as_set(&so), ep, fd);
            }
        }
        if op == libc::EPOLL_CTL_ADD && (raw == 0 || obj.as_deref().is_some_and(is_set)) {
            note_nested(ep, fd, obj.as_deref());
        }
        if op == libc::EPOLL_CTL_DEL && obj.as_deref().is_some_and(is_set) {
            if let Some(so) = set_of(ep, false) {
                lock(&as_set(&so).inner).nested.retain(|&n| n != fd);
            }
        }
        if op == libc::EPOLL_CTL_MOD && !ev.is_null() && MEMBERS_N.load(Ordering::Relaxed) > 0 {
            // An fd that went plain (a fallback) and still has an entry here: the entry takes
            // the application's new interest, or a later `refresh` of the fd would put back
            // the interest it had at ADD (red team rt12: a postgres backend's MOD to EPOLLIN was
            // replaced by its earlier EPOLLOUT, and it spun while its query sat unread).
            if let Some(so) = set_of(ep, false) {
                let set = as_set(&so);
                let mut g = lock(&set.inner);
                if g.entries.contains_key(&fd) {
                    // SAFETY: `ev` is non-null (checked) and the caller's epoll_event; `ep`
                    // and `fd` are the caller's numbers, judged by the kernel.
                    let r = unsafe { real::epoll_ctl(ep, op, fd, ev) };
                    if r == 0 {
                        // SAFETY: as above.
                        let (events, data) = unsafe { ((*ev).events, (*ev).u64) };
                        if let Some(e) = g.entries.get_mut(&fd) {
                            e.events = events;
                            e.data = data;
                            e.disabled = false;
                        }
                    }
                    return Some(r);
                }
            }
        }
        return None;
    }
    // As the kernel (`do_epoll_ctl`), before it looks at the numbers: an event to read, and
    // `EPOLLEXCLUSIVE` at ADD only with the bits it allows (red team round 29: ADD and MOD
    // without an event made an entry of no interest, EXCLUSIVE with ONESHOT was taken).
    if op != libc::EPOLL_CTL_DEL {
        if (ev as usize) < 0x1_0000 {
            real::set_errno(libc::EFAULT);
            return Some(-1);
        }
        // SAFETY: non-null, and by epoll_ctl's contract the caller's epoll_event.
        let asked = unsafe { (*ev).events };
        const EXCLUSIVE_OK: u32 = (libc::EPOLLIN
            | libc::EPOLLOUT
            | libc::EPOLLERR
            | libc::EPOLLHUP
            | libc::EPOLLWAKEUP
            | libc::EPOLLET
            | libc::EPOLLEXCLUSIVE) as u32;
        if op == libc::EPOLL_CTL_ADD
            && asked & libc::EPOLLEXCLUSIVE as u32 != 0
            && asked & !EXCLUSIVE_OK != 0
        {
            real::set_errno(libc::EINVAL);
            return Some(-1);
        }
    }
    let so = set_of(ep, true)?;
    let set = as_set(&so);
    let (events, data) = if ev.is_null() {
        (0, 0)
    } else {
        // SAFETY: `ev` is non-null (checked above) and, by epoll_ctl's contract, points to the
        // caller's epoll_event.
        let e = unsafe { &*ev };
        (e.events, e.u64)
    };
    let mut g = lock(&set.inner);
    // As the kernel: EPOLLEXCLUSIVE only with ADD, and an exclusive entry cannot be modified.
    let excl = libc::EPOLLEXCLUSIVE as u32;
    if op == libc::EPOLL_CTL_MOD
        && (events & excl != 0 || g.entries.get(&fd).is_some_and(|e| e.events & excl != 0))
    {
        real::set_errno(libc::EINVAL);
        return Some(-1);
    }
    let (mode, obj) = if emulated {
        (Mode::Emulated, obj)
    } else {
        mode_of(fd, events)
    };
    let mut kev = kernel_event(fd, mode, events, data);
    match op {
        libc::EPOLL_CTL_ADD => {
            // The kernel is the judge (it may be a different open file on the same number).
            // SAFETY: `kev` is a live epoll_event; `ep` and `fd` are the caller's fd numbers,
            // judged by the kernel.
            let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
            if r != 0 {
                return Some(r);
            }
            remove_entry(set, &mut g, fd);
            g.entries.insert(
                fd,
                Entry {
                    events,
                    data,
                    mode,
                    obj: if mode == Mode::Emulated { obj } else { None },
                    last_token: (0, 0),
                    last_mask: 0,
                    disabled: false,
                    hot: false,
                    active_us: 0,
                    seen: 0,
                    reported: 0,
                    last_seen: 0,
                },
            );
            tally(set, mode, true);
            make_hot(&mut g, fd);
            drop(g);
            let pause = crate::util::config::config().test_epoll_ctl_pause_ms;
            if pause > 0 && mode != Mode::Emulated {
                std::thread::sleep(std::time::Duration::from_millis(pause));
            }
            {
                let mut m = members().lock();
                let v = m.entry(fd).or_default();
                if !v.contains(&ep) {
                    v.push(ep);
                    MEMBERS_N.fetch_add(1, Ordering::Relaxed);
                }
            }
            // A decision made by another thread (a server end of this process driving its own
            // client, a connect completing) since `mode_of` above found no membership to
            // refresh: its state is installed before its refresh looks the members up, so it
            // is seen here. Without this the entry stayed on the TCP socket of an SMC
            // connection whose doorbells nothing arms (a wait missed its data for good).
            let now = if mode == Mode::Emulated {
                Mode::Emulated
            } else {
                mode_of(fd, events).0
            };
            if now != mode {
                refresh(fd);
            }
            Some(0)
        }
        libc::EPOLL_CTL_MOD => {
            // SAFETY: `kev` is a live epoll_event; `ep` and `fd` are the caller's fd numbers,
            // judged by the kernel.
            let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
            if r != 0 {
                return Some(r);
            }
            let old = g.entries.get(&fd).map(|e| e.mode);
            if let Some(old) = old {
                if old != mode {
                    unlist(&mut g, fd);
                    tally(set, old, false);
                    tally(set, mode, true);
                }
            }
            if let Some(e) = g.entries.get_mut(&fd) {
                e.events = events;
                e.data = data;
                e.mode = mode;
                e.obj = if mode == Mode::Emulated { obj } else { None };
                e.disabled = false;
                e.last_mask = 0;
                e.last_token = (0, 0);
            }
            make_hot(&mut g, fd);
            Some(0)
        }
        libc::EPOLL_CTL_DEL => {
            // SAFETY: `kev` is a live epoll_event; `ep` and `fd` are the caller's fd numbers,
            // judged by the kernel.
            let r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
            remove_entry(set, &mut g, fd);
            drop(g);
            unmember(fd, ep);
            Some(r)
        }
        _ => None,
    }
}

fn remove_entry(set: &EpollSet, g: &mut EpInner, fd: i32) {
    unlist(g, fd);
    if let Some(e) = g.entries.remove(&fd) {
        tally(set, e.mode, false);
    }
    g.undrained.retain(|(x, _, _)| *x != fd);
}

fn unmember(fd: i32, ep: i32) {
    let mut m = members().lock();
    if let Some(v) = m.get_mut(&fd) {
        let before = v.len();
        v.retain(|&x| x != ep);
        MEMBERS_N.fetch_sub(before - v.len(), Ordering::Relaxed);
        if v.is_empty() {
            m.remove(&fd);
        }
    }
}

fn forget(set: &EpollSet, ep: i32, fd: i32) {
    let mut g = lock(&set.inner);
    remove_entry(set, &mut g, fd);
    drop(g);
    unmember(fd, ep);
}

/// Whether an epoll set of ours tracks `fd`.
pub fn is_member(fd: i32) -> bool {
    MEMBERS_N.load(Ordering::Relaxed) > 0 && members().lock().contains_key(&fd)
}

/// `fd` is being closed: drop it from every epoll set (the kernel does the same). `live`: the
/// number still names the socket (a close we see before it happens, not a stale slot).
///
/// A registration with our tag is removed from the kernel too: the kernel keeps an epoll
/// registration as long as the open file lives, and another reference may keep it alive after
/// the application's close (the daemon checking the socket it was sent, a dup, a fork): its
/// events would reach the application with our tag as its data (nginx took it for a pointer)
/// if a wait did not drop them. Not when another process holds a copy of the set (`fork`): the
/// kernel's epoll instance and the open file are shared, and the registration is the other
/// process's too (TCP: a child's close leaves its parent's registration alone); our waits
/// drop the events it still queues here.
///
/// An emulated entry of a connection that another fd of this process still names is kept
/// instead, with its kernel registration, as TCP's registration lives as long as the open file:
/// it goes on reporting under its data until the connection's last number closes (conformance
/// `epoll_close_while_dup_open`). True when one was kept: the
/// caller moves the connection's own I/O off the number before it closes (its doorbells are
/// drained through that registration's events). `obj`: what the number named.
pub fn on_close(fd: i32, live: bool, obj: Option<&Arc<Obj>>) -> bool {
    let conn = obj.and_then(|o| o.conn());
    if let Some(c) = conn {
        if c.numbers() == 0 && KEPT.load(Ordering::Relaxed) > 0 {
            // Its last number: the entries kept for it go (the open file goes here).
            drop_kept(c);
        }
    }
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let lives_on = live && conn.is_some_and(|c| c.numbers() > 0);
    let eps = members().lock().remove(&fd).unwrap_or_default();
    MEMBERS_N.fetch_sub(eps.len(), Ordering::Relaxed);
    // A fallback still skipping late CLC messages that another number names (a dup): it is TCP
    // whatever comes, so its registration becomes the application's own in the kernel (as
    // TCP's, it lives with the open file, under its data). A late CLC message may then make
    // one spurious wakeup (its read through the other number skips it); removed, the
    // registration missed every later event (conformance
    // `epoll_close_while_dup_open_then_dup_closed`, 1 ms CLC timer).
    let skip_lives_on = live
        && !eps.is_empty()
        && obj.is_some_and(|o| {
            matches!(&**o, Obj::Skip(_)) && {
                let mut other = false;
                fdtable::for_each_object(|n, x| other |= n != fd && Arc::ptr_eq(x, o));
                other
            }
        });
    let mut kept = false;
    for ep in eps {
        if let Some(so) = set_of(ep, false) {
            let set = as_set(&so);
            let mut g = lock(&set.inner);
            let ours = g.entries.get(&fd).is_some_and(|e| e.mode != Mode::App);
            if skip_lives_on && !set.copied_by_fork() {
                if let Some(e) = g
                    .entries
                    .get(&fd)
                    .filter(|e| e.mode == Mode::Undecided && !e.disabled)
                {
                    let mut kev = libc::epoll_event {
                        events: e.events,
                        u64: e.data,
                    };
                    remove_entry(set, &mut g, fd);
                    // SAFETY: valid event; `fd` is still open (closed after this returns).
                    if unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut kev) } == 0 {
                        continue;
                    }
                }
            }
            let keep = lives_on
                && !set.copied_by_fork()
                && g.entries.get(&fd).is_some_and(|e| {
                    e.mode == Mode::Emulated
                        && e.obj
                            .as_ref()
                            .zip(obj)
                            .is_some_and(|(a, b)| Arc::ptr_eq(a, b))
                });
            if keep {
                unlist(&mut g, fd);
                g.undrained.retain(|(x, _, _)| *x != fd);
                if let Some(e) = g.entries.remove(&fd) {
                    tally(set, e.mode, false);
                    g.closed.push((fd, e));
                    KEPT.fetch_add(1, Ordering::Relaxed);
                    kept = true;
                }
                continue;
            }
            remove_entry(set, &mut g, fd);
            if ours && live && !set.copied_by_fork() {
                let mut kev = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: valid event; `fd` is still open (closed after this returns).
                unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut kev) };
            }
        }
    }
    kept
}

/// The last number of `c` in this process closed: the entries kept for it after earlier
/// closes ([`EpInner::closed`]) go.
fn drop_kept(c: &crate::conn::Conn) {
    let mut gone = Vec::new();
    fdtable::for_each_object(|_, o| {
        if let Obj::Epoll(set) = &**o {
            let mut g = lock(&set.inner);
            let before = g.closed.len();
            let EpInner { closed, .. } = &mut *g;
            closed.retain_mut(|(_, e)| {
                let mine = e
                    .obj
                    .as_ref()
                    .and_then(|o| o.conn())
                    .is_some_and(|x| std::ptr::eq(x, c));
                if mine {
                    // Dropped outside the lock (it may be the connection's last reference).
                    gone.extend(e.obj.take());
                }
                !mine
            });
            KEPT.fetch_sub(before - g.closed.len(), Ordering::Relaxed);
        }
    });
    drop(gone);
}

/// `fd` became an SMC connection: switch its registrations to emulation.
pub fn on_convert(fd: i32, _obj: &Arc<Obj>) {
    refresh(fd);
}

/// `fd`'s state changed (connect under way, handshake started or decided): bring every epoll
/// registration of it in line (`mode_of`). The kernel re-evaluates readiness on
/// `EPOLL_CTL_MOD`, so nothing that happened meanwhile is lost to the application.
pub fn refresh(fd: i32) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let eps = members().lock().get(&fd).cloned().unwrap_or_default();
    for ep in eps {
        rearm(ep, fd, false);
    }
}

/// The file at `fd` is replaced by another one (`swap`: a private connection with the last
/// bytes of a peer that closed, `dup3`'d over the number, see `lifecycle`): the kernel keys a
/// registration by number and file, so ours are taken off the old file first (it may live on
/// in another process and report at this number) and put on the new one after `swap`, with the
/// events the application asked for (red team rt15: an epoll set stopped reporting the number,
/// 5 of 20).
pub fn file_replaced(fd: i32, swap: impl FnOnce()) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        swap();
        return;
    }
    let eps = members().lock().get(&fd).cloned().unwrap_or_default();
    let e0 = real::errno();
    for &ep in &eps {
        let mut kev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: valid event (ignored by DEL).
        unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut kev) };
    }
    real::set_errno(e0);
    swap();
    for ep in eps {
        rearm(ep, fd, true);
    }
}

/// `fd`'s registration in the set `ep` as its state wants now (`mode_of`): modified when the
/// mode changed, or added anew (`added`: the kernel holds none for the file at `fd`).
fn rearm(ep: i32, fd: i32, added: bool) {
    let Some(so) = set_of(ep, false) else {
        return;
    };
    let set = as_set(&so);
    let mut g = lock(&set.inner);
    let Some(e) = g.entries.get(&fd) else {
        return;
    };
    let (events, data, old) = (e.events, e.data, e.mode);
    let (mode, obj) = mode_of(fd, events);
    if mode == old && !added {
        // Emulated stays with the connection it has (a dup'd fd shares it).
        return;
    }
    let mut kev = kernel_event(fd, mode, events, data);
    let e0 = real::errno();
    let op = if added {
        libc::EPOLL_CTL_ADD
    } else {
        libc::EPOLL_CTL_MOD
    };
    // SAFETY: valid event.
    let mut r = unsafe { real::epoll_ctl(ep, op, fd, &mut kev) };
    if r != 0 && !added && events & libc::EPOLLEXCLUSIVE as u32 != 0 {
        // The kernel refuses to modify an exclusive registration (left as the application
        // asked while the connection was undecided): replace it, or the SMC connection's
        // readiness would never be computed (nothing arms its doorbells).
        // SAFETY: valid event.
        unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut kev) };
        // SAFETY: valid event.
        r = unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut kev) };
    }
    real::set_errno(e0);
    if r != 0 {
        return;
    }
    unlist(&mut g, fd);
    tally(set, old, false);
    tally(set, mode, true);
    if let Some(e) = g.entries.get_mut(&fd) {
        e.mode = mode;
        e.obj = obj;
        e.last_token = (0, 0);
        e.last_mask = 0;
    }
    make_hot(&mut g, fd);
}

/// Our own call changed what the connection behind `fd` reports without the peer (a
/// `shutdown`, a write after the peer closed): its emulated entries go back on their sets'
/// ready lists, and a thread asleep in such a set is woken (`EPOLL_CTL_MOD` of our
/// registration makes the kernel queue an event: the socket is writable). The entries of other
/// fds of the connection (`dup`) are looked up only when there are any.
pub fn conn_changed(fd: i32, c: &crate::conn::Conn) {
    changed(fd, c, true);
}

/// [`conn_changed`] for the entries of `fd` only (the peer found gone by a drain of `fd`: an
/// entry of another fd of the connection hears of it from its own registration's event).
pub fn conn_changed_fd(fd: i32, c: &crate::conn::Conn) {
    changed(fd, c, false);
}

fn changed(fd: i32, c: &crate::conn::Conn, all_fds: bool) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let targets: Vec<(i32, i32)> = {
        let m = members().lock();
        if all_fds && c.sh().refs.load(Ordering::Relaxed) > 1 {
            m.iter()
                .flat_map(|(&f, eps)| eps.iter().map(move |&ep| (ep, f)))
                .collect()
        } else {
            m.get(&fd)
                .map(|eps| eps.iter().map(|&ep| (ep, fd)).collect())
                .unwrap_or_default()
        }
    };
    for (ep, f) in targets {
        let Some(so) = set_of(ep, false) else {
            continue;
        };
        let set = as_set(&so);
        let mut g = lock(&set.inner);
        let ours = g.entries.get(&f).is_some_and(|e| {
            e.mode == Mode::Emulated
                && e.obj
                    .as_ref()
                    .and_then(|o| o.conn())
                    .is_some_and(|x| std::ptr::eq(x, c))
        });
        if !ours {
            continue;
        }
        make_hot(&mut g, f);
        drop(g);
        if set.sleeping.load(Ordering::SeqCst) > 0 {
            kick(ep, f);
        }
    }
}

/// Wakes a thread asleep in the kernel wait of `ep` through `fd`'s registration with our tag
/// (re-armed as it is: the socket is writable, so the kernel queues an event for it).
fn kick(ep: i32, fd: i32) {
    let mut kev = kernel_event(fd, Mode::Emulated, 0, 0);
    let e0 = real::errno();
    // SAFETY: valid event; a stale fd number only makes the kernel say ENOENT/EBADF.
    unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut kev) };
    real::set_errno(e0);
}

/// Carry on the connect or handshake of `fd` as far as it goes without waiting; true when it
/// was decided (or is not undecided any more).
fn drive(fd: i32) -> bool {
    let Some(o) = fdtable::get(fd) else {
        return true;
    };
    let decided = match &*o {
        Obj::Pending(_) => {
            drop(o);
            crate::setup::resolve_pending(fd);
            !matches!(fdtable::get(fd).as_deref(), Some(Obj::Pending(_)))
        }
        Obj::Handshake(h) => crate::setup::progress(fd, h, false),
        Obj::Skip(s) => crate::setup::skip_late_clc(fd, fd, &o, s),
        _ => true,
    };
    // A state reached by any path (progress, resolve, another thread) takes effect here.
    refresh(fd);
    decided
}

/// Whether an undecided `fd` is writable for the application as far as TCP goes: a fallback
/// skipping late CLC messages, or a handshake whose connect counts as complete
/// ([`crate::obj::Handshake::out_while_undecided`]).
fn out_while_undecided(fd: i32) -> bool {
    match fdtable::get(fd).as_deref() {
        Some(Obj::Handshake(h)) => h.out_while_undecided(),
        Some(Obj::Skip(_)) => true,
        _ => false,
    }
}

/// `fd`'s socket has room now (a level check: its registration is edge-triggered).
fn writable_now(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one pollfd of our own, no wait.
    unsafe { real::poll(&mut p, 1, 0) == 1 && p.revents & libc::POLLOUT != 0 }
}

/// An undecided entry that a step just made writable for the application (`before`: it was
/// not): its `EPOLLOUT` is reported now, as TCP reports a completed connect. The socket's own
/// edge for it came long before (the TCP connect) and none follows: a client whose handshake
/// timed out at a tick (its server accepting later than the accept wait) became a fallback
/// that never reported `EPOLLOUT`, and an event loop that writes first on it waited for ever
/// (`smc-scale` at 65 536 connections: 512 of 512 connects in flight of a client stuck so).
fn out_after_step(fd: i32, before: bool, events: u32) -> bool {
    !before
        && events & OUT != 0
        && events & ONESHOT == 0
        && out_while_undecided(fd)
        && writable_now(fd)
}

/// Drive every undecided entry of the set (a tick: CLC timeouts are checked as they go); an
/// entry the step made writable is reported into `out` ([`out_after_step`]).
fn drive_all(set: &EpollSet, out: &mut Vec<libc::epoll_event>) -> bool {
    if set.undecided.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let fds: Vec<(i32, u32, u64)> = lock(&set.inner)
        .entries
        .iter()
        .filter(|(_, e)| e.mode == Mode::Undecided)
        .map(|(&fd, e)| (fd, e.events, e.data))
        .collect();
    let mut any = false;
    for (fd, events, data) in fds {
        let before = out_while_undecided(fd);
        any |= drive(fd);
        let still = lock(&set.inner)
            .entries
            .get(&fd)
            .is_some_and(|e| e.mode == Mode::Undecided && !e.disabled);
        if still && out_after_step(fd, before, events) {
            out.push(libc::epoll_event {
                events: OUT,
                u64: data,
            });
        }
    }
    any
}

/// Whether `ep` needs emulation.
pub fn wants(ep: i32) -> Option<Arc<Obj>> {
    if fdtable::raw(ep) < 8 {
        return None;
    }
    let o = fdtable::get(ep)?;
    match &*o {
        Obj::Epoll(s) if s.tagged.load(Ordering::Relaxed) => Some(o),
        _ => None,
    }
}

/// Whether an entry reporting `mask` now is reported (level-triggered: whenever ready;
/// `EPOLLET`: on an edge); `Some` of its edge token then.
fn reports(e: &Entry, c: &crate::conn::Conn, mask: u32) -> Option<(u64, u64)> {
    if mask == 0 {
        return None;
    }
    if e.events & ET == 0 {
        return Some((0, 0));
    }
    let tok = c.edge_token();
    (tok != e.last_token || mask & !e.last_mask != 0).then_some(tok)
}

/// An entry found not ready and left on the ready list unarmed, for the spin: its connection,
/// the bits it waits for and the bits it had.
type Warm = (Arc<Obj>, u32, u32);

/// Checks the entries on the ready list (each at most once per wait call: `fresh` starts a new
/// call's pass) and reports into `out`, at most `max`: level-triggered entries while ready,
/// `EPOLLET` ones on an edge, `EPOLLONESHOT` ones once (they leave the list). An entry that
/// reports nothing stays on the list unarmed (into `warm`) for [`WARM_US`]; then,
/// or at once with `park`, its wakeups are armed and it is checked again: still nothing, it
/// leaves the list until the kernel reports its socket.
fn collect(
    g: &mut EpInner,
    ep: i32,
    out: &mut Vec<libc::epoll_event>,
    max: usize,
    fresh: bool,
    park: bool,
    warm: &mut Vec<Warm>,
) {
    if fresh {
        g.pass = g.pass.wrapping_add(1);
    }
    let pass = g.pass;
    let now = now_us();
    let EpInner { entries, ready, .. } = g;
    let n = ready.len();
    for _ in 0..n {
        if out.len() >= max {
            return;
        }
        let Some(fd) = ready.pop_front() else {
            break;
        };
        let Some(e) = entries.get_mut(&fd) else {
            continue;
        };
        if !e.hot {
            continue;
        }
        if e.seen == pass {
            ready.push_back(fd);
            continue;
        }
        e.seen = pass;
        if e.disabled || e.mode != Mode::Emulated {
            e.hot = false;
            continue;
        }
        // Taken out while it is checked (no reference count traffic), put back below.
        let Some(o) = e.obj.take() else {
            e.hot = false;
            continue;
        };
        let before = out.len();
        let keep = match o.conn() {
            Some(c) => check(e, c, ep, fd, now, park, out),
            None => {
                e.hot = false;
                false
            }
        };
        if out.len() > before {
            e.reported = pass;
        }
        if e.hot {
            ready.push_back(fd);
            if keep {
                warm.push((o.clone(), e.events | ERR | HUP, e.last_seen));
            }
        }
        e.obj = Some(o);
    }
    // Entries kept after their number closed: checked at every wait, armed before it sleeps;
    // gone once no number of the process names the connection (or it continues on TCP).
    let before = g.closed.len();
    g.closed.retain(|(_, e)| {
        e.obj
            .as_ref()
            .and_then(|o| o.conn())
            .is_some_and(|c| c.numbers() > 0 && !c.switching())
    });
    if g.closed.len() < before {
        KEPT.fetch_sub(before - g.closed.len(), Ordering::Relaxed);
    }
    for (old, e) in g.closed.iter_mut() {
        if out.len() >= max {
            return;
        }
        if e.seen == pass || e.disabled {
            continue;
        }
        e.seen = pass;
        let Some(o) = e.obj.take() else { continue };
        if let Some(c) = o.conn() {
            check(e, c, ep, *old, now, park, out);
        }
        e.obj = Some(o);
    }
}

/// One check of an entry on the ready list (see [`collect`]): reports it into `out`, keeps it
/// on the list (`e.hot`) or parks it. True when it stays on the list unarmed without a report
/// (for the spin; `e.last_seen` is what it showed).
fn check(
    e: &mut Entry,
    c: &crate::conn::Conn,
    ep: i32,
    fd: i32,
    now: u32,
    park: bool,
    out: &mut Vec<libc::epoll_event>,
) -> bool {
    let want = e.events | ERR | HUP;
    let mut armed = false;
    loop {
        let mask = ready::conn_mask_at(c, fd) & want;
        if mask == 0 {
            e.last_mask = 0;
        }
        e.last_seen = mask;
        if let Some(tok) = reports(e, c, mask) {
            if e.events & ET != 0 {
                e.last_token = tok;
                e.last_mask = mask;
            }
            out.push(libc::epoll_event {
                events: mask,
                u64: e.data,
            });
            if e.events & ONESHOT != 0 {
                e.disabled = true;
                e.hot = false;
            } else {
                e.active_us = now;
            }
            return false;
        }
        if !armed && (park || now.wrapping_sub(e.active_us) >= WARM_US) {
            // Park: the peer rings from now on, or its change is seen by this check.
            ready::arm(c, fd, e.events);
            armed = true;
            continue;
        }
        if armed {
            e.hot = false;
            note_parked(c, ep, fd);
            return false;
        }
        return true;
    }
}

/// [`crate::conn::Conn::epoll_parked`]: entries of the connection were parked in more than one
/// set (looked up by the writing fd then).
const PARKED_MANY: u64 = u64::MAX;

/// The entry of `fd` in set `ep` was parked: the connection's next write puts it back on the
/// ready list ([`rewarm`]).
fn note_parked(c: &crate::conn::Conn, ep: i32, fd: i32) {
    // Both are descriptors (non-negative) and differ: never 0, never PARKED_MANY.
    let v = (u64::from(ep as u32) << 32) | u64::from(fd as u32);
    if let Err(old) = c
        .epoll_parked
        .compare_exchange(0, v, Ordering::Relaxed, Ordering::Relaxed)
    {
        if old != v {
            c.epoll_parked.store(PARKED_MANY, Ordering::Relaxed);
        }
    }
}

/// The application wrote on `fd`, a connection one of whose entries a set parked while it was
/// idle: a request went out, an answer is likely soon. The entry goes back on its set's ready
/// list (still armed), so that the next wait spins on its ring before it sleeps (as it does
/// for a connection active in the last [`WARM_US`]) rather than waking through the kernel when
/// the answer's doorbell arrives (ping every millisecond among idle connections: p50 63 µs
/// without, see docs/PERF.md). A heuristic for speed only: wakeups stay armed either way.
pub fn rewarm(fd: i32, c: &crate::conn::Conn) {
    // Not from a program's signal handler: the heuristic allocates (it may have interrupted
    // `malloc`); the mark stays for the next send.
    if crate::signals::in_handler() {
        return;
    }
    let v = c.epoll_parked.swap(0, Ordering::Relaxed);
    if v == 0 {
        return;
    }
    let targets: Vec<(i32, i32)> = if v == PARKED_MANY {
        members()
            .lock()
            .get(&fd)
            .map(|eps| eps.iter().map(|&ep| (ep, fd)).collect())
            .unwrap_or_default()
    } else {
        vec![((v >> 32) as u32 as i32, v as u32 as i32)]
    };
    for (ep, f) in targets {
        let Some(so) = set_of(ep, false) else {
            continue;
        };
        let set = as_set(&so);
        let mut g = lock(&set.inner);
        let ours = g.entries.get(&f).is_some_and(|e| {
            e.obj
                .as_ref()
                .and_then(|o| o.conn())
                .is_some_and(|x| std::ptr::eq(x, c))
        });
        if ours {
            make_hot(&mut g, f);
        }
    }
}

/// Handles what the kernel reported: the emulated fds whose socket saw a doorbell (or EOF)
/// go on the ready list, their doorbells drained (outside the set's lock) unless another
/// thread sleeps on the socket (the last one out drains: [`crate::conn::Conn::sleep_enter`]);
/// the handshakes of the undecided ones are driven; plain events are passed on. True when a
/// handshake was decided (its fd's readiness is then to be collected again: from the rings, or
/// from the kernel after its re-registration).
fn translate(set: &EpollSet, kev: &[libc::epoll_event], out: &mut Vec<libc::epoll_event>) -> bool {
    let ck = cookie();
    let mut g = None;
    let mut undecided = Vec::new();
    // (fd, connection, to the end): sockets to drain once the lock is released.
    let mut drains: Vec<(i32, Arc<Obj>, bool)> = Vec::new();
    for k in kev {
        let d = k.u64;
        if d & 0xFFFF_FFFF_0000_0000 == ck {
            let fd = d as u32 as i32;
            let g = g.get_or_insert_with(|| lock(&set.inner));
            // An entry kept after its number closed, registered under that number: its
            // doorbells are drained (through the connection's own descriptor); it is checked at
            // every wait.
            let rang = k.events & (IN | RDHUP | ERR | HUP) != 0;
            for (_, e) in g.closed.iter().filter(|(old, _)| *old == fd) {
                if let Some(o) = e.obj.as_ref().filter(|o| rang && o.conn().is_some()) {
                    drains.push((fd, o.clone(), k.events & (RDHUP | ERR | HUP) != 0));
                }
            }
            match g.entries.get(&fd) {
                Some(Entry {
                    mode: Mode::Emulated,
                    obj,
                    ..
                }) => {
                    // Only a readable socket holds doorbells (or EOF) to drain; `EPOLLOUT`
                    // alone is a (re-)registration, a kick, or doorbells another waiter took.
                    let rang = k.events & (IN | RDHUP | ERR | HUP) != 0;
                    if let Some(o) = obj.as_ref().filter(|o| rang && o.conn().is_some()) {
                        // The peer's FIN (or an error) is there: drained up to it, even behind
                        // doorbells. This registration is edge-triggered: no later event would
                        // tell of an EOF a short drain left queued.
                        let to_end = k.events & (RDHUP | ERR | HUP) != 0;
                        drains.push((fd, o.clone(), to_end));
                    }
                    make_hot(g, fd);
                    continue;
                }
                Some(Entry {
                    mode: Mode::Undecided,
                    events,
                    data,
                    ..
                }) => {
                    undecided.push((fd, k.events, *events, *data));
                    continue;
                }
                // Our tag on an entry since changed or removed: never the application's.
                Some(Entry {
                    mode: Mode::App, ..
                })
                | None => continue,
            }
        }
        out.push(*k);
    }
    drop(g);
    let mut left = Vec::new();
    let drained: Vec<i32> = drains.iter().map(|d| d.0).collect();
    for (fd, o, to_end) in drains {
        if let Some(c) = o.conn() {
            // Only through a number that still names the connection, or its private
            // duplicate (the number closed under a call in flight).
            let call = crate::fdtable::InCall::enter(fd, o.clone());
            if call.is_none() && !c.io_redirected() {
                continue;
            }
            if !c.try_drain_to(fd, to_end) {
                let seq = c.wake_seq();
                left.push((fd, o, seq));
            }
        }
    }
    if !left.is_empty() {
        lock(&set.inner).undrained.extend(left);
    }
    if !drained.is_empty() {
        // A drain may have found the peer's end (or reset) only now: an entry checked earlier
        // in this call and not reported is checked again.
        let mut g = lock(&set.inner);
        let pass = g.pass;
        for fd in drained {
            if let Some(e) = g.entries.get_mut(&fd) {
                if e.seen == pass && e.reported != pass {
                    e.seen = pass.wrapping_sub(1);
                }
            }
            make_hot(&mut g, fd);
        }
    }
    let mut decided = false;
    for (fd, kernel, events, data) in undecided {
        // Decided (by this drive, or by any path it took effect through: `refresh`): its
        // readiness is collected again (from the rings, or from the kernel), never reported
        // here as well (one call reports each entry once). A step that leaves the entry
        // undecided (connected: the handshake begins; timed out: a fallback skipping late CLC
        // messages) is reported below on this event: the registration is edge-triggered, and
        // no later event may come (a busy loop of `epoll_wait(0)` never saw its client
        // writable: 1 of 500 with a 1 ms CLC timer).
        let before = out_while_undecided(fd);
        let stepped = drive(fd);
        if lock(&set.inner)
            .entries
            .get(&fd)
            .is_none_or(|e| e.mode != Mode::Undecided)
        {
            decided = true;
            continue;
        }
        // Made writable by this step on an event without OUT (the peer's late message).
        let out_now = out_after_step(fd, before, events);
        decided |= stepped;
        // Established, handshake under way: writable as far as TCP goes (a write waits for the
        // decision with EAGAIN), never readable (CLC bytes are not data). Reported on the
        // kernel's edge; a one-shot entry hears of it when decided.
        // A fallback still skipping late CLC messages: its urgent data (out of band) is TCP's,
        // reported on the kernel's edge too.
        let (established, skipping) = match fdtable::get(fd).as_deref() {
            Some(Obj::Handshake(h)) => (h.out_while_undecided(), false),
            Some(Obj::Skip(_)) => (true, true),
            _ => (false, false),
        };
        let mut ev = 0;
        if established {
            ev |= kernel & events & OUT;
        }
        if out_now {
            ev |= OUT;
        }
        if skipping {
            ev |= kernel & events & PRI;
        }
        if ev != 0 && events & ONESHOT == 0 {
            out.push(libc::epoll_event {
                events: ev,
                u64: data,
            });
        }
    }
    decided
}

/// The sets registered in `set` ([`EpInner::nested`]) made kernel-ready when they have
/// something to report, before `set`'s kernel wait.
fn prepare_nested(set: &EpollSet, ep: i32) {
    let nested = {
        let g = lock(&set.inner);
        if g.nested.is_empty() {
            return;
        }
        g.nested.clone()
    };
    for n in nested {
        if n != ep {
            prepare_indirect(n, 1);
        }
    }
}

/// A wait on a set that had nothing of ours when it began ([`wants`]), passed straight to the
/// kernel: `kernel_wait` makes it (`epoll_wait`, `epoll_pwait`, `epoll_pwait2`), and what it
/// returns is checked for events of ours ([`after_plain_wait`]). `timeout_ms`: the wait's
/// timeout (ms, -1: for ever), asked only then.
///
/// # Safety
/// `events` is the caller's array of `max` entries, into which `kernel_wait` lets the kernel
/// write; `sigmask` the caller's signal mask or `None`.
pub unsafe fn plain_wait(
    ep: i32,
    events: *mut libc::epoll_event,
    max: i32,
    timeout_ms: impl FnOnce() -> i32,
    sigmask: Option<*const libc::sigset_t>,
    kernel_wait: impl FnOnce() -> i32,
) -> i32 {
    // Only when a registration of ours exists somewhere can the kernel return our tag.
    let start = ever_tagged().then(Instant::now);
    let r = kernel_wait();
    if r > 0 && ever_tagged() {
        let e0 = real::errno();
        let rem = || remaining_of(timeout_ms(), start);
        // SAFETY: the kernel wrote `r` entries of the caller's array of `max`.
        if let Some(r) = unsafe { after_plain_wait(ep, events, r, max, rem, sigmask) } {
            return r;
        }
        real::set_errno(e0);
    }
    r
}

/// What is left of a wait of `timeout` ms (-1: for ever) begun at `start` (unknown: all).
fn remaining_of(timeout: i32, start: Option<Instant>) -> i32 {
    match (timeout, start) {
        (t, _) if t <= 0 => t,
        (t, Some(s)) => (t as u128).saturating_sub(s.elapsed().as_millis()) as i32,
        (t, None) => t,
    }
}

/// A wait passed straight to the kernel (the set had nothing of ours when it began: [`wants`])
/// returned `n` events into `events`. Another thread may have made an entry of the set ours
/// meanwhile (an `EPOLL_CTL_ADD` of a connecting socket, a connect, a decided handshake): an
/// event of that registration carries our tag, not the application's data, and must not reach
/// it. `None` when no event was ours (the common case: one pass over the events); else what
/// the call returns instead, as [`wait`] would have: the application's events and the
/// readiness of ours, or, when that is nothing, a wait of `rem_ms` more.
///
/// # Safety
/// `events` is the caller's array of `max` entries, the first `n` written by the kernel.
unsafe fn after_plain_wait(
    ep: i32,
    events: *mut libc::epoll_event,
    n: i32,
    max: i32,
    rem_ms: impl FnOnce() -> i32,
    sigmask: Option<*const libc::sigset_t>,
) -> Option<i32> {
    if n <= 0 || events.is_null() || n > max {
        return None;
    }
    let ck = cookie();
    // SAFETY: the kernel wrote `n` (<= `max`) entries of the caller's array.
    let got = unsafe { std::slice::from_raw_parts(events, n as usize) };
    if !got.iter().any(|e| e.u64 & 0xFFFF_FFFF_0000_0000 == ck) {
        return None;
    }
    let kev = got.to_vec();
    let mut out = Vec::with_capacity(kev.len());
    let so = set_of(ep, false);
    match so.as_deref() {
        Some(Obj::Epoll(set)) => {
            translate(set, &kev, &mut out);
            let mut g = lock(&set.inner);
            let mut warm = Vec::new();
            collect(&mut g, ep, &mut out, max as usize, true, false, &mut warm);
        }
        // Not a set we know (cannot be: our tag is registered through one): ours dropped.
        _ => out.extend(kev.iter().filter(|e| e.u64 & 0xFFFF_FFFF_0000_0000 != ck)),
    }
    if !out.is_empty() {
        let k = out.len().min(max as usize);
        // SAFETY: the caller's array holds `max` entries; `k` <= `max`.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), events, k) };
        return Some(k as i32);
    }
    let rem = rem_ms();
    Some(match so {
        // SAFETY: the caller's array of `max` entries and signal mask, as for this function.
        Some(so) => unsafe { wait(&so, ep, events, max, rem, sigmask) },
        // SAFETY: as above.
        None => unsafe { real::epoll_wait(ep, events, max, rem) },
    })
}

/// Our epoll_wait / epoll_pwait.
///
/// # Safety
/// `events` is the caller's array of `max` entries.
pub unsafe fn wait(
    so: &Obj,
    ep: i32,
    events: *mut libc::epoll_event,
    max: i32,
    timeout: i32,
    sigmask: Option<*const libc::sigset_t>,
) -> i32 {
    if max <= 0 || max as usize > EP_MAX_EVENTS {
        real::set_errno(libc::EINVAL);
        return -1;
    }
    if (events as usize) < 0x1_0000 {
        // NULL or a small integer (below `vm.mmap_min_addr`): the kernel's copy of the first
        // event faults (it waits first when nothing is ready; we say it at once).
        real::set_errno(libc::EFAULT);
        return -1;
    }
    // As the kernel's access_ok() on the whole array: one that would reach past the user
    // address space is EFAULT, whatever is ready (x86-64 with 4-level page tables; with 5
    // levels the kernel's limit is higher and this says EFAULT a little early).
    const USER_END: usize = (1 << 47) - 4096;
    let bytes = max as usize * std::mem::size_of::<libc::epoll_event>();
    if (events as usize)
        .checked_add(bytes)
        .is_none_or(|end| end > USER_END)
    {
        real::set_errno(libc::EFAULT);
        return -1;
    }
    let set = as_set(so);
    set.waited_once.store(true, Ordering::Relaxed);
    let max = max as usize;
    let deadline = ready::deadline_ms(timeout);
    // At most KBUF events per call from the kernel (the rest stay queued there for the next
    // call, as with a smaller maxevents): a huge maxevents must not allocate its size.
    let mut out: Vec<libc::epoll_event> = Vec::with_capacity(max.min(KBUF));
    let mut kbuf: Vec<libc::epoll_event> =
        vec![libc::epoll_event { events: 0, u64: 0 }; max.min(KBUF)];
    let kwait_n = |kbuf: &mut Vec<libc::epoll_event>,
                   n: usize,
                   t: i32,
                   mask: Option<*const libc::sigset_t>|
     -> i32 {
        let n = n.min(kbuf.len()) as i32;
        match mask {
            // SAFETY: `kbuf` holds at least `n` writable epoll_events (`n` clamped to its length
            // above).
            None => unsafe { real::epoll_wait(ep, kbuf.as_mut_ptr(), n, t) },
            // SAFETY: as above; `m` is the caller's signal mask, passed on unchanged.
            Some(m) => unsafe { real::epoll_pwait(ep, kbuf.as_mut_ptr(), n, t, m) },
        }
    };
    let kwait = |kbuf: &mut Vec<libc::epoll_event>, t: i32, mask: Option<*const libc::sigset_t>| {
        let n = kbuf.len();
        kwait_n(kbuf, n, t, mask)
    };
    // Copies the events out. Another thread asleep on the set is woken while entries remain on
    // the ready list (left unchecked at `max`, or level-triggered and ready: TCP's entry
    // stays on the kernel's ready list and wakes the next waiter too).
    let finish = |out: &Vec<libc::epoll_event>| -> i32 {
        let n = out.len().min(max);
        // SAFETY: the caller's array holds max entries.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), events, n) };
        if set.sleeping.load(Ordering::SeqCst) > 0 {
            let first = lock(&set.inner).ready.front().copied();
            if let Some(fd) = first {
                kick(ep, fd);
            }
        }
        n as i32
    };
    let mut spun = false;
    let mut warm: Vec<Warm> = Vec::new();
    loop {
        let before = set.last_sharing.load(Ordering::Relaxed);
        let sharing = set.sharing();
        out.clear();
        warm.clear();
        {
            let mut g = lock(&set.inner);
            if sharing == Sharing::Shared || before == Sharing::Shared as u32 {
                // Shared: the other process may have taken any entry's event from the kernel.
                // Just unshared: what it took meanwhile is found by one full check.
                all_hot(&mut g);
            }
            collect(&mut g, ep, &mut out, max, true, false, &mut warm)
        };
        if !out.is_empty() || timeout == 0 {
            if timeout == 0 {
                prepare_nested(set, ep);
            }
            // A handshake decided here may make its fd ready at once (from the rings, or from
            // the kernel after its re-registration): one more round then.
            for round in 0..2 {
                let room = max - out.len();
                if room == 0 {
                    break;
                }
                // Only as many kernel events as there is room for: the kernel keeps the others
                // (an edge-triggered plain fd's event dropped here would be lost for good).
                let r = kwait_n(&mut kbuf, room, 0, None);
                let had = out.len();
                let decided = r > 0 && translate(set, &kbuf[..r as usize], &mut out);
                if round > 0 {
                    // The kernel reports a level-triggered entry that is still ready again: one
                    // call reports each entry once (`ep_send_events`). An event equal to one
                    // already here (same data, same mask) tells the program nothing new.
                    let mut i = had;
                    while i < out.len() {
                        let e = out[i];
                        if out[..had]
                            .iter()
                            .any(|x| x.u64 == e.u64 && x.events == e.events)
                        {
                            out.remove(i);
                        } else {
                            i += 1;
                        }
                    }
                }
                if r > 0 && out.len() < max {
                    // The entries the kernel just reported (each checked once per call).
                    let mut g = lock(&set.inner);
                    collect(&mut g, ep, &mut out, max, false, false, &mut warm);
                }
                if !decided {
                    break;
                }
            }
            return finish(&out);
        }
        // Doorbells another waiter of the connection had to drain: drained before anything is
        // parked (the drain may find the peer gone, which no new event would tell).
        let undrained = std::mem::take(&mut lock(&set.inner).undrained);
        if !undrained.is_empty() {
            let mut pending: Vec<(Arc<Obj>, i32, u32)> =
                undrained.into_iter().map(|(fd, o, s)| (o, fd, s)).collect();
            ready::settle(&mut pending, || {
                deadline.is_some() && ready::remaining_ms(deadline) == 0
            });
            continue;
        }
        // Spinning is for the rings of the entries just found idle (the others are armed:
        // their peers ring). Events the kernel reports meanwhile (other connections' doorbells)
        // end the spin but do not count as its success: with many connections they come every
        // few µs, and counting them would keep every wait spinning (a core busy for events
        // that a sleep would have waited for just as well).
        if !spun && !warm.is_empty() {
            spun = true;
            let budget = ready::spin_budget();
            if budget > 0 {
                let start = Instant::now();
                let mut hit = false;
                let mut warm_hit = false;
                let mut i = 0u32;
                while (start.elapsed().as_nanos() as u64) < budget {
                    let moved = warm.iter().any(|(o, want, had)| {
                        o.conn().is_some_and(|c| ready::conn_mask(c) & want != *had)
                    });
                    i += 1;
                    if moved || i & 31 == 0 {
                        let r = if moved { 0 } else { kwait(&mut kbuf, 0, None) };
                        if r > 0 {
                            translate(set, &kbuf[..r.max(0) as usize], &mut out);
                        }
                        if moved || r > 0 {
                            let mut w2 = Vec::new();
                            let mut g = lock(&set.inner);
                            collect(&mut g, ep, &mut out, max, true, false, &mut w2);
                            if !out.is_empty() {
                                hit = true;
                                warm_hit = moved;
                                break;
                            }
                        }
                    }
                    if crate::conn::spin_pause(i) {
                        break;
                    }
                }
                ready::spin_result(warm_hit);
                if hit {
                    return finish(&out);
                }
            }
        }
        // Park every entry still on the list (arm, recheck); one found ready is reported.
        {
            let mut g = lock(&set.inner);
            let mut w2 = Vec::new();
            collect(&mut g, ep, &mut out, max, true, true, &mut w2);
        }
        if !out.is_empty() {
            return finish(&out);
        }
        let rem = ready::remaining_ms(deadline);
        if deadline.is_some() && rem == 0 {
            return 0;
        }
        let ticking = set.undecided.load(Ordering::Relaxed) > 0;
        let mut cap = if ticking { ready::HS_TICK_MS } else { -1 };
        let tick = match sharing {
            Sharing::Alone => -1,
            Sharing::Forked => FORKED_TICK_MS,
            Sharing::Shared => SHARED_TICK_MS,
        };
        if tick >= 0 && (cap < 0 || tick < cap) {
            cap = tick;
        }
        // An entry kept after its number closed cannot be kicked (its registration has no
        // number any more): a change of ours without the peer (a shutdown) is seen at a tick.
        if !lock(&set.inner).closed.is_empty() && !(0..=KEPT_TICK_MS).contains(&cap) {
            cap = KEPT_TICK_MS;
        }
        let t = if cap >= 0 && !(0..=cap).contains(&rem) {
            cap
        } else {
            rem
        };
        prepare_nested(set, ep);
        set.sleeping.fetch_add(1, Ordering::SeqCst);
        let r = kwait(&mut kbuf, t, sigmask);
        set.sleeping.fetch_sub(1, Ordering::SeqCst);
        if r < 0 {
            return r;
        }
        let decided = translate(set, &kbuf[..r as usize], &mut out);
        if r == 0 && ticking {
            drive_all(set, &mut out);
        }
        let room = max.saturating_sub(out.len());
        if room > 0 {
            let mut g = lock(&set.inner);
            collect(&mut g, ep, &mut out, max, true, false, &mut warm);
        }
        if !out.is_empty() {
            return finish(&out);
        }
        if deadline.is_some() && ready::remaining_ms(deadline) == 0 {
            return 0;
        }
        let _ = decided;
    }
}
