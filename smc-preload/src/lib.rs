//! Interposition library for `smc-ctl run`: moves same-host TCP connections onto shared-memory
//! rings (SMC-D over a loopback-ism device), transparently, with TCP fallback.
//!
//! Module map:
//! - [`real`]: the real libc functions (`dlsym(RTLD_NEXT)`).
//! - [`fdtable`]: the lock-free per-fd table; [`obj`]: what an fd can be for us (SMC-D
//!   connection, listener, pending connect, handshake under way, fallback skipping a late CLC
//!   message, fallen-back sockmap member, orphan, epoll set).
//! - [`shm`]: mappings, memfds, a process-shared futex lock; [`forklock`]: the library's global
//!   locks and once-values, which a forked child replaces when another thread held them.
//! - [`conn`]: one SMC connection: rings, cursors, read/write/peek/shutdown/close, wakeups;
//!   [`iov`]: a cursor over an iovec array.
//! - [`setup`]: opt-in (at `connect`/`listen`), the eBPF socket state, the connection policies;
//!   [`handshake`]: the CLC handshake's I/O; [`dmbs`]: mappings of pooled DMBs kept for the next
//!   connection; [`member`]: reads of a fallen-back sockmap member.
//! - [`poll`], [`epoll`]: readiness and the poll/select/epoll emulation; [`signals`]: which
//!   signals interrupt a blocking call.
//! - [`ops`]: the behaviour of every interposed function; [`lifecycle`]: `vfork` children,
//!   listeners across `exec`, closes behind our back, fds received with `SCM_RIGHTS`, io_uring
//!   setup.
//! - [`stats`]: the per-process statistics file; [`log`]: `SMC_DEBUG` lines.
//! - `interpose` (feature `interpose`, not in unit tests): the exported libc symbols.

// The layers, top down: interposition (`interpose`, this file's constructor), dispatch,
// socket objects, the SMC connection core, shared memory; `util` is used by all. A layer uses
// only the ones below it (checked by `tests/layers.rs`); the flat names below are the
// modules' paths inside the crate.
pub mod dispatch;
pub mod shm;
pub mod smc;
pub mod socket;
pub mod util;

pub use dispatch::ops;
pub use smc::{conn, dmbs, iov};
pub use socket::{epoll, fdtable, handshake, lifecycle, member, obj, poll, setup, stats};
pub(crate) use util::PID;
pub use util::{forklock, log, pid, real, reset_pid, signals};

#[cfg(all(feature = "interpose", not(test)))]
mod interpose;

/// Library constructor: environment knobs, liburing detection, SMC sockets and listeners
/// inherited across `exec`, exit cleanup.
#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
extern "C" fn init() {
    if std::env::var_os("SMC_DISABLE").is_some_and(|v| v == "1") {
        ops::disable("SMC_DISABLE=1");
    }
    // io_uring submits socket I/O without any libc call we could see: a program linked with
    // liburing keeps all its connections on TCP.
    if uses_liburing() {
        ops::disable("liburing is loaded (io_uring bypasses the interposition)");
    }
    // Cached now, before any child can exist (see `reset_pid`).
    let _ = pid();
    setup::init_env();
    let _ = stats::keep();
    ops::adopt_orphans_after_exec();
    lifecycle::adopt_inherited_listeners();
    // SAFETY: registering plain extern "C" functions.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
}

#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
extern "C" fn at_exit() {
    // A vfork child that calls exit() instead of _exit() runs in its parent's memory.
    if lifecycle::in_vfork_child() {
        return;
    }
    stats::at_exit();
}

#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
extern "C" fn after_fork_child() {
    reset_pid();
    fdtable::unlock_all_after_fork();
    forklock::after_fork_child();
    setup::after_fork_child();
}

#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
fn uses_liburing() -> bool {
    unsafe extern "C" fn cb(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader passes a valid info; the name is a C string or null.
        let name = unsafe { (*info).dlpi_name };
        if !name.is_null() {
            // SAFETY: `name` is non-null (checked above) and the loader's NUL-terminated object
            // name.
            let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
            if n.windows(8).any(|w| w == b"liburing") {
                // SAFETY: `data` is the `&mut found` bool passed to dl_iterate_phdr below, alive
                // during the walk.
                unsafe { *(data as *mut bool) = true };
                return 1;
            }
        }
        0
    }
    let mut found = false;
    // SAFETY: the callback only reads what the loader passes.
    unsafe { libc::dl_iterate_phdr(Some(cb), &mut found as *mut bool as *mut libc::c_void) };
    found
}

#[cfg(all(feature = "interpose", not(test)))]
#[used]
#[unsafe(link_section = ".init_array")]
static INIT: extern "C" fn() = init;
