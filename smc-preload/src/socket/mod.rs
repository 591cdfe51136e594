//! Layer 3, socket objects: what an fd is for us and how it changes. The files, top down (each
//! uses only those after it, but for the uses `tests/layers.rs` lists):
//!
//! [`poll`] and [`epoll`] (the poll/select and epoll emulation over the objects), [`setup`]
//! (opt-in at connect/listen, the decisions), [`ready`] (readiness of one connection),
//! [`fdtable`] and [`obj`] (the per-fd objects), [`handshake`] (the CLC handshake's I/O),
//! [`member`] (fallen-back sockmap members), [`policy`] (which connections try SMC),
//! [`daemon`] (the loopback-ism device: the daemon client), [`stats`] (the per-process
//! statistics file).

pub mod daemon;
pub mod epoll;
pub mod fdtable;
pub mod handshake;
pub mod member;
pub mod obj;
pub mod policy;
pub mod poll;
pub mod ready;
pub mod setup;
pub mod stats;
