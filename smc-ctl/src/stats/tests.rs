use std::fs;

use smc_stats::{self as procstats};

use super::baseline::{scope_base, Baseline};
use super::collect::{cgroup_key, Scope};
use super::raw::Raw;
use super::text::abbrev;
use crate::procs::{scan_procs, PRUNE_AGGREGATES_ABOVE};

fn raw(pairs: &[(&str, u64)]) -> Raw {
    Raw {
        procs: pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        ..Default::default()
    }
}

#[test]
fn differences() {
    let cur = Raw {
        reasons: [("0x03010000".to_string(), 5)].into(),
        ebpf: Some([("same_host_pairs".to_string(), 10)].into()),
        daemon: Some([("ops_register_ok".to_string(), 7)].into()),
        daemon_started: Some(1000),
        ..raw(&[("smcd_client", 9), ("rx_bytes", 100)])
    };
    let base = Raw {
        reasons: [("0x03010000".to_string(), 2)].into(),
        ebpf: Some([("same_host_pairs".to_string(), 4)].into()),
        daemon: Some([("ops_register_ok".to_string(), 3)].into()),
        daemon_started: Some(1001),
        ..raw(&[("smcd_client", 4), ("rx_bytes", 150)])
    };
    let d = cur.minus(&base);
    assert_eq!(d.p("smcd_client"), 5);
    // Below its baseline: its source was reset, count from zero.
    assert_eq!(d.p("rx_bytes"), 100);
    assert_eq!(d.reasons["0x03010000"], 3);
    assert_eq!(d.ebpf.unwrap()["same_host_pairs"], 6);
    assert_eq!(d.daemon.unwrap()["ops_register_ok"], 4);
    // A restarted daemon (other start time) is not subtracted.
    let restarted = Raw {
        daemon_started: Some(5000),
        ..cur.clone()
    };
    assert_eq!(restarted.minus(&base).daemon.unwrap()["ops_register_ok"], 7);
}

#[test]
fn cgroup_baselines_are_summed() {
    let mut b = Baseline::default();
    b.scopes
        .insert(cgroup_key(1), (10, raw(&[("smcd_client", 2)])));
    b.scopes
        .insert(cgroup_key(2), (20, raw(&[("smcd_client", 3)])));
    let scope = |ids: &[u64]| Scope {
        key: String::new(),
        cgroup: None,
        ids: Some(ids.iter().copied().collect()),
    };
    let (t, r) = scope_base(&b, &scope(&[1, 2, 3])).unwrap();
    assert_eq!((t, r.p("smcd_client")), (10, 5));
    assert!(scope_base(&b, &scope(&[4])).is_none());
    assert!(scope_base(
        &b,
        &Scope {
            key: String::new(),
            cgroup: None,
            ids: None
        }
    )
    .is_none());
}

#[test]
fn abbreviations() {
    assert_eq!(abbrev(999), "999");
    assert_eq!(abbrev(1536), "1.50K");
    assert_eq!(abbrev(75 << 20), "75.0M");
    assert_eq!(abbrev(300 << 30), "300G");
}

#[test]
fn folding_a_directory() {
    use smc_stats::{Identity, ProcStats};
    let dir = std::env::temp_dir().join(format!("smc-stats-unit-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    // A file of a process that is gone (pid 0x7fff_fff0 does not exist).
    // SAFETY: all-zero is a valid ProcStats (atomics only).
    let a: Box<ProcStats> = unsafe { Box::new(std::mem::zeroed()) };
    a.init(
        &Identity {
            pid: 0x7fff_fff0,
            cgroup_id: 42,
            start_time: 1,
            pid_ns: 0,
        },
        procstats::VALID_SIDE_REASONS,
    );
    a.smcd_client
        .fetch_add(2, std::sync::atomic::Ordering::Relaxed);
    a.fallback(true, 0x0301_0000);
    fs::write(dir.join("2147483632"), a.to_bytes()).unwrap();
    let s = scan_procs(&dir);
    assert_eq!((s.stale_folded, s.exited_aggregates), (1, 1));
    assert!(!dir.join("2147483632").exists());
    assert!(dir.join("exited-42").exists());
    let (sum, open) = s.sum(Some(&[42].into()));
    assert_eq!(sum.get("smcd_client"), 2);
    assert_eq!(sum.get("fallback_server"), 1);
    assert_eq!(sum.reasons_server[&0x0301_0000], 1);
    assert_eq!(open, 0);
    // Read again: the same figures, from the aggregate alone.
    let again = scan_procs(&dir);
    assert_eq!(again.sum(None).0.get("smcd_client"), 2);
    assert_eq!(again.stale_folded, 0);
    fs::remove_dir_all(&dir).unwrap();
}

/// A FIFO, a symbolic link to /dev/zero and a huge file where the reader looks: the scan
/// completes (bounded wait: it used to block forever in `read` on the FIFO), skips them with
/// warnings, and still counts the real file.
#[test]
fn hostile_entries_are_skipped() {
    let dir = std::env::temp_dir().join(format!("smc-stats-hostile-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let mut agg = procstats::new_aggregate(9);
    agg[24..32].copy_from_slice(&5u64.to_le_bytes()); // smcd_client
    fs::write(dir.join(procstats::aggregate_name(9)), agg).unwrap();
    let fifo = std::ffi::CString::new(dir.join("4000001").to_str().unwrap()).unwrap();
    // SAFETY: NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("/dev/zero", dir.join("exited-4000002")).unwrap();
    fs::File::create(dir.join("4000003"))
        .unwrap()
        .set_len(1 << 33)
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dir.clone();
    std::thread::spawn(move || {
        let _ = tx.send(scan_procs(&d));
    });
    let s = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("scan_procs did not complete (blocked on a planted entry)");
    assert_eq!(s.sum(None).0.get("smcd_client"), 5);
    for name in ["4000001", "exited-4000002", "4000003"] {
        assert!(
            s.warnings.iter().any(|w| w.contains(name)),
            "no warning about {name}: {:?}",
            s.warnings
        );
    }
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn aggregates_of_removed_cgroups_are_merged() {
    let dir = std::env::temp_dir().join(format!("smc-stats-prune-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let n = PRUNE_AGGREGATES_ABOVE as u64 + 3;
    for i in 0..n {
        // Ids no cgroup has.
        let id = u64::MAX - i;
        let mut b = procstats::new_aggregate(id);
        b[24..32].copy_from_slice(&1u64.to_le_bytes()); // smcd_client
        fs::write(dir.join(procstats::aggregate_name(id)), b).unwrap();
    }
    let s = scan_procs(&dir);
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert_eq!(s.exited_aggregates, 1);
    assert_eq!(s.sum(None).0.get("smcd_client"), n);
    assert_eq!(s.sum(Some(&[0].into())).0.get("smcd_client"), n);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn container_subdirectories_are_read() {
    let dir = std::env::temp_dir().join(format!("smc-stats-ctr-{}", std::process::id()));
    for (sub, id) in [("ctr-a", 7u64), ("ctr-b", 8), (".hidden", 9)] {
        fs::create_dir_all(dir.join(sub)).unwrap();
        let mut b = procstats::new_aggregate(id);
        b[24..32].copy_from_slice(&1u64.to_le_bytes()); // smcd_client
        fs::write(dir.join(sub).join(procstats::aggregate_name(id)), b).unwrap();
    }
    let s = scan_procs(&dir);
    assert_eq!(s.exited_aggregates, 2);
    assert_eq!(s.sum(Some(&[7].into())).0.get("smcd_client"), 1);
    assert_eq!(s.sum(Some(&[8].into())).0.get("smcd_client"), 1);
    assert_eq!(s.sum(None).0.get("smcd_client"), 2);
    fs::remove_dir_all(&dir).unwrap();
}
