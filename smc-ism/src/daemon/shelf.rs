//! Files the daemon keeps without holding a descriptor for each: a DMB's memfd and a local
//! state page stay reachable for as long as their record lives (for `OP_ADOPT`, a pooled DMB
//! bound again, the samples of committed memory), but an established connection must not cost
//! the daemon four descriptors (a DMB and a state page per end): under a hard
//! `RLIMIT_NOFILE` of 20 000 that daemon served at most ~4 500 connections.
//!
//! A file is *shelved*: the daemon maps it (`PROT_NONE`, `MAP_SHARED`: never touched, no page
//! of it counted to the daemon, only a VMA of the kernel's) and closes its descriptor; the
//! mapping keeps the file alive. When the file is needed again, it is opened anew through the
//! mapping (`/proc/self/map_files/START-END`, which `CAP_SYS_ADMIN` or
//! `CAP_CHECKPOINT_RESTORE` may open: the daemon runs with them) and checked to be the same
//! inode. The daemon's own mapping is the only way to it, so what it opens is what it shelved:
//! nothing a client does can put another file there. What a client receives is unchanged (a
//! descriptor of the same file, with its seals).
//!
//! When: only once kept files hold half of the daemon's descriptors (a daemon with a high
//! limit never pays for it), and then those of DMBs that have lived
//! [`super::DaemonConfig::shelve_after_ms`] (so that a short connection, and a pooled DMB bound
//! again at once, never do), by a background sweep a few at a time (a burst of thousands took
//! a CPU from the connections' pings for milliseconds); above three quarters, of any age; with
//! only a few descriptors left, at once in the registration. Never those of a client's DMB
//! that waits for its first attach (see `registry::Record::awaiting`): that attach may be a server's past
//! its CLC accept, whose reply must not need a descriptor to open the file again (the daemon
//! at its limit has none: issue 14's resets). Where the mapping cannot be made
//! or opened (no capability), the descriptor is kept, as before.
//!
//! Where: the daemon's own shelf holds as many files as `vm.max_map_count` less a reserve of
//! 4096 allows (61 434 by default; or `max_shelved`). With its descriptors that is ~81 000
//! files: 38 096 connections of issue 14's 65 536 (two DMBs each and a page of state slots per
//! 16 ends). Beyond, the background sweep moves files into *holder processes* (`holder`):
//! children of the daemon that keep each file as a mapping of theirs, each within its own
//! `vm.max_map_count`, opened again through `/proc/<holder>/map_files` (the holder checked to
//! live after the open, and the inode). The sweep leaves half of the daemon's own shelf
//! ([`sweep_reserve`]) to the request paths, which shelve only there (never waiting for
//! a holder). A file whose holder died cannot be opened again (the reply goes without it, as
//! at the descriptor limit); nothing else of its connection depends on it.
//!
//! | Kept as | Costs the daemon | Opened again by | Who else can reach it |
//! | --- | --- | --- | --- |
//! | descriptor | a descriptor (`RLIMIT_NOFILE`) | nothing to open | nobody |
//! | own shelf | a mapping (`vm.max_map_count`) | `/proc/self/map_files/A-B` + inode check | nobody: the daemon's own address space |
//! | holder | a mapping of the holder's; per holder a socket and a pidfd | `/proc/<holder>/map_files/A-B`, holder alive after the open, inode check | nobody: the holder is the daemon's child, same uid, reachable only through the daemon's socket to it |
//!
//! What a shelf costs (the `mmap`, the reopen, the `munmap`, as measured): docs/PERF.md.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Kept files that hold a descriptor of the daemon's (not shelved).
static HELD: AtomicU64 = AtomicU64::new(0);

/// How many descriptors kept files hold now.
pub(crate) fn held_descriptors() -> u64 {
    HELD.load(Relaxed)
}

/// Shelved files (a mapping each).
static SHELVED: AtomicU64 = AtomicU64::new(0);

/// Mappings below `vm.max_map_count` that shelves leave to the rest of the daemon: a thread it
/// starts (tokio's blocking pool comes and goes) maps its stack and its signal stack, and
/// Rust's runtime aborts the process when the latter fails (a daemon that shelved up to the
/// limit, 65 530 mappings, aborted at its next thread: issue 14's 65 536 connections); malloc
/// maps arenas and large blocks. 4096: about a thousand threads.
const MAP_RESERVE: u64 = 4096;

/// How many files are shelved now, and whether no more may be (the shelves are full: their
/// cap or `vm.max_map_count` reached, as last read).
pub(crate) fn shelved_now() -> (u64, bool) {
    let n = SHELVED.load(Relaxed);
    (n, !shelf_room_quiet(n))
}

fn shelf_room_quiet(n: u64) -> bool {
    let lim = MAP_LIMIT.load(Relaxed);
    n < MAX_SHELVED.load(Relaxed) && (lim == 0 || n + MAP_RESERVE < lim)
}

/// Mappings of the daemon's own shelf that the background sweep leaves to the request paths,
/// when holder processes take the rest (`holder`): half of it. A registration with few
/// descriptors left shelves a batch at once, and only into the daemon's own shelf (it never
/// waits for a holder): that is its room when the sweep falls behind a burst of connections.
/// (With 2048 left to them, the sweep fell behind a setup of 3 000 connections a second under
/// load, the reserve ran out, and 1 900–5 500 registrations were refused at the descriptor
/// limit in a run of 65 536 connections.)
pub(crate) fn sweep_reserve() -> u64 {
    let lim = MAP_LIMIT.load(Relaxed);
    let lim = if lim == 0 { 65_530 } else { lim };
    lim.saturating_sub(MAP_RESERVE)
        .min(MAX_SHELVED.load(Relaxed))
        / 2
}

/// `vm.max_map_count` as last read (0: not yet).
static MAP_LIMIT: AtomicU64 = AtomicU64::new(0);

/// Files shelved at most, when configured ([`super::DaemonConfig::max_shelved`]; `u64::MAX`:
/// as `vm.max_map_count` allows).
static MAX_SHELVED: AtomicU64 = AtomicU64::new(u64::MAX);

/// Shelves at most `n` files (`None`: as `vm.max_map_count` allows).
pub(crate) fn set_max_shelved(n: Option<u64>) {
    MAX_SHELVED.store(n.unwrap_or(u64::MAX), Relaxed);
}

/// Whether one more file may be shelved within `vm.max_map_count` less [`MAP_RESERVE`] (read
/// again near the limit: it may have been raised), and within [`MAX_SHELVED`], with `reserve`
/// mappings more left free.
fn shelf_room(reserve: u64) -> bool {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let n = SHELVED.load(Relaxed) + reserve;
    let cap = MAX_SHELVED.load(Relaxed);
    let lim = MAP_LIMIT.load(Relaxed);
    if lim != 0 && n + MAP_RESERVE < lim && n < cap {
        return true;
    }
    let lim = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(65_530);
    MAP_LIMIT.store(lim, Relaxed);
    let room = n + MAP_RESERVE < lim && n < cap;
    if !room && reserve == 0 && !WARNED.swap(true, Relaxed) && !super::holder::enabled() {
        let why = if n >= cap {
            format!("--max-shelved ({cap})")
        } else {
            format!("vm.max_map_count ({lim})")
        };
        log::warn!(
            "{n} files shelved: {why} leaves no room for more; new ones keep their descriptors \
             (raise it: docs/OPERATIONS.md)"
        );
    }
    room
}
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::holder::{self, Holder};

/// A file the daemon keeps: by descriptor, or shelved (see the module docs).
pub(crate) struct KeptFile {
    hold: Mutex<Hold>,
    /// Mirrors `hold` (a lock-free check for the sweep).
    shelved: AtomicBool,
    /// Its size (that of the mapping when shelved).
    len: usize,
    /// Its inode (checked when it is opened again).
    ino: u64,
    /// Its committed bytes (`st_blocks` × 512) at the last sample.
    committed: AtomicU64,
}

enum Hold {
    /// Shared with the replies under way that pass it: closed when the last one is sent.
    Fd(Arc<OwnedFd>),
    /// The address of our `PROT_NONE` mapping of `len` bytes.
    Shelved(usize),
    /// The address of a holder process's mapping of `len` bytes (see `holder`).
    Held(Arc<Holder>, usize),
}

fn lock(m: &Mutex<Hold>) -> MutexGuard<'_, Hold> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KeptFile {
    /// Keeps `fd`, a file of `len` bytes (a multiple of the page size).
    pub(crate) fn new(fd: OwnedFd, len: u64) -> KeptFile {
        let (ino, blocks) = stat(fd.as_fd()).unwrap_or((0, 0));
        HELD.fetch_add(1, Relaxed);
        KeptFile {
            hold: Mutex::new(Hold::Fd(Arc::new(fd))),
            shelved: AtomicBool::new(false),
            len: len as usize,
            ino,
            committed: AtomicU64::new(blocks),
        }
    }

    /// A descriptor of the file: the one kept, or, when shelved, a new one opened through the
    /// mapping.
    pub(crate) fn fd(&self) -> io::Result<Arc<OwnedFd>> {
        let (addr, by) = match &*lock(&self.hold) {
            Hold::Fd(f) => return Ok(f.clone()),
            Hold::Shelved(a) => (*a, None),
            Hold::Held(h, a) => (*a, Some(h.clone())),
        };
        let f = match by {
            None => open_mapping(addr, self.len)?,
            // No wait for the holder: an open in /proc (its mapping, as our own).
            Some(h) => h.open(addr, self.len)?,
        };
        match stat(f.as_fd()) {
            Some((ino, _)) if ino == self.ino => Ok(Arc::new(f)),
            _ => Err(io::Error::other("a shelved file reopened as another inode")),
        }
    }

    /// The descriptor kept, if it is not shelved (never opens anything).
    pub(crate) fn held(&self) -> Option<Arc<OwnedFd>> {
        match &*lock(&self.hold) {
            Hold::Fd(f) => Some(f.clone()),
            Hold::Shelved(_) | Hold::Held(..) => None,
        }
    }

    /// Shelves the file in the daemon's own shelf, leaving `reserve` of its room free:
    /// `Some(true)` when shelved now, `Some(false)` when it was already (or is in a holder),
    /// `None` when it keeps its descriptor (shelves do not work here, no room, or the mapping
    /// failed).
    pub(crate) fn shelve(&self, reserve: u64) -> Option<bool> {
        if !available() {
            return None;
        }
        let mut h = lock(&self.hold);
        let fd = match &*h {
            Hold::Shelved(_) | Hold::Held(..) => return Some(false),
            Hold::Fd(f) => f.clone(),
        };
        if !shelf_room(reserve) {
            return None;
        }
        match map_none(fd.as_fd(), self.len) {
            Ok(addr) => {
                SHELVED.fetch_add(1, Relaxed);
                // Our descriptor goes (closed here, or once the replies using it are sent).
                *h = Hold::Shelved(addr);
                self.shelved.store(true, Relaxed);
                HELD.fetch_sub(1, Relaxed);
                Some(true)
            }
            Err(e) => {
                log::debug!("cannot shelve a file of {} bytes: {e}", self.len);
                None
            }
        }
    }

    pub(crate) fn is_shelved(&self) -> bool {
        self.shelved.load(Relaxed)
    }

    /// Its inode.
    pub(crate) fn ino(&self) -> u64 {
        self.ino
    }

    /// Its committed bytes: sampled now when it has a descriptor (one `fstat`) or `refresh`
    /// (shelved: a `stat` through the mapping, ~5 µs), else as last sampled.
    pub(crate) fn committed(&self, refresh: bool) -> u64 {
        let now = match &*lock(&self.hold) {
            Hold::Fd(f) => stat(f.as_fd()).map(|s| s.1),
            Hold::Shelved(a) if refresh => stat_mapping(*a, self.len).map(|s| s.1),
            Hold::Held(h, a) if refresh => h
                .stat(*a, self.len)
                .filter(|s| s.0 == self.ino)
                .map(|s| s.1),
            Hold::Shelved(_) | Hold::Held(..) => None,
        };
        match now {
            Some(c) => {
                self.committed.store(c, Relaxed);
                c
            }
            None => self.committed.load(Relaxed),
        }
    }
}

impl Drop for KeptFile {
    fn drop(&mut self) {
        match *lock(&self.hold) {
            Hold::Shelved(addr) => {
                // SAFETY: our own mapping of `len` bytes at `addr`, made by `map_none`, never
                // handed out, unmapped once (here).
                unsafe { libc::munmap(addr as *mut libc::c_void, self.len) };
                SHELVED.fetch_sub(1, Relaxed);
            }
            Hold::Held(ref h, addr) => {
                h.release(addr, self.len);
            }
            Hold::Fd(_) => {
                HELD.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// Moves those of `files` that keep a descriptor into holder processes (see `holder`), a
/// batch per message; waits for the holders' answers: the background sweep only. Those moved
/// (their addresses).
pub(crate) fn shelve_in_holders(files: &[&KeptFile]) -> std::collections::HashSet<usize> {
    let mut moved = std::collections::HashSet::new();
    if files.is_empty() || !available() || !holder::enabled() {
        return moved;
    }
    // Each once (the page of a client's state slots is shared by its DMBs).
    let mut seen = std::collections::HashSet::new();
    let todo: Vec<(&KeptFile, Arc<OwnedFd>)> = files
        .iter()
        .filter(|f| seen.insert(std::ptr::from_ref::<KeptFile>(f) as usize))
        .filter_map(|f| Some((*f, f.held()?)))
        .collect();
    let mut rest = &todo[..];
    while !rest.is_empty() {
        let Some((h, got)) = holder::pick(rest.len().min(holder::BATCH) as u64) else {
            break;
        };
        let (chunk, tail) = rest.split_at((got as usize).min(rest.len()));
        rest = tail;
        let fds: Vec<(BorrowedFd<'_>, usize)> =
            chunk.iter().map(|(f, fd)| (fd.as_fd(), f.len)).collect();
        let addrs = match h.map(&fds) {
            Ok(a) => a,
            Err(e) => {
                h.unreserve(chunk.len() as u64);
                log::debug!("holder process {}: {e}", h.pid());
                break;
            }
        };
        for ((f, fd), r) in chunk.iter().zip(addrs) {
            match r {
                Ok(addr) if f.take_holder(&h, addr, fd) => {
                    moved.insert(std::ptr::from_ref::<KeptFile>(f) as usize);
                }
                // Shelved meanwhile in our own shelf: the holder's copy goes.
                Ok(addr) => h.release(addr, f.len),
                Err(e) => {
                    h.unreserve(1);
                    if e == libc::ENOMEM {
                        h.full();
                    }
                    log::debug!("holder process {} cannot map a file: errno {e}", h.pid());
                }
            }
        }
    }
    moved
}

impl KeptFile {
    /// Kept by holder `h` at `addr` from now on, if it still keeps descriptor `fd`.
    fn take_holder(&self, h: &Arc<Holder>, addr: usize, fd: &Arc<OwnedFd>) -> bool {
        let mut g = lock(&self.hold);
        match &*g {
            Hold::Fd(f) if Arc::ptr_eq(f, fd) => {}
            _ => return false,
        }
        *g = Hold::Held(h.clone(), addr);
        self.shelved.store(true, Relaxed);
        HELD.fetch_sub(1, Relaxed);
        true
    }
}

/// Whether files can be shelved here (checked once: a memfd shelved and opened again).
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        let direct = || -> io::Result<()> {
            let f = crate::sys::create_state_memfd(4096)?;
            let addr = map_none(f.as_fd(), 4096)?;
            let r = open_mapping(addr, 4096).map(drop);
            // SAFETY: the mapping just made, unmapped once.
            unsafe { libc::munmap(addr as *mut libc::c_void, 4096) };
            r
        };
        match direct() {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "cannot reopen files through /proc/self/map_files ({e}): the daemon keeps a \
                     descriptor per DMB and per state page (CAP_SYS_ADMIN or \
                     CAP_CHECKPOINT_RESTORE lifts this)"
                );
                false
            }
        }
    })
}

/// Maps `len` bytes of `fd` shared, without access.
fn map_none(fd: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: a new mapping chosen by the kernel; nothing of ours is replaced; `PROT_NONE`: it
    // is never accessed.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(p as usize)
}

fn map_path(addr: usize, len: usize) -> std::ffi::CString {
    let s = format!("/proc/self/map_files/{:x}-{:x}", addr, addr + len);
    // No NUL in a formatted path.
    std::ffi::CString::new(s).unwrap_or_default()
}

/// Opens the file mapped at `addr` (our mapping of `len` bytes) read-write.
fn open_mapping(addr: usize, len: usize) -> io::Result<OwnedFd> {
    let p = map_path(addr, len);
    // SAFETY: a valid C string; a new descriptor or an error.
    let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor of ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Inode and committed bytes of an open file.
fn stat(fd: BorrowedFd<'_>) -> Option<(u64, u64)> {
    // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open (borrowed for the call), `st` a writable stat.
    (unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } == 0)
        .then_some((st.st_ino as u64, st.st_blocks as u64 * 512))
}

/// The same of the file mapped at `addr`, through the mapping (no descriptor).
fn stat_mapping(addr: usize, len: usize) -> Option<(u64, u64)> {
    let p = map_path(addr, len);
    // SAFETY: as in `stat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid C string and a writable stat.
    (unsafe { libc::stat(p.as_ptr(), &mut st) } == 0)
        .then_some((st.st_ino as u64, st.st_blocks as u64 * 512))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_at(fd: BorrowedFd<'_>, off: i64, b: &[u8]) {
        // SAFETY: a valid buffer of its length.
        let r = unsafe { libc::pwrite(fd.as_raw_fd(), b.as_ptr().cast(), b.len(), off) };
        assert_eq!(r, b.len() as isize);
    }

    fn read_at(fd: BorrowedFd<'_>, off: i64, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        // SAFETY: a valid buffer of its length.
        let r = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), n, off) };
        assert_eq!(r, n as isize);
        b
    }

    /// Descriptors of this process open on the file of inode `ino` (other tests run
    /// alongside: only this file's are counted).
    fn fds_of(ino: u64) -> usize {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
            .filter(|m| m.ino() == ino && m.nlink() == 0)
            .count()
    }

    #[test]
    fn a_shelved_file_is_the_same_file_without_a_descriptor() {
        if !available() {
            let test = "a_shelved_file_is_the_same_file_without_a_descriptor";
            let why = "reopening a file through /proc/self/map_files needs CAP_SYS_ADMIN or \
                       CAP_CHECKPOINT_RESTORE";
            // `cargo xtask test` (root) sets it: there the test must run.
            assert!(
                std::env::var_os("SMC_TESTS_NEED_ROOT").is_none(),
                "{test} needs root: {why} (SMC_TESTS_NEED_ROOT is set)"
            );
            // Straight to stderr, past the test harness's capture (which keeps what
            // `eprintln!` prints of a passing test), so that a passing run shows it.
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "{test}: SKIPPED: needs root: {why} (run the tests as root: cargo xtask test)"
            );
            return;
        }
        let f = crate::sys::create_dmb_memfd(64 * 1024).unwrap();
        write_at(f.as_fd(), 20_000, b"kept");
        let k = KeptFile::new(f, 64 * 1024);
        let before = k.committed(false);
        assert!(before >= 4096, "{before}");
        let held = k.fd().unwrap();
        assert_eq!(fds_of(k.ino()), 1);
        assert_eq!(k.shelve(0), Some(true));
        assert!(k.is_shelved());
        assert_eq!(k.shelve(0), Some(false));
        // A reply under way still has its descriptor; then ours is gone.
        assert_eq!(read_at(held.as_fd(), 20_000, 4), b"kept");
        drop(held);
        assert_eq!(fds_of(k.ino()), 0, "the daemon's descriptor is gone");
        let again = k.fd().unwrap();
        assert_eq!(read_at(again.as_fd(), 20_000, 4), b"kept");
        write_at(again.as_fd(), 100, b"back");
        drop(again);
        let third = k.fd().unwrap();
        assert_eq!(read_at(third.as_fd(), 100, 4), b"back");
        // Still sealed: it cannot grow or shrink.
        // SAFETY: ftruncate of our descriptor.
        assert_ne!(unsafe { libc::ftruncate(third.as_raw_fd(), 4096) }, 0);
        drop(third);
        assert_eq!(k.committed(true), 8192);
        assert_eq!(fds_of(k.ino()), 0);
    }
}
