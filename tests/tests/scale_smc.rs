//! Many concurrent connections (issue 14, "Scale"): `smc-scale` (tests/src/bin/smc-scale.rs),
//! an epoll server and an epoll client holding N connections that each ping 64 bytes per round,
//! both under the data path in an ism-attached cgroup with the test's own daemon.
//!
//! - 1000 connections: every one is SMC-D on both ends, every ping is answered with its own
//!   bytes, none is reset.
//! - The client's memory mappings run out (`vm.max_map_count`, reached by taking all mappings
//!   but a few before connecting, as 20 000+ connections would): the connections that cannot
//!   map their DMBs fall back to TCP with a `MEM` decline, cleanly (every ping answered, no
//!   reset), and the others stay SMC-D.
//!
//! - The daemon runs out of descriptors (its `RLIMIT_NOFILE` lowered while it runs): the
//!   registrations it cannot take (no memfd, or the socket passed with the request dropped by
//!   the kernel, `MSG_CTRUNC`) decline with `MEM`, never `INTERR`, and fall back cleanly; a
//!   server that sent its accept is never reset (its attach after the client's confirm, whose
//!   socket the daemon cannot receive, is proved by the record of its registration).
//!
//! - The daemon below four descriptors per connection (its limit 1500 above its start, 2000
//!   connections): every connection SMC-D, the daemon holding fewer descriptors than
//!   connections (their files shelved, see `smc_ism`'s `daemon/shelf.rs`).
//!
//! - The server's memory mappings run out while its handshakes are past their CLC accept: it
//!   held a mapping for the client's DMB from before its accept, none is reset (a handshake
//!   that cannot hold one declines with `MEM` before its accept).
//!
//! - The application itself at its descriptor limit (the server, or the client, sized for its
//!   own connections and one descriptor more, the library's daemon connection): differential,
//!   as plain programs under the same limits they observe the same (every connection up, every
//!   ping answered, none reset); a DMB memfd that finds no descriptor makes its connection
//!   decline with `MEM` before the point of no return, and the library holds no descriptor of
//!   another handshake's across the application's calls (the client's own `socket()` calls
//!   would find none).
//!
//! Needs root (cgroups, eBPF). Build first: `cargo build --release -p smc-ctl -p smc-preload
//! -p integration-tests --bins`, then `cargo test --release -p integration-tests --test
//! scale_smc`.
use integration_tests::{
    bin, brief, fallbacks, free_port, run_to_end, spawn_logged, wait_listening, wait_until,
    SmcWorld, Snapshot,
};
use smc_common::diag::Diag;
use std::time::Duration;

/// Bound of every wait for a program or a condition.
const T: Duration = Duration::from_secs(120);

struct Run {
    out: serde_json::Value,
    client: Snapshot,
    server: Snapshot,
}

/// Runs the server and a client of `n` connections and `rounds` rounds (`map_room`: mappings
/// left to the client below `vm.max_map_count`).
fn scale_run(w: &SmcWorld, n: u32, rounds: u32, map_room: Option<u32>) -> Run {
    let cenv: Vec<(&str, String)> = map_room
        .map(|r| ("SMC_SCALE_MAP_ROOM", r.to_string()))
        .into_iter()
        .collect();
    scale_run_with(w, n, rounds, &cenv)
}

/// `scale_run` with extra environment for the client (`cenv`).
fn scale_run_with(w: &SmcWorld, n: u32, rounds: u32, cenv: &[(&str, String)]) -> Run {
    let (out, stats) = scale_programs(w, n, rounds, &[], cenv, true);
    let Some((client, server)) = stats else {
        panic!("no statistics under the data path")
    };
    Run {
        out,
        client,
        server,
    }
}

/// Runs the server and a client of `n` connections and `rounds` rounds, with extra environment
/// (`senv`, `cenv`), under the data path (`smc`: then also their statistics, client's first) or
/// as plain programs (the same ones, without the library).
fn scale_programs(
    w: &SmcWorld,
    n: u32,
    rounds: u32,
    senv: &[(&str, String)],
    cenv: &[(&str, String)],
    smc: bool,
) -> (serde_json::Value, Option<(Snapshot, Snapshot)>) {
    let port = free_port();
    let logs = w.subdir("logs");
    let program = |env: &[(&str, String)]| {
        let mut c = if smc {
            w.run(bin("smc-scale"))
        } else {
            let mut c = std::process::Command::new(bin("smc-scale"));
            w.env(&mut c);
            c
        };
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c
    };
    let mut s = program(senv);
    s.arg("server").arg(port.to_string());
    let slog = logs.join(if smc {
        "scale-server.log"
    } else {
        "scale-server-tcp.log"
    });
    let mut server = spawn_logged(s, &slog);
    wait_listening(&mut server, port, T, "smc-scale server", Some(&slog));
    let mut c = program(cenv);
    c.args([
        "client",
        &port.to_string(),
        &n.to_string(),
        &rounds.to_string(),
        "500",
    ]);
    let f = run_to_end(c, &logs, None, T).ok();
    let out: serde_json::Value = serde_json::from_str(f.text().trim())
        .unwrap_or_else(|e| panic!("smc-scale client output ({e}): {}", f.text()));
    let stats = smc.then(|| {
        (
            w.stats_of(f.pid, "smc-scale client"),
            w.stats_of(server.0.id(), "smc-scale server"),
        )
    });
    (out, stats)
}

fn num(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("smc-scale printed no {k}: {v}"))
}

/// Every connection up, every ping answered with its own bytes, nothing reset.
fn assert_clean(r: &Run, n: u64) {
    let o = &r.out;
    assert_eq!(num(o, "established"), n, "connections set up: {o}");
    assert_eq!(num(o, "connect_errors"), 0, "{o}");
    assert_eq!(num(o, "resets"), 0, "connections reset or closed: {o}");
    assert_eq!(num(o, "wrong"), 0, "answers with wrong bytes: {o}");
    assert_eq!(num(o, "unanswered"), 0, "pings never answered: {o}");
    // The setup ping of each connection, then every ping of the rounds.
    assert_eq!(num(o, "answered"), n + num(o, "pings"), "{o}");
    assert!(num(o, "pings") > 0, "no ping in the rounds: {o}");
}

#[test]
fn thousand_connections_all_smcd() {
    let w = SmcWorld::new();
    let n = 1000;
    let r = scale_run(&w, n as u32, 2, None);
    assert_clean(&r, n);
    for (what, s, key) in [
        ("client", &r.client, "smcd_client"),
        ("server", &r.server, "smcd_server"),
    ] {
        assert_eq!(
            s.get(key),
            n,
            "{what}: not every connection is SMC-D: {}",
            brief(s)
        );
        assert_eq!(fallbacks(s), 0, "{what} fell back: {}", brief(s));
        assert_eq!(s.get("handshake_errors"), 0, "{what}: {}", brief(s));
    }
    assert_eq!(
        num(&r.out, "smcd_conns"),
        n,
        "client DMB mappings: {}",
        r.out
    );
}

#[test]
fn mappings_exhausted_fall_back_with_mem() {
    let w = SmcWorld::new();
    let n = 600;
    // Three mappings per SMC-D connection end (its DMB, the peer's, its shared state): room
    // for a few hundred, not for 600.
    let r = scale_run(&w, n as u32, 1, Some(900));
    assert_clean(&r, n);
    let (c, s) = (&r.client, &r.server);
    let smcd = c.get("smcd_client");
    let fb = c.get("fallback_client");
    assert!(
        smcd > 0 && fb > 0,
        "expected both SMC-D and MEM fallbacks: {}",
        brief(c)
    );
    assert_eq!(smcd + fb, n, "client: {}", brief(c));
    let mem = Diag::Mem.code();
    let by_reason: u64 = c.reasons.values().sum();
    let mem_n: u64 = c
        .reasons
        .iter()
        .filter(|(k, _)| **k == mem)
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        mem_n,
        by_reason,
        "every fallback must be MEM ({mem:#010x}): {}",
        brief(c)
    );
    assert_eq!(mem_n, fb, "client: {}", brief(c));
    // The server saw the same split: its SMC-D connections are exactly the client's.
    assert_eq!(s.get("smcd_server"), smcd, "server: {}", brief(s));
    assert_eq!(s.get("fallback_server"), fb, "server: {}", brief(s));
}

/// Every fallback of `s` was declined with `MEM`; returns how many.
fn all_mem(what: &str, s: &Snapshot) -> u64 {
    let mem = Diag::Mem.code();
    let all: u64 = s.reasons.values().sum();
    let mem_n: u64 = s
        .reasons
        .iter()
        .filter(|(k, _)| **k == mem)
        .map(|(_, v)| v)
        .sum();
    assert_eq!(
        mem_n,
        all,
        "{what}: every fallback must be MEM: {}",
        brief(s)
    );
    mem_n
}

#[test]
fn daemon_out_of_descriptors_declines_mem() {
    // Files kept by descriptor (no shelves): the daemon really runs out (with shelves, it
    // may keep up and serve all 1000: `a_daemon_below_four_descriptors_per_connection_…`).
    daemon_out_of_descriptors(&["--shelve-after-ms", "never"]);
}

/// The same with every DMB's files shelved (`--shelve-after-ms 0`, as a daemon that shelves
/// under a low limit): a server past its accept whose attach found the client's memfd shelved
/// and the daemon without a descriptor to open it again was reset (issue 14: server `INTERR`,
/// the daemon logging "a DMB's memfd cannot be opened again: Too many open files"; 76 of 1000
/// in a first run of this setup, none in 9 runs of this test: all SMC-D in 3 of them, which it
/// fails too, for want of fallbacks). That DMB now keeps its descriptor until that attach
/// (`a_server_past_its_accept_attaches_at_the_daemons_descriptor_limit` makes the case
/// deterministically): none reset, the rest `MEM`.
#[test]
fn daemon_out_of_descriptors_with_shelved_files_declines_mem() {
    daemon_out_of_descriptors(&["--shelve-after-ms", "0"]);
}

/// 1000 connections with the daemon's `RLIMIT_NOFILE` 150 above what it holds at the start
/// (`daemon_args`: its extra arguments): some SMC-D, the rest `MEM`, none reset.
fn daemon_out_of_descriptors(daemon_args: &[&str]) {
    let w = SmcWorld::with_daemon_args(daemon_args);
    // Room for 150 descriptors besides those the daemon holds already: about 37 connections
    // (a memfd and a state page per DMB).
    let open = std::fs::read_dir(format!("/proc/{}/fd", w.daemon_pid()))
        .unwrap_or_else(|e| panic!("daemon fds: {e}"))
        .count() as u64;
    let lim = libc::rlimit {
        rlim_cur: (open + 150) as libc::rlim_t,
        rlim_max: (open + 150) as libc::rlim_t,
    };
    set_nofile(w.daemon_pid(), lim);
    // Many more than fit: the daemon stays at its limit for most of the setup, while servers
    // attach after their accept (before the recorded proof: 1 of 10 runs reset some with
    // 300 connections, 9 of 10 with 1000; on main of 2026-12-01, 6 of 13 runs reset 1-33).
    let n = 1000;
    // Clients wait for their server's answer as long as a handshake waits (2 s, not the
    // 100 ms of `SMC_ACCEPT_WAIT_MS`): on a loaded machine (another test run beside this
    // one) 192 of 570 clients gave up first and fell back with `TIMEOUT_CL`, a reason this
    // test is not about.
    let cenv = [("SMC_ACCEPT_WAIT_MS", "2000".to_string())];
    let r = scale_run_with(&w, n as u32, 1, &cenv);
    eprintln!(
        "daemon at its limit {daemon_args:?}: client {} | server {}",
        brief(&r.client),
        brief(&r.server)
    );
    assert_eq!(
        r.server.get("handshake_errors"),
        0,
        "servers reset past their accept: {}",
        brief(&r.server)
    );
    assert_clean(&r, n);
    let c = &r.client;
    let (smcd, fb) = (c.get("smcd_client"), c.get("fallback_client"));
    assert!(
        smcd > 0 && fb > 0,
        "expected both SMC-D and fallbacks: {}",
        brief(c)
    );
    assert_eq!(smcd + fb, n, "client: {}", brief(c));
    assert_eq!(all_mem("client", c), fb);
    assert_eq!(
        all_mem("server", &r.server),
        r.server.get("fallback_server")
    );
}

/// The lowest descriptor number process `pid` has free.
fn lowest_free_fd(pid: u32) -> u64 {
    let open: std::collections::HashSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap_or_else(|e| panic!("the descriptors of {pid}: {e:?}"))
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    (0..).find(|n| !open.contains(n)).unwrap_or(0)
}

/// `RLIMIT_NOFILE` of process `pid` lowered to its lowest free descriptor: it can open none.
fn exhaust(pid: u32) {
    let free = lowest_free_fd(pid);
    set_nofile(
        pid,
        libc::rlimit {
            rlim_cur: free,
            rlim_max: free,
        },
    );
}

/// The soft `RLIMIT_NOFILE` of process `pid` lowered to its lowest free descriptor (the hard
/// one kept): it can open none. Returns the limits it had.
fn exhaust_soft(pid: u32) -> libc::rlimit {
    let free = lowest_free_fd(pid);
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit on the pid with a valid struct, reading the old value only.
    let r = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut old,
        )
    };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    set_nofile(
        pid,
        libc::rlimit {
            rlim_cur: free,
            rlim_max: old.rlim_max,
        },
    );
    old
}

/// Sets the `RLIMIT_NOFILE` of process `pid`.
fn set_nofile(pid: u32, lim: libc::rlimit) {
    // SAFETY: prlimit on the pid with a valid struct, no old value wanted.
    let r = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// The descriptors of process `pid` that are one of `socks` (the same open sockets).
fn copies_in(pid: u32, socks: &[&std::net::TcpStream]) -> usize {
    use std::os::fd::AsRawFd as _;
    let links: Vec<_> = socks
        .iter()
        .filter_map(|s| std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).ok())
        .collect();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|l| links.contains(l))
                .count()
        })
        .unwrap_or(0)
}

fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("listen: {e:?}"));
    let a = std::net::TcpStream::connect(l.local_addr().unwrap_or_else(|e| panic!("addr: {e:?}")))
        .unwrap_or_else(|e| panic!("connect: {e:?}"));
    let (b, _) = l.accept().unwrap_or_else(|e| panic!("accept: {e:?}"));
    (a, b)
}

/// What a server past its CLC accept asks the daemon (it can no longer decline: a failure
/// resets the connection, server `INTERR`) works with the daemon out of descriptors and every
/// DMB's files shelved (issue 14: at 65 536 connections with `vm.max_map_count` at its default,
/// 236 and 1 connections reset, the daemon logging "a DMB's memfd cannot be opened again: Too
/// many open files"). The requests are the data path's, sent from here step by step to the
/// test's real daemon (`--shelve-after-ms 0`), whose limit is then lowered to its lowest free
/// descriptor, so that it can open none:
///
/// - the server registered alone before its accept (its proof recorded), the client after it:
///   the server's attach of the client's DMB (its socket dropped by the kernel, proved by the
///   record) gets the memfd, which the daemon kept open for that attach. Before, the client's
///   memfd was shelved at its registration and its reopen failed (`EMFILE`): the reply came
///   without it, `Mem`, a reset (every run);
/// - the server's DMB came with a `PAIR`, whose answer the client could not use (it registers
///   alone then, as the data path does when its pair's memfds did not arrive): the same
///   attach, proved by the registry's record of the server's paired DMB. Before, no proof was
///   recorded for a `PAIR`: `Mem`, a reset (every run).
#[test]
fn a_server_past_its_accept_attaches_at_the_daemons_descriptor_limit() {
    use smc_ism::SharedClient;
    use std::os::fd::AsRawFd as _;
    let w = SmcWorld::with_daemon_args(&["--shelve-after-ms", "0"]);
    let dpid = w.daemon_pid();
    let client = SharedClient::new(&w.sock);
    let server = SharedClient::new(&w.sock);
    assert!(server.recorded_proof(), "the daemon records proofs");
    // Registered alone: the server before its accept, the client after it.
    let (a1, b1) = tcp_pair();
    let t = server
        .register_dmb_start_with(0, b1.as_raw_fd(), None, true)
        .unwrap_or_else(|e| panic!("server registers: {e:?}"));
    let sd1 = server
        .finish_dmb(t)
        .unwrap_or_else(|e| panic!("server's DMB: {e:?}"));
    let cd1 = client
        .register_dmb(0, a1.as_raw_fd())
        .unwrap_or_else(|e| panic!("client's DMB: {e:?}"));
    let sa1 = client
        .attach_dmb(sd1.token, a1.as_raw_fd())
        .unwrap_or_else(|e| panic!("client attaches the server's DMB: {e:?}"));
    // Paired (the server waits, the client completes), then the client registers alone.
    let (a2, b2) = tcp_pair();
    let ts = server
        .pair_start(0, Duration::from_secs(10), b2.as_raw_fd())
        .unwrap_or_else(|e| panic!("server's PAIR: {e:?}"));
    let tc = client
        .pair_start(0, Duration::from_secs(10), a2.as_raw_fd())
        .unwrap_or_else(|e| panic!("client's PAIR: {e:?}"));
    let (cown, cpeer) = client
        .finish_pair(tc, None)
        .unwrap_or_else(|e| panic!("client paired: {e:?}"));
    let (sown, _speer) = server
        .finish_pair(ts, None)
        .unwrap_or_else(|e| panic!("server paired: {e:?}"));
    client
        .release_nowait(Some(cown.token), Some(cpeer.token))
        .unwrap_or_else(|e| panic!("client gives its pair's DMBs back: {e:?}"));
    let cd2 = client
        .register_dmb(0, a2.as_raw_fd())
        .unwrap_or_else(|e| panic!("client's DMB registered alone: {e:?}"));
    let sa2 = client
        .attach_dmb(sown.token, a2.as_raw_fd())
        .unwrap_or_else(|e| panic!("client attaches the server's paired DMB: {e:?}"));
    // The daemon keeps none of the sockets passed (its closer works apart), then can open no
    // descriptor at all.
    wait_until(T, "the daemon to close the sockets passed", || {
        copies_in(dpid, &[&a1, &b1, &a2, &b2]) == 0
    });
    exhaust(dpid);
    for (what, cd, b, own) in [
        ("registered alone", &cd1, &b1, sd1.token),
        ("paired", &cd2, &b2, sown.token),
    ] {
        // As the data path sends it after the client's confirm: naming its own registration.
        let t = server
            .attach_dmb_start_reserved(cd.token, b.as_raw_fd(), own, &mut None)
            .unwrap_or_else(|e| panic!("attach sent: {e:?}"));
        let got = server
            .finish_dmb(t)
            .unwrap_or_else(|e| panic!("{what}: the server's attach after its accept: {e:?}"));
        assert_eq!(got.token, cd.token, "{what}");
        got.map()
            .unwrap_or_else(|e| panic!("{what}: the client's DMB mapped: {e}"));
    }
    drop((sa1, sa2, cd1, cd2, sd1, sown, cown, cpeer));
}

/// A `PAIR` that would wait for its peer with the daemon near its descriptor limit makes room
/// (the files of established DMBs shelved) instead of being refused. Before, it was refused
/// (`MEM`, `EMFILE`) whatever the daemon's DMB files held: in
/// `a_daemon_below_four_descriptors_per_connection_keeps_every_one_on_smcd`, 50–72 `PAIR`s in 2
/// of 6 runs with 1030–1082 of its ~1500 descriptors held by DMB files, and once 82 of the 2000
/// connections fell back. Here, step by step: 50 pairs completed (100 DMBs and their state
/// pages, 200 descriptors), 300 client connections (so that DMB files hold fewer than half of
/// the daemon's descriptors: the background sweep shelves none),
/// then the daemon's limit 40 above its lowest free descriptor (within the 64 a waiting `PAIR` keeps free, beyond the 32 a request needs to pass its socket), then a pair: both ends get their
/// DMBs (before: the end that would wait refused with `MEM`, the other `NOPEER`: 6 of 6 runs).
#[test]
fn a_pair_at_the_daemons_descriptor_limit_makes_room_instead_of_declining() {
    use smc_ism::SharedClient;
    use std::os::fd::AsRawFd as _;
    let w = SmcWorld::with_daemon_args(&[]);
    let dpid = w.daemon_pid();
    let (x, y) = (SharedClient::new(&w.sock), SharedClient::new(&w.sock));
    let pair = |a: &std::net::TcpStream, b: &std::net::TcpStream, what: &str| {
        let tx = x
            .pair_start(0, Duration::from_secs(10), a.as_raw_fd())
            .unwrap_or_else(|e| panic!("{what}: first PAIR sent: {e:?}"));
        let ty = y
            .pair_start(0, Duration::from_secs(10), b.as_raw_fd())
            .unwrap_or_else(|e| panic!("{what}: second PAIR sent: {e:?}"));
        // Replies within the pair's own 10 s, not the client's 2 s round trip: on a loaded
        // machine (CI42, another test run beside) the daemon making room took longer.
        let xd = x.finish_pair(tx, Some(Duration::from_secs(10)));
        let yd = y.finish_pair(ty, Some(Duration::from_secs(10)));
        match (xd, yd) {
            (Ok(xd), Ok(yd)) => (xd, yd),
            (xd, yd) => {
                // Both ends' answers and the daemon's counters say which request it refused.
                let st = smc_ism::Client::connect(&w.sock).and_then(|mut c| c.stats());
                panic!(
                    "{what}: the end that waited: {:?}, the end that completed: {:?}; daemon: {:?}",
                    xd.err(),
                    yd.err(),
                    st.map(|s| (s.failures, s.ops.pair))
                )
            }
        }
    };
    let socks: Vec<_> = (0..50).map(|_| tcp_pair()).collect();
    let held: Vec<_> = socks
        .iter()
        .enumerate()
        .map(|(i, (a, b))| pair(a, b, &format!("pair {i}")))
        .collect();
    let all: Vec<&std::net::TcpStream> = socks.iter().flat_map(|(a, b)| [a, b]).collect();
    wait_until(T, "the daemon to close the sockets passed", || {
        copies_in(dpid, &all) == 0
    });
    // Then descriptors of the daemon's that are no DMB files, above its DMB files (the lowest
    // free first): 300 client connections.
    let pads: Vec<SharedClient> = (0..300)
        .map(|i| {
            let c = SharedClient::new(&w.sock);
            c.connect()
                .unwrap_or_else(|e| panic!("client {i} connects: {e:?}"));
            c
        })
        .collect();
    wait_until(T, "the daemon to take the client connections", || {
        std::fs::read_dir(format!("/proc/{dpid}/fd")).map_or(0, |d| d.count()) >= 500
    });
    let free = lowest_free_fd(dpid);
    set_nofile(
        dpid,
        libc::rlimit {
            rlim_cur: free + 40,
            rlim_max: free + 40,
        },
    );
    let (a, b) = tcp_pair();
    let got = pair(&a, &b, "the pair at the limit");
    drop((got, held, pads));
}

/// The daemon's descriptors bound nothing that is established (issue 14): it kept a DMB's memfd
/// and its state page open for as long as the DMB lived, four descriptors per connection, and
/// under this VM's hard `RLIMIT_NOFILE` of 20 000 half of 10 000 connections fell back. Now it
/// shelves them (a mapping of its own instead of a descriptor). 2000 connections under a limit
/// of 1500 descriptors above those it holds at the start (room for 375 connections at four
/// each): every one SMC-D on both ends, every ping answered, and the daemon holds fewer
/// descriptors than there are connections. With `--shelve-after-ms never` (the old daemon's
/// descriptors), 1425 of the 2000 fell back with `MEM` (1 run).
#[test]
fn a_daemon_below_four_descriptors_per_connection_keeps_every_one_on_smcd() {
    daemon_limit_case(&[], |r, n, daemon_fds| {
        assert_clean(r, n);
        for (what, s, key) in [
            ("client", &r.client, "smcd_client"),
            ("server", &r.server, "smcd_server"),
        ] {
            assert_eq!(s.get(key), n, "{what}: {}", brief(s));
        }
        assert!(
            daemon_fds < n,
            "the daemon holds {daemon_fds} descriptors for {n} connections"
        );
    });
}

/// Runs 2000 connections with the daemon's `RLIMIT_NOFILE` (soft and hard) 1500 above what it
/// holds at the start; `check(run, n, the daemon's descriptors at the end of the rounds)`.
fn daemon_limit_case(daemon_args: &[&str], check: impl FnOnce(&Run, u64, u64)) {
    let w = SmcWorld::with_daemon_args(daemon_args);
    let dpid = w.daemon_pid();
    let fds = || {
        std::fs::read_dir(format!("/proc/{dpid}/fd"))
            .map(|d| d.count() as u64)
            .unwrap_or_else(|e| panic!("the daemon's descriptors: {e}"))
    };
    // Read once: the daemon may still be opening descriptors, and a soft limit above the hard
    // one is EINVAL (seen once in 8 runs of the file).
    let at_start = fds() + 1500;
    let lim = libc::rlimit {
        rlim_cur: at_start as libc::rlim_t,
        rlim_max: at_start as libc::rlim_t,
    };
    set_nofile(dpid, lim);
    let n = 2000;
    let r = scale_run(&w, n as u32, 1, None);
    eprintln!(
        "daemon below 4 descriptors per connection: client {} | server {} | smc-scale daemon_fds {}",
        brief(&r.client),
        brief(&r.server),
        r.out["daemon_fds"]
    );
    let daemon_fds = num(&r.out, "daemon_fds");
    check(&r, n, daemon_fds);
}

/// The application itself at its descriptor limit (`SMC_SCALE_NOFILE_ROOM`: exactly its own
/// connections' worth above what it has open at the start, and one more, which the library's
/// daemon connection takes; the other program has its usual room), so the memfds of its DMBs
/// find no descriptor now and then. As plain programs under the same limits nothing fails;
/// under the library they must observe the same (every connection up, every byte answered,
/// none reset): a handshake whose memfd found no descriptor declines with `MEM` before the
/// point of no return, and a server that sent its accept receives the client's memfd into the
/// descriptor it held since its registration.
fn process_at_its_limit(
    w: &SmcWorld,
    what: &str,
    senv: &[(&str, String)],
    cenv: &[(&str, String)],
) {
    let n = 300;
    let (tcp, _) = scale_programs(w, n as u32, 1, senv, cenv, false);
    let (smc, stats) = scale_programs(w, n as u32, 1, senv, cenv, true);
    for k in [
        "established",
        "connect_errors",
        "resets",
        "wrong",
        "unanswered",
        "answered",
        "pings",
    ] {
        assert_eq!(
            num(&tcp, k),
            num(&smc, k),
            "{what}: {k} differs from plain TCP:\n tcp {tcp}\n smc {smc}"
        );
    }
    let r = Run {
        out: smc.clone(),
        client: Snapshot::default(),
        server: Snapshot::default(),
    };
    assert_clean(&r, n);
    let Some((c, s)) = stats else {
        panic!("{what}: no statistics under the data path")
    };
    eprintln!(
        "{what}: client {} | server {}\n tcp {tcp}\n smc {smc}",
        brief(&c),
        brief(&s)
    );
    for (side, st) in [("client", &c), ("server", &s)] {
        assert_eq!(
            st.get("handshake_errors"),
            0,
            "{what}: {side} reset a handshake: {}",
            brief(st)
        );
    }
    let (smcd, fb) = (c.get("smcd_client"), c.get("fallback_client"));
    assert_eq!(smcd + fb, n, "{what}: client: {}", brief(&c));
    assert!(fb > 0, "{what}: the limit was never reached: {}", brief(&c));
    assert_eq!(all_mem("client", &c), fb, "{what}");
    assert_eq!(all_mem("server", &s), s.get("fallback_server"), "{what}");
    assert_eq!(s.get("smcd_server"), smcd, "{what}: server: {}", brief(&s));
}

fn tight(n: u64) -> Vec<(&'static str, String)> {
    vec![("SMC_SCALE_NOFILE_ROOM", (n + 1).to_string())]
}

/// Without the descriptor held from the registration, 5 of 10 runs reset or failed up to 3
/// connections (the server's memfd of the client's DMB found none after the confirm).
#[test]
fn server_out_of_descriptors_declines_mem() {
    let w = SmcWorld::new();
    process_at_its_limit(&w, "server at its limit", &tight(300), &[]);
}

/// Before requests were sent ahead only while the daemon connection had room for their
/// replies: 117 of 300 connects failed with `EMFILE` (2 of 2 runs), the descriptors held by
/// memfds of replies read for other handshakes.
#[test]
fn client_out_of_descriptors_declines_mem() {
    let w = SmcWorld::new();
    process_at_its_limit(&w, "client at its limit", &[], &tight(300));
}

/// A server whose memory mappings run out while its handshakes are past their CLC accept
/// (`vm.max_map_count`: those under way took them) maps the client's DMB after the client
/// confirmed, when it can no longer decline. It must never reset: it holds a mapping from
/// before its accept for it (`smc-preload` `handshake::Driver::map_slot`), and a handshake for
/// which it cannot hold one declines with `MEM` before its accept. Differential, as
/// [`process_at_its_limit`]: the server takes all mappings but 600 before it serves (room for
/// ~200 connection ends at three mappings each, not 300) and registers its DMBs alone
/// (`SMC_PAIR=0`: what a server does whose `PAIR` finds no partner: a client that does not
/// pair, or a daemon at its descriptor limit that refuses `PAIR`s), so that the client's DMB is
/// attached and mapped after the confirm. Before: the confirmed connections whose DMB the
/// server could not map were reset (server `INTERR`, "mapping of the client's DMB failed"):
/// 293 and 437 of 1000 by hand, 1000 connections, rooms 600 and 900.
#[test]
fn a_server_out_of_mappings_past_its_accept_declines_before_it() {
    let w = SmcWorld::new();
    let senv = vec![
        ("SMC_SCALE_MAP_ROOM", "600".to_string()),
        ("SMC_PAIR", "0".to_string()),
    ];
    process_at_its_limit(&w, "server out of mappings", &senv, &[]);
}

/// A process that starts while the daemon has no descriptor left for it (its `RLIMIT_NOFILE`
/// lowered to its lowest free descriptor) falls back to TCP at once: the daemon accepts it with
/// the one descriptor it keeps spare for that and closes it, so that its library sees the
/// daemon gone (`NOSMCDDEV`) instead of waiting in the listener's backlog for a reply nobody
/// reads. Before, each such process's first handshakes waited out the daemon's timeout (2 s,
/// both the server's and the client's): 5 connections took 4.0 s, then 6.0 s in a second
/// process (8 of 8 runs by hand), TCP ~1 ms; after, ~20 ms (16 of 16). Checked by the daemon's
/// count of clients refused that way (deterministic) and the clean fallback of all 5.
#[test]
fn a_new_process_at_a_daemon_without_descriptors_falls_back_at_once() {
    let w = SmcWorld::new();
    let dpid = w.daemon_pid();
    let port = free_port();
    let logs = w.subdir("logs");
    let mut s = w.run(bin("smc-scale"));
    s.arg("server").arg(port.to_string());
    let slog = logs.join("scale-server.log");
    let mut server = spawn_logged(s, &slog);
    wait_listening(&mut server, port, T, "smc-scale server", Some(&slog));
    // Its soft limit only: the hard one stays, so that it can be raised again (no
    // CAP_SYS_RESOURCE needed).
    let old = exhaust_soft(dpid);
    let mut c = w.run(bin("smc-scale"));
    c.args(["client", &port.to_string(), "5", "1", "100"]);
    let f = run_to_end(c, &logs, None, T).ok();
    let out: serde_json::Value = serde_json::from_str(f.text().trim())
        .unwrap_or_else(|e| panic!("smc-scale client output ({e}): {}", f.text()));
    // The daemon may open descriptors again (for `smc-ctl stats`).
    set_nofile(dpid, old);
    let cs = w.stats_of(f.pid, "smc-scale client");
    eprintln!(
        "new process at the daemon's limit: {out}\n client {}",
        brief(&cs)
    );
    let r = Run {
        out: out.clone(),
        client: Snapshot::default(),
        server: Snapshot::default(),
    };
    assert_clean(&r, 5);
    assert_eq!(cs.get("smcd_client"), 0, "{}", brief(&cs));
    assert_eq!(cs.get("fallback_client"), 5, "{}", brief(&cs));
    let figs = &w.stats_json()["daemon"]["figures"];
    let refused = figs["clients_refused_fd_limit"].as_u64().unwrap_or(0);
    assert!(
        refused >= 1,
        "the daemon refused no client for want of a descriptor: {figs}"
    );
    // The time it took is shown, not asserted (no timing threshold in a test): before, 4.0 s
    // and more (each handshake waited out the daemon timeout); after, ~20 ms.
    eprintln!("setup of 5 connections: {} s", out["setup_secs"]);
}
