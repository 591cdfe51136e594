//! Loading, pinning and attaching the eBPF programs (per-cgroup enablement).
//!
//! Everything lives under [`PIN_ROOT`] so that it outlives the command:
//!
//! ```text
//! /sys/fs/bpf/smc/layout-v<N>-<hash>/  marker: layout version and eBPF object of what is pinned
//! /sys/fs/bpf/smc/progs/<program>      the loaded programs
//! /sys/fs/bpf/smc/maps/<map>           the maps (the SOCKHASH holds the sk_msg attachment)
//! /sys/fs/bpf/smc/links/<cgroup inode>-<mode>-<program>   one bpf_link per cgroup and program
//! /sys/fs/bpf/smc/iter/smc_sweep       the sweep's iterator link (reading it runs the sweep)
//! ```
//!
//! The programs are loaded once, by the first `attach`; each further cgroup only adds links. The
//! detach of the last cgroup removes everything. [`trace`] (`smc-ctl trace`) switches the
//! programs' decision lines on (`maps/SMC_TRACE`) and prints them from aya-log's ring buffer.
use std::{
    collections::BTreeMap,
    fs,
    io::ErrorKind,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::{anyhow, bail, Context as _, Result};
use aya::{
    maps::{Array, Map, MapData, PerCpuArray, SockHash},
    programs::{links::FdLink, CgroupSockopt, Iter, ProgramInfo, SkMsg, SkSkb, SockOps},
    Btf, Ebpf,
};
use serde::Serialize;
use smc_common::bpf::{
    Counter, Mode, SockKey, TraceReason, CONFIG_NO_TCP_RECORDS, GETSOCKOPT_PROG, MAP_CONFIG,
    MAP_COUNTERS, MAP_LISTENERS, MAP_LOGS, MAP_PAIRS, MAP_PEERS, MAP_QUARANTINE, MAP_QUARANTINE_AT,
    MAP_SOCKHASH, MAP_SOCK_STATE, MAP_SWEEP, MAP_TCP_PEERS, MAP_TRACE, PIN_LAYOUT_VERSION,
    SETSOCKOPT_PROG, SK_MSG_PROG, SOCKOPS_PROG_ISM, SOCKOPS_PROG_SHORTCUT, SWEEP_PROG,
    VERDICT_PROG,
};

use crate::sys::{self, bpf_syscall};

/// Where everything is pinned.
pub const PIN_ROOT: &str = "/sys/fs/bpf/smc";
const BPFFS: &str = "/sys/fs/bpf";

static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/smc"));

/// What identifies the embedded eBPF object for the pins: FNV-1a over what the kernel gets from
/// it — the program sections with their relocations (offset and target symbol), the map
/// definitions, license and data sections. Debug info and BTF are left out: they name the build
/// directory, and two checkouts of the same sources must agree (their tests share the pins).
/// Programs pinned by another object are not ours to reuse.
fn object_hash() -> u64 {
    use object::{
        Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget, SectionKind,
    };
    fn fnv(h: u64, b: &[u8]) -> u64 {
        b.iter()
            .fold(h, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
    }
    let h = 0xcbf2_9ce4_8422_2325u64;
    let Ok(f) = object::File::parse(EBPF_OBJECT) else {
        return fnv(h, EBPF_OBJECT);
    };
    f.sections().fold(h, |mut h, s| {
        let name = s.name().unwrap_or_default();
        let kept = s.kind() == SectionKind::Text
            || matches!(
                name,
                "maps" | ".maps" | "license" | ".rodata" | ".data" | ".bss"
            );
        if !kept {
            return h;
        }
        h = fnv(h, name.as_bytes());
        h = fnv(h, s.data().unwrap_or_default());
        for (off, r) in s.relocations() {
            h = fnv(h, &off.to_le_bytes());
            if let RelocationTarget::Symbol(i) = r.target() {
                let sym = f.symbol_by_index(i).ok();
                h = fnv(
                    h,
                    sym.and_then(|s| s.name().ok())
                        .unwrap_or_default()
                        .as_bytes(),
                );
            }
        }
        h
    })
}

fn layout_marker_name() -> String {
    format!("layout-v{PIN_LAYOUT_VERSION}-{:016x}", object_hash())
}

fn layout_marker() -> PathBuf {
    Path::new(PIN_ROOT).join(layout_marker_name())
}

fn progs_dir() -> PathBuf {
    Path::new(PIN_ROOT).join("progs")
}

fn maps_dir() -> PathBuf {
    Path::new(PIN_ROOT).join("maps")
}

fn links_dir() -> PathBuf {
    Path::new(PIN_ROOT).join("links")
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Shortcut => "shortcut",
        Mode::Ism => "ism",
    }
}

fn parse_mode(s: &str) -> Option<Mode> {
    match s {
        "shortcut" => Some(Mode::Shortcut),
        "ism" => Some(Mode::Ism),
        _ => None,
    }
}

fn sockops_prog(mode: Mode) -> &'static str {
    match mode {
        Mode::Shortcut => SOCKOPS_PROG_SHORTCUT,
        Mode::Ism => SOCKOPS_PROG_ISM,
    }
}

/// The cgroup programs attached per cgroup, with the sock_ops one depending on the mode.
fn cgroup_progs(mode: Mode) -> [&'static str; 3] {
    [sockops_prog(mode), SETSOCKOPT_PROG, GETSOCKOPT_PROG]
}

/// Makes sure the pinned programs and maps exist and are of our layout; loads them if not.
fn ensure_loaded() -> Result<()> {
    sys::ensure_bpffs(BPFFS)?;
    let root = Path::new(PIN_ROOT);
    remove_if_foreign(root)?;
    if root.exists() {
        if !layout_marker().exists() {
            prune_removed_cgroups()?;
            if cleanup_if_unused()? {
                return ensure_loaded();
            }
            bail!(
                "{PIN_ROOT} holds programs loaded by another build of smc-ctl (want {}); \
                 detach its cgroups first (`smc-ctl status` lists them, `smc-ctl detach --all` removes them)",
                layout_marker_name()
            );
        }
        return Ok(());
    }
    let staging = Path::new(BPFFS).join(format!("smc-loading-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    // Made here, exclusively (the bpffs root is world-writable): what another uid made at this
    // name in the meantime fails the load instead of receiving our pins.
    fs::create_dir(&staging).with_context(|| format!("mkdir {}", staging.display()))?;
    let result = load_into(&staging);
    if let Err(e) = result {
        let _ = remove_pins(&staging);
        return Err(e);
    }
    // Publish atomically: a concurrent reader sees either nothing or a complete layout. A
    // foreign entry made at the pin root meanwhile is removed and the rename tried once more.
    let mut renamed = fs::rename(&staging, root);
    if renamed.is_err() && remove_if_foreign(root).unwrap_or(false) {
        renamed = fs::rename(&staging, root);
    }
    if let Err(e) = renamed {
        let _ = remove_pins(&staging);
        return Err(e).with_context(|| format!("rename {} to {PIN_ROOT}", staging.display()));
    }
    Ok(())
}

/// Removes `p` when another uid made it, or it is not a directory: `/sys/fs/bpf` is mode 1777
/// (bpffs's default), so while nothing is loaded any local user may make the pin root, e.g.
/// with a `links/<cgroup inode>-…` directory that reads as an attached cgroup of another build
/// and made every `attach` fail (red team rt24 `rt24_bpffs.sh`). Nothing of ours is in such a
/// tree (only root can pin), so it goes whole (a symlink itself, never its target). Returns
/// whether it removed something.
fn remove_if_foreign(p: &Path) -> Result<bool> {
    let md = match fs::symlink_metadata(p) {
        Ok(md) => md,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("stat {}", p.display())),
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.is_dir() && md.uid() == me {
        return Ok(false);
    }
    eprintln!(
        "smc-ctl: warning: {} was made by uid {} ({}), not by us: removed",
        p.display(),
        md.uid(),
        if md.is_dir() {
            "a directory"
        } else {
            "not a directory"
        }
    );
    let r = if md.is_dir() {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    };
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e).with_context(|| format!("remove {}", p.display())),
    }
}

fn load_into(dir: &Path) -> Result<()> {
    for d in ["progs", "maps", "links", "iter"] {
        fs::create_dir_all(dir.join(d)).with_context(|| format!("mkdir {}", dir.display()))?;
    }
    let mut ebpf = Ebpf::load(EBPF_OBJECT).map_err(|e| {
        anyhow!(
            "loading the eBPF object failed ({e}); is BPF available (CONFIG_BPF_SYSCALL, CAP_BPF)?"
        )
    })?;
    for name in [SOCKOPS_PROG_SHORTCUT, SOCKOPS_PROG_ISM] {
        let prog: &mut SockOps = program(&mut ebpf, name)?.try_into()?;
        prog.load()
            .with_context(|| format!("verifier rejected {name}"))?;
        prog.pin(dir.join("progs").join(name))?;
    }
    for name in [SETSOCKOPT_PROG, GETSOCKOPT_PROG] {
        let prog: &mut CgroupSockopt = program(&mut ebpf, name)?.try_into()?;
        prog.load()
            .with_context(|| format!("verifier rejected {name}"))?;
        prog.pin(dir.join("progs").join(name))?;
    }
    for name in [
        MAP_SOCK_STATE,
        MAP_PEERS,
        MAP_PAIRS,
        MAP_TCP_PEERS,
        MAP_SOCKHASH,
        MAP_COUNTERS,
        MAP_LISTENERS,
        MAP_TRACE,
        MAP_LOGS,
        MAP_CONFIG,
        MAP_QUARANTINE,
        MAP_QUARANTINE_AT,
        MAP_SWEEP,
    ] {
        let map = ebpf
            .map(name)
            .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))?;
        map.pin(dir.join("maps").join(name))
            .with_context(|| format!("pin map {name}"))?;
    }
    let sockhash: SockHash<_, SockKey> = SockHash::try_from(
        ebpf.map(MAP_SOCKHASH)
            .ok_or_else(|| anyhow!("no {MAP_SOCKHASH}"))?,
    )?;
    let map_fd = sockhash.fd().try_clone()?;
    let prog: &mut SkMsg = program(&mut ebpf, SK_MSG_PROG)?.try_into()?;
    prog.load()
        .with_context(|| format!("verifier rejected {SK_MSG_PROG}"))?;
    let link = prog.attach(&map_fd)?;
    // The attachment belongs to the (pinned) map from now on.
    std::mem::forget(prog.take_link(link)?);
    prog.pin(dir.join("progs").join(SK_MSG_PROG))?;
    load_quarantine(&mut ebpf, dir)?;
    fs::create_dir(dir.join(layout_marker_name()))?;
    Ok(())
}

/// The quarantine (see `smc-ebpf`'s `quarantine.rs`): the stream verdict on its SOCKHASH, and
/// the sweep iterator pinned as a link that the daemon opens to run it.
fn load_quarantine(ebpf: &mut Ebpf, dir: &Path) -> Result<()> {
    let map: SockHash<_, u64> = SockHash::try_from(
        ebpf.map(MAP_QUARANTINE)
            .ok_or_else(|| anyhow!("no {MAP_QUARANTINE}"))?,
    )?;
    let map_fd = map.fd().try_clone()?;
    let prog: &mut SkSkb = program(ebpf, VERDICT_PROG)?.try_into()?;
    prog.load()
        .with_context(|| format!("verifier rejected {VERDICT_PROG}"))?;
    let link = prog.attach(&map_fd)?;
    // The attachment belongs to the (pinned) map from now on.
    std::mem::forget(prog.take_link(link)?);
    prog.pin(dir.join("progs").join(VERDICT_PROG))?;
    let btf = Btf::from_sys_fs().context("the kernel's BTF (/sys/kernel/btf/vmlinux)")?;
    let prog: &mut Iter = program(ebpf, SWEEP_PROG)?.try_into()?;
    prog.load("tcp", &btf)
        .with_context(|| format!("verifier rejected {SWEEP_PROG}"))?;
    let link = prog.attach()?;
    let link = FdLink::try_from(prog.take_link(link)?)?;
    link.pin(dir.join("iter").join(SWEEP_PROG))
        .with_context(|| format!("pin the {SWEEP_PROG} iterator"))?;
    prog.pin(dir.join("progs").join(SWEEP_PROG))?;
    Ok(())
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))
}

/// One attached cgroup, from the link pins.
#[derive(Debug, Serialize, Clone)]
pub struct Attached {
    pub cgroup: String,
    pub cgroup_id: u64,
    pub mode: String,
    /// Whether connections that cannot become SMC-D leave same-host records
    /// (`--tcp-records`; `None`: not readable, e.g. attached by an older build).
    pub tcp_records: Option<bool>,
    pub links: Vec<String>,
}

fn link_name(ino: u64, mode: Mode, prog: &str) -> String {
    format!("{ino}-{}-{prog}", mode_name(mode))
}

fn attached_links() -> Result<BTreeMap<u64, (Mode, Vec<PathBuf>)>> {
    let mut out: BTreeMap<u64, (Mode, Vec<PathBuf>)> = BTreeMap::new();
    let dir = match fs::read_dir(links_dir()) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).context("read links"),
    };
    for entry in dir {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut parts = name.splitn(3, '-');
        let (Some(ino), Some(mode), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let (Ok(ino), Some(mode)) = (ino.parse::<u64>(), parse_mode(mode)) else {
            continue;
        };
        out.entry(ino)
            .or_insert((mode, Vec::new()))
            .1
            .push(entry.path());
    }
    Ok(out)
}

/// The attached cgroup whose programs apply to `cg` (canonical): `cg` itself or its nearest
/// attached ancestor (cgroup programs are inherited), with its mode.
pub fn enabled_by(cg: &Path) -> Result<Option<(PathBuf, Mode)>> {
    let links = attached_links()?;
    let root = sys::cgroup2_root()?;
    let mut dir = Some(cg);
    while let Some(d) = dir {
        if let Ok(md) = fs::metadata(d) {
            if let Some((mode, _)) = links.get(&md.ino()) {
                return Ok(Some((d.to_path_buf(), *mode)));
            }
        }
        if d == root {
            break;
        }
        dir = d.parent();
    }
    Ok(None)
}

/// Per attached cgroup settings (`MAP_CONFIG`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttachConfig {
    /// Connections that cannot become SMC-D leave same-host records (`SMC_TCP_PEERS`).
    pub tcp_records: bool,
}

impl AttachConfig {
    /// What a cgroup newly attached in `mode` gets when nothing is asked: no records of
    /// connections that stay TCP in ism mode (they cost such a connection 2.2–2.4 µs of eBPF
    /// instead of 0.6–0.7, docs/PERF.md; `conns` finds their same-host peers in the TCP
    /// tables); shortcut mode tracks every socket.
    pub fn default_for(mode: Mode) -> AttachConfig {
        AttachConfig {
            tcp_records: mode == Mode::Shortcut,
        }
    }

    fn bits(self) -> u32 {
        if self.tcp_records {
            0
        } else {
            CONFIG_NO_TCP_RECORDS
        }
    }
}

/// The attach types whose programs read `MAP_CONFIG`: each has its own entry per cgroup.
const CONFIG_ATTACH_TYPES: [u32; 2] = [
    bpf_syscall::BPF_CGROUP_SOCK_OPS,
    bpf_syscall::BPF_CGROUP_GETSOCKOPT,
];

#[allow(deprecated)] // aya's name for BPF_MAP_TYPE_CGROUP_STORAGE, see smc-ebpf's maps.rs
fn config_map() -> Result<aya::maps::CgroupStorage<MapData, u32>> {
    let data = MapData::from_pin(maps_dir().join(MAP_CONFIG)).context("open pinned config")?;
    Ok(aya::maps::CgroupStorage::try_from(Map::CgroupStorage(
        data,
    ))?)
}

/// Writes the settings of attached cgroup `ino` into its entries (which the kernel made at the
/// attach; until this write its sockets see zero: records kept, the behaviour of the default).
#[allow(deprecated)]
fn write_config(ino: u64, cfg: AttachConfig) -> Result<()> {
    let mut map = config_map()?;
    for t in CONFIG_ATTACH_TYPES {
        map.insert(aya::maps::CgroupStorageKey::new(ino, t), cfg.bits(), 0)
            .with_context(|| format!("write the settings of cgroup {ino} (attach type {t})"))?;
    }
    Ok(())
}

/// The settings of attached cgroup `ino` (`None` when they cannot be read).
#[allow(deprecated)]
fn read_config(ino: u64) -> Option<AttachConfig> {
    let bits = config_map()
        .ok()?
        .get(
            aya::maps::CgroupStorageKey::new(ino, bpf_syscall::BPF_CGROUP_SOCK_OPS),
            0,
        )
        .ok()?;
    Some(AttachConfig {
        tcp_records: bits & CONFIG_NO_TCP_RECORDS == 0,
    })
}

fn config_text(cfg: AttachConfig) -> &'static str {
    if cfg.tcp_records {
        "tcp records on"
    } else {
        "tcp records off"
    }
}

/// `smc-ctl attach`. Attaching a cgroup attached in the same mode again applies `cfg` to it
/// (`None`: keeps its settings; for a new attach, [`AttachConfig::default_for`] the mode).
pub fn attach(cgroup: &Path, mode: Mode, cfg: Option<AttachConfig>) -> Result<String> {
    sys::require_root()?;
    // Shortcut mode records every socket (its program never reads the setting, so the kernel
    // makes no entry for it).
    if mode == Mode::Shortcut && cfg.is_some_and(|c| c != AttachConfig::default_for(mode)) {
        bail!("--tcp-records off applies to --mode ism only (shortcut mode tracks every socket)");
    }
    let cg = sys::check_cgroup2_dir(cgroup)?;
    let ino = fs::metadata(&cg)?.ino();
    // What the kernel lacks, said clearly instead of a verifier dump or a bare EPERM.
    crate::probe::require()?;
    let _lock = sys::lock()?;
    ensure_loaded()?;
    // Links of cgroups removed while attached are defunct: drop them (an inode may be reused).
    prune_removed_cgroups()?;
    if let Some((have, _)) = attached_links()?.get(&ino) {
        if *have == mode && mode == Mode::Shortcut {
            return Ok(format!(
                "{} already attached (mode {})",
                cg.display(),
                mode_name(mode)
            ));
        }
        if *have == mode {
            let before = read_config(ino);
            let Some(cfg) = cfg.or(before) else {
                return Ok(format!(
                    "{} already attached (mode {})",
                    cg.display(),
                    mode_name(mode)
                ));
            };
            if before == Some(cfg) {
                return Ok(format!(
                    "{} already attached (mode {}, {})",
                    cg.display(),
                    mode_name(mode),
                    config_text(cfg)
                ));
            }
            write_config(ino, cfg)?;
            return Ok(format!(
                "{} already attached (mode {}); now {}",
                cg.display(),
                mode_name(mode),
                config_text(cfg)
            ));
        }
        bail!(
            "{} is attached in mode {}; detach it first to change the mode",
            cg.display(),
            mode_name(*have)
        );
    }
    let cfg = cfg.unwrap_or(AttachConfig::default_for(mode));
    let cg_file = fs::File::open(&cg).with_context(|| format!("open {}", cg.display()))?;
    let mut pinned = Vec::new();
    let res = (|| -> Result<()> {
        for prog in cgroup_progs(mode) {
            let attach_type = match prog {
                SETSOCKOPT_PROG => bpf_syscall::BPF_CGROUP_SETSOCKOPT,
                GETSOCKOPT_PROG => bpf_syscall::BPF_CGROUP_GETSOCKOPT,
                _ => bpf_syscall::BPF_CGROUP_SOCK_OPS,
            };
            let prog_fd = bpf_syscall::obj_get(&progs_dir().join(prog))
                .with_context(|| format!("open pinned program {prog}"))?;
            let link = bpf_syscall::link_create(&prog_fd, &cg_file, attach_type)
                .with_context(|| format!("attach {prog}"))?;
            let dst = links_dir().join(link_name(ino, mode, prog));
            bpf_syscall::obj_pin(&link, &dst).with_context(|| format!("pin {}", dst.display()))?;
            pinned.push(dst);
        }
        match mode {
            Mode::Ism => write_config(ino, cfg),
            Mode::Shortcut => Ok(()),
        }
    })();
    if let Err(e) = res {
        for p in pinned {
            unpin_link(&p);
        }
        cleanup_if_unused()?;
        return Err(e.context(format!("attach to {}", cg.display())));
    }
    Ok(match mode {
        Mode::Ism => format!(
            "attached {} (mode {}, {})",
            cg.display(),
            mode_name(mode),
            config_text(cfg)
        ),
        Mode::Shortcut => format!("attached {} (mode {})", cg.display(), mode_name(mode)),
    })
}

/// Removing the pin drops the last reference to the link: the program is detached.
fn unpin_link(path: &Path) {
    let _ = fs::remove_file(path);
}

/// `smc-ctl detach --all`: every cgroup, then unload.
pub fn detach_all() -> Result<String> {
    sys::require_root()?;
    let _lock = sys::lock()?;
    let links = attached_links()?;
    for (_, paths) in links.values() {
        for p in paths {
            unpin_link(p);
        }
    }
    cleanup_if_unused()?;
    Ok(format!(
        "detached {} cgroup(s); programs unloaded",
        links.len()
    ))
}

/// `smc-ctl detach`.
pub fn detach(cgroup: &Path) -> Result<String> {
    sys::require_root()?;
    let Ok(cg) = fs::canonicalize(cgroup) else {
        // Removed while attached: its links are defunct; unpin them (and unload when it was
        // the last cgroup).
        let _lock = sys::lock()?;
        let before = attached_links()?.len();
        let unloaded = cleanup_if_unused()?;
        let pruned = before - attached_links()?.len();
        if pruned == 0 && !unloaded {
            bail!(
                "{} does not exist and no removed cgroup is attached",
                cgroup.display()
            );
        }
        return Ok(format!(
            "{} no longer exists; unpinned the links of {pruned} removed cgroup(s){}",
            cgroup.display(),
            if unloaded {
                "; no cgroup left, programs unloaded"
            } else {
                ""
            }
        ));
    };
    let ino = fs::metadata(&cg)?.ino();
    let _lock = sys::lock()?;
    let links = attached_links()?;
    let Some((_, paths)) = links.get(&ino) else {
        bail!("{} is not attached", cg.display());
    };
    for p in paths {
        unpin_link(p);
    }
    let unloaded = cleanup_if_unused()?;
    Ok(if unloaded {
        format!(
            "detached {}; no cgroup left, programs unloaded",
            cg.display()
        )
    } else {
        format!("detached {}", cg.display())
    })
}

/// Unpins the links of cgroups that were removed while attached (their links are defunct).
fn prune_removed_cgroups() -> Result<()> {
    let links = attached_links()?;
    let found = sys::cgroup_paths_by_inode(links.keys().copied().collect());
    for (ino, (_, paths)) in links {
        if !found.contains_key(&ino) {
            for p in paths {
                unpin_link(&p);
            }
        }
    }
    Ok(())
}

/// Removes everything when no cgroup is attached any more. Returns whether it did.
fn cleanup_if_unused() -> Result<bool> {
    prune_removed_cgroups()?;
    if !Path::new(PIN_ROOT).exists() || !attached_links()?.is_empty() {
        return Ok(false);
    }
    remove_pins(Path::new(PIN_ROOT))?;
    Ok(true)
}

fn remove_pins(root: &Path) -> Result<()> {
    for d in ["links", "iter", "progs", "maps"] {
        if let Ok(rd) = fs::read_dir(root.join(d)) {
            for e in rd.flatten() {
                fs::remove_file(e.path())
                    .with_context(|| format!("unpin {}", e.path().display()))?;
            }
        }
    }
    match fs::remove_dir_all(root) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("remove {}", root.display())),
    }
}

/// Sums the per-CPU counters from the pinned map; all zero when nothing is loaded.
pub fn counters() -> Result<BTreeMap<&'static str, u64>> {
    let mut out: BTreeMap<&'static str, u64> = Counter::ALL.iter().map(|c| (c.name(), 0)).collect();
    let path = maps_dir().join(MAP_COUNTERS);
    if !path.exists() {
        return Ok(out);
    }
    let data = MapData::from_pin(&path).context("open pinned counters")?;
    let arr: PerCpuArray<_, u64> = PerCpuArray::try_from(Map::PerCpuArray(data))?;
    for c in Counter::ALL {
        let values = arr.get(&(c as u32), 0)?;
        out.insert(c.name(), values.iter().sum());
    }
    Ok(out)
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub loaded: bool,
    pub pin_root: &'static str,
    /// This build's pin layout marker; programs pinned under another are another build's.
    pub layout: String,
    pub programs: BTreeMap<String, u32>,
    pub cgroups: Vec<Attached>,
    pub counters: BTreeMap<&'static str, u64>,
}

/// `smc-ctl status`.
pub fn status() -> Result<Status> {
    sys::require_root()?;
    let loaded = progs_dir().exists();
    let mut programs = BTreeMap::new();
    if loaded {
        for e in fs::read_dir(progs_dir())?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let info = aya::programs::ProgramInfo::from_pin(e.path())
                .with_context(|| format!("program {name}"))?;
            programs.insert(name, info.id());
        }
    }
    let mut cgroups = Vec::new();
    let links = attached_links()?;
    let paths = sys::cgroup_paths_by_inode(links.keys().copied().collect());
    for (ino, (mode, links)) in links {
        cgroups.push(Attached {
            cgroup: paths
                .get(&ino)
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| format!("<cgroup inode {ino}, removed>")),
            cgroup_id: ino,
            mode: mode_name(mode).into(),
            tcp_records: match mode {
                Mode::Ism => read_config(ino).map(|c| c.tcp_records),
                Mode::Shortcut => Some(true),
            },
            links: links
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect(),
        });
    }
    Ok(Status {
        loaded,
        pin_root: PIN_ROOT,
        layout: layout_marker_name(),
        programs,
        cgroups,
        counters: counters()?,
    })
}

/// Prints aya-log records (the programs' decision lines) on stdout, one line each.
struct TracePrinter;

impl log::Log for TracePrinter {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        println!("{}", trace_text(&record.args().to_string()));
    }

    fn flush(&self) {}
}

/// The words of a decision line `"<reason> <local port> <remote port>"` (as written by the
/// programs); a line of another form as it is.
fn trace_text(line: &str) -> String {
    let mut it = line.split_whitespace().map(str::parse::<u32>);
    let (Some(Ok(code)), Some(Ok(local)), Some(Ok(remote)), None) =
        (it.next(), it.next(), it.next(), it.next())
    else {
        return line.to_owned();
    };
    let Some(r) = TraceReason::from_code(code) else {
        return line.to_owned();
    };
    if r.has_remote() {
        format!("{} {local}->{remote}: {}", r.event(), r.text())
    } else {
        format!("{} {local}: {}", r.event(), r.text())
    }
}

/// Sets the trace switch (`maps/SMC_TRACE`, entry 0).
fn set_trace(on: bool) -> Result<()> {
    let data = MapData::from_pin(maps_dir().join(MAP_TRACE)).context("open pinned SMC_TRACE")?;
    let mut arr: Array<_, u32> = Array::try_from(Map::Array(data))?;
    arr.set(0, u32::from(on), 0).context("set SMC_TRACE")?;
    Ok(())
}

/// `smc-ctl trace`: switches the programs' decision lines on and prints them until SIGINT or
/// SIGTERM (or `duration`), then switches them off. One trace at a time: the lines go to
/// whichever reader takes them from the ring buffer, and the first to stop switches them off.
pub fn trace(duration: Option<std::time::Duration>) -> Result<()> {
    sys::require_root()?;
    if !layout_marker().exists() {
        bail!("the eBPF programs of this build are not loaded: attach a cgroup first (`smc-ctl attach`)");
    }
    // aya-log finds its ring buffer among the maps of a (pinned) program of the object.
    let info = ProgramInfo::from_pin(progs_dir().join(SOCKOPS_PROG_ISM))
        .context("open pinned sock_ops program")?;
    let mut logger = aya_log::EbpfLogger::init_from_id_with_logger(info.id(), TracePrinter)
        .with_context(|| format!("open the {MAP_LOGS} ring buffer"))?;
    let signals = sys::SignalFd::new(&[libc::SIGINT, libc::SIGTERM])?;
    set_trace(true)?;
    eprintln!("tracing the eBPF programs' decisions (SIGINT or SIGTERM stops)");
    let deadline = duration.map(|d| std::time::Instant::now() + d);
    let res = (|| -> Result<()> {
        loop {
            let timeout = match deadline {
                Some(d) => match d.checked_duration_since(std::time::Instant::now()) {
                    Some(left) => left,
                    None => return Ok(()),
                },
                None => std::time::Duration::from_secs(3600),
            };
            let (ring, signal) = sys::poll2(&logger, &signals, timeout)?;
            if ring {
                logger.flush();
            }
            if signal {
                signals.take()?;
                return Ok(());
            }
        }
    })();
    let off = set_trace(false);
    logger.flush();
    res.and(off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_lines_get_their_words() {
        for r in TraceReason::ALL {
            assert_eq!(TraceReason::from_code(r as u32), Some(r));
        }
        assert_eq!(
            trace_text("8 48320 42139"),
            "established 48320->42139: the peer did not announce SMC: stays TCP"
        );
        assert_eq!(trace_text("4 42059 0"), "listen 42059: announces SMC");
        // Not a decision line of this build: shown as it came.
        assert_eq!(trace_text("99 1 2"), "99 1 2");
        assert_eq!(trace_text("hello"), "hello");
    }
}
