//! Parsers of the tools' output (sockperf, iperf3, redis-benchmark, wrk, our helper's JSON line).
use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context as _, Result};
use serde_json::Value;

/// Drops ANSI colour sequences (sockperf prints them).
pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            if it.peek() == Some(&'[') {
                it.next();
                for c in it.by_ref() {
                    if c.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// The number right after `key` (skipping `=`, `:` and blanks).
pub(crate) fn number_after(s: &str, key: &str) -> Option<f64> {
    let i = s.find(key)? + key.len();
    let rest = s[i..].trim_start_matches(|c: char| c == '=' || c == ':' || c.is_whitespace());
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

pub(crate) fn parse_sockperf_pp(out: &str) -> Result<BTreeMap<String, f64>> {
    let s = strip_ansi(out);
    let mut m = BTreeMap::new();
    m.insert(
        "p50_us".into(),
        number_after(&s, "percentile 50.000").ok_or_else(|| anyhow!("no p50"))?,
    );
    m.insert(
        "p99_us".into(),
        number_after(&s, "percentile 99.000").ok_or_else(|| anyhow!("no p99"))?,
    );
    if let Some(avg) = number_after(&s, "Summary: Latency is") {
        m.insert("avg_us".into(), avg);
    }
    // The first is the [Total Run] line (warm-up included, like the namespace's TCP counters).
    if let Some(n) = number_after(&s, "SentMessages") {
        m.insert("sent_messages".into(), n);
    }
    Ok(m)
}

pub(crate) fn parse_sockperf_tp(out: &str) -> Result<BTreeMap<String, f64>> {
    let s = strip_ansi(out);
    let mut m = BTreeMap::new();
    m.insert(
        "mbps".into(),
        number_after(&s, "BandWidth is").ok_or_else(|| anyhow!("no BandWidth"))?,
    );
    if let Some(r) = number_after(&s, "Message Rate is") {
        m.insert("msg_per_sec".into(), r);
    }
    if let Some(n) = number_after(&s, "Total of") {
        m.insert("sent_messages".into(), n);
    }
    Ok(m)
}

pub(crate) fn parse_iperf3(out: &str) -> Result<BTreeMap<String, f64>> {
    let v: Value = serde_json::from_str(out).context("iperf3 -J output")?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        bail!("iperf3: {e}");
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow!("no end.sum_received.bits_per_second"))?;
    let mut m = BTreeMap::new();
    m.insert("gbps".into(), bps / 1e9);
    if let Some(b) = v["end"]["sum_sent"]["bytes"].as_f64() {
        m.insert("bytes".into(), b);
    }
    if let Some(r) = v["end"]["sum_sent"]["retransmits"].as_f64() {
        m.insert("retransmits".into(), r);
    }
    Ok(m)
}

pub(crate) fn parse_redis(out: &str) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    for line in out.lines() {
        let f: Vec<&str> = line
            .split(',')
            .map(|x| x.trim().trim_matches('"'))
            .collect();
        if f.len() < 2 {
            continue;
        }
        let key = match f[0] {
            "GET" => "get_rps",
            "SET" => "set_rps",
            _ => continue,
        };
        m.insert(
            key.to_string(),
            f[1].parse()
                .with_context(|| format!("redis-benchmark: {line}"))?,
        );
    }
    Ok(m)
}

pub(crate) fn parse_wrk(out: &str) -> Result<BTreeMap<String, f64>> {
    let mut m = BTreeMap::new();
    let rps = number_after(out, "Requests/sec:").ok_or_else(|| anyhow!("no Requests/sec"))?;
    m.insert("rps".into(), rps);
    let requests = out
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .and_then(|(n, _)| n.trim().parse::<f64>().ok())
        })
        .unwrap_or(0.0);
    m.insert("requests".into(), requests);
    let non2xx = number_after(out, "Non-2xx or 3xx responses:").unwrap_or(0.0);
    if non2xx > 0.0 {
        bail!("{non2xx} non-2xx responses");
    }
    if let Some(l) = out.lines().find(|l| l.contains("Socket errors:")) {
        let errs: f64 = ["connect", "read", "write", "timeout"]
            .iter()
            .filter_map(|k| number_after(l, k))
            .sum();
        m.insert("socket_errors".into(), errs);
        if errs > requests * 0.01 {
            bail!("wrk: {}", l.trim());
        }
    }
    Ok(m)
}

pub(crate) fn parse_json_line(out: &str) -> Result<BTreeMap<String, f64>> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .ok_or_else(|| anyhow!("no JSON line"))?;
    let v: Value = serde_json::from_str(line)?;
    Ok(v.as_object()
        .ok_or_else(|| anyhow!("not an object"))?
        .iter()
        .filter_map(|(k, v)| v.as_f64().map(|x| (k.clone(), x)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_output() {
        let pp = "sockperf: \x1b[2;35m====> avg-latency=93.640 (std-dev=485.902)\x1b[0m\n\
                  sockperf: Summary: Latency is 93.640 usec\n\
                  sockperf: ---> percentile 99.000 = 2466.027\n\
                  sockperf: ---> percentile 50.000 =   20.320\n";
        let m = parse_sockperf_pp(pp).unwrap();
        assert_eq!(m["p50_us"], 20.32);
        assert_eq!(m["p99_us"], 2466.027);
        let tp = "sockperf: Summary: BandWidth is 469.971 MBps (3759.766 Mbps)\n";
        assert_eq!(parse_sockperf_tp(tp).unwrap()["mbps"], 469.971);
        let redis = "\"test\",\"rps\",\"avg_latency_ms\"\n\"SET\",\"81300.81\",\"0.3\"\n\"GET\",\"90000.00\",\"0.2\"\n";
        let m = parse_redis(redis).unwrap();
        assert_eq!((m["get_rps"], m["set_rps"]), (90000.0, 81300.81));
        let wrk = "Running 1s test @ http://127.0.0.1:1/\n  12345 requests in 1.00s, 3.00MB read\n\
                   Socket errors: connect 0, read 3, write 0, timeout 0\nRequests/sec:  12345.67\n";
        let m = parse_wrk(wrk).unwrap();
        assert_eq!(
            (m["rps"], m["requests"], m["socket_errors"]),
            (12345.67, 12345.0, 3.0)
        );
    }
}
