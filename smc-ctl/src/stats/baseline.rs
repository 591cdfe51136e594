//! The baseline of `reset` (`/run/smc/stats.baseline.json`): stored per scope, summed for a
//! set of cgroups.
use std::{collections::BTreeMap, fs, path::Path};

use anyhow::{Context as _, Result};
use serde::{Deserialize, Serialize};

use super::collect::{cgroup_key, Scope};
use super::raw::Raw;

#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Baseline {
    pub(crate) version: u32,
    pub(crate) created_unix: u64,
    pub(crate) procs_dir: String,
    /// `host`, `cgroup:<id>`.
    pub(crate) scopes: BTreeMap<String, (u64, Raw)>,
}

pub(crate) fn load_baseline(path: &Path) -> Option<Baseline> {
    let b: Baseline = serde_json::from_slice(&fs::read(path).ok()?).ok()?;
    (b.version == 1).then_some(b)
}

pub(crate) fn save_baseline(path: &Path, b: &Baseline) -> Result<()> {
    if let Some(d) = path.parent() {
        fs::create_dir_all(d).with_context(|| format!("mkdir {}", d.display()))?;
    }
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, serde_json::to_vec_pretty(b)?)
        .with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

/// The baseline of a scope: the host's, or the sum of the scope's cgroups' (a cgroup without
/// an entry had nothing at the reset); `None` when nothing of the scope was reset.
pub(crate) fn scope_base(b: &Baseline, scope: &Scope) -> Option<(u64, Raw)> {
    let Some(ids) = &scope.ids else {
        return b.scopes.get("host").cloned();
    };
    let mut out: Option<(u64, Raw)> = None;
    for id in ids {
        if let Some((t, r)) = b.scopes.get(&cgroup_key(*id)) {
            let e = out.get_or_insert_with(|| (*t, Raw::default()));
            e.0 = e.0.min(*t);
            e.1.add_procs(r);
        }
    }
    // The daemon's figures (host-wide) count from the host's reset.
    if let (Some((_, r)), Some((_, h))) = (out.as_mut(), b.scopes.get("host")) {
        r.daemon = h.daemon.clone();
        r.daemon_started = h.daemon_started;
    }
    out
}
