//! Where cgroup v2 lives on this host, which cgroup a process or a container is in.
//!
//! One place for what `smc-ctl`, the daemon, the statistics readers, the integration tests and
//! `xtask` need (host plumbing, so not in `smc-common`, which is the eBPF ABI and the wire
//! protocol):
//! - [`cgroup2_mount`] / [`cgroup2_root`]: the cgroup v2 mount, read from `/proc/self/mountinfo`
//!   (`/sys/fs/cgroup` on a unified host, `/sys/fs/cgroup/unified` in hybrid mode, anything else
//!   in a container), never assumed;
//! - [`cgroup_of_pid`]: the cgroup v2 directory of a process (`0::<path>` of `/proc/PID/cgroup`);
//! - [`find_container`]: the cgroup directory of a container by id (or a unique prefix of at
//!   least [`MIN_ID_PREFIX`] characters), in the layouts of the usual runtimes: systemd driver
//!   `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`
//!   (also under `kubepods*.slice`), cgroupfs driver `docker/<id>`, `kubepods/<qos>/pod<uid>/<id>`;
//! - [`pod_of_cgroup`]: the pod UID and QoS class of a kubelet pod cgroup (both drivers);
//! - [`join_before_exec`]: makes a `Command`'s child join a cgroup between fork and exec
//!   (without allocating after the fork).
use std::{
    fmt, fs, io,
    path::{Path, PathBuf},
};

/// Shortest container id prefix [`find_container`] accepts (what `docker ps` prints is 12).
pub const MIN_ID_PREFIX: usize = 12;
/// Directories [`find_container`] visits at most (a bound on a hostile or huge tree).
pub const MAX_WALK: usize = 200_000;

/// Why a cgroup could not be found.
#[derive(Debug)]
pub enum CgroupError {
    /// `/proc/self/mountinfo` has no cgroup2 entry.
    NoCgroup2,
    /// Reading a file failed.
    Io { path: PathBuf, source: io::Error },
    /// No such process.
    NoProcess(u32),
    /// The process is in no cgroup v2 (no `0::` line: a cgroup v1-only host).
    NotInCgroup2(u32),
    /// The process's cgroup is not below the cgroup v2 mount seen from here (another cgroup
    /// namespace); `path` is what `/proc/PID/cgroup` says.
    OutsideMount { pid: u32, path: String },
    /// A container id that is not hex, or shorter than [`MIN_ID_PREFIX`].
    BadContainerId(String),
    /// No cgroup of a known runtime layout for that container id.
    ContainerNotFound { id: String, root: PathBuf },
    /// The prefix matches several containers.
    AmbiguousContainer { id: String, matches: Vec<PathBuf> },
}

impl fmt::Display for CgroupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupError::NoCgroup2 => write!(
                f,
                "no cgroup v2 is mounted (no cgroup2 entry in /proc/self/mountinfo); \
                 mount it (mount -t cgroup2 none /sys/fs/cgroup) or boot with \
                 systemd.unified_cgroup_hierarchy=1"
            ),
            CgroupError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            CgroupError::NoProcess(pid) => write!(f, "no process with pid {pid}"),
            CgroupError::NotInCgroup2(pid) => write!(
                f,
                "process {pid} is in no cgroup v2 (no 0:: line in /proc/{pid}/cgroup)"
            ),
            CgroupError::OutsideMount { pid, path } => write!(
                f,
                "the cgroup of process {pid} ({path}) is not visible below the cgroup v2 \
                 mount of this namespace; run smc-ctl in the host's cgroup namespace"
            ),
            CgroupError::BadContainerId(id) => write!(
                f,
                "{id:?} is not a container id (hex, at least {MIN_ID_PREFIX} characters)"
            ),
            CgroupError::ContainerNotFound { id, root } => write!(
                f,
                "no cgroup for container {id} below {} (looked for docker-<id>.scope, \
                 cri-containerd-<id>.scope, crio-<id>.scope, libpod-<id>.scope and <id> \
                 directories of the cgroupfs driver); is the container running?",
                root.display()
            ),
            CgroupError::AmbiguousContainer { id, matches } => {
                write!(f, "container id {id} matches {} cgroups:", matches.len())?;
                for m in matches {
                    write!(f, " {}", m.display())?;
                }
                write!(f, "; give more of the id")
            }
        }
    }
}

impl std::error::Error for CgroupError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CgroupError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn read(path: &Path) -> Result<String, CgroupError> {
    fs::read_to_string(path).map_err(|source| CgroupError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A cgroup v2 mount: where it is mounted, and which directory of the hierarchy it shows
/// (`/` on the host; a container's own cgroup when mounted in a cgroup namespace or bind-mounted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup2Mount {
    pub mount_point: PathBuf,
    pub root: String,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\011`, `\012`, `\134`).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Every cgroup2 mount of a mountinfo text, in its order (`proc(5)`: fields 4 and 5 are the
/// root and the mount point, the filesystem type follows the ` - ` separator).
pub fn cgroup2_mounts(text: &str) -> Vec<Cgroup2Mount> {
    text.lines()
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            if post.split_whitespace().next() != Some("cgroup2") {
                return None;
            }
            let f: Vec<&str> = pre.split_whitespace().collect();
            (f.len() >= 5).then(|| Cgroup2Mount {
                root: unescape(f[3]),
                mount_point: PathBuf::from(unescape(f[4])),
            })
        })
        .collect()
}

/// The cgroup2 mount of a mountinfo text: the first one with root `/` (the whole hierarchy),
/// else the first bind mount of a sub-directory.
pub fn parse_mountinfo(text: &str) -> Option<Cgroup2Mount> {
    let mut all = cgroup2_mounts(text);
    let i = all.iter().position(|m| m.root == "/").unwrap_or(0);
    (i < all.len()).then(|| all.swap_remove(i))
}

/// The cgroup v2 mount of this process's mount namespace.
pub fn cgroup2_mount() -> Result<Cgroup2Mount, CgroupError> {
    parse_mountinfo(&read(Path::new("/proc/self/mountinfo"))?).ok_or(CgroupError::NoCgroup2)
}

/// Where cgroup v2 is mounted here (`/sys/fs/cgroup`, `/sys/fs/cgroup/unified`, …).
pub fn cgroup2_root() -> Result<PathBuf, CgroupError> {
    cgroup2_mount().map(|m| m.mount_point)
}

/// Makes the child of `cmd` join the cgroup directory `dir` between `fork` and `exec` (writes
/// `0` to its `cgroup.procs`), so that the program runs in it from its first instruction. The
/// path is prepared here: the child only calls `open`, `write` and `close`, which are
/// async-signal-safe (a child of a multi-threaded parent must not allocate: another thread may
/// have held the allocator's lock at the fork). A failure (also a path with a NUL byte) makes
/// `spawn` return the error.
pub fn join_before_exec(cmd: &mut std::process::Command, dir: &Path) {
    use std::os::unix::{ffi::OsStrExt as _, process::CommandExt as _};
    let procs = std::ffi::CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok();
    // SAFETY: the closure runs in the child between fork and exec and calls only open, write and
    // close (async-signal-safe) on memory allocated before the fork; its errors are built from
    // an errno or a constant kind (no allocation).
    unsafe {
        cmd.pre_exec(move || {
            let Some(procs) = &procs else {
                return Err(io::ErrorKind::InvalidInput.into());
            };
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            let r = libc::write(fd, b"0\n".as_ptr().cast(), 2);
            let err = io::Error::last_os_error();
            libc::close(fd);
            if r < 0 {
                return Err(err);
            }
            Ok(())
        });
    }
}

/// The cgroup v2 path (`0::<path>` line) of a `/proc/PID/cgroup` text.
pub fn parse_proc_cgroup(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The directory below `mount` of the hierarchy path `path` (as `/proc/PID/cgroup` gives it).
pub fn dir_of(mount: &Cgroup2Mount, path: &str) -> Option<PathBuf> {
    let path = path.trim_end_matches(" (deleted)");
    let root = mount.root.trim_end_matches('/');
    let rel = if root.is_empty() {
        path
    } else {
        let r = path.strip_prefix(root)?;
        if !(r.is_empty() || r.starts_with('/')) {
            return None;
        }
        r
    };
    let rel = rel.trim_start_matches('/');
    if rel.split('/').any(|c| c == "..") {
        return None;
    }
    Some(if rel.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rel)
    })
}

/// The cgroup v2 directory of process `pid`.
pub fn cgroup_of_pid(pid: u32) -> Result<PathBuf, CgroupError> {
    let p = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = match fs::read_to_string(&p) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(CgroupError::NoProcess(pid)),
        Err(source) => return Err(CgroupError::Io { path: p, source }),
    };
    let path = parse_proc_cgroup(&text).ok_or(CgroupError::NotInCgroup2(pid))?;
    let mount = cgroup2_mount()?;
    dir_of(&mount, path).ok_or_else(|| CgroupError::OutsideMount {
        pid,
        path: path.to_string(),
    })
}

/// The container id in a cgroup directory name of a known runtime layout, if any:
/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`,
/// or a bare 64-hex-digit `<id>` (cgroupfs driver).
pub fn container_id_of_dir_name(name: &str) -> Option<&str> {
    const PREFIXES: [&str; 4] = ["docker-", "cri-containerd-", "crio-", "libpod-"];
    let id = match name.strip_suffix(".scope") {
        Some(s) => PREFIXES.iter().find_map(|p| s.strip_prefix(p))?,
        None => name,
    };
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then_some(id)
}

/// The cgroup directory of a container below `root` (see the module docs for the layouts).
/// `id` is the full id or a unique prefix of at least [`MIN_ID_PREFIX`] hex digits. A scope
/// whose sub-directory holds the processes (`…/docker-<id>.scope/init.scope` under a nested
/// systemd) is returned as the scope itself: attaching it covers its descendants.
pub fn find_container(root: &Path, id: &str) -> Result<PathBuf, CgroupError> {
    let id = id.trim().to_ascii_lowercase();
    if id.len() < MIN_ID_PREFIX || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(CgroupError::BadContainerId(id));
    }
    let mut matches = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    let mut visited = 0usize;
    while let Some(dir) = stack.pop() {
        visited += 1;
        if visited > MAX_WALK {
            break;
        }
        let Ok(rd) = fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                continue;
            }
            let name = e.file_name();
            let name = name.to_string_lossy();
            match container_id_of_dir_name(&name) {
                // A container's own cgroup: do not descend (its sub-cgroups are its own).
                Some(cid) if cid.starts_with(&id) => matches.push(e.path()),
                Some(_) => {}
                None => stack.push(e.path()),
            }
        }
    }
    matches.sort();
    matches.dedup();
    match matches.len() {
        0 => Err(CgroupError::ContainerNotFound {
            id,
            root: root.to_path_buf(),
        }),
        1 => Ok(matches.remove(0)),
        _ => Err(CgroupError::AmbiguousContainer { id, matches }),
    }
}

/// QoS class of a kubelet pod cgroup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    Guaranteed,
    Burstable,
    BestEffort,
}

impl QosClass {
    pub fn name(self) -> &'static str {
        match self {
            QosClass::Guaranteed => "Guaranteed",
            QosClass::Burstable => "Burstable",
            QosClass::BestEffort => "BestEffort",
        }
    }
}

/// A kubelet pod cgroup: the pod's UID (with dashes) and QoS class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCgroup {
    pub uid: String,
    pub qos: QosClass,
}

/// The pod of a kubelet pod cgroup directory, from its path relative to the cgroup v2 root:
/// systemd driver `kubepods.slice/[kubepods-<qos>.slice/]kubepods-[<qos>-]pod<uid_>.slice`
/// (dashes of the UID written as `_`), cgroupfs driver `kubepods/[<qos>/]pod<uid>`.
/// `None` for anything else (also for the containers below a pod).
pub fn pod_of_cgroup(rel: &Path) -> Option<PodCgroup> {
    let comps: Vec<&str> = rel
        .components()
        .filter_map(|c| match c {
            std::path::Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let last = *comps.last()?;
    let qos_of = |s: &str| match s {
        "burstable" => Some(QosClass::Burstable),
        "besteffort" => Some(QosClass::BestEffort),
        _ => None,
    };
    let valid_uid = |u: &str| {
        u.len() == 36
            && u.bytes().enumerate().all(|(i, b)| {
                matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
            })
    };
    let (uid, qos) = if let Some(s) = last.strip_suffix(".slice") {
        // systemd: kubepods.slice / kubepods-burstable.slice / kubepods-burstable-pod<uid>.slice
        if comps.first() != Some(&"kubepods.slice") {
            return None;
        }
        let s = s.strip_prefix("kubepods-")?;
        let (qos, pod) = match s.split_once("-pod") {
            Some((q, p)) => (qos_of(q)?, p),
            None => (QosClass::Guaranteed, s.strip_prefix("pod")?),
        };
        let want_depth = if qos == QosClass::Guaranteed { 2 } else { 3 };
        if comps.len() != want_depth {
            return None;
        }
        (pod.replace('_', "-"), qos)
    } else {
        // cgroupfs: kubepods / burstable / pod<uid>
        if comps.first() != Some(&"kubepods") {
            return None;
        }
        let pod = last.strip_prefix("pod")?;
        let qos = match comps.len() {
            2 => QosClass::Guaranteed,
            3 => qos_of(comps[1])?,
            _ => return None,
        };
        (pod.to_string(), qos)
    };
    valid_uid(&uid).then_some(PodCgroup { uid, qos })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_before_exec_fails_the_spawn() {
        let mut c = std::process::Command::new("true");
        join_before_exec(&mut c, Path::new("/nonexistent-cgroup-dir"));
        let e = c.spawn().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
    }

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn mountinfo_hybrid_unified_and_container() {
        let m = parse_mountinfo(HYBRID).unwrap();
        assert_eq!(m.mount_point, Path::new("/sys/fs/cgroup/unified"));
        assert_eq!(m.root, "/");
        let unified =
            "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            parse_mountinfo(unified).unwrap().mount_point,
            Path::new("/sys/fs/cgroup")
        );
        // A container: its own cgroup bind-mounted (root is not /), an escaped space.
        let ctr = "900 800 0:26 /system.slice/docker-ab.scope /sys/fs/cgroup\\040x ro - cgroup2 cgroup2 rw\n";
        let m = parse_mountinfo(ctr).unwrap();
        assert_eq!(m.mount_point, Path::new("/sys/fs/cgroup x"));
        assert_eq!(m.root, "/system.slice/docker-ab.scope");
        assert_eq!(
            dir_of(&m, "/system.slice/docker-ab.scope/sub").unwrap(),
            Path::new("/sys/fs/cgroup x/sub")
        );
        assert_eq!(dir_of(&m, "/system.slice/docker-abc.scope"), None);
        assert_eq!(dir_of(&m, "/other"), None);
        assert!(parse_mountinfo(&HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs")).is_none());
        // Several: the full hierarchy wins over a bind mount of a sub-directory.
        let two = format!("{ctr}{HYBRID}");
        assert_eq!(parse_mountinfo(&two).unwrap().root, "/");
    }

    #[test]
    fn proc_cgroup_lines() {
        let t = "9:name=systemd:/\n4:memory:/x\n0::/system.slice/a.service\n";
        assert_eq!(parse_proc_cgroup(t), Some("/system.slice/a.service"));
        assert_eq!(parse_proc_cgroup("4:memory:/x\n"), None);
        let m = parse_mountinfo(HYBRID).unwrap();
        assert_eq!(
            dir_of(&m, "/").unwrap(),
            Path::new("/sys/fs/cgroup/unified")
        );
        assert_eq!(
            dir_of(&m, "/a/b").unwrap(),
            Path::new("/sys/fs/cgroup/unified/a/b")
        );
        assert_eq!(dir_of(&m, "/a/../../etc"), None);
    }

    #[test]
    fn container_dir_names() {
        let id = "0123456789abcdef".repeat(4);
        for n in [
            format!("docker-{id}.scope"),
            format!("cri-containerd-{id}.scope"),
            format!("crio-{id}.scope"),
            format!("libpod-{id}.scope"),
            id.clone(),
        ] {
            assert_eq!(container_id_of_dir_name(&n), Some(id.as_str()), "{n}");
        }
        for n in [
            "docker.service".to_string(),
            format!("docker-{}.scope", &id[..63]),
            format!("foo-{id}.scope"),
            format!("{id}x"),
        ] {
            assert_eq!(container_id_of_dir_name(&n), None, "{n}");
        }
    }

    #[test]
    fn pod_cgroups_both_drivers() {
        let uid = "1b2c3d4e-0000-4111-8222-333344445555";
        let u_ = uid.replace('-', "_");
        let cases = [
            (
                format!("kubepods.slice/kubepods-pod{u_}.slice"),
                QosClass::Guaranteed,
            ),
            (
                format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice"),
                QosClass::Burstable,
            ),
            (
                format!(
                    "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{u_}.slice"
                ),
                QosClass::BestEffort,
            ),
            (format!("kubepods/pod{uid}"), QosClass::Guaranteed),
            (format!("kubepods/burstable/pod{uid}"), QosClass::Burstable),
            (
                format!("kubepods/besteffort/pod{uid}"),
                QosClass::BestEffort,
            ),
        ];
        for (p, qos) in cases {
            assert_eq!(
                pod_of_cgroup(Path::new(&p)),
                Some(PodCgroup {
                    uid: uid.to_string(),
                    qos
                }),
                "{p}"
            );
        }
        for p in [
            "kubepods.slice".to_string(),
            "kubepods.slice/kubepods-burstable.slice".to_string(),
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u_}.slice/cri-containerd-x.scope"),
            format!("kubepods/burstable/pod{uid}/abc"),
            format!("kubepods/weird/pod{uid}"),
            "kubepods/burstable/podnot-a-uid".to_string(),
            format!("system.slice/kubepods-pod{u_}.slice"),
        ] {
            assert_eq!(pod_of_cgroup(Path::new(&p)), None, "{p}");
        }
    }
}
