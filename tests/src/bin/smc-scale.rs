//! `smc-scale`: many concurrent idle connections that each ping once per interval (issue 14,
//! "Scale"). Plain epoll programs, one thread each, as an event-driven server and a client
//! holding N connections would be; they use only the socket calls every such program uses, so
//! the interposition library sees them as it sees any unmodified program.
//!
//! - `smc-scale server PORT`: accepts every connection, answers each 64-byte message with the
//!   same 64 bytes; a message starting with `P` is answered with its pid instead (the client
//!   reads the server's memory figures from `/proc`).
//! - `smc-scale client PORT N ROUNDS [INTERVAL_MS [ACTIVE]]`: opens N connections (non-blocking,
//!   at most 512 connects in flight), pings once on each (setup: connect to the first answer),
//!   then ROUNDS rounds in which every connection (the first ACTIVE only, when given: the others
//!   stay idle in the set) pings once, spread evenly over INTERVAL_MS (default 1000); checks every answer (content, no reset, no loss); then prints one JSON object:
//!   connections, resets, unanswered and wrong answers, setup rate and latency, ping
//!   percentiles, and for the client, the server and the loopback-ism daemon (`SO_PEERCRED` of
//!   `$SMC_CTL_SOCK`, when set): RSS, its anonymous and shared parts, PSS, descriptors, memory
//!   mappings, DMB mappings (`memfd:smc-dmb`), CPU time used during the rounds. `smcd_conns` is
//!   the number of client connection ends with their two DMBs mapped (distinct DMB inodes / 2).
//!
//! More connections than one process holds (a descriptor each, within `RLIMIT_NOFILE`; three
//! mappings each, within `vm.max_map_count`) are spread over processes:
//! - `smc-scale server PORT WORKERS` (WORKERS > 1) listens on 0.0.0.0 and forks WORKERS
//!   processes that share the listener, each accepting up to its share (at most 16 000, see
//!   `per_process`), answering `P` with the first process's pid;
//! - the client forks as many workers as N needs (`SMC_SCALE_WORKERS=W` to choose), each with
//!   its share of the N connections; they set up, wait for each other, ping their rounds at the
//!   same time and send their figures to the first process, which prints the one JSON object
//!   for all of them (percentiles over all pings; memory, descriptors and mappings summed over
//!   all client and all server processes, plus `client_procs` and `server_procs`) while they
//!   still hold their connections. Beyond 3/4 of the ephemeral ports
//!   (`net.ipv4.ip_local_port_range`) the connections go to 127.0.0.1 … 127.0.0.A in turn (a
//!   server with WORKERS > 1 listens on all of them).
//!
//! `SMC_SCALE_MAP_ROOM=R` (the client, or a server of one process) takes all memory mappings
//! but R below `vm.max_map_count` before it starts (as many more connections would).
//!
//! `SMC_SCALE_NOFILE_ROOM=R` instead lowers it to leave exactly R descriptors above those open
//! at the start (a program sized for its own needs, at its limit).
//!
//! Both raise their soft `RLIMIT_NOFILE` to the hard limit (root: the hard limit too, when N
//! needs it).
use std::{
    collections::HashSet,
    env, fs,
    io::{self, Write as _},
    mem,
    os::fd::RawFd,
    process::ExitCode,
    time::{Duration, Instant},
};

const MSG: usize = 64;
const MAX_CONNECTING: usize = 512;

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let res = match a.as_slice() {
        ["server", port] => server(num(port), 1),
        ["server", port, workers] => server(num(port), num(workers)),
        ["client", port, n, rounds] => client(num(port), num(n), num(rounds), 1000, None),
        ["client", port, n, rounds, ms] => client(num(port), num(n), num(rounds), num(ms), None),
        ["client", port, n, rounds, ms, active] => {
            client(num(port), num(n), num(rounds), num(ms), Some(num(active)))
        }
        _ => {
            eprintln!("usage: smc-scale server PORT [WORKERS] | client PORT N ROUNDS [INTERVAL_MS [ACTIVE]]");
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smc-scale: {e}");
            ExitCode::FAILURE
        }
    }
}

fn num<T: std::str::FromStr>(s: &str) -> T {
    s.parse().unwrap_or_else(|_| {
        eprintln!("smc-scale: not a number: {s}");
        std::process::exit(2)
    })
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Soft `RLIMIT_NOFILE` to at least `want` if the hard limit allows (root raises the hard limit
/// too), else to the hard limit. Returns the soft limit in force.
fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut rl: libc::rlimit = mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur as u64 >= want {
            return rl.rlim_cur as u64;
        }
        if (rl.rlim_max as u64) < want {
            let hard = libc::rlimit {
                rlim_cur: want as libc::rlim_t,
                rlim_max: want as libc::rlim_t,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &hard) == 0 {
                return want;
            }
        }
        let soft = libc::rlimit {
            rlim_cur: rl.rlim_max,
            rlim_max: rl.rlim_max,
        };
        libc::setrlimit(libc::RLIMIT_NOFILE, &soft);
        rl.rlim_max as u64
    }
}

/// `SMC_SCALE_NOFILE_ROOM=R`: the soft `RLIMIT_NOFILE` lowered to leave room for exactly R
/// descriptors besides those open now (the program at its limit, as one sized for its own needs is); the
/// new limit.
fn nofile_room() -> Option<u64> {
    let room: u64 = env::var("SMC_SCALE_NOFILE_ROOM").ok()?.parse().ok()?;
    // Less the directory's own descriptor.
    let open = fs::read_dir("/proc/self/fd").ok()?.count() as u64 - 1;
    // SAFETY: setrlimit with a valid struct.
    unsafe {
        let mut rl: libc::rlimit = mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return None;
        }
        rl.rlim_cur = (open + room) as libc::rlim_t;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &rl) != 0 {
            return None;
        }
        Some(rl.rlim_cur as u64)
    }
}

fn sockaddr(addr: std::net::Ipv4Addr, port: u16) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_in = unsafe { mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = u32::from(addr).to_be();
    sa
}

fn epoll_add(ep: RawFd, fd: RawFd, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: valid epoll fd and event struct.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
}

fn epoll_mod(ep: RawFd, fd: RawFd, events: u32) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events,
        u64: fd as u64,
    };
    // SAFETY: valid epoll fd and event struct.
    cvt(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_MOD, fd, &mut ev) }).map(drop)
}

fn epoll_wait(ep: RawFd, evs: &mut [libc::epoll_event], ms: i32) -> io::Result<usize> {
    // SAFETY: the buffer holds evs.len() events.
    let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, ms) };
    match cvt(n) {
        Ok(n) => Ok(n as usize),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
        Err(e) => Err(e),
    }
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn write_fd(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes; MSG_NOSIGNAL: no SIGPIPE.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn close_fd(fd: RawFd) {
    // SAFETY: fd is owned by the caller's table and not used afterwards.
    unsafe { libc::close(fd) };
}

/// One server connection: the bytes of the message being read, the answer not yet written.
#[derive(Default)]
struct SrvConn {
    inb: Vec<u8>,
    out: Vec<u8>,
}

fn server(port: u16, workers: usize) -> Result<(), String> {
    let limit = raise_nofile(1 << 20);
    let e = |what: &str| {
        let err = io::Error::last_os_error();
        format!("{what}: {err}")
    };
    // Several workers: the connections' destinations are spread over 127.0.0.x (see `client`).
    let addr = if workers > 1 {
        std::net::Ipv4Addr::UNSPECIFIED
    } else {
        std::net::Ipv4Addr::LOCALHOST
    };
    // SAFETY: plain socket calls on a descriptor this function owns.
    let lfd = unsafe {
        let lfd = libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if lfd < 0 {
            return Err(e("socket"));
        }
        let one: libc::c_int = 1;
        libc::setsockopt(
            lfd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const libc::c_int).cast(),
            mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        let sa = sockaddr(addr, port);
        if libc::bind(
            lfd,
            (&sa as *const libc::sockaddr_in).cast(),
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        ) != 0
        {
            return Err(e("bind"));
        }
        if libc::listen(lfd, 65535) != 0 {
            return Err(e("listen"));
        }
        lfd
    };
    let main = std::process::id();
    if workers <= 1 {
        if let Some(room) = env::var("SMC_SCALE_MAP_ROOM")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            let eaten = eat_maps(room)?;
            eprintln!(
                "smc-scale server: {eaten} mappings taken, {room} left below vm.max_map_count"
            );
        }
        return serve(lfd, port, limit, None, main);
    }
    // Several processes share the one listener (forked after `listen`, so that every worker is
    // there before the first connection); each accepts until it holds `cap` connections.
    let cap = per_process(limit);
    eprintln!(
        "smc-scale server: port {port} on {addr}, {workers} workers of at most {cap} connections"
    );
    let mut pids = Vec::new();
    for _ in 0..workers {
        // SAFETY: fork; the child runs `serve` and exits, never returning here.
        match unsafe { libc::fork() } {
            -1 => return Err(e("fork")),
            0 => {
                die_with_parent();
                let code = match serve(lfd, port, limit, Some(cap), main) {
                    Ok(()) => 0,
                    Err(err) => {
                        eprintln!("smc-scale server worker: {err}");
                        1
                    }
                };
                std::process::exit(code);
            }
            pid => pids.push(pid),
        }
    }
    // A worker never ends by itself: one that does ends the server.
    let mut st = 0;
    // SAFETY: waitpid for any child.
    let pid = unsafe { libc::waitpid(-1, &mut st, 0) };
    for &p in &pids {
        // SAFETY: kill of this process's own children.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
    Err(format!("server worker {pid} ended (status {st:#x})"))
}

/// A forked worker ends with the process that forked it.
fn die_with_parent() {
    // SAFETY: prctl with plain integer arguments.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

/// `vm.max_map_count` (65 530 when unreadable).
fn max_map_count() -> u64 {
    fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_530)
}

/// How many connections one process holds here: at most 16 000, within its descriptor limit
/// (less room for the library's own) and `vm.max_map_count` (three mappings per connection end:
/// its two DMBs and a share of its state).
fn per_process(nofile: u64) -> usize {
    let maps = max_map_count().saturating_sub(4096) / 3;
    16_000.min(nofile.saturating_sub(1024)).min(maps).max(1) as usize
}

fn serve(lfd: RawFd, port: u16, limit: u64, cap: Option<usize>, main: u32) -> Result<(), String> {
    // SAFETY: plain epoll_create1.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })
        .map_err(|e| format!("epoll_create1: {e}"))?;
    let limit = nofile_room().unwrap_or(limit);
    eprintln!(
        "smc-scale server: port {port}, RLIMIT_NOFILE {limit}, pid {}",
        std::process::id()
    );
    epoll_add(ep, lfd, libc::EPOLLIN as u32).map_err(|e| format!("epoll_ctl: {e}"))?;
    let mut listening = true;
    let mut held = 0usize;
    let mut conns: Vec<Option<SrvConn>> = Vec::new();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    // The pid a `P` message is answered with: the server's first process (its workers are its
    // children).
    let pid = main;
    let mut buf = [0u8; 4096];
    let mut emfile = 0u64;
    loop {
        let n = epoll_wait(ep, &mut evs, -1).map_err(|e| format!("epoll_wait: {e}"))?;
        for ev in &evs[..n] {
            let fd = ev.u64 as RawFd;
            let events = ev.events;
            if fd == lfd {
                loop {
                    if cap.is_some_and(|c| held >= c) {
                        // Full: the other workers take the rest.
                        if listening {
                            // SAFETY: valid epoll and listener descriptors.
                            unsafe {
                                libc::epoll_ctl(ep, libc::EPOLL_CTL_DEL, lfd, std::ptr::null_mut())
                            };
                            listening = false;
                        }
                        break;
                    }
                    // SAFETY: accept4 on the listener, no address wanted.
                    let c = unsafe {
                        libc::accept4(
                            lfd,
                            std::ptr::null_mut(),
                            std::ptr::null_mut(),
                            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        )
                    };
                    if c < 0 {
                        let err = io::Error::last_os_error();
                        match err.raw_os_error() {
                            Some(libc::EAGAIN) | Some(libc::ECONNABORTED) => break,
                            Some(libc::EMFILE) | Some(libc::ENFILE) => {
                                // Tried again at the next wait (the listener stays readable).
                                emfile += 1;
                                if emfile.is_power_of_two() {
                                    eprintln!("smc-scale server: accept: {err} ({emfile} times)");
                                }
                                break;
                            }
                            _ => return Err(format!("accept: {err}")),
                        }
                    }
                    let i = c as usize;
                    if conns.len() <= i {
                        conns.resize_with(i + 1, || None);
                    }
                    conns[i] = Some(SrvConn::default());
                    held += 1;
                    if let Err(err) = epoll_add(ep, c, libc::EPOLLIN as u32) {
                        eprintln!("smc-scale server: epoll_ctl add: {err}");
                        conns[i] = None;
                        held -= 1;
                        close_fd(c);
                    }
                }
                continue;
            }
            let Some(Some(conn)) = conns.get_mut(fd as usize) else {
                continue;
            };
            let mut dead = false;
            if events & libc::EPOLLOUT as u32 != 0 && !conn.out.is_empty() {
                match write_fd(fd, &conn.out) {
                    Ok(w) => {
                        conn.out.drain(..w);
                    }
                    Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => dead = true,
                }
                if conn.out.is_empty() && !dead {
                    let _ = epoll_mod(ep, fd, libc::EPOLLIN as u32);
                }
            }
            if !dead && events & (libc::EPOLLIN | libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                loop {
                    match read_fd(fd, &mut buf) {
                        Ok(0) => {
                            dead = true;
                            break;
                        }
                        Ok(r) => {
                            conn.inb.extend_from_slice(&buf[..r]);
                            while conn.inb.len() >= MSG {
                                let msg: Vec<u8> = conn.inb.drain(..MSG).collect();
                                if msg[0] == b'P' {
                                    let mut a = [b' '; MSG];
                                    let s = format!("P{pid}");
                                    a[..s.len()].copy_from_slice(s.as_bytes());
                                    conn.out.extend_from_slice(&a);
                                } else {
                                    conn.out.extend_from_slice(&msg);
                                }
                            }
                            if r < buf.len() {
                                break;
                            }
                        }
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                        Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => {
                            dead = true;
                            break;
                        }
                    }
                }
                if !dead && !conn.out.is_empty() {
                    let was_empty = conn.out.len() <= MSG * 64;
                    match write_fd(fd, &conn.out) {
                        Ok(w) => {
                            conn.out.drain(..w);
                        }
                        Err(err) if err.kind() == io::ErrorKind::WouldBlock => {}
                        Err(_) => dead = true,
                    }
                    if !dead && !conn.out.is_empty() && was_empty {
                        let _ = epoll_mod(ep, fd, (libc::EPOLLIN | libc::EPOLLOUT) as u32);
                    }
                }
            }
            if dead {
                conns[fd as usize] = None;
                close_fd(fd);
                held -= 1;
                if !listening && cap.is_some_and(|c| held < c) {
                    listening = epoll_add(ep, lfd, libc::EPOLLIN as u32).is_ok();
                }
            }
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Connecting,
    Idle,
    Waiting,
}

struct CliConn {
    fd: RawFd,
    state: State,
    seq: u64,
    sent: Instant,
    got: usize,
    buf: [u8; MSG],
    connect_at: Instant,
    dead: bool,
}

fn ping_bytes(i: usize, seq: u64) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    m[0] = b'D';
    m[8..16].copy_from_slice(&(i as u64).to_le_bytes());
    m[16..24].copy_from_slice(&seq.to_le_bytes());
    for (k, b) in m.iter_mut().enumerate().skip(24) {
        *b = (i as u64 ^ seq).wrapping_add(k as u64) as u8;
    }
    m
}

#[derive(Default)]
struct Tally {
    resets: u64,
    wrong: u64,
    connect_errors: u64,
    answered: u64,
    /// Pings sent and not answered yet.
    outstanding: u64,
}

/// Reads what is there; returns the latency of a completed answer.
fn on_readable(c: &mut CliConn, i: usize, t: &mut Tally) -> Option<Duration> {
    loop {
        if c.state != State::Waiting {
            // Nothing is expected: anything readable is unasked data, an end of stream or a reset.
            let mut b = [0u8; MSG];
            match read_fd(c.fd, &mut b) {
                Ok(0) => kill(c, t),
                Ok(_) => t.wrong += 1,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => kill(c, t),
            }
            return None;
        }
        match read_fd(c.fd, &mut c.buf[c.got..]) {
            Ok(0) => {
                kill(c, t);
                return None;
            }
            Ok(r) => {
                c.got += r;
                if c.got == MSG {
                    c.got = 0;
                    c.state = State::Idle;
                    t.answered += 1;
                    t.outstanding -= 1;
                    if c.buf != ping_bytes(i, c.seq) {
                        t.wrong += 1;
                    }
                    return Some(c.sent.elapsed());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                kill(c, t);
                return None;
            }
        }
    }
}

/// A connection ended or failed: counted as a reset (the peer never closes first).
fn kill(c: &mut CliConn, t: &mut Tally) {
    if !c.dead {
        t.resets += 1;
        if c.state == State::Waiting {
            t.outstanding -= 1;
        }
        c.dead = true;
    }
}

fn send_ping(c: &mut CliConn, i: usize, t: &mut Tally) {
    c.seq += 1;
    let m = ping_bytes(i, c.seq);
    c.sent = Instant::now();
    match write_fd(c.fd, &m) {
        Ok(MSG) => {
            c.state = State::Waiting;
            t.outstanding += 1;
        }
        // A 64-byte write on an idle connection never blocks on TCP.
        Ok(_) | Err(_) => kill(c, t),
    }
}

fn connect_one(ep: RawFd, dst: std::net::Ipv4Addr, port: u16) -> io::Result<RawFd> {
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let sa = sockaddr(dst, port);
        let r = libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        if r != 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINPROGRESS) {
                close_fd(fd);
                return Err(e);
            }
        }
        if let Err(e) = epoll_add(ep, fd, (libc::EPOLLIN | libc::EPOLLOUT) as u32) {
            close_fd(fd);
            return Err(e);
        }
        Ok(fd)
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e6
}

/// The destination addresses: 127.0.0.1 alone while the ephemeral ports (at most 3/4 of
/// `net.ipv4.ip_local_port_range` per destination) suffice, else 127.0.0.1 … 127.0.0.A (a
/// port may be used again towards another address), which needs a server on 0.0.0.0.
fn destinations(n: usize) -> Vec<std::net::Ipv4Addr> {
    let ports = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| {
            let v: Vec<usize> = s
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            Some(v.get(1)?.saturating_sub(*v.first()?) + 1)
        })
        .unwrap_or(28_232);
    let per = (ports * 3 / 4).max(1);
    let a = n.div_ceil(per).clamp(1, 254);
    (1..=a as u8)
        .map(|k| std::net::Ipv4Addr::new(127, 0, 0, k))
        .collect()
}

/// How many client processes N connections take: one while its descriptor limit and
/// `vm.max_map_count` hold them all, else enough of [`per_process`] each
/// (`SMC_SCALE_WORKERS=W` says how many).
fn client_workers(n: usize, limit: u64) -> usize {
    if let Some(w) = env::var("SMC_SCALE_WORKERS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        return w.clamp(1, n.max(1));
    }
    if n as u64 + 256 <= limit && n as u64 * 3 + 4096 <= max_map_count() {
        1
    } else {
        n.div_ceil(per_process(limit)).max(1)
    }
}

/// One process's share of the connections, set up, then pinged.
struct Clients {
    ep: RawFd,
    port: u16,
    dests: Vec<std::net::Ipv4Addr>,
    /// Index of the first connection (destinations are spread by the overall index).
    first: usize,
    n: usize,
    conns: Vec<CliConn>,
    /// Descriptor → connection index.
    by_fd: Vec<usize>,
    t: Tally,
    ready: usize,
    setup_lat: Vec<Duration>,
    lat: Vec<Duration>,
    evs: Vec<libc::epoll_event>,
    late: u64,
    sent: u64,
    live: Vec<usize>,
}

impl Clients {
    fn new(
        port: u16,
        first: usize,
        n: usize,
        rounds: u32,
        dests: Vec<std::net::Ipv4Addr>,
    ) -> Result<Clients, String> {
        // SAFETY: plain epoll_create1.
        let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })
            .map_err(|e| format!("epoll_create1: {e}"))?;
        Ok(Clients {
            ep,
            port,
            dests,
            first,
            n,
            conns: Vec::with_capacity(n),
            by_fd: Vec::with_capacity(n + 1024),
            t: Tally::default(),
            ready: 0,
            setup_lat: Vec::with_capacity(n),
            lat: Vec::with_capacity(n * rounds as usize),
            evs: vec![libc::epoll_event { events: 0, u64: 0 }; 1024],
            late: 0,
            sent: 0,
            live: Vec::new(),
        })
    }

    /// Setup: connect, first ping answered.
    fn setup(&mut self) -> Result<(), String> {
        let n = self.n;
        let now = Instant::now();
        let t0 = Instant::now();
        let mut next = 0usize;
        let mut connecting = 0usize;
        let setup_deadline = t0 + Duration::from_secs(60 + n as u64 / 100);
        let t = &mut self.t;
        while self.ready + ((t.connect_errors + t.resets) as usize) < n {
            while next < n && connecting < MAX_CONNECTING {
                let g = self.first + next;
                let dst = self.dests[g % self.dests.len()];
                match connect_one(self.ep, dst, self.port) {
                    Ok(fd) => {
                        if self.by_fd.len() <= fd as usize {
                            self.by_fd.resize(fd as usize + 1, usize::MAX);
                        }
                        self.by_fd[fd as usize] = self.conns.len();
                        self.conns.push(CliConn {
                            fd,
                            state: State::Connecting,
                            seq: 0,
                            sent: now,
                            got: 0,
                            buf: [0; MSG],
                            connect_at: Instant::now(),
                            dead: false,
                        });
                        connecting += 1;
                    }
                    Err(e) => {
                        eprintln!("smc-scale client: connect #{g}: {e}");
                        t.connect_errors += 1;
                    }
                }
                next += 1;
            }
            if Instant::now() > setup_deadline {
                eprintln!(
                    "smc-scale client: setup timed out: {} of {n} ready, {connecting} connecting",
                    self.ready
                );
                break;
            }
            let k =
                epoll_wait(self.ep, &mut self.evs, 100).map_err(|e| format!("epoll_wait: {e}"))?;
            for ev in &self.evs[..k] {
                let fd = ev.u64 as RawFd;
                let Some(&i) = self.by_fd.get(fd as usize) else {
                    continue;
                };
                let Some(c) = self.conns.get_mut(i) else {
                    continue;
                };
                if c.dead {
                    continue;
                }
                if c.state == State::Connecting {
                    if ev.events & (libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP) as u32 == 0 {
                        continue;
                    }
                    let mut err: libc::c_int = 0;
                    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
                    // SAFETY: SO_ERROR into a c_int.
                    unsafe {
                        libc::getsockopt(
                            fd,
                            libc::SOL_SOCKET,
                            libc::SO_ERROR,
                            (&mut err as *mut libc::c_int).cast(),
                            &mut len,
                        )
                    };
                    connecting -= 1;
                    if err != 0 {
                        eprintln!(
                            "smc-scale client: connect #{}: {}",
                            self.first + i,
                            io::Error::from_raw_os_error(err)
                        );
                        t.connect_errors += 1;
                        c.dead = true;
                        continue;
                    }
                    let _ = epoll_mod(self.ep, fd, libc::EPOLLIN as u32);
                    send_ping(c, i, t);
                    continue;
                }
                if on_readable(c, i, t).is_some() && c.seq == 1 {
                    self.setup_lat.push(c.connect_at.elapsed());
                    self.ready += 1;
                }
            }
        }
        Ok(())
    }

    /// The connections that ping in the rounds (the first `active` live ones, when given); the
    /// server's pid, asked on the first of them.
    fn choose_live(&mut self, active: Option<usize>) -> Option<u32> {
        let conns = &self.conns;
        let mut live: Vec<usize> = (0..conns.len())
            .filter(|&i| !conns[i].dead && conns[i].state == State::Idle)
            .collect();
        if let Some(k) = active {
            live.truncate(k);
        }
        self.live = live;
        server_pid(
            &mut self.conns,
            &self.live,
            &mut self.t,
            self.ep,
            &mut self.evs,
        )
    }

    /// Rounds: every live connection pings once per interval, spread evenly.
    fn rounds(&mut self, rounds: u32, interval_ms: u64) -> Result<(), String> {
        let interval = Duration::from_millis(interval_ms.max(1));
        let live = &self.live;
        let t = &mut self.t;
        let r0 = Instant::now();
        let total = live.len() as u64 * rounds as u64;
        let mut due_idx = 0u64;
        let end = r0 + interval * rounds;
        loop {
            let now = Instant::now();
            // Pings due by now.
            while due_idx < total {
                let round = due_idx / live.len().max(1) as u64;
                let pos = due_idx % live.len().max(1) as u64;
                let at = r0
                    + interval * round as u32
                    + interval.mul_f64(pos as f64 / live.len().max(1) as f64);
                if at > now {
                    break;
                }
                let i = live[pos as usize];
                let c = &mut self.conns[i];
                if !c.dead {
                    if c.state == State::Waiting {
                        // The previous answer is still out: counted as late, not sent twice.
                        self.late += 1;
                    } else {
                        send_ping(c, i, t);
                        self.sent += 1;
                    }
                }
                due_idx += 1;
            }
            if due_idx >= total && (t.outstanding == 0 || now > end + Duration::from_secs(10)) {
                break;
            }
            let timeout = if due_idx < total {
                1
            } else {
                (end + Duration::from_secs(10))
                    .saturating_duration_since(now)
                    .as_millis()
                    .min(100) as i32
            };
            let k = epoll_wait(self.ep, &mut self.evs, timeout)
                .map_err(|e| format!("epoll_wait: {e}"))?;
            for ev in &self.evs[..k] {
                let fd = ev.u64 as RawFd;
                let Some(&i) = self.by_fd.get(fd as usize) else {
                    continue;
                };
                let Some(c) = self.conns.get_mut(i) else {
                    continue;
                };
                if c.dead {
                    continue;
                }
                if let Some(d) = on_readable(c, i, t) {
                    self.lat.push(d);
                }
            }
        }
        Ok(())
    }

    fn part(&self) -> Part {
        Part {
            ready: self.ready as u64,
            connect_errors: self.t.connect_errors,
            resets: self.t.resets,
            wrong: self.t.wrong,
            answered: self.t.answered,
            unanswered: self.t.outstanding,
            late: self.late,
            sent: self.sent,
            live: self.live.len() as u64,
            setup_lat: self.setup_lat.clone(),
            lat: self.lat.clone(),
        }
    }
}

/// What one client process counted.
#[derive(Default)]
struct Part {
    ready: u64,
    connect_errors: u64,
    resets: u64,
    wrong: u64,
    answered: u64,
    unanswered: u64,
    late: u64,
    sent: u64,
    live: u64,
    setup_lat: Vec<Duration>,
    lat: Vec<Duration>,
}

impl Part {
    fn add(&mut self, o: Part) {
        self.ready += o.ready;
        self.connect_errors += o.connect_errors;
        self.resets += o.resets;
        self.wrong += o.wrong;
        self.answered += o.answered;
        self.unanswered += o.unanswered;
        self.late += o.late;
        self.sent += o.sent;
        self.live += o.live;
        self.setup_lat.extend(o.setup_lat);
        self.lat.extend(o.lat);
    }

    /// As little-endian u64s: the counts, the two lengths, the latencies in nanoseconds.
    fn encode(&self) -> Vec<u8> {
        let mut v = vec![
            self.ready,
            self.connect_errors,
            self.resets,
            self.wrong,
            self.answered,
            self.unanswered,
            self.late,
            self.sent,
            self.live,
            self.setup_lat.len() as u64,
            self.lat.len() as u64,
        ];
        v.extend(self.setup_lat.iter().map(|d| d.as_nanos() as u64));
        v.extend(self.lat.iter().map(|d| d.as_nanos() as u64));
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn decode(fd: RawFd) -> io::Result<Part> {
        let h = read_u64s(fd, 11)?;
        let s = read_u64s(fd, h[9] as usize)?;
        let l = read_u64s(fd, h[10] as usize)?;
        Ok(Part {
            ready: h[0],
            connect_errors: h[1],
            resets: h[2],
            wrong: h[3],
            answered: h[4],
            unanswered: h[5],
            late: h[6],
            sent: h[7],
            live: h[8],
            setup_lat: s.into_iter().map(Duration::from_nanos).collect(),
            lat: l.into_iter().map(Duration::from_nanos).collect(),
        })
    }
}

fn write_all(fd: RawFd, mut b: &[u8]) -> io::Result<()> {
    while !b.is_empty() {
        // SAFETY: b is valid for b.len() bytes.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        b = &b[n as usize..];
    }
    Ok(())
}

fn read_u64s(fd: RawFd, k: usize) -> io::Result<Vec<u64>> {
    let mut b = vec![0u8; k * 8];
    let mut got = 0;
    while got < b.len() {
        match read_fd(fd, &mut b[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(r) => got += r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect())
}

fn pipe() -> Result<(RawFd, RawFd), String> {
    let mut p = [0 as RawFd; 2];
    // SAFETY: pipe2 into a two-element array.
    cvt(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) })
        .map_err(|e| format!("pipe: {e}"))?;
    Ok((p[0], p[1]))
}

fn client(
    port: u16,
    n: usize,
    rounds: u32,
    interval_ms: u64,
    active: Option<usize>,
) -> Result<(), String> {
    let limit = raise_nofile(n as u64 + 256);
    let workers = client_workers(n, limit);
    let dests = destinations(n);
    if workers > 1 {
        return client_workers_run(port, n, rounds, interval_ms, active, workers, dests, limit);
    }
    if limit < n as u64 + 16 {
        return Err(format!(
            "RLIMIT_NOFILE {limit} is too low for {n} connections"
        ));
    }
    let mut cl = Clients::new(port, 0, n, rounds, dests)?;
    if let Some(room) = env::var("SMC_SCALE_MAP_ROOM")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        let eaten = eat_maps(room)?;
        eprintln!("smc-scale client: {eaten} mappings taken, {room} left below vm.max_map_count");
    }
    if let Some(l) = nofile_room() {
        eprintln!("smc-scale client: RLIMIT_NOFILE {l}");
    }
    let t0 = Instant::now();
    cl.setup()?;
    let setup_secs = t0.elapsed().as_secs_f64();
    let me = std::process::id();
    let cpu0 = cpu_ticks(me);
    let srv = cl.choose_live(active).map(server_group).unwrap_or_default();
    let daemon = daemon_pid();
    let cpu_srv0 = group_ticks(&srv);
    let cpu_dmn0 = daemon.map(cpu_ticks);
    let r0 = Instant::now();
    cl.rounds(rounds, interval_ms)?;
    let rounds_secs = r0.elapsed().as_secs_f64();
    let cpu_cli = cpu_ticks(me).saturating_sub(cpu0);
    let cpu_srv = (!srv.is_empty()).then(|| group_ticks(&srv).saturating_sub(cpu_srv0));
    let cpu_dmn = daemon
        .zip(cpu_dmn0)
        .map(|(p, c)| cpu_ticks(p).saturating_sub(c));
    report(
        n,
        cl.part(),
        setup_secs,
        rounds_secs,
        &[me],
        &srv,
        daemon,
        [cpu_cli, cpu_srv.unwrap_or(0), cpu_dmn.unwrap_or(0)],
        [true, cpu_srv.is_some(), cpu_dmn.is_some()],
    )
}

/// N connections over `workers` forked processes: each sets its share up, says so with its
/// server's pid, waits for the others, pings its rounds, sends its figures, and keeps its
/// connections until the memory of all is read.
#[allow(clippy::too_many_arguments)]
fn client_workers_run(
    port: u16,
    n: usize,
    rounds: u32,
    interval_ms: u64,
    active: Option<usize>,
    workers: usize,
    dests: Vec<std::net::Ipv4Addr>,
    limit: u64,
) -> Result<(), String> {
    eprintln!(
        "smc-scale client: {n} connections over {workers} processes, to {} addresses, RLIMIT_NOFILE {limit}",
        dests.len()
    );
    let t0 = Instant::now();
    // (pid, reads from the worker, writes to it)
    let mut kids: Vec<(u32, RawFd, RawFd)> = Vec::new();
    let mut first = 0;
    for w in 0..workers {
        let share = n / workers + usize::from(w < n % workers);
        let (up_r, up_w) = pipe()?;
        let (down_r, down_w) = pipe()?;
        // SAFETY: fork; the child runs its share and exits, never returning here.
        match unsafe { libc::fork() } {
            -1 => return Err(format!("fork: {}", io::Error::last_os_error())),
            0 => {
                die_with_parent();
                for &(_, r, wr) in &kids {
                    close_fd(r);
                    close_fd(wr);
                }
                close_fd(up_r);
                close_fd(down_w);
                let act = active.map(|a| a.saturating_sub(first).min(share));
                let code = match client_worker(
                    port,
                    first,
                    share,
                    rounds,
                    interval_ms,
                    act,
                    dests.clone(),
                    up_w,
                    down_r,
                ) {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("smc-scale client worker {w}: {e}");
                        1
                    }
                };
                std::process::exit(code);
            }
            pid => {
                close_fd(up_w);
                close_fd(down_r);
                kids.push((pid as u32, up_r, down_w));
            }
        }
        first += share;
    }
    let io = |e: io::Error| format!("client worker: {e}");
    // Ready: every share set up.
    let mut srv_pid = None;
    for &(_, r, _) in &kids {
        let h = read_u64s(r, 1).map_err(io)?;
        if h[0] != 0 && srv_pid.is_none() {
            srv_pid = Some(h[0] as u32);
        }
    }
    let setup_secs = t0.elapsed().as_secs_f64();
    let pids: Vec<u32> = std::iter::once(std::process::id())
        .chain(kids.iter().map(|k| k.0))
        .collect();
    let srv = srv_pid.map(server_group).unwrap_or_default();
    let daemon = daemon_pid();
    let cpu0 = group_ticks(&pids);
    let cpu_srv0 = group_ticks(&srv);
    let cpu_dmn0 = daemon.map(cpu_ticks);
    let r0 = Instant::now();
    for &(_, _, wr) in &kids {
        write_all(wr, b"g").map_err(io)?;
    }
    let mut all = Part::default();
    for &(_, r, _) in &kids {
        all.add(Part::decode(r).map_err(io)?);
    }
    let rounds_secs = r0.elapsed().as_secs_f64();
    let cpu_cli = group_ticks(&pids).saturating_sub(cpu0);
    let cpu_srv = (!srv.is_empty()).then(|| group_ticks(&srv).saturating_sub(cpu_srv0));
    let cpu_dmn = daemon
        .zip(cpu_dmn0)
        .map(|(p, c)| cpu_ticks(p).saturating_sub(c));
    let res = report(
        n,
        all,
        setup_secs,
        rounds_secs,
        &pids,
        &srv,
        daemon,
        [cpu_cli, cpu_srv.unwrap_or(0), cpu_dmn.unwrap_or(0)],
        [true, cpu_srv.is_some(), cpu_dmn.is_some()],
    );
    for &(pid, r, wr) in &kids {
        let _ = write_all(wr, b"x");
        close_fd(wr);
        close_fd(r);
        let mut st = 0;
        // SAFETY: waitpid for this process's own child.
        unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    }
    res
}

#[allow(clippy::too_many_arguments)]
fn client_worker(
    port: u16,
    first: usize,
    n: usize,
    rounds: u32,
    interval_ms: u64,
    active: Option<usize>,
    dests: Vec<std::net::Ipv4Addr>,
    up: RawFd,
    down: RawFd,
) -> Result<(), String> {
    let io = |e: io::Error| format!("parent: {e}");
    let mut cl = Clients::new(port, first, n, rounds, dests)?;
    cl.setup()?;
    let srv = cl.choose_live(active);
    write_all(up, &u64::from(srv.unwrap_or(0)).to_le_bytes()).map_err(io)?;
    let mut b = [0u8; 1];
    if read_fd(down, &mut b).map_err(io)? != 1 {
        return Err("parent gone".into());
    }
    cl.rounds(rounds, interval_ms)?;
    write_all(up, &cl.part().encode()).map_err(io)?;
    // Kept until the parent has read the memory figures.
    let _ = read_fd(down, &mut b);
    Ok(())
}

/// The JSON line: the counts of all client processes, the memory of all client (`cli`) and
/// server (`srv`) processes and the daemon.
#[allow(clippy::too_many_arguments)]
fn report(
    n: usize,
    mut p: Part,
    setup_secs: f64,
    rounds_secs: f64,
    cli: &[u32],
    srv: &[u32],
    daemon: Option<u32>,
    cpu: [u64; 3],
    has_cpu: [bool; 3],
) -> Result<(), String> {
    p.lat.sort_unstable();
    p.setup_lat.sort_unstable();
    let (lat, setup_lat) = (&p.lat, &p.setup_lat);
    let me = group_mem(cli);
    let srv = (!srv.is_empty()).then(|| group_mem(srv));
    let dmn = daemon.map(mem_figures);
    let tck = ticks_per_sec();
    let ready = p.ready;
    let mut out = format!(
        "{{\"connections\": {n}, \"established\": {ready}, \"connect_errors\": {}, \
         \"resets\": {}, \"wrong\": {}, \"unanswered\": {}, \"late\": {}, \
         \"pings\": {}, \"answered\": {}, \"setup_secs\": {setup_secs:.3}, \
         \"setup_per_sec\": {:.1}, \"setup_p50_us\": {:.1}, \"setup_p99_us\": {:.1}, \
         \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}, \"rounds_secs\": {rounds_secs:.3}, \
         \"smcd_conns\": {}, \"active\": {}, \"client_cpu_ms\": {:.0}",
        p.connect_errors,
        p.resets,
        p.wrong,
        p.unanswered,
        p.late,
        p.sent,
        p.answered,
        ready as f64 / setup_secs.max(1e-9),
        pct(setup_lat, 0.5),
        pct(setup_lat, 0.99),
        pct(lat, 0.5),
        pct(lat, 0.99),
        lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e6),
        me.smcd_conns,
        p.live,
        cpu[0] as f64 * 1000.0 / tck,
    );
    if cli.len() > 1 || srv.as_ref().is_some_and(|m| m.procs > 1) {
        out.push_str(&format!(
            ", \"client_procs\": {}, \"server_procs\": {}",
            me.procs,
            srv.as_ref().map_or(0, |m| m.procs)
        ));
    }
    for (k, (who, m)) in [
        ("client", Some(&me)),
        ("server", srv.as_ref()),
        ("daemon", dmn.as_ref()),
    ]
    .into_iter()
    .enumerate()
    {
        let Some(m) = m else { continue };
        out.push_str(&format!(
            ", \"{who}_rss_kb\": {}, \"{who}_anon_kb\": {}, \"{who}_shmem_kb\": {}, \
             \"{who}_pss_kb\": {}, \"{who}_fds\": {}, \"{who}_maps\": {}, \"{who}_dmb_maps\": {}",
            m.rss_kb, m.anon_kb, m.shmem_kb, m.pss_kb, m.fds, m.maps, m.dmb_maps
        ));
        if k > 0 && has_cpu[k] {
            out.push_str(&format!(
                ", \"{who}_cpu_ms\": {:.0}",
                cpu[k] as f64 * 1000.0 / tck
            ));
        }
    }
    let per = |x: u64| x as f64 * 1024.0 / n.max(1) as f64;
    let total_kb =
        me.rss_kb + srv.as_ref().map_or(0, |m| m.rss_kb) + dmn.as_ref().map_or(0, |m| m.rss_kb);
    let total_pss =
        me.pss_kb + srv.as_ref().map_or(0, |m| m.pss_kb) + dmn.as_ref().map_or(0, |m| m.pss_kb);
    out.push_str(&format!(
        ", \"rss_bytes_per_conn\": {:.0}, \"pss_bytes_per_conn\": {:.0}}}",
        per(total_kb),
        per(total_pss)
    ));
    let mut so = io::stdout().lock();
    let _ = writeln!(so, "{out}");
    let _ = so.flush();
    Ok(())
}

/// The server's processes: the one that answered `P` and its children (its workers).
fn server_group(pid: u32) -> Vec<u32> {
    let mut v = vec![pid];
    if let Ok(d) = fs::read_dir("/proc") {
        for e in d.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            let stat = fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            // Fields after the name: state, ppid.
            if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
                v.push(p);
            }
        }
    }
    v
}

fn group_ticks(pids: &[u32]) -> u64 {
    pids.iter().map(|&p| cpu_ticks(p)).sum()
}

/// The memory figures of several processes, summed (`smcd_conns`: each one's distinct DMB
/// inodes / 2).
fn group_mem(pids: &[u32]) -> Mem {
    let mut m = Mem::default();
    for &p in pids {
        let f = mem_figures(p);
        m.rss_kb += f.rss_kb;
        m.anon_kb += f.anon_kb;
        m.shmem_kb += f.shmem_kb;
        m.pss_kb += f.pss_kb;
        m.fds += f.fds;
        m.maps += f.maps;
        m.dmb_maps += f.dmb_maps;
        m.dmb_inodes += f.dmb_inodes;
        m.smcd_conns += f.dmb_inodes / 2;
        m.procs += 1;
    }
    m
}

/// Takes memory mappings until only `room` are left below `vm.max_map_count` (one anonymous
/// region whose every other page is made inaccessible: one mapping per page), so that the
/// mappings of connections run out as they would with many more connections. Never freed.
fn eat_maps(room: u64) -> Result<u64, String> {
    let max: u64 = fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .ok_or("no vm.max_map_count")?;
    let have = fs::read_to_string("/proc/self/maps")
        .map_err(|e| format!("/proc/self/maps: {e}"))?
        .lines()
        .count() as u64;
    let eat = max.saturating_sub(have + room);
    if eat == 0 {
        return Ok(0);
    }
    let pages = eat as usize; // `eat` VMAs: pages alternate PROT_READ / PROT_NONE
                              // SAFETY: a fresh private anonymous region chosen by the kernel; only its protections are
                              // changed afterwards and it is never accessed.
    unsafe {
        let len = pages * 4096;
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(format!("mmap: {}", io::Error::last_os_error()));
        }
        for i in (1..pages).step_by(2) {
            if libc::mprotect(p.cast::<u8>().add(i * 4096).cast(), 4096, libc::PROT_NONE) != 0 {
                break;
            }
        }
    }
    Ok(eat)
}

/// Asks the server for its pid on the first live connection (a `P` message).
fn server_pid(
    conns: &mut [CliConn],
    live: &[usize],
    t: &mut Tally,
    ep: RawFd,
    evs: &mut [libc::epoll_event],
) -> Option<u32> {
    let &i = live.first()?;
    let fd = conns[i].fd;
    let mut m = [0u8; MSG];
    m[0] = b'P';
    if write_fd(fd, &m).ok()? != MSG {
        return None;
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < MSG && Instant::now() < deadline {
        let k = epoll_wait(ep, evs, 100).ok()?;
        let _ = k;
        let mut b = [0u8; MSG];
        match read_fd(fd, &mut b[..MSG - got.len()]) {
            Ok(0) => {
                kill(&mut conns[i], t);
                return None;
            }
            Ok(r) => got.extend_from_slice(&b[..r]),
            Err(_) => {}
        }
    }
    let s = std::str::from_utf8(got.get(1..)?).ok()?;
    s.trim().parse().ok()
}

/// The daemon's pid: `SO_PEERCRED` of a connection to `$SMC_CTL_SOCK`.
fn daemon_pid() -> Option<u32> {
    let path = env::var_os("SMC_CTL_SOCK")?;
    let s = std::os::unix::net::UnixStream::connect(&path)
        .ok()
        .or_else(|| {
            // The daemon's socket is SOCK_SEQPACKET.
            seqpacket_connect(&path)
        })?;
    use std::os::fd::AsRawFd as _;
    peer_pid(s.as_raw_fd())
}

fn seqpacket_connect(path: &std::ffi::OsStr) -> Option<std::os::unix::net::UnixStream> {
    use std::os::{fd::FromRawFd as _, unix::ffi::OsStrExt as _};
    let b = path.as_bytes();
    // SAFETY: sockaddr_un is plain data; the path fits (checked); the descriptor is owned by the
    // returned stream.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let s = std::os::unix::net::UnixStream::from_raw_fd(fd);
        let mut sa: libc::sockaddr_un = mem::zeroed();
        sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
        if b.len() >= sa.sun_path.len() {
            return None;
        }
        for (d, s) in sa.sun_path.iter_mut().zip(b) {
            *d = *s as libc::c_char;
        }
        if libc::connect(
            fd,
            (&sa as *const libc::sockaddr_un).cast(),
            mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ) != 0
        {
            return None;
        }
        Some(s)
    }
}

fn peer_pid(fd: RawFd) -> Option<u32> {
    // SAFETY: SO_PEERCRED into a ucred.
    unsafe {
        let mut cr: libc::ucred = mem::zeroed();
        let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
        if libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cr as *mut libc::ucred).cast(),
            &mut len,
        ) != 0
            || cr.pid <= 0
        {
            return None;
        }
        Some(cr.pid as u32)
    }
}

fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// utime + stime of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may contain spaces), from `state` (field 3).
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let g = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    g(11) + g(12)
}

#[derive(Default)]
struct Mem {
    rss_kb: u64,
    anon_kb: u64,
    shmem_kb: u64,
    pss_kb: u64,
    fds: u64,
    maps: u64,
    dmb_maps: u64,
    dmb_inodes: u64,
    /// Summed over processes ([`group_mem`]).
    smcd_conns: u64,
    procs: u64,
}

fn kb_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mem_figures(pid: u32) -> Mem {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rollup = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let maps = fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut inodes = HashSet::new();
    let mut dmb_maps = 0;
    for l in maps.lines().filter(|l| l.contains("memfd:smc-dmb")) {
        dmb_maps += 1;
        if let Some(ino) = l.split_whitespace().nth(4) {
            inodes.insert(ino.to_string());
        }
    }
    Mem {
        rss_kb: kb_field(&status, "VmRSS:"),
        anon_kb: kb_field(&status, "RssAnon:"),
        shmem_kb: kb_field(&status, "RssShmem:"),
        pss_kb: kb_field(&rollup, "Pss:"),
        fds: fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64),
        maps: maps.lines().count() as u64,
        dmb_maps,
        dmb_inodes: inodes.len() as u64,
        smcd_conns: inodes.len() as u64 / 2,
        procs: 1,
    }
}
