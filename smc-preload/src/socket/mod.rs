//! Layer 3, socket objects: what an fd is for us and how it changes. The files, top down (each
//! uses only those after it):
//!
//! [`poll`] and [`epoll`] (the poll/select and epoll emulation over the objects), [`setup`]
//! (opt-in at connect/listen, the decisions), [`ready`] (readiness of one connection),
//! [`fdtable`] and [`obj`] (the per-fd objects), [`epoll_set`] (the state of an epoll set,
//! which an object can be), [`handshake`] (the CLC handshake's I/O),
//! [`member`] (fallen-back sockmap members), [`policy`] (which connections try SMC),
//! [`daemon`] (the loopback-ism device: the daemon client), [`stats`] (the per-process
//! statistics file).

pub mod daemon;
pub mod epoll;
pub mod epoll_set;
pub mod fdtable;
pub mod handshake;
pub mod member;
pub mod obj;
pub mod policy;
pub mod poll;
pub mod ready;
pub mod setup;
pub mod stats;
