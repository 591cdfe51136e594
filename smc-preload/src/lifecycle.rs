//! Process lifecycle: what the library must (not) do across `vfork`, `exec` and fd passing.
//!
//! - **vfork.** A `vfork` child (CPython's `subprocess`, `posix_spawn`, Java, NuProcess) runs in
//!   its parent's memory until it execs or exits: the fd table, the connection objects and the
//!   signal bookkeeping it would touch are the parent's. Its `close`/`close_range`/`dup2`/
//!   `sigaction` only act on its own fd table in the kernel, so here they go straight to libc
//!   and leave our state alone ([`in_vfork_child`]).
//! - **exec.** The next image may not run the data path (environment cleared, setuid, static,
//!   Go): a listener it inherits must not announce SMC, or it would read its clients' CLC
//!   Proposals as request bytes. Listeners that survive an exec withdraw their announcement
//!   (`SMC_SO_ENABLE` 0, which the eBPF programs record per port and namespace); an image that
//!   runs the library announces again at load ([`adopt_inherited_listeners`]).

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
    // SAFETY: plain system call (glibc no longer caches getpid, but the raw call says it
    // plainly).
    let now = unsafe { libc::syscall(libc::SYS_getpid) } as u32;
    cached != 0 && cached != now
}

// ---------------------------------------------------------------------------------------------
// exec

use crate::fdtable::{self, Slot};
use crate::obj::Obj;
use crate::{ops, real, setup};
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
/// ([`adopt_inherited_listeners`]). No allocation: this may run in a `vfork` child.
pub fn withdraw_listeners_for_exec() -> Withdrawn {
    let mut w = Withdrawn {
        fds: [-1; MAX_WITHDRAWN],
        n: 0,
    };
    fdtable::for_each_object(|fd, o| {
        if matches!(o, Obj::Listener) && !cloexec(fd) && setup::announce(fd, false) {
            if let Some(slot) = w.fds.get_mut(w.n) {
                *slot = fd;
                w.n += 1;
            }
        }
    });
    w
}

/// Runs `exec` (which returns only when it failed) with the listeners withdrawn around it.
fn around_exec(exec: impl FnOnce() -> c_int) -> c_int {
    let w = withdraw_listeners_for_exec();
    let r = exec();
    let e = real::errno();
    w.restore();
    real::set_errno(e);
    r
}

pub unsafe fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    around_exec(|| unsafe { real::execve(path, argv, envp) })
}

pub unsafe fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(|| unsafe { real::execv(path, argv) })
}

pub unsafe fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(|| unsafe { real::execvp(file, argv) })
}

pub unsafe fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    // SAFETY: as above.
    around_exec(|| unsafe { real::execvpe(file, argv, envp) })
}

pub unsafe fn fexecve(fd: c_int, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    // SAFETY: as above.
    around_exec(|| unsafe { real::fexecve(fd, argv, envp) })
}

pub unsafe fn execveat(
    dirfd: c_int,
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    flags: c_int,
) -> c_int {
    // SAFETY: as above.
    around_exec(|| unsafe { real::execveat(dirfd, path, argv, envp, flags) })
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
    let w = withdraw_listeners_for_exec();
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe {
        if search_path {
            real::posix_spawnp(pid, path, fa, at, argv, envp)
        } else {
            real::posix_spawn(pid, path, fa, at, argv, envp)
        }
    };
    if r != 0 {
        w.restore();
    }
    r
}

/// At load: listening TCP sockets this image inherited (across exec from an image that
/// withdrew their announcement, from systemd socket activation, ...) are served by this image's
/// data path, so they announce SMC (again) and become our listeners. A listener that never
/// announced (opted in after `listen`) gets no option into its SYN-ACKs: its connections stay
/// TCP, as before.
pub fn adopt_inherited_listeners() {
    if !ops::enabled() {
        return;
    }
    let Ok(rd) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<c_int> = rd
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in fds {
        adopt_if_listener(fd);
    }
}

/// `fd` becomes one of our listeners if it is a listening TCP socket (inherited or received).
pub fn adopt_if_listener(fd: c_int) {
    if fdtable::raw(fd) != 0 || !is_tcp_listener(fd) || !ops::enabled() {
        return;
    }
    if setup::opt_in(fd) {
        crate::debug!("fd {fd}: inherited TCP listener: announces SMC");
        drop(fdtable::replace(fd, Slot::Obj(Arc::new(Obj::Listener))));
    }
}

fn sockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: valid out buffer and length.
    let r = unsafe {
        real::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some(v)
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
