//! Deployment paths (issue 15), for real on this host: `smc-ctl run --cgroup`, `attach --pid` /
//! `--container-id` over real cgroup directories in the runtimes' layouts, the daemon's
//! `sd_notify` readiness, the systemd units (`systemd-analyze verify`), and containers built with
//! `unshare` (own mount, PID, cgroup and network namespaces and root filesystem) that use the data
//! path through read-only bind mounts of the library and the daemon socket.
// Test and tool code: a failed unwrap/expect fails the test or the command, no user program.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    fs,
    os::unix::{fs::PermissionsExt as _, net::UnixDatagram},
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use integration_tests::{
    attach_waiting, bin, cgroup2_root, daemon_command, lock, log_tail, require_root, require_tool,
    seqpacket_accepts, smc_ctl, spawn_logged, spawn_piped, start_daemon, test_cgroup, unique,
    wait_listening, Cgroup, NetnsPair, Proc,
};

const T: Duration = Duration::from_secs(20);

fn text(o: &Output) -> String {
    format!(
        "status {}; stdout: {}; stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `smc-ctl ARGS` must fail with a message containing `want`.
fn fails_with(args: &[&str], want: &str) {
    let o = smc_ctl(args);
    assert!(
        !o.status.success(),
        "smc-ctl {args:?} succeeded: {}",
        text(&o)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains(want),
        "smc-ctl {args:?}: want {want:?} in: {err}"
    );
}

fn output(c: &mut Command) -> Output {
    c.output()
        .unwrap_or_else(|e| panic!("run {:?}: {e}", c.get_program()))
}

/// The hierarchy path of a cgroup directory (as `/proc/PID/cgroup` shows it).
fn rel(dir: &Path) -> String {
    format!("/{}", dir.strip_prefix(cgroup2_root()).unwrap().display())
}

/// The directories of `smc-ctl status --json`'s attached cgroups.
fn attached_cgroups() -> Vec<String> {
    let o = smc_ctl(&["status", "--json"]);
    assert!(o.status.success(), "smc-ctl status: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("status json");
    v["cgroups"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|c| c["cgroup"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the sub-directories of a test cgroup, deepest first (the guard removes the top).
fn remove_subtree(dir: &Path) {
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_subtree(&e.path());
                let _ = fs::remove_dir(e.path());
            }
        }
    }
}

/// A command run in the cgroup v2 root (joined before exec).
fn in_root_cgroup(program: &Path) -> Command {
    let mut c = Command::new(program);
    smc_cgroup::join_before_exec(&mut c, &cgroup2_root());
    c
}

#[test]
fn run_cgroup_and_attach_pid_with_clear_errors() {
    require_root();
    let _l = lock();
    let root = cgroup2_root();
    let cg = test_cgroup();
    let dir = cg.path.to_str().unwrap().to_string();

    // Errors, each with its own message, before anything is attached.
    let missing = root.join(unique("smc-missing-"));
    fails_with(
        &["run", "--cgroup", missing.to_str().unwrap(), "--", "true"],
        "does not exist (cgroup v2 is mounted at",
    );
    fails_with(
        &["run", "--cgroup", "/tmp", "--", "true"],
        "is not a cgroup v2 directory",
    );
    fails_with(
        &["run", "--cgroup", &dir, "--", "true"],
        "is not attached (nor below an attached cgroup)",
    );
    let o = output(
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(bin("smc-ctl"))
            .args(["run", "--cgroup", &dir, "--", "true"]),
    );
    assert!(
        !o.status.success(),
        "unprivileged run --cgroup: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("needs root"),
        "{}",
        text(&o)
    );
    // No cgroup v2: a mount namespace where it is unmounted (the directory stays, as tmpfs).
    for args in [
        format!("run --cgroup {dir} -- true"),
        "attach --pid self".into(),
        "attach --container-id 0123456789abcdef".into(),
    ] {
        let o = output(
            Command::new("unshare")
                .args(["-m", "sh", "-c"])
                .arg(format!(
                    "umount -l {} && exec {} {args}",
                    root.display(),
                    bin("smc-ctl").display()
                )),
        );
        assert!(
            !o.status.success(),
            "{args} without cgroup v2: {}",
            text(&o)
        );
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("no cgroup v2 is mounted"),
            "{args}: {}",
            text(&o)
        );
    }
    fails_with(
        &["attach", "--pid", "4194305"],
        "no process with pid 4194305",
    );
    fails_with(&["attach", "--pid", "abc"], "not a process id");
    // A process of the root cgroup: refused (it would enable the whole host).
    let o = output(in_root_cgroup(&bin("smc-ctl")).args(["attach", "--pid", "self"]));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("is in the root cgroup"),
        "{}",
        text(&o)
    );

    // Attached: run --cgroup moves itself there before exec, with the library preloaded; a
    // child cgroup of an attached one is enabled too (the programs are inherited).
    let _att = attach_waiting(&cg, "ism", Duration::from_secs(600));
    let child = cg.path.join("leaf");
    fs::create_dir(&child).unwrap();
    for target in [&cg.path, &child] {
        let o = smc_ctl(&[
            "run",
            "--cgroup",
            target.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "cat /proc/self/cgroup; echo \"LD_PRELOAD=$LD_PRELOAD\"",
        ]);
        assert!(o.status.success(), "run --cgroup: {}", text(&o));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.lines().any(|l| l == format!("0::{}", rel(target))),
            "not moved into {}: {out}",
            target.display()
        );
        assert!(out.contains("libsmc_preload.so"), "no LD_PRELOAD: {out}");
    }
    fs::remove_dir(&child).unwrap();

    // attach/detach --pid: the cgroup of a running process.
    let cg2 = test_cgroup();
    let mut sleeper = spawn_piped({
        let mut c = cg2.command("sleep");
        c.arg("60");
        c
    });
    let pid = sleeper.0.id().to_string();
    let o = smc_ctl(&["attach", "--pid", &pid]);
    assert!(o.status.success(), "attach --pid: {}", text(&o));
    let cg2s = cg2.path.display().to_string();
    assert!(
        attached_cgroups().contains(&cg2s),
        "{:?}",
        attached_cgroups()
    );
    let o = smc_ctl(&["detach", "--pid", &pid]);
    assert!(o.status.success(), "detach --pid: {}", text(&o));
    assert!(
        !attached_cgroups().contains(&cg2s),
        "{:?}",
        attached_cgroups()
    );
    let _ = sleeper.0.kill();
}

#[test]
fn attach_container_id_in_runtime_layouts() {
    require_root();
    let _l = lock();
    let cg = test_cgroup();
    // Real cgroup directories in the layouts of docker (systemd driver), containerd under a
    // burstable kubepods slice, and the cgroupfs driver; ids made unique per run.
    let seed = format!(
        "{:08x}{:08x}",
        std::process::id(),
        Instant::now().elapsed().subsec_nanos()
    );
    let id = |n: u8| format!("{seed}{n:02x}{}", "ab".repeat(23));
    let (docker, cri, cgfs) = (id(1), id(2), id(3));
    // Shares its first 18 digits with `docker`.
    let twin = format!("{}{}", &docker[..18], "cd".repeat(23));
    let uid = "1b2c3d4e-0000-4111-8222-333344445555";
    let dirs = [
        (docker.clone(), format!("system.slice/docker-{docker}.scope")),
        (
            cri.clone(),
            format!(
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{cri}.scope",
                uid.replace('-', "_")
            ),
        ),
        (cgfs.clone(), format!("kubepods/besteffort/pod{uid}/{cgfs}")),
        (twin.clone(), format!("system.slice/docker-{twin}.scope")),
    ];
    let mut paths = Vec::new();
    for (_, d) in &dirs {
        let p = cg.path.join(d);
        fs::create_dir_all(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
        paths.push(p);
    }
    let cleanup = scopeguard(&cg.path);
    for (i, (cid, _)) in dirs.iter().take(3).enumerate() {
        // A unique prefix to attach, the full id to detach.
        let short = &cid[..20];
        let o = smc_ctl_waiting(&["attach", "--container-id", short]);
        assert!(o.status.success(), "attach --container-id: {}", text(&o));
        let want = paths[i].display().to_string();
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&want),
            "attached something else than {want}: {}",
            text(&o)
        );
        assert!(
            attached_cgroups().contains(&want),
            "{:?}",
            attached_cgroups()
        );
        let o = smc_ctl(&["detach", "--container-id", cid]);
        assert!(o.status.success(), "detach --container-id: {}", text(&o));
        assert!(!attached_cgroups().contains(&want));
    }
    // A prefix shared by two containers, an unknown id, a malformed one.
    fails_with(
        &["attach", "--container-id", &docker[..18]],
        "matches 2 cgroups",
    );
    fails_with(
        &["attach", "--container-id", &format!("{seed}ff")],
        "no cgroup for container",
    );
    fails_with(
        &["attach", "--container-id", "abc"],
        "is not a container id",
    );
    drop(cleanup);
}

/// `smc-ctl ARGS`, retried (bounded) while the pinned programs belong to another build of
/// smc-ctl (someone else's cgroup is attached with it; see `attach_waiting`).
fn smc_ctl_waiting(args: &[&str]) -> Output {
    let t = Instant::now();
    loop {
        let o = smc_ctl(args);
        if o.status.success()
            || !String::from_utf8_lossy(&o.stderr).contains("another build")
            || t.elapsed() > Duration::from_secs(600)
        {
            return o;
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Removes a test cgroup's sub-directories on drop (also when the test fails).
struct Subtree(PathBuf);
fn scopeguard(p: &Path) -> Subtree {
    Subtree(p.to_path_buf())
}
impl Drop for Subtree {
    fn drop(&mut self) {
        remove_subtree(&self.0);
    }
}

/// Receives one sd_notify datagram (bounded).
fn recv_notify(sock: &UnixDatagram, what: &str) -> String {
    sock.set_read_timeout(Some(T)).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .unwrap_or_else(|e| panic!("no {what} notification within {T:?}: {e}"));
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn daemon_notifies_readiness_like_systemd_expects() {
    require_root();
    let dir = Path::new("/run/smc").join(unique("notify-test-"));
    fs::create_dir_all(&dir).unwrap();
    for abstract_ns in [false, true] {
        let (bind_path, env_value): (PathBuf, String) = if abstract_ns {
            let name = unique("smc-notify-");
            (PathBuf::from(format!("\0{name}")), format!("@{name}"))
        } else {
            let p = dir.join("notify.sock");
            let _ = fs::remove_file(&p);
            (p.clone(), p.display().to_string())
        };
        let sock = if abstract_ns {
            use std::os::linux::net::SocketAddrExt as _;
            let name = env_value.trim_start_matches('@');
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
            UnixDatagram::bind_addr(&addr).expect("bind abstract notify socket")
        } else {
            UnixDatagram::bind(&bind_path).expect("bind notify socket")
        };
        let ctl = dir.join("ctl.sock");
        let mut c = daemon_command(&ctl, &dir);
        c.env("NOTIFY_SOCKET", &env_value);
        let log = dir.join("daemon.log");
        let mut d = spawn_logged(c, &log);
        let msg = recv_notify(&sock, "READY=1");
        assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
        assert!(
            msg.lines().any(|l| l == format!("MAINPID={}", d.0.id())),
            "{msg}"
        );
        // Ready means ready: the socket accepts at the moment of the notification.
        assert!(
            seqpacket_accepts(&ctl),
            "READY=1 before the socket accepts{}",
            log_tail(&log)
        );
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(d.0.id() as i32, libc::SIGTERM) };
        let msg = recv_notify(&sock, "STOPPING=1");
        assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
        let t = Instant::now();
        let st = loop {
            if let Some(st) = d.0.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < T, "the daemon did not exit on SIGTERM");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(st.success(), "daemon exit {st}{}", log_tail(&log));
        assert!(!ctl.exists(), "the daemon left its socket behind");
    }
    let _ = fs::remove_dir_all(&dir);
}

fn packaging() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging")
}

/// The packaged units with `/usr/bin/smc-ctl` pointing at the built binary, in a unit directory
/// with a demo service that uses the drop-in and the slice.
fn unit_dir(dir: &Path) -> PathBuf {
    let units = dir.join("units");
    fs::create_dir_all(units.join("demo.service.d")).unwrap();
    let smc_ctl = bin("smc-ctl").display().to_string();
    for e in fs::read_dir(packaging().join("systemd")).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let body = fs::read_to_string(e.path())
            .unwrap()
            .replace("/usr/bin/smc-ctl", &smc_ctl);
        let dst = if name == "smc-enable.conf" {
            units.join("demo.service.d/smc.conf")
        } else {
            units.join(&name)
        };
        fs::write(dst, body).unwrap();
    }
    fs::write(
        units.join("demo.service"),
        "[Unit]\nDescription=demo\n[Service]\nExecStart=/usr/bin/sleep 1000\nSlice=smc.slice\n",
    )
    .unwrap();
    units
}

fn verify(units: &Path, names: &[&str]) -> Output {
    let tool = require_tool("systemd-analyze", "systemd");
    output(
        Command::new(tool)
            .arg("verify")
            .arg("--man=no")
            .args(names)
            .current_dir(units)
            .env("SYSTEMD_UNIT_PATH", format!("{}:", units.display()))
            .env("SYSTEMD_LOG_COLOR", "0"),
    )
}

#[test]
fn systemd_units_verify() {
    let dir = std::env::temp_dir().join(unique("smc-units-"));
    let units = unit_dir(&dir);
    let names = [
        "smc-daemon.service",
        "smc-attach@sys-fs-cgroup-smc.slice.service",
        "smc.slice",
        "demo.service",
    ];
    let o = verify(&units, &names);
    // verify exits 0 on unknown keys and bad values: they are warnings on stderr.
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "systemd-analyze verify: {}",
        text(&o)
    );
    // The check can fail: a misspelt key and a bad value are reported.
    let daemon = fs::read_to_string(units.join("smc-daemon.service")).unwrap();
    fs::write(
        units.join("bad.service"),
        daemon
            .replace("Type=notify", "Typ=notify")
            .replace("RestrictNamespaces=net", "RestrictNamespaces=bogus"),
    )
    .unwrap();
    let o = verify(&units, &["bad.service"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("Unknown key 'Typ'") && err.contains("bogus"),
        "{}",
        text(&o)
    );
    // What the units run is what smc-ctl accepts.
    for (unit, key) in [
        ("smc-daemon.service", "ExecStart="),
        ("smc-attach@.service", "ExecStart="),
        ("smc-enable.conf", "ExecStartPre=+"),
    ] {
        let body = fs::read_to_string(packaging().join("systemd").join(unit)).unwrap();
        let line = body
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("{unit}: no {key}"));
        let args: Vec<String> = line
            .split_whitespace()
            .skip(1)
            .map(|a| a.replace("%f", "/sys/fs/cgroup/x"))
            .collect();
        let o = output(Command::new(bin("smc-ctl")).args(&args).arg("--help"));
        assert!(
            o.status.success(),
            "{unit}: smc-ctl {args:?} --help: {}",
            text(&o)
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// Sets up a container's root in its new mount namespace and executes the rest of the command
/// line in it: a tmpfs root with the host's `/usr` read-only as "the image", its own `/proc`, its
/// cgroup (read-only, cgroup namespace), and what the deployment adds: the library and the daemon
/// socket read-only, its own statistics directory; `LD_PRELOAD` turns the data path on.
/// Arguments: ROOT APP LIB SOCK PROCS OUT -- CMD...
const CONTAINER_INIT: &str = r#"set -e
R=$1 APP=$2 LIB=$3 SOCK=$4 PROCS=$5 OUT=$6; shift 7
mount -t tmpfs -o mode=755 ctr "$R"
cd "$R"
mkdir -p usr proc dev etc tmp sys/fs/cgroup app out run/smc/procs opt/smc/lib
ln -s usr/bin bin; ln -s usr/lib lib; ln -s usr/lib64 lib64; ln -s usr/sbin sbin
mount --bind -o ro /usr usr
mount -t proc proc proc
mount -t cgroup2 -o ro,nosuid,nodev,noexec cgroup2 sys/fs/cgroup
for d in null zero urandom; do touch dev/$d; mount --bind /dev/$d dev/$d; done
touch app/smc-testprog; mount --bind -o ro "$APP" app/smc-testprog
touch opt/smc/lib/libsmc_preload.so; mount --bind -o ro "$LIB" opt/smc/lib/libsmc_preload.so
touch run/smc/ctl.sock; mount --bind -o ro "$SOCK" run/smc/ctl.sock
mount --bind "$PROCS" run/smc/procs
mount --bind "$OUT" out
exec chroot . /usr/bin/env -i PATH=/usr/bin:/usr/sbin LD_PRELOAD=/opt/smc/lib/libsmc_preload.so "$@"
"#;

/// A third network namespace joined to `a` by its own veth pair: `a` gets `10.78.<n>.1`, the new
/// one `10.78.<n>.2`. Removed on drop.
struct ThirdNetns {
    name: String,
    addr_a: String,
}

impl ThirdNetns {
    fn new(a: &str) -> ThirdNetns {
        let tag = unique("");
        let n = std::process::id() % 250;
        let t = ThirdNetns {
            name: format!("smct-c{tag}"),
            addr_a: format!("10.78.{n}.1"),
        };
        let short = &tag[tag.len().saturating_sub(8)..];
        let (va, vc) = (format!("smwa{short}"), format!("smwc{short}"));
        let ip = |args: &[&str]| {
            let o = output(Command::new("ip").args(args));
            assert!(o.status.success(), "ip {args:?}: {}", text(&o));
        };
        ip(&["netns", "add", &t.name]);
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vc]);
        ip(&["link", "set", &va, "netns", a]);
        ip(&["link", "set", &vc, "netns", &t.name]);
        ip(&[
            "-n",
            a,
            "addr",
            "add",
            &format!("{}/24", t.addr_a),
            "dev",
            &va,
        ]);
        ip(&[
            "-n",
            &t.name,
            "addr",
            "add",
            &format!("10.78.{n}.2/24"),
            "dev",
            &vc,
        ]);
        for (ns, dev) in [(a, &va), (t.name.as_str(), &vc)] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        t
    }
}

impl Drop for ThirdNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// The daemon under the hardening of `smc-daemon.service`: only the capabilities of its
/// `CapabilityBoundingSet=`, `NoNewPrivileges=` (setpriv), on a private socket.
fn hardened_daemon(sock: &Path, dir: &Path) -> Proc {
    let unit = fs::read_to_string(packaging().join("systemd/smc-daemon.service")).unwrap();
    let caps: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("CapabilityBoundingSet= in smc-daemon.service")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase()))
        .collect();
    assert!(unit.contains("NoNewPrivileges=yes"));
    let d = daemon_command(sock, dir);
    let mut c = Command::new("setpriv");
    c.arg("--no-new-privs")
        .arg("--inh-caps=-all")
        .arg(format!("--bounding-set=-all,{}", caps.join(",")))
        .arg("--")
        .arg(d.get_program())
        .args(d.get_args());
    let log = dir.join("daemon.log");
    start_daemon(c, sock, &log).proc
}

/// `smc-ctl stats json -a --cgroup CG` over the statistics of every container.
fn stats_of_cgroup(sock: &Path, procs: &Path, dir: &Path, cg: &Path) -> serde_json::Value {
    let o = output(
        Command::new(bin("smc-ctl"))
            .args(["stats", "json", "-a", "--socket"])
            .arg(sock)
            .arg("--procs-dir")
            .arg(procs)
            .arg("--baseline")
            .arg(dir.join("baseline.json"))
            .arg("--cgroup")
            .arg(cg),
    );
    assert!(o.status.success(), "smc-ctl stats: {}", text(&o));
    serde_json::from_slice(&o.stdout).expect("stats json")
}

#[test]
fn containers_enabled_per_cgroup_talk_over_smcd_the_other_stays_tcp() {
    require_root();
    let _l = lock();
    let dir = Path::new("/run/smc").join(unique("ctr-test-"));
    let procs = dir.join("procs");
    fs::create_dir_all(&procs).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let guard = DirGuard(dir.clone());
    let sock = dir.join("ctl.sock");
    let _daemon = hardened_daemon(&sock, &dir);
    let ns = NetnsPair::new().expect("network namespaces (iproute2)");
    let third = ThirdNetns::new(&ns.a);
    // Three containers, each in its own cgroup; only a and b are enabled.
    let (cg_a, cg_b, cg_c) = (test_cgroup(), test_cgroup(), test_cgroup());
    let _att_a = attach_waiting(&cg_a, "ism", Duration::from_secs(600));
    let _att_b = attach_waiting(&cg_b, "ism", Duration::from_secs(600));
    let init = dir.join("init.sh");
    fs::write(&init, CONTAINER_INIT).unwrap();
    let container = |name: &str, cg: &Cgroup, netns: &str, cmd: &str| -> Proc {
        let root = dir.join(format!("{name}-root"));
        let out = dir.join(format!("{name}-out"));
        let p = procs.join(name);
        for d in [&root, &out, &p] {
            fs::create_dir_all(d).unwrap();
        }
        let mut c = cg.command("nsenter");
        c.arg(format!("--net=/run/netns/{netns}"))
            .args([
                "--",
                "unshare",
                "--mount",
                "--pid",
                "--cgroup",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "sh",
            ])
            .arg(&init)
            .arg(&root)
            .arg(bin("smc-testprog"))
            .arg(bin("libsmc_preload.so"))
            .arg(&sock)
            .arg(&p)
            .arg(&out)
            .args(["--", "sh", "-c", cmd]);
        spawn_logged(c, &dir.join(format!("{name}.log")))
    };
    const UP: u64 = 3_000_017;
    const DOWN: u64 = 2_000_029;
    // a: two one-shot servers, one for b and one for c.
    let mut a = container(
        "a",
        &cg_a,
        &ns.a,
        &format!(
            "/app/smc-testprog server 0.0.0.0:7001 --reply {DOWN} > /out/s1 & \
             /app/smc-testprog server 0.0.0.0:7002 --reply {DOWN} > /out/s2 & wait"
        ),
    );
    let alog = dir.join("a.log");
    wait_listening(&mut a, 7001, T, "container a", Some(&alog));
    wait_listening(&mut a, 7002, T, "container a", Some(&alog));
    let client =
        |addr: &str, port: u16| format!("/app/smc-testprog client {addr}:{port} {UP} 5 > /out/c");
    let b = container("b", &cg_b, &ns.b, &client(&ns.addr_a, 7001));
    let c = container("c", &cg_c, &third.name, &client(&third.addr_a, 7002));
    for (p, name) in [(b, "b"), (c, "c"), (a, "a")] {
        let log = dir.join(format!("{name}.log"));
        p.wait_output(T)
            .unwrap_or_else(|e| panic!("container {name}: {e}{}", log_tail(&log)));
    }
    let read = |f: &str| fs::read_to_string(dir.join(f)).unwrap_or_default();
    let (s1, s2, cb, cc) = (
        read("a-out/s1"),
        read("a-out/s2"),
        read("b-out/c"),
        read("c-out/c"),
    );
    // Same bytes on both ends, the same as over TCP: b->a over SMC-D, c->a over TCP.
    for (client, server, what) in [(&cb, &s1, "b -> a"), (&cc, &s2, "c -> a")] {
        let up_sha = client.split_whitespace().nth(2).unwrap_or("?");
        assert!(
            client.starts_with(&format!("OK {UP} ")),
            "{what}: client said {client:?}"
        );
        let sha_line = server.lines().find(|l| l.starts_with("SHA ")).unwrap_or("");
        assert!(
            sha_line.starts_with(&format!("SHA {up_sha} {UP} ")),
            "{what}: server got other bytes: {server:?} vs client {client:?}"
        );
    }
    let back = |s: &str| {
        s.split_whitespace()
            .find_map(|w| w.strip_prefix("back="))
            .map(str::to_string)
    };
    assert_eq!(
        back(&cb),
        back(&cc),
        "the reply over SMC-D differs from TCP's"
    );
    assert_eq!(back(&cb).as_deref(), Some(DOWN.to_string().as_str()));

    // Only the enabled containers moved, as smc-ctl stats --cgroup shows per container.
    let st = |cg: &Cgroup| stats_of_cgroup(&sock, &procs, &dir, &cg.path);
    let (sa, sb, sc) = (st(&cg_a), st(&cg_b), st(&cg_c));
    let n = |v: &serde_json::Value, k: &str| v["connections"][k].as_u64().unwrap_or(0);
    let all = format!(
        "a: {}\nb: {}\nc: {}",
        sa["connections"], sb["connections"], sc["connections"]
    );
    assert_eq!(n(&sa, "smcd_server"), 1, "{all}");
    assert_eq!(n(&sa, "tcp_fallback_server"), 1, "{all}");
    assert_eq!(n(&sb, "smcd_client"), 1, "{all}");
    assert_eq!(n(&sb, "tcp_fallback"), 0, "{all}");
    assert_eq!(n(&sc, "smcd"), 0, "{all}");
    assert_eq!(sa["rx"]["bytes"].as_u64(), Some(UP), "{all}");
    assert_eq!(sb["rx"]["bytes"].as_u64(), Some(DOWN), "{all}");
    drop(guard);
}

/// Removes a test directory on drop unless the test failed (kept for its logs).
struct DirGuard(PathBuf);
impl Drop for DirGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test files kept in {}", self.0.display());
        } else {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
}

/// `GET /metrics` from a Prometheus endpoint (bounded); the body.
fn scrape(addr: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    s.set_read_timeout(Some(T)).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    r.split_once("\r\n\r\n")
        .map(|x| x.1.to_string())
        .unwrap_or_default()
}

/// The value of the sample `name{labels}` in a text exposition.
fn sample(text: &str, name: &str, labels: &str) -> Option<u64> {
    let want = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&want))
        .and_then(|v| v.trim().parse().ok())
}

/// A Pod object as the kubelet's `/pods` lists it (only what the agent reads).
fn pod_json(uid: &str, ns: &str, name: &str, labels: &str, annotations: &str) -> String {
    format!(
        r#"{{"kind":"Pod","apiVersion":"v1","metadata":{{"uid":"{uid}","namespace":"{ns}","name":"{name}","labels":{{{labels}}},"annotations":{{{annotations}}}}},"spec":{{"nodeName":"node-1"}}}}"#
    )
}

#[test]
fn kubernetes_agent_enables_selected_pods_of_a_kubepods_tree() {
    require_root();
    let _l = lock();
    // This build's programs loaded (waiting while another build's are) and kept loaded while
    // the agent attaches and detaches pods: a cgroup of its own stays attached meanwhile.
    let holder = test_cgroup();
    let _hold = attach_waiting(&holder, "ism", Duration::from_secs(600));
    // A node's kubelet tree, for real, under a test cgroup: systemd driver (burstable and
    // besteffort slices) and cgroupfs driver.
    let node = test_cgroup();
    let _subtree = scopeguard(&node.path);
    let dir = Path::new("/run/smc").join(unique("k8s-test-"));
    let guard = DirGuard(dir.clone());
    let (pods, procs) = (dir.join("pods"), dir.join("procs"));
    fs::create_dir_all(&pods).unwrap();
    fs::create_dir_all(&procs).unwrap();
    let sock = dir.join("ctl.sock");
    let mut dc = daemon_command(&sock, &dir);
    dc.arg("--procs-dir").arg(&procs);
    let dlog = dir.join("daemon.log");
    let daemon = start_daemon(dc, &sock, &dlog);
    let seed = format!("{:08x}", std::process::id());
    let uid = |n: u8| format!("{seed}-0000-4000-8000-0000000000{n:02x}");
    let (ua, ub, uc) = (uid(0xa), uid(0xb), uid(0xc));
    let cid = |n: u8| format!("{seed}{n:02x}{}", "ef".repeat(27));
    let pod_a = node.path.join(format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
        ua.replace('-', "_")
    ));
    let ctr_a = pod_a.join(format!("cri-containerd-{}.scope", cid(0xa)));
    let pod_b = node.path.join(format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice",
        ub.replace('-', "_")
    ));
    let pod_c = node.path.join(format!("kubepods/burstable/pod{uc}"));
    let ctr_c = pod_c.join(cid(0xc));
    for d in [
        &ctr_a,
        &pod_b.join(format!("cri-containerd-{}.scope", cid(0xb))),
    ] {
        fs::create_dir_all(d).unwrap();
    }
    // a: selected by label; b: not selected (another value); c comes later, by annotation.
    fs::write(
        pods.join("kubelet-pods.json"),
        format!(
            r#"{{"kind":"PodList","apiVersion":"v1","items":[{},{}]}}"#,
            pod_json(
                &ua,
                "shop",
                "frontend-1",
                r#""smc-rs.io/enabled":"true","app":"fe""#,
                ""
            ),
            pod_json(&ub, "shop", "batch-1", r#""smc-rs.io/enabled":"false""#, ""),
        ),
    )
    .unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let maddr = format!("127.0.0.1:{port}");
    let alog = dir.join("agent.log");
    let mut ac = Command::new(bin("smc-ctl"));
    ac.arg("agent")
        .arg("--cgroup-root")
        .arg(&node.path)
        .arg("--pods-dir")
        .arg(&pods)
        .args([
            "--interval-ms",
            "100",
            "--detach-on-exit",
            "--metrics",
            &maddr,
        ])
        .arg("--socket")
        .arg(&sock)
        .arg("--procs-dir")
        .arg(&procs);
    let mut agent = spawn_logged(ac, &alog);
    let attached = |p: &Path| attached_cgroups().contains(&p.display().to_string());
    let wait = |what: &str, cond: &dyn Fn() -> bool, agent: &mut Proc| {
        let t = Instant::now();
        while !cond() {
            if let Ok(Some(st)) = agent.0.try_wait() {
                panic!("agent exited ({st}){}", log_tail(&alog));
            }
            assert!(t.elapsed() < T, "{what}{}", log_tail(&alog));
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait("pod a not enabled", &|| attached(&pod_a), &mut agent);

    // A pod added while the agent runs: the cgroup first, its metadata later.
    fs::create_dir_all(&ctr_c).unwrap();
    fs::write(
        pods.join("static-c.json"),
        pod_json(
            &uc,
            "kube-system",
            "proxy-c",
            "",
            r#""smc-rs.io/enabled":"true""#,
        ),
    )
    .unwrap();
    wait("pod c not enabled", &|| attached(&pod_c), &mut agent);
    // Decided in the same passes as a and c: b stays TCP.
    assert!(!attached(&pod_b), "pod b enabled: {:?}", attached_cgroups());

    // Traffic inside pod a's container: both ends over SMC-D.
    let env = |c: &mut Command| {
        c.env("SMC_CTL_SOCK", &sock)
            .env("SMC_PROCS_DIR", &procs)
            .env("SMC_STATS_KEEP", "1");
    };
    let mut sc = Command::new(bin("smc-ctl"));
    sc.arg("run")
        .arg("--cgroup")
        .arg(&ctr_a)
        .arg("--")
        .arg(bin("smc-testprog"))
        .args(["server", "127.0.0.1:0", "--reply", "1000"]);
    env(&mut sc);
    let mut server = spawn_piped(sc);
    let line = server.read_line();
    let sport = line
        .strip_prefix("PORT ")
        .unwrap_or_else(|| panic!("server said {line:?}"));
    let mut cc = Command::new(bin("smc-ctl"));
    cc.arg("run")
        .arg("--cgroup")
        .arg(&ctr_a)
        .arg("--")
        .arg(bin("smc-testprog"))
        .args(["client", &format!("127.0.0.1:{sport}"), "200000", "3"]);
    env(&mut cc);
    let out = spawn_piped(cc).wait_output(T).expect("client");
    assert!(out.starts_with("OK 200000 "), "client: {out}");
    server.wait_output(T).expect("server");

    // The metrics carry the pods' labels: a's connections, c present with none, b absent.
    let la = format!(r#"namespace="shop",pod="frontend-1",uid="{ua}""#);
    let lc = format!(r#"namespace="kube-system",pod="proxy-c",uid="{uc}""#);
    let t = Instant::now();
    let m = loop {
        let m = scrape(&maddr);
        if sample(&m, "smc_connections_smcd_client", &la) == Some(1)
            && sample(&m, "smc_connections_smcd_server", &la) == Some(1)
        {
            break m;
        }
        assert!(t.elapsed() < T, "no SMC-D figures for pod a:\n{m}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(sample(&m, "smc_rx_bytes", &la), Some(201_000), "{m}");
    assert_eq!(
        sample(&m, "smc_connections_smcd_client", &lc),
        Some(0),
        "{m}"
    );
    assert!(
        !m.contains("batch-1") && !m.contains(&ub),
        "pod b in the metrics:\n{m}"
    );
    // One HELP/TYPE per family (the exposition is valid with several pods).
    assert_eq!(
        m.matches("# TYPE smc_connections_smcd_client ").count(),
        1,
        "{m}"
    );

    // A pod removed while the agent runs: forgotten, its links unpinned, gone from the metrics.
    fs::remove_dir(&ctr_c).unwrap();
    fs::remove_dir(&pod_c).unwrap();
    wait(
        "pod c not forgotten",
        &|| {
            fs::read_to_string(&alog)
                .unwrap_or_default()
                .contains(&format!("forgot pod kube-system/proxy-c ({uc})"))
        },
        &mut agent,
    );
    let m = scrape(&maddr);
    assert!(!m.contains("proxy-c"), "removed pod c in the metrics:\n{m}");
    assert!(
        sample(&m, "smc_connections_smcd_client", &la).is_some(),
        "{m}"
    );

    // SIGTERM with --detach-on-exit: pod a is detached, nothing of this node stays attached.
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    let st = loop {
        if let Some(st) = agent.0.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < T, "agent did not stop{}", log_tail(&alog));
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(st.success(), "agent exit {st}{}", log_tail(&alog));
    let left: Vec<String> = attached_cgroups()
        .into_iter()
        .filter(|c| c.starts_with(&node.path.display().to_string()))
        .collect();
    assert!(left.is_empty(), "still attached: {left:?}");
    drop(daemon);
    drop(guard);
}

/// `tests/k8s_validate.py FILES`: the documents as JSON, or the validator's complaints.
fn k8s_validate(files: &[PathBuf]) -> Result<serde_json::Value, String> {
    let py = Path::new("/usr/bin/python3");
    let probe = Command::new(py)
        .args(["-c", "import kubernetes, yaml"])
        .output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "the manifests are validated with the Kubernetes API models of python3-kubernetes: \
         apt-get install python3-kubernetes (cargo xtask setup does)"
    );
    let o = output(
        Command::new(py)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("k8s_validate.py"))
            .args(files),
    );
    if o.status.success() {
        Ok(serde_json::from_slice(&o.stdout).expect("validator output"))
    } else {
        Err(String::from_utf8_lossy(&o.stderr).into_owned())
    }
}

#[test]
fn kubernetes_manifests_validate_and_fit_together() {
    let k8s = packaging().join("kubernetes");
    let (ds_file, pod_file) = (k8s.join("smc-rs.yaml"), k8s.join("example-pod.yaml"));
    let docs = k8s_validate(&[ds_file.clone(), pod_file.clone()])
        .unwrap_or_else(|e| panic!("manifests do not validate:\n{e}"));
    let docs = docs.as_array().unwrap();
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    // The validator can fail: a misspelt key and a missing required field.
    let dir = std::env::temp_dir().join(unique("smc-k8s-"));
    fs::create_dir_all(&dir).unwrap();
    let body = fs::read_to_string(&ds_file).unwrap();
    for (i, (from, to, want)) in [
        (
            "mountPropagation:",
            "mountPropagaton:",
            "mountPropagaton: unknown field",
        ),
        (
            "- name: daemon",
            "- image: x",
            "Invalid value for `name`, must not be `None`",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let bad = dir.join(format!("bad{i}.yaml"));
        fs::write(&bad, body.replace(from, to)).unwrap();
        let e = k8s_validate(&[bad]).expect_err("a broken manifest validates");
        assert!(e.contains(want), "want {want:?} in: {e}");
    }
    let _ = fs::remove_dir_all(&dir);

    let ds = find("DaemonSet");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["hostPID"], true,
        "the daemon and agent see every pod's processes"
    );
    let host_paths: Vec<&str> = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    for p in [
        "/sys/fs/bpf",
        "/sys/fs/cgroup",
        "/run/smc",
        "/var/lib/smc",
        "/opt/smc/lib",
    ] {
        assert!(host_paths.contains(&p), "no hostPath {p}: {host_paths:?}");
    }
    let container = |name: &str| {
        spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no container {name}"))
    };
    // What the containers run is what smc-ctl accepts.
    let mut args_of = BTreeMap::new();
    for name in ["daemon", "agent"] {
        let cmd: Vec<String> = container(name)["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
        assert_eq!(cmd[0], "/usr/bin/smc-ctl", "{name}: {cmd:?}");
        let o = output(Command::new(bin("smc-ctl")).args(&cmd[1..]).arg("--help"));
        assert!(
            o.status.success(),
            "{name}: smc-ctl {cmd:?} --help: {}",
            text(&o)
        );
        args_of.insert(name, cmd);
    }
    assert_eq!(container("agent")["securityContext"]["privileged"], true);
    let arg = |name: &str, flag: &str| -> String {
        let cmd = &args_of[name];
        let i = cmd
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("{name}: no {flag}"));
        cmd[i + 1].clone()
    };
    // The example pod: selected by the agent's label, the library and the daemon's socket
    // where its LD_PRELOAD and the library's default look.
    let pod = find("Pod");
    let label = arg("agent", "--label");
    let (k, v) = label.split_once('=').unwrap();
    assert_eq!(
        pod["metadata"]["labels"][k], v,
        "example pod not selected by {label}"
    );
    let app = &pod["spec"]["containers"][0];
    let mount = |name: &str| {
        app["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no mount {name}"))
    };
    let preload = app["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LD_PRELOAD")
        .and_then(|e| e["value"].as_str())
        .unwrap();
    let lib_dir = mount("smc-lib")["mountPath"].as_str().unwrap();
    assert_eq!(preload, format!("{lib_dir}/libsmc_preload.so"));
    assert_eq!(
        mount("smc-sock")["mountPath"],
        arg("daemon", "--socket").as_str()
    );
    assert_eq!(
        mount("smc-sock")["mountPath"],
        "/run/smc/ctl.sock",
        "the library's default"
    );
    assert_eq!(mount("smc-lib")["readOnly"], true);
    assert_eq!(mount("smc-sock")["readOnly"], true);
    assert_eq!(mount("smc-procs")["mountPath"], "/run/smc/procs");
    assert!(docs.iter().any(|d| d["kind"] == "ClusterRoleBinding"));
}

#[test]
fn shell_completions_and_man_pages_from_clap() {
    // The commands, from `smc-ctl --help`.
    let o = smc_ctl(&["--help"]);
    assert!(o.status.success(), "{}", text(&o));
    let help = String::from_utf8_lossy(&o.stdout).into_owned();
    let commands: Vec<String> = help
        .split_once("Commands:")
        .unwrap()
        .1
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(
        commands.len() >= 10 && commands.contains(&"agent".to_string()),
        "{commands:?}"
    );
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = smc_ctl(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", text(&o));
        let s = String::from_utf8_lossy(&o.stdout);
        for c in &commands {
            assert!(s.contains(c.as_str()), "{shell} completion lacks {c}");
        }
    }
    // bash really completes: a command prefix, then an option of that command.
    // (clap-rs/clap#6421: the second one needs smc-ctl's workaround.)
    let o = output(Command::new("bash").arg("-c").arg(format!(
        "set -e\nsource <({} completions bash)\nf=$(complete -p smc-ctl | sed -E 's/.*-F ([^ ]+) .*/\\1/')\n\
         COMP_WORDS=(smc-ctl ag); COMP_CWORD=1; $f smc-ctl ag smc-ctl; echo \"${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(smc-ctl agent --pods); COMP_CWORD=2; $f smc-ctl --pods agent; echo \"${{COMPREPLY[*]}}\"\n",
        bin("smc-ctl").display()
    )));
    assert!(o.status.success(), "bash completion: {}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first(), Some(&"agent"), "{out}");
    assert_eq!(lines.get(1), Some(&"--pods-dir"), "{out}");

    // Man pages: smc-ctl.8 and one per command, which man renders.
    let dir = std::env::temp_dir().join(unique("smc-man-"));
    let o = output(Command::new(bin("smc-ctl")).arg("man").arg(&dir));
    assert!(o.status.success(), "{}", text(&o));
    let man = require_tool("man", "man-db");
    for page in std::iter::once("smc-ctl".to_string())
        .chain(commands.iter().map(|c| format!("smc-ctl-{c}")))
    {
        let f = dir.join(format!("{page}.8"));
        assert!(f.exists(), "no {}", f.display());
        let o = output(
            Command::new(&man)
                .arg("-l")
                .arg(&f)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "100"),
        );
        assert!(o.status.success(), "man -l {}: {}", f.display(), text(&o));
        let t = String::from_utf8_lossy(&o.stdout);
        assert!(
            t.contains("NAME") && t.contains("SYNOPSIS") && t.contains(&format!("{page}(8)")),
            "{page}: {t}"
        );
    }
    let t = fs::read_to_string(dir.join("smc-ctl-agent.8")).unwrap();
    assert!(t.contains("pods\\-dir"), "{t}");
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn dist_tarball_installs_into_a_fresh_root() {
    let dir = std::env::temp_dir().join(unique("smc-dist-"));
    let guard = DirGuard(dir.clone());
    let (out, unpack, root) = (dir.join("out"), dir.join("unpack"), dir.join("root"));
    fs::create_dir_all(&unpack).unwrap();
    // The tarball, built by what `cargo xtask dist` runs, from the binaries under test.
    let o = output(
        Command::new("sh")
            .arg(packaging().join("dist.sh"))
            .arg(bin("smc-ctl").parent().unwrap())
            .arg(&out)
            .arg(env!("CARGO_PKG_VERSION")),
    );
    assert!(o.status.success(), "dist.sh: {}", text(&o));
    let tarball = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    assert!(tarball.exists(), "{}", text(&o));
    let o = output(
        Command::new("tar")
            .arg("-C")
            .arg(&unpack)
            .arg("-xzf")
            .arg(&tarball),
    );
    assert!(o.status.success(), "tar: {}", text(&o));
    let top = unpack.join(
        tarball
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .trim_end_matches(".tar.gz"),
    );
    // A machine with systemd but no Rust toolchain: the host's system units, a bare PATH.
    fs::create_dir_all(root.join("usr/lib/systemd")).unwrap();
    let o = output(
        Command::new("cp")
            .arg("-a")
            .arg("/usr/lib/systemd/system")
            .arg(root.join("usr/lib/systemd/")),
    );
    assert!(o.status.success(), "cp: {}", text(&o));
    let o = output(
        Command::new("/bin/sh")
            .arg(top.join("install.sh"))
            .arg("--root")
            .arg(&root)
            .env_clear()
            .env("PATH", "/usr/bin:/bin"),
    );
    assert!(o.status.success(), "install.sh: {}", text(&o));
    let manifest = fs::read_to_string(top.join("MANIFEST")).unwrap();
    for want in [
        "/usr/bin/smc-ctl",
        "/usr/lib/smc/libsmc_preload.so",
        "/usr/lib/systemd/system/smc-daemon.service",
        "/usr/lib/systemd/system/smc-attach@.service",
        "/usr/lib/systemd/system/smc.slice",
        "/usr/share/smc/systemd/smc-enable.conf",
        "/usr/share/man/man8/smc-ctl.8.gz",
        "/usr/share/man/man8/smc-ctl-agent.8.gz",
        "/usr/share/bash-completion/completions/smc-ctl",
        "/usr/share/zsh/vendor-completions/_smc-ctl",
        "/usr/share/fish/vendor_completions.d/smc-ctl.fish",
        "/usr/share/smc/kubernetes/smc-rs.yaml",
    ] {
        assert!(
            manifest.lines().any(|l| l == want),
            "{want} not in MANIFEST:\n{manifest}"
        );
    }
    for f in manifest.lines() {
        let (a, b) = (top.join(format!("files{f}")), root.join(&f[1..]));
        assert_eq!(
            fs::read(&a).unwrap(),
            fs::read(&b).unwrap_or_default(),
            "{f} installed"
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&a), mode(&b), "{f}: mode");
    }
    // The installed binary runs, and finds the installed library.
    let smc = root.join("usr/bin/smc-ctl");
    let o = output(Command::new(&smc).arg("--version"));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        format!("smc-ctl {}", env!("CARGO_PKG_VERSION"))
    );
    let o = output(
        Command::new(&smc)
            .args(["run", "--", "sh", "-c", "echo \"$LD_PRELOAD\""])
            .env_remove("SMC_PRELOAD_LIB")
            .env_remove("LD_PRELOAD"),
    );
    assert!(o.status.success(), "{}", text(&o));
    let lib = fs::canonicalize(root.join("usr/lib/smc/libsmc_preload.so")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        lib.display().to_string()
    );
    // The installed units verify in that root (ExecStart= is the installed binary).
    let tool = require_tool("systemd-analyze", "systemd");
    let verify_in_root = |names: &[&str]| {
        output(
            Command::new(&tool)
                .arg("verify")
                .arg(format!("--root={}", root.display()))
                .arg("--man=no")
                .args(names)
                .env("SYSTEMD_LOG_COLOR", "0"),
        )
    };
    let o = verify_in_root(&[
        "smc-daemon.service",
        "smc.slice",
        "smc-attach@sys-fs-cgroup-smc.slice.service",
    ]);
    assert!(
        o.status.success() && o.stderr.is_empty(),
        "systemd-analyze verify: {}",
        text(&o)
    );
    // The check can fail: without the binary, ExecStart= is reported.
    fs::remove_file(&smc).unwrap();
    let o = verify_in_root(&["smc-daemon.service"]);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/usr/bin/smc-ctl is not executable"),
        "{}",
        text(&o)
    );
    // The man pages render from where man looks for them.
    let man = require_tool("man", "man-db");
    let o = output(
        Command::new(man)
            .arg("-l")
            .arg(root.join("usr/share/man/man8/smc-ctl-agent.8.gz"))
            .env("MANPAGER", "cat"),
    );
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stdout).contains("smc-ctl-agent(8)"),
        "{}",
        text(&o)
    );
    drop(guard);
}

#[test]
fn kernel_probe_before_attach_says_what_is_missing() {
    require_root();
    // This kernel has everything: `smc-ctl probe` lists each feature as there.
    let o = smc_ctl(&["probe", "--json"]);
    assert!(o.status.success(), "smc-ctl probe: {}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["supported"], true, "{v}");
    let features = v["features"].as_array().unwrap();
    for want in [
        "program type sock_ops",
        "program type cgroup_sockopt",
        "program type sk_msg",
        "cgroup bpf_link (BPF_LINK_CREATE)",
        "sock_ops: TCP header options (bpf_store_hdr_opt)",
        "sk_msg: bpf_msg_redirect_hash",
    ] {
        assert!(
            features
                .iter()
                .any(|f| f["feature"] == want && f["available"] == true),
            "{want}: {v}"
        );
    }
    // A root without CAP_BPF and CAP_SYS_ADMIN, for real: the kernel refuses every load, and
    // attach says why and what it needs, before loading or attaching anything.
    let cg = test_cgroup();
    let o = output(
        Command::new("setpriv")
            .args([
                "--inh-caps=-all",
                "--bounding-set=-bpf,-sys_admin,-perfmon",
                "--",
            ])
            .arg(bin("smc-ctl"))
            .args(["attach", "--cgroup", cg.path.to_str().unwrap()]),
    );
    assert!(!o.status.success(), "attach without CAP_BPF: {}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not let smc-ctl load eBPF programs (EPERM)")
            && err.contains("CAP_BPF and CAP_NET_ADMIN"),
        "{err}"
    );
    assert!(
        !err.contains("verifier") && err.lines().count() <= 3,
        "{err}"
    );
    assert!(!attached_cgroups().contains(&cg.path.display().to_string()));
}
