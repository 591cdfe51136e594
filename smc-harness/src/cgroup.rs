//! Cgroup v2 directories, their attachment (`smc-ctl attach`), and programs started in them,
//! under the data path or not.
use std::{
    collections::BTreeMap,
    ffi::OsStr,
    fs,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use crate::cgroup2_root;

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A name unique on this host for this process: `<prefix><pid>x<n>`.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// `smc-ctl ARGS` (stdin from /dev/null), its output whatever its status.
pub fn smc_ctl_output(bin: &Path, args: &[&str]) -> Result<Output> {
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {}", bin.display()))
}

/// `smc-ctl ARGS`: its stdout, or an error with its stderr.
pub fn smc_ctl(bin: &Path, args: &[&str]) -> Result<String> {
    let out = smc_ctl_output(bin, args)?;
    if !out.status.success() {
        bail!(
            "smc-ctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn status_json(bin: &Path) -> Result<serde_json::Value> {
    let out = smc_ctl(bin, &["status", "--json"])?;
    serde_json::from_str(&out).context("smc-ctl status --json")
}

/// The host-wide eBPF counters (`counters` of `smc-ctl status --json`).
pub fn ebpf_counters(bin: &Path) -> Result<BTreeMap<String, u64>> {
    let v = status_json(bin)?;
    let Some(m) = v["counters"].as_object() else {
        bail!("smc-ctl status --json has no counters: {v}");
    };
    Ok(m.iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
        .collect())
}

/// The attached cgroups (`cgroups` of `smc-ctl status --json`); `None` when it cannot be read.
pub fn attached_cgroups(bin: &Path) -> Option<Vec<PathBuf>> {
    let v = status_json(bin).ok()?;
    Some(
        v["cgroups"]
            .as_array()?
            .iter()
            .filter_map(|c| c["cgroup"].as_str().map(PathBuf::from))
            .collect(),
    )
}

/// `smc-ctl attach --cgroup C --mode M` held: `smc-ctl detach` on drop.
pub struct Attachment {
    pub cgroup: PathBuf,
    smc_ctl: PathBuf,
}

impl Attachment {
    /// Attaches `cgroup`; the attachment and what `smc-ctl attach` said on stderr (its warnings).
    pub fn new(smc_ctl: &Path, cgroup: &Path, mode: &str) -> Result<(Attachment, String)> {
        Attachment::new_waiting(smc_ctl, cgroup, mode, Duration::ZERO)
    }

    /// Like [`Attachment::new`], but while the pinned programs belong to another build of
    /// smc-ctl (someone else's cgroup is attached with them, which must never be detached from
    /// here) it tries again every 2 s for up to `timeout`.
    pub fn new_waiting(
        smc_ctl: &Path,
        cgroup: &Path,
        mode: &str,
        timeout: Duration,
    ) -> Result<(Attachment, String)> {
        Attachment::new_with(smc_ctl, cgroup, mode, &[], timeout)
    }

    /// [`Attachment::new_waiting`] with more arguments for `smc-ctl attach`
    /// (`["--tcp-records", "off"]`).
    pub fn new_with(
        smc_ctl: &Path,
        cgroup: &Path,
        mode: &str,
        extra: &[&str],
        timeout: Duration,
    ) -> Result<(Attachment, String)> {
        let cg = cgroup.to_string_lossy();
        let t = Instant::now();
        let mut args = vec!["attach", "--cgroup", &cg, "--mode", mode];
        args.extend_from_slice(extra);
        loop {
            let out = smc_ctl_output(smc_ctl, &args)?;
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            if out.status.success() {
                let a = Attachment {
                    cgroup: cgroup.to_path_buf(),
                    smc_ctl: smc_ctl.to_path_buf(),
                };
                return Ok((a, err));
            }
            if !err.contains("another build") || t.elapsed() >= timeout {
                bail!(
                    "smc-ctl attach --cgroup {cg} --mode {mode} {} failed: {}",
                    extra.join(" "),
                    err.trim()
                );
            }
            eprintln!("smc-ctl attach: another build holds the programs; waiting: {err}");
            std::thread::sleep(Duration::from_secs(2));
            crate::check_interrupted()?;
        }
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let cg = self.cgroup.to_string_lossy();
        if let Err(e) = smc_ctl(&self.smc_ctl, &["detach", "--cgroup", &cg]) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// A cgroup v2 directory this process made. On drop: every process in it is killed, its
/// attachment (if [`Cgroup::attach`]ed) is detached, and it is removed.
pub struct Cgroup {
    pub path: PathBuf,
    attachment: Option<Attachment>,
}

impl Cgroup {
    /// Makes `<cgroup v2 mount>/<name>`.
    pub fn new(name: &str) -> Result<Cgroup> {
        let path = cgroup2_root()?.join(name);
        fs::create_dir(&path).with_context(|| format!("mkdir {}", path.display()))?;
        Ok(Cgroup {
            path,
            attachment: None,
        })
    }

    /// Attaches it (`smc-ctl attach --mode MODE`) until it is dropped; what smc-ctl said on
    /// stderr.
    pub fn attach(&mut self, smc_ctl: &Path, mode: &str) -> Result<String> {
        self.attach_with(smc_ctl, mode, &[])
    }

    /// [`Cgroup::attach`] with more arguments for `smc-ctl attach`.
    pub fn attach_with(&mut self, smc_ctl: &Path, mode: &str, extra: &[&str]) -> Result<String> {
        let (a, err) = Attachment::new_with(smc_ctl, &self.path, mode, extra, Duration::ZERO)?;
        self.attachment = Some(a);
        Ok(err)
    }

    /// Makes `cmd`'s child join this cgroup between fork and exec, so that the program runs in
    /// it from its first instruction (nothing allocates after the fork).
    pub fn enter(&self, cmd: &mut Command) {
        smc_cgroup::join_before_exec(cmd, &self.path);
    }

    /// A command whose process runs in this cgroup.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new(program);
        self.enter(&mut c);
        c
    }

    /// `[WRAPPER…] PROGRAM` in this cgroup; with `data_path`, `[WRAPPER…] smc-ctl run --
    /// PROGRAM` (the preload library) pointed at its daemon. The arguments of PROGRAM follow.
    pub fn launch<S: AsRef<OsStr>>(
        &self,
        wrapper: &[S],
        data_path: Option<&DataPath>,
        program: impl AsRef<OsStr>,
    ) -> Command {
        let mut c = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest);
                if let Some(dp) = data_path {
                    c.arg(dp.smc_ctl);
                }
                c
            }
            None => Command::new(data_path.map_or(program.as_ref(), |dp| dp.smc_ctl.as_os_str())),
        };
        if let Some(dp) = data_path {
            c.args(["run", "--"]);
            dp.set_env(&mut c);
        }
        if !wrapper.is_empty() || data_path.is_some() {
            c.arg(program);
        }
        self.enter(&mut c);
        c
    }

    /// The pids of its processes.
    pub fn pids(&self) -> Vec<i32> {
        cgroup_pids(&self.path)
    }

    /// Kills every process in it (servers that daemonised or forked included) and waits
    /// (bounded) until it is empty.
    pub fn kill_all(&self) {
        kill_cgroup(&self.path);
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        kill_cgroup(&self.path);
        // Detached while the cgroup still exists.
        self.attachment.take();
        remove_cgroup(&self.path);
    }
}

/// How a program runs on the data path: under `smc-ctl run` (which preloads the library), with
/// `SMC_CTL_SOCK` naming the daemon and, with `procs`, its statistics file in `procs`, kept
/// after it exits (`SMC_STATS_KEEP=1`) so that its own figures can be read afterwards.
pub struct DataPath<'a> {
    pub smc_ctl: &'a Path,
    pub socket: &'a Path,
    pub procs: Option<&'a Path>,
    /// Drop the `SMC_*` knobs (but `SMC_PRELOAD_LIB` and `SMC_DEBUG`) and `LD_PRELOAD` that
    /// this process inherited: the library's defaults, whatever the caller's environment.
    pub clean_env: bool,
}

impl DataPath<'_> {
    /// Sets the environment (see the type) on `cmd`.
    pub fn set_env(&self, cmd: &mut Command) {
        if self.clean_env {
            for (k, _) in std::env::vars_os() {
                let k = k.to_string_lossy();
                if k.starts_with("SMC_") && k != "SMC_PRELOAD_LIB" && k != "SMC_DEBUG" {
                    cmd.env_remove(k.as_ref());
                }
            }
            cmd.env_remove("LD_PRELOAD");
        }
        cmd.env("SMC_CTL_SOCK", self.socket);
        if let Some(p) = self.procs {
            cmd.env("SMC_PROCS_DIR", p).env("SMC_STATS_KEEP", "1");
        }
    }
}

fn cgroup_pids(path: &Path) -> Vec<i32> {
    fs::read_to_string(path.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// `cgroup.kill` (Linux ≥ 5.14), SIGKILL per pid otherwise; waits (up to 5 s) until the cgroup
/// is empty.
fn kill_cgroup(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let pids = cgroup_pids(path);
        if pids.is_empty() {
            return;
        }
        if fs::write(path.join("cgroup.kill"), "1").is_err() {
            for pid in pids {
                // SAFETY: plain syscall; the pid is in our cgroup.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Removes an (unattached) cgroup directory, killing what is left in it; up to 5 s.
fn remove_cgroup(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if fs::remove_dir(path).is_ok() || !path.exists() {
            return;
        }
        kill_cgroup(path);
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("warning: could not remove {}", path.display());
}

/// Removes the cgroups `<mount>/<prefix><pid>…` whose process `<pid>` is gone (what a run
/// killed by SIGKILL left behind): their processes killed, detached if attached, removed.
pub fn remove_stale_cgroups(prefix: &str, smc_ctl: &Path) {
    let Ok(rd) = cgroup2_root().and_then(|r| Ok(fs::read_dir(r)?)) else {
        return;
    };
    let attached = attached_cgroups(smc_ctl);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(prefix) else {
            continue;
        };
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let Ok(pid) = rest[..digits].parse::<u32>() else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = e.path();
        eprintln!("==> removing {} left by an interrupted run", path.display());
        kill_cgroup(&path);
        if attached.as_ref().is_some_and(|a| a.contains(&path)) {
            drop(Attachment {
                cgroup: path.clone(),
                smc_ctl: smc_ctl.to_path_buf(),
            });
        }
        remove_cgroup(&path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(c: &Command) -> Vec<String> {
        std::iter::once(c.get_program())
            .chain(c.get_args())
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn launch_builds_the_command_line() {
        // No directory is made: `launch` only builds the command.
        let cg = Cgroup {
            path: PathBuf::from("/nonexistent-cgroup"),
            attachment: None,
        };
        let none: &[&str] = &[];
        assert_eq!(argv(&cg.launch(none, None, "prog")), ["prog"]);
        assert_eq!(
            argv(&cg.launch(&["taskset", "-c", "1"], None, "prog")),
            ["taskset", "-c", "1", "prog"]
        );
        let dp = DataPath {
            smc_ctl: Path::new("/x/smc-ctl"),
            socket: Path::new("/s/ctl.sock"),
            procs: Some(Path::new("/s/procs")),
            clean_env: true,
        };
        let c = cg.launch(&["taskset", "-c", "0"], Some(&dp), "prog");
        assert_eq!(
            argv(&c),
            ["taskset", "-c", "0", "/x/smc-ctl", "run", "--", "prog"]
        );
        let env: BTreeMap<_, _> = c.get_envs().collect();
        assert_eq!(
            env[OsStr::new("SMC_CTL_SOCK")],
            Some(OsStr::new("/s/ctl.sock"))
        );
        assert_eq!(
            env[OsStr::new("SMC_PROCS_DIR")],
            Some(OsStr::new("/s/procs"))
        );
        assert_eq!(env[OsStr::new("SMC_STATS_KEEP")], Some(OsStr::new("1")));
        assert_eq!(env[OsStr::new("LD_PRELOAD")], None);
        let c = cg.launch(none, Some(&dp), "prog");
        assert_eq!(argv(&c), ["/x/smc-ctl", "run", "--", "prog"]);
        // The child fails to join the missing cgroup: the spawn fails, nothing runs.
        let mut c = cg.command("true");
        assert!(c.spawn().is_err());
    }

    #[test]
    fn unique_names_differ() {
        let (a, b) = (unique("t-"), unique("t-"));
        assert_ne!(a, b);
        assert!(a.starts_with(&format!("t-{}x", std::process::id())));
    }
}
