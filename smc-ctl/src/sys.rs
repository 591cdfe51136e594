//! Host checks and small system helpers: privileges, cgroup v2 directories, bpffs, locking.
use std::{
    collections::{BTreeMap, BTreeSet},
    ffi::CString,
    fs,
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};

const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;
/// Runtime directory (lock file, daemon socket).
pub const RUN_DIR: &str = "/run/smc";

fn statfs_type(path: &Path) -> Result<i64> {
    let c = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: `libc::statfs` is plain integers, for which all-zero bytes are a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path alive for the call, `st` a writable statfs.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", path.display()));
    }
    Ok(st.f_type)
}

/// Where cgroup v2 is mounted (from `/proc/self/mountinfo`), or a clear error.
pub fn cgroup2_root() -> Result<PathBuf> {
    Ok(smc_cgroup::cgroup2_root()?)
}

/// Attaching needs root (CAP_SYS_ADMIN / CAP_BPF + CAP_NET_ADMIN): say so clearly.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("smc-ctl needs root (CAP_BPF, CAP_NET_ADMIN and write access to the cgroup); run it with sudo");
    }
    Ok(())
}

/// Canonical path of `dir`, which must be a directory on a cgroup v2 mount.
pub fn check_cgroup2_dir(dir: &Path) -> Result<PathBuf> {
    let cg = match fs::canonicalize(dir) {
        Ok(p) => p,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Say where cgroups are, or that there are none.
            let root = cgroup2_root()?;
            bail!(
                "cgroup {} does not exist (cgroup v2 is mounted at {}; create it with mkdir, or \
                 let the runtime create it by starting the container or unit)",
                dir.display(),
                root.display()
            );
        }
        Err(e) => return Err(e).with_context(|| format!("cgroup {}", dir.display())),
    };
    if !cg.is_dir() {
        bail!("{} is not a directory", cg.display());
    }
    if statfs_type(&cg)? != CGROUP2_SUPER_MAGIC {
        let root = cgroup2_root()?;
        bail!(
            "{} is not a cgroup v2 directory (cgroup v2 is mounted at {} here)",
            cg.display(),
            root.display()
        );
    }
    Ok(cg)
}

/// Mounts bpffs at `path` unless it is mounted there already.
pub fn ensure_bpffs(path: &str) -> Result<()> {
    let p = Path::new(path);
    if p.exists() && statfs_type(p)? == BPF_FS_MAGIC {
        return Ok(());
    }
    fs::create_dir_all(p).with_context(|| format!("mkdir {path}"))?;
    let src = CString::new("bpf")?;
    let dst = CString::new(path)?;
    // SAFETY: `src` and `dst` are NUL-terminated strings alive for the call; bpffs takes no data.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            dst.as_ptr(),
            src.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("mount bpffs at {path} (is BPF available?)"));
    }
    Ok(())
}

/// An exclusive lock serialising concurrent attach/detach commands.
pub struct Lock(#[allow(dead_code)] fs::File);

pub fn lock() -> Result<Lock> {
    fs::create_dir_all(RUN_DIR).with_context(|| format!("mkdir {RUN_DIR}"))?;
    let f = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(Path::new(RUN_DIR).join("attach.lock"))?;
    use std::os::fd::AsRawFd as _;
    // SAFETY: `f` is an open file we own for the call; flock only takes a lock on it.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("flock");
    }
    Ok(Lock(f))
}

/// Finds the cgroup directories with the given inode numbers (bounded walk of the v2 tree).
pub fn cgroup_paths_by_inode(mut wanted: BTreeSet<u64>) -> BTreeMap<u64, PathBuf> {
    let mut out = BTreeMap::new();
    let Ok(root) = cgroup2_root() else {
        return out;
    };
    let mut stack = vec![root];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        if wanted.is_empty() || visited > 100_000 {
            break;
        }
        visited += 1;
        if let Ok(md) = fs::metadata(&dir) {
            if wanted.remove(&md.ino()) {
                out.insert(md.ino(), dir.clone());
            }
        }
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

/// The three `bpf(2)` commands aya does not offer for every program type here: open a pinned
/// object, create a cgroup link, pin an object. (aya 0.14 pins the link of a `SockOps`
/// program — `from_pin`, `attach`, `take_link`, `FdLink::pin` — but a `CgroupSockopt` link
/// converts to no `FdLink` and `FdLink::new` is crate-private, so the sockopt programs would
/// need these calls anyway: one path for all three.)
pub mod bpf_syscall {
    use std::{
        ffi::CString,
        io,
        os::{
            fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
            unix::ffi::OsStrExt as _,
        },
        path::Path,
    };

    const BPF_OBJ_PIN: libc::c_long = 6;
    const BPF_OBJ_GET: libc::c_long = 7;
    const BPF_LINK_CREATE: libc::c_long = 28;
    pub const BPF_CGROUP_SOCK_OPS: u32 = 3;
    pub const BPF_CGROUP_GETSOCKOPT: u32 = 21;
    pub const BPF_CGROUP_SETSOCKOPT: u32 = 22;

    #[repr(C, align(8))]
    pub(crate) struct Attr(pub(crate) [u8; 128]);

    pub(crate) fn bpf(cmd: libc::c_long, attr: &mut Attr) -> io::Result<i64> {
        // SAFETY: attr is a zero-initialised bpf_attr of sufficient size.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.0.as_mut_ptr(), attr.0.len()) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    pub(crate) fn put_u32(a: &mut Attr, off: usize, v: u32) {
        a.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    }

    pub(crate) fn put_u64(a: &mut Attr, off: usize, v: u64) {
        a.0[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    }

    pub fn obj_get(path: &Path) -> io::Result<OwnedFd> {
        let c = CString::new(path.as_os_str().as_bytes())?;
        let mut a = Attr([0; 128]);
        put_u64(&mut a, 0, c.as_ptr() as u64);
        let fd = bpf(BPF_OBJ_GET, &mut a)?;
        // SAFETY: the kernel returned a new fd.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }

    pub fn obj_pin(fd: &OwnedFd, path: &Path) -> io::Result<()> {
        let c = CString::new(path.as_os_str().as_bytes())?;
        let mut a = Attr([0; 128]);
        put_u64(&mut a, 0, c.as_ptr() as u64);
        put_u32(&mut a, 8, fd.as_raw_fd() as u32);
        bpf(BPF_OBJ_PIN, &mut a).map(|_| ())
    }

    /// A bpf_link attaching `prog` to the cgroup `target` (multi-attach by nature).
    pub fn link_create(
        prog: &OwnedFd,
        target: &impl std::os::fd::AsRawFd,
        attach_type: u32,
    ) -> io::Result<OwnedFd> {
        let mut a = Attr([0; 128]);
        put_u32(&mut a, 0, prog.as_raw_fd() as u32);
        put_u32(&mut a, 4, target.as_raw_fd() as u32);
        put_u32(&mut a, 8, attach_type);
        let fd = bpf(BPF_LINK_CREATE, &mut a)?;
        // SAFETY: the kernel returned a new fd.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
    }
}

/// Which cgroup a command acts on: a directory, a process's, or a container's.
#[derive(clap::Args, Clone, Debug)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// A cgroup v2 directory.
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,
    /// The cgroup of this process (from /proc/PID/cgroup); `self` is smc-ctl's own (e.g. in
    /// a unit's ExecStartPre, which runs in the unit's cgroup).
    #[arg(long, value_name = "PID|self")]
    pub pid: Option<String>,
    /// The cgroup of this container (docker, containerd/CRI, CRI-O, podman layouts; a unique
    /// prefix of at least 12 hex digits is enough).
    #[arg(long, value_name = "ID")]
    pub container_id: Option<String>,
}

impl Target {
    /// The cgroup directory this target names (not yet checked to be a cgroup v2 directory).
    pub fn resolve(&self) -> Result<PathBuf> {
        use smc_cgroup as cgroup;
        if let Some(d) = &self.cgroup {
            return Ok(d.clone());
        }
        if let Some(p) = &self.pid {
            let pid = if p == "self" {
                std::process::id()
            } else {
                p.parse::<u32>()
                    .ok()
                    .filter(|&n| n > 0)
                    .with_context(|| format!("--pid {p}: not a process id (a number, or self)"))?
            };
            let dir = cgroup::cgroup_of_pid(pid)?;
            if dir == cgroup2_root()? {
                bail!(
                    "process {pid} is in the root cgroup ({}): attaching that would enable every \
                     process of the host; give --cgroup {} explicitly if that is meant",
                    dir.display(),
                    dir.display()
                );
            }
            return Ok(dir);
        }
        if let Some(id) = &self.container_id {
            return Ok(cgroup::find_container(&cgroup2_root()?, id)?);
        }
        bail!("give --cgroup, --pid or --container-id")
    }
}

/// A signalfd for `sigs`, which are blocked in this thread while it lives (so that they are
/// read from the fd instead of killing the process).
pub struct SignalFd {
    fd: std::os::fd::OwnedFd,
    old: libc::sigset_t,
}

impl SignalFd {
    pub fn new(sigs: &[libc::c_int]) -> Result<SignalFd> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: sigemptyset/sigaddset only write the local set.
        let set = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for s in sigs {
                libc::sigaddset(&mut set, *s);
            }
            set
        };
        // SAFETY: zeroed is a valid (empty) sigset_t, overwritten by pthread_sigmask.
        let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
        // SAFETY: valid sets; blocks the signals in this thread only.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        // SAFETY: a valid set; -1 asks for a new fd.
        let fd = unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: restores the mask saved above.
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
            return Err(e).context("signalfd");
        }
        // SAFETY: `fd` is a new descriptor that nothing else owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(SignalFd { fd, old })
    }
}

impl SignalFd {
    /// Takes a pending signal off the fd (otherwise it would be delivered, with its default
    /// action, when the mask is restored): its number.
    pub fn take(&self) -> Result<u32> {
        use std::os::fd::AsRawFd as _;
        // SAFETY: all-zero is a valid `signalfd_siginfo` (plain integers).
        let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::signalfd_siginfo>();
        // SAFETY: `info` is a writable buffer of `size` bytes for the duration of the call.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                std::ptr::from_mut(&mut info).cast(),
                size,
            )
        };
        if usize::try_from(n).ok() != Some(size) {
            return Err(std::io::Error::last_os_error()).context("read signalfd");
        }
        Ok(info.ssi_signo)
    }
}

impl std::os::fd::AsFd for SignalFd {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for SignalFd {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved at creation.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

/// Waits until `a` or `b` is readable, or `timeout`: which of them are.
pub fn poll2(
    a: &impl std::os::fd::AsRawFd,
    b: &impl std::os::fd::AsFd,
    timeout: std::time::Duration,
) -> Result<(bool, bool)> {
    use std::os::fd::AsRawFd as _;
    let mut fds = [
        libc::pollfd {
            fd: a.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: b.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `fds` is a valid array of two pollfd for the duration of the call.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == std::io::ErrorKind::Interrupted {
            return Ok((false, false));
        }
        return Err(e).context("poll");
    }
    Ok((fds[0].revents != 0, fds[1].revents != 0))
}
