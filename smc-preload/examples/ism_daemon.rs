//! A loopback-ism daemon for development: `ism_daemon SOCKET STATE_DIR`.
fn main() {
    let mut a = std::env::args().skip(1);
    let sock = a.next().unwrap_or_else(|| "/tmp/smc-dev/ctl.sock".into());
    let state = a.next().unwrap_or_else(|| "/tmp/smc-dev/state".into());
    let cfg = smc_ism::DaemonConfig::with_paths(sock, state);
    if let Err(e) = smc_ism::run_blocking(cfg) {
        eprintln!("ism_daemon: {e}");
        std::process::exit(1);
    }
}
