//! Property tests: CLC round trips and robustness, handshake termination, ring arithmetic.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use smc_common::cdc::{self, Cursor, CursorWord, ProdFlags, Ring};
use smc_common::clc::*;
use smc_common::handshake::*;

// ------------------------------------------------------------------------------------------
// Generators.

fn eid() -> impl Strategy<Value = Eid> {
    prop::array::uniform32(any::<u8>())
}

fn gidchid() -> impl Strategy<Value = GidChid> {
    (any::<u64>(), any::<u16>()).prop_map(|(gid, chid)| GidChid { gid, chid })
}

fn ip_prefix() -> impl Strategy<Value = IpPrefix> {
    (
        any::<[u8; 4]>(),
        any::<u8>(),
        prop::collection::vec(
            (any::<[u8; 16]>(), any::<u8>())
                .prop_map(|(prefix, prefix_len)| Ipv6Prefix { prefix, prefix_len }),
            0..=MAX_V6_PREFIXES,
        ),
    )
        .prop_map(|(outgoing_subnet, prefix_len, ipv6_prefixes)| IpPrefix {
            outgoing_subnet,
            prefix_len,
            ipv6_prefixes,
        })
}

fn smc_type() -> impl Strategy<Value = SmcType> {
    prop_oneof![
        Just(SmcType::R),
        Just(SmcType::D),
        Just(SmcType::N),
        Just(SmcType::B)
    ]
}

prop_compose! {
    fn v2_ext(smcd: bool)(
        release in 0u8..16,
        seid in any::<bool>(),
        roce_gid in any::<[u8; 16]>(),
        max_conns in any::<u8>(),
        max_links in any::<u8>(),
        feature_mask in any::<u16>(),
        ueids in prop::collection::vec(eid(), 0..=MAX_UEIDS),
        system_eid in eid(),
        gidchids in prop::collection::vec(gidchid(), 0..=MAX_GID_ENTRIES),
    ) -> ProposalV2Ext {
        ProposalV2Ext {
            release, seid, roce_gid, max_conns, max_links, feature_mask, ueids,
            smcd: smcd.then_some(SmcdV2Ext { system_eid, gidchids }),
        }
    }
}

fn proposal() -> impl Strategy<Value = Proposal> {
    (1u8..=3, smc_type(), smc_type())
        .prop_filter("consistent types", |(v, t1, t2)| {
            if *v == 1 {
                *t1 != SmcType::N
            } else {
                !(*t1 == SmcType::N && *t2 == SmcType::N)
            }
        })
        .prop_flat_map(|(version, typev1, typev2)| {
            let v1 = version == 1;
            let has_v2 = !v1 && typev2 != SmcType::N;
            let smcd_area = !v1 || typev1.smcd();
            (
                any::<[u8; 8]>(),
                any::<[u8; 16]>(),
                any::<[u8; 6]>(),
                any::<u64>(),
                any::<u16>(),
                ip_prefix(),
                v2_ext(typev2.smcd()),
            )
                .prop_map(move |(peer_id, ib_gid, ib_mac, g, c, pfx, v2)| Proposal {
                    version,
                    typev1,
                    // v1 headers carry 0 in the typev2 bits
                    typev2: if v1 { SmcType::R } else { typev2 },
                    peer_id,
                    ib_gid,
                    ib_mac,
                    ism_gid: if smcd_area { g } else { 0 },
                    ism_chid: if smcd_area { c } else { 0 },
                    ip_prefix: (typev1 != SmcType::N).then_some(pfx),
                    v2: has_v2.then_some(v2),
                })
        })
}

fn fce() -> impl Strategy<Value = FirstContactExt> {
    (
        any::<bool>(),
        0u8..16,
        0u8..16,
        any::<[u8; 32]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        any::<u32>(),
    )
        .prop_map(|(v2_direct, os_type, release, hostname, mc, ml, fm, vo)| {
            let v2x = release != 0;
            FirstContactExt {
                v2_direct,
                os_type,
                release,
                hostname,
                max_conns: if v2x { mc } else { 0 },
                max_links: if v2x { ml } else { 0 },
                feature_mask: if v2x { fm } else { 0 },
                vendor_exp_options: if v2x { vo } else { 0 },
            }
        })
}

fn accept_confirm() -> impl Strategy<Value = AcceptConfirm> {
    (
        1u8..=3,
        any::<bool>(),
        any::<u64>(),
        any::<u64>(),
        any::<u8>(),
        0u8..=6,
        any::<u32>(),
        any::<u16>(),
        eid(),
        any::<u64>(),
        fce(),
    )
        .prop_map(
            |(
                version,
                first_contact,
                gid,
                token,
                dmbe_idx,
                dmbe_size,
                link_id,
                chid,
                eid,
                gid_ext,
                f,
            )| {
                AcceptConfirm {
                    version,
                    first_contact,
                    gid,
                    token,
                    dmbe_idx,
                    dmbe_size,
                    link_id,
                    v2: (version >= 2).then(|| AcceptConfirmV2 {
                        chid,
                        eid,
                        gid_ext,
                        fce: first_contact.then_some(f),
                    }),
                }
            },
        )
}

fn decline() -> impl Strategy<Value = Decline> {
    (
        1u8..=3,
        any::<bool>(),
        any::<bool>(),
        any::<[u8; 8]>(),
        any::<u32>(),
        0u8..16,
        any::<[u32; 4]>(),
    )
        .prop_map(
            |(version, d, out_of_sync, peer_id, diagnosis, os_type, dv2)| Decline {
                version,
                typev1: if d { SmcType::D } else { SmcType::R },
                out_of_sync,
                peer_id,
                diagnosis,
                os_type,
                diag_v2: if version == 1 { [0; 4] } else { dv2 },
            },
        )
}

fn message() -> impl Strategy<Value = ClcMessage> {
    prop_oneof![
        proposal().prop_map(ClcMessage::Proposal),
        accept_confirm().prop_map(ClcMessage::Accept),
        accept_confirm().prop_map(ClcMessage::Confirm),
        decline().prop_map(ClcMessage::Decline),
    ]
}

/// A valid encoded message with a few bytes overwritten.
fn mutated() -> impl Strategy<Value = Vec<u8>> {
    (
        message(),
        prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        prop::option::of(0usize..700),
    )
        .prop_map(|(m, edits, cut)| {
            let mut b = m.encode().unwrap();
            for (i, v) in edits {
                let i = i.index(b.len());
                b[i] = v;
            }
            if let Some(c) = cut {
                b.truncate(c);
            }
            b
        })
}

fn check_decoder(bytes: &[u8]) {
    if bytes.len() >= HEADER_LEN {
        let h: [u8; HEADER_LEN] = bytes[..HEADER_LEN].try_into().unwrap();
        if let Ok(n) = message_len(&h) {
            assert!((DECLINE_V1_LEN..=PROPOSAL_MAX_LEN).contains(&n));
        }
    }
    if let Ok(m) = decode(bytes) {
        let again = m.encode().expect("a decoded message re-encodes");
        assert_eq!(again.len(), bytes.len());
        assert_eq!(decode(&again), Ok(m));
    }
}

// ------------------------------------------------------------------------------------------
// CLC properties.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn clc_roundtrip(m in message()) {
        let b = m.encode().unwrap();
        let h: [u8; HEADER_LEN] = b[..HEADER_LEN].try_into().unwrap();
        prop_assert_eq!(message_len(&h), Ok(b.len()));
        prop_assert_eq!(decode(&b), Ok(m));
    }

    #[test]
    fn clc_decode_arbitrary_bytes(b in prop::collection::vec(any::<u8>(), 0..700)) {
        check_decoder(&b);
    }

    #[test]
    fn clc_decode_mutated(b in mutated()) {
        check_decoder(&b);
    }
}

// ------------------------------------------------------------------------------------------
// Handshake properties.

#[derive(Clone, Debug)]
enum Step {
    /// A message produced by a well-behaved peer of the other role (if it has one to send).
    PeerMessage,
    /// A valid message of any kind.
    Valid(ClcMessage),
    /// Garbage or a damaged message.
    Bytes(Vec<u8>),
    Timeout,
    DmbOk(u64, u8),
    DmbFail(bool),
    Abort,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::PeerMessage),
        1 => message().prop_map(Step::Valid),
        1 => mutated().prop_map(Step::Bytes),
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(Step::Bytes),
        1 => Just(Step::Timeout),
        3 => (any::<u64>(), 0u8..9).prop_map(|(t, s)| Step::DmbOk(t, s)),
        1 => any::<bool>().prop_map(Step::DmbFail),
        1 => Just(Step::Abort),
    ]
}

const GID: Gid = Gid {
    gid: 0xAAAA_0000_BBBB_0001,
    gid_ext: 0xCCCC_0000_DDDD_0002,
};

/// Checks the invariants of one action stream and tracks DMB ownership.
#[derive(Default)]
struct Audit {
    terminal: usize,
    registered: Vec<LocalDmb>,
    released: Vec<LocalDmb>,
    established_local: Option<LocalDmb>,
}

impl Audit {
    fn record(&mut self, actions: &[Action]) {
        for a in actions {
            match a {
                Action::Send(b) => {
                    assert_eq!(self.terminal, 0, "send after the end: {actions:?}");
                    decode(b).expect("we only send valid CLC messages");
                }
                Action::RegisterDmb { .. } => assert_eq!(self.terminal, 0),
                Action::ReleaseDmb(d) => self.released.push(*d),
                Action::Established(e) => {
                    self.terminal += 1;
                    self.established_local = Some(e.local);
                }
                Action::Fallback(_) => self.terminal += 1,
            }
        }
        assert!(self.terminal <= 1, "more than one terminal action");
    }
}

fn run_sequence(role: Role, peer_smc: bool, steps: &[Step]) {
    let cfg = Config::loopback(GID);
    let mut h = match role {
        Role::Client => Handshake::client(cfg.clone(), peer_smc),
        Role::Server => Handshake::server(cfg.clone(), peer_smc),
    };
    // A well-behaved peer drives the "PeerMessage" steps.
    let mut peer = match role {
        Role::Client => Handshake::server(cfg, true),
        Role::Server => Handshake::client(cfg, true),
    };
    let mut peer_out: Vec<Vec<u8>> = Vec::new();
    for a in peer.start() {
        if let Action::Send(b) = a {
            peer_out.push(b)
        }
    }
    let mut audit = Audit::default();
    audit.record(&h.start());
    for s in steps {
        let actions = match s {
            Step::PeerMessage => match peer_out.pop() {
                Some(b) => h.handle(Input::Message(&b)),
                None => continue,
            },
            Step::Valid(m) => h.handle(Input::Message(&m.encode().unwrap())),
            Step::Bytes(b) => h.handle(Input::Message(b)),
            Step::Timeout => h.handle(Input::Timeout),
            Step::DmbOk(t, s) => {
                let d = LocalDmb {
                    token: *t,
                    idx: 0,
                    size_code: *s,
                };
                audit.registered.push(d);
                h.handle(Input::DmbRegistered(d))
            }
            Step::DmbFail(max) => h.handle(Input::DmbFailed(if *max {
                DmbFailure::MaxDmb
            } else {
                DmbFailure::Mem
            })),
            Step::Abort => h.handle(Input::Abort),
        };
        audit.record(&actions);
        // Feed what we sent to the peer so it can answer.
        for a in &actions {
            if let Action::Send(b) = a {
                for pa in peer.handle(Input::Message(b)) {
                    match pa {
                        Action::Send(b) => peer_out.push(b),
                        Action::RegisterDmb { size_code } => {
                            for pa2 in peer.handle(Input::DmbRegistered(LocalDmb {
                                token: 42,
                                idx: 0,
                                size_code,
                            })) {
                                if let Action::Send(b) = pa2 {
                                    peer_out.push(b)
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    // Whatever happened, a timeout (or abort) ends it.
    audit.record(&h.handle(Input::Timeout));
    assert!(h.is_finished());
    assert_eq!(audit.terminal, 1);
    // Every DMB handed in is either the established one or released exactly once.
    for d in &audit.registered {
        let kept = usize::from(audit.established_local == Some(*d));
        let released = audit.released.iter().filter(|r| *r == d).count();
        assert_eq!(
            kept + released,
            audit.registered.iter().filter(|r| *r == d).count(),
            "DMB {d:?} leaked or double-released"
        );
    }
    for r in &audit.released {
        assert!(
            audit.registered.contains(r),
            "released a DMB never registered"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn client_terminates(peer_smc in any::<bool>(), steps in prop::collection::vec(step(), 0..12)) {
        run_sequence(Role::Client, peer_smc, &steps);
    }

    #[test]
    fn server_terminates(peer_smc in any::<bool>(), steps in prop::collection::vec(step(), 0..12)) {
        run_sequence(Role::Server, peer_smc, &steps);
    }

    /// Two real machines: same host iff equal GIDs, and both sides agree on the outcome.
    #[test]
    fn pair_agrees(
        same in any::<bool>(),
        other in any::<(u64, u64)>(),
        common_eid in any::<bool>(),
        code in 0u8..=10,
    ) {
        let cgid = GID;
        let sgid = if same { GID } else { Gid { gid: other.0, gid_ext: other.1 } };
        let mut ccfg = Config::loopback(cgid);
        ccfg.dmb_size_code = code;
        let mut scfg = Config::loopback(sgid);
        if !common_eid {
            scfg.ueids = vec![padded32(b"NOT-THE-SAME")];
        }
        let mut c = Handshake::client(ccfg, true);
        let mut s = Handshake::server(scfg, true);
        let mut to_s = Vec::new();
        let mut to_c = Vec::new();
        let mut ca = c.start();
        let mut sa = Vec::new();
        let mut c_end = None;
        let mut s_end = None;
        for _ in 0..20 {
            for a in std::mem::take(&mut ca) {
                match a {
                    Action::Send(b) => to_s.push(b),
                    Action::RegisterDmb { size_code } => ca.extend(c.handle(Input::DmbRegistered(
                        LocalDmb { token: 1, idx: 0, size_code }))),
                    Action::Established(e) => c_end = Some(Ok(e)),
                    Action::Fallback(f) => c_end = Some(Err(f)),
                    Action::ReleaseDmb(_) => {}
                }
            }
            for a in std::mem::take(&mut sa) {
                match a {
                    Action::Send(b) => to_c.push(b),
                    Action::RegisterDmb { size_code } => sa.extend(s.handle(Input::DmbRegistered(
                        LocalDmb { token: 2, idx: 0, size_code }))),
                    Action::Established(e) => s_end = Some(Ok(e)),
                    Action::Fallback(f) => s_end = Some(Err(f)),
                    Action::ReleaseDmb(_) => {}
                }
            }
            if let Some(b) = to_s.pop() { sa = s.handle(Input::Message(&b)); }
            else if let Some(b) = to_c.pop() { ca = c.handle(Input::Message(&b)); }
            else if ca.is_empty() && sa.is_empty() { break; }
        }
        let (c_end, s_end) = (c_end.expect("client finished"), s_end.expect("server finished"));
        let ok = cgid == sgid && common_eid;
        prop_assert_eq!(c_end.is_ok(), ok);
        prop_assert_eq!(s_end.is_ok(), ok);
        if let (Ok(ce), Ok(se)) = (&c_end, &s_end) {
            prop_assert_eq!(ce.peer_token, 2);
            prop_assert_eq!(se.peer_token, 1);
            prop_assert_eq!(se.peer_dmb_size, cdc::dmb_size_from_code_large(code).unwrap());
        }
        if let (Err(cf), Err(sf)) = (&c_end, &s_end) {
            prop_assert!(cf.in_sync && sf.in_sync);
            prop_assert_eq!(cf.reason, FallbackReason::DeclinedByPeer { diag: sf.sent_decline.unwrap() });
        }
    }
}

// ------------------------------------------------------------------------------------------
// CDC properties.

fn ring() -> impl Strategy<Value = Ring> {
    prop_oneof![
        1u32..200,
        Just(16352u32),
        Just(u32::MAX),
        any::<u32>().prop_filter("nonzero", |v| *v > 0)
    ]
    .prop_map(|l| Ring::new(l).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(5000))]

    #[test]
    fn cursor_word_roundtrip(v in any::<u64>()) {
        prop_assert_eq!(CursorWord::from_u64(v).to_u64(), v);
        let w = CursorWord::from_u64(v);
        prop_assert_eq!(CursorWord::from_bytes(w.to_bytes()), w);
    }

    #[test]
    fn add_then_diff(r in ring(), wrap in any::<u16>(), count in any::<u32>(), n in any::<u32>()) {
        let c = Cursor::new(wrap, count % r.len());
        let n = n % r.len().saturating_add(1);
        let d = r.add(c, n);
        prop_assert!(r.is_valid(d));
        prop_assert_eq!(r.diff(c, d), Ok(n));
        prop_assert_eq!(r.readable(c, d), Ok(n));
        prop_assert_eq!(r.free_space(d, c), Ok(r.len() - n));
    }

    #[test]
    fn untrusted_peer_cursors_stay_in_bounds(
        r in ring(),
        wrap in any::<u16>(),
        count in any::<u32>(),
        produced in any::<u32>(),
        forged in any::<u64>(),
    ) {
        let cons = Cursor::new(wrap, count % r.len());
        let last = r.add(cons, produced % r.len().saturating_add(1));
        let new = CursorWord::from_u64(forged).cursor;
        if let Ok(p) = r.accept_peer_prod(cons, last, new) {
            let n = r.readable(cons, p).unwrap();
            prop_assert!(n <= r.len());
            for (off, len) in r.segments(cons, n) {
                prop_assert!(off + len <= r.len() as usize);
            }
            let [(_, a), (_, b)] = r.segments(cons, n);
            prop_assert_eq!(a + b, n as usize);
        }
        // Arbitrary inputs never index outside the ring.
        for (off, len) in r.segments(new, forged as u32) {
            prop_assert!(off + len <= r.len() as usize);
        }
        prop_assert!(r.offset(new) < r.len() as usize);
        if let Ok(c) = r.accept_peer_cons(last, cons, new) {
            let free = r.free_space(last, c).unwrap();
            prop_assert!(free <= r.len());
        }
        let _ = r.need_cons_update(cons, new, ProdFlags(forged as u8));
    }
}
