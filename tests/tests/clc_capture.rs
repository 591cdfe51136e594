//! A real SMC-D handshake of the data path, captured on `lo` with dumpcap and decoded by
//! Wireshark's own dissectors (`tshark`): the SYN and SYN-ACK carry the SMC experimental TCP
//! option (kind 254, ExID 0xE2D4C3D9), the Proposal, Accept and Confirm are decoded as SMC CLC
//! messages (SMC-D v2, the loopback GID, CHID 0xFFFF, DMB tokens) without any malformed-packet
//! mark, and nothing but those three messages travels as TCP payload: the application's bytes
//! went through shared memory.
//!
//! Needs root (cgroups, eBPF, packet capture) and tshark (`cargo xtask setup`). Build first:
//! `cargo build --release -p smc-ctl -p smc-preload -p integration-tests --bins`, then
//! `cargo test --release -p integration-tests --test clc_capture`.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use integration_tests::{
    bin, brief, free_port, log_tail, require_tool, run_to_end, spawn_logged, spawn_piped,
    wait_until, Proc, SmcWorld,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// dumpcap on `lo` for one TCP port, writing a pcap file; stopped (SIGINT, so that it flushes
/// and closes the file) by [`Capture::stop`], killed on drop.
struct Capture {
    proc: Option<Proc>,
    log: PathBuf,
}

impl Capture {
    /// Starts the capture and returns once it runs: dumpcap said "Capturing on" and the pcap
    /// file has its header (the kernel filter is attached by then; later packets are kept).
    fn start(dumpcap: &Path, port: u16, file: PathBuf, log: PathBuf) -> Capture {
        let mut c = Command::new(dumpcap);
        c.args(["-i", "lo", "-f", &format!("tcp port {port}"), "-P", "-w"])
            .arg(&file);
        let mut proc = spawn_logged(c, &log);
        wait_until(T, "dumpcap to start capturing on lo", || {
            if let Ok(Some(st)) = proc.0.try_wait() {
                panic!("dumpcap exited ({st}){}", log_tail(&log));
            }
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("Capturing on")
                && std::fs::metadata(&file).is_ok_and(|m| m.len() >= 24)
        });
        Capture {
            proc: Some(proc),
            log,
        }
    }

    fn stop(&mut self) {
        let mut p = self.proc.take().expect("capture running");
        // SAFETY: signal to our own child.
        unsafe { libc::kill(p.0.id() as i32, libc::SIGINT) };
        wait_until(T, "dumpcap to stop", || {
            matches!(p.0.try_wait(), Ok(Some(_)))
        });
        let st = p.0.try_wait().unwrap().unwrap();
        assert!(st.success(), "dumpcap: {st}{}", log_tail(&self.log));
    }
}

/// `tshark -r FILE ARGS` (stdout; fails the test when tshark fails).
fn tshark(tshark: &Path, file: &Path, args: &[&str]) -> String {
    let out = Command::new(tshark)
        .arg("-n")
        .arg("-r")
        .arg(file)
        .args(args)
        .output()
        .expect("run tshark");
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// One frame as `-T fields` prints the `FIELDS`, by field name (multiple occurrences joined with
/// commas, absent fields empty).
fn frames(ts: &Path, file: &Path, filter: &str) -> Vec<BTreeMap<&'static str, String>> {
    let mut args = vec![
        "-Y",
        filter,
        "-T",
        "fields",
        "-E",
        "separator=|",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ];
    for f in FIELDS {
        args.push("-e");
        args.push(f);
    }
    tshark(ts, file, &args)
        .lines()
        .map(|l| {
            FIELDS
                .iter()
                .zip(l.split('|'))
                .map(|(k, v)| (*k, v.to_string()))
                .collect()
        })
        .collect()
}

const FIELDS: &[&str] = &[
    "frame.number",
    "tcp.srcport",
    "tcp.dstport",
    "tcp.flags.syn",
    "tcp.flags.ack",
    "tcp.flags.fin",
    "tcp.len",
    "tcp.option_kind",
    "tcp.options.experimental.exid",
    "tcp.options.experimental.data",
    "smc.clc_msg",
    "smc.length",
    "smc.proposal.smcv2.type",
    "smc.proposal.ism.gid",
    "smc.proposal.smc.chid",
    "smc.proposal.ismv2_gid_count",
    "smc.accept.smc.type",
    "smc.accept.sender.server.ism.gid",
    "smc.accept.dmb.token",
    "smc.accept.smc.chid",
    "smc.confirm.smc.type",
    "smc.confirm.sender.client.ism.gid",
    "smc.confirm.dmb.token",
    "smc.confirm.smc.chid",
];

fn num(f: &BTreeMap<&str, String>, k: &str) -> u64 {
    let v = &f[k];
    let r = match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => v.parse(),
    };
    r.unwrap_or_else(|_| panic!("{k} = {v:?} in frame {f:?}"))
}

/// One connection of the tests' byte-stream program under the data path, captured on `lo`.
#[test]
fn clc_handshake_captured_on_lo_decodes_as_smc_without_malformed_packets() {
    let dumpcap = require_tool("dumpcap", "tshark");
    let ts = require_tool("tshark", "tshark");
    let w = SmcWorld::new();
    let port = free_port();
    let pcap = w.dir.join("clc.pcap");
    let mut cap = Capture::start(&dumpcap, port, pcap.clone(), w.dir.join("logs/dumpcap.log"));

    // One SMC-D connection: 1 MB up (after the program's 16-byte header), 700 kB down, SHA-256
    // on both ends.
    let (up, down) = (1_000_000u64, 700_000u64);
    let header = 16;
    let prog = bin("preload-prog");
    let mut c = w.run(&prog);
    c.args(["server", &port.to_string(), "thread", "1"]);
    let mut srv = spawn_piped(c);
    let line = srv.read_line();
    assert_eq!(line.trim(), format!("READY {port}"), "preload-prog server");
    let mut c = w.run(&prog);
    c.args([
        "client",
        "127.0.0.1",
        &port.to_string(),
        &up.to_string(),
        &down.to_string(),
        "5",
    ]);
    let cl = run_to_end(c, &w.subdir("logs"), None, T).ok();
    let spid = srv.0.id();
    let sout = srv.wait_output(T).expect("preload-prog server");
    let kv = |out: &str, prefix: &str| -> BTreeMap<String, String> {
        out.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {out:?}"))
            .split_whitespace()
            .filter_map(|x| x.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let (co, so) = (kv(&cl.text(), "CLIENT "), kv(&sout, "CONN "));
    assert_eq!(
        (co["tx"].as_str(), co["sha_tx"].as_str()),
        (so["rx"].as_str(), so["sha_rx"].as_str())
    );
    assert_eq!(
        (so["tx"].as_str(), so["sha_tx"].as_str()),
        (co["rx"].as_str(), co["sha_rx"].as_str())
    );
    let c = w.stats_of(cl.pid, "preload-prog client");
    let s = w.stats_of(spid, "preload-prog server");
    assert_eq!(
        (c.get("smcd_client"), c.get("tx_bytes"), c.get("rx_bytes")),
        (1, up + header, down),
        "client: {}",
        brief(&c)
    );
    assert_eq!(
        (s.get("smcd_server"), s.get("rx_bytes"), s.get("tx_bytes")),
        (1, up + header, down),
        "server: {}",
        brief(&s)
    );

    // Both FINs are in the file before the capture stops (dumpcap writes as it goes).
    wait_until(T, "both FINs of the connection in the capture", || {
        tshark(&ts, &pcap, &["-Y", "tcp.flags.fin == 1"])
            .lines()
            .count()
            >= 2
    });
    cap.stop();

    let all = frames(&ts, &pcap, "tcp");
    let text = tshark(&ts, &pcap, &["-V"]);
    let keep = w.dir.join("clc.txt");
    std::fs::write(&keep, &text).unwrap();
    let ctx = format!("(tshark -V output kept in {})", keep.display());

    // The TCP handshake: SYN from the client, SYN-ACK from the server, both with the SMC
    // experimental option: kind 254, ExID E2D4 C3D9 (tshark reads a 16-bit ExID + data).
    let client_port = {
        let syn: Vec<_> = all
            .iter()
            .filter(|f| f["tcp.flags.syn"] == "1" && f["tcp.flags.ack"] == "0")
            .collect();
        assert_eq!(syn.len(), 1, "SYNs: {syn:?} {ctx}");
        num(syn[0], "tcp.srcport")
    };
    for (what, ack) in [("SYN", "0"), ("SYN-ACK", "1")] {
        let f = all
            .iter()
            .find(|f| f["tcp.flags.syn"] == "1" && f["tcp.flags.ack"] == ack)
            .unwrap_or_else(|| panic!("no {what} captured {ctx}"));
        assert!(
            f["tcp.option_kind"].split(',').any(|k| k == "254"),
            "{what} without TCP option 254: {f:?} {ctx}"
        );
        assert_eq!(
            (
                f["tcp.options.experimental.exid"].as_str(),
                f["tcp.options.experimental.data"].as_str()
            ),
            ("0xe2d4", "c3d9"),
            "{what}: SMC ExID E2D4C3D9 expected {ctx}"
        );
    }

    // The CLC messages, in order, each whole in one segment.
    let smc: Vec<_> = all
        .iter()
        .filter(|f| !f["smc.clc_msg"].is_empty())
        .collect();
    let kinds: Vec<(u64, bool)> = smc
        .iter()
        .map(|f| (num(f, "smc.clc_msg"), num(f, "tcp.srcport") == client_port))
        .collect();
    assert_eq!(
        kinds,
        [(1, true), (2, false), (3, true)],
        "expected Proposal (client), Accept (server), Confirm (client) as (CLC type, from client) \
         {ctx}"
    );
    for f in &smc {
        assert_eq!(
            num(f, "smc.length"),
            num(f, "tcp.len"),
            "CLC message length vs segment {f:?} {ctx}"
        );
    }
    let (prop, acc, conf) = (smc[0], smc[1], smc[2]);
    // Proposal: SMC-D v2 with the loopback device's GID entries, CHID 0xFFFF.
    assert_eq!(
        num(prop, "smc.proposal.smcv2.type"),
        1,
        "SMC(v2) type SMC-D {ctx}"
    );
    assert!(
        num(prop, "smc.proposal.ismv2_gid_count") >= 1,
        "{prop:?} {ctx}"
    );
    let gids: Vec<&str> = prop["smc.proposal.ism.gid"].split(',').collect();
    assert!(
        prop["smc.proposal.smc.chid"]
            .split(',')
            .any(|c| c == "0xffff"),
        "no loopback CHID 0xffff in the Proposal {ctx}"
    );
    // Accept and Confirm: SMC-D, the same loopback GID, CHID 0xFFFF, two distinct DMB tokens.
    assert_eq!(
        num(acc, "smc.accept.smc.type"),
        1,
        "Accept SMC type SMC-D {ctx}"
    );
    assert_eq!(
        num(conf, "smc.confirm.smc.type"),
        1,
        "Confirm SMC type SMC-D {ctx}"
    );
    let sgid = acc["smc.accept.sender.server.ism.gid"].as_str();
    let cgid = conf["smc.confirm.sender.client.ism.gid"].as_str();
    assert!(
        gids.contains(&sgid),
        "Accept GID {sgid} not proposed ({gids:?}) {ctx}"
    );
    assert_eq!(
        sgid, cgid,
        "client and server share one loopback device {ctx}"
    );
    assert_eq!(num(acc, "smc.accept.smc.chid"), 0xffff, "{ctx}");
    assert_eq!(num(conf, "smc.confirm.smc.chid"), 0xffff, "{ctx}");
    let (ta, tc) = (
        num(acc, "smc.accept.dmb.token"),
        num(conf, "smc.confirm.dmb.token"),
    );
    assert!(
        ta != 0 && tc != 0 && ta != tc,
        "DMB tokens {ta:#x} {tc:#x} {ctx}"
    );

    // Wireshark decoded everything: three SMC trees, no malformed packet, no dissector trouble.
    let malformed = tshark(&ts, &pcap, &["-Y", "_ws.malformed"]);
    assert!(
        malformed.trim().is_empty(),
        "malformed packets: {malformed} {ctx}"
    );
    for bad in ["Malformed", "Dissector bug", "Exception occurred"] {
        assert!(!text.contains(bad), "tshark reports {bad:?} {ctx}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("Shared Memory Communications"))
            .count(),
        3,
        "SMC protocol trees {ctx}"
    );
    for m in ["Proposal (1)", "Accept (2)", "Confirm (3)"] {
        assert!(text.contains(&format!("CLC Message: {m}")), "no {m} {ctx}");
    }

    // Nothing else travelled as TCP payload: the 1.7 MB of the application went through the
    // DMBs, and the data path's wakeups do not show up as payload either.
    let payload: u64 = all.iter().map(|f| num(f, "tcp.len")).sum();
    let clc: u64 = smc.iter().map(|f| num(f, "smc.length")).sum();
    assert_eq!(payload, clc, "TCP payload besides the CLC messages {ctx}");
}
