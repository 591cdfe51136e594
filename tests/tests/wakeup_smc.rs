//! Lost wakeups (issue 10): two threads waiting on one SMC-D end at once — one for data, one for
//! room — must both be woken. `smc-testprog duplex` fills the send ring each round and waits
//! for room while a second thread waits for data (blocked in `read`, in `poll`, or in its own
//! epoll instance); the peer empties the ring (which rings the room doorbell) and sends one byte.
//! A wait that times out although its fd is ready is a doorbell consumed by the other waiter of
//! the same end: the program says `STALL` and fails. A liveness check, no timing threshold:
//! every wait has 5 s for an event that comes within microseconds.
//!
//! Then the same program over plain TCP (no library) as the differential baseline.
//!
//! Needs root (cgroups, eBPF).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{bin, spawn_piped, SmcWorld};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROUNDS: &str = "400";
const T: Duration = Duration::from_secs(240);

/// Runs `c`; the rounds it completed, or its failure.
fn run(mut c: Command) -> (Result<String, String>, u32) {
    c.stdout(Stdio::piped());
    let p = spawn_piped(c);
    let pid = p.0.id();
    let r = match p.wait_output(T) {
        Ok(out) if out.lines().any(|l| l == format!("OK rounds={ROUNDS}")) => Ok(out),
        Ok(out) => Err(out),
        Err(e) => Err(e.to_string()),
    };
    (r, pid)
}

/// (reader, writer) waits of the two threads.
const COMBOS: [(&str, &str); 5] = [
    ("block", "poll"),
    ("block", "epoll"),
    ("poll", "poll"),
    ("epoll", "epoll"),
    ("poll", "epoll"),
];

fn args(reader: &'static str, writer: &'static str) -> [&'static str; 6] {
    ["duplex", ROUNDS, "--reader", reader, "--writer", writer]
}

/// Differential baseline: the same program over plain TCP, without the library.
#[test]
fn two_waiters_of_one_end_over_tcp() {
    for (r, w) in COMBOS {
        let mut c = Command::new(bin("smc-testprog"));
        c.args(args(r, w));
        let (res, _) = run(c);
        if let Err(e) = res {
            panic!("--reader {r} --writer {w} over TCP: {e}");
        }
    }
}

/// Every combination in one world (one hold of the test lock); every failure is reported.
#[test]
fn two_waiters_of_one_end_over_smcd() {
    let w = SmcWorld::new();
    let mut bad = Vec::new();
    for (r, wr) in COMBOS {
        let what = format!("--reader {r} --writer {wr}");
        let mut c = w.run(bin("smc-testprog"));
        // A small ring: many rounds in little time; no spinning: every wait sleeps, so every
        // round goes through the doorbells.
        c.args(args(r, wr))
            .env("SMC_DMB_SIZE", "65536")
            .env("SMC_SPIN_US", "0");
        let (res, pid) = run(c);
        match res {
            Err(e) => bad.push(format!("{what}: {e}")),
            Ok(_) => {
                let s = w.stats_of(pid, &what);
                if (s.get("smcd_client"), s.get("smcd_server")) != (1, 1) {
                    bad.push(format!("{what}: the connection did not go SMC-D: {s:?}"));
                }
            }
        }
        eprintln!(
            "{what}: {}",
            if bad.is_empty() {
                "ok"
            } else {
                "FAILED so far"
            }
        );
    }
    assert!(bad.is_empty(), "lost wakeups:\n{}", bad.join("\n"));
}
