//! The data path's statistics files against a hostile local user (issue 12 items 2 and 6, issue
//! 10 item 7). Every attack runs as an unprivileged process (uid `nobody`, in a cgroup of its
//! own) against processes of root and of `nobody` running under `smc-ctl run` in an attached
//! cgroup, with this test's own daemon and statistics directory:
//!
//! - a foreign uid that opens and `flock`s everything it can under the statistics directory
//!   blocks neither an exiting process nor `smc-ctl stats`, and can truncate nothing;
//! - FIFOs, symbolic links to `/dev/zero` and huge files planted where the readers look are
//!   skipped with a warning, and `stats` / `conns` complete;
//! - a process of a non-root uid is counted (live, exited, and SIGKILLed), in a directory no
//!   other uid can write or lock.
//!
//! No timing is asserted: "does not hang" is a generous bound on each program's run.
//!
//! Needs root (cgroups, eBPF, setuid). Run with `cargo xtask test --no-fuzz hostile_stats`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{
    as_user, bin, nobody, ready_port, run_to_end, spawn_piped, test_cgroup, Cgroup, Finished, Proc,
    SmcWorld,
};
use serde_json::Value;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Bound of every program's run: far beyond what each needs, short of a hang.
const T: Duration = Duration::from_secs(60);

/// `preload-prog server 0 thread CONNS` under `smc-ctl run` in the world's attached cgroup, as
/// `user` (root when `None`), without `SMC_STATS_KEEP` (what a user runs): its port.
fn server(w: &SmcWorld, user: Option<(u32, u32)>, conns: u32) -> (Proc, u16) {
    let mut c = w.run(bin("preload-prog"));
    c.args(["server", "0", "thread", &conns.to_string()])
        .env_remove("SMC_STATS_KEEP");
    if let Some(u) = user {
        as_user(&mut c, u);
    }
    let mut p = spawn_piped(c);
    let port = ready_port(&mut p);
    (p, port)
}

/// One client connection to `port` under `smc-ctl run`, run to its end (bounded).
fn client(w: &SmcWorld, user: Option<(u32, u32)>, port: u16, seed: u32) -> Finished {
    let mut c = w.run(bin("preload-prog"));
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        "300000",
        "200000",
        &seed.to_string(),
    ])
    .env_remove("SMC_STATS_KEEP");
    if let Some(u) = user {
        as_user(&mut c, u);
    }
    let f = run_to_end(c, &w.subdir("logs"), None, T).ok();
    assert!(
        f.text().contains("CLIENT rx=200000 "),
        "client output: {}",
        f.text()
    );
    f
}

/// A client/server pair of one connection, both exited.
fn pair(w: &SmcWorld, user: Option<(u32, u32)>, seed: u32) {
    let (srv, port) = server(w, user, 1);
    client(w, user, port, seed);
    srv.wait_output(T).expect("server");
}

/// `smc-ctl stats json -a` (bounded): the figures and the warnings it printed.
fn stats_json(w: &SmcWorld) -> (Value, String) {
    let mut c = Command::new(bin("smc-ctl"));
    c.args(["stats", "json", "-a", "--socket"])
        .arg(&w.sock)
        .arg("--procs-dir")
        .arg(w.dir.join("procs"))
        .arg("--baseline")
        .arg(w.dir.join("baseline.json"));
    let f = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let v = serde_json::from_slice(&f.stdout).expect("smc-ctl stats json output");
    (v, f.stderr)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

fn smcd(v: &Value) -> (u64, u64) {
    let c = &v["connections"];
    (u(&c["smcd_client"]), u(&c["smcd_server"]))
}

/// A Python program run as `nobody` in a cgroup of its own, started with the statistics
/// directory as its argument.
fn attacker(w: &SmcWorld, cg: &Cgroup, script: &str, extra: &[&Path]) -> Proc {
    // The system's interpreter: one found through root's PATH (pyenv shims under /root) is not
    // executable by nobody.
    let python = Path::new("/usr/bin/python3");
    assert!(
        python.exists(),
        "/usr/bin/python3 is missing (apt-get install -y python3)"
    );
    let mut c = cg.command(python);
    c.arg("-c").arg(script).arg(w.dir.join("procs"));
    c.args(extra);
    c.stdin(Stdio::null());
    as_user(&mut c, nobody());
    spawn_piped(c)
}

/// Opens and `flock`s (exclusively, non-blocking) every file and directory it can under the
/// tree, truncates every file it does not own, creates `.lock` and a pid-named file in every
/// directory it does not own; re-scans every 10 ms so that files made later are held too.
/// Prints `READY` after the first pass, and a JSON report once the file argv[2] exists.
const HOLD_EVERYTHING: &str = r#"
import fcntl, json, os, sys, time
top, stop = sys.argv[1], sys.argv[2]
me = os.getuid()
held, locked, truncated, created = {}, set(), set(), set()
def grab(p):
    if p in held:
        return
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return
    held[p] = fd
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        locked.add(p)
    except OSError:
        pass
def walk(d):
    grab(d)
    try:
        names = os.listdir(d)
        mine = os.lstat(d).st_uid == me
    except OSError:
        return
    for n in names:
        p = os.path.join(d, n)
        try:
            st = os.lstat(p)
        except OSError:
            continue
        if os.path.isdir(p) and not os.path.islink(p):
            walk(p)
            continue
        grab(p)
        if st.st_uid != me:
            for how in (lambda: os.truncate(p, 0), lambda: os.close(os.open(p, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW))):
                try:
                    how()
                    truncated.add(p)
                except OSError:
                    pass
    if not mine:
        for n in (".lock", "4000000"):
            try:
                fd = os.open(os.path.join(d, n), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
                grab(os.path.join(d, n))
                os.close(fd)
                created.add(os.path.join(d, n))
            except OSError:
                pass
walk(top)
print("READY", flush=True)
while not os.path.exists(stop):
    walk(top)
    time.sleep(0.01)
walk(top)
print(json.dumps({"held": sorted(held), "locked": sorted(locked),
                  "truncated": sorted(truncated), "created": sorted(created)}), flush=True)
"#;

/// Plants, in every directory of the tree it can write to, a FIFO and a symbolic link to
/// /dev/zero under a pid name and an aggregate name each, a huge sparse file under a pid name,
/// and replaces `.lock` by a FIFO; tries the same in the directories it cannot write to.
/// Prints a JSON report: what it planted, what was refused.
const PLANT: &str = r#"
import json, os, sys
top = sys.argv[1]
planted, refused = [], []
def plant(d):
    def do(name, f):
        p = os.path.join(d, name)
        try:
            f(p)
            planted.append(p)
        except OSError as e:
            refused.append(p + ": " + e.strerror)
    def huge(p):
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, 8 << 30)
        os.close(fd)
    def fifo_lock(p):
        if os.path.lexists(p):
            os.unlink(p)
        os.mkfifo(p)
    do("4000001", os.mkfifo)
    do("exited-4000002", os.mkfifo)
    do("4000003", lambda p: os.symlink("/dev/zero", p))
    do("exited-4000004", lambda p: os.symlink("/dev/zero", p))
    do("4000005", huge)
    do(".lock", fifo_lock)
plant(top)
for n in sorted(os.listdir(top)):
    p = os.path.join(top, n)
    if os.path.isdir(p) and not os.path.islink(p):
        plant(p)
print(json.dumps({"planted": planted, "refused": refused}), flush=True)
"#;

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().expect("string").to_owned())
        .collect()
}

/// The `uid-<uid>` directory of the world.
fn uid_dir(w: &SmcWorld, uid: u32) -> PathBuf {
    w.dir.join("procs").join(format!("uid-{uid}"))
}

/// (a) `nobody` opens and locks every file it can under the statistics directory and keeps
/// them: a root process under `smc-ctl run` still exits, and `smc-ctl stats` still completes
/// with every connection counted. Before the fix (a 0644 `.lock` in the shared directory) the
/// exiting client hung in `flock` for as long as `nobody` held it.
#[test]
fn foreign_locks_block_no_exit_and_no_reader() {
    let w = SmcWorld::new();
    let nb = nobody();
    // Earlier runs of root and of nobody: the lock files and aggregates exist.
    pair(&w, None, 1);
    pair(&w, Some(nb), 2);
    let (srv, port) = server(&w, None, 1);
    let other = test_cgroup();
    let stop = w.dir.join("stop-attacker");
    let mut att = attacker(&w, &other, HOLD_EVERYTHING, &[&stop]);
    assert_eq!(att.read_line(), "READY", "the attacker did not start");

    // The victim: a root client exits (its file is folded at exit), the server too.
    client(&w, None, port, 3);
    srv.wait_output(T).expect("root server under smc-ctl run");
    let (v, warnings) = stats_json(&w);
    assert_eq!(smcd(&v), (3, 3), "every connection counted: {v:#}");
    assert_eq!(u(&v["sources"]["live_processes"]), 0, "{v:#}");

    std::fs::write(&stop, b"").unwrap();
    let report: Value =
        serde_json::from_str(&att.read_line()).expect("attacker report (JSON line)");
    drop(att);
    let own = uid_dir(&w, nb.0);
    let locked = strings(&report["locked"]);
    assert!(
        !locked.is_empty(),
        "the attacker locked nothing at all (not even its own files): {report:#}"
    );
    // Locks on statistics files and directories are harmless (nobody takes them); a lock file
    // of another uid's directory is what must be out of reach.
    let foreign: Vec<&String> = locked
        .iter()
        .filter(|p| p.ends_with("/.lock") && !Path::new(p).starts_with(&own))
        .collect();
    assert!(
        foreign.is_empty(),
        "nobody could lock another uid's lock file: {foreign:?}"
    );
    assert!(
        strings(&report["truncated"]).is_empty(),
        "nobody truncated files of other uids: {report:#}"
    );
    assert!(
        strings(&report["created"]).is_empty(),
        "nobody created files in other uids' directories: {report:#}"
    );
    // It held its own directory's lock: the reader went on without it and said so.
    if locked.iter().any(|p| Path::new(p) == own.join(".lock")) {
        assert!(
            warnings.contains("read without folding"),
            "no warning about the busy lock of {}: {warnings}",
            own.display()
        );
    }
}

/// (b) `nobody` plants FIFOs, symbolic links to /dev/zero and a huge sparse file where the
/// readers look (it can only do so in its own directory) and replaces its lock by a FIFO:
/// `smc-ctl stats` and `smc-ctl conns` complete, skip each with a warning, and still count the
/// real connections.
#[test]
fn planted_fifo_symlink_and_huge_file_are_skipped() {
    let w = SmcWorld::new();
    let nb = nobody();
    pair(&w, None, 1);
    pair(&w, Some(nb), 2);
    let other = test_cgroup();
    let att = attacker(&w, &other, PLANT, &[]);
    let out = att.wait_output(T).expect("planting attacker");
    let report: Value = serde_json::from_str(out.trim()).expect("attacker report");
    let planted = strings(&report["planted"]);
    let own = uid_dir(&w, nb.0);
    // Only in its own directory; the root-owned top directory refused every entry.
    assert!(
        planted.iter().all(|p| Path::new(p).starts_with(&own)),
        "nobody planted outside its own directory: {report:#}"
    );
    assert_eq!(planted.len(), 6, "{report:#}");
    let refused = strings(&report["refused"]);
    assert!(
        refused.iter().any(|r| r.contains("/procs/4000001:")),
        "{report:#}"
    );

    let (v, warnings) = stats_json(&w);
    assert_eq!(smcd(&v), (2, 2), "the real connections still count: {v:#}");
    for name in [
        "4000001",
        "exited-4000002",
        "4000003",
        "exited-4000004",
        "4000005",
    ] {
        let p = own.join(name);
        assert!(
            warnings.contains(&format!("ignored {}:", p.display())),
            "no warning about {}: {warnings}",
            p.display()
        );
    }
    assert!(warnings.contains("a FIFO"), "{warnings}");
    assert!(warnings.contains("symbolic link"), "{warnings}");
    assert!(
        warnings.contains("more than a statistics file"),
        "{warnings}"
    );
    assert!(warnings.contains("lock file refused"), "{warnings}");

    let mut c = Command::new(bin("smc-ctl"));
    c.args(["conns", "--json", "--socket"])
        .arg(&w.sock)
        .arg("--procs-dir")
        .arg(w.dir.join("procs"));
    // `conns` completes; it reads only the files of the processes it lists, so the planted
    // entries (no such process) are not even opened.
    let f = run_to_end(c, &w.subdir("logs"), None, T).ok();
    assert!(!f.stderr.contains("4000001"), "{}", f.stderr);
}

/// (c) A process of a non-root uid is counted: `nobody` runs a client/server pair under
/// `smc-ctl run` in the attached cgroup. Its files live in `uid-<uid>`, which the daemon made
/// and only that uid (and root) can write; the figures of its exited client, of its server
/// killed with SIGKILL (folded by root, the aggregate stays the uid's) and of a later pair all
/// count. Before the fix none of them did (`smc-ctl stats` counted 0 SMC-D connections).
#[test]
fn non_root_processes_are_counted() {
    let w = SmcWorld::new();
    let nb = nobody();
    let (mut srv, port) = server(&w, Some(nb), 2);
    client(&w, Some(nb), port, 1);
    let (v, _) = stats_json(&w);
    assert_eq!(smcd(&v), (1, 1), "nobody's connection: {v:#}");
    assert_eq!(u(&v["sources"]["live_processes"]), 1, "the server: {v:#}");

    let dir = uid_dir(&w, nb.0);
    let md = std::fs::symlink_metadata(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(md.is_dir(), "{}", dir.display());
    assert_eq!(md.uid(), nb.0, "{} owner", dir.display());
    assert_eq!(md.permissions().mode() & 0o7777, 0o755);
    let top = std::fs::metadata(w.dir.join("procs")).unwrap();
    assert_eq!(
        top.permissions().mode() & 0o022,
        0,
        "top directory writable by others"
    );
    let file = dir.join(srv.0.id().to_string());
    let md = std::fs::symlink_metadata(&file)
        .unwrap_or_else(|e| panic!("the server's file {}: {e}", file.display()));
    assert_eq!((md.uid(), md.permissions().mode() & 0o7777), (nb.0, 0o644));
    let lock = std::fs::symlink_metadata(dir.join(".lock")).expect("the uid's lock file");
    assert_eq!(
        (lock.uid(), lock.permissions().mode() & 0o7777),
        (nb.0, 0o600)
    );

    // SIGKILL: the file stays; root folds it into the uid's aggregate, which stays the uid's.
    srv.0.kill().unwrap();
    srv.0.wait().unwrap();
    let (v, _) = stats_json(&w);
    assert_eq!(smcd(&v), (1, 1), "after SIGKILL: {v:#}");
    assert_eq!(u(&v["sources"]["live_processes"]), 0, "{v:#}");
    assert!(!file.exists(), "the killed server's file was not folded");
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let md = e.metadata().unwrap();
        assert_eq!(md.uid(), nb.0, "{} is not the uid's", e.path().display());
    }

    // The uid's next processes still write and fold (nothing root left is in their way).
    pair(&w, Some(nb), 2);
    let (v, _) = stats_json(&w);
    assert_eq!(smcd(&v), (2, 2), "{v:#}");
    assert_eq!(u(&v["sources"]["live_processes"]), 0, "{v:#}");
    let files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert!(
        files.iter().all(|n| n.starts_with("exited-")),
        "files of exited processes left behind: {files:?}"
    );
}

/// Plants, in its own `uid-<uid>` directory: (1) a copy of a root process's file under that
/// process's pid, its figures and its connection records' byte counts inflated; (2) an
/// aggregate claiming a million SMC-D connections for the victim's cgroup; (3) N files of the
/// largest accepted size, each with a full connection table, claiming pids of another PID
/// namespace (which a reader cannot see directly). argv: top, victim pid, victim cgroup id, N.
const PLANT_CLAIMS: &str = r#"
import os, struct, sys, json
top, victim, cg, n, port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
own = os.path.join(top, "uid-%d" % os.getuid())
def w64(b, off, v): b[off:off + 8] = struct.pack("<Q", v)
peer = None
for l in open("/proc/net/tcp").read().splitlines()[1:]:
    f = l.split()
    if f[1] == "0100007F:%04X" % port and f[3] == "01":
        peer = int(f[2].split(":")[1], 16)
lo = int.from_bytes(bytes([0, 0, 0xff, 0xff, 127, 0, 0, 1]), "little")
rec = bytearray(128)
for i, v in enumerate([2, 2 | 1 << 8 | 5 << 32, port << 32 | (peer or 0) << 48, 0, lo, 0, lo,
                       0x1111, 0x2222, 65536 | 65536 << 32, 999999999, 999999999, 1]):
    w64(rec, i * 8, v)
b = bytearray(open(os.path.join(top, victim), "rb").read()[:4096])
w64(b, 24, 1000000); w64(b, 32, 1000000)
w64(b, 456, struct.unpack_from("<Q", b, 456)[0] | 1 << 6)
w64(b, 1296, 1); w64(b, 1304, 4096); w64(b, 1312, 128)
with open(os.path.join(own, victim), "wb") as f: f.write(bytes(b) + bytes(rec))
a = bytearray(b)
for o in range(16, 424, 8): w64(a, o, 0)
w64(a, 24, 5000000); w64(a, 32, 5000000); w64(a, 432, cg); w64(a, 448, 1); w64(a, 1296, 0)
with open(os.path.join(own, "exited-%d" % cg), "wb") as f: f.write(a)
big = bytearray(b)
w64(big, 1296, 8192); w64(big, 1320, 1)
table = bytes(rec) * 8192
for i in range(n):
    w64(big, 16, 300000 + i); w64(big, 440, 1)
    with open(os.path.join(own, str(300000 + i)), "wb") as f: f.write(bytes(big) + table)
print(json.dumps({"peer": peer, "files": n + 2}), flush=True)
"#;

/// Runs `smc-ctl ARGS` under `/usr/bin/time`: its output, warnings and peak RSS in KiB.
fn ctl_measured<S: AsRef<std::ffi::OsStr> + std::fmt::Debug>(args: &[S]) -> (String, String, u64) {
    let mut c = Command::new("/usr/bin/time");
    c.args(["-f", "MAXRSS_KB %M"])
        .arg(bin("smc-ctl"))
        .args(args);
    let out = c
        .output()
        .expect("/usr/bin/time smc-ctl (apt-get install -y time)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "smc-ctl {args:?}: {stderr}");
    let rss = stderr
        .lines()
        .find_map(|l| l.strip_prefix("MAXRSS_KB "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no peak RSS in {stderr}"));
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
        rss,
    )
}

/// (d) What `nobody` writes in its own directory claims nothing of others: a copy of a root
/// process's file under that process's pid, an aggregate of the root process's cgroup and 200
/// files of another PID namespace with full connection tables (200 MiB). `smc-ctl stats
/// --cgroup` of the victim counts only the victim's figures, `smc-ctl conns` shows the root
/// process's own record, and neither reads what it does not need: their peak memory stays
/// far below the planted bytes (before the fix, every file of a foreign PID namespace counted
/// as a running process and `stats`/`conns` held all their tables: about 1 GB for 1000).
#[test]
fn planted_claims_count_for_nobody_else() {
    let w = SmcWorld::new();
    let nb = nobody();
    smc_stats::ensure_uid_dir(&w.dir.join("procs"), nb.0, nb.1).expect("nobody's directory");
    // A live SMC-D connection of root: `source` streams to `sink` until killed.
    let mut c = w.run(bin("preload-prog"));
    c.args(["source", "0"]).env_remove("SMC_STATS_KEEP");
    let mut srv = spawn_piped(c);
    let port = ready_port(&mut srv).to_string();
    let mut c = w.run(bin("preload-prog"));
    c.args(["sink", "127.0.0.1", &port])
        .env_remove("SMC_STATS_KEEP");
    let mut sink = spawn_piped(c);
    let spid = srv.0.id().to_string();
    let file = w.dir.join("procs").join(&spid);
    // Connected when the sink's process has made its SMC-D client connection.
    let t0 = std::time::Instant::now();
    while smcd(&stats_json(&w).0) != (1, 1) {
        assert!(
            t0.elapsed() < T,
            "no SMC-D connection: {}",
            stats_json(&w).1
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(file.exists(), "{}", file.display());
    let cg = std::fs::metadata(&w.cgroup().path).unwrap().ino();
    let cg_s = cg.to_string();
    let procs = w.dir.join("procs");
    let procs_s = procs.to_str().unwrap();
    let sock_s = w.sock.to_str().unwrap();
    let scope = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["stats", "json", "--socket", sock_s, "--procs-dir", procs_s]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let cg_path = w.cgroup().path.to_str().unwrap().to_owned();
    let (before, _, _) = ctl_measured(&scope(&["--cgroup", &cg_path]));
    let before: Value = serde_json::from_str(&before).expect("stats json");
    assert_eq!(smcd(&before), (1, 1), "the root pair: {before:#}");
    assert_eq!(u(&before["sources"]["live_processes"]), 2, "{before:#}");

    let other = test_cgroup();
    let mut c = other.command("/usr/bin/python3");
    c.arg("-c")
        .arg(PLANT_CLAIMS)
        .args([procs_s, &spid, &cg_s, "200", &port])
        .stdin(Stdio::null());
    as_user(&mut c, nb);
    let out = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let report: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).expect("attacker report");
    assert!(
        report["peer"].is_u64(),
        "the connection's peer port: {report}"
    );

    let (after, warnings, rss) = ctl_measured(&scope(&["--cgroup", &cg_path]));
    let after: Value = serde_json::from_str(&after).expect("stats json");
    assert_eq!(
        smcd(&after),
        (1, 1),
        "nobody's claims counted for root's cgroup: {after:#}\n{warnings}"
    );
    assert_eq!(u(&after["sources"]["live_processes"]), 2, "{after:#}");
    assert!(
        warnings.contains("counted as unattributed"),
        "no warning about the unattributed claims: {warnings}"
    );
    assert!(rss < 96 * 1024, "smc-ctl stats peaked at {rss} KiB");
    // The host's totals still hold nobody's own (false) figures: a uid can always lie about
    // itself, not about others.
    let (all, _, _) = ctl_measured(&scope(&["-a"]));
    let all: Value = serde_json::from_str(&all).expect("stats json");
    assert!(
        smcd(&all).0 >= 1_000_000,
        "nobody's figures vanished: {all:#}"
    );

    let (conns, warnings, rss) = ctl_measured(&[
        "conns",
        "--json",
        "-d",
        "--socket",
        sock_s,
        "--procs-dir",
        procs_s,
    ]);
    assert!(
        rss < 96 * 1024,
        "smc-ctl conns peaked at {rss} KiB: {warnings}"
    );
    let conns: Value = serde_json::from_str(&conns).expect("conns json");
    let mine: Vec<&Value> = conns
        .as_array()
        .or_else(|| conns["connections"].as_array())
        .expect("connections")
        .iter()
        .filter(|c| c["pid"].as_u64() == Some(srv.0.id() as u64))
        .collect();
    assert!(
        !mine.is_empty(),
        "the server's connection is not listed: {conns:#}"
    );
    for c in mine {
        assert_ne!(c["source"], "record", "nobody's record shown: {c:#}");
        assert_ne!(
            c["rx_bytes"].as_u64(),
            Some(999_999_999),
            "nobody's record shown: {c:#}"
        );
    }
    sink.0.kill().unwrap();
    srv.0.kill().unwrap();
    let _ = sink.0.wait();
    let _ = srv.0.wait();
}
