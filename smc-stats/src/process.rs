//! What the statistics readers and writers learn from `/proc`: a process's identity (pid, start
//! time, PID namespace, cgroup v2 id) and whether the writer of a file still runs.

use crate::layout::{Identity, Snapshot};

impl Identity {
    /// The calling process's identity (0 for what cannot be read).
    pub fn current() -> Identity {
        let pid = std::process::id() as u64;
        Identity {
            pid,
            cgroup_id: proc_cgroup_id("self").unwrap_or(0),
            start_time: proc_start_time(pid).unwrap_or(0),
            pid_ns: pid_ns("self").unwrap_or(0),
        }
    }
}

/// Inode of the PID namespace of `pid` (`"self"` for the caller).
pub fn pid_ns(pid: &str) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(format!("/proc/{pid}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Start time of process `pid` (`/proc/<pid>/stat` field 22), if it exists.
pub fn proc_start_time(pid: u64) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may contain spaces and parentheses: fields start after the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the writer of `s` still runs (pid exists and, when recorded, has the same start
/// time). Aggregates are never live; a writer in another PID namespace always counts as live.
pub fn is_live(s: &Snapshot) -> bool {
    if s.is_aggregate() || s.pid == 0 {
        return false;
    }
    if s.pid_ns != 0 && pid_ns("self").is_some_and(|ns| ns != s.pid_ns) {
        return true;
    }
    match proc_start_time(s.pid) {
        None => false,
        Some(t) => s.start_time == 0 || s.start_time == t,
    }
}

/// Cgroup v2 id (directory inode) of process `pid` (`"self"` for the caller), from
/// `/proc/<pid>/cgroup` and the cgroup2 mounts in `/proc/<pid>/mountinfo` (the first whose
/// directory exists).
pub fn proc_cgroup_id(pid: &str) -> Option<u64> {
    use smc_common::cgroup;
    use std::os::unix::fs::MetadataExt as _;
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let rel = cgroup::parse_proc_cgroup(&cg)?.trim();
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    for m in cgroup::cgroup2_mounts(&mounts) {
        // A cgroup outside the mount's root: as seen from the mount point.
        let path = cgroup::dir_of(&m, rel)
            .unwrap_or_else(|| m.mount_point.join(rel.trim_start_matches('/')));
        // A pid other than "self" sees its mounts through its root.
        let path = if pid == "self" {
            path
        } else {
            std::path::Path::new(&format!("/proc/{pid}/root"))
                .join(path.strip_prefix("/").unwrap_or(&path))
        };
        if let Ok(md) = std::fs::metadata(&path) {
            return Some(md.ino());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_identity() {
        let t = proc_start_time(std::process::id() as u64).unwrap();
        assert!(t > 0);
        let me = Identity::current();
        assert_eq!(me.start_time, t);
        assert!(me.pid_ns != 0);
        let s = Snapshot {
            pid: std::process::id() as u64,
            start_time: t,
            pid_ns: me.pid_ns,
            ..Default::default()
        };
        assert!(is_live(&s));
        assert!(!is_live(&Snapshot {
            start_time: t + 1,
            ..s.clone()
        }));
        // Inside a cgroup v2 hierarchy the id resolves (skipped where there is none).
        if std::path::Path::new("/proc/self/cgroup").exists() {
            let _ = proc_cgroup_id("self");
        }
    }
}
