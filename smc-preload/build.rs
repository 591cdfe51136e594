//! Compiles `src/interpose_variadic.c` (`dprintf`, `vdprintf` and their fortified forms:
//! variadic, not definable in stable Rust) into a static library linked into the crate. Only
//! with the `interpose` feature (the exported libc symbols). Uses the system C compiler
//! (`$CC`, else `cc`) and `$AR` (else `ar`): no build dependency.

use std::path::{Path, PathBuf};
use std::process::Command;

const SRC: &str = "src/interpose_variadic.c";
const LIB: &str = "smc_preload_variadic";

fn run(cmd: &mut Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    let status = cmd.status().map_err(|e| {
        format!("cannot run {what}: {e} (a C compiler is needed: apt-get install gcc)")
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed: {status}"))
    }
}

fn tool(var: &str, default: &str) -> String {
    let target = std::env::var("TARGET").unwrap_or_default();
    [
        format!("{var}_{}", target.replace('-', "_")),
        format!("TARGET_{var}"),
        var.to_string(),
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
    .unwrap_or_else(|| default.to_string())
}

fn main() -> Result<(), String> {
    println!("cargo:rerun-if-changed={SRC}");
    println!("cargo:rerun-if-changed=build.rs");
    for v in ["CC", "AR", "TARGET_CC", "TARGET_AR"] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    if std::env::var_os("CARGO_FEATURE_INTERPOSE").is_none() {
        return Ok(());
    }
    let out = PathBuf::from(std::env::var("OUT_DIR").map_err(|e| format!("OUT_DIR: {e}"))?);
    let obj = out.join("interpose_variadic.o");
    let lib = out.join(format!("lib{LIB}.a"));
    let mut cc = Command::new(tool("CC", "cc"));
    cc.args(["-std=gnu11", "-O2", "-fPIC", "-Wall", "-Wextra", "-c"])
        .arg(Path::new(SRC))
        .arg("-o")
        .arg(&obj);
    run(&mut cc)?;
    // `ar` appends to an existing archive: start afresh.
    let _ = std::fs::remove_file(&lib);
    run(Command::new(tool("AR", "ar"))
        .arg("crs")
        .arg(&lib)
        .arg(&obj))?;
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=static={LIB}");
    Ok(())
}
