//! Helpers for the daemon tests: a temp dir, a daemon in it, TCP pairs, child processes.
#![allow(dead_code)]

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use smc_ism::{spawn, Client, DaemonConfig, DaemonHandle, DmbMap};

/// How long any wait in these tests may take before the test fails.
pub const WAIT: Duration = Duration::from_secs(20);

/// Set by `cargo xtask test`: a test that needs root fails without it instead of skipping.
pub const NEED_ROOT_ENV: &str = "SMC_TESTS_NEED_ROOT";

/// Whether a test that needs root (another uid, the per-cgroup figures only root sees) can run.
/// As a normal user (a plain `cargo test`) it is skipped with a message on stderr; with
/// [`NEED_ROOT_ENV`] set, a missing root fails the test.
pub fn root_or_skip(test: &str) -> bool {
    // SAFETY: no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root || skip_without_root(test, None)
}

/// Whether a test of shelved files (`DaemonConfig::shelve_after_ms`: the daemon keeps a DMB's
/// files in mappings, without descriptors) can run; skipped as [`root_or_skip`] where the
/// daemon cannot shelve (see [`can_shelve`]): it then keeps a descriptor per file and shelves
/// none, as designed.
pub fn shelving_or_skip(test: &str) -> bool {
    can_shelve()
        || skip_without_root(
            test,
            Some(
                "the daemon shelves files by reopening them through /proc/self/map_files, \
                 which needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE",
            ),
        )
}

/// Whether this process may open a file again through its mapping
/// (`/proc/self/map_files/START-END`), as the daemon does to shelve one (its own probe is
/// `shelf::available`); a daemon of these tests runs in this process or in a child with its
/// credentials. The kernel refuses it (`EPERM`) without `CAP_SYS_ADMIN` or
/// `CAP_CHECKPOINT_RESTORE` in the initial user namespace: a normal user, even in a user
/// namespace of its own, cannot. Takes two descriptors for a moment.
pub fn can_shelve() -> bool {
    // SAFETY: a valid C string; the descriptor is owned at once.
    let f = unsafe {
        let fd = libc::memfd_create(c"shelf-probe".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(fd)
    };
    // SAFETY: ftruncate of our descriptor.
    assert_eq!(unsafe { libc::ftruncate(f.as_raw_fd(), 4096) }, 0);
    // SAFETY: a new mapping chosen by the kernel, nothing of ours replaced; `PROT_NONE`: never
    // accessed; unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_NONE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
    let path = format!(
        "/proc/self/map_files/{:x}-{:x}",
        p as usize,
        p as usize + 4096
    );
    let r = fs::OpenOptions::new().read(true).write(true).open(&path);
    // SAFETY: the mapping made above, unmapped once.
    unsafe { libc::munmap(p, 4096) };
    match r {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => false,
        Err(e) => panic!("{path}: {e}"),
    }
}

/// Skips `test` for want of root, with a message on stderr (`why`: what needs it), unless
/// [`NEED_ROOT_ENV`] is set: then it fails. Returns false.
fn skip_without_root(test: &str, why: Option<&str>) -> bool {
    let why = why.map(|w| format!(": {w}")).unwrap_or_default();
    assert!(
        std::env::var_os(NEED_ROOT_ENV).is_none(),
        "{test} needs root{why} ({NEED_ROOT_ENV} is set)"
    );
    // Straight to stderr, past the test harness's capture, so that a passing run shows it.
    let _ = writeln!(
        std::io::stderr(),
        "{test}: SKIPPED: needs root{why} (run the tests as root: cargo xtask test)"
    );
    false
}

/// A private directory under /tmp, removed on drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = PathBuf::from(format!(
            "/tmp/smc-ism-{}-{}-{}",
            name,
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TestDir(p)
    }
    pub fn sock(&self) -> PathBuf {
        self.0.join("run/ctl.sock")
    }
    pub fn state(&self) -> PathBuf {
        self.0.join("state")
    }
    pub fn config(&self) -> DaemonConfig {
        DaemonConfig::with_paths(self.sock(), self.state())
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Starts a daemon in `dir` with `tweak` applied to its config.
pub fn start(dir: &TestDir, tweak: impl FnOnce(&mut DaemonConfig)) -> DaemonHandle {
    let mut cfg = dir.config();
    tweak(&mut cfg);
    spawn(cfg).expect("daemon starts")
}

pub fn client(dir: &TestDir) -> Client {
    Client::connect(&dir.sock()).expect("client connects")
}

/// A connected TCP pair on 127.0.0.1: (connecting end, accepted end).
pub fn tcp_pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (b, _) = l.accept().unwrap();
    for s in [&a, &b] {
        s.set_read_timeout(Some(WAIT)).unwrap();
        s.set_write_timeout(Some(WAIT)).unwrap();
    }
    (a, b)
}

pub fn send_u64(s: &mut TcpStream, v: u64) {
    s.write_all(&v.to_le_bytes()).unwrap();
}

pub fn recv_u64(s: &mut TcpStream) -> u64 {
    let mut b = [0u8; 8];
    s.read_exact(&mut b).unwrap();
    u64::from_le_bytes(b)
}

/// The atomic word at `off` of a mapping.
pub fn word(m: &DmbMap, off: usize) -> &AtomicU64 {
    assert!(off.is_multiple_of(8) && off + 8 <= m.len());
    // SAFETY: aligned (mmap is page aligned), in bounds, shared memory accessed atomically.
    unsafe { &*(m.as_ptr().add(off) as *const AtomicU64) }
}

/// Spins (yielding) until the word at `off` is non-zero; panics after [`WAIT`].
pub fn wait_word(m: &DmbMap, off: usize) -> u64 {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let v = word(m, off).load(Ordering::Acquire);
        if v != 0 {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting on shared memory"
        );
        std::thread::yield_now();
    }
}

pub fn write_bytes(m: &DmbMap, off: usize, data: &[u8]) {
    assert!(off + data.len() <= m.len());
    // SAFETY: in bounds; the reader synchronises through an acquire/release word.
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), m.as_ptr().add(off), data.len()) }
}

pub fn read_bytes(m: &DmbMap, off: usize, len: usize) -> Vec<u8> {
    assert!(off + len <= m.len());
    let mut v = vec![0u8; len];
    // SAFETY: in bounds.
    unsafe { std::ptr::copy_nonoverlapping(m.as_ptr().add(off), v.as_mut_ptr(), len) }
    v
}

/// Re-runs this test binary as a child process executing the ignored test `entry` with
/// `ISM_CHILD_ROLE=role`.
pub fn spawn_child(entry: &str, role: &str, sock: &Path, env: &[(&str, String)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        entry,
        "--nocapture",
        "--test-threads=1",
    ])
    .env("ISM_CHILD_ROLE", role)
    .env("SMC_CTL_SOCK", sock)
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Waits for a child with a deadline; SIGKILLs it on timeout.
pub fn wait_child(child: Child) -> std::process::ExitStatus {
    let pid = child.id() as libc::pid_t;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut child = child;
        let _ = tx.send(child.wait().unwrap());
    });
    match rx.recv_timeout(WAIT) {
        Ok(st) => st,
        Err(_) => {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("child did not exit in time");
        }
    }
}

/// Waits until the daemon is idle (no DMB, no attachment) and `clients` clients are connected.
pub fn wait_idle(c: &mut Client, clients: u64) -> smc_ism::Stats {
    match c.wait_for(WAIT, |s| {
        s.live_dmbs == 0
            && s.live_bytes == 0
            && s.live_attachments == 0
            && s.clients_connected == clients
    }) {
        Ok(s) => s,
        Err(e) => panic!("daemon not idle: {e}; stats: {:#?}", c.stats()),
    }
}

/// How long an `OP_PAIR` of these tests waits for its peer.
pub const PARK: Duration = Duration::from_secs(5);

/// A shared client of the test daemon in `dir`, connected.
pub fn shared(dir: &TestDir) -> smc_ism::SharedClient {
    let c = smc_ism::SharedClient::new(&dir.sock());
    c.connect().unwrap();
    c
}

/// Both ends of one connection pair: (a's own, a's peer), (b's own, b's peer).
pub fn pair(
    a: &smc_ism::SharedClient,
    b: &smc_ism::SharedClient,
    x: &TcpStream,
    y: &TcpStream,
) -> ((smc_ism::Dmb, smc_ism::Dmb), (smc_ism::Dmb, smc_ism::Dmb)) {
    let ta = a.pair_start(0, PARK, x.as_raw_fd()).unwrap();
    let tb = b.pair_start(0, PARK, y.as_raw_fd()).unwrap();
    let rb = b.finish_pair(tb, None).unwrap();
    let ra = a.finish_pair(ta, None).unwrap();
    (ra, rb)
}

/// A 4 KiB memfd sealed against shrinking and growing (a local state page).
pub fn sealed_page() -> OwnedFd {
    // SAFETY: valid C string; the fd is owned at once.
    let fd = unsafe {
        let fd = libc::memfd_create(
            c"state".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        assert!(fd >= 0, "memfd_create");
        OwnedFd::from_raw_fd(fd)
    };
    // SAFETY: plain calls on our fd.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), 4096), 0);
        assert_eq!(
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW
            ),
            0
        );
    }
    fd
}

/// `SO_LINGER` of `fd`: on or off, for `secs`.
pub fn set_linger(fd: RawFd, on: bool, secs: i32) {
    let l = libc::linger {
        l_onoff: on as i32,
        l_linger: secs,
    };
    // SAFETY: setsockopt with a valid linger struct.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as u32,
        )
    };
    assert_eq!(r, 0, "SO_LINGER");
}

/// Sends one record with several fds as SCM_RIGHTS.
pub fn send_with_fds(sock: RawFd, data: &[u8], fds: &[RawFd]) -> bool {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut _,
        iov_len: data.len(),
    };
    let len = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is arithmetic.
    let mut cbuf = vec![0u64; unsafe { libc::CMSG_SPACE(len) } as usize / 8 + 1];
    // SAFETY: msghdr is plain data; the buffers outlive the call; CMSG macros within cbuf.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(len) as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(len) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(c).cast(), fds.len());
        libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) == data.len() as isize
    }
}

/// A TCP socket with unsent data queued to a peer that never reads, SO_LINGER {1, 30}: its last
/// close blocks for up to 30 s. Returns (the socket, the peer that must stay open).
pub fn lingering_socket() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (peer, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let chunk = vec![0x5au8; 1 << 16];
    let mut queued = 0usize;
    loop {
        match std::io::Write::write(&mut &s, &chunk) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("filling the send buffer: {e}"),
        }
    }
    assert!(queued > 0);
    set_linger(s.as_raw_fd(), true, 30);
    (s, peer)
}

pub fn unix_connect(path: &std::path::Path) -> Option<OwnedFd> {
    let s = std::os::unix::net::UnixStream::connect(path).ok();
    // A SEQPACKET socket is needed: connect with libc.
    drop(s);
    let p = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: plain socket calls; sockaddr_un filled within bounds (checked length).
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let s = OwnedFd::from_raw_fd(fd);
        let mut a: libc::sockaddr_un = std::mem::zeroed();
        a.sun_family = libc::AF_UNIX as u16;
        let b = p.as_bytes();
        if b.len() >= a.sun_path.len() {
            return None;
        }
        for (i, c) in b.iter().enumerate() {
            a.sun_path[i] = *c as libc::c_char;
        }
        let n = std::mem::size_of::<libc::sockaddr_un>() as u32;
        (libc::connect(fd, (&a as *const libc::sockaddr_un).cast(), n) == 0).then_some(s)
    }
}

/// A TCP socket bound to `local` (SO_REUSEADDR) and connected to `remote`.
pub fn connect_from(local: SocketAddr, remote: SocketAddr) -> std::io::Result<TcpStream> {
    let (SocketAddr::V4(l), SocketAddr::V4(r)) = (local, remote) else {
        return Err(std::io::Error::other("v4 only"));
    };
    // SAFETY: plain socket calls on a socket owned right away.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = OwnedFd::from_raw_fd(fd);
        let one: i32 = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&one as *const i32).cast(),
            4,
        );
        let sin = |a: std::net::SocketAddrV4| libc::sockaddr_in {
            sin_family: libc::AF_INET as u16,
            sin_port: a.port().to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from(*a.ip()).to_be(),
            },
            sin_zero: [0; 8],
        };
        let (sl, sr) = (sin(l), sin(r));
        let n = std::mem::size_of::<libc::sockaddr_in>() as u32;
        if libc::bind(fd, (&sl as *const libc::sockaddr_in).cast(), n) != 0
            || libc::connect(fd, (&sr as *const libc::sockaddr_in).cast(), n) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TcpStream::from(s))
    }
}
