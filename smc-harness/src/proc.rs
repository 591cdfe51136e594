//! Child processes and their logs.
use std::{
    fs,
    io::Read as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::signals::check_interrupted;

/// A child process, killed and reaped on drop: the child itself, or its whole process group
/// when it was started with [`Proc::spawn_group`] (servers that fork workers). `.0` is the
/// [`Child`].
pub struct Proc(pub Child, Kill);

/// What a [`Proc`] kills: its name (for messages) and whether it leads its own process group.
pub struct Kill {
    name: String,
    group: bool,
}

impl Proc {
    /// A child started elsewhere, from now on killed on drop.
    pub fn new(name: &str, child: Child) -> Proc {
        Proc(
            child,
            Kill {
                name: name.to_owned(),
                group: false,
            },
        )
    }

    /// Spawns `cmd` with the standard streams it was given.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Proc> {
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        Ok(Proc::new(name, child))
    }

    /// Spawns `cmd` as the leader of a new process group: on drop the whole group is killed
    /// (and a terminal's Ctrl-C reaches the parent only, which cleans up in order).
    pub fn spawn_group(name: &str, cmd: &mut Command) -> Result<Proc> {
        cmd.process_group(0);
        let mut p = Proc::spawn(name, cmd)?;
        p.1.group = true;
        Ok(p)
    }

    /// The name it was started with.
    pub fn name(&self) -> &str {
        &self.1.name
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// Still running?
    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }

    /// Waits (bounded, and ended by an interrupt) for the exit; the status must be success.
    pub fn wait_success(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            check_interrupted()?;
            if let Some(st) = self.0.try_wait()? {
                if !st.success() {
                    bail!("{} exited with {st}", self.1.name);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{} did not finish within {timeout:?}", self.1.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits (bounded) for the exit and returns what it wrote to its (piped) stdout; fails when
    /// the status is not success.
    pub fn wait_output(mut self, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.0.try_wait()? {
                let mut s = String::new();
                if let Some(mut o) = self.0.stdout.take() {
                    o.read_to_string(&mut s)?;
                }
                if !status.success() {
                    return Err(anyhow!("process failed: {status}; stdout: {s}"));
                }
                return Ok(s);
            }
            if Instant::now() > deadline {
                bail!("process did not finish within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads one line of its (piped) stdout, without the newline (e.g. "listening on PORT");
    /// empty at the end of the stream or without a piped stdout.
    pub fn read_line(&mut self) -> String {
        let mut line = Vec::new();
        if let Some(out) = self.0.stdout.as_mut() {
            let mut b = [0u8; 1];
            while out.read(&mut b).map(|n| n == 1).unwrap_or(false) && b[0] != b'\n' {
                line.push(b[0]);
            }
        }
        String::from_utf8_lossy(&line).into_owned()
    }

    /// The port of `READY <port>`, the first line the test servers print on their (piped)
    /// stdout once they listen.
    pub fn read_ready_port(&mut self) -> Result<u16> {
        let line = self.read_line();
        line.strip_prefix("READY ")
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| anyhow!("{} said {line:?} instead of READY <port>", self.1.name))
    }

    /// Kills it (its group, see [`Proc::spawn_group`]) and reaps it.
    pub fn kill(&mut self) {
        if self.1.group && self.alive() {
            // SAFETY: plain syscall; the group is the child's own (process_group(0)), and the
            // child is not reaped yet, so its pid (the group id) is not reused.
            unsafe {
                libc::kill(-(self.0.id() as i32), libc::SIGKILL);
            }
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Gives `cmd` stdin from /dev/null and appends its stdout and stderr to `log` (a server whose
/// output nobody reads must not block on a full pipe).
pub fn log_to(cmd: &mut Command, log: &Path) -> Result<()> {
    let f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("open {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(f.try_clone().context("dup log fd")?)
        .stderr(f);
    Ok(())
}

/// The last `n` lines of a file (none when it cannot be read).
pub fn last_lines(path: &Path, n: usize) -> Vec<String> {
    let t = fs::read(path).unwrap_or_default();
    let t = String::from_utf8_lossy(&t);
    let lines: Vec<&str> = t.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| l.to_string())
        .collect()
}

/// The last 30 lines of a log file under a header line, for failure messages.
pub fn log_tail(path: &Path) -> String {
    format!(
        "\n--- last lines of {} ---\n{}",
        path.display(),
        last_lines(path, 30).join("\n")
    )
}

/// A directory, made empty on creation and removed with its contents on drop.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(path: PathBuf) -> Result<ScratchDir> {
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_and_tail() {
        let d = ScratchDir::new(
            std::env::temp_dir().join(format!("smc-harness-unit-{}", std::process::id())),
        )
        .unwrap();
        let f = d.0.join("log");
        fs::write(&f, (1..=40).map(|i| format!("l{i}\n")).collect::<String>()).unwrap();
        assert_eq!(last_lines(&f, 2), ["l39", "l40"]);
        let t = log_tail(&f);
        assert!(
            t.contains("l11\n") && t.ends_with("l40") && !t.contains("l10\n"),
            "{t}"
        );
        assert!(last_lines(&d.0.join("none"), 3).is_empty());
        let p = d.0.clone();
        drop(d);
        assert!(!p.exists());
    }

    #[test]
    fn group_killed_on_drop_and_output() {
        let mut c = Command::new("sh");
        c.args(["-c", "sleep 100 & echo $!; wait"])
            .stdout(Stdio::piped());
        let mut p = Proc::spawn_group("sh", &mut c).unwrap();
        let grandchild: i32 = p.read_line().trim().parse().unwrap();
        drop(p);
        // Gone, or a zombie waiting for whoever reaps orphans here.
        let gone = || {
            fs::read_to_string(format!("/proc/{grandchild}/stat")).map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            })
        };
        let t = Instant::now();
        while !gone() && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gone(), "the group's other process survived");

        let mut c = Command::new("echo");
        c.arg("READY 4242\nother").stdout(Stdio::piped());
        let mut p = Proc::spawn("echo", &mut c).unwrap();
        assert_eq!(p.read_ready_port().unwrap(), 4242);
        let e = p.read_ready_port().unwrap_err();
        assert!(e.to_string().contains("echo said \"other\""), "{e}");

        let mut c = Command::new("echo");
        c.arg("hi").stdout(Stdio::piped());
        let p = Proc::spawn("echo", &mut c).unwrap();
        assert_eq!(p.wait_output(Duration::from_secs(10)).unwrap(), "hi\n");
        let mut c = Command::new("false");
        let mut p = Proc::spawn("false", &mut c).unwrap();
        let e = p.wait_success(Duration::from_secs(10)).unwrap_err();
        assert!(e.to_string().contains("false exited"), "{e}");
    }
}
