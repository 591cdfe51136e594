//! Interposition library for `smc-ctl run`: moves same-host TCP connections onto shared-memory
//! rings (SMC-D over a loopback-ism device), transparently, with TCP fallback.
//!
//! The folders are the layers, top down; a layer uses only the layers below it (checked by
//! `tests/layers.rs`), and what a lower layer must tell an upper one goes through a hook the
//! upper one registers ([`conn::Hooks`], as the kernel's socket callbacks):
//!
//! ```text
//!  interposition   interpose.rs (the exported libc symbols), lib.rs (constructor, atfork, atexit)
//!        |
//!  dispatch/       ops (what every call does), lifecycle (fork, vfork, exec, SCM_RIGHTS, io_uring)
//!        |
//!  socket/         poll, epoll (readiness, the poll/select/epoll emulation), setup (opt-in at
//!        |         connect/listen, the decisions), ready, fdtable, obj (what an fd is for us),
//!        |         handshake (CLC I/O), member (fallen-back sockmap members), policy (which
//!        |         connections try SMC), daemon (the loopback-ism device: the daemon client),
//!        |         stats (the per-process statistics file)
//!  smc/            conn (one connection: rings, cursors, CDC, wakeups), dmbs (DMB mappings kept
//!        |         for the next connection), iov (an iovec cursor)
//!  shm/            mappings, memfds, a process-shared futex lock; room (mappings set aside
//!                  for the application when ours exhaust `vm.max_map_count`)
//!
//!  util/           used by all: real (the real libc functions), log (`SMC_DEBUG`), config
//!                  (the environment knobs, read once at load), forklock (fork-safe locks and
//!                  once-values), signals (which interrupt a blocking call), io_path (the
//!                  descriptor our I/O on a socket goes through), pid
//! ```
//!
//! Inside the crate the modules keep flat paths (`crate::conn`, `crate::setup`, ...).
//!
//! The library's only interface is the libc symbols it exports; its Rust items are public for
//! its tests and tools, and their documentation is for its maintainers: it links private items
//! freely (read it with `cargo doc --document-private-items`).
#![allow(rustdoc::private_intra_doc_links)]

pub mod dispatch;
pub mod shm;
pub mod smc;
pub mod socket;
pub mod util;

pub use dispatch::{lifecycle, ops};
pub use smc::{conn, dmbs, iov};
pub use socket::{
    daemon, epoll, epoll_set, fdtable, handshake, member, obj, policy, poll, ready, setup, stats,
};
pub(crate) use util::PID;
pub use util::{forklock, log, pid, real, reset_pid, signals};

#[cfg(all(feature = "interpose", not(test)))]
mod interpose;

/// Every allocation of the library: the C library's, except inside the program's signal
/// handlers (see [`util::handler_alloc`]).
#[global_allocator]
static ALLOC: util::handler_alloc::HandlerAlloc = util::handler_alloc::HandlerAlloc;

/// Library constructor: environment knobs, liburing detection, SMC sockets and listeners
/// inherited across `exec`, exit cleanup.
#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
extern "C" fn init() {
    util::config::load();
    util::unwound::init(obj::release_unwound, fdtable::raw_seqcst);
    if util::config::config().disable {
        setup::disable("SMC_DISABLE=1");
    }
    // io_uring submits socket I/O without any libc call we could see: a program linked with
    // liburing keeps all its connections on TCP.
    if uses_liburing() {
        setup::disable("liburing is loaded (io_uring bypasses the interposition)");
    }
    // Cached now, before any child can exist (see `reset_pid`).
    let _ = pid();
    setup::init_env();
    let _ = stats::keep();
    let socks = lifecycle::inherited_sockets();
    ops::adopt_orphans_after_exec(&socks);
    lifecycle::adopt_inherited_sockets(&socks);
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
    let open = fdtable::all_objects();
    sweep_peers_before_exit(&open);
    stats::at_exit(open.iter().filter_map(|(_, o)| o.conn()));
}

/// A client whose Accept did not come that leaves without closing: the kernel's close sends
/// its FIN (`setup::sweep_peer_before_fin`).
fn sweep_peers_before_exit(open: &[(i32, std::sync::Arc<obj::Obj>)]) {
    for (fd, o) in open {
        if let obj::Obj::Skip(s) = &**o {
            setup::sweep_peer_before_fin(*fd, s);
        }
    }
}

/// `_exit`/`_Exit` of the program (not `exit`, whose handlers [`at_exit`] joins): what the
/// exit hook does for the connections, without the statistics (a program calls `_exit` not to
/// run its exit handlers; a forked child's numbers are its parent's). Nothing in a `vfork`
/// child (its parent's memory) or from a signal handler (`sweep_peer_before_fin`).
#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
pub(crate) fn before_underscore_exit() {
    if !fdtable::any_objects() || lifecycle::in_vfork_child() || util::signals::in_handler() {
        return;
    }
    sweep_peers_before_exit(&fdtable::all_objects());
}

#[cfg_attr(any(test, not(feature = "interpose")), allow(dead_code))]
extern "C" fn after_fork_child() {
    reset_pid();
    fdtable::unlock_all_after_fork();
    // The child of a handler of a single-threaded process: no allocation (`ops::fork`).
    forklock::after_fork_all(ops::child_must_not_allocate());
    if ops::child_must_not_allocate() {
        setup::after_fork_child_of_handler();
        return;
    }
    setup::after_fork_child();
    ops::conns_after_fork_child();
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
