//! `smc-bench-helper`: the two small TCP programs of `cargo xtask bench` that no Debian package
//! provides. They use nothing but the socket calls every program uses (std, blocking), so the
//! interposition library sees them as it sees any unmodified program.
//!
//! - `msg-server PORT SIZE` / `msg-client PORT SIZE SECONDS`: a message-rate test like ipc-bench's
//!   TCP one: the client sends a SIZE-byte message, the server sends it back, repeated; messages
//!   per second (round trips) and their latency.
//! - `conn-server PORT` / `conn-client PORT SECONDS`: connection setup: connect, one byte each way,
//!   close, repeated; connections per second and latency percentiles of connect + first exchange
//!   (the part a handshake on the connection slows down), and of `connect()` alone (the TCP
//!   handshake, in the plain TCP column).
//! - `proc-client PORT SECONDS` (against `conn-server`): one connection per process, as a CGI
//!   program, a health check or a shell loop of `curl` makes them: it runs `one PORT` (this
//!   program: exec, connect, one byte each way, close, exit) one after the other; processes per
//!   second, the latency of each child's connect + first exchange and of its `connect()`, and
//!   the wall time of a whole child (spawn to exit).
//!
//! Clients print one JSON object on stdout. Servers run until killed.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    env,
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    process::ExitCode,
    time::{Duration, Instant},
};

const WARMUP: Duration = Duration::from_millis(200);

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let res = match argv.as_slice() {
        ["msg-server", port, size] => msg_server(num(port), num(size)),
        ["msg-client", port, size, secs] => msg_client(num(port), num(size), secs_arg(secs)),
        ["conn-server", port] => conn_server(num(port)),
        ["conn-client", port, secs] => conn_client(num(port), secs_arg(secs)),
        ["proc-client", port, secs] => proc_client(num(port), secs_arg(secs)),
        ["one", port] => one(num(port)),
        _ => {
            eprintln!(
                "usage: smc-bench-helper msg-server PORT SIZE | msg-client PORT SIZE SECONDS | \
                 conn-server PORT | conn-client PORT SECONDS | proc-client PORT SECONDS"
            );
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc-bench-helper: {e}");
            ExitCode::FAILURE
        }
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    s.parse().unwrap_or_else(|_| {
        eprintln!("smc-bench-helper: not a number: {s}");
        std::process::exit(2)
    })
}

fn secs_arg(s: &str) -> Duration {
    Duration::from_secs_f64(num::<f64>(s))
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn msg_server(port: u16, size: usize) -> std::io::Result<()> {
    let l = TcpListener::bind(addr(port))?;
    let mut buf = vec![0u8; size.max(1)];
    loop {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        loop {
            match s.read_exact(&mut buf) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => break,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => return Err(e),
            }
            if let Err(e) = s.write_all(&buf) {
                if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) {
                    break;
                }
                return Err(e);
            }
        }
    }
}

fn msg_client(port: u16, size: usize, secs: Duration) -> std::io::Result<()> {
    let mut s = TcpStream::connect(addr(port))?;
    s.set_nodelay(true)?;
    let out: Vec<u8> = (0..size.max(1)).map(|i| i as u8).collect();
    let mut back = vec![0u8; out.len()];
    let mut round = |s: &mut TcpStream| -> std::io::Result<()> {
        s.write_all(&out)?;
        s.read_exact(&mut back)?;
        if back != out {
            return Err(std::io::Error::other("echoed message differs"));
        }
        Ok(())
    };
    let warmup = warm_up(|| round(&mut s))?;
    let mut lat = Vec::with_capacity(1 << 20);
    let start = Instant::now();
    let mut last = start;
    loop {
        round(&mut s)?;
        let now = Instant::now();
        lat.push((now - last).as_nanos() as u64);
        last = now;
        if now - start >= secs {
            break;
        }
    }
    let elapsed = (last - start).as_secs_f64();
    let n = lat.len();
    println!(
        "{{\"messages\":{n},\"total_messages\":{},\"seconds\":{elapsed:.6},\"msg_per_sec\":{:.1},\"p50_us\":{:.3},\"p99_us\":{:.3}}}",
        n as u64 + warmup,
        n as f64 / elapsed,
        pct(&mut lat, 50.0),
        pct(&mut lat, 99.0)
    );
    Ok(())
}

fn conn_server(port: u16) -> std::io::Result<()> {
    let l = TcpListener::bind(addr(port))?;
    let mut b = [0u8; 1];
    loop {
        let (mut s, _) = match l.accept() {
            Ok(x) => x,
            // A client that gave up between SYN and accept.
            Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
            Err(e) => return Err(e),
        };
        // One byte each way, then the server closes first (its side keeps TIME_WAIT, so the
        // client's ephemeral ports are not used up).
        if s.read_exact(&mut b).is_ok() {
            let _ = s.write_all(&b);
        }
    }
}

/// One connection: connect, one byte each way, the server's close; the nanoseconds of
/// connect + first exchange and of `connect()` alone.
fn exchange(a: SocketAddr) -> std::io::Result<[u64; 2]> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(a)?;
    let dc = t0.elapsed().as_nanos() as u64;
    s.write_all(b"x")?;
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    let dt = t0.elapsed().as_nanos() as u64;
    // Wait for the server's close: a full short-lived connection per iteration.
    let mut rest = [0u8; 16];
    while s.read(&mut rest)? != 0 {}
    Ok([dt, dc])
}

/// `once` for [`WARMUP`], unmeasured, then for `secs`, each of its `K` figures collected: the
/// iterations of the warm-up, the samples, the seconds measured.
fn sampled<const K: usize>(
    secs: Duration,
    mut once: impl FnMut() -> std::io::Result<[u64; K]>,
) -> std::io::Result<(u64, [Vec<u64>; K], f64)> {
    let warmup = warm_up(|| once().map(drop))?;
    let mut v: [Vec<u64>; K] = std::array::from_fn(|_| Vec::with_capacity(1 << 16));
    let start = Instant::now();
    while start.elapsed() < secs {
        for (x, col) in once()?.into_iter().zip(v.iter_mut()) {
            col.push(x);
        }
    }
    Ok((warmup, v, start.elapsed().as_secs_f64()))
}

fn conn_client(port: u16, secs: Duration) -> std::io::Result<()> {
    let a = addr(port);
    let (warmup, [mut lat, mut conn], elapsed) = sampled(secs, || exchange(a))?;
    let n = lat.len();
    println!(
        "{{\"connections\":{n},\"total_connections\":{},\"seconds\":{elapsed:.6},\"conn_per_sec\":{:.1},\"p50_us\":{:.3},\"p99_us\":{:.3},\"connect_p50_us\":{:.3},\"connect_p99_us\":{:.3}}}",
        n as u64 + warmup,
        n as f64 / elapsed,
        pct(&mut lat, 50.0),
        pct(&mut lat, 99.0),
        pct(&mut conn, 50.0),
        pct(&mut conn, 99.0)
    );
    Ok(())
}

/// One connection of [`conn_client`] in a process of its own: prints the nanoseconds of
/// connect + first exchange and of `connect()` alone.
fn one(port: u16) -> std::io::Result<()> {
    let [dt, dc] = exchange(addr(port))?;
    println!("{dt} {dc}");
    Ok(())
}

fn proc_client(port: u16, secs: Duration) -> std::io::Result<()> {
    let exe = env::current_exe()?;
    let once = || -> std::io::Result<[u64; 3]> {
        let t0 = Instant::now();
        let out = std::process::Command::new(&exe)
            .args(["one", &port.to_string()])
            .stderr(std::process::Stdio::inherit())
            .output()?;
        let wall = t0.elapsed().as_nanos() as u64;
        let text = String::from_utf8_lossy(&out.stdout);
        let mut it = text.split_whitespace().map(|v| v.parse::<u64>().ok());
        match (
            out.status.success(),
            it.next().flatten(),
            it.next().flatten(),
        ) {
            (true, Some(dt), Some(dc)) => Ok([dt, dc, wall]),
            _ => Err(std::io::Error::other(format!(
                "child: {} {text:?}",
                out.status
            ))),
        }
    };
    let (warmup, [mut lat, mut conn, mut wall], elapsed) = sampled(secs, once)?;
    let n = lat.len();
    println!(
        "{{\"processes\":{n},\"total_connections\":{},\"seconds\":{elapsed:.6},\"proc_per_sec\":{:.1},\"p50_us\":{:.3},\"p99_us\":{:.3},\"connect_p50_us\":{:.3},\"proc_p50_us\":{:.3}}}",
        n as u64 + warmup,
        n as f64 / elapsed,
        pct(&mut lat, 50.0),
        pct(&mut lat, 99.0),
        pct(&mut conn, 50.0),
        pct(&mut wall, 50.0)
    );
    Ok(())
}

/// Runs `step` for [`WARMUP`], unmeasured; returns how many times.
fn warm_up(mut step: impl FnMut() -> std::io::Result<()>) -> std::io::Result<u64> {
    let warm = Instant::now();
    let mut n = 0u64;
    while warm.elapsed() < WARMUP {
        step()?;
        n += 1;
    }
    Ok(n)
}

/// Percentile of nanosecond samples, in microseconds.
fn pct(v: &mut [u64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let i = ((p / 100.0) * (v.len() - 1) as f64).round() as usize;
    v[i.min(v.len() - 1)] as f64 / 1000.0
}
