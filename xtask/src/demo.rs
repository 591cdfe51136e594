//! `cargo xtask demo`: the same transfers through plain TCP, the sk_msg shortcut and the
//! shared-memory data path (SMC-D over our loopback-ism daemon), side by side, with the counters.
//!
//! Each mode runs its server and client (iperf3 for throughput, sockperf ping-pong for latency)
//! in its own cgroup: none attached for TCP, `--mode shortcut`, and `--mode ism` with both ends
//! under `smc-ctl run`. Everything is removed afterwards.
use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};
use smc_harness::{ebpf_counters, wait_listening, Cgroup, Daemon, DataPath, Proc};

use crate::Bins;

const SECONDS: &str = "3";

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Tcp,
    Shortcut,
    Smcd,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Tcp => "plain TCP",
            Mode::Shortcut => "sk_msg shortcut",
            Mode::Smcd => "SMC-D (shared memory)",
        }
    }
}

struct Env<'a> {
    bins: &'a Bins,
    cg: &'a Cgroup,
    daemon: Option<&'a Daemon>,
}

impl Env<'_> {
    /// A command in this mode's cgroup, under `smc-ctl run` for SMC-D, pinned to `cpu`.
    fn command(&self, cpu: u32, prog: &str) -> Command {
        let data_path = self.daemon.map(|d| DataPath {
            smc_ctl: &self.bins.smc_ctl,
            socket: &d.socket,
            procs: None,
            clean_env: false,
        });
        let cpu = cpu.to_string();
        let mut c = self
            .cg
            .launch(&["taskset", "-c", &cpu], data_path.as_ref(), prog);
        c.stdin(Stdio::null());
        c
    }
}

/// Waits until the server listens on `port` (in this namespace).
fn wait_listen(srv: &mut Proc, port: u16) -> Result<()> {
    let what = srv.name().to_owned();
    wait_listening(
        srv,
        Path::new("/proc/self/net"),
        port,
        Duration::from_secs(10),
        &what,
    )
}

fn iperf3(env: &Env, port: u16) -> Result<f64> {
    let mut srv = Proc::spawn(
        "iperf3 server",
        env.command(0, "iperf3")
            .args(["-s", "-1", "-p", &port.to_string()])
            .stdout(Stdio::null()),
    )?;
    wait_listen(&mut srv, port)?;
    let out = env
        .command(1, "iperf3")
        .args([
            "-c",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-t",
            SECONDS,
            "-J",
        ])
        .output()
        .context("iperf3 client")?;
    if !out.status.success() {
        bail!("iperf3 failed: {}", String::from_utf8_lossy(&out.stdout));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .map(|b| b / 1e9)
        .ok_or_else(|| anyhow!("no throughput in iperf3 output"))
}

fn sockperf(env: &Env, port: u16) -> Result<(f64, f64)> {
    let mut srv = Proc::spawn(
        "sockperf server",
        env.command(0, "sockperf")
            .args(["sr", "--tcp", "-i", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    wait_listen(&mut srv, port)?;
    let out = env
        .command(1, "sockperf")
        .args([
            "pp",
            "--tcp",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-m",
            "14",
            "-t",
            SECONDS,
        ])
        .output()
        .context("sockperf client")?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let pct = |p: &str| -> Result<f64> {
        text.lines()
            .find(|l| l.contains(&format!("percentile {p} =")))
            .and_then(|l| l.rsplit('=').next())
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| anyhow!("no p{p} in sockperf output:\n{text}"))
    };
    Ok((pct("50.000")?, pct("99.000")?))
}

struct Row {
    mode: Mode,
    gbps: Result<f64>,
    lat: Result<(f64, f64)>,
    note: String,
}

fn run_mode(bins: &Bins, mode: Mode, port: u16) -> Result<Row> {
    let mut cg = crate::cgroup(&format!("demo-{port}"))?;
    // What attach says on stderr (the shortcut's differences from TCP) is not repeated here.
    match mode {
        Mode::Tcp => {}
        Mode::Shortcut => _ = cg.attach(&bins.smc_ctl, "shortcut")?,
        Mode::Smcd => _ = cg.attach(&bins.smc_ctl, "ism")?,
    }
    let daemon = if mode == Mode::Smcd {
        Some(crate::daemon(bins, "demo")?)
    } else {
        None
    };
    let env = Env {
        bins,
        cg: &cg,
        daemon: daemon.as_ref(),
    };
    let counters = || ebpf_counters(&bins.smc_ctl).unwrap_or_default();
    let before = counters();
    let gbps = iperf3(&env, port);
    let lat = sockperf(&env, port + 1);
    let after = counters();
    let d = |k: &str| {
        let at = |m: &BTreeMap<String, u64>| m.get(k).copied().unwrap_or(0);
        at(&after).saturating_sub(at(&before))
    };
    if mode != Mode::Tcp {
        println!("eBPF counters during the {} runs:", mode.name());
        for k in after.keys() {
            let moved = d(k);
            if moved > 0 {
                println!("  {k:<28} +{moved}");
            }
        }
    }
    let note = match mode {
        Mode::Tcp => String::new(),
        Mode::Shortcut => format!("{} MiB redirected by sk_msg", d("bytes_redirected") >> 20),
        Mode::Smcd => format!(
            "{} SMC option exchanges, {} same-host pairs",
            d("synack_opt_received"),
            d("same_host_pairs")
        ),
    };
    if mode == Mode::Smcd {
        if let Ok(out) = Command::new(&bins.smc_ctl)
            .args(["stats"])
            .env("SMC_CTL_SOCK", &daemon.as_ref().expect("daemon").socket)
            .output()
        {
            if out.status.success() {
                println!(
                    "\n`smc-ctl stats` after the SMC-D runs:\n{}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
    }
    Ok(Row {
        mode,
        gbps,
        lat,
        note,
    })
}

pub fn run(root: &Path) -> Result<()> {
    let bins = Bins::new(root)?;
    let mut rows = Vec::new();
    for (i, mode) in [Mode::Tcp, Mode::Shortcut, Mode::Smcd]
        .into_iter()
        .enumerate()
    {
        eprintln!(
            "==> {}: iperf3 {SECONDS}s, sockperf ping-pong 14 B {SECONDS}s",
            mode.name()
        );
        rows.push(run_mode(&bins, mode, 42100 + 10 * i as u16)?);
    }
    let tcp_gbps = rows[0].gbps.as_ref().ok().copied();
    let tcp_p50 = rows[0].lat.as_ref().ok().map(|l| l.0);
    println!(
        "\n{:<24} {:>14} {:>9} {:>12} {:>12} {:>9}  notes",
        "mode", "iperf3 Gbit/s", "× TCP", "p50 µs", "p99 µs", "p50×TCP"
    );
    for r in &rows {
        let (g, gr) = match &r.gbps {
            Ok(g) => (
                format!("{g:.2}"),
                tcp_gbps
                    .map(|t| format!("{:.2}", g / t))
                    .unwrap_or_default(),
            ),
            Err(e) => (
                "failed".into(),
                format!("({e:#})").chars().take(60).collect(),
            ),
        };
        let (p50, p99, lr) = match &r.lat {
            Ok((a, b)) => (
                format!("{a:.2}"),
                format!("{b:.2}"),
                tcp_p50.map(|t| format!("{:.2}", a / t)).unwrap_or_default(),
            ),
            Err(_) => ("failed".into(), String::new(), String::new()),
        };
        println!(
            "{:<24} {:>14} {:>9} {:>12} {:>12} {:>9}  {}",
            r.mode.name(),
            g,
            gr,
            p50,
            p99,
            lr,
            r.note
        );
    }
    Ok(())
}
