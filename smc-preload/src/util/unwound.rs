//! Calls left by a jump: a thread blocked in one of our calls that leaves it by `siglongjmp`
//! (or `longjmp`) from a signal handler — old-style timeouts: `alarm` + `siglongjmp` — runs no
//! destructor of ours, so what the call held stays held: its registration on the connection
//! (`fdtable::InCall`: the connection's last close would wait for it for ever) and, when it slept,
//! the connection's poller role and its count as a sleeper on the socket (every later wait
//! would take the 500 ms safety net).
//!
//! Each thread keeps the calls it has in flight in a fixed table of its own ([`push`], [`pop`]);
//! a call that goes to sleep ([`asleep`]) notes there the address of a local of its wait (its
//! stack depth) and what it holds while asleep ([`Asleep::hold`]). At its next entry into the
//! library ([`reap`]), a thread whose stack pointer is *above* (the stack grows down:
//! shallower than) the depth a sleeping call of its own noted can no longer be inside that
//! call: a signal handler that runs inside it (and calls us) runs deeper on the same stack; the
//! call's frames were unwound without returning. Such a call is taken out of the table
//! ([`reap`]) and its holdings are given back exactly as its normal end would have
//! (`obj::reap_unwound`). The comparison is only trusted on the thread's own stack: not when
//! the thread runs on its alternate signal stack (`sigaltstack` says `SS_ONSTACK`), and only
//! when both the current and the noted depth lie inside the thread's stack
//! (`pthread_getattr_np`, asked once per thread): a handler on an alternate stack that
//! disarms itself (`SS_AUTODISARM`: `sigaltstack` then says nothing), or a coroutine stack,
//! may lie anywhere. Only calls asleep are ever judged: a call's non-blocking stretches never
//! are (a library call may hold several entries made in frames that returned since, which
//! would look unwound), and a signal lands in practice where the call sleeps.
//!
//! Cost: one thread-local load at each check while the thread has no call in flight, a few
//! stores per call. The table is fixed (no allocation; [`CAP`] calls deep, beyond that a call
//! is not tracked and a jump out of it leaves it registered, as before). A thread that leaves a
//! call this way and never calls into the library again from above it keeps it registered
//! until it ends ([`thread_ends`]); meanwhile another thread's close of the connection stays
//! deferred (nothing tells another thread, soundly and cheaply, that the call is gone).

use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicU8, AtomicUsize, Ordering};

/// Calls in flight per thread that are tracked.
pub const CAP: usize = 16;

/// Held while asleep ([`Asleep::hold`]): the connection's poller role.
pub const POLLER: u8 = 1;
/// Held while asleep: a count as a sleeper on the socket (`Conn::sleep_enter`).
pub const KSLEEP: u8 = 2;
/// Held while asleep: a count as a futex waiter of the connection.
pub const WAITER: u8 = 4;

/// One call in flight. `token` 0: a free entry (its other fields mean nothing). Fields are
/// atomics only so that a signal handler running on this same thread (which may enter the
/// library) sees each store whole; `token` is claimed by compare-exchange (by the call's end
/// or by a reaper), so that a call is released once.
struct Rec {
    token: AtomicUsize,
    /// The depth its wait noted (0: not asleep, never judged).
    sp: AtomicUsize,
    /// The `Arc<Obj>` the call holds (`Arc::as_ptr`).
    obj: AtomicUsize,
    /// The connection (`&Conn`), the key of [`asleep`].
    conn: AtomicUsize,
    fd: AtomicUsize,
    held: AtomicU8,
}

impl Rec {
    const fn empty() -> Rec {
        Rec {
            token: AtomicUsize::new(0),
            sp: AtomicUsize::new(0),
            obj: AtomicUsize::new(0),
            conn: AtomicUsize::new(0),
            fd: AtomicUsize::new(0),
            held: AtomicU8::new(0),
        }
    }
}

struct Table {
    /// Entries in use are below `len`; those at or above it are free (`token` 0).
    len: AtomicUsize,
    next: Cell<usize>,
    recs: [Rec; CAP],
    /// The thread's stack (low, high), once asked (0, 0: not yet; (1, 0): unknown).
    bounds: Cell<(usize, usize)>,
    /// The thread's end releases what is left ([`thread_ends`]): armed at its first sleep.
    armed: Cell<bool>,
}

thread_local! {
    // Const-initialised, no destructor: a plain TLS access, usable in a signal handler.
    static TABLE: Table = const {
        Table {
            len: AtomicUsize::new(0),
            next: Cell::new(0),
            recs: [const { Rec::empty() }; CAP],
            bounds: Cell::new((0, 0)),
            armed: Cell::new(false),
        }
    };
}

/// A tracked call's entry ([`push`]): `token` 0 when it could not be tracked.
#[derive(Clone, Copy)]
pub struct Entry {
    slot: u8,
    token: usize,
}

impl Entry {
    pub const NONE: Entry = Entry { slot: 0, token: 0 };
}

/// A call holding `obj` on the connection `conn` through `fd` starts on this thread.
#[inline]
pub fn push(obj: usize, conn: usize, fd: i32) -> Entry {
    TABLE
        .try_with(|t| {
            let slot = t.len.load(Ordering::Relaxed);
            if slot >= CAP {
                return Entry::NONE;
            }
            // Reserved first: a handler that interrupts us from here on uses the entries above
            // (this one is free, token 0, until it is complete: nobody judges it).
            t.len.store(slot + 1, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            let token = t.next.get().wrapping_add(1).max(1);
            t.next.set(token);
            let r = &t.recs[slot];
            r.sp.store(0, Ordering::Relaxed);
            r.held.store(0, Ordering::Relaxed);
            r.obj.store(obj, Ordering::Relaxed);
            r.conn.store(conn, Ordering::Relaxed);
            r.fd.store(fd as u32 as usize, Ordering::Relaxed);
            compiler_fence(Ordering::SeqCst);
            r.token.store(token, Ordering::Relaxed);
            Entry {
                slot: slot as u8,
                token,
            }
        })
        .unwrap_or(Entry::NONE)
}

/// The call of `e` ends: false when it had been judged unwound and released already
/// ([`reap`]): the caller must then release nothing (nor drop what the call held).
#[inline]
pub fn pop(e: Entry) -> bool {
    if e.token == 0 {
        return true;
    }
    TABLE
        .try_with(|t| {
            let Some(r) = t.recs.get(e.slot as usize) else {
                return true;
            };
            if r.token
                .compare_exchange(e.token, 0, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
            {
                return false;
            }
            compiler_fence(Ordering::SeqCst);
            trim(t);
            true
        })
        .unwrap_or(true)
}

/// Gives back the free entries at the top of the table.
fn trim(t: &Table) {
    let mut n = t.len.load(Ordering::Relaxed);
    while n > 0 && t.recs[n - 1].token.load(Ordering::Relaxed) == 0 {
        n -= 1;
        t.len.store(n, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
    }
}

/// A call of this thread asleep on a connection ([`asleep`]); it is awake again when this
/// drops.
pub struct Asleep {
    slot: u8,
    token: usize,
}

/// The call of this thread on the connection `conn` (the latest one not asleep yet) goes to
/// sleep; `depth`: the address of a local of its wait. `None`: not tracked.
#[inline]
pub fn asleep(conn: usize, depth: usize) -> Option<Asleep> {
    TABLE
        .try_with(|t| {
            let n = t.len.load(Ordering::Relaxed).min(CAP);
            for slot in (0..n).rev() {
                let r = &t.recs[slot];
                let token = r.token.load(Ordering::Relaxed);
                if token != 0
                    && r.conn.load(Ordering::Relaxed) == conn
                    && r.sp.load(Ordering::Relaxed) == 0
                {
                    r.held.store(0, Ordering::Relaxed);
                    compiler_fence(Ordering::SeqCst);
                    r.sp.store(depth, Ordering::Relaxed);
                    if !t.armed.get() {
                        arm_thread_end();
                        t.armed.set(true);
                    }
                    return Some(Asleep {
                        slot: slot as u8,
                        token,
                    });
                }
            }
            None
        })
        .ok()
        .flatten()
}

impl Asleep {
    fn rec<R>(&self, f: impl FnOnce(&Rec) -> R) -> Option<R> {
        TABLE
            .try_with(|t| {
                let r = &t.recs[self.slot as usize % CAP];
                (r.token.load(Ordering::Relaxed) == self.token).then(|| f(r))
            })
            .ok()
            .flatten()
    }

    /// Whether the sleeping call's number no longer names the object it was made on (closed,
    /// or another file there), by the table's look-up registered at load ([`init`]).
    pub fn renamed(&self) -> bool {
        let f = NAMES.load(Ordering::Acquire);
        if f == 0 {
            return false;
        }
        // SAFETY: only `init` stores here, a `fn(i32) -> usize`.
        let names: fn(i32) -> usize = unsafe { std::mem::transmute(f) };
        self.rec(|r| {
            names(r.fd.load(Ordering::Relaxed) as u32 as i32) & !1 != r.obj.load(Ordering::Relaxed)
        })
        .unwrap_or(false)
    }

    /// The sleeping call now holds `what` ([`POLLER`], ...): to be noted right *after* it was
    /// taken (a jump in between leaves it held, never released twice).
    #[inline]
    pub fn hold(&self, what: u8) {
        compiler_fence(Ordering::SeqCst);
        self.rec(|r| r.held.fetch_or(what, Ordering::Relaxed));
        compiler_fence(Ordering::SeqCst);
    }

    /// The sleeping call gives `what` back: to be noted right *before* it is given back.
    #[inline]
    pub fn release(&self, what: u8) {
        compiler_fence(Ordering::SeqCst);
        self.rec(|r| r.held.fetch_and(!what, Ordering::Relaxed));
        compiler_fence(Ordering::SeqCst);
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        compiler_fence(Ordering::SeqCst);
        self.rec(|r| {
            r.sp.store(0, Ordering::Relaxed);
            r.held.store(0, Ordering::Relaxed);
        });
        compiler_fence(Ordering::SeqCst);
    }
}

/// A call judged unwound, taken out of the table: what it held, for the caller to give back.
pub struct Unwound {
    pub obj: usize,
    pub fd: i32,
    pub held: u8,
}

/// Whether this thread has calls in flight (the only cost of [`reap`] when it has none).
#[inline]
pub fn any() -> bool {
    TABLE
        .try_with(|t| t.len.load(Ordering::Relaxed) != 0)
        .unwrap_or(false)
}

/// Takes out the calls of this thread that were left by a jump (see the module's text) and
/// gives each to `release`, the latest first. Call it on entry, before this call registers.
#[inline(never)]
pub fn reap(release: &mut dyn FnMut(Unwound)) {
    let here = 0u8;
    // The depth of this frame: any frame of a call this one runs inside (a signal handler
    // interrupted it) is above it on the same stack.
    let cur = std::hint::black_box(&here) as *const u8 as usize;
    let _ = TABLE.try_with(|t| {
        let candidate = |r: &Rec| {
            let sp = r.sp.load(Ordering::Relaxed);
            r.token.load(Ordering::Relaxed) != 0 && sp != 0 && sp < cur
        };
        let n = t.len.load(Ordering::Relaxed).min(CAP);
        if !t.recs[..n].iter().any(candidate) {
            return;
        }
        // Not on the alternate signal stack (a handler's frames there may lie above the
        // thread's stack while it runs inside our call), and both depths inside the thread's
        // stack (a handler on a stack that disarmed itself, a coroutine stack).
        if on_alt_stack() {
            return;
        }
        let (lo, hi) = bounds(t);
        let inside = |a: usize| lo < a && a < hi;
        if !inside(cur) {
            return;
        }
        for slot in (0..n).rev() {
            let r = &t.recs[slot];
            if !candidate(r) || !inside(r.sp.load(Ordering::Relaxed)) {
                continue;
            }
            if let Some(u) = claim(r) {
                compiler_fence(Ordering::SeqCst);
                release(u);
            }
        }
        trim(t);
    });
}

/// Takes the call of entry `r` for releasing, once: the entry is free from here on (a handler
/// interrupting us sees it free, or claimed it first). `None`: free already.
fn claim(r: &Rec) -> Option<Unwound> {
    let token = r.token.load(Ordering::Relaxed);
    if token == 0 {
        return None;
    }
    let u = Unwound {
        obj: r.obj.load(Ordering::Relaxed),
        fd: r.fd.load(Ordering::Relaxed) as u32 as i32,
        held: r.held.load(Ordering::Relaxed),
    };
    r.token
        .compare_exchange(token, 0, Ordering::Relaxed, Ordering::Relaxed)
        .is_ok()
        .then_some(u)
}

/// The key whose destructor runs at each thread's end (its value + 1; 0: none).
static EXIT_KEY: AtomicUsize = AtomicUsize::new(0);
/// What gives back a call left behind (`fn(Unwound)`; 0: none).
static RELEASE: AtomicUsize = AtomicUsize::new(0);
/// What a number names now (`fn(i32) -> usize`: the fd table's slot, the object's address
/// with its lock bit; 0: none), for [`Asleep::renamed`].
static NAMES: AtomicUsize = AtomicUsize::new(0);

/// At load: `release` gives back the calls a thread leaves behind when it ends (left by a jump,
/// and no later entry of the thread took them: [`thread_ends`]); `names` tells what a number
/// names now ([`Asleep::renamed`]).
pub fn init(release: fn(Unwound), names: fn(i32) -> usize) {
    RELEASE.store(release as usize, Ordering::Release);
    NAMES.store(names as usize, Ordering::Release);
    let mut k: libc::pthread_key_t = 0;
    // SAFETY: valid out pointer; the destructor is a plain extern "C" function of ours.
    if unsafe { libc::pthread_key_create(&mut k, Some(thread_ends)) } == 0 {
        EXIT_KEY.store(k as usize + 1, Ordering::Release);
    }
}

/// This thread's end runs [`thread_ends`]. (`pthread_setspecific` of a key made at load, among
/// the first ones, takes no allocation in glibc: safe in a signal handler.)
fn arm_thread_end() {
    let k = EXIT_KEY.load(Ordering::Acquire);
    if k != 0 {
        // SAFETY: a key made by `init`; any non-null value.
        unsafe {
            libc::pthread_setspecific(
                (k - 1) as libc::pthread_key_t,
                std::ptr::dangling::<libc::c_void>(),
            )
        };
    }
}

/// The thread ends: a call still in its table has no frame any more (a call it leaves by
/// unwinding, `pthread_exit` or `pthread_cancel`, releases itself on the way), whatever the
/// depths: each is given back.
unsafe extern "C" fn thread_ends(_: *mut libc::c_void) {
    let f = RELEASE.load(Ordering::Acquire);
    if f == 0 {
        return;
    }
    // SAFETY: stored by `init` from a `fn(Unwound)`.
    let release: fn(Unwound) = unsafe { std::mem::transmute::<usize, fn(Unwound)>(f) };
    let _ = TABLE.try_with(|t| {
        let n = t.len.load(Ordering::Relaxed).min(CAP);
        for slot in (0..n).rev() {
            if let Some(u) = claim(&t.recs[slot]) {
                release(u);
            }
        }
        trim(t);
    });
}

/// Whether this thread runs on its alternate signal stack.
fn on_alt_stack() -> bool {
    let e0 = crate::real::errno();
    // SAFETY: a zeroed stack_t is valid output space; no new stack is set.
    let mut ss: libc::stack_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer, null new stack: a query.
    let r = unsafe { libc::sigaltstack(std::ptr::null(), &mut ss) };
    crate::real::set_errno(e0);
    // Unknown: judged as on it (nothing is released).
    r != 0 || ss.ss_flags & libc::SS_ONSTACK != 0
}

/// The thread's stack (low, high): (0, 0) when unknown (nothing is inside).
fn bounds(t: &Table) -> (usize, usize) {
    let b = t.bounds.get();
    if b != (0, 0) {
        return if b.0 < b.1 { b } else { (0, 0) };
    }
    let e0 = crate::real::errno();
    // SAFETY: a zeroed attribute object is valid output space for pthread_getattr_np.
    let mut a: libc::pthread_attr_t = unsafe { std::mem::zeroed() };
    let mut got = (1, 0);
    // SAFETY: our own thread; `a` is initialised by the call and destroyed once on success.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), &mut a) } == 0 {
        let mut addr: *mut libc::c_void = std::ptr::null_mut();
        let mut size: libc::size_t = 0;
        // SAFETY: `a` is initialised; valid out pointers.
        if unsafe { libc::pthread_attr_getstack(&a, &mut addr, &mut size) } == 0 && size > 0 {
            got = (addr as usize, (addr as usize).saturating_add(size));
        }
        // SAFETY: initialised above, destroyed once.
        unsafe { libc::pthread_attr_destroy(&mut a) };
    }
    crate::real::set_errno(e0);
    t.bounds.set(got);
    if got.0 < got.1 {
        got
    } else {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_pop_and_reap_only_shallower() {
        let e = push(1, 2, 3);
        assert!(e.token != 0);
        assert!(pop(e));
        assert!(!any());

        // A call that went to sleep in a frame that is gone: reaped by a shallower entry.
        #[inline(never)]
        fn sleep_deep(depth: u32) -> (Entry, Asleep) {
            let pad = [0u8; 512];
            std::hint::black_box(&pad);
            if depth > 0 {
                let r = sleep_deep(depth - 1);
                std::hint::black_box(&pad);
                return r;
            }
            let e = push(10, 20, 7);
            let a = asleep(20, std::hint::black_box(&pad) as *const _ as usize).unwrap();
            a.hold(POLLER | KSLEEP);
            (e, a)
        }
        let (e, a) = sleep_deep(4);
        std::mem::forget(a);
        let mut got = Vec::new();
        reap(&mut |u| got.push((u.obj, u.fd, u.held)));
        assert_eq!(got, vec![(10, 7, POLLER | KSLEEP)]);
        assert!(!any());
        // Its end, were it ever to come, releases nothing.
        assert!(!pop(e));
    }

    #[test]
    fn a_deeper_entry_leaves_a_sleeping_call_alone() {
        let e = push(1, 2, 3);
        let here = 0u8;
        let a = asleep(2, std::hint::black_box(&here) as *const _ as usize).unwrap();
        #[inline(never)]
        fn deeper() -> usize {
            let pad = [0u8; 256];
            std::hint::black_box(&pad);
            let mut n = 0;
            reap(&mut |_| n += 1);
            n
        }
        assert_eq!(deeper(), 0);
        drop(a);
        // Awake: never judged, whatever the depth.
        let mut n = 0;
        reap(&mut |_| n += 1);
        assert_eq!(n, 0);
        assert!(pop(e));
    }

    /// A signal handler that interrupts a sleeping call of its thread and enters the library:
    /// on the thread's stack it runs below the call's frames; on an alternate stack that is a
    /// local of an outer frame of the thread (above the call's frames) it runs above them, and
    /// `SS_ONSTACK` keeps it from taking the call. Returns (whether the handler ran above the
    /// noted depth, the calls it took).
    fn handler_inside_sleeping_call(sig: i32, altstack: bool) -> (bool, usize) {
        use std::sync::atomic::AtomicBool;
        static ABOVE: AtomicBool = AtomicBool::new(false);
        static TAKEN: AtomicUsize = AtomicUsize::new(usize::MAX);
        static DEPTH: AtomicUsize = AtomicUsize::new(0);
        extern "C" fn h(_: i32) {
            let here = 0u8;
            let cur = std::hint::black_box(&here) as *const u8 as usize;
            ABOVE.store(cur > DEPTH.load(Ordering::SeqCst), Ordering::SeqCst);
            let mut n = 0;
            reap(&mut |_| n += 1);
            TAKEN.store(n, Ordering::SeqCst);
        }
        #[inline(never)]
        fn deep(sig: i32) {
            let pad = [0u8; 512];
            let e = push(1, 2, 3);
            let d = std::hint::black_box(&pad) as *const _ as usize;
            DEPTH.store(d, Ordering::SeqCst);
            let a = asleep(2, d).unwrap();
            a.hold(POLLER);
            // SAFETY: the handler is installed; raise runs it on this thread before it returns.
            unsafe { libc::raise(sig) };
            drop(a);
            assert!(pop(e), "the sleeping call was taken");
        }
        std::thread::spawn(move || {
            let mut stack = vec![0u8; 0];
            let mut local = [0u8; 128 * 1024];
            // SAFETY: valid sigaction and stack_t values; the alternate stack is disabled
            // again before its frame goes.
            unsafe {
                if altstack {
                    let ss = libc::stack_t {
                        ss_sp: local.as_mut_ptr().cast(),
                        ss_flags: 0,
                        ss_size: local.len(),
                    };
                    assert_eq!(libc::sigaltstack(&ss, std::ptr::null_mut()), 0);
                }
                let mut a: libc::sigaction = std::mem::zeroed();
                a.sa_sigaction = h as *const () as usize;
                a.sa_flags = if altstack { libc::SA_ONSTACK } else { 0 };
                libc::sigemptyset(&mut a.sa_mask);
                assert_eq!(libc::sigaction(sig, &a, std::ptr::null_mut()), 0);
                deep(sig);
                let off = libc::stack_t {
                    ss_sp: std::ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                libc::sigaltstack(&off, std::ptr::null_mut());
            }
            stack.push(std::hint::black_box(&mut local)[0]);
        })
        .join()
        .unwrap();
        (ABOVE.load(Ordering::SeqCst), TAKEN.load(Ordering::SeqCst))
    }

    #[test]
    fn a_handler_inside_a_sleeping_call_takes_nothing() {
        // (One test: the helper's statics are shared.)
        assert_eq!(
            handler_inside_sleeping_call(libc::SIGRTMIN() + 3, false),
            (false, 0)
        );
        // Above the noted depth, inside the thread's stack: only SS_ONSTACK tells.
        assert_eq!(
            handler_inside_sleeping_call(libc::SIGRTMIN() + 3, true),
            (true, 0)
        );
    }
}
