//! CLC decline diagnosis codes (`SMC_CLC_DECL_*` in Linux `net/smc/smc_clc.h`).
//!
//! A decline carries a 32-bit diagnosis code in network byte order. [`Diag`] names the codes
//! Linux defines; codes it does not know are kept as plain `u32` by the CLC decoder, and
//! [`Diag::from_code`] returns `None` for them.
//!
//! `no_std`, no allocation.

use core::fmt;

macro_rules! diag_codes {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $name:literal; )*) => {
        /// A decline diagnosis code known to Linux.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum Diag {
            $( $(#[$doc])* $variant = $code, )*
        }

        impl Diag {
            /// Every known code, in numeric order.
            pub const ALL: &'static [Diag] = &[ $( Diag::$variant, )* ];

            /// The 32-bit code as sent on the wire.
            pub const fn code(self) -> u32 {
                self as u32
            }

            /// The known code for `code`, if any.
            pub const fn from_code(code: u32) -> Option<Diag> {
                match code {
                    $( $code => Some(Diag::$variant), )*
                    _ => None,
                }
            }

            /// The Linux name without the `SMC_CLC_DECL_` prefix, e.g. `"PEERNOSMC"`.
            pub const fn name(self) -> &'static str {
                match self {
                    $( Diag::$variant => $name, )*
                }
            }
        }
    };
}

diag_codes! {
    /// Insufficient memory resources.
    Mem = 0x0101_0000, "MEM";
    /// Timeout waiting for QP confirm link (also used here for CLC timeouts).
    TimeoutCl = 0x0201_0000, "TIMEOUT_CL";
    /// Timeout waiting for QP add link.
    TimeoutAl = 0x0202_0000, "TIMEOUT_AL";
    /// Configuration error.
    CnfErr = 0x0300_0000, "CNFERR";
    /// Peer did not indicate SMC.
    PeerNoSmc = 0x0301_0000, "PEERNOSMC";
    /// IPsec usage.
    Ipsec = 0x0302_0000, "IPSEC";
    /// No SMC device found (R or D).
    NoSmcDev = 0x0303_0000, "NOSMCDEV";
    /// No SMC-D device found.
    NoSmcdDev = 0x0303_0001, "NOSMCDDEV";
    /// No SMC-R device found.
    NoSmcrDev = 0x0303_0002, "NOSMCRDEV";
    /// Hardware has no ISMv2 support.
    NoIsm2Supp = 0x0303_0003, "NOISM2SUPP";
    /// Peer sent no CLC v2 extension.
    NoV2Ext = 0x0303_0004, "NOV2EXT";
    /// Peer sent no SMC-Dv2 extension.
    NoV2DExt = 0x0303_0005, "NOV2DEXT";
    /// Peer sent no SEID.
    NoSeid = 0x0303_0006, "NOSEID";
    /// No SMC-Dv2 device found.
    NoSmcd2Dev = 0x0303_0007, "NOSMCD2DEV";
    /// Peer sent no UEID.
    NoUeid = 0x0303_0008, "NOUEID";
    /// Release version negotiation failed.
    ReleaseErr = 0x0303_0009, "RELEASEERR";
    /// Max connections negotiation failed.
    MaxConnErr = 0x0303_000a, "MAXCONNERR";
    /// Max links negotiation failed.
    MaxLinkErr = 0x0303_000b, "MAXLINKERR";
    /// SMC modes do not match (R or D).
    ModeUnsupp = 0x0304_0000, "MODEUNSUPP";
    /// Peer has eyecatcher in RMBE.
    RmbeEc = 0x0305_0000, "RMBE_EC";
    /// Fastopen sockopt not supported.
    OptUnsupp = 0x0306_0000, "OPTUNSUPP";
    /// IP prefix / subnet mismatch.
    DiffPrefix = 0x0307_0000, "DIFFPREFIX";
    /// Error getting the VLAN id of the IP device.
    GetVlanErr = 0x0308_0000, "GETVLANERR";
    /// Error registering the VLAN id on the ISM device.
    IsmVlanErr = 0x0309_0000, "ISMVLANERR";
    /// No active SMC-R link in link group.
    NoActLink = 0x030a_0000, "NOACTLINK";
    /// SMC-R link from server not found.
    NoSrvLink = 0x030b_0000, "NOSRVLINK";
    /// SMC version mismatch.
    VersMismat = 0x030c_0000, "VERSMISMAT";
    /// SMC-D DMB limit exceeded.
    MaxDmb = 0x030d_0000, "MAX_DMB";
    /// SMC-Rv2 connection: no route to peer.
    NoRoute = 0x030e_0000, "NOROUTE";
    /// SMC-Rv2 connection: indirect mismatch.
    NoIndirect = 0x030f_0000, "NOINDIRECT";
    /// Synchronization error (sent with the first-contact bit set).
    SyncErr = 0x0400_0000, "SYNCERR";
    /// Peer declined during handshake.
    PeerDecl = 0x0500_0000, "PEERDECL";
    /// Internal error.
    IntErr = 0x0999_0000, "INTERR";
    /// rtoken handling failed.
    ErrRtok = 0x0999_0001, "ERR_RTOK";
    /// IB ready link failed.
    ErrRdyLnk = 0x0999_0002, "ERR_RDYLNK";
    /// Registering RDMA buffers failed.
    ErrRegBuf = 0x0999_0003, "ERR_REGBUF";
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#010x})", self.name(), self.code())
    }
}

/// The name of a raw code, or `"UNKNOWN"`.
pub const fn name_of(code: u32) -> &'static str {
    match Diag::from_code(code) {
        Some(d) => d.name(),
        None => "UNKNOWN",
    }
}

/// Fallback reason of the data path's short-connection policy (a client connection kept on
/// TCP because its recent connections were too short to gain from SMC-D). Not a Linux
/// diagnosis code: private codes live in `0x7Fxx_xxxx`.
pub const POLICY_SHORT: u32 = 0x7F00_0001;

/// The name of a fallback reason code: the Linux decline name (`PEERNOSMC`), a private
/// code's name (`POLICY_SHORT`), or `UNKNOWN`.
pub const fn reason_name(code: u32) -> &'static str {
    match code {
        POLICY_SHORT => "POLICY_SHORT",
        c => name_of(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_numbers() {
        assert_eq!(Diag::PeerNoSmc.code(), 0x0301_0000);
        assert_eq!(Diag::PeerNoSmc.name(), "PEERNOSMC");
        assert_eq!(Diag::MaxDmb.code(), 0x030d_0000);
        assert_eq!(Diag::NoSmcdDev.code(), 0x0303_0001);
        assert_eq!(Diag::SyncErr.code(), 0x0400_0000);
        assert_eq!(Diag::IntErr.code(), 0x0999_0000);
        assert_eq!(Diag::from_code(0x030c_0000), Some(Diag::VersMismat));
        assert_eq!(Diag::from_code(0x1234_5678), None);
        assert_eq!(name_of(0x0101_0000), "MEM");
        assert_eq!(name_of(7), "UNKNOWN");
    }

    #[test]
    fn roundtrip_all() {
        for (i, d) in Diag::ALL.iter().enumerate() {
            assert_eq!(Diag::from_code(d.code()), Some(*d));
            if i > 0 {
                assert!(Diag::ALL[i - 1].code() < d.code());
            }
        }
        assert_eq!(Diag::ALL.len(), 36);
    }

    #[test]
    fn reason_names() {
        assert_eq!(reason_name(0x0301_0000), "PEERNOSMC");
        assert_eq!(reason_name(POLICY_SHORT), "POLICY_SHORT");
        assert_eq!(reason_name(0x7F00_0099), "UNKNOWN");
    }
}
