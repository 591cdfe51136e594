//! Byte-vector tests written from the Linux struct layouts.

use super::*;

fn ueid() -> Eid {
    padded32(b"SMC-LOOPBACK-TEST")
}

/// A proposal as Linux sends it from a host whose only device is loopback-ism: SMC-Dv2 only
/// (typev1 N, typev2 D), one UEID, the 128-bit GID in two entries with CHID 0xFFFF.
fn loopback_proposal() -> Proposal {
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
            release: SMC_RELEASE_1,
            seid: false,
            roce_gid: [0; 16],
            max_conns: 0,
            max_links: 0,
            feature_mask: FEATURE_EMULATED_ISM,
            ueids: vec![ueid()],
            smcd: Some(SmcdV2Ext {
                system_eid: [0; 32],
                gidchids: vec![
                    GidChid {
                        gid: 0x1111_2222_3333_4444,
                        chid: LOOPBACK_CHID,
                    },
                    GidChid {
                        gid: 0x5555_6666_7777_8888,
                        chid: LOOPBACK_CHID,
                    },
                ],
            }),
        }),
    }
}

#[test]
fn proposal_v2_loopback_bytes() {
    let p = loopback_proposal();
    let b = p.encode().unwrap();
    // 40 base + 40 smcd info + 40 v2 ext + 32 UEID + 48 smcd v2 ext + 2*10 entries + 4 trailer
    assert_eq!(b.len(), 224);
    assert_eq!(&b[0..4], &EYECATCHER_SMCR);
    assert_eq!(b[4], 1);
    assert_eq!(u16::from_be_bytes([b[5], b[6]]), 224);
    assert_eq!(b[7], 0x26, "version 2, typev2 D, typev1 N");
    assert_eq!(&b[8..38], &[0u8; 30], "lcl is SMC-R only");
    assert_eq!(&b[38..40], &[0, 0], "iparea_offset 0 without v1");
    assert_eq!(&b[40..50], &[0u8; 10], "no native ISM device");
    assert_eq!(u16::from_be_bytes([b[50], b[51]]), 28, "v2_ext_offset");
    assert_eq!(&b[52..80], &[0u8; 28]);
    // v2 extension at 80
    assert_eq!(b[80], 1, "eid_cnt");
    assert_eq!(b[81], 2, "ism_gid_cnt");
    assert_eq!(b[83], 0x10, "release 1, seid off");
    assert_eq!(u16::from_be_bytes([b[86], b[87]]), 64, "smcd_v2_ext_offset");
    assert_eq!(&b[88..104], &[0u8; 16], "roce gid");
    assert_eq!(u16::from_be_bytes([b[106], b[107]]), 1, "feature mask");
    assert_eq!(&b[120..152], &ueid());
    // SMC-Dv2 extension at 152
    assert_eq!(&b[152..200], &[0u8; 48]);
    assert_eq!(&b[200..208], &0x1111_2222_3333_4444u64.to_be_bytes());
    assert_eq!(&b[208..210], &[0xFF, 0xFF]);
    assert_eq!(&b[210..218], &0x5555_6666_7777_8888u64.to_be_bytes());
    assert_eq!(&b[218..220], &[0xFF, 0xFF]);
    assert_eq!(&b[220..224], &EYECATCHER_SMCR);
    let hdr: [u8; 8] = b[..8].try_into().unwrap();
    assert_eq!(message_len(&hdr), Ok(224));
    assert_eq!(decode(&b), Ok(ClcMessage::Proposal(p.clone())));
    let devs = p.v2.unwrap().smcd.unwrap().devices();
    assert_eq!(
        devs,
        vec![OfferedDevice {
            chid: 0xFFFF,
            gid: Gid {
                gid: 0x1111_2222_3333_4444,
                gid_ext: 0x5555_6666_7777_8888
            }
        }]
    );
}

#[test]
fn proposal_v1_smcd_ipv4() {
    // A v1 SMC-D proposal: smcd info, IPv4 prefix 10.0.0.0/8.
    let p = Proposal {
        version: SMC_V1,
        typev1: SmcType::D,
        typev2: SmcType::R,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: 0xAABB,
        ism_chid: 0x0123,
        ip_prefix: Some(IpPrefix {
            outgoing_subnet: [10, 0, 0, 0],
            prefix_len: 8,
            ipv6_prefixes: vec![],
        }),
        v2: None,
    };
    let b = p.encode().unwrap();
    assert_eq!(b.len(), 40 + 40 + 8 + 4);
    assert_eq!(b[7], 0x11);
    assert_eq!(u16::from_be_bytes([b[38], b[39]]), 40);
    assert_eq!(&b[40..48], &0xAABBu64.to_be_bytes());
    assert_eq!(&b[48..50], &[0x01, 0x23]);
    assert_eq!(&b[80..88], &[10, 0, 0, 0, 8, 0, 0, 0]);
    assert_eq!(decode(&b), Ok(ClcMessage::Proposal(p)));
}

#[test]
fn proposal_v2_with_v1_prefix_ipv6() {
    let mut p = loopback_proposal();
    p.typev1 = SmcType::D;
    p.ip_prefix = Some(IpPrefix {
        outgoing_subnet: [0; 4],
        prefix_len: 0,
        ipv6_prefixes: vec![
            Ipv6Prefix {
                prefix: [0xfd; 16],
                prefix_len: 64,
            },
            Ipv6Prefix {
                prefix: [0x20; 16],
                prefix_len: 48,
            },
        ],
    });
    let b = p.encode().unwrap();
    assert_eq!(b.len(), 224 + 8 + 34);
    assert_eq!(u16::from_be_bytes([b[38], b[39]]), 40);
    assert_eq!(u16::from_be_bytes([b[50], b[51]]), 28 + 8 + 34);
    assert_eq!(b[87], 2, "ipv6_prefixes_cnt");
    assert_eq!(b[88 + 16], 64);
    assert_eq!(decode(&b), Ok(ClcMessage::Proposal(p)));
}

fn accept_v2_fc() -> AcceptConfirm {
    AcceptConfirm {
        version: SMC_V2,
        first_contact: true,
        gid: 0x0102_0304_0506_0708,
        token: 0x1122_3344_5566_7788,
        dmbe_idx: 0,
        dmbe_size: 2,
        link_id: 0xCAFE_0001,
        v2: Some(AcceptConfirmV2 {
            chid: LOOPBACK_CHID,
            eid: ueid(),
            gid_ext: 0x090A_0B0C_0D0E_0F10,
            fce: Some(FirstContactExt {
                v2_direct: false,
                os_type: OS_LINUX,
                release: SMC_RELEASE_1,
                hostname: padded32(b"host"),
                max_conns: 0,
                max_links: 0,
                feature_mask: FEATURE_EMULATED_ISM,
                vendor_exp_options: 0,
            }),
        }),
    }
}

#[test]
fn accept_v2_first_contact_bytes() {
    let a = accept_v2_fc();
    let b = a.encode(MsgType::Accept).unwrap();
    assert_eq!(b.len(), 78 + 52);
    assert_eq!(&b[0..4], &EYECATCHER_SMCD);
    assert_eq!(b[4], 2);
    assert_eq!(u16::from_be_bytes([b[5], b[6]]), 130);
    assert_eq!(b[7], 0x29, "version 2, first contact, typev1 D");
    assert_eq!(&b[8..16], &0x0102_0304_0506_0708u64.to_be_bytes());
    assert_eq!(&b[16..24], &0x1122_3344_5566_7788u64.to_be_bytes());
    assert_eq!(b[24], 0, "dmbe_idx");
    assert_eq!(b[25], 0x20, "dmbe_size in the high nibble");
    assert_eq!(&b[26..28], &[0, 0]);
    assert_eq!(&b[28..32], &[0xCA, 0xFE, 0, 1]);
    assert_eq!(&b[32..34], &[0xFF, 0xFF], "chid");
    assert_eq!(&b[34..66], &ueid());
    assert_eq!(&b[66..74], &0x090A_0B0C_0D0E_0F10u64.to_be_bytes());
    // first contact extension at 74
    assert_eq!(b[74], 0);
    assert_eq!(b[75], 0x21, "os_type linux, release 1");
    assert_eq!(&b[78..82], b"host");
    assert_eq!(b[82], b' ');
    assert_eq!(&b[110..112], &[0, 0]);
    assert_eq!(&b[112..114], &[0, 1], "feature mask");
    assert_eq!(&b[114..126], &[0u8; 12]);
    assert_eq!(&b[126..130], &EYECATCHER_SMCD);
    assert_eq!(decode(&b), Ok(ClcMessage::Accept(a.clone())));
    let c = a.encode(MsgType::Confirm).unwrap();
    assert_eq!(c[4], 3);
    assert_eq!(decode(&c), Ok(ClcMessage::Confirm(a)));
}

#[test]
fn accept_v2_release0_and_no_fc() {
    let mut a = accept_v2_fc();
    a.v2.as_mut().unwrap().fce.as_mut().unwrap().release = 0;
    a.v2.as_mut().unwrap().fce.as_mut().unwrap().feature_mask = 0;
    let b = a.encode(MsgType::Accept).unwrap();
    assert_eq!(b.len(), 78 + 36);
    assert_eq!(decode(&b), Ok(ClcMessage::Accept(a.clone())));
    a.first_contact = false;
    a.v2.as_mut().unwrap().fce = None;
    let b = a.encode(MsgType::Confirm).unwrap();
    assert_eq!(b.len(), 78);
    assert_eq!(b[7], 0x21);
    assert_eq!(&b[74..78], &EYECATCHER_SMCD);
    assert_eq!(decode(&b), Ok(ClcMessage::Confirm(a)));
}

#[test]
fn accept_v1_bytes() {
    let a = AcceptConfirm {
        version: SMC_V1,
        first_contact: true,
        gid: 7,
        token: 9,
        dmbe_idx: 1,
        dmbe_size: 6,
        link_id: 3,
        v2: None,
    };
    let b = a.encode(MsgType::Accept).unwrap();
    assert_eq!(b.len(), 48);
    assert_eq!(b[7], 0x19);
    assert_eq!(b[25], 0x60);
    assert_eq!(&b[32..44], &[0u8; 12]);
    assert_eq!(&b[44..48], &EYECATCHER_SMCD);
    assert_eq!(decode(&b), Ok(ClcMessage::Accept(a)));
}

#[test]
fn decline_bytes() {
    let d = Decline::new(SMC_V1, Diag::PeerNoSmc.code(), [1, 2, 3, 4, 5, 6, 7, 8]);
    let b = d.encode();
    assert_eq!(
        b,
        vec![
            0xE2, 0xD4, 0xC3, 0xD9, 4, 0, 28, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 0x03, 0x01, 0, 0, 0, 0,
            0, 0, 0xE2, 0xD4, 0xC3, 0xD9
        ]
    );
    assert_eq!(decode(&b), Ok(ClcMessage::Decline(d)));

    let d2 = Decline::new(SMC_V2, Diag::SyncErr.code(), [0; 8]);
    let b = d2.encode();
    assert_eq!(b.len(), 44);
    assert_eq!(b[7], 0x28, "version 2, sync flag, typev1 R");
    assert_eq!(&b[16..20], &[4, 0, 0, 0]);
    assert_eq!(b[20], 0x20, "os_type linux");
    assert_eq!(&b[24..40], &[0u8; 16]);
    assert_eq!(&b[40..44], &EYECATCHER_SMCR);
    assert_eq!(decode(&b), Ok(ClcMessage::Decline(d2)));
}

#[test]
fn framing_rejects() {
    let good = Decline::new(SMC_V2, 0x0303_0000, [0; 8]).encode();
    let hdr: [u8; 8] = good[..8].try_into().unwrap();
    assert_eq!(message_len(&hdr), Ok(44));
    let mut h = hdr;
    h[0] = 0;
    assert_eq!(message_len(&h), Err(ClcError::BadEyecatcher));
    let mut h = hdr;
    h[4] = 9;
    assert_eq!(message_len(&h), Err(ClcError::UnknownType(9)));
    let mut h = hdr;
    h[7] = 0x00;
    assert_eq!(message_len(&h), Err(ClcError::BadVersion(0)));
    let mut h = hdr;
    h[6] = 45;
    assert!(matches!(message_len(&h), Err(ClcError::BadLength { .. })));
    // truncated / trailing / trailer
    assert!(matches!(
        decode(&good[..43]),
        Err(ClcError::Truncated { .. })
    ));
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(decode(&long), Err(ClcError::TrailingBytes { .. })));
    let mut bad = good.clone();
    bad[43] = 0;
    assert_eq!(decode(&bad), Err(ClcError::BadTrailer));
    assert!(matches!(decode(&[]), Err(ClcError::Truncated { .. })));
}

#[test]
fn proposal_rejects_inconsistent() {
    let b = loopback_proposal().encode().unwrap();
    // v2_ext_offset off by one
    let mut x = b.clone();
    x[51] = 29;
    assert!(matches!(
        decode(&x),
        Err(ClcError::BadOffset {
            field: "v2_ext_offset",
            ..
        })
    ));
    // smcd_v2_ext_offset wrong
    let mut x = b.clone();
    x[87] = 63;
    assert!(matches!(
        decode(&x),
        Err(ClcError::BadOffset {
            field: "smcd_v2_ext_offset",
            ..
        })
    ));
    // one more gid entry than the length allows
    let mut x = b.clone();
    x[81] = 3;
    assert!(decode(&x).is_err());
    // too many UEIDs
    let mut x = b.clone();
    x[80] = 9;
    assert!(matches!(
        decode(&x),
        Err(ClcError::TooMany {
            field: "eid_cnt",
            ..
        })
    ));
    // both types N
    let mut x = b.clone();
    x[7] = 0x2A;
    assert!(matches!(decode(&x), Err(ClcError::BadSmcType { .. })));
    // SMC-R accept is not supported
    let a = accept_v2_fc().encode(MsgType::Accept).unwrap();
    let mut r = a.clone();
    r[7] = 0x28; // typev1 R
    r[5..7].copy_from_slice(&(130u16).to_be_bytes());
    assert_eq!(decode(&r), Err(ClcError::UnsupportedMode));
    assert_eq!(ClcError::UnsupportedMode.diag(), Diag::ModeUnsupp);
    // bad dmbe size (codes above 6 frame as the large-DMB extension, which the handshake
    // accepts only when negotiated; above 10 never)
    let mut x = a.clone();
    x[25] = 0xB0;
    assert_eq!(decode(&x), Err(ClcError::BadDmbSize(11)));
    // fce length not matching its release
    let mut x = a;
    x[75] = 0x20;
    assert_eq!(decode(&x), Err(ClcError::BadFirstContactExt));
}

#[test]
fn encode_rejects_inconsistent() {
    let mut p = loopback_proposal();
    p.ip_prefix = Some(IpPrefix::default());
    assert!(matches!(p.encode(), Err(ClcError::Inconsistent(_))));
    let mut p = loopback_proposal();
    p.v2.as_mut().unwrap().ueids = vec![[0; 32]; 9];
    assert!(matches!(p.encode(), Err(ClcError::TooMany { .. })));
    let mut a = accept_v2_fc();
    a.first_contact = false;
    assert!(matches!(
        a.encode(MsgType::Accept),
        Err(ClcError::Inconsistent(_))
    ));
    assert!(accept_v2_fc().encode(MsgType::Proposal).is_err());
}

#[test]
fn emulated_pairing_like_linux() {
    let ext = SmcdV2Ext {
        system_eid: [0; 32],
        gidchids: vec![
            GidChid {
                gid: 1,
                chid: 0x0001,
            },
            GidChid {
                gid: 2,
                chid: 0xFFFF,
            },
            GidChid {
                gid: 3,
                chid: 0xFF01,
            }, // CHID differs: entry 2 skipped
            GidChid {
                gid: 4,
                chid: 0xFF01,
            },
            GidChid {
                gid: 5,
                chid: 0xFF01,
            },
            GidChid {
                gid: 6,
                chid: 0xFFFF,
            }, // last, unpaired: skipped
        ],
    };
    let d = ext.devices();
    assert_eq!(d.len(), 2);
    assert_eq!(d[0].gid, Gid { gid: 1, gid_ext: 0 });
    assert_eq!(d[1].chid, 0xFF01);
    assert_eq!(d[1].gid, Gid { gid: 3, gid_ext: 4 });
}

#[test]
fn v1_proposal_keeps_unused_typev2_bits() {
    // Found by reasoning about the fuzz invariant: a v1 header may carry any typev2 bits
    // (the old `flag`/reserved bits); re-encoding must preserve what decoding reported.
    let p = Proposal {
        version: SMC_V1,
        typev1: SmcType::D,
        typev2: SmcType::N,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: 1,
        ism_chid: 2,
        ip_prefix: Some(IpPrefix::default()),
        v2: None,
    };
    let b = p.encode().unwrap();
    assert_eq!(b[7], 0x19);
    let m = decode(&b).unwrap();
    assert_eq!(m, ClcMessage::Proposal(p));
    assert_eq!(decode(&m.encode().unwrap()), Ok(m));
}

#[test]
fn gid_text() {
    let g = Gid {
        gid: 0x0123_4567_89ab_cdef,
        gid_ext: 0xfedc_ba98_7654_3210,
    };
    let s = g.to_string();
    assert_eq!(s, "01234567-89ab-cdef-fedc-ba9876543210");
    assert_eq!(Gid::parse(&s), Some(g));
    assert_eq!(Gid::parse("0123456789abcdeffedcba9876543210\n"), Some(g));
    assert_eq!(Gid::parse("xyz"), None);
    assert_eq!(Gid::from_bytes(g.to_bytes()), g);
}
