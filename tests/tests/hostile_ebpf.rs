//! The eBPF opt-in channel against hostile local users (issue 12 item 4): an unprivileged
//! process in an attached cgroup must not switch the `sk_msg` shortcut on for its own socket.
//! Only the loopback-ism daemon (root) grants it, to the exact socket that proved at a DMB
//! attach to be the peer of a registered one, and the data path then enables it.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write as _, process::Stdio, time::Duration};

use smc_common::bpf::{PeerEntry, SockKey};

use integration_tests::{
    as_user, bin, brief, counters, delta, free_port, lock, nobody, ready_port, require_root,
    spawn_piped, spawn_port, test_cgroup, Attached, Cgroup, SmcWorld,
};

const T: Duration = Duration::from_secs(60);
/// What the attacker tries to push into the victim's socket.
const FLOOD: u64 = 64 << 20;

/// The largest receive and send buffers TCP autotuning may reach (`tcp_rmem[2]`,
/// `tcp_wmem[2]`): what plain TCP lets a writer queue toward a reader that never reads.
fn tcp_buffer_max() -> (u64, u64) {
    let third = |f: &str| -> u64 {
        let s = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{f}: {e}"));
        s.split_whitespace()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{f}: {s:?}"))
    };
    (
        third("/proc/sys/net/ipv4/tcp_rmem"),
        third("/proc/sys/net/ipv4/tcp_wmem"),
    )
}

fn field<'a>(out: &'a str, key: &str) -> &'a str {
    let toks: Vec<&str> = out.split_whitespace().collect();
    toks.iter()
        .position(|t| *t == key)
        .and_then(|i| toks.get(i + 1))
        .copied()
        .unwrap_or_else(|| panic!("no {key} in {out:?}"))
}

fn state_of(out: &str) -> (u32, u64) {
    let v = out
        .split_whitespace()
        .find_map(|t| t.strip_prefix("state="))
        .unwrap_or_else(|| panic!("no state= in {out:?}"));
    let (f, b) = v.split_once('/').unwrap_or_else(|| panic!("state {v:?}"));
    (f.parse().unwrap(), b.parse().unwrap())
}

/// One flood: a victim (root, no library) listens with the SMC opt-in in `cg` and never reads;
/// `nobody`, also in `cg`, connects with the opt-in (both ends announced SMC: both sockets are
/// in the SOCKHASH), optionally asks for the shortcut, and writes up to [`FLOOD`] bytes without
/// blocking. Returns (setsockopt errno or 0, bytes the writer queued, the writer's redirected
/// bytes, the victim's SIOCINQ).
fn flood(cg: &Cgroup, shortcut: bool) -> (i32, u64, u64, u64) {
    let mut v = cg.command(bin("smc-testprog"));
    v.args(["sink", "127.0.0.1:0", "--opt-in"])
        .stdin(Stdio::piped());
    let (mut victim, port) = spawn_port(v, "PORT ");
    let mut a = cg.command(bin("smc-testprog"));
    a.args([
        "flood",
        &format!("127.0.0.1:{port}"),
        "--opt-in",
        "--limit",
        &FLOOD.to_string(),
    ]);
    if shortcut {
        a.arg("--shortcut");
    }
    as_user(&mut a, nobody());
    let out = spawn_piped(a).wait_output(T).expect("attacker");
    eprintln!("attacker (shortcut asked: {shortcut}): {out}");
    let errno: i32 = field(&out, "SHORTCUT").parse().unwrap();
    let queued: u64 = field(&out, "QUEUED").parse().unwrap();
    let (_, redirected) = state_of(&out);
    victim
        .0
        .stdin
        .take()
        .expect("victim stdin")
        .write_all(b"?\n")
        .expect("ask the victim");
    let vout = victim.wait_output(T).expect("victim");
    eprintln!("victim: {vout}");
    let inq: u64 = field(&vout, "INQ").parse().unwrap();
    (errno, queued, redirected, inq)
}

#[test]
fn unprivileged_process_cannot_enable_the_shortcut_for_itself() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "ism");
    let (rmem, wmem) = tcp_buffer_max();
    // Differential: the same flood without asking for the shortcut is plain TCP.
    let before = counters();
    let (e0, q0, r0, i0) = flood(&cg, false);
    assert_eq!(e0, 0);
    assert_eq!(r0, 0, "nothing asked, nothing redirected");
    assert!(q0 <= rmem + wmem, "plain TCP queued {q0}");
    assert!(i0 <= rmem, "plain TCP: victim holds {i0}");
    let (errno, queued, redirected, inq) = flood(&cg, true);
    let after = counters();
    assert_eq!(
        errno,
        libc::EPERM,
        "setsockopt(SMC_SO_SHORTCUT) by an unprivileged process on its own socket must fail"
    );
    assert_eq!(redirected, 0, "the attacker's bytes took the shortcut");
    assert!(
        queued <= rmem + wmem && queued < FLOOD,
        "the attacker queued {queued} bytes toward a reader that never reads (TCP bounds it \
         at tcp_rmem {rmem} + tcp_wmem {wmem})"
    );
    assert!(inq <= rmem, "victim holds {inq}");
    assert_eq!(delta(&before, &after, "bytes_redirected"), 0);
}

/// The data path still gets the shortcut for its doorbells: granted by the daemon at the
/// verified attach, enabled by the data path.
#[test]
fn smcd_doorbells_still_take_the_shortcut() {
    let w = SmcWorld::new();
    let mut s = w.run(bin("preload-prog"));
    s.args(["server", "0", "thread", "1"])
        .env("SMC_DMB_SIZE", "16384");
    let mut server = spawn_piped(s);
    let port = ready_port(&mut server).to_string();
    let before = counters();
    let mut c = w.run(bin("preload-prog"));
    c.args(["client", "127.0.0.1", &port, "4194304", "4194304", "7"])
        .env("SMC_DMB_SIZE", "16384");
    let out = spawn_piped(c).wait_output(T).expect("client");
    let sout = server.wait_output(T).expect("server");
    let after = counters();
    eprintln!("client: {out}\nserver: {sout}");
    // Byte-exact both ways: the client's received stream is what the server sent, and back.
    let kv = |out: &str, k: &str| field(&out.replace('=', " "), k).to_string();
    assert_eq!(kv(&out, "rx"), "4194304", "{out}");
    assert_eq!(kv(&out, "sha_rx"), kv(&sout, "sha_tx"), "{out} / {sout}");
    assert_eq!(kv(&out, "sha_tx"), kv(&sout, "sha_rx"), "{out} / {sout}");
    let s = w.stats_sum();
    assert_eq!(
        (s.get("smcd_client"), s.get("smcd_server")),
        (1, 1),
        "both ends on SMC-D: {}",
        brief(&s)
    );
    assert!(
        s.get("doorbells_sent") > 0,
        "a 4 MiB exchange through 16 KiB rings rings doorbells: {}",
        brief(&s)
    );
    assert!(
        delta(&before, &after, "msg_redirected") > 0,
        "the doorbells took the shortcut"
    );
}

/// `OP_SWEEP` (the quarantine of a withdrawn listener's queued connections, before an exec into
/// an image without the library; or of one connection's server end, asked by its client
/// before its FIN) as uid `nobody`: the daemon sweeps only for a listening TCP socket, or the
/// other end of a connected TCP socket, that the caller passes; a UDP socket is refused; a
/// sweep of its own (empty, announcing) listener, or of its own connection whose client
/// announced nothing, quarantines nothing.
#[test]
fn a_sweep_needs_a_listener_of_its_own() {
    let w = SmcWorld::new();
    let before = counters();
    for (kind, want) in [
        ("connected", "SWEEP ok"),
        ("udp", "SWEEP refused"),
        ("listener", "SWEEP ok"),
    ] {
        let mut c = w.cgroup().launch::<&str>(&[], None, bin("smc-hostile"));
        c.args(["sweep", kind]);
        w.env(&mut c);
        as_user(&mut c, nobody());
        let out = spawn_piped(c)
            .wait_output(T)
            .unwrap_or_else(|e| panic!("smc-hostile sweep {kind}: {e}"));
        assert!(out.starts_with(want), "sweep of a {kind} socket: {out}");
    }
    assert_eq!(delta(&before, &counters(), "quarantined"), 0);
}

/// The red team's round 22 probes (`tests/redteam/rt22_*.py`), run with `python3 -c`.
const RT22_ATTACK: &str = include_str!("../redteam/rt22_attack.py");
const RT22_VICTIM: &str = include_str!("../redteam/rt22_victim.py");

/// The attacker: uid `nobody`, outside the attached cgroups, without the library, talking to
/// the world's daemon itself.
fn rt22_attacker(w: &SmcWorld, args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new("python3");
    c.arg("-c")
        .arg(RT22_ATTACK)
        .args(args)
        .env("SMC_CTL_SOCK", &w.sock)
        .env_remove("LD_PRELOAD");
    as_user(&mut c, nobody());
    c
}

/// A victim of root under the library (`rt22_victim.py ARGS`: `server`, `client`, `burst`).
fn rt22_victim(w: &SmcWorld, args: &[&str]) -> std::process::Command {
    let mut c = w.run("python3");
    c.arg("-c")
        .arg(RT22_VICTIM)
        .args(args)
        .env("SMC_SHORT_BYTES", "0");
    c
}

/// A victim echo server of root under the library; returns it and its port.
fn rt22_server(w: &SmcWorld, accept_ms: u32) -> (integration_tests::Proc, u16) {
    let mut s = rt22_victim(w, &["server", &free_port().to_string()]);
    s.env("RT_ACCEPT_MS", accept_ms.to_string());
    spawn_port(s, "LISTENING ")
}

/// The `TUPLE ...` lines a victim client prints for its connections before `READY`.
fn rt22_tuples(client: &mut integration_tests::Proc) -> Vec<String> {
    let mut tuples = Vec::new();
    loop {
        let line = client.read_line();
        if let Some(t) = line.strip_prefix("TUPLE ") {
            tuples.push(t.to_string());
        } else if line.starts_with("READY") {
            return tuples;
        } else {
            panic!("victim client said {line:?}");
        }
    }
}

fn kv(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|t| t.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no {key}= in {out:?}")) as u64
}

/// `OP_LEAVE_SHORTCUT` takes only the caller's own socket out of the SOCKHASH. The SOCKHASH is
/// keyed by 4-tuple, unique only within a network namespace: uid `nobody` reads root's tuples
/// in `/proc/net/tcp`, rebuilds them in a user and network namespace of its own and passes its
/// sockets. The daemon took 8 of 8 of root's sockets out before (red team rt22 `leave`); now it
/// refuses all 8, and root's connections stay exact.
#[test]
fn another_uid_cannot_take_foreign_sockets_out_of_the_sockhash() {
    let w = SmcWorld::new();
    let (mut server, port) = rt22_server(&w, 0);
    let mut client = spawn_piped(rt22_victim(&w, &["client", &port.to_string(), "6", "4"]));
    assert_eq!(rt22_tuples(&mut client).len(), 4);
    let out = spawn_piped(rt22_attacker(&w, &["leave", &port.to_string()]))
        .wait_output(T)
        .expect("attacker");
    eprintln!("attacker: {out}");
    let vout = client.wait_output(T).expect("victim client");
    eprintln!("victim: {vout}");
    let _ = server.0.kill();
    assert_eq!(
        (kv(&out, "ok"), kv(&out, "refused")),
        (0, 8),
        "the daemon took another uid's sockets out of the SOCKHASH: {out}"
    );
    assert!(kv(&vout, "rounds") > 0, "{vout}");
    assert_eq!((kv(&vout, "bad"), kv(&vout, "errors")), (0, 0), "{vout}");
    let s = w.stats_sum();
    assert_eq!(s.get("smcd_client"), 4, "{}", brief(&s));
}

/// A sweep quarantines only connections whose own listener withdrew. Uid `nobody` binds
/// `[::]:PORT` with `IPV6_V6ONLY` next to root's IPv4 listener of that port (a busy server: its
/// connections wait 20 ms in the backlog) and sweeps it in a loop: its wildcard key covered
/// root's queued connections, 51 of 100 were quarantined and fell back to TCP (red team rt22
/// `sweepv6`); now none.
#[test]
fn a_foreign_wildcard_sweep_quarantines_no_connection_of_another_listener() {
    let w = SmcWorld::new();
    let (mut server, port) = rt22_server(&w, 20);
    let before = counters();
    let attacker = spawn_piped(rt22_attacker(&w, &["sweepv6", &port.to_string(), "8"]));
    std::thread::sleep(Duration::from_millis(500));
    let vout = spawn_piped(rt22_victim(&w, &["burst", &port.to_string(), "60"]))
        .wait_output(T)
        .expect("victim burst");
    let out = attacker.wait_output(T).expect("attacker");
    let quarantined = delta(&before, &counters(), "quarantined");
    let _ = server.0.kill();
    eprintln!("attacker: {out}\nvictim: {vout}");
    assert!(kv(&out, "ok") > 0, "the attacker's sweeps were made: {out}");
    assert_eq!((kv(&vout, "ok"), kv(&vout, "bad")), (60, 0), "{vout}");
    assert_eq!(
        quarantined, 0,
        "another uid's sweep quarantined root's connections"
    );
    let s = w.stats_sum();
    assert_eq!(
        (integration_tests::fallbacks(&s), s.get("smcd_client")),
        (0, 60),
        "{}",
        brief(&s)
    );
}

/// Sweeps run off the daemon's async workers, one uid's at a time in the queue. Uid `nobody`
/// keeps 16 daemon connections asking for sweeps of a network namespace of its own that holds
/// 15 000 listeners. On the workers (two on two cores) root's round trips to the daemon waited
/// behind them: median 17 ms with 4 connections (red team rt22 `sweepns` with `PROBE=1`: 16.8
/// and 17.3 ms, at most 112 ms; 0.1 ms without); and off the workers but in one queue, root's
/// own sweep (before an exec) waited behind all of nobody's: median 89 ms (`PROBE=sweep`; 2 ms
/// alone). Now neither waits for more than one of nobody's sweeps.
#[test]
fn sweeps_of_another_uid_do_not_hold_the_daemon() {
    let w = SmcWorld::new();
    let mut a = rt22_attacker(&w, &["sweepflood", "16", "10"]);
    a.env("RT_NSLISTENERS", "15000");
    let attacker = spawn_piped(a);
    std::thread::sleep(Duration::from_secs(2));
    let root = |what: &str| {
        let mut p = std::process::Command::new("python3");
        p.arg("-c")
            .arg(RT22_ATTACK)
            .args([what, "3"])
            .env("SMC_CTL_SOCK", &w.sock)
            .env_remove("LD_PRELOAD");
        spawn_piped(p).wait_output(T).expect("root's probe")
    };
    let pout = root("probe");
    let sout = root("sweepone");
    let out = attacker.wait_output(T).expect("attacker");
    eprintln!("attacker: {out}\nroot: {pout}\nroot: {sout}");
    assert!(kv(&out, "n") > 0, "{out}");
    assert!(
        kv(&pout, "p50ms") < 5,
        "root's requests waited behind another uid's sweeps: {pout}"
    );
    assert!(
        kv(&sout, "p50ms") < 40,
        "root's sweep waited behind all of another uid's: {sout}"
    );
}

/// A pinned map of the loaded programs (`/sys/fs/bpf/smc/maps/NAME`), opened by root.
fn pinned_map(name: &str) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd as _;
    let path =
        std::ffi::CString::new(format!("{}/maps/{name}", integration_tests::PIN_ROOT)).unwrap();
    let mut attr = [0u64; 16];
    attr[0] = path.as_ptr() as u64;
    // SAFETY: BPF_OBJ_GET (7) reads the path pointer and zeroed flags.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 7, attr.as_mut_ptr(), 128) };
    assert!(fd >= 0, "open the pinned {name}");
    // SAFETY: a new fd of ours.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }
}

/// Every key of a map whose keys are [`SockKey`]s (BPF_MAP_GET_NEXT_KEY).
fn sock_keys(map: &std::os::fd::OwnedFd) -> Vec<SockKey> {
    use std::os::fd::AsRawFd as _;
    let mut out = Vec::new();
    let mut prev: Option<SockKey> = None;
    loop {
        let mut next = SockKey::default();
        let mut attr = [0u64; 16];
        attr[0] = map.as_raw_fd() as u64;
        attr[1] = prev.as_ref().map_or(0, |k| k as *const SockKey as u64);
        attr[2] = &mut next as *mut SockKey as u64;
        // SAFETY: BPF_MAP_GET_NEXT_KEY (4): key and next key buffers of the map's key size.
        if unsafe { libc::syscall(libc::SYS_bpf, 4, attr.as_mut_ptr(), 128) } != 0 {
            return out;
        }
        out.push(next);
        prev = Some(next);
    }
}

/// The `SMC_PEERS` entry of `key`.
fn peer_entry(map: &std::os::fd::OwnedFd, key: &SockKey) -> Option<PeerEntry> {
    use std::os::fd::AsRawFd as _;
    let mut v = PeerEntry::default();
    let mut attr = [0u64; 16];
    attr[0] = map.as_raw_fd() as u64;
    attr[1] = key as *const SockKey as u64;
    attr[2] = &mut v as *mut PeerEntry as u64;
    // SAFETY: BPF_MAP_LOOKUP_ELEM (1): key and value buffers of the map's sizes.
    (unsafe { libc::syscall(libc::SYS_bpf, 1, attr.as_mut_ptr(), 128) } == 0).then_some(v)
}

/// The eBPF key of 127.0.0.1:`local` → 127.0.0.1:`remote` in namespace `netns`.
fn loopback_key(local: u16, remote: u16, netns: u64) -> SockKey {
    let lo = |port| std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    SockKey::new(lo(local), lo(remote), netns)
}

/// Another tenant cannot take over root's SOCKHASH and `SMC_PEERS` entries. Uid `nobody`, a
/// process of the *attached* cgroup, reads root's four SMC-D connections' 4-tuples in
/// `/proc/net/tcp` and rebuilds them, opted in to SMC, in a user and network namespace of its
/// own (red team rt22 `hijack`). Keyed by the 4-tuple alone, its sockets replaced root's 8 in
/// the SOCKHASH and `SMC_PEERS`: root's doorbells left the shortcut (each client socket sent
/// 0 more messages through it in 200 rounds) and `SMC_PEERS` named the attacker's 8 cookies.
/// Keyed by network namespace too, the attacker's 8 entries sit next to root's: root's
/// sockets stay (their doorbells keep the shortcut), `SMC_PEERS` keeps root's cookies, and
/// nothing reaches the attacker.
#[test]
fn another_tenant_cannot_hijack_sockhash_entries_with_rebuilt_tuples() {
    let w = SmcWorld::new();
    let (mut server, port) = rt22_server(&w, 0);
    let mut c = rt22_victim(&w, &["client", &port.to_string(), "60", "4"]);
    c.env("RT_GO", "1")
        .env("RT_ROUNDS", "200")
        .stdin(Stdio::piped());
    let mut client = spawn_piped(c);
    // (client port, client cookie)
    let tuples: Vec<(u16, u64)> = rt22_tuples(&mut client)
        .iter()
        .map(|t| {
            let f: Vec<u64> = t.split_whitespace().map(|v| v.parse().unwrap()).collect();
            (f[0] as u16, f[2])
        })
        .collect();
    assert_eq!(tuples.len(), 4);
    let ns = smc_common::bpf::own_netns_cookie().expect("SO_NETNS_COOKIE");
    let peers = pinned_map(smc_common::bpf::MAP_PEERS);
    let sockhash = pinned_map(smc_common::bpf::MAP_SOCKHASH);
    // Root's 8 sockets: each client end and each server end.
    let keys: Vec<SockKey> = tuples
        .iter()
        .flat_map(|&(cport, _)| [loopback_key(cport, port, ns), loopback_key(port, cport, ns)])
        .collect();
    let cookies = |m: &std::os::fd::OwnedFd| -> Vec<Option<u64>> {
        keys.iter()
            .map(|k| peer_entry(m, k).map(|e| e.cookie))
            .collect()
    };
    let before = cookies(&peers);
    for (i, &(_, cookie)) in tuples.iter().enumerate() {
        assert_eq!(
            before[2 * i],
            Some(cookie),
            "SMC_PEERS names root's client socket"
        );
    }
    assert!(before.iter().all(Option::is_some), "{before:?}");

    // The attacker: uid nobody, in the attached cgroup, without the library.
    let mut a = w.cgroup().command("python3");
    a.arg("-c")
        .arg(RT22_ATTACK)
        .args(["hijack", &port.to_string(), "0"])
        .env("SMC_CTL_SOCK", &w.sock)
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped());
    as_user(&mut a, nobody());
    let mut attacker = spawn_piped(a);
    let mut built = 0;
    for _ in 0..4 {
        let line = attacker.read_line();
        if let Some(n) = line.strip_prefix("BUILT ") {
            built = n.trim().parse().unwrap();
            break;
        }
        assert!(!line.is_empty(), "the attacker ended early");
    }
    assert_eq!(built, 8, "the attacker rebuilt root's 8 sockets");

    // The attacker's sockets are in both maps under root's 4-tuples, in its own namespace.
    let bare: std::collections::HashSet<SockKey> = keys.iter().map(|k| k.in_netns(0)).collect();
    let foreign = |all: Vec<SockKey>| {
        all.iter()
            .filter(|k| k.netns != ns && bare.contains(&k.in_netns(0)))
            .count()
    };
    let foreign_peers = foreign(sock_keys(&peers));
    let hashed = sock_keys(&sockhash);
    let foreign_hashed = foreign(hashed.clone());
    let root_hashed = keys.iter().filter(|k| hashed.contains(k)).count();
    let after = cookies(&peers);

    // Root's connections go on: their doorbells still through the shortcut.
    client.0.stdin.take().unwrap().write_all(b"GO\n").unwrap();
    let vout = client.wait_output(T).expect("victim client");
    attacker.0.stdin.take().unwrap().write_all(b"\n").unwrap();
    let out = attacker.wait_output(T).expect("attacker");
    let _ = server.0.kill();
    eprintln!(
        "attacker: {out}\nvictim: {vout}\nforeign entries: SMC_PEERS {foreign_peers} \
         SOCKHASH {foreign_hashed}; root's keys in the SOCKHASH: {root_hashed}\n\
         cookies before {before:?}\n        after {after:?}"
    );
    let redirected: Vec<(u64, u64)> = vout
        .lines()
        .filter_map(|l| l.strip_prefix("REDIRECTED "))
        .map(|l| {
            let f: Vec<u64> = l.split_whitespace().map(|v| v.parse().unwrap()).collect();
            (f[1], f[2])
        })
        .collect();
    assert_eq!(redirected.len(), 4, "{vout}");
    assert!(
        redirected.iter().all(|&(b, a)| a > b),
        "root's doorbells left the shortcut (messages through it before and after 200 \
         rounds, per client socket): {redirected:?}"
    );
    assert_eq!(after, before, "SMC_PEERS keeps root's cookies");
    assert_eq!(root_hashed, 8, "root's 8 sockets stay in the SOCKHASH");
    assert_eq!(
        (foreign_peers, foreign_hashed),
        (8, 8),
        "the attacker's sockets were recorded, in their own namespace"
    );
    assert_eq!(kv(&out, "stolen"), 0, "{out}");
    assert_eq!((kv(&vout, "bad"), kv(&vout, "errors")), (0, 0), "{vout}");
    assert_eq!(kv(&vout, "rounds"), 800, "{vout}");
    let s = w.stats_sum();
    assert_eq!(s.get("smcd_client"), 4, "{}", brief(&s));
}

/// The probes of [`a_third_namespace_cannot_hijack_a_pair_between_two_namespaces`]: a victim
/// echo pair over veth (`server ADDR`, `client ADDR PORT ROUNDS`), and the attacker (`attack
/// ADDR_A ADDR_B CPORT SPORT`), who rebuilds the pair's 4-tuple in a user and network namespace
/// of its own (both addresses on its `lo`).
const XNS_PROBE: &str = r#"
import ctypes, os, select, socket, subprocess, sys
SOL_SMC_BPF, SMC_SO_STATE = 0x534D4300, 3
def redirected(s):
    return int.from_bytes(s.getsockopt(SOL_SMC_BPF, SMC_SO_STATE, 48)[16:24], "little")
def exact(s, n):
    b = b""
    while len(b) < n:
        x = s.recv(n - len(b))
        if not x:
            raise OSError("eof")
        b += x
    return b
m = sys.argv[1]
if m == "server":
    ls = socket.socket(); ls.bind((sys.argv[2], 0)); ls.listen(8)
    print("LISTENING %d" % ls.getsockname()[1], flush=True)
    c, _ = ls.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b)
elif m == "client":
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])))
    print("TUPLE %d" % s.getsockname()[1], flush=True)
    sys.stdin.readline()
    before, bad = redirected(s), 0
    for i in range(int(sys.argv[4])):
        msg = bytes((i + k) & 0xFF for k in range(1000))
        s.sendall(msg)
        bad += exact(s, len(msg)) != msg
    print("REDIRECTED before=%d after=%d bad=%d" % (before, redirected(s), bad), flush=True)
elif m == "attack":
    a, b, cport, sport = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
    open("/proc/self/setgroups", "w").write("deny")
    open("/proc/self/uid_map", "w").write("0 %d 1" % uid)
    open("/proc/self/gid_map", "w").write("0 %d 1" % gid)
    for cmd in (["link", "set", "lo", "up"], ["addr", "add", a + "/32", "dev", "lo"],
                ["addr", "add", b + "/32", "dev", "lo"]):
        subprocess.run(["ip"] + cmd, check=True)
    ls = socket.socket(); ls.bind((b, sport)); ls.listen(1)
    c = socket.socket(); c.bind((a, cport)); c.connect((b, sport))
    acc, _ = ls.accept()
    print("BUILT 2", flush=True)
    stolen = 0
    for s in (c, acc):
        s.setblocking(False)
    while not select.select([sys.stdin], [], [], 0.01)[0]:
        for s in (c, acc):
            try:
                stolen += len(s.recv(65536))
            except BlockingIOError:
                pass
    print("HIJACK stolen=%d" % stolen, flush=True)
"#;

/// A connection between two network namespaces (containers over veth, `shortcut` mode) keeps
/// its shortcut when uid `nobody`, a process of the same attached cgroup, rebuilds its 4-tuple
/// (both addresses on the `lo` of a user and network namespace of its own). Its peer is the
/// socket the kernel paired by 4-tuple and both first sequence numbers (`SMC_PAIRS`), which
/// the attacker's sockets do not have: they pair with each other in their own namespace. With
/// keys of the 4-tuple alone, the attacker's sockets replaced both ends in the SOCKHASH: 0 of
/// 200 messages of the client took the shortcut after the attack.
#[test]
fn a_third_namespace_cannot_hijack_a_pair_between_two_namespaces() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    let _a = Attached::new(&cg, "shortcut");
    let ns = integration_tests::NetnsPair::new().expect("netns pair");
    let py = std::path::Path::new("python3");
    let mut s = integration_tests::NetnsPair::command(&ns.b, Some(&cg), py);
    s.args(["-c", XNS_PROBE, "server", &ns.addr_b]);
    let (mut server, sport) = spawn_port(s, "LISTENING ");
    let mut c = integration_tests::NetnsPair::command(&ns.a, Some(&cg), py);
    c.args(["-c", XNS_PROBE, "client", &ns.addr_b])
        .args([sport.to_string(), "200".into()])
        .stdin(Stdio::piped());
    let (mut client, cport) = spawn_port(c, "TUPLE ");

    let mut a = cg.command("python3");
    a.args(["-c", XNS_PROBE, "attack", &ns.addr_a, &ns.addr_b])
        .args([cport.to_string(), sport.to_string()])
        .env_remove("LD_PRELOAD")
        .stdin(Stdio::piped());
    as_user(&mut a, nobody());
    let mut attacker = spawn_piped(a);
    let line = attacker.read_line();
    assert_eq!(
        line.trim(),
        "BUILT 2",
        "the attacker rebuilt the pair's tuple"
    );

    client.0.stdin.take().unwrap().write_all(b"GO\n").unwrap();
    let vout = client.wait_output(T).expect("victim client");
    attacker.0.stdin.take().unwrap().write_all(b"\n").unwrap();
    let out = attacker.wait_output(T).expect("attacker");
    let _ = server.0.kill();
    eprintln!("attacker: {out}\nvictim: {vout}");
    let (before, after) = (kv(&vout, "before"), kv(&vout, "after"));
    assert!(
        after >= before + 200,
        "the client's messages left the shortcut after the attack: {vout}"
    );
    assert_eq!(kv(&vout, "bad"), 0, "{vout}");
    assert_eq!(kv(&out, "stolen"), 0, "{out}");
}

/// `/sys/fs/bpf` is mode 1777 (bpffs's default): while nothing is loaded, uid nobody may make
/// the pin root itself. One directory shaped as an attached cgroup's link pin
/// (`links/<inode of an existing cgroup>-shortcut-…`), or one where a map pin goes, made every
/// `smc-ctl attach` of root fail (red team rt24 `rt24_bpffs.sh`: "holds programs loaded by
/// another build", "unpin …/maps/x: Is a directory", rc 1 each), for as long as root did not
/// remove it by hand. Now a pin root another uid made is removed and the attach loads.
#[test]
fn another_uid_cannot_squat_the_pin_root_while_nothing_is_loaded() {
    require_root();
    let _l = lock();
    let root = std::path::Path::new(integration_tests::PIN_ROOT);
    if root.exists() {
        // Another cgroup of this host is attached outside the tests: nothing to squat.
        eprintln!("{} exists (attached elsewhere): not tried", root.display());
        return;
    }
    let cg_root = integration_tests::cgroup2_root();
    let ino = {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(&cg_root).unwrap().ino()
    };
    for squat in [
        format!("links/{ino}-shortcut-squat"),
        "maps/x".to_string(),
        String::new(),
    ] {
        let target = if squat.is_empty() {
            "/sys/fs/bpf/rt24-nobody".to_string()
        } else {
            root.join(&squat).display().to_string()
        };
        let mut c = std::process::Command::new("mkdir");
        c.args(["-p", &target]);
        as_user(&mut c, nobody());
        assert!(c.status().unwrap().success(), "nobody's mkdir {target}");
        if squat.is_empty() {
            // A symlink to a tree of nobody's.
            let mut c = std::process::Command::new("ln");
            c.args(["-s", &target, root.to_str().unwrap()]);
            as_user(&mut c, nobody());
            assert!(c.status().unwrap().success(), "nobody's symlink");
        }
        let cg = test_cgroup();
        let path = cg.path.to_str().unwrap().to_string();
        let out = integration_tests::smc_ctl(&["attach", "--cgroup", &path, "--mode", "ism"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let owner = {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::symlink_metadata(root).map(|m| (m.uid(), m.is_dir()))
        };
        let detached = integration_tests::smc_ctl(&["detach", "--cgroup", &path]);
        // Leave nothing of nobody's behind, whatever happened.
        let _ = std::fs::remove_dir_all("/sys/fs/bpf/rt24-nobody");
        if std::fs::symlink_metadata(root).is_ok_and(|m| !m.is_dir() || m.len() == 0) {
            let _ = std::fs::remove_file(root);
        }
        if !detached.status.success() {
            let _ = std::fs::remove_dir_all(root);
        }
        assert!(
            out.status.success(),
            "squat {squat:?}: root's attach failed: {err}"
        );
        assert_eq!(
            owner.ok(),
            Some((0, true)),
            "squat {squat:?}: the pin root after the attach"
        );
        assert!(err.contains("not by us: removed"), "squat {squat:?}: {err}");
        assert!(detached.status.success(), "detach: {:?}", detached);
    }
}
