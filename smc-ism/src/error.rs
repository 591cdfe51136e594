//! Errors of the client and the daemon, and their mapping to SMC decline reasons.

use std::io;
use std::path::PathBuf;

use smc_common::diag::Diag;

use crate::proto::Status;

/// What the handshake should tell the peer when a device operation fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeclineReason {
    /// Out of DMBs: no free slot, or the cgroup's DMB count quota is used up.
    MaxDmb,
    /// Out of memory: byte quota, memory pressure, memfd/ftruncate failure.
    Mem,
    /// The device is not usable: daemon down, restarted, timed out or shutting down.
    NoDevice,
    /// Anything else (bad proof, stale token, protocol errors).
    Other,
}

impl DeclineReason {
    /// The CLC diagnosis code for this reason.
    pub fn diagnosis(self) -> u32 {
        match self {
            DeclineReason::MaxDmb => Diag::MaxDmb.code(),
            DeclineReason::Mem => Diag::Mem.code(),
            DeclineReason::NoDevice => Diag::NoSmcdDev.code(),
            DeclineReason::Other => Diag::IntErr.code(),
        }
    }
}

/// Errors of the loopback-ism client and daemon.
#[derive(Debug, thiserror::Error)]
pub enum IsmError {
    // ---- transport (client side) ----
    /// The daemon's socket could not be connected (not running, or its backlog is full).
    #[error("loopback-ism daemon unavailable: {0}")]
    Unavailable(#[source] io::Error),
    /// The daemon closed the connection (it stopped or restarted).
    #[error("loopback-ism daemon closed the connection")]
    Disconnected,
    /// The daemon did not answer within the client's timeout.
    #[error("loopback-ism daemon timed out")]
    Timeout,
    /// A transport error on the Unix socket (the connection was dropped; the next call
    /// reconnects).
    #[error("loopback-ism i/o error: {0}")]
    Io(#[source] io::Error),
    /// The request could not be sent (e.g. the fd to pass is not open); nothing reached the
    /// daemon and the connection is intact.
    #[error("loopback-ism request not sent: {0}")]
    NotSent(#[source] io::Error),
    /// The daemon's reply could not be understood.
    #[error("loopback-ism protocol error: {0}")]
    Protocol(&'static str),

    // ---- statuses returned by the daemon ----
    /// No free DMB slot on the device.
    #[error("no free DMB slot")]
    MaxDmb,
    /// The caller's cgroup holds its maximum number of DMBs.
    #[error("cgroup DMB count quota exhausted")]
    QuotaDmbs,
    /// The caller's cgroup holds its maximum number of DMB bytes.
    #[error("cgroup DMB byte quota exhausted")]
    QuotaBytes,
    /// Out of memory (device byte limit, memory pressure, memfd/ftruncate failure).
    #[error("out of memory for a DMB (errno {errno})")]
    Mem {
        /// The errno of the failed syscall, 0 for a limit or memory pressure.
        errno: i32,
    },
    /// The size code is above 6.
    #[error("invalid DMB size code")]
    BadSize,
    /// The socket passed is missing or is not an established TCP socket.
    #[error("no established TCP socket passed as proof")]
    BadSocket,
    /// No live DMB has this token.
    #[error("unknown or released DMB token")]
    StaleToken,
    /// The socket passed is not the other end of the owner's TCP connection.
    #[error("attach refused: the socket is not the peer of the DMB owner's connection")]
    BadProof,
    /// This client holds no such reference.
    #[error("this client holds no such DMB reference")]
    NotHeld,
    /// The daemon could not parse the request.
    #[error("malformed request")]
    Malformed,
    /// The request was too large.
    #[error("oversized request")]
    Oversized,
    /// The daemon speaks another protocol version.
    #[error("unsupported protocol version (daemon speaks {daemon})")]
    UnsupportedVersion {
        /// The daemon's version.
        daemon: u16,
    },
    /// The daemon does not know the op.
    #[error("unknown op")]
    UnknownOp,
    /// The daemon is shutting down.
    #[error("loopback-ism daemon is shutting down")]
    ShuttingDown,
    /// `PAIR`: the other end of the connection did not ask within the wait.
    #[error("the peer did not ask for its DMB in time")]
    NoPeer,
    /// `PAIR`: cancelled by the caller.
    #[error("pairing cancelled")]
    Cancelled,
    /// Unexpected daemon-side failure.
    #[error("internal daemon error")]
    Internal,
    /// `PAIR`: the reply names a state slot, but this process forked after asking (the
    /// slot may be on a page its child maps); both references were given back.
    #[error("a state slot asked for before a fork")]
    SlotAcrossFork,

    // ---- daemon setup ----
    /// Invalid daemon configuration.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Another daemon already serves this socket path.
    #[error("another daemon is already listening on {0}")]
    AlreadyRunning(PathBuf),
    /// Setting up a file or directory failed.
    #[error("{what} {path}: {source}")]
    Setup {
        /// What was being done.
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The error.
        #[source]
        source: io::Error,
    },
}

impl IsmError {
    /// The decline reason the handshake should send when this error made SMC-D unusable.
    pub fn decline_reason(&self) -> DeclineReason {
        match self {
            IsmError::MaxDmb | IsmError::QuotaDmbs => DeclineReason::MaxDmb,
            IsmError::QuotaBytes | IsmError::Mem { .. } => DeclineReason::Mem,
            IsmError::Unavailable(_)
            | IsmError::Disconnected
            | IsmError::Timeout
            | IsmError::Io(_)
            | IsmError::ShuttingDown => DeclineReason::NoDevice,
            _ => DeclineReason::Other,
        }
    }

    /// True when the failure is the transport (daemon down, restarted, hung): the caller should
    /// fall back to TCP, and a later call reconnects.
    pub fn is_unavailable(&self) -> bool {
        matches!(self.decline_reason(), DeclineReason::NoDevice)
    }

    /// The error for a non-OK daemon status.
    pub(crate) fn from_status(status: Status, detail: u32) -> IsmError {
        match status {
            Status::Ok | Status::Internal => IsmError::Internal,
            Status::Malformed => IsmError::Malformed,
            Status::Oversized => IsmError::Oversized,
            Status::BadVersion => IsmError::UnsupportedVersion {
                daemon: detail as u16,
            },
            Status::UnknownOp => IsmError::UnknownOp,
            Status::BadSize => IsmError::BadSize,
            Status::MaxDmb => IsmError::MaxDmb,
            Status::QuotaDmbs => IsmError::QuotaDmbs,
            Status::QuotaBytes => IsmError::QuotaBytes,
            Status::Mem => IsmError::Mem {
                errno: detail as i32,
            },
            Status::BadSocket => IsmError::BadSocket,
            Status::StaleToken => IsmError::StaleToken,
            Status::BadProof => IsmError::BadProof,
            Status::NotHeld => IsmError::NotHeld,
            Status::ShuttingDown => IsmError::ShuttingDown,
            Status::NoPeer => IsmError::NoPeer,
            Status::Cancelled => IsmError::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decline_mapping() {
        assert_eq!(IsmError::MaxDmb.decline_reason(), DeclineReason::MaxDmb);
        assert_eq!(IsmError::QuotaDmbs.decline_reason(), DeclineReason::MaxDmb);
        assert_eq!(IsmError::QuotaBytes.decline_reason(), DeclineReason::Mem);
        assert_eq!(
            IsmError::Mem { errno: 12 }.decline_reason(),
            DeclineReason::Mem
        );
        assert_eq!(IsmError::BadProof.decline_reason(), DeclineReason::Other);
        assert!(IsmError::Disconnected.is_unavailable());
        assert_eq!(DeclineReason::MaxDmb.diagnosis(), 0x030d0000);
        assert_eq!(DeclineReason::Mem.diagnosis(), 0x01010000);
    }
}
