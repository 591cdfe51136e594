//! Write one encoded CLC message of every kind into a directory, as seeds for the
//! `clc_decode` fuzz target: `cargo run -p smc-common --example fuzz_seeds -- DIR`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use smc_common::clc::{decode, ClcMessage, Decline, MsgType, SMC_V1, SMC_V2};
use smc_common::diag::Diag;
use smc_common::handshake::{Action, Config, Handshake, Input, LocalDmb};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: fuzz_seeds DIR");
    std::fs::create_dir_all(&dir).expect("create seed dir");
    let mut seeds: Vec<(String, Vec<u8>)> = Vec::new();

    // A complete handshake between the state machines.
    let gid = smc_common::clc::Gid {
        gid: 0x1122_3344_5566_7788,
        gid_ext: 0x99AA_BBCC_DDEE_FF00,
    };
    let mut c = Handshake::client(Config::loopback(gid), true);
    let mut s = Handshake::server(Config::loopback(gid), true);
    let mut queue: Vec<(bool, Action)> = c.start().into_iter().map(|a| (true, a)).collect();
    while !queue.is_empty() {
        let (client, a) = queue.remove(0);
        let (me, other) = if client {
            (&mut c, &mut s)
        } else {
            (&mut s, &mut c)
        };
        match a {
            Action::Send(b) => {
                let name = match decode(&b).expect("valid") {
                    ClcMessage::Proposal(_) => "proposal_v2",
                    ClcMessage::Accept(_) => "accept_v2_fc",
                    ClcMessage::Confirm(_) => "confirm_v2_fc",
                    ClcMessage::Decline(_) => "decline",
                };
                seeds.push((name.into(), b.clone()));
                let r = other.handle(Input::Message(&b));
                queue.extend(r.into_iter().map(|a| (!client, a)));
            }
            Action::RegisterDmb { size_code } => {
                let r = me.handle(Input::DmbRegistered(LocalDmb {
                    token: 0xABCD,
                    idx: 0,
                    size_code,
                }));
                queue.extend(r.into_iter().map(|a| (client, a)));
            }
            _ => {}
        }
    }
    // Declines, v1 and v2, and a v1 accept.
    seeds.push((
        "decline_v1".into(),
        Decline::new(SMC_V1, Diag::SyncErr.code(), [1; 8]).encode(),
    ));
    seeds.push((
        "decline_v2".into(),
        Decline::new(SMC_V2, Diag::NoSmcDev.code(), [0; 8]).encode(),
    ));
    let v1 = smc_common::clc::AcceptConfirm {
        version: SMC_V1,
        first_contact: true,
        gid: 1,
        token: 2,
        dmbe_idx: 0,
        dmbe_size: 1,
        link_id: 3,
        v2: None,
    };
    seeds.push((
        "accept_v1".into(),
        v1.encode(MsgType::Accept).expect("encode"),
    ));
    // v1 proposals: SMC-D with an IPv6 prefix, and SMC-R only (no SMC-D info).
    let mut v1 = smc_common::clc::Proposal {
        version: SMC_V1,
        typev1: smc_common::clc::SmcType::D,
        typev2: smc_common::clc::SmcType::R,
        peer_id: [0; 8],
        ib_gid: [0; 16],
        ib_mac: [0; 6],
        ism_gid: 5,
        ism_chid: 6,
        ip_prefix: Some(smc_common::clc::IpPrefix {
            outgoing_subnet: [0; 4],
            prefix_len: 0,
            ipv6_prefixes: vec![smc_common::clc::Ipv6Prefix {
                prefix: [0xfd; 16],
                prefix_len: 64,
            }],
        }),
        v2: None,
    };
    seeds.push(("proposal_v1_smcd".into(), v1.encode().expect("encode")));
    v1.typev1 = smc_common::clc::SmcType::R;
    v1.ism_gid = 0;
    v1.ism_chid = 0;
    seeds.push(("proposal_v1_smcr".into(), v1.encode().expect("encode")));
    for (name, bytes) in seeds {
        std::fs::write(format!("{dir}/{name}.bin"), bytes).expect("write seed");
    }
}
