//! `cargo xtask soak`: the long full-duplex soak of the data path (issue 10). `smc-soak`
//! (tests/src/bin/smc-soak.rs) runs server and client under `smc-ctl run` in an attached
//! cgroup with a private loopback-ism daemon: many connections, a few at a time, both ends
//! writing and reading at once with random sizes and mixed socket APIs, every byte verified.
//! The default moves 100 GiB (1024 connections × 50 MiB each way). Fails when any connection
//! was reset, lost or changed a byte, stalled or lost a wakeup, or did not take SMC-D.
use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context as _, Result};
use smc_harness::{DataPath, Proc, SoakSummary};

use crate::Bins;

/// What to run.
pub struct Opts {
    pub conns: u64,
    pub par: u64,
    pub bytes: String,
    pub modes: String,
    pub seed: u64,
}

pub fn run(root: &Path, o: &Opts) -> Result<()> {
    let bins = Bins::new(root)?;
    let soak = bins.smc_ctl.with_file_name("smc-soak");
    if !soak.exists() {
        bail!("{} missing", soak.display());
    }
    let mut cg = crate::cgroup("soak")?;
    cg.attach(&bins.smc_ctl, "ism")?;
    let daemon = crate::daemon(&bins, "soak")?;
    let procs = daemon.socket.with_file_name("procs");
    std::fs::create_dir_all(&procs)?;
    let data_path = DataPath {
        smc_ctl: &bins.smc_ctl,
        socket: &daemon.socket,
        procs: Some(&procs),
        clean_env: false,
    };
    let cmd = |args: &[String]| {
        let mut c = cg.launch::<&str>(&[], Some(&data_path), &soak);
        c.args(args).stdin(Stdio::null());
        c
    };
    let mut srv = Proc::spawn(
        "smc-soak server",
        cmd(&["server".into(), "0".into(), o.conns.to_string()]).stdout(Stdio::piped()),
    )?;
    let port = srv.read_ready_port()?.to_string();
    let lines = BufReader::new(srv.0.stdout.take().context("server stdout")?).lines();
    eprintln!(
        "==> soak: {} connections, {} at a time, {} each way, modes {}",
        o.conns, o.par, o.bytes, o.modes
    );
    let t0 = Instant::now();
    let cli = cmd(&[
        "client".into(),
        "127.0.0.1".into(),
        port,
        "--conns".into(),
        o.conns.to_string(),
        "--par".into(),
        o.par.to_string(),
        "--bytes".into(),
        o.bytes.clone(),
        "--modes".into(),
        o.modes.clone(),
        "--seed".into(),
        o.seed.to_string(),
    ])
    .stderr(Stdio::inherit())
    .output()
    .context("soak client")?;
    let cout = String::from_utf8_lossy(&cli.stdout).into_owned();
    let sout: String = lines.map_while(Result::ok).collect::<Vec<_>>().join("\n");
    let _ = srv.0.wait();
    print!("{cout}");
    println!("{sout}");
    let stats = Command::new(&bins.smc_ctl)
        .args(["stats", "--socket"])
        .arg(&daemon.socket)
        .arg("--procs-dir")
        .arg(&procs)
        .output()
        .context("smc-ctl stats")?;
    println!("{}", String::from_utf8_lossy(&stats.stdout));
    let (Some(c), Some(s)) = (SoakSummary::find(&cout), SoakSummary::find(&sout)) else {
        bail!("no summary line from the client or the server");
    };
    let bad = c.failures().saturating_add(s.failures());
    let n = |x: &SoakSummary, k: &str| x.get(k).unwrap_or(u64::MAX);
    let done = n(&c, "conns").min(n(&s, "conns"));
    println!(
        "soak: {done} connections, {:.1} GiB verified, {bad} failures, {:.0} s",
        n(&c, "bytes") as f64 / f64::from(1u32 << 30),
        t0.elapsed().as_secs_f64()
    );
    if bad != 0 || done != o.conns || !cli.status.success() {
        bail!("the soak failed (see the FAIL lines above)");
    }
    Ok(())
}
