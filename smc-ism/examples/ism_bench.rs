//! Benchmark of the loopback-ism round trips: register / attach / detach / unregister from 1, 2
//! and 64 concurrent clients, with latency percentiles and operations per second.
//!
//! ```text
//! cargo run --release -p smc-ism --example ism_bench -- [--clients 1,2,64] [--cycles N]
//!                                                        [--socket PATH]
//! ```
//!
//! Without `--socket` it starts its own daemon (in this process, on its own runtime) in a
//! temporary directory. Each client is a thread with two connections (owner and peer, as two
//! processes of one TCP connection would have) and its own TCP pair for the proofs. One cycle is
//! the four round trips an SMC-D connection costs: register, attach, detach, unregister.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use smc_ism::{Client, DaemonConfig};

const OPS: [&str; 4] = ["register", "attach", "detach", "unregister"];

struct Args {
    clients: Vec<usize>,
    cycles: usize,
    socket: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        clients: vec![1, 2, 64],
        cycles: 0,
        socket: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--clients" => a.clients = v.split(',').map(|n| n.parse().expect("number")).collect(),
            "--cycles" => a.cycles = v.parse().expect("number"),
            "--socket" => a.socket = Some(PathBuf::from(v)),
            _ => panic!("unknown argument {k}"),
        }
    }
    a
}

fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    (a, b)
}

fn pct(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

/// Runs `clients` threads × `cycles` cycles; returns per-op latencies (ns) and wall time.
fn run(sock: &Path, clients: usize, cycles: usize) -> ([Vec<u64>; 4], Vec<u64>, Duration) {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|_| {
            let sock = sock.to_path_buf();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let mut owner = Client::connect(&sock).unwrap();
                let mut peer = Client::connect(&sock).unwrap();
                let (a, b) = tcp_pair();
                let cycle = |owner: &mut Client, peer: &mut Client, lat: Option<&mut [u64; 5]>| {
                    let t0 = Instant::now();
                    let d = owner.register_dmb(0, a.as_raw_fd()).unwrap();
                    let t1 = Instant::now();
                    let att = peer.attach_dmb(d.token, b.as_raw_fd()).unwrap();
                    let t2 = Instant::now();
                    peer.detach_dmb(d.token).unwrap();
                    let t3 = Instant::now();
                    owner.unregister_dmb(d.token).unwrap();
                    let t4 = Instant::now();
                    drop((d, att));
                    if let Some(l) = lat {
                        l[0] = (t1 - t0).as_nanos() as u64;
                        l[1] = (t2 - t1).as_nanos() as u64;
                        l[2] = (t3 - t2).as_nanos() as u64;
                        l[3] = (t4 - t3).as_nanos() as u64;
                        l[4] = (t4 - t0).as_nanos() as u64;
                    }
                };
                for _ in 0..50 {
                    cycle(&mut owner, &mut peer, None);
                }
                barrier.wait();
                let mut out: [Vec<u64>; 5] = Default::default();
                for v in out.iter_mut() {
                    v.reserve(cycles);
                }
                let mut l = [0u64; 5];
                for _ in 0..cycles {
                    cycle(&mut owner, &mut peer, Some(&mut l));
                    for (v, x) in out.iter_mut().zip(l) {
                        v.push(x);
                    }
                }
                out
            })
        })
        .collect();
    barrier.wait();
    let t = Instant::now();
    let mut ops: [Vec<u64>; 4] = Default::default();
    let mut cyc = Vec::new();
    for h in handles {
        let [r, a, d, u, c] = h.join().unwrap();
        ops[0].extend(r);
        ops[1].extend(a);
        ops[2].extend(d);
        ops[3].extend(u);
        cyc.extend(c);
    }
    let wall = t.elapsed();
    (ops, cyc, wall)
}

/// Baseline: a bare SEQPACKET ping-pong between two threads (what any daemon round trip costs
/// at least on this machine).
fn baseline(n: usize) -> Vec<u64> {
    let mut sv = [0i32; 2];
    // SAFETY: socketpair with a valid array.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            sv.as_mut_ptr(),
        )
    };
    assert_eq!(r, 0);
    let (a, b) = (sv[0], sv[1]);
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: plain read/write on our socket.
            let n = unsafe { libc::read(b, buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                break;
            }
            // SAFETY: as above.
            unsafe { libc::write(b, buf.as_ptr().cast(), n as usize) };
        }
        // SAFETY: closing our fd.
        unsafe { libc::close(b) };
    });
    let mut lat = Vec::with_capacity(n);
    let mut buf = [0u8; 64];
    for i in 0..n + 1000 {
        let t = Instant::now();
        // SAFETY: plain write/read on our socket.
        unsafe {
            libc::write(a, buf.as_ptr().cast(), 24);
            libc::read(a, buf.as_mut_ptr().cast(), buf.len());
        }
        if i >= 1000 {
            lat.push(t.elapsed().as_nanos() as u64);
        }
    }
    // SAFETY: closing our fd ends the echo thread.
    unsafe { libc::close(a) };
    echo.join().unwrap();
    lat
}

fn row(name: &str, v: &mut [u64]) {
    v.sort_unstable();
    println!(
        "  {:<11} {:>8.1} {:>8.1} {:>8.1} {:>8.1}",
        name,
        pct(v, 0.50),
        pct(v, 0.90),
        pct(v, 0.99),
        pct(v, 1.0)
    );
}

fn main() {
    let args = parse_args();
    let tmp;
    let mut _daemon = None;
    let sock = match &args.socket {
        Some(s) => s.clone(),
        None => {
            tmp = std::env::temp_dir().join(format!("ism-bench-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&tmp);
            let cfg = DaemonConfig::with_paths(tmp.join("ctl.sock"), tmp.join("state"));
            _daemon = Some(smc_ism::spawn(cfg).expect("daemon"));
            tmp.join("ctl.sock")
        }
    };
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "loopback-ism round trips ({} CPUs, daemon {}); latencies in µs",
        cpus,
        if args.socket.is_some() {
            "external"
        } else {
            "in-process"
        }
    );
    println!(
        "\nbaseline: bare SEQPACKET ping-pong between two threads (no daemon)\n  {:<11} {:>8} {:>8} {:>8} {:>8}",
        "op", "p50", "p90", "p99", "max"
    );
    row("round trip", &mut baseline(20_000));
    for &clients in &args.clients {
        let cycles = if args.cycles > 0 {
            args.cycles
        } else {
            (20_000 / clients).clamp(300, 10_000)
        };
        let (mut ops, mut cyc, wall) = run(&sock, clients, cycles);
        let total_ops = 4 * clients * cycles;
        println!(
            "\n{clients} client(s) × {cycles} cycles: {total_ops} round trips in {:.2?} = {:.0} ops/s, {:.0} cycles/s",
            wall,
            total_ops as f64 / wall.as_secs_f64(),
            (clients * cycles) as f64 / wall.as_secs_f64()
        );
        println!(
            "  {:<11} {:>8} {:>8} {:>8} {:>8}",
            "op", "p50", "p90", "p99", "max"
        );
        for (name, v) in OPS.iter().zip(ops.iter_mut()) {
            row(name, v);
        }
        row("cycle(4)", &mut cyc);
    }
    if let Some(d) = _daemon.take() {
        let mut c = Client::connect(&sock).unwrap();
        let st = c.stats().unwrap();
        println!(
            "\ndaemon: {} registers, {} attaches, {} failures total, {} live DMBs at the end",
            st.ops.register.ok,
            st.ops.attach.ok,
            st.ops.register.failed
                + st.ops.attach.failed
                + st.ops.detach.failed
                + st.ops.unregister.failed,
            st.live_dmbs
        );
        drop(c);
        d.shutdown().unwrap();
        let _ = std::fs::remove_dir_all(sock.parent().unwrap());
    }
}
