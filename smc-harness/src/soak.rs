//! The summary line of `smc-soak` (tests/src/bin/smc-soak.rs), read by the bounded soak test
//! and by `cargo xtask soak`: `SOAK role=.. conns=.. bytes=.. resets=.. ..`, one per end.
use std::collections::BTreeMap;

/// The summary's counters of failures: a soak passed when all of them are 0 on both ends.
pub const SOAK_FAILURES: [&str; 7] = [
    "resets",
    "errors",
    "short",
    "diff_bytes",
    "peek_diff",
    "stalls",
    "lost_wakeups",
];

/// The `key=value` fields of one end's `SOAK` summary line.
#[derive(Debug)]
pub struct SoakSummary(pub BTreeMap<String, String>);

impl SoakSummary {
    /// The summary line in `out` (a program's whole output), if it printed one.
    pub fn find(out: &str) -> Option<SoakSummary> {
        let l = out.lines().find(|l| l.starts_with("SOAK "))?;
        Some(SoakSummary(
            l.split_whitespace()
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ))
    }

    /// The number `key`, if present and a number.
    pub fn get(&self, key: &str) -> Option<u64> {
        self.0.get(key).and_then(|v| v.parse().ok())
    }

    /// The failures counted ([`SOAK_FAILURES`]), a missing or unreadable counter as `u64::MAX`.
    pub fn failures(&self) -> u64 {
        SOAK_FAILURES
            .iter()
            .map(|k| self.get(k).unwrap_or(u64::MAX))
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_summary_line_and_counts_its_failures() {
        let out = "FAIL conn 3: reset\nSOAK role=client conns=4 bytes=800 resets=1 errors=0 \
                   short=0 diff_bytes=0 peek_diff=0 lost_wakeups=2 stalls=0 elapsed=1.0s\n";
        let s = SoakSummary::find(out).unwrap();
        assert_eq!(s.get("conns"), Some(4));
        assert_eq!(s.failures(), 3);
        let partial = SoakSummary::find("SOAK role=server conns=4").unwrap();
        assert_eq!(partial.failures(), u64::MAX);
        assert!(SoakSummary::find("no summary").is_none());
    }
}
