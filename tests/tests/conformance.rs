//! Differential conformance (issue 11): every scenario of `smc-conform` runs once over plain TCP
//! and once under the data path (`smc-ctl run` in an ism-attached cgroup with this test's own
//! loopback-ism daemon), and the harness compares what the program observed — return values,
//! errno, bytes, readiness masks and their order, signals. A run under the data path also has to
//! have taken SMC-D for as many client connections as the scenario says (the library's own
//! per-process statistics). Scenarios that cannot match from userspace are listed in
//! [`EXPECTED`] with the reason; a listed scenario that matches in a run is reported, not
//! failed (some listed differences depend on timing). Each scenario runs under the data path a
//! second time with the CLC timeout cut to 1, 5 or 20 ms (by turns): handshakes then fall back
//! at every step, and the program must still see exactly what it sees over TCP (the path taken
//! is not checked there). Such a timer makes every run a different race: a timer run that
//! differs is run twice more, and fails the test when it differs again; a difference seen once
//! in three runs is printed (`FLAKE`, with its trace and log) and counted in the table, not
//! failed. The `shortcut` column (sk_msg mode, no library) is informational.
//!
//! The table goes to `results/conformance.txt` and to the test's output.
//! `SMC_CONFORM_ONLY=a,b` runs only the named scenarios; `SMC_CONFORM_TIMER_MS=N` gives every
//! scenario's CLC-timer run a timeout of N ms (by default 1, 5 or 20 by turns).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{bin, run_to_end, test_cgroup, Attached, SmcWorld};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

/// Scenarios whose trace under the data path differs from TCP, and why.
/// Scenarios whose connection may take either path by timing, both correct: the trace must
/// still match TCP. `scm_rights_client_mid_handshake`: a client passed on right after its
/// non-blocking connect is declined when its handshake is still under way (0 SMC-D) and moves
/// as an SMC-D connection (adopted by the receiver) when it was already decided (1; seen in
/// about 1 run of 15 on a loaded machine).
/// `*_after_clc_timeout`: a CLC timeout of 1 ms usually ends the handshake before the server
/// accepts (0), but not always (1).
const SMC_EITHER: &[&str] = &[
    "scm_rights_client_mid_handshake",
    "dup2_over_recv_after_clc_timeout",
    "socket_reuses_number_while_recv_after_clc_timeout",
    // The client's first write races its server thread's accept: before the Accept it goes
    // on over TCP (`setup::write_before_accept`), after it on SMC-D.
    "nonblock_connect_write_at_once",
];

const EXPECTED: &[(&str, &str)] = &[
    ("epoll_nested", "an epoll fd in another epoll set: the outer wait may see the inner set ready when no entry of it reports (our registration's own event, e.g. right after EPOLL_CTL_ADD: the kernel's view of the set), and the inner wait then returns nothing: a spurious wakeup, never a missed one (epoll_nested_lt_data_left and epoll_nested_wakes_on_write match TCP)"),
    ("poll_nested_epoll", "the same with poll on the epoll fd: POLLIN for an idle set right after EPOLL_CTL_ADD (spurious; data left or arriving is always seen)"),
    ("sigio_not_while_read_waits_one_thread", "with O_ASYNC on, a blocking read that waits when the data comes gets a SIGIO for it (TCP: none, sk_wait_data sets SOCKWQ_ASYNC_WAITDATA and sock_wake_async stays silent): the read sleeps in poll on the socket, woken by a doorbell, and the kernel sends SIGIO for every doorbell that arrives; not suppressible without waking that read another way. A spurious SIGIO, never a missed one (every other sigio_* scenario matches TCP)"),
    ("sigio_fsetsig_write_space", "with F_SETSIG, the signal that tells a writer of room says si_code POLL_IN, si_band IN|RDNORM where TCP says POLL_OUT, OUT|WRNORM|WRBAND (sk_stream_write_space): the room reaches the writer as a doorbell, which its kernel signals as data; the kernel makes POLL_OUT only when its own send buffer frees, and a program that takes the signal with sigwaitinfo runs no code of ours that could rewrite it. The signal comes, at the right time, for the right fd; plain SIGIO (sigio_on_write_space) matches"),
];

struct Outcome {
    name: String,
    tcp: String,
    ism: String,
    ism_smc: u64,
    want_smc: u64,
    shortcut: String,
    /// The run under the data path with a CLC timeout of [`Outcome::timer_ms`]: handshakes race
    /// their timer and fall back at every step (the path each connection takes is not checked,
    /// only that the program sees what it sees over TCP).
    timer: String,
    /// The timer run differed once and matched in both runs made again: its difference.
    timer_flake: Option<String>,
    timer_ms: u32,
    timer_log: String,
    /// The end of the data-path run's stderr: its `SMC_DEBUG` lines (every decision and reset
    /// says why), so that a difference seen once in CI carries its own explanation.
    ism_log: String,
}

/// The last `n` lines of `s`.
fn tail(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

fn trace_of(f: &integration_tests::Finished) -> String {
    let mut t = f.text();
    if !f.status.success() {
        t.push_str(&format!("(exit: {})\n", f.status));
    }
    t
}

fn diff(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = String::new();
    for i in 0..la.len().max(lb.len()) {
        let (x, y) = (la.get(i).copied(), lb.get(i).copied());
        if x == y {
            out.push_str(&format!("    {}\n", x.unwrap_or("")));
        } else {
            if let Some(x) = x {
                out.push_str(&format!("tcp {x}\n"));
            }
            if let Some(y) = y {
                out.push_str(&format!("ism {y}\n"));
            }
        }
    }
    out
}

#[test]
fn conformance() {
    let world = SmcWorld::new();
    let prog = bin("smc-conform");
    let list = Command::new(&prog)
        .arg("list")
        .output()
        .expect("run smc-conform list");
    assert!(list.status.success(), "smc-conform list failed");
    // `SMC_CONFORM_TIMER_MS=1`: every scenario's timer run with that CLC timeout (hunting
    // the races of one timer across all scenarios).
    let timer_override: Option<u32> = std::env::var("SMC_CONFORM_TIMER_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    let only: Option<Vec<String>> = std::env::var("SMC_CONFORM_ONLY")
        .ok()
        .map(|v| v.split(',').map(str::to_string).collect());
    let scenarios: Vec<(String, u64)> = String::from_utf8_lossy(&list.stdout)
        .lines()
        .filter_map(|l| {
            let (n, k) = l.split_once(' ')?;
            Some((n.to_string(), k.parse().ok()?))
        })
        .filter(|(n, _)| only.as_ref().is_none_or(|o| o.contains(n)))
        .collect();
    match &only {
        None => assert!(scenarios.len() >= 60, "only {} scenarios", scenarios.len()),
        Some(o) => {
            let unknown: Vec<&String> = o
                .iter()
                .filter(|n| !scenarios.iter().any(|(s, _)| s == *n))
                .collect();
            assert!(
                unknown.is_empty(),
                "SMC_CONFORM_ONLY names no scenario {unknown:?}"
            );
        }
    }
    for (n, _) in EXPECTED {
        assert!(
            scenarios.iter().any(|(s, _)| s == n) || only.is_some(),
            "EXPECTED names an unknown scenario {n}"
        );
    }
    // The sk_msg shortcut mode: same program, no library, in a cgroup attached in that mode.
    let sc_cg = test_cgroup();
    let _sc_att = Attached::new(&sc_cg, "shortcut");
    let dir = world.subdir("conform");
    let timeout = Duration::from_secs(40);

    let queue = Mutex::new(scenarios.clone().into_iter().enumerate());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|sc| {
        for _ in 0..3 {
            sc.spawn(|| loop {
                let Some((idx, (name, want))) = queue.lock().unwrap().next() else {
                    return;
                };
                let mut c = Command::new(&prog);
                c.arg(&name);
                let tcp = run_to_end(c, &dir, None, timeout);
                // The run under the data path. Its trace is the semantics; the count of SMC-D
                // client connections only says that the scenario took that path. A handshake
                // slower than the CLC timeout on a loaded machine (3 scenarios run at once)
                // falls back, transparently: the same trace over TCP. Such a run is made again
                // (at most twice), so that the count means what it says.
                let run_ism = || {
                    let mut c = world.run(&prog);
                    c.arg(&name)
                        .env("SMC_SHORT_BYTES", "0")
                        .env("SMC_DEBUG", "1");
                    let ism = run_to_end(c, &dir, None, timeout);
                    let n = world
                        .stats_files()
                        .get(&ism.pid.to_string())
                        .map_or(0, |s| s.get("smcd_client"));
                    (ism, n)
                };
                let (mut ism, mut ism_smc) = run_ism();
                for _ in 0..2 {
                    if ism_smc == want
                        || SMC_EITHER.contains(&name.as_str())
                        || trace_of(&ism) != trace_of(&tcp)
                    {
                        break;
                    }
                    eprintln!("{name}: {ism_smc} SMC-D client connections instead of {want}, same trace: run again");
                    (ism, ism_smc) = run_ism();
                }
                // The same with the CLC timeout cut to 1, 5 or 20 ms (by turns): fallbacks
                // after a timeout at every step of the handshake, late CLC messages to skip,
                // decisions racing the scenario's own closes and dup2s.
                let timer_ms = timer_override.unwrap_or([1u32, 5, 20][idx % 3]);
                let run_timer = || {
                    let mut c = world.run(&prog);
                    c.arg(&name)
                        .env("SMC_SHORT_BYTES", "0")
                        .env("SMC_DEBUG", "1")
                        .env("SMC_CLC_TIMEOUT_MS", timer_ms.to_string());
                    run_to_end(c, &dir, None, timeout)
                };
                // A timer this short makes each run a different race. A difference is run
                // twice more: one that comes back (2 of 3) fails the test; a single one is
                // reported as a flake with its trace and log (`timer_flake`), never hidden.
                let timer = run_timer();
                let mut timer_flake = None;
                if trace_of(&timer) != trace_of(&tcp) {
                    let again = (0..2)
                        .filter(|_| trace_of(&run_timer()) != trace_of(&tcp))
                        .count();
                    if again == 0 {
                        timer_flake = Some(format!(
                            "{}\nthe data-path run's stderr (SMC_DEBUG), last lines:\n{}",
                            diff(&trace_of(&tcp), &trace_of(&timer)),
                            tail(&timer.stderr, 30)
                        ));
                    }
                }
                let mut c = sc_cg.command(&prog);
                c.arg(&name).env_remove("LD_PRELOAD");
                let sct = run_to_end(c, &dir, None, timeout);
                results.lock().unwrap().push(Outcome {
                    name,
                    tcp: trace_of(&tcp),
                    ism: trace_of(&ism),
                    ism_smc,
                    want_smc: want,
                    shortcut: trace_of(&sct),
                    timer: if timer_flake.is_some() {
                        trace_of(&tcp)
                    } else {
                        trace_of(&timer)
                    },
                    timer_flake,
                    timer_ms,
                    timer_log: tail(&timer.stderr, 80),
                    ism_log: tail(&ism.stderr, 80),
                });
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    let order: Vec<&String> = scenarios.iter().map(|(n, _)| n).collect();
    results.sort_by_key(|o| order.iter().position(|n| **n == o.name));

    let mut table = String::from(
        "scenario                              | TCP | ism                      | ism, CLC timer   | shortcut\n\
         --------------------------------------|-----|--------------------------|------------------|---------\n",
    );
    let mut failures = Vec::new();
    let mut flakes = Vec::new();
    let (mut same, mut listed) = (0, 0);
    for o in &results {
        let smc_ok =
            o.ism_smc == o.want_smc || (SMC_EITHER.contains(&o.name.as_str()) && o.ism_smc <= 1);
        let ism_same = o.ism == o.tcp && smc_ok;
        let expected = EXPECTED.iter().find(|(n, _)| *n == o.name);
        let ism_col = match (ism_same, expected) {
            (true, None) => {
                same += 1;
                "same".to_string()
            }
            (true, Some(_)) => {
                // Some listed differences depend on timing (e.g. whether a handshake of this
                // process's own connection has completed when the scenario polls), so a
                // listed scenario may match in one run: reported, not a failure.
                eprintln!(
                    "{}: listed as differing but matched TCP in this run (remove it from EXPECTED if it always does)",
                    o.name
                );
                "same (listed)".into()
            }
            (false, Some(_)) => {
                listed += 1;
                // Its trace and the library's account of it, for a listed difference whose
                // cause is still open (it shows in some runs only).
                eprintln!(
                    "{} (listed) differs in this run:\n{}\nthe data-path run's stderr (SMC_DEBUG), last lines:\n{}\n",
                    o.name,
                    diff(&o.tcp, &o.ism),
                    tail(&o.ism_log, 30)
                );
                "differs (listed)".into()
            }
            (false, None) => {
                failures.push(format!(
                    "{}: differs from TCP{}\n{}\nthe data-path run's stderr (SMC_DEBUG), last lines:\n{}\n",
                    o.name,
                    if smc_ok {
                        String::new()
                    } else {
                        format!(
                            " (SMC-D client connections {} instead of {})",
                            o.ism_smc, o.want_smc
                        )
                    },
                    diff(&o.tcp, &o.ism),
                    o.ism_log
                ));
                if smc_ok {
                    "DIFFERS".into()
                } else {
                    format!("DIFFERS (smc {}/{})", o.ism_smc, o.want_smc)
                }
            }
        };
        if let Some(f) = &o.timer_flake {
            flakes.push(format!(
                "{}: differed from TCP once with a CLC timeout of {} ms (matched in 2 more runs)\n{f}\n",
                o.name, o.timer_ms
            ));
        }
        let timer_col = match (o.timer == o.tcp, expected.is_some()) {
            (true, _) if o.timer_flake.is_some() => "flaky (1 of 3)",
            (true, _) => "same",
            (false, true) => "differs (listed)",
            (false, false) => {
                failures.push(format!(
                    "{}: differs from TCP with a CLC timeout of {} ms\n{}\nthe data-path run's stderr (SMC_DEBUG), last lines:\n{}\n",
                    o.name,
                    o.timer_ms,
                    diff(&o.tcp, &o.timer),
                    o.timer_log
                ));
                "DIFFERS"
            }
        };
        let sc_col = if o.shortcut == o.tcp {
            "same"
        } else {
            "differs"
        };
        table.push_str(&format!(
            "{:<38}| ok  | {:<25}| {:<17}| {}\n",
            o.name, ism_col, timer_col, sc_col
        ));
    }
    table.push_str(&format!(
        "\n{} scenarios: ism matches TCP in {same}, {listed} listed differences ({}), {} unexpected, {} timer flakes\n",
        results.len(),
        EXPECTED
            .iter()
            .map(|(n, why)| format!("{n}: {why}"))
            .collect::<Vec<_>>()
            .join("; "),
        failures.len(),
        flakes.len()
    ));
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results");
    let _ = std::fs::create_dir_all(&path);
    let _ = std::fs::write(path.join("conformance.txt"), &table);
    // The differences first: a log cut to its head and tail still shows them.
    for f in &flakes {
        println!("FLAKE {f}");
    }
    for f in &failures {
        println!("DIFFERENCE {f}");
    }
    println!("{table}");
    if std::env::var_os("SMC_CONFORM_SHOW").is_some() {
        for o in &results {
            println!("== {}\n{}", o.name, diff(&o.tcp, &o.ism));
        }
    }
    assert!(
        failures.is_empty(),
        "{} scenario(s) differ from TCP:\n\n{}",
        failures.len(),
        failures.join("\n")
    );
}
