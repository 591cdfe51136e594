//! The short-connection policy (`smc-preload/src/socket/policy.rs`) with real processes: a
//! client whose connections to one service are short (one request, one answer) and whose
//! connections to another are long keeps the short ones on TCP once it has seen 8 in a row to
//! that service, and its long ones to the other service still take SMC-D. The answers are the
//! same as over plain TCP.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use integration_tests::{brief, spawn_piped, SmcWorld};

const T: Duration = Duration::from_secs(60);

/// Two echo servers in threads: `short` gets 60 connections of one request and one answer;
/// `long` gets a connection of 10 round trips after every 10th short one. Prints every
/// answer's length and hash.
const MIXED: &str = r#"
import hashlib, socket, threading
def server(ls):
    while True:
        c, _ = ls.accept()
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    break
                c.sendall(d)
ports = []
for _ in range(2):
    ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(16)
    ports.append(ls.getsockname()[1])
    threading.Thread(target=server, args=(ls,), daemon=True).start()
def exchange(port, rounds):
    h = hashlib.sha256()
    with socket.create_connection(("127.0.0.1", port)) as c:
        for r in range(rounds):
            m = b"%d " % r * 50
            c.sendall(m)
            got = b""
            while len(got) < len(m):
                got += c.recv(len(m) - len(got))
            h.update(got)
        c.shutdown(socket.SHUT_WR)
        assert c.recv(1) == b""
    return h.hexdigest()[:12]
out = []
for i in range(60):
    out.append(exchange(ports[0], 1))
    if i % 10 == 9:
        out.append(exchange(ports[1], 10))
print(" ".join(out))
"#;

#[test]
fn short_connections_to_one_service_stay_tcp_whatever_the_long_ones_to_another_do() {
    let w = SmcWorld::new();
    let py = w.subdir("py").join("mixed.py");
    std::fs::write(&py, MIXED).unwrap();
    let tcp = spawn_piped({
        let mut c = Command::new("python3");
        c.arg(&py);
        c
    })
    .wait_output(T)
    .expect("mixed.py over TCP");
    let mut c = w.run("python3");
    c.arg(&py);
    let out = spawn_piped(c).wait_output(T).expect("mixed.py");
    assert_eq!(out, tcp, "library against plain TCP");
    let s = w.stats_sum();
    // The 6 long connections and the first 8 short ones (before the policy learned) took
    // SMC-D; the other 52 short ones stayed TCP. (Before, with one run for the whole process,
    // the long connections to the other service stayed TCP as well once it had learned: 8
    // SMC-D, 58 TCP.)
    assert_eq!(s.get("smcd_client"), 6 + 8, "{}", brief(&s));
    assert_eq!(s.get("fallback_client"), 52, "{}", brief(&s));
}
