//! Sans-IO CLC handshake for SMC-Dv2 over a loopback-ism-like device: a client and a server
//! state machine that never touch a socket, a clock or a thread.
//!
//! The I/O layer creates a [`Handshake`] per TCP connection (after the TCP handshake, knowing
//! whether the peer's SYN/SYN-ACK carried the SMC option), then feeds it [`Input`]s and carries
//! out the returned [`Action`]s in order:
//!
//! ```text
//! client                                   server
//!   Send(Proposal)  ───────────────────▶    RegisterDmb      (same GID, common EID)
//!                                           DmbRegistered ─▶ Send(Accept{server token})
//!   RegisterDmb     ◀───────────────────
//!   DmbRegistered ─▶ Send(Confirm{client token}), Established
//!                   ───────────────────▶    Established
//! ```
//!
//! Either side may instead send a Decline and end in [`Action::Fallback`]; a received Decline
//! ends in fallback without sending anything. Two peers are on the same host iff their 128-bit
//! GIDs (gid + gid_ext) are equal, exactly like Linux's `smc_lo_query_rgid`.
//!
//! **Termination.** Every state that waits for the peer or for the local DMB ends on
//! [`Input::Timeout`] or [`Input::Abort`], so any input sequence that ends with one of them
//! leaves the machine finished. Exactly one terminal action ([`Action::Established`] or
//! [`Action::Fallback`]) is ever returned; inputs after it only return
//! [`Action::ReleaseDmb`] for a DMB registered too late (so it is never leaked), otherwise
//! nothing.
//!
//! **Timeouts** are inputs: Linux waits `CLC_WAIT_TIME` (6 s) for each CLC message; the I/O
//! layer arms its own timer while [`Handshake::waiting_for`] is `Some`.
//!
//! **Stream state after fallback.** [`Fallback::in_sync`] is false when the TCP byte stream
//! may hold CLC bytes the application must not see (we timed out while the peer may still be
//! sending, or we got bytes we could not frame). The I/O layer should then reset the
//! connection rather than hand later bytes to the application — or, after a timeout while the
//! peer had to answer (client waiting for the accept, server waiting for the proposal), skip
//! the one late CLC message: the Decline sent on the timeout is the peer's answer, and each
//! side sends exactly one message per message received before any application byte.
//!
//! **Withdrawn accept** ([`FEATURE_ACCEPT_WITHDRAW`], this implementation's extension). A
//! server that waited for the Confirm in vain (its client went idle after its Proposal: the
//! client's handshake advances only inside its calls) would have to reset the connection, since
//! a Confirm may be crossing its Decline. Instead both ends decide in the server's DMB, which
//! both have mapped, who came first ([`crate::cdc::CdcHeader::claim_confirm`] /
//! [`crate::cdc::CdcHeader::claim_withdraw`]) and tell the machine with
//! [`Input::AcceptWithdrawn`] when the server did: the server sends a Decline after its Accept
//! and falls back in sync; the client sends nothing more, reads the Decline and falls back in
//! sync. When the client came first, the server keeps waiting for its (imminent) Confirm.
//!
//! **Device and peer DMB.** The client attaches the peer's DMB when it is asked to register
//! its own ([`Handshake::peer_dmb`] names it), so a failed attach is still a clean decline
//! ([`Input::DmbFailed`]). A side whose local device is unavailable
//! ([`Handshake::device_unavailable`]) declines instead of proposing or accepting.

use crate::cdc::{dmb_size_from_code_large, DMB_MAX_SIZE_CODE, DMB_MAX_SIZE_CODE_LARGE};
use crate::clc::{
    decode, message_len, padded32, AcceptConfirm, AcceptConfirmV2, ClcMessage, Decline, Eid,
    FirstContactExt, Gid, GidChid, MsgType, Proposal, ProposalV2Ext, SmcType, SmcdV2Ext,
    FEATURE_ACCEPT_WITHDRAW, FEATURE_EMULATED_ISM, FEATURE_LARGE_DMB, HEADER_LEN, LOOPBACK_CHID,
    OS_LINUX, OUR_FEATURES, SMC_RELEASE_1, SMC_V1, SMC_V2,
};
use crate::diag::Diag;
use std::vec::Vec;

/// The UEID used when none is configured: both ends of this implementation use it, so they
/// always find a common EID (Linux requires a UEID or a system EID for SMC-Dv2).
pub const DEFAULT_UEID: Eid = *b"SMC-RS-LOOPBACK                 ";

/// The local device and protocol settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Our 128-bit GID.
    pub gid: Gid,
    /// Our CHID ([`LOOPBACK_CHID`] for loopback-ism).
    pub chid: u16,
    /// System EID; `Some` also sets the SEID flag in proposals.
    pub system_eid: Option<Eid>,
    /// User EIDs (at most 8), in preference order.
    pub ueids: Vec<Eid>,
    /// System id sent in declines (`id_for_peer`).
    pub peer_id: [u8; 8],
    /// DMB size code we ask the I/O layer to register (`16 KiB << code`, 0..=10): codes above
    /// [`DMB_MAX_SIZE_CODE`] (1 MiB, Linux's SMC-D limit) only when both ends offered
    /// [`FEATURE_LARGE_DMB`], otherwise capped at 6.
    pub dmb_size_code: u8,
    /// Host name for first-contact extensions (blank padded).
    pub hostname: [u8; 32],
    /// Highest SMCv2 release we speak (`SMC_RELEASE_1`).
    pub release: u8,
    /// Link group id sent in accept/confirm.
    pub link_id: u32,
    /// Send accept/confirm as first contact (each connection is its own link group).
    pub first_contact: bool,
}

impl Config {
    /// Settings like Linux's loopback-ism: CHID 0xFFFF, SMC-Dv2.1, [`DEFAULT_UEID`], 64 KiB
    /// DMBs, first contact.
    pub fn loopback(gid: Gid) -> Config {
        Config {
            gid,
            chid: LOOPBACK_CHID,
            system_eid: None,
            ueids: vec![DEFAULT_UEID],
            peer_id: [0; 8],
            dmb_size_code: 2,
            hostname: padded32(b""),
            release: SMC_RELEASE_1,
            link_id: 0,
            first_contact: true,
        }
    }
}

/// A DMB registered by the I/O layer for this connection (the one the peer will write into).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalDmb {
    /// Device-unique token the peer attaches with.
    pub token: u64,
    /// DMBE index (Linux always uses 0).
    pub idx: u8,
    /// Size code (`16 KiB << code`, 0..=6; up to 10 with [`FEATURE_LARGE_DMB`]).
    pub size_code: u8,
}

/// Why the I/O layer could not register a DMB (or, on the client, attach the peer's).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DmbFailure {
    /// All DMB slots are in use (declined with `MAX_DMB`).
    MaxDmb,
    /// Memory allocation failed (declined with `MEM`).
    Mem,
    /// The device went away (declined with `NOSMCDDEV`).
    NoDevice,
    /// Anything else, e.g. the device refused the attach (declined with `INTERR`).
    Internal,
}

impl DmbFailure {
    /// The decline code Linux uses.
    pub const fn diag(self) -> Diag {
        match self {
            DmbFailure::MaxDmb => Diag::MaxDmb,
            DmbFailure::Mem => Diag::Mem,
            DmbFailure::NoDevice => Diag::NoSmcdDev,
            DmbFailure::Internal => Diag::IntErr,
        }
    }
}

/// The peer's DMB as named in its accept (client side, see [`Handshake::peer_dmb`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerDmb {
    /// Token to attach with.
    pub token: u64,
    /// DMBE index.
    pub idx: u8,
    /// Size code (checked: `16 KiB << code` is a valid DMB size).
    pub size_code: u8,
}

/// What happened, as seen by the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input<'a> {
    /// One complete CLC message (header included, see [`crate::clc::message_len`]). Bytes that
    /// could not be framed may be passed too; they end the handshake.
    Message(&'a [u8]),
    /// The timer for the awaited message (or DMB) expired.
    Timeout,
    /// The DMB asked for by [`Action::RegisterDmb`] is ready.
    DmbRegistered(LocalDmb),
    /// The DMB asked for could not be registered.
    DmbFailed(DmbFailure),
    /// The I/O layer gives up (socket error, peer closed, shutdown): no more bytes are sent.
    Abort,
    /// The server's Accept is withdrawn, as decided in the server's DMB
    /// ([`crate::cdc::CdcHeader::claim_withdraw`]; see *Withdrawn accept* above). Server,
    /// waiting for the Confirm (its timer expired and its claim won): decline, in sync. Client,
    /// asked to register its DMB (its claim before the Confirm lost): no Confirm; it waits for
    /// the server's Decline, which follows the Accept. Anywhere else, and for a server whose
    /// client did not offer [`FEATURE_ACCEPT_WITHDRAW`]: as [`Input::Timeout`].
    AcceptWithdrawn,
}

/// What the I/O layer must do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Write these bytes (one CLC message) to the TCP connection.
    Send(Vec<u8>),
    /// Register a local DMB of this size code, then report [`Input::DmbRegistered`] or
    /// [`Input::DmbFailed`].
    RegisterDmb {
        /// Requested size code.
        size_code: u8,
    },
    /// Unregister this DMB: the handshake failed after it was registered.
    ReleaseDmb(LocalDmb),
    /// The handshake succeeded (terminal).
    Established(Established),
    /// The handshake failed; the connection stays plain TCP (terminal).
    Fallback(Fallback),
}

/// The result of a successful handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Established {
    /// The peer's GID (equal to ours: same host).
    pub peer_gid: Gid,
    /// The peer's CHID.
    pub peer_chid: u16,
    /// Token of the peer's DMB, to attach to and write into.
    pub peer_token: u64,
    /// DMBE index in the peer's DMB.
    pub peer_dmbe_idx: u8,
    /// The peer's DMB size code.
    pub peer_dmb_size_code: u8,
    /// The peer's DMB size in bytes, CDC header included (`16 KiB << code`); its data ring is
    /// `peer_dmb_size - 32` bytes ([`crate::cdc::Ring::for_dmb`]).
    pub peer_dmb_size: u32,
    /// The peer's link id.
    pub peer_link_id: u32,
    /// Our DMB, which the peer writes into.
    pub local: LocalDmb,
    /// Negotiated SMC version (2).
    pub version: u8,
    /// Negotiated SMCv2 release.
    pub release: u8,
    /// Negotiated EID.
    pub eid: Eid,
    /// Negotiated v2 feature bits (both ends offered them), e.g.
    /// [`crate::clc::FEATURE_SWITCH_ALONE`].
    pub feature_mask: u16,
}

/// Why the handshake ended in fallback to TCP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// The peer did not announce SMC in the TCP handshake: no CLC message was exchanged.
    PeerNoSmc,
    /// The peer sent a Decline with this diagnosis.
    DeclinedByPeer {
        /// The peer's diagnosis code.
        diag: u32,
    },
    /// We declined because of a protocol problem in what the peer sent (malformed,
    /// unexpected or inconsistent message), or an internal error.
    DeclinedByUs {
        /// The code we declined with.
        diag: Diag,
    },
    /// The peer or the local DMB did not answer in time.
    Timeout,
    /// The peer speaks only SMCv1 (or answered with v1).
    VersionMismatch,
    /// No common device: different host, no loopback device offered, or no common EID.
    NoCommonDevice(DeviceMismatch),
    /// No local DMB could be registered (or, on the client, the peer's attached).
    OutOfDmbs(DmbFailure),
    /// The local device is unavailable ([`Handshake::device_unavailable`]).
    NoLocalDevice {
        /// The code we declined with.
        diag: Diag,
    },
    /// The I/O layer aborted the handshake.
    Aborted,
}

impl FallbackReason {
    /// The reason as a Linux diagnosis code (as `smc->fallback_rsn` would record it: a
    /// received decline counts as `PEERDECL`).
    pub fn diag_code(&self) -> u32 {
        match self {
            FallbackReason::PeerNoSmc => Diag::PeerNoSmc.code(),
            FallbackReason::DeclinedByPeer { .. } => Diag::PeerDecl.code(),
            FallbackReason::DeclinedByUs { diag } => diag.code(),
            FallbackReason::Timeout => Diag::TimeoutCl.code(),
            FallbackReason::VersionMismatch => Diag::VersMismat.code(),
            FallbackReason::NoCommonDevice(m) => m.diag().code(),
            FallbackReason::OutOfDmbs(f) => f.diag().code(),
            FallbackReason::NoLocalDevice { diag } => diag.code(),
            FallbackReason::Aborted => Diag::IntErr.code(),
        }
    }
}

/// Why no common device was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceMismatch {
    /// The peer's loopback GID differs from ours: it is on another host.
    DifferentHost,
    /// The peer offered no device with our CHID (or no SMC-Dv2 at all).
    NoLoopbackOffered,
    /// The peer's SMCv2 release or feature mask does not allow Emulated-ISM devices.
    ReleaseTooOld,
    /// The peer offered neither a UEID nor a system EID.
    NoEidOffered,
    /// No EID in common.
    NoCommonEid,
    /// The peer's accept/confirm names a CHID we did not offer.
    UnexpectedChid,
    /// The peer's accept/confirm names an EID that was not negotiated.
    EidMismatch,
    /// The peer's first-contact release does not match the negotiated one.
    ReleaseMismatch,
}

impl DeviceMismatch {
    /// The decline code used for it.
    pub const fn diag(self) -> Diag {
        match self {
            DeviceMismatch::NoEidOffered => Diag::NoUeid,
            DeviceMismatch::ReleaseMismatch => Diag::ReleaseErr,
            _ => Diag::NoSmcDev,
        }
    }
}

/// The end of a failed handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fallback {
    /// Why.
    pub reason: FallbackReason,
    /// The diagnosis of the Decline we sent (in the preceding [`Action::Send`]), if any.
    pub sent_decline: Option<u32>,
    /// Whether the TCP stream is at a message boundary with nothing of the handshake left in
    /// flight, so plain TCP can continue; if false, reset the connection.
    pub in_sync: bool,
}

/// Client or server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends the proposal (the `connect` side).
    Client,
    /// Answers it (the `accept` side).
    Server,
}

/// Coarse state, for the I/O layer and for diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Not started.
    Init,
    /// Waiting for a CLC message of this type (or a decline).
    WaitMessage(MsgType),
    /// Waiting for [`Input::DmbRegistered`] / [`Input::DmbFailed`].
    WaitDmb,
    /// Finished with [`Action::Established`].
    Established,
    /// Finished with [`Action::Fallback`].
    Fallback,
}

/// What the server negotiated from the proposal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Negotiated {
    eid: Eid,
    release: u8,
    feature_mask: u16,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum St {
    Init,
    ClientWaitAccept,
    ClientWaitDmb {
        accept: AcceptConfirm,
        neg: Negotiated,
    },
    /// The server withdrew its Accept: its Decline follows.
    ClientWaitDecline,
    ServerWaitProposal,
    ServerWaitDmb {
        neg: Negotiated,
    },
    ServerWaitConfirm {
        neg: Negotiated,
        local: LocalDmb,
    },
    Done(bool),
}

/// One handshake (one TCP connection, one role).
#[derive(Clone, Debug)]
pub struct Handshake {
    role: Role,
    cfg: Config,
    peer_smc: bool,
    /// The local device is unavailable: decline with this code.
    no_device: Option<Diag>,
    /// The socket was handed over ([`Handshake::withdraw`]): decline with this code at our next
    /// message.
    withdrawn: Option<Diag>,
    st: St,
}

/// Failure while processing an input: what to decline with and why.
struct Fail {
    reason: FallbackReason,
    /// Decline with this code (None: do not send a decline).
    decline: Option<u32>,
    in_sync: bool,
}

impl Fail {
    fn declined(reason: FallbackReason, diag: Diag) -> Fail {
        Fail {
            reason,
            decline: Some(diag.code()),
            in_sync: true,
        }
    }
    fn protocol(diag: Diag, in_sync: bool) -> Fail {
        Fail {
            reason: FallbackReason::DeclinedByUs { diag },
            decline: Some(diag.code()),
            in_sync,
        }
    }
    fn device(m: DeviceMismatch) -> Fail {
        Fail::declined(FallbackReason::NoCommonDevice(m), m.diag())
    }
}

impl Handshake {
    /// A client handshake. `peer_announced_smc`: the peer's SYN-ACK carried the SMC option.
    pub fn client(cfg: Config, peer_announced_smc: bool) -> Handshake {
        Handshake {
            role: Role::Client,
            cfg,
            peer_smc: peer_announced_smc,
            no_device: None,
            withdrawn: None,
            st: St::Init,
        }
    }

    /// A server handshake. `peer_announced_smc`: the peer's SYN carried the SMC option.
    pub fn server(cfg: Config, peer_announced_smc: bool) -> Handshake {
        Handshake {
            role: Role::Server,
            cfg,
            peer_smc: peer_announced_smc,
            no_device: None,
            withdrawn: None,
            st: St::Init,
        }
    }

    /// The local device is unavailable (e.g. its daemon is down), so `cfg.gid` means nothing:
    /// a client declines at once with `diag` instead of proposing (the peer waits for a CLC
    /// message), a server declines the proposal with it. Without an SMC-announcing peer nothing
    /// is sent either way.
    pub fn device_unavailable(mut self, diag: Diag) -> Handshake {
        self.no_device = Some(diag);
        self
    }

    /// The socket leaves the end that runs this handshake (passed to another process, which
    /// cannot take over our DMB mappings): from now on, our next message is a Decline with
    /// `diag` wherever the protocol still allows one — a client declines instead of proposing
    /// or of confirming, a server instead of accepting — so both ends continue on plain TCP
    /// with the stream in sync. A server whose Accept is out already cannot withdraw: the
    /// client's Confirm decides.
    pub fn withdraw(&mut self, diag: Diag) {
        self.withdrawn = Some(diag);
    }

    /// Client, while asked to register its DMB (and after): the server's DMB named in its
    /// accept, for the I/O layer to attach before it reports [`Input::DmbRegistered`].
    pub fn peer_dmb(&self) -> Option<PeerDmb> {
        match &self.st {
            St::ClientWaitDmb { accept, .. } => Some(PeerDmb {
                token: accept.token,
                idx: accept.dmbe_idx,
                size_code: accept.dmbe_size,
            }),
            _ => None,
        }
    }

    /// Server waiting for the Confirm of a client that offered [`FEATURE_ACCEPT_WITHDRAW`]:
    /// when its wait is over, the I/O layer may withdraw the Accept (see *Withdrawn accept*).
    pub fn may_withdraw_accept(&self) -> bool {
        matches!(&self.st, St::ServerWaitConfirm { neg, .. }
            if neg.feature_mask & FEATURE_ACCEPT_WITHDRAW != 0)
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The coarse state.
    pub fn state(&self) -> State {
        match &self.st {
            St::Init => State::Init,
            St::ClientWaitAccept => State::WaitMessage(MsgType::Accept),
            St::ClientWaitDecline => State::WaitMessage(MsgType::Decline),
            St::ServerWaitProposal => State::WaitMessage(MsgType::Proposal),
            St::ServerWaitConfirm { .. } => State::WaitMessage(MsgType::Confirm),
            St::ClientWaitDmb { .. } | St::ServerWaitDmb { .. } => State::WaitDmb,
            St::Done(true) => State::Established,
            St::Done(false) => State::Fallback,
        }
    }

    /// The CLC message type awaited from the peer, if any (arm the CLC timer while `Some`).
    pub fn waiting_for(&self) -> Option<MsgType> {
        match self.state() {
            State::WaitMessage(t) => Some(t),
            _ => None,
        }
    }

    /// Whether a terminal action has been returned.
    pub fn is_finished(&self) -> bool {
        matches!(self.st, St::Done(_))
    }

    /// Start: the client sends its proposal; either side falls back at once if the peer did not
    /// announce SMC. Called implicitly by the first [`handle`](Self::handle); calling it again
    /// returns nothing.
    pub fn start(&mut self) -> Vec<Action> {
        if self.st != St::Init {
            return Vec::new();
        }
        if !self.peer_smc {
            self.st = St::Done(false);
            return vec![Action::Fallback(Fallback {
                reason: FallbackReason::PeerNoSmc,
                sent_decline: None,
                in_sync: true,
            })];
        }
        let decline = match (self.no_device, self.withdrawn) {
            (Some(diag), _) => Some((diag, FallbackReason::NoLocalDevice { diag })),
            (None, Some(diag)) => Some((diag, FallbackReason::DeclinedByUs { diag })),
            (None, None) => None,
        };
        match (self.role, decline) {
            (Role::Server, _) => {
                self.st = St::ServerWaitProposal;
                Vec::new()
            }
            (Role::Client, Some((diag, reason))) => {
                // The server waits for a CLC message: our decline is its answer.
                self.st = St::Done(false);
                vec![
                    Action::Send(Decline::new(SMC_V2, diag.code(), self.cfg.peer_id).encode()),
                    Action::Fallback(Fallback {
                        reason,
                        sent_decline: Some(diag.code()),
                        in_sync: true,
                    }),
                ]
            }
            (Role::Client, None) => match self.proposal().encode() {
                Ok(bytes) => {
                    self.st = St::ClientWaitAccept;
                    vec![Action::Send(bytes)]
                }
                // Only a bad configuration (e.g. more than 8 UEIDs) gets here; nothing was
                // sent yet, so the stream is untouched.
                Err(_) => {
                    self.st = St::Done(false);
                    vec![Action::Fallback(Fallback {
                        reason: FallbackReason::DeclinedByUs { diag: Diag::IntErr },
                        sent_decline: None,
                        in_sync: true,
                    })]
                }
            },
        }
    }

    /// Process one input and return the actions to perform, in order.
    pub fn handle(&mut self, input: Input<'_>) -> Vec<Action> {
        let mut out = self.start();
        if let St::Done(_) = self.st {
            // A registration after the end (e.g. requested before a timeout) is never used.
            if let Input::DmbRegistered(d) = input {
                out.push(Action::ReleaseDmb(d));
            }
            return out;
        }
        let st = std::mem::replace(&mut self.st, St::Done(false));
        let res = match input {
            Input::Abort => Err(Fail {
                reason: FallbackReason::Aborted,
                decline: None,
                in_sync: false,
            }),
            Input::AcceptWithdrawn => match &st {
                St::ServerWaitConfirm { neg, .. }
                    if neg.feature_mask & FEATURE_ACCEPT_WITHDRAW != 0 =>
                {
                    Err(Fail {
                        reason: FallbackReason::Timeout,
                        decline: Some(Diag::TimeoutCl.code()),
                        in_sync: true,
                    })
                }
                St::ClientWaitDmb { .. } => Ok((St::ClientWaitDecline, Vec::new())),
                _ => {
                    self.st = st;
                    out.extend(self.handle(Input::Timeout));
                    return out;
                }
            },
            Input::Timeout if st == St::ClientWaitDecline => Err(Fail {
                reason: FallbackReason::Timeout,
                decline: None,
                in_sync: false,
            }),
            Input::Timeout => {
                // Waiting for the local DMB: the peer waits for us, so a decline keeps the
                // stream in sync. Waiting for the peer: it may still be sending.
                let in_sync = matches!(st, St::ClientWaitDmb { .. } | St::ServerWaitDmb { .. });
                Err(Fail {
                    reason: FallbackReason::Timeout,
                    decline: Some(Diag::TimeoutCl.code()),
                    in_sync,
                })
            }
            Input::Message(bytes) => self.on_message(&st, bytes),
            Input::DmbRegistered(d) => self.on_dmb(&st, d),
            Input::DmbFailed(f) => match st {
                St::ClientWaitDmb { .. } | St::ServerWaitDmb { .. } => {
                    Err(Fail::declined(FallbackReason::OutOfDmbs(f), f.diag()))
                }
                _ => Err(Fail::protocol(Diag::IntErr, true)),
            },
        };
        // After the server withdrew its Accept its Decline is all that may come: anything else
        // is out of sync, and nothing is sent (our Decline would follow the server's last CLC
        // message and reach its application).
        let res = match res {
            Err(f)
                if st == St::ClientWaitDecline
                    && !matches!(f.reason, FallbackReason::DeclinedByPeer { .. }) =>
            {
                Err(Fail {
                    decline: None,
                    in_sync: false,
                    ..f
                })
            }
            r => r,
        };
        let local = match &st {
            St::ServerWaitConfirm { local, .. } => Some(*local),
            _ => None,
        };
        match res {
            Ok((next, actions)) => {
                self.st = next;
                out.extend(actions);
            }
            Err(fail) => {
                // A decline goes out only if the peer expects CLC from us (it announced SMC).
                let decline_version = decline_version(&input);
                if let Some(code) = fail.decline {
                    out.push(Action::Send(
                        Decline::new(decline_version, code, self.cfg.peer_id).encode(),
                    ));
                }
                if let Some(l) = local {
                    out.push(Action::ReleaseDmb(l));
                }
                if let Input::DmbRegistered(d) = input {
                    // A registration we cannot use (unexpected, or a bad size code).
                    out.push(Action::ReleaseDmb(d));
                }
                self.st = St::Done(false);
                out.push(Action::Fallback(Fallback {
                    reason: fail.reason,
                    sent_decline: fail.decline,
                    in_sync: fail.in_sync,
                }));
            }
        }
        out
    }

    fn proposal(&self) -> Proposal {
        let c = &self.cfg;
        let mut gidchids = vec![GidChid {
            gid: c.gid.gid,
            chid: c.chid,
        }];
        if crate::clc::is_emulated_chid(c.chid) {
            gidchids.push(GidChid {
                gid: c.gid.gid_ext,
                chid: c.chid,
            });
        }
        Proposal {
            version: SMC_V2,
            typev1: SmcType::N,
            typev2: SmcType::D,
            peer_id: [0; 8],
            ib_gid: [0; 16],
            ib_mac: [0; 6],
            ism_gid: 0,
            ism_chid: 0,
            ip_prefix: None,
            v2: Some(ProposalV2Ext {
                release: c.release,
                seid: c.system_eid.is_some(),
                roce_gid: [0; 16],
                max_conns: 0,
                max_links: 0,
                // We accept a peer's large DMB whatever our own size.
                feature_mask: OUR_FEATURES,
                ueids: c.ueids.clone(),
                smcd: Some(SmcdV2Ext {
                    system_eid: c.system_eid.unwrap_or([0; 32]),
                    gidchids,
                }),
            }),
        }
    }

    fn accept_confirm(&self, neg: &Negotiated, local: &LocalDmb) -> AcceptConfirm {
        let c = &self.cfg;
        AcceptConfirm {
            version: SMC_V2,
            first_contact: c.first_contact,
            gid: c.gid.gid,
            token: local.token,
            dmbe_idx: local.idx,
            dmbe_size: local.size_code,
            link_id: c.link_id,
            v2: Some(AcceptConfirmV2 {
                chid: c.chid,
                eid: neg.eid,
                gid_ext: if crate::clc::is_emulated_chid(c.chid) {
                    c.gid.gid_ext
                } else {
                    0
                },
                fce: c.first_contact.then_some(FirstContactExt {
                    v2_direct: false,
                    os_type: OS_LINUX,
                    release: neg.release,
                    hostname: c.hostname,
                    max_conns: 0,
                    max_links: 0,
                    feature_mask: if neg.release >= SMC_RELEASE_1 {
                        neg.feature_mask
                    } else {
                        0
                    },
                    vendor_exp_options: 0,
                }),
            }),
        }
    }

    fn on_message(&mut self, st: &St, bytes: &[u8]) -> Result<(St, Vec<Action>), Fail> {
        let framed = bytes
            .get(..HEADER_LEN)
            .and_then(|h| <&[u8; HEADER_LEN]>::try_from(h).ok())
            .is_some_and(|h| message_len(h) == Ok(bytes.len()));
        let msg = decode(bytes).map_err(|e| Fail::protocol(e.diag(), framed))?;
        if let ClcMessage::Decline(d) = &msg {
            return Err(Fail {
                reason: FallbackReason::DeclinedByPeer { diag: d.diagnosis },
                decline: None,
                in_sync: true,
            });
        }
        match (st, msg) {
            (St::ServerWaitProposal, ClcMessage::Proposal(p)) => self.on_proposal(&p),
            (St::ClientWaitAccept, ClcMessage::Accept(a)) => self.on_accept(a),
            (St::ServerWaitConfirm { neg, local }, ClcMessage::Confirm(c)) => {
                self.on_confirm(neg, local, &c)
            }
            // Anything else is out of sequence.
            _ => Err(Fail::protocol(Diag::SyncErr, true)),
        }
    }

    fn on_proposal(&mut self, p: &Proposal) -> Result<(St, Vec<Action>), Fail> {
        if let Some(diag) = self.no_device {
            return Err(Fail::declined(FallbackReason::NoLocalDevice { diag }, diag));
        }
        if let Some(diag) = self.withdrawn {
            return Err(Fail::protocol(diag, true));
        }
        if p.version == SMC_V1 {
            return Err(Fail::declined(
                FallbackReason::VersionMismatch,
                Diag::VersMismat,
            ));
        }
        let (v2, smcd) = match (&p.v2, p.typev2.smcd()) {
            (Some(v2), true) => match &v2.smcd {
                Some(s) => (v2, s),
                None => return Err(Fail::device(DeviceMismatch::NoLoopbackOffered)),
            },
            _ => return Err(Fail::device(DeviceMismatch::NoLoopbackOffered)),
        };
        if v2.ueids.is_empty() && !v2.seid {
            return Err(Fail::device(DeviceMismatch::NoEidOffered));
        }
        let release = v2.release.min(self.cfg.release);
        let feature_mask = v2.feature_mask & OUR_FEATURES;
        let devices = smcd.devices();
        let ours = devices
            .iter()
            .filter(|d| d.chid == self.cfg.chid)
            .collect::<Vec<_>>();
        if ours.is_empty() {
            return Err(Fail::device(DeviceMismatch::NoLoopbackOffered));
        }
        if crate::clc::is_emulated_chid(self.cfg.chid)
            && (release < SMC_RELEASE_1 || feature_mask & FEATURE_EMULATED_ISM == 0)
        {
            return Err(Fail::device(DeviceMismatch::ReleaseTooOld));
        }
        if !ours.iter().any(|d| d.gid == self.cfg.gid) {
            return Err(Fail::device(DeviceMismatch::DifferentHost));
        }
        let eid = self
            .match_eid(v2, &smcd.system_eid)
            .ok_or_else(|| Fail::device(DeviceMismatch::NoCommonEid))?;
        let neg = Negotiated {
            eid,
            release,
            feature_mask,
        };
        Ok((
            St::ServerWaitDmb { neg },
            vec![Action::RegisterDmb {
                size_code: self.local_size_code(&neg),
            }],
        ))
    }

    /// `smc_clc_match_eid`: the system EID if both enable it and they are equal, else the
    /// first proposed UEID that we also have.
    fn match_eid(&self, v2: &ProposalV2Ext, peer_seid: &Eid) -> Option<Eid> {
        if let Some(seid) = &self.cfg.system_eid {
            if v2.seid && seid == peer_seid {
                return Some(*seid);
            }
        }
        v2.ueids
            .iter()
            .find(|u| self.cfg.ueids.contains(u))
            .copied()
    }

    /// The EIDs we offered in our proposal.
    fn offered_eid(&self, eid: &Eid) -> bool {
        self.cfg.system_eid.as_ref() == Some(eid) || self.cfg.ueids.contains(eid)
    }

    /// The size code of our DMB: ours, capped at Linux's limit unless both ends offered large
    /// DMBs.
    fn local_size_code(&self, neg: &Negotiated) -> u8 {
        self.cfg.dmb_size_code.min(max_size_code(neg.feature_mask))
    }

    /// `large`: the peer may use a large-DMB size code (both ends offered the extension).
    fn check_peer_v2<'a>(
        &self,
        m: &'a AcceptConfirm,
        large: bool,
    ) -> Result<&'a AcceptConfirmV2, Fail> {
        let v2 = match (&m.v2, m.version) {
            (Some(v2), v) if v >= SMC_V2 => v2,
            _ => {
                return Err(Fail::declined(
                    FallbackReason::VersionMismatch,
                    Diag::VersMismat,
                ))
            }
        };
        if v2.chid != self.cfg.chid {
            return Err(Fail::device(DeviceMismatch::UnexpectedChid));
        }
        if m.sender_gid() != self.cfg.gid {
            return Err(Fail::device(DeviceMismatch::DifferentHost));
        }
        let max = if large {
            DMB_MAX_SIZE_CODE_LARGE
        } else {
            DMB_MAX_SIZE_CODE
        };
        if m.dmbe_size > max {
            return Err(Fail::protocol(Diag::SyncErr, true));
        }
        Ok(v2)
    }

    fn on_accept(&mut self, a: AcceptConfirm) -> Result<(St, Vec<Action>), Fail> {
        if let Some(diag) = self.withdrawn {
            return Err(Fail::protocol(diag, true));
        }
        // We offered large DMBs; the server uses one only when it echoes the bit.
        let large =
            a.v2.as_ref()
                .and_then(|v| v.fce.as_ref())
                .is_some_and(|f| f.feature_mask & FEATURE_LARGE_DMB != 0);
        let v2 = self.check_peer_v2(&a, large)?;
        if !self.offered_eid(&v2.eid) {
            return Err(Fail::device(DeviceMismatch::EidMismatch));
        }
        let release = match &v2.fce {
            Some(f) => {
                if f.release > self.cfg.release {
                    return Err(Fail::device(DeviceMismatch::ReleaseMismatch));
                }
                f.release
            }
            None => self.cfg.release,
        };
        if crate::clc::is_emulated_chid(self.cfg.chid) && release < SMC_RELEASE_1 {
            return Err(Fail::device(DeviceMismatch::ReleaseTooOld));
        }
        let feature_mask = v2
            .fce
            .as_ref()
            .map_or(FEATURE_EMULATED_ISM, |f| f.feature_mask & OUR_FEATURES);
        let neg = Negotiated {
            eid: v2.eid,
            release,
            feature_mask,
        };
        Ok((
            St::ClientWaitDmb { accept: a, neg },
            vec![Action::RegisterDmb {
                size_code: self.local_size_code(&neg),
            }],
        ))
    }

    fn on_confirm(
        &mut self,
        neg: &Negotiated,
        local: &LocalDmb,
        c: &AcceptConfirm,
    ) -> Result<(St, Vec<Action>), Fail> {
        let v2 = self.check_peer_v2(c, neg.feature_mask & FEATURE_LARGE_DMB != 0)?;
        if v2.eid != neg.eid {
            return Err(Fail::device(DeviceMismatch::EidMismatch));
        }
        if let Some(f) = &v2.fce {
            if f.release != neg.release {
                return Err(Fail::device(DeviceMismatch::ReleaseMismatch));
            }
        }
        let est = established(c, *local, neg);
        Ok((St::Done(true), vec![Action::Established(est)]))
    }

    fn on_dmb(&mut self, st: &St, d: LocalDmb) -> Result<(St, Vec<Action>), Fail> {
        match st {
            St::ClientWaitDmb { .. } | St::ServerWaitDmb { .. } => {}
            // A registration nobody asked for: give it back and stop.
            _ => return Err(Fail::protocol(Diag::IntErr, true)),
        }
        let neg = match st {
            St::ServerWaitDmb { neg } | St::ClientWaitDmb { neg, .. } => neg,
            _ => return Err(Fail::protocol(Diag::IntErr, true)),
        };
        if d.size_code > max_size_code(neg.feature_mask) {
            return Err(Fail::protocol(Diag::IntErr, true));
        }
        match st {
            St::ServerWaitDmb { neg } => {
                let bytes = self
                    .accept_confirm(neg, &d)
                    .encode(MsgType::Accept)
                    .map_err(|_| Fail::protocol(Diag::IntErr, true))?;
                Ok((
                    St::ServerWaitConfirm {
                        neg: *neg,
                        local: d,
                    },
                    vec![Action::Send(bytes)],
                ))
            }
            St::ClientWaitDmb { accept, neg } => {
                let bytes = self
                    .accept_confirm(neg, &d)
                    .encode(MsgType::Confirm)
                    .map_err(|_| Fail::protocol(Diag::IntErr, true))?;
                let est = established(accept, d, neg);
                Ok((
                    St::Done(true),
                    vec![Action::Send(bytes), Action::Established(est)],
                ))
            }
            _ => Err(Fail::protocol(Diag::IntErr, true)),
        }
    }
}

/// The largest DMB size code allowed with this negotiated feature mask.
fn max_size_code(feature_mask: u16) -> u8 {
    if feature_mask & FEATURE_LARGE_DMB != 0 {
        DMB_MAX_SIZE_CODE_LARGE
    } else {
        DMB_MAX_SIZE_CODE
    }
}

/// Declines answer a v1 message with v1 (as Linux does), everything else with v2.
fn decline_version(input: &Input<'_>) -> u8 {
    match input {
        Input::Message(b) if b.get(7).is_some_and(|v| v >> 4 == SMC_V1) => SMC_V1,
        _ => SMC_V2,
    }
}

fn established(peer: &AcceptConfirm, local: LocalDmb, neg: &Negotiated) -> Established {
    Established {
        peer_gid: peer.sender_gid(),
        peer_chid: peer.v2.as_ref().map_or(0, |v| v.chid),
        peer_token: peer.token,
        peer_dmbe_idx: peer.dmbe_idx,
        peer_dmb_size_code: peer.dmbe_size,
        // Checked by `check_peer_v2`; 0 cannot happen.
        peer_dmb_size: dmb_size_from_code_large(peer.dmbe_size).unwrap_or(0),
        peer_link_id: peer.link_id,
        local,
        version: SMC_V2,
        release: neg.release,
        eid: neg.eid,
        feature_mask: neg.feature_mask,
    }
}

#[cfg(test)]
mod tests;
