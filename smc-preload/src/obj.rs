//! What an fd in the table can be.

use crate::conn::Conn;

pub enum Obj {
    /// An established SMC connection (shared by dup'd fds).
    Conn(Conn),
}
