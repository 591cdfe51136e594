//! `smc-ctl stats show`: the figures as text.

use serde_json::Value;

use super::collect::now_unix;

/// `1234567` → `1.2M` (binary units, like smc-tools' abbreviations).
pub(crate) fn abbrev(v: u64) -> String {
    const U: [&str; 6] = ["", "K", "M", "G", "T", "P"];
    let mut x = v as f64;
    let mut i = 0;
    while x >= 1024.0 && i < U.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v}")
    } else if x < 10.0 {
        format!("{x:.2}{}", U[i])
    } else if x < 100.0 {
        format!("{x:.1}{}", U[i])
    } else {
        format!("{x:.0}{}", U[i])
    }
}

pub(crate) fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

pub(crate) fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64 * 100.0
    }
}

pub(crate) fn hist_row(label: &str, h: &Value) -> String {
    let Some(m) = h.as_object() else {
        return format!(
            "  {label:<5}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}  (not recorded)",
            "-", "-", "-", "-", "-", "-", "-", "-"
        );
    };
    let g = |k: &str| m.get(k).and_then(Value::as_u64).unwrap_or(0);
    // smc-tools' columns: ≤8K … 512K, and >512K (1024K and above together).
    let cols = [
        g("8k"),
        g("16k"),
        g("32k"),
        g("64k"),
        g("128k"),
        g("256k"),
        g("512k"),
        g("1024k") + g("gt_1024k"),
    ];
    let mut s = format!("  {label:<5}");
    for c in cols {
        s.push_str(&format!("  {:>6}", abbrev(c)));
    }
    s
}

pub(crate) fn print_reasons(list: &Value, max: usize) {
    for r in list.as_array().into_iter().flatten().take(max) {
        println!(
            "     {:<23}{:>12}",
            r["name"].as_str().unwrap_or("?"),
            n(&r["count"])
        );
    }
}

pub(crate) fn print_text(f: &Value, details: bool) {
    let c = &f["connections"];
    let l = &f["live"];
    let title = match f["cgroup"].as_str() {
        Some(cg) => format!("SMC-D Connections Summary (cgroup {cg})"),
        None => "SMC-D Connections Summary".to_string(),
    };
    println!("{title}");
    println!("  Total connections handled  {:>12}", n(&c["total"]));
    if details {
        println!(
            "  SMC-D connections          {:>12} (client {}, server {})",
            n(&c["smcd"]),
            n(&c["smcd_client"]),
            n(&c["smcd_server"])
        );
    } else {
        println!("  SMC-D connections          {:>12}", n(&c["smcd"]));
    }
    println!("    open now                 {:>12}", n(&c["smcd_open"]));
    println!(
        "  Handshake errors           {:>12}",
        n(&c["handshake_errors"])
    );
    println!(
        "  Avg requests per SMC conn  {:>14.1}",
        c["avg_requests_per_conn"].as_f64().unwrap_or(0.0)
    );
    if details {
        println!(
            "  TCP fallback               {:>12} (client {}, server {})",
            n(&c["tcp_fallback"]),
            n(&c["tcp_fallback_client"]),
            n(&c["tcp_fallback_server"])
        );
    } else {
        println!("  TCP fallback               {:>12}", n(&c["tcp_fallback"]));
    }
    let max = if details { usize::MAX } else { 3 };
    if details && !c["fallback_reasons_server"].is_null() {
        if c["fallback_reasons_server"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            println!("    Server");
            print_reasons(&c["fallback_reasons_server"], max);
        }
        if c["fallback_reasons_client"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
        {
            println!("    Client");
            print_reasons(&c["fallback_reasons_client"], max);
        }
    } else {
        print_reasons(&c["fallback_reasons"], max);
    }
    match c["shortcut_sockets"].as_u64() {
        Some(s) => {
            println!("  Shortcut (sk_msg) sockets  {s:>12}");
            if details {
                println!(
                    "    messages redirected      {:>12}",
                    n(&c["shortcut_messages"])
                );
                println!(
                    "    bytes redirected         {:>12}",
                    n(&c["shortcut_bytes"])
                );
            }
        }
        None => println!("  Shortcut (sk_msg) sockets  {:>12}", "n/a"),
    }
    match c["same_host_pairs"].as_u64() {
        Some(p) => {
            println!("  Same-host connections      {p:>12}");
            println!(
                "    not on SMC-D             {:>12}",
                n(&c["same_host_not_smcd"])
            );
        }
        None => println!("  Same-host connections      {:>12}", "n/a"),
    }
    println!(
        "  Live now                   {:>12} (SMC-D {}, shortcut {}, TCP {}, same-host TCP {})",
        n(&l["connections"]),
        n(&l["smcd"]),
        n(&l["shortcut"]),
        n(&l["tcp"]),
        n(&l["same_host_tcp"])
    );
    if let Some(m) = l["same_host_tcp_reasons"].as_object() {
        let mut v: Vec<(&String, u64)> = m.iter().map(|(k, x)| (k, n(x))).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (k, x) in v.into_iter().take(max) {
            println!("     {k:<23}{x:>12}");
        }
    }
    println!();
    for (dir, title) in [("rx", "RX Stats"), ("tx", "TX Stats")] {
        let d = &f[dir];
        println!("{title}");
        let bytes = n(&d["bytes"]);
        println!(
            "  Data transmitted (Bytes) {:>14} ({})",
            bytes,
            abbrev(bytes)
        );
        let reqs = n(&d["requests"]);
        println!("  Total requests             {reqs:>12}");
        if dir == "rx" {
            let full = n(&d["buffer_full"]);
            println!(
                "  Buffer full                {full:>12} ({:.2}%)",
                pct(full, reqs)
            );
        } else {
            let full = n(&d["buffer_full_remote"]);
            println!(
                "  Buffer full (remote)       {full:>12} ({:.2}%)",
                pct(full, reqs)
            );
        }
        println!("            8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB");
        println!("{}", hist_row("Bufs", &d["ring_hist"]));
        println!("{}", hist_row("Reqs", &d["req_hist"]));
        println!();
    }
    let e = &f["extras"];
    println!("Extras");
    println!(
        "  Special socket calls       {:>12}",
        n(&e["special_calls"])
    );
    if details {
        let na = |v: &Value| match v.as_u64() {
            Some(x) => format!("{x:>12}"),
            None => format!("{:>12}", "n/a"),
        };
        println!("    sendfile                 {:>12}", n(&e["sendfile"]));
        println!("    splice                   {:>12}", n(&e["splice"]));
        println!("    urgent data              {:>12}", n(&e["urgent_data"]));
        println!("    MSG_PEEK                 {}", na(&e["peek"]));
        println!("    fork                     {}", na(&e["fork"]));
        println!("    exec                     {}", na(&e["exec"]));
        println!(
            "  Doorbells sent / received  {:>12} / {}",
            n(&e["doorbells_sent"]),
            n(&e["doorbells_received"])
        );
    }
    println!();
    let d = &f["daemon"];
    println!("Daemon (loopback-ism)");
    if d["running"].as_bool() != Some(true) {
        println!(
            "  daemon not running ({}: {})",
            d["socket"].as_str().unwrap_or("?"),
            d["error"].as_str().unwrap_or("?")
        );
    } else {
        let g = &d["figures"];
        println!(
            "  GID                        {}",
            d["gid"].as_str().unwrap_or("?")
        );
        println!(
            "  Live DMBs                  {:>12} ({} bytes, {} attachments)",
            n(&g["live_dmbs"]),
            n(&g["live_bytes"]),
            n(&g["live_attachments"])
        );
        println!(
            "  Registrations              {:>12} (failed {})",
            n(&g["ops_register_requests"]),
            n(&g["ops_register_failed"])
        );
        println!(
            "  Attaches by token          {:>12} (failed {})",
            n(&g["ops_attach_requests"]),
            n(&g["ops_attach_failed"])
        );
        println!(
            "  Attaches by connection     {:>12} ({} before the peer registered: then by token)",
            n(&g["ops_attach_peer_requests"]),
            n(&g["ops_attach_peer_failed"])
        );
        println!(
            "  Pairs (ends served)        {:>12} (failed {}, DMBs reused {})",
            n(&g["ops_pair_ok"]),
            n(&g["ops_pair_failed"]),
            n(&g["dmbs_reused"])
        );
        let (fd_limit, reopen) = (n(&g["failures_fd_limit"]), n(&g["failures_reopen"]));
        if fd_limit + reopen > 0 {
            println!(
                "  At its descriptor limit    {fd_limit:>12} refused ({reopen} replies without a \
                 shelved file; declined MEM)"
            );
        }
        let (kept, kept_full) = (n(&g["refs_kept"]), n(&g["failures_kept_full"]));
        if kept + kept_full > 0 {
            println!(
                "  Kept for handed-on sockets {kept:>12} references ({kept_full} released at once \
                 at the bound)"
            );
        }
        println!(
            "  Clients                    {:>12} connected ({} total)",
            n(&g["clients_connected"]),
            n(&g["clients_total"])
        );
        if let Some(cg) = d["cgroup"].as_object() {
            println!(
                "  This cgroup                {:>12} DMBs ({} bytes, {} refused)",
                cg.get("dmbs").map(n).unwrap_or(0),
                cg.get("bytes").map(n).unwrap_or(0),
                cg.get("refused").map(n).unwrap_or(0)
            );
        }
        if details {
            println!("            8KB    16KB    32KB    64KB   128KB   256KB   512KB  >512KB");
            println!("{}", hist_row("Live", &d["live_dmb_hist"]));
            if let Some(m) = g.as_object() {
                for (k, v) in m {
                    if n(v) > 0 && (k.starts_with("failures_") || k.starts_with("ops_")) {
                        println!("    {k:<26} {:>12}", n(v));
                    }
                }
            }
        }
    }
    if details {
        if let Some(m) = f["ebpf"].as_object() {
            println!();
            println!("eBPF counters (host-wide)");
            for (k, v) in m {
                println!("  {k:<27}{:>12}", n(v));
            }
        }
    }
    println!();
    let s = &f["sources"];
    let since = match f["baseline_unix"].as_u64() {
        Some(t) => format!(
            "since reset {}s ago (-a: absolute)",
            now_unix().saturating_sub(t)
        ),
        None => "absolute".to_string(),
    };
    println!(
        "Figures {since}; {} live process file(s), {} exited aggregate(s) in {}; eBPF {}",
        n(&s["live_processes"]),
        n(&s["exited_aggregates"]),
        s["procs_dir"].as_str().unwrap_or("?"),
        if s["ebpf_loaded"].as_bool() == Some(true) {
            "loaded"
        } else {
            "not loaded"
        }
    );
    if n(&s["cgroup_from_proc"]) > 0 {
        println!(
            "note: {} process file(s) do not record their cgroup; it was read from /proc/<pid>/cgroup",
            n(&s["cgroup_from_proc"])
        );
    }
    if f["scope"] == "cgroup" {
        println!(
            "note: eBPF counters (shortcut, same-host pairs) are host-wide: not shown per cgroup"
        );
    }
    println!("note: RX/TX bytes and requests are counted when a connection closes");
}
