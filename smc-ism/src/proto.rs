//! The wire protocol between [`Client`](crate::Client) and the daemon.
//!
//! Transport: a Unix `SOCK_SEQPACKET` socket. One request is one record, one reply is one
//! record, so framing can never be lost: a malformed record is answered with an error and the
//! next record is parsed from scratch. File descriptors travel as `SCM_RIGHTS` ancillary data
//! attached to the record (the caller's TCP socket in `REGISTER`/`ATTACH` requests, the DMB's
//! memfd in their replies).
//!
//! Every record starts with a 16-byte header, all fields little-endian:
//!
//! | offset | size | field                                                           |
//! |--------|------|-----------------------------------------------------------------|
//! | 0      | 4    | magic [`MAGIC`] (`"SMCI"` read as a little-endian u32)          |
//! | 4      | 2    | protocol version ([`VERSION`])                                  |
//! | 6      | 2    | op (requests: `OP_*`; replies: the request's op with [`REPLY_BIT`]) |
//! | 8      | 4    | payload length in bytes (must equal the record length − 16)     |
//! | 12     | 4    | sequence number, chosen by the client and echoed in the reply   |
//!
//! A reply payload starts with `status: u32` ([`Status`]) and `detail: u32` (an errno for
//! [`Status::Mem`], the daemon's version for [`Status::BadVersion`], 0 otherwise), followed by
//! the op's result when the status is [`Status::Ok`].
//!
//! Request payloads:
//! - `OP_QUERY_GID`: empty. Result: `gid: u64, gid_ext: u64, chid: u16, max_size_code: u8,
//!   reserved: u8, features: u32`.
//! - `OP_REGISTER`: `size_code: u8, flags: u8, reserved: [u8; 6]` + the caller's connected TCP
//!   socket (whose peer socket's cookie the daemon records). Result: [`DmbReply`] + the memfd.
//!   Flag [`REGISTER_RECORD_PROOF`]: the daemon records what the socket proves (its identity;
//!   the socket itself goes to the closer as always) with the registration, for this client's
//!   attach of its peer's DMB (`own` below): a server that has sent its CLC accept cannot
//!   decline any more, and must not fail when the daemon is out of descriptors. The record
//!   goes at that attach's success, or when the owner reference goes.
//! - `OP_ATTACH`: `token: u64` + the caller's end of the same TCP connection (its `SO_COOKIE`
//!   must be the recorded peer cookie). Result: [`DmbReply`] + the memfd. Or `token: u64,
//!   own: u64`: when the kernel dropped the socket passed (`MSG_CTRUNC`, the daemon out of
//!   descriptors) and `own` is a registration of this client recorded with
//!   [`REGISTER_RECORD_PROOF`], its record is the proof.
//! - `OP_DETACH`, `OP_UNREGISTER`: `token: u64`. Result: empty.
//! - `OP_RELEASE`: `own: u64, peer: u64` (0: none), optionally `flags: u32, reserved: u32`:
//!   drops the owner reference of `own` and the attach reference of `peer` in one record
//!   (counted as an unregister and a detach). Flags ([`FEATURE_POOL`]): [`RELEASE_POOL_OWN`]
//!   keeps `own` registered, unbound, in the caller's pool of DMBs (see `OP_PAIR`) instead of
//!   freeing it, when the pool has room and the DMB may be reused; [`RELEASE_TAINT_PEER`]: the
//!   caller may still write into `peer` (another process shares the connection), so it is
//!   never reused, and both references stay while the caller's socket of the connection is
//!   held by a process (for it to adopt). Result: empty; `NotHeld` if either was not held (the other is still
//!   released).
//! - `OP_ATTACH_PEER`: empty + the caller's connected TCP socket. Attaches the live DMB that
//!   the other end of this very connection registered (the same mirror proof as `OP_ATTACH`,
//!   and both sockets in one network namespace, where a mirrored 4-tuple cannot be forged), so
//!   that a server can attach before the client's token arrives in the CLC confirm (it then
//!   checks the token). Result: [`DmbReply`] + the memfd; `StaleToken` when there is none.
//!   Or `own: u64`: a record for a socket dropped, as for `OP_ATTACH`.
//! - `OP_REGISTER` may carry a second fd after the socket: a memfd of the owner's local state
//!   page (4 KiB, checked to be a shmem file of that size, else closed), kept with the DMB for
//!   `OP_ADOPT` and closed with it.
//! - `OP_ADOPT`: `which: u8` ([`ADOPT_OWN`]: the DMB the caller's socket registered, its
//!   receive ring; [`ADOPT_PEER`]: the DMB of the other end, its send ring; [`ADOPT_STATE`]:
//!   the state page registered with the first), `flags: u8` ([`ADOPT_FLAG_SLOT`]: the caller
//!   takes a local state that is a slot of a shared page, [`FEATURE_STATE_SLOTS`]),
//!   `reserved: [u8; 6]` + the caller's connected TCP socket. For a process the socket moved to (`SCM_RIGHTS`, `exec`): the DMB whose owner
//!   socket *is* this socket (same `SO_COOKIE`), registered by a client of the caller's uid,
//!   cgroup and pid namespace, while its record lives (also after its owner's unregister, as
//!   long as the peer still holds it). Grants an attach reference. Result: [`DmbReply`] + the
//!   memfd; `StaleToken` when there is none, `BadProof` when the caller is not the owner's
//!   uid/cgroup/pid namespace. An `ADOPT_STATE` with [`ADOPT_FLAG_SLOT`] is answered with
//!   [`ADOPT_STATE_REPLY_LEN`] bytes: the [`DmbReply`], then `state_off: u32, flags: u32`
//!   ([`STATE_IS_SLOT`]: the state is the [`STATE_SLOT`] bytes at `state_off` of the memfd, a
//!   page shared with other connection ends of the registering client; else the whole page);
//!   without the flag, a state that is a slot is not handed over (`StaleToken`).
//! - `OP_PAIR`: `size_code: u8, flags: u8, reserved: [u8; 2], park_ms: u32, reserved: u64`
//!   (flag [`PAIR_FLAG_STATE_SLOT`]: a DMB registered for the caller comes with a local state
//!   that is a slot, see below; with it [`PAIR_FLAG_NEW_SLOT_PAGE`]: the caller forked, its
//!   slots come from a new page from now on), then up to
//!   [`PAIR_RELEASES_MAX`] releases of 24 bytes each (`own: u64, peer: u64, flags: u32,
//!   reserved: u32`, handled first, as `OP_RELEASE` records: a process sends the releases of
//!   its finished short connections with its next pair, one record and one wakeup of the
//!   daemon instead of several) + the caller's connected TCP socket ([`FEATURE_PAIR`]). Both ends of a connection send it (the client
//!   with its CLC proposal, the server when it reads the proposal): the daemon answers both
//!   once the second arrives, each with its own DMB (registered, or one of its pooled DMBs that
//!   only this peer's process ever attached, bound to this connection) and the peer's, attached
//!   (the mirror proof of `OP_ATTACH`: the two sockets are the two ends of one connection).
//!   The first to arrive waits at most `park_ms` (capped at 10 s; [`Status::NoPeer`] then), so
//!   **its reply may come after replies to later requests** of the same connection: replies
//!   carry the request's sequence number. A peer that registers with `OP_REGISTER` instead
//!   completes a waiting `OP_PAIR` too, and an `OP_PAIR` attaches a DMB the peer registered
//!   so. Result: [`PAIR_REPLY_LEN`] bytes, own [`DmbReply`] + own id (u64) + peer
//!   [`DmbReply`] + peer id (u64) + `flags: u32, reserved: u32`; the two memfds, own first,
//!   then, with [`PAIR_OWN_STATE`], the own DMB's local state page: a sealed 4 KiB memfd the
//!   daemon created with the DMB (a pooled DMB keeps its page), which the owner uses as that
//!   end's local state and which `OP_ADOPT` hands to a process the socket moves to, as the
//!   one a `REGISTER` carries. A DMB id is never reused by any daemon instance (random
//!   start), so a process may keep a mapping of a DMB (and of its state page) across its
//!   bindings and recognise it by id. With [`PAIR_STATE_SLOT`] (asked for with
//!   [`PAIR_FLAG_STATE_SLOT`]) the local state is not a page of its own but the [`STATE_SLOT`]
//!   bytes at `state_off` (the result's last `u32`) of that memfd: a page of 16 slots the
//!   daemon hands out, in order and never twice, to the DMBs it registers for one client
//!   connection (one process), so that an idle connection end costs 256 bytes of state
//!   instead of 4 KiB. A slot lives with its DMB (a pooled DMB keeps it); the page lives while
//!   any of its slots' DMBs does, or a process maps it.
//! - `OP_CANCEL`: `seq: u32, reserved: u32`: the caller's `OP_PAIR` of that sequence number
//!   no longer waits (its reply comes at once, [`Status::Cancelled`], unless it was answered
//!   already). Usually with [`NOREPLY_BIT`].
//! - `OP_SWEEP`: empty + the caller's listening TCP socket, whose SMC announcement it withdrew
//!   before an exec into an image without the data path. The daemon quarantines the connections
//!   queued at it (see the op's docs). Or ([`FEATURE_SWEEP_PEER`]) the caller's connected client
//!   socket: the daemon quarantines that connection's server end, if no data path claimed it.
//!   Result: empty, once done.
//! - `OP_STATS`: empty. Result: [`Stats`](crate::Stats) as JSON.
//! - `OP_WAIT`: `generation: u64, timeout_ms: u32, reserved: u32`. The daemon answers once its
//!   release generation differs from `generation` or the timeout (capped at 60 s) expires.
//!   Result: [`Stats`](crate::Stats) as JSON.
//! - `OP_LIST`: `start_slot: u32, max: u32`. Result: [`DmbList`](crate::DmbList) as JSON: the
//!   live DMBs with slot ≥ `start_slot` in slot order, at most `max` (capped at
//!   [`LIST_PAGE_MAX`]), and the slot to continue from. A caller whose uid (`SO_PEERCRED`) is 0
//!   gets every DMB with its token; any other uid only the DMBs its own connections
//!   registered, without tokens. (`OP_STATS`/`OP_WAIT` likewise list per-cgroup figures to
//!   root only.)
//!
//! Request records are decoded by [`decode_request`] (fuzzed). `QuotaDmbs` carries detail 2
//! when the caller's uid limit refused the registration (0: its cgroup's quota).
//!
//! Requests larger than [`MAX_REQUEST`] bytes are answered with [`Status::Oversized`].
//!
//! A request whose op carries [`NOREPLY_BIT`] gets no reply at all (only `OP_DETACH`,
//! `OP_UNREGISTER`, `OP_RELEASE` and `OP_CANCEL`; with any other op the bit makes the request
//! `Malformed`, answered as usual): the data path releases DMBs at close without waiting.
//!
//! The `QUERY_GID` result's last `u32` is a feature mask ([`FEATURE_RELEASE`],
//! [`FEATURE_NOREPLY`], [`FEATURE_ATTACH_PEER`], [`FEATURE_ADOPT`], [`FEATURE_PAIR`],
//! [`FEATURE_POOL`], [`FEATURE_RECORDED_PROOF`]); daemons that predate them send 0, so a client
//! uses those requests only after a `QUERY_GID` on the same connection advertised them.

/// `"SMCI"` as a little-endian u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SMCI");
/// The protocol version spoken by this crate.
pub const VERSION: u16 = 1;
/// Size of the fixed header.
pub const HEADER_LEN: usize = 16;
/// Largest request record the daemon accepts (header included).
pub const MAX_REQUEST: usize = 256;
/// Set in the op field of every reply.
pub const REPLY_BIT: u16 = 0x8000;
/// Set in the op field of a request that wants no reply.
pub const NOREPLY_BIT: u16 = 0x4000;

/// Query the device identity (GID, CHID).
pub const OP_QUERY_GID: u16 = 1;
/// Register a new DMB (owner side).
pub const OP_REGISTER: u16 = 2;
/// Attach to the peer's DMB.
pub const OP_ATTACH: u16 = 3;
/// Drop one attachment.
pub const OP_DETACH: u16 = 4;
/// Drop the owner's registration.
pub const OP_UNREGISTER: u16 = 5;
/// Counters and gauges as JSON.
pub const OP_STATS: u16 = 6;
/// Wait for the release generation to change, then return stats.
pub const OP_WAIT: u16 = 7;
/// List live DMBs (tokens only for root).
pub const OP_LIST: u16 = 8;
/// Release an owner and an attach reference in one record.
pub const OP_RELEASE: u16 = 9;
/// Attach the DMB registered by the other end of the caller's TCP connection.
pub const OP_ATTACH_PEER: u16 = 10;
/// Attach a DMB of the connection whose socket the caller now holds (moved to it).
pub const OP_ADOPT: u16 = 11;
/// Register (or reuse a pooled) DMB and attach the peer's, both ends at once.
pub const OP_PAIR: u16 = 12;
/// Stop waiting for a peer in an `OP_PAIR`.
pub const OP_CANCEL: u16 = 13;
/// Take the caller's TCP socket out of the eBPF SOCKHASH: its SMC-D connection continues on
/// plain TCP (the data path's switch to TCP, `smc-preload` DESIGN.md *Switch to TCP*), and a
/// SOCKHASH member reads through `tcp_bpf`, which is not quite TCP. Empty payload, empty
/// result; the socket goes along as the proof.
pub const OP_LEAVE_SHORTCUT: u16 = 14;
/// Quarantine the connections queued at the caller's listening socket (passed along, the
/// proof), whose SMC announcement the caller withdrew before an exec into an image without the
/// data path: their clients' CLC messages are stripped off their streams (`smc-ebpf`'s
/// `quarantine.rs`). With a connected client socket instead ([`FEATURE_SWEEP_PEER`]): the
/// server end of that connection alone, when it is a passive socket whose client announced
/// SMC and that no data path claimed (asked by a client whose Accept did not come, before it
/// half-closes). Empty payload, empty result, once the sweep is done.
pub const OP_SWEEP: u16 = 15;
/// Highest op code.
pub const OP_MAX: u16 = OP_SWEEP;
/// `OP_ADOPT`: the DMB registered with the caller's socket.
pub const ADOPT_OWN: u8 = 0;
/// `OP_ADOPT`: the DMB of the other end of the caller's connection.
pub const ADOPT_PEER: u8 = 1;
/// `OP_ADOPT`: the local state page registered with the caller's socket.
pub const ADOPT_STATE: u8 = 2;
/// Size of the local state page a `REGISTER` may carry.
pub const STATE_PAGE: u64 = 4096;
/// Size of a local state slot ([`PAIR_STATE_SLOT`]); slots of one page are this far apart.
pub const STATE_SLOT: u64 = 256;
/// `OP_PAIR` request flag: a DMB registered for the caller may come with a state slot.
pub const PAIR_FLAG_STATE_SLOT: u8 = 1 << 0;
/// `OP_PAIR` request flag (with [`PAIR_FLAG_STATE_SLOT`], [`FEATURE_NEW_SLOT_PAGE`]): the caller
/// forked since it last said so; the slots of this request and of its later ones come from a
/// page that none of its earlier slots is on (a child it forked maps those pages), and no
/// pooled DMB of its whose slot is on such a page is bound again.
pub const PAIR_FLAG_NEW_SLOT_PAGE: u8 = 1 << 1;
/// `OP_ADOPT` request flag: the caller takes a state slot (see [`ADOPT_STATE_REPLY_LEN`]).
pub const ADOPT_FLAG_SLOT: u8 = 1 << 0;
/// Length of the result of an `ADOPT_STATE` asked with [`ADOPT_FLAG_SLOT`].
pub const ADOPT_STATE_REPLY_LEN: usize = DMB_REPLY_LEN + 8;
/// Flag of an `ADOPT_STATE` result: the state is a slot of the page (`state_off`).
pub const STATE_IS_SLOT: u32 = 1 << 0;

/// Feature: `OP_RELEASE`.
pub const FEATURE_RELEASE: u32 = 1 << 0;
/// Feature: [`NOREPLY_BIT`].
pub const FEATURE_NOREPLY: u32 = 1 << 1;
/// Feature: `OP_ATTACH_PEER`.
pub const FEATURE_ATTACH_PEER: u32 = 1 << 2;
/// Feature: `OP_ADOPT`.
pub const FEATURE_ADOPT: u32 = 1 << 3;
/// Feature: `OP_PAIR` and `OP_CANCEL` (replies of `OP_PAIR` may come out of order).
pub const FEATURE_PAIR: u32 = 1 << 4;
/// Feature: the flags of `OP_RELEASE` (pooled DMBs).
pub const FEATURE_POOL: u32 = 1 << 5;
/// Feature: [`REGISTER_RECORD_PROOF`] and the attaches it proves (`own`).
pub const FEATURE_RECORDED_PROOF: u32 = 1 << 6;
/// Feature: `OP_LEAVE_SHORTCUT`.
pub const FEATURE_LEAVE_SHORTCUT: u32 = 1 << 7;
/// Feature: local state slots ([`PAIR_FLAG_STATE_SLOT`], [`ADOPT_FLAG_SLOT`]).
pub const FEATURE_STATE_SLOTS: u32 = 1 << 8;
/// Feature: [`PAIR_FLAG_NEW_SLOT_PAGE`].
pub const FEATURE_NEW_SLOT_PAGE: u32 = 1 << 9;
/// Feature: `OP_SWEEP`.
pub const FEATURE_SWEEP: u32 = 1 << 10;
/// Feature: `OP_SWEEP` of a connected client socket (its server end).
pub const FEATURE_SWEEP_PEER: u32 = 1 << 11;
/// Every feature this crate's daemon offers.
pub const FEATURES: u32 = FEATURE_RELEASE
    | FEATURE_LEAVE_SHORTCUT
    | FEATURE_NOREPLY
    | FEATURE_ATTACH_PEER
    | FEATURE_ADOPT
    | FEATURE_PAIR
    | FEATURE_POOL
    | FEATURE_RECORDED_PROOF
    | FEATURE_STATE_SLOTS
    | FEATURE_NEW_SLOT_PAGE
    | FEATURE_SWEEP
    | FEATURE_SWEEP_PEER;

/// `OP_REGISTER` flag: record what the passed socket proves, for a later attach whose socket
/// the daemon could not receive (see the module documentation).
pub const REGISTER_RECORD_PROOF: u8 = 1 << 0;

/// `OP_RELEASE` flag: keep the released own DMB in the caller's pool.
pub const RELEASE_POOL_OWN: u32 = 1 << 0;
/// `OP_RELEASE` flag: never reuse the released peer DMB.
pub const RELEASE_TAINT_PEER: u32 = 1 << 1;

/// Longest wait of an `OP_PAIR` for its peer.
pub const PAIR_PARK_MAX_MS: u32 = 10_000;

/// Releases carried by one `OP_PAIR` at most.
pub const PAIR_RELEASES_MAX: usize = 8;

/// One release carried by an `OP_PAIR`: own, peer, flags (see `OP_RELEASE`).
pub type PairRelease = (u64, u64, u32);

/// Largest page of `OP_LIST`.
pub const LIST_PAGE_MAX: u32 = 128;

/// Length of the status prefix of every reply payload.
pub const STATUS_LEN: usize = 8;
/// Length of the `REGISTER`/`ATTACH` result.
pub const DMB_REPLY_LEN: usize = 24;
/// Length of the `QUERY_GID` result.
pub const GID_REPLY_LEN: usize = 24;
/// Length of the `OP_PAIR` result.
pub const PAIR_REPLY_LEN: usize = 72;
/// `OP_PAIR` result flag: a third fd, the own DMB's local state page, follows the memfds.
pub const PAIR_OWN_STATE: u32 = 1 << 0;
/// `OP_PAIR` result flag (with [`PAIR_OWN_STATE`]): the local state is the [`STATE_SLOT`]
/// bytes at `state_off` (the result's last `u32`) of that memfd.
pub const PAIR_STATE_SLOT: u32 = 1 << 1;

/// Reply status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The record could not be parsed (bad magic, length mismatch, short payload).
    Malformed = 1,
    /// The record is larger than [`MAX_REQUEST`].
    Oversized = 2,
    /// Unsupported protocol version; `detail` carries the daemon's version.
    BadVersion = 3,
    /// Unknown op.
    UnknownOp = 4,
    /// DMB size code above 6.
    BadSize = 5,
    /// No free DMB slot on the device.
    MaxDmb = 6,
    /// The caller's cgroup holds its maximum number of DMBs.
    QuotaDmbs = 7,
    /// The caller's cgroup holds its maximum number of DMB bytes.
    QuotaBytes = 8,
    /// Out of memory: device byte limit, memory pressure, or memfd/ftruncate failed (`detail` =
    /// errno when a syscall failed).
    Mem = 9,
    /// No socket passed, or it is not an established TCP socket.
    BadSocket = 10,
    /// No live DMB has this token.
    StaleToken = 11,
    /// The socket passed is not the other end of the owner's TCP connection.
    BadProof = 12,
    /// This client holds no such reference (detach/unregister).
    NotHeld = 13,
    /// Unexpected daemon-side failure.
    Internal = 14,
    /// The daemon is shutting down.
    ShuttingDown = 15,
    /// `OP_PAIR`: the peer did not ask within the wait.
    NoPeer = 16,
    /// `OP_PAIR`: cancelled by the caller (`OP_CANCEL`).
    Cancelled = 17,
}

impl Status {
    /// Decodes a wire value; unknown values map to [`Status::Internal`].
    pub fn from_u32(v: u32) -> Status {
        use Status::*;
        match v {
            0 => Ok,
            1 => Malformed,
            2 => Oversized,
            3 => BadVersion,
            4 => UnknownOp,
            5 => BadSize,
            6 => MaxDmb,
            7 => QuotaDmbs,
            8 => QuotaBytes,
            9 => Mem,
            10 => BadSocket,
            11 => StaleToken,
            12 => BadProof,
            13 => NotHeld,
            15 => ShuttingDown,
            16 => NoPeer,
            17 => Cancelled,
            _ => Internal,
        }
    }
}

/// The fixed record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Must be [`MAGIC`].
    pub magic: u32,
    /// Protocol version.
    pub version: u16,
    /// Op code (with [`REPLY_BIT`] in replies).
    pub op: u16,
    /// Payload length.
    pub len: u32,
    /// Sequence number.
    pub seq: u32,
}

impl Header {
    /// A header for the current version.
    pub fn new(op: u16, len: usize, seq: u32) -> Header {
        Header {
            magic: MAGIC,
            version: VERSION,
            op,
            len: len as u32,
            seq,
        }
    }

    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    pub fn encode(&self, out: &mut [u8]) {
        out[0..4].copy_from_slice(&self.magic.to_le_bytes());
        out[4..6].copy_from_slice(&self.version.to_le_bytes());
        out[6..8].copy_from_slice(&self.op.to_le_bytes());
        out[8..12].copy_from_slice(&self.len.to_le_bytes());
        out[12..16].copy_from_slice(&self.seq.to_le_bytes());
    }

    /// Reads a header; `None` when `buf` is shorter than [`HEADER_LEN`].
    pub fn decode(buf: &[u8]) -> Option<Header> {
        if buf.len() < HEADER_LEN {
            return None;
        }
        Some(Header {
            magic: get_u32(buf, 0),
            version: u16::from_le_bytes([buf[4], buf[5]]),
            op: u16::from_le_bytes([buf[6], buf[7]]),
            len: get_u32(buf, 8),
            seq: get_u32(buf, 12),
        })
    }
}

/// The result of `REGISTER` and `ATTACH`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmbReply {
    /// The DMB token.
    pub token: u64,
    /// The device slot (DMB index in the device's bitmap).
    pub slot: u32,
    /// The DMB element index as carried in CLC (`dmbe_idx`); always 0, one element per DMB.
    pub idx: u8,
    /// Size code (`size = 16 KiB << size_code`).
    pub size_code: u8,
    /// Size in bytes.
    pub size: u64,
}

impl DmbReply {
    /// Encodes into [`DMB_REPLY_LEN`] bytes.
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.token.to_le_bytes());
        out[8..12].copy_from_slice(&self.slot.to_le_bytes());
        out[12] = self.idx;
        out[13] = self.size_code;
        out[14..16].fill(0);
        out[16..24].copy_from_slice(&self.size.to_le_bytes());
    }

    /// Decodes; `None` if too short.
    pub fn decode(buf: &[u8]) -> Option<DmbReply> {
        if buf.len() < DMB_REPLY_LEN {
            return None;
        }
        Some(DmbReply {
            token: get_u64(buf, 0),
            slot: get_u32(buf, 8),
            idx: buf[12],
            size_code: buf[13],
            size: get_u64(buf, 16),
        })
    }
}

/// A request record, decoded ([`decode_request`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `OP_QUERY_GID`.
    QueryGid,
    /// `OP_REGISTER` (size code ≤ [`smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE`], 10).
    Register {
        /// `16 KiB << size_code` bytes.
        size_code: u8,
        /// [`REGISTER_RECORD_PROOF`].
        record: bool,
    },
    /// `OP_ATTACH`.
    Attach {
        /// The owner's token.
        token: u64,
        /// The caller's registration whose recorded proof stands in for a socket dropped
        /// (0: none).
        own: u64,
    },
    /// `OP_ATTACH_PEER`.
    AttachPeer {
        /// As for [`Request::Attach`].
        own: u64,
    },
    /// `OP_ADOPT`.
    Adopt {
        /// [`ADOPT_OWN`], [`ADOPT_PEER`] or [`ADOPT_STATE`].
        which: u8,
        /// [`ADOPT_FLAG_SLOT`]: the caller takes a state slot.
        slot_ok: bool,
    },
    /// `OP_DETACH`.
    Detach {
        /// The token of the attach reference.
        token: u64,
    },
    /// `OP_UNREGISTER`.
    Unregister {
        /// The token of the owner reference.
        token: u64,
    },
    /// `OP_RELEASE` (0: none).
    Release {
        /// Owner reference to drop.
        own: u64,
        /// Attach reference to drop.
        peer: u64,
        /// `RELEASE_*` flags.
        flags: u32,
    },
    /// `OP_PAIR` (`park_ms` capped at [`PAIR_PARK_MAX_MS`]).
    Pair {
        /// `16 KiB << size_code` bytes.
        size_code: u8,
        /// How long to wait for the peer.
        park_ms: u32,
        /// Releases to handle first (the first `n_releases`).
        releases: [PairRelease; PAIR_RELEASES_MAX],
        /// How many of `releases` there are.
        n_releases: u8,
        /// [`PAIR_FLAG_STATE_SLOT`].
        state_slot: bool,
        /// [`PAIR_FLAG_NEW_SLOT_PAGE`] (only with `state_slot`).
        new_slot_page: bool,
    },
    /// `OP_CANCEL`.
    Cancel {
        /// The sequence number of the `OP_PAIR`.
        seq: u32,
    },
    /// `OP_LEAVE_SHORTCUT`.
    LeaveShortcut,
    /// `OP_SWEEP`.
    Sweep,
    /// `OP_STATS`.
    Stats,
    /// `OP_WAIT` (timeout capped at 60 s).
    Wait {
        /// The generation the caller knows.
        generation: u64,
        /// Milliseconds at most.
        timeout_ms: u32,
    },
    /// `OP_LIST` (`max` clamped to 1..=[`LIST_PAGE_MAX`]).
    List {
        /// First slot.
        start: u32,
        /// Entries at most.
        max: u32,
    },
}

impl Request {
    /// Whether this request takes the caller's TCP socket (for `OP_SWEEP` a listening one, or
    /// a connected client).
    pub fn takes_socket(&self) -> bool {
        matches!(
            self,
            Request::Register { .. }
                | Request::Attach { .. }
                | Request::AttachPeer { .. }
                | Request::Adopt { .. }
                | Request::Pair { .. }
                | Request::LeaveShortcut
                | Request::Sweep
        )
    }
}

/// A decoded request record: what to answer (op and sequence) and the request or why it is
/// refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// The op to answer with (without [`NOREPLY_BIT`]; 0 when the header is unreadable).
    pub op: u16,
    /// The sequence number to echo.
    pub seq: u32,
    /// The request wants no reply.
    pub noreply: bool,
    /// The request, or the status to answer with. `header` tells whether the record as a
    /// whole was refused (counted as invalid) rather than its op's payload.
    pub request: Result<Request, RequestError>,
}

/// Why a record is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestError {
    /// The status to answer.
    pub status: Status,
    /// The header was refused (magic, version, length, op), not just the op's payload.
    pub header: bool,
}

/// Decodes one request record of `rec.len()` bytes (`truncated`: the record was larger than
/// the buffer it was received into). Never panics, whatever the bytes.
pub fn decode_request(rec: &[u8], truncated: bool) -> Decoded {
    let hdr = Header::decode(rec);
    let (raw_op, seq) = hdr.map(|h| (h.op, h.seq)).unwrap_or((0, 0));
    let noreply = raw_op & NOREPLY_BIT != 0
        && hdr.is_some_and(|h| h.magic == MAGIC && h.version == VERSION)
        && matches!(
            raw_op & !NOREPLY_BIT,
            OP_DETACH | OP_UNREGISTER | OP_RELEASE | OP_CANCEL
        );
    let op = if noreply {
        raw_op & !NOREPLY_BIT
    } else {
        raw_op
    };
    let bad = |status, header| Err(RequestError { status, header });
    let invalid = if truncated || rec.len() > MAX_REQUEST {
        Some(Status::Oversized)
    } else {
        match hdr {
            None => Some(Status::Malformed),
            Some(h) if h.magic != MAGIC => Some(Status::Malformed),
            Some(h) if h.version != VERSION => Some(Status::BadVersion),
            Some(h) if h.len as usize != rec.len() - HEADER_LEN => Some(Status::Malformed),
            Some(_) if raw_op & NOREPLY_BIT != 0 && !noreply => Some(Status::Malformed),
            Some(_) if !matches!(op, OP_QUERY_GID..=OP_MAX) => Some(Status::UnknownOp),
            Some(_) => None,
        }
    };
    let op_out = op & !REPLY_BIT;
    if let Some(status) = invalid {
        return Decoded {
            op: op_out,
            seq,
            noreply,
            request: bad(status, true),
        };
    }
    let p = &rec[HEADER_LEN..];
    let need = |n: usize| p.len() >= n;
    let request = match op {
        OP_QUERY_GID => Ok(Request::QueryGid),
        OP_REGISTER if !need(8) => bad(Status::Malformed, false),
        OP_REGISTER if p[0] > smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE => {
            bad(Status::BadSize, false)
        }
        OP_REGISTER => Ok(Request::Register {
            size_code: p[0],
            record: p[1] & REGISTER_RECORD_PROOF != 0,
        }),
        OP_ATTACH if !need(8) => bad(Status::Malformed, false),
        OP_ATTACH => Ok(Request::Attach {
            token: get_u64(p, 0),
            own: get_u64(p, 8),
        }),
        OP_ATTACH_PEER => Ok(Request::AttachPeer { own: get_u64(p, 0) }),
        OP_ADOPT if !need(8) => bad(Status::Malformed, false),
        OP_ADOPT if p[0] > ADOPT_STATE => bad(Status::Malformed, false),
        OP_ADOPT => Ok(Request::Adopt {
            which: p[0],
            slot_ok: p[1] & ADOPT_FLAG_SLOT != 0,
        }),
        OP_DETACH | OP_UNREGISTER if !need(8) => bad(Status::Malformed, false),
        OP_DETACH => Ok(Request::Detach {
            token: get_u64(p, 0),
        }),
        OP_UNREGISTER => Ok(Request::Unregister {
            token: get_u64(p, 0),
        }),
        OP_RELEASE if !need(16) => bad(Status::Malformed, false),
        OP_RELEASE => Ok(Request::Release {
            own: get_u64(p, 0),
            peer: get_u64(p, 8),
            flags: get_u32(p, 16),
        }),
        OP_PAIR if !need(8) => bad(Status::Malformed, false),
        OP_PAIR if p[0] > smc_common::cdc::DMB_MAX_SIZE_CODE_LARGE => bad(Status::BadSize, false),
        OP_PAIR if p.len() > 16 && !(p.len() - 16).is_multiple_of(24) => {
            bad(Status::Malformed, false)
        }
        OP_PAIR if p.len() > 16 + 24 * PAIR_RELEASES_MAX => bad(Status::Malformed, false),
        OP_PAIR => {
            let mut releases = [(0, 0, 0); PAIR_RELEASES_MAX];
            let n = p.len().saturating_sub(16) / 24;
            for (i, r) in releases.iter_mut().enumerate().take(n) {
                let o = 16 + 24 * i;
                *r = (get_u64(p, o), get_u64(p, o + 8), get_u32(p, o + 16));
            }
            Ok(Request::Pair {
                size_code: p[0],
                park_ms: get_u32(p, 4).min(PAIR_PARK_MAX_MS),
                releases,
                n_releases: n as u8,
                state_slot: p[1] & PAIR_FLAG_STATE_SLOT != 0,
                new_slot_page: p[1] & (PAIR_FLAG_STATE_SLOT | PAIR_FLAG_NEW_SLOT_PAGE)
                    == PAIR_FLAG_STATE_SLOT | PAIR_FLAG_NEW_SLOT_PAGE,
            })
        }
        OP_CANCEL if !need(4) => bad(Status::Malformed, false),
        OP_CANCEL => Ok(Request::Cancel { seq: get_u32(p, 0) }),
        OP_STATS => Ok(Request::Stats),
        OP_LEAVE_SHORTCUT => Ok(Request::LeaveShortcut),
        OP_SWEEP => Ok(Request::Sweep),
        OP_WAIT if !need(16) => bad(Status::Malformed, false),
        OP_WAIT => Ok(Request::Wait {
            generation: get_u64(p, 0),
            timeout_ms: get_u32(p, 8).min(60_000),
        }),
        OP_LIST if !need(8) => bad(Status::Malformed, false),
        OP_LIST => Ok(Request::List {
            start: get_u32(p, 0),
            max: get_u32(p, 4).clamp(1, LIST_PAGE_MAX),
        }),
        _ => bad(Status::UnknownOp, true),
    };
    Decoded {
        op: op_out,
        seq,
        noreply,
        request,
    }
}

/// Reads a little-endian u32 at `off` (caller checks bounds; 0 past the end, never a panic).
pub fn get_u32(buf: &[u8], off: usize) -> u32 {
    buf.get(off..)
        .and_then(<[u8]>::first_chunk::<4>)
        .map_or(0, |c| u32::from_le_bytes(*c))
}

/// Reads a little-endian u64 at `off` (caller checks bounds; 0 past the end, never a panic).
pub fn get_u64(buf: &[u8], off: usize) -> u64 {
    buf.get(off..)
        .and_then(<[u8]>::first_chunk::<8>)
        .map_or(0, |c| u64::from_le_bytes(*c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip() {
        let h = Header::new(OP_ATTACH, 8, 77);
        let mut b = [0u8; HEADER_LEN];
        h.encode(&mut b);
        assert_eq!(&b[0..4], b"SMCI");
        assert_eq!(Header::decode(&b), Some(h));
        assert_eq!(Header::decode(&b[..15]), None);
    }

    #[test]
    fn dmb_reply_roundtrip() {
        let r = DmbReply {
            token: 0xdead_beef_1234_5678,
            slot: 65534,
            idx: 0,
            size_code: 6,
            size: 1 << 20,
        };
        let mut b = [0u8; DMB_REPLY_LEN];
        r.encode(&mut b);
        assert_eq!(DmbReply::decode(&b), Some(r));
    }

    fn record(op: u16, payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; HEADER_LEN];
        Header::new(op, payload.len(), 9).encode(&mut b);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn decode_requests() {
        let d = decode_request(&record(OP_REGISTER, &[6, 0, 0, 0, 0, 0, 0, 0]), false);
        assert_eq!(
            d.request,
            Ok(Request::Register {
                size_code: 6,
                record: false
            })
        );
        assert_eq!((d.op, d.seq, d.noreply), (OP_REGISTER, 9, false));
        let d = decode_request(&record(OP_REGISTER, &[10, 1, 0, 0, 0, 0, 0, 0]), false);
        assert_eq!(
            d.request,
            Ok(Request::Register {
                size_code: 10,
                record: true
            })
        );
        // An attach may name the registration whose record proves it, or none (8 bytes).
        let d = decode_request(&record(OP_ATTACH, &[7; 8]), false);
        assert!(matches!(d.request, Ok(Request::Attach { own: 0, .. })));
        let mut p = [0u8; 16];
        p[8] = 5;
        let d = decode_request(&record(OP_ATTACH, &p), false);
        assert!(matches!(d.request, Ok(Request::Attach { own: 5, .. })));
        let d = decode_request(&record(OP_ATTACH_PEER, &[]), false);
        assert_eq!(d.request, Ok(Request::AttachPeer { own: 0 }));
        let d = decode_request(&record(OP_ATTACH_PEER, &5u64.to_le_bytes()), false);
        assert_eq!(d.request, Ok(Request::AttachPeer { own: 5 }));
        let d = decode_request(&record(OP_REGISTER, &[11, 0, 0, 0, 0, 0, 0, 0]), false);
        assert_eq!(d.request.unwrap_err().status, Status::BadSize);
        let d = decode_request(&record(OP_ATTACH, &[1; 4]), false);
        assert_eq!(
            d.request,
            Err(RequestError {
                status: Status::Malformed,
                header: false
            })
        );
        let d = decode_request(&record(OP_RELEASE | NOREPLY_BIT, &[0; 16]), false);
        assert!(d.noreply);
        assert_eq!(
            d.request,
            Ok(Request::Release {
                own: 0,
                peer: 0,
                flags: 0
            })
        );
        let d = decode_request(&record(OP_STATS | NOREPLY_BIT, &[]), false);
        assert!(!d.noreply);
        assert!(d.request.unwrap_err().header);
        let d = decode_request(&record(OP_MAX + 1, &[]), false);
        assert_eq!(d.request.unwrap_err().status, Status::UnknownOp);
        let d = decode_request(&record(OP_LIST, &[0, 0, 0, 0, 255, 255, 255, 255]), false);
        assert_eq!(
            d.request,
            Ok(Request::List {
                start: 0,
                max: LIST_PAGE_MAX
            })
        );
        let d = decode_request(&record(OP_QUERY_GID, &[]), true);
        assert_eq!(d.request.unwrap_err().status, Status::Oversized);
        assert_eq!(decode_request(&[1, 2, 3], false).op, 0);
    }

    #[test]
    fn pair_records() {
        let mut p = vec![3u8, 0, 0, 0];
        p.extend_from_slice(&99_999u32.to_le_bytes());
        p.extend_from_slice(&[0; 8]);
        match decode_request(&record(OP_PAIR, &p), false).request {
            Ok(Request::Pair {
                size_code: 3,
                park_ms: PAIR_PARK_MAX_MS,
                n_releases: 0,
                state_slot: false,
                ..
            }) => {}
            r => panic!("{r:?}"),
        }
        let mut slot = p.clone();
        slot[1] = PAIR_FLAG_STATE_SLOT;
        assert!(matches!(
            decode_request(&record(OP_PAIR, &slot), false).request,
            Ok(Request::Pair {
                state_slot: true,
                new_slot_page: false,
                ..
            })
        ));
        // A new page only for a caller that takes slots.
        slot[1] = PAIR_FLAG_STATE_SLOT | PAIR_FLAG_NEW_SLOT_PAGE;
        assert!(matches!(
            decode_request(&record(OP_PAIR, &slot), false).request,
            Ok(Request::Pair {
                state_slot: true,
                new_slot_page: true,
                ..
            })
        ));
        slot[1] = PAIR_FLAG_NEW_SLOT_PAGE;
        assert!(matches!(
            decode_request(&record(OP_PAIR, &slot), false).request,
            Ok(Request::Pair {
                state_slot: false,
                new_slot_page: false,
                ..
            })
        ));
        assert_eq!(
            decode_request(&record(OP_ADOPT, &[2, 1, 0, 0, 0, 0, 0, 0]), false).request,
            Ok(Request::Adopt {
                which: ADOPT_STATE,
                slot_ok: true
            })
        );
        // Two releases carried.
        for (own, peer, flags) in [(1u64, 2u64, 1u32), (3, 0, 2)] {
            p.extend_from_slice(&own.to_le_bytes());
            p.extend_from_slice(&peer.to_le_bytes());
            p.extend_from_slice(&flags.to_le_bytes());
            p.extend_from_slice(&[0; 4]);
        }
        match decode_request(&record(OP_PAIR, &p), false).request {
            Ok(Request::Pair {
                releases,
                n_releases: 2,
                ..
            }) => assert_eq!(&releases[..2], &[(1, 2, 1), (3, 0, 2)]),
            r => panic!("{r:?}"),
        }
        // A partial release, too many releases, a short record, a bad size code.
        let d = decode_request(&record(OP_PAIR, &p[..p.len() - 1]), false);
        assert_eq!(d.request.unwrap_err().status, Status::Malformed);
        // (9 releases still fit a record: 16 + 16 + 9 * 24 = 248 bytes.)
        let mut long = p.clone();
        for _ in 2..=PAIR_RELEASES_MAX {
            long.extend_from_slice(&[0; 24]);
        }
        let d = decode_request(&record(OP_PAIR, &long), false);
        assert_eq!(d.request.unwrap_err().status, Status::Malformed);
        let d = decode_request(&record(OP_PAIR, &p[..7]), false);
        assert_eq!(d.request.unwrap_err().status, Status::Malformed);
        p[0] = 11;
        let d = decode_request(&record(OP_PAIR, &p), false);
        assert_eq!(d.request.unwrap_err().status, Status::BadSize);
        // CANCEL may want no reply.
        let d = decode_request(
            &record(OP_CANCEL | NOREPLY_BIT, &[5, 0, 0, 0, 0, 0, 0, 0]),
            false,
        );
        assert_eq!(
            (d.noreply, d.request),
            (true, Ok(Request::Cancel { seq: 5 }))
        );
    }

    #[test]
    fn status_codes() {
        for v in 0..20u32 {
            let s = Status::from_u32(v);
            if v <= 17 && v != 14 {
                assert_eq!(s as u32, v);
            } else {
                assert_eq!(s, Status::Internal);
            }
        }
    }
}
