//! What an fd in the table can be.

use crate::conn::Conn;
use crate::epoll::EpollSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;

pub enum Obj {
    /// An established SMC connection (shared by dup'd fds).
    Conn(Conn),
    /// A listening socket that announced SMC: accepted sockets run the server handshake.
    Listener,
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
    Epoll(EpollSet),
    /// A connection whose handshake is under way: an accepted one (an event-loop server is not
    /// held up waiting for its client) or a client of a non-blocking connect (which must not
    /// wait for its server inside `connect`): progressed by the fd's operations and polls.
    Handshake(Handshake),
    /// An SMC connection inherited across `exec`: its rings are gone with the old image, and
    /// its TCP socket carries only doorbells. Reads fail with `ECONNRESET` (then EOF), writes
    /// with `EPIPE`; never a doorbell byte as data.
    Orphan(Skip),
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
}

impl Handshake {
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
    pub dest: Option<crate::setup::Dest>,
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
}

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
    pub fn conn(&self) -> Option<&Conn> {
        match self {
            Obj::Conn(c) => Some(c),
            _ => None,
        }
    }
}
