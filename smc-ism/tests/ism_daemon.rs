//! Real daemon, real memfds, real processes: the loopback-ism device end to end.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use smc_common::clc::LOOPBACK_CHID;
use smc_ism::proto::{self, Header, Status};
use smc_ism::{Client, DeclineReason, Gid, IsmError};

const CHILD_ENTRY: &str = "child_entry";

/// Entry point of the child processes the tests spawn (re-executing this binary).
#[test]
#[ignore = "child process entry point, spawned by other tests"]
fn child_entry() {
    let Ok(role) = std::env::var("ISM_CHILD_ROLE") else {
        return;
    };
    let port: u16 = std::env::var("ISM_PORT").unwrap().parse().unwrap();
    match role.as_str() {
        "exchange" => child_exchange(port),
        "hold" => child_hold(port),
        "cgroup" => child_cgroup(port),
        other => panic!("unknown role {other}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Two processes exchange data through attached DMBs, SMC-D style: each registers its own DMB
// (its receive buffer), sends the token over the TCP connection, attaches the peer's DMB and
// writes into it.

const MSG_LEN: usize = 12_000;

fn pattern(seed: u8) -> Vec<u8> {
    (0..MSG_LEN)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn child_exchange(port: u16) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut ism = Client::connect_default().unwrap();
    let own = ism.register_dmb(0, tcp.as_raw_fd()).unwrap();
    let own_map = own.map().unwrap();
    assert!(
        read_bytes(&own_map, 0, own.size).iter().all(|&b| b == 0),
        "DMB not zeroed"
    );
    send_u64(&mut tcp, own.token);
    let peer_token = recv_u64(&mut tcp);
    let peer = ism.attach_dmb(peer_token, tcp.as_raw_fd()).unwrap();
    let peer_map = peer.map().unwrap();

    // Receive the parent's message in our DMB.
    let len = wait_word(&own_map, 0) as usize;
    assert_eq!(len, MSG_LEN);
    let got = read_bytes(&own_map, 32, len);
    assert_eq!(got, pattern(7), "child read wrong bytes");
    // Answer in the parent's DMB: the bytes + 1.
    let answer: Vec<u8> = got.iter().map(|b| b.wrapping_add(1)).collect();
    write_bytes(&peer_map, 32, &answer);
    word(&peer_map, 0).store(len as u64, Ordering::Release);

    // Wait for the parent to be done reading, then release.
    let mut b = [0u8; 1];
    tcp.read_exact(&mut b).unwrap();
    drop(peer_map);
    ism.detach_dmb(peer.token).unwrap();
    drop(own_map);
    ism.unregister_dmb(own.token).unwrap();
    tcp.write_all(b"D").unwrap();
}

#[test]
fn two_processes_exchange_data_through_dmbs() {
    let dir = TestDir::new("exchange");
    let d = start(&dir, |_| {});
    let mut ism = client(&dir);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let child = spawn_child(
        CHILD_ENTRY,
        "exchange",
        d.socket_path(),
        &[("ISM_PORT", port.to_string())],
    )
    .spawn()
    .unwrap();
    let (mut tcp, _) = l.accept().unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();

    let child_token = recv_u64(&mut tcp);
    let own = ism.register_dmb(1, tcp.as_raw_fd()).unwrap();
    assert_eq!((own.size, own.size_code, own.idx), (32 * 1024, 1, 0));
    let own_map = own.map().unwrap();
    send_u64(&mut tcp, own.token);
    let peer = ism.attach_dmb(child_token, tcp.as_raw_fd()).unwrap();
    assert_eq!(peer.token, child_token);
    assert_eq!(peer.size, 16 * 1024);
    let peer_map = peer.map().unwrap();

    // The child attaches ours once it has read our token.
    let st = ism.wait_for(WAIT, |s| s.live_attachments == 2).unwrap();
    assert_eq!(st.live_dmbs, 2);
    assert_eq!(st.live_bytes, 48 * 1024);

    write_bytes(&peer_map, 32, &pattern(7));
    word(&peer_map, 0).store(MSG_LEN as u64, Ordering::Release);
    let len = wait_word(&own_map, 0) as usize;
    let expect: Vec<u8> = pattern(7).iter().map(|b| b.wrapping_add(1)).collect();
    assert_eq!(read_bytes(&own_map, 32, len), expect);

    tcp.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    tcp.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"D");
    assert!(wait_child(child).success());

    // The child released its references; ours keep both DMBs alive.
    let st = ism
        .wait_for(WAIT, |s| {
            s.clients_connected == 1 && s.live_attachments == 1
        })
        .unwrap();
    assert_eq!(st.live_dmbs, 2);
    drop(peer_map);
    ism.detach_dmb(child_token).unwrap();
    ism.unregister_dmb(own.token).unwrap();
    let st = wait_idle(&mut ism, 1);
    assert_eq!(st.ops.register.ok, 2);
    assert_eq!(st.ops.attach.ok, 2);
    assert_eq!(st.released_on_disconnect, 0);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// 64 threads × 1000 register/attach/detach/unregister cycles: never a duplicate token or slot
// among live DMBs, and every count back to zero.

struct XorShift(u64);
impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn concurrent_clients_never_share_a_token_or_slot() {
    const THREADS: usize = 64;
    let iters: usize = std::env::var("ISM_STRESS_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = TestDir::new("stress");
    let d = start(&dir, |_| {});
    let live_tokens = Arc::new(Mutex::new(HashSet::<u64>::new()));
    let live_slots = Arc::new(Mutex::new(HashSet::<u32>::new()));
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (live_tokens, live_slots, sock) = (&live_tokens, &live_slots, d.socket_path());
            s.spawn(move || {
                let mut owner = Client::connect(sock).unwrap();
                let mut peer = Client::connect(sock).unwrap();
                let (a, b) = tcp_pair();
                let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678));
                let mut window = std::collections::VecDeque::new();
                let release =
                    |owner: &mut Client, peer: &mut Client, tok: u64, slot: u32, r: u64| {
                        // Forget it before the last release: from then on the daemon may reuse it.
                        if r & 1 == 0 {
                            peer.detach_dmb(tok).unwrap();
                            assert!(live_tokens.lock().unwrap().remove(&tok));
                            assert!(live_slots.lock().unwrap().remove(&slot));
                            owner.unregister_dmb(tok).unwrap();
                        } else {
                            owner.unregister_dmb(tok).unwrap();
                            assert!(live_tokens.lock().unwrap().remove(&tok));
                            assert!(live_slots.lock().unwrap().remove(&slot));
                            peer.detach_dmb(tok).unwrap();
                        }
                    };
                for _ in 0..iters {
                    let code = (rng.next() % 3) as u8;
                    let reg = owner.register_dmb(code, a.as_raw_fd()).unwrap();
                    assert!(
                        live_tokens.lock().unwrap().insert(reg.token),
                        "duplicate live token"
                    );
                    assert!(
                        live_slots.lock().unwrap().insert(reg.slot),
                        "duplicate live slot"
                    );
                    let att = peer.attach_dmb(reg.token, b.as_raw_fd()).unwrap();
                    assert_eq!(
                        (att.token, att.slot, att.size),
                        (reg.token, reg.slot, reg.size)
                    );
                    window.push_back((reg.token, reg.slot));
                    if window.len() > (rng.next() % 4) as usize {
                        let (tok, slot) = window.pop_front().unwrap();
                        release(&mut owner, &mut peer, tok, slot, rng.next());
                    }
                }
                while let Some((tok, slot)) = window.pop_front() {
                    release(&mut owner, &mut peer, tok, slot, rng.next());
                }
            });
        }
    });
    let elapsed = t0.elapsed();
    let mut c = client(&dir);
    let st = wait_idle(&mut c, 1);
    let n = (THREADS * iters) as u64;
    assert_eq!(st.ops.register.ok, n);
    assert_eq!(st.ops.attach.ok, n);
    assert_eq!(st.ops.detach.ok, n);
    assert_eq!(st.ops.unregister.ok, n);
    assert_eq!(st.failures, Default::default());
    assert!(st.cgroups.is_empty(), "{:?}", st.cgroups);
    assert!(live_tokens.lock().unwrap().is_empty());
    eprintln!("{} cycles ({} round trips) in {:.2?}", n, 4 * n, elapsed);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// A client SIGKILLed while holding DMBs leaks nothing; the memory lives on in the peer.

fn child_hold(port: u16) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut ism = Client::connect_default().unwrap();
    let mut keep = Vec::new();
    for i in 0..8u8 {
        let (a, b) = tcp_pair();
        let dmb = ism.register_dmb(i % 4, a.as_raw_fd()).unwrap();
        let m = dmb.map().unwrap();
        word(&m, 8).store(1, Ordering::Relaxed);
        if i % 2 == 0 {
            let att = ism.attach_dmb(dmb.token, b.as_raw_fd()).unwrap();
            keep.push(att.map().unwrap());
        }
        keep.push(m);
        keep.push(dmb.map().unwrap());
        drop((a, b));
    }
    // A ninth DMB shared with the parent over our connection to it.
    let shared = ism.register_dmb(0, tcp.as_raw_fd()).unwrap();
    let m = shared.map().unwrap();
    write_bytes(&m, 64, b"written by the child before it died");
    word(&m, 0).store(1, Ordering::Release);
    send_u64(&mut tcp, shared.token);
    // Block until killed.
    let mut b = [0u8; 1];
    let _ = tcp.read(&mut b);
    std::process::exit(3);
}

#[test]
fn sigkilled_client_leaks_nothing() {
    let dir = TestDir::new("sigkill");
    let d = start(&dir, |_| {});
    let mut ism = client(&dir);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut child = spawn_child(
        CHILD_ENTRY,
        "hold",
        d.socket_path(),
        &[("ISM_PORT", port.to_string())],
    )
    .spawn()
    .unwrap();
    let (mut tcp, _) = l.accept().unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let token = recv_u64(&mut tcp);
    let att = ism.attach_dmb(token, tcp.as_raw_fd()).unwrap();
    let m = att.map().unwrap();
    assert_eq!(wait_word(&m, 0), 1);

    let st = ism.stats().unwrap();
    assert_eq!(st.live_dmbs, 9);
    assert_eq!(st.live_attachments, 5);
    assert_eq!(st.clients_connected, 2);

    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());

    // Everything the child held is released; our attachment keeps the shared DMB alive.
    let st = ism
        .wait_for(WAIT, |s| s.clients_connected == 1 && s.live_dmbs == 1)
        .unwrap();
    assert_eq!(st.live_attachments, 1);
    assert_eq!(st.live_bytes, 16 * 1024);
    assert_eq!(st.released_on_disconnect, 8 + 4 + 1);
    assert_eq!(
        read_bytes(&m, 64, 35),
        b"written by the child before it died"
    );
    drop(m);
    ism.detach_dmb(token).unwrap();
    let st = wait_idle(&mut ism, 1);
    assert!(st.cgroups.is_empty());
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Attach refused without the mirror proof, with a stale token, after unregister; releases
// only of references held.

fn assert_err(r: Result<impl std::fmt::Debug, IsmError>, want: fn(&IsmError) -> bool, what: &str) {
    match r {
        Err(e) if want(&e) => {}
        other => panic!("{what}: unexpected {other:?}"),
    }
}

#[test]
fn attach_needs_the_mirror_socket() {
    let dir = TestDir::new("proof");
    let d = start(&dir, |_| {});
    let mut owner = client(&dir);
    let mut other = client(&dir);
    let (a1, b1) = tcp_pair();
    let (a2, b2) = tcp_pair();
    let dmb = owner.register_dmb(0, a1.as_raw_fd()).unwrap();
    let tok = dmb.token;

    let bad_proof = |e: &IsmError| matches!(e, IsmError::BadProof);
    let bad_socket = |e: &IsmError| matches!(e, IsmError::BadSocket);
    let stale = |e: &IsmError| matches!(e, IsmError::StaleToken);
    let not_held = |e: &IsmError| matches!(e, IsmError::NotHeld);
    assert_err(
        other.attach_dmb(tok, b2.as_raw_fd()),
        bad_proof,
        "other connection",
    );
    assert_err(
        other.attach_dmb(tok, a2.as_raw_fd()),
        bad_proof,
        "other connection (a)",
    );
    assert_err(
        other.attach_dmb(tok, a1.as_raw_fd()),
        bad_proof,
        "owner's own socket",
    );
    assert_err(
        owner.attach_dmb(tok, a1.as_raw_fd()),
        bad_proof,
        "owner's socket, owner",
    );

    let file = std::fs::File::open("/proc/self/stat").unwrap();
    assert_err(
        other.attach_dmb(tok, file.as_raw_fd()),
        bad_socket,
        "a file",
    );
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    assert_err(
        other.attach_dmb(tok, l.as_raw_fd()),
        bad_socket,
        "a listener",
    );
    let u = UdpSocket::bind("127.0.0.1:0").unwrap();
    u.connect(l.local_addr().unwrap()).unwrap();
    assert_err(other.attach_dmb(tok, u.as_raw_fd()), bad_socket, "UDP");
    let (ux, _uy) = UnixStream::pair().unwrap();
    assert_err(
        other.attach_dmb(tok, ux.as_raw_fd()),
        bad_socket,
        "unix socket",
    );
    assert_err(
        other.attach_dmb(tok, -1),
        |e| matches!(e, IsmError::NotSent(_)) && !e.is_unavailable(),
        "fd -1",
    );
    // The connection survived the local failure.
    other.query_gid().unwrap();

    assert_err(
        other.attach_dmb(tok ^ 1, b1.as_raw_fd()),
        stale,
        "wrong token",
    );
    assert_err(other.attach_dmb(0, b1.as_raw_fd()), stale, "token 0");

    // The real peer may attach.
    let att = other.attach_dmb(tok, b1.as_raw_fd()).unwrap();
    assert_eq!(att.slot, dmb.slot);

    // Only references held can be released.
    assert_err(
        other.unregister_dmb(tok),
        not_held,
        "unregister by the attacher",
    );
    assert_err(owner.detach_dmb(tok), not_held, "detach by the owner");
    let mut third = client(&dir);
    assert_err(third.detach_dmb(tok), not_held, "detach by a stranger");
    assert_err(
        third.unregister_dmb(tok),
        not_held,
        "unregister by a stranger",
    );

    // After unregister no new attach, even by the real peer; memory lives until detach.
    owner.unregister_dmb(tok).unwrap();
    assert_err(owner.unregister_dmb(tok), not_held, "double unregister");
    assert_err(
        other.attach_dmb(tok, b1.as_raw_fd()),
        stale,
        "after unregister",
    );
    let st = owner.stats().unwrap();
    assert_eq!((st.live_dmbs, st.live_attachments), (1, 1));
    other.detach_dmb(tok).unwrap();
    assert_err(other.detach_dmb(tok), not_held, "double detach");
    assert_err(other.attach_dmb(tok, b1.as_raw_fd()), stale, "after free");

    // A socket whose peer has closed is not ESTABLISHED.
    let (a3, b3) = tcp_pair();
    drop(b3);
    let mut a3r = &a3;
    let mut buf = [0u8; 1];
    assert_eq!(a3r.read(&mut buf).unwrap(), 0); // FIN received: CLOSE_WAIT
    assert_err(
        owner.register_dmb(0, a3.as_raw_fd()),
        bad_socket,
        "CLOSE_WAIT socket",
    );
    assert_err(
        owner.register_dmb(11, a1.as_raw_fd()),
        |e| matches!(e, IsmError::BadSize),
        "size 11",
    );

    let st = wait_idle(&mut owner, 3);
    assert_eq!(st.failures.bad_proof, 4);
    assert_eq!(st.failures.bad_socket, 5);
    assert_eq!(st.failures.stale_token, 4);
    assert_eq!(st.failures.not_held, 6);
    assert_eq!(st.failures.bad_size, 1);
    assert_eq!(st.ops.attach.ok, 1);
    assert_eq!(IsmError::BadProof.decline_reason(), DeclineReason::Other);
    d.shutdown().unwrap();
}

#[test]
fn daemon_never_keeps_the_tcp_socket() {
    let dir = TestDir::new("fin");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    let (a, mut b) = tcp_pair();
    let dmb = c.register_dmb(0, a.as_raw_fd()).unwrap();
    // Our copy was the last one besides the daemon's: the FIN must go out right away.
    drop(a);
    let mut buf = [0u8; 1];
    let t = Instant::now();
    assert_eq!(b.read(&mut buf).unwrap(), 0);
    assert!(t.elapsed() < WAIT);
    // And the proof fd of an attach, too.
    let (a, b) = tcp_pair();
    let dmb2 = c.register_dmb(0, a.as_raw_fd()).unwrap();
    let _att = c.attach_dmb(dmb2.token, b.as_raw_fd()).unwrap();
    drop(b);
    let mut a = a;
    assert_eq!(a.read(&mut buf).unwrap(), 0);
    c.unregister_dmb(dmb.token).unwrap();
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Quotas and limits fail fast with the right reason.

#[test]
fn quotas_and_limits_refuse_with_the_right_reason() {
    if !root_or_skip("quotas_and_limits_refuse_with_the_right_reason") {
        return;
    }
    let (a, _b) = tcp_pair();
    let fd = a.as_raw_fd();

    // Cgroup DMB count.
    let dir = TestDir::new("quota");
    let d = start(&dir, |c| c.cgroup_max_dmbs = 3);
    let mut c = client(&dir);
    let held: Vec<_> = (0..3).map(|_| c.register_dmb(0, fd).unwrap()).collect();
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(matches!(e, IsmError::QuotaDmbs), "{e:?}");
    assert_eq!(e.decline_reason(), DeclineReason::MaxDmb);
    assert_eq!(e.decline_reason().diagnosis(), 0x030d_0000);
    c.unregister_dmb(held[0].token).unwrap();
    let again = c.register_dmb(0, fd).unwrap();
    let st = c.stats().unwrap();
    assert_eq!(st.failures.quota_dmbs, 1);
    assert_eq!(st.live_dmbs, 3);
    assert_eq!(st.cgroups.len(), 1);
    assert_eq!((st.cgroups[0].dmbs, st.cgroups[0].refused), (3, 1));
    drop((held, again));
    drop(c);
    d.shutdown().unwrap();

    // Cgroup bytes: a DMB is charged 16 KiB (its first pages) when registered.
    let dir = TestDir::new("quota-bytes");
    let d = start(&dir, |c| c.cgroup_max_bytes = 16 * 1024);
    let mut c = client(&dir);
    let _big = c.register_dmb(2, fd).unwrap();
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(matches!(e, IsmError::QuotaBytes), "{e:?}");
    assert_eq!(e.decline_reason(), DeclineReason::Mem);
    assert_eq!(e.decline_reason().diagnosis(), 0x0101_0000);
    assert_eq!(c.stats().unwrap().live_bytes, 64 * 1024);
    drop(c);
    d.shutdown().unwrap();

    // Device slots.
    let dir = TestDir::new("slots");
    let d = start(&dir, |c| c.max_dmbs = 2);
    let mut c = client(&dir);
    let x = c.register_dmb(0, fd).unwrap();
    let y = c.register_dmb(0, fd).unwrap();
    assert_ne!(x.slot, y.slot);
    assert!(x.slot < 2 && y.slot < 2);
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(matches!(e, IsmError::MaxDmb), "{e:?}");
    assert_eq!(e.decline_reason(), DeclineReason::MaxDmb);
    // A failed registration leaks no quota.
    let st = c.stats().unwrap();
    assert_eq!((st.live_dmbs, st.live_bytes), (2, 32 * 1024));
    assert_eq!(st.failures.max_dmb, 1);
    c.unregister_dmb(x.token).unwrap();
    let z = c.register_dmb(0, fd).unwrap();
    assert_eq!(z.slot, x.slot, "the freed slot is reused");
    drop(c);
    d.shutdown().unwrap();

    // Device bytes, and memory pressure.
    let dir = TestDir::new("total");
    let d = start(&dir, |c| c.max_total_bytes = 16 * 1024);
    let mut c = client(&dir);
    let _x = c.register_dmb(1, fd).unwrap();
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(matches!(e, IsmError::Mem { errno: 0 }), "{e:?}");
    drop(c);
    d.shutdown().unwrap();

    let dir = TestDir::new("pressure");
    let d = start(&dir, |c| c.min_available_bytes = u64::MAX / 2);
    let mut c = client(&dir);
    let t = Instant::now();
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(1), "must fail fast");
    assert!(matches!(e, IsmError::Mem { .. }), "{e:?}");
    let st = c.stats().unwrap();
    assert_eq!(st.failures.mem_pressure, 1);
    assert_eq!((st.live_dmbs, st.live_bytes), (0, 0));
    d.shutdown().unwrap();
}

/// The byte quotas count committed memory (touched pages of the memfds), not nominal sizes:
/// large DMBs fit while unused, a DMB whose pages were written counts them, and pages given
/// back (hole punching, as the data path does for drained rings) stop counting.
#[test]
fn byte_quotas_count_committed_memory() {
    let (a, _b) = tcp_pair();
    let fd = a.as_raw_fd();
    let dir = TestDir::new("quota-committed");
    let d = start(&dir, |c| {
        c.cgroup_max_bytes = 512 * 1024;
        c.commit_sample_ms = 0;
    });
    let mut c = client(&dir);
    assert_eq!(c.max_size_code().unwrap(), 10);
    // 8 MiB and 16 MiB nominal, far above the quota: charged 16 KiB each.
    let big = c.register_dmb(9, fd).unwrap();
    assert_eq!(big.size, 8 << 20);
    let _huge = c.register_dmb(10, fd).unwrap();
    let e = c.register_dmb(11, fd).unwrap_err();
    assert!(matches!(e, IsmError::BadSize), "{e:?}");
    // Write 1 MiB into the first one: that memory now counts.
    let m = big.map().unwrap();
    write_bytes(&m, 0, &vec![0x5a; 1 << 20]);
    let e = c.register_dmb(0, fd).unwrap_err();
    assert!(matches!(e, IsmError::QuotaBytes), "{e:?}");
    let st = c.stats().unwrap();
    assert!(st.committed_bytes >= 1 << 20, "{}", st.committed_bytes);
    assert_eq!(st.live_bytes, (8 << 20) + (16 << 20));
    assert_eq!(st.failures.quota_bytes, 1);
    // Give the pages back: registrations fit again.
    // SAFETY: punching a hole in a memfd we hold; nothing maps it but `m`, unused from here.
    let r = unsafe {
        libc::fallocate(
            big.fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            1 << 20,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let _small = c.register_dmb(0, fd).unwrap();
    assert!(c.stats().unwrap().committed_bytes < 64 * 1024);
    drop(m);
    drop(c);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Restart: the GID persists, live mappings are unaffected, clients fail fast while the daemon
// is down and reconnect afterwards.

#[test]
fn restart_keeps_gid_and_live_mappings() {
    let dir = TestDir::new("restart");
    let d = start(&dir, |_| {});
    let mut a = client(&dir);
    let mut b = client(&dir);
    let gid = a.query_gid().unwrap();
    assert_eq!(gid, d.gid());
    assert_ne!(gid, Gid::default());
    assert_eq!(LOOPBACK_CHID, 0xFFFF);
    let file = std::fs::read_to_string(dir.state().join("gid")).unwrap();
    assert_eq!(Gid::parse(&file), Some(gid));

    let (sa, sb) = tcp_pair();
    let own = a.register_dmb(0, sa.as_raw_fd()).unwrap();
    let att = b.attach_dmb(own.token, sb.as_raw_fd()).unwrap();
    let ma = own.map().unwrap();
    let mb = att.map().unwrap();
    word(&mb, 0).store(0x1111, Ordering::Release);
    assert_eq!(word(&ma, 0).load(Ordering::Acquire), 0x1111);

    d.shutdown().unwrap();
    assert!(!dir.sock().exists(), "socket removed on shutdown");

    // Down: connects fail fast, calls report the device as unavailable.
    let t = Instant::now();
    let e = Client::connect(&dir.sock()).unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    let e = a.query_gid().unwrap_err();
    assert!(e.is_unavailable(), "{e:?}");
    assert_eq!(e.decline_reason(), DeclineReason::NoDevice);
    assert!(t.elapsed() < Duration::from_secs(1));

    // The mapping still works both ways.
    word(&ma, 8).store(0x2222, Ordering::Release);
    assert_eq!(word(&mb, 8).load(Ordering::Acquire), 0x2222);

    let d2 = start(&dir, |_| {});
    assert_eq!(d2.gid(), gid, "GID stable across restarts");
    assert_eq!(a.query_gid().unwrap(), gid, "client reconnects by itself");
    assert_eq!(b.query_gid().unwrap(), gid);
    // The old references died with the old daemon: releasing them is a benign NotHeld.
    assert!(matches!(b.detach_dmb(own.token), Err(IsmError::NotHeld)));
    // New DMBs work.
    let (sc, sd) = tcp_pair();
    let n = a.register_dmb(0, sc.as_raw_fd()).unwrap();
    let _n2 = b.attach_dmb(n.token, sd.as_raw_fd()).unwrap();
    assert_eq!(word(&mb, 0).load(Ordering::Acquire), 0x1111);
    drop((ma, mb));
    a.unregister_dmb(n.token).unwrap();
    d2.shutdown().unwrap();

    // A second daemon on the same path is refused while one runs.
    let d3 = start(&dir, |_| {});
    let e = smc_ism::spawn(dir.config()).unwrap_err();
    assert!(matches!(e, IsmError::AlreadyRunning(_)), "{e:?}");
    assert_eq!(d3.gid(), gid);
    d3.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Malformed, oversized, wrong-version records get an error reply; the daemon keeps serving.

fn record(magic: u32, version: u16, op: u16, len: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; proto::HEADER_LEN];
    Header {
        magic,
        version,
        op,
        len,
        seq: 42,
    }
    .encode(&mut v);
    v.extend_from_slice(payload);
    v
}

#[test]
fn malformed_requests_get_errors_and_daemon_keeps_serving() {
    let dir = TestDir::new("malformed");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    let gid = c.query_gid().unwrap();
    let m = proto::MAGIC;
    let v = proto::VERSION;
    let (tcp, _peer) = tcp_pair();

    let cases: Vec<(Vec<u8>, Option<i32>, Status)> = vec![
        (
            record(0xdead_beef, v, proto::OP_QUERY_GID, 0, &[]),
            None,
            Status::Malformed,
        ),
        (
            record(m, 2, proto::OP_QUERY_GID, 0, &[]),
            None,
            Status::BadVersion,
        ),
        (record(m, v, 99, 0, &[]), None, Status::UnknownOp),
        (record(m, v, 0, 0, &[]), None, Status::UnknownOp),
        (
            record(m, v, proto::OP_QUERY_GID, 5, &[]),
            None,
            Status::Malformed,
        ),
        (
            record(m, v, proto::OP_DETACH, 0, &[]),
            None,
            Status::Malformed,
        ),
        (
            record(m, v, proto::OP_WAIT, 4, &[0; 4]),
            None,
            Status::Malformed,
        ),
        (vec![1, 2, 3], None, Status::Malformed),
        (
            record(m, v, proto::OP_QUERY_GID, 70_000, &[0; 70_000]),
            None,
            Status::Oversized,
        ),
        // MAX_REQUEST + 1 bytes: refused; MAX_REQUEST bytes: accepted.
        (
            record(m, v, proto::OP_QUERY_GID, 241, &[0; 241]),
            None,
            Status::Oversized,
        ),
        (
            record(m, v, proto::OP_QUERY_GID, 240, &[0; 240]),
            None,
            Status::Ok,
        ),
        (
            record(m, v, proto::OP_REGISTER, 8, &[0; 8]),
            None,
            Status::BadSocket,
        ),
        (
            record(m, v, proto::OP_REGISTER, 1, &[0]),
            Some(tcp.as_raw_fd()),
            Status::Malformed,
        ),
        (
            record(m, v, proto::OP_DETACH, 8, &[0; 8]),
            Some(tcp.as_raw_fd()),
            Status::NotHeld,
        ),
        (
            record(m, v, proto::OP_ATTACH, 8, &[1; 8]),
            Some(tcp.as_raw_fd()),
            Status::StaleToken,
        ),
    ];
    for (i, (rec, fd, want)) in cases.iter().enumerate() {
        let (status, reply, rfd) = c.raw_request(rec, *fd).unwrap();
        assert_eq!(status, *want, "case {i}");
        assert!(rfd.is_none());
        let h = Header::decode(&reply).unwrap();
        assert_eq!(h.magic, proto::MAGIC);
        assert_eq!(h.len as usize, reply.len() - proto::HEADER_LEN);
        if *want == Status::BadVersion {
            assert_eq!(proto::get_u32(&reply, proto::HEADER_LEN + 4), 1);
        }
        // The same connection keeps working.
        assert_eq!(c.query_gid().unwrap(), gid, "after case {i}");
    }
    // A client that sends garbage and vanishes does not hurt either.
    {
        let mut g = client(&dir);
        let _ = g.raw_request(&[0xff; 200], None).unwrap();
    }
    let mut fresh = client(&dir);
    assert_eq!(fresh.query_gid().unwrap(), gid);
    let st = fresh.stats().unwrap();
    assert_eq!(st.ops.invalid.failed, 9);
    assert_eq!(st.failures.malformed, 7);
    assert_eq!(st.failures.oversized, 2);
    assert_eq!(st.failures.bad_version, 1);
    assert_eq!(st.failures.unknown_op, 2);
    assert_eq!(st.ops.query_gid.ok, 1 + 15 + 1 + 1);
    assert_eq!(st.ops.query_gid.failed, 0);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// After fork the child gets its own connection; the parent's is undisturbed.

#[test]
fn forked_child_reconnects() {
    let dir = TestDir::new("fork");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    let gid = c.query_gid().unwrap();
    let (a, _b) = tcp_pair();
    let before = c.stats().unwrap().clients_total;
    // SAFETY: the child only uses the client (std + libc) and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let ok = (|| -> Result<bool, IsmError> {
            let g = c.query_gid()?;
            let dmb = c.register_dmb(0, a.as_raw_fd())?;
            c.unregister_dmb(dmb.token)?;
            Ok(g == gid)
        })();
        // SAFETY: leave the child without running the parent's destructors or test harness.
        unsafe { libc::_exit(if matches!(ok, Ok(true)) { 0 } else { 1 }) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed"
    );
    let st = c.stats().unwrap();
    assert_eq!(
        st.clients_total,
        before + 1,
        "the child used a connection of its own"
    );
    assert_eq!(st.ops.register.ok, 1);
    let st = wait_idle(&mut c, 1);
    assert_eq!(st.released_on_disconnect, 0);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// Cgroups: quotas are per cgroup, and with require_same_cgroup an attach from another cgroup is
// refused even with the mirror socket.

fn cgroup2_root() -> Option<std::path::PathBuf> {
    smc_cgroup::cgroup2_root().ok()
}

fn child_cgroup(port: u16) {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    let mut ism = Client::connect_default().unwrap();
    let token = recv_u64(&mut tcp);
    let attach = match ism.attach_dmb(token, tcp.as_raw_fd()) {
        Ok(_) => 0u64,
        Err(IsmError::BadProof) => 1,
        Err(e) => panic!("unexpected {e:?}"),
    };
    // The parent's cgroup is at its quota; ours is not.
    let (a, _b) = tcp_pair();
    let reg = match ism.register_dmb(0, a.as_raw_fd()) {
        Ok(_) => 0u64,
        Err(IsmError::QuotaDmbs) => 1,
        Err(e) => panic!("unexpected {e:?}"),
    };
    send_u64(&mut tcp, attach | reg << 1);
    let mut b = [0u8; 1];
    let _ = tcp.read(&mut b);
}

fn run_cgroup_child(sock: &std::path::Path, cgroup: Option<&std::path::Path>, token: u64) -> u64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let mut cmd = spawn_child(
        CHILD_ENTRY,
        "cgroup",
        sock,
        &[("ISM_PORT", port.to_string())],
    );
    if let Some(cg) = cgroup {
        smc_cgroup::join_before_exec(&mut cmd, cg);
    }
    let child = cmd.spawn().unwrap();
    let (mut tcp, _) = l.accept().unwrap();
    tcp.set_read_timeout(Some(WAIT)).unwrap();
    // Register a DMB for this connection and hand the token over, as CLC would.
    let mut ism = Client::connect(sock).unwrap();
    let dmb = ism.register_dmb(0, tcp.as_raw_fd());
    let token = match dmb {
        Ok(d) => d.token,
        Err(_) => token,
    };
    send_u64(&mut tcp, token);
    let verdict = recv_u64(&mut tcp);
    drop(tcp);
    assert!(wait_child(child).success());
    verdict
}

#[test]
fn cgroups_have_separate_quotas_and_can_be_fenced() {
    let Some(root) = cgroup2_root() else {
        eprintln!("no cgroup2 mount: skipping");
        return;
    };
    let cg = root.join(format!("smc-ism-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&cg) {
        eprintln!("cannot create a cgroup ({e}): skipping");
        return;
    }
    struct Rm(std::path::PathBuf);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _rm = Rm(cg.clone());

    let dir = TestDir::new("cgroup");
    // Our cgroup may hold 2 DMBs; the run_cgroup_child registers one more each time.
    let d = start(&dir, |c| {
        c.require_same_cgroup = true;
        c.cgroup_max_dmbs = 2;
    });
    let sock = dir.sock();
    let mut me = client(&dir);
    let (a, _b) = tcp_pair();
    let _mine = me.register_dmb(0, a.as_raw_fd()).unwrap();

    // Same cgroup: attach allowed; our cgroup is then full (2), so the child's register fails.
    let v = run_cgroup_child(&sock, None, 0);
    assert_eq!(v, 0b10, "same cgroup: attach ok, quota shared");
    // The child died, its connection closed: back to our one DMB... plus the one
    // run_cgroup_child registered for the connection, freed when that client dropped.
    me.wait_for(WAIT, |s| s.live_dmbs == 1 && s.clients_connected == 1)
        .unwrap();

    // Other cgroup: attach refused with the mirror socket; its own quota is untouched.
    let v = run_cgroup_child(&sock, Some(&cg), 0);
    assert_eq!(v, 0b01, "other cgroup: attach refused, own quota");
    let st = me
        .wait_for(WAIT, |s| s.live_dmbs == 1 && s.clients_connected == 1)
        .unwrap();
    assert_eq!(st.failures.other_cgroup, 1);
    assert_eq!(st.failures.quota_dmbs, 1);
    let cgs: HashSet<String> = st.cgroups.iter().map(|c| c.path.clone()).collect();
    assert!(cgs.len() == 1, "only our cgroup holds DMBs now: {cgs:?}");
    d.shutdown().unwrap();

    // By default (require_same_cgroup off) the mirror proof alone decides: a peer in another
    // cgroup may attach (SMC-D between containers).
    let dir = TestDir::new("cgroup-default");
    let d = start(&dir, |_| {});
    let v = run_cgroup_child(&dir.sock(), Some(&cg), 0);
    assert_eq!(v, 0b00, "other cgroup, default config: attach ok");
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// LIST shows live DMBs; tokens only to root; another uid sees only its own DMBs (no other
// tenant's tuples or cgroup paths), without tokens.

#[test]
fn list_shows_tokens_only_to_root() {
    if !root_or_skip("list_shows_tokens_only_to_root") {
        return;
    }
    let dir = TestDir::new("list");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    let (a, b) = tcp_pair();
    let regs: Vec<_> = (0..200u32)
        .map(|i| c.register_dmb((i % 3) as u8, a.as_raw_fd()).unwrap())
        .collect();
    let _att = c.attach_dmb(regs[5].token, b.as_raw_fd()).unwrap();
    c.unregister_dmb(regs[5].token).unwrap();

    let list = c.list_dmbs().unwrap();
    assert_eq!(list.len(), 200, "paged over LIST_PAGE_MAX");
    assert!(list.windows(2).all(|w| w[0].slot < w[1].slot));
    for r in &regs {
        let e = list.iter().find(|e| e.slot == r.slot).unwrap();
        assert_eq!(e.token, Some(r.token), "root sees tokens");
        assert_eq!((e.size as usize, e.size_code), (r.size, r.size_code));
        assert_eq!(e.owner_local, a.local_addr().unwrap().to_string());
        assert_eq!(e.owner_peer, a.peer_addr().unwrap().to_string());
        if r.token == regs[5].token {
            assert_eq!((e.refs, e.unregistered), (1, true));
        } else {
            assert_eq!((e.refs, e.unregistered), (1, false));
        }
    }

    // SAFETY: the child only uses the client and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: dropping privileges in the child.
        let code = if unsafe { libc::setgid(65534) == 0 && libc::setuid(65534) == 0 } {
            let (x, _y) = tcp_pair();
            let own = Client::connect(&dir.sock()).and_then(|mut n| {
                let d = n.register_dmb(0, x.as_raw_fd())?;
                Ok((n.list_dmbs()?, n.stats()?, d, n))
            });
            match own {
                Ok((l, st, d, _n))
                    if l.len() == 1
                        && l[0].slot == d.slot
                        && l[0].token.is_none()
                        && st.cgroups.is_empty() =>
                {
                    0
                }
                Ok(_) => 1,
                Err(_) => 2,
            }
        } else {
            3
        };
        // SAFETY: leave without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(
        libc::WEXITSTATUS(status),
        0,
        "non-root sees its own DMB only, no tokens, no cgroup paths"
    );
    drop(c);
    let mut c = client(&dir);
    // The client went while its sockets are still held (here, by this process: as by a
    // forked child or a receiver of the socket): its references are kept for an adopter
    // until nobody holds the sockets any more.
    let s = c
        .wait_for(WAIT, |s| {
            s.released_on_disconnect >= 201 && s.live_dmbs <= 200
        })
        .expect("the daemon saw both clients go and freed the child's DMB (socket closed)");
    assert_eq!(
        (s.live_dmbs, s.live_attachments),
        (200, 1),
        "kept while held"
    );
    drop((a, b));
    wait_idle(&mut c, 1);
    assert!(c.list_dmbs().unwrap().is_empty());
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// WAIT never misses a change (a lost wakeup: a state change between check and sleep): a waiter racing with state changes is
// always woken, whether the change lands before or after the daemon parks the waiter.

#[test]
fn wait_never_misses_a_change() {
    let dir = TestDir::new("wait");
    let d = start(&dir, |_| {});
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let sock = dir.sock();
    let actor = std::thread::spawn(move || {
        let mut c = Client::connect(&sock).unwrap();
        let (a, _b) = tcp_pair();
        let mut held = None;
        while go_rx.recv().is_ok() {
            match held.take() {
                None => held = Some(c.register_dmb(0, a.as_raw_fd()).unwrap()),
                Some(d) => c.unregister_dmb(d.token).unwrap(),
            }
            done_tx.send(()).unwrap();
        }
    });
    let mut w = client(&dir);
    for i in 0..1000 {
        let g = w.stats().unwrap().generation;
        go_tx.send(()).unwrap();
        let t = Instant::now();
        let s = w.wait_change(g, WAIT).unwrap();
        assert_ne!(s.generation, g, "iteration {i}: missed wakeup");
        assert!(t.elapsed() < WAIT / 2, "iteration {i}: late wakeup");
        done_rx.recv().unwrap();
    }
    drop(go_tx);
    actor.join().unwrap();
    let st = w.stats().unwrap();
    assert_eq!(st.ops.wait.ok, 1000);
    d.shutdown().unwrap();
}

// ---------------------------------------------------------------------------------------------
// One SharedClient per side, shared by many threads: pipelined requests of different threads
// interleave on one connection, every reply reaches its own ticket.

#[test]
fn shared_client_serves_many_threads_on_one_connection() {
    const THREADS: usize = 16;
    const ITERS: usize = 200;
    let dir = TestDir::new("shared");
    let d = start(&dir, |_| {});
    let owner = smc_ism::SharedClient::new(d.socket_path());
    let peer = smc_ism::SharedClient::new(d.socket_path());
    let live = Mutex::new(HashSet::<u64>::new());
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let (owner, peer, live) = (&owner, &peer, &live);
            s.spawn(move || {
                let (a, b) = tcp_pair();
                for i in 0..ITERS {
                    // Two tickets in flight from this thread, among the others' requests.
                    let t1 = owner
                        .register_dmb_start((i % 3) as u8, a.as_raw_fd())
                        .unwrap();
                    let t2 = owner.register_dmb_start(0, a.as_raw_fd()).unwrap();
                    let (r2, r1) = (owner.finish_dmb(t2).unwrap(), owner.finish_dmb(t1).unwrap());
                    assert_eq!(r1.size, 16384 << (i % 3));
                    for r in [&r1, &r2] {
                        assert!(live.lock().unwrap().insert(r.token), "duplicate token");
                        let att = peer.attach_dmb(r.token, b.as_raw_fd()).unwrap();
                        assert_eq!((att.token, att.size), (r.token, r.size));
                        assert!(live.lock().unwrap().remove(&r.token));
                        peer.release_nowait(None, Some(r.token)).unwrap();
                        owner.release_nowait(Some(r.token), None).unwrap();
                    }
                }
            });
        }
    });
    let mut c = client(&dir);
    let st = c
        .wait_for(WAIT, |s| s.live_dmbs == 0 && s.live_attachments == 0)
        .unwrap();
    let n = (THREADS * ITERS * 2) as u64;
    assert_eq!(st.ops.register.ok, n);
    assert_eq!(st.ops.attach.ok, n);
    assert_eq!(st.failures, Default::default());
    d.shutdown().unwrap();
}
