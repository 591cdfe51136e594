//! `smc-ctl conns`: one line per TCP connection of the attached cgroups, like `smcss`.
//!
//! Sources, joined per socket:
//! - the processes of every attached cgroup (and its descendants): `cgroup.procs`, their
//!   socket fds (`/proc/<pid>/fd`), command and uid;
//! - the TCP tables of their network namespaces (`/proc/<pid>/net/tcp{,6}`): state, addresses;
//! - the eBPF view (`SMC_PEERS`, pinned): for every established socket of an attached cgroup
//!   whether it opted in, announced SMC, saw the peer announce it, has its peer on this host,
//!   takes the shortcut;
//! - the loopback-ism daemon's DMB list: a connection whose 4-tuple owns a live DMB runs SMC-D
//!   (tokens and sizes with `-d`, tokens only for root);
//! - the data path's per-connection records in its per-process file, when it writes them
//!   ([`smc_stats::ConnRecord`]): the exact mode, decline reason and bytes.
//!
//! Without a record the mode is inferred: `SMCD` (a live DMB of the daemon), `SHORTCUT` (a
//! shortcut-mode cgroup whose peer is a registered local socket) or `TCP` with why:
//! `PEERNOSMC` (opted in, the peer did not announce SMC), `NOT_ENABLED` (the process is not
//! under `smc-ctl run`), `DECLINED` (both announced SMC but the CLC handshake declined: the
//! process's recorded decline codes are listed), `NOSMCDDEV` (no daemon), `NO_LOCAL_PEER`
//! (shortcut mode, peer elsewhere), `UNTRACKED` (established before the cgroup was attached),
//! `UNRECORDED` (a cgroup attached with `--tcp-records off`, whose connections that could not
//! become SMC-D leave no eBPF record: both ends run the library, or the other end is not
//! found, so why is not known here). For such a cgroup `same_host`, `NOT_ENABLED` and
//! `PEERNOSMC` come from the TCP tables (the socket with the mirrored 4-tuple) and from which
//! processes map the library, source `proc`.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use anyhow::Result;
use aya::maps::{HashMap as BpfHashMap, Map, MapData};
use serde::Serialize;
use smc_common::{
    bpf::{
        own_netns_cookie, PeerEntry, SockKey, MAP_PEERS, MAP_TCP_PEERS, SOCK_OPTED_IN,
        SOCK_OPT_SENT, SOCK_PEER_SMC, SOCK_SAME_HOST, SOCK_SHORTCUT,
    },
    diag,
};
use smc_stats::{self as procstats, ConnState};

use crate::bpf;

/// One connection (one end), as printed by `conns` and counted by `stats`.
#[derive(Clone, Debug, Serialize)]
pub struct ConnInfo {
    /// TCP state (`ESTABLISHED`, `LISTEN`, …).
    pub state: &'static str,
    pub pid: u32,
    pub command: String,
    pub uid: u32,
    pub inode: u64,
    /// The process's cgroup (path) and its id (directory inode).
    pub cgroup: String,
    pub cgroup_id: u64,
    /// Mode of the attached cgroup the process is under (`ism` / `shortcut`).
    pub cgroup_mode: String,
    pub local: String,
    pub peer: String,
    /// `SMCD`, `SHORTCUT`, `TCP`, or `CLC` (handshake running, from a record).
    pub mode: &'static str,
    /// For `TCP`: the decline name or why (see the module docs).
    pub reason: Option<String>,
    /// For `TCP` with a CLC decline code: the code (`0x03010000`).
    pub reason_code: Option<String>,
    /// Both ends on this host (eBPF view).
    pub same_host: bool,
    /// Where the mode comes from: `record`, `daemon`, `ebpf`, `maps`, `proc`.
    pub source: &'static str,
    /// eBPF flags of the socket (`opted_in`, `opt_sent`, `peer_smc`, `same_host`, `shortcut`).
    pub flags: Vec<&'static str>,
    pub own_token: Option<String>,
    pub peer_token: Option<String>,
    /// DMB sizes (the ring is 32 bytes less: the CDC header).
    pub own_dmb_size: Option<u64>,
    pub peer_dmb_size: Option<u64>,
    /// Bytes moved (from a record, or from the producer cursors: exact below 65536 ring
    /// wraps).
    pub rx_bytes: Option<u64>,
    pub tx_bytes: Option<u64>,
    /// The CDC cursors of both directions (`wrap:count`), read from the two DMBs as this
    /// end maps them (root, with the daemon's DMB list): what the peer produced into our ring
    /// and what we published as consumed; what we produced into the peer's ring and what it
    /// consumed.
    pub cursors: Option<Cursors>,
    /// Shutdown state like smcss: `R` our reading side is done (the peer finished writing,
    /// closed or aborted), `W` we finished writing; `<->` both open.
    pub shutdown: Option<String>,
}

/// CDC cursors of one end.
#[derive(Clone, Debug, Serialize)]
pub struct Cursors {
    pub rx_prod: String,
    pub rx_cons: String,
    /// Connection-state flags the peer wrote (hex).
    pub rx_flags: String,
    pub tx_prod: String,
    pub tx_cons: String,
    /// Our connection-state flags (hex).
    pub tx_flags: String,
}

/// What `conns` (and `stats`) could see.
#[derive(Debug, Default, Serialize)]
pub struct Notes {
    /// The pinned eBPF maps exist.
    pub ebpf_loaded: bool,
    /// The daemon answered the DMB list.
    pub daemon_running: bool,
    pub daemon_error: Option<String>,
    /// Processes whose file carries connection records.
    pub processes_with_records: usize,
    /// Processes scanned.
    pub processes: usize,
    /// Attached cgroups scanned.
    pub cgroups: Vec<String>,
}

pub struct Options {
    pub socket: PathBuf,
    pub procs_dir: PathBuf,
    /// Only processes in this cgroup (and its descendants).
    pub cgroup: Option<PathBuf>,
    /// Include listening sockets.
    pub listening: bool,
}

fn parse_hex_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.split_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let ip = match a.len() {
        8 => {
            let v = u32::from_str_radix(a, 16).ok()?;
            IpAddr::V4(Ipv4Addr::from(v.to_ne_bytes()))
        }
        32 => {
            let mut o = [0u8; 16];
            for i in 0..4 {
                let v = u32::from_str_radix(&a[i * 8..i * 8 + 8], 16).ok()?;
                o[i * 4..i * 4 + 4].copy_from_slice(&v.to_ne_bytes());
            }
            let v6 = Ipv6Addr::from(o);
            match v6.to_ipv4_mapped() {
                Some(v4) => IpAddr::V4(v4),
                None => IpAddr::V6(v6),
            }
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

struct TcpEntry {
    state: &'static str,
    local: SocketAddr,
    peer: SocketAddr,
}

/// One network namespace's TCP table: socket inode → entry, and (local, peer) → inode of the
/// connected sockets, to find a connection's other end on this host.
#[derive(Default)]
struct NsTable {
    by_inode: HashMap<u64, TcpEntry>,
    by_tuple: HashMap<(SocketAddr, SocketAddr), u64>,
}

impl NsTable {
    fn read(pid: u32) -> NsTable {
        let mut t = NsTable::default();
        tcp_table(pid, &mut t.by_inode);
        for (&ino, e) in &t.by_inode {
            if e.state != "LISTEN" {
                t.by_tuple.insert((e.local, e.peer), ino);
            }
        }
        t
    }
}

/// The other end of the connection `t` of namespace `ns` on this host, from the TCP tables
/// alone (for sockets the eBPF programs keep no record of, `--tcp-records off`): the socket
/// with the mirrored 4-tuple in the same namespace, or, for an address that is not loopback
/// (each namespace has its own), in another scanned one. `(namespace, inode)`.
fn mirror_end(tables: &HashMap<u64, NsTable>, ns: u64, t: &TcpEntry) -> Option<(u64, u64)> {
    let key = (t.peer, t.local);
    if let Some(&ino) = tables.get(&ns).and_then(|x| x.by_tuple.get(&key)) {
        return Some((ns, ino));
    }
    if t.peer.ip().is_loopback() {
        return None;
    }
    tables
        .iter()
        .find_map(|(&n, x)| Some((n, *x.by_tuple.get(&key)?)).filter(|_| n != ns))
}

/// Whether process `pid` maps the data path's library.
fn runs_library(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.contains(crate::run::PRELOAD_LIB))
}

/// `/proc/<pid>/net/tcp` and `tcp6`: socket inode → entry.
fn tcp_table(pid: u32, out: &mut HashMap<u64, TcpEntry>) {
    for f in ["tcp", "tcp6"] {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/net/{f}")) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let c: Vec<&str> = line.split_whitespace().collect();
            if c.len() < 10 {
                continue;
            }
            let (Some(local), Some(peer)) = (parse_hex_addr(c[1]), parse_hex_addr(c[2])) else {
                continue;
            };
            let st = u8::from_str_radix(c[3], 16).unwrap_or(0);
            let Ok(inode) = c[9].parse::<u64>() else {
                continue;
            };
            if inode == 0 {
                continue;
            }
            out.insert(
                inode,
                TcpEntry {
                    state: procstats::tcp_state_name(st).unwrap_or("UNKNOWN"),
                    local,
                    peer,
                },
            );
        }
    }
}

/// The network namespace cookie (`SO_NETNS_COOKIE`, the eBPF programs' `bpf_get_netns_cookie`)
/// of process `pid`'s network namespace: a socket made there by a thread that joins it.
fn netns_cookie(pid: u32) -> Option<u64> {
    let ns = fs::File::open(format!("/proc/{pid}/ns/net")).ok()?;
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd as _;
        // SAFETY: `ns` is an open namespace file; `setns` changes only this thread's network
        // namespace, and the thread ends right after.
        if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return None;
        }
        own_netns_cookie().ok()
    })
    .join()
    .ok()
    .flatten()
}

/// Every entry of the pinned `SMC_PEERS` map, and of `SMC_TCP_PEERS` (sockets of ism-mode
/// cgroups that never opted in) where `SMC_PEERS` has none (`None` when nothing is loaded).
pub fn peers_map() -> Option<HashMap<SockKey, PeerEntry>> {
    let mut all = pinned_peers(MAP_TCP_PEERS).unwrap_or_default();
    all.extend(pinned_peers(MAP_PEERS)?);
    Some(all)
}

fn pinned_peers(name: &str) -> Option<HashMap<SockKey, PeerEntry>> {
    let path = Path::new(bpf::PIN_ROOT).join("maps").join(name);
    let data = MapData::from_pin(&path).ok()?;
    let map: BpfHashMap<_, SockKey, PeerEntry> =
        BpfHashMap::try_from(Map::from_map_data(data).ok()?).ok()?;
    Some(map.iter().filter_map(|r| r.ok()).collect())
}

fn flag_names(f: u32) -> Vec<&'static str> {
    [
        (SOCK_OPTED_IN, "opted_in"),
        (SOCK_OPT_SENT, "opt_sent"),
        (SOCK_PEER_SMC, "peer_smc"),
        (SOCK_SAME_HOST, "same_host"),
        (SOCK_SHORTCUT, "shortcut"),
    ]
    .iter()
    .filter(|(b, _)| f & b != 0)
    .map(|(_, n)| *n)
    .collect()
}

/// A process of an attached cgroup.
struct ProcInfo {
    pid: u32,
    cgroup: PathBuf,
    cgroup_id: u64,
    mode: String,
    /// The attached cgroup keeps records of connections that cannot become SMC-D.
    records: bool,
}

/// Every cgroup directory at or below `dir`, with its id.
pub fn cgroup_tree(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(md) = fs::metadata(&d) else {
            continue;
        };
        out.push((d.clone(), md.ino()));
        if let Ok(rd) = fs::read_dir(&d) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(e.path());
                }
            }
        }
    }
    out
}

fn pids_of(cg: &Path) -> Vec<u32> {
    fs::read_to_string(cg.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The attached cgroups (path, mode), limited to `filter` (a cgroup directory: its attached
/// ancestor or descendants) when given.
fn scanned_cgroups(filter: Option<&Path>) -> Result<Vec<(PathBuf, String, bool)>> {
    let st = bpf::status()?;
    let mut out = Vec::new();
    let filter = match filter {
        Some(f) => Some(fs::canonicalize(f)?),
        None => None,
    };
    for a in st.cgroups {
        let p = PathBuf::from(&a.cgroup);
        if !p.exists() {
            continue;
        }
        let records = a.tcp_records.unwrap_or(true);
        match &filter {
            None => out.push((p, a.mode, records)),
            Some(f) if f.starts_with(&p) => out.push((f.clone(), a.mode, records)),
            Some(f) if p.starts_with(f) => out.push((p, a.mode, records)),
            Some(_) => {}
        }
    }
    out.sort();
    out.dedup_by(|a, b| a.0 == b.0);
    Ok(out)
}

fn processes(cgroups: &[(PathBuf, String, bool)]) -> Vec<ProcInfo> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for (root, mode, records) in cgroups {
        for (dir, id) in cgroup_tree(root) {
            for pid in pids_of(&dir) {
                if seen.insert(pid) {
                    out.push(ProcInfo {
                        pid,
                        cgroup: dir.clone(),
                        cgroup_id: id,
                        mode: mode.clone(),
                        records: *records,
                    });
                }
            }
        }
    }
    out
}

fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(rd) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .filter_map(|l| {
            l.to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// `/proc/<pid>/maps` entries of DMBs: inode → `start-end`.
fn dmb_mappings(pid: u32) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    for l in fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .lines()
    {
        if !l.contains("memfd:smc-dmb") {
            continue;
        }
        let f: Vec<&str> = l.split_whitespace().collect();
        if let (Some(range), Some(ino)) = (f.first(), f.get(4).and_then(|i| i.parse().ok())) {
            out.entry(ino).or_insert_with(|| range.to_string());
        }
    }
    out
}

/// The CDC header at the start of a DMB mapped by `pid` (read through `map_files`: root).
fn read_cdc(pid: u32, range: &str) -> Option<smc_common::cdc::CdcMsg> {
    use std::os::unix::fs::FileExt as _;
    let f = fs::File::open(format!("/proc/{pid}/map_files/{range}")).ok()?;
    let mut b = [0u8; smc_common::cdc::CDC_HEADER_LEN];
    f.read_exact_at(&mut b, 0).ok()?;
    smc_common::cdc::CdcMsg::from_bytes(&b).ok()
}

/// Cursors, shutdown state and bytes of an SMC-D end from its two DMBs.
/// `maps`: the process's DMB mappings ([`dmb_mappings`], read once per process: its maps file
/// lists every DMB it maps, thousands of lines for a process with thousands of connections).
fn cdc_details(
    c: &mut ConnInfo,
    pid: u32,
    maps: &HashMap<u64, String>,
    own: &smc_ism::DmbInfo,
    peer: &smc_ism::DmbInfo,
) {
    use smc_common::cdc::{ConnStateFlags, Cursor};
    let (Some(oi), Some(pi)) = (own.inode, peer.inode) else {
        return;
    };
    let (Some(om), Some(pm)) = (maps.get(&oi), maps.get(&pi)) else {
        return;
    };
    let (Some(o), Some(p)) = (read_cdc(pid, om), read_cdc(pid, pm)) else {
        return;
    };
    let hdr = smc_common::cdc::CDC_HEADER_LEN as u64;
    let cur = |x: Cursor| format!("{:04x}:{:08x}", x.wrap, x.count);
    let moved = |x: Cursor, dmb: u64| x.wrap as u64 * dmb.saturating_sub(hdr) + x.count as u64;
    // Our DMB is written by the peer: its producer word and, in its consumer word, how far it
    // consumed its own ring plus its flags. The peer's DMB carries ours.
    let (theirs, mine) = (o.cons.conn_state, p.cons.conn_state);
    c.cursors = Some(Cursors {
        rx_prod: cur(o.prod.cursor),
        rx_cons: cur(p.cons.cursor),
        rx_flags: format!("{:02x}", theirs.0),
        tx_prod: cur(p.prod.cursor),
        tx_cons: cur(o.cons.cursor),
        tx_flags: format!("{:02x}", mine.0),
    });
    c.rx_bytes = Some(moved(o.prod.cursor, own.size));
    c.tx_bytes = Some(moved(p.prod.cursor, peer.size));
    let done = |f: ConnStateFlags| f.any_close_or_done();
    c.shutdown = Some(format!(
        "{}-{}",
        if done(theirs) { 'R' } else { '<' },
        if done(mine) { 'W' } else { '>' }
    ));
}

fn maps_dmbs(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("memfd:smc-dmb"))
}

/// The daemon's live DMBs by owner (local, peer), or why there are none.
fn daemon_dmbs(socket: &Path) -> std::result::Result<Vec<smc_ism::DmbInfo>, String> {
    let mut c = smc_ism::Client::connect(socket).map_err(|e| e.to_string())?;
    c.list_dmbs().map_err(|e| e.to_string())
}

fn norm(a: &str) -> Option<SocketAddr> {
    let a: SocketAddr = a.parse().ok()?;
    Some(match a.ip() {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
            None => a,
        },
        IpAddr::V4(_) => a,
    })
}

fn reason_name(code: u32) -> String {
    match smc_common::diag::reason_name(code) {
        "UNKNOWN" => format!("{code:#010x}"),
        n => n.to_string(),
    }
}

/// Collects every connection of the attached cgroups (see the module docs).
pub fn collect(o: &Options) -> Result<(Vec<ConnInfo>, Notes)> {
    let mut notes = Notes::default();
    let cgroups = scanned_cgroups(o.cgroup.as_deref())?;
    notes.cgroups = cgroups
        .iter()
        .map(|(p, _, _)| p.display().to_string())
        .collect();
    let procs = processes(&cgroups);
    notes.processes = procs.len();
    let peers = peers_map();
    notes.ebpf_loaded = peers.is_some();
    let peers = peers.unwrap_or_default();
    let dmbs = match daemon_dmbs(&o.socket) {
        Ok(d) => {
            notes.daemon_running = true;
            d
        }
        Err(e) => {
            notes.daemon_error = Some(e);
            Vec::new()
        }
    };
    let mut by_owner: HashMap<(SocketAddr, SocketAddr), &smc_ism::DmbInfo> = HashMap::new();
    for d in &dmbs {
        if let (Some(l), Some(p)) = (norm(&d.owner_local), norm(&d.owner_peer)) {
            if !d.unregistered {
                by_owner.insert((l, p), d);
            }
        }
    }
    let mut files = crate::procs::ProcFiles::open(&o.procs_dir);

    // One TCP table per network namespace, read before any connection is looked at (the
    // other end of one may be in a namespace of a process scanned later), and which scanned
    // process holds each socket.
    let mut tables: HashMap<u64, NsTable> = HashMap::new();
    let mut holders: HashMap<(u64, u64), u32> = HashMap::new();
    let mut cookies: HashMap<u64, Option<u64>> = HashMap::new();
    let mut scanned = Vec::new();
    for p in &procs {
        let inodes = socket_inodes(p.pid);
        if inodes.is_empty() {
            continue;
        }
        let Ok(ns) = fs::metadata(format!("/proc/{}/ns/net", p.pid)).map(|m| m.ino()) else {
            continue;
        };
        tables.entry(ns).or_insert_with(|| NsTable::read(p.pid));
        cookies.entry(ns).or_insert_with(|| netns_cookie(p.pid));
        for &ino in &inodes {
            holders.entry((ns, ino)).or_insert(p.pid);
        }
        scanned.push((p, ns, inodes));
    }
    let mut library: HashMap<u32, bool> = HashMap::new();
    let mut out = Vec::new();
    let mut seen_inodes = BTreeSet::new();
    for (p, ns, inodes) in scanned {
        let Some(table) = tables.get(&ns) else {
            continue;
        };
        let command = fs::read_to_string(format!("/proc/{}/comm", p.pid))
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        let uid = fs::metadata(format!("/proc/{}", p.pid))
            .map(|m| m.uid())
            .unwrap_or(0);
        // Read now, for this process only (and dropped after it).
        let file = files.get(p.pid);
        if file
            .as_ref()
            .is_some_and(|s| s.valid & procstats::VALID_CONN_TABLE != 0)
        {
            notes.processes_with_records += 1;
        }
        let file = file.as_ref();
        let mut maps_checked = None;
        let mut dmb_maps: Option<HashMap<u64, String>> = None;
        for ino in inodes {
            let Some(t) = table.by_inode.get(&ino) else {
                continue;
            };
            if !seen_inodes.insert((ns, ino)) {
                continue; // shared with another process (fork) already listed
            }
            if t.state == "LISTEN" && !o.listening {
                continue;
            }
            // The eBPF maps key sockets by namespace cookie and 4-tuple; a namespace whose
            // cookie could not be read is matched by the 4-tuple when only one namespace has it.
            let key = match cookies.get(&ns).copied().flatten() {
                Some(c) => SockKey::new(t.local, t.peer, c),
                None => {
                    let bare = SockKey::new(t.local, t.peer, 0);
                    let mut of_tuple = peers.keys().filter(|k| k.in_netns(0) == bare);
                    match (of_tuple.next(), of_tuple.next()) {
                        (Some(k), None) => *k,
                        _ => bare,
                    }
                }
            };
            let entry = peers.get(&key);
            let mirror = peers.contains_key(&key.mirror());
            let flags = entry.map(|e| e.flags).unwrap_or(0);
            let mut c = ConnInfo {
                state: t.state,
                pid: p.pid,
                command: command.clone(),
                uid,
                inode: ino,
                cgroup: p.cgroup.display().to_string(),
                cgroup_id: p.cgroup_id,
                cgroup_mode: p.mode.clone(),
                local: t.local.to_string(),
                peer: t.peer.to_string(),
                mode: "TCP",
                reason: None,
                reason_code: None,
                same_host: flags & SOCK_SAME_HOST != 0 || mirror,
                source: "ebpf",
                flags: flag_names(flags),
                own_token: None,
                peer_token: None,
                own_dmb_size: None,
                peer_dmb_size: None,
                rx_bytes: None,
                tx_bytes: None,
                cursors: None,
                shutdown: None,
            };
            if t.state == "LISTEN" {
                c.source = "proc";
                c.mode = if p.mode == "shortcut" {
                    "SHORTCUT"
                } else {
                    "TCP"
                };
                out.push(c);
                continue;
            }
            // 1. the data path's own record
            if let Some(r) = file.and_then(|f| {
                f.conns
                    .iter()
                    .find(|r| r.local == t.local && r.peer == t.peer)
            }) {
                c.source = "record";
                c.rx_bytes = Some(r.rx_bytes);
                c.tx_bytes = Some(r.tx_bytes);
                match r.state() {
                    ConnState::Smcd => {
                        c.mode = "SMCD";
                        c.own_token = Some(format!("{:016x}", r.own_token));
                        c.peer_token = Some(format!("{:016x}", r.peer_token));
                        c.own_dmb_size = Some(r.own_dmb_size as u64);
                        c.peer_dmb_size = Some(r.peer_dmb_size as u64);
                    }
                    ConnState::Handshake => c.mode = "CLC",
                    _ => {
                        c.mode = "TCP";
                        c.reason = Some(reason_name(r.reason));
                        c.reason_code = Some(format!("{:#010x}", r.reason));
                    }
                }
                out.push(c);
                continue;
            }
            // 2. a live DMB of the daemon
            let own = by_owner.get(&(t.local, t.peer));
            let theirs = by_owner.get(&(t.peer, t.local));
            if own.is_some() || theirs.is_some() {
                c.mode = "SMCD";
                c.source = "daemon";
                c.own_token = own.and_then(|d| d.token).map(|t| format!("{t:016x}"));
                c.peer_token = theirs.and_then(|d| d.token).map(|t| format!("{t:016x}"));
                c.own_dmb_size = own.map(|d| d.size);
                c.peer_dmb_size = theirs.map(|d| d.size);
                if let (Some(o), Some(t)) = (own, theirs) {
                    let maps = dmb_maps.get_or_insert_with(|| dmb_mappings(p.pid));
                    cdc_details(&mut c, p.pid, maps, o, t);
                }
                out.push(c);
                continue;
            }
            // 3. inferred from the eBPF view; without its record (`--tcp-records off`) from
            // the TCP tables and which processes run the library.
            let why: &str = if entry.is_none() && !p.records && p.mode == "ism" {
                c.source = "proc";
                let mut lib = |pid: u32| *library.entry(pid).or_insert_with(|| runs_library(pid));
                let other = mirror_end(&tables, ns, t);
                c.same_host = other.is_some();
                if !lib(p.pid) {
                    "NOT_ENABLED"
                } else {
                    // Ours announced SMC. The other end's process: one without the library, or
                    // outside every attached cgroup (all are scanned without `--cgroup`), did
                    // not announce it.
                    let peer_lib = match other.map(|e| holders.get(&e)) {
                        Some(Some(&pid)) => Some(lib(pid)),
                        Some(None) if o.cgroup.is_none() => Some(false),
                        _ => None,
                    };
                    if peer_lib == Some(false) {
                        c.reason_code = Some(format!("{:#010x}", diag::Diag::PeerNoSmc.code()));
                        "PEERNOSMC"
                    } else {
                        "UNRECORDED"
                    }
                }
            } else if entry.is_none() {
                "UNTRACKED"
            } else if p.mode == "shortcut" {
                if flags & SOCK_SHORTCUT != 0 && mirror {
                    c.mode = "SHORTCUT";
                    ""
                } else {
                    "NO_LOCAL_PEER"
                }
            } else if flags & SOCK_OPTED_IN == 0 {
                "NOT_ENABLED"
            } else if flags & SOCK_PEER_SMC == 0 {
                c.reason_code = Some(format!("{:#010x}", diag::Diag::PeerNoSmc.code()));
                "PEERNOSMC"
            } else if !notes.daemon_running {
                let maps = *maps_checked.get_or_insert_with(|| maps_dmbs(p.pid));
                if maps {
                    c.mode = "SMCD";
                    c.source = "maps";
                    ""
                } else {
                    c.reason_code = Some(format!("{:#010x}", diag::Diag::NoSmcdDev.code()));
                    "NOSMCDDEV"
                }
            } else {
                "DECLINED"
            };
            if c.mode == "TCP" {
                let mut r = why.to_string();
                if why == "DECLINED" {
                    let codes: Vec<String> = file
                        .map(|f| {
                            f.reasons
                                .keys()
                                .filter(|&&k| k != diag::Diag::PeerNoSmc.code())
                                .map(|&k| reason_name(k))
                                .collect()
                        })
                        .unwrap_or_default();
                    if !codes.is_empty() {
                        r = format!("DECLINED({})", codes.join("|"));
                    }
                }
                c.reason = Some(r);
            }
            out.push(c);
        }
    }
    out.sort_by(|a, b| (a.pid, &a.local, &a.peer).cmp(&(b.pid, &b.local, &b.peer)));
    Ok((out, notes))
}

fn col(s: &str, w: usize) -> String {
    if s.len() > w {
        format!("{}..", &s[..w - 2])
    } else {
        format!("{s:<w$}")
    }
}

/// `smc-ctl conns`.
pub fn run(o: &Options, details: bool, json: bool) -> Result<()> {
    crate::sys::require_root()?;
    let (conns, notes) = collect(o)?;
    if json {
        let v = serde_json::json!({ "connections": conns, "sources": notes });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    print!(
        "{} {} {} {} {:<8}",
        col("State", 12),
        col("PID/Command", 22),
        col("Local Address", 23),
        col("Peer Address", 23),
        "Mode"
    );
    if details {
        print!(
            " {:<5} {:<16} {:<16} {:>8} {:>8} {:<13} {:<13} {:<7} {:<13} {:<13} {:<7} {:>12} {:>12} {:<6} Flags",
            "Shutd",
            "Token",
            "Peer-Token",
            "Rcvbuf",
            "Peerbuf",
            "rxprod-Cursor",
            "rxcons-Cursor",
            "rxFlags",
            "txprod-Cursor",
            "txcons-Cursor",
            "txFlags",
            "RX-bytes",
            "TX-bytes",
            "Source"
        );
    }
    println!();
    for c in &conns {
        let mode = match (&c.reason, c.mode) {
            (Some(r), "TCP") => format!("TCP {r}"),
            _ => c.mode.to_string(),
        };
        print!(
            "{} {} {} {} {:<8}",
            col(c.state, 12),
            col(&format!("{}/{}", c.pid, c.command), 22),
            col(&c.local, 23),
            col(&c.peer, 23),
            mode
        );
        if details {
            let ring = |s: Option<u64>| {
                s.map(|v| {
                    format!(
                        "{}",
                        v.saturating_sub(smc_common::cdc::CDC_HEADER_LEN as u64)
                    )
                })
                .unwrap_or_else(|| "-".into())
            };
            let num = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            let cu = c.cursors.as_ref();
            let cs = |f: fn(&Cursors) -> &String| cu.map(|x| f(x).as_str()).unwrap_or("-");
            print!(
                " {:<5} {:<16} {:<16} {:>8} {:>8} {:<13} {:<13} {:<7} {:<13} {:<13} {:<7} {:>12} {:>12} {:<6} {}",
                c.shutdown.as_deref().unwrap_or("-"),
                c.own_token.as_deref().unwrap_or("-"),
                c.peer_token.as_deref().unwrap_or("-"),
                ring(c.own_dmb_size),
                ring(c.peer_dmb_size),
                cs(|x| &x.rx_prod),
                cs(|x| &x.rx_cons),
                cs(|x| &x.rx_flags),
                cs(|x| &x.tx_prod),
                cs(|x| &x.tx_cons),
                cs(|x| &x.tx_flags),
                num(c.rx_bytes),
                num(c.tx_bytes),
                c.source,
                if c.flags.is_empty() {
                    "-".to_string()
                } else {
                    c.flags.join(",")
                }
            );
        }
        println!();
    }
    if conns.is_empty() {
        println!(
            "(no connections in {} attached cgroup(s))",
            notes.cgroups.len()
        );
    }
    if !notes.daemon_running {
        println!(
            "note: daemon not running ({}): SMC-D is inferred from the processes' DMB mappings",
            notes.daemon_error.as_deref().unwrap_or("?")
        );
    }
    if notes.processes_with_records == 0 && details {
        println!(
            "note: the data path writes no per-connection records yet: modes are inferred (Source column); cursors and bytes come from the DMBs (SMC-D)"
        );
    }
    Ok(())
}

/// Live figures of a set of connections (for `stats`): counts by mode and TCP reasons.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Live {
    pub connections: u64,
    pub smcd: u64,
    pub shortcut: u64,
    pub tcp: u64,
    pub same_host_tcp: u64,
    pub tcp_reasons: BTreeMap<String, u64>,
}

pub fn live(conns: &[ConnInfo]) -> Live {
    let mut l = Live::default();
    for c in conns.iter().filter(|c| c.state != "LISTEN") {
        l.connections += 1;
        match c.mode {
            "SMCD" => l.smcd += 1,
            "SHORTCUT" => l.shortcut += 1,
            _ => {
                l.tcp += 1;
                if c.same_host {
                    l.same_host_tcp += 1;
                    let r = c.reason.clone().unwrap_or_else(|| "?".into());
                    *l.tcp_reasons.entry(r).or_insert(0) += 1;
                }
            }
        }
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_addresses() {
        // 127.0.0.1:8080 as /proc/net/tcp prints it on a little-endian host.
        let a = parse_hex_addr("0100007F:1F90").unwrap();
        assert_eq!(a, "127.0.0.1:8080".parse().unwrap());
        // ::1 port 22 in tcp6.
        let a = parse_hex_addr("00000000000000000000000001000000:0016").unwrap();
        assert_eq!(a, "[::1]:22".parse().unwrap());
        // ::ffff:127.0.0.1 is shown as IPv4.
        let a = parse_hex_addr("0000000000000000FFFF00000100007F:0050").unwrap();
        assert_eq!(a, "127.0.0.1:80".parse().unwrap());
        assert!(parse_hex_addr("zz:1").is_none());
    }

    #[test]
    fn netns_cookie_of_a_process() {
        // Joining a namespace (even one's own) needs CAP_SYS_ADMIN: without it, no cookie.
        if let Some(c) = netns_cookie(std::process::id()) {
            assert_eq!(c, own_netns_cookie().unwrap());
        }
    }

    #[test]
    fn live_counts() {
        let c = |mode: &'static str, same: bool, reason: Option<&str>| ConnInfo {
            state: "ESTABLISHED",
            pid: 1,
            command: String::new(),
            uid: 0,
            inode: 1,
            cgroup: String::new(),
            cgroup_id: 1,
            cgroup_mode: "ism".into(),
            local: String::new(),
            peer: String::new(),
            mode,
            reason: reason.map(str::to_string),
            reason_code: None,
            same_host: same,
            source: "ebpf",
            flags: Vec::new(),
            own_token: None,
            peer_token: None,
            own_dmb_size: None,
            peer_dmb_size: None,
            rx_bytes: None,
            tx_bytes: None,
            cursors: None,
            shutdown: None,
        };
        let l = live(&[
            c("SMCD", true, None),
            c("SHORTCUT", true, None),
            c("TCP", true, Some("PEERNOSMC")),
            c("TCP", false, Some("UNTRACKED")),
        ]);
        assert_eq!((l.connections, l.smcd, l.shortcut, l.tcp), (4, 1, 1, 2));
        assert_eq!(l.same_host_tcp, 1);
        assert_eq!(l.tcp_reasons["PEERNOSMC"], 1);
    }
}
