//! The handshake driver over real loopback TCP connections, against a loopback-ism daemon
//! started in this process.

use super::*;
use smc_common::clc::{decode, ClcMessage, Decline, SMC_V2};
use smc_common::handshake::FallbackReason;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// The daemon's directory, removed when the test binary exits ([`remove_dir`]).
static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();

extern "C" fn remove_dir() {
    if let Some(d) = DIR.get() {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// One daemon for the whole test binary (the library reads its socket path once).
fn daemon() {
    static D: OnceLock<smc_ism::DaemonHandle> = OnceLock::new();
    D.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("smc-preload-hs-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        if DIR.set(dir.clone()).is_ok() {
            // SAFETY: registers a plain extern "C" function.
            unsafe { libc::atexit(remove_dir) };
        }
        let sock = dir.join("ctl.sock");
        std::env::set_var("SMC_CTL_SOCK", &sock);
        let _ = crate::util::config::TEST_DAEMON.set(sock.clone());
        let mut cfg = smc_ism::DaemonConfig::with_paths(&sock, dir.join("state"));
        cfg.min_available_bytes = 0;
        smc_ism::spawn(cfg).expect("daemon")
    });
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn client(fd: i32) -> Driver {
    Driver::new(machine(false, 0), fd, false, 0).with_timeout(Duration::from_secs(5))
}

fn server(fd: i32) -> Driver {
    Driver::new(machine(true, 1), fd, true, 1).with_timeout(Duration::from_secs(5))
}

fn done(p: Progress) -> Outcome {
    match p {
        Progress::Done(o) => o,
        Progress::WouldBlock => panic!("would block"),
    }
}

fn fell_back(o: Outcome) -> (Fallback, Option<MsgType>) {
    match o {
        Outcome::Fallback { fb, awaited, .. } => (fb, awaited),
        Outcome::Established { .. } => panic!("established"),
        Outcome::Broken(why) => panic!("broken: {why}"),
    }
}

/// The daemon's live DMBs in use (pooled ones of finished connections of other tests come and
/// go on their own) and attachments.
fn live() -> (u64, u64) {
    let s = smc_ism::Client::connect(crate::util::config::daemon_path())
        .and_then(|mut c| c.stats())
        .unwrap();
    (s.live_dmbs - s.dmbs_pooled, s.live_attachments)
}

/// Read one CLC message from a plain socket.
fn read_clc(s: &mut TcpStream) -> ClcMessage {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let n = clc::message_len(&h).unwrap();
    let mut b = h.to_vec();
    b.resize(n, 0);
    s.read_exact(&mut b[HEADER_LEN..]).unwrap();
    decode(&b).unwrap()
}

#[test]
fn client_and_server_establish() {
    daemon();
    // Its DMBs stay registered (never released here): not while DMBs are counted.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (c, s) = pair();
    let sfd = s.as_raw_fd();
    let t = std::thread::spawn(move || {
        let o = done(server(sfd).step(true));
        drop(s);
        o
    });
    let co = done(client(c.as_raw_fd()).step(true));
    let so = t.join().unwrap();
    let (
        Outcome::Established {
            est: ce,
            own: cown,
            peer: cpeer,
        },
        Outcome::Established {
            est: se,
            own: sown,
            peer: speer,
        },
    ) = (co, so)
    else {
        panic!("both ends establish");
    };
    assert_eq!(ce.peer_token, sown.token);
    assert_eq!(cpeer.token, sown.token);
    assert_eq!(se.peer_token, cown.token);
    assert_eq!(speer.token, cown.token);
    assert_eq!(cown.map.len(), 16 << 10);
    assert_eq!(sown.map.len(), 32 << 10);
    assert_eq!(cpeer.map.len(), 32 << 10);
    assert_eq!(speer.map.len(), 16 << 10);
    daemon::release_dmbs(Some(cown.token), Some(cpeer.token));
    daemon::release_dmbs(Some(sown.token), Some(speer.token));
}

#[test]
fn client_times_out_declines_and_is_out_of_sync() {
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (c, mut s) = pair();
    let mut d = client(c.as_raw_fd()).with_timeout(Duration::from_millis(50));
    let (fb, awaited) = fell_back(done(d.step(true)));
    assert_eq!(fb.reason, FallbackReason::Timeout);
    assert!(!fb.in_sync);
    assert_eq!(awaited, Some(MsgType::Accept));
    assert!(matches!(read_clc(&mut s), ClcMessage::Proposal(_)));
    assert!(
        matches!(read_clc(&mut s), ClcMessage::Decline(d) if d.diagnosis == Diag::TimeoutCl.code())
    );
}

#[test]
fn server_without_clc_consumes_nothing() {
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, mut s) = pair();
    c.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (fb, _) = fell_back(done(server(s.as_raw_fd()).step(true)));
    assert_eq!(fb.reason, FallbackReason::PeerNoSmc);
    assert!(fb.in_sync);
    let mut b = [0u8; 18];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"GET / HTTP/1.0\r\n\r\n");
}

#[test]
fn decline_is_consumed_and_application_bytes_after_it_are_not() {
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, mut s) = pair();
    let mut bytes = Decline::new(SMC_V2, Diag::MaxDmb.code(), [7; 8]).encode();
    bytes.extend_from_slice(b"hello");
    c.write_all(&bytes).unwrap();
    let (fb, _) = fell_back(done(server(s.as_raw_fd()).step(true)));
    assert_eq!(
        fb.reason,
        FallbackReason::DeclinedByPeer {
            diag: Diag::MaxDmb.code()
        }
    );
    assert!(fb.in_sync);
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello");
}

#[test]
fn garbage_instead_of_an_accept_is_out_of_sync() {
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (c, mut s) = pair();
    s.write_all(b"\xE2\xD4\xC3\xC4garbage!").unwrap();
    let (fb, _) = fell_back(done(client(c.as_raw_fd()).step(true)));
    assert!(!fb.in_sync);
    assert!(matches!(fb.reason, FallbackReason::DeclinedByUs { .. }));
}

#[test]
fn server_steps_without_blocking() {
    daemon();
    // Its DMBs stay registered (never released here): not while DMBs are counted.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (c, s) = pair();
    let mut sd = server(s.as_raw_fd());
    assert!(matches!(sd.step(false), Progress::WouldBlock));
    let cfd = c.as_raw_fd();
    // The client's socket stays open until the server is done (the server attaches with it).
    let t = std::thread::spawn(move || (done(client(cfd).step(true)), c));
    let start = Instant::now();
    let so = loop {
        match sd.step(false) {
            Progress::Done(o) => break o,
            Progress::WouldBlock => {
                assert!(start.elapsed() < Duration::from_secs(5));
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    };
    let (co, _c) = t.join().unwrap();
    if let Outcome::Broken(w) = &so {
        panic!("broken: {w}");
    }
    assert!(matches!(so, Outcome::Established { .. }));
    assert!(matches!(co, Outcome::Established { .. }));
}

#[test]
fn skip_one_late_message() {
    let (mut c, s) = pair();
    assert_eq!(skip_one(s.as_raw_fd(), true), None);
    let d = Decline::new(SMC_V2, Diag::TimeoutCl.code(), [1; 8]).encode();
    c.write_all(&d[..5]).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(skip_one(s.as_raw_fd(), true), None, "partial");
    c.write_all(&d[5..]).unwrap();
    c.write_all(b"data").unwrap();
    std::thread::sleep(Duration::from_millis(10));
    assert_eq!(skip_one(s.as_raw_fd(), true), Some(Some(MsgType::Decline)));
    assert_eq!(skip_one(s.as_raw_fd(), true), Some(None), "data is not CLC");
}

/// An urgent byte at the head of the stream is the peer's application data: no CLC message
/// can follow it, so the skip ends there (before, it waited on and the read that TCP makes
/// pass over the byte was never made), whether the byte was read out of band or not.
#[test]
fn skip_one_ends_at_an_urgent_byte() {
    let (c, s) = pair();
    let fd = s.as_raw_fd();
    assert_eq!(skip_one(fd, false), None, "nothing there yet");
    // SAFETY: a valid one-byte buffer.
    let r = unsafe { libc::send(c.as_raw_fd(), b"X".as_ptr().cast(), 1, libc::MSG_OOB) };
    assert_eq!(r, 1);
    let start = Instant::now();
    while !at_urgent_mark(fd) {
        assert!(start.elapsed() < Duration::from_secs(5));
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(skip_one(fd, false), Some(None), "urgent byte unread");
    let mut b = [0u8; 4];
    // SAFETY: a valid buffer.
    let r = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), libc::MSG_OOB) };
    assert_eq!((r, b[0]), (1, b'X'));
    assert_eq!(
        skip_one(fd, true),
        Some(None),
        "urgent byte read out of band"
    );
}

/// A fallback records the CLC bytes it sent and consumed, by socket (a duplicate of the
/// number finds them too), a skipped late message adds to them, and they go when the number
/// closes: `TCP_INFO` takes them out of the kernel's counts.
#[test]
fn a_fallback_records_its_clc_bytes() {
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (mut c, s) = pair();
    let fd = s.as_raw_fd();
    assert_eq!(clc_bytes(fd), None);
    let d = Decline::new(SMC_V2, Diag::MaxDmb.code(), [7; 8]).encode();
    c.write_all(&d).unwrap();
    let _ = fell_back(done(server(fd).step(true)));
    let n = d.len() as u64;
    assert_eq!(clc_bytes(fd), Some((0, n)));
    c.write_all(&d).unwrap();
    wait_head(fd).unwrap();
    assert_eq!(skip_one(fd, false), Some(Some(MsgType::Decline)));
    assert_eq!(clc_bytes(fd), Some((0, 2 * n)));
    let dup = s.try_clone().unwrap();
    assert_eq!(clc_bytes(dup.as_raw_fd()), Some((0, 2 * n)));
    assert_eq!(
        clc_bytes(c.as_raw_fd()),
        None,
        "the other end fell back nowhere"
    );
    forget_clc_bytes(fd.into(), fd.into());
    assert_eq!(clc_bytes(fd), None);
}

/// After a Decline of ours only the peer's Decline is skipped; a blocking reader waits for a
/// message that is still on its way instead of reading its first bytes as data.
#[test]
fn skip_one_decline_only_and_waiting() {
    let (mut c, s) = pair();
    let gid = smc_common::clc::Gid { gid: 1, gid_ext: 2 };
    let mut m = Handshake::client(smc_common::handshake::Config::loopback(gid), true);
    let Some(smc_common::handshake::Action::Send(p)) = m.start().into_iter().next() else {
        panic!("a client starts with its Proposal");
    };
    c.write_all(&p).unwrap();
    let fd = s.as_raw_fd();
    wait_head(fd).unwrap();
    assert_eq!(skip_one(fd, false), Some(None), "a Proposal is not skipped");
    assert_eq!(skip_one(fd, true), Some(Some(MsgType::Proposal)));
    let d = Decline::new(SMC_V2, Diag::TimeoutCl.code(), [1; 8]).encode();
    c.write_all(&d[..3]).unwrap();
    let t = std::thread::spawn(move || {
        // The rest comes later: the wait must last until it is there (any order of events
        // gives the same answer).
        std::thread::yield_now();
        c.write_all(&d[3..]).unwrap();
        c.write_all(b"data").unwrap();
        c
    });
    wait_head(fd).unwrap();
    assert_eq!(skip_one(fd, false), Some(Some(MsgType::Decline)));
    let _c = t.join().unwrap();
    let mut b = [0u8; 4];
    assert_eq!((&s).read(&mut b).unwrap(), 4);
    assert_eq!(&b, b"data", "only the Decline was consumed");
}

#[test]
fn nothing_is_left_registered_after_fallbacks() {
    daemon();
    // Serialised with the other tests that count live DMBs.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let before = live();
    // Client: its registration went out with the proposal; the server declines.
    let (c, mut s) = pair();
    let cfd = c.as_raw_fd();
    let t = std::thread::spawn(move || done(client(cfd).step(true)));
    assert!(matches!(read_clc(&mut s), ClcMessage::Proposal(_)));
    s.write_all(&Decline::new(SMC_V2, Diag::MaxDmb.code(), [3; 8]).encode())
        .unwrap();
    let (fb, _) = fell_back(t.join().unwrap());
    assert!(fb.in_sync);
    // Server: the attach sent with its accept, then the client declines.
    let (mut c2, s2) = pair();
    let sfd = s2.as_raw_fd();
    let t = std::thread::spawn(move || done(server(sfd).step(true)));
    let prop = Driver::new(machine(false, 0), -1, false, 0)
        .m
        .start()
        .into_iter()
        .find_map(|a| match a {
            Action::Send(b) => Some(b),
            _ => None,
        })
        .unwrap();
    c2.write_all(&prop).unwrap();
    assert!(matches!(read_clc(&mut c2), ClcMessage::Accept(_)));
    c2.write_all(&Decline::new(SMC_V2, Diag::IntErr.code(), [3; 8]).encode())
        .unwrap();
    let (fb, _) = fell_back(t.join().unwrap());
    assert!(fb.in_sync);
    // Releases need no reply: wait for the daemon to have processed them.
    let start = Instant::now();
    while live() != before {
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", live());
        std::thread::sleep(Duration::from_millis(5));
    }
    drop((c, s, c2, s2));
}

static COUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn server_stands_in_for_a_client_that_already_left() {
    use smc_common::cdc::{CdcHeader, ConnStateFlags, CursorWord};
    daemon();
    // Counted live DMBs are compared by other tests: no handshake of ours meanwhile.
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let est = Established {
        peer_gid: smc_common::clc::Gid::default(),
        peer_chid: smc_common::clc::LOOPBACK_CHID,
        // No such DMB: the client released it when it closed.
        peer_token: 0x5eed_0000_0000_0001,
        peer_dmbe_idx: 0,
        peer_dmb_size_code: 0,
        peer_dmb_size: 16 << 10,
        peer_link_id: 0,
        local: LocalDmb {
            token: 0,
            idx: 0,
            size_code: 1,
        },
        version: 2,
        release: 1,
        eid: smc_common::handshake::DEFAULT_UEID,
        feature_mask: 0,
    };
    let (_c, s) = pair();
    // Nothing recorded in our DMB: the client may still be there, the connection is broken.
    let mut d = server(s.as_raw_fd());
    d.own = Some(HeldDmb {
        token: 0,
        id: 0,
        map: Mapping::anon_shared(32 << 10).unwrap().into(),
        state: None,
    });
    assert!(d.attach_client(&est).is_err());
    // The client's close recorded (as its final close does before it releases its DMB): a
    // stand-in of the client's DMB size takes its place.
    let own = Mapping::anon_shared(32 << 10).unwrap();
    let w = CursorWord {
        conn_state: ConnStateFlags::PEER_CONN_CLOSED,
        ..CursorWord::default()
    };
    // SAFETY: a fresh page-aligned mapping of 32 KiB.
    unsafe { CdcHeader::from_ptr(own.as_ptr()) }.store_cons(w);
    d.own = Some(HeldDmb {
        token: 0,
        id: 0,
        map: own.into(),
        state: None,
    });
    d.attach_client(&est).unwrap();
    let p = d.peer.take().unwrap();
    assert_eq!(p.token, 0);
    assert_eq!(p.map.len(), 16 << 10);
    d.own = None;
}

/// Establishes one connection between a client and a server driver: (client own, client peer,
/// server own, server peer).
fn establish() -> (HeldDmb, HeldDmb, HeldDmb, HeldDmb) {
    let (c, s) = pair();
    let sfd = s.as_raw_fd();
    let t = std::thread::spawn(move || {
        let o = done(server(sfd).step(true));
        drop(s);
        o
    });
    let co = done(client(c.as_raw_fd()).step(true));
    match (co, t.join().unwrap()) {
        (
            Outcome::Established {
                own: cown,
                peer: cpeer,
                ..
            },
            Outcome::Established {
                own: sown,
                peer: speer,
                ..
            },
        ) => (cown, cpeer, sown, speer),
        _ => panic!("both ends establish"),
    }
}

#[test]
fn a_pooled_dmb_bound_again_starts_clean_without_a_kept_mapping() {
    daemon();
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (cown, cpeer, sown, speer) = establish();
    // The connection ran: its cursors and close flags are in the client DMB's CDC header, its
    // state in the local state page the daemon keeps with that DMB.
    // SAFETY: our own mappings (the DMB's, and its state: a page or a slot, `st.len()` bytes),
    // used by no connection any more.
    unsafe {
        std::ptr::write_bytes(cown.map.as_ptr(), 0xa5, smc_common::cdc::CDC_HEADER_LEN);
        let st = cown
            .state
            .as_ref()
            .expect("a PAIR DMB comes with its state page");
        std::ptr::write_bytes(st.as_ptr(), 0x5a, st.len());
    }
    let token = cown.token;
    // Pooled by the daemon, but its mapping is not kept here (as when the process dropped it
    // from its cache while the daemon, stopped meanwhile, still pooled the DMB).
    drop(cown);
    with_dev(|c| {
        c.release_flags(
            Some(token),
            Some(cpeer.token),
            smc_ism::proto::RELEASE_POOL_OWN,
        )
    })
    .unwrap();
    daemon::release_dmbs(Some(sown.token), Some(speer.token));
    let (cown, cpeer, sown, speer) = establish();
    assert_eq!(cown.token, token, "the pooled DMB is bound again");
    let hdr: Vec<u8> = (0..smc_common::cdc::CDC_HEADER_LEN)
        // SAFETY: within the mapping; nobody writes it (the peer has not been told yet).
        .map(|i| unsafe { std::ptr::read_volatile(cown.map.as_ptr().add(i)) })
        .collect();
    assert!(
        hdr.iter().all(|&b| b == 0),
        "the earlier connection's CDC header is left: {hdr:x?}"
    );
    let st = cown.state.as_ref().expect("its state page");
    // SAFETY: as above, our state mapping of `st.len()` bytes.
    let page = unsafe { std::slice::from_raw_parts(st.as_ptr() as *const u8, st.len()) };
    assert!(
        page.iter().all(|&b| b == 0),
        "the earlier connection's state page is left"
    );
    daemon::release_dmbs(Some(cown.token), Some(cpeer.token));
    daemon::release_dmbs(Some(sown.token), Some(speer.token));
}

/// The raw bytes of one CLC message from a plain socket.
fn read_clc_bytes(s: &mut TcpStream) -> Vec<u8> {
    let mut h = [0u8; HEADER_LEN];
    s.read_exact(&mut h).unwrap();
    let n = clc::message_len(&h).unwrap();
    let mut b = h.to_vec();
    b.resize(n, 0);
    s.read_exact(&mut b[HEADER_LEN..]).unwrap();
    b
}

/// Nothing more arrives on `s` (a socket of ours whose peer has finished its handshake).
fn nothing_more(s: &TcpStream) {
    s.set_nonblocking(true).unwrap();
    let mut x = [0u8; 1];
    assert_eq!(
        (&*s).read(&mut x).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "no CLC message after the peer's last one"
    );
    s.set_nonblocking(false).unwrap();
}

fn wait_live(before: (u64, u64)) {
    // Releases need no reply: wait for the daemon to have processed them.
    let start = Instant::now();
    while live() != before {
        assert!(start.elapsed() < Duration::from_secs(5), "{:?}", live());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A client that went idle after its Proposal (a connection pool): its server's wait for the
/// Confirm ends, the server withdraws its Accept (a Decline after it) and falls back in sync
/// instead of resetting; the client, stepped later, reads the Accept, finds the withdrawal in
/// the server's DMB, sends nothing and reads the Decline: both on TCP, the server's greeting
/// intact, every DMB given back.
#[test]
fn idle_client_reads_a_withdrawn_accept_and_both_fall_back_in_sync() {
    daemon();
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let before = live();
    let (mut c, mut s) = pair();
    let mut cd = client(c.as_raw_fd());
    assert!(matches!(cd.step(false), Progress::WouldBlock));
    let mut sd = server(s.as_raw_fd()).with_timeout(Duration::from_millis(20));
    let (fb, awaited) = fell_back(done(sd.step(true)));
    assert_eq!(fb.reason, FallbackReason::Timeout);
    assert!(
        fb.in_sync,
        "the server withdraws its Accept, it does not reset"
    );
    assert_eq!(fb.sent_decline, Some(Diag::TimeoutCl.code()));
    assert_eq!(awaited, Some(MsgType::Confirm));
    drop(sd);
    s.write_all(b"220 hello\r\n").unwrap();
    let (fb, _) = fell_back(done(cd.step(true)));
    assert_eq!(
        fb.reason,
        FallbackReason::DeclinedByPeer {
            diag: Diag::TimeoutCl.code()
        }
    );
    assert!(fb.in_sync);
    assert_eq!(fb.sent_decline, None);
    drop(cd);
    let mut b = [0u8; 11];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"220 hello\r\n");
    nothing_more(&s);
    wait_live(before);
}

/// The crossing: the client decided to confirm (its claim in the server's DMB, made right
/// before it sends its Confirm) but the Confirm is not there yet when the server's wait ends.
/// The server must not withdraw: it waits for the Confirm, and both ends establish. The order
/// is forced (claim, then the server's deadline, then the Confirm), not timed.
#[test]
fn confirm_decided_as_the_servers_wait_ends_is_waited_for() {
    daemon();
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (c, s) = pair();
    let mut cd = client(c.as_raw_fd());
    assert!(matches!(cd.step(false), Progress::WouldBlock));
    let mut sd = server(s.as_raw_fd()).with_timeout(Duration::from_millis(20));
    let start = Instant::now();
    let step = |sd: &mut Driver| match sd
        .step_until(Some(Some(Instant::now() + Duration::from_millis(5))))
    {
        Progress::WouldBlock => assert!(start.elapsed() < Duration::from_secs(5)),
        Progress::Done(_) => panic!("the server decided without the Confirm"),
    };
    while sd.m.waiting_for() != Some(MsgType::Confirm) {
        step(&mut sd);
    }
    let own = sd.own.as_ref().expect("the server's DMB").map.clone();
    assert!(dmb_header(&own).claim_confirm(), "the client decides first");
    while !sd.withdraw_lost {
        step(&mut sd);
    }
    assert!(!dmb_header(&own).claim_withdraw());
    // Now the client confirms (its own claim finds its decision) and the server takes it.
    let co = done(cd.step(true));
    let so = done(sd.step(true));
    let (
        Outcome::Established {
            own: cown,
            peer: cpeer,
            ..
        },
        Outcome::Established {
            own: sown,
            peer: speer,
            ..
        },
    ) = (co, so)
    else {
        panic!("both ends establish");
    };
    assert_eq!(cpeer.token, sown.token);
    assert_eq!(speer.token, cown.token);
    daemon::release_dmbs(Some(cown.token), Some(cpeer.token));
    daemon::release_dmbs(Some(sown.token), Some(speer.token));
    drop((c, s));
}

/// A client whose attach of the server's DMB fails (a server that does not pair released it
/// when it withdrew its Accept) takes the Decline already queued behind the Accept as the
/// answer: it sends no Decline of its own after the server's last CLC message.
#[test]
fn client_takes_a_decline_queued_behind_the_accept_as_the_answer() {
    daemon();
    let _g = COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let before = live();
    let (mut c, mut s) = pair();
    let mut cd = client(c.as_raw_fd());
    assert!(matches!(cd.step(false), Progress::WouldBlock));
    let prop = read_clc_bytes(&mut s);
    // A server that does not pair registers alone (which completes the client's pairing), but
    // its Accept names a DMB that is gone: the client gives the pairing back, registers and
    // attaches by the Accept's token, which fails.
    let mut alone = smc_ism::Client::connect(crate::util::config::daemon_path()).unwrap();
    let reg = alone.register_dmb(1, s.as_raw_fd()).unwrap();
    let mut m = machine(true, 1);
    assert!(matches!(
        m.handle(Input::Message(&prop)).as_slice(),
        [Action::RegisterDmb { .. }]
    ));
    let gone = LocalDmb {
        token: reg.token ^ 0x5eed,
        idx: 0,
        size_code: 1,
    };
    for a in m
        .handle(Input::DmbRegistered(gone))
        .into_iter()
        .chain(m.handle(Input::AcceptWithdrawn))
    {
        if let Action::Send(b) = a {
            s.write_all(&b).unwrap();
        }
    }
    s.write_all(b"220 hello\r\n").unwrap();
    let (fb, _) = fell_back(done(cd.step(true)));
    assert_eq!(
        fb.reason,
        FallbackReason::DeclinedByPeer {
            diag: Diag::TimeoutCl.code()
        }
    );
    assert!(fb.in_sync);
    assert_eq!(fb.sent_decline, None);
    drop(cd);
    let mut b = [0u8; 11];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"220 hello\r\n");
    nothing_more(&s);
    // Its connection's end gives back what it registered (once nobody holds the socket: the
    // daemon keeps the references of a client that goes while its socket is still held).
    drop((c, s));
    drop(alone);
    wait_live(before);
}
