//! A bounded soak of the data path (issue 10, item 1): `smc-soak` server and client under
//! `smc-ctl run` in an attached cgroup with a private loopback-ism daemon, both ends writing
//! and reading at once (a writer and a reader thread, or one edge-triggered epoll loop), random
//! sizes up to 1 MiB, the socket API mixed per connection, every byte verified. Then the same
//! program over plain TCP as the differential baseline. `cargo xtask soak` is the long run.
//!
//! Needs root (cgroups, eBPF).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{bin, fallbacks, ready_port, spawn_piped, SmcWorld};
use smc_harness::{SoakSummary, SOAK_FAILURES};
use std::process::{Command, Stdio};
use std::time::Duration;

const CONNS: u64 = 24;
/// Bytes each way per connection: 24 × 2 × 96 MiB = 4.5 GiB through the rings.
const BYTES: &str = "96m";
/// Every API, one edge-triggered epoll instance per thread on the same socket included.
const MODES: &str = "rw,vec,sr,msg,poll,epoll,epoll1";
const T: Duration = Duration::from_secs(300);

/// The `SOAK` summary line of `out`.
fn summary(out: &str, who: &str) -> SoakSummary {
    SoakSummary::find(out).unwrap_or_else(|| panic!("{who} printed no summary line:\n{out}"))
}

fn n(s: &SoakSummary, k: &str) -> u64 {
    s.get(k).unwrap_or_else(|| panic!("no {k} in {s:?}"))
}

/// Runs server and client (`wrap` turns the program into the command to run) and checks
/// that every connection moved every byte, unchanged, without reset, stall or lost wakeup.
/// Returns the client's and the server's summaries and their pids.
fn soak(
    wrap: impl Fn(&std::path::Path) -> Command,
    what: &str,
) -> (SoakSummary, SoakSummary, u32, u32) {
    let prog = bin("smc-soak");
    let mut sc = wrap(&prog);
    sc.args(["server", "0", &CONNS.to_string()])
        .stdout(Stdio::piped());
    let mut srv = spawn_piped(sc);
    let port = ready_port(&mut srv).to_string();
    let mut cc = wrap(&prog);
    cc.args([
        "client",
        "127.0.0.1",
        &port,
        "--conns",
        &CONNS.to_string(),
        "--par",
        "4",
        "--bytes",
        BYTES,
        "--modes",
        MODES,
        "--stall-secs",
        "60",
    ])
    .stdout(Stdio::piped());
    let cli = spawn_piped(cc);
    let (cpid, spid) = (cli.0.id(), srv.0.id());
    let cout = cli.wait_output(T).expect("soak client");
    let sout = srv.wait_output(T).expect("soak server");
    let (c, s) = (summary(&cout, "client"), summary(&sout, "server"));
    let all = format!("{what}\nclient:\n{cout}\nserver:\n{sout}");
    eprintln!(
        "{what}: {}",
        cout.lines().find(|l| l.starts_with("SOAK ")).unwrap_or("")
    );
    for (side, x) in [("client", &c), ("server", &s)] {
        assert_eq!(n(x, "conns"), CONNS, "{side} connections; {all}");
        for k in SOAK_FAILURES {
            assert_eq!(n(x, k), 0, "{side} {k}; {all}");
        }
    }
    let per = 96u64 << 20;
    assert_eq!(n(&c, "bytes"), 2 * CONNS * per, "client bytes; {all}");
    assert_eq!(n(&s, "bytes"), 2 * CONNS * per, "server bytes; {all}");
    assert!(!cout.contains("FAIL") && !sout.contains("FAIL"), "{all}");
    (c, s, cpid, spid)
}

#[test]
fn soak_full_duplex_mixed_apis_smcd_and_tcp() {
    let w = SmcWorld::new();
    let (_c, _s, cpid, spid) = soak(|p| w.run(p), "SMC-D");
    // Every connection really took SMC-D, on both ends.
    let cs = w.stats_of(cpid, "smc-soak client");
    let ss = w.stats_of(spid, "smc-soak server");
    assert_eq!(cs.get("smcd_client"), CONNS, "client figures {cs:?}");
    assert_eq!(ss.get("smcd_server"), CONNS, "server figures {ss:?}");
    assert_eq!(fallbacks(&cs) + fallbacks(&ss), 0, "{cs:?} {ss:?}");
    assert!(
        cs.get("rx_bytes") >= CONNS * (96 << 20) && ss.get("rx_bytes") >= CONNS * (96 << 20),
        "the bytes went through the rings: {cs:?} {ss:?}"
    );
    // The differential baseline: the same program over plain TCP, outside the cgroup and
    // without the library, sees the same.
    soak(|p| Command::new(p), "plain TCP");
    w.wait_no_live_dmbs(Duration::from_secs(10));
}
