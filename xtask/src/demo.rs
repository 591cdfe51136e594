//! `cargo xtask demo`: the same transfers through plain TCP, the sk_msg shortcut and the
//! shared-memory data path (SMC-D over our loopback-ism daemon), side by side, with the counters.
//!
//! Each mode runs its server and client (iperf3 for throughput, sockperf ping-pong for latency)
//! in its own cgroup, on ports the kernel picks at run time: none attached for TCP, `--mode shortcut`, and `--mode ism` with both ends
//! under `smc-ctl run`. Everything is removed afterwards.
use std::{
    collections::BTreeMap,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, Context as _, Result};
use smc_harness::{ebpf_counters, free_port, wait_listening, Cgroup, Daemon, DataPath, Proc};

use crate::bench::parsers::{parse_iperf3, parse_sockperf_pp};
use crate::{load, Bins};

const SECONDS: u32 = 3;

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

    /// The mode in a cgroup's name.
    fn tag(self) -> &'static str {
        match self {
            Mode::Tcp => "tcp",
            Mode::Shortcut => "shortcut",
            Mode::Smcd => "smcd",
        }
    }
}

struct Env<'a> {
    bins: &'a Bins,
    cg: &'a Cgroup,
    daemon: Option<&'a Daemon>,
}

impl Env<'_> {
    /// `argv` in this mode's cgroup, under `smc-ctl run` for SMC-D, pinned to `cpu`.
    fn command(&self, cpu: u32, argv: &[String]) -> Result<Command> {
        let (prog, args) = argv.split_first().context("an empty command line")?;
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
        c.args(args).stdin(Stdio::null());
        Ok(c)
    }

    /// Starts the server `server(port)` on a port the kernel picks now, waits until it
    /// listens, then runs the client `client(port)` to its end: its stdout and its stderr.
    fn run(
        &self,
        what: &str,
        server: fn(u16) -> Vec<String>,
        client: impl Fn(u16) -> Vec<String>,
    ) -> Result<(String, String)> {
        let port = free_port()?;
        let mut srv = Proc::spawn(
            &format!("{what} server"),
            self.command(0, &server(port))?
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )?;
        let name = srv.name().to_owned();
        wait_listening(
            &mut srv,
            Path::new("/proc/self/net"),
            port,
            Duration::from_secs(10),
            &name,
        )?;
        let out = self
            .command(1, &client(port))?
            .output()
            .with_context(|| format!("{what} client"))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        if !out.status.success() {
            bail!("{what} client failed: {stdout}{stderr}");
        }
        Ok((stdout, stderr))
    }
}

/// iperf3, one stream: Gbit/s.
fn iperf3(env: &Env) -> Result<f64> {
    let (json, _) = env.run("iperf3", load::iperf3_server, |port| {
        load::iperf3_client(port, SECONDS)
    })?;
    let m = parse_iperf3(&json)?;
    m.get("gbps")
        .copied()
        .context("no throughput in iperf3 output")
}

/// sockperf ping-pong, 14 B: p50 and p99 latency in µs.
fn sockperf(env: &Env) -> Result<(f64, f64)> {
    let (stdout, stderr) = env.run("sockperf", load::sockperf_server, |port| {
        load::sockperf_ping_pong(port, SECONDS)
    })?;
    let out = stdout + &stderr;
    let m = parse_sockperf_pp(&out)?;
    let pct = |k: &str| {
        m.get(k)
            .copied()
            .with_context(|| format!("no {k} in sockperf output:\n{out}"))
    };
    Ok((pct("p50_us")?, pct("p99_us")?))
}

struct Row {
    mode: Mode,
    gbps: Result<f64>,
    lat: Result<(f64, f64)>,
    note: String,
}

fn run_mode(bins: &Bins, mode: Mode) -> Result<Row> {
    let mut cg = crate::cgroup(&format!("demo-{}", mode.tag()))?;
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
    let gbps = iperf3(&env);
    let lat = sockperf(&env);
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
    for mode in [Mode::Tcp, Mode::Shortcut, Mode::Smcd] {
        eprintln!(
            "==> {}: iperf3 {SECONDS}s, sockperf ping-pong 14 B {SECONDS}s",
            mode.name()
        );
        rows.push(run_mode(&bins, mode)?);
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
