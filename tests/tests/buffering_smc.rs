//! Buffering capacity and memory that follows the traffic (issue 10 item 6, issue 14): a client
//! that writes a whole request before it reads anything, to a fork-per-connection echo server
//! (Python `socketserver.ForkingTCPServer`), completes over TCP because loopback TCP holds
//! several MB per direction; under the data path it must complete too (byte-exact, on SMC-D).
//! And once the connection is drained and idle, the rings' pages go back: the client's mappings
//! of both DMBs (`/proc/self/smaps`, the `memfd:smc-dmb` mappings) shrink to a few pages.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{brief, fallbacks, ready_port, spawn_piped, SmcWorld};
use std::time::Duration;

const T: Duration = Duration::from_secs(120);

const FORKING_ECHO_SERVER: &str = r#"
import socketserver
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(65536)
            if not b:
                return
            self.request.sendall(b)
srv = socketserver.ForkingTCPServer(("127.0.0.1", 0), Echo)
print("READY", srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// `client.py PORT N...`: per N, a new connection: write N bytes, then read N bytes back and
/// compare. A write that cannot complete (the connection holds less than N both ways together)
/// ends after `SO_SNDTIMEO` with `STUCK` instead of hanging. Then, with the connection kept
/// open and idle (blocking reads with `SO_RCVTIMEO`, until the figure drops or at most 20 s),
/// the resident bytes of the DMB mappings, before and after.
const CLIENT: &str = r#"
import socket, sys, struct, hashlib, time
def dmb_rss():
    total, cur = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split()[0] and len(line.split()) >= 5:
                cur = "memfd:smc-dmb" in line
            elif cur and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total
port = int(sys.argv[1])
for n in map(int, sys.argv[2:]):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 20, 0))
    data = bytes((i * 131 + n) & 0xFF for i in range(256)) * (n // 256) + b"x" * (n % 256)
    sent = 0
    try:
        while sent < n:
            sent += s.send(data[sent:sent + (1 << 20)])
    except OSError as e:
        print("STUCK", n, "after", sent, e, flush=True)
        sys.exit(1)
    got = bytearray()
    while len(got) < n:
        b = s.recv(1 << 20)
        if not b:
            print("EOF", n, "after", len(got), flush=True)
            sys.exit(1)
        got += b
    if hashlib.sha256(got).digest() != hashlib.sha256(data).digest():
        print("MISMATCH", n, flush=True)
        sys.exit(1)
    busy = dmb_rss()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 100000))
    t = time.monotonic()
    idle = busy
    while time.monotonic() - t < 20:
        try:
            s.recv(1)
        except OSError:
            pass
        idle = dmb_rss()
        if idle <= 256 * 1024:
            break
    print("OK", n, "busy", busy, "idle", idle, flush=True)
    s.close()
"#;

#[test]
fn write_before_read_to_a_forking_echo_server_and_memory_given_back() {
    let w = SmcWorld::new();
    let dir = w.subdir("py");
    let srv_py = dir.join("server.py");
    let cl_py = dir.join("client.py");
    std::fs::write(&srv_py, FORKING_ECHO_SERVER).expect("write server.py");
    std::fs::write(&cl_py, CLIENT).expect("write client.py");
    let mut c = w.run("python3");
    c.arg(&srv_py);
    let mut srv = spawn_piped(c);
    let port = ready_port(&mut srv);
    let mut c = w.run("python3");
    c.arg(&cl_py)
        .arg(port.to_string())
        .args(["3000000", "8000000"]);
    let out = spawn_piped(c)
        .wait_output(T)
        .unwrap_or_else(|e| panic!("client: {e}; figures: {}", brief(&w.stats_sum())));
    eprintln!("client: {out}");
    let sum = w.stats_sum();
    assert!(
        sum.get("smcd_client") >= 2 && sum.get("smcd_server") >= 2,
        "both connections must have been SMC-D: {}\n{out}",
        brief(&sum)
    );
    assert_eq!(fallbacks(&sum), 0, "{}", brief(&sum));
    for n in [3_000_000u64, 8_000_000] {
        let l = out
            .lines()
            .find(|l| l.starts_with(&format!("OK {n} ")))
            .unwrap_or_else(|| panic!("no OK for {n}: {out}"));
        let f: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let (busy, idle) = (f[1], f[2]);
        // Busy: the rings held the data (MBs resident); idle: header pages and the writers'
        // warm windows only.
        assert!(
            busy >= 1 << 20,
            "{n}: only {busy} bytes resident while busy: {l}"
        );
        assert!(
            idle <= 256 * 1024,
            "{n}: {idle} bytes still resident when idle: {l}"
        );
    }
    drop(srv);
}
