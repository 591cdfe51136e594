//! What an fd in the table can be.

use crate::conn::Conn;
use crate::epoll_set::EpollSet;
use crate::forklock::ForkOnce;
use crate::real;
use crate::util::unwound;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

pub enum Obj {
    /// An established SMC connection (shared by dup'd fds).
    Conn(Conn),
    /// A listening socket that announced SMC: accepted sockets run the server handshake.
    Listener(Listen),
    /// A client socket that announced SMC and whose non-blocking connect had not completed
    /// when `connect` returned: the handshake (or a decline) happens at the first operation.
    Pending(Pending),
    /// A connection that fell back to TCP after both ends announced SMC and we sent a Decline:
    /// CLC messages of the peer that crossed our Decline may still arrive before its data and
    /// must be skipped (see [`Skip`]).
    Skip(Skip),
    /// A connection that stays TCP after both ends announced SMC: it may still be a sockmap
    /// member for a moment, so reads go through [`crate::member`].
    Tcp,
    /// An epoll instance that watches SMC connections.
    Epoll(EpollSet<Obj>),
    /// A connection whose handshake is under way: an accepted one (an event-loop server is not
    /// held up waiting for its client) or a client of a non-blocking connect (which must not
    /// wait for its server inside `connect`): progressed by the fd's operations and polls.
    Handshake(Handshake),
    /// An SMC connection inherited across `exec`: its rings are gone with the old image, and
    /// its TCP socket carries only doorbells. Reads fail with `ECONNRESET` (then EOF), writes
    /// with `EPIPE`; never a doorbell byte as data. With [`Skip::lost`]: a connection reset
    /// during its handshake, whose error the handshake's own read took from the socket: the
    /// first read or write reports it, then the socket is the kernel's ([`Obj::Tcp`]).
    Orphan(Skip),
    /// Our private duplicate of the socket of the connection `.0` (see [`Conn::with_io`]),
    /// made when a number of it was closed while it stayed in use: for the application this
    /// number is not open (its `close` says `EBADF`, `close_range` leaves it, a `dup2` onto it
    /// moves it first), and it is closed with the connection's object.
    Private(Weak<Obj>),
}

/// A listener of this process: its port is one of [`OWN_LISTENERS`] for as long as an fd of
/// the process names it (the object is shared by its duplicates).
pub struct Listen {
    port: Option<u16>,
}

/// The ports of this process's SMC listeners, each with how many listeners use it
/// (`SO_REUSEPORT`), at most 64: a connect to one of them, and the accept of such a client,
/// must not wait for the other end inside the call (`setup::to_own_listener`). A port leaves
/// when its last listener is closed here: a process that closed its listener after a `fork`
/// (its child serves it) is a client like any other.
static OWN_LISTENERS: crate::forklock::ForkMutex<Vec<(u16, u32)>> =
    crate::forklock::ForkMutex::new(Vec::new);
static OWN_LISTENERS_N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Listen {
    /// A listener on `port` (`None`: unknown, not counted).
    pub fn new(port: Option<u16>) -> Listen {
        if let Some(p) = port {
            let mut v = OWN_LISTENERS.lock();
            if let Some(e) = v.iter_mut().find(|e| e.0 == p) {
                e.1 += 1;
            } else if v.len() < 64 {
                v.push((p, 1));
            } else {
                return Listen { port: None };
            }
            OWN_LISTENERS_N.store(v.len() as u64, Ordering::Relaxed);
        }
        Listen { port }
    }
}

impl Drop for Listen {
    fn drop(&mut self) {
        if let Some(p) = self.port {
            let mut v = OWN_LISTENERS.lock();
            if let Some(i) = v.iter().position(|e| e.0 == p) {
                if let Some(e) = v.get_mut(i) {
                    e.1 = e.1.saturating_sub(1);
                    if e.1 == 0 {
                        v.swap_remove(i);
                    }
                }
            }
            OWN_LISTENERS_N.store(v.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Whether `port` is the port of a listener of this process ([`Listen`]).
pub fn own_listener_port(port: u16) -> bool {
    OWN_LISTENERS_N.load(Ordering::Relaxed) != 0 && OWN_LISTENERS.lock().iter().any(|e| e.0 == port)
}

/// How a dropped object closes its private duplicate of the socket (`fdtable::close_private`:
/// the table holds that number), registered by the table when it marks the first one
/// (`fdtable::set_private`); before, no object has one.
static CLOSE_PRIVATE: ForkOnce<fn(i32)> = ForkOnce::new();

/// Registers [`CLOSE_PRIVATE`] (the first registration stays).
pub fn set_close_private(f: fn(i32)) {
    let _ = CLOSE_PRIVATE.set(f);
}

fn close_private(p: i32) {
    if let Some(f) = CLOSE_PRIVATE.get() {
        f(p);
    }
}

impl Drop for Obj {
    fn drop(&mut self) {
        // The connection's object goes (its last fd closed, its last call returned): its
        // private duplicate of the socket goes with it, as the kernel drops the file reference
        // a call held.
        if let Obj::Conn(c) = self {
            if let Some(p) = c.take_private_io() {
                close_private(p);
            }
        }
        // A handshake whose number was closed under a call that drove it, and which that call
        // left undecided: nothing can drive it any more, the socket goes with its duplicate.
        if let Obj::Handshake(h) = self {
            if let Some(p) = h.io.take_private() {
                close_private(p);
            }
        }
    }
}

/// The inode of the file `fd` names (a socket's identity while it is open).
pub fn socket_ino(fd: i32) -> Option<u64> {
    let e0 = real::errno();
    // SAFETY: a zeroed stat is valid; out pointer is ours.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    let r = unsafe { libc::fstat(fd, &mut st) };
    real::set_errno(e0);
    (r == 0).then_some(st.st_ino)
}

/// Releases the calls of this thread that a jump left (`siglongjmp` out of a signal handler
/// while they slept; see `util::unwound`), as their ends would have: their sleep's holdings
/// on the connection (the poller role, the sleeper and waiter counts), their registration
/// (with the fd references closed under them: the connection's deferred last close), the
/// object they held. To be called on entry (before this call registers): one thread-local
/// load when the thread has no call in flight.
#[inline]
pub fn reap_unwound() {
    if unwound::any() {
        unwound::reap(&mut release_unwound);
    }
}

/// Gives back one call left by a jump (see [`reap_unwound`]; also at its thread's end).
pub fn release_unwound(u: unwound::Unwound) {
    // SAFETY: `u.obj` is the `Arc::as_ptr` of the `Arc<Obj>` an `InCall` held (its
    // `ManuallyDrop`), whose frame is gone; the reaper took its entry, so that `InCall` never
    // drops it (`unwound::pop` says so): this consumes that strong reference once.
    let obj = unsafe { Arc::from_raw(u.obj as *const Obj) };
    if let Obj::Conn(c) = &*obj {
        crate::debug!(
            "fd {}: a call left by a jump (siglongjmp out of a signal handler) is released",
            u.fd
        );
        c.forget_sleeper(u.fd, u.held);
        for _ in 0..c.call_leave() {
            release_ref(u.fd, u.fd, c);
        }
    }
    drop(obj);
}

/// Drops one fd reference of `c`: the close of `fd`, or the end of the last call a close left
/// its reference to (the number names another file or none then: the I/O of the final close
/// goes through the connection's private duplicate of the socket). The last reference anywhere
/// closes the connection (the peer learns it from the CDC header). `io_fd`: the number to use
/// for that close's I/O (-1: none, a close behind our back).
pub fn release_ref(fd: i32, io_fd: i32, c: &Conn) {
    // A connection switched to TCP closes as TCP (counted when it switched).
    if !c.drop_ref() || c.switched() {
        return;
    }
    let sh = c.sh();
    crate::debug!(
        "fd {fd}: close: rx {} B/{} calls, tx {} B/{} calls, doorbells sent {} rcvd {}, spin hits {}, sleeps {}, tx full {}",
        sh.rx_bytes.load(Ordering::Relaxed),
        sh.rx_calls.load(Ordering::Relaxed),
        sh.tx_bytes.load(Ordering::Relaxed),
        sh.tx_calls.load(Ordering::Relaxed),
        sh.doorbells_sent.load(Ordering::Relaxed),
        sh.doorbells_rcvd.load(Ordering::Relaxed),
        sh.spin_hits.load(Ordering::Relaxed),
        sh.sleeps.load(Ordering::Relaxed),
        sh.tx_full.load(Ordering::Relaxed),
    );
    // Counted before the final close: once it finished, the state page may be pooled and
    // reused by the process that registered it.
    crate::stats::conn_closed(c);
    if c.role == crate::conn::Role::Client {
        crate::policy::note_client_conn(
            c.with_io(io_fd, crate::policy::Dest::peer_of),
            sh.rx_bytes.load(Ordering::Relaxed) + sh.tx_bytes.load(Ordering::Relaxed),
            c.turns(),
        );
    }
    c.final_close(io_fd);
}

pub struct Handshake {
    /// The driver until the handshake is decided (`None` after).
    pub driver: Mutex<Option<Box<crate::handshake::Driver>>>,
    /// O_NONBLOCK of the file description, tracked through `fcntl` / `FIONBIO`.
    pub nonblock: std::sync::atomic::AtomicBool,
    /// The server side (else the client's).
    pub server: bool,
    /// A client whose server is a listener of this process: its other operations (not only
    /// reads and writes) do not wait for the server when non-blocking, which may be this very
    /// thread. A server whose client is a connection of this process: it drives that client's
    /// handshake (`setup::nudge_own_peer`).
    pub peer_local: bool,
    /// A non-blocking write said `EAGAIN` (the handshake waits for the peer): poll/epoll report
    /// the fd writable only once it is decided ([`Handshake::out_while_undecided`]), so that
    /// the program does not spin on it.
    pub write_waits: std::sync::atomic::AtomicBool,
    /// Another fd names it too (`dup`, `dup2`, `F_DUPFD`, `SCM_RIGHTS`): the decision is
    /// copied to every such fd ([`crate::setup::share_decision`]).
    pub shared: std::sync::atomic::AtomicBool,
    /// An end being driven by the other end of its connection, in this same process
    /// (`setup::nudge_own_peer`): a close of the fd waits until that step is over.
    pub nudged: std::sync::atomic::AtomicBool,
    /// The descriptor the driver's I/O goes through (shared with it): a close of the number
    /// while a call drives the handshake ([`Handshake::calls`]) redirects it to a private
    /// duplicate of the socket first, so that the handshake never reads from, writes to or
    /// decides on whatever the number names next.
    pub io: Arc<crate::util::io_path::IoPath>,
    /// Calls of this process driving the handshake right now (`setup::progress_until`).
    pub calls: AtomicU32,
    /// A call applies the decision to the number it was made on right now (`setup::settle`):
    /// a close of that number waits until it is applied, then closes what it became, so that
    /// the decision's I/O never reaches what the number names next.
    pub deciding: std::sync::atomic::AtomicBool,
    /// Decided on the private duplicate (its number was closed under the call that decided
    /// it): the duplicate and the socket's inode, for the call to continue on and then close
    /// (`fdtable::close_moved`).
    pub moved: Mutex<Option<(i32, u64)>>,
}

impl Handshake {
    /// The object of a handshake under way, driven by `driver`.
    pub fn new(
        driver: Box<crate::handshake::Driver>,
        nonblock: bool,
        server: bool,
        peer_local: bool,
    ) -> Handshake {
        Handshake {
            io: driver.io_path(),
            driver: Mutex::new(Some(driver)),
            nonblock: std::sync::atomic::AtomicBool::new(nonblock),
            server,
            peer_local,
            write_waits: std::sync::atomic::AtomicBool::new(false),
            shared: std::sync::atomic::AtomicBool::new(false),
            nudged: std::sync::atomic::AtomicBool::new(false),
            calls: AtomicU32::new(0),
            deciding: std::sync::atomic::AtomicBool::new(false),
            moved: Mutex::new(None),
        }
    }

    /// Whether poll/epoll report this undecided fd writable (as TCP does once the connection
    /// is established). A client's connect completes, for the program, when its handshake is
    /// decided: until then it is not writable and a non-blocking write says `EAGAIN`, as for a
    /// TCP connect still under way, so that a program that waits for `POLLOUT` before its first
    /// write never sees `EAGAIN` there. Exceptions: a client of our own listener (its server
    /// may be this very thread, which must be told that the connection is up); a server, whose
    /// accepted socket is writable at once, until a write had to say `EAGAIN`.
    pub fn out_while_undecided(&self) -> bool {
        (self.server || self.peer_local)
            && !self.write_waits.load(std::sync::atomic::Ordering::Relaxed)
    }
}

pub struct Pending {
    /// Serialises the resolution between threads.
    pub lock: Mutex<bool>,
    /// Where it connects to.
    pub dest: Option<crate::policy::Dest>,
    /// Another fd names it too: as [`Handshake::shared`].
    pub shared: std::sync::atomic::AtomicBool,
}

/// What may still arrive from the peer before its data, after a fallback in which we sent a
/// Decline. The peer sends at most one CLC message per message it received, plus a Decline of
/// its own when its timer expires: after *our* timeout (the message we waited for may come
/// late, then the peer's own timeout Decline), at most a late message of any type and then a
/// Decline; after a Decline of ours that answered the peer's message, at most the Decline the
/// peer sent on its timeout while ours was under way. A peer's Decline is its last CLC byte.
pub struct Skip {
    pub lock: Mutex<()>,
    /// [`SKIP_LATE`]: a late message of any CLC type, then a Decline, may still come;
    /// [`SKIP_DECLINE`]: only a Decline may still come; [`SKIP_DONE`]: the data starts.
    /// (An [`Obj::Orphan`] uses it as "reported": 0 not yet, 1 done.)
    pub state: AtomicU32,
    /// We are the server.
    pub server: bool,
    /// A client whose Accept did not come: before its FIN (a half-close or close) while
    /// nothing of its server was read yet, the daemon quarantines the server end, which may
    /// still lie unaccepted in its listener's queue (`setup::sweep_peer_before_fin`).
    pub sweep_peer: AtomicBool,
    /// A wait of `setup::skip_before_libc` ran its whole CLC timeout for this skip: what did
    /// not come then is not waited for again (a `posix_spawn` that puts the socket on stdin and
    /// stdout settles it three times: 6 s instead of 2, red team round 30 `rt30b_spawn.c client
    /// spawn`).
    pub waited_out: AtomicBool,
    /// An [`Obj::Orphan`] of a connection reset during its handshake: the socket error
    /// (`ECONNRESET`, ...) that the handshake's read took (`sock_error`) and the application's
    /// first read or write reports, as TCP's would; 0 otherwise.
    pub lost: i32,
    /// With [`Skip::lost`]: a server whose client left during the handshake
    /// (`crate::handshake::Lost::left`): its reads are the socket's (EOF).
    pub left: bool,
}

/// The states of a [`Skip::lost`] orphan (`state`; 0: the error is still to be reported): the
/// first write takes its bytes (no write came yet); the error was reported.
pub const LOST_WAITED: u32 = 2;
pub const LOST_REPORTED: u32 = 1;

pub const SKIP_LATE: u32 = 0;
pub const SKIP_DONE: u32 = 1;
pub const SKIP_DECLINE: u32 = 2;

impl Skip {
    /// After our timeout: a late message, then a Decline, may still come.
    pub fn new(server: bool) -> Skip {
        Skip {
            lock: Mutex::new(()),
            state: AtomicU32::new(SKIP_LATE),
            server,
            sweep_peer: AtomicBool::new(false),
            waited_out: AtomicBool::new(false),
            lost: 0,
            left: false,
        }
    }

    /// A connection that ended during its handshake as `l` says ([`Skip::lost`]).
    pub fn lost(server: bool, l: crate::handshake::Lost) -> Skip {
        Skip {
            lost: l.err,
            left: l.left,
            state: AtomicU32::new(if l.write_passes { LOST_WAITED } else { 0 }),
            ..Skip::new(server)
        }
    }

    /// A client after its wait for the server's Accept expired (as [`Skip::new`]), whose
    /// server end is swept before its FIN ([`Skip::sweep_peer`]).
    pub fn after_accept_timeout() -> Skip {
        Skip {
            sweep_peer: AtomicBool::new(true),
            ..Skip::new(false)
        }
    }

    /// After our Decline answered the peer's message: the peer's timeout Decline may come.
    pub fn decline_only(server: bool) -> Skip {
        Skip {
            state: AtomicU32::new(SKIP_DECLINE),
            ..Skip::new(server)
        }
    }

    pub fn done(&self) -> bool {
        self.state.load(Ordering::Acquire) == SKIP_DONE
    }
}

impl Obj {
    /// Moves the I/O of the connection or handshake that owns our private duplicate `old` to
    /// `new` (another duplicate, or `IO_GONE`); false when it did not go through `old`.
    pub fn move_private_io(&self, old: i32, new: i32) -> bool {
        match self {
            Obj::Conn(c) => c.move_private_io(old, new),
            Obj::Handshake(h) => h.io.move_private(old, new),
            _ => false,
        }
    }

    pub fn conn(&self) -> Option<&Conn> {
        match self {
            Obj::Conn(c) => Some(c),
            _ => None,
        }
    }
}
