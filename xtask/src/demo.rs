//! `cargo xtask demo`: the same transfers through plain TCP, the sk_msg shortcut and the
//! shared-memory data path (SMC-D over our loopback-ism daemon), side by side, with the counters.
//!
//! Each mode runs its server and client (iperf3 for throughput, sockperf ping-pong for latency)
//! in its own cgroup: none attached for TCP, `--mode shortcut`, and `--mode ism` with both ends
//! under `smc-ctl run`. Everything is removed afterwards.
use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::harness::{wait_listen, Bins, Cgroup, Daemon, Proc};

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
    mode: Mode,
    daemon: Option<&'a Daemon>,
}

impl Env<'_> {
    /// A command in this mode's cgroup, under `smc-ctl run` for SMC-D, pinned to `cpu`.
    fn command(&self, cpu: u32, prog: &str) -> Command {
        let mut c = Command::new("taskset");
        c.args(["-c", &cpu.to_string()]);
        if self.mode == Mode::Smcd {
            c.arg(&self.bins.smc_ctl).arg("run").arg("--");
        }
        c.arg(prog);
        if let Some(d) = self.daemon {
            c.env("SMC_CTL_SOCK", &d.socket);
        }
        self.cg.enter(&mut c);
        c
    }
}

fn iperf3(env: &Env, port: u16) -> Result<f64> {
    let _srv = Proc::spawn(
        env.command(0, "iperf3")
            .args(["-s", "-1", "-p", &port.to_string()])
            .stdout(Stdio::null()),
    )?;
    wait_listen(port, Duration::from_secs(10))?;
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
    let _srv = Proc::spawn(
        env.command(0, "sockperf")
            .args(["sr", "--tcp", "-i", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    )?;
    wait_listen(port, Duration::from_secs(10))?;
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

fn status_counters(bins: &Bins) -> Result<serde_json::Value> {
    let out = Command::new(&bins.smc_ctl)
        .args(["status", "--json"])
        .output()?;
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    Ok(v["counters"].clone())
}

struct Row {
    mode: Mode,
    gbps: Result<f64>,
    lat: Result<(f64, f64)>,
    note: String,
}

fn run_mode(bins: &Bins, mode: Mode, port: u16) -> Result<Row> {
    let mut cg = Cgroup::new(&format!("demo-{port}"), &bins.smc_ctl)?;
    match mode {
        Mode::Tcp => {}
        Mode::Shortcut => cg.attach("shortcut")?,
        Mode::Smcd => cg.attach("ism")?,
    }
    let daemon = if mode == Mode::Smcd {
        Some(Daemon::start(bins, "demo")?)
    } else {
        None
    };
    let env = Env {
        bins,
        cg: &cg,
        mode,
        daemon: daemon.as_ref(),
    };
    let before = status_counters(bins).unwrap_or_default();
    let gbps = iperf3(&env, port);
    let lat = sockperf(&env, port + 1);
    let after = status_counters(bins).unwrap_or_default();
    if mode != Mode::Tcp {
        println!("eBPF counters during the {} runs:", mode.name());
        if let Some(obj) = after.as_object() {
            for (k, v) in obj {
                let moved = v
                    .as_u64()
                    .unwrap_or(0)
                    .saturating_sub(before[k].as_u64().unwrap_or(0));
                if moved > 0 {
                    println!("  {k:<28} +{moved}");
                }
            }
        }
    }
    let d = |k: &str| {
        after[k]
            .as_u64()
            .unwrap_or(0)
            .saturating_sub(before[k].as_u64().unwrap_or(0))
    };
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
