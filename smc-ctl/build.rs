//! Builds the eBPF programs (`smc-ebpf`) for the BPF target with aya-build.
//!
//! The eBPF crate needs a compiler whose `core` sources are installed (`-Z build-std=core`) and
//! bpf-linker. `cargo xtask setup` installs Debian's rustc-web + rust-web-src, links them as the
//! rustup toolchain `smc-ebpf`, and installs bpf-linker under `/opt/smc-tools/bin`.
use std::env;

use anyhow::{anyhow, Context as _};

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=SMC_EBPF_TOOLCHAIN");
    println!("cargo:rerun-if-env-changed=SMC_TOOLS_DIR");
    let toolchain = env::var("SMC_EBPF_TOOLCHAIN").unwrap_or_else(|_| "smc-ebpf".into());
    let tools = env::var("SMC_TOOLS_DIR").unwrap_or_else(|_| "/opt/smc-tools".into());
    let path = env::var("PATH").unwrap_or_default();
    let bin = format!("{tools}/bin");
    if !std::path::Path::new(&bin).join("bpf-linker").exists() {
        return Err(anyhow!(
            "bpf-linker not found in {bin}: run `cargo xtask setup` first (it installs the eBPF toolchain)"
        ));
    }
    // SAFETY: build scripts are single-threaded here; the variables are read by the nested cargo.
    unsafe {
        env::set_var("PATH", format!("{bin}:{path}"));
        // Debian's compiler is stable; -Z build-std=core needs the unstable flags.
        env::set_var("RUSTC_BOOTSTRAP", "1");
    }
    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    // aya-build watches the eBPF crate's own directory only: the constants the programs take
    // from smc-common (map sizes, layouts) must rebuild them too (a changed `MAX_SOCKETS` was
    // left out of the object).
    for p in &metadata.packages {
        if p.name.as_str() == "smc-common" {
            if let Some(dir) = p.manifest_path.parent() {
                println!("cargo:rerun-if-changed={dir}");
            }
        }
    }
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|p| p.name.as_str() == "smc-ebpf")
        .ok_or_else(|| anyhow!("smc-ebpf package not found"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?
        .as_str()
        .to_owned();
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "smc-ebpf",
            root_dir: &root_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
