//! Per-process statistics in shared memory, for `smc-ctl stats` / `conns`.
//!
//! Each process that loads the library and opts a socket in (or decides a connection) maps one
//! file `/run/smc/procs/<pid>` (`$SMC_PROCS_DIR/<pid>`; `.../uid-<euid>/<pid>` for a uid that
//! does not own the directory, see `smc_stats::StatsDir`), 4096 bytes, `MAP_SHARED`. When no
//! directory can be used the same layout lives in anonymous memory (nothing to read from
//! outside).
//! Readers must treat the file as a snapshot: every field is an 8-byte little-endian counter
//! updated with atomic adds. A file whose pid no longer exists is stale; a reader that may write
//! the directory folds it into its cgroup's aggregate and removes it (`smc_stats::StatsDir`).
//!
//! The layout is `smc_stats` (version 1 plus extension 1): this writer records its
//! identity (cgroup id, start time, PID namespace: `VALID_IDENTITY`) when it creates the file, so
//! that a reader can attribute the figures of a process that was killed to its cgroup, and keeps
//! the per-side fallback-reason tables (`VALID_SIDE_REASONS`).

use crate::conn::Conn;
use crate::debug;
use crate::shm::Mapping;
use smc_stats::{self as procstats, Identity, ProcStats, VALID_SIDE_REASONS};
use std::os::fd::{AsRawFd as _, IntoRawFd as _};
use std::sync::atomic::{AtomicU64, Ordering};

pub type Stats = ProcStats;

const _: () = assert!(std::mem::size_of::<Stats>() <= procstats::PAGE_LEN);

struct Area {
    ptr: *mut Stats,
    pid: u32,
}
// SAFETY: the area is shared memory accessed only through atomics.
unsafe impl Send for Area {}
// SAFETY: as above.
unsafe impl Sync for Area {}

static AREA: crate::forklock::ForkMutex<Option<Area>> = crate::forklock::ForkMutex::new(|| None);

static FAST: AtomicU64 = AtomicU64::new(0);

pub fn procs_dir() -> &'static str {
    &crate::util::config::config().procs_dir
}

/// `SMC_STATS_KEEP=1`, read at load time.
pub fn keep() -> bool {
    crate::util::config::config().stats_keep
}

/// The directory this process writes to (`procstats::StatsDir::for_writer`): the top
/// directory when the process's euid owns it, else `uid-<euid>`, which the daemon creates when a
/// client of that uid connects (asked here once, with one `QUERY_GID`, when it is missing).
fn writer_dir() -> Option<procstats::StatsDir> {
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    let ask_daemon = || {
        smc_ism::Client::connect(crate::util::config::daemon_path())
            .and_then(|mut c| c.features())
            .is_ok()
    };
    match procstats::StatsDir::for_writer(std::path::Path::new(procs_dir()), euid, ask_daemon) {
        Ok(d) => Some(d),
        Err(e) => {
            debug!(
                "statistics directory {} unusable for uid {euid}: {e}",
                procs_dir()
            );
            None
        }
    }
}

fn open_area(pid: u32) -> *mut Stats {
    let id = identity(pid);
    // Created with O_EXCL in a directory only this uid (or root) can write, so nobody else can
    // truncate the page under the mapping (no SIGBUS).
    let fd = writer_dir().and_then(|d| match d.create_process_file(&id, procstats::PAGE_LEN) {
        Ok((fd, _reused)) => Some(fd),
        Err(e) => {
            debug!(
                "statistics file of pid {pid} in {}: {e}",
                d.path().display()
            );
            None
        }
    });
    let map = match &fd {
        Some(f) => Mapping::new(f.as_raw_fd(), procstats::PAGE_LEN),
        None => Mapping::anon_shared(procstats::PAGE_LEN),
    };
    if let Some(f) = fd {
        // SAFETY: our fd, closed once (the mapping stays).
        unsafe { crate::real::close(f.into_raw_fd()) };
    }
    let Ok(map) = map else {
        // Last resort: leak a private zeroed page.
        let b: Box<[u64; 512]> = Box::new([0; 512]);
        return Box::into_raw(b) as *mut Stats;
    };
    let s = map.as_ptr() as *mut Stats;
    // The page lives as long as the process (the area is `'static`): never unmapped.
    std::mem::forget(map);
    // SAFETY: a fresh zeroed page, or this process's own page before an exec (same identity).
    unsafe { (*s).init(&id, VALID_SIDE_REASONS) };
    s
}

/// This process's identity. The cgroup and the PID namespace are read once and inherited by
/// forked children (which start in their parent's); the start time is the process's own.
fn identity(pid: u32) -> Identity {
    static INHERITED: crate::forklock::ForkOnce<(u64, u64)> = crate::forklock::ForkOnce::new();
    let &(cgroup_id, pid_ns) = INHERITED.get_or_init(|| {
        (
            bpf_cgroup_id()
                .or_else(|| procstats::proc_cgroup_id("self"))
                .unwrap_or(0),
            procstats::pid_ns("self").unwrap_or(0),
        )
    });
    Identity {
        pid: pid as u64,
        cgroup_id,
        start_time: procstats::proc_start_time(pid as u64).unwrap_or(0),
        pid_ns,
    }
}

/// This process's cgroup v2 id as the programs of its attached cgroup tell it
/// (`SMC_SO_CGROUP`, asked on a throwaway socket): one system call where
/// [`procstats::proc_cgroup_id`] reads `/proc/self/cgroup`, all of `/proc/self/mountinfo` (as
/// long as the host has mounts) and the cgroup's directory, before a fresh process's first
/// connection. `None` outside an attached cgroup (no program answers), then `/proc` it is.
/// Errno preserved.
fn bpf_cgroup_id() -> Option<u64> {
    let e0 = crate::real::errno();
    // SAFETY: creates a descriptor or fails; the kernel's call, not the interposed `socket`
    // (a socket of our own, closed below, that the application never sees).
    let fd = unsafe {
        libc::syscall(
            libc::SYS_socket,
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        )
    } as i32;
    if fd < 0 {
        crate::real::set_errno(e0);
        return None;
    }
    let mut id = 0u64;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: valid out buffer of `len` bytes, our own socket.
    let r = unsafe {
        crate::real::getsockopt(
            fd,
            smc_common::bpf::SOL_SMC_BPF,
            smc_common::bpf::SMC_SO_CGROUP,
            (&mut id as *mut u64).cast(),
            &mut len,
        )
    };
    // SAFETY: our own descriptor, closed once, by the kernel's call (nothing of ours is kept
    // for it).
    unsafe { libc::syscall(libc::SYS_close, fd) };
    crate::real::set_errno(e0);
    (r == 0 && len as usize == std::mem::size_of::<u64>() && id != 0).then_some(id)
}

/// The stats area of this process (created on first use, per process after fork).
/// Whether this process's statistics are open already: [`get`] then neither allocates nor
/// takes a lock (a signal handler's close counts only then).
pub fn ready() -> bool {
    let f = FAST.load(Ordering::Acquire);
    f != 0 && (f >> 44) as u32 == crate::pid() & 0xFFFFF
}

pub fn get() -> &'static Stats {
    let pid = crate::pid();
    let f = FAST.load(Ordering::Acquire);
    if f != 0 && (f >> 44) as u32 == pid & 0xFFFFF {
        // SAFETY: pointer published below, never freed.
        return unsafe { &*((f & ((1 << 44) - 1)) as *const Stats) };
    }
    let mut g = AREA.lock();
    if g.as_ref().is_none_or(|a| a.pid != pid) {
        // Another process's area (before fork): never freed, only forgotten.
        *g = None;
    }
    let a = g.get_or_insert_with(|| Area {
        ptr: open_area(pid),
        pid,
    });
    let p = a.ptr as u64;
    if p < (1 << 44) {
        FAST.store(((pid as u64 & 0xFFFFF) << 44) | p, Ordering::Release);
    }
    // SAFETY: never freed.
    unsafe { &*a.ptr }
}

/// At exit: the connections still open (`open`, each seen once or more: one per number) are
/// closed by the kernel with the process, so their bytes are counted now; then (unless `SMC_STATS_KEEP=1` leaves the file for a reader) the file
/// is folded into its cgroup's `exited-<id>` aggregate and removed, so the figures of exited
/// processes keep counting and the directory does not grow with every process.
pub fn at_exit<'a>(open: impl IntoIterator<Item = &'a Conn>) {
    let mut seen: Vec<*const Conn> = Vec::new();
    for c in open {
        let p = c as *const Conn;
        if !seen.contains(&p) {
            seen.push(p);
            take_counts(c);
        }
    }
    if keep() {
        return;
    }
    let g = AREA.lock();
    let Some(a) = g.as_ref().filter(|a| a.pid == crate::pid()) else {
        return;
    };
    // Only a directory this uid owns: after a setuid the file stays for the readers to fold.
    let Some(dir) = writer_dir() else {
        return;
    };
    let name = a.pid.to_string();
    // The lock can be held only by this uid and root, and is waited for a bounded time: when
    // it is busy the file is left for `smc-ctl stats`, which folds the files of exited
    // processes.
    let Ok(_lock) = dir.lock(procstats::WRITER_LOCK_WAIT) else {
        return;
    };
    // Our own file (not a file of the same pid in another directory after a setuid).
    let Ok((bytes, s)) = dir.read_snapshot(&name) else {
        return;
    };
    // SAFETY: never freed.
    let me = unsafe { &*a.ptr };
    if s.pid != a.pid as u64
        || s.start_time != me.start_time.load(Ordering::Relaxed)
        || s.pid_ns != me.pid_ns.load(Ordering::Relaxed)
    {
        return;
    }
    if dir.fold_into_aggregate(s.cgroup_id, &bytes).is_ok() {
        let _ = dir.remove(&name);
    }
}

/// Moves the byte and call counts of a connection end that is still open into this process's
/// figures, leaving zero behind: a forked process that shares the end and closes it later
/// counts only what it moved after this (no byte counted twice).
fn take_counts(c: &Conn) {
    add_counts(c, true);
}

/// This process's figures paired with a connection end's counts that add up into them.
fn counts(c: &Conn) -> [(&'static AtomicU64, &AtomicU64); 8] {
    let s = get();
    let sh = c.sh();
    [
        (&s.rx_bytes, &sh.rx_bytes),
        (&s.tx_bytes, &sh.tx_bytes),
        (&s.rx_calls, &sh.rx_calls),
        (&s.tx_calls, &sh.tx_calls),
        (&s.rx_full, &sh.rx_full),
        (&s.tx_full, &sh.tx_full),
        (&s.doorbells_sent, &sh.doorbells_sent),
        (&s.doorbells_rcvd, &sh.doorbells_rcvd),
    ]
}

/// Adds a connection end's counts to this process's figures; `take` leaves zero behind.
fn add_counts(c: &Conn, take: bool) {
    for (dst, src) in counts(c) {
        let v = if take {
            src.swap(0, Ordering::Relaxed)
        } else {
            src.load(Ordering::Relaxed)
        };
        dst.fetch_add(v, Ordering::Relaxed);
    }
}

pub fn fallback(server: bool, code: u32) {
    get().fallback(server, code);
}

pub fn smc(server: bool) {
    let s = get();
    if server {
        s.smcd_server.fetch_add(1, Ordering::Relaxed);
    } else {
        s.smcd_client.fetch_add(1, Ordering::Relaxed);
    }
}

pub fn conn_closed(c: &Conn) {
    get().closed_conns.fetch_add(1, Ordering::Relaxed);
    add_counts(c, false);
}

/// Takes back what [`conn_closed`] counted for `c`: a connection counted closed when its last
/// bytes went to an exec'd image (a tail) that is back on its ring because the exec failed.
/// Its figures did not move in between (its rings were stopped), so this process's sums are
/// as if it had never been counted; its later close counts it once.
pub fn conn_reopened(c: &Conn) {
    get().closed_conns.fetch_sub(1, Ordering::Relaxed);
    for (dst, src) in counts(c) {
        dst.fetch_sub(src.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

pub enum Special {
    Sendfile,
    Splice,
    Oob,
}

pub fn special(k: Special) {
    let s = get();
    match k {
        Special::Sendfile => &s.special_sendfile,
        Special::Splice => &s.special_splice,
        Special::Oob => &s.special_oob,
    }
    .fetch_add(1, Ordering::Relaxed);
}

pub fn handshake_error() {
    get().handshake_errors.fetch_add(1, Ordering::Relaxed);
}

pub fn pending() {
    get().pending_connects.fetch_add(1, Ordering::Relaxed);
}
