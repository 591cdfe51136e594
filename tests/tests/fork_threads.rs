//! `fork` in a threaded process under the data path (issue 12 item 7): while several threads
//! run SMC-D handshakes and connections back to back, the main thread forks 216 children, 16
//! of them while the loopback-ism daemon is stopped (SIGSTOP), so that threads are waiting for
//! it at the fork. Every child makes one connection through the library and exits: none may
//! hang (a lock held by a thread of the parent is never released in the child), and every
//! byte of every connection is exact; no connection fails.
//!
//! The stress runs the same storm harder: more threads, short connections (mostly handshakes)
//! over the smallest DMBs (the cursors wrap), busy loops in the test's cgroup, six daemon
//! stops (each lasts until 8 children got through it, longer than the daemon client's
//! timeout), and children that first close every descriptor they inherited (the threads' SMC
//! connections among them, as a program about to `exec` does).
//!
//! Shared connection: a process and the children it forks meanwhile read one SMC-D connection
//! at once (TCP semantics: every byte goes to exactly one reader), children leaving after a
//! few reads, busy loops in the cgroup, 16 KiB rings.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{io::Write as _, process::Stdio, time::Duration};

use integration_tests::{
    bin, free_port, spawn_logged, spawn_piped, wait_listening, Proc, SmcWorld,
};

fn field(out: &str, key: &str) -> u64 {
    out.split_whitespace()
        .find_map(|t| t.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {out:?}"))
}

/// The daemon continues when this is dropped (it must not stay stopped after a failure).
struct Cont(libc::pid_t);

impl Drop for Cont {
    fn drop(&mut self) {
        // SAFETY: plain kill of our own daemon.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// Runs `preload-prog storm` with `args` (after HOST PORT; `stops` stop phases) against a
/// thread-per-connection server of `w`, stopping the daemon during each stop phase, and checks
/// that every child and every thread's connection was exact and that no child hung, and that
/// each child went through the data path (one client decision of its own).
fn storm(w: &SmcWorld, env: &[(&str, &str)], args: &[&str], stops: usize, forks: u64) {
    let port = free_port();
    let log = w.dir.join("logs/server.log");
    let mut s = w.run(bin("preload-prog"));
    s.args(["server", &port.to_string(), "thread"])
        .envs(env.iter().copied());
    let mut srv = spawn_logged(s, &log);
    wait_listening(
        &mut srv,
        port,
        Duration::from_secs(30),
        "server",
        Some(&log),
    );
    let mut c = w.run(bin("preload-prog"));
    c.args(["storm", "127.0.0.1", &port.to_string()])
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::piped());
    let mut storm = spawn_piped(c);
    let storm_pid = storm.0.id();
    let daemon = w.daemon_pid() as libc::pid_t;
    let _cont = Cont(daemon);
    let mut stdin = storm.0.stdin.take().expect("storm stdin");
    for _ in 0..stops {
        for (want, sig) in [("PHASE stop", libc::SIGSTOP), ("PHASE cont", libc::SIGCONT)] {
            let line = storm.read_line();
            assert_eq!(line.trim(), want, "storm said {line:?}");
            // SAFETY: plain kill of our own daemon.
            assert_eq!(unsafe { libc::kill(daemon, sig) }, 0);
            stdin.write_all(b"go\n").expect("tell the storm");
        }
    }
    let out = storm.wait_output(Duration::from_secs(600)).expect("storm");
    eprintln!("{out}");
    assert_eq!(field(&out, "forks"), forks, "{out}");
    assert_eq!(field(&out, "hung"), 0, "children hung after fork: {out}");
    assert_eq!(field(&out, "bad"), 0, "children with wrong bytes: {out}");
    assert_eq!(
        field(&out, "reset"),
        0,
        "children whose connection failed: {out}"
    );
    assert_eq!(field(&out, "ok"), forks, "{out}");
    assert_eq!(
        field(&out, "badconns"),
        0,
        "threads with wrong bytes: {out}"
    );
    assert_eq!(
        field(&out, "resetconns"),
        0,
        "threads whose connection failed: {out}"
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

#[test]
fn fork_storm_while_threads_handshake_and_the_daemon_stalls() {
    let w = SmcWorld::new();
    storm(&w, &[], &["4", "200", "65536"], 1, 200 + 16);
}

#[test]
fn fork_stress_with_daemon_stalls_busy_cpus_small_rings_and_closing_children() {
    let w = SmcWorld::new();
    // Busy loops in the test's cgroup: threads and children are preempted anywhere.
    let hogs = hogs(&w, 2);
    storm(
        &w,
        // 16 KiB rings: the 20 000 bytes of a connection wrap the cursors.
        &[("SMC_DMB_SIZE", "16384")],
        &[
            "8",
            "240",
            "20000",
            "stops=6",
            "stop_children=8",
            "close=1",
            "ballast=256",
        ],
        6,
        240 + 6 * 8,
    );
    drop(hogs);
}

/// Busy loops in `w`'s cgroup (killed when dropped): the test's processes are preempted
/// anywhere.
fn hogs(w: &SmcWorld, n: usize) -> Vec<Proc> {
    (0..n)
        .map(|_| {
            let mut c = w.cgroup().command("sh");
            c.args(["-c", "while :; do :; done"]);
            spawn_piped(c)
        })
        .collect()
}

#[test]
fn parent_and_forked_children_read_one_connection_each_byte_once() {
    let w = SmcWorld::new();
    let _hogs = hogs(&w, 2);
    let env = [("SMC_DMB_SIZE", "16384")];
    let port = free_port();
    let log = w.dir.join("logs/server.log");
    let mut s = w.run(bin("preload-prog"));
    s.args(["server", &port.to_string(), "thread", "1"])
        .envs(env);
    let mut srv = spawn_logged(s, &log);
    wait_listening(
        &mut srv,
        port,
        Duration::from_secs(30),
        "server",
        Some(&log),
    );
    let total: u64 = 48 << 20;
    let mut c = w.run(bin("preload-prog"));
    c.args([
        "share",
        "127.0.0.1",
        &port.to_string(),
        &total.to_string(),
        "4",
    ])
    .envs(env);
    let share = spawn_piped(c);
    let share_pid = share.0.id();
    let out = share.wait_output(Duration::from_secs(300)).expect("share");
    eprintln!("{out}");
    assert_eq!(field(&out, "total"), total, "{out}");
    assert_eq!(field(&out, "dup"), 0, "bytes read twice: {out}");
    assert_eq!(
        field(&out, "bad"),
        0,
        "chunks that are not the stream: {out}"
    );
    assert_eq!(field(&out, "read"), total, "bytes read in all: {out}");
    assert_eq!(
        field(&out, "holes"),
        field(&out, "small"),
        "bytes never read: {out}"
    );
    assert!(field(&out, "forks") >= 50, "{out}");
    // The connection was SMC-D (not a fallback, where the kernel shares the socket).
    let st = w.stats_of(share_pid, "the reading process");
    assert_eq!(st.get("smcd_client"), 1, "{st:?}");
}

/// Two threads keep using an epoll set that watches an SMC-D connection (waits and `EPOLL_CTL_MOD`)
/// while the main thread forks 100 children, each of which uses its copy of the set once and
/// exits. Prints how many children did not exit within 3 s (killed then).
const EPOLL_FORK: &str = r#"
import os, select, socket, sys, threading, time
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(8)
c = socket.create_connection(ls.getsockname()); s, _ = ls.accept()
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
stop = False
turns = [0, 0]
def churn(k):
    try:
        while not stop:
            ep.poll(0)
            ep.modify(s.fileno(), select.EPOLLIN | select.EPOLLOUT)
            ep.modify(s.fileno(), select.EPOLLIN)
            turns[k] += 1
    except Exception as e:
        print("churn", k, repr(e), flush=True)
ths = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
for t in ths:
    t.start()
hung = 0
for i in range(100):
    pid = os.fork()
    if pid == 0:
        ep.poll(0)
        ep.modify(s.fileno(), select.EPOLLIN)
        os._exit(0)
    t = time.time()
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.time() - t > 3:
            hung += 1
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
stop = True
for t in ths:
    t.join()
c.sendall(b"x")
print("hung", hung, "read", s.recv(1), "busy", min(turns) > 100, flush=True)
print(turns, file=sys.stderr)
"#;

/// A forked child uses the epoll set its parent's threads were busy with at the fork (red team
/// round 15, finding 8: the set's lock, held by one of those threads at the fork, stayed held
/// in the child for ever: 31 of 100 children hung; over TCP none). The forking thread now holds
/// every set's lock across the fork.
#[test]
fn forked_children_use_an_epoll_set_their_parents_threads_were_busy_with() {
    let w = SmcWorld::new();
    let mut c = w.run("python3");
    c.args(["-c", EPOLL_FORK]);
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(400))
        .expect("epoll fork program");
    assert_eq!(out.trim(), "hung 0 read b'x' busy True", "{out}");
    let s = w.stats_sum();
    assert!(s.get("smcd_client") >= 1, "not SMC-D: {s:?}");
}

/// `fork` from a signal handler (`SIGALRM` every 200 µs) while the process makes 2000
/// connections to its own listener: the handler interrupts connects, accepts and the library
/// inside them. Every connection exact and SMC-D, every child gone, as over TCP (before: the
/// handler's `fork` drove the handshake under way, whose server was the very accept it
/// interrupted or whose daemon request the interrupted code held: 3 of 3 runs hung).
#[test]
fn fork_from_a_signal_handler_while_connecting_hangs_nothing() {
    let w = SmcWorld::new();
    let mut c = w.run(bin("preload-prog"));
    c.args(["sigfork", "2000"]);
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(120))
        .expect("preload-prog sigfork");
    // Every child only calls `_exit(0)`: one the library's `fork` left a damaged heap aborts
    // in glibc's checks (~100 of 300 did while `fork` allocated).
    assert_eq!(
        out.trim(),
        "SIGFORK conns=2000 forks=yes badchildren=0",
        "{out}"
    );
    let s = w.stats_sum();
    assert_eq!(s.get("smcd_client"), 2000, "{s:?}");
}

/// A `SIGALRM` handler that changes an entry of the epoll set (`epoll_ctl` MOD, every 200 µs)
/// while the program waits on that set for its other connection, round after round: the handler
/// interrupts the library's epoll emulation anywhere. It hung for ever (3 of 3 runs) when the
/// handler came while the emulation held the set's lock (the handler's `epoll_ctl` waited for its
/// own thread); the lock now defers handlers as the library's other locks do. TCP: 20 000 rounds.
#[test]
fn epoll_ctl_from_a_signal_handler_during_epoll_waits_hangs_nothing() {
    let w = SmcWorld::new();
    let mut c = w.run(bin("preload-prog"));
    c.args(["sigepoll", "20000"]);
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(120))
        .expect("preload-prog sigepoll");
    assert_eq!(out.trim(), "SIGEPOLL rounds=20000 handled=yes", "{out}");
    let s = w.stats_sum();
    assert_eq!(s.get("smcd_client"), 2, "{s:?}");
}

/// A `SIGALRM` handler that says goodbye on an SMC-D connection and closes it (`close`, `dup2`
/// of /dev/null over it, `close_range` of it; or forks a child that execs `/bin/true` with the
/// connections left, then closes), every 200 µs through 100 connections, while the main code
/// only allocates and frees: the handler lands inside `malloc`, whose state is half updated (a
/// single-threaded process) or whose arena lock is held (an idle second thread). Every
/// connection carries exactly `BYE\n` then EOF, before the process calls the library again,
/// every child exits 0 and the process ends, as over TCP (red team `sigsafe`: the library's
/// close allocated and freed inside the handler, the process aborted in glibc's heap checks in
/// every run, and with a second thread hung for ever on the arena lock; the forked children's
/// fork handler allocated a lock, 1-18 of 50 children aborted; a close while another thread
/// was blocked in `recv` on the connection hung on the arena lock, 1 of 2 runs; with the
/// connections in an epoll set the main code waits on, the handler's goodbye waited for ever for
/// the set's lock the interrupted `epoll_wait` held, 4 of 4; then the set reported the closed
/// numbers' EOF until the next call that was not a wait, and with a second thread a handler's
/// close there could wait for the set's member list held by a thread waiting for `malloc`).
#[test]
fn closes_from_a_signal_handler_inside_malloc_keep_the_heap_sound() {
    let cases = [
        ("close", ""),
        ("dup2", ""),
        ("close_range", ""),
        ("close", "mt"),
        ("dup2", "mt"),
        ("close_range", "mt"),
        // Single-threaded only: with a second thread glibc's own `fork` waits for the arena
        // lock the interrupted `malloc` holds (over TCP too).
        ("fork_exec", ""),
        // Each close while another thread's `recv` is under way on the connection (50 threads).
        ("close_inflight", ""),
        // The connections in an epoll set the main code also waits on: the handler comes
        // inside our `epoll_wait` too.
        ("close", "epoll"),
        ("dup2", "mt+epoll"),
        ("close", "mt+epoll"),
    ];
    let n = |mode: &str| if mode == "close_inflight" { 50 } else { 100 };
    let want = |n: u64| format!("SIGCLOSE handled={n} failed=0 exact={n} badchildren=0");
    // Plain TCP first: the expected output.
    for mode in ["close", "close_inflight"] {
        let mut c = std::process::Command::new(bin("preload-prog"));
        c.args(["sigclose", &n(mode).to_string(), mode, "mt"]);
        let out = spawn_piped(c)
            .wait_output(Duration::from_secs(60))
            .expect("preload-prog sigclose over TCP");
        assert_eq!(out.trim(), want(n(mode)), "TCP {mode}: {out}");
    }
    let w = SmcWorld::new();
    for (mode, mt) in cases {
        let mut c = w.run(bin("preload-prog"));
        c.args(["sigclose", &n(mode).to_string(), mode, mt]);
        let out = spawn_piped(c)
            .wait_output(Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("sigclose {mode} {mt}: {e}"));
        assert_eq!(out.trim(), want(n(mode)), "sigclose {mode} {mt}: {out}");
    }
    let s = w.stats_sum();
    let conns: u64 = cases.iter().map(|(m, _)| n(m)).sum();
    assert_eq!(s.get("smcd_client"), conns, "{s:?}");
}

/// Red team round 17's probe (`tests/redteam/sigsafe.c`, built here with the C compiler that
/// links Rust): a `SIGALRM` every few hundred µs whose handler works on the next of K
/// connections while the main code churns `malloc`/`free`, so the handler lands inside
/// `malloc`. `sendonly` with non-blocking connects not waited for (`NB=1 NBX=1`): the handler's
/// `send` drives the handshake, which allocates; `execnolibonly`: the handler forks a child that
/// execs an image without the library with the connections open, which switches them to TCP,
/// and the parent's next handler `send` continues on TCP. Before the library's allocations in
/// handlers came from its own arenas (`util::handler_alloc`), the process aborted in glibc's
/// heap checks (`corrupted double-linked list`, 2 runs of 2 each) or, with an idle second
/// thread, hung; the children's exec counted the open descriptors with `opendir` (`malloc`)
/// and aborted (1 to 7 of 50). Same output as over TCP.
#[test]
fn handshakes_and_exec_switches_from_a_signal_handler_inside_malloc_keep_the_heap_sound() {
    let w = SmcWorld::new();
    let exe = w.subdir("c").join("sigsafe");
    let src = concat!(env!("CARGO_MANIFEST_DIR"), "/redteam/sigsafe.c");
    let cc = std::process::Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .args([src, "-lpthread"])
        .output()
        .expect("cc (the C compiler Rust links with)");
    assert!(cc.status.success(), "cc sigsafe.c: {cc:?}");
    type Env = &'static [(&'static str, &'static str)];
    let cases: [(&str, &str, &str, Env); 3] = [
        ("sendonly", "100", "200", &[("NB", "1"), ("NBX", "1")]),
        (
            "sendonly",
            "100",
            "200",
            &[("NB", "1"), ("NBX", "1"), ("MT", "1")],
        ),
        ("execnolibonly", "50", "300", &[]),
    ];
    for (scen, k, us, env) in cases {
        let run = |smc: bool| -> String {
            let port = free_port().to_string();
            let mut c = w.run_or_plain(smc, &exe);
            c.args([port.as_str(), scen, k, us])
                .envs(env.iter().copied());
            let out = spawn_piped(c)
                .wait_output(Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("sigsafe {scen} {env:?} smc={smc}: {e}"));
            let mut lines: Vec<&str> = out
                .lines()
                .filter(|l| l.starts_with("server:") || l.starts_with("client:"))
                .collect();
            lines.sort();
            lines.join("\n")
        };
        let tcp = run(false);
        assert!(
            tcp.contains(&format!("exactly4={k}")) && tcp.contains("badkids=0"),
            "{scen} {env:?} over TCP: {tcp}"
        );
        assert_eq!(run(true), tcp, "{scen} {env:?}: library against TCP");
    }
}

/// A child made with the raw `clone` system call (past the library's `fork`, so no fork
/// handler runs and it keeps its parent's cached pid and daemon connection), while its parent
/// goes on: each makes 100 connections to a forked echo server. Prints the failed ones of each.
const RAW_CLONE: &str = r#"
import ctypes, os, platform, socket
libc = ctypes.CDLL(None, use_errno=True)
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64); port = ls.getsockname()[1]
srv = os.fork()
if srv == 0:
    while True:
        c, _ = ls.accept()
        try:
            c.sendall(c.recv(64))
        except OSError:
            pass
        c.close()
ls.close()
def conns(n):
    bad = 0
    for i in range(n):
        try:
            with socket.create_connection(("127.0.0.1", port)) as c:
                c.sendall(b"hello %d" % i)
                if c.recv(64) != b"hello %d" % i:
                    bad += 1
        except OSError:
            bad += 1
    return bad
conns(3)
# clone(SIGCHLD, 0, ...): a fork by the system call, which the library does not see.
nr = {"x86_64": 56, "aarch64": 220}[platform.machine()]
pid = libc.syscall(nr, 17, 0, 0, 0, 0)
if pid == 0:
    os._exit(min(conns(100), 100))
bad = conns(100)
_, st = os.waitpid(pid, 0)
os.kill(srv, 9)
os.waitpid(srv, 0)
print("parent bad", bad, "child bad", os.waitstatus_to_exitcode(st))
"#;

/// Red team round 15, finding 10: a child of a raw `clone` shared its parent's daemon
/// connection, their requests and replies interleaved (98 and 99 of 100 connections failed,
/// the server reset). Now such a process asks the daemon nothing and does not announce SMC
/// (its connections are plain TCP), and the parent's stay SMC-D, every byte exact as over TCP.
#[test]
fn a_child_of_a_raw_clone_does_not_share_its_parents_daemon_connection() {
    let w = SmcWorld::new();
    let mut c = w.run("python3");
    // Every connection SMC-D (the policy would keep the short ones on TCP).
    c.env("SMC_SHORT_BYTES", "0");
    c.args(["-c", RAW_CLONE]);
    let out = spawn_piped(c)
        .wait_output(Duration::from_secs(120))
        .expect("raw clone program");
    assert_eq!(out.trim(), "parent bad 0 child bad 0", "{out}");
    let s = w.stats_sum();
    // The parent's 103 connections, both ends in this world.
    assert!(s.get("smcd_client") >= 103, "{s:?}");
}

/// A thread's connection in its handshake (its server accepts 1 s late) while the main thread
/// forks, 5 times; the child peeks at that connection once (without waiting) and closes
/// its copy. `connect`: the thread is inside its `connect`/first write, driving the handshake;
/// `idle`: it connected and sleeps, nobody drives it. Prints the forks that took over 100 ms,
/// the children not gone within 5 s and the thread's connections not echoed exact; the
/// slowest fork on stderr.
const FORK_DURING_HANDSHAKE: &str = r#"
import os, socket, sys, threading, time
mode = sys.argv[1]; rounds = int(sys.argv[2]); delay = float(sys.argv[3])
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(64); port = ls.getsockname()[1]
srv = os.fork()
if srv == 0:
    def echo(c):
        while True:
            d = c.recv(4096)
            if not d: break
            c.sendall(d)
        c.close()
    while True:
        time.sleep(delay)  # accept late: the client's handshake waits for it
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()
ls.close()
slow = hung = bad = 0; worst = 0.0
for r in range(rounds):
    s = socket.socket()
    res = []
    def client():
        try:
            if mode == "idle":
                # A non-blocking connect left alone: nobody drives its handshake.
                s.setblocking(False); s.connect_ex(("127.0.0.1", port))
                time.sleep(0.6)
                s.setblocking(True)
            else:
                s.connect(("127.0.0.1", port))
            msg = b"round %d " % r * 100
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                d = s.recv(65536)
                if not d: break
                got += d
            res.append(got == msg)
        except OSError as e:
            res.append(False)
    th = threading.Thread(target=client); th.start()
    time.sleep(0.2)
    t = time.monotonic()
    pid = os.fork()
    if pid == 0:
        # The child leaves the connection to its parent: one peek, then closes its copy.
        try:
            s.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK)
        except OSError:
            pass
        s.close()
        os._exit(0)
    ms = (time.monotonic() - t) * 1000
    worst = max(worst, ms)
    if ms > 1000: slow += 1
    t = time.monotonic()
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() - t > 5:
            hung += 1; os.kill(pid, 9); os.waitpid(pid, 0); break
        time.sleep(0.01)
    th.join(10)
    if th.is_alive() or res != [True]: bad += 1
    s.close()
os.kill(srv, 9); os.waitpid(srv, 0)
print("rounds", rounds, "slow_forks", slow, "hung_children", hung, "bad_conns", bad, flush=True)
print("worst fork ms %.1f" % worst, file=sys.stderr)
"#;

/// Runs [`FORK_DURING_HANDSHAKE`] in `mode` with the library (`w`) or as plain TCP.
fn fork_during_handshake(w: &SmcWorld, mode: &str, smc: bool) -> (String, String) {
    let mut c = if smc {
        // The client waits for its late server's Accept (2 s) instead of declining after
        // `SMC_ACCEPT_WAIT_MS` (100 ms), so that the fork finds its handshake under way.
        let mut c = w.run("python3");
        c.env("SMC_ACCEPT_WAIT_MS", "4000")
            .env("SMC_CLC_TIMEOUT_MS", "4000");
        c
    } else {
        let mut c = std::process::Command::new("python3");
        c.env_remove("LD_PRELOAD");
        c
    };
    c.args(["-c", FORK_DURING_HANDSHAKE, mode, "3", "2.0"]);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out = c
        .spawn()
        .expect("spawn")
        .wait_with_output()
        .expect("fork during handshake");
    (
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

/// Red team round 15, finding 11: `fork` waited for the handshake another thread was driving
/// (up to 1.8 s; 5 of 5 forks took ~0.8 s, the thread's server accepting 1 s late). Now it
/// leaves that handshake to its thread: no fork waits for it (here the server accepts 2 s
/// late, so a fork that waited took ~1.8 s: counted slow above 1 s), the child, whose copy
/// cannot take part in the handshake, does not hang, and the parent's connection is exact and
/// SMC-D. A handshake nobody drives (a non-blocking connect left alone) is driven 500 ms at
/// most in all (a fork-per-connection server's child serves the connection its thread just
/// accepted): under 1.5 s, where an unbounded drive waits for the accept (~1.8 s).
#[test]
fn fork_does_not_wait_for_another_threads_handshake() {
    let w = SmcWorld::new();
    let (tcp, _) = fork_during_handshake(&w, "connect", false);
    assert_eq!(
        tcp, "rounds 3 slow_forks 0 hung_children 0 bad_conns 0",
        "plain TCP"
    );
    let (out, err) = fork_during_handshake(&w, "connect", true);
    assert_eq!(out, tcp, "library against plain TCP ({err})");
    let s = w.stats_sum();
    assert!(s.get("smcd_client") >= 3, "not SMC-D: {s:?}");
    // Nobody drives it: the fork drives it, bounded.
    let (out, err) = fork_during_handshake(&w, "idle", true);
    assert!(
        out.ends_with("hung_children 0 bad_conns 0"),
        "{out} ({err})"
    );
    let worst: f64 = err
        .strip_prefix("worst fork ms ")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{err:?}"));
    assert!(worst < 1500.0, "a fork took {worst} ms");
}
