//! A loopback-ism daemon that stops answering in the middle of a handshake, at the one point
//! where the client is already committed: it sent its CLC Confirm (it is on SMC-D), and the
//! server still has to attach the client's DMB. The server reaches the daemon through a proxy
//! of this test that forwards its requests and replies (with their descriptors) unchanged,
//! except that from the server's first attach request on it forwards nothing for a while: the
//! daemon, as the server sees it, stalls; the client talks to the daemon directly and gets
//! through. A stall longer than the daemon client's timeout (2 s) used to reset the connection
//! (the server gave up on the attach, declined on a stream the client already used for SMC-D:
//! the client read ECONNRESET; seen as a flake of `fork_threads` while its daemon was
//! SIGSTOPped); now the server waits for the daemon (bounded) and the connection is exact. A
//! daemon that never answers again still ends the connection with a reset, never a hang.
//!
//! With `OP_PAIR` (the default) the server gets its client's DMB with its own, before it sends
//! its Accept: once the client is committed nothing is left to ask the daemon. The attach after
//! the Accept remains for a server whose daemon does not pair, or whose pair did not come
//! through: the server here does not pair (`SMC_PAIR=0`); its client does (the server's
//! `REGISTER` completes the client's waiting `PAIR`).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use integration_tests::{bin, line_fields, ready_port, spawn_piped, SmcWorld};

/// The daemon protocol's op field (offset 6 of a record, little-endian) of `OP_ATTACH_PEER`
/// (smc_ism::proto): the server's attach of its client's DMB, sent with its Accept.
const OP_ATTACH_PEER: u16 = 10;

/// What the proxy withholds.
struct Stall {
    /// How long nothing is forwarded once the server's first attach request came (`None`:
    /// until the proxy is dropped).
    len: Option<Duration>,
    /// When the stall started.
    since: Mutex<Option<Instant>>,
    /// The proxy is being dropped: forward nothing more, stop.
    done: AtomicBool,
}

impl Stall {
    /// Before forwarding a record: starts the stall at the server's first attach request, and
    /// waits while it lasts. False when the proxy stops.
    fn pass(&self, attach: bool) -> bool {
        {
            let mut s = self.since.lock().unwrap();
            if attach && s.is_none() {
                *s = Some(Instant::now());
            }
        }
        loop {
            if self.done.load(Ordering::SeqCst) {
                return false;
            }
            let since = *self.since.lock().unwrap();
            match (since, self.len) {
                (None, _) => return true,
                (Some(t), Some(len)) if t.elapsed() >= len => return true,
                _ => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
}

/// A `SOCK_SEQPACKET` proxy in front of the daemon's socket: one daemon connection per client
/// connection (the daemon's references stay per connection), records and their `SCM_RIGHTS`
/// descriptors forwarded both ways.
struct Proxy {
    path: PathBuf,
    stall: Arc<Stall>,
    listener: OwnedFd,
}

fn cvt(r: libc::c_int, what: &str) -> RawFd {
    assert!(r >= 0, "{what}: {}", std::io::Error::last_os_error());
    r
}

fn sockaddr(path: &Path) -> (libc::sockaddr_un, libc::socklen_t) {
    use std::os::unix::ffi::OsStrExt as _;
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    assert!(b.len() < a.sun_path.len(), "socket path too long");
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    (
        a,
        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
    )
}

fn seqpacket() -> OwnedFd {
    // SAFETY: plain socket call; the result is checked and owned at once.
    unsafe {
        OwnedFd::from_raw_fd(cvt(
            libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0),
            "socket",
        ))
    }
}

/// One record and the descriptors that came with it; `None` at EOF or on an error.
fn recv_record(fd: RawFd) -> Option<(Vec<u8>, Vec<OwnedFd>)> {
    let mut buf = vec![0u8; 1 << 16];
    let mut cmsg = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = cmsg.as_mut_ptr().cast();
    m.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: `m` describes our buffers.
    let n = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_CMSG_CLOEXEC) };
    if n <= 0 {
        return None;
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cmsg`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&m);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let k = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..k {
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&m, c);
        }
    }
    buf.truncate(n as usize);
    Some((buf, fds))
}

fn send_record(fd: RawFd, rec: &[u8], fds: &[OwnedFd]) -> bool {
    let mut cmsg = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: rec.as_ptr() as *mut libc::c_void,
        iov_len: rec.len(),
    };
    // SAFETY: a zeroed msghdr is valid; the pointers set below outlive the call.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !fds.is_empty() {
        let len = std::mem::size_of_val(fds) as u32;
        m.msg_control = cmsg.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure size computations; the header and data are
        // written inside `cmsg`, which holds a header and 4 descriptors at most.
        unsafe {
            m.msg_controllen = libc::CMSG_SPACE(len) as usize;
            let c = libc::CMSG_FIRSTHDR(&m);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(len) as usize;
            let data = libc::CMSG_DATA(c) as *mut RawFd;
            for (i, f) in fds.iter().enumerate() {
                data.add(i).write_unaligned(f.as_raw_fd());
            }
        }
    }
    // SAFETY: `m` describes our buffers and descriptors.
    unsafe { libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL) == rec.len() as isize }
}

/// Forwards records from `from` to `to` until either end closes; `requests`: the direction
/// of the requests (where the server's attach starts the stall).
fn forward(from: Arc<OwnedFd>, to: Arc<OwnedFd>, requests: bool, stall: Arc<Stall>) {
    while let Some((rec, fds)) = recv_record(from.as_raw_fd()) {
        let op = rec
            .get(6..8)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
        if fds.len() > 4
            || !stall.pass(requests && op == OP_ATTACH_PEER)
            || !send_record(to.as_raw_fd(), &rec, &fds)
        {
            break;
        }
    }
    // Either end gone: so are both (the other direction's thread sees EOF).
    // SAFETY: shutdown of descriptors we own.
    unsafe {
        libc::shutdown(from.as_raw_fd(), libc::SHUT_RDWR);
        libc::shutdown(to.as_raw_fd(), libc::SHUT_RDWR);
    }
}

impl Proxy {
    fn start(daemon: &Path, path: PathBuf, stall: Option<Duration>) -> Proxy {
        let listener = seqpacket();
        let (a, len) = sockaddr(&path);
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        cvt(
            unsafe {
                libc::bind(
                    listener.as_raw_fd(),
                    (&a as *const libc::sockaddr_un).cast(),
                    len,
                )
            },
            "bind",
        );
        // SAFETY: plain listen.
        cvt(unsafe { libc::listen(listener.as_raw_fd(), 128) }, "listen");
        let stall = Arc::new(Stall {
            len: stall,
            since: Mutex::new(None),
            done: AtomicBool::new(false),
        });
        let (lfd, daemon, st) = (listener.as_raw_fd(), daemon.to_path_buf(), stall.clone());
        std::thread::spawn(move || loop {
            // SAFETY: accept on our listener (closed by `Drop`, which ends this loop).
            let c = unsafe {
                libc::accept4(
                    lfd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if c < 0 || st.done.load(Ordering::SeqCst) {
                return;
            }
            // SAFETY: just accepted, owned here.
            let down = Arc::new(unsafe { OwnedFd::from_raw_fd(c) });
            let up = seqpacket();
            let (a, len) = sockaddr(&daemon);
            // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
            if unsafe {
                libc::connect(up.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len)
            } != 0
            {
                continue;
            }
            let up = Arc::new(up);
            let (d2, u2, s2) = (down.clone(), up.clone(), st.clone());
            std::thread::spawn(move || forward(d2, u2, true, s2));
            let s3 = st.clone();
            std::thread::spawn(move || forward(up, down, false, s3));
        });
        Proxy {
            path,
            stall,
            listener,
        }
    }

    /// Whether the server's attach came (and the stall started).
    fn stalled(&self) -> bool {
        self.stall.since.lock().unwrap().is_some()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stall.done.store(true, Ordering::SeqCst);
        // SAFETY: wakes the accept loop (it checks `done`).
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A one-connection thread server whose daemon is the proxy, and a client of it (through the
/// daemon directly); their outputs.
fn serve_one(w: &SmcWorld, proxy: &Proxy, env: &[(&str, &str)]) -> (String, String) {
    let mut s = w.run(bin("preload-prog"));
    s.args(["server", "0", "thread", "1"])
        .env("SMC_CTL_SOCK", &proxy.path)
        .env("SMC_PAIR", "0")
        .envs(env.iter().copied());
    let mut srv = spawn_piped(s);
    let port = ready_port(&mut srv);
    let mut c = w.run(bin("preload-prog"));
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        "300000",
        "700000",
        "7",
    ])
    .envs(env.iter().copied());
    let client = spawn_piped(c)
        .wait_output(Duration::from_secs(120))
        .expect("client");
    let server = srv.wait_output(Duration::from_secs(120)).expect("server");
    (client, server)
}

#[test]
fn a_daemon_stall_after_the_clients_confirm_is_waited_out() {
    let w = SmcWorld::new();
    // Longer than the daemon client's timeout (2 s) and its back-off after one (1 s).
    let proxy = Proxy::start(
        &w.sock,
        w.dir.join("proxy.sock"),
        Some(Duration::from_secs(5)),
    );
    let (client, server) = serve_one(&w, &proxy, &[]);
    assert!(proxy.stalled(), "the server never sent its attach request");
    let c = line_fields(&client, "CLIENT ");
    let s = line_fields(&server, "CONN ");
    assert_eq!(c.len(), 1, "client: {client}\nserver: {server}");
    assert_eq!(s.len(), 1, "client: {client}\nserver: {server}");
    let (c, s) = (&c[0], &s[0]);
    assert_eq!(c["tx"], s["rx"], "bytes client->server");
    assert_eq!(c["sha_tx"], s["sha_rx"], "SHA-256 client->server");
    assert_eq!(s["tx"], c["rx"], "bytes server->client");
    assert_eq!(s["sha_tx"], c["sha_rx"], "SHA-256 server->client");
    // Both ends on SMC-D: the server attached once the daemon answered again.
    let st = w.stats_sum();
    assert_eq!(st.get("smcd_client"), 1, "{st:?}");
    assert_eq!(st.get("smcd_server"), 1, "{st:?}");
    assert_eq!(
        st.get("fallback_client") + st.get("fallback_server"),
        0,
        "{st:?}"
    );
}

#[test]
fn a_daemon_that_never_answers_again_ends_the_connection_with_a_reset() {
    let w = SmcWorld::new();
    let proxy = Proxy::start(&w.sock, w.dir.join("proxy.sock"), None);
    // A short CLC timeout makes the server's wait for the daemon short too.
    let (client, server) = serve_one(&w, &proxy, &[("SMC_CLC_TIMEOUT_MS", "300")]);
    assert!(proxy.stalled(), "the server never sent its attach request");
    assert!(
        client.contains("CLIENT ERR") && client.contains("os error 104"),
        "the client must see a reset: {client}\nserver: {server}"
    );
    assert!(server.contains("ERR "), "server: {server}");
}
