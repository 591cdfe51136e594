//! Layer 4, the SMC connection core: one connection's rings, cursors, CDC header and wakeups
//! ([`conn`]), the DMB mappings a process keeps ([`dmbs`]), an iovec cursor ([`iov`]). It
//! knows nothing of fds' objects or of the calls above; what the socket layer wants to hear
//! from a connection is a hook it registers ([`conn::Hooks`]).

pub mod conn;
pub mod dmbs;
pub mod iov;
