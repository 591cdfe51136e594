//! `smc-ctl run -- CMD`: executes CMD with the interposition library preloaded (like smc_run).
use std::{
    env,
    ffi::{OsStr, OsString},
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::{bpf, sys};

/// File name of the interposition library.
pub const PRELOAD_LIB: &str = "libsmc_preload.so";

/// The library next to this binary (or in `../lib/smc`, `../lib`: an installed package), or
/// where `SMC_PRELOAD_LIB` says.
pub fn preload_lib() -> Result<PathBuf> {
    if let Some(p) = env::var_os("SMC_PRELOAD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("no directory for {}", exe.display()))?;
    for cand in [
        dir.join(PRELOAD_LIB),
        dir.join("../lib/smc").join(PRELOAD_LIB),
        dir.join("../lib").join(PRELOAD_LIB),
    ] {
        if cand.exists() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!(
        "{PRELOAD_LIB} not found next to {} (build it with `cargo xtask build`, or set SMC_PRELOAD_LIB)",
        exe.display()
    )
}

/// Moves this process into `dir` (a cgroup v2 directory that is attached or below an attached
/// one): what `exec` then runs, and its children, are in the enabled cgroup.
pub fn join_cgroup(dir: &Path) -> Result<PathBuf> {
    let cg = sys::check_cgroup2_dir(dir)?;
    sys::require_root().context("smc-ctl run --cgroup moves itself into the cgroup")?;
    match bpf::enabled_by(&cg)? {
        Some(_) => {}
        None => bail!(
            "{} is not attached (nor below an attached cgroup): its connections would stay TCP; \
             run `smc-ctl attach --cgroup {}` first",
            cg.display(),
            cg.display()
        ),
    }
    let procs = cg.join("cgroup.procs");
    // Writing 0 moves the writing process (the whole of it: smc-ctl has one thread here).
    if let Err(e) = fs::write(&procs, "0") {
        let hint = match e.raw_os_error() {
            Some(libc::EBUSY) => {
                " (the cgroup has controllers enabled for its children in cgroup.subtree_control: \
                 processes may only live in its leaves; use or create a child cgroup)"
            }
            Some(libc::EOPNOTSUPP) => " (a threaded cgroup or a domain-invalid one)",
            Some(libc::ENOENT) | Some(libc::ENODEV) => " (the cgroup was removed)",
            _ => "",
        };
        return Err(anyhow!("cannot move into {}: {e}{hint}", cg.display()));
    }
    Ok(cg)
}

pub fn exec(cmd: &[OsString], cgroup: Option<&Path>) -> Result<()> {
    let lib = preload_lib()?;
    if let Some(dir) = cgroup {
        join_cgroup(dir)?;
    }
    let mut preload = OsString::from(lib.as_os_str());
    if let Some(old) = env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(OsStr::new(":"));
        preload.push(old);
    }
    let (prog, args) = cmd
        .split_first()
        .ok_or_else(|| anyhow!("no command given"))?;
    let err = Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .exec();
    Err(anyhow!("cannot execute {}: {err}", prog.to_string_lossy()))
}
