//! CLC (connection layer control) messages: the SMC handshake carried over the original TCP
//! connection, byte-exact with Linux `net/smc/smc_clc.h` / `smc_clc.c`.
//!
//! All multi-byte fields are big-endian. Every message starts with an 8-byte [`Header`] and ends
//! with a 4-byte trailer repeating an eyecatcher (`"SMCR"` or `"SMCD"` in EBCDIC).
//!
//! # Framing
//!
//! An I/O layer reads [`HEADER_LEN`] bytes, asks [`message_len`] how long the whole message is
//! (this already rejects a bad eyecatcher, type, version or a length impossible for the type),
//! reads the rest, and hands the complete buffer to [`decode`].
//!
//! # Strictness
//!
//! [`decode`] checks every eyecatcher, length, offset and count against the layouts below and
//! never reads outside the buffer. Reserved and vendor bytes are ignored (as Linux does), so
//! `decode(encode(m)) == m` and `encode(decode(b))` equals `b` up to reserved bytes. Offsets
//! must describe the contiguous layout that Linux's length check implies (Linux computes the
//! expected length from the counts and only bounds the offsets; we require them to agree).
//! Counts are limited like Linux's receive path: at most 8 IPv6 prefixes, 8 UEIDs and 8
//! GID/CHID entries.
//!
//! # Layouts (offsets in bytes, all verified by the unit tests)
//!
//! ```text
//! Header (struct smc_clc_msg_hdr, 8 bytes)
//!   0 eyecatcher[4]  4 type  5 length be16  7 version:4 | typev2:2 | typev1:2
//!
//! Proposal (smc_clc_msg_proposal 40 + smc_clc_msg_smcd 40 + optional parts + trailer)
//!   8 peer_id[8]  16 ib gid[16]  32 mac[6]  38 iparea_offset be16
//!   40 SMC-D info: 40 ism gid be64, 48 chid be16, 50 v2_ext_offset be16 (counted from 52),
//!      52..80 vendor oui / options / reserved
//!   40+iparea_offset: IP prefix area: subnet[4], prefix_len, reserved[2], ipv6_cnt,
//!      then ipv6_cnt x {prefix[16], len} (17 bytes each)
//!   v2 extension (40 + 32 per UEID): eid_cnt, ism_gid_cnt, reserved,
//!      release:4 | rsvd:3 | seid:1, reserved[2], +6 smcd_v2_ext_offset be16 (counted from +8),
//!      +8 roce gid[16], +24 max_conns, +25 max_links, +26 feature_mask be16, reserved[12],
//!      then the UEIDs
//!   SMC-Dv2 extension (48 + 10 per entry): system_eid[32], reserved[16],
//!      then {gid be64, chid be16} entries
//!   trailer[4]
//!
//! Accept/Confirm, SMC-D (smcd_clc_msg_accept_confirm_common + d1)
//!   8 gid be64  16 token be64  24 dmbe_idx  25 dmbe_size:4 | reserved:4  26 reserved[2]
//!   28 linkid be32
//!   v1: 32 reserved[12], 44 trailer                                   = 48 bytes
//!   v2: 32 chid be16, 34 eid[32], 66 gid_ext be64,
//!       [74 first-contact extension: v2_direct:1 | rsvd:7, os_type:4 | release:4,
//!        reserved[2], hostname[32]                                    (36 bytes, release 0)
//!        + reserved[2], feature_mask be16, vendor_exp_options be32,
//!          reserved[8]                                                (52 bytes, release 1)]
//!       trailer                                                       = 78 / 114 / 130 bytes
//!
//! Decline (smc_clc_msg_decline[_v2])
//!   8 peer_id[8]  16 diagnosis be32  20 os_type:4 | reserved:4  21 reserved[3]
//!   v1: 24 trailer                                                    = 28 bytes
//!   v2: 24 four more diagnoses be32, 40 trailer                       = 44 bytes
//! ```

use crate::diag::Diag;
use std::fmt;
use std::vec::Vec;

pub use crate::clc_wire::*;

/// `SMC_V1`.
pub const SMC_V1: u8 = 1;
/// `SMC_V2`.
pub const SMC_V2: u8 = 2;
/// `SMC_RELEASE_0` (SMCv2.0).
pub const SMC_RELEASE_0: u8 = 0;
/// `SMC_RELEASE_1` (SMCv2.1, which added Emulated-ISM devices such as loopback-ism).
pub const SMC_RELEASE_1: u8 = 1;
/// `SMC_CLC_OS_LINUX`.
pub const OS_LINUX: u8 = 2;
/// Bit of `SMC_SPF_EMULATED_ISM_DEV` in the v2 feature mask (`SMC_FEATURE_MASK`).
pub const FEATURE_EMULATED_ISM: u16 = 1 << 0;
/// This implementation's large-DMB extension in the v2 feature mask (a bit Linux does not
/// define; its server keeps only `SMC_FEATURE_MASK` of a proposal's mask, so a Linux peer never
/// echoes it): the sender accepts DMB size codes up to [`crate::cdc::DMB_MAX_SIZE_CODE_LARGE`]
/// from the peer. A server uses such a code only when the proposal offered the bit and echoes
/// it in its accept; a client only when the accept echoed it.
pub const FEATURE_LARGE_DMB: u16 = 1 << 15;
/// This implementation's accept-withdrawal extension in the v2 feature mask (a bit Linux does
/// not define, masked off by a Linux server like [`FEATURE_LARGE_DMB`]): the client decides
/// its Confirm against the server's give-up in the server's DMB
/// ([`crate::cdc::CdcHeader::claim_confirm`]) before it sends it, so that a server that waited
/// for the Confirm in vain (an idle client) may withdraw its Accept with a Decline and both ends
/// continue on TCP, in sync, instead of resetting the connection. A server withdraws only when
/// the proposal offered the bit (echoing it in its accept); a client always decides first.
pub const FEATURE_ACCEPT_WITHDRAW: u16 = 1 << 14;
/// This implementation's "switch alone" extension in the v2 feature mask (a bit Linux does not
/// define, masked off by a Linux server like [`FEATURE_LARGE_DMB`]): both ends count the control
/// bytes (doorbells, the switch marker) they send on the TCP socket while the rings carry the
/// stream, in the last word of the receiver's DMB header (see [`crate::cdc`]), so that the
/// receiver reads exactly those and never a data byte behind them; and an end may switch the
/// connection to TCP without its peer's answer when neither ring holds an unread byte (the
/// peer continues on TCP at its next operation). Used only when the proposal offered it and
/// the accept echoed it.
pub const FEATURE_SWITCH_ALONE: u16 = 1 << 13;
/// This implementation's extension of [`FEATURE_SWITCH_ALONE`] (a bit Linux does not define,
/// masked off by a Linux server like [`FEATURE_LARGE_DMB`]): an end may also switch alone while
/// the peer has not read all it wrote into the peer's ring. Its switch marker is then followed
/// by a count `n` (4 bytes, little-endian) and the `n` bytes of its stream from the consumer
/// cursor the peer last published (which may lag what the peer has read) to its final producer
/// cursor; the peer, when it answers, drops from them what it had already read from its ring,
/// and reads the rest over TCP, then what the end writes after it. Used only when the proposal
/// offered it and the accept echoed it, together with [`FEATURE_SWITCH_ALONE`].
pub const FEATURE_SWITCH_ALONE_RESEND: u16 = 1 << 12;
/// This implementation's extension of the switch to TCP (a bit Linux does not define, masked
/// off by a Linux server like [`FEATURE_LARGE_DMB`]): at the end of a two-sided switch each end
/// waits until the peer acknowledged its switch bytes, turns its delayed ACKs back to those of a
/// fresh connection (`TCP_QUICKACK`), and says so in the wait word of its DMB (see
/// [`crate::cdc`]); neither end continues before the other said so. The switch's own exchange
/// left both sockets in delayed-ACK (ping-pong) mode, where a fresh TCP connection ACKs at once:
/// the peer's small writes then waited on Nagle for the ACK of the first, and a close with
/// unread bytes (a reset) dropped them. Used only when the proposal offered it and the accept
/// echoed it.
pub const FEATURE_SWITCH_FRESH_ACKS: u16 = 1 << 11;
/// The feature bits this implementation offers and echoes.
pub const OUR_FEATURES: u16 = FEATURE_EMULATED_ISM
    | FEATURE_LARGE_DMB
    | FEATURE_ACCEPT_WITHDRAW
    | FEATURE_SWITCH_ALONE
    | FEATURE_SWITCH_ALONE_RESEND
    | FEATURE_SWITCH_FRESH_ACKS;
/// CHID of Linux's loopback-ism (`SMC_LO_RESERVED_CHID`).
pub const LOOPBACK_CHID: u16 = 0xFFFF;
/// `SMC_FIRST_CONTACT_MASK` within `typev2`.
const FIRST_CONTACT_MASK: u8 = 0b10;

/// An Enterprise ID (system EID or user EID), 32 bytes, blank padded.
pub type Eid = [u8; EID_LEN];

/// Whether a CHID is in the range reserved for Emulated-ISM devices (`0xFF00..=0xFFFF`,
/// `__smc_ism_is_emulated`). Such a device has a 128-bit GID and takes two GID/CHID entries in
/// a proposal.
pub const fn is_emulated_chid(chid: u16) -> bool {
    chid & 0xFF00 == 0xFF00
}

/// A 128-bit SMC-D GID (`struct smcd_gid`): `gid_ext` is zero for native ISM devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Gid {
    /// First 64 bits.
    pub gid: u64,
    /// Extension (second 64 bits of an Emulated-ISM UUID).
    pub gid_ext: u64,
}

impl Gid {
    /// From the 16 bytes of a UUID (loopback-ism's GID): `gid` is the first 8, `gid_ext` the
    /// last 8, both read big-endian. Two peers are on the same host when both halves are equal.
    pub fn from_bytes(b: [u8; 16]) -> Gid {
        let mut hi = [0u8; 8];
        let mut lo = [0u8; 8];
        hi.copy_from_slice(&b[0..8]);
        lo.copy_from_slice(&b[8..16]);
        Gid {
            gid: u64::from_be_bytes(hi),
            gid_ext: u64::from_be_bytes(lo),
        }
    }

    /// The 16 UUID bytes.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[0..8].copy_from_slice(&self.gid.to_be_bytes());
        b[8..16].copy_from_slice(&self.gid_ext.to_be_bytes());
        b
    }

    /// Parses 32 hex digits, dashes allowed anywhere (UUID form).
    pub fn parse(s: &str) -> Option<Gid> {
        let hex: Vec<u8> = s.trim().bytes().filter(|&c| c != b'-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut b = [0u8; 16];
        for (i, pair) in hex.chunks(2).enumerate() {
            let s = std::str::from_utf8(pair).ok()?;
            b[i] = u8::from_str_radix(s, 16).ok()?;
        }
        Some(Gid::from_bytes(b))
    }
}

impl fmt::Display for Gid {
    /// UUID form, `8-4-4-4-12` hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.to_bytes();
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// CLC message type (`SMC_CLC_PROPOSAL` ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MsgType {
    /// Client's offer.
    Proposal = MSG_PROPOSAL,
    /// Server's choice.
    Accept = 2,
    /// Client's confirmation.
    Confirm = 3,
    /// Either side gives up; both fall back to TCP.
    Decline = MSG_DECLINE,
}

impl MsgType {
    /// The type for a wire byte.
    pub const fn from_u8(v: u8) -> Option<MsgType> {
        match v {
            1 => Some(MsgType::Proposal),
            2 => Some(MsgType::Accept),
            3 => Some(MsgType::Confirm),
            4 => Some(MsgType::Decline),
            _ => None,
        }
    }
}

/// `SMC_TYPE_*`: which SMC variants a message is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SmcType {
    /// SMC-R only.
    R = 0,
    /// SMC-D only.
    D = 1,
    /// Neither.
    N = 2,
    /// Both.
    B = 3,
}

impl SmcType {
    /// From the 2-bit field.
    pub const fn from_bits(v: u8) -> SmcType {
        match v & 3 {
            0 => SmcType::R,
            1 => SmcType::D,
            2 => SmcType::N,
            _ => SmcType::B,
        }
    }
    /// `smcd_indicated`.
    pub const fn smcd(self) -> bool {
        matches!(self, SmcType::D | SmcType::B)
    }
    /// `smcr_indicated`.
    pub const fn smcr(self) -> bool {
        matches!(self, SmcType::R | SmcType::B)
    }
}

/// A decoding (or encoding) failure. Each maps to the diagnosis code to decline with
/// ([`ClcError::diag`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClcError {
    /// The buffer is shorter than the header says (or than a header).
    Truncated {
        /// Bytes required.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// The buffer is longer than the header's length field.
    TrailingBytes {
        /// Header length.
        len: usize,
        /// Bytes available.
        have: usize,
    },
    /// The header does not start with an SMC eyecatcher.
    BadEyecatcher,
    /// The trailer is not an SMC eyecatcher.
    BadTrailer,
    /// Unknown message type byte.
    UnknownType(u8),
    /// Version 0 (Linux requires at least `SMC_V1`).
    BadVersion(u8),
    /// The length field is impossible for this type, version and content.
    BadLength {
        /// Message type byte.
        msg_type: u8,
        /// Length field.
        length: u16,
    },
    /// `typev1` / `typev2` combination not allowed for this message.
    BadSmcType {
        /// typev1 bits.
        typev1: u8,
        /// typev2 bits.
        typev2: u8,
    },
    /// An offset field does not point where the layout requires.
    BadOffset {
        /// Field name.
        field: &'static str,
        /// Its value.
        value: u16,
    },
    /// A count exceeds the protocol limit.
    TooMany {
        /// Field name.
        field: &'static str,
        /// Its value.
        count: usize,
    },
    /// An SMC-R accept/confirm (this implementation does SMC-D only).
    UnsupportedMode,
    /// DMBE size code above `SMCD_DMBE_SIZES` (6).
    BadDmbSize(u8),
    /// First-contact extension length does not match its release.
    BadFirstContactExt,
    /// Encoder input whose fields contradict each other.
    Inconsistent(&'static str),
}

impl ClcError {
    /// The diagnosis code to decline with when this error is found in a received message.
    pub const fn diag(&self) -> Diag {
        match self {
            ClcError::UnsupportedMode => Diag::ModeUnsupp,
            ClcError::BadVersion(_) => Diag::VersMismat,
            ClcError::Inconsistent(_) => Diag::IntErr,
            _ => Diag::SyncErr,
        }
    }
}

impl fmt::Display for ClcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClcError::Truncated { need, have } => {
                write!(f, "truncated CLC message: need {need} bytes, have {have}")
            }
            ClcError::TrailingBytes { len, have } => {
                write!(f, "CLC message length {len} but {have} bytes given")
            }
            ClcError::BadEyecatcher => f.write_str("bad CLC eyecatcher"),
            ClcError::BadTrailer => f.write_str("bad CLC trailer"),
            ClcError::UnknownType(t) => write!(f, "unknown CLC message type {t}"),
            ClcError::BadVersion(v) => write!(f, "unsupported CLC version {v}"),
            ClcError::BadLength { msg_type, length } => {
                write!(f, "invalid length {length} for CLC message type {msg_type}")
            }
            ClcError::BadSmcType { typev1, typev2 } => {
                write!(f, "invalid SMC types v1={typev1} v2={typev2}")
            }
            ClcError::BadOffset { field, value } => write!(f, "invalid {field} {value}"),
            ClcError::TooMany { field, count } => write!(f, "too many {field}: {count}"),
            ClcError::UnsupportedMode => f.write_str("SMC-R accept/confirm not supported"),
            ClcError::BadDmbSize(s) => write!(f, "invalid DMBE size code {s}"),
            ClcError::BadFirstContactExt => f.write_str("invalid first-contact extension"),
            ClcError::Inconsistent(what) => write!(f, "inconsistent CLC message: {what}"),
        }
    }
}

impl std::error::Error for ClcError {}

/// The 8-byte CLC header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Header {
    /// True for `"SMCD"`, false for `"SMCR"`.
    pub smcd_eyecatcher: bool,
    /// Message type.
    pub msg_type: MsgType,
    /// Whole message length.
    pub length: u16,
    /// Protocol version (1, 2, ...).
    pub version: u8,
    /// `typev2` bits (for accept/confirm/decline bit 1 is the first-contact / sync flag).
    pub typev2: u8,
    /// `typev1` bits.
    pub typev1: u8,
}

impl Header {
    /// Parse and check eyecatcher, type and version (not the length; see [`message_len`]).
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, ClcError> {
        let smcd_eyecatcher = match [b[0], b[1], b[2], b[3]] {
            EYECATCHER_SMCR => false,
            EYECATCHER_SMCD => true,
            _ => return Err(ClcError::BadEyecatcher),
        };
        let msg_type = MsgType::from_u8(b[4]).ok_or(ClcError::UnknownType(b[4]))?;
        let version = b[7] >> 4;
        if version < SMC_V1 {
            return Err(ClcError::BadVersion(version));
        }
        Ok(Header {
            smcd_eyecatcher,
            msg_type,
            length: u16::from_be_bytes([b[5], b[6]]),
            version,
            typev2: (b[7] >> 2) & 3,
            typev1: b[7] & 3,
        })
    }

    /// The 8 header bytes.
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let e = if self.smcd_eyecatcher {
            EYECATCHER_SMCD
        } else {
            EYECATCHER_SMCR
        };
        let l = self.length.to_be_bytes();
        [
            e[0],
            e[1],
            e[2],
            e[3],
            self.msg_type as u8,
            l[0],
            l[1],
            (self.version << 4) | ((self.typev2 & 3) << 2) | (self.typev1 & 3),
        ]
    }
}

/// Framing: the total length of the message whose header is `header`, after checking that it
/// is possible for its type and version. Read that many bytes (header included) and pass them
/// to [`decode`].
pub fn message_len(header: &[u8; HEADER_LEN]) -> Result<usize, ClcError> {
    let h = Header::parse(header)?;
    let len = h.length as usize;
    let ok = match h.msg_type {
        MsgType::Proposal => (PROPOSAL_MIN_LEN..=PROPOSAL_MAX_LEN).contains(&len),
        MsgType::Accept | MsgType::Confirm => match (SmcType::from_bits(h.typev1), h.version) {
            (SmcType::D, SMC_V1) => len == SMCD_ACCEPT_CONFIRM_V1_LEN,
            (SmcType::D, _) => {
                len == SMCD_ACCEPT_CONFIRM_V2_LEN
                    || len == SMCD_ACCEPT_CONFIRM_V2_LEN + FCE_LEN
                    || len == SMCD_ACCEPT_CONFIRM_V2_LEN + FCE_V2X_LEN
            }
            (SmcType::R, SMC_V1) => len == SMCR_ACCEPT_CONFIRM_V1_LEN,
            (SmcType::R, _) => {
                (SMCR_ACCEPT_CONFIRM_V2_LEN..=SMCR_ACCEPT_CONFIRM_MAX_LEN).contains(&len)
            }
            _ => {
                return Err(ClcError::BadSmcType {
                    typev1: h.typev1,
                    typev2: h.typev2,
                })
            }
        },
        MsgType::Decline => {
            if h.version == SMC_V1 {
                len == DECLINE_V1_LEN
            } else {
                len == DECLINE_V2_LEN
            }
        }
    };
    if ok {
        Ok(len)
    } else {
        Err(ClcError::BadLength {
            msg_type: h.msg_type as u8,
            length: h.length,
        })
    }
}

/// The IP prefix area of a proposal (`smc_clc_msg_proposal_prefix` + IPv6 prefixes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct IpPrefix {
    /// IPv4 subnet (network byte order), zero when IPv6 prefixes are given.
    pub outgoing_subnet: [u8; 4],
    /// Significant bits of the IPv4 subnet.
    pub prefix_len: u8,
    /// IPv6 prefixes (at most 8).
    pub ipv6_prefixes: Vec<Ipv6Prefix>,
}

/// One IPv6 prefix (`struct smc_clc_ipv6_prefix`, 17 bytes packed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ipv6Prefix {
    /// Prefix address.
    pub prefix: [u8; 16],
    /// Prefix length.
    pub prefix_len: u8,
}

/// One `{gid, chid}` entry of the SMC-Dv2 extension.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GidChid {
    /// ISM GID (or, for the second entry of an Emulated-ISM device, its `gid_ext`).
    pub gid: u64,
    /// ISMv2 CHID.
    pub chid: u16,
}

/// An ISM device offered in a proposal, after pairing Emulated-ISM entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OfferedDevice {
    /// CHID.
    pub chid: u16,
    /// GID (`gid_ext` is zero for native ISM).
    pub gid: Gid,
}

/// The SMC-Dv2 extension of a proposal (`smc_clc_smcd_v2_extension`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct SmcdV2Ext {
    /// System EID (zero when the SEID flag is off).
    pub system_eid: Eid,
    /// GID/CHID entries (at most 8); an Emulated-ISM device takes two consecutive entries with
    /// the same CHID, the second carrying `gid_ext`.
    pub gidchids: Vec<GidChid>,
}

impl SmcdV2Ext {
    /// The offered devices, pairing entries exactly like Linux's
    /// `smc_find_ism_v2_device_serv` (an Emulated-ISM entry without a following entry of the
    /// same CHID is skipped).
    pub fn devices(&self) -> Vec<OfferedDevice> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.gidchids.len() {
            let e = self.gidchids[i];
            let mut gid = Gid {
                gid: e.gid,
                gid_ext: 0,
            };
            if is_emulated_chid(e.chid) {
                match self.gidchids.get(i + 1) {
                    Some(next) if next.chid == e.chid => {
                        gid.gid_ext = next.gid;
                        i += 1;
                    }
                    _ => {
                        i += 1;
                        continue;
                    }
                }
            }
            out.push(OfferedDevice { chid: e.chid, gid });
            i += 1;
        }
        out
    }
}

/// The v2 extension of a proposal (`smc_clc_v2_extension`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ProposalV2Ext {
    /// Highest SMCv2 release the client supports (4 bits).
    pub release: u8,
    /// The system EID in the SMC-Dv2 extension is valid.
    pub seid: bool,
    /// RoCEv2 GID (SMC-Rv2).
    pub roce_gid: [u8; 16],
    /// SMC-R max connections per link group.
    pub max_conns: u8,
    /// SMC-R max links per link group.
    pub max_links: u8,
    /// Supplemental features (`SMC_FEATURE_MASK`).
    pub feature_mask: u16,
    /// User-defined EIDs (at most 8).
    pub ueids: Vec<Eid>,
    /// SMC-Dv2 extension, present iff `typev2` indicates SMC-D.
    pub smcd: Option<SmcdV2Ext>,
}

/// A CLC proposal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proposal {
    /// Header version (1, or >= 2 for the v2 layout).
    pub version: u8,
    /// SMCv1 variants offered.
    pub typev1: SmcType,
    /// SMCv2 variants offered (only meaningful when `version >= 2`; Linux v1 senders put
    /// 0, i.e. `R`, in these bits).
    pub typev2: SmcType,
    /// `lcl.id_for_peer` (SMC-R system id; zero from Linux for SMC-D only).
    pub peer_id: [u8; 8],
    /// `lcl.gid` (SMC-R).
    pub ib_gid: [u8; 16],
    /// `lcl.mac` (SMC-R).
    pub ib_mac: [u8; 6],
    /// Native (v1) ISM device: GID.
    pub ism_gid: u64,
    /// Native (v1) ISM device: CHID.
    pub ism_chid: u16,
    /// IP prefix area, present iff `typev1 != N`.
    pub ip_prefix: Option<IpPrefix>,
    /// v2 extension, present iff `version >= 2 && typev2 != N`.
    pub v2: Option<ProposalV2Ext>,
}

/// First-contact extension of an SMC-Dv2 accept/confirm (`smc_clc_first_contact_ext[_v2x]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FirstContactExt {
    /// `v2_direct` (SMC-R only).
    pub v2_direct: bool,
    /// Operating system (`SMC_CLC_OS_LINUX` = 2).
    pub os_type: u8,
    /// Negotiated release (4 bits). 0 means a 36-byte extension, >= 1 the 52-byte v2.1 one.
    pub release: u8,
    /// Host name, blank padded.
    pub hostname: [u8; HOSTNAME_LEN],
    /// v2.1 part: `(max_conns, max_links)` are SMC-R only; zero for SMC-D.
    pub max_conns: u8,
    /// See `max_conns`.
    pub max_links: u8,
    /// Supplemental features.
    pub feature_mask: u16,
    /// Vendor options.
    pub vendor_exp_options: u32,
}

impl FirstContactExt {
    /// Encoded length: 36 for release 0, 52 otherwise.
    pub const fn len(&self) -> usize {
        if self.release == SMC_RELEASE_0 {
            FCE_LEN
        } else {
            FCE_V2X_LEN
        }
    }

    /// Never empty; present for symmetry with `len`.
    pub const fn is_empty(&self) -> bool {
        false
    }
}

/// The v2 part of an SMC-D accept/confirm (`d1`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AcceptConfirmV2 {
    /// CHID of the chosen device.
    pub chid: u16,
    /// Negotiated EID.
    pub eid: Eid,
    /// Second half of the sender's GID (Emulated-ISM only; zero otherwise).
    pub gid_ext: u64,
    /// First-contact extension, present iff the first-contact bit is set.
    pub fce: Option<FirstContactExt>,
}

/// An SMC-D accept or confirm.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct AcceptConfirm {
    /// Header version (1, or >= 2 for the v2 layout).
    pub version: u8,
    /// First contact (new link group): `typev2` bit 1 (the v1 `flag`).
    pub first_contact: bool,
    /// Sender's GID (first 64 bits).
    pub gid: u64,
    /// Token of the sender's own DMB.
    pub token: u64,
    /// DMBE index (Linux always sends 0).
    pub dmbe_idx: u8,
    /// DMBE size code: `16 KiB << code`, 0..=6.
    pub dmbe_size: u8,
    /// Link (group) identifier.
    pub link_id: u32,
    /// v2 part, present iff `version >= 2`.
    pub v2: Option<AcceptConfirmV2>,
}

impl AcceptConfirm {
    /// The sender's full GID (`gid_ext` zero for v1).
    pub fn sender_gid(&self) -> Gid {
        Gid {
            gid: self.gid,
            gid_ext: self.v2.as_ref().map_or(0, |v| v.gid_ext),
        }
    }
}

/// A decline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Decline {
    /// Header version (1: 28 bytes, >= 2: 44 bytes).
    pub version: u8,
    /// `typev1` (Linux sends R; R or D accepted).
    pub typev1: SmcType,
    /// Sync error: `typev2` first-contact bit, set by Linux iff the diagnosis is `SYNCERR`.
    pub out_of_sync: bool,
    /// Sender's system id.
    pub peer_id: [u8; 8],
    /// Diagnosis code (see [`Diag`]).
    pub diagnosis: u32,
    /// OS type (4 bits): 0 in v1, `OS_LINUX` in v2 from Linux.
    pub os_type: u8,
    /// Additional diagnosis codes (v2 only; zero in v1).
    pub diag_v2: [u32; 4],
}

impl Decline {
    /// A decline as Linux's `smc_clc_send_decline` builds it.
    pub fn new(version: u8, diagnosis: u32, peer_id: [u8; 8]) -> Decline {
        Decline {
            version,
            typev1: SmcType::R,
            out_of_sync: diagnosis == Diag::SyncErr.code(),
            peer_id,
            diagnosis,
            os_type: if version == SMC_V1 { 0 } else { OS_LINUX },
            diag_v2: [0; 4],
        }
    }

    /// The diagnosis as a known code, if it is one.
    pub fn diag(&self) -> Option<Diag> {
        Diag::from_code(self.diagnosis)
    }
}

/// Any decoded CLC message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ClcMessage {
    /// Type 1.
    Proposal(Proposal),
    /// Type 2.
    Accept(AcceptConfirm),
    /// Type 3.
    Confirm(AcceptConfirm),
    /// Type 4.
    Decline(Decline),
}

impl ClcMessage {
    /// The message type.
    pub fn msg_type(&self) -> MsgType {
        match self {
            ClcMessage::Proposal(_) => MsgType::Proposal,
            ClcMessage::Accept(_) => MsgType::Accept,
            ClcMessage::Confirm(_) => MsgType::Confirm,
            ClcMessage::Decline(_) => MsgType::Decline,
        }
    }

    /// Encode to wire bytes (as Linux would send them).
    pub fn encode(&self) -> Result<Vec<u8>, ClcError> {
        match self {
            ClcMessage::Proposal(p) => p.encode(),
            ClcMessage::Accept(a) => a.encode(MsgType::Accept),
            ClcMessage::Confirm(c) => c.encode(MsgType::Confirm),
            ClcMessage::Decline(d) => Ok(d.encode()),
        }
    }
}

// ----------------------------------------------------------------------------------------------
// Reading helpers: every access is bounds-checked and returns `Truncated` instead of panicking.

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn bytes(&self, off: usize, len: usize) -> Result<&'a [u8], ClcError> {
        let end = off.checked_add(len).ok_or(ClcError::Truncated {
            need: usize::MAX,
            have: self.buf.len(),
        })?;
        self.buf.get(off..end).ok_or(ClcError::Truncated {
            need: end,
            have: self.buf.len(),
        })
    }
    fn arr<const N: usize>(&self, off: usize) -> Result<[u8; N], ClcError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(off, N)?);
        Ok(a)
    }
    fn u8(&self, off: usize) -> Result<u8, ClcError> {
        Ok(self.arr::<1>(off)?[0])
    }
    fn u16(&self, off: usize) -> Result<u16, ClcError> {
        Ok(u16::from_be_bytes(self.arr(off)?))
    }
    fn u32(&self, off: usize) -> Result<u32, ClcError> {
        Ok(u32::from_be_bytes(self.arr(off)?))
    }
    fn u64(&self, off: usize) -> Result<u64, ClcError> {
        Ok(u64::from_be_bytes(self.arr(off)?))
    }
}

fn check_trailer(buf: &[u8]) -> Result<(), ClcError> {
    let n = buf.len();
    if n < HEADER_LEN + TRAILER_LEN {
        return Err(ClcError::Truncated {
            need: HEADER_LEN + TRAILER_LEN,
            have: n,
        });
    }
    match [buf[n - 4], buf[n - 3], buf[n - 2], buf[n - 1]] {
        EYECATCHER_SMCR | EYECATCHER_SMCD => Ok(()),
        _ => Err(ClcError::BadTrailer),
    }
}

/// Decode one complete CLC message. `buf` must be exactly the message (as many bytes as the
/// header's length field, see [`message_len`]).
pub fn decode(buf: &[u8]) -> Result<ClcMessage, ClcError> {
    let hdr: [u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or(ClcError::Truncated {
            need: HEADER_LEN,
            have: buf.len(),
        })?;
    let len = message_len(&hdr)?;
    if buf.len() < len {
        return Err(ClcError::Truncated {
            need: len,
            have: buf.len(),
        });
    }
    if buf.len() > len {
        return Err(ClcError::TrailingBytes {
            len,
            have: buf.len(),
        });
    }
    let h = Header::parse(&hdr)?;
    check_trailer(buf)?;
    let r = Reader { buf };
    match h.msg_type {
        MsgType::Proposal => decode_proposal(&h, &r).map(ClcMessage::Proposal),
        MsgType::Accept => decode_accept_confirm(&h, &r).map(ClcMessage::Accept),
        MsgType::Confirm => decode_accept_confirm(&h, &r).map(ClcMessage::Confirm),
        MsgType::Decline => decode_decline(&h, &r).map(ClcMessage::Decline),
    }
}

fn bad_len(h: &Header) -> ClcError {
    ClcError::BadLength {
        msg_type: h.msg_type as u8,
        length: h.length,
    }
}

fn decode_prefix(r: &Reader<'_>, off: usize) -> Result<(IpPrefix, usize), ClcError> {
    let outgoing_subnet = r.arr::<4>(off)?;
    let prefix_len = r.u8(off + 4)?;
    let cnt = r.u8(off + 7)? as usize;
    if cnt > MAX_V6_PREFIXES {
        return Err(ClcError::TooMany {
            field: "ipv6_prefixes_cnt",
            count: cnt,
        });
    }
    let mut ipv6_prefixes = Vec::with_capacity(cnt);
    for i in 0..cnt {
        let o = off + PROPOSAL_PREFIX_LEN + i * IPV6_PREFIX_LEN;
        ipv6_prefixes.push(Ipv6Prefix {
            prefix: r.arr::<16>(o)?,
            prefix_len: r.u8(o + 16)?,
        });
    }
    Ok((
        IpPrefix {
            outgoing_subnet,
            prefix_len,
            ipv6_prefixes,
        },
        PROPOSAL_PREFIX_LEN + cnt * IPV6_PREFIX_LEN,
    ))
}

fn decode_proposal(h: &Header, r: &Reader<'_>) -> Result<Proposal, ClcError> {
    let typev1 = SmcType::from_bits(h.typev1);
    let typev2 = SmcType::from_bits(h.typev2);
    let bad_types = ClcError::BadSmcType {
        typev1: h.typev1,
        typev2: h.typev2,
    };
    let iparea_offset = r.u16(38)?;
    let mut p = Proposal {
        version: h.version,
        typev1,
        typev2,
        peer_id: r.arr(8)?,
        ib_gid: r.arr(16)?,
        ib_mac: r.arr(32)?,
        ism_gid: 0,
        ism_chid: 0,
        ip_prefix: None,
        v2: None,
    };
    let expected_len;
    if h.version == SMC_V1 {
        if typev1 == SmcType::N {
            return Err(bad_types);
        }
        // Linux v1 senders put the SMC-D info before the prefix iff SMC-D is offered.
        let want = if typev1.smcd() {
            PROPOSAL_SMCD_LEN as u16
        } else {
            0
        };
        if iparea_offset != want {
            return Err(ClcError::BadOffset {
                field: "iparea_offset",
                value: iparea_offset,
            });
        }
        if typev1.smcd() {
            p.ism_gid = r.u64(40)?;
            p.ism_chid = r.u16(48)?;
        }
        let off = PROPOSAL_BASE_LEN + iparea_offset as usize;
        let (prefix, plen) = decode_prefix(r, off)?;
        p.ip_prefix = Some(prefix);
        expected_len = off + plen + TRAILER_LEN;
    } else {
        if typev1 == SmcType::N && typev2 == SmcType::N {
            return Err(bad_types);
        }
        p.ism_gid = r.u64(40)?;
        p.ism_chid = r.u16(48)?;
        let v2_ext_offset = r.u16(50)?;
        let mut off = PROPOSAL_BASE_LEN + PROPOSAL_SMCD_LEN;
        if typev1 != SmcType::N {
            if iparea_offset as usize != PROPOSAL_SMCD_LEN {
                return Err(ClcError::BadOffset {
                    field: "iparea_offset",
                    value: iparea_offset,
                });
            }
            let (prefix, plen) = decode_prefix(r, off)?;
            p.ip_prefix = Some(prefix);
            off += plen;
        } else if iparea_offset != 0 && iparea_offset as usize != PROPOSAL_SMCD_LEN {
            return Err(ClcError::BadOffset {
                field: "iparea_offset",
                value: iparea_offset,
            });
        }
        if typev2 == SmcType::N {
            if v2_ext_offset != 0 {
                return Err(ClcError::BadOffset {
                    field: "v2_ext_offset",
                    value: v2_ext_offset,
                });
            }
        } else {
            // Counted from the end of the v2_ext_offset field (byte 52).
            if 52 + v2_ext_offset as usize != off {
                return Err(ClcError::BadOffset {
                    field: "v2_ext_offset",
                    value: v2_ext_offset,
                });
            }
            let eid_cnt = r.u8(off)? as usize;
            let gid_cnt = r.u8(off + 1)? as usize;
            let flag = r.u8(off + 3)?;
            let smcd_v2_ext_offset = r.u16(off + 6)?;
            if eid_cnt > MAX_UEIDS {
                return Err(ClcError::TooMany {
                    field: "eid_cnt",
                    count: eid_cnt,
                });
            }
            if gid_cnt > MAX_GID_ENTRIES {
                return Err(ClcError::TooMany {
                    field: "ism_gid_cnt",
                    count: gid_cnt,
                });
            }
            let mut v2 = ProposalV2Ext {
                release: flag >> 4,
                seid: flag & 1 != 0,
                roce_gid: r.arr(off + 8)?,
                max_conns: r.u8(off + 24)?,
                max_links: r.u8(off + 25)?,
                feature_mask: r.u16(off + 26)?,
                ueids: Vec::with_capacity(eid_cnt),
                smcd: None,
            };
            for i in 0..eid_cnt {
                v2.ueids.push(r.arr(off + V2_EXT_LEN + i * EID_LEN)?);
            }
            let ext_start = off;
            off += V2_EXT_LEN + eid_cnt * EID_LEN;
            if typev2.smcd() {
                // Counted from the end of the smcd_v2_ext_offset field (v2 ext + 8).
                if ext_start + 8 + smcd_v2_ext_offset as usize != off {
                    return Err(ClcError::BadOffset {
                        field: "smcd_v2_ext_offset",
                        value: smcd_v2_ext_offset,
                    });
                }
                let mut smcd = SmcdV2Ext {
                    system_eid: r.arr(off)?,
                    gidchids: Vec::with_capacity(gid_cnt),
                };
                for i in 0..gid_cnt {
                    let o = off + SMCD_V2_EXT_LEN + i * GIDCHID_LEN;
                    smcd.gidchids.push(GidChid {
                        gid: r.u64(o)?,
                        chid: r.u16(o + 8)?,
                    });
                }
                off += SMCD_V2_EXT_LEN + gid_cnt * GIDCHID_LEN;
                v2.smcd = Some(smcd);
            } else {
                if smcd_v2_ext_offset != 0 {
                    return Err(ClcError::BadOffset {
                        field: "smcd_v2_ext_offset",
                        value: smcd_v2_ext_offset,
                    });
                }
                if gid_cnt != 0 {
                    return Err(ClcError::TooMany {
                        field: "ism_gid_cnt",
                        count: gid_cnt,
                    });
                }
            }
            p.v2 = Some(v2);
        }
        expected_len = off + TRAILER_LEN;
    }
    if expected_len != h.length as usize {
        return Err(bad_len(h));
    }
    Ok(p)
}

fn decode_accept_confirm(h: &Header, r: &Reader<'_>) -> Result<AcceptConfirm, ClcError> {
    match SmcType::from_bits(h.typev1) {
        SmcType::D => {}
        SmcType::R => return Err(ClcError::UnsupportedMode),
        _ => {
            return Err(ClcError::BadSmcType {
                typev1: h.typev1,
                typev2: h.typev2,
            })
        }
    }
    let first_contact = h.typev2 & FIRST_CONTACT_MASK != 0;
    let dmbe_size = r.u8(25)? >> 4;
    if dmbe_size > crate::cdc::DMB_MAX_SIZE_CODE_LARGE {
        return Err(ClcError::BadDmbSize(dmbe_size));
    }
    let mut m = AcceptConfirm {
        version: h.version,
        first_contact,
        gid: r.u64(8)?,
        token: r.u64(16)?,
        dmbe_idx: r.u8(24)?,
        dmbe_size,
        link_id: r.u32(28)?,
        v2: None,
    };
    let len = h.length as usize;
    if h.version == SMC_V1 {
        if len != SMCD_ACCEPT_CONFIRM_V1_LEN {
            return Err(bad_len(h));
        }
        return Ok(m);
    }
    let fce_len = len
        .checked_sub(SMCD_ACCEPT_CONFIRM_V2_LEN)
        .ok_or_else(|| bad_len(h))?;
    let fce = if first_contact {
        let base = SMCD_ACCEPT_CONFIRM_V2_LEN - TRAILER_LEN;
        let b0 = r.u8(base)?;
        let b1 = r.u8(base + 1)?;
        let mut fce = FirstContactExt {
            v2_direct: b0 & 0x80 != 0,
            os_type: b1 >> 4,
            release: b1 & 0x0F,
            hostname: r.arr(base + 4)?,
            max_conns: 0,
            max_links: 0,
            feature_mask: 0,
            vendor_exp_options: 0,
        };
        if fce_len != fce.len() {
            return Err(ClcError::BadFirstContactExt);
        }
        if fce_len == FCE_V2X_LEN {
            fce.max_conns = r.u8(base + 36)?;
            fce.max_links = r.u8(base + 37)?;
            fce.feature_mask = r.u16(base + 38)?;
            fce.vendor_exp_options = r.u32(base + 40)?;
        }
        Some(fce)
    } else {
        if fce_len != 0 {
            return Err(bad_len(h));
        }
        None
    };
    m.v2 = Some(AcceptConfirmV2 {
        chid: r.u16(32)?,
        eid: r.arr(34)?,
        gid_ext: r.u64(66)?,
        fce,
    });
    Ok(m)
}

fn decode_decline(h: &Header, r: &Reader<'_>) -> Result<Decline, ClcError> {
    let typev1 = SmcType::from_bits(h.typev1);
    if !matches!(typev1, SmcType::R | SmcType::D) {
        return Err(ClcError::BadSmcType {
            typev1: h.typev1,
            typev2: h.typev2,
        });
    }
    let mut d = Decline {
        version: h.version,
        typev1,
        out_of_sync: h.typev2 & FIRST_CONTACT_MASK != 0,
        peer_id: r.arr(8)?,
        diagnosis: r.u32(16)?,
        os_type: r.u8(20)? >> 4,
        diag_v2: [0; 4],
    };
    if h.version != SMC_V1 {
        for (i, slot) in d.diag_v2.iter_mut().enumerate() {
            *slot = r.u32(24 + 4 * i)?;
        }
    }
    Ok(d)
}

// ----------------------------------------------------------------------------------------------
// Encoding.

fn finish(mut out: Vec<u8>, hdr: Header, trailer: [u8; 4]) -> Result<Vec<u8>, ClcError> {
    out.extend_from_slice(&trailer);
    let len = u16::try_from(out.len()).map_err(|_| ClcError::Inconsistent("message too long"))?;
    let mut hdr = hdr;
    hdr.length = len;
    out[..HEADER_LEN].copy_from_slice(&hdr.to_bytes());
    Ok(out)
}

fn check_nibble(v: u8, what: &'static str) -> Result<(), ClcError> {
    if v > 0x0F {
        Err(ClcError::Inconsistent(what))
    } else {
        Ok(())
    }
}

fn check_version(v: u8) -> Result<(), ClcError> {
    if v == 0 || v > 0x0F {
        Err(ClcError::Inconsistent("version must be 1..=15"))
    } else {
        Ok(())
    }
}

impl Proposal {
    /// Encode like `smc_clc_send_proposal` (v2) or the v1 layout. Fails if optional parts do
    /// not match `typev1`/`typev2`/`version` or a count exceeds its limit.
    pub fn encode(&self) -> Result<Vec<u8>, ClcError> {
        check_version(self.version)?;
        let v1 = self.version == SMC_V1;
        if self.ip_prefix.is_some() != (self.typev1 != SmcType::N) {
            return Err(ClcError::Inconsistent("ip_prefix present iff typev1 != N"));
        }
        if v1 && self.typev1 == SmcType::N {
            return Err(ClcError::Inconsistent("v1 proposal needs typev1 != N"));
        }
        if !v1 && self.typev1 == SmcType::N && self.typev2 == SmcType::N {
            return Err(ClcError::Inconsistent("proposal offers nothing"));
        }
        let want_v2 = !v1 && self.typev2 != SmcType::N;
        if self.v2.is_some() != want_v2 {
            return Err(ClcError::Inconsistent(
                "v2 ext present iff version>=2 and typev2 != N",
            ));
        }
        let mut out = vec![0u8; HEADER_LEN];
        out.extend_from_slice(&self.peer_id);
        out.extend_from_slice(&self.ib_gid);
        out.extend_from_slice(&self.ib_mac);
        let smcd_area = !v1 || self.typev1.smcd();
        let iparea_offset: u16 = if smcd_area && self.typev1 != SmcType::N {
            PROPOSAL_SMCD_LEN as u16
        } else {
            0
        };
        out.extend_from_slice(&iparea_offset.to_be_bytes());
        let mut prefix_bytes = Vec::new();
        if let Some(pfx) = &self.ip_prefix {
            if pfx.ipv6_prefixes.len() > MAX_V6_PREFIXES {
                return Err(ClcError::TooMany {
                    field: "ipv6_prefixes_cnt",
                    count: pfx.ipv6_prefixes.len(),
                });
            }
            prefix_bytes.extend_from_slice(&pfx.outgoing_subnet);
            prefix_bytes.push(pfx.prefix_len);
            prefix_bytes.extend_from_slice(&[0, 0]);
            prefix_bytes.push(pfx.ipv6_prefixes.len() as u8);
            for p6 in &pfx.ipv6_prefixes {
                prefix_bytes.extend_from_slice(&p6.prefix);
                prefix_bytes.push(p6.prefix_len);
            }
        }
        if smcd_area {
            out.extend_from_slice(&self.ism_gid.to_be_bytes());
            out.extend_from_slice(&self.ism_chid.to_be_bytes());
            let v2_ext_offset: u16 = if want_v2 {
                (PROPOSAL_SMCD_LEN - 12 + prefix_bytes.len()) as u16
            } else {
                0
            };
            out.extend_from_slice(&v2_ext_offset.to_be_bytes());
            out.extend_from_slice(&[0u8; 28]);
        }
        out.extend_from_slice(&prefix_bytes);
        if let Some(v2) = &self.v2 {
            check_nibble(v2.release, "release must fit 4 bits")?;
            if v2.ueids.len() > MAX_UEIDS {
                return Err(ClcError::TooMany {
                    field: "eid_cnt",
                    count: v2.ueids.len(),
                });
            }
            if v2.smcd.is_some() != self.typev2.smcd() {
                return Err(ClcError::Inconsistent(
                    "SMC-Dv2 ext present iff typev2 has D",
                ));
            }
            let gid_cnt = v2.smcd.as_ref().map_or(0, |s| s.gidchids.len());
            if gid_cnt > MAX_GID_ENTRIES {
                return Err(ClcError::TooMany {
                    field: "ism_gid_cnt",
                    count: gid_cnt,
                });
            }
            out.push(v2.ueids.len() as u8);
            out.push(gid_cnt as u8);
            out.push(0);
            out.push((v2.release << 4) | u8::from(v2.seid));
            out.extend_from_slice(&[0, 0]);
            let smcd_off: u16 = if v2.smcd.is_some() {
                (V2_EXT_LEN - 8 + v2.ueids.len() * EID_LEN) as u16
            } else {
                0
            };
            out.extend_from_slice(&smcd_off.to_be_bytes());
            out.extend_from_slice(&v2.roce_gid);
            out.push(v2.max_conns);
            out.push(v2.max_links);
            out.extend_from_slice(&v2.feature_mask.to_be_bytes());
            out.extend_from_slice(&[0u8; 12]);
            for e in &v2.ueids {
                out.extend_from_slice(e);
            }
            if let Some(s) = &v2.smcd {
                out.extend_from_slice(&s.system_eid);
                out.extend_from_slice(&[0u8; 16]);
                for gc in &s.gidchids {
                    out.extend_from_slice(&gc.gid.to_be_bytes());
                    out.extend_from_slice(&gc.chid.to_be_bytes());
                }
            }
        }
        let hdr = Header {
            smcd_eyecatcher: false,
            msg_type: MsgType::Proposal,
            length: 0,
            version: self.version,
            // v1 senders put 0 (old `flag`/reserved bits) here; keep whatever the struct says
            // so that decode/encode round-trips.
            typev2: self.typev2 as u8,
            typev1: self.typev1 as u8,
        };
        finish(out, hdr, EYECATCHER_SMCR)
    }
}

impl AcceptConfirm {
    /// Encode as an accept or confirm (`smcd_clc_prep_confirm_accept`), with the `"SMCD"`
    /// eyecatcher. `v2` must be present iff `version >= 2`; its `fce` iff `first_contact`
    /// (v2 only).
    pub fn encode(&self, kind: MsgType) -> Result<Vec<u8>, ClcError> {
        if !matches!(kind, MsgType::Accept | MsgType::Confirm) {
            return Err(ClcError::Inconsistent("kind must be Accept or Confirm"));
        }
        check_version(self.version)?;
        if self.dmbe_size > crate::cdc::DMB_MAX_SIZE_CODE_LARGE {
            return Err(ClcError::BadDmbSize(self.dmbe_size));
        }
        let v1 = self.version == SMC_V1;
        if self.v2.is_some() == v1 {
            return Err(ClcError::Inconsistent("v2 part present iff version >= 2"));
        }
        let mut out = vec![0u8; HEADER_LEN];
        out.extend_from_slice(&self.gid.to_be_bytes());
        out.extend_from_slice(&self.token.to_be_bytes());
        out.push(self.dmbe_idx);
        out.push(self.dmbe_size << 4);
        out.extend_from_slice(&[0, 0]);
        out.extend_from_slice(&self.link_id.to_be_bytes());
        match &self.v2 {
            None => out.extend_from_slice(&[0u8; 12]),
            Some(v2) => {
                if v2.fce.is_some() != self.first_contact {
                    return Err(ClcError::Inconsistent("fce present iff first_contact"));
                }
                out.extend_from_slice(&v2.chid.to_be_bytes());
                out.extend_from_slice(&v2.eid);
                out.extend_from_slice(&v2.gid_ext.to_be_bytes());
                if let Some(f) = &v2.fce {
                    check_nibble(f.os_type, "os_type must fit 4 bits")?;
                    check_nibble(f.release, "release must fit 4 bits")?;
                    out.push(if f.v2_direct { 0x80 } else { 0 });
                    out.push((f.os_type << 4) | f.release);
                    out.extend_from_slice(&[0, 0]);
                    out.extend_from_slice(&f.hostname);
                    if f.len() == FCE_V2X_LEN {
                        out.push(f.max_conns);
                        out.push(f.max_links);
                        out.extend_from_slice(&f.feature_mask.to_be_bytes());
                        out.extend_from_slice(&f.vendor_exp_options.to_be_bytes());
                        out.extend_from_slice(&[0u8; 8]);
                    }
                }
            }
        }
        let hdr = Header {
            smcd_eyecatcher: true,
            msg_type: kind,
            length: 0,
            version: self.version,
            typev2: if self.first_contact {
                FIRST_CONTACT_MASK
            } else {
                0
            },
            typev1: SmcType::D as u8,
        };
        finish(out, hdr, EYECATCHER_SMCD)
    }
}

impl Decline {
    /// Encode like `smc_clc_send_decline` (`"SMCR"` eyecatcher, 28 or 44 bytes). Values
    /// that do not fit their bit fields are truncated to them.
    pub fn encode(&self) -> Vec<u8> {
        let version = self.version.clamp(1, 0x0F);
        let mut out = vec![0u8; HEADER_LEN];
        out.extend_from_slice(&self.peer_id);
        out.extend_from_slice(&self.diagnosis.to_be_bytes());
        out.push((self.os_type & 0x0F) << 4);
        out.extend_from_slice(&[0, 0, 0]);
        if version != SMC_V1 {
            for d in self.diag_v2 {
                out.extend_from_slice(&d.to_be_bytes());
            }
        }
        let typev1 = match self.typev1 {
            SmcType::D => SmcType::D,
            _ => SmcType::R,
        };
        let hdr = Header {
            smcd_eyecatcher: false,
            msg_type: MsgType::Decline,
            length: 0,
            version,
            typev2: if self.out_of_sync {
                FIRST_CONTACT_MASK
            } else {
                0
            },
            typev1: typev1 as u8,
        };
        // Cannot fail: at most 44 bytes.
        finish(out, hdr, EYECATCHER_SMCR).unwrap_or_default()
    }
}

/// A blank-padded 32-byte field (EID or host name) from text; longer text is cut.
pub fn padded32(s: &[u8]) -> [u8; 32] {
    let mut out = [b' '; 32];
    let n = s.len().min(32);
    out[..n].copy_from_slice(&s[..n]);
    out
}

#[cfg(test)]
mod tests;
