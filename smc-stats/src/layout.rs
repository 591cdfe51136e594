//! The per-process statistics file of the data path (`/run/smc/procs/<pid>`), shared by its
//! writer (`smc-preload`) and its readers (`smc-ctl stats` / `conns`, the daemon's metrics).
//!
//! One file per process that loaded the library and made a TCP decision, `MAP_SHARED` by the
//! writer, every field an 8-byte little-endian counter updated with atomic adds. Readers treat a
//! file as a snapshot ([`Snapshot::parse`]).
//!
//! # Layout ([`ProcStats`], `#[repr(C)]`, all `u64`)
//!
//! Layout version 1 — the first 424 bytes, unchanged since the first writer:
//!
//! | offset | field |
//! |---:|---|
//! | 0 | magic [`MAGIC`] ("SMCPSTAT") |
//! | 8 | layout version [`VERSION`] (1) |
//! | 16 | pid |
//! | 24 | smcd_client: connections that became SMC-D as client |
//! | 32 | smcd_server |
//! | 40 | fallback_client |
//! | 48 | fallback_server |
//! | 56 | handshake_errors (timeouts, I/O or protocol errors during CLC; each is also a fallback, except a connection lost during the handshake: reset or closed by the peer) |
//! | 64 | rx_bytes (closed connections; live ones add their own) |
//! | 72 | tx_bytes |
//! | 80 | rx_calls |
//! | 88 | tx_calls |
//! | 96 | rx_buffer_full (reads that found the ring full) |
//! | 104 | tx_buffer_full (writes that found no room in the peer's ring) |
//! | 112 | closed_conns (live SMC-D = smcd_client + smcd_server − closed_conns, summed) |
//! | 120 | special_sendfile |
//! | 128 | special_splice |
//! | 136 | special_oob |
//! | 144 | pending_connects |
//! | 152 | doorbells_sent |
//! | 160 | doorbells_received |
//! | 168..424 | 16 fallback-reason slots `{code, count}` (code 0 = free), client and server together |
//!
//! Extension 1 (appended; `ext_version` = [`EXT_VERSION`]; a writer that predates it leaves
//! the page zero there, so `ext_version` 0 means "absent" and the version word stays 1):
//!
//! | offset | field |
//! |---:|---|
//! | 424 | ext_version (1) |
//! | 432 | cgroup_id: inode of the writer's cgroup v2 directory (what `smc-ctl attach` keys on) |
//! | 440 | start_time: the writer's start time (`/proc/<pid>/stat` field 22, clock ticks after boot), to tell a live pid from a reused one |
//! | 448 | flags: [`FLAG_AGGREGATE`] (a sum of exited processes, pid 0) |
//! | 456 | valid: `VALID_*` bits, which optional figures below the writer maintains |
//! | 464 | special_fork (children that made their own file) |
//! | 472 | special_exec (images that found their pre-exec file and kept it) |
//! | 480 | special_peek (`MSG_PEEK` reads) |
//! | 488 | conns_untracked (connections that found the connection table full) |
//! | 496..568 | rx_ring_hist\[9\]: closed SMC-D connections by receive DMB size (≤8K, 16K, 32K, 64K, 128K, 256K, 512K, 1024K, >1024K) |
//! | 568..640 | tx_ring_hist\[9\]: by the peer's DMB size |
//! | 640..712 | rx_req_hist\[9\]: read requests by size, same buckets |
//! | 712..784 | tx_req_hist\[9\]: write requests by size |
//! | 784..1040 | 16 client fallback-reason slots `{code, count}` |
//! | 1040..1296 | 16 server fallback-reason slots |
//! | 1296 | conn_slots: records in the connection table (0 = no table) |
//! | 1304 | conn_table_offset: byte offset of the table in the file (≥ 4096) |
//! | 1312 | conn_record_len: bytes per record ([`CONN_RECORD_LEN`]) |
//! | 1320 | pid_ns: inode of the writer's PID namespace (`/proc/self/ns/pid`); a reader in another PID namespace cannot tell whether the pid lives and treats the file as live |
//! | 1328..4096 | reserved (zero) |
//!
//! The connection table ([`ConnRecord`], 16 words each) follows at `conn_table_offset`; the file
//! is then `conn_table_offset + conn_slots * conn_record_len` bytes long.
//!
//! # Files of a directory
//!
//! - `<pid>`: a process's file. It is *live* while a process with that pid and (when recorded)
//!   that start time exists; otherwise it is *stale* (killed, or kept by `SMC_STATS_KEEP=1`).
//! - `exited-<cgroup_id>` ([`aggregate_name`]): the sum of the exited processes of one cgroup, in
//!   the same layout with [`FLAG_AGGREGATE`]. A process that exits normally folds its file into
//!   its cgroup's aggregate and removes it; readers fold stale files the same way. Both hold an
//!   exclusive `flock` on [`LOCK_NAME`] while they add and unlink, and readers hold it while they
//!   read the directory, so that a file is never counted twice nor missed.
//! - `uid-<uid>/` ([`uid_dir_name`](crate::uid_dir_name), top directory only): the same three kinds of entries for
//!   the processes of one effective uid that does not own the top directory, in a directory
//!   only that uid (and root) can write, made by the daemon. Every directory has its own lock,
//!   which only its owner and root can open; nobody waits for a lock longer than a bound.
//!
//! [`StatsDir`](crate::StatsDir) (module [`dir`](crate::dir)) is how writers and readers reach these files: no symbolic link
//! followed, no FIFO or device opened, no file of a foreign owner or beyond
//! [`MAX_FILE_LEN`](crate::MAX_FILE_LEN)
//! read. [`fold`] adds one file's bytes into an aggregate's bytes.

use std::collections::BTreeMap;
use std::mem::offset_of;

use std::sync::atomic::{AtomicU64, Ordering};

/// "SMCPSTAT".
pub const MAGIC: u64 = 0x534d_4350_5354_4154;
/// Layout version (the extension is signalled by `ext_version`, not by this word).
pub const VERSION: u64 = 1;
/// Version of the extension written by current writers.
pub const EXT_VERSION: u64 = 1;
/// Fallback-reason slots per table.
pub const REASON_SLOTS: usize = 16;
/// Histogram buckets (≤8K … >1024K).
pub const HIST_BUCKETS: usize = 9;
/// Upper bounds of the histogram buckets but the last.
pub const HIST_BOUNDS: [u64; HIST_BUCKETS - 1] = [
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1024 << 10,
];
/// Names of the histogram buckets (also the JSON key suffixes).
pub const HIST_NAMES: [&str; HIST_BUCKETS] = [
    "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1024k", "gt_1024k",
];
/// Size of the fixed part (one page).
pub const PAGE_LEN: usize = 4096;
/// Bytes of a version-1 file without extension that a reader needs.
pub const V1_LEN: usize = 424;
/// Default directory.
pub const DEFAULT_DIR: &str = "/run/smc/procs";
/// Environment variable that overrides [`DEFAULT_DIR`] (writer and readers).
pub const DIR_ENV: &str = "SMC_PROCS_DIR";
/// Lock file of a directory (see the module docs).
pub const LOCK_NAME: &str = ".lock";
/// Prefix of the aggregate files.
pub const AGGREGATE_PREFIX: &str = "exited-";

/// `flags`: the file is the sum of exited processes (pid 0).
pub const FLAG_AGGREGATE: u64 = 1;

/// `valid`: `cgroup_id` and `start_time` are recorded.
pub const VALID_IDENTITY: u64 = 1 << 0;
/// `valid`: the client/server reason tables are maintained.
pub const VALID_SIDE_REASONS: u64 = 1 << 1;
/// `valid`: the ring-size histograms are maintained.
pub const VALID_RING_HIST: u64 = 1 << 2;
/// `valid`: the request-size histograms are maintained.
pub const VALID_REQ_HIST: u64 = 1 << 3;
/// `valid`: `special_fork` and `special_exec` are maintained.
pub const VALID_FORK_EXEC: u64 = 1 << 4;
/// `valid`: `special_peek` is maintained.
pub const VALID_PEEK: u64 = 1 << 5;
/// `valid`: the connection table is maintained.
pub const VALID_CONN_TABLE: u64 = 1 << 6;

/// The directory: `$SMC_PROCS_DIR` or [`DEFAULT_DIR`].
pub fn default_dir() -> std::path::PathBuf {
    std::env::var_os(DIR_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| DEFAULT_DIR.into())
}

/// File name of the aggregate of cgroup `cgroup_id`'s exited processes.
pub fn aggregate_name(cgroup_id: u64) -> String {
    format!("{AGGREGATE_PREFIX}{cgroup_id}")
}

/// The file's layout in memory. Fields are atomics so that the writer can update a shared
/// mapping from any thread or forked process.
#[repr(C)]
pub struct ProcStats {
    pub magic: AtomicU64,
    pub version: AtomicU64,
    pub pid: AtomicU64,
    pub smcd_client: AtomicU64,
    pub smcd_server: AtomicU64,
    pub fallback_client: AtomicU64,
    pub fallback_server: AtomicU64,
    pub handshake_errors: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub rx_calls: AtomicU64,
    pub tx_calls: AtomicU64,
    pub rx_full: AtomicU64,
    pub tx_full: AtomicU64,
    pub closed_conns: AtomicU64,
    pub special_sendfile: AtomicU64,
    pub special_splice: AtomicU64,
    pub special_oob: AtomicU64,
    pub pending_connects: AtomicU64,
    pub doorbells_sent: AtomicU64,
    pub doorbells_rcvd: AtomicU64,
    /// Client and server together (version 1).
    pub reasons: [[AtomicU64; 2]; REASON_SLOTS],
    // ---- extension 1 ----
    pub ext_version: AtomicU64,
    pub cgroup_id: AtomicU64,
    pub start_time: AtomicU64,
    pub flags: AtomicU64,
    pub valid: AtomicU64,
    pub special_fork: AtomicU64,
    pub special_exec: AtomicU64,
    pub special_peek: AtomicU64,
    pub conns_untracked: AtomicU64,
    pub rx_ring_hist: [AtomicU64; HIST_BUCKETS],
    pub tx_ring_hist: [AtomicU64; HIST_BUCKETS],
    pub rx_req_hist: [AtomicU64; HIST_BUCKETS],
    pub tx_req_hist: [AtomicU64; HIST_BUCKETS],
    pub reasons_client: [[AtomicU64; 2]; REASON_SLOTS],
    pub reasons_server: [[AtomicU64; 2]; REASON_SLOTS],
    pub conn_slots: AtomicU64,
    pub conn_table_offset: AtomicU64,
    pub conn_record_len: AtomicU64,
    pub pid_ns: AtomicU64,
}

const _: () = {
    assert!(offset_of!(ProcStats, smcd_client) == 24);
    assert!(offset_of!(ProcStats, doorbells_rcvd) == 160);
    assert!(offset_of!(ProcStats, reasons) == 168);
    assert!(offset_of!(ProcStats, ext_version) == V1_LEN);
    assert!(offset_of!(ProcStats, cgroup_id) == 432);
    assert!(offset_of!(ProcStats, start_time) == 440);
    assert!(offset_of!(ProcStats, flags) == 448);
    assert!(offset_of!(ProcStats, valid) == 456);
    assert!(offset_of!(ProcStats, special_fork) == 464);
    assert!(offset_of!(ProcStats, conns_untracked) == 488);
    assert!(offset_of!(ProcStats, rx_ring_hist) == 496);
    assert!(offset_of!(ProcStats, tx_ring_hist) == 568);
    assert!(offset_of!(ProcStats, rx_req_hist) == 640);
    assert!(offset_of!(ProcStats, tx_req_hist) == 712);
    assert!(offset_of!(ProcStats, reasons_client) == 784);
    assert!(offset_of!(ProcStats, reasons_server) == 1040);
    assert!(offset_of!(ProcStats, conn_slots) == 1296);
    assert!(offset_of!(ProcStats, conn_record_len) == 1312);
    assert!(offset_of!(ProcStats, pid_ns) == 1320);
    assert!(std::mem::size_of::<ProcStats>() <= PAGE_LEN);
};

/// Scalar counters by stable name (the keys of `smc-ctl stats json`), with their offsets.
/// Everything here is summed over processes and folded into aggregates.
pub const COUNTERS: &[(&str, usize)] = &[
    ("smcd_client", offset_of!(ProcStats, smcd_client)),
    ("smcd_server", offset_of!(ProcStats, smcd_server)),
    ("fallback_client", offset_of!(ProcStats, fallback_client)),
    ("fallback_server", offset_of!(ProcStats, fallback_server)),
    ("handshake_errors", offset_of!(ProcStats, handshake_errors)),
    ("rx_bytes", offset_of!(ProcStats, rx_bytes)),
    ("tx_bytes", offset_of!(ProcStats, tx_bytes)),
    ("rx_calls", offset_of!(ProcStats, rx_calls)),
    ("tx_calls", offset_of!(ProcStats, tx_calls)),
    ("rx_buffer_full", offset_of!(ProcStats, rx_full)),
    ("tx_buffer_full", offset_of!(ProcStats, tx_full)),
    ("closed_conns", offset_of!(ProcStats, closed_conns)),
    ("special_sendfile", offset_of!(ProcStats, special_sendfile)),
    ("special_splice", offset_of!(ProcStats, special_splice)),
    ("special_oob", offset_of!(ProcStats, special_oob)),
    ("pending_connects", offset_of!(ProcStats, pending_connects)),
    ("doorbells_sent", offset_of!(ProcStats, doorbells_sent)),
    ("doorbells_received", offset_of!(ProcStats, doorbells_rcvd)),
    ("special_fork", offset_of!(ProcStats, special_fork)),
    ("special_exec", offset_of!(ProcStats, special_exec)),
    ("special_peek", offset_of!(ProcStats, special_peek)),
    ("conns_untracked", offset_of!(ProcStats, conns_untracked)),
];

const HISTS: [(&str, usize); 4] = [
    ("rx_ring", offset_of!(ProcStats, rx_ring_hist)),
    ("tx_ring", offset_of!(ProcStats, tx_ring_hist)),
    ("rx_req", offset_of!(ProcStats, rx_req_hist)),
    ("tx_req", offset_of!(ProcStats, tx_req_hist)),
];

const REASON_TABLES: [usize; 3] = [
    offset_of!(ProcStats, reasons),
    offset_of!(ProcStats, reasons_client),
    offset_of!(ProcStats, reasons_server),
];

/// The histogram bucket of `bytes`.
pub fn hist_bucket(bytes: u64) -> usize {
    HIST_BOUNDS
        .iter()
        .position(|&b| bytes <= b)
        .unwrap_or(HIST_BUCKETS - 1)
}

/// Adds one to `code`'s slot of a reason table (claims a free slot if needed; drops the count
/// when all 16 slots hold other codes).
pub fn add_reason(table: &[[AtomicU64; 2]; REASON_SLOTS], code: u32) {
    let code = code as u64;
    if code == 0 {
        return;
    }
    for slot in table {
        let c = slot[0].load(Ordering::Relaxed);
        if c == code {
            slot[1].fetch_add(1, Ordering::Relaxed);
            return;
        }
        if c == 0 {
            match slot[0].compare_exchange(0, code, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    slot[1].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(now) if now == code => {
                    slot[1].fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Err(_) => {}
            }
        }
    }
}

impl ProcStats {
    /// Writes the identity of a fresh (zeroed) area: magic, versions, pid, cgroup, start time,
    /// PID namespace and the `valid` bits the writer maintains.
    pub fn init(&self, id: &Identity, valid: u64) {
        self.pid.store(id.pid, Ordering::Relaxed);
        self.cgroup_id.store(id.cgroup_id, Ordering::Relaxed);
        self.start_time.store(id.start_time, Ordering::Relaxed);
        self.pid_ns.store(id.pid_ns, Ordering::Relaxed);
        self.valid.store(valid | VALID_IDENTITY, Ordering::Relaxed);
        self.ext_version.store(EXT_VERSION, Ordering::Relaxed);
        self.version.store(VERSION, Ordering::Relaxed);
        self.magic.store(MAGIC, Ordering::Release);
    }

    /// Counts a fallback: the side's counter, the shared reason table and the side's table.
    pub fn fallback(&self, server: bool, code: u32) {
        if server {
            self.fallback_server.fetch_add(1, Ordering::Relaxed);
            add_reason(&self.reasons_server, code);
        } else {
            self.fallback_client.fetch_add(1, Ordering::Relaxed);
            add_reason(&self.reasons_client, code);
        }
        add_reason(&self.reasons, code);
    }

    /// Counts a closed SMC-D connection's DMB sizes (receive ring = own DMB, send ring = the
    /// peer's).
    pub fn ring_sizes(&self, own_dmb: u64, peer_dmb: u64) {
        self.rx_ring_hist[hist_bucket(own_dmb)].fetch_add(1, Ordering::Relaxed);
        self.tx_ring_hist[hist_bucket(peer_dmb)].fetch_add(1, Ordering::Relaxed);
    }

    /// A copy of the fixed part as bytes (for [`Snapshot::parse`] and [`fold`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let words = std::mem::size_of::<ProcStats>() / 8;
        let base = self as *const ProcStats as *const AtomicU64;
        let mut out = vec![0u8; PAGE_LEN];
        for i in 0..words {
            // SAFETY: ProcStats is `repr(C)` and made only of AtomicU64 (arrays included), so
            // it is exactly `words` consecutive AtomicU64.
            let v = unsafe { &*base.add(i) }.load(Ordering::Relaxed);
            out[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
        }
        out
    }
}

/// Who writes a file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub pid: u64,
    pub cgroup_id: u64,
    pub start_time: u64,
    pub pid_ns: u64,
}

fn word(b: &[u8], off: usize) -> u64 {
    b.get(off..)
        .and_then(<[u8]>::first_chunk::<8>)
        .map(|c| u64::from_le_bytes(*c))
        .unwrap_or(0)
}

fn put_word(b: &mut [u8], off: usize, v: u64) {
    b[off..off + 8].copy_from_slice(&v.to_le_bytes());
}

/// Whether `b` starts with a readable stats file.
pub fn is_stats_file(b: &[u8]) -> bool {
    b.len() >= V1_LEN && word(b, 0) == MAGIC && word(b, 8) == VERSION
}

/// One state of a connection record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ConnState {
    /// Free slot.
    Free = 0,
    /// CLC handshake running.
    Handshake = 1,
    /// Data over the DMBs.
    Smcd = 2,
    /// Plain TCP after a decline (`reason`).
    Tcp = 3,
}

impl ConnState {
    fn from_u8(v: u8) -> Option<ConnState> {
        Some(match v {
            0 => ConnState::Free,
            1 => ConnState::Handshake,
            2 => ConnState::Smcd,
            3 => ConnState::Tcp,
            _ => return None,
        })
    }
}

/// Bytes of one connection record.
pub const CONN_RECORD_LEN: usize = 128;
/// Records a writer that keeps a table is expected to reserve (the file is then 36 KiB; pages
/// that are never touched cost nothing on tmpfs).
pub const DEFAULT_CONN_SLOTS: usize = 256;

/// One connection of the process, as the writer records it in its table.
///
/// Words (u64 LE): 0 seq (odd while the writer updates the record; 0 = never used) ·
/// 1 state u8 | role u8 << 8 (0 client, 1 server) | fd i32 << 32 ·
/// 2 reason u32 | local port u16 << 32 | peer port u16 << 48 ·
/// 3–4 local address (16 bytes, IPv4 as `::ffff:a.b.c.d`) · 5–6 peer address ·
/// 7 own DMB token · 8 peer DMB token · 9 own DMB size u32 | peer DMB size u32 << 32 ·
/// 10 rx bytes · 11 tx bytes · 12 opened (Unix time, ms) · 13–15 reserved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnRecord {
    pub state: u8,
    pub server: bool,
    pub fd: i32,
    pub reason: u32,
    pub local: std::net::SocketAddr,
    pub peer: std::net::SocketAddr,
    pub own_token: u64,
    pub peer_token: u64,
    pub own_dmb_size: u32,
    pub peer_dmb_size: u32,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub opened_ms: u64,
}

fn addr_words(a: &std::net::SocketAddr) -> ([u64; 2], u16) {
    let ip = match a.ip() {
        std::net::IpAddr::V4(v4) => v4.to_ipv6_mapped(),
        std::net::IpAddr::V6(v6) => v6,
    };
    // Little-endian halves: the low word is octets 0..8, the high word octets 8..16.
    let w = u128::from_le_bytes(ip.octets());
    ([w as u64, (w >> 64) as u64], a.port())
}

fn words_addr(w: [u64; 2], port: u16) -> std::net::SocketAddr {
    let mut o = [0u8; 16];
    o[..8].copy_from_slice(&w[0].to_le_bytes());
    o[8..].copy_from_slice(&w[1].to_le_bytes());
    let v6 = std::net::Ipv6Addr::from(o);
    let ip = match v6.to_ipv4_mapped() {
        Some(v4) => std::net::IpAddr::V4(v4),
        None => std::net::IpAddr::V6(v6),
    };
    std::net::SocketAddr::new(ip, port)
}

impl ConnRecord {
    /// The record's state.
    pub fn state(&self) -> ConnState {
        ConnState::from_u8(self.state).unwrap_or(ConnState::Free)
    }

    /// Encodes into the 16 words (without the seq word, which [`ConnSlot::publish`] manages).
    pub fn encode(&self) -> [u64; 16] {
        let mut w = [0u64; 16];
        w[1] = self.state as u64 | (self.server as u64) << 8 | (self.fd as u32 as u64) << 32;
        let (la, lp) = addr_words(&self.local);
        let (pa, pp) = addr_words(&self.peer);
        w[2] = self.reason as u64 | (lp as u64) << 32 | (pp as u64) << 48;
        w[3] = la[0];
        w[4] = la[1];
        w[5] = pa[0];
        w[6] = pa[1];
        w[7] = self.own_token;
        w[8] = self.peer_token;
        w[9] = self.own_dmb_size as u64 | (self.peer_dmb_size as u64) << 32;
        w[10] = self.rx_bytes;
        w[11] = self.tx_bytes;
        w[12] = self.opened_ms;
        w
    }

    /// Decodes the 16 words.
    pub fn decode(w: &[u64; 16]) -> ConnRecord {
        ConnRecord {
            state: w[1] as u8,
            server: (w[1] >> 8) & 0xff != 0,
            fd: (w[1] >> 32) as u32 as i32,
            reason: w[2] as u32,
            local: words_addr([w[3], w[4]], (w[2] >> 32) as u16),
            peer: words_addr([w[5], w[6]], (w[2] >> 48) as u16),
            own_token: w[7],
            peer_token: w[8],
            own_dmb_size: w[9] as u32,
            peer_dmb_size: (w[9] >> 32) as u32,
            rx_bytes: w[10],
            tx_bytes: w[11],
            opened_ms: w[12],
        }
    }
}

/// One record slot in the writer's shared mapping.
#[repr(C)]
pub struct ConnSlot(pub [AtomicU64; 16]);

const _: () = assert!(std::mem::size_of::<ConnSlot>() == CONN_RECORD_LEN);

impl ConnSlot {
    /// Takes a free slot (state word from 0 to `Handshake`); false when taken by someone else.
    pub fn try_claim(&self) -> bool {
        self.0[1]
            .compare_exchange(
                0,
                ConnState::Handshake as u64,
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok()
    }

    /// Writes a whole record (seqlock: readers retry or skip a record whose seq is odd or
    /// changed while they read).
    pub fn publish(&self, r: &ConnRecord) {
        let w = r.encode();
        let s = self.0[0].load(Ordering::Relaxed);
        self.0[0].store(s | 1, Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        for (i, v) in w.iter().enumerate().skip(2) {
            self.0[i].store(*v, Ordering::Relaxed);
        }
        self.0[1].store(w[1], Ordering::Relaxed);
        self.0[0].store((s | 1) + 1, Ordering::Release);
    }

    /// Frees the slot.
    pub fn release(&self) {
        let s = self.0[0].load(Ordering::Relaxed);
        self.0[0].store(s | 1, Ordering::Relaxed);
        self.0[1].store(0, Ordering::Release);
        self.0[0].store((s | 1) + 1, Ordering::Release);
    }

    /// Adds moved bytes to a published record.
    pub fn add_bytes(&self, rx: u64, tx: u64) {
        self.0[10].fetch_add(rx, Ordering::Relaxed);
        self.0[11].fetch_add(tx, Ordering::Relaxed);
    }
}

/// A parsed file: the figures of one process (or one aggregate).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub pid: u64,
    /// The extension is present.
    pub ext: bool,
    /// 0 when not recorded.
    pub cgroup_id: u64,
    /// 0 when not recorded.
    pub start_time: u64,
    /// 0 when not recorded.
    pub pid_ns: u64,
    pub flags: u64,
    pub valid: u64,
    /// Every name of [`COUNTERS`].
    pub counters: BTreeMap<&'static str, u64>,
    /// Shared table (client and server), by code.
    pub reasons: BTreeMap<u32, u64>,
    /// By code; empty unless [`VALID_SIDE_REASONS`].
    pub reasons_client: BTreeMap<u32, u64>,
    pub reasons_server: BTreeMap<u32, u64>,
    /// `rx_ring`, `tx_ring`, `rx_req`, `tx_req`.
    pub hists: BTreeMap<&'static str, [u64; HIST_BUCKETS]>,
    /// Published records (state ≠ free).
    pub conns: Vec<ConnRecord>,
}

fn reason_table(b: &[u8], off: usize) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    for r in 0..REASON_SLOTS {
        let code = word(b, off + r * 16);
        if code != 0 && code <= u32::MAX as u64 {
            // Untrusted counts (a code may repeat): wrap like every other counter.
            let e = m.entry(code as u32).or_insert(0u64);
            *e = e.wrapping_add(word(b, off + r * 16 + 8));
        }
    }
    m
}

impl Snapshot {
    /// Parses a file's bytes; `None` unless magic and version match and the version-1 part is
    /// complete.
    pub fn parse(b: &[u8]) -> Option<Snapshot> {
        if !is_stats_file(b) {
            return None;
        }
        let ext = b.len() >= PAGE_LEN && word(b, offset_of!(ProcStats, ext_version)) >= 1;
        let mut s = Snapshot {
            pid: word(b, 16),
            ext,
            ..Default::default()
        };
        for (name, off) in COUNTERS {
            let v = if *off < V1_LEN || ext {
                word(b, *off)
            } else {
                0
            };
            s.counters.insert(name, v);
        }
        s.reasons = reason_table(b, REASON_TABLES[0]);
        if ext {
            s.cgroup_id = word(b, offset_of!(ProcStats, cgroup_id));
            s.start_time = word(b, offset_of!(ProcStats, start_time));
            s.pid_ns = word(b, offset_of!(ProcStats, pid_ns));
            s.flags = word(b, offset_of!(ProcStats, flags));
            s.valid = word(b, offset_of!(ProcStats, valid));
            s.reasons_client = reason_table(b, REASON_TABLES[1]);
            s.reasons_server = reason_table(b, REASON_TABLES[2]);
        }
        for (name, off) in HISTS {
            let mut h = [0u64; HIST_BUCKETS];
            if ext {
                for (i, v) in h.iter_mut().enumerate() {
                    *v = word(b, off + i * 8);
                }
            }
            s.hists.insert(name, h);
        }
        if ext {
            let slots = word(b, offset_of!(ProcStats, conn_slots)) as usize;
            let off = word(b, offset_of!(ProcStats, conn_table_offset)) as usize;
            let len = word(b, offset_of!(ProcStats, conn_record_len)) as usize;
            if slots > 0 && off >= PAGE_LEN && len >= CONN_RECORD_LEN && slots <= 1 << 20 {
                for i in 0..slots {
                    // Untrusted offsets: a sum that overflows is past the end.
                    let Some(at) = i.checked_mul(len).and_then(|x| x.checked_add(off)) else {
                        break;
                    };
                    if at.saturating_add(CONN_RECORD_LEN) > b.len() {
                        break;
                    }
                    let mut w = [0u64; 16];
                    for (j, v) in w.iter_mut().enumerate() {
                        *v = word(b, at + j * 8);
                    }
                    // Skip a record the writer was changing when the file was read.
                    if w[0] & 1 == 1 || w[1] & 0xff == 0 {
                        continue;
                    }
                    s.conns.push(ConnRecord::decode(&w));
                }
            }
        }
        Some(s)
    }

    /// Whether this is an aggregate of exited processes.
    pub fn is_aggregate(&self) -> bool {
        self.flags & FLAG_AGGREGATE != 0
    }

    /// A counter by name (0 when unknown).
    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }

    /// Adds `other`'s figures to these (pid, identity and records are not summed).
    pub fn add(&mut self, other: &Snapshot) {
        for (k, v) in &other.counters {
            let e = self.counters.entry(k).or_insert(0);
            *e = e.wrapping_add(*v);
        }
        for (dst, src) in [
            (&mut self.reasons, &other.reasons),
            (&mut self.reasons_client, &other.reasons_client),
            (&mut self.reasons_server, &other.reasons_server),
        ] {
            for (c, n) in src {
                let e = dst.entry(*c).or_insert(0);
                *e = e.wrapping_add(*n);
            }
        }
        for (k, h) in &other.hists {
            let e = self.hists.entry(k).or_insert([0; HIST_BUCKETS]);
            for (d, s) in e.iter_mut().zip(h) {
                *d = d.wrapping_add(*s);
            }
        }
        self.valid |= other.valid;
        self.ext |= other.ext;
    }
}

/// A fresh aggregate file's bytes for `cgroup_id`.
pub fn new_aggregate(cgroup_id: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE_LEN];
    put_word(&mut b, 0, MAGIC);
    put_word(&mut b, 8, VERSION);
    put_word(&mut b, offset_of!(ProcStats, ext_version), EXT_VERSION);
    put_word(&mut b, offset_of!(ProcStats, cgroup_id), cgroup_id);
    put_word(&mut b, offset_of!(ProcStats, flags), FLAG_AGGREGATE);
    b
}

fn fold_reasons(dst: &mut [u8], off: usize, src: &BTreeMap<u32, u64>) {
    // When all slots hold other codes the count stays in the side counters only.
    for (&code, &n) in src {
        for r in 0..REASON_SLOTS {
            let at = off + r * 16;
            let c = word(dst, at);
            if c == code as u64 || c == 0 {
                put_word(dst, at, code as u64);
                put_word(dst, at + 8, word(dst, at + 8).wrapping_add(n));
                break;
            }
        }
    }
}

/// Adds the figures of file `src` (a process's bytes) into aggregate `dst` (bytes of an
/// aggregate, see [`new_aggregate`]). Returns false when `src` is not a stats file.
pub fn fold(dst: &mut Vec<u8>, src: &[u8]) -> bool {
    let Some(s) = Snapshot::parse(src) else {
        return false;
    };
    if dst.len() < PAGE_LEN || !is_stats_file(dst) {
        let cg = s.cgroup_id;
        *dst = new_aggregate(cg);
    }
    let dst: &mut [u8] = dst;
    for (name, off) in COUNTERS {
        let v = s.get(name);
        put_word(dst, *off, word(dst, *off).wrapping_add(v));
    }
    fold_reasons(dst, REASON_TABLES[0], &s.reasons);
    fold_reasons(dst, REASON_TABLES[1], &s.reasons_client);
    fold_reasons(dst, REASON_TABLES[2], &s.reasons_server);
    for (name, off) in HISTS {
        let h = s.hists.get(name).copied().unwrap_or_default();
        for (i, v) in h.iter().enumerate() {
            put_word(dst, off + i * 8, word(dst, off + i * 8).wrapping_add(*v));
        }
    }
    let vo = offset_of!(ProcStats, valid);
    put_word(dst, vo, word(dst, vo) | (s.valid & !VALID_CONN_TABLE));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area() -> Box<ProcStats> {
        // SAFETY: all-zero is a valid ProcStats (only atomics).
        unsafe { Box::new(std::mem::zeroed()) }
    }

    #[test]
    fn v1_prefix_is_unchanged() {
        assert_eq!(REASON_TABLES[0] + REASON_SLOTS * 16, V1_LEN);
        // A version-1 file (no extension): figures parse, extension figures are zero.
        let mut b = vec![0u8; PAGE_LEN];
        put_word(&mut b, 0, MAGIC);
        put_word(&mut b, 8, 1);
        put_word(&mut b, 16, 4242);
        put_word(&mut b, 24, 3);
        put_word(&mut b, 64, 1000);
        put_word(&mut b, 168, 0x0301_0000);
        put_word(&mut b, 176, 2);
        let s = Snapshot::parse(&b).unwrap();
        assert!(!s.ext);
        assert_eq!(s.pid, 4242);
        assert_eq!(s.get("smcd_client"), 3);
        assert_eq!(s.get("rx_bytes"), 1000);
        assert_eq!(s.reasons[&0x0301_0000], 2);
        assert_eq!(s.cgroup_id, 0);
        // Only the v1 part: still readable.
        assert!(Snapshot::parse(&b[..V1_LEN]).is_some());
        assert!(Snapshot::parse(&b[..V1_LEN - 1]).is_none());
    }

    #[test]
    fn writer_reader_roundtrip_and_fold() {
        let a = area();
        let id = Identity {
            pid: 77,
            cgroup_id: 12345,
            start_time: 999,
            pid_ns: 5,
        };
        a.init(&id, VALID_SIDE_REASONS | VALID_RING_HIST);
        a.smcd_client.fetch_add(2, Ordering::Relaxed);
        a.fallback(true, 0x0301_0000);
        a.fallback(false, 0x0301_0000);
        a.fallback(false, 0x030d_0000);
        a.ring_sizes(64 << 10, 1 << 20);
        a.rx_bytes.fetch_add(5, Ordering::Relaxed);
        let b = a.to_bytes();
        let s = Snapshot::parse(&b).unwrap();
        assert!(s.ext);
        assert_eq!(
            (s.pid, s.cgroup_id, s.start_time, s.pid_ns),
            (77, 12345, 999, 5)
        );
        assert_eq!(s.get("fallback_server"), 1);
        assert_eq!(s.get("fallback_client"), 2);
        assert_eq!(s.reasons[&0x0301_0000], 2);
        assert_eq!(s.reasons_client[&0x030d_0000], 1);
        assert_eq!(s.reasons_server[&0x0301_0000], 1);
        assert_eq!(s.hists["rx_ring"][3], 1);
        assert_eq!(s.hists["tx_ring"][7], 1);

        let mut agg = new_aggregate(12345);
        assert!(fold(&mut agg, &b));
        assert!(fold(&mut agg, &b));
        let g = Snapshot::parse(&agg).unwrap();
        assert!(g.is_aggregate());
        assert_eq!(g.cgroup_id, 12345);
        assert_eq!(g.get("smcd_client"), 4);
        assert_eq!(g.get("rx_bytes"), 10);
        assert_eq!(g.reasons[&0x0301_0000], 4);
        assert_eq!(g.reasons_client[&0x030d_0000], 2);
        assert_eq!(g.hists["tx_ring"][7], 2);
        assert!(!fold(&mut agg, b"junk"));
    }

    #[test]
    fn buckets() {
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(8 << 10), 0);
        assert_eq!(hist_bucket((8 << 10) + 1), 1);
        assert_eq!(hist_bucket(16 << 10), 1);
        assert_eq!(hist_bucket(1 << 20), 7);
        assert_eq!(hist_bucket((1 << 20) + 1), 8);
    }

    #[test]
    fn conn_records() {
        let mut file = area().to_bytes();
        file.resize(PAGE_LEN + 4 * CONN_RECORD_LEN, 0);
        put_word(&mut file, 0, MAGIC);
        put_word(&mut file, 8, VERSION);
        put_word(&mut file, offset_of!(ProcStats, ext_version), 1);
        put_word(&mut file, offset_of!(ProcStats, conn_slots), 4);
        put_word(
            &mut file,
            offset_of!(ProcStats, conn_table_offset),
            PAGE_LEN as u64,
        );
        put_word(
            &mut file,
            offset_of!(ProcStats, conn_record_len),
            CONN_RECORD_LEN as u64,
        );
        let slots: Vec<ConnSlot> = (0..4)
            .map(|_| ConnSlot(std::array::from_fn(|_| AtomicU64::new(0))))
            .collect();
        assert!(slots[1].try_claim());
        assert!(!slots[1].try_claim());
        let r = ConnRecord {
            state: ConnState::Smcd as u8,
            server: true,
            fd: 7,
            reason: 0,
            local: "127.0.0.1:80".parse().unwrap(),
            peer: "[::1]:40000".parse().unwrap(),
            own_token: 0xdead,
            peer_token: 0xbeef,
            own_dmb_size: 65536,
            peer_dmb_size: 16384,
            rx_bytes: 0,
            tx_bytes: 0,
            opened_ms: 1,
        };
        slots[1].publish(&r);
        slots[1].add_bytes(10, 20);
        assert!(slots[2].try_claim());
        slots[2].publish(&ConnRecord {
            state: ConnState::Tcp as u8,
            reason: 0x0301_0000,
            ..r.clone()
        });
        slots[2].release();
        for (i, s) in slots.iter().enumerate() {
            for (j, w) in s.0.iter().enumerate() {
                put_word(
                    &mut file,
                    PAGE_LEN + i * CONN_RECORD_LEN + j * 8,
                    w.load(Ordering::Relaxed),
                );
            }
        }
        let s = Snapshot::parse(&file).unwrap();
        assert_eq!(s.conns.len(), 1);
        let got = &s.conns[0];
        assert_eq!(got.state(), ConnState::Smcd);
        assert_eq!((got.rx_bytes, got.tx_bytes), (10, 20));
        assert_eq!(
            ConnRecord {
                rx_bytes: 0,
                tx_bytes: 0,
                ..got.clone()
            },
            r
        );
    }
}
