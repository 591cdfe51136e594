//! Holder processes: shelves beyond the daemon's own `vm.max_map_count` (see `shelf`).
//!
//! A shelved file costs its shelf a mapping, and a process has at most `vm.max_map_count`
//! (65 530 by default) of them: the daemon's own shelves, with its descriptors, keep about
//! 81 000 files, and 65 536 connections need about 139 000 (two DMBs and an eighth of a page of
//! local state slots each). So once the daemon's own shelf is full, the background sweep
//! moves files into *holders*: small processes of the daemon's, each of which maps what it is
//! given (`PROT_NONE`, `MAP_SHARED`, as the daemon's own shelf), closes the descriptor and
//! answers the address. The daemon opens such a file again through
//! `/proc/<holder>/map_files/START-END` (the capability its own shelf needs, the same uid) and
//! checks the inode as for its own shelf; when the file's record goes, the holder unmaps it.
//! Each holder has its own `vm.max_map_count`: holders scale the shelves without a sysctl.
//!
//! Processes: at its start the daemon forks a *zygote* (`smc-ism-zygote`, while the daemon is
//! still small: a holder forked later from a daemon of tens of thousands of connections would
//! keep a copy of its heap and of its mappings); the zygote forks the holders
//! (`smc-ism-holder`) when asked, each with a `SOCK_SEQPACKET` socket to the daemon and
//! nothing else open, and hands the daemon that socket and a pidfd of the holder. The children
//! of a multi-threaded daemon run only async-signal-safe calls: raw system calls on stack
//! buffers, no allocation, no lock.
//!
//! Trust: a holder is reachable only through its socket, which only the daemon holds (no path,
//! no inheritance across `exec`), and runs as the daemon's uid: no client can talk to it or put
//! a mapping into it. What the daemon opens through a holder's `map_files` is what that holder
//! mapped for it, as long as the holder lives: after the open the daemon checks, through the
//! pidfd, that the holder still lives (so the pid was not reused by another process), and the
//! inode.
//!
//! Lifetime: the holders die with the daemon (their socket to it closes: they exit; their
//! parent, the zygote, exits when its socket to the daemon closes, and the holders have
//! `PR_SET_PDEATHSIG` `SIGKILL` for their parent), and at its shutdown (killed). A holder that
//! dies otherwise loses nothing in use: the connections whose files it held keep their
//! mappings in their processes; only reopening those files (`OP_ADOPT`, a pooled DMB bound
//! again) fails, as a reopen at the descriptor limit does (the reply goes without the file,
//! its client declines `MEM`).
//!
//! Waits: only the background sweep talks to holders and waits for their answers (a batch of
//! up to 250 files per message, with a timeout after which the holder is killed). The request paths
//! never wait on a holder: a reopen is an `open` in `/proc`, a release an unmap message sent
//! without waiting (queued, and sent by the sweep, when the holder's socket is full).

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// Files passed in one message at most (`SCM_MAX_FD` is 253): one round trip per turn of the
/// sweep (under load each answer waits for the holder to be scheduled: with 64 per message,
/// the sweep fell behind a setup of 3 000 connections a second and the daemon reached its
/// descriptor limit).
pub(crate) const BATCH: usize = 250;

const OP_MAP: u64 = 1;
const OP_UNMAP: u64 = 2;
const OP_SPAWN: u64 = 3;

/// The descriptor number of the socket in the zygote and in a holder.
const CHILD_SOCK: RawFd = 3;

/// Mappings below `vm.max_map_count` a holder leaves free (those it inherited from the daemon
/// at its start are a few hundred at most).
const HOLDER_RESERVE: u64 = 1024;

/// How long the sweep waits for a holder's or the zygote's answer before it gives up on it.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// Room for the `SCM_RIGHTS` of [`BATCH`] descriptors (`CMSG_SPACE(4 * 250)` = 1016).
const CMSG_BYTES: usize = 1024;

const _: () = assert!(CMSG_BYTES >= 16 + 4 * BATCH);

#[repr(C, align(8))]
struct CmsgBuf([u8; CMSG_BYTES]);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Holders at most (`DaemonConfig::max_holders`; 0: none, no zygote).
static MAX_HOLDERS: AtomicU64 = AtomicU64::new(16);
/// Files one holder keeps at most (`DaemonConfig::holder_max_files`; `u64::MAX`: as its
/// `vm.max_map_count` allows).
static HOLDER_CAP: AtomicU64 = AtomicU64::new(u64::MAX);
/// Files kept in live holders now, and live holders (for `stats`; not on a request path).
pub(crate) fn figures() -> (u64, u64) {
    let p = lock(&POOL);
    let live = p.holders.iter().filter(|h| !h.dead.load(Relaxed));
    live.fold((0, 0), |(f, n), h| (f + h.files.load(Relaxed), n + 1))
}

struct Pool {
    zygote: Option<Arc<Zygote>>,
    holders: Vec<Arc<Holder>>,
    /// Daemons of this process running (holders are shared by them, as the shelves are).
    daemons: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    zygote: None,
    holders: Vec::new(),
    daemons: 0,
});

/// A running daemon's hold on the holders: the last one's drop kills them.
pub(crate) struct Lease(());

/// Starts the holders' zygote (once per process: the daemons of a process share it) when
/// holders are wanted; see the module docs.
pub(crate) fn start(max_holders: u32, holder_max_files: Option<u64>) -> Lease {
    MAX_HOLDERS.store(u64::from(max_holders), Relaxed);
    HOLDER_CAP.store(holder_max_files.unwrap_or(u64::MAX), Relaxed);
    let mut p = lock(&POOL);
    p.daemons += 1;
    if max_holders > 0 && p.zygote.is_none() && super::shelf::available() {
        match Zygote::fork() {
            Ok(z) => p.zygote = Some(Arc::new(z)),
            Err(e) => log::warn!(
                "cannot start the holders' zygote ({e}): the shelves are the daemon's own \
                 (vm.max_map_count bounds them)"
            ),
        }
    }
    Lease(())
}

impl Drop for Lease {
    fn drop(&mut self) {
        let (zygote, holders) = {
            let mut p = lock(&POOL);
            p.daemons = p.daemons.saturating_sub(1);
            if p.daemons > 0 {
                return;
            }
            (p.zygote.take(), std::mem::take(&mut p.holders))
        };
        for h in holders {
            h.kill();
        }
        if let Some(z) = zygote {
            z.kill();
        }
    }
}

/// Whether files may go to holders (a zygote runs).
pub(crate) fn enabled() -> bool {
    lock(&POOL).zygote.is_some()
}

/// A holder with room for more files, and how many of `n` were reserved in it (see
/// [`Holder::unreserve`]); a new one is spawned when none has room. Only the sweep calls this.
pub(crate) fn pick(n: u64) -> Option<(Arc<Holder>, u64)> {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let zygote = {
        let mut p = lock(&POOL);
        p.holders.retain(|h| !h.is_dead());
        for h in &p.holders {
            let got = h.reserve(n);
            if got > 0 {
                return Some((h.clone(), got));
            }
        }
        if p.holders.len() as u64 >= MAX_HOLDERS.load(Relaxed) {
            if !WARNED.swap(true, Relaxed) {
                log::warn!(
                    "{} holder processes full: new DMB files keep their descriptors \
                     (--max-holders)",
                    p.holders.len()
                );
            }
            return None;
        }
        p.zygote.clone()?
    };
    // The zygote's answer is waited for without the pool's lock.
    let h = match zygote.spawn() {
        Ok(h) => Arc::new(h),
        Err(e) => {
            log::warn!("cannot start a holder process: {e}");
            if zygote.broken.load(Relaxed) {
                let mut p = lock(&POOL);
                if p.zygote.as_ref().is_some_and(|z| Arc::ptr_eq(z, &zygote)) {
                    p.zygote = None;
                }
                drop(p);
                zygote.kill();
            }
            return None;
        }
    };
    log::info!(
        "holder process {} started: it keeps DMB files beyond the daemon's own mappings",
        h.pid
    );
    let got = h.reserve(n);
    let mut p = lock(&POOL);
    p.holders.push(h.clone());
    (got > 0).then_some((h, got))
}

/// The sweep's turn for the holders: unmaps that found a holder's socket full are sent, and
/// dead holders leave the pool.
pub(crate) fn tick() {
    let hs: Vec<Arc<Holder>> = {
        let mut p = lock(&POOL);
        p.holders.retain(|h| !h.is_dead());
        p.holders.clone()
    };
    for h in hs {
        let _g = lock(&h.map_lock);
        h.flush_pending();
    }
}

/// A holder process (see the module docs).
pub(crate) struct Holder {
    pid: i32,
    pidfd: OwnedFd,
    sock: OwnedFd,
    /// Files it keeps, and those reserved for a batch under way.
    files: AtomicU64,
    /// Files it may keep (lowered when its mappings ran out).
    cap: AtomicU64,
    dead: AtomicBool,
    /// One `MAP` at a time (a request and its answer).
    map_lock: Mutex<()>,
    /// Unmaps that found its socket full: sent before the next `MAP` or at the next turn of
    /// the sweep.
    pending: Mutex<Vec<(usize, usize)>>,
}

impl Holder {
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// Reserves room for up to `n` files: how many.
    fn reserve(&self, n: u64) -> u64 {
        let cap = self.cap.load(Relaxed);
        if self.dead.load(Relaxed) {
            return 0;
        }
        match self.files.fetch_update(Relaxed, Relaxed, |f| {
            (f < cap).then_some(f + n.min(cap - f))
        }) {
            Ok(f) => n.min(cap - f),
            Err(_) => 0,
        }
    }

    /// Gives back `n` reserved files that did not go to it.
    pub(crate) fn unreserve(&self, n: u64) {
        self.files.fetch_sub(n, Relaxed);
    }

    /// Its mappings ran out: no more files than it keeps now.
    pub(crate) fn full(&self) {
        self.cap.store(self.files.load(Relaxed), Relaxed);
    }

    /// Whether it died (or was given up).
    pub(crate) fn is_dead(&self) -> bool {
        if self.dead.load(Relaxed) {
            return true;
        }
        if exited(self.pidfd.as_fd()) {
            self.dead.store(true, Relaxed);
            log::warn!(
                "holder process {} died: the DMB files it kept cannot be opened again (their \
                 connections keep working; adopting them declines MEM)",
                self.pid
            );
            return true;
        }
        false
    }

    fn kill(&self) {
        self.dead.store(true, Relaxed);
        // SAFETY: our pidfd of the holder; a signal to it, or an error when it is gone.
        unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                libc::SIGKILL,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
    }

    fn give_up(&self, why: &str) {
        log::warn!("holder process {}: {why}; it is killed", self.pid);
        self.kill();
    }

    /// Maps `files` (descriptors and sizes, at most [`BATCH`]) in the holder: an address, or
    /// the holder's errno, for each. Waits for its answer (the sweep only).
    pub(crate) fn map(
        &self,
        files: &[(BorrowedFd<'_>, usize)],
    ) -> io::Result<Vec<Result<usize, i32>>> {
        let n = files.len().min(BATCH);
        let _g = lock(&self.map_lock);
        if self.dead.load(Relaxed) {
            return Err(io::Error::other("the holder is gone"));
        }
        self.flush_pending();
        let mut req = [0u64; 2 + BATCH];
        let mut fds = [-1 as RawFd; BATCH];
        req[0] = OP_MAP;
        req[1] = n as u64;
        for (i, (fd, len)) in files.iter().take(n).enumerate() {
            req[2 + i] = *len as u64;
            fds[i] = fd.as_raw_fd();
        }
        let fail = |e: i32, what: &str| {
            let e = io::Error::from_raw_os_error(e);
            self.give_up(&format!("{what}: {e}"));
            e
        };
        send_words(self.sock.as_raw_fd(), &req[..2 + n], &fds[..n], 0)
            .map_err(|e| fail(e, "cannot pass it files"))?;
        let mut rep = [0u64; 2 + BATCH];
        let mut none = [-1 as RawFd; BATCH];
        let (bytes, nfd) = recv_words(self.sock.as_raw_fd(), &mut rep, &mut none)
            .map_err(|e| fail(e, "no answer"))?;
        close_all(&none[..nfd]);
        if bytes != (2 + n) * 8 || rep[0] != OP_MAP || rep[1] != n as u64 {
            return Err(fail(libc::EPROTO, "a malformed answer"));
        }
        Ok(rep[2..2 + n]
            .iter()
            .map(|&a| {
                let a = a as i64;
                if a < 0 {
                    Err(-a as i32)
                } else {
                    Ok(a as usize)
                }
            })
            .collect())
    }

    /// Sends the queued unmaps (the caller holds `map_lock`; blocking, with a timeout).
    fn flush_pending(&self) {
        let todo = std::mem::take(&mut *lock(&self.pending));
        for chunk in todo.chunks(BATCH) {
            let mut msg = [0u64; 2 + 2 * BATCH];
            msg[0] = OP_UNMAP;
            msg[1] = chunk.len() as u64;
            for (i, (a, l)) in chunk.iter().enumerate() {
                msg[2 + 2 * i] = *a as u64;
                msg[3 + 2 * i] = *l as u64;
            }
            if let Err(e) = send_words(self.sock.as_raw_fd(), &msg[..2 + 2 * chunk.len()], &[], 0) {
                self.give_up(&format!(
                    "cannot send it unmaps: {}",
                    io::Error::from_raw_os_error(e)
                ));
                return;
            }
        }
    }

    /// The file it maps at `addr` (`len` bytes), opened read-write: never waits for the holder.
    pub(crate) fn open(&self, addr: usize, len: usize) -> io::Result<OwnedFd> {
        if self.dead.load(Relaxed) {
            return Err(gone());
        }
        let p = self.path(addr, len);
        // SAFETY: a valid C string; a new descriptor or an error.
        let fd = unsafe { libc::open(p.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor of ours.
        let f = unsafe { OwnedFd::from_raw_fd(fd) };
        // Alive after the open: the pid was the holder's when it was opened.
        if self.is_dead() {
            return Err(gone());
        }
        Ok(f)
    }

    /// `stat` of the file it maps at `addr` (no descriptor): inode and committed bytes.
    pub(crate) fn stat(&self, addr: usize, len: usize) -> Option<(u64, u64)> {
        if self.dead.load(Relaxed) {
            return None;
        }
        let p = self.path(addr, len);
        // SAFETY: `libc::stat` is plain integers, for which all-zero bytes are a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and a writable stat.
        let ok = unsafe { libc::stat(p.as_ptr(), &mut st) } == 0;
        (ok && !self.is_dead()).then_some((st.st_ino as u64, st.st_blocks as u64 * 512))
    }

    fn path(&self, addr: usize, len: usize) -> std::ffi::CString {
        let s = format!("/proc/{}/map_files/{:x}-{:x}", self.pid, addr, addr + len);
        // No NUL in a formatted path.
        std::ffi::CString::new(s).unwrap_or_default()
    }

    /// The file at `addr` is no longer kept: the holder unmaps it (a message sent without
    /// waiting; queued for the sweep when the socket is full).
    pub(crate) fn release(&self, addr: usize, len: usize) {
        self.files.fetch_sub(1, Relaxed);
        if self.dead.load(Relaxed) {
            return;
        }
        let msg = [OP_UNMAP, 1, addr as u64, len as u64];
        match send_words(self.sock.as_raw_fd(), &msg, &[], libc::MSG_DONTWAIT) {
            Ok(()) => {}
            Err(libc::EAGAIN) => lock(&self.pending).push((addr, len)),
            // Gone (EPIPE): nothing to unmap.
            Err(_) => self.dead.store(true, Relaxed),
        }
    }
}

fn gone() -> io::Error {
    io::Error::other("its holder process is gone")
}

/// Whether the process of `pidfd` exited (readable).
fn exited(pidfd: BorrowedFd<'_>) -> bool {
    let mut p = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r > 0 && p.revents != 0
}

/// The holders' zygote: a child of the daemon forked at its start (see the module docs).
struct Zygote {
    pid: i32,
    /// Its pidfd (a signal to it never reaches another process, should something else in
    /// this process have reaped it and its pid been reused).
    pidfd: Option<OwnedFd>,
    sock: OwnedFd,
    /// One `SPAWN` at a time.
    lock: Mutex<()>,
    /// It failed to answer: given up.
    broken: AtomicBool,
}

impl Zygote {
    fn fork() -> io::Result<Zygote> {
        let (ours, theirs) = seqpacket_pair()?;
        set_timeouts(ours.as_fd());
        // SAFETY: the child runs `zygote_start`, which makes only async-signal-safe calls (raw
        // system calls on its stack, no allocation, no lock) and never returns: what fork
        // leaves of the other threads' state in the child is never touched.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid == 0 {
            // SAFETY: see above; the child of the fork.
            unsafe { zygote_start(theirs.as_raw_fd()) }
        }
        drop(theirs);
        // SAFETY: a pidfd of our child, or an error.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as RawFd;
        // SAFETY: a new descriptor of ours when not negative.
        let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
        Ok(Zygote {
            pid,
            pidfd,
            sock: ours,
            lock: Mutex::new(()),
            broken: AtomicBool::new(false),
        })
    }

    /// A new holder (waits for the zygote's answer: the sweep only).
    fn spawn(&self) -> io::Result<Holder> {
        let _g = lock(&self.lock);
        if self.broken.load(Relaxed) {
            return Err(io::Error::other("the zygote is gone"));
        }
        let broken = |e: i32| {
            self.broken.store(true, Relaxed);
            io::Error::from_raw_os_error(e)
        };
        send_words(self.sock.as_raw_fd(), &[OP_SPAWN, 0], &[], 0).map_err(broken)?;
        let mut rep = [0u64; 4];
        let mut fds = [-1 as RawFd; BATCH];
        let (bytes, nfd) = recv_words(self.sock.as_raw_fd(), &mut rep, &mut fds).map_err(broken)?;
        // SAFETY: descriptors just received, ours.
        let mut got: Vec<OwnedFd> = fds[..nfd]
            .iter()
            .map(|&f| unsafe { OwnedFd::from_raw_fd(f) })
            .collect();
        if bytes != 24 || rep[0] != OP_SPAWN {
            return Err(broken(libc::EPROTO));
        }
        if rep[1] == 0 || got.len() != 2 {
            return Err(io::Error::from_raw_os_error(rep[2] as i32));
        }
        let pidfd = got.pop().ok_or_else(gone)?;
        let sock = got.pop().ok_or_else(gone)?;
        set_timeouts(sock.as_fd());
        let map_limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(65_530);
        Ok(Holder {
            pid: rep[1] as i32,
            pidfd,
            sock,
            files: AtomicU64::new(0),
            cap: AtomicU64::new(
                map_limit
                    .saturating_sub(HOLDER_RESERVE)
                    .min(HOLDER_CAP.load(Relaxed)),
            ),
            dead: AtomicBool::new(false),
            map_lock: Mutex::new(()),
            pending: Mutex::new(Vec::new()),
        })
    }

    fn kill(&self) {
        // SAFETY: a signal through our pidfd of the zygote, then it is reaped through it
        // (fails at once when something else reaped it); without a pidfd, to its pid: our
        // child, reaped only here.
        unsafe {
            match &self.pidfd {
                Some(fd) => {
                    libc::syscall(
                        libc::SYS_pidfd_send_signal,
                        fd.as_raw_fd(),
                        libc::SIGKILL,
                        std::ptr::null::<libc::siginfo_t>(),
                        0,
                    );
                    let mut info: libc::siginfo_t = std::mem::zeroed();
                    libc::waitid(
                        libc::P_PIDFD,
                        fd.as_raw_fd() as libc::id_t,
                        &mut info,
                        libc::WEXITED,
                    );
                }
                None => {
                    libc::kill(self.pid, libc::SIGKILL);
                    libc::waitpid(self.pid, std::ptr::null_mut(), 0);
                }
            }
        }
    }
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut sv = [-1 as RawFd; 2];
    // SAFETY: a writable array of two descriptors.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: two new descriptors of ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(sv[0]), OwnedFd::from_raw_fd(sv[1])) })
}

/// Send and receive timeouts on the daemon's end of a socket to a child ([`ANSWER_TIMEOUT`]).
fn set_timeouts(fd: BorrowedFd<'_>) {
    let tv = libc::timeval {
        tv_sec: ANSWER_TIMEOUT.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: a valid timeval of its size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
    }
}

fn errno() -> i32 {
    // SAFETY: the calling thread's errno.
    unsafe { *libc::__errno_location() }
}

/// Sends `words` and `fds` (at most [`BATCH`]) as one message; the errno on failure.
/// Async-signal-safe (used by the children).
fn send_words(sock: RawFd, words: &[u64], fds: &[RawFd], flags: libc::c_int) -> Result<(), i32> {
    let mut iov = libc::iovec {
        iov_base: words.as_ptr() as *mut libc::c_void,
        iov_len: std::mem::size_of_val(words),
    };
    let mut cbuf = CmsgBuf([0; CMSG_BYTES]);
    // SAFETY: `libc::msghdr` is plain integers and pointers, for which all-zero bytes are valid.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    let n = fds.len().min(BATCH);
    if n > 0 {
        let bytes = (n * std::mem::size_of::<RawFd>()) as u32;
        mh.msg_control = cbuf.0.as_mut_ptr().cast();
        // SAFETY: arithmetic only.
        mh.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        // SAFETY: `mh` points at `cbuf` (aligned, CMSG_BYTES ≥ CMSG_SPACE of BATCH descriptors),
        // so the first header and its `bytes` of data lie within it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&mh);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(c),
                bytes as usize,
            );
        }
    }
    loop {
        // SAFETY: `mh` describes valid buffers for the call.
        let r = unsafe { libc::sendmsg(sock, &mh, flags | libc::MSG_NOSIGNAL) };
        if r >= 0 {
            return Ok(());
        }
        match errno() {
            libc::EINTR => continue,
            e => return Err(e),
        }
    }
}

/// Receives one message into `words` and its descriptors into `fds` (those beyond its room are
/// closed): bytes and descriptors received; `Ok((0, 0))` at end of file. Async-signal-safe.
fn recv_words(
    sock: RawFd,
    words: &mut [u64],
    fds: &mut [RawFd; BATCH],
) -> Result<(usize, usize), i32> {
    let mut iov = libc::iovec {
        iov_base: words.as_mut_ptr().cast(),
        iov_len: std::mem::size_of_val(words),
    };
    let mut cbuf = CmsgBuf([0; CMSG_BYTES]);
    // SAFETY: as in `send_words`.
    let mut mh: libc::msghdr = unsafe { std::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.0.as_mut_ptr().cast();
    mh.msg_controllen = CMSG_BYTES;
    let r = loop {
        // SAFETY: `mh` describes valid writable buffers.
        let r = unsafe { libc::recvmsg(sock, &mut mh, libc::MSG_CMSG_CLOEXEC) };
        if r >= 0 {
            break r as usize;
        }
        match errno() {
            libc::EINTR => continue,
            e => return Err(e),
        }
    };
    let mut nfd = 0;
    // SAFETY: the kernel filled `cbuf` up to `msg_controllen`; the CMSG_* walk stays within it.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    match fds.get_mut(nfd) {
                        Some(slot) => {
                            *slot = fd;
                            nfd += 1;
                        }
                        None => {
                            libc::close(fd);
                        }
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    Ok((r, nfd))
}

fn close_all(fds: &[RawFd]) {
    for &f in fds {
        // SAFETY: descriptors received and not otherwise owned.
        unsafe { libc::close(f) };
    }
}

/// Closes every descriptor from `from` on.
///
/// # Safety
/// Only in a child that owns nothing there.
unsafe fn close_from(from: u32) {
    // SAFETY: the caller's contract (the child of a fork): async-signal-safe calls on
    // this stack's buffers and descriptors of its own only.
    unsafe {
        if libc::syscall(libc::SYS_close_range, from, u32::MAX, 0) != 0 {
            let mut rl: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
            for fd in from as u64..(rl.rlim_cur as u64).min(1 << 20) {
                libc::close(fd as RawFd);
            }
        }
    }
}

/// What every child does first: default signal dispositions, none blocked, no descriptor but
/// `sock` (at [`CHILD_SOCK`]) and `/dev/null` on 0 to 2, its name.
///
/// # Safety
/// Only in the child of a fork; async-signal-safe calls only.
unsafe fn child_setup(sock: RawFd, name: &[u8]) {
    // SAFETY: the caller's contract (the child of a fork): async-signal-safe calls on
    // this stack's buffers and descriptors of its own only.
    unsafe {
        for s in 1..libc::SIGRTMAX() {
            if s != libc::SIGKILL && s != libc::SIGSTOP {
                libc::signal(s, libc::SIG_DFL);
            }
        }
        // A Ctrl-C to the daemon's process group stops the daemon, which then stops them.
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
        if sock != CHILD_SOCK && libc::dup2(sock, CHILD_SOCK) < 0 {
            libc::_exit(1);
        }
        close_from(CHILD_SOCK as u32 + 1);
        for fd in 0..CHILD_SOCK {
            libc::close(fd);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null == 0 {
            libc::dup2(0, 1);
            libc::dup2(0, 2);
        }
        libc::prctl(libc::PR_SET_NAME, name.as_ptr(), 0, 0, 0);
    }
}

/// The zygote: forks a holder for each `SPAWN` and answers its pid, socket and pidfd; exits
/// when the daemon's end of its socket closes.
///
/// # Safety
/// Only in the child of a fork; async-signal-safe calls only.
unsafe fn zygote_start(sock: RawFd) -> ! {
    // SAFETY: the caller's contract (the child of a fork): async-signal-safe calls on
    // this stack's buffers and descriptors of its own only.
    unsafe {
        child_setup(sock, b"smc-ism-zygote\0");
        let me = libc::getpid();
        let mut req = [0u64; 4];
        let mut fds = [-1 as RawFd; BATCH];
        loop {
            // Holders that exited (the daemon holds pidfds of them: their pids are not reused
            // under it).
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            let (bytes, nfd) = match recv_words(CHILD_SOCK, &mut req, &mut fds) {
                Ok((0, _)) | Err(_) => libc::_exit(0),
                Ok(v) => v,
            };
            close_all(fds.get(..nfd).unwrap_or_default());
            if bytes < 8 || req[0] != OP_SPAWN {
                continue;
            }
            let mut sv = [-1 as RawFd; 2];
            if libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                sv.as_mut_ptr(),
            ) != 0
            {
                let _ = send_words(CHILD_SOCK, &[OP_SPAWN, 0, errno() as u64], &[], 0);
                continue;
            }
            let pid = libc::fork();
            if pid == 0 {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if libc::getppid() != me {
                    libc::_exit(0);
                }
                child_setup(sv[1], b"smc-ism-holder\0");
                holder_main();
            }
            libc::close(sv[1]);
            if pid < 0 {
                let _ = send_words(CHILD_SOCK, &[OP_SPAWN, 0, errno() as u64], &[], 0);
                libc::close(sv[0]);
                continue;
            }
            let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as RawFd;
            if pidfd < 0 {
                let e = errno();
                libc::kill(pid, libc::SIGKILL);
                let _ = send_words(CHILD_SOCK, &[OP_SPAWN, 0, e as u64], &[], 0);
            } else {
                let _ = send_words(CHILD_SOCK, &[OP_SPAWN, pid as u64, 0], &[sv[0], pidfd], 0);
                libc::close(pidfd);
            }
            libc::close(sv[0]);
        }
    }
}

/// A holder: maps what it is passed (`MAP`: sizes, with the descriptors; answers an address
/// or `-errno` for each), unmaps what it is told (`UNMAP`: address and size pairs, no
/// answer); exits when the daemon's end of its socket closes.
///
/// # Safety
/// Only in the child of a fork; async-signal-safe calls only.
unsafe fn holder_main() -> ! {
    // SAFETY: the caller's contract (the child of a fork): async-signal-safe calls on
    // this stack's buffers and descriptors of its own only.
    unsafe {
        let mut req = [0u64; 2 + 2 * BATCH];
        let mut fds = [-1 as RawFd; BATCH];
        let mut rep = [0u64; 2 + BATCH];
        loop {
            let (bytes, nfd) = match recv_words(CHILD_SOCK, &mut req, &mut fds) {
                Ok((0, _)) | Err(_) => libc::_exit(0),
                Ok(v) => v,
            };
            let words = bytes / 8;
            let n = if words >= 2 { req[1] as usize } else { 0 };
            match req[0] {
                OP_MAP if n <= BATCH && words == 2 + n && nfd == n => {
                    rep[0] = OP_MAP;
                    rep[1] = n as u64;
                    for i in 0..n {
                        let (len, fd) = (req[2 + i] as usize, fds[i]);
                        let p = libc::mmap(
                            std::ptr::null_mut(),
                            len,
                            libc::PROT_NONE,
                            libc::MAP_SHARED,
                            fd,
                            0,
                        );
                        rep[2 + i] = if p == libc::MAP_FAILED {
                            (-(errno() as i64)) as u64
                        } else {
                            p as u64
                        };
                        libc::close(fd);
                    }
                    if send_words(CHILD_SOCK, &rep[..2 + n], &[], 0).is_err() {
                        libc::_exit(0);
                    }
                }
                OP_MAP => {
                    close_all(fds.get(..nfd).unwrap_or_default());
                    // Answered as malformed: the daemon gives this holder up.
                    if send_words(CHILD_SOCK, &[OP_MAP, u64::MAX], &[], 0).is_err() {
                        libc::_exit(0);
                    }
                }
                OP_UNMAP if n <= BATCH && words == 2 + 2 * n => {
                    close_all(fds.get(..nfd).unwrap_or_default());
                    for i in 0..n {
                        libc::munmap(req[2 + 2 * i] as *mut libc::c_void, req[3 + 2 * i] as usize);
                    }
                }
                _ => close_all(fds.get(..nfd).unwrap_or_default()),
            }
        }
    }
}
