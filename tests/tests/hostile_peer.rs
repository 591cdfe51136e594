//! A legitimate peer turned hostile (issue 12): it shares DMBs with its victim through a real
//! CLC handshake and then writes random cursors, flags and wait bits into the shared memory.
//!
//! - victim: `smc-hostile victim`, an echo server (a thread per connection with blocking calls,
//!   `poll`, `FIONREAD`, `MSG_PEEK`, or one epoll event loop, level- or edge-triggered) under
//!   `smc-ctl run` with `SMC_DEBUG=1`;
//! - alongside: two `smc-hostile honest` SMC-D streams through the same victim process (one
//!   served by a thread, one in the epoll loop that attacked connections share) whose every
//!   byte is checked, for the whole attack;
//! - attacker: `smc-hostile peer` as uid `nobody` in the attached cgroup, without the data path:
//!   it opts in, runs the client side of the CLC handshake itself, registers its DMB and attaches
//!   the victim's through the daemon with its own socket as proof, maps both (`Dmb::map`, as the
//!   data path does), checks a legitimate exchange through the rings, fails to resize the sealed
//!   memfds, then scribbles over both headers, the victim's ring (and punches holes into its
//!   memfd) and the doorbell channel in a tight loop, connection after
//!   connection, for `SMC_HOSTILE_SECS` seconds (`cargo xtask test` sets 60; a direct
//!   `cargo test` run takes 10).
//!
//! Asserted: the victim never dies (a read out of its mappings would be a SIGSEGV/SIGBUS), what
//! it echoes under forged but valid cursors is exactly its ring's bytes between them, and it
//! never hangs (every attacked connection ends — reset, error or EOF — within a bound after the
//! attacker is gone, waited for as a condition); the library logged why it reset connections;
//! the honest connections stay byte-exact to their end; every DMB is given back. No timing is
//! asserted: the bounds only turn a hang into a failure.
//!
//! Needs root (cgroups, eBPF, setuid). `cargo xtask test --no-fuzz hostile_peer`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{as_user, bin, brief, nobody, run_to_end, Driven, SmcWorld};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

/// Bound of each wait: far beyond what each step needs, short of a hang.
const T: Duration = Duration::from_secs(60);

/// How long the attacker scribbles: `SMC_HOSTILE_SECS` (60 under `cargo xtask test`), else 10.
fn attack_secs() -> u64 {
    std::env::var("SMC_HOSTILE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10)
}

/// `key=value` of a line.
fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|t| t.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
}

fn num(line: &str, key: &str) -> u64 {
    field(line, key)
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
}

/// A victim's `END <id> <port> <how> rx=<n> tx=<n>` line.
struct End {
    port: u16,
    how: String,
    line: String,
}

fn ends(lines: &[String]) -> BTreeMap<u64, End> {
    lines
        .iter()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.first() == Some(&"END") && t.len() >= 4).then(|| {
                (
                    t[1].parse().unwrap(),
                    End {
                        port: t[2].parse().unwrap(),
                        how: t[3].to_string(),
                        line: l.clone(),
                    },
                )
            })
        })
        .collect()
}

/// Accepted connections: id → peer port.
fn accepts(lines: &[String]) -> BTreeMap<u64, u16> {
    lines
        .iter()
        .filter_map(|l| {
            let t: Vec<&str> = l.split_whitespace().collect();
            (t.first() == Some(&"ACCEPT") && t.len() >= 3)
                .then(|| (t[1].parse().unwrap(), t[2].parse().unwrap()))
        })
        .collect()
}

#[test]
fn hostile_peer_scribbling_shared_memory_resets_only_its_own_connection() {
    let secs = attack_secs();
    let w = SmcWorld::new();
    let logs = w.subdir("logs");

    let mut v = w.run(bin("smc-hostile"));
    v.arg("victim")
        .env("SMC_DEBUG", "1")
        .env("SMC_DMB_SIZE", "65536");
    let mut victim = Driven::spawn(v, &logs, "victim");
    let port: u16 = victim.wait_for(T, "the victim's port", |l| {
        l.iter()
            .find_map(|l| l.strip_prefix("PORT ").and_then(|p| p.trim().parse().ok()))
    });
    let addr = format!("127.0.0.1:{port}");

    // Two honest streams: the victim serves the first (connection 0) with a thread, the
    // second (connection 1) in its epoll loop, where attacked connections join it.
    let mut honest = Vec::new();
    for seed in [7, 8] {
        let mut h = w.run(bin("smc-hostile"));
        h.args(["honest", &addr, &seed.to_string()])
            .env("SMC_DMB_SIZE", "65536");
        let mut d = Driven::spawn(h, &logs, &format!("honest{seed}"));
        let port: u16 = d.wait_for(T, "the honest stream's first bytes", |l| {
            l.iter().find_map(|l| {
                l.strip_prefix("HONEST started port=")
                    .and_then(|p| p.trim().parse().ok())
            })
        });
        honest.push((d, port));
    }
    let honest_ports: Vec<u16> = honest.iter().map(|(_, p)| *p).collect();

    // The attack, run to its end (bounded).
    let mut a = w.cgroup().command(bin("smc-hostile"));
    w.env(&mut a);
    a.args(["peer", &addr, &secs.to_string(), "12"]);
    as_user(&mut a, nobody());
    let attack = run_to_end(a, &logs, None, Duration::from_secs(secs) + T).ok();
    let out = attack.text();
    std::fs::write(logs.join("attacker.out"), &out).expect("keep the attacker's report");
    let summary = out
        .lines()
        .find(|l| l.starts_with("HOSTILE "))
        .unwrap_or_else(|| panic!("attacker printed no summary:\n{out}"));
    eprintln!("attacker: {summary}");
    let (conns, established, legit) = (
        num(summary, "conns"),
        num(summary, "established"),
        num(summary, "legit"),
    );
    // A connection whose handshake declined (e.g. a CLC timeout on a loaded host) stays TCP
    // and is not attacked; it ends like the others.
    assert!(established > 0, "no attack got SMC-D:\n{out}");
    eprintln!(
        "{} of {conns} attacker connections not on SMC-D",
        conns - established
    );
    assert_eq!(
        legit, established,
        "every attacker connection first moved its bytes through the rings legitimately:\n{out}"
    );
    let attack_ports: Vec<u16> = out
        .lines()
        .filter(|l| l.starts_with("ATTACK "))
        .map(|l| num(l, "port") as u16)
        .collect();
    assert_eq!(attack_ports.len() as u64, established);
    let all_ports: Vec<u16> = out
        .lines()
        .filter(|l| l.starts_with("ATTACK ") || l.starts_with("NOSMC "))
        .map(|l| num(l, "port") as u16)
        .collect();
    assert!(
        !out.contains("truncate=ALLOWED"),
        "the attacker resized a sealed DMB memfd:\n{out}"
    );
    // Under forged but valid cursors the victim read exactly its ring between its cursors.
    assert!(
        !out.contains("echo=BAD"),
        "the victim echoed bytes that were not in its ring where its cursors said:\n{out}"
    );
    assert!(
        num(summary, "echoed") > 0,
        "no echo of the plausible profile was checked:\n{out}"
    );

    // The attacker is gone: every connection it had ends at the victim, which is still up.
    let acc = victim.wait_for(T, "an END of every attacked connection", |l| {
        let acc = accepts(l);
        let ends = ends(l);
        let attacked: Vec<u64> = acc
            .iter()
            .filter(|(_, p)| !honest_ports.contains(p))
            .map(|(id, _)| *id)
            .collect();
        (attacked.len() as u64 == conns && attacked.iter().all(|id| ends.contains_key(id)))
            .then_some(acc)
    });
    assert!(victim.running(), "the victim exited during the attack");
    let lines = victim.lines();
    let ends = ends(&lines);
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for (id, p) in &acc {
        if honest_ports.contains(p) {
            continue;
        }
        assert!(
            all_ports.contains(p),
            "unknown connection {id} from port {p}"
        );
        *outcomes.entry(ends[id].how.clone()).or_default() += 1;
    }
    eprintln!("attacked connections ended at the victim: {outcomes:?}");
    for (how, n) in &outcomes {
        assert!(
            ["reset", "epipe", "eof"].contains(&how.as_str()),
            "{n} attacked connection(s) ended with {how}: not a reset, a broken pipe or EOF"
        );
    }
    assert!(
        outcomes.get("reset").copied().unwrap_or(0) > 0,
        "no attacked connection was reset: {outcomes:?}"
    );

    // The library said why.
    let log = victim.stderr();
    assert!(
        !log.contains("panicked"),
        "a panic in the victim:{}",
        integration_tests::log_tail(&victim.err)
    );
    let proto = log
        .lines()
        .filter(|l| l.contains("protocol error, connection reset"))
        .count();
    let econnreset = log
        .lines()
        .filter(|l| l.contains("gives ECONNRESET"))
        .count();
    eprintln!(
        "victim log: {proto} protocol errors, {econnreset} ECONNRESET reported; e.g. {}",
        log.lines()
            .find(|l| l.contains("protocol error"))
            .unwrap_or("-")
    );
    assert!(proto > 0, "no reset reason logged with SMC_DEBUG=1");
    assert!(
        econnreset as u64 >= outcomes.get("reset").copied().unwrap_or(0),
        "{econnreset} ECONNRESET logged for {outcomes:?}"
    );

    // The honest connections of the same process ran alongside the whole time: byte-exact.
    for (h, port) in &mut honest {
        h.tell("stop");
        let st = h.finish(T);
        let ok = h
            .lines()
            .into_iter()
            .find(|l| l.starts_with("HONEST ok ") || l.starts_with("HONEST BAD "))
            .unwrap_or_default();
        assert!(
            st.success() && ok.starts_with("HONEST ok "),
            "honest stream ({st}): {ok}{}",
            integration_tests::log_tail(&h.err)
        );
        let bytes = num(&ok, "bytes");
        assert!(bytes > 0);
        let port = *port;
        let end = victim.wait_for(T, "the end of an honest connection", |l| {
            let a = accepts(l);
            let id = a.iter().find(|(_, p)| **p == port).map(|(id, _)| *id)?;
            self::ends(l).remove(&id)
        });
        assert_eq!(end.port, port);
        assert_eq!(
            (end.how.as_str(), num(&end.line, "rx"), num(&end.line, "tx")),
            ("eof", bytes, bytes),
            "the victim's side of an honest connection: {}",
            end.line
        );
        let hs = w.stats_of(h.proc.0.id(), "honest client");
        assert_eq!(hs.get("smcd_client"), 1, "honest on SMC-D: {}", brief(&hs));
        eprintln!("honest stream through port {port}: {bytes} bytes, exact");
    }

    // Still up, it exits when told, with status 0: no signal, no abort.
    victim.tell("quit");
    let st = victim.finish(T);
    assert!(
        st.success(),
        "victim: {st} (signal {:?}){}",
        st.signal(),
        integration_tests::log_tail(&victim.err)
    );
    let vs = w.stats_of(victim.proc.0.id(), "victim");
    assert_eq!(
        vs.get("smcd_server"),
        established + 2,
        "the victim served every connection on SMC-D: {}",
        brief(&vs)
    );
    w.wait_no_live_dmbs(T);
}

/// An urgent mark ahead of the read position against a blocking peek (red team round 23,
/// `tests/redteam/rt23_peekoob.py`): the peer (uid `nobody`) sends 10 bytes, one urgent byte
/// and 200 more; the victim (root) peeks for more than the 10 bytes before the mark
/// (`MSG_PEEK|MSG_WAITALL`, `SO_RCVLOWAT`), from an `SO_PEEK_OFF` past the mark and at it, and
/// reads with `MSG_WAITALL`. TCP stops at the mark a read that copied bytes, a peek too: each
/// answer is compared with plain TCP's. Before, the peeks neither copied nor slept (poll counts
/// the bytes past the mark) and spun at 100% CPU for ever: `HANG cpu=5.00 in 5 s` for
/// `waitall`, `lowat`, `peekoff` (a hostile peer needs only to write the urgent word). The
/// script's watchdog (RT_WATCHDOG seconds) only turns a hang into a failure.
#[test]
fn an_urgent_mark_never_makes_a_blocking_peek_spin() {
    let w = SmcWorld::new();
    let logs = w.subdir("logs");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("redteam/rt23_peekoob.py");
    for mode in ["waitall", "lowat", "peekoff", "peekmark", "read"] {
        let answer = |smc: bool| {
            let mut c = w.run_or_plain(smc, "/usr/bin/python3");
            c.arg(&script)
                .arg(mode)
                .env("RT_AS_NOBODY", "1")
                .env("RT_WATCHDOG", "20")
                .env("SMC_DEBUG", "1");
            let f = run_to_end(c, &logs, None, T);
            let out = f.text();
            eprintln!("{mode} smc={smc}: {out}");
            let line = out
                .lines()
                .find(|l| l.starts_with("PEEK "))
                .unwrap_or_else(|| panic!("{mode}: no answer: {out}{}", f.stderr))
                .to_string();
            assert!(!line.contains("HANG"), "{mode} smc={smc}: {line}");
            // The answer without the CPU time.
            line.split(" cpu=").next().unwrap_or("").to_string()
        };
        let tcp = answer(false);
        let smc = answer(true);
        assert_eq!(smc, tcp, "{mode}: the library's answer differs from TCP's");
    }
    let s = w.stats_sum();
    assert!(
        s.get("smcd_server") >= 5,
        "the victim's connections were SMC-D: {}",
        brief(&s)
    );
}
