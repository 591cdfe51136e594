//! Checks shared by the fuzz targets. Every function panics on a violated invariant, which
//! libFuzzer reports as a crash.

use arbitrary::Arbitrary;
use smc_common::cdc::{CdcHeader, CdcMsg, ConnStateFlags, Cursor, CursorWord, ProdFlags, Ring};
use smc_common::clc::{self, ClcMessage, Gid, HEADER_LEN};
use smc_common::handshake::{Action, Config, DmbFailure, Handshake, Input, LocalDmb};

/// Decoding arbitrary bytes never panics; whatever decodes re-encodes to the same length and
/// decodes to the same message.
pub fn check_clc(bytes: &[u8]) {
    if let Some(h) = bytes.get(..HEADER_LEN) {
        let h: &[u8; HEADER_LEN] = h.try_into().unwrap();
        if let Ok(n) = clc::message_len(h) {
            assert!((clc::DECLINE_V1_LEN..=clc::PROPOSAL_MAX_LEN).contains(&n));
        }
    }
    if let Ok(m) = clc::decode(bytes) {
        let again = m.encode().expect("decoded message must re-encode");
        assert_eq!(again.len(), bytes.len());
        assert_eq!(clc::decode(&again).as_ref(), Ok(&m));
        if let ClcMessage::Proposal(p) = &m {
            if let Some(s) = p.v2.as_ref().and_then(|v| v.smcd.as_ref()) {
                assert!(s.devices().len() <= s.gidchids.len());
            }
        }
    }
}

/// Build a framed message from a selector byte (type in bits 0-1, `"SMCD"` eyecatcher if bit
/// 7), the header's flags byte (version, typev2, typev1) and a body, so that the fuzzer spends
/// its time on message contents rather than on guessing eyecatchers and lengths.
pub fn framed(sel: u8, flags: u8, body: &[u8]) -> Vec<u8> {
    let ty = 1 + (sel & 3);
    let eye = if sel & 0x80 != 0 {
        clc::EYECATCHER_SMCD
    } else {
        clc::EYECATCHER_SMCR
    };
    let len = (HEADER_LEN + body.len() + 4).min(u16::MAX as usize) as u16;
    let mut b = Vec::with_capacity(len as usize);
    b.extend_from_slice(&eye);
    b.push(ty);
    b.extend_from_slice(&len.to_be_bytes());
    b.push(flags);
    b.extend_from_slice(&body[..(len as usize - HEADER_LEN - 4)]);
    b.extend_from_slice(&eye);
    b
}

/// One step of a handshake fuzz run.
#[derive(Arbitrary, Debug)]
pub enum Op {
    /// Arbitrary bytes as a "message".
    Bytes(Vec<u8>),
    /// A framed message (see [`framed`]).
    Framed(u8, u8, Vec<u8>),
    /// The next message a well-behaved peer would send.
    Peer,
    /// Timer expiry.
    Timeout,
    /// DMB registered.
    DmbOk(u64, u8, u8),
    /// DMB registration failed.
    DmbFail(bool),
    /// I/O abort.
    Abort,
    /// The accept withdrawn (decided in the server's DMB).
    AcceptWithdrawn,
}

/// A handshake fuzz case.
#[derive(Arbitrary, Debug)]
pub struct HandshakeCase {
    /// Role of the machine under test.
    pub server: bool,
    /// Whether the peer announced SMC.
    pub peer_smc: bool,
    /// Whether the well-behaved peer has the same GID.
    pub same_gid: bool,
    /// The steps.
    pub ops: Vec<Op>,
}

/// Run a case: no panic, at most one terminal action, nothing sent after it, a final timeout
/// always terminates, and every registered DMB is either kept or released exactly once.
pub fn check_handshake(case: &HandshakeCase) {
    let gid = Gid {
        gid: 0x0102_0304_0506_0708,
        gid_ext: 0x1112_1314_1516_1718,
    };
    let peer_gid = if case.same_gid {
        gid
    } else {
        Gid { gid: 9, gid_ext: 9 }
    };
    let (mut h, mut peer) = if case.server {
        (
            Handshake::server(Config::loopback(gid), case.peer_smc),
            Handshake::client(Config::loopback(peer_gid), true),
        )
    } else {
        (
            Handshake::client(Config::loopback(gid), case.peer_smc),
            Handshake::server(Config::loopback(peer_gid), true),
        )
    };
    let mut peer_out: Vec<Vec<u8>> = Vec::new();
    let feed_peer = |peer: &mut Handshake, acts: Vec<Action>, out: &mut Vec<Vec<u8>>| {
        let mut q = acts;
        while !q.is_empty() {
            let mut next = Vec::new();
            for a in q {
                match a {
                    Action::Send(b) => out.push(b),
                    Action::RegisterDmb { size_code } => {
                        next.extend(peer.handle(Input::DmbRegistered(LocalDmb {
                            token: 0xFEED,
                            idx: 0,
                            size_code,
                        })))
                    }
                    _ => {}
                }
            }
            q = next;
        }
    };
    let start = peer.start();
    feed_peer(&mut peer, start, &mut peer_out);

    let mut terminal = 0usize;
    let mut registered: Vec<LocalDmb> = Vec::new();
    let mut released: Vec<LocalDmb> = Vec::new();
    let mut kept: Option<LocalDmb> = None;
    let mut record = |acts: &[Action], terminal: &mut usize| {
        for a in acts {
            match a {
                Action::Send(b) => {
                    assert_eq!(*terminal, 0, "send after end");
                    clc::decode(b).expect("we send only valid messages");
                }
                Action::RegisterDmb { size_code } => {
                    assert_eq!(*terminal, 0);
                    assert!(*size_code <= 6);
                }
                Action::ReleaseDmb(d) => released.push(*d),
                Action::Established(e) => {
                    *terminal += 1;
                    assert_eq!(e.peer_gid, gid, "established only with the same host");
                    kept = Some(e.local);
                }
                Action::Fallback(_) => *terminal += 1,
            }
        }
        assert!(*terminal <= 1);
    };
    let acts = h.start();
    record(&acts, &mut terminal);
    for op in case.ops.iter().take(64) {
        let acts = match op {
            Op::Bytes(b) => h.handle(Input::Message(b)),
            Op::Framed(sel, flags, body) => h.handle(Input::Message(&framed(*sel, *flags, body))),
            Op::Peer => match peer_out.pop() {
                Some(b) => h.handle(Input::Message(&b)),
                None => continue,
            },
            Op::Timeout => h.handle(Input::Timeout),
            Op::DmbOk(token, idx, size_code) => {
                let d = LocalDmb {
                    token: *token,
                    idx: *idx,
                    size_code: *size_code,
                };
                registered.push(d);
                h.handle(Input::DmbRegistered(d))
            }
            Op::DmbFail(max) => h.handle(Input::DmbFailed(if *max {
                DmbFailure::MaxDmb
            } else {
                DmbFailure::Mem
            })),
            Op::Abort => h.handle(Input::Abort),
            Op::AcceptWithdrawn => h.handle(Input::AcceptWithdrawn),
        };
        record(&acts, &mut terminal);
        let sends: Vec<Action> = acts
            .iter()
            .filter_map(|a| match a {
                Action::Send(b) => Some(b.clone()),
                _ => None,
            })
            .flat_map(|b| peer.handle(Input::Message(&b)))
            .collect();
        feed_peer(&mut peer, sends, &mut peer_out);
    }
    let acts = h.handle(Input::Timeout);
    record(&acts, &mut terminal);
    assert!(h.is_finished());
    assert_eq!(terminal, 1);
    for d in &registered {
        let n = registered.iter().filter(|r| *r == d).count();
        let r = released.iter().filter(|r| *r == d).count();
        assert_eq!(
            usize::from(kept == Some(*d)) + r,
            n,
            "DMB leaked or double-released"
        );
    }
}

/// A CDC fuzz case: a ring, our cursors, and whatever the peer wrote.
#[derive(Arbitrary, Debug)]
pub struct CdcCase {
    /// Ring length (0 is rejected by `Ring::new`).
    pub len: u32,
    /// Our consumer cursor (wrap, count).
    pub cons: (u16, u32),
    /// How far the previously accepted producer cursor is ahead of `cons`.
    pub produced: u32,
    /// Raw shared-memory header.
    pub header: [u8; 32],
    /// An extra byte count to map to ring segments.
    pub n: u32,
    /// Peer flags byte.
    pub flags: u8,
}

/// CDC invariants: decoding any header never panics, round-trips, and no cursor (validated or
/// not) yields an index outside the ring.
pub fn check_cdc(c: &CdcCase) {
    // Raw header parsing and atomic access.
    if let Ok(m) = CdcMsg::from_bytes(&c.header) {
        let b = m.to_bytes();
        assert_eq!(CdcMsg::from_bytes(&b), Ok(m));
        assert_eq!(&b[8..24], &c.header[8..24]);
    }
    let mut mem = [0u64; 4];
    for (i, w) in mem.iter_mut().enumerate() {
        *w = u64::from_ne_bytes(c.header[i * 8..i * 8 + 8].try_into().unwrap());
    }
    let hdr = unsafe { CdcHeader::from_ptr(mem.as_mut_ptr() as *mut u8) };
    let prod_word = hdr.load_prod();
    let cons_word = hdr.load_cons();
    assert_eq!(prod_word, CursorWord::from_u64(mem[1]));
    assert_eq!(hdr.snapshot().is_ok(), c.header[0] == 0xFE);
    let _ = (
        ProdFlags(c.flags),
        ConnStateFlags(c.flags).any_close_or_done(),
    );

    let Some(r) = Ring::new(c.len) else {
        return;
    };
    let len = r.len() as usize;
    let cons = Cursor::new(c.cons.0, c.cons.1 % r.len());
    let last = r.add(cons, c.produced % r.len().saturating_add(1));
    for w in [prod_word, cons_word] {
        let new = w.cursor;
        assert!(r.offset(new) < len);
        for (off, l) in r.segments(new, c.n) {
            assert!(off + l <= len);
        }
        if let Ok(p) = r.accept_peer_prod(cons, last, new) {
            let n = r.readable(cons, p).expect("accepted cursor is readable");
            assert!(n as usize <= len);
            let segs = r.segments(cons, n);
            assert_eq!(segs[0].1 + segs[1].1, n as usize);
            for (off, l) in segs {
                assert!(off + l <= len);
            }
        }
        if let Ok(pc) = r.accept_peer_cons(last, cons, new) {
            let free = r
                .free_space(last, pc)
                .expect("accepted cursor gives free space");
            assert!(free <= r.len());
        }
        let _ = r.need_cons_update(cons, new, ProdFlags(c.flags));
        let d = r.diff(cons, new);
        if let Ok(d) = d {
            assert!(d <= r.len());
            assert_eq!(r.add(cons, d), new);
        }
    }
}

/// A statistics file from a hostile writer (any bytes) through the readers' parser and the
/// fold into an aggregate. Byte 0 selects: bit 0 clear forces the magic and version (so that
/// the fuzzer spends its time past them), bit 1 forces extension 1 when the input covers it,
/// bit 2 pads to a full page.
pub fn check_procstats(data: &[u8]) {
    use smc_stats::{
        fold, is_stats_file, new_aggregate, ConnRecord, Snapshot, COUNTERS, CONN_RECORD_LEN,
        MAGIC, PAGE_LEN, V1_LEN, VERSION,
    };
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let mut b = rest.to_vec();
    if sel & 4 != 0 && b.len() < PAGE_LEN {
        b.resize(PAGE_LEN, 0);
    }
    if sel & 1 == 0 && b.len() >= 16 {
        b[..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&VERSION.to_le_bytes());
    }
    if sel & 2 != 0 && b.len() >= V1_LEN + 8 {
        b[V1_LEN..V1_LEN + 8].copy_from_slice(&1u64.to_le_bytes());
    }
    let parsed = Snapshot::parse(&b);
    assert_eq!(parsed.is_some(), is_stats_file(&b));
    let Some(s) = parsed else {
        let mut agg = new_aggregate(1);
        assert!(!fold(&mut agg, &b));
        return;
    };
    assert_eq!(s.counters.len(), COUNTERS.len());
    // Records come from inside the file only, and decode stably.
    assert!(s.conns.len() <= b.len().saturating_sub(PAGE_LEN) / CONN_RECORD_LEN);
    for r in &s.conns {
        assert_ne!(r.state, 0);
        assert_eq!(&ConnRecord::decode(&r.encode()), r);
    }
    // Folding adds every counter and histogram, twice gives twice.
    let mut agg = new_aggregate(s.cgroup_id);
    assert!(fold(&mut agg, &b));
    let g = Snapshot::parse(&agg).expect("an aggregate parses");
    assert!(g.is_aggregate());
    assert!(g.conns.is_empty());
    for (name, _) in COUNTERS {
        assert_eq!(g.get(name), s.get(name), "{name}");
    }
    assert_eq!(g.hists, s.hists);
    assert!(fold(&mut agg, &b));
    let g2 = Snapshot::parse(&agg).expect("an aggregate parses");
    for (name, _) in COUNTERS {
        assert_eq!(g2.get(name), s.get(name).wrapping_mul(2), "{name}");
    }
    let mut sum = Snapshot::default();
    sum.add(&s);
    sum.add(&g2);
}
