//! Feed encoded CLC messages to Wireshark's SMC dissector (`tshark`) and require that every
//! message is recognised and none is marked malformed.
//!
//! When `tshark` is not installed the test fails, unless the `CI` environment variable is unset,
//! in which case it prints a loud notice and returns (developer machines). CI installs tshark.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use smc_common::clc::*;
use smc_common::diag::Diag;
use smc_common::handshake::{Action, Config, Handshake, Input, LocalDmb};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A minimal classic-pcap writer for raw IPv4 TCP segments.
struct Pcap {
    data: Vec<u8>,
    t: u32,
}

struct Flow {
    cli: ([u8; 4], u16),
    srv: ([u8; 4], u16),
    cli_seq: u32,
    srv_seq: u32,
}

fn csum(data: &[u8], mut sum: u32) -> u16 {
    let mut i = 0;
    while i + 1 < data.len() {
        sum += u32::from(u16::from_be_bytes([data[i], data[i + 1]]));
        i += 2;
    }
    if i < data.len() {
        sum += u32::from(data[i]) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    !(sum as u16)
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;

impl Pcap {
    fn new() -> Pcap {
        let mut data = Vec::new();
        data.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        data.extend_from_slice(&2u16.to_le_bytes());
        data.extend_from_slice(&4u16.to_le_bytes());
        data.extend_from_slice(&0i32.to_le_bytes());
        data.extend_from_slice(&0u32.to_le_bytes());
        data.extend_from_slice(&65535u32.to_le_bytes());
        data.extend_from_slice(&101u32.to_le_bytes()); // LINKTYPE_RAW
        Pcap { data, t: 0 }
    }

    #[allow(clippy::too_many_arguments)]
    fn segment(
        &mut self,
        src: ([u8; 4], u16),
        dst: ([u8; 4], u16),
        seq: u32,
        ack: u32,
        flags: u8,
        smc_option: bool,
        payload: &[u8],
    ) {
        let opts: &[u8] = if smc_option {
            &[1, 1, 254, 6, 0xE2, 0xD4, 0xC3, 0xD9]
        } else {
            &[]
        };
        let tcp_len = 20 + opts.len() + payload.len();
        let mut tcp = Vec::with_capacity(tcp_len);
        tcp.extend_from_slice(&src.1.to_be_bytes());
        tcp.extend_from_slice(&dst.1.to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push((((20 + opts.len()) / 4) as u8) << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]);
        tcp.extend_from_slice(opts);
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&src.0);
        pseudo.extend_from_slice(&dst.0);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        pseudo.extend_from_slice(&tcp);
        let c = csum(&pseudo, 0);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());

        let total = 20 + tcp_len;
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(total as u16).to_be_bytes());
        ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&src.0);
        ip.extend_from_slice(&dst.0);
        let c = csum(&ip, 0);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        ip.extend_from_slice(&tcp);

        self.t += 1;
        self.data.extend_from_slice(&self.t.to_le_bytes());
        self.data.extend_from_slice(&0u32.to_le_bytes());
        self.data
            .extend_from_slice(&(ip.len() as u32).to_le_bytes());
        self.data
            .extend_from_slice(&(ip.len() as u32).to_le_bytes());
        self.data.extend_from_slice(&ip);
    }

    /// SYN / SYN-ACK / ACK, both with the SMC option.
    fn connect(&mut self, cli_port: u16) -> Flow {
        let mut f = Flow {
            cli: ([10, 0, 0, 1], cli_port),
            srv: ([10, 0, 0, 2], 5000),
            cli_seq: 1000,
            srv_seq: 9000,
        };
        self.segment(f.cli, f.srv, f.cli_seq, 0, SYN, true, &[]);
        self.segment(f.srv, f.cli, f.srv_seq, f.cli_seq + 1, SYN | ACK, true, &[]);
        f.cli_seq += 1;
        f.srv_seq += 1;
        self.segment(f.cli, f.srv, f.cli_seq, f.srv_seq, ACK, false, &[]);
        f
    }

    fn client_sends(&mut self, f: &mut Flow, payload: &[u8]) {
        self.segment(
            f.cli,
            f.srv,
            f.cli_seq,
            f.srv_seq,
            PSH | ACK,
            false,
            payload,
        );
        f.cli_seq += payload.len() as u32;
    }

    fn server_sends(&mut self, f: &mut Flow, payload: &[u8]) {
        self.segment(
            f.srv,
            f.cli,
            f.srv_seq,
            f.cli_seq,
            PSH | ACK,
            false,
            payload,
        );
        f.srv_seq += payload.len() as u32;
    }
}

fn eid() -> Eid {
    padded32(b"SMC-RS-LOOPBACK")
}

fn proposal(n_ueids: usize, with_v1: bool) -> Vec<u8> {
    Proposal {
        version: SMC_V2,
        typev1: if with_v1 { SmcType::D } else { SmcType::N },
        typev2: SmcType::D,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: if with_v1 { 0x42 } else { 0 },
        ism_chid: if with_v1 { 0x0102 } else { 0 },
        ip_prefix: with_v1.then(|| IpPrefix {
            outgoing_subnet: [10, 0, 0, 0],
            prefix_len: 24,
            ipv6_prefixes: vec![],
        }),
        v2: Some(ProposalV2Ext {
            release: SMC_RELEASE_1,
            seid: false,
            roce_gid: [0; 16],
            max_conns: 0,
            max_links: 0,
            feature_mask: FEATURE_EMULATED_ISM,
            ueids: vec![eid(); n_ueids],
            smcd: Some(SmcdV2Ext {
                system_eid: [0; 32],
                gidchids: vec![
                    GidChid {
                        gid: 0xDEAD_BEEF_0000_0001,
                        chid: LOOPBACK_CHID,
                    },
                    GidChid {
                        gid: 0x1234_5678_9ABC_DEF0,
                        chid: LOOPBACK_CHID,
                    },
                ],
            }),
        }),
    }
    .encode()
    .unwrap()
}

fn accept_confirm(kind: MsgType, version: u8, first_contact: bool, release: u8) -> Vec<u8> {
    AcceptConfirm {
        version,
        first_contact,
        gid: 0xDEAD_BEEF_0000_0001,
        token: 0x0123_4567_89AB_CDEF,
        dmbe_idx: 0,
        dmbe_size: 2,
        link_id: 0x0000_0101,
        v2: (version >= SMC_V2).then(|| AcceptConfirmV2 {
            chid: LOOPBACK_CHID,
            eid: eid(),
            gid_ext: 0x1234_5678_9ABC_DEF0,
            fce: first_contact.then(|| FirstContactExt {
                v2_direct: false,
                os_type: OS_LINUX,
                release,
                hostname: padded32(b"testhost"),
                max_conns: 0,
                max_links: 0,
                feature_mask: if release >= SMC_RELEASE_1 {
                    FEATURE_EMULATED_ISM
                } else {
                    0
                },
                vendor_exp_options: 0,
            }),
        }),
    }
    .encode(kind)
    .unwrap()
}

/// Every CLC message kind we emit, one TCP connection per exchange. Returns the number of CLC
/// messages written.
fn build_capture(path: &Path) -> usize {
    let mut p = Pcap::new();
    let mut n = 0;
    let mut send = |p: &mut Pcap, f: &mut Flow, from_client: bool, m: Vec<u8>| {
        if from_client {
            p.client_sends(f, &m)
        } else {
            p.server_sends(f, &m)
        }
        n += 1;
    };
    // 0. Handshakes produced by the state machines: same host, then a different host.
    for (port, server_gid) in [(40010, 7u64), (40011, 8u64)] {
        let mut f = p.connect(port);
        for (from_client, bytes) in machine_exchange(server_gid) {
            send(&mut p, &mut f, from_client, bytes);
        }
    }
    // 1. Successful SMC-Dv2 handshake with first contact (v2.1).
    let mut f = p.connect(40001);
    send(&mut p, &mut f, true, proposal(1, false));
    send(
        &mut p,
        &mut f,
        false,
        accept_confirm(MsgType::Accept, 2, true, 1),
    );
    send(
        &mut p,
        &mut f,
        true,
        accept_confirm(MsgType::Confirm, 2, true, 1),
    );
    // 2. A proposal that also offers SMC-Dv1, first contact, then a confirm without it.
    //    (Only release-1 first-contact extensions are captured: Wireshark 4.0's dissector
    //    always expects the 52-byte v2.1 extension and flags Linux's 36-byte SMC-D v2.0
    //    extension as malformed. This implementation never emits release 0: loopback-ism
    //    needs v2.1.)
    let mut f = p.connect(40002);
    send(&mut p, &mut f, true, proposal(2, true));
    send(
        &mut p,
        &mut f,
        false,
        accept_confirm(MsgType::Accept, 2, true, 1),
    );
    send(
        &mut p,
        &mut f,
        true,
        accept_confirm(MsgType::Confirm, 2, false, 1),
    );
    // 3. SMC-Dv1 accept/confirm.
    let mut f = p.connect(40003);
    send(&mut p, &mut f, true, proposal(0, true));
    send(
        &mut p,
        &mut f,
        false,
        accept_confirm(MsgType::Accept, 1, true, 0),
    );
    send(
        &mut p,
        &mut f,
        true,
        accept_confirm(MsgType::Confirm, 1, false, 0),
    );
    // 4. Declines, v2 and v1.
    let mut f = p.connect(40004);
    send(&mut p, &mut f, true, proposal(1, false));
    send(
        &mut p,
        &mut f,
        false,
        Decline::new(SMC_V2, Diag::NoSmcDev.code(), [0; 8]).encode(),
    );
    let mut f = p.connect(40005);
    send(&mut p, &mut f, true, proposal(1, false));
    send(
        &mut p,
        &mut f,
        false,
        Decline::new(SMC_V1, Diag::SyncErr.code(), [1, 2, 3, 4, 5, 6, 7, 8]).encode(),
    );
    std::fs::write(path, &p.data).unwrap();
    n
}

/// The CLC messages two `Handshake`s exchange (client GID 7; server GID as given), in order,
/// tagged with whether the client sent them.
fn machine_exchange(server_gid: u64) -> Vec<(bool, Vec<u8>)> {
    let gid = |g| smc_common::clc::Gid {
        gid: g,
        gid_ext: 0xFEED,
    };
    let mut ccfg = Config::loopback(gid(7));
    ccfg.hostname = padded32(b"client-host");
    let mut scfg = Config::loopback(gid(server_gid));
    scfg.hostname = padded32(b"server-host");
    let mut c = Handshake::client(ccfg, true);
    let mut s = Handshake::server(scfg, true);
    let mut wire = Vec::new();
    let mut pending: Vec<(bool, Action)> = c.start().into_iter().map(|a| (true, a)).collect();
    while let Some((client, a)) = (!pending.is_empty()).then(|| pending.remove(0)) {
        let (me, other) = if client {
            (&mut c, &mut s)
        } else {
            (&mut s, &mut c)
        };
        match a {
            Action::Send(b) => {
                wire.push((client, b.clone()));
                pending.extend(
                    other
                        .handle(Input::Message(&b))
                        .into_iter()
                        .map(|a| (!client, a)),
                );
            }
            Action::RegisterDmb { size_code } => {
                let d = LocalDmb {
                    token: if client { 0xC1 } else { 0x5E },
                    idx: 0,
                    size_code,
                };
                pending.extend(
                    me.handle(Input::DmbRegistered(d))
                        .into_iter()
                        .map(|a| (client, a)),
                );
            }
            _ => {}
        }
    }
    assert!(c.is_finished() && s.is_finished());
    wire
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn out_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("smc-common-tshark-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn wireshark_decodes_every_message() {
    if !tshark_available() {
        if std::env::var_os("CI").is_some() {
            panic!("tshark is required in CI (apt-get install tshark) but was not found");
        }
        eprintln!("=============================================================");
        eprintln!("SKIPPED wireshark_decodes_every_message: tshark not installed");
        eprintln!("  (install it: apt-get install -y tshark; CI fails without it)");
        eprintln!("=============================================================");
        return;
    }
    let dir = out_dir();
    let pcap = dir.join("clc.pcap");
    let n = build_capture(&pcap);
    let out = Command::new("tshark")
        .args(["-n", "-r"])
        .arg(&pcap)
        .args(["-V", "-o", "tcp.desegment_tcp_streams:TRUE"])
        .output()
        .expect("run tshark");
    let text = String::from_utf8_lossy(&out.stdout);
    std::fs::write(dir.join("clc.txt"), text.as_bytes()).unwrap();
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for bad in ["Malformed", "malformed", "Exception", "Dissector bug"] {
        assert!(
            !text.contains(bad),
            "tshark reports {bad:?}; full output in {}",
            dir.join("clc.txt").display()
        );
    }
    let smc_trees = text
        .lines()
        .filter(|l| l.starts_with("Shared Memory Communications"))
        .count();
    assert_eq!(
        smc_trees,
        n,
        "expected {n} SMC messages dissected; output in {}",
        dir.join("clc.txt").display()
    );
    for kind in ["Proposal", "Accept", "Confirm", "Decline"] {
        assert!(text.contains(kind), "no {kind} in tshark output");
    }
    // Fields as Wireshark reads them must be the values we encoded.
    for field in [
        "SMC Version: 2",
        "SMC(v2) Type: SMC-D (1)",
        "SMCv2 Extension Offset: 0x001c",
        "SMC-Dv2 Extension Offset: 0x0040",
        "EID Count: 1",
        "ISMv2 GID Count: 2",
        "SMC Version Release Number: 1",
        "ISM GID: 0xdeadbeef00000001",
        "ISM GID: 0x123456789abcdef0",
        "ISMv2 CHID: 0xffff",
        "DMB Token: 0x0123456789abcdef",
        "Buffers Size (Compressed Notation): 2 (Size: 64k)",
        "Negotiated EID: SMC-RS-LOOPBACK",
        "Peer Host Name: testhost",
        "First Contact: True",
        "Peer Diagnosis Information: 0x03030000",
        "Peer Diagnosis Information: 0x04000000",
        "Out of Sync: True",
        "OS Type: Linux (2)",
    ] {
        assert!(
            text.contains(field),
            "tshark output lacks {field:?}; output in {}",
            dir.join("clc.txt").display()
        );
    }
    if std::env::var_os("SMC_KEEP_TSHARK").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}
