//! epoll emulation for SMC connections.
//!
//! An SMC fd is registered with the kernel for `EPOLLIN | EPOLLRDHUP` only (doorbells and the
//! channel's EOF wake us) with our own tag as `epoll_data`; the application's events and data
//! are kept here. `epoll_wait` computes readiness from the rings, emulates `EPOLLET` (a new edge
//! only when the peer moved a cursor or a flag since the last report) and `EPOLLONESHOT`, and
//! hands back the application's data. Sockets that may still become SMC are tracked too: a
//! TCP socket not yet connected is registered as the application asked; one whose connect or
//! handshake is under way (`Pending`, `Handshake`) is registered with our tag, edge-triggered,
//! and its events drive the handshake instead of reaching the application (the CLC messages
//! must not look like data: TCP reports `EPOLLIN` only for the peer's bytes). Once decided the
//! fd is emulated (SMC) or registered as the application asked again (TCP).

use crate::fdtable::{self, Slot};
use crate::forklock::ForkMutex;
use crate::forklock::ForkOnce;
use crate::obj::Obj;
use crate::poll::{self, ERR, HUP, IN, RDHUP};
use crate::real;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

const ET: u32 = libc::EPOLLET as u32;
const ONESHOT: u32 = libc::EPOLLONESHOT as u32;
/// The kernel's limit on maxevents (`INT_MAX / sizeof(struct epoll_event)`).
const EP_MAX_EVENTS: usize = i32::MAX as usize / std::mem::size_of::<libc::epoll_event>();
/// Kernel events fetched per call at most.
const KBUF: usize = 1024;

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

/// How an entry is registered with the kernel.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// As the application asked (its events and data): plain TCP or a candidate not connected.
    App,
    /// Connect or handshake under way: our tag, edge-triggered; nothing reaches the application.
    Undecided,
    /// An SMC connection: our tag, readiness computed from the rings.
    Emulated,
}

pub struct Entry {
    events: u32,
    data: u64,
    mode: Mode,
    /// The connection, once the fd is SMC (emulated); `None` while it is only a candidate.
    obj: Option<Arc<Obj>>,
    last_token: (u64, u64),
    last_mask: u32,
    disabled: bool,
}

#[derive(Default)]
pub struct EpInner {
    entries: HashMap<i32, Entry>,
    /// fds of emulated entries, for a fair scan.
    order: Vec<i32>,
    rr: usize,
}

#[derive(Default)]
pub struct EpollSet {
    inner: Mutex<EpInner>,
    /// Emulated entries.
    smc: AtomicUsize,
    /// Undecided entries (their events are ours to handle).
    undecided: AtomicUsize,
    /// A registration with our tag was made: from then on every wait is ours, so that an event
    /// still carrying the tag (queued before its entry went) never reaches the application.
    tagged: AtomicBool,
}

/// While a handshake of the set is undecided, a blocking wait wakes at least this often to let
/// handshakes whose peer went quiet time out (and fall back) as they would in a read.
const HS_TICK_MS: i32 = 100;

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
        _ => (Mode::App, None),
    }
}

/// The kernel registration for `mode`.
fn kernel_event(fd: i32, mode: Mode, events: u32, data: u64) -> libc::epoll_event {
    match mode {
        Mode::App => libc::epoll_event { events, u64: data },
        Mode::Emulated => libc::epoll_event {
            events: IN | RDHUP,
            u64: tag(fd),
        },
        // Connect completion (OUT) and the peer's CLC messages (IN), each edge once.
        Mode::Undecided => libc::epoll_event {
            events: IN | libc::EPOLLOUT as u32 | RDHUP | ET,
            u64: tag(fd),
        },
    }
}

/// Count an entry's mode in and out of the set's tallies.
fn tally(set: &EpollSet, g: &mut EpInner, fd: i32, mode: Mode, add: bool) {
    if add && mode != Mode::App {
        set.tagged.store(true, Ordering::Relaxed);
    }
    match mode {
        Mode::App => {}
        Mode::Emulated => {
            if add {
                g.order.push(fd);
                set.smc.fetch_add(1, Ordering::Relaxed);
            } else {
                g.order.retain(|&x| x != fd);
                set.smc.fetch_sub(1, Ordering::Relaxed);
            }
        }
        Mode::Undecided => {
            if add {
                set.undecided.fetch_add(1, Ordering::Relaxed);
            } else {
                set.undecided.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// fd -> epoll fds that track it.
static MEMBERS: ForkMutex<HashMap<i32, Vec<i32>>> = ForkMutex::new(HashMap::new);
static CREATE: ForkMutex<()> = ForkMutex::new(|| ());

fn members() -> &'static ForkMutex<HashMap<i32, Vec<i32>>> {
    &MEMBERS
}

pub(crate) fn after_fork_locks() {
    MEMBERS.after_fork();
    CREATE.after_fork();
}
static MEMBERS_N: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// Our epoll_ctl. Returns `None` when the call is not ours (pass it through).
///
/// # Safety
/// `ev` is the caller's pointer.
pub unsafe fn ctl(ep: i32, op: i32, fd: i32, ev: *mut libc::epoll_event) -> Option<i32> {
    let raw = fdtable::raw(fd) & !1;
    let obj = if raw >= 8 { fdtable::get(fd) } else { None };
    let emulated = obj.as_ref().is_some_and(|o| o.conn().is_some());
    let candidate = raw == fdtable::TAG_TCP
        || obj
            .as_ref()
            .is_some_and(|o| matches!(&**o, Obj::Pending(_) | Obj::Handshake(_)));
    if !emulated && !candidate {
        if op == libc::EPOLL_CTL_DEL && MEMBERS_N.load(Ordering::Relaxed) > 0 {
            if let Some(so) = set_of(ep, false) {
                forget(as_set(&so), ep, fd);
            }
        }
        return None;
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
            if let Some(old) = g.entries.remove(&fd) {
                tally(set, &mut g, fd, old.mode, false);
            }
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
                },
            );
            tally(set, &mut g, fd, mode, true);
            let mut m = members().lock();
            let v = m.entry(fd).or_default();
            if !v.contains(&ep) {
                v.push(ep);
                MEMBERS_N.fetch_add(1, Ordering::Relaxed);
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
                    tally(set, &mut g, fd, old, false);
                    tally(set, &mut g, fd, mode, true);
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
    if let Some(e) = g.entries.remove(&fd) {
        tally(set, g, fd, e.mode, false);
    }
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
/// events would reach the application with our tag as its data (nginx took it for a pointer).
pub fn on_close(fd: i32, live: bool) {
    if MEMBERS_N.load(Ordering::Relaxed) == 0 {
        return;
    }
    let eps = members().lock().remove(&fd).unwrap_or_default();
    MEMBERS_N.fetch_sub(eps.len(), Ordering::Relaxed);
    for ep in eps {
        if let Some(so) = set_of(ep, false) {
            let set = as_set(&so);
            let mut g = lock(&set.inner);
            let ours = g.entries.get(&fd).is_some_and(|e| e.mode != Mode::App);
            remove_entry(set, &mut g, fd);
            if ours && live {
                let mut kev = libc::epoll_event { events: 0, u64: 0 };
                // SAFETY: valid event; `fd` is still open (closed after this returns).
                unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_DEL, fd, &mut kev) };
            }
        }
    }
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
        let Some(so) = set_of(ep, false) else {
            continue;
        };
        let set = as_set(&so);
        let mut g = lock(&set.inner);
        let Some(e) = g.entries.get(&fd) else {
            continue;
        };
        let (events, data, old) = (e.events, e.data, e.mode);
        let (mode, obj) = mode_of(fd, events);
        if mode == old {
            // Emulated stays with the connection it has (a dup'd fd shares it).
            continue;
        }
        let mut kev = kernel_event(fd, mode, events, data);
        let e0 = real::errno();
        // SAFETY: valid event.
        let mut r = unsafe { real::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut kev) };
        if r != 0 && events & libc::EPOLLEXCLUSIVE as u32 != 0 {
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
            continue;
        }
        tally(set, &mut g, fd, old, false);
        tally(set, &mut g, fd, mode, true);
        if let Some(e) = g.entries.get_mut(&fd) {
            e.mode = mode;
            e.obj = obj;
            e.last_token = (0, 0);
            e.last_mask = 0;
        }
    }
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
            crate::ops::resolve_pending(fd);
            !matches!(fdtable::get(fd).as_deref(), Some(Obj::Pending(_)))
        }
        Obj::Handshake(h) => crate::setup::progress(fd, h, false),
        _ => true,
    };
    // A state reached by any path (progress, resolve, another thread) takes effect here.
    refresh(fd);
    decided
}

/// Drive every undecided entry of the set (a tick: CLC timeouts are checked as they go).
fn drive_all(set: &EpollSet) -> bool {
    if set.undecided.load(Ordering::Relaxed) == 0 {
        return false;
    }
    let fds: Vec<i32> = lock(&set.inner)
        .entries
        .iter()
        .filter(|(_, e)| e.mode == Mode::Undecided)
        .map(|(&fd, _)| fd)
        .collect();
    let mut any = false;
    for fd in fds {
        any |= drive(fd);
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

/// Fill `out` with ready emulated entries (ET/ONESHOT rules), at most `max`.
fn collect(set: &EpollSet, out: &mut Vec<libc::epoll_event>, max: usize, arm: bool) {
    let mut g = lock(&set.inner);
    let n = g.order.len();
    if n == 0 {
        return;
    }
    let start = g.rr % n;
    let mut advanced = 0;
    for i in 0..n {
        if out.len() >= max {
            break;
        }
        let fd = g.order[(start + i) % n];
        let Some(e) = g.entries.get_mut(&fd) else {
            continue;
        };
        if e.disabled {
            continue;
        }
        let Some(o) = &e.obj else { continue };
        let Some(c) = o.conn() else { continue };
        let want = e.events | ERR | HUP;
        let mask = if arm {
            poll::arm(c, fd, e.events)
        } else {
            poll::conn_mask(c)
        } & want;
        if mask == 0 {
            e.last_mask = 0;
            continue;
        }
        if e.events & ET != 0 {
            let tok = c.edge_token();
            if tok == e.last_token && mask & !e.last_mask == 0 {
                continue;
            }
            e.last_token = tok;
            e.last_mask = mask;
        }
        if e.events & ONESHOT != 0 {
            e.disabled = true;
        }
        out.push(libc::epoll_event {
            events: mask,
            u64: e.data,
        });
        advanced = i + 1;
    }
    g.rr = start + advanced;
}

/// Drain doorbells of the emulated fds the kernel reported, drive the handshakes of the
/// undecided ones, pass plain events on. True when a handshake was decided (its fd's readiness
/// is then to be collected again: from the rings, or from the kernel after its re-registration).
///
/// The emulated fds the kernel reported (their doorbells rang) go to `rang` when given, else
/// their doorbells are drained unless another thread sleeps on the socket (it was woken by them
/// and drains them: [`crate::conn::Conn::sleep_enter`]).
fn translate(
    set: &EpollSet,
    kev: &[libc::epoll_event],
    out: &mut Vec<libc::epoll_event>,
    mut rang: Option<&mut Vec<(i32, Arc<Obj>)>>,
) -> bool {
    let ck = cookie();
    let mut g = None;
    let mut undecided = Vec::new();
    for k in kev {
        let d = k.u64;
        if d & 0xFFFF_FFFF_0000_0000 == ck {
            let fd = d as u32 as i32;
            let g = g.get_or_insert_with(|| lock(&set.inner));
            match g.entries.get(&fd) {
                Some(Entry {
                    mode: Mode::Emulated,
                    obj,
                    ..
                }) => {
                    if let Some(o) = obj.as_ref().filter(|o| o.conn().is_some()) {
                        match rang.as_deref_mut() {
                            Some(r) => r.push((fd, o.clone())),
                            None => {
                                if let Some(c) = o.conn() {
                                    c.try_drain(fd);
                                }
                            }
                        }
                    }
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
    let mut decided = false;
    for (fd, kernel, events, data) in undecided {
        if drive(fd) {
            decided = true;
            continue;
        }
        // Established, handshake under way: writable as far as TCP goes (a write waits for the
        // decision with EAGAIN), never readable (CLC bytes are not data). Reported on the
        // kernel's edge; a one-shot entry hears of it when decided.
        let out_ev = libc::EPOLLOUT as u32;
        let established = matches!(fdtable::get(fd).as_deref(), Some(Obj::Handshake(h)) if h.out_while_undecided());
        if established && kernel & events & out_ev != 0 && events & ONESHOT == 0 {
            out.push(libc::epoll_event {
                events: out_ev,
                u64: data,
            });
        }
    }
    decided
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
    if max <= 0 || events.is_null() {
        real::set_errno(libc::EINVAL);
        return -1;
    }
    if max as usize > EP_MAX_EVENTS {
        real::set_errno(libc::EINVAL);
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
    let max = max as usize;
    let deadline = poll::deadline_ms(timeout);
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
    let finish = |out: &Vec<libc::epoll_event>| -> i32 {
        let n = out.len().min(max);
        // SAFETY: the caller's array holds max entries.
        unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), events, n) };
        n as i32
    };
    let mut spun = false;
    loop {
        out.clear();
        collect(set, &mut out, max, false);
        if !out.is_empty() || timeout == 0 {
            // A handshake decided here may make its fd ready at once (from the rings, or from
            // the kernel after its re-registration): one more round then.
            for _ in 0..2 {
                let room = max - out.len();
                if room == 0 {
                    break;
                }
                // Only as many kernel events as there is room for: the kernel keeps the others
                // (an edge-triggered plain fd's event dropped here would be lost for good).
                let r = kwait_n(&mut kbuf, room, 0, None);
                let decided = r > 0 && translate(set, &kbuf[..r as usize], &mut out, None);
                if out.is_empty() {
                    // Doorbells may have made something ready.
                    collect(set, &mut out, max, false);
                }
                if !decided {
                    break;
                }
            }
            return finish(&out);
        }
        // Spinning is for the rings; a set of plain fds only (its connections gone, or still
        // in their handshakes) sleeps in the kernel at once.
        if !spun && set.smc.load(Ordering::Relaxed) > 0 {
            spun = true;
            let budget = poll::spin_budget();
            if budget > 0 {
                let start = Instant::now();
                let mut hit = false;
                let mut i = 0u32;
                while (start.elapsed().as_nanos() as u64) < budget {
                    collect(set, &mut out, max, false);
                    if !out.is_empty() {
                        hit = true;
                        break;
                    }
                    i += 1;
                    if i & 31 == 0 {
                        let r = kwait(&mut kbuf, 0, None);
                        if r > 0 {
                            translate(set, &kbuf[..r as usize], &mut out, None);
                            collect(set, &mut out, max, false);
                            if !out.is_empty() {
                                hit = true;
                                break;
                            }
                        }
                    }
                    crate::conn::spin_pause(i);
                }
                poll::spin_result(hit);
                if hit {
                    return finish(&out);
                }
            }
        }
        // Register as a sleeper on every emulated socket, arm every emulated entry and
        // recheck.
        let sleepers = sleepers(set);
        for (_, o) in &sleepers {
            if let Some(c) = o.conn() {
                c.sleep_enter();
            }
        }
        let leave = |rang: &[(i32, Arc<Obj>)]| {
            let mut pending = Vec::new();
            for (fd, o) in &sleepers {
                if let Some(c) = o.conn() {
                    if c.sleep_leave(*fd, rang.iter().any(|(r, _)| r == fd)) {
                        pending.push((o.clone(), *fd, c.wake_seq()));
                    }
                }
            }
            // Sockets the kernel watches for an entry we did not wait on (a disabled
            // one-shot entry): drained as well, or the next sleep would return at once.
            for (fd, o) in rang {
                if !sleepers.iter().any(|(s, _)| s == fd) {
                    if let Some(c) = o.conn() {
                        if !c.try_drain(*fd) {
                            pending.push((o.clone(), *fd, c.wake_seq()));
                        }
                    }
                }
            }
            pending
        };
        out.clear();
        collect(set, &mut out, max, true);
        if !out.is_empty() {
            leave(&[]);
            return finish(&out);
        }
        let rem = poll::remaining_ms(deadline);
        if deadline.is_some() && rem == 0 {
            leave(&[]);
            return 0;
        }
        let ticking = set.undecided.load(Ordering::Relaxed) > 0;
        let t = if ticking && !(0..=HS_TICK_MS).contains(&rem) {
            HS_TICK_MS
        } else {
            rem
        };
        let r = kwait(&mut kbuf, t, sigmask);
        if r < 0 {
            leave(&[]);
            return r;
        }
        let mut rang = Vec::new();
        let decided = translate(set, &kbuf[..r as usize], &mut out, Some(&mut rang));
        // The last sleeper of a socket drains its doorbells; those left to other sleepers
        // must be gone before we sleep on that socket again.
        let mut pending = leave(&rang);
        if r == 0 && ticking {
            drive_all(set);
        }
        let room = max.saturating_sub(out.len());
        if room > 0 {
            let mut mine = Vec::new();
            collect(set, &mut mine, room, false);
            out.extend(mine);
        }
        if !out.is_empty() {
            return finish(&out);
        }
        if deadline.is_some() && poll::remaining_ms(deadline) == 0 {
            return 0;
        }
        if decided {
            continue;
        }
        let ready = poll::settle(&mut pending, || {
            collect(set, &mut out, max, false);
            !out.is_empty() || (deadline.is_some() && poll::remaining_ms(deadline) == 0)
        });
        if ready {
            return finish(&out);
        }
    }
}

/// The emulated entries of `set` that a sleep waits on.
fn sleepers(set: &EpollSet) -> Vec<(i32, Arc<Obj>)> {
    let g = lock(&set.inner);
    g.order
        .iter()
        .filter_map(|fd| {
            let e = g.entries.get(fd)?;
            if e.disabled || e.mode != Mode::Emulated {
                return None;
            }
            let o = e.obj.as_ref()?;
            o.conn()?;
            Some((*fd, o.clone()))
        })
        .collect()
}
