use super::*;
use crate::clc::{decode, ClcMessage, IpPrefix};

const GID: Gid = Gid {
    gid: 0x0011_2233_4455_6677,
    gid_ext: 0x8899_aabb_ccdd_eeff,
};

fn cfg(gid: Gid) -> Config {
    let mut c = Config::loopback(gid);
    c.hostname = padded32(b"unit");
    c
}

/// A tiny I/O layer: delivers messages between the two machines, registers DMBs with fresh
/// tokens, and records every action.
struct Wire {
    next_token: u64,
    client_log: Vec<Action>,
    server_log: Vec<Action>,
}

impl Wire {
    fn new() -> Wire {
        Wire {
            next_token: 0x1000,
            client_log: Vec::new(),
            server_log: Vec::new(),
        }
    }

    /// Run both machines until neither has anything left to do.
    fn run(&mut self, client: &mut Handshake, server: &mut Handshake) {
        let mut to_server: Vec<Vec<u8>> = Vec::new();
        let mut to_client: Vec<Vec<u8>> = Vec::new();
        let mut pending_c: Vec<Action> = client.start();
        let mut pending_s: Vec<Action> = server.start();
        for _ in 0..100 {
            if pending_c.is_empty() && pending_s.is_empty() {
                if let Some(m) = to_server.pop() {
                    pending_s = server.handle(Input::Message(&m));
                } else if let Some(m) = to_client.pop() {
                    pending_c = client.handle(Input::Message(&m));
                } else {
                    return;
                }
            }
            for a in std::mem::take(&mut pending_c) {
                self.client_log.push(a.clone());
                match a {
                    Action::Send(b) => to_server.push(b),
                    Action::RegisterDmb { size_code } => {
                        self.next_token += 1;
                        pending_c.extend(client.handle(Input::DmbRegistered(LocalDmb {
                            token: self.next_token,
                            idx: 0,
                            size_code,
                        })));
                    }
                    _ => {}
                }
            }
            for a in std::mem::take(&mut pending_s) {
                self.server_log.push(a.clone());
                match a {
                    Action::Send(b) => to_client.push(b),
                    Action::RegisterDmb { size_code } => {
                        self.next_token += 1;
                        pending_s.extend(server.handle(Input::DmbRegistered(LocalDmb {
                            token: self.next_token,
                            idx: 0,
                            size_code,
                        })));
                    }
                    _ => {}
                }
            }
        }
        panic!("did not settle");
    }
}

fn terminal(log: &[Action]) -> &Action {
    let t: Vec<&Action> = log
        .iter()
        .filter(|a| matches!(a, Action::Established(_) | Action::Fallback(_)))
        .collect();
    assert_eq!(t.len(), 1, "exactly one terminal action: {log:?}");
    t[0]
}

fn sent(log: &[Action]) -> Vec<ClcMessage> {
    log.iter()
        .filter_map(|a| match a {
            Action::Send(b) => Some(decode(b).expect("we only send valid messages")),
            _ => None,
        })
        .collect()
}

#[test]
fn same_host_establishes() {
    let mut c = Handshake::client(cfg(GID), true);
    let mut s = Handshake::server(cfg(GID), true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    let (Action::Established(ce), Action::Established(se)) =
        (terminal(&w.client_log), terminal(&w.server_log))
    else {
        panic!("{:?} / {:?}", w.client_log, w.server_log)
    };
    assert_eq!(
        ce.peer_token, se.local.token,
        "client writes into server's DMB"
    );
    assert_eq!(
        se.peer_token, ce.local.token,
        "server writes into client's DMB"
    );
    assert_eq!(ce.peer_gid, GID);
    assert_eq!(se.peer_gid, GID);
    assert_eq!(ce.peer_dmb_size, 64 * 1024);
    assert_eq!(ce.release, 1);
    assert_eq!(ce.eid, DEFAULT_UEID);
    assert_eq!(se.eid, DEFAULT_UEID);
    assert!(c.is_finished() && s.is_finished());
    assert_eq!(c.state(), State::Established);
    // What went over the wire.
    let cs = sent(&w.client_log);
    let ss = sent(&w.server_log);
    assert!(matches!(cs[0], ClcMessage::Proposal(_)));
    assert!(matches!(&cs[1], ClcMessage::Confirm(m) if m.first_contact));
    assert!(
        matches!(&ss[0], ClcMessage::Accept(m) if m.v2.as_ref().unwrap().gid_ext == GID.gid_ext)
    );
    let bytes = match &w.client_log[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    assert_eq!(bytes.len(), 224);
    // Inputs after the end do nothing.
    assert!(c.handle(Input::Timeout).is_empty());
    assert!(s.handle(Input::Abort).is_empty());
}

#[test]
fn different_host_falls_back() {
    let other = Gid {
        gid: 1,
        gid_ext: GID.gid_ext,
    };
    let mut c = Handshake::client(cfg(other), true);
    let mut s = Handshake::server(cfg(GID), true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    assert_eq!(
        terminal(&w.server_log),
        &Action::Fallback(Fallback {
            reason: FallbackReason::NoCommonDevice(DeviceMismatch::DifferentHost),
            sent_decline: Some(Diag::NoSmcDev.code()),
            in_sync: true,
        })
    );
    assert_eq!(
        terminal(&w.client_log),
        &Action::Fallback(Fallback {
            reason: FallbackReason::DeclinedByPeer {
                diag: Diag::NoSmcDev.code()
            },
            sent_decline: None,
            in_sync: true,
        })
    );
    assert!(!w
        .server_log
        .iter()
        .any(|a| matches!(a, Action::RegisterDmb { .. })));
}

#[test]
fn no_common_eid() {
    let mut sc = cfg(GID);
    sc.ueids = vec![padded32(b"OTHER")];
    let mut c = Handshake::client(cfg(GID), true);
    let mut s = Handshake::server(sc, true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    assert!(matches!(
        terminal(&w.server_log),
        Action::Fallback(Fallback {
            reason: FallbackReason::NoCommonDevice(DeviceMismatch::NoCommonEid),
            ..
        })
    ));
    // Matching system EIDs work without UEIDs.
    let mut a = cfg(GID);
    a.ueids.clear();
    a.system_eid = Some(padded32(b"SYSTEM-EID"));
    let mut c = Handshake::client(a.clone(), true);
    let mut s = Handshake::server(a, true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    assert!(
        matches!(terminal(&w.client_log), Action::Established(e) if e.eid == padded32(b"SYSTEM-EID"))
    );
}

#[test]
fn both_ends_negotiate_switch_alone() {
    let mut c = Handshake::client(cfg(GID), true);
    let mut s = Handshake::server(cfg(GID), true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    for log in [&w.client_log, &w.server_log] {
        assert!(
            matches!(terminal(log), Action::Established(e)
                if e.feature_mask & crate::clc::FEATURE_SWITCH_ALONE != 0),
            "{log:?}"
        );
    }
}

#[test]
fn peer_no_smc() {
    for mut h in [
        Handshake::client(cfg(GID), false),
        Handshake::server(cfg(GID), false),
    ] {
        let a = h.start();
        assert_eq!(
            a,
            vec![Action::Fallback(Fallback {
                reason: FallbackReason::PeerNoSmc,
                sent_decline: None,
                in_sync: true
            })]
        );
        assert_eq!(FallbackReason::PeerNoSmc.diag_code(), 0x0301_0000);
        assert!(h.handle(Input::Timeout).is_empty());
    }
}

fn declined_with(actions: &[Action]) -> u32 {
    let d = actions
        .iter()
        .find_map(|a| match a {
            Action::Send(b) => match decode(b) {
                Ok(ClcMessage::Decline(d)) => Some(d.diagnosis),
                _ => None,
            },
            _ => None,
        })
        .expect("a decline");
    d
}

#[test]
fn timeouts_end_every_state() {
    // Client waiting for accept.
    let mut c = Handshake::client(cfg(GID), true);
    c.start();
    assert_eq!(c.waiting_for(), Some(MsgType::Accept));
    let a = c.handle(Input::Timeout);
    assert_eq!(declined_with(&a), Diag::TimeoutCl.code());
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::Timeout && !f.in_sync)
    );
    // Server waiting for proposal.
    let mut s = Handshake::server(cfg(GID), true);
    assert!(s.start().is_empty());
    assert_eq!(s.waiting_for(), Some(MsgType::Proposal));
    assert!(matches!(
        s.handle(Input::Timeout).last(),
        Some(Action::Fallback(_))
    ));
    // Server waiting for its DMB, then the DMB shows up late: it must be released.
    let mut c = Handshake::client(cfg(GID), true);
    let prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let mut s = Handshake::server(cfg(GID), true);
    assert_eq!(
        s.handle(Input::Message(&prop)),
        vec![Action::RegisterDmb { size_code: 2 }]
    );
    assert_eq!(s.state(), State::WaitDmb);
    let a = s.handle(Input::Timeout);
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    let late = LocalDmb {
        token: 5,
        idx: 0,
        size_code: 2,
    };
    assert_eq!(
        s.handle(Input::DmbRegistered(late)),
        vec![Action::ReleaseDmb(late)]
    );
    assert!(s.handle(Input::Timeout).is_empty());
}

#[test]
fn server_waiting_for_confirm_releases_its_dmb() {
    let mut c = Handshake::client(cfg(GID), true);
    let prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let mut s = Handshake::server(cfg(GID), true);
    s.handle(Input::Message(&prop));
    let local = LocalDmb {
        token: 77,
        idx: 0,
        size_code: 1,
    };
    let a = s.handle(Input::DmbRegistered(local));
    assert!(matches!(a[0], Action::Send(_)));
    assert_eq!(s.waiting_for(), Some(MsgType::Confirm));
    let a = s.handle(Input::Abort);
    assert_eq!(
        a,
        vec![
            Action::ReleaseDmb(local),
            Action::Fallback(Fallback {
                reason: FallbackReason::Aborted,
                sent_decline: None,
                in_sync: false
            })
        ]
    );
}

#[test]
fn out_of_dmbs() {
    let mut c = Handshake::client(cfg(GID), true);
    let prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let mut s = Handshake::server(cfg(GID), true);
    s.handle(Input::Message(&prop));
    let a = s.handle(Input::DmbFailed(DmbFailure::MaxDmb));
    assert_eq!(declined_with(&a), Diag::MaxDmb.code());
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::OutOfDmbs(DmbFailure::MaxDmb))
    );
    // The client receives the decline.
    let decl = match &a[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let a = c.handle(Input::Message(&decl));
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::DeclinedByPeer { diag: 0x030d_0000 })
    );
}

#[test]
fn v1_proposal_is_version_mismatch() {
    let p = Proposal {
        version: SMC_V1,
        typev1: SmcType::D,
        typev2: SmcType::R,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: 1,
        ism_chid: 2,
        ip_prefix: Some(IpPrefix::default()),
        v2: None,
    };
    let mut s = Handshake::server(cfg(GID), true);
    let a = s.handle(Input::Message(&p.encode().unwrap()));
    assert_eq!(declined_with(&a), Diag::VersMismat.code());
    match &a[0] {
        Action::Send(b) => assert_eq!(b.len(), 28, "v1 decline for a v1 peer"),
        _ => unreachable!(),
    }
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::VersionMismatch)
    );
}

#[test]
fn garbage_is_a_sync_error_out_of_sync() {
    let mut s = Handshake::server(cfg(GID), true);
    let a = s.handle(Input::Message(b"GET / HTTP/1.1\r\n"));
    assert_eq!(declined_with(&a), Diag::SyncErr.code());
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if !f.in_sync));
    // A well-framed but unexpected message keeps the stream in sync.
    let mut c = Handshake::client(cfg(GID), true);
    c.start();
    let prop = Handshake::client(cfg(GID), true).start();
    let Action::Send(p) = &prop[0] else {
        unreachable!()
    };
    let a = c.handle(Input::Message(p));
    assert_eq!(declined_with(&a), Diag::SyncErr.code());
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
}

#[test]
fn accept_from_other_host_or_chid_is_declined() {
    let mut c = Handshake::client(cfg(GID), true);
    c.start();
    let mut acc = AcceptConfirm {
        version: SMC_V2,
        first_contact: true,
        gid: GID.gid,
        token: 1,
        dmbe_idx: 0,
        dmbe_size: 0,
        link_id: 0,
        v2: Some(AcceptConfirmV2 {
            chid: LOOPBACK_CHID,
            eid: DEFAULT_UEID,
            gid_ext: GID.gid_ext ^ 1,
            fce: Some(FirstContactExt {
                v2_direct: false,
                os_type: OS_LINUX,
                release: 1,
                hostname: padded32(b"x"),
                max_conns: 0,
                max_links: 0,
                feature_mask: 1,
                vendor_exp_options: 0,
            }),
        }),
    };
    let a = c
        .clone()
        .handle(Input::Message(&acc.encode(MsgType::Accept).unwrap()));
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::NoCommonDevice(DeviceMismatch::DifferentHost))
    );
    acc.v2.as_mut().unwrap().gid_ext = GID.gid_ext;
    acc.v2.as_mut().unwrap().chid = 0x1234;
    let a = c
        .clone()
        .handle(Input::Message(&acc.encode(MsgType::Accept).unwrap()));
    assert!(
        matches!(a.last(), Some(Action::Fallback(f)) if f.reason == FallbackReason::NoCommonDevice(DeviceMismatch::UnexpectedChid))
    );
    acc.v2.as_mut().unwrap().chid = LOOPBACK_CHID;
    let a = c.handle(Input::Message(&acc.encode(MsgType::Accept).unwrap()));
    assert_eq!(a, vec![Action::RegisterDmb { size_code: 2 }]);
    let a = c.handle(Input::DmbRegistered(LocalDmb {
        token: 9,
        idx: 0,
        size_code: 2,
    }));
    assert!(matches!(&a[0], Action::Send(b) if b.len() == 130));
    assert!(
        matches!(&a[1], Action::Established(e) if e.peer_token == 1 && e.peer_dmb_size == 16384)
    );
}

#[test]
fn stray_dmb_registration_is_returned() {
    let mut c = Handshake::client(cfg(GID), true);
    c.start();
    let d = LocalDmb {
        token: 3,
        idx: 0,
        size_code: 0,
    };
    let a = c.handle(Input::DmbRegistered(d));
    assert!(a.contains(&Action::ReleaseDmb(d)));
    assert!(matches!(a.last(), Some(Action::Fallback(_))));
}

#[test]
fn device_unavailable_declines_without_proposing() {
    // Client: a decline instead of a proposal, answered by the server's fallback.
    let mut c = Handshake::client(cfg(GID), true).device_unavailable(Diag::NoSmcdDev);
    let a = c.start();
    assert_eq!(declined_with(&a), Diag::NoSmcdDev.code());
    assert!(matches!(
        a.last(),
        Some(Action::Fallback(f)) if f.in_sync
            && f.reason == FallbackReason::NoLocalDevice { diag: Diag::NoSmcdDev }
            && f.reason.diag_code() == Diag::NoSmcdDev.code()
    ));
    assert!(c.is_finished());
    let decl = match &a[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let mut s = Handshake::server(cfg(GID), true);
    let a = s.handle(Input::Message(&decl));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    // Server: the proposal is declined with the device's code, no DMB asked for.
    let mut c = Handshake::client(cfg(GID), true);
    let prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let mut s = Handshake::server(cfg(GID), true).device_unavailable(Diag::IntErr);
    let a = s.handle(Input::Message(&prop));
    assert_eq!(declined_with(&a), Diag::IntErr.code());
    assert!(!a.iter().any(|x| matches!(x, Action::RegisterDmb { .. })));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    // Without an SMC peer nothing is sent.
    let mut c = Handshake::client(cfg(GID), false).device_unavailable(Diag::NoSmcdDev);
    let a = c.start();
    assert_eq!(a.len(), 1);
    assert!(matches!(&a[0], Action::Fallback(f) if f.reason == FallbackReason::PeerNoSmc));
}

#[test]
fn client_names_the_peer_dmb_and_declines_a_failed_attach() {
    let mut c = Handshake::client(cfg(GID), true);
    let prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    assert_eq!(c.peer_dmb(), None);
    let mut s = Handshake::server(cfg(GID), true);
    s.handle(Input::Message(&prop));
    let local = LocalDmb {
        token: 0xabcd,
        idx: 0,
        size_code: 3,
    };
    let acc = match &s.handle(Input::DmbRegistered(local))[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    assert_eq!(
        c.handle(Input::Message(&acc)),
        vec![Action::RegisterDmb { size_code: 2 }]
    );
    assert_eq!(
        c.peer_dmb(),
        Some(PeerDmb {
            token: 0xabcd,
            idx: 0,
            size_code: 3
        })
    );
    let a = c.handle(Input::DmbFailed(DmbFailure::NoDevice));
    assert_eq!(declined_with(&a), Diag::NoSmcdDev.code());
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    assert_eq!(c.peer_dmb(), None);
    // The server, waiting for the confirm, gets the decline and releases its DMB.
    let decl = match &a[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    let a = s.handle(Input::Message(&decl));
    assert_eq!(a[0], Action::ReleaseDmb(local));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    assert_eq!(DmbFailure::Internal.diag(), Diag::IntErr);
}

#[test]
fn large_dmbs_when_both_offer() {
    let (mut cc, mut sc) = (cfg(GID), cfg(GID));
    cc.dmb_size_code = 9;
    sc.dmb_size_code = 8;
    let mut c = Handshake::client(cc, true);
    let mut s = Handshake::server(sc, true);
    let mut w = Wire::new();
    w.run(&mut c, &mut s);
    let (Action::Established(ce), Action::Established(se)) =
        (terminal(&w.client_log), terminal(&w.server_log))
    else {
        panic!("{:?} / {:?}", w.client_log, w.server_log)
    };
    assert_eq!(ce.local.size_code, 9);
    assert_eq!(se.peer_dmb_size, 8 << 20);
    assert_eq!(ce.peer_dmb_size, 4 << 20);
    let ClcMessage::Proposal(p) = &sent(&w.client_log)[0] else {
        panic!()
    };
    assert_ne!(p.v2.as_ref().unwrap().feature_mask & FEATURE_LARGE_DMB, 0);
}

/// A peer that does not offer the extension (Linux, an older version of this library): both
/// ends stay at Linux's 1 MiB, and a large code without the echoed bit is a protocol error.
#[test]
fn no_large_dmbs_without_the_offer() {
    let mut sc = cfg(GID);
    sc.dmb_size_code = 9;
    let mut s = Handshake::server(sc, true);
    let mut cc = cfg(GID);
    cc.dmb_size_code = 9;
    let mut c = Handshake::client(cc, true);
    let Action::Send(pb) = &c.start()[0] else {
        panic!()
    };
    let Ok(ClcMessage::Proposal(mut p)) = decode(pb) else {
        panic!()
    };
    p.v2.as_mut().unwrap().feature_mask = FEATURE_EMULATED_ISM;
    let old = p.encode().unwrap();
    assert_eq!(s.start(), vec![]);
    let a = s.handle(Input::Message(&old));
    assert_eq!(a, vec![Action::RegisterDmb { size_code: 6 }]);
    let a = s.handle(Input::DmbRegistered(LocalDmb {
        token: 7,
        idx: 0,
        size_code: 6,
    }));
    let Some(Action::Send(ab)) = a.first() else {
        panic!("{a:?}")
    };
    let Ok(ClcMessage::Accept(mut acc)) = decode(ab) else {
        panic!()
    };
    let fm = acc.v2.as_ref().unwrap().fce.as_ref().unwrap().feature_mask;
    assert_eq!(fm & FEATURE_LARGE_DMB, 0, "not echoed when not offered");
    // The client: an accept with a large code but without the bit is refused.
    acc.dmbe_size = 9;
    let bad = acc.encode(MsgType::Accept).unwrap();
    let r = c.handle(Input::Message(&bad));
    assert!(
        matches!(r.last(), Some(Action::Fallback(_))),
        "large code without the extension: {r:?}"
    );
    // The same accept at 1 MiB: the client registers at most 1 MiB too.
    let mut cc = cfg(GID);
    cc.dmb_size_code = 9;
    let mut c = Handshake::client(cc, true);
    let _ = c.start();
    acc.dmbe_size = 6;
    let ok = acc.encode(MsgType::Accept).unwrap();
    assert_eq!(
        c.handle(Input::Message(&ok)),
        vec![Action::RegisterDmb { size_code: 6 }]
    );
}

#[test]
fn withdrawn_handshake_declines_at_its_next_message() {
    let send = |a: &[Action]| match a.first() {
        Some(Action::Send(b)) => b.clone(),
        _ => unreachable!(),
    };
    let withdrawn = |a: &[Action]| {
        assert_eq!(declined_with(a), Diag::OptUnsupp.code());
        assert!(!a.iter().any(|x| matches!(x, Action::RegisterDmb { .. })));
        assert!(matches!(
            a.last(),
            Some(Action::Fallback(f)) if f.in_sync
                && f.reason == FallbackReason::DeclinedByUs { diag: Diag::OptUnsupp }
        ));
    };
    // A client withdrawn before it starts declines instead of proposing; the server waiting
    // for its proposal falls back in sync.
    let mut c = Handshake::client(cfg(GID), true);
    c.withdraw(Diag::OptUnsupp);
    let a = c.start();
    withdrawn(&a);
    let mut s = Handshake::server(cfg(GID), true);
    s.start();
    let a = s.handle(Input::Message(&send(&a)));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    // A server withdrawn while the proposal is on its way declines it.
    let mut c = Handshake::client(cfg(GID), true);
    let prop = send(&c.start());
    let mut s = Handshake::server(cfg(GID), true);
    s.start();
    s.withdraw(Diag::OptUnsupp);
    let a = s.handle(Input::Message(&prop));
    withdrawn(&a);
    let a = c.handle(Input::Message(&send(&a)));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
    // A client withdrawn while the accept is on its way declines instead of confirming; the
    // server gives back the DMB it registered.
    let mut c = Handshake::client(cfg(GID), true);
    let prop = send(&c.start());
    let mut s = Handshake::server(cfg(GID), true);
    let a = s.handle(Input::Message(&prop));
    assert!(matches!(a.last(), Some(Action::RegisterDmb { .. })));
    let local = LocalDmb {
        token: 7,
        idx: 0,
        size_code: 0,
    };
    let acc = send(&s.handle(Input::DmbRegistered(local)));
    c.withdraw(Diag::OptUnsupp);
    let a = c.handle(Input::Message(&acc));
    withdrawn(&a);
    let a = s.handle(Input::Message(&send(&a)));
    assert!(a.contains(&Action::ReleaseDmb(local)));
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if f.in_sync));
}

/// Client and server up to the server waiting for the confirm: (client, server, accept bytes,
/// the server's DMB).
fn up_to_accept(offer_withdraw: bool) -> (Handshake, Handshake, Vec<u8>, LocalDmb) {
    let mut c = Handshake::client(cfg(GID), true);
    let mut prop = match &c.start()[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    if !offer_withdraw {
        let mut p = match decode(&prop).unwrap() {
            ClcMessage::Proposal(p) => p,
            _ => unreachable!(),
        };
        p.v2.as_mut().unwrap().feature_mask &= !FEATURE_ACCEPT_WITHDRAW;
        prop = p.encode().unwrap();
    }
    let mut s = Handshake::server(cfg(GID), true);
    s.handle(Input::Message(&prop));
    let local = LocalDmb {
        token: 0x5151,
        idx: 0,
        size_code: 1,
    };
    let acc = match &s.handle(Input::DmbRegistered(local))[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    assert_eq!(s.waiting_for(), Some(MsgType::Confirm));
    (c, s, acc, local)
}

#[test]
fn withdrawn_accept_falls_back_in_sync_on_both_ends() {
    let (mut c, mut s, acc, local) = up_to_accept(true);
    // The accept echoes the offer.
    let ClcMessage::Accept(a) = decode(&acc).unwrap() else {
        unreachable!()
    };
    let fm = a.v2.unwrap().fce.unwrap().feature_mask;
    assert_ne!(fm & FEATURE_ACCEPT_WITHDRAW, 0);
    // The server's wait is over and its claim won: a decline after the accept, in sync.
    let a = s.handle(Input::AcceptWithdrawn);
    assert_eq!(declined_with(&a), Diag::TimeoutCl.code());
    assert!(a.contains(&Action::ReleaseDmb(local)));
    assert!(matches!(a.last(), Some(Action::Fallback(f))
        if f.in_sync && f.reason == FallbackReason::Timeout && f.sent_decline.is_some()));
    let decl = match &a[0] {
        Action::Send(b) => b.clone(),
        _ => unreachable!(),
    };
    // The client reads the accept late; its claim loses: nothing sent, the decline awaited.
    assert_eq!(
        c.handle(Input::Message(&acc)),
        vec![Action::RegisterDmb { size_code: 2 }]
    );
    assert!(c.handle(Input::AcceptWithdrawn).is_empty());
    assert_eq!(c.waiting_for(), Some(MsgType::Decline));
    assert_eq!(c.peer_dmb(), None);
    let a = c.handle(Input::Message(&decl));
    assert_eq!(
        a,
        vec![Action::Fallback(Fallback {
            reason: FallbackReason::DeclinedByPeer {
                diag: Diag::TimeoutCl.code()
            },
            sent_decline: None,
            in_sync: true,
        })]
    );
}

#[test]
fn client_waiting_for_the_decline_never_sends() {
    // Timeout: out of sync, no decline of ours after the server's last CLC message.
    let (mut c, _s, acc, _) = up_to_accept(true);
    c.handle(Input::Message(&acc));
    c.handle(Input::AcceptWithdrawn);
    let a = c.handle(Input::Timeout);
    assert_eq!(
        a,
        vec![Action::Fallback(Fallback {
            reason: FallbackReason::Timeout,
            sent_decline: None,
            in_sync: false,
        })]
    );
    // Anything but a decline (another accept, garbage): out of sync, nothing sent.
    for bad in [acc.clone(), b"\xE2\xD4\xC3\xC4garbage!".to_vec()] {
        let (mut c, _s, acc, _) = up_to_accept(true);
        c.handle(Input::Message(&acc));
        c.handle(Input::AcceptWithdrawn);
        let a = c.handle(Input::Message(&bad));
        assert!(!a.iter().any(|x| matches!(x, Action::Send(_))), "{a:?}");
        assert!(matches!(a.last(), Some(Action::Fallback(f)) if !f.in_sync));
    }
}

#[test]
fn withdrawal_not_offered_is_a_timeout() {
    // A client that did not offer the extension may confirm at any time: the server's wait
    // ends as a timeout, out of sync (the connection is reset), as before.
    let (_c, mut s, acc, local) = up_to_accept(false);
    let ClcMessage::Accept(a) = decode(&acc).unwrap() else {
        unreachable!()
    };
    assert_eq!(
        a.v2.unwrap().fce.unwrap().feature_mask & FEATURE_ACCEPT_WITHDRAW,
        0
    );
    let a = s.handle(Input::AcceptWithdrawn);
    assert!(a.contains(&Action::ReleaseDmb(local)));
    assert!(matches!(a.last(), Some(Action::Fallback(f))
        if f.reason == FallbackReason::Timeout && !f.in_sync));
    // Elsewhere it is a timeout too.
    let mut c = Handshake::client(cfg(GID), true);
    c.start();
    let a = c.handle(Input::AcceptWithdrawn);
    assert_eq!(declined_with(&a), Diag::TimeoutCl.code());
    assert!(matches!(a.last(), Some(Action::Fallback(f)) if !f.in_sync));
}
