//! The data path's per-process statistics files (`/run/smc/procs/<pid>`), shared by their
//! writer (`smc-preload`) and their readers (`smc-ctl stats` / `conns`, the daemon's metrics).
//!
//! Module map:
//! - [`layout`]: the `#[repr(C)]` file layout ([`ProcStats`], the connection table
//!   [`ConnRecord`]), parsing a file as a [`Snapshot`], folding files into per-cgroup aggregates;
//! - [`dir`]: the directory tree, safe against other local users ([`StatsDir`], the per-uid
//!   subdirectories, the bounded directory lock [`DirLock`]);
//! - [`process`]: what comes from `/proc`: a process's [`Identity`], whether a file's writer
//!   still runs ([`is_live`]), and whether it may have written where its file is ([`Writers`]).
//!
//! Everything is re-exported at the crate root.

pub mod dir;
pub mod layout;
pub mod process;

pub use dir::{
    ensure_uid_dir, uid_dir_name, DirLock, LockError, Refused, StatsDir, MAX_FILE_LEN,
    READER_LOCK_WAIT, UID_DIR_PREFIX, WRITER_LOCK_WAIT,
};
pub use layout::*;
pub use process::*;
