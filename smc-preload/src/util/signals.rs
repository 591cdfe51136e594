//! Which signals interrupt a blocking socket call.
//!
//! A blocking `recv` in the kernel is restarted after a handler installed with `SA_RESTART` and
//! fails with `EINTR` otherwise (always with a socket timeout). Our blocking waits sleep in
//! `poll`, which never restarts, so the data path must know which signal interrupted it. The
//! handlers the program installs through our `sigaction`/`signal` are run by a trampoline of
//! ours ([`wrap`]) that notes the signal in a thread-local before it calls the program's
//! handler; the flags of that very signal's action, read from the kernel, then decide
//! ([`interrupted`]). `sigaction` reports the program's own handler back, never ours. Fault
//! signals are left alone (runtimes inspect those handlers; they never interrupt another
//! thread's call). A signal we did not see installed (its handler set before we loaded, or by
//! libc itself) falls back to the process-wide view: `EINTR` when any handler without
//! `SA_RESTART` exists.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Bit `n` set: signal `n` has a handler without SA_RESTART.
static NORESTART: AtomicU64 = AtomicU64::new(0);

/// The program's handler of each signal our trampoline stands in for (0: none).
static APP: [AtomicUsize; 65] = [const { AtomicUsize::new(0) }; 65];
/// Bit `n` set: the program's handler of signal `n` takes `(sig, info, context)`.
static APP_SIGINFO: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last signal our trampoline ran on this thread (0: none since [`wait_begins`]).
    static LAST: Cell<i32> = const { Cell::new(0) };
    /// Program handlers our trampoline is running on this thread ([`in_handler`]).
    static HANDLING: Cell<u32> = const { Cell::new(0) };
    /// Shared-memory locks this thread holds ([`crit_enter`]): a program handler is not run
    /// while any is held, but deferred ([`DEFERRED`]).
    static CRIT: Cell<u32> = const { Cell::new(0) };
    /// Signals whose program handler came while this thread held a shared-memory lock: how
    /// many, and each one's number and `siginfo` (raised again at [`crit_exit`]).
    static DEFERRED_N: Cell<usize> = const { Cell::new(0) };
    static DEFERRED: [Cell<(i32, [u64; 16])>; DEFERRED_MAX] =
        const { [const { Cell::new((0, [0; 16])) }; DEFERRED_MAX] };
}

/// Signals deferred at most per thread while it holds a shared-memory lock; beyond, a standard
/// signal already deferred is dropped as the kernel merges it, and others run at once.
const DEFERRED_MAX: usize = 8;

/// This thread now holds a shared-memory lock (`ShmLock`): a handler of the program that a
/// signal brings meanwhile is deferred until the last one is released ([`crit_exit`]). The
/// kernel runs a handler only when a system call is over, never inside a socket's send: our
/// send copies into the ring in user space, under the ring's lock, and a handler that ran
/// there and then called `shutdown` or `send` on that connection waited for ever for the lock
/// its own thread held (red team rt13 `rt13_sigclose.c`: a `SIGALRM` handler's
/// `shutdown(SHUT_RDWR)` to cut a send short, and a handler's 1-byte keepalive `send`, hung
/// 3 of 3 runs; TCP: `EPIPE`, every byte).
#[inline]
pub fn crit_enter() {
    CRIT.with(|c| c.set(c.get().wrapping_add(1)));
}

/// The matching release of [`crit_enter`]: at the last one, the deferred signals are raised
/// again for this thread, with their `siginfo` (`rt_tgsigqueueinfo` to itself), so that their
/// handlers run now, as they would have after a system call.
#[inline]
pub fn crit_exit() {
    let left = CRIT.with(|c| {
        let v = c.get().saturating_sub(1);
        c.set(v);
        v
    });
    if left == 0 && DEFERRED_N.with(|n| n.get()) != 0 {
        raise_deferred();
    }
}

#[cold]
fn raise_deferred() {
    let n = DEFERRED_N.with(|n| n.replace(0)).min(DEFERRED_MAX);
    let e0 = crate::real::errno();
    // SAFETY: plain system calls.
    let (pid, tid) = unsafe {
        (
            libc::getpid(),
            libc::syscall(libc::SYS_gettid) as libc::pid_t,
        )
    };
    for i in 0..n {
        let (sig, info) = DEFERRED.with(|d| d[i].get());
        // SAFETY: `info` is the kernel's siginfo of that signal, 128 bytes; a signal to this
        // very thread (the kernel allows any `si_code` within one thread group).
        unsafe {
            libc::syscall(
                libc::SYS_rt_tgsigqueueinfo,
                pid,
                tid,
                sig,
                info.as_ptr() as *const libc::siginfo_t,
            )
        };
    }
    crate::real::set_errno(e0);
}

/// In the trampoline: defers `sig` when this thread holds a shared-memory lock; true when it
/// did (the handler is not to run now).
fn defer(sig: libc::c_int, info: *const libc::siginfo_t) -> bool {
    if CRIT.with(|c| c.get()) == 0 || info.is_null() {
        return false;
    }
    let n = DEFERRED_N.with(|n| n.get());
    // A standard signal already deferred is merged, as the kernel merges a pending one.
    if sig < libc::SIGRTMIN()
        && (0..n.min(DEFERRED_MAX)).any(|i| DEFERRED.with(|d| d[i].get().0) == sig)
    {
        return true;
    }
    if n >= DEFERRED_MAX {
        return false;
    }
    let mut raw = [0u64; 16];
    // SAFETY: the kernel's siginfo for this delivery, 128 bytes, copied into our buffer of 128.
    unsafe {
        std::ptr::copy_nonoverlapping(
            info as *const u8,
            raw.as_mut_ptr() as *mut u8,
            std::mem::size_of::<libc::siginfo_t>().min(128),
        )
    };
    DEFERRED.with(|d| d[n].set((sig, raw)));
    DEFERRED_N.with(|c| c.set(n + 1));
    true
}

fn fault(sig: i32) -> bool {
    matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGILL | libc::SIGFPE | libc::SIGTRAP | libc::SIGSYS
    )
}

/// Record a handler change.
pub fn note(sig: i32, handler: libc::sighandler_t, flags: i32) {
    if !(1..64).contains(&sig) {
        return;
    }
    // Fault signals (a runtime's stack-overflow or crash handler) are synchronous to the
    // faulting thread: they never interrupt a blocking call of another.
    if fault(sig) {
        return;
    }
    let bit = 1u64 << sig;
    let is_handler = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
    if is_handler && flags & libc::SA_RESTART == 0 {
        NORESTART.fetch_or(bit, Ordering::Relaxed);
    } else {
        NORESTART.fetch_and(!bit, Ordering::Relaxed);
    }
}

extern "C" fn trampoline(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // Inside a section that holds a shared-memory lock: the program's handler runs when the
    // lock is released ([`crit_exit`]). Only the errno of the interrupted code is at stake
    // here (nothing else is called).
    if defer(sig, info) {
        return;
    }
    // A const-initialised thread-local without destructor: a plain TLS access (its block was
    // touched by `wait_begins` before any wait), safe in a handler.
    LAST.with(|l| l.set(sig));
    let Some(slot) = APP.get(sig as usize) else {
        return;
    };
    let h = slot.load(Ordering::Acquire);
    if h == 0 || h == libc::SIG_DFL || h == libc::SIG_IGN || h == trampoline_addr() {
        return;
    }
    // While the program's handler runs, calls it makes are not to do the library's own work
    // that takes locks the interrupted code may hold ([`in_handler`]). A handler left with
    // `siglongjmp` leaves the count up: that thread then never does such work from its calls
    // again (the safe side).
    HANDLING.with(|c| c.set(c.get().saturating_add(1)));
    if APP_SIGINFO.load(Ordering::Acquire) & (1u64 << sig) != 0 {
        // SAFETY: the program installed `h` with SA_SIGINFO: it takes these arguments.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed `h` as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
    HANDLING.with(|c| c.set(c.get().saturating_sub(1)));
}

/// Whether this thread runs a handler of the program's (through our trampoline) now: a
/// `waitpid(WNOHANG)` of a `SIGCHLD` reaper, say, which may have interrupted a `send` of ours
/// holding a connection's ring lock, so it must not answer switches to TCP (red team rt13
/// `rt13_reenter`: the handler's switch waited for the lock its own thread held).
pub fn in_handler() -> bool {
    HANDLING.with(|c| c.get() != 0)
}

extern "C" {
    /// glibc (2.32 and later): nonzero while the process never had a second thread.
    static __libc_single_threaded: libc::c_char;
}

/// This thread runs a handler of the program ([`in_handler`]) in a process that never had
/// another thread. glibc's `malloc` takes no lock then, so the handler may have interrupted an
/// allocation half way: code run now must neither allocate nor free (a `fork` of such a
/// handler: its children aborted in `malloc()`'s checks, `preload-prog sigfork`).
pub fn in_handler_of_single_thread() -> bool {
    // SAFETY: a byte glibc defines and only ever writes from the thread that makes a second one.
    in_handler() && unsafe { std::ptr::read_volatile(&raw const __libc_single_threaded) } != 0
}

fn trampoline_addr() -> usize {
    trampoline as *const () as usize
}

/// The action to give the kernel for the program's `act` on `sig`: ours in place of a handler
/// (the program's is noted first, so that a signal arriving meanwhile runs it), else `act`
/// itself. Returns the program's previous handler and whether it took `SA_SIGINFO`, for
/// [`unwrap_old`].
pub fn wrap(sig: i32, act: &libc::sigaction) -> (libc::sigaction, (usize, bool)) {
    let prev = previous(sig);
    let h = act.sa_sigaction;
    if h == trampoline_addr() {
        // Our trampoline handed back by a call that does not translate it (`sysv_signal`,
        // `bsd_signal`, `sigset` return what the kernel holds): the program restores the
        // handler it had, which the trampoline still runs.
        return (*act, prev);
    }
    if !(1..64).contains(&sig) || fault(sig) || h == libc::SIG_DFL || h == libc::SIG_IGN {
        if let Some(slot) = APP.get(sig as usize) {
            slot.store(0, Ordering::Release);
        }
        return (*act, prev);
    }
    let bit = 1u64 << sig;
    if act.sa_flags & libc::SA_SIGINFO != 0 {
        APP_SIGINFO.fetch_or(bit, Ordering::AcqRel);
    } else {
        APP_SIGINFO.fetch_and(!bit, Ordering::AcqRel);
    }
    if let Some(slot) = APP.get(sig as usize) {
        slot.store(h, Ordering::Release);
    }
    let mut ours = *act;
    ours.sa_sigaction = trampoline_addr();
    ours.sa_flags |= libc::SA_SIGINFO;
    (ours, prev)
}

/// The program's current handler of `sig` (0: none of ours) and whether it takes SA_SIGINFO.
pub fn previous(sig: i32) -> (usize, bool) {
    let h = APP
        .get(sig.max(0) as usize)
        .map_or(0, |s| s.load(Ordering::Acquire));
    let si = (1..64).contains(&sig) && APP_SIGINFO.load(Ordering::Acquire) & (1u64 << sig) != 0;
    (h, si)
}

/// `old` as the kernel reported it: our trampoline is shown as the program's handler `prev`.
pub fn unwrap_old(old: &mut libc::sigaction, prev: (usize, bool)) {
    if old.sa_sigaction == trampoline_addr() && prev.0 != 0 {
        old.sa_sigaction = prev.0;
        if !prev.1 {
            old.sa_flags &= !libc::SA_SIGINFO;
        }
    } else if old.sa_sigaction == libc::SIG_DFL && prev.0 != 0 && !prev.1 {
        // Reset by the kernel after one delivery (SA_RESETHAND): the flags are still the ones
        // we installed the trampoline with.
        old.sa_flags &= !libc::SA_SIGINFO;
    }
}

/// A blocking wait is about to sleep: forget the signals this thread ran before.
pub fn wait_begins() {
    LAST.with(|l| l.set(0));
}

/// Whether a handler of ours ran on this thread since [`wait_begins`] (a call that ended
/// early without saying `EINTR`, as `tcp_bpf`'s blocking read does: `EAGAIN`, may have been
/// ended by it).
pub fn caught() -> bool {
    LAST.with(|l| l.get()) > 0
}

/// Whether the signal that just interrupted this thread's wait (`EINTR`) ends the call with
/// `EINTR`: its action has no `SA_RESTART` (read from the kernel: `siginterrupt` and the like
/// change it behind `sigaction`). Unknown signal: when any handler lacks `SA_RESTART`.
pub fn interrupted() -> bool {
    let sig = LAST.with(|l| l.get());
    if sig <= 0 {
        return any_handler_without_restart();
    }
    // SAFETY: a zeroed sigaction is valid output space; querying only.
    let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer; no new action.
    if unsafe { crate::real::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
        return NORESTART.load(Ordering::Relaxed) != 0;
    }
    cur.sa_flags & libc::SA_RESTART == 0
}

/// The signal is unknown (its handler was installed without us: `sysv_signal`, `sigset`, raw
/// system calls): EINTR when any signal's action, as the kernel holds it, has a handler
/// without `SA_RESTART`.
fn any_handler_without_restart() -> bool {
    for sig in 1..65 {
        if fault(sig) || sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: a zeroed sigaction is valid output space; querying only.
        let mut cur: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointer; no new action.
        if unsafe { crate::real::sigaction(sig, std::ptr::null(), &mut cur) } != 0 {
            continue;
        }
        let h = cur.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN && cur.sa_flags & libc::SA_RESTART == 0 {
            return true;
        }
    }
    false
}

thread_local! {
    /// A blocking read of the application waits for a handshake on this thread
    /// ([`interruptible`]).
    static HANDSHAKE_CALL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, a blocking read's wait for its socket's handshake: a signal whose handler ends
/// such a call (`EINTR`, no `SA_RESTART`) ends the wait ([`wait_interrupted`]), as it ends
/// TCP's blocking read. (Not a `connect`'s or a write's wait: TCP's had returned.)
pub fn interruptible<T>(f: impl FnOnce() -> T) -> T {
    let was = HANDSHAKE_CALL.with(|h| h.replace(true));
    let r = f();
    HANDSHAKE_CALL.with(|h| h.set(was));
    r
}

/// Whether the handshake wait of an [`interruptible`] call ends now: a handler ran since the
/// call began, and its signal ends the call.
pub fn wait_interrupted() -> bool {
    HANDSHAKE_CALL.with(|h| h.get()) && caught() && interrupted()
}

/// Whether a poll interrupted by a signal should surface as EINTR (process-wide view).
pub fn interrupts() -> bool {
    NORESTART.load(Ordering::Relaxed) != 0
}
