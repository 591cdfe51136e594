//! Process lifecycle: what the library must (not) do across `vfork`, `exec` and fd passing.
//!
//! - **vfork.** A `vfork` child (CPython's `subprocess`, `posix_spawn`, Java, NuProcess) runs in
//!   its parent's memory until it execs or exits: the fd table, the connection objects and the
//!   signal bookkeeping it would touch are the parent's. Its `close`/`close_range`/`dup2`/
//!   `sigaction` only act on its own fd table in the kernel, so here they go straight to libc
//!   and leave our state alone ([`in_vfork_child`]). It cannot drive a handshake of ours either:
//!   the interposed `vfork` decides them before libc's runs (`ops::before_vfork`).
//! - **exec.** The next image may not run the data path (environment cleared, setuid, static,
//!   Go): a listener it inherits must not announce SMC, or it would read its clients' CLC
//!   Proposals as request bytes. Listeners that survive an exec withdraw their announcement
//!   (`SMC_SO_ENABLE` 0, which the eBPF programs record per port and namespace); an image that
//!   runs the library announces again at load ([`adopt_inherited_sockets`]).
//! - **fds we did not see close.** `syscall(SYS_close)` (libuv), `fclose` of an `fdopen`ed
//!   socket, a close inside a runtime: the slot of that number still holds the connection
//!   when the kernel hands the number out again. Every fd-creating call we interpose drops such
//!   a stale slot first (`ops::fd_created`), without any I/O on the number, and `syscall` and
//!   `fclose` are interposed so that those closes are seen at all.
//! - **fd passing.** A socket received with `SCM_RIGHTS` ([`fds_received`]): a listening TCP
//!   socket is served (announces SMC), an unconnected one (bound, not yet listening: Node's
//!   cluster workers) may opt in at its `listen` or `connect`, one of our own SMC connections (same process, another
//!   number) is shared like a `dup`, an SMC connection of another process is adopted (the
//!   daemon hands its DMBs and local state page to a process of the same uid, cgroup and pid
//!   namespace holding the socket: [`daemon::adopt`]) and otherwise fails cleanly
//!   (`ECONNRESET`/`EPIPE`), never hands out doorbells as data. The reference a socket holds
//!   while it travels (`SCM_RIGHTS`, `exec`, `posix_spawn`) is marked in the connection's
//!   shared page, so that the receiver, in whatever process, takes it over.
//! - **io_uring.** A ring set up through `syscall(SYS_io_uring_setup)` (libuv, tokio-uring,
//!   monoio) submits socket I/O we never see: SMC is disabled for the process from then on
//!   (its listeners stop announcing, connections not yet decided stay TCP).

#![allow(clippy::missing_safety_doc)]
// Safety of every `pub unsafe fn` here: the pointer arguments are the application's, with the
// meaning and validity the libc function of the same name requires.

use std::sync::atomic::Ordering;

/// Whether this code runs in a `vfork` child (or any child sharing our memory): its pid is not
/// the one cached for the memory image. Costs one `getpid` system call, so callers ask only
/// when they are about to change shared bookkeeping (a slot that is not empty, a signal
/// handler), never on the data path.
pub fn in_vfork_child() -> bool {
    let cached = crate::PID.load(Ordering::Relaxed);
    // SAFETY: plain system call (glibc has not cached the pid since 2.25).
    let now = unsafe { libc::getpid() } as u32;
    cached != 0 && cached != now
}

thread_local! {
    /// This thread has a descriptor table of its own (`unshare(CLONE_FILES)`,
    /// `close_range(.., CLOSE_RANGE_UNSHARE)`): its closes and `dup2`s change its numbers only.
    static OWN_TABLE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// This thread's descriptor table is no longer the process's (`unshare(CLONE_FILES)`,
/// `close_range(.., CLOSE_RANGE_UNSHARE)`). Not so in a process of one thread: the table it
/// gave up was nobody else's (the kernel frees it), so its copy is the process's table, which
/// the slots describe (red team round 29: a daemon-style `close_range(3, ~0, UNSHARE)` at
/// start made every later close leave its slot, and the next connections at those numbers read
/// CLC bytes as data). Nor in a `vfork` child, whose table is its own copy already and whose
/// thread-local storage is its parent's thread's.
pub fn fd_table_unshared() {
    if in_vfork_child() || crate::util::one_thread() {
        return;
    }
    OWN_TABLE.with(|o| o.set(true));
}

/// Whether this thread took a descriptor table of its own ([`fd_table_unshared`]): one
/// thread-local load, no system call.
#[inline]
pub fn own_table_thread() -> bool {
    OWN_TABLE.with(std::cell::Cell::get)
}

/// Whether this thread's descriptor table is not the one our slots describe: a `vfork` child's
/// copy ([`in_vfork_child`], one system call) or an unshared table. Its closes and `dup2`s
/// leave the slots alone and shadow the numbers instead ([`vfork_shadow`]).
pub fn own_fd_table() -> bool {
    OWN_TABLE.with(std::cell::Cell::get) || in_vfork_child()
}

// ---------------------------------------------------------------------------------------------
// vfork children's own numbers

/// Threads whose `vfork` child re-pointed numbers ([`vfork_shadow`]) that have not been back in
/// the library since: while 0, [`vfork_shadowed`] is one load.
static SHADOWS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Room for this many ranges of re-pointed numbers; more make every number the child's own.
/// Ranges, not numbers: a `close_range` over many of our sockets (CPython's child closes all
/// but its `pass_fds`, one range per gap) is one entry or a few, however many sockets it
/// covers. With single numbers and room for 16, a child that closed 17 of its parent's
/// sockets made every number its own, the `pass_fds` connection included, which then
/// travelled without its reference: the parent's close ended it (red team round 29, nine
/// connections handed on by one process: the first reader read `b''`, 4 of 4).
const SHADOW_MAX: usize = 32;

thread_local! {
    /// A `vfork` child runs on its parent's thread (same memory, same thread-local storage)
    /// with its own copy of the descriptor table: the pid of such a child that made numbers
    /// name other files (`dup2` onto them, `close`), 0 when none. The parent's thread finds
    /// it there when it is back (the child exec'd or exited) and clears it.
    static SHADOW_PID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Those numbers, as inclusive ranges (`SHADOW_N` of them; more than [`SHADOW_MAX`]: all).
    static SHADOW_FDS: std::cell::Cell<[(c_int, c_int); SHADOW_MAX]> = const { std::cell::Cell::new([(-1, -1); SHADOW_MAX]) };
    static SHADOW_N: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// In a `vfork` child (the caller checked [`in_vfork_child`]): `fd` names another file from
/// now on, in this child only (`fd < 0`: every number). The parent's slot stays; the child's
/// data calls on the number go to the kernel unchanged, never to the parent's connection
/// ([`vfork_shadowed`]).
pub fn vfork_shadow(fd: c_int) {
    if fd < 0 {
        vfork_shadow_range(0, -1);
    } else {
        vfork_shadow_range(fd, fd);
    }
}

/// [`vfork_shadow`] for the numbers `first..=last` (`last < first`: every number).
pub fn vfork_shadow_range(first: c_int, last: c_int) {
    // SAFETY: plain system call.
    let me = unsafe { libc::getpid() } as u32;
    if SHADOW_PID.with(|p| p.replace(me)) != me {
        SHADOW_N.with(|n| n.set(0));
        SHADOWS.fetch_add(1, Ordering::SeqCst);
    }
    let n = SHADOW_N.with(std::cell::Cell::get);
    if n > SHADOW_MAX {
        return;
    }
    if last < first || first < 0 {
        SHADOW_N.with(|c| c.set(SHADOW_MAX + 1));
        return;
    }
    let mut ranges = SHADOW_FDS.with(std::cell::Cell::get);
    // One that overlaps or touches it grows (ranges may overlap each other after that: the
    // lookup takes any); so does one from which only numbers this child has not open separate
    // it (a child that closes its parent's numbers one by one, CPython's fallback when its
    // `close_range` failed: the numbers the parent had closed make gaps, and a range per gap
    // would make every number the child's own, the one it was passed included).
    for r in ranges.iter_mut().take(n) {
        let touches = first <= r.1.saturating_add(1) && last >= r.0.saturating_sub(1);
        if touches
            || (r.1 < first && closed_here(r.1 + 1, first - 1))
            || (last < r.0 && closed_here(last + 1, r.0 - 1))
        {
            *r = (r.0.min(first), r.1.max(last));
            SHADOW_FDS.with(|f| f.set(ranges));
            return;
        }
    }
    match ranges.get_mut(n) {
        Some(slot) => {
            *slot = (first, last);
            SHADOW_FDS.with(|f| f.set(ranges));
            SHADOW_N.with(|c| c.set(n + 1));
        }
        None => SHADOW_N.with(|c| c.set(SHADOW_MAX + 1)),
    }
}

/// In a child just forked: when the
/// forking thread had a table of its own ([`fd_table_unshared`]), the child's table is a copy
/// of that one, so the numbers that thread shadowed stay shadowed for the child, now under its
/// pid. Before, the child took them for its parent's thread back from a `vfork` child and
/// dropped them: a pipe the thread had `dup2`ed onto a number of an SMC-D connection of the
/// process got nothing of the child's `write`, which went into that connection (red team round
/// 30, `rt30b_x.c fork_own_w`: the peer read `PIPEDATA` at the head of its stream, 3 of 3).
pub fn shadows_after_fork() {
    if !own_table_thread() {
        return;
    }
    // SAFETY: plain system calls (the parent is the process that forked: nothing can have
    // reparented the child before its first instructions).
    let (me, parent) = unsafe { (libc::getpid() as u32, libc::getppid() as u32) };
    SHADOW_PID.with(|p| {
        if p.get() == parent {
            p.set(me);
        }
    });
}

/// Whether every number `a..=b` (at most 64 of them) is closed in this process's table.
fn closed_here(a: c_int, b: c_int) -> bool {
    b >= a
        && b - a < 64
        && (a..=b).all(|fd| {
            let e0 = real::errno();
            // SAFETY: F_GETFD has no argument.
            let r = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
            let closed = r < 0 && real::errno() == libc::EBADF;
            real::set_errno(e0);
            closed
        })
}

/// Whether this thread is a `vfork` child that re-pointed numbers already: then its closes of
/// numbers we know nothing of are recorded too, so that a child closing its parent's numbers one
/// by one (an `/proc/self/fd` walk) makes one range, not one per socket. One thread-local load
/// while no child of this thread shadowed anything.
pub fn shadowing_now() -> bool {
    let p = SHADOW_PID.with(std::cell::Cell::get);
    // SAFETY: plain system call.
    p != 0 && unsafe { libc::getpid() } as u32 == p
}

/// Whether `fd`, in this `vfork` child, names a file of its own ([`vfork_shadow`]): then no
/// slot of the parent applies to it.
#[inline]
pub fn vfork_shadowed(fd: c_int) -> bool {
    SHADOWS.load(Ordering::Relaxed) != 0 && shadowed(fd)
}

#[cold]
fn shadowed(fd: c_int) -> bool {
    let p = SHADOW_PID.with(std::cell::Cell::get);
    if p == 0 {
        return false;
    }
    // SAFETY: plain system call.
    if unsafe { libc::getpid() } as u32 != p {
        // The parent's thread, back: its child exec'd or exited.
        SHADOW_PID.with(|c| c.set(0));
        SHADOWS.fetch_sub(1, Ordering::SeqCst);
        return false;
    }
    let n = SHADOW_N.with(std::cell::Cell::get);
    n > SHADOW_MAX
        || SHADOW_FDS.with(|f| f.get().iter().take(n).any(|&(a, b)| (a..=b).contains(&fd)))
}

/// Room for this many numbers a `vfork` child made name one of its parent's objects.
const VFORK_DUPS_MAX: usize = 16;

thread_local! {
    /// In a `vfork` child (`VFORK_DUPS_PID`): numbers it made name one of the parent's objects
    /// with `dup2`/`dup3` (`dup2(conn, 0)` before an exec, as CPython's `subprocess` and
    /// inetd-style servers do), each with the number of that object in the parent's table.
    /// The parent's slots do not change ([`vfork_shadow`]), so this is how the child's `exec`
    /// finds the connections the next image inherits at other numbers.
    static VFORK_DUPS: std::cell::Cell<[(c_int, c_int); VFORK_DUPS_MAX]> = const { std::cell::Cell::new([(-1, -1); VFORK_DUPS_MAX]) };
    static VFORK_DUPS_N: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    static VFORK_DUPS_PID: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// This `vfork` child's entries of [`VFORK_DUPS`] (none in any other process: a parent's
/// thread back from its child finds the child's pid there). No allocation.
fn vfork_dups() -> ([(c_int, c_int); VFORK_DUPS_MAX], usize) {
    // SAFETY: plain system call.
    let me = unsafe { libc::getpid() } as u32;
    if VFORK_DUPS_PID.with(std::cell::Cell::get) != me {
        return ([(-1, -1); VFORK_DUPS_MAX], 0);
    }
    (
        VFORK_DUPS.with(std::cell::Cell::get),
        VFORK_DUPS_N.with(std::cell::Cell::get).min(VFORK_DUPS_MAX),
    )
}

/// In a `vfork` child (the caller checked [`own_fd_table`]): `dst` names what `src` names from
/// now on (`src` < 0: something that is none of the parent's objects, e.g. after `close`).
/// No allocation.
pub fn vfork_dup(src: c_int, dst: c_int) {
    let (mut v, mut n) = vfork_dups();
    // What `src` names: the parent's object at that number, unless this child re-pointed it
    // (to another of the parent's objects, or to a file of its own).
    let origin = if src < 0 {
        -1
    } else if let Some(&(_, o)) = v[..n].iter().find(|&&(t, _)| t == src) {
        o
    } else if fdtable::raw(src) >= 8 && !vfork_shadowed(src) {
        src
    } else {
        -1
    };
    if let Some(i) = v[..n].iter().position(|&(t, _)| t == dst) {
        v[i] = v[n - 1];
        n -= 1;
    }
    if origin >= 0 && dst >= 0 && n < VFORK_DUPS_MAX {
        v[n] = (dst, origin);
        n += 1;
    }
    // SAFETY: plain system call.
    VFORK_DUPS_PID.with(|p| p.set(unsafe { libc::getpid() } as u32));
    VFORK_DUPS.with(|c| c.set(v));
    VFORK_DUPS_N.with(|c| c.set(n));
}

// ---------------------------------------------------------------------------------------------
// exec

use crate::fdtable::{self, Slot};
use crate::obj::Obj;
use crate::util::sockopt_int;
use crate::{daemon, handshake, policy, real, setup};
use libc::{c_char, c_int};
use std::sync::Arc;

/// At most this many withdrawn listeners are remembered for a failed exec (more are still
/// withdrawn; they stay so, which only keeps their connections on TCP).
const MAX_WITHDRAWN: usize = 64;

/// Listeners whose SMC announcement was withdrawn for an exec, restored if it fails.
pub struct Withdrawn {
    fds: [c_int; MAX_WITHDRAWN],
    n: usize,
}

impl Withdrawn {
    pub fn restore(&self) {
        for &fd in &self.fds[..self.n.min(MAX_WITHDRAWN)] {
            setup::announce(fd, true);
        }
    }

    /// When the next image does not run the data path: the connections already queued at
    /// each withdrawn listener were announced (their SYN-ACKs went out before the withdrawal),
    /// and their clients' CLC Proposals lie in their streams, which that image would read as
    /// request bytes. The daemon's sweep quarantines them (`smc_ism` `OP_SWEEP`): the eBPF
    /// verdict strips those messages; each client waits for an Accept in vain and continues on
    /// TCP. An image that runs the library serves them as any accept of ours does. Not from a
    /// handler of the program, nor in the child one forked (the request allocates and waits).
    fn sweep_unless_served(&self, img: Image, envp: *const *const c_char) {
        if self.n == 0 || crate::signals::in_handler() || image_runs_library(img, envp) {
            return;
        }
        let vforked = in_vfork_child();
        for &fd in &self.fds[..self.n.min(MAX_WITHDRAWN)] {
            setup::sweep_listener(fd, vforked);
        }
    }
}

/// Whether `fd` is open (errno preserved).
fn is_open(fd: c_int) -> bool {
    let e0 = real::errno();
    // SAFETY: F_GETFD has no argument.
    let r = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    real::set_errno(e0);
    r >= 0
}

/// Whether `fd` is closed at exec (errno preserved; an invalid fd counts as closed).
fn cloexec(fd: c_int) -> bool {
    let e0 = real::errno();
    // SAFETY: F_GETFD has no argument.
    let r = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    real::set_errno(e0);
    r < 0 || r & libc::FD_CLOEXEC != 0
}

/// Before an exec: the program that comes may not run the data path (environment cleared,
/// setuid, static, another language runtime), and one that inherits a listener announcing SMC
/// would read its clients' CLC Proposals as request bytes. So every listener that survives
/// the exec stops announcing; the new image, if it runs the library, announces again at load
/// ([`adopt_inherited_sockets`]). No allocation: this may run in a `vfork` child.
pub fn withdraw_listeners_for_exec() -> Withdrawn {
    let mut w = Withdrawn {
        fds: [-1; MAX_WITHDRAWN],
        n: 0,
    };
    fdtable::for_each_object(|fd, o| {
        if matches!(&**o, Obj::Listener(_)) && !cloexec(fd) && setup::announce(fd, false) {
            if let Some(slot) = w.fds.get_mut(w.n) {
                *slot = fd;
                w.n += 1;
            }
        }
    });
    w
}

/// Before an exec or a spawn: sockets whose handshake is under way and that the next image
/// inherits are decided first, declined where the protocol allows it
/// ([`setup::settle_leaving`]): that image cannot continue the handshake, and would read CLC
/// bytes as data. Not in a `vfork` child: that runs in its parent's memory and must leave the
/// parent's state alone (a documented residual).
/// Finding them allocates nothing (an exec from a signal handler, or from the child a handler
/// forked, may have interrupted `malloc`: `tests/redteam/sigsafe.c execonly`, children aborting
/// in its checks): only a socket to settle costs what settling costs.
fn settle_for_exec() {
    if in_vfork_child() || !fdtable::any_objects() {
        return;
    }
    const SETTLE_MAX: usize = 64;
    let mut todo = [0 as c_int; SETTLE_MAX];
    let (mut n, mut more) = (0, false);
    fdtable::for_each_object(|fd, o| {
        if matches!(&**o, Obj::Handshake(_) | Obj::Pending(_) | Obj::Skip(_)) && !cloexec(fd) {
            match todo.get_mut(n) {
                Some(t) => {
                    *t = fd;
                    n += 1;
                }
                None => more = true,
            }
        }
    });
    for &fd in todo.get(..n).unwrap_or_default() {
        setup::settle_leaving(fd);
    }
    if more {
        for (fd, o) in fdtable::all_objects() {
            if matches!(&*o, Obj::Handshake(_) | Obj::Pending(_) | Obj::Skip(_)) && !cloexec(fd) {
                drop(o);
                setup::settle_leaving(fd);
            }
        }
    }
}

/// SMC connections whose sockets the next image inherits: each fd's reference travels with it
/// (marked in the shared page, [`Conn::mark_in_flight`](crate::conn::Conn::mark_in_flight)) for the image to take over when it
/// adopts the connection. The reference of a close-on-exec fd of a process's own exec is
/// dropped (the kernel closes that fd), unless it is the connection's last one: an
/// inetd-style child (`dup2(conn, 0)`, `dup2(conn, 1)`, the accepted fd close-on-exec) would
/// otherwise leave one behind, and its handler's closes would never end the connection.
/// Restored if the exec or spawn fails. No allocation: this may run in a `vfork` child.
struct Travelling {
    fds: [c_int; MAX_WITHDRAWN],
    n: usize,
    /// A reference was added for each (the child's fd table is a copy: `vfork`, `posix_spawn`).
    added: bool,
    /// Close-on-exec fds whose reference was dropped.
    dropped: [c_int; MAX_WITHDRAWN],
    nd: usize,
}

impl Travelling {
    fn mark(added: bool) -> Travelling {
        let mut t = Travelling {
            fds: [-1; MAX_WITHDRAWN],
            n: 0,
            added,
            dropped: [-1; MAX_WITHDRAWN],
            nd: 0,
        };
        fdtable::for_each_object(|fd, o| {
            if let Obj::Conn(c) = &**o {
                if cloexec(fd) {
                    // In a copy of the fd table (`added`) no reference was counted for it.
                    if !added && t.nd < MAX_WITHDRAWN && c.drop_ref_unless_last() {
                        t.dropped[t.nd] = fd;
                        t.nd += 1;
                    }
                } else if added && vfork_shadowed(fd) {
                    // The vfork child made the number name something else (below if it is
                    // another of our connections).
                } else if t.n < MAX_WITHDRAWN {
                    if added {
                        c.add_ref(1);
                    }
                    c.mark_in_flight();
                    t.fds[t.n] = fd;
                    t.n += 1;
                }
            }
        });
        if added {
            // Numbers the vfork child made name a connection of ours (inetd style:
            // `dup2(conn, 0)`, CPython's `Popen(stdin=conn)`, the original number
            // close-on-exec or closed): the image gets it there, with a reference (the
            // parent's close of its own number must not end the connection) and a mark to
            // adopt. Recorded under the parent's number, where a failed exec finds it again.
            let (dups, nd) = vfork_dups();
            for &(dst, origin) in dups.get(..nd).unwrap_or_default() {
                if t.n >= MAX_WITHDRAWN || cloexec(dst) {
                    continue;
                }
                if let Some(o) = fdtable::get(origin) {
                    if let Obj::Conn(c) = &*o {
                        c.add_ref(1);
                        c.mark_in_flight();
                        t.fds[t.n] = origin;
                        t.n += 1;
                    }
                }
            }
        }
        t
    }

    /// The exec or spawn failed: nothing travelled, no fd was closed.
    fn restore(&self) {
        for &fd in &self.fds[..self.n.min(MAX_WITHDRAWN)] {
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Conn(c) = &*o {
                    if c.take_in_flight() && self.added {
                        c.drop_ref();
                    }
                }
            }
        }
        for &fd in &self.dropped[..self.nd.min(MAX_WITHDRAWN)] {
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Conn(c) = &*o {
                    c.add_ref(1);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// exec into an image without the library: SMC connections switch to TCP first

extern "C" {
    static environ: *const *const c_char;
}

/// The file an exec runs.
#[derive(Clone, Copy)]
enum Image {
    /// A path (relative to the working directory, or to `dirfd` of `execveat`).
    Path(c_int, *const c_char),
    /// A path searched in `PATH` when it has no slash (`execvp`, `execvpe`).
    Search(*const c_char),
    /// An open file (`fexecve`, `execveat` with `AT_EMPTY_PATH`).
    Fd(c_int),
}

/// Whether `envp` (the environment the next image gets) preloads this library.
fn env_preloads_us(envp: *const *const c_char) -> bool {
    let envp = if envp.is_null() {
        // SAFETY: reads the process's environment pointer.
        unsafe { environ }
    } else {
        envp
    };
    if envp.is_null() {
        return false;
    }
    const KEY: &[u8] = b"LD_PRELOAD=";
    const LIB: &[u8] = b"smc_preload";
    let mut i = 0;
    loop {
        // SAFETY: a NULL-terminated array of C strings (exec's contract).
        let e = unsafe { *envp.add(i) };
        if e.is_null() {
            return false;
        }
        // SAFETY: a C string of the array.
        let b = unsafe { std::ffi::CStr::from_ptr(e) }.to_bytes();
        if let Some(v) = b.strip_prefix(KEY) {
            // Each entry naming the library: the loader must find it (after a `chroot` it
            // may not exist in the new root; the loader then ignores it).
            for entry in v.split(|&c| c == b':' || c == b' ') {
                if entry.windows(LIB.len()).any(|w| w == LIB) && preload_reachable(entry) {
                    return true;
                }
            }
        }
        i += 1;
    }
}

/// Whether the loader of a new image would find the `LD_PRELOAD` entry `entry`: a path must
/// name a readable file (from the current root); a bare name is searched by the loader in its
/// own paths (taken as found). No allocation: this may run in a `vfork` child.
fn preload_reachable(entry: &[u8]) -> bool {
    if !entry.contains(&b'/') {
        return true;
    }
    let mut path = [0u8; 4096];
    if entry.len() >= path.len() {
        return true;
    }
    path[..entry.len()].copy_from_slice(entry);
    // SAFETY: a NUL-terminated path in our buffer; integer arguments.
    unsafe {
        libc::syscall(
            libc::SYS_faccessat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::R_OK,
            0,
        ) == 0
    }
}

/// Opens the file an exec would run (read-only, close-on-exec; a `PATH` search like
/// `execvp`'s). No allocation: this may run in a `vfork` child.
fn open_image(img: Image) -> Option<c_int> {
    let open = |dir: c_int, p: *const c_char| -> Option<c_int> {
        // SAFETY: a C string; the raw system call (our `open` would note a new fd).
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat,
                dir,
                p,
                libc::O_RDONLY | libc::O_CLOEXEC,
                0,
            )
        };
        (r >= 0).then_some(r as c_int)
    };
    match img {
        Image::Fd(_) => None,
        Image::Path(dir, p) => open(dir, p),
        Image::Search(f) => {
            // SAFETY: a C string (exec's contract).
            let name = unsafe { std::ffi::CStr::from_ptr(f) }.to_bytes();
            if name.contains(&b'/') || name.is_empty() {
                return open(libc::AT_FDCWD, f);
            }
            // SAFETY: getenv returns a pointer into the environment or NULL.
            let path = unsafe { libc::getenv(c"PATH".as_ptr()) };
            let path: &[u8] = if path.is_null() {
                b"/bin:/usr/bin"
            } else {
                // SAFETY: a C string of the environment.
                unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes()
            };
            let mut buf = [0u8; 4096];
            for dir in path.split(|&b| b == b':') {
                let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
                let n = dir.len() + 1 + name.len();
                if n + 1 > buf.len() {
                    continue;
                }
                buf[..dir.len()].copy_from_slice(dir);
                buf[dir.len()] = b'/';
                buf[dir.len() + 1..n].copy_from_slice(name);
                buf[n] = 0;
                let p = buf.as_ptr() as *const c_char;
                // SAFETY: a C string in our buffer.
                if unsafe { libc::access(p, libc::X_OK) } == 0 {
                    return open(libc::AT_FDCWD, p);
                }
            }
            None
        }
    }
}

/// Whether the file open at `fd` runs without this library even with `LD_PRELOAD` set: the
/// loader ignores it for a setuid or setgid file or one with file capabilities (secure
/// mode), and a static ELF executable has no loader at all.
fn image_drops_preload(fd: c_int) -> bool {
    image_drops_preload_at(fd, 0)
}

/// [`image_drops_preload`]; a `#!` script runs its interpreter, whose file decides (the
/// script's own set-id bits are ignored by the kernel), as deep as the kernel follows them.
/// No allocation: this may run in a `vfork` child.
fn image_drops_preload_at(fd: c_int, depth: u32) -> bool {
    let mut head = [0u8; 256];
    // SAFETY: valid buffer.
    let n = unsafe { libc::pread(fd, head.as_mut_ptr() as *mut libc::c_void, head.len(), 0) };
    if n >= 2 && head[..2] == *b"#!" {
        // The interpreter: after `#!` and blanks, up to a blank or the end of the line.
        let line = &head[2..n as usize];
        let start = line
            .iter()
            .position(|&b| b != b' ' && b != b'\t')
            .unwrap_or(line.len());
        let rest = &line[start..];
        let len = rest
            .iter()
            .position(|&b| b == b' ' || b == b'\t' || b == b'\n' || b == 0)
            .unwrap_or(rest.len());
        if len == 0 || len >= 255 || depth >= 4 {
            return false;
        }
        let mut path = [0u8; 256];
        path[..len].copy_from_slice(&rest[..len]);
        // SAFETY: a NUL-terminated path in our buffer; the raw system call (our `open` would
        // note a new fd).
        let ifd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
                0,
            )
        };
        if ifd < 0 {
            return false; // the exec fails
        }
        let drops = image_drops_preload_at(ifd as c_int, depth + 1);
        // SAFETY: our own fd.
        unsafe { libc::syscall(libc::SYS_close, ifd) };
        return drops;
    }
    // SAFETY: plain old data, all-zero valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return false;
    }
    if st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0 {
        return true;
    }
    // SAFETY: a C string name, no buffer (size query).
    if unsafe { libc::fgetxattr(fd, c"security.capability".as_ptr(), std::ptr::null_mut(), 0) } > 0
    {
        return true;
    }
    // ELF64 without a PT_INTERP program header: static.
    let mut eh = [0u8; 64];
    // SAFETY: valid buffer.
    if unsafe { libc::pread(fd, eh.as_mut_ptr() as *mut libc::c_void, 64, 0) } != 64
        || eh[..4] != *b"\x7fELF"
        || eh[4] != 2
    {
        return false;
    }
    let u16at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
    let phoff = u64::from_le_bytes([
        eh[32], eh[33], eh[34], eh[35], eh[36], eh[37], eh[38], eh[39],
    ]);
    let (phentsize, phnum) = (u16at(&eh, 54), u16at(&eh, 56));
    if phentsize < 4 || phnum == 0 {
        return false;
    }
    let mut ph = [0u8; 4096];
    let len = (phentsize * phnum).min(ph.len());
    // SAFETY: valid buffer of at least `len` bytes.
    let got = unsafe { libc::pread(fd, ph.as_mut_ptr() as *mut libc::c_void, len, phoff as i64) };
    if got < 0 {
        return false;
    }
    let got = got as usize;
    let interp = (0..phnum)
        .map(|i| i * phentsize)
        .take_while(|&o| o + 4 <= got)
        .any(|o| u32::from_le_bytes([ph[o], ph[o + 1], ph[o + 2], ph[o + 3]]) == 3);
    !interp
}

/// Whether the image an exec starts runs this library's data path.
fn image_runs_library(img: Image, envp: *const *const c_char) -> bool {
    if !env_preloads_us(envp) {
        return false;
    }
    match img {
        Image::Fd(fd) => !image_drops_preload(fd),
        _ => match open_image(img) {
            Some(fd) => {
                let drops = image_drops_preload(fd);
                // SAFETY: our own fd.
                unsafe { libc::syscall(libc::SYS_close, fd) };
                !drops
            }
            // Not found: the exec fails.
            None => true,
        },
    }
}

/// How long a switch to TCP waits for the peer's answer (its next operation on the
/// connection) before it resets the connection.
fn switch_wait() -> std::time::Duration {
    handshake::clc_timeout() * 5
}

/// `o` (the connection of `fd`) continues on TCP: the peer asked, or the socket leaves for an
/// image without the library. Switches it ([`Conn::switch_to_tcp`](crate::conn::Conn::switch_to_tcp)) and makes every fd of
/// this process that names it plain TCP. True when the fd is plain now (the caller runs its
/// call on the socket); false when the connection was reset instead (its calls fail).
///
/// When this process holds the peer's end too (both ends of one connection, e.g. a program
/// that talks to itself and then hands one end to stdio or aio, or execs without the library),
/// the peer's end is switched by this call as well, once our marker is out: its next operation
/// may only come from the thread that is waiting here (before: that thread waited the whole
/// switch wait for itself, then both ends were reset).
pub(crate) fn continue_on_tcp(fd: c_int, o: &Arc<Obj>) -> bool {
    switch_end(fd, o, true, None)
}

/// [`continue_on_tcp`] for a socket that leaves for an image without the library: when the
/// peer had closed and its last bytes are unread in our ring, they are handed on in a private
/// loopback connection ([`crate::conn::Switched::Tail`]), whose reading socket is put in
/// `tail` (the caller's to close) for the caller to put at the numbers the image inherits.
///
/// `for_exec`: the process is about to exec (or spawn) that image, whose switches all end by
/// this deadline (one switch wait for the exec, not one per connection); when the bytes are handed
/// on, the numbers of the connection keep their slots (a failed exec gives the bytes back,
/// [`Tails::finish`]; after a successful one nothing of this process is left).
fn continue_on_tcp_leaving(
    fd: c_int,
    o: &Arc<Obj>,
    tail: &mut Option<(c_int, crate::conn::TailUndo)>,
    for_exec: Option<std::time::Instant>,
) -> bool {
    switch_end(fd, o, true, Some((tail, for_exec)))
}

/// The end of this process's connection whose DMBs are `c`'s, crossed (its own is `c`'s
/// peer's and the other way round): one of its numbers and its object.
fn own_peer_end(c: &crate::conn::Conn) -> Option<(c_int, Arc<Obj>)> {
    if c.own_token == 0 || c.peer_token == 0 {
        return None;
    }
    let mut found = None;
    fdtable::for_each_object(|ofd, x| {
        if found.is_none() {
            if let Obj::Conn(p) = &**x {
                if p.own_token == c.peer_token && p.peer_token == c.own_token {
                    found = Some((ofd, x.clone()));
                }
            }
        }
    });
    found
}

type TailSlot<'a> = (
    &'a mut Option<(c_int, crate::conn::TailUndo)>,
    Option<std::time::Instant>,
);

fn switch_end(fd: c_int, o: &Arc<Obj>, drive_own_peer: bool, tail: Option<TailSlot>) -> bool {
    let Obj::Conn(c) = &**o else { return false };
    let deadline = tail
        .as_ref()
        .and_then(|(_, d)| *d)
        .unwrap_or_else(|| std::time::Instant::now() + switch_wait());
    let vforked = in_vfork_child();
    let peer_here = || {
        if !drive_own_peer {
            return;
        }
        if let Some((pfd, po)) = own_peer_end(c) {
            if vforked && (vfork_shadowed(pfd) || !is_open(pfd)) {
                // A vfork child whose parent (suspended) holds the peer's end: switched here
                // through the parent's number, which must name that socket in this child too.
                return;
            }
            crate::debug!("fd {fd}: the peer's end is ours (fd {pfd}): it switches too");
            // Never back to this end (its locks are held here): `drive_own_peer` false.
            let _ = switch_end(pfd, &po, false, None);
        }
    };
    let tail_ok = tail.is_some();
    match c.switch_to_tcp(
        fd,
        deadline,
        tail_ok,
        || setup::leave_shortcut_for_tcp(c.io_now(fd), vforked),
        peer_here,
    ) {
        crate::conn::Switched::Reset => return false,
        crate::conn::Switched::Already => {}
        // Counted as closed here, once per connection end: its closes are plain TCP ones.
        crate::conn::Switched::Tcp => crate::stats::conn_closed(c),
        crate::conn::Switched::Tail(t, undo) => {
            crate::stats::conn_closed(c);
            let for_exec = tail.as_ref().is_some_and(|(_, e)| e.is_some());
            if let Some((slot, _)) = tail {
                *slot = Some((t, undo));
            } else {
                // SAFETY: our own descriptor, never given out (not asked for: not reached).
                unsafe { real::close(t) };
            }
            if for_exec {
                return true;
            }
        }
    }
    if c.stash_left() {
        if tail_ok {
            // The socket leaves for an image that reads it itself, and bytes of the stream
            // that our switch read wait in our ring, where that image cannot read them: the
            // connection fails cleanly instead of losing them.
            crate::debug!(
                "fd {fd}: leaves for an image without the library with stream bytes read by                  the switch unread: the connection is reset"
            );
            c.reset_now(fd);
            return false;
        }
        // Our numbers stay the connection's until the program read those bytes (its reads
        // take them first; everything else goes to the socket).
        return true;
    }
    if vforked {
        return true;
    }
    let mut fds = Vec::new();
    fdtable::for_each_object(|ofd, x| {
        if Arc::ptr_eq(x, o) {
            fds.push(ofd);
        }
    });
    for ofd in fds {
        if fdtable::get(ofd).is_some_and(|x| Arc::ptr_eq(&x, o)) {
            setup::settle_plain(ofd);
        }
    }
    true
}

/// Before an exec into an image that does not run the library: the SMC connections it
/// inherits switch to TCP, so that it reads and writes them as plain TCP sockets (otherwise
/// it would read doorbells, or wait for bytes that travel in the rings). Also from a `vfork`
/// child, which leaves its parent's slots alone (see below). The connections whose last bytes
/// are handed on ([`Tails`]): the caller's to [`Tails::finish`] once it knows whether the image
/// runs.
fn switch_for_exec(img: Image, envp: *const *const c_char) -> Tails {
    let mut tails = Tails::default();
    if !fdtable::any_objects() {
        return tails;
    }
    if image_runs_library(img, envp) {
        reset_stashed_for_exec();
        return tails;
    }
    if in_vfork_child() {
        tails.vforked = true;
        // The child's table is a copy: a connection reaches the next image at a number of the
        // parent's that this child left alone, or at one it made name it (`dup2(conn, 0)`).
        // The switch is the connection's, shared with the suspended parent (same memory):
        // from now on every holder continues on the socket (`F_SWITCHED`); the parent's slots
        // change at its next call, not here.
        let mut inherited: Vec<(c_int, Arc<Obj>)> = Vec::new();
        for (fd, o) in fdtable::all_objects() {
            if matches!(&*o, Obj::Conn(_)) && !vfork_shadowed(fd) && !cloexec(fd) {
                inherited.push((fd, o));
            }
        }
        let (dups, n) = vfork_dups();
        for &(t, origin) in &dups[..n] {
            if let Some(o) = fdtable::get(origin) {
                let known = inherited.iter().any(|(_, x)| Arc::ptr_eq(x, &o));
                if matches!(&*o, Obj::Conn(_)) && !known && !cloexec(t) {
                    inherited.push((t, o));
                }
            }
        }
        for (fd, o) in inherited {
            crate::debug!(
                "fd {fd}: the next image (exec in a vfork child) does not run the library: \
                 switch to TCP"
            );
            tails.switch(fd, &o);
        }
        return tails;
    }
    let leaving: Vec<(c_int, Arc<Obj>)> = fdtable::all_objects()
        .into_iter()
        .filter(|(fd, o)| matches!(&**o, Obj::Conn(_)) && !cloexec(*fd))
        .collect();
    // A tail takes three descriptors while it is made, and a copy of an original one each.
    tails.keep_orig = fds_left().is_some_and(|n| n >= leaving.len() + 8);
    for (fd, o) in leaving {
        crate::debug!("fd {fd}: the next image does not run the library: switch to TCP");
        tails.switch(fd, &o);
    }
    tails
}

/// How many more descriptors this process may open (`RLIMIT_NOFILE` less those open).
fn fds_left() -> Option<usize> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid rlimit to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } != 0 {
        return None;
    }
    let open = open_fds()?;
    usize::try_from(rl.rlim_cur).ok()?.checked_sub(open)
}

/// How many descriptors this process has open: the entries of `/proc/self/fd`, read with
/// `getdents64` into a buffer on the stack. Not `read_dir`: `opendir` takes its buffer from
/// `malloc`, and this runs in an exec's switch to TCP, which may come from a child a signal
/// handler forked while `malloc` was interrupted (red team round 17 `execnolibonly`: children
/// aborted in `malloc()`'s checks).
fn open_fds() -> Option<usize> {
    // SAFETY: a NUL-terminated path; a new descriptor of ours, closed below.
    let d = unsafe {
        real::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            0,
        )
    };
    if d < 0 {
        return None;
    }
    let mut buf = [0u8; 4096];
    let mut n = 0usize;
    let ok = loop {
        // SAFETY: `buf` is writable for its length; `d` is our directory descriptor.
        let r = unsafe { libc::syscall(libc::SYS_getdents64, d, buf.as_mut_ptr(), buf.len()) };
        if r < 0 {
            break false;
        }
        if r == 0 {
            break true;
        }
        let got = buf.get(..r as usize).unwrap_or(&[]);
        let mut off = 0usize;
        // `struct linux_dirent64`: ino u64, off i64, reclen u16, type u8, name (NUL-terminated).
        while let Some(rec) = got.get(off..) {
            let (Some(&a), Some(&b)) = (rec.get(16), rec.get(17)) else {
                break;
            };
            let reclen = usize::from(u16::from_ne_bytes([a, b]));
            if reclen == 0 {
                break;
            }
            // "." and "..": names that start with a dot.
            if rec.get(19) != Some(&b'.') {
                n += 1;
            }
            off += reclen;
        }
    };
    // SAFETY: our descriptor, closed once.
    unsafe { real::close(d) };
    // The directory's own descriptor was one of them.
    ok.then(|| n.saturating_sub(1))
}

/// How many connections (and numbers of them) one exec hands on with their peer's last bytes.
const TAILS_MAX: usize = 64;

/// The connections handed on to an image without the library as private loopback
/// connections (their peers had closed; [`continue_on_tcp_leaving`]): each one's reading
/// socket, put at every number of it the image inherits (the first switch makes it, the other
/// numbers of the same connection find it here), and what [`Tails::finish`] needs to take it
/// all back when the exec fails: the connection and its reading position, and the original
/// socket of each number (a close-on-exec copy). No allocation: this may run in a `vfork`
/// child (the numbers are the child's own; the parent's table is not touched).
struct Tails {
    made: [(usize, c_int); TAILS_MAX],
    undo: [Option<(Arc<Obj>, crate::conn::TailUndo)>; TAILS_MAX],
    n: usize,
    /// A number the tail was put at, the original socket it named (-1: no copy was made),
    /// and the index of its connection in `made`.
    put: [(c_int, c_int, usize); TAILS_MAX],
    n_put: usize,
    /// Whether copies of the original sockets are kept: only where a failed exec leaves this
    /// process with the numbers (not in a `vfork` child, whose numbers are its own) and while
    /// descriptors are left for every tail (red team rt15: at `RLIMIT_NOFILE` 30, 2 of 20
    /// connections got their bytes; the bytes of a successful exec come first).
    keep_orig: bool,
    /// When every switch of this exec ends at the latest.
    deadline: std::time::Instant,
    /// Made in a `vfork` child: the numbers are the child's, the slots and epoll sets the
    /// parent's.
    vforked: bool,
}

impl Default for Tails {
    fn default() -> Self {
        Tails {
            made: [(0, -1); TAILS_MAX],
            undo: [const { None }; TAILS_MAX],
            n: 0,
            put: [(-1, -1, 0); TAILS_MAX],
            n_put: 0,
            keep_orig: false,
            deadline: std::time::Instant::now() + switch_wait(),
            vforked: false,
        }
    }
}

/// The private connection `tail` takes the place of a socket whose open file was
/// non-blocking: so is it (red team rt15: an event loop's socket went blocking in the next
/// image and its read waited).
fn set_nonblocking(tail: c_int, on: bool) {
    if !on {
        return;
    }
    let e0 = real::errno();
    // SAFETY: plain system calls on our own descriptor.
    unsafe {
        let fl = real::fcntl(tail, libc::F_GETFL, 0);
        if fl >= 0 {
            real::fcntl(
                tail,
                libc::F_SETFL,
                (fl | libc::O_NONBLOCK) as libc::c_ulong,
            );
        }
    }
    real::set_errno(e0);
}

impl Tails {
    fn switch(&mut self, fd: c_int, o: &Arc<Obj>) {
        let key = Arc::as_ptr(o) as usize;
        let known = self.made[..self.n]
            .iter()
            .position(|(k, _)| *k == key)
            .map(|i| (i, self.made[i].1));
        let nonblock = crate::util::nonblocking(fd);
        let (idx, tail) = match known {
            Some(k) => k,
            None => {
                let mut t = None;
                continue_on_tcp_leaving(fd, o, &mut t, Some(self.deadline));
                let Some((t, undo)) = t else {
                    return;
                };
                set_nonblocking(t, nonblock);
                if self.n == self.made.len() {
                    // No room to remember it: this number gets it, the connection's other
                    // numbers (if any) keep its ended socket, and a failed exec cannot give
                    // the bytes back.
                    self.put_at(fd, t);
                    // SAFETY: our own descriptor, which `fd` names now.
                    unsafe { real::close(t) };
                    return;
                }
                self.made[self.n] = (key, fd);
                self.undo[self.n] = Some((o.clone(), undo));
                self.n += 1;
                (self.n - 1, t)
            }
        };
        let first = known.is_none();
        crate::debug!("fd {fd}: its peer's unread last bytes go on in a connection of their own");
        // The original socket, kept (close-on-exec) for a failed exec.
        let orig = if self.keep_orig && self.n_put < self.put.len() {
            // SAFETY: plain system call on our own descriptor.
            unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) }
        } else {
            -1
        };
        if self.n_put < self.put.len() {
            self.put[self.n_put] = (fd, orig, idx);
            self.n_put += 1;
        } else if let Some(u) = self.undo.get_mut(idx) {
            // Not remembered: a failed exec cannot give this connection's bytes back.
            *u = None;
        }
        // The slots keep the connection (a failed exec goes on with it; after a successful
        // one, or at this process's next call on it once it spawned the image, `F_SWITCHED`
        // makes them plain). In a `vfork` child the slots are the parent's anyway.
        self.put_at(fd, tail);
        if first {
            // The connection's other numbers take it from `fd` (one descriptor fewer held).
            // SAFETY: our own descriptor, which `fd` names now.
            unsafe { real::close(tail) };
        }
    }

    /// `src` (a tail) at `fd`; this process's epoll registrations of `fd` move with it (not in
    /// a `vfork` child, whose numbers are not its parent's).
    fn put_at(&self, fd: c_int, src: c_int) {
        // SAFETY: plain system call on our own descriptors; `fd` keeps its close-on-exec flag
        // off (the image inherits it), as `dup2` leaves it.
        let put = || unsafe {
            real::dup2(src, fd);
        };
        if self.vforked {
            put();
        } else {
            crate::epoll::file_replaced(fd, put);
        }
    }

    /// After the exec (or spawn): `failed`, it did not run, and each connection whose numbers
    /// can all name its original socket again (a copy was kept of each; always in a `vfork`
    /// child, whose numbers are its own) has them back and its peer's last bytes back in its
    /// ring ([`Conn::undo_tail`](crate::conn::Conn::undo_tail)); one that cannot keeps the
    /// private connection at its numbers (this process reads the bytes there, once). Not
    /// failed: a spawned image has them, and this process's numbers go on as plain TCP
    /// sockets now (they name the private connection too). The copies kept here are closed.
    fn finish(mut self, failed: bool) {
        let e0 = real::errno();
        if !self.vforked {
            for &(_, orig, i) in &self.put[..self.n_put] {
                if orig < 0 {
                    if let Some(u) = self.undo.get_mut(i) {
                        *u = None;
                    }
                }
            }
        }
        for &(fd, orig, i) in &self.put[..self.n_put] {
            if orig < 0 {
                continue;
            }
            if failed && self.undo.get(i).is_some_and(|u| u.is_some()) {
                // `fd` names the original socket again, without close-on-exec (as it was:
                // only such numbers get a tail).
                self.put_at(fd, orig);
            }
            // SAFETY: our own copy.
            unsafe { real::close(orig) };
        }
        for (i, u) in self.undo[..self.n].iter().enumerate() {
            match u {
                Some((o, undo)) if failed => {
                    if let Obj::Conn(c) = &**o {
                        if c.undo_tail(*undo) {
                            crate::stats::conn_reopened(c);
                        }
                    }
                }
                _ if self.vforked => {}
                _ => {
                    // This process goes on with the private connection at the numbers.
                    let fd = self.made[i].1;
                    if let Some(o) = fdtable::get(fd) {
                        let _ = continue_on_tcp(fd, &o);
                    }
                }
            }
        }
        real::set_errno(e0);
    }
}

/// Runs `exec` (which returns only when it failed) with the listeners withdrawn around it.
fn around_exec(img: Image, envp: *const *const c_char, exec: impl FnOnce() -> c_int) -> c_int {
    // This process's own exec ends its other threads: a handshake one of them drives inside
    // a blocking `connect` is decided first (a `vfork` child's exec ends none of its parent's).
    if !in_vfork_child() {
        setup::wait_for_driven_handshakes();
    }
    settle_for_exec();
    let tails = switch_for_exec(img, envp);
    let w = withdraw_listeners_for_exec();
    w.sweep_unless_served(img, envp);
    // A vfork child's fds are copies of its parent's (one more reference each); a process's
    // own exec takes its references along.
    let t = Travelling::mark(in_vfork_child());
    let r = exec();
    let e = real::errno();
    t.restore();
    w.restore();
    tails.finish(true);
    if !in_vfork_child() {
        undo_std_tails();
    }
    real::set_errno(e);
    r
}

pub unsafe fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    around_exec(Image::Path(libc::AT_FDCWD, path), envp, || unsafe {
        real::execve(path, argv, envp)
    })
}

pub unsafe fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(
        Image::Path(libc::AT_FDCWD, path),
        std::ptr::null(),
        || unsafe { real::execv(path, argv) },
    )
}

pub unsafe fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(Image::Search(file), std::ptr::null(), || unsafe {
        real::execvp(file, argv)
    })
}

pub unsafe fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: as above.
    around_exec(Image::Search(file), envp, || unsafe {
        real::execvpe(file, argv, envp)
    })
}

pub unsafe fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(Image::Fd(fd), envp, || unsafe {
        real::fexecve(fd, argv, envp)
    })
}

pub unsafe fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: a non-NULL path is a C string (execveat's contract).
    let empty = !path.is_null() && unsafe { *path } == 0 && flags & libc::AT_EMPTY_PATH != 0;
    let img = if empty {
        Image::Fd(dirfd)
    } else {
        Image::Path(dirfd, path)
    };
    // SAFETY: as above.
    around_exec(img, envp, || unsafe {
        real::execveat(dirfd, path, argv, envp, flags)
    })
}

/// `posix_spawn`/`posix_spawnp`: the child execs before the call returns; on success it holds
/// the inherited listeners, so they stay withdrawn (a child that runs the library announces
/// again at its load). File actions that `dup2` a close-on-exec listener onto another fd are
/// not seen (glibc keeps them opaque); such a listener keeps announcing.
pub unsafe fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    at: *const libc::posix_spawnattr_t,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
    search_path: bool,
) -> c_int {
    settle_for_exec();
    let img = if search_path {
        Image::Search(path)
    } else {
        Image::Path(libc::AT_FDCWD, path)
    };
    let tails = switch_for_exec(img, envp as *const *const c_char);
    let w = withdraw_listeners_for_exec();
    w.sweep_unless_served(img, envp as *const *const c_char);
    // The child's inherited fds are copies: one more reference each, travelling.
    let t = Travelling::mark(true);
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe {
        if search_path {
            real::posix_spawnp(pid, path, fa, at, argv, envp)
        } else {
            real::posix_spawn(pid, path, fa, at, argv, envp)
        }
    };
    if r != 0 {
        t.restore();
        w.restore();
    }
    tails.finish(r != 0);
    r
}

/// `system(3)` and `popen(3)`: glibc starts `/bin/sh -c CMD` with its internal spawn, which
/// the interposition never sees, with every fd that is not close-on-exec. As for
/// [`posix_spawn`]: handshakes are decided and connections the shell would not serve switch to
/// TCP first, listeners are withdrawn, and each inherited connection's reference travels with
/// the child (one more reference, marked for the shell's library to adopt at load). Without
/// that reference, a parent that closed its copy as soon as `popen` returned (the usual
/// shape: `popen` then `close`) closed the connection before the shell had adopted it.
/// `sh` gets the process's environment (`environ`).
fn around_shell<T>(failed: impl Fn(&T) -> bool, spawn: impl FnOnce() -> T) -> T {
    if in_vfork_child() || !fdtable::any_objects() {
        return spawn();
    }
    settle_for_exec();
    let sh = Image::Path(libc::AT_FDCWD, c"/bin/sh".as_ptr());
    let tails = switch_for_exec(sh, std::ptr::null());
    let w = withdraw_listeners_for_exec();
    w.sweep_unless_served(sh, std::ptr::null());
    let t = Travelling::mark(true);
    let r = spawn();
    let failed = failed(&r);
    let e = real::errno();
    if failed {
        t.restore();
        w.restore();
    }
    tails.finish(failed);
    real::set_errno(e);
    r
}

/// `system(3)`; see [`around_shell`]. A NULL command only asks whether a shell exists.
///
/// # Safety
/// `cmd` is the caller's string or NULL.
pub unsafe fn system(cmd: *const c_char) -> c_int {
    if cmd.is_null() {
        // SAFETY: as above.
        return unsafe { real::system(cmd) };
    }
    // The shell could not be started: -1 (status 127 means it ran and exec of it failed, in
    // which case the child's copies went with it).
    // SAFETY: as above.
    around_shell(|&r| r == -1, || unsafe { real::system(cmd) })
}

/// `popen(3)`; see [`around_shell`].
///
/// # Safety
/// `cmd` and `mode` are the caller's strings.
pub unsafe fn popen(cmd: *const c_char, mode: *const c_char) -> *mut libc::FILE {
    // SAFETY: as above.
    around_shell(
        |f: &*mut libc::FILE| f.is_null(),
        || unsafe { real::popen(cmd, mode) },
    )
}

/// At load: listening TCP sockets this image inherited (across exec from an image that
/// withdrew their announcement) are served by this image's data path, so they announce SMC
/// again and become our listeners; unconnected TCP sockets may opt in ([`adopt_if_unconnected`]).
/// A listener that never announced (listening before an image with the library saw it: systemd
/// socket activation) gets no option into its SYN-ACKs: the eBPF programs arm that only at its
/// `listen`, so its connections stay TCP (`PEERNOSMC` at both ends).
/// `socks`: as for `ops::adopt_orphans_after_exec`, which ran first.
pub fn adopt_inherited_sockets(socks: &[c_int]) {
    if !policy::enabled() {
        return;
    }
    for &fd in socks {
        adopt_if_listener(fd);
        adopt_if_unconnected(fd);
    }
}

/// The sockets among the descriptors this image found open at load (one walk of
/// `/proc/self/fd` and an `fstat` each; no socket option asked of a file that is none), for
/// the two adoptions above it.
pub fn inherited_sockets() -> Vec<c_int> {
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let fds: Vec<c_int> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.into_iter()
        .filter(|&fd| {
            // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid
            // value.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid out buffer.
            let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
            ok && st.st_mode & libc::S_IFMT == libc::S_IFSOCK
        })
        .collect()
}

/// `fd`, unknown here, may opt in like a socket this process created if it is a TCP socket
/// that neither listens nor has started to connect: bound by the image before the exec, made
/// a listener by this one (uvicorn `--workers`, Python `multiprocessing` "spawn": the parent
/// binds, each worker it spawns listens; their clients fell back `PEERNOSMC`), or received
/// with `SCM_RIGHTS` (Node's cluster primary binds and passes the socket to its workers).
fn adopt_if_unconnected(fd: c_int) {
    if fdtable::raw(fd) != 0 || !is_unconnected_tcp(fd) {
        return;
    }
    crate::debug!("fd {fd}: an unconnected TCP socket from elsewhere: may opt in");
    fdtable::set_tag(fd, fdtable::TAG_TCP);
    setup::forget_rcvbuf(fd);
}

/// `fd` becomes one of our listeners if it is a listening TCP socket (inherited or received),
/// unless a live process that does not run the library holds it too ([`held_without_library`]):
/// that process may accept any connection whose SYN-ACK announces SMC and would read its
/// client's CLC Proposal as request bytes (red team rt20 `rt20_mix.py`: a library process
/// makes the listener and execs an image without the library, which forks and execs a library
/// image that inherits it; the image without the library read 51 of 80 Proposals). Such a
/// listener stays plain TCP here (its connections `PEERNOSMC` at both ends), said in the debug
/// log. Checked before and again after the announcement: a holder that turned into an image
/// without the library in between (its own exec withdrew the listener, which our announcement
/// would revive) finds the listener withdrawn again and its queue swept. Not when systemd names
/// us (`LISTEN_PID`: socket activation, whose manager holds the listener without accepting).
pub fn adopt_if_listener(fd: c_int) {
    if fdtable::raw(fd) != 0 || !is_tcp_listener(fd) || !policy::enabled() {
        return;
    }
    let check = !listen_pid_is_us();
    if check {
        if let Some(pid) = held_without_library(fd) {
            crate::debug!(
                "fd {fd}: inherited TCP listener also held by pid {pid}, which does not run \
                 the library: stays TCP"
            );
            return;
        }
    }
    if setup::opt_in(fd) {
        if check {
            if let Some(pid) = held_without_library(fd) {
                setup::announce(fd, false);
                setup::sweep_listener(fd, in_vfork_child());
                crate::debug!(
                    "fd {fd}: inherited TCP listener also held by pid {pid}, which does not \
                     run the library (found after the announcement): withdrawn, stays TCP"
                );
                return;
            }
        }
        crate::debug!("fd {fd}: inherited TCP listener: announces SMC");
        drop(fdtable::replace(
            fd,
            Slot::Obj(Arc::new(setup::listener_obj(fd))),
        ));
    }
}

/// Whether `LISTEN_PID` (systemd socket activation, `sd_listen_fds`) names this process.
fn listen_pid_is_us() -> bool {
    std::env::var("LISTEN_PID")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .is_some_and(|p| p == crate::pid())
}

/// At most this many other processes are looked at for [`held_without_library`].
const HOLDERS_MAX: usize = 1024;

/// Another live process that holds the socket of `fd` and does not map this library (its
/// pid): among our parent, its other children and the processes of our cgroup (unless that is
/// the root of the hierarchy). Processes whose maps say they run the library are not read
/// further (a pre-fork server's many workers cost one maps read each); the descriptors of the
/// others are. Processes whose descriptors cannot be read (another uid without
/// `CAP_SYS_PTRACE`) are not known to hold it. Runs once per inherited or received listener.
fn held_without_library(fd: c_int) -> Option<u32> {
    let e0 = real::errno();
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out buffer.
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    real::set_errno(e0);
    if !ok {
        return None;
    }
    let want = format!("socket:[{}]", st.st_ino);
    let me = crate::pid();
    let mut pids: Vec<u32> = Vec::new();
    // SAFETY: plain system call.
    let ppid = unsafe { libc::getppid() };
    if let Ok(pp) = u32::try_from(ppid) {
        if pp > 1 {
            pids.push(pp);
            if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pp}/task")) {
                for t in tasks.flatten() {
                    if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                        pids.extend(
                            list.split_whitespace()
                                .filter_map(|p| p.parse::<u32>().ok()),
                        );
                    }
                }
            }
        }
    }
    if let Ok(mount) = smc_cgroup::cgroup2_mount() {
        if let Some(dir) = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .as_deref()
            .and_then(smc_cgroup::parse_proc_cgroup)
            .and_then(|path| smc_cgroup::dir_of(&mount, path))
        {
            if dir != mount.mount_point {
                if let Ok(list) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    pids.extend(
                        list.split_whitespace()
                            .filter_map(|p| p.parse::<u32>().ok()),
                    );
                }
            }
        }
    }
    let mut seen: Vec<u32> = Vec::new();
    let found = pids.into_iter().find(|&pid| {
        if pid == me || seen.contains(&pid) || seen.len() >= HOLDERS_MAX {
            return false;
        }
        seen.push(pid);
        if maps_library(pid) == Some(true) {
            return false;
        }
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return false;
        };
        fds.flatten()
            .any(|f| std::fs::read_link(f.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
    });
    real::set_errno(e0);
    found
}

fn is_tcp_listener(fd: c_int) -> bool {
    let e0 = real::errno();
    let yes = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(1)
        && sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
        && matches!(
            sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        );
    real::set_errno(e0);
    yes
}

/// Whether `fd` is a TCP socket (IPv4 or IPv6) that neither listens nor has started to connect
/// (state `TCP_CLOSE`: created, perhaps bound).
fn is_unconnected_tcp(fd: c_int) -> bool {
    let e0 = real::errno();
    let tcp = sockopt_int(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
        && matches!(
            sockopt_int(fd, libc::SOL_SOCKET, libc::SO_DOMAIN),
            Some(libc::AF_INET | libc::AF_INET6)
        )
        && sockopt_int(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) == Some(0);
    let state = tcp && crate::util::tcp_state(fd) == Some(crate::conn::TCP_CLOSE);
    real::set_errno(e0);
    state
}

// ---------------------------------------------------------------------------------------------
// fd identity

/// Socket cookie of `fd` (errno preserved).
pub(crate) fn cookie(fd: c_int) -> Option<u64> {
    crate::util::sock_cookie(fd)
}

/// Calls `f` with every fd of the `SCM_RIGHTS` messages in `m`.
///
/// # Safety
/// `m`'s control buffer is valid for `msg_controllen` bytes.
unsafe fn for_each_passed_fd(m: &libc::msghdr, mut f: impl FnMut(c_int)) {
    if m.msg_control.is_null() || m.msg_controllen < std::mem::size_of::<libc::cmsghdr>() {
        return;
    }
    // SAFETY: CMSG_* walk the control buffer within msg_controllen (the caller's contract).
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: `c` points to a complete cmsghdr inside the buffer (CMSG_FIRSTHDR/NXTHDR).
        let h = unsafe { std::ptr::read_unaligned(c) };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: as above; the data of an SCM_RIGHTS message is an array of ints.
            let data = unsafe { libc::CMSG_DATA(c) } as *const c_int;
            let hdr = data as usize - c as usize;
            let n = (h.cmsg_len as usize).saturating_sub(hdr) / std::mem::size_of::<c_int>();
            for i in 0..n {
                // SAFETY: within the message's data (n computed from cmsg_len).
                f(unsafe { std::ptr::read_unaligned(data.add(i)) });
            }
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
}

/// The fds of the `SCM_RIGHTS` messages the kernel just put into `m`, each first given to
/// `created` (`ops::fd_created`, from the layer above: a stale slot at that number is dropped).
///
/// # Safety
/// `m` is a msghdr the kernel just filled.
pub unsafe fn fds_received(m: &libc::msghdr, created: fn(c_int)) {
    // SAFETY: the caller's contract.
    unsafe {
        for_each_passed_fd(m, |fd| {
            created(fd);
            fd_arrived(fd);
        })
    };
}

/// SMC connections on their way through a Unix socket: each holds one reference of its
/// connection (as the kernel holds one of the socket), so that closing the sender's fd right
/// after `sendmsg` (Node cluster, fd-passing proxies) does not end the connection; a receiver
/// in this process takes it over ([`fd_arrived`]). Bounded: the oldest is let go (its
/// reference dropped) when the list is full.
struct InFlight {
    cookie: u64,
    obj: Arc<Obj>,
}

const MAX_IN_FLIGHT: usize = 256;

static IN_FLIGHT: crate::forklock::ForkMutex<std::collections::VecDeque<InFlight>> =
    crate::forklock::ForkMutex::new(std::collections::VecDeque::new);

fn in_flight() -> &'static crate::forklock::ForkMutex<std::collections::VecDeque<InFlight>> {
    &IN_FLIGHT
}

/// An in-flight entry let go (the list is full, or the `sendmsg` failed): its travelling
/// reference is dropped unless a receiver (in any process) has taken it over.
fn release(o: &Obj) {
    if let Obj::Conn(c) = o {
        if c.take_in_flight() {
            c.drop_ref();
        }
    }
}

/// Whether the process at the other end of the Unix socket `via` runs this library, as far as
/// can be told: the peer's pid as the kernel recorded it (`SO_PEERCRED`: the process that
/// connected, listened or made the pair) maps a library of our file name. `None`: not known
/// (no peer credentials, a datagram socket, its maps not readable).
fn receiver_runs_library(via: c_int) -> Option<bool> {
    // SAFETY: a zeroed ucred is valid output space.
    let mut cr: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let e0 = real::errno();
    // SAFETY: valid out pointers of their lengths.
    let r = unsafe {
        real::getsockopt(
            via,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cr as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    real::set_errno(e0);
    if r != 0 || cr.pid <= 0 {
        return None;
    }
    if cr.pid as u32 == crate::pid() {
        // A pair this process made (or a connection to itself): the other end may have gone
        // to a child, with a `fork` before the child's `exec` into an image without the
        // library. Its holders among our children say (one without the library is enough).
        // Looked up at most once a second per socket (Node's cluster primary passes every
        // connection over the pair it made for each worker).
        let e0 = real::errno();
        // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid out buffer.
        let key = (unsafe { libc::fstat(via, &mut st) } == 0).then_some((st.st_dev, st.st_ino));
        real::set_errno(e0);
        let now = std::time::Instant::now();
        let fresh = |t: std::time::Instant| now.duration_since(t).as_millis() < 1000;
        if let (Some(k), Ok(cache)) = (key, PAIR_VERDICTS.try_lock()) {
            if let Some(&(_, v, _)) = cache.iter().find(|(x, _, t)| *x == k && fresh(*t)) {
                return Some(v);
            }
        }
        // Only children without the library have their descriptors read (red team rt12
        // `rt12_prefork`: 32 workers of 200 fds each made 300 passes take 12.3 s, TCP 65 ms).
        let v = crate::util::unix_peer::peer_inode(via).is_none_or(|ino| {
            crate::util::unix_peer::children_holding(ino, |pid| maps_library(pid) != Some(true))
                .is_empty()
        });
        if let (Some(k), Ok(mut cache)) = (key, PAIR_VERDICTS.try_lock()) {
            cache.retain(|(x, _, t)| *x != k && fresh(*t));
            if cache.len() < 1024 {
                cache.push((k, v, now));
            }
        }
        return Some(v);
    }
    maps_library(cr.pid as u32)
}

/// Verdicts of [`receiver_runs_library`] on pairs this process made: (device, inode) of our
/// end, the verdict, when it was made. Only ever `try_lock`ed (a `fork` while another thread
/// held it leaves the child without the cache, never stuck).
static PAIR_VERDICTS: std::sync::Mutex<Vec<PairVerdict>> = std::sync::Mutex::new(Vec::new());

type PairVerdict = ((u64, u64), bool, std::time::Instant);

/// Whether process `pid` maps a library of our file name (`None`: its maps not readable).
fn maps_library(pid: u32) -> Option<bool> {
    let name = library_name()?;
    let maps = std::fs::read(format!("/proc/{pid}/maps")).ok()?;
    Some(maps.windows(name.len()).any(|w| w == name.as_slice()))
}

/// The file name of this library (`/libsmc_preload.so`, as the dynamic linker mapped it).
fn library_name() -> Option<Vec<u8>> {
    static NAME: crate::forklock::ForkOnce<Option<Vec<u8>>> = crate::forklock::ForkOnce::new();
    NAME.get_or_init(|| {
        // SAFETY: a zeroed Dl_info is valid output space; the address is one of our functions.
        let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::dladdr(library_name as *const libc::c_void, &mut info) } == 0
            || info.dli_fname.is_null()
        {
            return None;
        }
        // SAFETY: dladdr gives a NUL-terminated path.
        let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_bytes();
        let base = path.rsplit(|&b| b == b'/').next()?;
        (!base.is_empty()).then(|| [b"/", base].concat())
    })
    .clone()
}

/// Before an exec into an image that runs the library: a connection that continues on TCP
/// with bytes its switch read still in our ring ([`crate::conn::Conn::stash_left`]), at a
/// number the image inherits, is reset. The image does not take a switched connection over
/// (it left the shortcut) and would read the socket past those bytes: red team rt21
/// `execlib`, 4.4 and 6.6 of 7.3 MiB read, then a clean EOF, 3 of 3. A clean failure instead
/// (as an image without the library gets, `switch_end`), also when the exec then fails.
fn reset_stashed_for_exec() {
    for (fd, o) in fdtable::all_objects() {
        if let Obj::Conn(c) = &*o {
            if c.stash_left() && !cloexec(fd) {
                crate::debug!(
                    "fd {fd}: goes to the next image with stream bytes its switch read unread                      in our ring: the connection is reset"
                );
                c.reset_now(fd);
            }
        }
    }
}

/// Before a `sendmsg` on `via`: our connections among its `SCM_RIGHTS` fds go in flight.
/// Returns how many, for [`fds_not_sent`]. An SMC connection bound for a process that does not
/// run the library ([`receiver_runs_library`]: a program without it, which would read the
/// doorbells as data) continues on TCP first, as before an exec into such an image; so does
/// one bound for a process it cannot tell (its maps not readable: another uid, which could not
/// adopt the connection either; a datagram socket without peer credentials): red team rt13
/// `rt13_scm_user.py`, 0 of 5 answered, each reset, where it went on as SMC-D before.
///
/// # Safety
/// `m` is the application's msghdr for `sendmsg`.
pub unsafe fn fds_sending(via: c_int, m: &libc::msghdr) -> usize {
    let mut n = 0;
    let mut receiver: Option<Option<bool>> = None;
    // SAFETY: the caller's contract.
    unsafe {
        for_each_passed_fd(m, |fd| {
            if fdtable::raw(fd) < 8 {
                return;
            }
            // A socket in its handshake is decided before it leaves: the receiver may be
            // another process, which cannot continue it. (Our own daemon requests pass the
            // handshaking socket as their proof with the raw system call, not through here.)
            if let Some(o) = fdtable::get(fd)
                .filter(|o| matches!(&**o, Obj::Handshake(_) | Obj::Pending(_) | Obj::Skip(_)))
            {
                let to_library = matches!(&*o, Obj::Handshake(h) if h.server)
                    && *receiver.get_or_insert_with(|| receiver_runs_library(via)) == Some(true);
                drop(o);
                setup::settle_leaving_to(fd, to_library);
            }
            let Some(o) = fdtable::get(fd) else { return };
            if matches!(&*o, Obj::Listener(_))
                && *receiver.get_or_insert_with(|| receiver_runs_library(via)) != Some(true)
            {
                // As before an exec into such an image: its clients' CLC Proposals would be
                // its request bytes. Announced again if it comes back to a process with the
                // library (`fd_arrived`).
                if setup::announce(fd, false) {
                    crate::debug!(
                        "fd {fd}: listener passed to a process that does not run the library: \
                         its SYN-ACKs no longer announce SMC"
                    );
                }
                return;
            }
            let Obj::Conn(c) = &*o else { return };
            if c.stash_left() {
                // A receiver with the library would not take the switched connection over and
                // would read its socket past the bytes our switch read (red team rt21 `scm`:
                // 4.4 of 7.3 MiB); one without it could not read them at all: reset (both
                // ends fail cleanly), as before an exec.
                crate::debug!(
                    "fd {fd}: passed on with stream bytes its switch read unread in our ring:                      the connection is reset"
                );
                c.reset_now(fd);
                return;
            }
            if *receiver.get_or_insert_with(|| receiver_runs_library(via)) != Some(true) {
                crate::debug!(
                    "fd {fd}: passed to a process that does not run the library: the \
                     connection continues on TCP"
                );
                let e0 = real::errno();
                if !continue_on_tcp(fd, &o) {
                    crate::debug!("fd {fd}: the switch to TCP failed: the connection was reset");
                }
                real::set_errno(e0);
                return;
            }
            let Some(ck) = cookie(fd) else { return };
            c.add_ref(1);
            c.mark_in_flight();
            let mut l = in_flight().lock();
            if l.len() >= MAX_IN_FLIGHT {
                if let Some(old) = l.pop_front() {
                    release(&old.obj);
                }
            }
            l.push_back(InFlight {
                cookie: ck,
                obj: o.clone(),
            });
            n += 1;
        })
    };
    n
}

/// The `sendmsg` failed: the last `n` connections put in flight were not sent.
pub fn fds_not_sent(n: usize) {
    let mut l = in_flight().lock();
    for _ in 0..n {
        if let Some(x) = l.pop_back() {
            release(&x.obj);
        }
    }
}

/// The in-flight connection of the socket with cookie `ck`, taken off the list (its reference
/// goes to the receiving fd).
fn take_in_flight(ck: u64) -> Option<Arc<Obj>> {
    let mut l = in_flight().lock();
    let i = l.iter().position(|x| x.cookie == ck)?;
    l.remove(i).map(|x| x.obj)
}

/// [`fd_arrived`] in a process whose data path is off: an SMC connection received is adopted
/// and switched to TCP at once ([`continue_on_tcp`]); one that cannot be adopted fails cleanly
/// (`ECONNRESET`, then EOF).
fn disabled_receives(fd: c_int) {
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return;
    }
    let look = setup::smc_conn_look(fd);
    if look == setup::SmcLook::No {
        return;
    }
    match daemon::adopt(fd) {
        Some(c) => {
            let o = Arc::new(Obj::Conn(c));
            drop(fdtable::replace(fd, Slot::Obj(o.clone())));
            crate::debug!("fd {fd}: received an SMC connection with the data path off: TCP");
            let e0 = real::errno();
            continue_on_tcp(fd, &o);
            real::set_errno(e0);
        }
        // The daemon knows no DMB of it: TCP's (see `SmcLook::Maybe`).
        None if look == setup::SmcLook::Maybe => {}
        None => {
            crate::debug!("fd {fd}: received another process's SMC connection: fails cleanly");
            drop(fdtable::replace(
                fd,
                Slot::Obj(Arc::new(Obj::Orphan(crate::obj::Skip::new(false)))),
            ));
        }
    }
}

/// A standard stream (fd 0, 1 or 2) is about to name the SMC connection `o` of `fd`: stdio
/// reads and writes it through libc's internal calls, which the interposition never sees
/// (`dprintf` is served: `interpose_variadic.c`), so it continues on TCP first (an
/// inetd-style handler, `dup2(conn, 1); printf`). A handshake under way is decided first.
pub fn std_stream_takes(fd: c_int) {
    if fdtable::raw(fd) < 8 || in_vfork_child() {
        return;
    }
    setup::settle_leaving(fd);
    if let Some(o) = fdtable::get(fd).filter(|o| matches!(&**o, Obj::Conn(_))) {
        crate::debug!("fd {fd}: becomes a standard stream (stdio bypasses us): TCP");
        let e0 = real::errno();
        continue_on_tcp_in_place(fd, &o, true);
        real::set_errno(e0);
    }
}

/// [`continue_on_tcp`] for a connection this process goes on using through libc's own calls
/// (stdio on a standard stream or after `fdopen`, POSIX aio, an io_uring instance): when the
/// peer had closed with its last bytes unread in our ring, they go on in a connection of their
/// own ([`crate::conn::Switched::Tail`]) that every number of this one in this process names
/// from then on (a standard stream about to be made from `fd` too), so that whichever reads
/// gets them, then EOF, as on the socket. False when the connection was reset instead.
fn continue_on_tcp_in_place(fd: c_int, o: &Arc<Obj>, std_stream: bool) -> bool {
    let mut fds = Vec::new();
    fdtable::for_each_object(|ofd, x| {
        if Arc::ptr_eq(x, o) {
            fds.push(ofd);
        }
    });
    let mut tail = None;
    let ok = continue_on_tcp_leaving(fd, o, &mut tail, None);
    if let Some((tail, undo)) = tail {
        if std_stream {
            remember_std_tail(fd, o, undo, tail);
        }
        let nonblock = crate::util::nonblocking(fd);
        for ofd in fds {
            let flags = if cloexec(ofd) { libc::O_CLOEXEC } else { 0 };
            crate::epoll::file_replaced(ofd, || {
                // SAFETY: plain system call on our own descriptors (settled plain already).
                unsafe { real::dup3(tail, ofd, flags) };
            });
        }
        set_nonblocking(tail, nonblock);
        // SAFETY: ours; the numbers above keep it.
        unsafe { real::close(tail) };
    }
    ok
}

/// A connection whose peer's last bytes went on in place for a standard stream
/// ([`std_stream_takes`]: inetd style, a forked child's `dup2(conn, 0)` before its exec).
/// When that exec fails, the bytes belong to the other holder of the connection (the parent),
/// as on TCP, where the socket still holds them ([`undo_std_tails`]).
struct StdTail {
    obj: Arc<Obj>,
    undo: crate::conn::TailUndo,
    /// A number of the private connection (or a standard stream made from it), its socket
    /// cookie and the bytes it held.
    fd: c_int,
    cookie: u64,
    n: c_int,
    pid: u32,
}

/// The last few [`StdTail`]s of this process (a fork's child inherits none that counts: the
/// pid is the maker's).
static STD_TAILS: crate::forklock::ForkMutex<Vec<StdTail>> =
    crate::forklock::ForkMutex::new(Vec::new);
const STD_TAILS_MAX: usize = 4;

/// Bytes queued to read on `fd` (`FIONREAD`), -1 when unknown; errno kept.
fn queued(fd: c_int) -> c_int {
    let e0 = real::errno();
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int.
    let r = unsafe {
        real::ioctl(
            fd,
            libc::FIONREAD as libc::c_ulong,
            std::ptr::from_mut(&mut n) as libc::c_ulong,
        )
    };
    real::set_errno(e0);
    if r == 0 {
        n
    } else {
        -1
    }
}

fn remember_std_tail(fd: c_int, o: &Arc<Obj>, undo: crate::conn::TailUndo, tail: c_int) {
    let (Some(cookie), n) = (cookie(tail), queued(tail)) else {
        return;
    };
    if n <= 0 {
        return;
    }
    let mut v = STD_TAILS.lock();
    if v.len() == STD_TAILS_MAX {
        v.remove(0);
    }
    v.push(StdTail {
        obj: o.clone(),
        undo,
        fd,
        cookie,
        n,
        pid: crate::pid(),
    });
}

/// After a failed exec: each [`StdTail`] this process made whose private connection is still
/// at its number with every byte unread, while another process holds the connection too,
/// gives its bytes back to the ring ([`Conn::undo_tail`](crate::conn::Conn::undo_tail)) and
/// drops them from the private connection (the other holder reads them, once). Red team rt15
/// `rt15_tail forkfail`: the forked child whose exec failed took them, 5 of 5 lost.
fn undo_std_tails() {
    let taken: Vec<StdTail> = {
        let mut v = STD_TAILS.lock();
        if v.is_empty() {
            return;
        }
        std::mem::take(&mut *v)
    };
    let me = crate::pid();
    for t in taken {
        let Obj::Conn(c) = &*t.obj else { continue };
        // The number it was made at may be closed by now (`close_range` after the `dup2`).
        let Some(fd) = [t.fd, 0, 1, 2]
            .into_iter()
            .find(|&f| cookie(f) == Some(t.cookie))
        else {
            continue;
        };
        // Not counted open again (`stats::conn_reopened`): this forked child leaves with its
        // references (no close of its own), so the other holder's close is not the last one
        // and counts nothing; the close counted here at the tail stands for it.
        if t.pid != me || queued(fd) != t.n || !c.held_elsewhere() || !c.undo_tail(t.undo) {
            continue;
        }
        let mut buf = [0u8; 4096];
        let mut left = t.n as usize;
        while left > 0 {
            // SAFETY: a valid buffer of its length.
            let r = unsafe {
                real::recv(
                    fd,
                    buf.as_mut_ptr().cast(),
                    buf.len().min(left),
                    libc::MSG_DONTWAIT,
                )
            };
            if r <= 0 {
                break;
            }
            left = left.saturating_sub(r as usize);
        }
    }
}

/// `posix_spawn_file_actions_adddup2(3)`: a spawned child will have `fd` as `newfd`. As a
/// standard stream (0-2) an SMC connection continues on TCP now, in the parent
/// ([`std_stream_takes`]): the child's image may use stdio on it, and a close-on-exec `fd`
/// (the usual `accept4(SOCK_CLOEXEC)`) would not even travel as an SMC connection (the
/// parent's close right after the spawn ended it before the child adopted it: red team rt8
/// `spawn_lib_cloexec`).
///
/// # Safety
/// `fa` is the caller's initialised file actions object.
pub unsafe fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    if (0..=2).contains(&newfd) {
        std_stream_takes(fd);
    }
    // SAFETY: as above.
    unsafe { real::posix_spawn_file_actions_adddup2(fa, fd, newfd) }
}

/// One fd received from another process (or from ourselves) with `SCM_RIGHTS`.
fn fd_arrived(fd: c_int) {
    if in_vfork_child() {
        return;
    }
    if !policy::enabled() {
        // The data path is off here (`SMC_DISABLE`, io_uring), but another process's SMC
        // connection must still not be read as a raw socket (its bytes are in the rings, its
        // TCP stream carries doorbells): taken over, then continued on TCP.
        disabled_receives(fd);
        return;
    }
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out buffer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return;
    }
    if is_tcp_listener(fd) {
        adopt_if_listener(fd);
        return;
    }
    if is_unconnected_tcp(fd) {
        adopt_if_unconnected(fd);
        return;
    }
    let look = setup::smc_conn_look(fd);
    if look == setup::SmcLook::No {
        return;
    }
    // One of our own connections: sent by this process (its reference was in flight), or still
    // open here under another number (shared as dup() would).
    if let Some(ck) = cookie(fd) {
        if let Some(o) = take_in_flight(ck) {
            crate::debug!("fd {fd}: received our own SMC connection back");
            if let Obj::Conn(c) = &*o {
                // The travelling reference becomes this fd's, unless another receiver took it.
                if !c.take_in_flight() {
                    c.add_ref(1);
                }
            }
            drop(fdtable::replace(fd, Slot::Obj(o)));
            return;
        }
        let mut same = -1;
        fdtable::for_each_object(|other, o| {
            if same < 0 && other != fd && matches!(&**o, Obj::Conn(_)) && cookie(other) == Some(ck)
            {
                same = other;
            }
        });
        if same >= 0 {
            crate::debug!("fd {fd}: received our own SMC connection (fd {same}): shared");
            setup::copy_slot(same, fd);
            // The copy counted a reference for this fd; the one that travelled (from another
            // process) is it.
            if let Some(o) = fdtable::get(fd) {
                if let Obj::Conn(c) = &*o {
                    if c.take_in_flight() {
                        c.drop_ref();
                    }
                }
            }
            return;
        }
    }
    if let Some(c) = daemon::adopt(fd) {
        drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Conn(c)))));
        return;
    }
    if look == setup::SmcLook::Maybe {
        // The daemon knows no DMB of it: TCP's (see `SmcLook::Maybe`).
        return;
    }
    crate::debug!("fd {fd}: received another process's SMC connection: fails cleanly");
    drop(fdtable::replace(
        fd,
        Slot::Obj(Arc::new(Obj::Orphan(crate::obj::Skip::new(false)))),
    ));
}

/// `pidfd_getfd(2)`: `fd` is a duplicate of another process's descriptor, made without that
/// process (a supervisor, a debugger, a sibling of the same uid taking a socket over). Its
/// library saw nothing leave, so nothing travelled: an SMC connection is adopted as one that
/// arrived with `SCM_RIGHTS` ([`fd_arrived`]: the daemon's `OP_ADOPT` for the owner's uid,
/// cgroup and pid namespace, a reference added for this fd), else it fails cleanly; a
/// listener or an unconnected socket as one received. Before, the number went to libc
/// unchanged: a read got the doorbells as data, a write went onto the doorbell channel and
/// the peer reset the connection (red team rt24 `rt24_getfd.py`). errno is preserved.
pub fn fd_taken_from_another_process(fd: c_int) {
    let e0 = real::errno();
    fd_arrived(fd);
    real::set_errno(e0);
}

// ---------------------------------------------------------------------------------------------
// io_uring, fdopen(3) and AIO: I/O we do not see

/// An io_uring instance exists in this process: its submissions bypass us. New connections
/// stay TCP; those open now continue on TCP ([`libc_takes`], as before an exec into an image
/// without the library), so that any submission on them reads and writes plain TCP, never
/// half a data path (a read that never completes, an `EPOLL_CTL` whose wait never wakes).
pub fn io_uring_seen() {
    setup::disable("an io_uring instance was set up (its submissions bypass the interposition)");
    if fdtable::any_objects() {
        let mut fds = Vec::new();
        fdtable::for_each_object(|fd, o| {
            if matches!(&**o, Obj::Conn(_) | Obj::Handshake(_) | Obj::Pending(_)) {
                fds.push(fd);
            }
        });
        for fd in fds {
            libc_takes(fd, "an io_uring instance");
        }
    }
}

/// `fdopen(3)`: stdio reads and writes a `FILE` through libc's internal `read` and `write`,
/// which the interposition never sees, so a stream on an SMC connection would read doorbells
/// and write into a socket whose peer reads its ring. The connection continues on TCP first
/// ([`libc_takes`]).
///
/// # Safety
/// `mode` is the caller's string.
pub unsafe fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    libc_takes(fd, "fdopen: stdio");
    // SAFETY: as above.
    unsafe { real::fdopen(fd, mode) }
}

/// `fd` is about to be read or written by libc itself, through its internal calls that never
/// reach the interposition (stdio after `fdopen`, the threads of POSIX aio): an SMC connection
/// continues on TCP first, as before an exec into an image without the library
/// ([`continue_on_tcp`]: the peer answers at its next operation; one that does not within the
/// switch wait gets the connection reset, a clean failure on both ends); a handshake under way
/// is decided first, declined where the protocol still allows it ([`setup::settle_leaving`]).
/// Any other fd costs one look at its slot. errno is preserved.
fn libc_takes(fd: c_int, who: &str) {
    if fdtable::raw(fd) != 0 && !in_vfork_child() {
        setup::settle_leaving(fd);
        if let Some(o) = fdtable::get(fd).filter(|o| matches!(&**o, Obj::Conn(_))) {
            crate::debug!(
                "fd {fd}: {who} bypasses the interposition: the connection continues on TCP"
            );
            let e0 = real::errno();
            if !continue_on_tcp_in_place(fd, &o, false) {
                crate::debug!("fd {fd}: the switch to TCP failed: the connection was reset");
            }
            real::set_errno(e0);
        }
    }
}

/// The first two fields of glibc's `struct aiocb` and `struct aiocb64` (the same in both, on
/// every architecture): all the library reads of a control block.
#[repr(C)]
pub struct AiocbHead {
    aio_fildes: c_int,
    aio_lio_opcode: c_int,
}

/// `aio_read`, `aio_write` (and their 64 forms): glibc's aio threads run the transfer with its
/// internal `pread`/`read`/`pwrite`/`write` (on a socket `pread` fails with `ESPIPE` and it
/// reads instead), which bypass the interposition: the connection continues on TCP before
/// glibc sees the request ([`libc_takes`]).
///
/// # Safety
/// `cb` is the caller's control block (null or valid, as libc's contract says).
pub unsafe fn aio_takes(cb: *const AiocbHead) {
    if cb.is_null() || !fdtable::any_objects() {
        return;
    }
    // SAFETY: a valid control block (the caller's contract, which glibc relies on too).
    let fd = unsafe { std::ptr::addr_of!((*cb).aio_fildes).read() };
    libc_takes(fd, "POSIX aio");
}

/// `lio_listio` (and `lio_listio64`): each request of the list that reads or writes
/// (`LIO_NOP` and null entries are skipped, as glibc does) as in [`aio_takes`].
///
/// # Safety
/// `list` is the caller's array of `n` control block pointers (null entries allowed).
pub unsafe fn lio_takes(list: *const *const AiocbHead, n: c_int) {
    if list.is_null() || n <= 0 || !fdtable::any_objects() {
        return;
    }
    for i in 0..n as usize {
        // SAFETY: `list` has `n` entries (the caller's contract).
        let cb = unsafe { list.add(i).read() };
        if cb.is_null() {
            continue;
        }
        // SAFETY: a valid control block (as above).
        let op = unsafe { std::ptr::addr_of!((*cb).aio_lio_opcode).read() };
        if op != libc::LIO_NOP {
            // SAFETY: as above.
            unsafe { aio_takes(cb) };
        }
    }
}

/// How often a wait of a process that holds SMC connections looks for a switch to TCP its
/// peer asked for.
const WAIT_SLICE_MS: i64 = 10;

/// The options of a `waitpid`/`wait4` ([`wait_child`] serves it) or a `waitid`.
#[derive(Clone, Copy)]
pub enum WaitOptions {
    /// `waitpid`/`wait4` options: served when none of `WNOHANG`, `WUNTRACED`, `WCONTINUED`.
    Pid(c_int),
    /// `waitid` options: served when `WEXITED` and none of `WNOHANG`, `WSTOPPED`,
    /// `WCONTINUED` (`WNOWAIT` is fine: the loop's calls add only `WNOHANG`).
    Id(c_int),
}

impl WaitOptions {
    fn nohang(self) -> bool {
        match self {
            WaitOptions::Pid(o) | WaitOptions::Id(o) => o & libc::WNOHANG != 0,
        }
    }

    fn served(self) -> bool {
        match self {
            WaitOptions::Pid(o) => o & (libc::WNOHANG | libc::WUNTRACED | libc::WCONTINUED) == 0,
            WaitOptions::Id(o) => {
                o & libc::WEXITED != 0
                    && o & (libc::WNOHANG | libc::WSTOPPED | libc::WCONTINUED) == 0
            }
        }
    }
}

/// `waitpid`, `wait`, `wait4`, `waitid` (`call(nohang)` makes the real one with the options it
/// is given, plus `WNOHANG` when `nohang`, and says `None` when that found no child ready). A
/// process that holds SMC connections answers, while it waits for one child (`pid` > 0, only
/// for its end), the switch to TCP the peer end of one of them starts: typically the child,
/// which now execs an image without the library on its copy of the other end and waits for
/// our marker (*Switch to TCP*). Before, nothing answered until the child was done: its switch
/// waited 10 s, then reset the connection (rt10 `exec_nolib_peer_in_waitpid`; rt12
/// `waitswitch` `waitid`).
///
/// The wait sleeps in `ppoll` on a pidfd of the child (its end wakes it at once), looking at
/// the connections' shared state every [`WAIT_SLICE_MS`]; the thread's signal mask is left as
/// it is. A signal whose handler lacks `SA_RESTART` ends it with `EINTR` as it ends the real
/// call, whenever it ran (rt12 `sigrace`). A `WNOHANG` call answers the switches asked so far,
/// then makes the real call (a loop of them, as Python's `Popen.wait(timeout)` makes: rt12
/// `waitswitch` `wnohang`). Any other wait (for any child, a process group, stops), a process
/// that handles `SIGCHLD` ([`sigchld_handled`]), one without SMC connections, a call from a
/// signal handler and a `vfork` child make the real call at once (waiting in slices for any
/// child cost a tracer or a reaper 5–10 ms per event: rt12).
pub fn wait_child(
    pid: libc::pid_t,
    options: WaitOptions,
    mut call: impl FnMut(bool) -> Option<c_int>,
) -> c_int {
    // In a signal handler (a `SIGCHLD` reaper) the interrupted code may hold a connection's
    // locks: the real call only.
    if !fdtable::any_objects() || in_vfork_child() || crate::signals::in_handler() {
        return call(false).unwrap_or(0);
    }
    if options.nohang() {
        answer_peer_switches();
        return call(false).unwrap_or(0);
    }
    if pid <= 0 || !options.served() || sigchld_handled() || !has_smc_conn() || traced_by_us(pid) {
        return call(false).unwrap_or(0);
    }
    let e0 = real::errno();
    close_left_pidfd();
    // SAFETY: plain system call; a failure (an old kernel, no such process) is -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as c_int) as c_int };
    if pidfd < 0 {
        real::set_errno(e0);
        return call(false).unwrap_or(0);
    }
    // Noted until the wait ends, so that one left by `siglongjmp` or a thread cancelled in it
    // does not keep the descriptor for ever ([`close_left_pidfd`], [`LeftPidfd`]).
    LEFT_PIDFD.with(|l| l.0.set((pidfd, pid)));
    crate::signals::wait_begins();
    let r = loop {
        if let Some(r) = call(true) {
            break r;
        }
        if crate::signals::caught() && crate::signals::interrupted() {
            real::set_errno(libc::EINTR);
            break -1;
        }
        answer_peer_switches();
        let mut p = libc::pollfd {
            fd: pidfd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd and a timeout; the thread's own signal mask.
        unsafe { real::ppoll(&mut p, 1, &WAIT_SLICE, std::ptr::null()) };
    };
    let e = real::errno();
    LEFT_PIDFD.with(|l| l.0.set((-1, 0)));
    // SAFETY: our own descriptor.
    unsafe { real::close(pidfd) };
    // errno as the real call leaves it: unchanged on success.
    real::set_errno(if r >= 0 { e0 } else { e });
    r
}

/// Whether the program handles `SIGCHLD` (a handler, not `SIG_DFL`/`SIG_IGN`). Such a wait is
/// not served: the handler must run while the process waits, as it does in the kernel's wait
/// (a supervisor's handler that kills the child waited for when another ends; one without
/// `SA_RESTART` that ends the wait with `EINTR`: red team rt13 `rt13_wait killer`, `eintr`,
/// which waited for an alarm when `SIGCHLD` was blocked during the wait), and it may reap the
/// child between the slices of the wait, which the kernel's waiter would have got first (rt12
/// `reaper`).
fn sigchld_handled() -> bool {
    // SAFETY: a zeroed sigaction is valid output space; the call only reads the action.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    let e0 = real::errno();
    // SAFETY: a query only (null new action).
    let r = unsafe { real::sigaction(libc::SIGCHLD, std::ptr::null(), &mut old) };
    real::set_errno(e0);
    r != 0 || (old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN)
}

/// Whether this process traces `pid` (`TracerPid` in its status): a tracer's wait returns at
/// each stop of the tracee, which does not wake a pidfd (only the end does), so a served wait
/// would see each stop only at its next slice (rt12 `rt12_wait ptrace`: 3.9 ms per stop against
/// 0.5 ms over TCP). errno preserved.
fn traced_by_us(pid: libc::pid_t) -> bool {
    let e0 = real::errno();
    let st = std::fs::read(format!("/proc/{pid}/status")).unwrap_or_default();
    real::set_errno(e0);
    let want = format!("TracerPid:\t{}\n", crate::pid());
    st.windows(want.len()).any(|w| w == want.as_bytes())
}

/// The pidfd of a served wait of this thread (-1: none) and the child it names. Set while the
/// wait runs; what remains set after it was left without returning (`siglongjmp` out of a
/// signal handler) is closed by the thread's next served wait, and at the thread's end (a
/// thread cancelled inside the wait: red team rt13 `rt13_wait cancel`, one descriptor per
/// cancelled thread before).
struct LeftPidfd(std::cell::Cell<(c_int, libc::pid_t)>);

impl Drop for LeftPidfd {
    fn drop(&mut self) {
        close_if_pidfd_of(self.0.get());
    }
}

thread_local! {
    static LEFT_PIDFD: LeftPidfd = const { LeftPidfd(std::cell::Cell::new((-1, 0))) };
}

/// Closes a pidfd a served wait of this thread left behind ([`LeftPidfd`]).
fn close_left_pidfd() {
    let left = LEFT_PIDFD.with(|l| l.0.replace((-1, 0)));
    close_if_pidfd_of(left);
}

/// Closes `fd` if it is still a pidfd of `pid` (the program may have closed the number since and
/// made another file with it; then nothing is closed).
fn close_if_pidfd_of((fd, pid): (c_int, libc::pid_t)) {
    if fd < 0 {
        return;
    }
    let e0 = real::errno();
    let info = std::fs::read(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
    let want = format!("Pid:\t{pid}\n");
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_default();
    if link.as_os_str().as_encoded_bytes() == b"anon_inode:[pidfd]"
        && info.windows(want.len()).any(|w| w == want.as_bytes())
    {
        // SAFETY: a pidfd of ours, by its kind and its process.
        unsafe { real::close(fd) };
    }
    real::set_errno(e0);
}

const WAIT_SLICE: libc::timespec = libc::timespec {
    tv_sec: 0,
    tv_nsec: WAIT_SLICE_MS * 1_000_000,
};

/// `sigsuspend(mask)` (and `pause`, with `mask` null: the thread's own mask). A process that
/// holds SMC connections and sleeps until a signal (nginx's master, many daemons: a `SIGCHLD`
/// handler, then `sigsuspend` until the child it started is done) answers meanwhile the switch
/// to TCP a peer asked for, typically that child exec'ing an image without the library on the
/// other end of one of its connections (rt12 `waitswitch` `sigsuspend`, `pause_sigchld`: the
/// child's switch waited 10 s, then reset both ends). It sleeps in `ppoll` with the caller's
/// mask in slices of [`WAIT_SLICE_MS`], which a handled signal ends with `EINTR` as it ends
/// `sigsuspend`; between the slices every signal is blocked, so that one that comes while
/// the switches are answered stays pending for the next slice instead of running its handler
/// where no call would end (a `pause` that never returned). The caller's mask is back on
/// return. `None`: not served (no SMC connection, a `vfork` child), the caller makes the real
/// call.
pub fn suspend_answering(mask: *const libc::sigset_t) -> Option<c_int> {
    if !fdtable::any_objects()
        || in_vfork_child()
        || crate::signals::in_handler()
        || !has_smc_conn()
    {
        return None;
    }
    // SAFETY: sigset_t is plain data; the calls fill our sets and set the thread's mask.
    let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: as above.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
    }
    let during = if mask.is_null() {
        &old as *const libc::sigset_t
    } else {
        mask
    };
    let e = loop {
        answer_peer_switches();
        // SAFETY: no pollfd, a timeout and the caller's (or the thread's own) signal set.
        let r = unsafe { real::ppoll(std::ptr::null_mut(), 0, &WAIT_SLICE, during) };
        if r < 0 {
            // EINTR (a handled signal: `sigsuspend`'s only return), or EFAULT for a bad mask.
            break real::errno();
        }
    };
    // SAFETY: the caller's mask back.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    real::set_errno(e);
    Some(-1)
}

/// Whether this process holds an SMC connection that has not continued on TCP.
fn has_smc_conn() -> bool {
    let mut any = false;
    fdtable::for_each_object(|_, o| {
        any |= matches!(&**o, Obj::Conn(c) if !c.switched());
    });
    any
}

/// The switches to TCP the peers of our connections asked for and wait for, answered (as the
/// next operation on each connection would). A peer that switched alone waits for nothing:
/// its connection is answered at our next operation on it.
fn answer_peer_switches() {
    let mut asked: Vec<(c_int, Arc<Obj>)> = Vec::new();
    fdtable::for_each_object(|fd, o| {
        if matches!(&**o, Obj::Conn(c) if c.peer_switch_waits()) {
            asked.push((fd, o.clone()));
        }
    });
    for (fd, o) in asked {
        let Obj::Conn(c) = &*o else { continue };
        // Re-checked: another of its numbers may have answered it already.
        if !c.peer_switch_waits() {
            continue;
        }
        let e0 = real::errno();
        c.notice_switch(fd);
        crate::debug!("fd {fd}: the peer switches to TCP while this process waits for a child");
        if !continue_on_tcp(fd, &o) {
            crate::debug!("fd {fd}: the switch to TCP failed: the connection was reset");
        }
        real::set_errno(e0);
    }
}
