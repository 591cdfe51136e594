//! `smc-ctl stats [show|reset|json]`: the figures of `smcd stats`, fed by the real counters.
//!
//! Sources:
//! - the data path's per-process files ([`smc_stats`], `$SMC_PROCS_DIR` or
//!   `/run/smc/procs`): SMC-D connections, fallbacks and their decline codes, handshake errors,
//!   bytes, requests, buffer-full events, special calls. Files of processes that are gone are
//!   folded into the per-cgroup aggregate `exited-<cgroup id>` (under the directory's lock), so
//!   that exited processes keep counting;
//! - the eBPF per-CPU counters (host-wide): same-host pairs, the sk_msg shortcut;
//! - the loopback-ism daemon's counters, when it answers;
//! - the live connections of the attached cgroups ([`crate::conns`]): SMC-D, shortcut and
//!   same-host TCP now, with why.
//!
//! `reset` stores the current absolute figures as a baseline (`/run/smc/stats.baseline.json`),
//! per scope (host and every cgroup); `show` and `json` then print the difference, `-a` the
//! absolute figures. Live figures (gauges) are never differences.
//!
//! Modules: [`collect`] (the inputs of one run, from [`crate::procs`], the eBPF maps, the daemon
//! and [`crate::conns`]), [`raw`] (cumulative counters of a scope), [`baseline`] (what `reset`
//! stores), [`model`] (every figure as JSON), [`text`] (`show`), [`prometheus`](mod@prometheus) (the metrics
//! hook).
use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, ValueEnum};
use smc_stats as procstats;

mod baseline;
mod collect;
mod model;
mod prometheus;
mod raw;
#[cfg(test)]
mod tests;
mod text;

use self::baseline::{load_baseline, save_baseline};
use self::collect::{cgroup_key, gather, now_unix, raw_of, scope_of, Scope};
use self::model::figures;
use self::text::print_text;
pub use prometheus::{cgroup_families, prometheus, render as render_metrics, Labels};

/// Default baseline file of `reset`.
pub const DEFAULT_BASELINE: &str = "/run/smc/stats.baseline.json";

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Action {
    /// Print the figures (since the last `reset`, or absolute with `-a`).
    #[default]
    Show,
    /// Store the current figures as the baseline of `show` and `json`.
    Reset,
    /// Print every figure as JSON (stable snake_case keys, see the README).
    Json,
}

#[derive(Args, Clone, Debug)]
pub struct StatsArgs {
    /// show (default), reset or json.
    #[arg(value_enum)]
    pub action: Option<Action>,
    /// Details: client/server splits, every fallback reason, the special calls one by one,
    /// the eBPF counters and the daemon's operations.
    #[arg(short = 'd', long)]
    pub details: bool,
    /// Absolute figures, ignoring the baseline of `reset`.
    #[arg(short = 'a', long)]
    pub absolute: bool,
    /// Only the processes and connections of this cgroup (and its descendants).
    #[arg(long)]
    pub cgroup: Option<PathBuf>,
    /// The loopback-ism daemon's socket.
    #[arg(long, default_value_os_t = smc_ism::default_socket_path())]
    pub socket: PathBuf,
    /// The data path's per-process statistics directory.
    #[arg(long, default_value_os_t = procstats::default_dir())]
    pub procs_dir: PathBuf,
    /// Baseline file of `reset`.
    #[arg(long, default_value = DEFAULT_BASELINE)]
    pub baseline: PathBuf,
    /// Same as the `json` action.
    #[arg(long)]
    pub json: bool,
}

// ---------------------------------------------------------------------------------------------
// entry points

/// `smc-ctl stats`.
pub fn run(a: StatsArgs) -> Result<()> {
    crate::sys::require_root()?;
    let action = if a.json {
        Action::Json
    } else {
        a.action.unwrap_or_default()
    };
    let scope = scope_of(a.cgroup.as_deref())?;
    let inp = gather(&a, &scope, true);
    for w in &inp.scan.warnings {
        eprintln!("warning: {w}");
    }
    let procs_dir = a.procs_dir.display().to_string();
    match action {
        Action::Reset => {
            let mut b = load_baseline(&a.baseline)
                .filter(|b| b.procs_dir == procs_dir)
                .unwrap_or_default();
            b.version = 1;
            b.procs_dir = procs_dir;
            let t = now_unix();
            b.created_unix = t;
            if scope.ids.is_none() {
                // Host-wide reset: the host and every cgroup seen.
                b.scopes.clear();
                b.scopes.insert("host".into(), (t, raw_of(&inp, &scope)));
                for cg in inp.scan.per_cgroup.keys() {
                    let s = Scope {
                        key: cgroup_key(*cg),
                        cgroup: None,
                        ids: Some([*cg].into()),
                    };
                    b.scopes.insert(s.key.clone(), (t, raw_of(&inp, &s)));
                }
            } else {
                // Each cgroup of the scope (its figures may be summed in other scopes too).
                for cg in scope.ids.iter().flatten() {
                    let s = Scope {
                        key: cgroup_key(*cg),
                        cgroup: None,
                        ids: Some([*cg].into()),
                    };
                    b.scopes.insert(s.key.clone(), (t, raw_of(&inp, &s)));
                }
            }
            save_baseline(&a.baseline, &b)?;
            println!(
                "statistics reset ({}); `smc-ctl stats -a` shows the absolute figures",
                scope
                    .cgroup
                    .as_ref()
                    .map(|p| format!("cgroup {}", p.display()))
                    .unwrap_or_else(|| "host and every cgroup".into())
            );
        }
        Action::Show | Action::Json => {
            let b = load_baseline(&a.baseline).filter(|b| b.procs_dir == procs_dir);
            let f = figures(&a, &inp, &scope, b.as_ref());
            if action == Action::Json {
                println!("{}", serde_json::to_string_pretty(&f)?);
            } else {
                print_text(&f, a.details);
            }
        }
    }
    Ok(())
}
