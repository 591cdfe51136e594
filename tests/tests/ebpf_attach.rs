//! The eBPF control plane on the real kernel: attach/detach per cgroup, the SMC option in the TCP
//! handshake, same-host detection, the sk_msg shortcut and its known failure modes.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{path::Path, process::Command, time::Duration};

use integration_tests::{
    bin, counters, delta, lock, ready_port, require_root, run_to_end, smc_ctl, spawn_piped,
    spawn_port, test_cgroup, Attached, Cgroup, NetnsPair, Proc, SmcWorld, PIN_ROOT,
};
use smc_common::bpf::{SOCK_OPTED_IN, SOCK_OPT_SENT, SOCK_PEER_SMC, SOCK_SAME_HOST, SOCK_SHORTCUT};

const T: Duration = Duration::from_secs(120);

fn flags(out: &str, side: &str) -> u32 {
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{side}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {side}= in {out:?}"))
}

fn pair(cg: &Cgroup, addr: &str, client_opt: bool, server_opt: bool) -> (u32, u32) {
    let mut c = cg.command(bin("smc-testprog"));
    c.args(["pair", addr]);
    if client_opt {
        c.arg("--client-opt");
    }
    if server_opt {
        c.arg("--server-opt");
    }
    let out = spawn_piped(c).wait_output(T).expect("pair");
    (flags(&out, "client"), flags(&out, "server"))
}

#[test]
fn option_negotiated_only_when_both_ends_opt_in() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        let before = counters();
        let (c, s) = pair(&cg, addr, true, true);
        let after = counters();
        assert_eq!(
            c & (SOCK_OPT_SENT | SOCK_PEER_SMC),
            SOCK_OPT_SENT | SOCK_PEER_SMC,
            "{addr} client {c:#x}"
        );
        assert_eq!(
            s & (SOCK_OPT_SENT | SOCK_PEER_SMC),
            SOCK_OPT_SENT | SOCK_PEER_SMC,
            "{addr} server {s:#x}"
        );
        assert_eq!(delta(&before, &after, "syn_opt_sent"), 1);
        assert_eq!(delta(&before, &after, "synack_opt_sent"), 1);
        assert_eq!(delta(&before, &after, "synack_opt_received"), 1);
        assert_eq!(delta(&before, &after, "syn_opt_received"), 1);

        // Only the client asked: the SYN carries it, the SYN-ACK does not, nobody sees a peer.
        let before = counters();
        let (c, s) = pair(&cg, addr, true, false);
        let after = counters();
        assert_eq!(c & SOCK_PEER_SMC, 0, "{addr} client {c:#x}");
        assert_eq!(
            s & (SOCK_OPT_SENT | SOCK_PEER_SMC),
            0,
            "{addr} server {s:#x}"
        );
        assert_eq!(delta(&before, &after, "syn_opt_sent"), 1);
        assert_eq!(delta(&before, &after, "synack_opt_sent"), 0);

        // Only the server asked: nothing on the wire at all.
        let before = counters();
        let (c, s) = pair(&cg, addr, false, true);
        let after = counters();
        assert_eq!(
            c & (SOCK_OPTED_IN | SOCK_PEER_SMC),
            0,
            "{addr} client {c:#x}"
        );
        assert_eq!(
            s & (SOCK_OPT_SENT | SOCK_PEER_SMC),
            0,
            "{addr} server {s:#x}"
        );
        assert_eq!(
            delta(&before, &after, "syn_opt_sent") + delta(&before, &after, "synack_opt_sent"),
            0
        );
    }
}

/// With `--tcp-records on`, a pair that never announced SMC is known as same-host to the eBPF
/// programs (off, the default, see below: only to `conns`).
#[test]
fn same_host_detected_over_loopback_v4_v6() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::with(&cg, "ism", &["--tcp-records", "on"]);
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        let before = counters();
        let (c, s) = pair(&cg, addr, false, false);
        let after = counters();
        assert_ne!(s & SOCK_SAME_HOST, 0, "{addr} server {s:#x}");
        assert_ne!(c & SOCK_SAME_HOST, 0, "{addr} client {c:#x}");
        assert_eq!(delta(&before, &after, "same_host_pairs"), 1, "{addr}");
        assert_eq!(delta(&before, &after, "sockets_established"), 2, "{addr}");
    }
}

/// What one end's socket knew at the end: `SOCK_*` flags and bytes it sent via the shortcut.
#[derive(Debug, Clone, Copy)]
struct End {
    flags: u32,
    redirected: u64,
}

fn end_state(report: &str) -> End {
    let v = report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("state="))
        .unwrap_or_else(|| panic!("no state= in {report:?}"));
    if v == "none" {
        return End {
            flags: 0,
            redirected: 0,
        };
    }
    let (f, b) = v.split_once('/').expect("flags/bytes");
    End {
        flags: f.parse().unwrap(),
        redirected: b.parse().unwrap(),
    }
}

/// Streams `bytes` from a client to a server (and `reply` bytes back), checks both hashes and
/// returns what the client's and the server's sockets knew.
fn stream(srv: Command, cli: Command, host: &str, bytes: u64, reply: u64) -> (End, End) {
    stream_with(srv, cli, &[], host, bytes, reply)
}

fn stream_with(
    mut srv: Command,
    mut cli: Command,
    cli_flags: &[&str],
    host: &str,
    bytes: u64,
    reply: u64,
) -> (End, End) {
    srv.args(["--reply", &reply.to_string()]);
    let (srv, port) = spawn_port(srv, "PORT ");
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    cli.args([
        "client",
        &target,
        &bytes.to_string(),
        "12345",
        "--max-chunk",
        "200000",
    ]);
    cli.args(cli_flags);
    let cli_out = spawn_piped(cli).wait_output(T).expect("client");
    let srv_out = srv.wait_output(T).expect("server");
    let sent: Vec<&str> = cli_out.split_whitespace().collect();
    let got: Vec<&str> = srv_out.split_whitespace().collect();
    assert_eq!(sent[0], "OK", "client: {cli_out}");
    assert_eq!(got[0], "SHA", "server: {srv_out}");
    assert_eq!(
        got[2], sent[1],
        "byte count: client {cli_out} server {srv_out}"
    );
    assert_eq!(
        got[1], sent[2],
        "sha256 differs: client {cli_out} server {srv_out}"
    );
    assert_eq!(
        sent[3],
        format!("back={reply}"),
        "reply after half-close: {cli_out}"
    );
    eprintln!("client: {cli_out}server: {srv_out}");
    (end_state(&cli_out), end_state(&srv_out))
}

fn testprog_in(cg: &Cgroup) -> Command {
    cg.command(bin("smc-testprog"))
}

#[test]
fn shortcut_delivers_identical_streams_with_half_close() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    let mut s = testprog_in(&cg);
    s.args(["server", "127.0.0.1:0"]);
    let (c, s) = stream(s, testprog_in(&cg), "127.0.0.1", 256 << 20, 3 << 20);
    // Both directions went through the shortcut, every byte of them.
    assert!(
        c.flags & SOCK_SHORTCUT != 0 && s.flags & SOCK_SHORTCUT != 0,
        "{c:?} {s:?}"
    );
    assert_eq!(c.redirected, 256 << 20, "{c:?}");
    assert_eq!(s.redirected, 3 << 20, "{s:?}");
}

#[test]
fn shortcut_v4_mapped_client_to_v4_server() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    let mut s = testprog_in(&cg);
    s.args(["server", "0.0.0.0:0"]);
    // An AF_INET6 socket talking to an AF_INET one: keys must match (no EACCES, redirected).
    let (c, s) = stream(s, testprog_in(&cg), "::ffff:127.0.0.1", 8 << 20, 1 << 20);
    assert_eq!(c.redirected, 8 << 20, "{c:?}");
    assert_eq!(s.redirected, 1 << 20, "{s:?}");
    assert!(s.flags & SOCK_SAME_HOST != 0, "{s:?}");
}

#[test]
fn shortcut_one_end_outside_the_cgroup_stays_tcp() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    // Server outside any attached cgroup, client inside.
    let mut s = Command::new(bin("smc-testprog"));
    s.args(["server", "127.0.0.1:0"]);
    let (c, _) = stream(s, testprog_in(&cg), "127.0.0.1", 16 << 20, 1 << 20);
    assert_eq!(c.redirected, 0, "{c:?}");
    assert!(c.flags & SOCK_SAME_HOST == 0, "{c:?}");
    // And the reverse.
    let mut s = testprog_in(&cg);
    s.args(["server", "127.0.0.1:0"]);
    let (_, s) = stream(
        s,
        Command::new(bin("smc-testprog")),
        "127.0.0.1",
        16 << 20,
        1 << 20,
    );
    assert_eq!(s.redirected, 0, "{s:?}");
}

#[test]
fn same_host_across_network_namespaces_and_other_host_untouched() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    let ns = NetnsPair::new().expect("netns pair");
    let prog = bin("smc-testprog");

    // Both ends in the cgroup, in two namespaces joined by veth: same host, shortcut.
    let before = counters();
    let mut s = NetnsPair::command(&ns.b, Some(&cg), &prog);
    s.args(["server", &format!("{}:0", ns.addr_b)]);
    let (c, s) = stream(
        s,
        NetnsPair::command(&ns.a, Some(&cg), &prog),
        &ns.addr_b,
        32 << 20,
        1 << 20,
    );
    let after = counters();
    assert!(delta(&before, &after, "same_host_pairs") >= 1);
    assert!(
        c.flags & SOCK_SAME_HOST != 0 && s.flags & SOCK_SAME_HOST != 0,
        "{c:?} {s:?}"
    );
    assert_eq!(c.redirected, 32 << 20, "{c:?}");
    assert_eq!(s.redirected, 1 << 20, "{s:?}");

    // The server namespace is "another host" (not in the cgroup): plain TCP, intact.
    let mut s = NetnsPair::command(&ns.b, None, &prog);
    s.args(["server", &format!("{}:0", ns.addr_b)]);
    let (c, _) = stream(
        s,
        NetnsPair::command(&ns.a, Some(&cg), &prog),
        &ns.addr_b,
        32 << 20,
        1 << 20,
    );
    assert!(c.flags & SOCK_SAME_HOST == 0, "{c:?}");
    assert_eq!(c.redirected, 0, "{c:?}");
}

#[test]
fn ism_mode_never_redirects_application_payload() {
    // In ism mode the shortcut only carries the data path's own control traffic: splice readers
    // and stalled readers see plain TCP semantics (the two cases sockmap cannot make safe).
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    let mut s = testprog_in(&cg);
    s.args(["server", "127.0.0.1:0", "--splice", "--opt-in"]);
    let (c, s) = stream_with(s, testprog_in(&cg), &["--opt-in"], "127.0.0.1", 16 << 20, 0);
    assert!(
        c.flags & SOCK_PEER_SMC != 0 && s.flags & SOCK_SAME_HOST != 0,
        "{c:?} {s:?}"
    );
    assert_eq!(c.redirected + s.redirected, 0, "{c:?} {s:?}");
    let mut st = testprog_in(&cg);
    st.args(["stall", "127.0.0.1:0"]);
    let out = spawn_piped(st).wait_output(T).expect("stall");
    let queued: u64 = out
        .trim()
        .strip_prefix("QUEUED ")
        .and_then(|v| v.parse().ok())
        .expect("QUEUED");
    assert!(
        queued < 64 << 20,
        "a stalled reader let {queued} bytes queue"
    );
}

#[test]
fn process_outside_the_cgroup_is_untouched() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    let before = counters();
    let out = spawn_piped({
        let mut c = Command::new(bin("smc-testprog"));
        c.args(["pair", "127.0.0.1:0"]);
        c
    })
    .wait_output(T)
    .unwrap();
    let after = counters();
    // Outside an attached cgroup the private socket option does not even exist.
    assert_eq!(flags(&out, "client"), u32::MAX, "{out}");
    assert_eq!(delta(&before, &after, "sockets_established"), 0);
}

/// `SMC_SO_CGROUP` answers a process of an attached cgroup (or of a cgroup below it) its own
/// cgroup's id, the inode of its directory, which the data path records in its statistics
/// file instead of reading `/proc/self/mountinfo`; outside, no program answers it.
#[test]
fn the_cgroup_option_tells_the_callers_own_cgroup() {
    use std::os::unix::fs::MetadataExt as _;
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    let rel = cg
        .path
        .strip_prefix(integration_tests::cgroup2_root())
        .unwrap();
    let sub = Cgroup::new(&rel.join("below").to_string_lossy()).unwrap();
    let ask = |dir: Option<&Path>| {
        let mut c = Command::new("python3");
        c.args([
            "-c",
            &format!(
                "import socket,struct\ns=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n\
                 try:\n print(struct.unpack('<Q',s.getsockopt({},{},8))[0])\n\
                 except OSError as e:\n print('errno',e.errno)",
                smc_common::bpf::SOL_SMC_BPF,
                smc_common::bpf::SMC_SO_CGROUP
            ),
        ]);
        if let Some(d) = dir {
            smc_cgroup::join_before_exec(&mut c, d);
        }
        spawn_piped(c).wait_output(T).unwrap().trim().to_owned()
    };
    let own = ask(Some(&cg.path));
    let below = ask(Some(&sub.path));
    let outside = ask(None);
    assert_eq!(own, std::fs::metadata(&cg.path).unwrap().ino().to_string());
    assert_ne!(below, own, "a sub-cgroup's process is told its own cgroup");
    assert!(below.parse::<u64>().is_ok(), "{below}");
    // A Unix socket has no option levels but SOL_SOCKET: EOPNOTSUPP.
    assert_eq!(
        outside,
        format!("errno {}", libc::EOPNOTSUPP),
        "outside: {outside}"
    );
}

/// The pinned links of the given cgroups (others' cgroups may be attached on this host).
fn pinned_links(cgs: &[&Cgroup]) -> Vec<String> {
    use std::os::unix::fs::MetadataExt as _;
    let inos: Vec<String> = cgs
        .iter()
        .map(|c| format!("{}-", std::fs::metadata(&c.path).unwrap().ino()))
        .collect();
    std::fs::read_dir(Path::new(PIN_ROOT).join("links"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| inos.iter().any(|i| n.starts_with(i.as_str())))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn two_cgroups_attach_and_detach_independently_and_leave_nothing() {
    require_root();
    let _l = lock();
    let a = test_cgroup();
    let b = test_cgroup();
    let pa = a.path.to_str().unwrap();
    let pb = b.path.to_str().unwrap();
    assert!(smc_ctl(&["attach", "--cgroup", pa, "--mode", "shortcut"])
        .status
        .success());
    // Attaching twice is a no-op.
    let again = smc_ctl(&["attach", "--cgroup", pa, "--mode", "shortcut"]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains("already attached"));
    assert!(smc_ctl(&["attach", "--cgroup", pb, "--mode", "ism"])
        .status
        .success());
    assert_eq!(
        pinned_links(&[&a, &b]).len(),
        6,
        "{:?}",
        pinned_links(&[&a, &b])
    );

    let st: serde_json::Value =
        serde_json::from_slice(&smc_ctl(&["status", "--json"]).stdout).unwrap();
    let cgs = st["cgroups"].as_array().unwrap();
    assert!(
        cgs.iter()
            .any(|c| c["cgroup"] == pa && c["mode"] == "shortcut"),
        "{st}"
    );
    assert!(
        cgs.iter().any(|c| c["cgroup"] == pb && c["mode"] == "ism"),
        "{st}"
    );

    // Detaching one leaves the other working.
    assert!(smc_ctl(&["detach", "--cgroup", pa]).status.success());
    let (c, s) = pair(&b, "127.0.0.1:0", true, true);
    assert_ne!(c & SOCK_PEER_SMC, 0);
    assert_ne!(s & SOCK_PEER_SMC, 0);
    let (c, _) = pair(&a, "127.0.0.1:0", true, true);
    assert_eq!(
        c,
        u32::MAX,
        "detached cgroup still answers the private option"
    );

    let not = smc_ctl(&["detach", "--cgroup", pa]);
    assert!(!not.status.success());
    assert!(String::from_utf8_lossy(&not.stderr).contains("not attached"));

    let last = smc_ctl(&["detach", "--cgroup", pb]);
    assert!(last.status.success());
    assert!(pinned_links(&[&a, &b]).is_empty());
    // When no other cgroup on the host is attached, the last detach unloads everything.
    if String::from_utf8_lossy(&last.stdout).contains("unloaded") {
        assert!(!Path::new(PIN_ROOT).exists(), "{PIN_ROOT} left behind");
    }
    let show = Command::new("bpftool")
        .args(["cgroup", "show", pb])
        .output();
    if let Ok(show) = show {
        assert!(
            String::from_utf8_lossy(&show.stdout).trim().lines().count() <= 1,
            "{:?}",
            show
        );
    }
}

#[test]
fn clear_errors() {
    require_root();
    let _l = lock();
    let out = smc_ctl(&["attach", "--cgroup", "/tmp"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a cgroup v2 directory"));
    let out = smc_ctl(&["attach", "--cgroup", "/nonexistent/cg"]);
    assert!(!out.status.success());
    let out = Command::new(bin("smc-ctl"))
        .args(["status"])
        .env("PATH", "/usr/bin:/bin")
        .uid(65534)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs root"));
}

trait Uid {
    fn uid(&mut self, uid: u32) -> &mut Self;
}
impl Uid for Command {
    fn uid(&mut self, uid: u32) -> &mut Self {
        std::os::unix::process::CommandExt::uid(self, uid)
    }
}

#[test]
fn a_cgroup_removed_while_attached_leaves_no_links() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let path = cg.path.to_str().unwrap().to_owned();
    let out = smc_ctl(&["attach", "--cgroup", &path, "--mode", "ism"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(pinned_links(&[&cg]).len(), 3);
    let ino = {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(&cg.path).unwrap().ino()
    };
    drop(cg); // removes the directory, the links stay pinned but defunct
    assert!(!Path::new(&path).exists());
    let out = smc_ctl(&["detach", "--cgroup", &path]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no longer exists"));
    let left: Vec<String> = std::fs::read_dir(Path::new(PIN_ROOT).join("links"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        !left.iter().any(|n| n.starts_with(&format!("{ino}-"))),
        "{left:?}"
    );
}

/// Runs `smc-testprog pair` in `cg` (client opted in, server not): the server's port.
fn pair_port(cg: &Cgroup) -> u16 {
    let mut c = cg.command(bin("smc-testprog"));
    c.args(["pair", "127.0.0.1:0", "--client-opt"]);
    let out = spawn_piped(c).wait_output(T).expect("pair");
    out.split_whitespace()
        .find_map(|kv| kv.strip_prefix("port="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no port= in {out:?}"))
}

/// Whether a trace line is about a connection to or from `port`.
fn mentions(line: &str, port: u16) -> bool {
    [
        format!(" {port}:"),
        format!(" {port}->"),
        format!("->{port}:"),
    ]
    .iter()
    .any(|p| line.contains(p.as_str()))
}

/// `smc-ctl trace` with its stdout lines on a channel.
fn start_trace() -> (Proc, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut c = Command::new(bin("smc-ctl"));
    c.arg("trace");
    let mut p = spawn_piped(c);
    let out = p.0.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (p, rx)
}

/// Makes connections until the trace reports the client end of one of them as having stayed
/// TCP because its peer did not announce SMC; returns every line read and that port.
fn traced_connection(cg: &Cgroup, rx: &std::sync::mpsc::Receiver<String>) -> (Vec<String>, u16) {
    let deadline = std::time::Instant::now() + T;
    let mut lines = Vec::new();
    while std::time::Instant::now() < deadline {
        // Connections made before the trace switched the lines on are not reported: retry.
        let port = pair_port(cg);
        let want = format!("->{port}: the peer did not announce SMC: stays TCP");
        let wait = std::time::Instant::now() + Duration::from_secs(2);
        while let Some(left) = wait.checked_duration_since(std::time::Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(l) => {
                    let found = l.starts_with("established ") && l.ends_with(&want);
                    lines.push(l);
                    if found {
                        return (lines, port);
                    }
                }
                Err(_) => break,
            }
        }
    }
    panic!("smc-ctl trace never explained a connection; it printed {lines:#?}");
}

/// `smc-ctl trace` says why a connection stayed TCP, and the programs write nothing while no
/// trace runs (records written then would wait in the ring buffer for the next reader).
#[test]
fn trace_says_why_a_connection_stayed_tcp() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    let before = pair_port(&cg);

    let (mut trace, rx) = start_trace();
    let (lines, port) = traced_connection(&cg, &rx);
    // The server end, in the same cgroup, did not opt in.
    let server = format!("established {port}->");
    let deadline = std::time::Instant::now() + T;
    let mut all = lines;
    while !all
        .iter()
        .any(|l| l.starts_with(&server) && l.ends_with("did not opt in (SMC_SO_ENABLE): stays TCP"))
    {
        let left = deadline
            .checked_duration_since(std::time::Instant::now())
            .unwrap_or_else(|| panic!("no server line {server}... in {all:#?}"));
        match rx.recv_timeout(left) {
            Ok(l) => all.push(l),
            Err(e) => panic!("no server line {server}... ({e}) in {all:#?}"),
        }
    }
    assert!(
        all.iter()
            .any(|l| l.starts_with("connect ")
                && l.ends_with(&format!("->{port}: SYN announces SMC"))),
        "no connect line for port {port} in {all:#?}"
    );
    assert!(
        !all.iter().any(|l| mentions(l, before)),
        "a connection made before the trace was reported: {all:#?}"
    );
    // SAFETY: the pid of our live child.
    unsafe { libc::kill(trace.0.id() as i32, libc::SIGTERM) };
    let status = trace.0.wait().expect("wait for smc-ctl trace");
    assert!(status.success(), "smc-ctl trace exited with {status}");

    // Stopped: the switch is off again, so the next trace sees nothing of this connection.
    let after = pair_port(&cg);
    let (_trace, rx) = start_trace();
    let (lines, _) = traced_connection(&cg, &rx);
    assert!(
        !lines.iter().any(|l| mentions(l, after)),
        "a connection made between two traces was reported: {lines:#?}"
    );
}

/// A loopback connection held open by a Python process in `cg` (neither end under the data
/// path); its listening port, once both ends are established.
fn held_connection(cg: &Cgroup) -> (Proc, u16) {
    let mut c = cg.command("python3");
    c.arg("-c").arg(
        "import socket, time\n\
         l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n\
         c = socket.create_connection(l.getsockname()); a, _ = l.accept()\n\
         print('READY', l.getsockname()[1], flush=True)\n\
         time.sleep(120)\n",
    );
    let mut p = spawn_piped(c);
    let port = ready_port(&mut p);
    (p, port)
}

/// What `smc-ctl conns --json` says of the two ends of the connection to `port`.
fn conns_of(cg: &Cgroup, port: u16) -> Vec<serde_json::Value> {
    let out = smc_ctl(&["conns", "--json", "--cgroup", cg.path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let p = format!(":{port}");
    let ends: Vec<serde_json::Value> = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "ESTABLISHED")
        .filter(|c| {
            c["local"].as_str().unwrap().ends_with(&p) || c["peer"].as_str().unwrap().ends_with(&p)
        })
        .cloned()
        .collect();
    assert_eq!(ends.len(), 2, "{v:#}");
    ends
}

fn tcp_records_of(cg: &Cgroup) -> serde_json::Value {
    let st: serde_json::Value =
        serde_json::from_slice(&smc_ctl(&["status", "--json"]).stdout).unwrap();
    st["cgroups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cgroup"] == cg.path.to_str().unwrap())
        .unwrap_or_else(|| panic!("{} not in {st:#}", cg.path.display()))["tcp_records"]
        .clone()
}

/// `--tcp-records off`, the default of an ism attach: a connection that cannot become SMC-D
/// leaves no same-host record (its ends learn nothing of each other; `conns` finds its other
/// end in the TCP tables), one whose ends both announce SMC is recorded as before;
/// `--tcp-records on` on the attached cgroup restores the records for new connections, and an
/// attach again without the option keeps the setting.
#[test]
fn tcp_records_off_leaves_no_record_of_connections_that_stay_tcp() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    assert_eq!(tcp_records_of(&cg), false);
    for addr in ["127.0.0.1:0", "[::1]:0"] {
        // Neither end opted in.
        let before = counters();
        let (c, s) = pair(&cg, addr, false, false);
        let after = counters();
        assert_eq!((c, s), (0, 0), "{addr}: client {c:#x} server {s:#x}");
        assert_eq!(delta(&before, &after, "same_host_pairs"), 0, "{addr}");
        assert_eq!(delta(&before, &after, "sockets_established"), 2, "{addr}");
        assert_eq!(delta(&before, &after, "state_queries"), 2, "{addr}");

        // Only the client announced: it keeps its own state, but no same-host record.
        let before = counters();
        let (c, s) = pair(&cg, addr, true, false);
        let after = counters();
        assert_eq!(
            c & (SOCK_OPT_SENT | SOCK_PEER_SMC | SOCK_SAME_HOST),
            SOCK_OPT_SENT
        );
        assert_eq!(s, 0, "{addr} server {s:#x}");
        assert_eq!(delta(&before, &after, "same_host_pairs"), 0, "{addr}");

        // Both announced: recorded and detected as before.
        let before = counters();
        let (c, s) = pair(&cg, addr, true, true);
        let after = counters();
        let want = SOCK_OPT_SENT | SOCK_PEER_SMC | SOCK_SAME_HOST;
        assert_eq!(c & want, want, "{addr} client {c:#x}");
        assert_eq!(s & want, want, "{addr} server {s:#x}");
        assert_eq!(delta(&before, &after, "same_host_pairs"), 1, "{addr}");
    }
    // `conns` tells from the TCP tables what the records would have said (`on` below).
    let (p, port) = held_connection(&cg);
    for e in conns_of(&cg, port) {
        assert_eq!(e["reason"], "NOT_ENABLED", "{e:#}");
        assert_eq!(e["same_host"], true, "{e:#}");
        assert_eq!(e["source"], "proc", "{e:#}");
        assert_eq!(e["flags"], serde_json::json!([]), "{e:#}");
    }
    drop(p);

    // Back on, for the connections made from now on.
    let cgp = cg.path.to_str().unwrap();
    let on = smc_ctl(&["attach", "--cgroup", cgp, "--tcp-records", "on"]);
    assert!(on.status.success(), "{on:?}");
    assert!(
        String::from_utf8_lossy(&on.stdout).contains("now tcp records on"),
        "{on:?}"
    );
    assert_eq!(tcp_records_of(&cg), true);
    let again = smc_ctl(&["attach", "--cgroup", cgp]);
    assert!(again.status.success(), "{again:?}");
    assert_eq!(tcp_records_of(&cg), true, "{again:?}");
    let before = counters();
    let (c, s) = pair(&cg, "127.0.0.1:0", false, false);
    let after = counters();
    assert_ne!(c & SOCK_SAME_HOST, 0, "client {c:#x}");
    assert_ne!(s & SOCK_SAME_HOST, 0, "server {s:#x}");
    assert_eq!(delta(&before, &after, "same_host_pairs"), 1);
    let (p, port) = held_connection(&cg);
    for e in conns_of(&cg, port) {
        assert_eq!(e["reason"], "NOT_ENABLED", "{e:#}");
        assert_eq!(e["same_host"], true, "{e:#}");
    }
    drop(p);
}

/// SMC-D under `--tcp-records off`: both ends under the data path take SMC-D; a client under
/// the data path against a server that is not stays TCP (`PEERNOSMC`) with its bytes intact.
#[test]
fn tcp_records_off_keeps_smcd() {
    let w = SmcWorld::with_args(&["--tcp-records", "off"], &[]);
    let logs = w.subdir("logs");
    let client = |port: u16, seed: u32| {
        let mut c = w.run(bin("preload-prog"));
        c.args([
            "client",
            "127.0.0.1",
            &port.to_string(),
            "300000",
            "200000",
            &seed.to_string(),
        ]);
        let f = run_to_end(c, &logs, None, T).ok();
        assert!(f.text().contains("CLIENT rx=200000 "), "{}", f.text());
    };
    let mut srv = w.run(bin("preload-prog"));
    srv.args(["server", "0", "thread", "2"]);
    let mut srv = spawn_piped(srv);
    let port = ready_port(&mut srv);
    client(port, 1);
    client(port, 2);
    srv.wait_output(T).expect("server");
    let v = w.stats_json();
    let c = &v["connections"];
    assert_eq!(c["smcd_client"], 2, "{v:#}");
    assert_eq!(c["smcd_server"], 2, "{v:#}");
    assert_eq!(c["tcp_fallback"], 0, "{v:#}");

    // The same server without the library, in the cgroup: the client stays TCP.
    let mut srv = w.cgroup().command(bin("preload-prog"));
    srv.args(["server", "0", "thread", "1"]);
    let mut srv = spawn_piped(srv);
    let port = ready_port(&mut srv);
    client(port, 3);
    srv.wait_output(T).expect("plain server");
    let v = w.stats_json();
    let c = &v["connections"];
    assert_eq!(c["smcd_client"], 2, "{v:#}");
    assert_eq!(c["tcp_fallback_client"], 1, "{v:#}");

    // Held open, such a connection is in `conns` as with the records: the library's end
    // `PEERNOSMC`, the plain server's `NOT_ENABLED`, both on this host (from the TCP tables).
    let mut srv = w.cgroup().command("python3");
    srv.arg("-c").arg(HOLD_SERVER);
    let mut srv = spawn_piped(srv);
    let port = ready_port(&mut srv);
    let mut cl = w.run("python3");
    cl.arg("-c").arg(format!(
        "import socket, time\n\
         c = socket.create_connection(('127.0.0.1', {port})); c.sendall(b'x'); c.recv(1)\n\
         print('READY', {port}, flush=True)\n\
         time.sleep(120)\n"
    ));
    let mut cl = spawn_piped(cl);
    ready_port(&mut cl);
    let ends = conns_of(w.cgroup(), port);
    let by_port = |server: bool| {
        ends.iter()
            .find(|e| e["local"].as_str().unwrap().ends_with(&format!(":{port}")) == server)
            .unwrap_or_else(|| {
                panic!(
                    "no {} end in {ends:#?}",
                    if server { "server" } else { "client" }
                )
            })
    };
    assert_eq!(by_port(false)["reason"], "PEERNOSMC", "{ends:#?}");
    assert_eq!(by_port(true)["reason"], "NOT_ENABLED", "{ends:#?}");
    for e in &ends {
        assert_eq!(e["same_host"], true, "{e:#}");
        assert_eq!(e["mode"], "TCP", "{e:#}");
    }
}

/// A plain server that accepts one connection, answers its byte and holds it.
const HOLD_SERVER: &str = "import socket, time\n\
     l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n\
     print('READY', l.getsockname()[1], flush=True)\n\
     a, _ = l.accept(); a.recv(1); a.sendall(b'y')\n\
     time.sleep(120)\n";
