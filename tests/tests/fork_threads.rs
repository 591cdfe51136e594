//! `fork` in a threaded process under the data path (issue 12 item 7): while several threads
//! run SMC-D handshakes and connections back to back, the main thread forks 216 children, 16
//! of them while the loopback-ism daemon is stopped (SIGSTOP), so that threads are waiting for
//! it at the fork. Every child makes one connection through the library and exits: none may
//! hang (a lock held by a thread of the parent is never released in the child), and every
//! byte of every connection is exact.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write as _, process::Stdio, time::Duration};

use integration_tests::{bin, free_port, spawn_logged, wait_listening, Proc, SmcWorld};

const FORKS: u64 = 200;

fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|t| t.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
}

#[test]
fn fork_storm_while_threads_handshake_and_the_daemon_stalls() {
    let w = SmcWorld::new();
    let port = free_port();
    let log = w.dir.join("logs/server.log");
    let mut s = w.run(bin("preload-prog"));
    s.args(["server", &port.to_string(), "thread"]);
    let mut srv = spawn_logged(s, &log);
    wait_listening(
        &mut srv,
        port,
        Duration::from_secs(30),
        "server",
        Some(&log),
    );
    let mut c = w.run(bin("preload-prog"));
    c.args([
        "storm",
        "127.0.0.1",
        &port.to_string(),
        "4",
        &FORKS.to_string(),
        "65536",
    ])
    .stdin(Stdio::piped());
    let mut storm = Proc::spawn(c);
    let storm_pid = storm.0.id();
    let daemon = w.daemon_pid() as libc::pid_t;
    let mut stdin = storm.0.stdin.take().expect("storm stdin");
    for (want, sig) in [("PHASE stop", libc::SIGSTOP), ("PHASE cont", libc::SIGCONT)] {
        let line = storm.read_line();
        assert_eq!(line.trim(), want, "storm said {line:?}");
        // SAFETY: plain kill of our own daemon.
        assert_eq!(unsafe { libc::kill(daemon, sig) }, 0);
        stdin.write_all(b"go\n").expect("tell the storm");
    }
    let out = storm.wait_output(Duration::from_secs(600));
    // SAFETY: as above (the daemon must not stay stopped when the storm failed).
    unsafe { libc::kill(daemon, libc::SIGCONT) };
    let out = out.expect("storm");
    eprintln!("{out}");
    let forks = FORKS + 16;
    assert_eq!(field(&out, "forks"), forks, "{out}");
    assert_eq!(field(&out, "hung"), 0, "children hung after fork: {out}");
    assert_eq!(field(&out, "bad"), 0, "children with wrong bytes: {out}");
    assert_eq!(field(&out, "ok"), forks, "{out}");
    assert_eq!(
        field(&out, "badconns"),
        0,
        "threads with wrong bytes: {out}"
    );
    assert!(field(&out, "conns") > 0, "{out}");
    // Every child went through the data path: its own statistics file with its one
    // connection, SMC-D or (while the daemon was stopped) a fallback.
    let files = w.stats_files();
    let (mut children, mut smcd) = (0u64, 0u64);
    for (name, st) in &files {
        if name.parse::<u32>().is_err() || name == &storm_pid.to_string() {
            continue;
        }
        let c = st.get("smcd_client") + st.get("fallback_client");
        if c == 1 && st.get("smcd_server") + st.get("fallback_server") == 0 {
            children += 1;
            smcd += st.get("smcd_client");
        }
    }
    eprintln!("children with a statistics file: {children}, on SMC-D: {smcd}");
    assert_eq!(children, forks, "children seen by the data path");
    assert!(smcd > 0, "no child connection was SMC-D");
}
