//! `smc-ctl run -- CMD`: executes CMD with the interposition library preloaded (like smc_run).
use std::{
    env,
    ffi::{OsStr, OsString},
    os::unix::process::CommandExt as _,
    path::PathBuf,
    process::Command,
};

use anyhow::{anyhow, bail, Result};

/// File name of the interposition library.
pub const PRELOAD_LIB: &str = "libsmc_preload.so";

/// The library next to this binary, or where `SMC_PRELOAD_LIB` says.
pub fn preload_lib() -> Result<PathBuf> {
    if let Some(p) = env::var_os("SMC_PRELOAD_LIB") {
        return Ok(PathBuf::from(p));
    }
    let exe = env::current_exe()?;
    let dir = exe
        .parent()
        .ok_or_else(|| anyhow!("no directory for {}", exe.display()))?;
    for cand in [dir.join(PRELOAD_LIB), dir.join("../lib").join(PRELOAD_LIB)] {
        if cand.exists() {
            return Ok(cand.canonicalize()?);
        }
    }
    bail!(
        "{PRELOAD_LIB} not found next to {} (build it with `cargo xtask build`, or set SMC_PRELOAD_LIB)",
        exe.display()
    )
}

pub fn exec(cmd: &[OsString]) -> Result<()> {
    let lib = preload_lib()?;
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
