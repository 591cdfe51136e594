//! Layer 3, socket objects: what an fd is for us and how it changes.
//!
//! [`fdtable`] and [`obj`] (the per-fd objects), [`setup`] (opt-in at connect/listen, the
//! decisions, the daemon client) and [`handshake`] (the CLC handshake's I/O), [`member`]
//! (fallen-back sockmap members), [`ready`] (readiness of one connection), [`poll`] and
//! [`epoll`] (the poll/select and epoll emulation over the objects), [`stats`] (the
//! per-process statistics file).

pub mod epoll;
pub mod fdtable;
pub mod handshake;
pub mod member;
pub mod obj;
pub mod poll;
pub mod ready;
pub mod setup;
pub mod stats;
