//! The sizes and eyecatchers of CLC messages (Linux `net/smc/smc_clc.h`), without `std`: the
//! framing constants that the eBPF programs also need (the quarantine verdict strips a client's
//! Proposal and Decline off the stream of a server that does not run the data path, see
//! [`crate::bpf::MAP_QUARANTINE`]). [`crate::clc`] re-exports them with its codecs.

/// `"SMCR"` in EBCDIC: proposals, declines and SMC-R accept/confirm.
pub const EYECATCHER_SMCR: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xD9];
/// `"SMCD"` in EBCDIC: SMC-D accept/confirm.
pub const EYECATCHER_SMCD: [u8; 4] = [0xE2, 0xD4, 0xC3, 0xC4];

/// `SMC_CLC_PROPOSAL`: the type byte of a Proposal (`clc::MsgType::Proposal`).
pub const MSG_PROPOSAL: u8 = 1;
/// `SMC_CLC_DECLINE`: the type byte of a Decline (`clc::MsgType::Decline`).
pub const MSG_DECLINE: u8 = 4;

/// `sizeof(struct smc_clc_msg_hdr)`.
pub const HEADER_LEN: usize = 8;
/// `sizeof(struct smc_clc_msg_trail)`.
pub const TRAILER_LEN: usize = 4;
/// `SMC_MAX_EID_LEN`.
pub const EID_LEN: usize = 32;
/// `SMC_MAX_HOSTNAME_LEN`.
pub const HOSTNAME_LEN: usize = 32;

/// `sizeof(struct smc_clc_msg_proposal)`: header, local info, iparea_offset.
pub const PROPOSAL_BASE_LEN: usize = 40;
/// `sizeof(struct smc_clc_msg_smcd)`.
pub const PROPOSAL_SMCD_LEN: usize = 40;
/// `sizeof(struct smc_clc_msg_proposal_prefix)`.
pub const PROPOSAL_PREFIX_LEN: usize = 8;
/// `sizeof(struct smc_clc_ipv6_prefix)`.
pub const IPV6_PREFIX_LEN: usize = 17;
/// `sizeof(struct smc_clc_v2_extension_fixed)`.
pub const V2_EXT_LEN: usize = 40;
/// `sizeof(struct smc_clc_smcd_v2_extension_fixed)`.
pub const SMCD_V2_EXT_LEN: usize = 48;
/// `sizeof(struct smc_clc_smcd_gid_chid)`.
pub const GIDCHID_LEN: usize = 10;
/// `SMC_CLC_MAX_V6_PREFIX`.
pub const MAX_V6_PREFIXES: usize = 8;
/// `SMC_CLC_MAX_UEID`.
pub const MAX_UEIDS: usize = 8;
/// `SMCD_CLC_MAX_V2_GID_ENTRIES`.
pub const MAX_GID_ENTRIES: usize = 8;
/// Largest valid proposal (`sizeof(struct smc_clc_msg_proposal_area)`): 652 bytes.
pub const PROPOSAL_MAX_LEN: usize = PROPOSAL_BASE_LEN
    + PROPOSAL_SMCD_LEN
    + PROPOSAL_PREFIX_LEN
    + MAX_V6_PREFIXES * IPV6_PREFIX_LEN
    + V2_EXT_LEN
    + MAX_UEIDS * EID_LEN
    + SMCD_V2_EXT_LEN
    + MAX_GID_ENTRIES * GIDCHID_LEN
    + TRAILER_LEN;
/// Smallest proposal: a v1 SMC-R proposal without SMC-D info and without IPv6 prefixes.
pub const PROPOSAL_MIN_LEN: usize = PROPOSAL_BASE_LEN + PROPOSAL_PREFIX_LEN + TRAILER_LEN;

/// `SMCD_CLC_ACCEPT_CONFIRM_LEN`.
pub const SMCD_ACCEPT_CONFIRM_V1_LEN: usize = 48;
/// `SMCD_CLC_ACCEPT_CONFIRM_LEN_V2` (without first-contact extension).
pub const SMCD_ACCEPT_CONFIRM_V2_LEN: usize = 78;
/// `SMCR_CLC_ACCEPT_CONFIRM_LEN`.
pub const SMCR_ACCEPT_CONFIRM_V1_LEN: usize = 68;
/// `SMCR_CLC_ACCEPT_CONFIRM_LEN_V2`.
pub const SMCR_ACCEPT_CONFIRM_V2_LEN: usize = 108;
/// Largest SMC-R v2 accept/confirm (first contact, v2.1, 8-entry GID list); framing only.
pub const SMCR_ACCEPT_CONFIRM_MAX_LEN: usize =
    SMCR_ACCEPT_CONFIRM_V2_LEN + FCE_V2X_LEN + 4 + 8 * 16;
/// `sizeof(struct smc_clc_first_contact_ext)`.
pub const FCE_LEN: usize = 36;
/// `sizeof(struct smc_clc_first_contact_ext_v2x)`.
pub const FCE_V2X_LEN: usize = 52;
/// `sizeof(struct smc_clc_msg_decline)`.
pub const DECLINE_V1_LEN: usize = 28;
/// `sizeof(struct smc_clc_msg_decline_v2)`.
pub const DECLINE_V2_LEN: usize = 44;
