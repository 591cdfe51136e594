//! Data source: the data path's per-process statistics files (`$SMC_PROCS_DIR`, see
//! [`smc_stats`]): the folded sums per cgroup for `smc-ctl stats`, the live files by pid for
//! `smc-ctl conns`.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use serde::Serialize;
use smc_stats::{self as procstats, Snapshot};

/// What the directory held.
#[derive(Debug, Default, Clone, Serialize)]
pub struct ProcScan {
    pub dir: String,
    /// Sum per cgroup id (0 = unknown).
    #[serde(skip)]
    pub per_cgroup: BTreeMap<u64, Snapshot>,
    /// Files of running processes.
    pub live_processes: u64,
    /// Aggregates of exited processes.
    pub exited_aggregates: u64,
    /// Files of processes that are gone, folded into aggregates by this run.
    pub stale_folded: u64,
    /// Files of processes that are gone, left as they are (no write access).
    pub stale_kept: u64,
    /// Live processes whose cgroup was read from `/proc/<pid>/cgroup` because their file does
    /// not record it.
    pub cgroup_from_proc: u64,
    /// SMC-D connections open now (Σ smcd_client + smcd_server − closed_conns over the files
    /// of running processes).
    #[serde(skip)]
    pub live_smcd_by_cgroup: BTreeMap<u64, i64>,
    /// Fold/lock problems.
    pub warnings: Vec<String>,
}

/// Reads the directory tree: the top directory and its `uid-<n>` subdirectories (see
/// `procstats::StatsDir::tree`), and one level of other subdirectories (one per container: a
/// container gets its own, mounted at its `/run/smc/procs`, as its pids collide with the
/// host's and other containers'), each with its own `uid-<n>` subdirectories. Live files,
/// aggregates, stale files (folded when possible). Nothing in it can make this block for longer
/// than [`procstats::READER_LOCK_WAIT`] per directory, nor read a FIFO, device or oversized
/// file: such entries are skipped with a warning.
pub fn scan_procs(dir: &Path) -> ProcScan {
    let mut writers = procstats::Writers::new();
    let mut scan = scan_one(dir, &mut writers);
    for sub in container_dirs(dir) {
        let s = scan_one(&sub, &mut writers);
        for (cg, snap) in s.per_cgroup {
            scan.per_cgroup
                .entry(cg)
                .or_insert_with(|| Snapshot {
                    cgroup_id: cg,
                    ..Default::default()
                })
                .add(&snap);
        }
        for (cg, n) in s.live_smcd_by_cgroup {
            *scan.live_smcd_by_cgroup.entry(cg).or_insert(0) += n;
        }
        scan.live_processes += s.live_processes;
        scan.exited_aggregates += s.exited_aggregates;
        scan.stale_folded += s.stale_folded;
        scan.stale_kept += s.stale_kept;
        scan.cgroup_from_proc += s.cgroup_from_proc;
        scan.warnings.extend(s.warnings);
    }
    scan
}

/// The per-container subdirectories of the top directory `dir` (sorted; not the `uid-<n>` ones,
/// which belong to the top directory's tree, nor hidden entries).
fn container_dirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut subs: Vec<PathBuf> = rd
        .flatten()
        .filter(|e| {
            e.file_type().is_ok_and(|t| t.is_dir())
                && !e.file_name().as_encoded_bytes().starts_with(b".")
                && !e.file_name().as_encoded_bytes().starts_with(b"uid-")
        })
        .map(|e| e.path())
        .collect();
    subs.sort();
    subs
}

pub(crate) fn scan_one(dir: &Path, writers: &mut procstats::Writers) -> ProcScan {
    let mut scan = ProcScan {
        dir: dir.display().to_string(),
        ..Default::default()
    };
    let mut warnings = Vec::new();
    let Ok(dirs) = procstats::StatsDir::tree(dir, &mut warnings) else {
        return scan;
    };
    scan.warnings = warnings;
    for d in &dirs {
        scan_dir(&mut scan, d, writers);
    }
    scan
}

/// Open SMC-D connections are counted over the files of running processes only: those of a
/// process that is gone were closed with it.
pub(crate) fn add_to_scan(scan: &mut ProcScan, cg: u64, s: &Snapshot, live: bool) {
    scan.per_cgroup
        .entry(cg)
        .or_insert_with(|| Snapshot {
            cgroup_id: cg,
            ..Default::default()
        })
        .add(s);
    if live {
        let open = s.get("smcd_client") as i64 + s.get("smcd_server") as i64
            - s.get("closed_conns") as i64;
        *scan.live_smcd_by_cgroup.entry(cg).or_insert(0) += open;
    }
}

/// The cgroup that figures of a file of `d` claiming `cgroup_id` count for: the claim itself in
/// a directory of root or of the reader's own uid; in another uid's directory only where a
/// process of that uid runs now (a uid cannot attribute figures to another tenant's cgroup),
/// otherwise 0 (unattributed: they still count in the host's totals), with a warning.
fn attributed(
    scan: &mut ProcScan,
    d: &procstats::StatsDir,
    cgroup_id: u64,
    writers: &mut procstats::Writers,
) -> u64 {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if d.owner() == 0
        || d.owner() == me
        || cgroup_id == 0
        || writers.uid_in_cgroup(d.owner(), cgroup_id)
    {
        return cgroup_id;
    }
    let w = format!(
        "{}: figures of uid {} for cgroup {cgroup_id}, where no process of that uid runs, counted as unattributed",
        d.path().display(),
        d.owner()
    );
    if !scan.warnings.contains(&w) {
        scan.warnings.push(w);
    }
    0
}

pub(crate) fn scan_dir(
    scan: &mut ProcScan,
    d: &procstats::StatsDir,
    writers: &mut procstats::Writers,
) {
    // Without write access nothing is folded and stale files are read as they are. A lock held
    // for longer than the wait (only the directory's owner or root can hold it) leaves this
    // directory read without folding: a uid can only disturb its own figures.
    let lock = match d.lock(procstats::READER_LOCK_WAIT) {
        Ok(l) => Some(l),
        Err(e) => {
            if !e.is_permission() {
                scan.warnings.push(format!(
                    "lock of {}: {e}; read without folding",
                    d.path().display()
                ));
            }
            None
        }
    };
    let mut names = d.names();
    // Stale files first, so that the aggregates read afterwards include them.
    names.sort_by_key(|n| n.starts_with(procstats::AGGREGATE_PREFIX));
    let mut aggregates = BTreeSet::new();
    for name in names {
        if name.starts_with(procstats::AGGREGATE_PREFIX) {
            aggregates.insert(name);
            continue;
        }
        if name.parse::<u64>().is_err() {
            continue;
        }
        let (bytes, s) = match d.read_snapshot(&name) {
            Ok(v) => v,
            Err(e) if e.not_found() => continue, // folded meanwhile by its exiting writer
            Err(e) => {
                scan.warnings
                    .push(format!("ignored {}: {e}", d.path().join(&name).display()));
                continue;
            }
        };
        // A file is a running process's only under that process's pid and where it may
        // write (see `procstats::Writers`): a uid's file named after another uid's process is
        // that uid's stale figures.
        let named = name.parse::<u64>().is_ok_and(|n| n == s.pid);
        if let (true, procstats::Writer::Live { cgroup_id, .. }) =
            (named, writers.writer(&s, d.owner()))
        {
            scan.live_processes += 1;
            if d.owner() != 0 || s.valid & procstats::VALID_IDENTITY == 0 || s.cgroup_id == 0 {
                scan.cgroup_from_proc += 1;
            }
            add_to_scan(scan, cgroup_id, &s, true);
            continue;
        }
        // Gone: fold into its cgroup's aggregate when we may write, else count as it is.
        if lock.is_some() {
            match d.fold_into_aggregate(s.cgroup_id, &bytes) {
                Ok(()) => {
                    let _ = d.remove(&name);
                    scan.stale_folded += 1;
                    continue;
                }
                Err(e) => scan
                    .warnings
                    .push(format!("fold {}: {e}", d.path().join(&name).display())),
            }
        }
        scan.stale_kept += 1;
        let cg = attributed(scan, d, s.cgroup_id, writers);
        add_to_scan(scan, cg, &s, false);
    }
    // The aggregates, re-listed: folding may have created some.
    aggregates.extend(
        d.names()
            .into_iter()
            .filter(|n| n.starts_with(procstats::AGGREGATE_PREFIX)),
    );
    if lock.is_some() && aggregates.len() > PRUNE_AGGREGATES_ABOVE {
        prune_aggregates(d, &mut aggregates, &mut scan.warnings);
    }
    for name in aggregates {
        match d.read_snapshot(&name) {
            Ok((_, s)) => {
                scan.exited_aggregates += 1;
                let cg = attributed(scan, d, s.cgroup_id, writers);
                add_to_scan(scan, cg, &s, false);
            }
            Err(e) if e.not_found() => {}
            Err(e) => scan
                .warnings
                .push(format!("ignored {}: {e}", d.path().join(&name).display())),
        }
    }
    drop(lock);
}

/// Above this many aggregates, those of cgroups that no longer exist are merged into
/// `exited-0`, so that container churn does not leave one file per container behind.
pub(crate) const PRUNE_AGGREGATES_ABOVE: usize = 32;

pub(crate) fn prune_aggregates(
    d: &procstats::StatsDir,
    names: &mut BTreeSet<String>,
    warnings: &mut Vec<String>,
) {
    let ids: BTreeMap<u64, String> = names
        .iter()
        .filter_map(|n| {
            let id = n.strip_prefix(procstats::AGGREGATE_PREFIX)?.parse().ok()?;
            (id != 0).then(|| (id, n.clone()))
        })
        .collect();
    let found = crate::sys::cgroup_paths_by_inode(ids.keys().copied().collect());
    for (id, n) in ids {
        if found.contains_key(&id) {
            continue;
        }
        let Ok(b) = d.read(&n) else { continue };
        match d.fold_into_aggregate(0, &b) {
            Ok(()) => {
                let _ = d.remove(&n);
                names.remove(&n);
                names.insert(procstats::aggregate_name(0));
            }
            Err(e) => warnings.push(format!("merge {}: {e}", d.path().join(&n).display())),
        }
    }
}

impl ProcScan {
    /// The sum over the given cgroups (all when `None`).
    pub(crate) fn sum(&self, ids: Option<&BTreeSet<u64>>) -> (Snapshot, i64) {
        let mut total = Snapshot::default();
        let mut open = 0;
        for (cg, s) in &self.per_cgroup {
            if ids.is_none_or(|ids| ids.contains(cg)) {
                total.add(s);
                open += self.live_smcd_by_cgroup.get(cg).copied().unwrap_or(0);
            }
        }
        (total, open)
    }
}

/// The per-process files of the tree `dir` (the top directory, its `uid-<n>` subdirectories,
/// and the per-container subdirectories with theirs), looked up one process at a time, for
/// `smc-ctl conns`: only the files of the processes listed are read, one at a time, so that
/// the memory of a reader does not follow what other uids put into their directories.
pub struct ProcFiles {
    dirs: Vec<procstats::StatsDir>,
    writers: procstats::Writers,
}

impl ProcFiles {
    pub fn open(dir: &Path) -> ProcFiles {
        let mut warnings = Vec::new();
        let mut dirs = procstats::StatsDir::tree(dir, &mut warnings).unwrap_or_default();
        for sub in container_dirs(dir) {
            if let Ok(v) = procstats::StatsDir::tree(&sub, &mut warnings) {
                dirs.extend(v);
            }
        }
        for w in warnings {
            eprintln!("warning: {w}");
        }
        ProcFiles {
            dirs,
            writers: procstats::Writers::new(),
        }
    }

    /// The file of the running process `pid` (a host pid): named after its pid in its own PID
    /// namespace, in a directory it may write, and written by it ([`procstats::Writers`]).
    pub fn get(&mut self, pid: u32) -> Option<Snapshot> {
        let (_, ns_pid) = self.writers.ns_pid(pid as u64)?;
        let name = if ns_pid != 0 { ns_pid } else { pid as u64 }.to_string();
        for d in &self.dirs {
            match d.read_snapshot(&name) {
                Ok((_, s)) => {
                    if let procstats::Writer::Live { pid: p, .. } =
                        self.writers.writer(&s, d.owner())
                    {
                        if p == pid as u64 && s.pid.to_string() == name {
                            return Some(s);
                        }
                    }
                }
                Err(e) if e.not_found() => {}
                Err(e) => eprintln!("warning: ignored {}: {e}", d.path().join(&name).display()),
            }
        }
        None
    }
}
