//! `smc-ctl`: the control binary of the SMC accelerator.
//!
//! Modules, data sources first, then commands:
//! - sources: [`sys`] (host: root, cgroup v2 directories, /proc, the raw `bpf` syscall),
//!   [`probe`] (what the kernel offers), [`bpf`] (the pinned eBPF programs, maps and links),
//!   [`procs`] (the data path's per-process statistics files); the daemon is reached through
//!   `smc_ism::Client`, `/proc/net` and the socket maps by [`conns`];
//! - commands: attach/detach/status/trace ([`bpf`]), probe ([`probe`]), [`daemon`], [`agent`]
//!   (Kubernetes), [`run`](mod@run), [`stats`], [`conns`]; completions and man pages here.
use std::path::PathBuf;

use anyhow::Result;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};
use smc_common::bpf::Mode;

mod agent;
mod bpf;
mod conns;
mod daemon;
mod probe;
mod procs;
mod run;
mod stats;
mod sys;

#[derive(Parser)]
#[command(
    name = "smc-ctl",
    version,
    about = "Transparent SMC-D style shared-memory acceleration of same-host TCP"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// What the kernel's sockmap redirection cannot do like TCP, found by the differential
/// conformance suite (`tests/tests/conformance.rs`, column `shortcut`): said at every attach.
const SHORTCUT_WARNING: &str = "\
warning: --mode shortcut is EXPERIMENTAL. The kernel's sk_msg redirection (sockmap) does not
behave like TCP for these calls, so programs that rely on them can misbehave or lose data:
  - splice() into a full connection fails with ENOMEM and can stall (a pipe's bytes stay
    unsent); a full socket makes write()/send() fail with ENOMEM instead of EAGAIN, and epoll
    does not report EPOLLOUT when room comes back;
  - blocking recv() returns EAGAIN (not EINTR, not restarted) when a signal arrives, and
    reports one spurious EAGAIN at the peer's FIN; MSG_WAITALL returns short reads;
    MSG_TRUNC with a NULL buffer fails with EFAULT; MSG_OOB data arrives differently;
    SO_SNDTIMEO and SO_RCVLOWAT are ignored;
  - close() with unread data and shutdown(SHUT_WR) do not reset or stop the peer as TCP does
    (writes after SHUT_WR still succeed); a write from an invalid buffer returns 0, not EFAULT;
  - no receive-buffer bound like TCP's for a peer that does not read.
Use --mode ism (the default) with `smc-ctl run` for a data path that matches TCP.";

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    /// EXPERIMENTAL: the sk_msg kernel shortcut for every same-host connection of the cgroup,
    /// without the library; differs from TCP in several calls (attach prints which).
    Shortcut,
    /// The shared-memory data path (`smc-ctl run`); the shortcut carries only its control traffic.
    Ism,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Shortcut => Mode::Shortcut,
            ModeArg::Ism => Mode::Ism,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Subcommand)]
enum Cmd {
    /// Enable a cgroup v2 directory (a container): load the programs if needed and attach them.
    Attach {
        #[command(flatten)]
        target: sys::Target,
        #[arg(long, value_enum, default_value = "ism")]
        mode: ModeArg,
        /// Whether the cgroup's connections that cannot become SMC-D (not both ends announced
        /// SMC) are recorded at ESTABLISHED. `off`, the default in ism mode, saves most of what
        /// the programs cost such a connection (2.2-2.4 -> 0.6-0.7 us measured); `conns` then
        /// finds their same-host peers in the TCP tables (no eBPF flags) and `same_host_pairs`
        /// counts only pairs that both announced SMC. `on` records them in the eBPF maps as
        /// well. `--mode ism` only (shortcut mode tracks every socket). On an attached cgroup:
        /// changes the setting for new connections (not given: keeps it).
        #[arg(long, value_enum, value_name = "on|off")]
        tcp_records: Option<OnOff>,
    },
    /// Disable a cgroup; the last detach unloads everything.
    Detach {
        /// A cgroup v2 directory.
        #[arg(long, value_name = "DIR", required_unless_present_any = ["all", "pid", "container_id"])]
        cgroup: Option<PathBuf>,
        /// The cgroup of this process (`self`: smc-ctl's own).
        #[arg(long, value_name = "PID|self", conflicts_with_all = ["cgroup", "container_id"])]
        pid: Option<String>,
        /// The cgroup of this container.
        #[arg(long, value_name = "ID", conflicts_with = "cgroup")]
        container_id: Option<String>,
        /// Every attached cgroup (also those removed while attached).
        #[arg(long, conflicts_with_all = ["cgroup", "pid", "container_id"])]
        all: bool,
    },
    /// Whether this kernel has the eBPF program types, maps, helpers and links smc-rs needs
    /// (`attach` checks the same before loading anything).
    Probe {
        #[arg(long)]
        json: bool,
    },
    /// Enabled cgroups, program ids, modes and counters.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// The loopback-ism device: allocates, shares and frees DMBs for the data path.
    Daemon(daemon::DaemonArgs),
    /// Kubernetes node agent: enables the pods selected by label or annotation as the kubelet
    /// creates their cgroups, forgets removed ones, serves per-pod metrics.
    Agent(agent::AgentArgs),
    /// Connection and fallback figures like `smcd stats`: show, reset, json.
    Stats(stats::StatsArgs),
    /// The TCP connections of the attached cgroups with their mode, like `smcss`.
    Conns {
        /// Details: DMB tokens and sizes, bytes, eBPF flags, where the mode comes from.
        #[arg(short = 'd', long)]
        details: bool,
        #[arg(long)]
        json: bool,
        /// Also listening sockets.
        #[arg(short = 'a', long)]
        all: bool,
        /// Only this cgroup (and its descendants).
        #[arg(long)]
        cgroup: Option<PathBuf>,
        /// The loopback-ism daemon's socket.
        #[arg(long, default_value_os_t = smc_ism::default_socket_path())]
        socket: PathBuf,
        /// The data path's per-process statistics directory.
        #[arg(long, default_value_os_t = smc_stats::default_dir())]
        procs_dir: PathBuf,
    },
    /// Print why connections of the attached cgroups did or did not get the SMC option, and why
    /// they stay TCP: the eBPF programs' decision lines (aya-log), written only while a trace
    /// runs. Stops at SIGINT or SIGTERM. One trace at a time.
    Trace {
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        seconds: Option<u64>,
    },
    /// Print the shell completion script of smc-ctl (install it as the shell expects, e.g.
    /// /usr/share/bash-completion/completions/smc-ctl).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages, smc-ctl.8 and smc-ctl-COMMAND.8, into DIR.
    Man {
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Run CMD with its TCP connections on the accelerated path (LD_PRELOAD interposition).
    Run {
        /// Move into this cgroup v2 directory (which must be attached, or below an attached one)
        /// before executing CMD, so that CMD and its children are enabled.
        #[arg(long, value_name = "DIR")]
        cgroup: Option<PathBuf>,
        /// The command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        cmd: Vec<std::ffi::OsString>,
    },
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    if let Err(e) = run(Cli::parse()) {
        eprintln!("smc-ctl: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Attach {
            target,
            mode,
            tcp_records,
        } => {
            let cfg = tcp_records.map(|r| bpf::AttachConfig {
                tcp_records: matches!(r, OnOff::On),
            });
            println!("{}", bpf::attach(&target.resolve()?, mode.into(), cfg)?);
            if let ModeArg::Shortcut = mode {
                eprintln!("{SHORTCUT_WARNING}");
            }
        }
        Cmd::Detach { all: true, .. } => println!("{}", bpf::detach_all()?),
        Cmd::Detach {
            cgroup,
            pid,
            container_id,
            ..
        } => {
            let t = sys::Target {
                cgroup,
                pid,
                container_id,
            };
            println!("{}", bpf::detach(&t.resolve()?)?)
        }
        Cmd::Daemon(args) => daemon::run(args)?,
        Cmd::Probe { json } => probe::run(json)?,
        Cmd::Agent(args) => agent::run(args)?,
        Cmd::Trace { seconds } => bpf::trace(seconds.map(std::time::Duration::from_secs))?,
        Cmd::Run { cgroup, cmd } => run::exec(&cmd, cgroup.as_deref())?,
        Cmd::Stats(args) => stats::run(args)?,
        Cmd::Completions { shell } => print!("{}", completions(shell)),
        Cmd::Man { dir } => man_pages(&dir)?,
        Cmd::Conns {
            details,
            json,
            all,
            cgroup,
            socket,
            procs_dir,
        } => conns::run(
            &conns::Options {
                socket,
                procs_dir,
                cgroup,
                listening: all,
            },
            details,
            json,
        )?,
        Cmd::Status { json } => {
            let st = bpf::status()?;
            if json {
                println!("{}", serde_json::to_string_pretty(&st)?);
            } else {
                print_status(&st);
            }
        }
    }
    Ok(())
}

/// The completion script of `shell`.
fn completions(shell: clap_complete::Shell) -> String {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "smc-ctl", &mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    // clap_complete's bash script spells the state of a subcommand of a hyphenated binary in
    // two ways (`smc__ctl__subcmd__X` in the loop, `smc__subcmd__ctl__subcmd__X` in the case
    // arms), so no option of a command ever completes (clap-rs/clap#6421): use one spelling.
    match shell {
        clap_complete::Shell::Bash => text.replace("smc__subcmd__ctl", "smc__ctl"),
        _ => text,
    }
}

/// The man pages (section 8: system administration) of smc-ctl and of each command.
fn man_pages(dir: &std::path::Path) -> Result<()> {
    use anyhow::Context as _;
    std::fs::create_dir_all(dir).with_context(|| format!("mkdir {}", dir.display()))?;
    let mut cmd = Cli::command();
    cmd.build();
    let mut pages = vec![("smc-ctl".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let name = format!("smc-ctl-{}", sub.get_name());
        pages.push((name, sub.clone()));
    }
    let n = pages.len();
    for (name, page) in pages {
        let path = dir.join(format!("{name}.8"));
        let mut out = Vec::new();
        clap_mangen::Man::new(page)
            .section("8")
            .render(&mut out)
            .with_context(|| format!("render {name}"))?;
        std::fs::write(&path, out).with_context(|| format!("write {}", path.display()))?;
    }
    println!("{n} man pages written to {}", dir.display());
    Ok(())
}

fn print_status(st: &bpf::Status) {
    if !st.loaded {
        println!("not loaded (no cgroup attached)");
        return;
    }
    println!("programs (pinned under {}):", st.pin_root);
    for (name, id) in &st.programs {
        println!("  {name:<24} id {id}");
    }
    println!("cgroups:");
    for cg in &st.cgroups {
        let note = if cg.mode == "shortcut" {
            "  (experimental: differs from TCP, see `smc-ctl attach --help`)"
        } else {
            ""
        };
        let records = match cg.tcp_records {
            Some(false) => ", tcp records off",
            _ => "",
        };
        println!("  {}  mode {}{records}{note}", cg.cgroup, cg.mode);
    }
    println!("counters:");
    for (name, v) in &st.counters {
        println!("  {name:<28} {v}");
    }
}
