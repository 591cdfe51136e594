//! The statistics directory tree, safe against other local users.
//!
//! The threat is a local process of another uid (docs/SECURITY.md): it must not be able to block an
//! exiting writer or a reader, make a reader hang or exhaust its memory, redirect it, or
//! truncate a writer's shared page. The rules:
//!
//! - A process writes only into a directory its own euid owns and that nobody else can write
//!   (not group/other-writable): the top directory when it is the top's owner (root, normally),
//!   otherwise its `uid-<euid>` subdirectory ([`uid_dir_name`]). A non-root writer cannot create
//!   that subdirectory under a root-owned top, so the daemon (root) creates it when a client of
//!   that uid connects ([`ensure_uid_dir`]); the writer asks the daemon once when it is missing.
//! - Files are created with `O_EXCL | O_NOFOLLOW` (mode 0644) and never truncated by anyone but
//!   their writer, so the `MAP_SHARED` page cannot be shrunk under it (no `SIGBUS`).
//! - The lock ([`LOCK_NAME`], mode 0600) of a directory can be opened only by its owner and
//!   root. A uid can hold only its own directory's lock, and every taker waits a bounded time
//!   ([`StatsDir::lock`]); a reader that does not get it reads that directory without folding
//!   (a uid can only falsify its own figures, which it can do anyway).
//! - Readers open entries with `O_NOFOLLOW | O_NONBLOCK`, require a regular file owned by the
//!   directory's owner or root, at most [`MAX_FILE_LEN`] bytes, and read at most that
//!   ([`StatsDir::read`]); subdirectories must be owned by their uid (or root) and not writable
//!   by others. Anything else is skipped with a warning.

use std::ffi::CString;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::layout::{aggregate_name, fold, new_aggregate, Identity, Snapshot, LOCK_NAME};
use crate::layout::{CONN_RECORD_LEN, PAGE_LEN};
use crate::process::is_live;

/// Prefix of a per-uid subdirectory (`uid-1000`).
pub const UID_DIR_PREFIX: &str = "uid-";
/// Largest file a reader accepts (a page and 8192 connection records).
pub const MAX_FILE_LEN: usize = PAGE_LEN + 8192 * CONN_RECORD_LEN;
/// How long a reader waits for a directory's lock before it reads that directory unlocked.
pub const READER_LOCK_WAIT: Duration = Duration::from_millis(500);
/// How long an exiting writer waits for its directory's lock before it leaves its file for
/// the readers to fold.
pub const WRITER_LOCK_WAIT: Duration = Duration::from_millis(200);

/// Name of uid `uid`'s subdirectory.
pub fn uid_dir_name(uid: u32) -> String {
    format!("{UID_DIR_PREFIX}{uid}")
}

/// Why an entry was not used.
#[derive(Debug)]
pub enum Refused {
    Io(io::Error),
    /// A FIFO, device, socket, directory or symbolic link where a file was expected.
    NotRegular(&'static str),
    /// Owned by this uid, neither the directory's owner nor root.
    Owner(u32),
    /// A directory writable by users other than its owner.
    Mode(u32),
    /// Larger than [`MAX_FILE_LEN`].
    TooLarge(u64),
    /// Not in the statistics layout.
    NotStats,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Io(e) => write!(f, "{e}"),
            Refused::NotRegular(k) => write!(f, "not a regular file ({k})"),
            Refused::Owner(u) => write!(f, "owned by uid {u}, not by the directory's owner"),
            Refused::Mode(m) => write!(f, "writable by other users (mode {m:o})"),
            Refused::TooLarge(n) => {
                write!(f, "{n} bytes, more than a statistics file ({MAX_FILE_LEN})")
            }
            Refused::NotStats => write!(f, "not a statistics file"),
        }
    }
}

impl std::error::Error for Refused {}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Refused {
        Refused::Io(e)
    }
}

impl Refused {
    /// The entry does not exist (any more).
    pub fn not_found(&self) -> bool {
        matches!(self, Refused::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// Why a directory's lock was not taken.
#[derive(Debug)]
pub enum LockError {
    /// Held by another process for longer than the wait.
    Busy,
    /// The lock file is not one only the owner can open.
    Unsafe(Refused),
    Io(io::Error),
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Busy => write!(f, "held by another process"),
            LockError::Unsafe(r) => write!(f, "lock file refused: {r}"),
            LockError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for LockError {}

impl LockError {
    /// The caller may not use the lock at all (not its directory): not worth a warning.
    pub fn is_permission(&self) -> bool {
        matches!(self, LockError::Io(e) if matches!(e.raw_os_error(),
            Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS)))
    }
}

fn kind_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFDIR => "a directory",
        _ => "unknown type",
    }
}

fn name_c(name: &str) -> io::Result<CString> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a file name",
        ));
    }
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: all-zero is a valid `stat`; fstat fills it for a valid fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid out pointer.
    cvt(unsafe { libc::fstat(fd, &mut st) })?;
    Ok(st)
}

fn openat(dir: RawFd, name: &str, flags: libc::c_int, mode: libc::mode_t) -> io::Result<OwnedFd> {
    let c = name_c(name)?;
    // SAFETY: NUL-terminated single path component relative to a directory fd.
    let fd = cvt(unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: openat returned a new fd that nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn geteuid() -> u32 {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() }
}

/// One directory of the tree, opened once; every entry is reached relative to its fd.
#[derive(Debug)]
pub struct StatsDir {
    fd: OwnedFd,
    path: PathBuf,
    owner: u32,
    mode: u32,
}

impl StatsDir {
    /// Opens the top directory `path` (symbolic links in it are the administrator's choice).
    pub fn open(path: &Path) -> io::Result<StatsDir> {
        let f = std::fs::File::open(path)?;
        let st = fstat(f.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a directory",
            ));
        }
        Ok(StatsDir {
            fd: f.into(),
            path: path.to_path_buf(),
            owner: st.st_uid,
            mode: st.st_mode & 0o7777,
        })
    }

    /// Opens the top directory, creating it (mode 0755) when missing.
    pub fn open_or_create(path: &Path) -> io::Result<StatsDir> {
        use std::os::unix::fs::DirBuilderExt as _;
        match StatsDir::open(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)?;
                StatsDir::open(path)
            }
            r => r,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The uid owning the directory.
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Whether users other than the owner may create entries.
    pub fn foreign_writable(&self) -> bool {
        self.mode & 0o022 != 0
    }

    /// Subdirectory `name`, which must be owned by `uid` (or root, while the daemon creates it)
    /// and not writable by others.
    fn sub(&self, name: &str, uid: u32) -> Result<StatsDir, Refused> {
        let fd = openat(
            self.fd.as_raw_fd(),
            name,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_NONBLOCK,
            0,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Refused::NotRegular(kind_name(libc::S_IFLNK)),
            Some(libc::ENOTDIR) => Refused::NotRegular("not a directory"),
            _ => Refused::Io(e),
        })?;
        let st = fstat(fd.as_raw_fd())?;
        if st.st_uid != uid && st.st_uid != 0 {
            return Err(Refused::Owner(st.st_uid));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(Refused::Mode(st.st_mode & 0o7777));
        }
        Ok(StatsDir {
            fd,
            path: self.path.join(name),
            owner: st.st_uid,
            mode: st.st_mode & 0o7777,
        })
    }

    /// The accepted `uid-<n>` subdirectories; each refused one adds a warning.
    pub fn uid_dirs(&self, warnings: &mut Vec<String>) -> Vec<StatsDir> {
        let mut out = Vec::new();
        for name in self.names() {
            let Some(uid) = name
                .strip_prefix(UID_DIR_PREFIX)
                .and_then(|u| u.parse::<u32>().ok())
            else {
                continue;
            };
            match self.sub(&name, uid) {
                Ok(d) => out.push(d),
                Err(e) => {
                    warnings.push(format!("ignored {}: {e}", self.path.join(&name).display()))
                }
            }
        }
        out
    }

    /// The top directory `path` and its accepted `uid-<n>` subdirectories.
    pub fn tree(path: &Path, warnings: &mut Vec<String>) -> io::Result<Vec<StatsDir>> {
        let top = StatsDir::open(path)?;
        let mut v = top.uid_dirs(warnings);
        v.insert(0, top);
        Ok(v)
    }

    /// The names of the entries (not `.`/`..`), sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> =
            match std::fs::read_dir(format!("/proc/self/fd/{}", self.fd.as_raw_fd())) {
                Ok(rd) => rd
                    .flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect(),
                Err(_) => Vec::new(),
            };
        v.sort();
        v
    }

    /// The bytes of file `name`: opened without following a symbolic link and without
    /// blocking, a regular file owned by the directory's owner or root, at most
    /// [`MAX_FILE_LEN`] bytes (and no more read).
    pub fn read(&self, name: &str) -> Result<Vec<u8>, Refused> {
        let fd = openat(
            self.fd.as_raw_fd(),
            name,
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        )
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => Refused::NotRegular(kind_name(libc::S_IFLNK)),
            _ => Refused::Io(e),
        })?;
        let st = fstat(fd.as_raw_fd())?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Refused::NotRegular(kind_name(st.st_mode)));
        }
        if st.st_uid != self.owner && st.st_uid != 0 {
            return Err(Refused::Owner(st.st_uid));
        }
        if st.st_size < 0 || st.st_size as u64 > MAX_FILE_LEN as u64 {
            return Err(Refused::TooLarge(st.st_size as u64));
        }
        let mut b = Vec::with_capacity(st.st_size as usize);
        std::fs::File::from(fd)
            .take(MAX_FILE_LEN as u64 + 1)
            .read_to_end(&mut b)?;
        if b.len() > MAX_FILE_LEN {
            return Err(Refused::TooLarge(b.len() as u64));
        }
        Ok(b)
    }

    /// [`read`](Self::read) and parse.
    pub fn read_snapshot(&self, name: &str) -> Result<(Vec<u8>, Snapshot), Refused> {
        let b = self.read(name)?;
        match Snapshot::parse(&b) {
            Some(s) => Ok((b, s)),
            None => Err(Refused::NotStats),
        }
    }

    /// Removes entry `name`.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        let c = name_c(name)?;
        // SAFETY: NUL-terminated name relative to our directory fd.
        cvt(unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) }).map(|_| ())
    }

    /// Takes the directory's exclusive lock, waiting at most `wait`. Only the directory's owner
    /// and root can open the lock file (mode 0600); a lock file anyone else could open (an
    /// older version's 0644 one) is replaced by the owner or root, and refused otherwise.
    pub fn lock(&self, wait: Duration) -> Result<DirLock, LockError> {
        let me = geteuid();
        let may_create = me == self.owner || me == 0;
        let mut fd = None;
        for attempt in 0..2 {
            let flags = libc::O_RDWR
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | if may_create { libc::O_CREAT } else { 0 };
            let f = openat(self.fd.as_raw_fd(), LOCK_NAME, flags, 0o600).map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    LockError::Unsafe(Refused::NotRegular(kind_name(libc::S_IFLNK)))
                } else {
                    LockError::Io(e)
                }
            })?;
            let st = fstat(f.as_raw_fd()).map_err(LockError::Io)?;
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(LockError::Unsafe(Refused::NotRegular(kind_name(
                    st.st_mode,
                ))));
            }
            if st.st_uid != self.owner {
                if !(me == 0 && st.st_uid == 0) {
                    return Err(LockError::Unsafe(Refused::Owner(st.st_uid)));
                }
                // Created by root in another uid's directory: the owner must be able to use it.
                // SAFETY: fchown on our fd; -1 keeps the group.
                cvt(unsafe { libc::fchown(f.as_raw_fd(), self.owner, u32::MAX) })
                    .map_err(LockError::Io)?;
            }
            if st.st_mode & 0o077 != 0 {
                if attempt == 0 && may_create {
                    // Someone may hold the old file open: a new inode, then.
                    self.remove(LOCK_NAME).map_err(LockError::Io)?;
                    continue;
                }
                return Err(LockError::Unsafe(Refused::Mode(st.st_mode & 0o7777)));
            }
            fd = Some(f);
            break;
        }
        let fd = fd.ok_or(LockError::Busy)?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            // SAFETY: flock on our fd.
            if unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return Ok(DirLock(fd));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {
                    let spent = start.elapsed();
                    if spent >= wait {
                        return Err(LockError::Busy);
                    }
                    std::thread::sleep(pause.min(wait - spent));
                    pause = (pause * 2).min(Duration::from_millis(20));
                }
                Some(libc::EINTR) => {}
                _ => return Err(LockError::Io(e)),
            }
        }
    }

    /// Writes `bytes` as file `name`, atomically (a temporary file, then a rename). Root writing
    /// into another uid's directory gives the file to that uid.
    fn replace(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let tmp = format!(".{name}.{}.tmp", std::process::id());
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = match openat(self.fd.as_raw_fd(), &tmp, flags, 0o644) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                // Left by a process of the same pid that died.
                self.remove(&tmp)?;
                openat(self.fd.as_raw_fd(), &tmp, flags, 0o644)?
            }
            r => r?,
        };
        let done = (|| {
            if geteuid() != self.owner {
                // SAFETY: fchown on our fd; -1 keeps the group.
                cvt(unsafe { libc::fchown(fd.as_raw_fd(), self.owner, u32::MAX) })?;
            }
            std::fs::File::from(fd).write_all(bytes)?;
            let (a, b) = (name_c(&tmp)?, name_c(name)?);
            let d = self.fd.as_raw_fd();
            // SAFETY: NUL-terminated names relative to our directory fd.
            cvt(unsafe { libc::renameat(d, a.as_ptr(), d, b.as_ptr()) }).map(|_| ())
        })();
        if done.is_err() {
            let _ = self.remove(&tmp);
        }
        done
    }

    /// Adds `src` (a stats file's bytes) into the aggregate of `cgroup_id`, replacing the
    /// aggregate atomically. The caller holds [`lock`](Self::lock).
    pub fn fold_into_aggregate(&self, cgroup_id: u64, src: &[u8]) -> io::Result<()> {
        let name = aggregate_name(cgroup_id);
        let mut agg = match self.read(&name) {
            Ok(b) => b,
            Err(r) if r.not_found() => new_aggregate(cgroup_id),
            Err(r) => return Err(io::Error::other(format!("{name}: {r}"))),
        };
        if !fold(&mut agg, src) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a stats file",
            ));
        }
        self.replace(&name, &agg)
    }

    /// The directory a process of effective uid `euid` writes to under the top directory
    /// `base`: the top itself when `euid` owns it, else `uid-<euid>`, made by the writer when it
    /// may, else by the daemon, which `ensure` asks (once). Created when missing.
    pub fn for_writer(
        base: &Path,
        euid: u32,
        ensure: impl FnOnce() -> bool,
    ) -> Result<StatsDir, Refused> {
        let mut ensure = Some(ensure);
        let top = match StatsDir::open_or_create(base) {
            Ok(t) => t,
            // Missing, and not ours to create: the daemon makes it with the uid's directory.
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                if let Some(f) = ensure.take() {
                    f();
                }
                StatsDir::open(base)?
            }
            Err(e) => return Err(Refused::Io(e)),
        };
        if top.owner == euid {
            if top.foreign_writable() {
                return Err(Refused::Mode(top.mode));
            }
            return Ok(top);
        }
        let name = uid_dir_name(euid);
        for _ in 0..3 {
            match top.sub(&name, euid) {
                Ok(d) if d.owner == euid => return Ok(d),
                Ok(_) => {} // being created by the daemon
                Err(r) if r.not_found() => {
                    let c = name_c(&name)?;
                    // SAFETY: NUL-terminated name relative to the top's fd.
                    if unsafe { libc::mkdirat(top.fd.as_raw_fd(), c.as_ptr(), 0o755) } == 0 {
                        continue;
                    }
                }
                Err(r) => return Err(r),
            }
            match ensure.take() {
                Some(f) => {
                    f();
                }
                None => break,
            }
        }
        top.sub(&name, euid).and_then(|d| {
            if d.owner == euid {
                Ok(d)
            } else {
                Err(Refused::Owner(d.owner))
            }
        })
    }

    /// Creates the file of process `id` (`O_EXCL`, no symbolic link followed, mode 0644) of
    /// `len` bytes. An existing file of the same pid is this very process before an `exec`
    /// (same start time and PID namespace): it is reopened and kept (`true`). Otherwise it is a
    /// process that is gone, whose figures are folded into its cgroup's aggregate before the
    /// file is replaced; a file of a running process (another PID namespace) is left alone
    /// and this fails.
    pub fn create_process_file(&self, id: &Identity, len: usize) -> io::Result<(OwnedFd, bool)> {
        let name = id.pid.to_string();
        let d = self.fd.as_raw_fd();
        for _ in 0..3 {
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
            match openat(d, &name, flags, 0o644) {
                Ok(fd) => {
                    // SAFETY: ftruncate on our new fd.
                    if let Err(e) = cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as i64) }) {
                        let _ = self.remove(&name);
                        return Err(e);
                    }
                    return Ok((fd, false));
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            match self.read_snapshot(&name) {
                Ok((bytes, s)) => {
                    let own = s.pid == id.pid
                        && id.start_time != 0
                        && s.start_time == id.start_time
                        && s.pid_ns == id.pid_ns;
                    if own && bytes.len() == len {
                        let flags = libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK;
                        let fd = openat(d, &name, flags, 0)?;
                        let st = fstat(fd.as_raw_fd())?;
                        if st.st_mode & libc::S_IFMT == libc::S_IFREG
                            && st.st_uid == geteuid()
                            && st.st_size as u64 == len as u64
                        {
                            return Ok((fd, true));
                        }
                    } else if !own && is_live(&s) {
                        return Err(io::Error::new(
                            io::ErrorKind::AlreadyExists,
                            "the file of a running process",
                        ));
                    } else {
                        let _lock = self
                            .lock(WRITER_LOCK_WAIT)
                            .map_err(|e| io::Error::other(format!("lock: {e}")))?;
                        self.fold_into_aggregate(s.cgroup_id, &bytes)?;
                        match self.remove(&name) {
                            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                            _ => continue,
                        }
                    }
                }
                Err(r) if r.not_found() => continue,
                Err(_) => {} // nothing worth keeping
            }
            match self.remove(&name) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "file keeps reappearing",
        ))
    }
}

/// A directory's exclusive lock; released on drop.
#[derive(Debug)]
pub struct DirLock(OwnedFd);

impl Drop for DirLock {
    fn drop(&mut self) {
        // SAFETY: flock on our fd.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

/// Makes sure uid `uid` has its subdirectory under the top directory `base` (created when
/// missing, mode 0755, owned by `uid`:`gid`): what the daemon (root) does for each client, so
/// that a process of any uid can write its figures. Nothing to do for the top's owner.
pub fn ensure_uid_dir(base: &Path, uid: u32, gid: u32) -> Result<(), Refused> {
    let top = StatsDir::open_or_create(base)?;
    if top.owner == uid {
        return Ok(());
    }
    let name = uid_dir_name(uid);
    let c = name_c(&name)?;
    // SAFETY: NUL-terminated name relative to the top's fd.
    if unsafe { libc::mkdirat(top.fd.as_raw_fd(), c.as_ptr(), 0o755) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(Refused::Io(e));
        }
    }
    let d = top.sub(&name, uid)?;
    if d.owner == uid {
        return Ok(());
    }
    // Ours (root), just made: give it to the uid.
    // SAFETY: fchown/fchmod on our fd.
    cvt(unsafe { libc::fchown(d.fd.as_raw_fd(), uid, gid) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fchmod(d.fd.as_raw_fd(), 0o755) })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{ProcStats, VALID_SIDE_REASONS};
    use std::os::unix::fs::PermissionsExt as _;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("smc-statsdir-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    fn page(id: &Identity) -> Vec<u8> {
        // SAFETY: all-zero is a valid ProcStats (atomics only).
        let a: Box<ProcStats> = unsafe { Box::new(std::mem::zeroed()) };
        a.init(id, VALID_SIDE_REASONS);
        a.smcd_client
            .fetch_add(3, std::sync::atomic::Ordering::Relaxed);
        a.to_bytes()
    }

    #[test]
    fn hostile_entries_are_refused_without_blocking() {
        let d = tmp("read");
        let fifo = CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        std::os::unix::fs::symlink("/dev/zero", d.join("zero")).unwrap();
        std::fs::File::create(d.join("huge"))
            .unwrap()
            .set_len(1 << 33)
            .unwrap();
        std::fs::write(d.join("ok"), page(&Identity::default())).unwrap();
        let sd = StatsDir::open(&d).unwrap();
        assert!(matches!(
            sd.read("fifo"),
            Err(Refused::NotRegular("a FIFO"))
        ));
        assert!(matches!(sd.read("zero"), Err(Refused::NotRegular(_))));
        assert!(matches!(sd.read("huge"), Err(Refused::TooLarge(_))));
        assert!(sd.read("missing").unwrap_err().not_found());
        assert!(matches!(sd.read("../x"), Err(Refused::Io(_))));
        assert_eq!(sd.read_snapshot("ok").unwrap().1.get("smcd_client"), 3);
        // A lock file that is a FIFO is refused, not waited on.
        std::fs::rename(d.join("fifo"), d.join(LOCK_NAME)).unwrap();
        assert!(matches!(
            sd.lock(Duration::from_secs(5)),
            Err(LockError::Unsafe(Refused::NotRegular(_)))
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn lock_is_owner_only_bounded_and_replaces_a_loose_one() {
        let d = tmp("lock");
        // An older version's lock file, readable by everyone (anyone could flock it).
        std::fs::write(d.join(LOCK_NAME), b"").unwrap();
        std::fs::set_permissions(d.join(LOCK_NAME), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        let old = std::fs::File::open(d.join(LOCK_NAME)).unwrap();
        // SAFETY: flock on our fd.
        assert_eq!(unsafe { libc::flock(old.as_raw_fd(), libc::LOCK_EX) }, 0);
        let sd = StatsDir::open(&d).unwrap();
        let l = sd.lock(Duration::from_secs(5)).expect("a new lock file");
        let md = std::fs::metadata(d.join(LOCK_NAME)).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o600);
        // Held: a second taker gives up after its wait instead of blocking.
        assert!(matches!(
            sd.lock(Duration::from_millis(30)),
            Err(LockError::Busy)
        ));
        drop(l);
        drop(sd.lock(Duration::from_millis(30)).expect("free again"));
        drop(old);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn process_files_exec_and_pid_reuse() {
        let d = tmp("create");
        let sd = StatsDir::for_writer(&d, geteuid(), || panic!("no daemon needed")).unwrap();
        let me = Identity::current();
        // A process that is gone left a file with our pid (another start time).
        let gone = Identity {
            start_time: me.start_time + 1,
            cgroup_id: 77,
            ..me
        };
        std::fs::write(d.join(me.pid.to_string()), page(&gone)).unwrap();
        let (fd, reused) = sd.create_process_file(&me, PAGE_LEN).unwrap();
        assert!(!reused);
        let st = fstat(fd.as_raw_fd()).unwrap();
        assert_eq!((st.st_size as usize, st.st_mode & 0o777), (PAGE_LEN, 0o644));
        // Its figures went to its cgroup's aggregate.
        let (_, agg) = sd.read_snapshot(&aggregate_name(77)).unwrap();
        assert_eq!(agg.get("smcd_client"), 3);
        // Our own file after an exec (same identity) is kept.
        std::fs::write(d.join(me.pid.to_string()), page(&me)).unwrap();
        let (_, reused) = sd.create_process_file(&me, PAGE_LEN).unwrap();
        assert!(reused);
        // A symbolic link in its place is never followed.
        let target = d.join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::remove_file(d.join(me.pid.to_string())).unwrap();
        std::os::unix::fs::symlink(&target, d.join(me.pid.to_string())).unwrap();
        let (_, reused) = sd.create_process_file(&me, PAGE_LEN).unwrap();
        assert!(!reused);
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert!(!std::fs::symlink_metadata(d.join(me.pid.to_string()))
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
