//! The per-fd table: a lock-free two-level array indexed by fd.
//!
//! Each slot is one `AtomicUsize`:
//! - `0`: nothing known, the fd goes straight to libc (the fast path: two loads);
//! - a small even tag below 8 ([`TAG_TCP`]): a TCP socket created by `socket()` that may opt in;
//! - otherwise an `Arc<Obj>` pointer (`Arc::into_raw`, 8-byte aligned) whose bit 0 is a tiny
//!   per-slot lock, held only while the strong count is bumped. No global lock anywhere.
//!
//! While a thread forks, the other threads' changes of slots wait ([`freeze_for_fork`]), so
//! that the references `fork` counts for the child are exactly the objects in the child's
//! copy of the table.
//!
//! Besides: our private numbers ([`Obj::Private`], [`set_private`]), and [`InCall`], a call in
//! flight on a connection through a number (as the kernel's `fdget`).

use crate::conn::Conn;
use crate::forklock::ForkOnce;
use crate::obj::Obj;
use crate::real;
use crate::util::unwound;
use std::cell::Cell;
use std::mem::ManuallyDrop;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

const CHUNK_BITS: usize = 12;
const CHUNK: usize = 1 << CHUNK_BITS;
const TOP: usize = 1024;
/// Highest fd + 1 that the table can describe (4 Mi); larger fds are always passed through.
pub const MAX_FDS: usize = CHUNK * TOP;

/// An `AF_INET`/`AF_INET6` `SOCK_STREAM` socket created through our `socket()`.
pub const TAG_TCP: usize = 2;
/// Our private duplicate of a socket made by a program's signal handler's close, whose
/// [`Obj::Private`] comes at the next call into the library (`ops::unpark_closes`).
pub const TAG_PRIVATE_PENDING: usize = 4;

type Chunk = [AtomicUsize; CHUNK];

static TABLE: [AtomicPtr<Chunk>; TOP] = [const { AtomicPtr::new(ptr::null_mut()) }; TOP];
/// Number of slots holding an object (any kind), to skip scans when zero.
static OBJECTS: AtomicUsize = AtomicUsize::new(0);

/// What the epoll emulation must hear of a number whose object changes (as [`crate::conn::Hooks`]
/// for a connection's readiness): registered with the first epoll set of the process; unset, no
/// set tracks any number and there is nothing to tell.
pub struct Hooks {
    /// `fd`'s object changed (connect under way, handshake started or decided, converted,
    /// fallen back): its epoll registrations are brought in line (`epoll::refresh`).
    pub refresh: fn(i32),
    /// Whether an epoll set of this process tracks `fd` (`epoll::is_member`).
    pub is_member: fn(i32) -> bool,
}

static HOOKS: ForkOnce<Hooks> = ForkOnce::new();

/// Registers the epoll emulation's [`Hooks`] (the first registration stays).
pub fn set_hooks(h: Hooks) {
    let _ = HOOKS.set(h);
}

/// `fd`'s object changed: see [`Hooks::refresh`].
pub fn epoll_refresh(fd: i32) {
    if let Some(h) = HOOKS.get() {
        (h.refresh)(fd);
    }
}

/// See [`Hooks::is_member`].
pub fn epoll_member(fd: i32) -> bool {
    HOOKS.get().is_some_and(|h| (h.is_member)(fd))
}

/// What a slot holds.
pub enum Slot {
    Empty,
    Tag(usize),
    Obj(Arc<Obj>),
}

#[inline]
fn slot(fd: i32) -> Option<&'static AtomicUsize> {
    if fd < 0 || fd as usize >= MAX_FDS {
        return None;
    }
    let fd = fd as usize;
    let c = TABLE[fd >> CHUNK_BITS].load(Ordering::Acquire);
    if c.is_null() {
        return None;
    }
    // SAFETY: chunks are never freed.
    Some(unsafe { &(*c)[fd & (CHUNK - 1)] })
}

fn slot_alloc(fd: i32) -> Option<&'static AtomicUsize> {
    if fd < 0 || fd as usize >= MAX_FDS {
        return None;
    }
    let fdu = fd as usize;
    let top = &TABLE[fdu >> CHUNK_BITS];
    if top.load(Ordering::Acquire).is_null() {
        let fresh: Box<Chunk> = Box::new([const { AtomicUsize::new(0) }; CHUNK]);
        let p = Box::into_raw(fresh);
        if top
            .compare_exchange(ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // SAFETY: we just allocated it and nobody saw it.
            drop(unsafe { Box::from_raw(p) });
        }
    }
    slot(fd)
}

/// Whether `fd` has a slot already ([`replace`] of a tag there allocates nothing).
pub fn has_slot(fd: i32) -> bool {
    slot(fd).is_some()
}

/// The raw slot value: `0` for "nothing known". The hot path checks this first.
#[inline]
pub fn raw(fd: i32) -> usize {
    match slot(fd) {
        Some(s) => s.load(Ordering::Acquire),
        None => 0,
    }
}

/// [`raw`] as a sequentially consistent load (the check of a call that registered on an object,
/// against a close that empties the slot and then looks for calls: `InCall`).
#[inline]
pub fn raw_seqcst(fd: i32) -> usize {
    match slot(fd) {
        Some(s) => s.load(Ordering::SeqCst),
        None => 0,
    }
}

/// Takes a slot's lock bit. A program's signal handler that comes meanwhile waits until
/// [`unlock`] (`signals::crit_enter`): one that called us on the same fd would spin for ever on
/// the bit its own thread holds (red team rt13 `rt13_sigio.c`: a `SIGIO` handler's `recv` while
/// the interrupted `send` looked up the same fd).
fn lock(s: &AtomicUsize) -> usize {
    crate::signals::crit_enter();
    let mut spins = 0u32;
    loop {
        let v = s.load(Ordering::Acquire);
        if v & 1 == 0
            && s.compare_exchange_weak(v, v | 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return v;
        }
        spins += 1;
        if spins > 64 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Releases a slot's lock bit taken by [`lock`], storing `v`.
fn unlock(s: &AtomicUsize, v: usize) {
    s.store(v, Ordering::Release);
    crate::signals::crit_exit();
}

/// The object of `fd`, if any (its strong count bumped).
#[inline]
pub fn get(fd: i32) -> Option<Arc<Obj>> {
    let s = slot(fd)?;
    let v0 = s.load(Ordering::Acquire);
    if v0 < 8 {
        return None;
    }
    let v = lock(s);
    if v < 8 {
        unlock(s, v);
        return None;
    }
    let p = v as *const Obj;
    // SAFETY: the slot owns one strong count of this Arc and we hold the slot lock, so it is
    // alive; we add one for the caller.
    let a = unsafe {
        Arc::increment_strong_count(p);
        Arc::from_raw(p)
    };
    unlock(s, v);
    Some(a)
}

/// 1 while a thread forks ([`freeze_for_fork`]): other threads' [`replace`] waits.
static FROZEN: AtomicU32 = AtomicU32::new(0);

thread_local! {
    /// This thread froze the table (its own changes, e.g. from `pthread_atfork` handlers that
    /// run inside `fork`, go through).
    static FREEZER: Cell<bool> = const { Cell::new(false) };
}

fn frozen_for_me() -> bool {
    FROZEN.load(Ordering::SeqCst) != 0 && !FREEZER.with(Cell::get)
}

fn wait_thawed() {
    while frozen_for_me() {
        crate::shm::futex_wait(&FROZEN, 1, 10);
    }
}

/// The table stands still for other threads until this is dropped (see [`freeze_for_fork`]);
/// `false`: a nested freeze, which leaves the outer one in place.
pub struct Frozen(bool);

impl Drop for Frozen {
    fn drop(&mut self) {
        if self.0 {
            FREEZER.with(|f| f.set(false));
            FROZEN.store(0, Ordering::SeqCst);
            crate::shm::futex_wake(&FROZEN, i32::MAX);
        }
    }
}

/// Before `fork`: makes every other thread's slot change ([`replace`]) wait until the returned
/// guard is dropped (after the fork, in the parent; in the child it only resets the state), and
/// waits for the changes already under way. `fork` counts a reference for each connection in
/// the table before it forks (the child's copy of the table names them): a connection another
/// thread installed (or dup'd) between that count and the fork reached the child uncounted, and
/// the child's close of it (a program closing its inherited descriptors before `exec`) was
/// then taken for the last one: the peer was told the connection closed while the parent still
/// used it, and its stream ended early without an error (seen with the fork stress test). Reads
/// and writes do not change slots and never wait.
pub fn freeze_for_fork() -> Frozen {
    if FREEZER.with(Cell::get) {
        // Nested (a fork from an atfork handler of our own fork): already frozen by us.
        return Frozen(false);
    }
    while FROZEN
        .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        // Another thread forks: after it.
        crate::shm::futex_wait(&FROZEN, 1, 10);
    }
    FREEZER.with(|f| f.set(true));
    // Pairs with the fence in `replace`: a chunk published by a thread that still saw the
    // table unfrozen is seen by the walk below.
    fence(Ordering::SeqCst);
    // A change that saw the table unfrozen holds its slot's lock until it is stored: taking
    // every slot's lock once waits for it.
    for t in TABLE.iter() {
        let c = t.load(Ordering::Acquire);
        if c.is_null() {
            continue;
        }
        // SAFETY: chunks are never freed.
        let chunk = unsafe { &*c };
        for s in chunk.iter() {
            let v = lock(s);
            unlock(s, v);
        }
    }
    Frozen(true)
}

/// Replaces `fd`'s slot with `new` only while it still holds `expect` (the same object, not
/// another one the number was given since: a socket's identity, not its number); false, and
/// nothing changed, otherwise. Waits while another thread forks, as [`replace`].
pub fn replace_if(fd: i32, expect: &Arc<Obj>, new: Slot) -> bool {
    let want = Arc::as_ptr(expect) as usize;
    match swap(fd, new, Some(want)) {
        Ok(old) => {
            drop(old);
            true
        }
        Err(new) => {
            drop(new);
            false
        }
    }
}

/// Replace the content of `fd`'s slot, returning what was there. Waits while another thread
/// forks ([`freeze_for_fork`]).
pub fn replace(fd: i32, new: Slot) -> Slot {
    match swap(fd, new, None) {
        Ok(old) | Err(old) => old,
    }
}

/// [`replace`], only while the slot's content is `expect` when that is given: `Err(new)` back
/// otherwise (also when there is no slot for `fd`: `Err` of what would not be stored).
fn swap(fd: i32, new: Slot, expect: Option<usize>) -> Result<Slot, Slot> {
    let s = match &new {
        Slot::Empty => slot(fd),
        _ => slot_alloc(fd),
    };
    let Some(s) = s else {
        return if expect.is_some() {
            Err(new)
        } else {
            Ok(Slot::Empty)
        };
    };
    let old = loop {
        let v = lock(s);
        // Pairs with the fence in `freeze_for_fork` (see there).
        fence(Ordering::SeqCst);
        if expect.is_some_and(|e| e != v) {
            unlock(s, v);
            return Err(new);
        }
        if !frozen_for_me() {
            break v;
        }
        unlock(s, v);
        wait_thawed();
    };
    let nv = match new {
        Slot::Empty => 0,
        Slot::Tag(t) => t,
        Slot::Obj(a) => {
            OBJECTS.fetch_add(1, Ordering::Relaxed);
            if let Some(c) = a.conn() {
                c.count_number(true);
            }
            Arc::into_raw(a) as usize
        }
    };
    unlock(s, nv);
    Ok(match old {
        0 => Slot::Empty,
        t if t < 8 => Slot::Tag(t),
        p => {
            OBJECTS.fetch_sub(1, Ordering::Relaxed);
            // SAFETY: the slot owned this strong count; ownership moves to the caller.
            let o = unsafe { Arc::from_raw(p as *const Obj) };
            if let Some(c) = o.conn() {
                c.count_number(false);
            }
            Slot::Obj(o)
        }
    })
}

/// Set a tag (no object) on `fd`.
pub fn set_tag(fd: i32, tag: usize) {
    drop(replace(fd, Slot::Tag(tag)));
}

/// Whether any slot holds an object.
#[inline]
pub fn any_objects() -> bool {
    OBJECTS.load(Ordering::Relaxed) != 0
}

/// Every fd whose slot holds an object, with the object (for fork and exec bookkeeping).
pub fn all_objects() -> Vec<(i32, Arc<Obj>)> {
    let mut out = Vec::new();
    for_each_object(|fd, o| out.push((fd, o.clone())));
    out
}

/// Calls `f` with every object of the table, without allocating (usable in a `vfork` child,
/// where the allocator's locks may be held by a thread of the parent).
pub fn for_each_object(mut f: impl FnMut(i32, &Arc<Obj>)) {
    if !any_objects() {
        return;
    }
    for (ti, t) in TABLE.iter().enumerate() {
        let c = t.load(Ordering::Acquire);
        if c.is_null() {
            continue;
        }
        // SAFETY: chunks are never freed once published.
        let chunk = unsafe { &*c };
        for (i, s) in chunk.iter().enumerate() {
            if s.load(Ordering::Relaxed) >= 8 {
                let fd = ((ti << CHUNK_BITS) | i) as i32;
                if let Some(o) = get(fd) {
                    f(fd, &o);
                }
            }
        }
    }
}

/// In a child after fork: a thread of the parent may have held a slot lock at the moment of
/// the fork; that thread does not exist here, so release every lock bit. The table is not
/// frozen here (the thread that froze it is the child's one thread).
pub fn unlock_all_after_fork() {
    FREEZER.with(|f| f.set(false));
    FROZEN.store(0, Ordering::SeqCst);
    for t in TABLE.iter() {
        let c = t.load(Ordering::Acquire);
        if c.is_null() {
            continue;
        }
        // SAFETY: chunks are never freed.
        let chunk = unsafe { &*c };
        for s in chunk.iter() {
            let v = s.load(Ordering::Relaxed);
            if v & 1 == 1 {
                s.store(v & !1, Ordering::Relaxed);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// our private numbers, and the calls in flight on a number

/// Marks `p`, our private duplicate of the socket of the connection or handshake `owner`, as
/// ours ([`Obj::Private`]); from then on a dropped object closes its duplicate
/// ([`close_private`]).
pub fn set_private(p: i32, owner: Weak<Obj>) {
    crate::obj::set_close_private(close_private);
    drop(replace(p, Slot::Obj(Arc::new(Obj::Private(owner)))));
}

/// Closes `p`, the private duplicate that carried a handshake decided after the application
/// closed the number it was made on ([`crate::obj::Handshake::moved`]; `ino`: the socket's
/// inode). The reference of the closed number goes now: an SMC connection's last one closes it.
/// When `p` names another file by now (the application made it name one with `dup2`, whose
/// close dropped our reference already) nothing is done.
pub fn close_moved(p: i32, ino: u64) {
    if crate::obj::socket_ino(p) != Some(ino) {
        crate::debug!("fd {p}: names another file now: left open");
        return;
    }
    crate::debug!("fd {p}: the call that went on with the connection returned: closed");
    let old = replace(p, Slot::Empty);
    if let Slot::Obj(o) = &old {
        if let Obj::Conn(c) = &**o {
            crate::obj::release_ref(p, p, c);
        }
    }
    drop(old);
    let e0 = real::errno();
    // SAFETY: our own descriptor, never handed to the application.
    unsafe { real::close(p) };
    real::set_errno(e0);
}

/// Closes our private descriptor `p` (an [`Obj::Private`] slot, or one still
/// [`TAG_PRIVATE_PENDING`]).
pub fn close_private(p: i32) {
    if raw(p) & !1 == TAG_PRIVATE_PENDING || matches!(get(p).as_deref(), Some(Obj::Private(_))) {
        drop(replace(p, Slot::Empty));
        let e0 = real::errno();
        // SAFETY: our own descriptor, never handed to the application.
        unsafe { real::close(p) };
        real::set_errno(e0);
    }
}

/// Whether `fd` is one of our private descriptors ([`Obj::Private`], or one still
/// [`TAG_PRIVATE_PENDING`]).
pub fn is_private(fd: i32) -> bool {
    let v = raw(fd);
    v & !1 == TAG_PRIVATE_PENDING || (v >= 8 && matches!(get(fd).as_deref(), Some(Obj::Private(_))))
}

/// A cheap first look for [`is_private`]: false when `fd` cannot be one.
#[inline]
pub fn maybe_private(fd: i32) -> bool {
    let v = raw(fd);
    v >= 8 || v & !1 == TAG_PRIVATE_PENDING
}

/// A call in flight on an SMC connection, made through the number `fd`: as the kernel's file
/// reference of a system call (`fdget`), it keeps the connection open when another thread
/// closes the number meanwhile ([`Conn::call_enter`]); the last fd reference closed under it is
/// dropped when it ends (and the connection closed, when that was the last one anywhere).
///
/// A call left by a jump (`siglongjmp` out of a signal handler) runs no destructor: its thread
/// releases it at its next entry into the library ([`crate::obj::reap_unwound`],
/// `util::unwound`).
pub struct InCall {
    /// Dropped by [`InCall`]'s `Drop`, or by [`crate::obj::reap_unwound`] when the call was
    /// left by a jump (never both: `util::unwound::pop` says which).
    obj: ManuallyDrop<Arc<Obj>>,
    /// The connection of `obj` (`Obj::Conn`), found once by [`InCall::enter`].
    conn: NonNull<Conn>,
    fd: i32,
    entry: unwound::Entry,
}

impl InCall {
    /// Registers a call on the connection `obj`, which the caller found at `fd`; `None` when it
    /// is not a connection, or `fd` no longer names it (closed meanwhile: the call is to be
    /// made on whatever the number names now).
    #[inline]
    pub fn enter(fd: i32, obj: Arc<Obj>) -> Option<InCall> {
        let c = obj.conn()?;
        crate::obj::reap_unwound();
        c.call_enter();
        let entry = unwound::push(Arc::as_ptr(&obj) as usize, c as *const Conn as usize, fd);
        let conn = NonNull::from(c);
        let call = InCall {
            obj: ManuallyDrop::new(obj),
            conn,
            fd,
            entry,
        };
        // Pairs with the fence of the close (`ops::forget_slot`): either it sees this call, or
        // this sees the number's slot emptied.
        if raw_seqcst(fd) & !1 != Arc::as_ptr(&call.obj) as usize {
            return None;
        }
        Some(call)
    }

    pub fn obj(&self) -> &Arc<Obj> {
        &self.obj
    }

    /// Whether its number still names the connection (not closed, nor reused, meanwhile).
    pub fn still_named(&self) -> bool {
        raw_seqcst(self.fd) & !1 == Arc::as_ptr(&self.obj) as usize
    }

    pub fn conn(&self) -> &Conn {
        // SAFETY: `conn` points into the object `obj` holds a strong reference to (`enter`
        // took it from that `Obj::Conn`): an `Arc`'s value does not move, and `obj` is dropped
        // only by `Drop` (or by the reaper of a call left by a jump, whose frame, holding this
        // `InCall`, is gone), so it lives as long as `&self`.
        unsafe { self.conn.as_ref() }
    }
}

impl Drop for InCall {
    fn drop(&mut self) {
        if !unwound::pop(self.entry) {
            // Judged left by a jump and released already (its thread entered the library again
            // from above its frames): never twice.
            return;
        }
        if let Obj::Conn(c) = &**self.obj {
            for _ in 0..c.call_leave() {
                crate::obj::release_ref(self.fd, self.fd, c);
            }
        }
        // SAFETY: dropped once, here (the entry was ours: no reaper took it).
        unsafe { ManuallyDrop::drop(&mut self.obj) };
    }
}
