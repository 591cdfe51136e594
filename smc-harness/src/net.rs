//! Network namespaces and TCP listeners.
use std::{
    fs,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::{proc::Proc, signals::check_interrupted};

/// `ip ARGS` (iproute2); fails with its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run ip (iproute2)")?;
    if !out.status.success() {
        bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A named network namespace (`ip netns add`) with `lo` up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Adds it (one of that name that was left behind is deleted first).
    pub fn new(name: &str) -> Result<Netns> {
        let _ = ip(&["netns", "del", name]);
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_owned(),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// A TCP port of 127.0.0.1 that the kernel gave a moment ago (bound to port 0, then released),
/// for a server that must be told its port: never a fixed one, which other users of the machine
/// or packaged services may hold.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("bind 127.0.0.1:0")?
        .port())
}

/// Whether a TCP socket listens on `port` in the network namespace whose `/proc/…/net` is
/// `net` (`/proc/net`: ours; `/proc/<pid>/net`: that process's). Read from `tcp` and `tcp6`:
/// no connection is made (a probe would take the one accept of servers such as `iperf3 -1`, and
/// be counted by the data path).
pub fn tcp_listening(net: &Path, port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        fs::read_to_string(net.join(f)).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().collect();
                c.len() > 3 && c[1].ends_with(&want) && c[3] == "0A"
            })
        })
    })
}

/// Waits (bounded, and ended by an interrupt) until something listens on `port` in `net` (see
/// [`tcp_listening`]); fails at once when `server` exits first.
pub fn wait_listening(
    server: &mut Proc,
    net: &Path,
    port: u16,
    timeout: Duration,
    what: &str,
) -> Result<()> {
    let t = Instant::now();
    loop {
        check_interrupted()?;
        if tcp_listening(net, port) {
            return Ok(());
        }
        if let Ok(Some(st)) = server.0.try_wait() {
            bail!("{what} exited ({st}) before listening on port {port}");
        }
        if t.elapsed() > timeout {
            bail!("{what} does not listen on port {port} after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sees_a_listener_not_a_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // A connected socket's port: held by us and not listening (no other process can take
        // it while we hold it, so this does not depend on what else runs on the host).
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let client_port = c.local_addr().unwrap().port();
        let net = Path::new("/proc/self/net");
        assert!(tcp_listening(net, port));
        assert!(!tcp_listening(net, client_port));
    }
}
