//! Daemon counters, as returned by [`Client::stats`](crate::Client::stats).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Requests, successes and failures of one operation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpStats {
    /// Requests received.
    pub requests: u64,
    /// Requests that succeeded.
    pub ok: u64,
    /// Requests that failed (the reason is counted in [`FailureStats`]).
    pub failed: u64,
    /// Nanoseconds the daemon spent handling them, from the decoded record to the reply's
    /// encoding, the socket I/O excluded: REGISTER and ATTACH (the connection-setup ops),
    /// DETACH and UNREGISTER sent alone; 0 for the other ops.
    pub nanos: u64,
}

/// Per-operation counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OpsStats {
    /// `QUERY_GID`.
    pub query_gid: OpStats,
    /// `REGISTER`.
    pub register: OpStats,
    /// `ATTACH` (by token) and `ADOPT`.
    pub attach: OpStats,
    /// `ATTACH_PEER` (by connection). A failure is mostly by design: the data path's server asks
    /// right after its CLC accept, and when its client had not registered yet it attaches by
    /// token after the confirm (counted under `attach`).
    pub attach_peer: OpStats,
    /// `DETACH`.
    pub detach: OpStats,
    /// `UNREGISTER`.
    pub unregister: OpStats,
    /// `STATS`.
    pub stats: OpStats,
    /// `WAIT`.
    pub wait: OpStats,
    /// `LIST`.
    pub list: OpStats,
    /// `PAIR`: `requests` records, `ok` connection ends served (two per connection: each end's
    /// reply, with its own DMB and the peer's), `nanos` the time of the pairings.
    pub pair: OpStats,
    /// Records that could not be attributed to an op (malformed, oversized, bad version,
    /// unknown op).
    pub invalid: OpStats,
}

/// Failure counters, one per reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FailureStats {
    /// No free slot (decline MAX_DMB).
    pub max_dmb: u64,
    /// Cgroup DMB count quota (decline MAX_DMB).
    pub quota_dmbs: u64,
    /// Per-uid DMB count limit (decline MAX_DMB; `QuotaDmbs` with detail 2).
    pub uid_dmbs: u64,
    /// Cgroup byte quota (decline MEM).
    pub quota_bytes: u64,
    /// Device-wide byte limit (decline MEM).
    pub total_bytes: u64,
    /// MemAvailable below the configured floor (decline MEM).
    pub mem_pressure: u64,
    /// memfd_create/ftruncate/seal failed (decline MEM).
    pub memfd: u64,
    /// Refused at the daemon's descriptor limit (`RLIMIT_NOFILE`, less the descriptors it keeps
    /// free for the sockets requests pass), or the socket a request passed dropped by the
    /// kernel for want of one (decline MEM).
    pub fd_limit: u64,
    /// A reply went without a file the daemon keeps shelved: it could not be opened again (no
    /// descriptor left); its client gave the references back (decline MEM).
    pub reopen: u64,
    /// Size code above the daemon's largest (10).
    pub bad_size: u64,
    /// Missing fd, or not an established TCP socket.
    pub bad_socket: u64,
    /// Unknown or released token.
    pub stale_token: u64,
    /// The socket is not the other end of the owner's connection.
    pub bad_proof: u64,
    /// Attach refused because the owner's peer socket was not in the connection table when
    /// the owner registered (so no socket can prove to be it).
    pub peer_unknown: u64,
    /// Attach refused because `require_same_cgroup` is on and the cgroups differ.
    pub other_cgroup: u64,
    /// Detach/unregister of a reference the client does not hold.
    pub not_held: u64,
    /// Unparseable record.
    pub malformed: u64,
    /// Record above the size limit.
    pub oversized: u64,
    /// Unsupported protocol version.
    pub bad_version: u64,
    /// Unknown op.
    pub unknown_op: u64,
    /// `PAIR` found no peer within its wait.
    pub no_peer: u64,
    /// Reply could not be sent (client gone).
    pub send_failed: u64,
    /// Unexpected errors.
    pub internal: u64,
    /// A reference let go of while its socket was still held elsewhere (handed on) was
    /// released at once because the kept references were at their bound (`max_kept`, or the
    /// releasing uid's `uid_max_kept`): the process that holds the socket now may lose the
    /// connection's shared memory (it falls back or fails cleanly).
    pub kept_full: u64,
}

/// Usage of one cgroup (only cgroups with live DMBs or refusals are listed).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CgroupStats {
    /// The cgroup v2 path (`/proc/PID/cgroup` "0::" line).
    pub path: String,
    /// Live DMBs owned by processes of this cgroup.
    pub dmbs: u64,
    /// Their bytes (nominal sizes).
    pub bytes: u64,
    /// Bytes of them that exist in memory, as last sampled (memfd `st_blocks`; sampled at a
    /// registration or a stats request, at most every `commit_sample_ms`).
    pub committed_bytes: u64,
    /// Registrations refused by this cgroup's quota.
    pub refused: u64,
}

/// Everything the daemon counts. Serialisable for `smc-ctl stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Stats {
    /// Protocol version of the daemon.
    pub protocol_version: u16,
    /// The device GID as 32 hex digits (gid then gid_ext).
    pub gid: String,
    /// Seconds since the daemon started.
    pub uptime_secs: u64,
    /// Bumped whenever a DMB reference is released or a client disconnects.
    pub generation: u64,
    /// Clients connected now.
    pub clients_connected: u64,
    /// Clients accepted since start.
    pub clients_total: u64,
    /// Connections closed at once because `max_clients` were connected.
    pub clients_refused: u64,
    /// Connections closed at once because their uid had `uid_max_clients` connected.
    pub clients_refused_uid: u64,
    /// Clients refused at once because the daemon had no descriptor left for them (its
    /// `RLIMIT_NOFILE`): they see the daemon gone (decline `NOSMCDDEV`) instead of waiting
    /// for a reply that cannot come.
    pub clients_refused_fd_limit: u64,
    /// Live DMBs (registered and not yet freed).
    pub live_dmbs: u64,
    /// Bytes of live DMBs (nominal sizes).
    pub live_bytes: u64,
    /// Bytes of live DMBs that exist in memory (see [`CgroupStats::committed_bytes`]).
    pub committed_bytes: u64,
    /// Live attachments (references beyond the owners').
    pub live_attachments: u64,
    /// Configured maximum number of DMBs (slots).
    pub max_dmbs: u64,
    /// References released because their client's connection closed.
    pub released_on_disconnect: u64,
    /// DMBs bound again to a new connection from their owner's pool (`PAIR`), instead of
    /// registered anew.
    pub dmbs_reused: u64,
    /// DMBs currently pooled (registered, unbound, waiting for reuse).
    pub dmbs_pooled: u64,
    /// Live DMBs whose memfd (and state page) the daemon keeps without a descriptor (shelved
    /// in a mapping of its own, opened again when needed).
    pub dmbs_shelved: u64,
    /// Files (DMB memfds and state pages) kept in holder processes: shelved beyond the
    /// daemon's own mappings (`vm.max_map_count`), see `smc-ism`'s shelves.
    pub files_in_holders: u64,
    /// Holder processes running (`smc-ism-holder`).
    pub holders: u64,
    /// References kept for sockets handed on (their client let go while a process still holds
    /// the socket), see `DaemonConfig::max_kept`.
    pub refs_kept: u64,
    /// Per-op counters.
    pub ops: OpsStats,
    /// Per-reason failure counters.
    pub failures: FailureStats,
    /// Per-cgroup usage (for root callers only: the paths are other tenants' business).
    pub cgroups: Vec<CgroupStats>,
}

impl Stats {
    /// The fields that are gauges (a level that goes up and down); every other numeric figure
    /// is a counter. Shared by the daemon's `/metrics` and `smc-ctl stats`.
    pub const GAUGES: &'static [&'static str] = &[
        "protocol_version",
        "uptime_secs",
        "generation",
        "clients_connected",
        "live_dmbs",
        "live_bytes",
        "live_attachments",
        "max_dmbs",
        "dmbs_shelved",
        "files_in_holders",
        "holders",
        "refs_kept",
    ];

    /// Every numeric figure by its flattened name (`ops_register_ok`, `live_dmbs`: nested field
    /// names joined with `_`), in name order. The per-cgroup list is not included.
    pub fn figures(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        flatten(
            "",
            &serde_json::to_value(self).unwrap_or(Value::Null),
            &mut out,
        );
        out
    }

    /// Whether the figure `name` (of [`Stats::figures`]) is a gauge.
    pub fn is_gauge(name: &str) -> bool {
        Self::GAUGES.contains(&name)
    }
}

/// Numbers of a JSON value by their path (object keys joined with `_`); arrays, strings and
/// booleans are left out.
fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, u64>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}_{k}")
                };
                flatten(&key, x, out);
            }
        }
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                out.insert(prefix.to_string(), u);
            }
        }
        _ => {}
    }
}

/// One live DMB, as listed by [`Client::list_dmbs`](crate::Client::list_dmbs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DmbInfo {
    /// Device slot.
    pub slot: u32,
    /// Size in bytes.
    pub size: u64,
    /// SMC size code.
    pub size_code: u8,
    /// References (owner + attachments).
    pub refs: u32,
    /// The owner has unregistered; alive only through attachments.
    pub unregistered: bool,
    /// Local address of the owner's TCP connection.
    pub owner_local: String,
    /// Peer address of the owner's TCP connection.
    pub owner_peer: String,
    /// The owner's cgroup.
    pub owner_cgroup: String,
    /// The token: only present when the caller is root.
    pub token: Option<u64>,
    /// Inode of the DMB's memfd, as `/proc/<pid>/maps` shows it (so that `smc-ctl conns -d`
    /// finds each end's mappings and reads the CDC cursors): only present when the caller is
    /// root.
    pub inode: Option<u64>,
}

/// One page of the DMB list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DmbList {
    /// DMBs in slot order.
    pub dmbs: Vec<DmbInfo>,
    /// The `start_slot` of the next page, if any.
    pub next: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_flattened() {
        let mut s = Stats::default();
        s.ops.register.ok = 3;
        s.live_dmbs = 1;
        s.gid = "x".into();
        let f = s.figures();
        assert_eq!(f["ops_register_ok"], 3);
        assert_eq!(f["live_dmbs"], 1);
        assert!(!f.contains_key("gid"));
        assert!(!f.contains_key("cgroups"));
        assert!(Stats::is_gauge("live_dmbs") && !Stats::is_gauge("ops_register_ok"));
        let mut m = BTreeMap::new();
        flatten("", &serde_json::json!({"a": {"b": 2}, "c": [1]}), &mut m);
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            vec![("a_b".to_string(), 2)]
        );
    }
}
