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

/// The name of TCP state `st` (`include/net/tcp_states.h`: `tcpi_state`, the `st` column of
/// `/proc/net/tcp`), for the states 1 (`ESTABLISHED`) to 11 (`CLOSING`).
pub fn tcp_state_name(st: u8) -> Option<&'static str> {
    const NAMES: [&str; 11] = [
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT1",
        "FIN_WAIT2",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "CLOSING",
    ];
    NAMES.get(usize::from(st).checked_sub(1)?).copied()
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
    use smc_cgroup as cgroup;
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

/// What a reader learns of the writer of a per-process file, found in a directory owned by
/// `dir_owner` ([`Writers::writer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// Its process runs (host pid), and may write where the file is: a directory of root, or
    /// of one of the process's uids. `cgroup_id`: the file's own claim when root wrote it, else
    /// the process's cgroup read from `/proc` (0: unknown).
    Live { pid: u64, cgroup_id: u64 },
    /// No such process runs (exited, killed, a pid reused since), or it runs as a uid that
    /// cannot write in that directory (a file planted under another process's pid): the file
    /// holds the directory owner's figures, as any stale file does.
    Gone,
}

/// One process of `/proc` as [`Writers`] indexes it.
#[derive(Clone, Debug, Default)]
struct ProcEntry {
    /// Real, effective, saved and filesystem uid (`Uid:` of `/proc/<pid>/status`).
    uids: [u32; 4],
    /// Inode of its PID namespace (0: unreadable).
    pid_ns: u64,
    /// Its pid in that namespace (last field of `NSpid:`).
    ns_pid: u64,
}

/// The readers' check of what a per-process file claims about its writer, against `/proc`:
/// a file is only a process's while that process runs as a uid that may write in the file's
/// directory, and a non-root uid's figures only count for a cgroup where a process of that uid
/// runs. `/proc` is read once, on the first question that needs every process (a writer in
/// another PID namespace, a cgroup claim), and at most [`Writers::MAX_PROCS`] entries of it.
#[derive(Default)]
pub struct Writers {
    procs: Option<std::collections::HashMap<u64, ProcEntry>>,
    by_ns: std::collections::HashMap<(u64, u64), u64>,
    cgroups: std::collections::HashMap<u64, u64>,
    own_ns: Option<u64>,
}

/// The four uids of `/proc/<pid>/status`.
pub fn proc_uids(pid: u64) -> Option<[u32; 4]> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status(&s).map(|(u, _)| u)
}

/// `Uid:` (four uids) and the last `NSpid:` field of a `/proc/<pid>/status` text.
fn parse_status(s: &str) -> Option<([u32; 4], u64)> {
    let mut uids = None;
    let mut ns_pid = 0;
    for l in s.lines() {
        if let Some(v) = l.strip_prefix("Uid:") {
            let mut u = [0u32; 4];
            let mut it = v.split_whitespace();
            for x in &mut u {
                *x = it.next()?.parse().ok()?;
            }
            uids = Some(u);
        } else if let Some(v) = l.strip_prefix("NSpid:") {
            ns_pid = v.split_whitespace().last()?.parse().ok()?;
        }
    }
    Some((uids?, ns_pid))
}

impl Writers {
    /// Processes of `/proc` indexed at most (a bound on the reader's memory and time).
    pub const MAX_PROCS: usize = 1 << 20;

    pub fn new() -> Writers {
        Writers::default()
    }

    fn own_ns(&mut self) -> u64 {
        *self
            .own_ns
            .get_or_insert_with(|| pid_ns("self").unwrap_or(0))
    }

    fn index(&mut self) -> &std::collections::HashMap<u64, ProcEntry> {
        if self.procs.is_none() {
            let mut m = std::collections::HashMap::new();
            if let Ok(rd) = std::fs::read_dir("/proc") {
                for e in rd.flatten().take(Self::MAX_PROCS) {
                    let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u64>().ok())
                    else {
                        continue;
                    };
                    let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                        continue;
                    };
                    let Some((uids, ns_pid)) = parse_status(&st) else {
                        continue;
                    };
                    let pid_ns = pid_ns(&pid.to_string()).unwrap_or(0);
                    if pid_ns != 0 && ns_pid != 0 {
                        self.by_ns.insert((pid_ns, ns_pid), pid);
                    }
                    m.insert(
                        pid,
                        ProcEntry {
                            uids,
                            pid_ns,
                            ns_pid,
                        },
                    );
                }
            }
            self.procs = Some(m);
        }
        self.procs.get_or_insert_with(Default::default)
    }

    fn cgroup_of(&mut self, pid: u64) -> u64 {
        *self
            .cgroups
            .entry(pid)
            .or_insert_with(|| proc_cgroup_id(&pid.to_string()).unwrap_or(0))
    }

    /// The writer of `s`, a file named after its pid in a directory owned by `dir_owner`.
    pub fn writer(&mut self, s: &Snapshot, dir_owner: u32) -> Writer {
        if s.is_aggregate() || s.pid == 0 {
            return Writer::Gone;
        }
        let own = self.own_ns();
        let host = if s.pid_ns == 0 || s.pid_ns == own {
            // Same namespace: the pid itself, with the start time the writer recorded.
            match proc_start_time(s.pid) {
                Some(t) if s.start_time == 0 || s.start_time == t => s.pid,
                _ => return Writer::Gone,
            }
        } else {
            // Another PID namespace (a container's file): the process whose namespace and pid
            // there are those recorded, if one runs. Its start time is counted in the
            // container's time namespace, so it is not compared.
            self.index();
            match self.by_ns.get(&(s.pid_ns, s.pid)) {
                Some(&p) => p,
                None => return Writer::Gone,
            }
        };
        if dir_owner == 0 {
            let cg = if s.valid & crate::VALID_IDENTITY != 0 && s.cgroup_id != 0 {
                s.cgroup_id
            } else {
                self.cgroup_of(host)
            };
            return Writer::Live {
                pid: host,
                cgroup_id: cg,
            };
        }
        match proc_uids(host) {
            Some(u) if u.contains(&dir_owner) => Writer::Live {
                pid: host,
                cgroup_id: self.cgroup_of(host),
            },
            _ => Writer::Gone,
        }
    }

    /// Whether a process running as `uid` is in the cgroup `cgroup_id` now: what a non-root
    /// uid's claim of figures for that cgroup (its aggregates, its stale files) needs to count
    /// there.
    pub fn uid_in_cgroup(&mut self, uid: u32, cgroup_id: u64) -> bool {
        let pids: Vec<u64> = self
            .index()
            .iter()
            .filter(|(_, e)| e.uids.contains(&uid))
            .map(|(p, _)| *p)
            .collect();
        pids.into_iter().any(|p| self.cgroup_of(p) == cgroup_id)
    }

    /// Host pid → (PID namespace, pid there) of a running process, for finding its file.
    pub fn ns_pid(&mut self, pid: u64) -> Option<(u64, u64)> {
        if let Some(e) = self.procs.as_ref().and_then(|m| m.get(&pid)) {
            return Some((e.pid_ns, e.ns_pid));
        }
        let st = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let (_, ns_pid) = parse_status(&st)?;
        Some((pid_ns(&pid.to_string()).unwrap_or(0), ns_pid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_state_names() {
        assert_eq!(tcp_state_name(1), Some("ESTABLISHED"));
        assert_eq!(tcp_state_name(10), Some("LISTEN"));
        assert_eq!(tcp_state_name(11), Some("CLOSING"));
        assert_eq!((tcp_state_name(0), tcp_state_name(12)), (None, None));
    }

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

    #[test]
    fn writers_checks_pid_uid_and_namespace() {
        let me = Identity::current();
        let s = Snapshot {
            pid: me.pid,
            start_time: me.start_time,
            pid_ns: me.pid_ns,
            cgroup_id: 77,
            valid: crate::VALID_IDENTITY,
            ..Default::default()
        };
        let mut w = Writers::new();
        let uid = proc_uids(me.pid).unwrap()[1];
        // Root's directory: the file's own cgroup claim stands.
        assert_eq!(
            w.writer(&s, 0),
            Writer::Live {
                pid: me.pid,
                cgroup_id: 77
            }
        );
        // A directory of a uid this process does not run as: not its file.
        let other = if uid == 4242 { 4243 } else { 4242 };
        assert_eq!(w.writer(&s, other), Writer::Gone);
        if uid != 0 {
            // Its own uid's directory: live, the cgroup from /proc, not from the file.
            assert!(matches!(w.writer(&s, uid), Writer::Live { cgroup_id, .. } if cgroup_id != 77));
        }
        // Another PID namespace where no such pid runs: gone.
        let foreign = Snapshot {
            pid_ns: me.pid_ns + 1,
            pid: 1 << 30,
            ..s.clone()
        };
        assert_eq!(w.writer(&foreign, 0), Writer::Gone);
        // Its own namespace and pid, recorded as another namespace would: found in the index.
        assert_eq!(w.ns_pid(me.pid).map(|x| x.1), Some(me.pid));
        // A process of our uid is in our cgroup; none of uid 4242 is in cgroup 77.
        let cg = proc_cgroup_id("self").unwrap_or(0);
        if cg != 0 {
            assert!(w.uid_in_cgroup(uid, cg));
        }
        assert!(!w.uid_in_cgroup(other, 77));
    }

    #[test]
    fn status_fields() {
        let t = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t1\t1\t1\t1\nNSpid:\t4711\t12\n";
        assert_eq!(parse_status(t), Some(([1000, 1001, 1002, 1003], 12)));
        assert_eq!(parse_status("Uid:\t1 2\n"), None);
    }
}
