//! SMC-D connection data control (CDC): the 32-byte header at offset 0 of every DMB, its two
//! cursor words, and ring arithmetic over the rest of the DMB.
//!
//! `no_std`, no allocation. Everything here is usable from the data path on raw shared memory.
//!
//! # Layout (Linux `net/smc/smc_cdc.h`, `struct smcd_cdc_msg`, `__aligned(8)`)
//!
//! | offset | size | field                                              |
//! |-------:|-----:|----------------------------------------------------|
//! | 0      | 1    | type, always [`CDC_MSG_TYPE`] (`0xFE`)             |
//! | 1      | 7    | reserved (`res1`), zero                            |
//! | 8      | 8    | producer cursor word (`union smcd_cdc_cursor prod`)|
//! | 16     | 8    | consumer cursor word (`union smcd_cdc_cursor cons`)|
//! | 24     | 8    | reserved (`res3`), zero                            |
//!
//! This implementation uses both reserved parts once the connection exists (extensions, as
//! the handshake arbitration below; Linux ignores them):
//!
//! | offset | size | extension                                                       |
//! |-------:|-----:|-----------------------------------------------------------------|
//! | 1      | 7    | the urgent word ([`crate::urg::UrgWord`]): sequence number, ring offsets of the newest urgent byte and the one before; written by the writer only, before the producer cursor covering the byte ([`CdcHeader::store_urg`]) |
//! | 24     | 8    | the wakeup bits of the direction (the preload's `WAIT_DATA`, `WAIT_SPACE`, `WAIT_SWITCH`, `WAIT_ASYNC`, `ASYNC_RUNG`), set and swapped by both ends; with [`crate::clc::FEATURE_SWITCH_ALONE`] also the owner's `WAIT_ALONE`, the writer's `CTL_UNCOUNTED`, its control sends in flight (bits 16..32) and its control bytes sent (bits 32..64); with [`crate::clc::FEATURE_SWITCH_FRESH_ACKS`] the owner's `WAIT_ACKS_FRESH` (its socket's delayed ACKs are a fresh connection's again after a switch to TCP) |
//!
//! The urgent flags of [`ProdFlags`] (`urg_data_pending`, `urg_data_present`) are set by the
//! writer as Linux does (pending from the start of an urgent send, present once its last byte
//! is produced; both cleared by the next ordinary write), for whoever looks at the header; a
//! reader here goes by the urgent word, which says *where* the urgent byte is even when the
//! writer wrote on before the reader looked (Linux's receiver takes the producer cursor of the
//! CDC message that carried the flag, one message at a time).
//!
//! A cursor word is Linux's `union smcd_cdc_cursor`: a `__packed` struct
//! `{ u16 wrap; u32 count; u8 prod_flags; u8 conn_state_flags; }` overlaid on an
//! `atomic64_t acurs`. Unlike SMC-R's `smc_cdc_cursor` (big-endian, `reserved/wrap/count`), the
//! SMC-D cursor is in **host byte order** (both ends share one machine), so within the 8 bytes:
//!
//! | byte | field                                    |
//! |-----:|------------------------------------------|
//! | 0..2 | `wrap`, `u16`, native endian             |
//! | 2..6 | `count`, `u32`, native endian, unaligned |
//! | 6    | producer flags ([`ProdFlags`])           |
//! | 7    | connection-state flags ([`ConnStateFlags`]) |
//!
//! The word as a `u64` is `u64::from_ne_bytes(those 8 bytes)` ([`CursorWord::to_u64`]); on
//! little-endian hosts that is `wrap | count << 16 | prod_flags << 48 | conn_state << 56`.
//! The flag bytes are Linux bitfields declared MSB-first for both bit orders, so
//! `write_blocked` is `0x80` and `peer_done_writing` is `0x80` on every host.
//!
//! **Where the flags live.** Linux (`smcd_cdc_msg_send`, `smcd_cdc_msg_to_host`) writes the
//! flags only into the *consumer* word and reads them only from there; the flag bytes of the
//! producer word are sent as zero and ignored. Interoperable writers should do the same;
//! [`CdcMsg::flags`] reads them from the consumer word.
//!
//! # Handshake arbitration (this implementation's extension)
//!
//! Before the connection exists, the first word (type byte and `res1`) of the **server's**
//! DMB decides a race the CLC messages alone cannot: a client that read the server's Accept
//! late (it was idle) confirming, against the server giving up waiting for that Confirm
//! ([`crate::clc::FEATURE_ACCEPT_WITHDRAW`]). The server's DMB is zero there until then (fresh,
//! or cleared by its owner before the Accept names it), and both ends have it mapped: the
//! server from its registration, the client before its Confirm. Each end compare-exchanges it
//! from zero, once: the client to [`ARBITER_CONFIRMED`] (the type word it writes anyway when
//! the connection is set up) right before it sends its Confirm
//! ([`CdcHeader::claim_confirm`]), the server to [`ARBITER_WITHDRAWN`] when its wait for the
//! Confirm is over ([`CdcHeader::claim_withdraw`]). Whoever comes first decides: the client
//! confirms and the server waits for that Confirm (a moment away), or the server sends a
//! Decline after its Accept and the client, which then does not confirm, reads Accept and
//! Decline and falls back to TCP with the server. The word is written by both ends: a value
//! other than these is the peer's doing, and costs only the peer's own connection.
//!
//! # Direction
//!
//! Each side writes the header of the **peer's** DMB: its producer word says how far the writer
//! has produced into that DMB's ring (bytes the owner may read), its consumer word says how far
//! the writer has consumed from its *own* DMB (space the owner may reuse when writing to the
//! writer).
//!
//! # Untrusted cursors
//!
//! Everything read from shared memory was written by another process and may be forged or torn.
//! [`Ring::accept_peer_prod`] and [`Ring::accept_peer_cons`] validate a new peer cursor against
//! what we know; [`Ring::offset`] and [`Ring::segments`] only ever return positions inside the
//! ring, whatever cursor they are given. (Linux had a heap out-of-bounds write from an unchecked
//! peer cursor.)
//!
//! # Example
//!
//! ```
//! use smc_common::cdc::*;
//!
//! // A 64 KiB DMB (8-byte aligned, as mmap'ed memory is). Its ring is 64 KiB - 32.
//! let mut dmb = vec![0u64; 64 * 1024 / 8];
//! let base = dmb.as_mut_ptr() as *mut u8;
//! let ring = Ring::for_dmb(64 * 1024).unwrap();
//! let hdr = unsafe { CdcHeader::from_ptr(base) };
//!
//! // The peer wrote 100 bytes at ring offset 0 (DMB offset 32) and published its cursor.
//! hdr.init();
//! hdr.store_prod(CursorWord::from_cursor(ring.add(Cursor::ZERO, 100)));
//!
//! // We, the owner, read: validate the untrusted cursor, then copy at most two segments.
//! let (mut cons, mut last_prod, confirmed) = (Cursor::ZERO, Cursor::ZERO, Cursor::ZERO);
//! let prod = ring.accept_peer_prod(cons, last_prod, hdr.load_prod().cursor).unwrap();
//! let n = ring.readable(cons, prod).unwrap();
//! assert_eq!(n, 100);
//! for (off, len) in ring.segments(cons, n) {
//!     let _data = CDC_HEADER_LEN + off..CDC_HEADER_LEN + off + len; // always inside the DMB
//! }
//! cons = ring.add(cons, n);
//! last_prod = prod;
//! // 100 bytes is below the 10% threshold: no consumer cursor update unless asked for.
//! let (peer_flags, _state) = hdr.snapshot().unwrap().flags();
//! assert!(!ring.need_cons_update(confirmed, cons, peer_flags));
//! # let _ = last_prod;
//! ```

use core::fmt;
use core::sync::atomic::{AtomicU64, Ordering};

/// `SMC_CDC_MSG_TYPE`: the type byte at offset 0 of a CDC header.
pub const CDC_MSG_TYPE: u8 = 0xFE;
/// `sizeof(struct smcd_cdc_msg)`: bytes at the start of a DMB taken by the CDC header.
pub const CDC_HEADER_LEN: usize = 32;
/// Offset of the producer cursor word in the header.
pub const PROD_WORD_OFFSET: usize = 8;
/// Offset of the consumer cursor word in the header.
pub const CONS_WORD_OFFSET: usize = 16;

/// Smallest DMB size, `SMC_BUF_MIN_SIZE` (16 KiB, size code 0).
pub const DMB_MIN_SIZE: u32 = 16 * 1024;
/// Largest SMC-D DMB size code, `SMCD_DMBE_SIZES` (16 KiB << 6 = 1 MiB).
pub const DMB_MAX_SIZE_CODE: u8 = 6;
/// Largest size code of this implementation's large-DMB extension (16 KiB << 10 = 16 MiB):
/// used only between two ends that both offered [`crate::clc::FEATURE_LARGE_DMB`] (Linux
/// masks that bit off, so it never sees a code above [`DMB_MAX_SIZE_CODE`]).
pub const DMB_MAX_SIZE_CODE_LARGE: u8 = 10;

/// The first header word of the server's DMB once the client decided to confirm (see
/// *Handshake arbitration*): the CDC type byte, as the client's connection writes it.
pub const ARBITER_CONFIRMED: u64 = u64::from_ne_bytes([CDC_MSG_TYPE, 0, 0, 0, 0, 0, 0, 0]);
/// The first header word of the server's DMB once the server withdrew its Accept (see
/// *Handshake arbitration*): type byte 0 (no CDC message), then `"WDRAW"`.
pub const ARBITER_WITHDRAWN: u64 = u64::from_ne_bytes([0, b'W', b'D', b'R', b'A', b'W', 0, 0]);

/// Minimum consumer-cursor update threshold: Linux's `SOCK_MIN_SNDBUF / 2` on x86-64
/// (`2 * (2048 + SKB_DATA_ALIGN(sizeof(struct sk_buff)))/2 = 2304`), used by
/// `smc_rmb_wnd_update_limit`.
pub const CONS_UPDATE_MIN: u32 = 2304;

/// DMB size in bytes for a 4-bit size code (`smc_uncompress_bufsize`: `16 KiB << code`).
/// `None` for codes above [`DMB_MAX_SIZE_CODE`].
pub const fn dmb_size_from_code(code: u8) -> Option<u32> {
    if code > DMB_MAX_SIZE_CODE {
        None
    } else {
        Some(DMB_MIN_SIZE << code)
    }
}

/// DMB size in bytes for a size code of the large-DMB extension (up to
/// [`DMB_MAX_SIZE_CODE_LARGE`]); `None` above it.
pub const fn dmb_size_from_code_large(code: u8) -> Option<u32> {
    if code > DMB_MAX_SIZE_CODE_LARGE {
        None
    } else {
        Some(DMB_MIN_SIZE << code)
    }
}

/// Size code for a DMB of at least `bytes` (`smc_compress_bufsize` for SMC-D: rounds up to the
/// next power-of-two multiple of 16 KiB, capped at [`DMB_MAX_SIZE_CODE`]).
pub const fn dmb_size_code(bytes: u32) -> u8 {
    let code = dmb_size_code_large(bytes);
    if code > DMB_MAX_SIZE_CODE {
        DMB_MAX_SIZE_CODE
    } else {
        code
    }
}

/// [`dmb_size_code`] capped at [`DMB_MAX_SIZE_CODE_LARGE`] instead.
pub const fn dmb_size_code_large(bytes: u32) -> u8 {
    if bytes <= DMB_MIN_SIZE {
        return 0;
    }
    let units = (bytes - 1) >> 14; // >= 1
    let code = (31 - units.leading_zeros()) + 1; // ilog2(units) + 1
    if code > DMB_MAX_SIZE_CODE_LARGE as u32 {
        DMB_MAX_SIZE_CODE_LARGE
    } else {
        code as u8
    }
}

/// Producer flags byte (`struct smc_cdc_producer_flags`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ProdFlags(pub u8);

impl ProdFlags {
    /// No flags.
    pub const EMPTY: ProdFlags = ProdFlags(0);
    /// `write_blocked`: the writer has data but no space in our ring.
    pub const WRITE_BLOCKED: ProdFlags = ProdFlags(0x80);
    /// `urg_data_pending`: urgent data announced, not yet written.
    pub const URG_DATA_PENDING: ProdFlags = ProdFlags(0x40);
    /// `urg_data_present`: the last byte produced is urgent data.
    pub const URG_DATA_PRESENT: ProdFlags = ProdFlags(0x20);
    /// `cons_curs_upd_req`: the writer asks for a consumer cursor update now.
    pub const CONS_CURS_UPD_REQ: ProdFlags = ProdFlags(0x10);
    /// `failover_validation`: SMC-R failover replay (unused by SMC-D).
    pub const FAILOVER_VALIDATION: ProdFlags = ProdFlags(0x08);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: ProdFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// `self` with the bits of `other` set.
    pub const fn with(self, other: ProdFlags) -> ProdFlags {
        ProdFlags(self.0 | other.0)
    }
    /// `self` with the bits of `other` cleared.
    pub const fn without(self, other: ProdFlags) -> ProdFlags {
        ProdFlags(self.0 & !other.0)
    }
}

impl fmt::Debug for ProdFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProdFlags({:#04x}", self.0)?;
        for (bit, name) in [
            (Self::WRITE_BLOCKED, "write_blocked"),
            (Self::URG_DATA_PENDING, "urg_pending"),
            (Self::URG_DATA_PRESENT, "urg_present"),
            (Self::CONS_CURS_UPD_REQ, "cons_curs_upd_req"),
            (Self::FAILOVER_VALIDATION, "failover"),
        ] {
            if self.contains(bit) {
                write!(f, " {name}")?;
            }
        }
        f.write_str(")")
    }
}

/// Connection-state flags byte (`struct smc_cdc_conn_state_flags`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConnStateFlags(pub u8);

impl ConnStateFlags {
    /// No flags.
    pub const EMPTY: ConnStateFlags = ConnStateFlags(0);
    /// `peer_done_writing`: the writer shut down its sending side (EOF after remaining bytes).
    pub const PEER_DONE_WRITING: ConnStateFlags = ConnStateFlags(0x80);
    /// `peer_conn_closed`: the writer closed the connection (EOF after remaining bytes).
    pub const PEER_CONN_CLOSED: ConnStateFlags = ConnStateFlags(0x40);
    /// `peer_conn_abort`: abnormal close (`ECONNRESET` for the reader).
    pub const PEER_CONN_ABORT: ConnStateFlags = ConnStateFlags(0x20);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: ConnStateFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// `self` with the bits of `other` set.
    pub const fn with(self, other: ConnStateFlags) -> ConnStateFlags {
        ConnStateFlags(self.0 | other.0)
    }
    /// `self` with the bits of `other` cleared.
    pub const fn without(self, other: ConnStateFlags) -> ConnStateFlags {
        ConnStateFlags(self.0 & !other.0)
    }
    /// Closed or aborted (`smc_cdc_rxed_any_close`).
    pub const fn any_close(self) -> bool {
        self.0 & (Self::PEER_CONN_CLOSED.0 | Self::PEER_CONN_ABORT.0) != 0
    }
    /// Closed, aborted or done writing (`smc_cdc_rxed_any_close_or_senddone`): no more data
    /// will arrive after what the producer cursor already covers.
    pub const fn any_close_or_done(self) -> bool {
        self.any_close() || self.contains(Self::PEER_DONE_WRITING)
    }
}

impl fmt::Debug for ConnStateFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnStateFlags({:#04x}", self.0)?;
        for (bit, name) in [
            (Self::PEER_DONE_WRITING, "peer_done_writing"),
            (Self::PEER_CONN_CLOSED, "peer_conn_closed"),
            (Self::PEER_CONN_ABORT, "peer_conn_abort"),
        ] {
            if self.contains(bit) {
                write!(f, " {name}")?;
            }
        }
        f.write_str(")")
    }
}

/// A position in a ring: `count` bytes into the current pass, `wrap` passes completed
/// (mod 2^16). Valid for a ring of `len` bytes when `count < len`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cursor {
    /// Number of times the cursor wrapped around the ring (wraps itself at 0xFFFF).
    pub wrap: u16,
    /// Offset inside the ring.
    pub count: u32,
}

impl Cursor {
    /// The start of a connection.
    pub const ZERO: Cursor = Cursor { wrap: 0, count: 0 };

    /// A cursor from its parts.
    pub const fn new(wrap: u16, count: u32) -> Cursor {
        Cursor { wrap, count }
    }
}

/// One 8-byte cursor word as stored in the header: a cursor plus the two flag bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CursorWord {
    /// The cursor.
    pub cursor: Cursor,
    /// Producer flags (meaningful in the consumer word only, see the module docs).
    pub prod_flags: ProdFlags,
    /// Connection-state flags (meaningful in the consumer word only).
    pub conn_state: ConnStateFlags,
}

impl CursorWord {
    /// A word carrying `cursor` and no flags.
    pub const fn from_cursor(cursor: Cursor) -> CursorWord {
        CursorWord {
            cursor,
            prod_flags: ProdFlags::EMPTY,
            conn_state: ConnStateFlags::EMPTY,
        }
    }

    /// The 8 bytes as laid out in shared memory (see the module docs).
    pub const fn to_bytes(self) -> [u8; 8] {
        let w = self.cursor.wrap.to_ne_bytes();
        let c = self.cursor.count.to_ne_bytes();
        [
            w[0],
            w[1],
            c[0],
            c[1],
            c[2],
            c[3],
            self.prod_flags.0,
            self.conn_state.0,
        ]
    }

    /// Parse the 8 bytes as laid out in shared memory. Total: every bit pattern is a word
    /// (validation against a ring is separate, see [`Ring`]).
    pub const fn from_bytes(b: [u8; 8]) -> CursorWord {
        CursorWord {
            cursor: Cursor {
                wrap: u16::from_ne_bytes([b[0], b[1]]),
                count: u32::from_ne_bytes([b[2], b[3], b[4], b[5]]),
            },
            prod_flags: ProdFlags(b[6]),
            conn_state: ConnStateFlags(b[7]),
        }
    }

    /// The word as the `u64` that is loaded/stored atomically (`acurs`).
    pub const fn to_u64(self) -> u64 {
        u64::from_ne_bytes(self.to_bytes())
    }

    /// The word from an atomically loaded `u64`.
    pub const fn from_u64(v: u64) -> CursorWord {
        CursorWord::from_bytes(v.to_ne_bytes())
    }
}

/// Atomically load a cursor word (`Acquire`: data produced before the word was stored is
/// visible after this returns).
pub fn load_word(word: &AtomicU64) -> CursorWord {
    CursorWord::from_u64(word.load(Ordering::Acquire))
}

/// Atomically store a cursor word (`Release`: data written before is visible to whoever loads
/// this word).
pub fn store_word(word: &AtomicU64, value: CursorWord) {
    word.store(value.to_u64(), Ordering::Release)
}

/// Why a cursor or header was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CursorError {
    /// `count` is not below the ring length.
    CountOutOfRange,
    /// The cursor is more than one ring length ahead of the reference cursor.
    TooFarAhead,
    /// The cursor moved backwards compared with the last accepted value.
    Backwards,
    /// The header's type byte is not [`CDC_MSG_TYPE`].
    BadType,
}

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CursorError::CountOutOfRange => "cursor count outside the ring",
            CursorError::TooFarAhead => "cursor more than one ring ahead",
            CursorError::Backwards => "cursor moved backwards",
            CursorError::BadType => "CDC header type is not 0xFE",
        })
    }
}

#[cfg(feature = "std")]
impl std::error::Error for CursorError {}

/// A data ring of `len` bytes (for SMC-D: the DMB minus the 32-byte header).
///
/// All arithmetic is exact modulo `2^16 * len` (the cursor space), so the `wrap` counter rolling
/// over from `0xFFFF` to `0` is handled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ring {
    len: u32,
}

impl Ring {
    /// A ring of `len` bytes; `None` if `len` is zero.
    pub const fn new(len: u32) -> Option<Ring> {
        if len == 0 {
            None
        } else {
            Some(Ring { len })
        }
    }

    /// The ring inside a DMB of `dmb_size` bytes (`dmb_size - 32`); `None` if that is empty or
    /// does not fit in `u32`.
    pub const fn for_dmb(dmb_size: usize) -> Option<Ring> {
        if dmb_size <= CDC_HEADER_LEN || dmb_size - CDC_HEADER_LEN > u32::MAX as usize {
            None
        } else {
            Ring::new((dmb_size - CDC_HEADER_LEN) as u32)
        }
    }

    /// Length in bytes.
    pub const fn len(self) -> u32 {
        self.len
    }

    /// Always false (a `Ring` is never empty); present for API symmetry with `len`.
    pub const fn is_empty(self) -> bool {
        false
    }

    const fn period(self) -> u64 {
        (self.len as u64) << 16
    }

    /// Linear position in the cursor space; `count` is reduced modulo `len` first so that this
    /// is total.
    const fn linear(self, c: Cursor) -> u64 {
        (c.wrap as u64) * (self.len as u64) + (c.count % self.len) as u64
    }

    const fn cursor_at(self, lin: u64) -> Cursor {
        let lin = lin % self.period();
        Cursor {
            wrap: (lin / self.len as u64) as u16,
            count: (lin % self.len as u64) as u32,
        }
    }

    /// Whether `c.count < len`.
    pub const fn is_valid(self, c: Cursor) -> bool {
        c.count < self.len
    }

    /// `Ok(c)` if `c.count < len`.
    pub const fn validate(self, c: Cursor) -> Result<Cursor, CursorError> {
        if self.is_valid(c) {
            Ok(c)
        } else {
            Err(CursorError::CountOutOfRange)
        }
    }

    /// The byte offset of `c` inside the ring; always `< len`, even for an invalid cursor
    /// (whose count is reduced modulo `len`).
    pub const fn offset(self, c: Cursor) -> usize {
        (c.count % self.len) as usize
    }

    /// `c` advanced by `n` bytes (`smc_curs_add`, generalised to any `n`).
    pub const fn add(self, c: Cursor, n: u32) -> Cursor {
        self.cursor_at(self.linear(c) + n as u64)
    }

    /// Bytes from `old` forward to `new`: `Ok` only when both are valid and `new` is at most
    /// one ring length ahead (`smc_curs_diff` without its one-wrap assumption). A `new` behind
    /// `old` is `TooFarAhead` (it would be almost a whole cursor space ahead).
    pub const fn diff(self, old: Cursor, new: Cursor) -> Result<u32, CursorError> {
        if !self.is_valid(old) || !self.is_valid(new) {
            return Err(CursorError::CountOutOfRange);
        }
        let period = self.period();
        let d = (self.linear(new) + period - self.linear(old)) % period;
        if d > self.len as u64 {
            Err(CursorError::TooFarAhead)
        } else {
            Ok(d as u32)
        }
    }

    /// Bytes the reader may read: from our consumer cursor `cons` to the peer's producer
    /// cursor `prod` (at most `len`).
    pub const fn readable(self, cons: Cursor, prod: Cursor) -> Result<u32, CursorError> {
        self.diff(cons, prod)
    }

    /// Bytes the writer may still write: `len` minus what it produced (`prod`) beyond what the
    /// reader consumed (`cons`).
    pub const fn free_space(self, prod: Cursor, cons: Cursor) -> Result<u32, CursorError> {
        match self.diff(cons, prod) {
            Ok(used) => Ok(self.len - used),
            Err(e) => Err(e),
        }
    }

    /// `diff(last, new)`, reporting a cursor that moved behind `last` as `Backwards`.
    const fn forward_of(self, last: Cursor, new: Cursor) -> Result<u32, CursorError> {
        match self.diff(last, new) {
            Ok(d) => Ok(d),
            Err(CursorError::TooFarAhead) if self.diff(new, last).is_ok() => {
                Err(CursorError::Backwards)
            }
            Err(e) => Err(e),
        }
    }

    /// Validate a producer cursor read from shared memory (the peer writing into our ring).
    ///
    /// `cons` is our consumer cursor, `last` the previously accepted producer cursor. The new
    /// cursor must be valid, not behind `last`, and at most `len` ahead of `cons`. On error the
    /// caller keeps `last` (ignore, like Linux does for stale cursors) or aborts the connection.
    pub const fn accept_peer_prod(
        self,
        cons: Cursor,
        last: Cursor,
        new: Cursor,
    ) -> Result<Cursor, CursorError> {
        if !self.is_valid(new) {
            return Err(CursorError::CountOutOfRange);
        }
        if let Err(e) = self.forward_of(last, new) {
            return Err(e);
        }
        if self.diff(cons, new).is_err() {
            return Err(CursorError::TooFarAhead);
        }
        Ok(new)
    }

    /// Validate a consumer cursor read from shared memory (the peer reading what we wrote into
    /// its ring; `self` is the peer's ring).
    ///
    /// `prod` is our producer cursor, `last` the previously accepted consumer cursor. The new
    /// cursor must be valid, not behind `last`, and not beyond `prod` (nobody consumes what was
    /// not produced).
    pub const fn accept_peer_cons(
        self,
        prod: Cursor,
        last: Cursor,
        new: Cursor,
    ) -> Result<Cursor, CursorError> {
        if !self.is_valid(new) {
            return Err(CursorError::CountOutOfRange);
        }
        if let Err(e) = self.forward_of(last, new) {
            return Err(e);
        }
        if self.diff(new, prod).is_err() {
            return Err(CursorError::TooFarAhead);
        }
        Ok(new)
    }

    /// Consumer-cursor update threshold: `max(len / 10, CONS_UPDATE_MIN)`
    /// (`smc_rmb_wnd_update_limit`, RFC 7609's 10% rule), capped at `len`.
    pub const fn update_limit(self) -> u32 {
        let l = if self.len / 10 > CONS_UPDATE_MIN {
            self.len / 10
        } else {
            CONS_UPDATE_MIN
        };
        if l > self.len {
            self.len
        } else {
            l
        }
    }

    /// Whether to publish our consumer cursor now: we consumed at least
    /// [`update_limit`](Self::update_limit) bytes since the last published cursor
    /// (`confirmed`), or the writer asked (`cons_curs_upd_req` or `write_blocked` in
    /// `peer_flags`) and there is something new to confirm. Invalid cursors count as "update"
    /// so that the caller resynchronises rather than stalls.
    pub const fn need_cons_update(
        self,
        confirmed: Cursor,
        consumed: Cursor,
        peer_flags: ProdFlags,
    ) -> bool {
        let to_confirm = match self.diff(confirmed, consumed) {
            Ok(d) => d,
            Err(_) => return true,
        };
        let asked =
            peer_flags.0 & (ProdFlags::CONS_CURS_UPD_REQ.0 | ProdFlags::WRITE_BLOCKED.0) != 0;
        to_confirm >= self.update_limit() || (asked && to_confirm > 0)
    }

    /// The ring byte ranges covering `n` bytes from `start`, as `(offset, len)` pairs: the
    /// first runs to at most the end of the ring, the second (possibly empty) restarts at 0.
    /// `n` is clamped to `len`; `start.count` is reduced modulo `len`. Both ranges are always
    /// inside `0..len`.
    pub const fn segments(self, start: Cursor, n: u32) -> [(usize, usize); 2] {
        let n = if n > self.len { self.len } else { n };
        let off = self.offset(start);
        let to_end = self.len as usize - off;
        let n = n as usize;
        if n <= to_end {
            [(off, n), (0, 0)]
        } else {
            [(off, to_end), (0, n - to_end)]
        }
    }
}

/// A decoded CDC header (a snapshot, not the shared memory itself).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CdcMsg {
    /// Producer cursor word.
    pub prod: CursorWord,
    /// Consumer cursor word (carries the flags).
    pub cons: CursorWord,
}

impl CdcMsg {
    /// The 32 header bytes, with type `0xFE` and zero reserved fields.
    pub const fn to_bytes(&self) -> [u8; CDC_HEADER_LEN] {
        let mut out = [0u8; CDC_HEADER_LEN];
        out[0] = CDC_MSG_TYPE;
        let p = self.prod.to_bytes();
        let c = self.cons.to_bytes();
        let mut i = 0;
        while i < 8 {
            out[PROD_WORD_OFFSET + i] = p[i];
            out[CONS_WORD_OFFSET + i] = c[i];
            i += 1;
        }
        out
    }

    /// Parse 32 header bytes. Only the type byte is checked (reserved bytes are ignored, as in
    /// Linux); the cursors must still be validated against a [`Ring`].
    pub fn from_bytes(b: &[u8; CDC_HEADER_LEN]) -> Result<CdcMsg, CursorError> {
        if b[0] != CDC_MSG_TYPE {
            return Err(CursorError::BadType);
        }
        let mut p = [0u8; 8];
        let mut c = [0u8; 8];
        p.copy_from_slice(&b[PROD_WORD_OFFSET..PROD_WORD_OFFSET + 8]);
        c.copy_from_slice(&b[CONS_WORD_OFFSET..CONS_WORD_OFFSET + 8]);
        Ok(CdcMsg {
            prod: CursorWord::from_bytes(p),
            cons: CursorWord::from_bytes(c),
        })
    }

    /// The flags as Linux reads them: from the consumer word.
    pub const fn flags(&self) -> (ProdFlags, ConnStateFlags) {
        (self.cons.prod_flags, self.cons.conn_state)
    }
}

/// The CDC header in shared memory: four 8-byte atomic words. Obtain one with
/// [`CdcHeader::from_ptr`] on the start of a DMB (8-byte aligned, as every DMB is page
/// aligned). All accessors take `&self`: the memory is shared and mutated concurrently.
#[repr(C, align(8))]
pub struct CdcHeader {
    /// Bytes 0..8: type byte then 7 bytes, the urgent word (its accessors,
    /// `CdcHeader::load_urg` and `store_urg`, are in [`crate::urg`]).
    pub(crate) type_word: AtomicU64,
    /// Bytes 8..16.
    prod: AtomicU64,
    /// Bytes 16..24.
    cons: AtomicU64,
    /// Bytes 24..32.
    reserved: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<CdcHeader>() == CDC_HEADER_LEN);
const _: () = assert!(core::mem::align_of::<CdcHeader>() == 8);

impl CdcHeader {
    /// A header not in shared memory (tests, local mirrors), with every byte zero.
    pub const fn zeroed() -> CdcHeader {
        CdcHeader {
            type_word: AtomicU64::new(0),
            prod: AtomicU64::new(0),
            cons: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
        }
    }

    /// View the 32 bytes at `ptr` as a header.
    ///
    /// # Safety
    /// `ptr` must be non-null, 8-byte aligned, and valid for reads and writes of 32 bytes for
    /// the whole lifetime `'a`; all concurrent access to those bytes must be through atomics
    /// (another process writing them with 8-byte aligned stores is fine).
    pub unsafe fn from_ptr<'a>(ptr: *mut u8) -> &'a CdcHeader {
        // SAFETY: the caller guarantees validity and alignment; AtomicU64 has the size and
        // alignment of u64 and any bit pattern is valid.
        unsafe { &*(ptr as *const CdcHeader) }
    }

    /// Like [`from_ptr`](Self::from_ptr) but returns `None` for a null or misaligned pointer.
    ///
    /// # Safety
    /// As for `from_ptr`, except for the null and alignment requirements, which are checked.
    pub unsafe fn try_from_ptr<'a>(ptr: *mut u8) -> Option<&'a CdcHeader> {
        if ptr.is_null() || (ptr as usize) & 7 != 0 {
            None
        } else {
            // SAFETY: checked above; the rest is the caller's contract.
            Some(unsafe { Self::from_ptr(ptr) })
        }
    }

    /// Client, right before it sends its CLC Confirm: claims the server's DMB (see *Handshake
    /// arbitration*). True: the Confirm is to be sent (also when this end had claimed it
    /// already); false: the server withdrew its Accept first (its Decline follows the Accept),
    /// or the word holds something neither end writes (a peer's doing): no Confirm. (Not on
    /// the eBPF target, which has no compare-exchange.)
    #[cfg(not(target_arch = "bpf"))]
    pub fn claim_confirm(&self) -> bool {
        match self.type_word.compare_exchange(
            0,
            ARBITER_CONFIRMED,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => true,
            Err(v) => v == ARBITER_CONFIRMED,
        }
    }

    /// Server, when its wait for the client's Confirm is over: withdraws its Accept in its own
    /// DMB (see *Handshake arbitration*). True: withdrawn (send a Decline, fall back to TCP);
    /// false: the client claimed first (its Confirm is on its way) or wrote something else.
    #[cfg(not(target_arch = "bpf"))]
    pub fn claim_withdraw(&self) -> bool {
        self.type_word
            .compare_exchange(0, ARBITER_WITHDRAWN, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// The type byte (`0xFE` once the peer has written the header, `0` before).
    pub fn msg_type(&self) -> u8 {
        self.type_word.load(Ordering::Acquire).to_ne_bytes()[0]
    }

    /// Write the type byte `0xFE` and zero the reserved bytes of the first and last words.
    pub fn init(&self) {
        let mut b = [0u8; 8];
        b[0] = CDC_MSG_TYPE;
        self.type_word
            .store(u64::from_ne_bytes(b), Ordering::Release);
        self.reserved.store(0, Ordering::Release);
    }

    /// Atomically load the producer word.
    pub fn load_prod(&self) -> CursorWord {
        load_word(&self.prod)
    }

    /// Atomically load the consumer word.
    pub fn load_cons(&self) -> CursorWord {
        load_word(&self.cons)
    }

    /// Atomically store the producer word.
    pub fn store_prod(&self, w: CursorWord) {
        store_word(&self.prod, w)
    }

    /// Atomically store the consumer word (which carries the flags).
    pub fn store_cons(&self, w: CursorWord) {
        store_word(&self.cons, w)
    }

    /// The producer word itself, for custom atomic operations.
    pub fn prod_atomic(&self) -> &AtomicU64 {
        &self.prod
    }

    /// The consumer word itself, for custom atomic operations (e.g. `fetch_or` of a flag).
    pub fn cons_atomic(&self) -> &AtomicU64 {
        &self.cons
    }

    /// A snapshot of the whole header (each word loaded atomically, not the four together).
    /// Fails if the type byte is not `0xFE`.
    pub fn snapshot(&self) -> Result<CdcMsg, CursorError> {
        if self.msg_type() != CDC_MSG_TYPE {
            return Err(CursorError::BadType);
        }
        Ok(CdcMsg {
            prod: self.load_prod(),
            cons: self.load_cons(),
        })
    }

    /// Store a whole message: type word, producer word, then consumer word last (so a reader
    /// that sees the new flags also sees the new producer cursor).
    pub fn store(&self, m: &CdcMsg) {
        self.init();
        self.store_prod(m.prod);
        self.store_cons(m.cons);
    }
}

impl fmt::Debug for CdcHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CdcHeader")
            .field("type", &self.msg_type())
            .field("prod", &self.load_prod())
            .field("cons", &self.load_cons())
            .finish()
    }
}

/// Atomically load the producer word of the header at `hdr` (the start of a DMB).
///
/// # Safety
/// As for [`CdcHeader::from_ptr`].
pub unsafe fn read_prod(hdr: *mut u8) -> CursorWord {
    // SAFETY: forwarded contract.
    unsafe { CdcHeader::from_ptr(hdr) }.load_prod()
}

/// Atomically load the consumer word of the header at `hdr`.
///
/// # Safety
/// As for [`CdcHeader::from_ptr`].
pub unsafe fn read_cons(hdr: *mut u8) -> CursorWord {
    // SAFETY: forwarded contract.
    unsafe { CdcHeader::from_ptr(hdr) }.load_cons()
}

/// Atomically store the producer word of the header at `hdr`.
///
/// # Safety
/// As for [`CdcHeader::from_ptr`].
pub unsafe fn write_prod(hdr: *mut u8, w: CursorWord) {
    // SAFETY: forwarded contract.
    unsafe { CdcHeader::from_ptr(hdr) }.store_prod(w)
}

/// Atomically store the consumer word of the header at `hdr`.
///
/// # Safety
/// As for [`CdcHeader::from_ptr`].
pub unsafe fn write_cons(hdr: *mut u8, w: CursorWord) {
    // SAFETY: forwarded contract.
    unsafe { CdcHeader::from_ptr(hdr) }.store_cons(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_offsets() {
        let m = CdcMsg {
            prod: CursorWord::from_cursor(Cursor::new(0x0102, 0x0304_0506)),
            cons: CursorWord {
                cursor: Cursor::new(0x1112, 0x1314_1516),
                prod_flags: ProdFlags::WRITE_BLOCKED.with(ProdFlags::CONS_CURS_UPD_REQ),
                conn_state: ConnStateFlags::PEER_DONE_WRITING,
            },
        };
        let b = m.to_bytes();
        assert_eq!(b.len(), 32);
        assert_eq!(b[0], 0xFE);
        assert_eq!(&b[1..8], &[0; 7]);
        assert_eq!(&b[8..10], &0x0102u16.to_ne_bytes());
        assert_eq!(&b[10..14], &0x0304_0506u32.to_ne_bytes());
        assert_eq!(&b[14..16], &[0, 0]);
        assert_eq!(&b[16..18], &0x1112u16.to_ne_bytes());
        assert_eq!(&b[18..22], &0x1314_1516u32.to_ne_bytes());
        assert_eq!(b[22], 0x90);
        assert_eq!(b[23], 0x80);
        assert_eq!(&b[24..32], &[0; 8]);
        assert_eq!(CdcMsg::from_bytes(&b), Ok(m));
        let mut bad = b;
        bad[0] = 0;
        assert_eq!(CdcMsg::from_bytes(&bad), Err(CursorError::BadType));
    }

    #[cfg(target_endian = "little")]
    #[test]
    fn word_as_u64_little_endian() {
        let w = CursorWord {
            cursor: Cursor::new(0xAABB, 0x1122_3344),
            prod_flags: ProdFlags(0x10),
            conn_state: ConnStateFlags(0x20),
        };
        assert_eq!(w.to_u64(), 0x2010_1122_3344_AABB);
        assert_eq!(CursorWord::from_u64(w.to_u64()), w);
    }

    #[test]
    fn header_atomic_roundtrip() {
        let mut mem = [0u64; 4];
        // SAFETY: `mem` is 32 bytes, 8-byte aligned, outlives `h` and is only accessed through it.
        let h = unsafe { CdcHeader::from_ptr(mem.as_mut_ptr() as *mut u8) };
        assert_eq!(h.snapshot(), Err(CursorError::BadType));
        let m = CdcMsg {
            prod: CursorWord::from_cursor(Cursor::new(3, 77)),
            cons: CursorWord {
                cursor: Cursor::new(2, 5),
                prod_flags: ProdFlags::URG_DATA_PRESENT,
                conn_state: ConnStateFlags::PEER_CONN_ABORT,
            },
        };
        h.store(&m);
        assert_eq!(h.snapshot(), Ok(m));
        // SAFETY: [u64; 4] and [u8; 32] have the same size and every bit pattern is valid.
        let bytes: [u8; 32] = unsafe { core::mem::transmute(mem) };
        assert_eq!(bytes, m.to_bytes());
        let p = mem.as_mut_ptr() as *mut u8;
        // SAFETY: `p` points to the 32-byte, 8-byte aligned `mem`, live for the whole block;
        // `try_from_ptr` checks the misaligned `p.add(1)` and reads nothing through it.
        unsafe {
            write_prod(p, CursorWord::from_cursor(Cursor::new(9, 9)));
            assert_eq!(read_prod(p).cursor, Cursor::new(9, 9));
            write_cons(p, CursorWord::default());
            assert_eq!(read_cons(p), CursorWord::default());
            assert!(CdcHeader::try_from_ptr(p.add(1)).is_none());
            assert!(CdcHeader::try_from_ptr(core::ptr::null_mut()).is_none());
        }
    }

    #[test]
    fn ring_math() {
        let r = Ring::new(100).unwrap();
        let c = r.add(Cursor::ZERO, 250);
        assert_eq!(c, Cursor::new(2, 50));
        assert_eq!(r.diff(Cursor::new(1, 90), Cursor::new(2, 10)), Ok(20));
        assert_eq!(r.diff(Cursor::new(1, 10), Cursor::new(2, 10)), Ok(100));
        assert_eq!(
            r.diff(Cursor::new(1, 10), Cursor::new(2, 11)),
            Err(CursorError::TooFarAhead)
        );
        assert_eq!(
            r.diff(Cursor::new(1, 10), Cursor::new(1, 9)),
            Err(CursorError::TooFarAhead)
        );
        assert_eq!(
            r.diff(Cursor::new(1, 100), Cursor::new(1, 9)),
            Err(CursorError::CountOutOfRange)
        );
        // wrap counter rollover
        let last = Cursor::new(0xFFFF, 95);
        assert_eq!(r.add(last, 10), Cursor::new(0, 5));
        assert_eq!(r.diff(last, Cursor::new(0, 5)), Ok(10));
        assert_eq!(r.readable(Cursor::new(0, 0), Cursor::new(0, 40)), Ok(40));
        assert_eq!(r.free_space(Cursor::new(0, 40), Cursor::new(0, 0)), Ok(60));
        assert_eq!(r.free_space(Cursor::new(1, 0), Cursor::new(0, 0)), Ok(0));
        assert_eq!(r.segments(Cursor::new(0, 90), 30), [(90, 10), (0, 20)]);
        assert_eq!(r.segments(Cursor::new(0, 10), 30), [(10, 30), (0, 0)]);
        assert_eq!(r.segments(Cursor::new(0, 1000), 1000), [(0, 100), (0, 0)]);
    }

    #[test]
    fn untrusted_cursors() {
        let r = Ring::new(100).unwrap();
        let cons = Cursor::new(0, 50);
        let last = Cursor::new(0, 60);
        assert_eq!(
            r.accept_peer_prod(cons, last, Cursor::new(1, 50)),
            Ok(Cursor::new(1, 50))
        );
        assert_eq!(
            r.accept_peer_prod(cons, last, Cursor::new(1, 51)),
            Err(CursorError::TooFarAhead)
        );
        assert_eq!(
            r.accept_peer_prod(cons, last, Cursor::new(0, 55)),
            Err(CursorError::Backwards)
        );
        assert_eq!(
            r.accept_peer_prod(cons, last, Cursor::new(0, 200)),
            Err(CursorError::CountOutOfRange)
        );
        let prod = Cursor::new(0, 80);
        let last_c = Cursor::new(0, 20);
        assert_eq!(
            r.accept_peer_cons(prod, last_c, Cursor::new(0, 80)),
            Ok(Cursor::new(0, 80))
        );
        assert_eq!(
            r.accept_peer_cons(prod, last_c, Cursor::new(0, 81)),
            Err(CursorError::TooFarAhead)
        );
        assert_eq!(
            r.accept_peer_cons(prod, last_c, Cursor::new(0, 19)),
            Err(CursorError::Backwards)
        );
    }

    #[test]
    fn update_rule() {
        let r = Ring::for_dmb(64 * 1024).unwrap();
        assert_eq!(r.len(), 65504);
        assert_eq!(r.update_limit(), 6550);
        let small = Ring::for_dmb(16 * 1024).unwrap();
        assert_eq!(small.update_limit(), CONS_UPDATE_MIN);
        let z = Cursor::ZERO;
        assert!(!r.need_cons_update(z, r.add(z, 6549), ProdFlags::EMPTY));
        assert!(r.need_cons_update(z, r.add(z, 6550), ProdFlags::EMPTY));
        assert!(r.need_cons_update(z, r.add(z, 1), ProdFlags::CONS_CURS_UPD_REQ));
        assert!(r.need_cons_update(z, r.add(z, 1), ProdFlags::WRITE_BLOCKED));
        assert!(!r.need_cons_update(z, z, ProdFlags::CONS_CURS_UPD_REQ));
    }

    #[test]
    fn size_codes() {
        assert_eq!(dmb_size_from_code(0), Some(16384));
        assert_eq!(dmb_size_from_code(6), Some(1 << 20));
        assert_eq!(dmb_size_from_code(7), None);
        assert_eq!(dmb_size_code(1), 0);
        assert_eq!(dmb_size_code(16384), 0);
        assert_eq!(dmb_size_code(16385), 1);
        assert_eq!(dmb_size_code(65536), 2);
        assert_eq!(dmb_size_code(65537), 3);
        assert_eq!(dmb_size_code(1 << 20), 6);
        assert_eq!(dmb_size_code(u32::MAX), 6);
        assert_eq!(dmb_size_code_large(8 << 20), 9);
        assert_eq!(dmb_size_code_large((8 << 20) + 1), 10);
        assert_eq!(dmb_size_code_large(u32::MAX), 10);
        assert_eq!(dmb_size_from_code_large(9), Some(8 << 20));
        assert_eq!(dmb_size_from_code_large(11), None);
    }

    #[test]
    fn arbiter_first_claim_decides() {
        // The client first: the server's withdrawal fails, a repeated claim still confirms.
        let h = CdcHeader::zeroed();
        assert!(h.claim_confirm());
        assert!(!h.claim_withdraw());
        assert!(h.claim_confirm());
        assert_eq!(h.msg_type(), CDC_MSG_TYPE);
        // The server first: the client does not confirm.
        let h = CdcHeader::zeroed();
        assert!(h.claim_withdraw());
        assert!(!h.claim_confirm());
        assert!(!h.claim_withdraw());
        assert_ne!(h.msg_type(), CDC_MSG_TYPE);
        // Something neither end writes: neither claims.
        let h = CdcHeader::zeroed();
        h.type_word.store(0x55, Ordering::Relaxed);
        assert!(!h.claim_confirm());
        assert!(!h.claim_withdraw());
    }

    #[test]
    fn arbiter_crossing_claims_have_one_winner() {
        // Both claims at the same moment (released together), many times: exactly one wins.
        for _ in 0..2000 {
            let h = CdcHeader::zeroed();
            let go = std::sync::Barrier::new(2);
            let (c, s) = std::thread::scope(|sc| {
                let c = sc.spawn(|| {
                    go.wait();
                    h.claim_confirm()
                });
                go.wait();
                let s = h.claim_withdraw();
                (c.join().unwrap(), s)
            });
            assert!(c != s, "confirm {c}, withdraw {s}");
        }
    }
}
