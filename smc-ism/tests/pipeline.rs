//! Pipelined requests, releases without reply, and attach by connection (`ATTACH_PEER`).
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::fd::AsRawFd;

use common::*;
use smc_ism::proto::{self, Header, Status};
use smc_ism::IsmError;

fn record(op: u16, payload: &[u8]) -> Vec<u8> {
    let mut r = vec![0u8; proto::HEADER_LEN];
    Header::new(op, payload.len(), 4242).encode(&mut r);
    r.extend_from_slice(payload);
    r
}

#[test]
fn features_are_advertised() {
    let dir = TestDir::new("features");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    assert_eq!(c.features().unwrap(), proto::FEATURES);
    let st = c.stats().unwrap();
    assert_eq!(st.ops.query_gid.ok, 1, "asked once per connection");
    c.features().unwrap();
    assert_eq!(c.stats().unwrap().ops.query_gid.ok, 1);
    d.shutdown().unwrap();
}

#[test]
fn tickets_finish_in_any_order_and_sync_calls_interleave() {
    let dir = TestDir::new("tickets");
    let d = start(&dir, |_| {});
    let mut owner = client(&dir);
    let mut peer = client(&dir);
    let (a1, b1) = tcp_pair();
    let (a2, _b2) = tcp_pair();
    let t1 = owner.register_dmb_start(0, a1.as_raw_fd()).unwrap();
    let t2 = owner.register_dmb_start(1, a2.as_raw_fd()).unwrap();
    // A synchronous call in between reads both replies on its way.
    let gid = owner.query_gid().unwrap();
    let d2 = owner.finish_dmb(t2).unwrap();
    let d1 = owner.finish_dmb(t1).unwrap();
    assert_eq!(d1.size, 16 << 10);
    assert_eq!(d2.size, 32 << 10);
    assert_ne!(d1.token, d2.token);
    // The peer attaches by token, pipelined too.
    let t = peer.attach_dmb_start(d1.token, b1.as_raw_fd()).unwrap();
    assert_eq!(peer.query_gid().unwrap(), gid);
    let att = peer.finish_dmb(t).unwrap();
    assert_eq!(att.token, d1.token);
    // A failing ticket reports its own error.
    let t = peer.attach_dmb_start(d1.token ^ 7, b1.as_raw_fd()).unwrap();
    assert!(matches!(peer.finish_dmb(t), Err(IsmError::StaleToken)));
    let st = owner.stats().unwrap();
    assert_eq!(st.live_dmbs, 2);
    assert_eq!(st.live_attachments, 1);
    d.shutdown().unwrap();
}

#[test]
fn release_nowait_gives_back_both_references() {
    let dir = TestDir::new("release");
    let d = start(&dir, |_| {});
    let mut a = client(&dir);
    let mut b = client(&dir);
    let (x, y) = tcp_pair();
    let da = a.register_dmb(0, x.as_raw_fd()).unwrap();
    let db = b.register_dmb(0, y.as_raw_fd()).unwrap();
    let aa = a.attach_dmb(db.token, x.as_raw_fd()).unwrap();
    let bb = b.attach_dmb(da.token, y.as_raw_fd()).unwrap();
    assert_eq!(a.stats().unwrap().live_attachments, 2);
    a.release_nowait(Some(da.token), Some(aa.token)).unwrap();
    b.release_nowait(Some(db.token), Some(bb.token)).unwrap();
    // No reply was sent: the next call's reply is its own.
    let mut c = client(&dir);
    let st = c
        .wait_for(WAIT, |s| s.live_dmbs == 0 && s.live_attachments == 0)
        .unwrap();
    assert_eq!(st.ops.detach.ok, 2);
    assert_eq!(st.ops.unregister.ok, 2);
    assert_eq!(a.query_gid().unwrap(), b.query_gid().unwrap());
    // Releasing what is not held: counted, still no reply, the connection keeps serving.
    a.release_nowait(Some(da.token), None).unwrap();
    a.query_gid().unwrap();
    assert_eq!(a.stats().unwrap().failures.not_held, 1);
    // NOREPLY on an op that has a result: malformed, answered.
    let (s, _, _) = a
        .raw_request(&record(proto::OP_QUERY_GID | proto::NOREPLY_BIT, &[]), None)
        .unwrap();
    assert_eq!(s, Status::Malformed);
    // RELEASE with a reply.
    let (s, _, _) = a
        .raw_request(&record(proto::OP_RELEASE, &[0; 16]), None)
        .unwrap();
    assert_eq!(s, Status::Ok);
    let (s, _, _) = a
        .raw_request(&record(proto::OP_RELEASE, &[0; 8]), None)
        .unwrap();
    assert_eq!(s, Status::Malformed);
    d.shutdown().unwrap();
}

#[test]
fn attach_peer_needs_the_other_end_of_the_connection() {
    let dir = TestDir::new("attachpeer");
    let d = start(&dir, |_| {});
    let mut owner = client(&dir);
    let mut other = client(&dir);
    let (a1, b1) = tcp_pair();
    let (_a2, b2) = tcp_pair();
    // Nothing registered yet.
    let t = other.attach_peer_start(b1.as_raw_fd()).unwrap();
    assert!(matches!(other.finish_dmb(t), Err(IsmError::StaleToken)));
    let dmb = owner.register_dmb(2, a1.as_raw_fd()).unwrap();
    // Another connection, the owner's own socket: refused.
    let t = other.attach_peer_start(b2.as_raw_fd()).unwrap();
    assert!(matches!(other.finish_dmb(t), Err(IsmError::StaleToken)));
    let t = other.attach_peer_start(a1.as_raw_fd()).unwrap();
    assert!(other.finish_dmb(t).is_err());
    // The other end gets the very DMB.
    let t = other.attach_peer_start(b1.as_raw_fd()).unwrap();
    let got = other.finish_dmb(t).unwrap();
    assert_eq!(got.token, dmb.token);
    assert_eq!(got.size, 64 << 10);
    let st = owner.stats().unwrap();
    assert_eq!(st.live_attachments, 1);
    other.detach_dmb(got.token).unwrap();
    // After the owner's unregister, no attach by connection either.
    owner.unregister_dmb(dmb.token).unwrap();
    let t = other.attach_peer_start(b1.as_raw_fd()).unwrap();
    assert!(matches!(other.finish_dmb(t), Err(IsmError::StaleToken)));
    // A newer registration of the same connection wins.
    let d1 = owner.register_dmb(0, a1.as_raw_fd()).unwrap();
    let d2 = owner.register_dmb(1, a1.as_raw_fd()).unwrap();
    let t = other.attach_peer_start(b1.as_raw_fd()).unwrap();
    assert_eq!(other.finish_dmb(t).unwrap().token, d2.token);
    owner.unregister_dmb(d1.token).unwrap();
    let t = other.attach_peer_start(b1.as_raw_fd()).unwrap();
    assert_eq!(other.finish_dmb(t).unwrap().token, d2.token);
    d.shutdown().unwrap();
}

#[test]
fn tickets_of_a_dead_connection_are_void() {
    let dir = TestDir::new("deadticket");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    let (a, _b) = tcp_pair();
    let t = c.register_dmb_start(0, a.as_raw_fd()).unwrap();
    // The daemon restarts: whatever it granted on the old connection was released with it.
    d.shutdown().unwrap();
    let d = start(&dir, |_| {});
    // The next call notices and reconnects (its reply may come after the ticket's, read and
    // kept on the way, or the old connection may be gone already).
    c.query_gid().unwrap();
    assert!(matches!(c.finish_dmb(t), Err(IsmError::Disconnected)));
    assert_eq!(c.stats().unwrap().live_dmbs, 0);
    d.shutdown().unwrap();
}

/// An event-loop process (wrk, nginx at 1000 connections) starts a request per connection and
/// finishes the tickets much later. Its replies must not fill its socket: the daemon would
/// block sending them and stop reading, our next request would block sending, and after the
/// timeout the connection (with every handshake on it) would be dropped.
#[test]
fn many_tickets_in_flight_never_deadlock() {
    let dir = TestDir::new("inflight");
    let d = start(&dir, |_| {});
    let mut c = client(&dir);
    c.set_timeout(std::time::Duration::from_secs(5)).unwrap();
    let (a, _b) = tcp_pair();
    let n = 3000;
    let mut tickets = Vec::with_capacity(n);
    for i in 0..n {
        match c.register_dmb_start(0, a.as_raw_fd()) {
            Ok(t) => tickets.push(t),
            Err(e) => panic!("request {i} of {n} in flight failed: {e:?}"),
        }
    }
    let mut tokens = std::collections::HashSet::new();
    for t in tickets {
        let dmb = c.finish_dmb(t).expect("every ticket gets its reply");
        assert!(tokens.insert(dmb.token), "a token granted twice");
    }
    assert_eq!(c.stats().unwrap().live_dmbs, n as u64);
    d.shutdown().unwrap();
}

/// The same through the `SharedClient` the data path uses: an event loop with thousands of
/// handshakes under way never makes the daemon stop reading (at most `MAX_INFLIGHT` replies
/// outstanding; the oldest is read and filed for its ticket first).
#[test]
fn shared_client_many_tickets_in_flight_never_deadlock() {
    let dir = TestDir::new("shared-inflight");
    let d = start(&dir, |_| {});
    let c = smc_ism::SharedClient::new(&dir.sock());
    let (a, _b) = tcp_pair();
    let n = 3000;
    let mut tickets = Vec::with_capacity(n);
    for i in 0..n {
        match c.register_dmb_start(0, a.as_raw_fd()) {
            Ok(t) => tickets.push(t),
            Err(e) => panic!("request {i} of {n} in flight failed: {e:?}"),
        }
    }
    let mut tokens = std::collections::HashSet::new();
    for t in tickets {
        let dmb = c.finish_dmb(t).expect("every ticket gets its reply");
        assert!(tokens.insert(dmb.token), "a token granted twice");
    }
    assert_eq!(tokens.len(), n);
    d.shutdown().unwrap();
}
