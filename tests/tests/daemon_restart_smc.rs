//! The loopback-ism daemon restarted under live traffic, as an operator does it: stopped for an
//! upgrade (`SIGTERM`, `systemctl restart`) or crashed (`SIGKILL`), then started again on the
//! same socket. What is owed to the applications, compared with the same program over plain
//! TCP: the SMC-D connections already set up go on byte-exact (their DMBs are mapped by both
//! processes; the daemon is not on the data path), connections made while no daemon runs stay
//! TCP at once (no wait for a daemon that is not there), and once the new daemon listens new
//! connections take SMC-D again.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use integration_tests::{brief, spawn_piped, SmcWorld, Snapshot};

const T: Duration = Duration::from_secs(120);

/// An echo server and three long connections that keep echoing random messages (1 B to 200 KB,
/// each checked) until the end. Commands on stdin: `short N` makes N short connections (3 round
/// trips each) and answers `DONE`; `end` waits until each long connection did 20 more round
/// trips, stops them and prints the errors seen (none over TCP).
const RESTART: &str = r#"
import random, socket, sys, threading
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64)
port = ls.getsockname()[1]
def echo(c):
    with c:
        while True:
            d = c.recv(65536)
            if not d:
                return
            c.sendall(d)
def serve():
    while True:
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
def roundtrip(c, rnd):
    m = rnd.randbytes(rnd.randint(1, 200000))
    c.sendall(m)
    got = bytearray()
    while len(got) < len(m):
        d = c.recv(len(m) - len(got))
        if not d:
            raise Exception("EOF after %d of %d bytes" % (len(got), len(m)))
        got += d
    if got != m:
        raise Exception("differing bytes")
errors, rounds, stop = [], [0, 0, 0], threading.Event()
def long_conn(k):
    try:
        rnd = random.Random(k)
        with socket.create_connection(("127.0.0.1", port)) as c:
            while not stop.is_set():
                roundtrip(c, rnd)
                rounds[k] += 1
    except Exception as e:
        errors.append("long %d: %r" % (k, e))
ths = [threading.Thread(target=long_conn, args=(k,)) for k in range(3)]
for t in ths:
    t.start()
made = 0
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "short":
        for _ in range(int(cmd[1])):
            made += 1
            try:
                rnd = random.Random(made)
                with socket.create_connection(("127.0.0.1", port)) as c:
                    for _ in range(3):
                        roundtrip(c, rnd)
            except Exception as e:
                errors.append("short %d: %r" % (made, e))
        print("DONE", flush=True)
    else:
        break
seen = list(rounds)
while any(r - s < 20 for r, s in zip(rounds, seen)) and not errors:
    threading.Event().wait(0.01)
stop.set()
for t in ths:
    t.join()
print("errors:", errors, flush=True)
"#;

/// [`RESTART`] under the library (`smc`) or over plain TCP.
struct Prog {
    p: integration_tests::Proc,
    stdin: std::process::ChildStdin,
}

impl Prog {
    fn start(w: &SmcWorld, smc: bool) -> Prog {
        let mut c = w.run_or_plain(smc, "python3");
        if smc {
            // Every connection SMC-D (the short ones would go TCP by the policy).
            c.env("SMC_SHORT_BYTES", "0");
        }
        c.arg("-c").arg(RESTART).stdin(Stdio::piped());
        let mut p = spawn_piped(c);
        let stdin = p.0.stdin.take().unwrap();
        Prog { p, stdin }
    }

    fn short(&mut self, n: usize) {
        writeln!(self.stdin, "short {n}").unwrap();
        assert_eq!(self.p.read_line(), "DONE");
    }

    fn end(mut self) -> String {
        writeln!(self.stdin, "end").unwrap();
        self.p.wait_output(T).expect("the restart program")
    }
}

fn smcd_ends(s: &Snapshot) -> u64 {
    s.get("smcd_client") + s.get("smcd_server")
}

#[test]
fn a_daemon_restarted_under_traffic_leaves_every_connection_exact() {
    let mut w = SmcWorld::new();
    let mut tcp = Prog::start(&w, false);
    tcp.short(20);
    tcp.short(20);
    let tcp = tcp.end();
    assert_eq!(tcp.trim(), "errors: []");
    for (signal, name) in [(libc::SIGTERM, "SIGTERM"), (libc::SIGKILL, "SIGKILL")] {
        let s0 = w.stats_sum();
        let mut p = Prog::start(&w, true);
        p.short(20);
        let s1 = w.stats_sum();
        // The 3 long connections and the 20 short ones, both ends in this process.
        assert_eq!(
            smcd_ends(&s1) - smcd_ends(&s0),
            2 * 23,
            "{name}: {}",
            brief(&s1)
        );

        // No daemon: new connections stay TCP at once, the long ones go on.
        w.stop_daemon(signal);
        p.short(20);
        let s2 = w.stats_sum();
        assert_eq!(smcd_ends(&s2), smcd_ends(&s1), "{name}: {}", brief(&s2));
        assert_eq!(
            s2.get("fallback_client") - s1.get("fallback_client"),
            20,
            "{name}: {}",
            brief(&s2)
        );

        // A daemon again: new connections take SMC-D once the process's back-off after the
        // daemon went away (a second, `socket::daemon::back_off_ms`) is over.
        w.start_daemon();
        let t = Instant::now();
        let mut tries = 0;
        while smcd_ends(&w.stats_sum()) == smcd_ends(&s2) {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{name}: no connection took SMC-D within 10 s of the restart ({tries} tried): {}",
                brief(&w.stats_sum())
            );
            p.short(1);
            tries += 1;
        }
        let s3 = w.stats_sum();
        p.short(20);
        let s4 = w.stats_sum();
        assert_eq!(
            smcd_ends(&s4) - smcd_ends(&s3),
            2 * 20,
            "{name}: {}",
            brief(&s4)
        );
        assert_eq!(p.end(), tcp, "{name}: library against plain TCP");
    }
}
