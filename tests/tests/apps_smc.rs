//! Unmodified real applications on the transparent data path: redis (redis-benchmark,
//! redis-cli), nginx (wrk keep-alive, curl with a multi-MB file), iperf3 (both directions),
//! sockperf (ping-pong, throughput), and connections between two network namespaces of this
//! host, and the test suites of CPython (socket, TLS, asyncio), Tornado and Twisted (a
//! differential run against plain TCP). Every program runs as `smc-ctl run -- PROGRAM` inside an ism-attached cgroup with the
//! test's own loopback-ism daemon, and every test proves from the data path's per-process
//! statistics that the connections became SMC-D (not a silent TCP fallback) and that the
//! application's bytes went through the shared-memory rings, besides checking what the
//! application itself reports (request counts, SHA-256 of what arrived).
//!
//! Needs root (cgroups, eBPF) and the tools that `cargo xtask setup` installs. Build first into
//! the default target directory: `cargo build --release -p smc-ctl -p smc-preload -p
//! integration-tests --bins`, then `cargo test --release -p integration-tests --test apps_smc`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{
    brief, fallbacks, free_port, http_server_args, log_tail, pseudo_random, require_tool,
    run_to_end, sha256_hex, smcd_open, spawn_logged, spawn_piped, wait_listening, NetnsPair, Proc,
    SmcWorld, Snapshot,
};
use smc_stats::ConnState;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bound of every wait for a program or a condition.
const T: Duration = Duration::from_secs(120);

/// Asserts that process `what` (figures `s`) made exactly `client`/`server` SMC-D connections
/// (at least, when `at_least`), with no fallback and no handshake error.
fn assert_smcd(what: &str, s: &Snapshot, client: u64, server: u64, at_least: bool) {
    let (c, sv) = (s.get("smcd_client"), s.get("smcd_server"));
    if at_least {
        assert!(
            c >= client && sv >= server,
            "{what}: expected at least {client} client / {server} server SMC-D connections: {}",
            brief(s)
        );
    } else {
        assert!(
            c == client && sv == server,
            "{what}: expected {client} client / {server} server SMC-D connections: {}",
            brief(s)
        );
    }
    assert_eq!(
        fallbacks(s),
        0,
        "{what}: connections fell back to TCP: {}",
        brief(s)
    );
    assert_eq!(
        s.get("handshake_errors"),
        0,
        "{what}: CLC handshake errors: {}",
        brief(s)
    );
}

/// Every connection of the world had both ends on the data path: as many server ends as client
/// ends, nothing fell back; and, all of them closed, the daemon released every DMB. Called last
/// (it runs `smc-ctl stats`).
fn assert_world_consistent(w: &SmcWorld) -> Snapshot {
    let sum = w.stats_sum();
    assert_eq!(
        sum.get("smcd_client"),
        sum.get("smcd_server"),
        "SMC-D client ends and server ends differ: {}",
        brief(&sum)
    );
    assert_eq!(fallbacks(&sum), 0, "fallbacks: {}", brief(&sum));
    assert_eq!(sum.get("handshake_errors"), 0, "{}", brief(&sum));
    w.wait_no_live_dmbs(T);
    sum
}

/// Waits until the server process `pid` has closed every SMC-D connection it accepted and has
/// accepted at least `n`.
fn wait_server_closed(w: &SmcWorld, pid: u32, n: u64, what: &str) -> Snapshot {
    w.wait_stats(
        T,
        &format!("{what} (pid {pid}) to close its {n} SMC-D connections"),
        |w| w.stats_of(pid, what),
        |s| s.get("smcd_server") >= n && smcd_open(s) == 0,
    )
}

// ─────────────────────────────────────────── redis ───────────────────────────────────────────

struct Redis {
    proc: Proc,
    port: u16,
    log: PathBuf,
}

fn redis_server(w: &SmcWorld) -> Redis {
    let exe = require_tool("redis-server", "redis-server");
    let d = w.subdir("redis");
    let port = free_port();
    let mut c = w.run(exe);
    c.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--protected-mode", "no", "--dir"])
        .arg(&d)
        .arg("--logfile")
        .arg(d.join("redis.log"));
    let log = d.join("redis.log");
    let mut proc = spawn_logged(c, &d.join("stdout.log"));
    wait_listening(&mut proc, port, T, "redis-server", Some(&log));
    Redis { proc, port, log }
}

fn redis_cli(
    w: &SmcWorld,
    r: &Redis,
    args: &[&str],
    stdin: Option<&Path>,
) -> integration_tests::Finished {
    let exe = require_tool("redis-cli", "redis-tools");
    let mut c = w.run(exe);
    c.args(["-h", "127.0.0.1", "-p", &r.port.to_string()])
        .args(args);
    let f = stdin.map(|p| std::fs::File::open(p).expect("open stdin file"));
    run_to_end(c, &w.subdir("logs"), f, T).ok()
}

/// `cmdstat_<cmd>:calls=N` of `INFO commandstats`.
fn cmd_calls(info: &str, cmd: &str) -> u64 {
    let key = format!("cmdstat_{cmd}:calls=");
    info.lines()
        .find_map(|l| l.trim().strip_prefix(&key))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// redis-benchmark (10 clients, 2000 SET and 2000 GET of 1 KiB values) against redis-server,
/// both under the data path: every benchmark connection is SMC-D on both ends, the server
/// executed exactly the requested commands, and the values crossed the rings.
#[test]
fn redis_benchmark_set_get_over_smcd() {
    let w = SmcWorld::new();
    let r = redis_server(&w);
    let exe = require_tool("redis-benchmark", "redis-tools");
    let (n, clients, size) = (2000u64, 10u64, 1024u64);
    let mut c = w.run(exe);
    c.args(["-h", "127.0.0.1", "-p", &r.port.to_string()])
        .args(["-n", &n.to_string(), "-c", &clients.to_string()])
        .args(["-d", &size.to_string(), "-t", "set,get", "--csv"]);
    let bench = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let out = bench.text();
    for test in ["SET", "GET"] {
        let rps: f64 = out
            .lines()
            .find(|l| l.starts_with(&format!("\"{test}\"")))
            .and_then(|l| l.split(',').nth(1))
            .and_then(|v| v.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("no {test} result in redis-benchmark output:\n{out}"));
        assert!(rps > 0.0, "{test}: {rps} requests/s:\n{out}");
    }

    // The benchmark: one connection per client per test, all SMC-D; the SET values went out and
    // the GET values came in through shared memory.
    let b = w.stats_of(bench.pid, "redis-benchmark");
    assert_smcd("redis-benchmark", &b, 2 * clients, 0, true);
    assert_eq!(
        smcd_open(&b),
        0,
        "redis-benchmark left connections open: {}",
        brief(&b)
    );
    assert!(
        b.get("tx_bytes") >= n * size,
        "SET values not sent via SMC-D: {}",
        brief(&b)
    );
    assert!(
        b.get("rx_bytes") >= n * size,
        "GET values not received via SMC-D: {}",
        brief(&b)
    );

    // The server end of every one of them; every byte one end wrote, the other read.
    let conns = b.get("smcd_client");
    let s = wait_server_closed(&w, r.proc.0.id(), conns, "redis-server");
    assert_smcd("redis-server", &s, 0, conns, false);
    assert_eq!(
        s.get("rx_bytes"),
        b.get("tx_bytes"),
        "server {} / benchmark {}",
        brief(&s),
        brief(&b)
    );
    assert_eq!(
        s.get("tx_bytes"),
        b.get("rx_bytes"),
        "server {} / benchmark {}",
        brief(&s),
        brief(&b)
    );

    // The server executed every request of the benchmark.
    let info = redis_cli(&w, &r, &["INFO", "commandstats"], None).text();
    assert_eq!(cmd_calls(&info, "set"), n, "SET calls:\n{info}");
    assert_eq!(cmd_calls(&info, "get"), n, "GET calls:\n{info}");
    wait_server_closed(&w, r.proc.0.id(), conns + 1, "redis-server");
    assert_world_consistent(&w);
    drop(r);
}

/// redis-cli stores a 400 kB value and reads it back: identical bytes, each redis-cli on one
/// SMC-D connection, the value crossing the rings both ways.
#[test]
fn redis_cli_large_value_roundtrip_over_smcd() {
    let w = SmcWorld::new();
    let r = redis_server(&w);
    let len = 400_000usize;
    let value = pseudo_random(len, 0x5eed, true);
    let vfile = w.dir.join("value.txt");
    std::fs::write(&vfile, &value).unwrap();

    let set = redis_cli(&w, &r, &["-x", "SET", "big"], Some(&vfile));
    assert_eq!(set.text().trim(), "OK", "SET: {}", set.text());
    let strlen = redis_cli(&w, &r, &["STRLEN", "big"], None);
    assert_eq!(strlen.text().trim(), len.to_string(), "STRLEN");
    let get = redis_cli(&w, &r, &["--raw", "GET", "big"], None);
    let mut got = get.stdout.clone();
    assert_eq!(
        got.pop(),
        Some(b'\n'),
        "redis-cli --raw ends its output with a newline"
    );
    assert_eq!(
        got.len(),
        len,
        "GET returned {} bytes, want {len}",
        got.len()
    );
    assert_eq!(
        sha256_hex(&got),
        sha256_hex(&value),
        "GET returned other bytes than SET stored"
    );

    // Each redis-cli made one SMC-D connection; the server read the value from its ring and
    // wrote it back into the GET client's ring.
    for (f, what) in [
        (&set, "redis-cli SET"),
        (&strlen, "redis-cli STRLEN"),
        (&get, "redis-cli GET"),
    ] {
        assert_smcd(what, &w.stats_of(f.pid, what), 1, 0, false);
    }
    let s = wait_server_closed(&w, r.proc.0.id(), 3, "redis-server");
    assert_smcd("redis-server", &s, 0, 3, false);
    assert!(
        s.get("rx_bytes") >= len as u64,
        "value not received via SMC-D: {}",
        brief(&s)
    );
    assert!(
        s.get("tx_bytes") >= len as u64,
        "value not sent via SMC-D: {}",
        brief(&s)
    );
    assert_world_consistent(&w);
    assert!(
        !log_tail(&r.log).contains("Protocol error"),
        "redis-server saw protocol errors{}",
        log_tail(&r.log)
    );
}

/// Bytes a process moved through shared memory: those of its closed connections plus those its
/// connection records show for live ones (as `smc-ctl stats` adds them).
fn moved(s: &Snapshot) -> (u64, u64) {
    let live = s.conns.iter().filter(|c| c.state() == ConnState::Smcd);
    let (rx, tx) = live.fold((0, 0), |(r, t), c| (r + c.rx_bytes, t + c.tx_bytes));
    (s.get("rx_bytes") + rx, s.get("tx_bytes") + tx)
}

/// redis-cli, like many clients, exits without closing its connection (the kernel closes it).
/// The bytes it moved over SMC-D must still be in its statistics: the server counted them.
#[test]
fn redis_cli_exit_without_close_keeps_byte_counts() {
    let w = SmcWorld::new();
    let r = redis_server(&w);
    let len = 300_000usize;
    let vfile = w.dir.join("value.txt");
    std::fs::write(&vfile, pseudo_random(len, 0xc1, true)).unwrap();
    let set = redis_cli(&w, &r, &["-x", "SET", "v"], Some(&vfile));
    assert_eq!(set.text().trim(), "OK");
    let s = wait_server_closed(&w, r.proc.0.id(), 1, "redis-server");
    let c = w.stats_of(set.pid, "redis-cli SET");
    assert_smcd("redis-cli SET", &c, 1, 0, false);
    let (crx, ctx) = moved(&c);
    assert!(
        ctx >= len as u64 && ctx == s.get("rx_bytes") && crx == s.get("tx_bytes"),
        "the server read {} bytes from redis-cli's SMC-D connection and wrote {}, but the \
         statistics of redis-cli (exited without close) show rx={crx} tx={ctx}: {}",
        s.get("rx_bytes"),
        s.get("tx_bytes"),
        brief(&c)
    );
}

// ─────────────────────────────────────────── nginx ───────────────────────────────────────────

struct Nginx {
    master: Proc,
    port: u16,
    dir: PathBuf,
}

/// nginx with its own configuration (a master and one worker, `sendfile on`, keep-alive) on a
/// private port, serving `files` from its root.
fn nginx(w: &SmcWorld, files: &[(&str, &[u8])]) -> Nginx {
    let exe = require_tool("nginx", "nginx");
    let d = w.subdir("nginx");
    let www = d.join("www");
    std::fs::create_dir_all(&www).unwrap();
    for (name, body) in files {
        std::fs::write(www.join(name), body).unwrap();
    }
    let port = free_port();
    let p = d.display();
    let conf = format!(
        "daemon off;\n\
         master_process on;\n\
         worker_processes 1;\n\
         user root;\n\
         pid {p}/nginx.pid;\n\
         error_log {p}/error.log info;\n\
         events {{ worker_connections 512; }}\n\
         http {{\n\
           access_log {p}/access.log;\n\
           client_body_temp_path {p}/body;\n\
           proxy_temp_path {p}/proxy;\n\
           fastcgi_temp_path {p}/fastcgi;\n\
           uwsgi_temp_path {p}/uwsgi;\n\
           scgi_temp_path {p}/scgi;\n\
           default_type application/octet-stream;\n\
           sendfile on;\n\
           keepalive_timeout 60s;\n\
           keepalive_requests 1000000;\n\
           server {{\n\
             listen 127.0.0.1:{port};\n\
             root {p}/www;\n\
           }}\n\
         }}\n"
    );
    std::fs::write(d.join("nginx.conf"), conf).unwrap();
    let mut c = w.run(exe);
    c.arg("-p")
        .arg(&d)
        .arg("-c")
        .arg(d.join("nginx.conf"))
        .arg("-e")
        .arg(d.join("error.log"));
    let mut master = spawn_logged(c, &d.join("stdout.log"));
    wait_listening(&mut master, port, T, "nginx", Some(&d.join("error.log")));
    Nginx {
        master,
        port,
        dir: d,
    }
}

impl Nginx {
    /// The pids of the processes of this world other than the master (its worker).
    fn workers(&self, w: &SmcWorld) -> Vec<u32> {
        let m = self.master.0.id();
        w.live_pids().into_iter().filter(|p| *p != m).collect()
    }

    /// No worker died: nginx's master logs "worker process N exited on signal S" and starts
    /// another (which would hide a crash from every other check).
    fn assert_no_worker_crash(&self) {
        let log = std::fs::read_to_string(self.dir.join("error.log")).unwrap_or_default();
        let crashes: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("exited on signal"))
            .collect();
        assert!(
            crashes.is_empty(),
            "nginx workers crashed:\n{}",
            crashes.join("\n")
        );
    }

    fn access_log_lines(&self) -> usize {
        std::fs::read_to_string(self.dir.join("access.log"))
            .unwrap_or_default()
            .lines()
            .count()
    }
}

/// The number before `what` in wrk's report ("12345 requests in 2.00s").
fn wrk_number(out: &str, what: &str) -> u64 {
    out.lines()
        .find_map(|l| {
            let t = l.trim();
            t.find(what).and_then(|i| t[..i].trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no {what:?} in wrk output:\n{out}"))
}

/// nginx + wrk (8 keep-alive connections, 2 threads, 2 s): every request answered 200, every
/// connection SMC-D on both ends, the responses (sent by nginx with sendfile) crossing the
/// rings.
#[test]
fn nginx_wrk_keepalive_over_smcd() {
    let page = pseudo_random(32 * 1024, 77, false);
    let w = SmcWorld::new();
    let ng = nginx(&w, &[("page.bin", &page)]);
    let wrk = require_tool("wrk", "wrk");
    let mut c = w.run(wrk);
    c.args(["-c", "8", "-t", "2", "-d", "2s"])
        .arg(format!("http://127.0.0.1:{}/page.bin", ng.port));
    let run = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let out = run.text();
    ng.assert_no_worker_crash();
    let requests = wrk_number(&out, "requests in");
    assert!(requests >= 100, "wrk made only {requests} requests:\n{out}");
    assert!(!out.contains("Non-2xx"), "wrk got error responses:\n{out}");
    assert!(
        !out.contains("Socket errors"),
        "wrk saw socket errors:\n{out}"
    );

    // wrk: its 8 connections (and the one it opens first to check the address) are SMC-D.
    let c = w.stats_of(run.pid, "wrk");
    assert_smcd("wrk", &c, 8, 0, true);

    // nginx: the worker accepted each of them on SMC-D and sent the responses with sendfile,
    // emulated onto the rings: at least every response wrk counted went through them.
    let workers = ng.workers(&w);
    assert_eq!(
        workers.len(),
        1,
        "nginx processes besides the master: {workers:?}"
    );
    let conns = c.get("smcd_client");
    let s = w.wait_stats(
        T,
        &format!("the nginx worker to close wrk's {conns} SMC-D connections"),
        |w| w.stats_of(workers[0], "nginx worker"),
        |s| s.get("smcd_server") >= conns && smcd_open(s) == 0,
    );
    assert_smcd("nginx worker", &s, 0, conns, false);
    assert!(
        s.get("special_sendfile") > 0,
        "nginx sendfile did not reach the data path: {}",
        brief(&s)
    );
    assert!(
        s.get("tx_bytes") >= requests * page.len() as u64,
        "{requests} responses of {} bytes not sent via SMC-D: {}",
        page.len(),
        brief(&s)
    );
    assert!(
        s.get("rx_bytes") >= requests * 40,
        "{requests} requests not received via SMC-D: {}",
        brief(&s)
    );
    assert!(
        ng.access_log_lines() as u64 >= requests,
        "access log shorter than wrk's count"
    );
    assert_world_consistent(&w);
}

/// curl fetches an 8 MiB file from nginx: identical SHA-256, one SMC-D connection, the file
/// crossing the ring.
#[test]
fn nginx_curl_large_file_over_smcd() {
    let body = pseudo_random(8 << 20, 4242, false);
    let w = SmcWorld::new();
    let ng = nginx(&w, &[("big.bin", &body)]);
    let curl = require_tool("curl", "curl");
    let out = w.dir.join("got.bin");
    let mut c = w.run(curl);
    c.args(["-sS", "-f", "-o"])
        .arg(&out)
        .arg(format!("http://127.0.0.1:{}/big.bin", ng.port));
    let run = run_to_end(c, &w.subdir("logs"), None, T).ok();
    ng.assert_no_worker_crash();
    let got = std::fs::read(&out).expect("curl output");
    assert_eq!(got.len(), body.len(), "curl got {} bytes", got.len());
    assert_eq!(
        sha256_hex(&got),
        sha256_hex(&body),
        "SHA-256 of the fetched file differs"
    );

    let s = w.stats_of(run.pid, "curl");
    assert_smcd("curl", &s, 1, 0, false);
    assert!(
        s.get("rx_bytes") >= body.len() as u64,
        "file not received via SMC-D: {}",
        brief(&s)
    );
    let workers = ng.workers(&w);
    assert_eq!(
        workers.len(),
        1,
        "nginx processes besides the master: {workers:?}"
    );
    let s = w.wait_stats(
        T,
        "the nginx worker to close curl's SMC-D connection",
        |w| w.stats_of(workers[0], "nginx worker"),
        |s| s.get("smcd_server") >= 1 && smcd_open(s) == 0,
    );
    assert_smcd("nginx worker", &s, 0, 1, false);
    assert!(s.get("tx_bytes") >= body.len() as u64, "{}", brief(&s));
    assert!(s.get("special_sendfile") > 0, "{}", brief(&s));
    let sum = assert_world_consistent(&w);
    assert_eq!(sum.get("rx_bytes"), sum.get("tx_bytes"), "{}", brief(&sum));
}

// ─────────────────────────────────────────── iperf3 ──────────────────────────────────────────

/// iperf3 for 2 s in each direction (client sends, then `-R`: server sends): the control and
/// the data connection are SMC-D, and what iperf3 reports as transferred went through the rings.
#[test]
fn iperf3_both_directions_over_smcd() {
    let exe = require_tool("iperf3", "iperf3");
    let w = SmcWorld::new();
    let d = w.subdir("iperf3");
    let port = free_port();
    let mut c = w.run(&exe);
    c.args(["-s", "-B", "127.0.0.1", "-p", &port.to_string()]);
    let log = d.join("server.log");
    let mut srv = spawn_logged(c, &log);
    wait_listening(&mut srv, port, T, "iperf3 -s", Some(&log));
    let mut served = 0;
    for reverse in [false, true] {
        let mut c = w.run(&exe);
        c.args(["-c", "127.0.0.1", "-p", &port.to_string(), "-t", "2", "-J"]);
        if reverse {
            c.arg("-R");
        }
        let run = run_to_end(c, &w.subdir("logs"), None, T).ok();
        let j: serde_json::Value = serde_json::from_slice(&run.stdout)
            .unwrap_or_else(|e| panic!("iperf3 -J output: {e}:\n{}", run.text()));
        assert!(j.get("error").is_none(), "iperf3: {}", j["error"]);
        let sent = j["end"]["sum_sent"]["bytes"]
            .as_u64()
            .expect("sum_sent.bytes");
        let received = j["end"]["sum_received"]["bytes"]
            .as_u64()
            .expect("sum_received.bytes");
        assert!(
            received > 0 && sent >= received,
            "sent {sent} received {received}"
        );
        let s = w.stats_of(run.pid, "iperf3 client");
        // Control connection and one data stream.
        assert_smcd(
            &format!("iperf3 client (reverse {reverse})"),
            &s,
            2,
            0,
            false,
        );
        if reverse {
            assert!(
                s.get("rx_bytes") >= received,
                "-R: {received} bytes not received via SMC-D: {}",
                brief(&s)
            );
        } else {
            assert!(
                s.get("tx_bytes") >= sent,
                "{sent} bytes not sent via SMC-D: {}",
                brief(&s)
            );
        }
        served += 2;
        let s = wait_server_closed(&w, srv.0.id(), served, "iperf3 server");
        assert_smcd("iperf3 server", &s, 0, served, false);
    }
    let s = w.stats_of(srv.0.id(), "iperf3 server");
    assert!(
        s.get("rx_bytes") > 0 && s.get("tx_bytes") > 0,
        "{}",
        brief(&s)
    );
    assert_world_consistent(&w);
}

// ────────────────────────────────────────── sockperf ─────────────────────────────────────────

/// `key=value;` fields of sockperf's "[Valid Duration]" summary line.
fn sockperf_field(out: &str, key: &str) -> u64 {
    out.lines()
        .filter(|l| l.contains("Valid Duration"))
        .find_map(|l| {
            l.split(|c: char| c == ';' || c.is_whitespace())
                .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or_else(|| panic!("no {key} in sockperf output:\n{out}"))
}

/// sockperf ping-pong (14 B) and throughput (64000 B), 2 s each, against one sockperf server:
/// both clients run, get answers, and their connection is SMC-D with the messages in the rings.
#[test]
fn sockperf_ping_pong_and_throughput_over_smcd() {
    let exe = require_tool("sockperf", "sockperf");
    let w = SmcWorld::new();
    let d = w.subdir("sockperf");
    let port = free_port();
    let mut c = w.run(&exe);
    c.args([
        "server",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ]);
    let log = d.join("server.log");
    let mut srv = spawn_logged(c, &log);
    wait_listening(&mut srv, port, T, "sockperf server", Some(&log));

    let mut c = w.run(&exe);
    c.args([
        "ping-pong",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ])
    // Ping-pong on shared memory outruns sockperf's default message-rate estimate, from
    // which it sizes its sequence table ("_seqN > m_maxSequenceNo"): give it room. Every
    // reply is checked against what was sent (--data-integrity).
    .args(["-t", "2", "-m", "14", "--mps=5000000", "--data-integrity"]);
    let pp = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let out = pp.text();
    let sent = sockperf_field(&out, "SentMessages");
    let received = sockperf_field(&out, "ReceivedMessages");
    assert!(
        received >= 100,
        "ping-pong: {received} replies in 2 s:\n{out}"
    );
    assert!(
        out.contains("Summary: Latency is"),
        "no latency summary:\n{out}"
    );
    let s = w.stats_of(pp.pid, "sockperf ping-pong");
    assert_smcd("sockperf ping-pong", &s, 1, 0, false);
    assert!(
        s.get("tx_bytes") >= 14 * sent,
        "{sent} messages not sent via SMC-D: {}",
        brief(&s)
    );
    assert!(s.get("rx_bytes") >= 14 * received, "{}", brief(&s));
    wait_server_closed(&w, srv.0.id(), 1, "sockperf server");

    let mut c = w.run(&exe);
    c.args([
        "throughput",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ])
    .args(["-t", "2", "-m", "64000"]);
    let tp = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let out = tp.text();
    let sent: u64 = out
        .lines()
        .find_map(|l| l.split("Total of ").nth(1))
        .and_then(|t| t.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no message count in sockperf output:\n{out}"));
    assert!(sent >= 100, "throughput: {sent} messages in 2 s:\n{out}");
    assert!(
        out.contains("Summary: BandWidth is"),
        "no bandwidth summary:\n{out}"
    );
    let s = w.stats_of(tp.pid, "sockperf throughput");
    assert_smcd("sockperf throughput", &s, 1, 0, false);
    assert!(
        s.get("tx_bytes") >= 64000 * sent,
        "{sent} messages not sent via SMC-D: {}",
        brief(&s)
    );

    let s = wait_server_closed(&w, srv.0.id(), 2, "sockperf server");
    assert_smcd("sockperf server", &s, 0, 2, false);
    assert!(
        s.get("rx_bytes") >= 64000 * sent,
        "server did not read the messages via SMC-D: {}",
        brief(&s)
    );
    assert_world_consistent(&w);
}

// ──────────────────────────────────── two network namespaces ─────────────────────────────────

/// Both ends in the same attached cgroup but in two network namespaces of this host joined by
/// veth (server in `b`, client in `a`): curl against python's http.server and the tests'
/// byte-stream program both go over SMC-D, bytes identical.
#[test]
fn netns_pair_connections_over_smcd() {
    let curl = require_tool("curl", "curl");
    let python = require_tool("python3", "python3");
    let w = SmcWorld::new();
    let ns = NetnsPair::new().expect("create the network namespace pair (iproute2)");

    // python3 -m http.server in namespace b, curl in namespace a.
    let www = w.subdir("www");
    let body = pseudo_random(3 << 20, 99, false);
    std::fs::write(www.join("blob.bin"), &body).unwrap();
    let port = 8000 + (std::process::id() % 1000) as u16;
    let mut c = w.run_in_netns(&ns.b, &python);
    http_server_args(&mut c, &ns.addr_b, port, &www);
    let log = w.dir.join("http.log");
    let mut srv = spawn_logged(c, &log);
    wait_listening(
        &mut srv,
        port,
        T,
        "python3 -m http.server (netns b)",
        Some(&log),
    );
    let out = w.dir.join("got.bin");
    let mut c = w.run_in_netns(&ns.a, &curl);
    c.args(["-sS", "-f", "-o"])
        .arg(&out)
        .arg(format!("http://{}:{port}/blob.bin", ns.addr_b));
    let run = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let got = std::fs::read(&out).expect("curl output");
    assert_eq!(
        sha256_hex(&got),
        sha256_hex(&body),
        "SHA-256 of the fetched file differs"
    );
    let s = w.stats_of(run.pid, "curl (netns a)");
    assert_smcd("curl (netns a)", &s, 1, 0, false);
    assert!(s.get("rx_bytes") >= body.len() as u64, "{}", brief(&s));
    let s = wait_server_closed(&w, srv.0.id(), 1, "python http.server (netns b)");
    assert_smcd("python http.server (netns b)", &s, 0, 1, false);
    assert!(s.get("tx_bytes") >= body.len() as u64, "{}", brief(&s));

    // The tests' byte-stream program: 5 MB up, then a 6 MB reply down, SHA-256 on both ends;
    // the reply must also be exactly what the same program receives over plain TCP.
    let smc = testprog_pair(&w, &ns, true);
    let tcp = testprog_pair(&w, &ns, false);
    assert_eq!(
        smc.0, tcp.0,
        "the reply over SMC-D differs from the reply over TCP"
    );
    let (cpid, spid) = (smc.1, smc.2);
    let c = w.stats_of(cpid, "smc-testprog client (netns a)");
    assert_smcd("smc-testprog client (netns a)", &c, 1, 0, false);
    assert_eq!(
        (c.get("tx_bytes"), c.get("rx_bytes")),
        (UP, DOWN),
        "{}",
        brief(&c)
    );
    let s = wait_server_closed(&w, spid, 1, "smc-testprog server (netns b)");
    assert_smcd("smc-testprog server (netns b)", &s, 0, 1, false);
    assert_eq!(
        (s.get("rx_bytes"), s.get("tx_bytes")),
        (UP, DOWN),
        "{}",
        brief(&s)
    );
    assert_world_consistent(&w);
    drop(srv);
    drop(ns);
}

const UP: u64 = 5_000_123;
const DOWN: u64 = 6_000_321;

/// `smc-testprog server` in namespace `b`, `smc-testprog client` in `a`: UP bytes up, DOWN bytes
/// of reply. With `smc` both run under the data path in the attached cgroup, otherwise as plain
/// processes outside it. Checks both ends' SHA-256 of the upload and returns the reply's SHA-256
/// with the client's and the server's pid.
fn testprog_pair(w: &SmcWorld, ns: &NetnsPair, smc: bool) -> (String, u32, u32) {
    let prog = integration_tests::bin("smc-testprog");
    let mut c = if smc {
        w.run_in_netns(&ns.b, &prog)
    } else {
        NetnsPair::command(&ns.b, None, &prog)
    };
    c.args([
        "server",
        &format!("{}:0", ns.addr_b),
        "--reply",
        &DOWN.to_string(),
    ]);
    let mut srv = spawn_piped(c);
    let line = srv.read_line();
    let port: u16 = line
        .strip_prefix("PORT ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("smc-testprog server said {line:?}"));
    let mut c = if smc {
        w.run_in_netns(&ns.a, &prog)
    } else {
        NetnsPair::command(&ns.a, None, &prog)
    };
    c.args([
        "client",
        &format!("{}:{port}", ns.addr_b),
        &UP.to_string(),
        "17",
    ]);
    let cl = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let spid = srv.0.id();
    let sout = srv.wait_output(T).expect("smc-testprog server");
    // Client: "OK <bytes> <sha> back=<n> <sha>"; server: "SHA <sha> <n>".
    let cout = cl.text();
    let cw: Vec<&str> = cout.split_whitespace().collect();
    let sw: Vec<&str> = sout.split_whitespace().collect();
    assert!(cw.len() >= 5 && cw[0] == "OK", "client said {cout:?}");
    assert!(sw.len() >= 3 && sw[0] == "SHA", "server said {sout:?}");
    assert_eq!(cw[1], UP.to_string(), "client sent {cout:?}");
    assert_eq!(sw[2], UP.to_string(), "server received {sout:?}");
    assert_eq!(
        cw[2], sw[1],
        "SHA-256 of the upload differs between the ends (smc {smc})"
    );
    assert_eq!(cw[3], format!("back={DOWN}"), "client received {cout:?}");
    (cw[4].to_string(), cl.pid, spid)
}

/// What a user sees without `SMC_STATS_KEEP` (the default): a client under `smc-ctl run` exits
/// normally after a clean close; its figures must stay in the statistics directory (folded
/// into its cgroup's `exited-<cgroup id>` aggregate, as `smc_stats` specifies), not
/// vanish with it.
#[test]
fn exited_client_figures_survive_without_stats_keep() {
    let curl = require_tool("curl", "curl");
    let python = require_tool("python3", "python3");
    let w = SmcWorld::new();
    let www = w.subdir("www");
    let body = pseudo_random(2 << 20, 5, false);
    std::fs::write(www.join("f.bin"), &body).unwrap();
    let port = free_port();
    let mut c = w.run(&python);
    http_server_args(&mut c, "127.0.0.1", port, &www);
    let log = w.dir.join("http.log");
    let mut srv = spawn_logged(c, &log);
    wait_listening(&mut srv, port, T, "python3 -m http.server", Some(&log));
    let out = w.dir.join("got.bin");
    let mut c = w.run(&curl);
    c.env_remove("SMC_STATS_KEEP")
        .args(["-sS", "-f", "-o"])
        .arg(&out)
        .arg(format!("http://127.0.0.1:{port}/f.bin"));
    run_to_end(c, &w.subdir("logs"), None, T).ok();
    assert_eq!(std::fs::read(&out).unwrap(), body, "fetched file differs");
    let s = wait_server_closed(&w, srv.0.id(), 1, "python http.server");
    assert!(s.get("tx_bytes") >= body.len() as u64, "{}", brief(&s));
    let files = w.stats_files();
    let sum = w.stats_sum();
    assert_eq!(
        (sum.get("smcd_client"), sum.get("smcd_server")),
        (1, 1),
        "the exited curl's SMC-D connection is missing from the statistics directory \
         (files {:?}): {}",
        files.keys().collect::<Vec<_>>(),
        brief(&sum)
    );
    assert_eq!(sum.get("rx_bytes"), sum.get("tx_bytes"), "{}", brief(&sum));
}

/// A Python program's test run: its output (stdout and stderr) and exit status.
struct SuiteRun {
    out: String,
    code: Option<i32>,
}

/// Runs `/usr/bin/python3 ARGS` in `w`'s world under the library and, side by side, over plain
/// TCP in a network namespace of its own (loopback up: some tests bind fixed names, such as
/// CPython's abstract Unix sockets `\0python\0test\0`, that the two runs would otherwise take
/// from each other), each in a directory of its own. Returns (library, TCP).
fn python_suite_both_ways(w: &SmcWorld, tag: &str, args: &[&str]) -> (SuiteRun, SuiteRun) {
    let python = Path::new("/usr/bin/python3");
    let logs = w.subdir("logs");
    let run = |smc: bool| {
        let mut c = if smc {
            w.run(python)
        } else {
            let mut c = std::process::Command::new("unshare");
            c.args([
                "-n",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec \"$0\" \"$@\"",
            ])
            .arg(python);
            c
        };
        let dir = format!("{tag}-{}", if smc { "smc" } else { "tcp" });
        c.current_dir(w.subdir(&dir)).args(args);
        let f = run_to_end(c, &logs, None, Duration::from_secs(900));
        SuiteRun {
            out: format!("{}\n{}", f.text(), f.stderr),
            code: f.status.code(),
        }
    };
    std::thread::scope(|s| {
        let smc = s.spawn(|| run(true));
        let tcp = run(false);
        (smc.join().unwrap(), tcp)
    })
}

/// The tests a unittest (`FAIL: name`, `ERROR: name`) or trial (`name ... [FAIL]`,
/// `[ERROR]`) run reports as failed.
fn suite_failures(out: &str) -> std::collections::BTreeSet<String> {
    out.lines()
        .filter_map(|l| {
            if l.starts_with("FAIL: ") || l.starts_with("ERROR: ") {
                return Some(l.to_string());
            }
            let (name, verdict) = l.rsplit_once(" ... ")?;
            matches!(verdict.trim(), "[FAIL]" | "[ERROR]")
                .then(|| l.to_string())
                .filter(|_| !name.is_empty())
        })
        .collect()
}

/// How many tests ran: the sum of the run's `Ran N tests` lines (one per unittest module).
fn suite_total(out: &str) -> u64 {
    out.lines()
        .filter_map(|l| {
            l.strip_prefix("Ran ")?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The library's run of a test suite did what the plain one did: at least `min_tests` ran,
/// as many both ways, the same ones failed, the same exit status.
fn assert_suite_as_over_tcp(what: &str, smc: &SuiteRun, tcp: &SuiteRun, min_tests: u64) {
    let last = |out: &str, n: usize| {
        let l: Vec<&str> = out.lines().collect();
        l[l.len().saturating_sub(n)..].join("\n")
    };
    assert!(
        suite_total(&tcp.out) >= min_tests,
        "{what}: the plain run ran {} tests: {}",
        suite_total(&tcp.out),
        last(&tcp.out, 30)
    );
    assert_eq!(
        suite_failures(&smc.out),
        suite_failures(&tcp.out),
        "{what}: tests that fail under the library differ from those over TCP; library run: {}",
        last(&smc.out, 60)
    );
    assert_eq!(
        suite_total(&smc.out),
        suite_total(&tcp.out),
        "{what}: tests run differ"
    );
    assert_eq!(
        smc.code,
        tcp.code,
        "{what}: exit status differs: {}",
        last(&smc.out, 30)
    );
}

/// Fails with the package to install unless `/usr/bin/python3` imports `module`.
fn require_python_module(module: &str, package: &str) {
    let have = std::process::Command::new("/usr/bin/python3")
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        have,
        "Python module {module} is missing: `cargo xtask setup` installs it \
         (apt-get install -y {package})"
    );
}

/// CPython's own tests of sockets, TLS and asyncio streams (Debian's `libpython3.11-testsuite`):
/// a test suite nobody here wrote, that checks the calls one by one. Run under the library
/// and over plain TCP side by side, the same tests must run and the same ones fail (none on
/// this host), and the library's run must have moved connections over SMC-D. It found a
/// difference: a non-blocking write before the server's Accept said `EAGAIN` where TCP takes
/// the bytes (`test_ssl` `test_subclass`: `SSLWantWriteError`; `test_asyncio.test_sslproto`
/// `test_start_tls_client_reg_proto_1`: an assertion in asyncio's flow control).
#[test]
fn cpython_socket_test_suites_pass_as_over_tcp() {
    require_python_module(
        "test.test_socket, test.test_asyncio.test_sslproto",
        "libpython3.11-testsuite",
    );
    const MODULES: &[&str] = &[
        "test_socket",
        "test_ssl",
        "test_asyncio.test_sslproto",
        "test_asyncio.test_sock_lowlevel",
        "test_asyncio.test_streams",
        "test_asyncio.test_server",
        "test_selectors",
        "test_httplib",
    ];
    let w = SmcWorld::new();
    // The VSOCK tests wait for ever on a host without a vsock transport, either way.
    let mut args = vec!["-m", "test", "-v", "-i", "*VSOCK*"];
    args.extend_from_slice(MODULES);
    // Side by side: the two runs take ~1.5 min each, mostly in their tests' own timeouts.
    let (smc, tcp) = python_suite_both_ways(&w, "cpython", &args);
    assert_suite_as_over_tcp("CPython", &smc, &tcp, 1000);
    let sum = w.stats_sum();
    assert!(
        sum.get("smcd_client") >= 50,
        "the suites made almost no SMC-D connections under the library: {}",
        brief(&sum)
    );
}

/// Two networking frameworks' own test suites (Debian's `python3-tornado` and
/// `python3-twisted`), nobody here wrote either: Tornado's whole suite (its IOLoop on epoll,
/// IOStream, TCP server and client, HTTP/1.1 server and clients, subprocesses; ~1 200 tests)
/// and Twisted's reactor, TCP, TLS, Unix socket, process and endpoint tests, its HTTP, SMTP,
/// FTP and IRC protocols (~2 600 tests, each on the epoll, poll, select and asyncio reactors).
/// Under the library and over TCP, the same tests run and the same ones fail (Twisted's GLib
/// reactors' `test_closePeerOnEMFILE` and a few environment ones, both ways).
#[test]
fn tornado_and_twisted_test_suites_pass_as_over_tcp() {
    require_python_module("tornado.test.runtests", "python3-tornado");
    require_python_module("twisted.trial", "python3-twisted");
    let w = SmcWorld::new();
    let (smc, tcp) =
        python_suite_both_ways(&w, "tornado", &["-m", "tornado.test.runtests", "--verbose"]);
    assert_suite_as_over_tcp("Tornado", &smc, &tcp, 1000);
    let tornado = w.stats_sum();
    assert!(
        tornado.get("smcd_client") >= 50,
        "Tornado's suite made almost no SMC-D connections under the library: {}",
        brief(&tornado)
    );
    let (smc, tcp) = python_suite_both_ways(
        &w,
        "twisted",
        &[
            "-m",
            "twisted.trial",
            "--reporter=bwverbose",
            "twisted.internet.test.test_tcp",
            "twisted.internet.test.test_tls",
            "twisted.internet.test.test_unix",
            "twisted.internet.test.test_socket",
            "twisted.internet.test.test_process",
            "twisted.internet.test.test_posixprocess",
            "twisted.internet.test.test_endpoints",
            "twisted.test.test_tcp",
            "twisted.test.test_loopback",
            "twisted.test.test_protocols",
            "twisted.web.test.test_http",
            "twisted.web.test.test_agent",
            "twisted.mail.test.test_smtp",
            "twisted.words.test.test_irc",
            "twisted.test.test_ftp",
        ],
    );
    assert_suite_as_over_tcp("Twisted", &smc, &tcp, 2000);
    let sum = w.stats_sum();
    assert!(
        sum.get("smcd_client") >= tornado.get("smcd_client") + 50,
        "Twisted's suite made almost no SMC-D connections under the library: {}",
        brief(&sum)
    );
}

/// OpenSSH: `sshd` re-executes itself for every connection (the accepted socket crosses an
/// `exec`), hands it between its privilege-separated processes and serves the session from a
/// child sandboxed with seccomp after the connection was made; `ssh` runs commands, uploads
/// and downloads 3 MB through `cat` and returns an exit status. Under the library (both
/// ends) and over plain TCP the same output; under the library every connection SMC-D.
#[test]
fn ssh_sessions_through_sshd_privsep_and_sandbox_over_smcd() {
    let sshd = require_tool("sshd", "openssh-server");
    let ssh = require_tool("ssh", "openssh-client");
    let keygen = require_tool("ssh-keygen", "openssh-client");
    let w = SmcWorld::new();
    let d = w.subdir("ssh");
    // sshd's privilege separation directory (the package makes it at boot).
    std::fs::create_dir_all("/run/sshd").expect("mkdir /run/sshd");
    for key in ["hostkey", "userkey"] {
        let st = std::process::Command::new(&keygen)
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(d.join(key))
            .status()
            .expect("ssh-keygen");
        assert!(st.success(), "ssh-keygen {key}: {st}");
    }
    std::fs::copy(d.join("userkey.pub"), d.join("authorized_keys")).expect("authorized_keys");
    let blob = pseudo_random(3 << 20, 22, false);
    std::fs::write(d.join("blob"), &blob).expect("write blob");
    let session = |smc: bool| -> Vec<String> {
        let port = free_port();
        let tag = if smc { "smc" } else { "tcp" };
        let cfg = d.join(format!("sshd_config.{tag}"));
        std::fs::write(
            &cfg,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/hostkey\n\
                 PidFile {dir}/sshd.{tag}.pid\nAuthorizedKeysFile {dir}/authorized_keys\n\
                 PermitRootLogin yes\nUsePAM no\nStrictModes no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\n",
                dir = d.display()
            ),
        )
        .expect("sshd_config");
        let cmd = |p: &Path| {
            if smc {
                w.run(p)
            } else {
                std::process::Command::new(p)
            }
        };
        let mut c = cmd(&sshd);
        c.args(["-D", "-e", "-f"]).arg(&cfg);
        let log = d.join(format!("sshd.{tag}.log"));
        let mut srv = spawn_logged(c, &log);
        wait_listening(&mut srv, port, T, "sshd", Some(&log));
        let client = |remote: &str, stdin: Option<std::fs::File>| {
            let mut c = cmd(&ssh);
            c.arg("-q").arg("-i").arg(d.join("userkey")).args([
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
                "UserKnownHostsFile=/dev/null",
                "-o",
                "BatchMode=yes",
                "-p",
                &port.to_string(),
                "root@127.0.0.1",
                remote,
            ]);
            run_to_end(c, &w.subdir("logs"), stdin, T)
        };
        let mut seen = Vec::new();
        for i in 0..3 {
            let r = client(&format!("echo hello-{i}"), None);
            seen.push(format!(
                "echo {i}: {:?} {}",
                r.status.code(),
                r.text().trim()
            ));
        }
        let copy = d.join(format!("blob.{tag}"));
        let up = client(
            &format!("cat > {}", copy.display()),
            Some(std::fs::File::open(d.join("blob")).expect("open blob")),
        );
        let got = std::fs::read(&copy).unwrap_or_default();
        seen.push(format!(
            "upload: {:?} {} bytes, sha256 {}",
            up.status.code(),
            got.len(),
            sha256_hex(&got)
        ));
        let down = client(&format!("cat {}", d.join("blob").display()), None);
        seen.push(format!(
            "download: {:?} {} bytes, sha256 {}",
            down.status.code(),
            down.stdout.len(),
            sha256_hex(&down.stdout)
        ));
        let late = client("sleep 0.2; echo late; exit 3", None);
        seen.push(format!(
            "exit: {:?} {}",
            late.status.code(),
            late.text().trim()
        ));
        drop(srv);
        seen
    };
    let tcp = session(false);
    let smc = session(true);
    assert_eq!(
        tcp[3],
        format!(
            "upload: Some(0) {} bytes, sha256 {}",
            blob.len(),
            sha256_hex(&blob)
        ),
        "over TCP: {tcp:?}"
    );
    assert_eq!(smc, tcp, "ssh under the library differs from ssh over TCP");
    let sum = w.stats_sum();
    assert!(
        sum.get("smcd_client") >= 6 && sum.get("smcd_server") >= 6 && fallbacks(&sum) == 0,
        "ssh's connections did not all take SMC-D: {}",
        brief(&sum)
    );
}

/// The JDK's socket machinery, Perl's timeout idioms, Ruby's thread interrupts and Node's
/// socket hand-off to a child (`tests/redteam/rt27_java.java`, `rt27_perl.pl`, `rt27_ruby.rb`,
/// `rt27_node.js`), under the library and over TCP: the same observations line by line. Java
/// closes a socket another thread is blocked on by `dup2`ing a dead socketpair end over its
/// number and signalling the thread (`NioSocketImpl`, `NativeThread.signal`); before the wake
/// fix, `Socket.close`, `SocketChannel.close` and `Thread.interrupt` of a blocked read left the
/// reader asleep for ever under the library. Also selectors, asynchronous channels, timeouts,
/// urgent data, linger 0; Perl's `alarm` + `die` out of `sysread` and `readline`; Ruby's
/// `IO#close` of a socket another thread reads or writes (it wakes that thread with a signal and
/// raises `IOError` in it), `Timeout`, `Thread#raise` and `#kill` in blocking reads; Node's
/// `child.send('socket', s)` with bytes in flight, backpressure, destroy under a write,
/// half-open, idle timeouts, a reset.
#[test]
fn runtimes_socket_idioms_as_over_tcp() {
    let javac = require_tool("javac", "default-jdk-headless");
    let java = require_tool("java", "default-jdk-headless");
    let perl = require_tool("perl", "perl");
    let ruby = require_tool("ruby", "ruby");
    let node = require_tool("node", "nodejs");
    let w = SmcWorld::new();
    let classes = w.subdir("java");
    let redteam = Path::new(env!("CARGO_MANIFEST_DIR")).join("redteam");
    let st = std::process::Command::new(&javac)
        .arg("-d")
        .arg(&classes)
        .arg(redteam.join("rt27_java.java"))
        .status()
        .expect("javac");
    assert!(st.success(), "javac rt27_java.java: {st}");
    let logs = w.subdir("logs");
    let run = |prog: &Path, args: &[&std::ffi::OsStr], smc: bool| -> String {
        let mut c = if smc {
            w.run(prog)
        } else {
            std::process::Command::new(prog)
        };
        c.args(args);
        let f = run_to_end(c, &logs, None, T);
        assert_eq!(
            f.status.code(),
            Some(0),
            "{prog:?} (library: {smc}) failed: {}\n{}",
            f.text(),
            f.stderr
        );
        f.text()
    };
    let jargs = [
        std::ffi::OsStr::new("-cp"),
        classes.as_os_str(),
        std::ffi::OsStr::new("Rt27Java"),
    ];
    let script = redteam.join("rt27_perl.pl");
    let pargs = [script.as_os_str()];
    let rscript = redteam.join("rt27_ruby.rb");
    let rargs = [rscript.as_os_str()];
    let nscript = redteam.join("rt27_node.js");
    let nargs = [nscript.as_os_str()];
    for (what, prog, args, lines) in [
        ("java", &java, &jargs[..], 30),
        ("perl", &perl, &pargs[..], 12),
        ("ruby", &ruby, &rargs[..], 20),
        ("node", &node, &nargs[..], 7),
    ] {
        let tcp = run(prog, args, false);
        assert!(
            tcp.lines().count() >= lines && !tcp.contains("FAILED"),
            "{what} over TCP: {tcp}"
        );
        let smc = run(prog, args, true);
        assert_eq!(
            smc, tcp,
            "{what} under the library differs from {what} over TCP"
        );
        let sum = w.stats_sum();
        if what == "perl" {
            // Java and Perl: every connection SMC-D.
            assert!(
                sum.get("smcd_client") >= 15 && fallbacks(&sum) == 0,
                "the connections did not take SMC-D: {}",
                brief(&sum)
            );
        }
        if what == "ruby" || what == "node" {
            // Ruby makes every socket non-blocking: its echo clients write right after
            // connecting to a listener of their own process, which TCP takes at once, so they
            // stop waiting for the Accept (`TIMEOUT_CL`) and stay TCP
            // (`setup::write_before_accept`); nothing else may fall back.
            let timeout_cl = smc_common::diag::Diag::TimeoutCl.code();
            assert_eq!(
                integration_tests::fallbacks_other_than(&sum, timeout_cl),
                0,
                "fallbacks other than TIMEOUT_CL: {}",
                brief(&sum)
            );
        }
    }
}
