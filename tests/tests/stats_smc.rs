//! `smc-ctl stats`, `smc-ctl conns` and the daemon's metrics endpoint against real runs: real
//! programs under the interposition library in attached cgroups, a real loopback-ism daemon,
//! real eBPF negotiation. The figures must match what the test did: N connections → N counted,
//! M bytes → M bytes, a forced decline → its reason, `reset` → zero, `json` ↔ `show`.
//!
//! Needs root. Build first into one target directory: `cargo build --release -p smc-ctl
//! -p smc-preload -p integration-tests --bins && cargo build --release -p smc-preload`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{
    bin, daemon_command, http_server_args, line_fields, lock, preload_lib, require_root,
    spawn_piped, spawn_ready, start_daemon, test_cgroup, unique, Attached, Cgroup, Daemon, Proc,
};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// One test's world: attached cgroups, a private daemon, a private stats directory and
/// baseline, so that other runs on the host do not disturb the figures.
struct World {
    _lock: integration_tests::TestLock,
    cgs: Vec<(Cgroup, Attached)>,
    daemon: Option<Daemon>,
    dir: PathBuf,
    sock: PathBuf,
    metrics: Option<String>,
}

impl World {
    fn new(modes: &[&str], metrics: bool) -> World {
        require_root();
        let lock = lock();
        let cgs = modes
            .iter()
            .map(|m| {
                let cg = test_cgroup();
                let a = Attached::new(&cg, m);
                (cg, a)
            })
            .collect();
        let dir = Path::new("/run/smc").join(unique("stats-test-"));
        std::fs::create_dir_all(dir.join("procs")).unwrap();
        let sock = dir.join("ctl.sock");
        let mut w = World {
            _lock: lock,
            cgs,
            daemon: None,
            dir,
            sock,
            metrics: None,
        };
        let addr = metrics.then(|| {
            // A free local port.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().to_string()
        });
        w.start_daemon(addr.as_deref());
        w.metrics = addr;
        w
    }

    fn start_daemon(&mut self, metrics: Option<&str>) {
        let mut c = daemon_command(&self.sock, &self.dir);
        c.arg("--procs-dir").arg(self.dir.join("procs"));
        if let Some(a) = metrics {
            c.args(["--metrics", a]);
        }
        self.daemon = Some(start_daemon(c, &self.sock, &self.dir.join("daemon.log")));
    }

    fn cg(&self, i: usize) -> &Cgroup {
        &self.cgs[i].0
    }

    fn env(&self, c: &mut Command, keep: bool) {
        c.env("SMC_CTL_SOCK", &self.sock)
            .env("SMC_PROCS_DIR", self.dir.join("procs"));
        if keep {
            c.env("SMC_STATS_KEEP", "1");
        } else {
            c.env_remove("SMC_STATS_KEEP");
        }
    }

    /// `preload-prog ARGS` in cgroup `i`, with the library or without.
    fn prog(&self, i: usize, lib: bool, args: &[&str]) -> Command {
        let mut c = self.cg(i).command(bin("preload-prog"));
        c.args(args);
        if lib {
            c.env("LD_PRELOAD", preload_lib());
        }
        self.env(&mut c, false);
        c
    }

    /// `smc-ctl ARGS` with this world's daemon, stats directory and baseline.
    fn ctl(&self, args: &[&str]) -> Output {
        let mut c = Command::new(bin("smc-ctl"));
        c.args(args);
        if args[0] == "stats" || args[0] == "conns" {
            c.arg("--socket")
                .arg(&self.sock)
                .arg("--procs-dir")
                .arg(self.dir.join("procs"));
        }
        if args[0] == "stats" {
            c.arg("--baseline").arg(self.dir.join("baseline.json"));
        }
        let out = c.output().expect("run smc-ctl");
        assert!(
            out.status.success(),
            "smc-ctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn stats_json(&self, extra: &[&str]) -> Value {
        let mut a = vec!["stats", "json"];
        a.extend_from_slice(extra);
        serde_json::from_slice(&self.ctl(&a).stdout).expect("stats json")
    }

    fn stats_text(&self, extra: &[&str]) -> String {
        let mut a = vec!["stats", "show", "-d"];
        a.extend_from_slice(extra);
        String::from_utf8(self.ctl(&a).stdout).unwrap()
    }

    fn conns(&self, extra: &[&str]) -> Vec<Value> {
        let mut a = vec!["conns", "--json"];
        a.extend_from_slice(extra);
        let v: Value = serde_json::from_slice(&self.ctl(&a).stdout).expect("conns json");
        v["connections"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for World {
    fn drop(&mut self) {
        self.daemon.take();
        // Processes first (Cgroup kills them), then the directory.
        self.cgs.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run_client(c: Command) -> BTreeMap<String, String> {
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(120))
        .unwrap();
    let f = line_fields(&out, "CLIENT ");
    assert_eq!(f.len(), 1, "client output: {out}");
    assert!(f[0].contains_key("rx"), "client output: {out}");
    f[0].clone()
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The number after `label` on the first line of `text` that starts (after spaces) with it.
fn text_num(text: &str, label: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label:?} in:\n{text}"));
    line.trim_start()[label.len()..]
        .split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number in {line:?}"))
}

/// The number after `label` in the section that starts with `section`.
fn section_num(text: &str, section: &str, label: &str) -> u64 {
    let at = text
        .find(&format!("\n{section}\n"))
        .unwrap_or_else(|| panic!("no section {section}"));
    text_num(&text[at..], label)
}

/// N SMC-D connections with known byte counts; `show` and `json` agree; `reset` zeroes;
/// connections after the reset are the only ones counted; `-a` shows everything.
#[test]
fn stats_counts_connections_bytes_and_reset() {
    let w = World::new(&["ism"], false);
    // Nothing has run yet in this world: everything is zero.
    let f0 = w.stats_json(&[]);
    assert_eq!(u(&f0["connections"]["total"]), 0, "{f0}");

    let n = 3u64;
    let sizes: Vec<(u64, u64)> = (0..n)
        .map(|i| (1_000_000 + i * 123_457, 2_000_000 - i * 77_777))
        .collect();
    let run_batch = |sizes: &[(u64, u64)], seed: u64| {
        let (srv, port) = spawn_ready(w.prog(
            0,
            true,
            &["server", "0", "thread", &sizes.len().to_string()],
        ));
        for (i, (send, recv)) in sizes.iter().enumerate() {
            let c = run_client(w.prog(
                0,
                true,
                &[
                    "client",
                    "127.0.0.1",
                    &port.to_string(),
                    &send.to_string(),
                    &recv.to_string(),
                    &(seed + i as u64).to_string(),
                ],
            ));
            assert_eq!(c["rx"], recv.to_string());
        }
        srv.wait_output(Duration::from_secs(60)).unwrap();
    };
    run_batch(&sizes, 10);
    // Every byte each end wrote, the 16-byte request header included.
    let bytes: u64 = sizes.iter().map(|(s, r)| 16 + s + r).sum();

    let f = w.stats_json(&[]);
    let c = &f["connections"];
    assert_eq!(u(&c["smcd_client"]), n, "{f:#}");
    assert_eq!(u(&c["smcd_server"]), n, "{f:#}");
    assert_eq!(u(&c["smcd"]), 2 * n, "{f:#}");
    assert_eq!(u(&c["total"]), 2 * n, "{f:#}");
    assert_eq!(u(&c["tcp_fallback"]), 0, "{f:#}");
    assert_eq!(u(&c["handshake_errors"]), 0, "{f:#}");
    assert_eq!(u(&c["smcd_open"]), 0, "all closed: {f:#}");
    assert_eq!(u(&f["rx"]["bytes"]), bytes, "{f:#}");
    assert_eq!(u(&f["tx"]["bytes"]), bytes, "{f:#}");
    assert!(u(&f["rx"]["requests"]) > 0 && u(&f["tx"]["requests"]) > 0);
    assert!(c["avg_requests_per_conn"].as_f64().unwrap() > 0.0);
    assert_eq!(f["daemon"]["running"], true, "{f:#}");
    // A DMB for each connection end: registered, or taken in a PAIR.
    let fig = &f["daemon"]["figures"];
    assert!(
        u(&fig["ops_register_ok"]) + u(&fig["ops_pair_ok"]) >= 2 * n,
        "{f:#}"
    );
    // The files of the exited processes were folded, none was lost.
    let s = &f["sources"];
    assert_eq!(u(&s["live_processes"]), 0, "{f:#}");
    assert!(u(&s["exited_aggregates"]) >= 1, "{f:#}");

    // show prints the same figures.
    let t = w.stats_text(&[]);
    assert_eq!(text_num(&t, "Total connections handled"), 2 * n, "{t}");
    assert_eq!(text_num(&t, "SMC-D connections"), 2 * n, "{t}");
    assert!(t.contains(&format!("(client {n}, server {n})")), "{t}");
    assert_eq!(text_num(&t, "TCP fallback"), 0, "{t}");
    assert_eq!(text_num(&t, "Handshake errors"), 0, "{t}");
    for (sec, key) in [("RX Stats", "rx"), ("TX Stats", "tx")] {
        assert_eq!(
            section_num(&t, sec, "Data transmitted (Bytes)"),
            u(&f[key]["bytes"]),
            "{t}"
        );
        assert_eq!(
            section_num(&t, sec, "Total requests"),
            u(&f[key]["requests"]),
            "{t}"
        );
    }

    // reset → zero.
    w.ctl(&["stats", "reset"]);
    let z = w.stats_json(&[]);
    assert_eq!(z["absolute"], false);
    assert!(z["baseline_unix"].is_u64());
    for k in ["total", "smcd", "tcp_fallback", "handshake_errors"] {
        assert_eq!(u(&z["connections"][k]), 0, "{k}: {z:#}");
    }
    assert_eq!(u(&z["rx"]["bytes"]), 0, "{z:#}");
    assert_eq!(u(&z["tx"]["requests"]), 0, "{z:#}");
    let zt = w.stats_text(&[]);
    assert_eq!(text_num(&zt, "Total connections handled"), 0, "{zt}");
    assert_eq!(section_num(&zt, "RX Stats", "Data transmitted (Bytes)"), 0);

    // One more connection: only it is shown, -a shows all.
    let more = [(300_000u64, 400_000u64)];
    run_batch(&more, 99);
    let d = w.stats_json(&[]);
    assert_eq!(u(&d["connections"]["smcd"]), 2, "{d:#}");
    assert_eq!(u(&d["rx"]["bytes"]), 16 + 300_000 + 400_000, "{d:#}");
    let a = w.stats_json(&["-a"]);
    assert_eq!(a["absolute"], true);
    assert_eq!(u(&a["connections"]["smcd"]), 2 * n + 2, "{a:#}");
    assert_eq!(u(&a["rx"]["bytes"]), bytes + 16 + 700_000, "{a:#}");

    // Per cgroup: the exited processes' figures are kept under their cgroup, and the
    // host-wide reset applies to it too.
    let cg = w.cg(0).path.display().to_string();
    let c = w.stats_json(&["--cgroup", &cg]);
    assert_eq!(c["scope"], "cgroup");
    assert_eq!(u(&c["connections"]["smcd"]), 2, "{c:#}");
    let ca = w.stats_json(&["--cgroup", &cg, "-a"]);
    assert_eq!(u(&ca["connections"]["smcd"]), 2 * n + 2, "{ca:#}");
    assert_eq!(u(&ca["tx"]["bytes"]), bytes + 16 + 700_000, "{ca:#}");
    w.ctl(&["stats", "reset", "--cgroup", &cg]);
    let cz = w.stats_json(&["--cgroup", &cg]);
    assert_eq!(u(&cz["connections"]["smcd"]), 0, "{cz:#}");
    // The ring-size histogram: every closed connection end counted once per direction.
    let h = &ca["rx"]["ring_hist"];
    if h.is_object() {
        let total: u64 = h.as_object().unwrap().values().map(u).sum();
        assert_eq!(total, 2 * n + 2, "{h:#}");
    }
}

/// A client under `smc-ctl run` against a server without the library: PEERNOSMC, counted as
/// a client fallback with its reason, in `json` and in `show`.
#[test]
fn stats_fallback_reason_peernosmc() {
    let w = World::new(&["ism"], false);
    // A plain HTTP server in the attached cgroup, without the library.
    let root = w.dir.join("www");
    std::fs::create_dir_all(&root).unwrap();
    let body: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.join("blob"), &body).unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut c = w.cg(0).command("python3");
    http_server_args(&mut c, "127.0.0.1", port, &root);
    let _srv = spawn_piped(c);
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "http.server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // curl under `smc-ctl run`: it announces SMC, the server does not → PEERNOSMC.
    let got = w.dir.join("got");
    let mut c = w.cg(0).command(bin("smc-ctl"));
    c.args(["run", "--", "curl", "-sf", "-o"])
        .arg(&got)
        .arg(format!("http://127.0.0.1:{port}/blob"));
    w.env(&mut c, false);
    let st = c.status().expect("curl (apt-get install curl)");
    assert!(st.success(), "curl: {st}");
    assert_eq!(std::fs::read(&got).unwrap(), body);

    let f = w.stats_json(&[]);
    let c = &f["connections"];
    assert_eq!(u(&c["smcd"]), 0, "{f:#}");
    assert_eq!(u(&c["tcp_fallback"]), 1, "{f:#}");
    assert_eq!(u(&c["tcp_fallback_client"]), 1, "{f:#}");
    assert_eq!(u(&c["total"]), 1, "{f:#}");
    let reasons = c["fallback_reasons"].as_array().unwrap();
    assert_eq!(reasons.len(), 1, "{f:#}");
    assert_eq!(reasons[0]["name"], "PEERNOSMC");
    assert_eq!(reasons[0]["code"], "0x03010000");
    assert_eq!(u(&reasons[0]["count"]), 1);
    if let Some(cl) = c["fallback_reasons_client"].as_array() {
        assert_eq!(cl[0]["name"], "PEERNOSMC", "{f:#}");
    }
    // Fallback connections move no bytes through shared memory.
    assert_eq!(u(&f["rx"]["bytes"]), 0, "{f:#}");

    let t = w.stats_text(&[]);
    assert_eq!(text_num(&t, "TCP fallback"), 1, "{t}");
    assert_eq!(text_num(&t, "PEERNOSMC"), 1, "{t}");
    // Without -d as well (the top reasons are always listed).
    let plain = String::from_utf8(w.ctl(&["stats"]).stdout).unwrap();
    assert_eq!(text_num(&plain, "PEERNOSMC"), 1, "{plain}");
}

/// Live connections: SMC-D (both ends, tokens crossed), TCP with why, the shortcut; per cgroup.
#[test]
fn stats_conns_live_modes_and_cgroups() {
    let w = World::new(&["ism", "ism", "shortcut"], false);
    // cgroup 0: an SMC-D pair.
    let (mut src, port) = spawn_ready(w.prog(0, true, &["source", "0"]));
    let sink = spawn_piped(w.prog(0, true, &["sink", "127.0.0.1", &port.to_string()]));
    // cgroup 1: the library on the server only → TCP (PEERNOSMC / NOT_ENABLED).
    let (src1, port1) = spawn_ready(w.prog(1, true, &["source", "0"]));
    let sink1 = spawn_piped(w.prog(1, false, &["sink", "127.0.0.1", &port1.to_string()]));
    // cgroup 2 (shortcut mode): no library, both ends on the sk_msg shortcut.
    let (src2, port2) = spawn_ready(w.prog(2, false, &["source", "0"]));
    let sink2 = spawn_piped(w.prog(2, false, &["sink", "127.0.0.1", &port2.to_string()]));
    std::thread::sleep(Duration::from_millis(500));

    let pid = |p: &Proc| p.0.id() as u64;
    let all = w.conns(&[]);
    let by_pid = |p: u64| -> Vec<&Value> { all.iter().filter(|c| u(&c["pid"]) == p).collect() };

    let s0 = by_pid(pid(&src));
    let k0 = by_pid(pid(&sink));
    assert_eq!((s0.len(), k0.len()), (1, 1), "{all:#?}");
    let (s0, k0) = (s0[0], k0[0]);
    assert_eq!(s0["mode"], "SMCD", "{s0:#}");
    assert_eq!(k0["mode"], "SMCD", "{k0:#}");
    assert_eq!(s0["state"], "ESTABLISHED");
    assert_eq!(s0["local"], k0["peer"]);
    assert_eq!(s0["peer"], k0["local"]);
    assert_eq!(s0["local"], format!("127.0.0.1:{port}"));
    assert_eq!(s0["command"], "preload-prog");
    // Root sees the tokens: each end's own DMB is the other's peer DMB.
    assert!(s0["own_token"].is_string(), "{s0:#}");
    assert_eq!(s0["own_token"], k0["peer_token"]);
    assert_eq!(s0["peer_token"], k0["own_token"]);
    assert!(u(&s0["own_dmb_size"]) >= 16384);
    assert_eq!(s0["cgroup"], w.cg(0).path.display().to_string());
    // The cursors, read from the two DMBs as each end maps them: with both ends stopped, what
    // the source produced is what the sink sees produced, and what the sink consumed is what
    // the source sees consumed.
    for p in [&src, &sink] {
        // SAFETY: plain kill of our child.
        unsafe { libc::kill(p.0.id() as i32, libc::SIGSTOP) };
    }
    std::thread::sleep(Duration::from_millis(100));
    let frozen = w.conns(&["--cgroup", &w.cg(0).path.display().to_string()]);
    for p in [&src, &sink] {
        // SAFETY: as above.
        unsafe { libc::kill(p.0.id() as i32, libc::SIGCONT) };
    }
    let fs0 = frozen.iter().find(|c| u(&c["pid"]) == pid(&src)).unwrap();
    let fk0 = frozen.iter().find(|c| u(&c["pid"]) == pid(&sink)).unwrap();
    let (sc, kc) = (&fs0["cursors"], &fk0["cursors"]);
    assert!(sc.is_object(), "{fs0:#}");
    assert_eq!(sc["tx_prod"], kc["rx_prod"], "{sc:#} {kc:#}");
    assert_eq!(sc["tx_cons"], kc["rx_cons"], "{sc:#} {kc:#}");
    assert_eq!(fs0["tx_bytes"], fk0["rx_bytes"]);
    assert!(u(&fs0["tx_bytes"]) > 0, "{fs0:#}");
    assert_eq!(fs0["shutdown"], "<->");

    let s1 = by_pid(pid(&src1));
    let k1 = by_pid(pid(&sink1));
    assert_eq!((s1.len(), k1.len()), (1, 1), "{all:#?}");
    assert_eq!(s1[0]["mode"], "TCP", "{:#}", s1[0]);
    assert_eq!(s1[0]["reason"], "PEERNOSMC", "{:#}", s1[0]);
    assert_eq!(k1[0]["mode"], "TCP");
    assert_eq!(k1[0]["reason"], "NOT_ENABLED", "{:#}", k1[0]);
    assert_eq!(s1[0]["same_host"], true);

    let s2 = by_pid(pid(&src2));
    let k2 = by_pid(pid(&sink2));
    assert_eq!((s2.len(), k2.len()), (1, 1), "{all:#?}");
    assert_eq!(s2[0]["mode"], "SHORTCUT", "{:#}", s2[0]);
    assert_eq!(k2[0]["mode"], "SHORTCUT", "{:#}", k2[0]);

    // The text view has the same lines.
    let text = String::from_utf8(w.ctl(&["conns", "-d"]).stdout).unwrap();
    let line = |p: u64| -> String {
        text.lines()
            .find(|l| l.contains(&format!(" {p}/preload-prog")))
            .unwrap_or_else(|| panic!("no line for {p}:\n{text}"))
            .to_string()
    };
    assert!(line(pid(&src)).contains("SMCD"), "{text}");
    assert!(
        line(pid(&src)).contains(s0["own_token"].as_str().unwrap()),
        "{text}"
    );
    assert!(line(pid(&src1)).contains("TCP PEERNOSMC"), "{text}");
    assert!(line(pid(&src2)).contains("SHORTCUT"), "{text}");

    // stats: live figures, host-wide (other attached cgroups of the host may add theirs) and
    // per cgroup (exact).
    let f = w.stats_json(&[]);
    let l = &f["live"];
    assert!(u(&l["smcd"]) >= 2, "{f:#}");
    assert!(u(&l["shortcut"]) >= 2, "{f:#}");
    assert!(u(&l["same_host_tcp"]) >= 2, "{f:#}");
    assert!(u(&l["same_host_tcp_reasons"]["PEERNOSMC"]) >= 1, "{f:#}");
    assert!(u(&l["same_host_tcp_reasons"]["NOT_ENABLED"]) >= 1, "{f:#}");
    // The data path's figures come from this world's own directory: exact.
    assert_eq!(u(&f["connections"]["smcd_open"]), 2, "{f:#}");
    // cgroup 1's library end fell back with PEERNOSMC while it runs.
    assert_eq!(u(&f["connections"]["tcp_fallback_server"]), 1, "{f:#}");

    let cg0 = w.cg(0).path.display().to_string();
    let cg1 = w.cg(1).path.display().to_string();
    let f0 = w.stats_json(&["--cgroup", &cg0]);
    assert_eq!(f0["scope"], "cgroup");
    assert_eq!(u(&f0["connections"]["smcd"]), 2, "{f0:#}");
    assert_eq!(u(&f0["connections"]["tcp_fallback"]), 0, "{f0:#}");
    assert_eq!(u(&f0["live"]["smcd"]), 2, "{f0:#}");
    assert_eq!(u(&f0["live"]["tcp"]), 0, "{f0:#}");
    assert!(f0["ebpf"].is_null(), "host-wide only");
    // The daemon is host-wide, shown in every scope, with this cgroup's usage.
    let fig0 = &f0["daemon"]["figures"];
    assert!(
        u(&fig0["ops_register_ok"]) + u(&fig0["ops_pair_ok"]) >= 2,
        "{f0:#}"
    );
    assert_eq!(u(&f0["daemon"]["cgroup"]["dmbs"]), 2, "{f0:#}");
    let f1 = w.stats_json(&["--cgroup", &cg1]);
    assert_eq!(u(&f1["connections"]["smcd"]), 0, "{f1:#}");
    assert_eq!(u(&f1["connections"]["tcp_fallback"]), 1, "{f1:#}");
    assert_eq!(
        f1["connections"]["fallback_reasons"][0]["name"], "PEERNOSMC",
        "{f1:#}"
    );
    assert_eq!(u(&f1["live"]["tcp"]), 2, "{f1:#}");
    assert_eq!(
        u(&f1["live"]["same_host_tcp_reasons"]["PEERNOSMC"]),
        1,
        "{f1:#}"
    );
    let cg2 = w.cg(2).path.display().to_string();
    let f2 = w.stats_json(&["--cgroup", &cg2]);
    assert_eq!(u(&f2["live"]["shortcut"]), 2, "{f2:#}");
    assert_eq!(u(&f2["live"]["connections"]), 2, "{f2:#}");
    let c1 = w.conns(&["--cgroup", &cg1]);
    assert_eq!(c1.len(), 2, "{c1:#?}");

    // The source is killed: its file is stale, folded, and counts the same.
    src.0.kill().unwrap();
    src.0.wait().unwrap();
    sink.wait_output(Duration::from_secs(20)).unwrap();
    let g = w.stats_json(&["--cgroup", &cg0]);
    assert_eq!(u(&g["live"]["smcd"]), 0, "{g:#}");
    assert_eq!(u(&g["connections"]["smcd"]), 2, "{g:#}");
    drop((src1, sink1, src2, sink2));
}

/// `smc-ctl daemon --metrics`: Prometheus text with the daemon's figures and the data path's.
#[test]
fn stats_metrics_endpoint() {
    let w = World::new(&["ism"], true);
    let (srv, port) = spawn_ready(w.prog(0, true, &["server", "0", "thread", "2"]));
    for i in 0..2 {
        run_client(w.prog(
            0,
            true,
            &[
                "client",
                "127.0.0.1",
                &port.to_string(),
                "100000",
                "200000",
                &i.to_string(),
            ],
        ));
    }
    srv.wait_output(Duration::from_secs(60)).unwrap();
    let addr = w.metrics.clone().unwrap();
    let body = http_get(&addr, "/metrics");
    let metric = |name: &str| -> u64 {
        body.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(metric("smc_connections_smcd_client"), 2);
    assert_eq!(metric("smc_connections_smcd_server"), 2);
    assert_eq!(metric("smc_rx_bytes"), 2 * (16 + 100_000 + 200_000));
    assert!(metric("smc_ism_ops_register_ok") + metric("smc_ism_ops_pair_ok") >= 4);
    // The DMBs are released when the connections close (the daemon notices asynchronously).
    let t = Instant::now();
    loop {
        let b = http_get(&addr, "/metrics");
        if b.lines().any(|l| l == "smc_ism_live_dmbs 0") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(5), "{b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(body.contains("# TYPE smc_ism_live_dmbs gauge"), "{body}");
    assert!(body.contains("# TYPE smc_rx_bytes counter"), "{body}");
    // The same figures as `stats json -a`.
    let f = w.stats_json(&["-a"]);
    assert_eq!(metric("smc_tx_bytes"), u(&f["tx"]["bytes"]));
    assert!(http_get(&addr, "/nothing").starts_with("HTTP/1.1 404"));
}

fn http_get(addr: &str, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    if path == "/metrics" {
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        r.split_once("\r\n\r\n").unwrap().1.to_string()
    } else {
        r
    }
}
