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
        ["server", port] => server(num(port)),
        ["client", port, n, rounds] => client(num(port), num(n), num(rounds), 1000, None),
        ["client", port, n, rounds, ms] => client(num(port), num(n), num(rounds), num(ms), None),
        ["client", port, n, rounds, ms, active] => {
            client(num(port), num(n), num(rounds), num(ms), Some(num(active)))
        }
        _ => {
            eprintln!("usage: smc-scale server PORT | client PORT N ROUNDS [INTERVAL_MS [ACTIVE]]");
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

fn sockaddr(port: u16) -> libc::sockaddr_in {
    // SAFETY: sockaddr_in is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_in = unsafe { mem::zeroed() };
    sa.sin_family = libc::AF_INET as libc::sa_family_t;
    sa.sin_port = port.to_be();
    sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
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

fn server(port: u16) -> Result<(), String> {
    let limit = raise_nofile(1 << 20);
    let e = |what: &str| {
        let err = io::Error::last_os_error();
        format!("{what}: {err}")
    };
    // SAFETY: plain socket calls on a descriptor this function owns.
    let (lfd, ep) = unsafe {
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
        let sa = sockaddr(port);
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
        let ep = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        if ep < 0 {
            return Err(e("epoll_create1"));
        }
        (lfd, ep)
    };
    let limit = nofile_room().unwrap_or(limit);
    eprintln!("smc-scale server: port {port}, RLIMIT_NOFILE {limit}");
    epoll_add(ep, lfd, libc::EPOLLIN as u32).map_err(|e| format!("epoll_ctl: {e}"))?;
    let mut conns: Vec<Option<SrvConn>> = Vec::new();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let pid = std::process::id();
    let mut buf = [0u8; 4096];
    let mut emfile = 0u64;
    loop {
        let n = epoll_wait(ep, &mut evs, -1).map_err(|e| format!("epoll_wait: {e}"))?;
        for ev in &evs[..n] {
            let fd = ev.u64 as RawFd;
            let events = ev.events;
            if fd == lfd {
                loop {
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
                    if let Err(err) = epoll_add(ep, c, libc::EPOLLIN as u32) {
                        eprintln!("smc-scale server: epoll_ctl add: {err}");
                        conns[i] = None;
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

fn connect_one(ep: RawFd, port: u16) -> io::Result<RawFd> {
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = cvt(libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        ))?;
        let sa = sockaddr(port);
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

fn client(
    port: u16,
    n: usize,
    rounds: u32,
    interval_ms: u64,
    active: Option<usize>,
) -> Result<(), String> {
    let limit = raise_nofile(n as u64 + 256);
    if limit < n as u64 + 16 {
        return Err(format!(
            "RLIMIT_NOFILE {limit} is too low for {n} connections"
        ));
    }
    // SAFETY: plain epoll_create1.
    let ep = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })
        .map_err(|e| format!("epoll_create1: {e}"))?;
    let now = Instant::now();
    let mut conns: Vec<CliConn> = Vec::with_capacity(n);
    // Descriptor → connection index.
    let mut by_fd: Vec<usize> = Vec::new();
    let mut t = Tally::default();
    let mut setup_lat = Vec::with_capacity(n);
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    by_fd.reserve(n + 1024);
    let mut lat = Vec::with_capacity(n * rounds as usize);
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

    // Setup: connect, first ping answered.
    let t0 = Instant::now();
    let mut next = 0usize;
    let mut connecting = 0usize;
    let mut ready = 0usize;
    let setup_deadline = t0 + Duration::from_secs(60 + n as u64 / 100);
    while ready + ((t.connect_errors + t.resets) as usize) < n {
        while next < n && connecting < MAX_CONNECTING {
            match connect_one(ep, port) {
                Ok(fd) => {
                    if by_fd.len() <= fd as usize {
                        by_fd.resize(fd as usize + 1, usize::MAX);
                    }
                    by_fd[fd as usize] = conns.len();
                    conns.push(CliConn {
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
                    eprintln!("smc-scale client: connect #{next}: {e}");
                    t.connect_errors += 1;
                }
            }
            next += 1;
        }
        if Instant::now() > setup_deadline {
            eprintln!(
                "smc-scale client: setup timed out: {ready} of {n} ready, {connecting} connecting"
            );
            break;
        }
        let k = epoll_wait(ep, &mut evs, 100).map_err(|e| format!("epoll_wait: {e}"))?;
        for ev in &evs[..k] {
            let fd = ev.u64 as RawFd;
            let Some(&i) = by_fd.get(fd as usize) else {
                continue;
            };
            let Some(c) = conns.get_mut(i) else { continue };
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
                        "smc-scale client: connect #{i}: {}",
                        io::Error::from_raw_os_error(err)
                    );
                    t.connect_errors += 1;
                    c.dead = true;
                    continue;
                }
                let _ = epoll_mod(ep, fd, libc::EPOLLIN as u32);
                send_ping(c, i, &mut t);
                continue;
            }
            if on_readable(c, i, &mut t).is_some() && c.seq == 1 {
                setup_lat.push(c.connect_at.elapsed());
                ready += 1;
            }
        }
    }
    let setup_secs = t0.elapsed().as_secs_f64();

    // Rounds: every live connection (the first `active` of them) pings once per interval,
    // spread evenly.
    let interval = Duration::from_millis(interval_ms.max(1));
    let mut sent = 0u64;
    let mut late = 0u64;
    let mut live: Vec<usize> = (0..conns.len())
        .filter(|&i| !conns[i].dead && conns[i].state == State::Idle)
        .collect();
    if let Some(k) = active {
        live.truncate(k);
    }
    let cpu0 = [cpu_ticks(std::process::id())];
    let srv_pid = server_pid(&mut conns, &live, &mut t, ep, &mut evs);
    let daemon = daemon_pid();
    let cpu_srv0 = srv_pid.map(cpu_ticks);
    let cpu_dmn0 = daemon.map(cpu_ticks);
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
            let c = &mut conns[i];
            if !c.dead {
                if c.state == State::Waiting {
                    // The previous answer is still out: counted as late, not sent twice.
                    late += 1;
                } else {
                    send_ping(c, i, &mut t);
                    sent += 1;
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
        let k = epoll_wait(ep, &mut evs, timeout).map_err(|e| format!("epoll_wait: {e}"))?;
        for ev in &evs[..k] {
            let fd = ev.u64 as RawFd;
            let Some(&i) = by_fd.get(fd as usize) else {
                continue;
            };
            let Some(c) = conns.get_mut(i) else { continue };
            if c.dead {
                continue;
            }
            if let Some(d) = on_readable(c, i, &mut t) {
                lat.push(d);
            }
        }
    }
    let rounds_secs = r0.elapsed().as_secs_f64();
    let unanswered = t.outstanding;
    let cpu_cli = cpu_ticks(std::process::id()).saturating_sub(cpu0[0]);
    let cpu_srv = srv_pid
        .zip(cpu_srv0)
        .map(|(p, c)| cpu_ticks(p).saturating_sub(c));
    let cpu_dmn = daemon
        .zip(cpu_dmn0)
        .map(|(p, c)| cpu_ticks(p).saturating_sub(c));
    lat.sort_unstable();
    setup_lat.sort_unstable();

    let me = mem_figures(std::process::id());
    let srv = srv_pid.map(mem_figures);
    let dmn = daemon.map(mem_figures);
    let tck = ticks_per_sec();
    let mut out = format!(
        "{{\"connections\": {n}, \"established\": {ready}, \"connect_errors\": {}, \
         \"resets\": {}, \"wrong\": {}, \"unanswered\": {unanswered}, \"late\": {late}, \
         \"pings\": {sent}, \"answered\": {}, \"setup_secs\": {setup_secs:.3}, \
         \"setup_per_sec\": {:.1}, \"setup_p50_us\": {:.1}, \"setup_p99_us\": {:.1}, \
         \"p50_us\": {:.1}, \"p99_us\": {:.1}, \"max_us\": {:.1}, \"rounds_secs\": {rounds_secs:.3}, \
         \"smcd_conns\": {}, \"active\": {}, \"client_cpu_ms\": {:.0}",
        t.connect_errors,
        t.resets,
        t.wrong,
        t.answered,
        ready as f64 / setup_secs.max(1e-9),
        pct(&setup_lat, 0.5),
        pct(&setup_lat, 0.99),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e6),
        me.dmb_inodes / 2,
        live.len(),
        cpu_cli as f64 * 1000.0 / tck,
    );
    for (who, m, cpu) in [
        ("client", Some(&me), None),
        ("server", srv.as_ref(), cpu_srv),
        ("daemon", dmn.as_ref(), cpu_dmn),
    ] {
        let Some(m) = m else { continue };
        out.push_str(&format!(
            ", \"{who}_rss_kb\": {}, \"{who}_anon_kb\": {}, \"{who}_shmem_kb\": {}, \
             \"{who}_pss_kb\": {}, \"{who}_fds\": {}, \"{who}_maps\": {}, \"{who}_dmb_maps\": {}",
            m.rss_kb, m.anon_kb, m.shmem_kb, m.pss_kb, m.fds, m.maps, m.dmb_maps
        ));
        if let Some(c) = cpu {
            out.push_str(&format!(
                ", \"{who}_cpu_ms\": {:.0}",
                c as f64 * 1000.0 / tck
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
    }
}
