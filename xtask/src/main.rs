//! Build, test, demo and bench orchestration: `cargo xtask <command>`.
//!
//! - `setup`: installs what a fresh Debian 12 machine lacks (idempotent, says what it does).
//! - `build`: builds smc-ctl (with the eBPF programs) and the interposition library.
//! - `dist`: the release tarball (`packaging/dist.sh`).
//! - `lint`: `cargo fmt --check`, clippy on the workspace, and clippy on `smc-ebpf` for the BPF
//!   target.
//! - `test`: the lint checks, unit tests, the integration tests (root), bounded fuzzing.
//! - `demo`: the accelerated path against plain TCP, with the counters.
//! - `bench`: the side-by-side benchmarks.
//! - `soak`: the long full-duplex soak of the data path (100 GiB, 1024 connections, mixed APIs).
//!
//! Modules: this file (setup, build, dist, lint, test), `demo`, `bench` (with its own
//! modules), `soak`, `load` (the load tools' command lines, shared by demo and bench).
//! Cgroups, attachments, the daemon and processes are guards of the `smc-harness` crate,
//! shared with the integration tests.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod bench;
mod demo;
mod load;
mod soak;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the eBPF toolchain and the test tools (idempotent).
    Setup,
    /// Build smc-ctl (with the eBPF programs) and the interposition library, release mode.
    Build,
    /// The release tarball (target/dist/smc-rs-VERSION-ARCH-linux.tar.gz): smc-ctl, the
    /// library, the systemd units, man pages, shell completions, the Kubernetes manifests and
    /// install.sh (packaging/dist.sh).
    Dist,
    /// Format and lint checks, including clippy on the eBPF crate for the BPF target.
    Lint,
    /// Checks, unit tests, integration tests and bounded fuzzing.
    Test {
        /// Seconds of fuzzing per fuzz target.
        #[arg(long, default_value_t = 10)]
        fuzz_seconds: u32,
        /// Skip the fuzzers (development).
        #[arg(long)]
        no_fuzz: bool,
        /// Only integration tests whose name contains this.
        filter: Option<String>,
    },
    /// The demo: same-host transfers through the accelerated path and through plain TCP.
    Demo,
    /// Benchmarks: plain TCP vs shortcut vs shared memory, side by side.
    Bench {
        /// A short run for development.
        #[arg(long)]
        quick: bool,
    },
    /// The long soak of the data path: full duplex, mixed APIs, every byte verified.
    Soak {
        /// Connections in all.
        #[arg(long, default_value_t = 1024)]
        conns: u64,
        /// Connections at a time.
        #[arg(long, default_value_t = 4)]
        par: u64,
        /// Bytes each way per connection (suffixes k, m, g): 1024 x 50 MiB x 2 = 100 GiB.
        #[arg(long, default_value = "50m")]
        bytes: String,
        /// The socket APIs to mix (see tests/src/bin/smc-soak.rs).
        #[arg(long, default_value = "rw,vec,sr,msg,poll,epoll1")]
        modes: String,
        /// Stream seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

/// Where bpf-linker is installed.
pub const TOOLS_DIR: &str = "/opt/smc-tools";
/// Debian packages: the eBPF toolchain, then what the tests, demo and benchmarks run.
const APT_PACKAGES: &[&str] = &[
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    // clippy of the same compiler: lints smc-ebpf for bpfel-unknown-none.
    "rust-web-clippy",
    "llvm-22-dev",
    "libclang-dev",
    // The C compiler and headers: smc-preload/build.rs compiles its dprintf/vdprintf shim
    // (src/interpose_variadic.c); the Rust linker driver is `cc` too.
    "gcc",
    "libc6-dev",
    "bpftool",
    "iproute2",
    "curl",
    "python3",
    "tshark",
    "nftables",
    "sockperf",
    "iperf3",
    "redis-server",
    "redis-tools",
    "nginx",
    "wrk",
    // The real-program matrix (tests/tests/matrix_smc.rs).
    "nodejs",
    "postgresql",
    "memcached",
    "libmemcached-tools",
    "socat",
    "golang-go",
    "haproxy",
    // Python's WSGI and ASGI servers, for Debian's python3.
    "gunicorn",
    "python3-uvicorn",
    "python3-uvloop",
    // systemd-analyze: the tests verify the packaged units offline.
    "systemd",
    // The Kubernetes API models: the tests validate the manifests offline.
    "python3-kubernetes",
    // GNU time: the peak memory of `smc-ctl` under planted statistics files.
    "time",
    // CPython's own test suite (socket, ssl, asyncio): a differential test against TCP with
    // tests nobody here wrote (tests/tests/apps_smc.rs).
    "libpython3.11-testsuite",
    // The JDK (javac, java) and its socket machinery: tests/redteam/rt27_java.java.
    "default-jdk-headless",
    // Ruby's socket and thread machinery: tests/redteam/rt27_ruby.rb.
    "ruby",
    // Tornado's and Twisted's test suites: the same, with two networking frameworks.
    "python3-tornado",
    "python3-twisted",
    // OpenSSH's server: re-exec, privilege separation and a seccomp sandbox per connection.
    "openssh-server",
    // Apache httpd (event and prefork MPMs) for the real-program matrix.
    "apache2",
];

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Setup => setup(),
        Cmd::Build => {
            setup()?;
            build()
        }
        Cmd::Dist => {
            setup()?;
            build()?;
            dist()
        }
        Cmd::Lint => {
            setup()?;
            lint()
        }
        Cmd::Test {
            fuzz_seconds,
            no_fuzz,
            filter,
        } => {
            setup()?;
            test(if no_fuzz { 0 } else { fuzz_seconds }, filter)
        }
        Cmd::Demo => {
            setup()?;
            build()?;
            demo::run(&workspace_root())
        }
        Cmd::Bench { quick } => {
            setup()?;
            build()?;
            bench::run(&workspace_root(), quick)
        }
        Cmd::Soak {
            conns,
            par,
            bytes,
            modes,
            seed,
        } => {
            setup()?;
            build()?;
            step("building smc-soak");
            run(cargo().args([
                "build",
                "--release",
                "-p",
                "integration-tests",
                "--bin",
                "smc-soak",
            ]))?;
            soak::run(
                &workspace_root(),
                &soak::Opts {
                    conns,
                    par,
                    bytes,
                    modes,
                    seed,
                },
            )
        }
    }
}

/// The release binaries `cargo xtask build` produced.
pub struct Bins {
    pub smc_ctl: PathBuf,
    pub preload: PathBuf,
}

impl Bins {
    pub fn new(root: &Path) -> Result<Bins> {
        let dir = env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"))
            .join("release");
        let b = Bins {
            smc_ctl: dir.join("smc-ctl"),
            preload: dir.join("libsmc_preload.so"),
        };
        for p in [&b.smc_ctl, &b.preload] {
            if !p.exists() {
                bail!("{} missing: run `cargo xtask build`", p.display());
            }
        }
        Ok(b)
    }
}

/// Prefix of every cgroup (and the bench's network namespace) xtask creates:
/// `smc-xtask-<pid>-<role>`; what a killed run left behind is found by it.
pub const CGROUP_PREFIX: &str = "smc-xtask-";

/// The cgroup `smc-xtask-<pid>-<role>` (removed on drop).
pub fn cgroup(role: &str) -> Result<smc_harness::Cgroup> {
    smc_harness::Cgroup::new(&format!("{CGROUP_PREFIX}{}-{role}", std::process::id()))
}

/// The loopback-ism daemon in `/run/smc/<name>-<pid>` (removed on drop), its stderr ours.
pub fn daemon(bins: &Bins, name: &str) -> Result<smc_harness::Daemon> {
    let dir = PathBuf::from(format!("/run/smc/{name}-{}", std::process::id()));
    let dir = smc_harness::ScratchDir::new(dir)?;
    smc_harness::Daemon::start_scratch::<&str>(&bins.smc_ctl, dir, &[], None)
}

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

fn step(msg: &str) {
    eprintln!("==> {msg}");
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("spawn {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed: {status}");
    }
    Ok(())
}

fn dpkg_installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn setup() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !dpkg_installed(p))
        .collect();
    if !missing.is_empty() {
        if !is_root() {
            bail!("missing Debian packages {missing:?}; run `sudo cargo xtask setup`");
        }
        step(&format!(
            "installing Debian packages (about a minute): {}",
            missing.join(" ")
        ));
        run(Command::new("apt-get").args(["update", "-qq"]))?;
        run(Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"))?;
        // The packaged services must not hold the ports the tests use.
        for svc in ["nginx", "redis-server", "haproxy", "ssh", "apache2"] {
            let _ = Command::new("systemctl").args(["stop", svc]).status();
            let _ = Command::new("service").args([svc, "stop"]).status();
        }
    }
    let linked = Command::new("rustup")
        .args(["run", "smc-ebpf", "rustc", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !linked {
        step("linking Debian's rustc-web 1.96 as the rustup toolchain `smc-ebpf` (builds the eBPF programs)");
        run(Command::new("rustup").args(["toolchain", "link", "smc-ebpf", "/usr"]))?;
    }
    if workspace_root().join("smc-common/fuzz").exists() {
        let have_fuzz = Command::new("cargo")
            .args(["+nightly", "fuzz", "--version"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !have_fuzz {
            step("installing cargo-fuzz (coverage-guided fuzzing of the protocol decoders)");
            run(Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]))?;
        }
    }
    let linker = Path::new(TOOLS_DIR).join("bin/bpf-linker");
    if !linker.exists() {
        step(&format!(
            "building bpf-linker 0.13.0 against LLVM 22 into {TOOLS_DIR} (about 3 minutes)"
        ));
        run(Command::new("cargo")
            .args([
                "install",
                "bpf-linker@0.13.0",
                "--locked",
                "--no-default-features",
                "--features",
                "llvm-22",
                "--root",
                TOOLS_DIR,
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"))?;
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn build() -> Result<()> {
    step("building smc-ctl (eBPF programs included) and libsmc_preload.so");
    run(cargo().args(["build", "--release", "-p", "smc-ctl", "-p", "smc-preload"]))
}

/// packaging/dist.sh over the release binaries, into target/dist.
fn dist() -> Result<()> {
    let root = workspace_root();
    step("packaging the release tarball (packaging/dist.sh)");
    run(Command::new("sh")
        .arg(root.join("packaging/dist.sh"))
        .arg(root.join("target/release"))
        .arg(root.join("target/dist"))
        .arg(env!("CARGO_PKG_VERSION")))
}

/// Every crate but smc-ebpf, which only builds for the BPF target (through smc-ctl's build
/// script): the default members and the integration tests.
const WHOLE_WORKSPACE: [&str; 3] = ["--workspace", "--exclude", "smc-ebpf"];

fn lint() -> Result<()> {
    step("cargo fmt --check");
    run(cargo().args(["fmt", "--all", "--check"]))?;
    step("cargo clippy --workspace --exclude smc-ebpf --all-targets -- -D warnings");
    run(cargo().arg("clippy").args(WHOLE_WORKSPACE).args([
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    clippy_ebpf()
}

/// Clippy on smc-ebpf for the BPF target, with the toolchain and flags smc-ctl's build script
/// (aya-build) compiles it with: Debian's rustc-web as the rustup toolchain `smc-ebpf`, its
/// `core` sources (`-Z build-std=core`, allowed on a stable compiler by `RUSTC_BOOTSTRAP`), and
/// the `bpf_target_arch` cfg aya-ebpf selects its bindings by. A check build: no bpf-linker.
fn clippy_ebpf() -> Result<()> {
    let target = if cfg!(target_endian = "big") {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    };
    step(&format!(
        "cargo clippy -p smc-ebpf --target {target} (toolchain smc-ebpf) -- -D warnings"
    ));
    let target_dir = workspace_root().join("target/ebpf-clippy");
    let mut c = Command::new("rustup");
    c.current_dir(workspace_root())
        .args([
            "run",
            "smc-ebpf",
            "cargo",
            "clippy",
            "--package",
            "smc-ebpf",
        ])
        .args(["--bins", "--release", "--target", target])
        .args(["-Z", "build-std=core", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-D", "warnings"])
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{}\"", env::consts::ARCH),
        );
    // The outer cargo's toolchain must not leak into the nested one (as aya-build does).
    for key in [
        "CARGO",
        "RUSTC",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTUP_TOOLCHAIN",
    ] {
        c.env_remove(key);
    }
    run(&mut c)
}

fn test(fuzz_seconds: u32, filter: Option<String>) -> Result<()> {
    if !is_root() {
        bail!("the integration tests load eBPF programs and create cgroups: run them as root");
    }
    lint()?;
    step("building the binaries the integration tests drive");
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "smc-ctl",
        "-p",
        "smc-preload",
        "-p",
        "integration-tests",
        "--bins",
        // libsmc_preload.so is smc-preload's (cdylib) library target: `--bins` alone skips it.
        "--lib",
    ]))?;
    step("unit and integration tests");
    let mut t = cargo();
    t.args(["test", "--release"]).args(WHOLE_WORKSPACE);
    // Tests that skip themselves without root (so that a plain `cargo test` works as any user)
    // must run here.
    t.env("SMC_TESTS_NEED_ROOT", "1");
    // The hostile peer scribbles on shared memory for a minute (a direct `cargo test` run: 10 s).
    t.env("SMC_HOSTILE_SECS", "60");
    if let Some(f) = &filter {
        t.args(["--", f.as_str()]);
    }
    run(&mut t)?;
    if fuzz_seconds > 0 {
        let script = workspace_root().join("smc-common/fuzz/run.sh");
        if script.exists() {
            step(&format!("fuzzing every target for {fuzz_seconds}s"));
            run(Command::new("bash")
                .arg(script)
                .arg(fuzz_seconds.to_string()))?;
        }
    }
    step("all tests passed");
    Ok(())
}
