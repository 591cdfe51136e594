//! Layer 3, socket objects: what an fd is for us and how it changes.
//!
//! [`fdtable`] and [`obj`] (the per-fd objects), [`setup`] (opt-in at connect/listen, the
//! decisions, the daemon client) and [`handshake`] (the CLC handshake's I/O), [`member`]
//! (fallen-back sockmap members), [`poll`] and [`epoll`] (readiness and the poll/epoll
//! emulation over the objects), [`stats`] (the per-process statistics file).

pub mod epoll;
pub mod fdtable;
pub mod handshake;
pub mod member;
pub mod obj;
pub mod poll;
pub mod setup;
pub mod stats;
