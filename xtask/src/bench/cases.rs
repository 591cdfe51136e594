//! The cases: what each runs (server and client command lines per port), what it measures, and
//! how long it may take.
use std::{collections::BTreeMap, ffi::OsString, fs, path::Path, time::Duration};

use super::parsers::{
    parse_iperf3, parse_json_line, parse_redis, parse_sockperf_pp, parse_sockperf_tp, parse_wrk,
};
use crate::load;
use anyhow::Result;

pub(crate) struct Metric {
    pub(crate) key: &'static str,
    pub(crate) label: &'static str,
    pub(crate) unit: &'static str,
    pub(crate) higher_is_better: bool,
}

pub(crate) const fn metric(
    key: &'static str,
    label: &'static str,
    unit: &'static str,
    higher: bool,
) -> Metric {
    Metric {
        key,
        label,
        unit,
        higher_is_better: higher,
    }
}

pub(crate) type Argv = Box<dyn Fn(u16) -> Result<Vec<OsString>>>;
pub(crate) type Parse = fn(&str) -> Result<BTreeMap<String, f64>>;

pub(crate) struct Case {
    pub(crate) id: &'static str,
    pub(crate) title: &'static str,
    pub(crate) metrics: Vec<Metric>,
    /// Output key counting the work done in a run (messages, requests, bytes), to compare the
    /// TCP data segments of runs of different speed; `None`: every run does the same work.
    pub(crate) units: Option<&'static str>,
    /// Server plain, client accelerated (the fallback rows).
    pub(crate) fallback: bool,
    pub(crate) server: Argv,
    pub(crate) client: Argv,
    pub(crate) parse: Parse,
    pub(crate) timeout: Duration,
    /// Environment of the accelerated (`smc-ctl run`) processes of this case.
    pub(crate) smc_env: Vec<(&'static str, &'static str)>,
    /// The short-connection policy is on and the SMC-D column measures what it is for: client
    /// connections it keeps on TCP (`POLICY_SHORT`) count as intended, not as fallbacks.
    pub(crate) policy_tcp: bool,
}

/// Durations and sizes of one bench flavour.
pub(crate) struct Params {
    pub(crate) reps: usize,
    /// Seconds of each time-bound client run.
    pub(crate) secs: u32,
    /// Requests per redis-benchmark test.
    pub(crate) redis_n: u32,
}

/// Everything the runs share. Dropping it stops the daemon, kills every process, removes the
/// cgroups (detaching them first), then the network namespace.
pub(crate) fn os_args(v: &[String]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

pub(crate) fn argv(f: impl Fn(u16) -> Vec<String> + 'static) -> Argv {
    Box::new(move |port| Ok(os_args(&f(port))))
}

pub(crate) fn cases(p: &Params, helper: &Path, tmp: &Path) -> Result<Vec<Case>> {
    let secs = p.secs;
    let timed = Duration::from_secs(u64::from(secs) * 3 + 60);
    let helper = helper.to_string_lossy().into_owned();
    let sockperf_server = || argv(load::sockperf_server);
    let pp_client = move || argv(move |port| load::sockperf_ping_pong(port, secs));
    let h = helper.clone();
    let conn_server = move || {
        let h = h.clone();
        argv(move |port| sv(&[&h, "conn-server", &port.to_string()]))
    };
    let h = helper.clone();
    let conn_client = move || {
        let h = h.clone();
        argv(move |port| sv(&[&h, "conn-client", &port.to_string(), &secs.to_string()]))
    };

    // nginx: its own prefix with a config per port, a 1 KiB file, run as root in the foreground.
    let www = tmp.join("www");
    fs::create_dir_all(&www)?;
    fs::write(www.join("index.html"), "x".repeat(1023) + "\n")?;
    fs::write(www.join("16k.html"), "x".repeat(16 * 1024 - 1) + "\n")?;
    let tmp_s = tmp.to_string_lossy().into_owned();
    let nginx_server = move || -> Argv {
        let dir = tmp_s.clone();
        Box::new(move |port| {
            let conf = format!("{dir}/nginx-{port}.conf");
            fs::write(&conf, nginx_conf(&dir, port))?;
            Ok(os_args(&sv(&[
                "nginx",
                "-p",
                &dir,
                "-e",
                &format!("{dir}/nginx-error.log"),
                "-c",
                &conf,
            ])))
        })
    };
    let wrk_to = move |close: bool, conns: u32, page: &'static str| {
        argv(move |port| {
            let c = conns.to_string();
            let mut a = sv(&["wrk", "-t", "1", "-c", &c, "-d", &format!("{secs}s")]);
            if close {
                a.extend(sv(&["-H", "Connection: close"]));
            }
            a.push(format!("http://127.0.0.1:{port}/{page}"));
            a
        })
    };
    let wrk = move |close: bool| wrk_to(close, 50, "index.html");
    let redis_n = p.redis_n;
    let redis_dir = tmp.to_string_lossy().into_owned();
    let h = helper.clone();
    let h2 = helper.clone();

    // Connection: close, the short-connection policy on (SMC-D column: what the policy keeps on
    // TCP, plus the 16 KiB ones it leaves on SMC-D) and off (every connection SMC-D).
    let mut close_cases = Vec::new();
    for (policy, sfx, what) in [
        (true, "", "policy on"),
        (false, "-smcd", "policy off: all SMC-D"),
    ] {
        for (page, size, kib) in [("index.html", "", "1 KiB"), ("16k.html", "-16k", "16 KiB")] {
            for (conns, csfx) in [(50u32, ""), (1000, "-c1000")] {
                let id: &'static str = format!("nginx-close{sfx}{size}{csfx}").leak();
                let title: &'static str =
                    format!("nginx + wrk Connection: close, {kib}, {conns} conns, {what}").leak();
                close_cases.push(Case {
                    id,
                    title,
                    metrics: vec![
                        metric("rps", "requests", "req/s", true),
                        metric("ebpf_ns_per_unit", "eBPF ns per request", "ns", false),
                    ],
                    units: Some("requests"),
                    fallback: false,
                    server: nginx_server(),
                    client: wrk_to(true, conns, page),
                    parse: parse_wrk,
                    timeout: timed,
                    smc_env: if policy {
                        vec![]
                    } else {
                        vec![("SMC_SHORT_BYTES", "0")]
                    },
                    policy_tcp: policy,
                });
            }
        }
    }
    // The same workload measured plainly and as a fallback row (server plain, client accelerated).
    let pp_case = |id, title, fallback| Case {
        id,
        title,
        metrics: vec![
            metric("p50_us", "p50 latency", "us", false),
            metric("p99_us", "p99 latency", "us", false),
        ],
        units: Some("sent_messages"),
        fallback,
        server: sockperf_server(),
        client: pp_client(),
        parse: parse_sockperf_pp,
        timeout: timed,
        smc_env: vec![],
        policy_tcp: false,
    };
    // Connection setup (our helper's conn-server and conn-client), measured by `metrics`.
    let conn_case = |id, title, metrics| Case {
        id,
        title,
        metrics,
        units: Some("total_connections"),
        fallback: false,
        server: conn_server(),
        client: conn_client(),
        parse: parse_json_line,
        timeout: timed,
        smc_env: vec![],
        policy_tcp: false,
    };
    let mut v = vec![
        pp_case("sockperf-pp", "sockperf ping-pong 14 B", false),
        Case {
            id: "sockperf-tp",
            title: "sockperf throughput 64000 B",
            metrics: vec![metric("mbps", "bandwidth", "MB/s", true)],
            units: Some("sent_messages"),
            fallback: false,
            server: sockperf_server(),
            client: argv(move |port| load::sockperf_throughput(port, 64000, secs)),
            parse: parse_sockperf_tp,
            timeout: timed,
            smc_env: vec![],
            policy_tcp: false,
        },
        Case {
            id: "iperf3",
            title: "iperf3 single stream",
            metrics: vec![metric("gbps", "bitrate", "Gbit/s", true)],
            units: Some("bytes"),
            fallback: false,
            server: argv(load::iperf3_server),
            client: argv(move |port| load::iperf3_client(port, secs)),
            parse: parse_iperf3,
            timeout: timed,
            smc_env: vec![],
            policy_tcp: false,
        },
        Case {
            id: "redis",
            title: "redis-benchmark -d 1024 -c 50",
            metrics: vec![
                metric("get_rps", "GET", "req/s", true),
                metric("set_rps", "SET", "req/s", true),
            ],
            units: None,
            fallback: false,
            server: argv(move |port| {
                sv(&[
                    "redis-server",
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                    "--daemonize",
                    "no",
                    "--dir",
                    &redis_dir,
                    "--dbfilename",
                    &format!("bench-{port}.rdb"),
                ])
            }),
            client: argv(move |port| {
                sv(&[
                    "redis-benchmark",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "-t",
                    "set,get",
                    "-d",
                    "1024",
                    "-c",
                    "50",
                    "-n",
                    &redis_n.to_string(),
                    "--csv",
                ])
            }),
            parse: parse_redis,
            timeout: Duration::from_secs(if redis_n > 100_000 { 600 } else { 120 }),
            smc_env: vec![],
            policy_tcp: false,
        },
        Case {
            id: "nginx-keepalive",
            title: "nginx + wrk keep-alive, 1 KiB",
            metrics: vec![metric("rps", "requests", "req/s", true)],
            units: Some("requests"),
            fallback: false,
            server: nginx_server(),
            client: wrk(false),
            parse: parse_wrk,
            timeout: timed,
            smc_env: vec![],
            policy_tcp: false,
        },
        Case {
            id: "msgrate",
            title: "message rate 100 B ping-pong (ipc-bench style)",
            metrics: vec![
                metric("msg_per_sec", "messages", "msg/s", true),
                metric("p50_us", "p50 round trip", "us", false),
            ],
            units: Some("total_messages"),
            fallback: false,
            server: argv(move |port| sv(&[&h, "msg-server", &port.to_string(), "100"])),
            client: argv(move |port| {
                sv(&[
                    &h2,
                    "msg-client",
                    &port.to_string(),
                    "100",
                    &secs.to_string(),
                ])
            }),
            parse: parse_json_line,
            timeout: timed,
            smc_env: vec![],
            policy_tcp: false,
        },
        Case {
            smc_env: vec![("SMC_SHORT_BYTES", "0")],
            ..conn_case(
                "connrate",
                "connection setup, policy off: all SMC-D (connect, 1 B each way, close)",
                vec![
                    metric("conn_per_sec", "connections", "conn/s", true),
                    metric("p50_us", "p50 connect to first byte", "us", false),
                    metric("p99_us", "p99 connect to first byte", "us", false),
                    metric("connect_p50_us", "p50 connect() alone", "us", false),
                    metric("connect_p99_us", "p99 connect() alone", "us", false),
                    metric("daemon_register_us", "daemon REGISTER, mean", "us", false),
                    metric("daemon_attach_us", "daemon ATTACH, mean", "us", false),
                    metric("daemon_pair_us", "daemon PAIR, mean", "us", false),
                    metric("ebpf_ns_per_unit", "eBPF ns per connection", "ns", false),
                ],
            )
        },
        Case {
            policy_tcp: true,
            ..conn_case(
                "connrate-policy",
                "connection setup, policy on: stays TCP in an attached cgroup",
                vec![
                    metric("conn_per_sec", "connections", "conn/s", true),
                    metric("p50_us", "p50 connect to first byte", "us", false),
                    metric("p99_us", "p99 connect to first byte", "us", false),
                    metric("ebpf_ns_per_unit", "eBPF ns per connection", "ns", false),
                    metric(
                        "ebpf_runs_per_unit",
                        "eBPF runs per connection",
                        "runs",
                        false,
                    ),
                ],
            )
        },
        pp_case("fallback-pp", "fallback: sockperf ping-pong 14 B", true),
        Case {
            fallback: true,
            ..conn_case(
                "fallback-conn",
                "fallback: connection setup",
                vec![
                    metric("conn_per_sec", "connections", "conn/s", true),
                    metric("p50_us", "p50 setup latency", "us", false),
                    metric("ebpf_ns_per_unit", "eBPF ns per connection", "ns", false),
                ],
            )
        },
        proc_case(&helper, secs, timed, false),
        proc_case(&helper, secs, timed, true),
    ];
    v.extend(close_cases);
    v.extend(scale_cases(&helper));
    v.extend(scale_idle_cases(&helper));
    Ok(v)
}

/// One connection per process (issue 13): `smc-bench-helper proc-client` runs `one PORT` (exec,
/// connect, 1 B each way, close, exit) one process after the other against `conn-server`, as a
/// CGI program, a health check or a shell loop of `curl` does: every connection is a fresh
/// process's first (the library loaded, its daemon connection and statistics file made, no
/// pooled DMB), which the short-connection policy cannot keep on TCP (it learns per process).
/// `fallback`: the server without the library (the SMC-D column then measures what loading the
/// library costs a process whose connection stays TCP).
fn proc_case(helper: &str, secs: u32, timeout: Duration, fallback: bool) -> Case {
    let (h1, h2) = (helper.to_owned(), helper.to_owned());
    Case {
        id: if fallback {
            "fallback-proc"
        } else {
            "proc-conn"
        },
        title: if fallback {
            "fallback: one connection per process"
        } else {
            "one connection per process (exec, connect, 1 B each way, exit)"
        },
        metrics: vec![
            metric("proc_per_sec", "processes", "proc/s", true),
            metric("p50_us", "p50 connect to first byte", "us", false),
            metric("connect_p50_us", "p50 connect() alone", "us", false),
            metric("proc_p50_us", "p50 process, spawn to exit", "us", false),
        ],
        units: Some("total_connections"),
        fallback,
        server: argv(move |port| sv(&[&h1, "conn-server", &port.to_string()])),
        client: argv(move |port| sv(&[&h2, "proc-client", &port.to_string(), &secs.to_string()])),
        parse: parse_json_line,
        timeout,
        smc_env: vec![],
        policy_tcp: false,
    }
}

/// Many concurrent connections (issue 14): `smc-scale` (tests/src/bin/smc-scale.rs, built next
/// to `smc-bench-helper`), one epoll server and one epoll client of N connections, each pinging
/// 64 B once a second for 3 rounds: connections on SMC-D, setup rate, p50 and p99 ping, memory
/// per connection (RSS and PSS of client, server and daemon together, divided by N),
/// descriptors.
/// N = 1000 and 10 000; 65 536 with `SMC_BENCH_SCALE_65K=1`, any others with
/// `SMC_BENCH_SCALE_N=20000,40000`. Beyond 16 000 connections both programs spread them over
/// processes (the hard `RLIMIT_NOFILE` of 20 000 here); 65 536 need `vm.max_map_count` raised
/// for the daemon's shelved files (docs/OPERATIONS.md).
fn scale_cases(helper: &str) -> Vec<Case> {
    let bin = Path::new(helper)
        .with_file_name("smc-scale")
        .to_string_lossy()
        .into_owned();
    let mut ns = vec![1000u32, 10_000];
    if std::env::var_os("SMC_BENCH_SCALE_65K").is_some_and(|v| v == "1") {
        ns.push(65_536);
    }
    // `SMC_BENCH_SCALE_N=20000,40000`: more sizes (case ids `scale-20k`, `scale-40k`).
    if let Ok(more) = std::env::var("SMC_BENCH_SCALE_N") {
        ns.extend(more.split(',').filter_map(|v| v.trim().parse::<u32>().ok()));
        ns.sort_unstable();
        ns.dedup();
    }
    ns.into_iter()
        .map(|n| {
            let (b1, b2) = (bin.clone(), bin.clone());
            // Beyond what one process holds (a hard RLIMIT_NOFILE of 20 000 here) the server
            // runs several workers on one listener (on 0.0.0.0: the client then spreads its
            // connections over 127.0.0.x for ephemeral ports) and the client forks its own.
            let workers = if n > 16_000 { n.div_ceil(16_000) } else { 1 };
            let k = if n >= 65_536 {
                "65k".to_string()
            } else {
                format!("{}k", n / 1000)
            };
            Case {
                id: format!("scale-{k}").leak(),
                title: format!("{n} concurrent connections pinging 64 B once a second").leak(),
                metrics: vec![
                    metric("smcd_conns", "connections on SMC-D", "conns", true),
                    metric("setup_per_sec", "setup rate", "conn/s", true),
                    metric("p50_us", "p50 ping", "us", false),
                    metric("p99_us", "p99 ping", "us", false),
                    metric(
                        "rss_bytes_per_conn",
                        "RSS per connection (all 3)",
                        "B",
                        false,
                    ),
                    metric(
                        "pss_bytes_per_conn",
                        "PSS per connection (all 3)",
                        "B",
                        false,
                    ),
                    metric("resets", "connections reset", "conns", false),
                    metric("client_cpu_ms", "client CPU in the rounds", "ms", false),
                ],
                units: None,
                fallback: false,
                server: argv(move |port| {
                    if workers > 1 {
                        sv(&[&b1, "server", &port.to_string(), &workers.to_string()])
                    } else {
                        sv(&[&b1, "server", &port.to_string()])
                    }
                }),
                client: argv(move |port| {
                    sv(&[&b2, "client", &port.to_string(), &n.to_string(), "3"])
                }),
                parse: parse_json_line,
                timeout: Duration::from_secs(120 + u64::from(n) / 100),
                smc_env: vec![],
                policy_tcp: false,
            }
        })
        .collect()
}

/// What an epoll wait costs with many idle connections in the set (issue 14): `smc-scale` with
/// N connections in one epoll set on each side, of which one pings 64 B every millisecond for
/// 2000 rounds while the others stay idle: p50 and p99 of that ping, and the CPU time of both
/// programs in those 2 s (each wait of theirs pays for the idle entries if it scans them), and
/// the memory per idle connection. N = 10, 1000, 4000 (4000 connections hold 16 000 descriptors
/// in the daemon, a DMB and a state page per end: within a hard `RLIMIT_NOFILE` of 20 000).
fn scale_idle_cases(helper: &str) -> Vec<Case> {
    let bin = Path::new(helper)
        .with_file_name("smc-scale")
        .to_string_lossy()
        .into_owned();
    [10u32, 1000, 4000]
        .into_iter()
        .map(|n| {
            let (b1, b2) = (bin.clone(), bin.clone());
            let k = if n >= 1000 {
                format!("{}k", n / 1000)
            } else {
                n.to_string()
            };
            Case {
                id: format!("scale-idle-{k}").leak(),
                title: format!("{n} connections in one epoll set, one pinging 64 B every ms")
                    .leak(),
                metrics: vec![
                    metric("smcd_conns", "connections on SMC-D", "conns", true),
                    metric("p50_us", "p50 ping", "us", false),
                    metric("p99_us", "p99 ping", "us", false),
                    metric("client_cpu_ms", "client CPU in the 2 s", "ms", false),
                    metric("server_cpu_ms", "server CPU in the 2 s", "ms", false),
                    metric(
                        "pss_bytes_per_conn",
                        "PSS per connection (all 3)",
                        "B",
                        false,
                    ),
                    metric(
                        "rss_bytes_per_conn",
                        "RSS per connection (all 3)",
                        "B",
                        false,
                    ),
                ],
                units: None,
                fallback: false,
                server: argv(move |port| sv(&[&b1, "server", &port.to_string()])),
                client: argv(move |port| {
                    sv(&[
                        &b2,
                        "client",
                        &port.to_string(),
                        &n.to_string(),
                        "2000",
                        "1",
                        "1",
                    ])
                }),
                parse: parse_json_line,
                timeout: Duration::from_secs(120 + u64::from(n) / 100),
                smc_env: vec![],
                policy_tcp: false,
            }
        })
        .collect()
}

pub(crate) fn sv(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

pub(crate) fn nginx_conf(dir: &str, port: u16) -> String {
    format!(
        "user root;\n\
         worker_processes 1;\n\
         env LD_PRELOAD;\n\
         env SMC_CTL_SOCK;\n\
         env SMC_PROCS_DIR;\n\
         env SMC_STATS_KEEP;\n\
         daemon off;\n\
         master_process on;\n\
         pid {dir}/nginx-{port}.pid;\n\
         error_log {dir}/nginx-error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{\n\
         \x20   access_log off;\n\
         \x20   default_type text/html;\n\
         \x20   sendfile on;\n\
         \x20   keepalive_requests 10000000;\n\
         \x20   keepalive_timeout 60s;\n\
         \x20   client_body_temp_path {dir}/nginx-body;\n\
         \x20   proxy_temp_path {dir}/nginx-proxy;\n\
         \x20   fastcgi_temp_path {dir}/nginx-fastcgi;\n\
         \x20   uwsgi_temp_path {dir}/nginx-uwsgi;\n\
         \x20   scgi_temp_path {dir}/nginx-scgi;\n\
         \x20   server {{\n\
         \x20       listen 127.0.0.1:{port};\n\
         \x20       root {dir}/www;\n\
         \x20   }}\n\
         }}\n"
    )
}
