//! The transparent data path end to end: real programs under the interposition library in an
//! attached cgroup, a real loopback-ism daemon, real eBPF negotiation. Every test checks with
//! the per-process statistics of the library that the bytes really went through shared
//! memory (or, for the fallback tests, that they did not), and compares SHA-256 of both ends.
//!
//! Needs root (cgroups, eBPF). `cargo xtask test` builds smc-ctl, the library and the test
//! programs first.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{
    bin, counters, daemon_command, delta, http_server_args, line_fields, lock, preload_lib,
    require_root, spawn_piped, spawn_ready, start_daemon, test_cgroup, unique, Attached, Cgroup,
    Daemon, Proc,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One test's world: an attached cgroup, a private daemon, a stats directory.
struct World {
    _lock: integration_tests::TestLock,
    cg: Cgroup,
    _att: Attached,
    _daemon: Daemon,
    dir: PathBuf,
    sock: PathBuf,
}

impl World {
    fn new() -> World {
        require_root();
        let lock = lock();
        let cg = test_cgroup();
        let att = Attached::new(&cg, "ism");
        let dir = Path::new("/run/smc").join(unique("preload-test-"));
        std::fs::create_dir_all(dir.join("procs")).unwrap();
        let sock = dir.join("ctl.sock");
        let mut dc = daemon_command(&sock, &dir);
        // Where a client of another uid gets its own `uid-<n>` directory.
        dc.arg("--procs-dir").arg(dir.join("procs"));
        let daemon = start_daemon(dc, &sock, &dir.join("daemon.log"));
        World {
            _lock: lock,
            cg,
            _att: att,
            _daemon: daemon,
            dir,
            sock,
        }
    }

    /// `program` with the library, inside the attached cgroup.
    fn smc(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = self.cg.command(program);
        self.env(&mut c);
        c
    }

    /// `program` with the library but outside any attached cgroup.
    fn lib_only(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        self.env(&mut c);
        c
    }

    fn env(&self, c: &mut Command) {
        c.env("LD_PRELOAD", preload_lib())
            .env("SMC_CTL_SOCK", &self.sock)
            .env("SMC_PROCS_DIR", self.dir.join("procs"))
            .env("SMC_STATS_KEEP", "1");
    }

    /// Sum of every process's statistics.
    fn stats(&self) -> BTreeMap<String, u64> {
        let mut sum = BTreeMap::new();
        let top = self.dir.join("procs");
        let mut files = Vec::new();
        for e in std::fs::read_dir(&top).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                // A uid's own directory (a process that is not root).
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            } else {
                files.push(p);
            }
        }
        for f in files {
            let b = std::fs::read(f).unwrap();
            if let Some(v) = parse_stats(&b) {
                for (k, n) in v {
                    if k != "pid" {
                        let e = sum.entry(k).or_insert(0u64);
                        *e = e.wrapping_add(n);
                    }
                }
            }
        }
        sum
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The layout documented in smc-preload/src/stats.rs.
fn parse_stats(b: &[u8]) -> Option<Vec<(String, u64)>> {
    if b.len() < 424 {
        return None;
    }
    let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    if w(0) != 0x534d_4350_5354_4154 || w(1) != 1 {
        return None;
    }
    let names = [
        "pid",
        "smcd_client",
        "smcd_server",
        "fallback_client",
        "fallback_server",
        "handshake_errors",
        "rx_bytes",
        "tx_bytes",
        "rx_calls",
        "tx_calls",
        "rx_buffer_full",
        "tx_buffer_full",
        "closed_conns",
        "special_sendfile",
        "special_splice",
        "special_oob",
        "pending_connects",
        "doorbells_sent",
        "doorbells_received",
    ];
    let mut out: Vec<(String, u64)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.to_string(), w(i + 2)))
        .collect();
    for r in 0..16 {
        let code = w(21 + 2 * r);
        if code != 0 {
            out.push((format!("fallback_{code:#010x}"), w(22 + 2 * r)));
        }
    }
    Some(out)
}

fn get(s: &BTreeMap<String, u64>, k: &str) -> u64 {
    s.get(k).copied().unwrap_or(0)
}

fn client(
    w: &World,
    with_lib_in_cg: bool,
    port: u16,
    send: u64,
    recv: u64,
    seed: u64,
) -> BTreeMap<String, String> {
    let prog = bin("preload-prog");
    let mut c = if with_lib_in_cg {
        w.smc(&prog)
    } else {
        Command::new(&prog)
    };
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        &send.to_string(),
        &recv.to_string(),
        &seed.to_string(),
    ]);
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(300))
        .unwrap();
    let f = line_fields(&out, "CLIENT ");
    assert_eq!(f.len(), 1, "client output: {out}");
    f[0].clone()
}

/// The server's CONN lines; on an error, the failure shows what the world's statistics say
/// (fallback reasons, handshake errors) and the client's figures.
fn server_lines(w: &World, p: Proc, client: &dyn std::fmt::Debug) -> Vec<BTreeMap<String, String>> {
    let out = p.wait_output(Duration::from_secs(300)).unwrap();
    assert!(
        !out.contains("ERR"),
        "server: {out}\nclient: {client:?}\nstatistics: {:?}",
        w.stats()
    );
    line_fields(&out, "CONN ")
}

fn check_pair(c: &BTreeMap<String, String>, s: &BTreeMap<String, String>) {
    assert_eq!(c["tx"], s["rx"], "bytes client->server");
    assert_eq!(c["sha_tx"], s["sha_rx"], "SHA-256 client->server");
    assert_eq!(s["tx"], c["rx"], "bytes server->client");
    assert_eq!(s["sha_tx"], c["sha_rx"], "SHA-256 server->client");
}

/// [`check_pair`] of each client with the server connection that received its stream.
fn check_pairs(cs: &[BTreeMap<String, String>], s: &[BTreeMap<String, String>]) {
    for c in cs {
        let m = s
            .iter()
            .find(|x| x["sha_rx"] == c["sha_tx"])
            .expect("matching server conn");
        check_pair(c, m);
    }
}

#[test]
fn preload_integrity_1gib_both_directions() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["server", "0", "thread", "1"]);
        c
    });
    let gib = 1u64 << 30;
    let c = client(&w, true, port, gib, gib / 2 + 12345, 7);
    let s = server_lines(&w, srv, &c);
    assert_eq!(s.len(), 1);
    check_pair(&c, &s[0]);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_client"), 1, "{st:?}");
    assert_eq!(get(&st, "smcd_server"), 1, "{st:?}");
    assert!(get(&st, "rx_bytes") >= gib + gib / 2, "{st:?}");
    assert_eq!(
        get(&st, "fallback_client") + get(&st, "fallback_server"),
        0,
        "{st:?}"
    );
}

#[test]
fn preload_fork_per_connection_server() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["server", "0", "fork", "4"]);
        c
    });
    let mut cs = Vec::new();
    for i in 0..4u64 {
        cs.push(client(
            &w,
            true,
            port,
            3_000_000 + i * 777_777,
            5_000_000 - i * 333,
            100 + i,
        ));
    }
    let s = server_lines(&w, srv, &cs);
    assert_eq!(s.len(), 4, "{s:?}");
    check_pairs(&cs, &s);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_client"), 4, "{st:?}");
    assert_eq!(get(&st, "smcd_server"), 4, "{st:?}");
}

#[test]
fn preload_epoll_edge_triggered_server_many_clients() {
    let w = World::new();
    let n = 8;
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["server", "0", "epoll", &n.to_string()]);
        c
    });
    let hs: Vec<_> = (0..n as u64)
        .map(|i| {
            let prog = bin("preload-prog");
            let mut c = w.smc(&prog);
            c.args([
                "client",
                "127.0.0.1",
                &port.to_string(),
                &(2_000_000 + i * 100_003).to_string(),
                &(4_000_000 - i * 7).to_string(),
                &(1000 + i).to_string(),
            ]);
            spawn_piped(c)
        })
        .collect();
    let cs: Vec<_> = hs
        .into_iter()
        .map(|p| {
            let out = p.wait_output(Duration::from_secs(120)).unwrap();
            line_fields(&out, "CLIENT ")[0].clone()
        })
        .collect();
    let s = server_lines(&w, srv, &cs);
    assert_eq!(s.len(), n);
    check_pairs(&cs, &s);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_server"), n as u64, "{st:?}");
}

#[test]
fn preload_fallback_client_without_library() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["server", "0", "poll", "1"]);
        c
    });
    // A client in the cgroup but without the library never announces SMC.
    let prog = bin("preload-prog");
    let mut c = w.cg.command(&prog);
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        "3000000",
        "2000000",
        "9",
    ]);
    let out = spawn_piped(c).wait_output(Duration::from_secs(60)).unwrap();
    let cl = line_fields(&out, "CLIENT ")[0].clone();
    let s = server_lines(&w, srv, &cl);
    check_pair(&cl, &s[0]);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_server"), 0, "{st:?}");
    assert_eq!(get(&st, "fallback_server"), 1, "{st:?}");
    assert_eq!(get(&st, "fallback_0x03010000"), 1, "PEERNOSMC: {st:?}");
}

#[test]
fn preload_fallback_server_without_library() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.cg.command(bin("preload-prog"));
        c.args(["server", "0", "thread", "1"]);
        c
    });
    let before = counters();
    let cl = client(&w, true, port, 2_500_000, 1_500_000, 11);
    let s = server_lines(&w, srv, &cl);
    check_pair(&cl, &s[0]);
    // Only one end announced SMC: the socket never enters the SOCKHASH (its blocking reads
    // are the kernel's plain TCP ones).
    assert_eq!(delta(&before, &counters(), "shortcut_sockets"), 0);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_client"), 0, "{st:?}");
    assert_eq!(get(&st, "fallback_0x03010000"), 1, "PEERNOSMC: {st:?}");
}

/// Both ends announce SMC but the server has no device (its daemon is unreachable): it
/// declines, both continue on TCP, and both sockets leave the SOCKHASH again (a sockmap member
/// reads through tcp_bpf, which can return EAGAIN to a blocking reader at the FIN).
#[test]
fn preload_declined_connection_leaves_the_sockhash_and_stays_intact() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.env("SMC_CTL_SOCK", w.dir.join("no-daemon.sock"));
        c.args(["server", "0", "thread", "12"]);
        c
    });
    let before = counters();
    // Many short connections: each server thread's first (blocking) read starts right after
    // the decline, while its socket is still a sockmap member.
    let cs: Vec<_> = (0..12u64)
        .map(|i| client(&w, true, port, 200_000 + i * 99_991, 100_000 + i, 30 + i))
        .collect();
    let s = server_lines(&w, srv, &cs);
    assert_eq!(s.len(), 12);
    check_pairs(&cs, &s);
    let after = counters();
    assert_eq!(delta(&before, &after, "shortcut_sockets"), 24);
    // The server ends (no daemon) leave the SOCKHASH at their next outgoing segment, which the
    // programs count; the client ends are taken out by their daemon at the fallback (not
    // counted there), unless a segment of theirs went first.
    let left = delta(&before, &after, "shortcut_sockets_left");
    assert!((12..=24).contains(&left), "shortcut_sockets_left {left}");
    let st = w.stats();
    assert_eq!(
        get(&st, "smcd_client") + get(&st, "smcd_server"),
        0,
        "{st:?}"
    );
    assert_eq!(get(&st, "fallback_client"), 12, "{st:?}");
    assert_eq!(get(&st, "fallback_server"), 12, "{st:?}");
}

#[test]
fn preload_library_outside_attached_cgroup_is_plain_tcp() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.lib_only(bin("preload-prog"));
        c.args(["server", "0", "thread", "1"]);
        c
    });
    let prog = bin("preload-prog");
    let mut c = w.lib_only(&prog);
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        "1000000",
        "1000000",
        "3",
    ]);
    let out = spawn_piped(c).wait_output(Duration::from_secs(60)).unwrap();
    let cl = line_fields(&out, "CLIENT ")[0].clone();
    let s = server_lines(&w, srv, &cl);
    check_pair(&cl, &s[0]);
    let st = w.stats();
    assert_eq!(
        get(&st, "smcd_client") + get(&st, "smcd_server"),
        0,
        "{st:?}"
    );
}

#[test]
fn preload_peer_killed_mid_transfer_is_eof_not_hang() {
    let w = World::new();
    let (mut srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["source", "0"]);
        c
    });
    let prog = bin("preload-prog");
    let mut c = w.smc(&prog);
    c.args(["sink", "127.0.0.1", &port.to_string()]);
    let sink = spawn_piped(c);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: plain kill of our child.
    unsafe { libc::kill(srv.0.id() as i32, libc::SIGKILL) };
    let _ = srv.0.wait();
    let out = sink
        .wait_output(Duration::from_secs(20))
        .expect("sink must finish, not hang");
    assert!(
        out.starts_with("SINK EOF") || out.starts_with("SINK ERR 104"),
        "{out}"
    );
    let st = w.stats();
    assert_eq!(get(&st, "smcd_client"), 1, "{st:?}");
}

#[test]
fn preload_reader_killed_writer_gets_epipe() {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["source", "0"]);
        c
    });
    let prog = bin("preload-prog");
    let mut c = w.smc(&prog);
    c.args(["sink", "127.0.0.1", &port.to_string()]);
    let mut sink = spawn_piped(c);
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: plain kill of our child.
    unsafe { libc::kill(sink.0.id() as i32, libc::SIGKILL) };
    let _ = sink.0.wait();
    // Rust ignores SIGPIPE: the writer sees EPIPE (32) or ECONNRESET (104).
    let out = srv
        .wait_output(Duration::from_secs(20))
        .expect("source must finish");
    assert!(
        out.contains("SOURCE ERR 32") || out.contains("SOURCE ERR 104"),
        "{out}"
    );
}

#[test]
fn preload_curl_against_python_http_server() {
    if Command::new("python3").arg("--version").output().is_err()
        || Command::new("curl").arg("--version").output().is_err()
    {
        panic!("python3 and curl are needed (apt-get install python3 curl)");
    }
    let w = World::new();
    let root = w.dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    let body: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(root.join("blob.bin"), &body).unwrap();
    let port = 20000 + (std::process::id() % 20000) as u16;
    let mut c = w.smc("python3");
    http_server_args(&mut c, "127.0.0.1", port, &root);
    let _srv = spawn_piped(c);
    let out_file = w.dir.join("got.bin");
    let t = Instant::now();
    loop {
        let mut c = w.smc("curl");
        c.args(["-sf", "-o"])
            .arg(&out_file)
            .arg(format!("http://127.0.0.1:{port}/blob.bin"));
        let st = c.status().unwrap();
        if st.success() {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "curl never succeeded"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(std::fs::read(&out_file).unwrap(), body);
    let st = w.stats();
    assert!(get(&st, "smcd_client") >= 1, "{st:?}");
    assert!(get(&st, "smcd_server") >= 1, "{st:?}");
}

#[test]
fn preload_exec_with_inherited_smc_socket_never_reads_doorbells() {
    exec_with_inherited_smc_socket(false);
}

/// The same for a server that is not root (the daemon hands the connection to the new image
/// of the same uid, cgroup and pid namespace).
#[test]
fn preload_exec_with_inherited_smc_socket_never_reads_doorbells_not_root() {
    exec_with_inherited_smc_socket(true);
}

fn exec_with_inherited_smc_socket(not_root: bool) {
    let w = World::new();
    let (srv, port) = spawn_ready({
        let mut c = w.smc(bin("preload-prog"));
        c.args(["exec-server", "0"]);
        if not_root {
            integration_tests::as_user(&mut c, integration_tests::nobody());
        }
        c
    });
    let prog = bin("preload-prog");
    let mut c = w.smc(&prog);
    c.args(["client", "127.0.0.1", &port.to_string(), "100000", "0", "5"]);
    let cl = spawn_piped(c);
    let out = srv.wait_output(Duration::from_secs(30)).unwrap();
    // The new image adopts the connection (the daemon kept its DMBs and local state page):
    // it reads the client's 16-byte header and 100 000 bytes, then EOF, as over TCP — never
    // the doorbell bytes of the TCP socket as data.
    assert!(out.contains("READFD total=100016 err=0"), "{out}");
    drop(cl);
    let st = w.stats();
    assert_eq!(get(&st, "smcd_server"), 1, "{st:?}");
}
