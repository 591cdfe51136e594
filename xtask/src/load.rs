//! The command lines of the load tools that `demo` and `bench` both run (sockperf, iperf3),
//! one definition each, against a server on 127.0.0.1:`port`. Their output parsers are in
//! `bench::parsers`.

fn argv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

/// `sockperf sr`: the server of both sockperf tests.
pub(crate) fn sockperf_server(port: u16) -> Vec<String> {
    argv(&[
        "sockperf",
        "sr",
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
    ])
}

/// A sockperf client of `test` (`pp`, `tp`): `size`-byte messages for `secs` seconds.
fn sockperf_client(test: &str, port: u16, size: u32, secs: u32, more: &[&str]) -> Vec<String> {
    let mut a = argv(&[
        "sockperf",
        test,
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-m",
        &size.to_string(),
        "-t",
        &secs.to_string(),
    ]);
    a.extend(argv(more));
    a
}

/// `sockperf pp`: ping-pong of 14-byte messages for `secs` seconds (p50 and p99 latency).
pub(crate) fn sockperf_ping_pong(port: u16, secs: u32) -> Vec<String> {
    // sockperf sizes its sequence table from the message rate; at the shared-memory path's
    // sub-µs round trips the default overflows (`_seqN > m_maxSequenceNo`).
    sockperf_client("pp", port, 14, secs, &["--mps=5000000"])
}

/// `sockperf tp`: one-way throughput of `size`-byte messages for `secs` seconds.
pub(crate) fn sockperf_throughput(port: u16, size: u32, secs: u32) -> Vec<String> {
    sockperf_client("tp", port, size, secs, &[])
}

/// `iperf3 -s`: the iperf3 server.
pub(crate) fn iperf3_server(port: u16) -> Vec<String> {
    argv(&["iperf3", "-s", "-p", &port.to_string()])
}

/// `iperf3 -c`: one stream for `secs` seconds, the report as JSON.
pub(crate) fn iperf3_client(port: u16, secs: u32) -> Vec<String> {
    argv(&[
        "iperf3",
        "-c",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-J",
    ])
}
