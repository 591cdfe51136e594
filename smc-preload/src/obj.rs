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
    /// A connection that fell back to TCP after a CLC timeout: one late CLC message from the
    /// peer may still arrive before its data and must be skipped (and a late Proposal
    /// declined).
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
    /// A client whose server is a listener of this process: its non-blocking writes do not
    /// wait for the server (`EAGAIN`), which may be this very thread.
    pub peer_local: bool,
}

pub struct Pending {
    /// Serialises the resolution between threads.
    pub lock: Mutex<bool>,
    /// Where it connects to.
    pub dest: Option<crate::setup::Dest>,
}

pub struct Skip {
    pub lock: Mutex<()>,
    /// 0: a CLC message may still come; 1: done.
    pub state: AtomicU32,
    /// We are the server: a late Proposal gets a Decline.
    pub server: bool,
}

impl Skip {
    pub fn new(server: bool) -> Skip {
        Skip {
            lock: Mutex::new(()),
            state: AtomicU32::new(0),
            server,
        }
    }

    pub fn done(&self) -> bool {
        self.state.load(Ordering::Acquire) != 0
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
