//! The DMB table: slot bitmap, token shards, refcounts, quotas, counters.
//!
//! Concurrency: no lock is ever held across I/O or an `.await`.
//! - Slots: a bitmap of `AtomicU64` words; a slot is taken with a compare-and-swap on its bit
//!   (two callers picking the same free bit cannot both get it: only the CAS winner owns the
//!   bit).
//! - Tokens: 64 shards of `Mutex<HashMap<token, Record>>`. A random token is committed by
//!   inserting it into its shard only if vacant, under that shard's lock (a few hundred
//!   nanoseconds); a clash redraws. Refcounts live in the record and change only under the same
//!   lock, so "look up" and "take a reference unless it is being freed" are one atomic step, and
//!   the release that drops the count to zero removes the token in that same step.
//! - Quotas and gauges: atomics with reserve-then-check (`fetch_add`, roll back if over).
//! - Freeing is RAII: the record's `Arc<DmbObj>` drops the memfd first, then the slot bit, then
//!   the quota charge, so a slot or quota is reusable only once the memory reference is gone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use crate::client::Gid;
use crate::proto::Status;
use crate::stats::{CgroupStats, DmbInfo, DmbList, FailureStats, OpStats, OpsStats, Stats};
use crate::sys::{self, TcpIdentity};
use smc_common::cdc::dmb_size_from_code_large;

use super::shelf::KeptFile;
use super::DaemonConfig;

const SHARDS: usize = 64;

/// Why a request failed (one failure counter each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fail {
    MaxDmb,
    QuotaDmbs,
    /// The caller's uid holds its maximum number of DMBs.
    UidDmbs,
    QuotaBytes,
    TotalBytes,
    MemPressure,
    Memfd(i32),
    /// The daemon at its descriptor limit (`RLIMIT_NOFILE`): no descriptor for a new DMB's
    /// files, or for the socket a request passed (the kernel dropped it), kept free below it.
    FdLimit,
    BadSize,
    BadSocket,
    StaleToken,
    BadProof,
    /// The owner's peer socket was not found when it registered: nobody may attach.
    PeerUnknown,
    /// `PAIR`: the other end did not ask within the wait.
    NoPeer,
    OtherCgroup,
    NotHeld,
    Malformed,
    Oversized,
    BadVersion,
    UnknownOp,
    Internal,
}

impl Fail {
    /// The failure of a record the decoder refused.
    pub(crate) fn from_status(s: Status) -> Fail {
        match s {
            Status::Oversized => Fail::Oversized,
            Status::BadVersion => Fail::BadVersion,
            Status::UnknownOp => Fail::UnknownOp,
            Status::BadSize => Fail::BadSize,
            _ => Fail::Malformed,
        }
    }

    /// Wire status and detail.
    pub(crate) fn status(self) -> (Status, u32) {
        match self {
            Fail::MaxDmb => (Status::MaxDmb, 0),
            Fail::QuotaDmbs => (Status::QuotaDmbs, 0),
            Fail::UidDmbs => (Status::QuotaDmbs, QUOTA_DETAIL_UID),
            Fail::QuotaBytes => (Status::QuotaBytes, 0),
            Fail::TotalBytes | Fail::MemPressure => (Status::Mem, 0),
            Fail::Memfd(errno) => (Status::Mem, errno as u32),
            Fail::FdLimit => (Status::Mem, libc::EMFILE as u32),
            Fail::BadSize => (Status::BadSize, 0),
            Fail::BadSocket => (Status::BadSocket, 0),
            Fail::StaleToken => (Status::StaleToken, 0),
            Fail::BadProof | Fail::PeerUnknown | Fail::OtherCgroup => (Status::BadProof, 0),
            Fail::NoPeer => (Status::NoPeer, 0),
            Fail::NotHeld => (Status::NotHeld, 0),
            Fail::Malformed => (Status::Malformed, 0),
            Fail::Oversized => (Status::Oversized, 0),
            Fail::BadVersion => (Status::BadVersion, crate::proto::VERSION as u32),
            Fail::UnknownOp => (Status::UnknownOp, 0),
            Fail::Internal => (Status::Internal, 0),
        }
    }
}

macro_rules! failure_counters {
    ($($f:ident),* $(,)?) => {
        #[derive(Default)]
        pub(crate) struct Failures { $(pub $f: AtomicU64,)* }
        impl Failures {
            fn snapshot(&self) -> FailureStats {
                FailureStats { $($f: self.$f.load(Relaxed),)* }
            }
        }
    };
}
failure_counters!(
    max_dmb,
    quota_dmbs,
    uid_dmbs,
    quota_bytes,
    total_bytes,
    mem_pressure,
    memfd,
    fd_limit,
    reopen,
    bad_size,
    bad_socket,
    stale_token,
    bad_proof,
    peer_unknown,
    other_cgroup,
    not_held,
    malformed,
    oversized,
    bad_version,
    unknown_op,
    no_peer,
    send_failed,
    internal,
    kept_full,
);

impl Failures {
    pub(crate) fn count(&self, f: Fail) {
        let c = match f {
            Fail::MaxDmb => &self.max_dmb,
            Fail::QuotaDmbs => &self.quota_dmbs,
            Fail::UidDmbs => &self.uid_dmbs,
            Fail::QuotaBytes => &self.quota_bytes,
            Fail::TotalBytes => &self.total_bytes,
            Fail::MemPressure => &self.mem_pressure,
            Fail::Memfd(_) => &self.memfd,
            Fail::FdLimit => {
                note_fd_limit();
                &self.fd_limit
            }
            Fail::BadSize => &self.bad_size,
            Fail::BadSocket => &self.bad_socket,
            Fail::StaleToken => &self.stale_token,
            Fail::BadProof => &self.bad_proof,
            Fail::PeerUnknown => &self.peer_unknown,
            Fail::NoPeer => &self.no_peer,
            Fail::OtherCgroup => &self.other_cgroup,
            Fail::NotHeld => &self.not_held,
            Fail::Malformed => &self.malformed,
            Fail::Oversized => &self.oversized,
            Fail::BadVersion => &self.bad_version,
            Fail::UnknownOp => &self.unknown_op,
            Fail::Internal => &self.internal,
        };
        c.fetch_add(1, Relaxed);
    }
}

/// At most one line per this many milliseconds says why requests are refused or replies go
/// without their files (a burst of thousands of handshakes would log thousands).
const LOG_EVERY_MS: u64 = 10_000;

/// A warning logged at most once per [`LOG_EVERY_MS`], with the count of the occurrences it
/// stands for.
pub(crate) struct RateLog {
    /// Milliseconds (since the first use) of the last line, + 1 (0: none yet).
    last_ms: AtomicU64,
    /// Occurrences since that line.
    since: AtomicU64,
}

impl RateLog {
    pub(crate) const fn new() -> RateLog {
        RateLog {
            last_ms: AtomicU64::new(0),
            since: AtomicU64::new(0),
        }
    }

    /// One occurrence: `log(n)` when a line is due, `n` the occurrences it stands for.
    pub(crate) fn note(&self, log: impl FnOnce(u64)) {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        let now = EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1;
        self.since.fetch_add(1, Relaxed);
        let last = self.last_ms.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < LOG_EVERY_MS {
            return;
        }
        if self
            .last_ms
            .compare_exchange(last, now, Relaxed, Relaxed)
            .is_ok()
        {
            log(self.since.swap(0, Relaxed));
        }
    }
}

/// Says (rate-limited) that the daemon refused a request at its descriptor limit.
fn note_fd_limit() {
    static LOG: RateLog = RateLog::new();
    LOG.note(|n| {
        let (shelved, full) = super::shelf::shelved_now();
        let why = if full {
            "its shelves are full (vm.max_map_count, or --max-shelved): raise them or \
             RLIMIT_NOFILE (docs/OPERATIONS.md)"
        } else {
            "raise RLIMIT_NOFILE (docs/OPERATIONS.md)"
        };
        log::warn!(
            "at its descriptor limit (RLIMIT_NOFILE {}; {} held by DMB files, {shelved} \
             shelved): {n} request(s) refused since the last such line, their connections \
             decline MEM and stay TCP; {why}",
            sys::nofile_soft_limit(),
            super::shelf::held_descriptors(),
        );
    });
}

/// Counters of one op.
#[derive(Default)]
pub(crate) struct OpCounter {
    requests: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    nanos: AtomicU64,
}

impl OpCounter {
    /// Time spent handling one request (see [`OpStats::nanos`]).
    pub(crate) fn add_time(&self, t: std::time::Duration) {
        self.nanos
            .fetch_add(t.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    pub(crate) fn record(&self, ok: bool) {
        self.requests.fetch_add(1, Relaxed);
        if ok {
            self.ok.fetch_add(1, Relaxed);
        } else {
            self.failed.fetch_add(1, Relaxed);
        }
    }
    fn snapshot(&self) -> OpStats {
        OpStats {
            requests: self.requests.load(Relaxed),
            ok: self.ok.load(Relaxed),
            failed: self.failed.load(Relaxed),
            nanos: self.nanos.load(Relaxed),
        }
    }
}

/// All counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub query_gid: OpCounter,
    pub register: OpCounter,
    pub attach: OpCounter,
    pub attach_peer: OpCounter,
    pub detach: OpCounter,
    pub unregister: OpCounter,
    pub stats: OpCounter,
    pub wait: OpCounter,
    pub list: OpCounter,
    pub pair: OpCounter,
    pub invalid: OpCounter,
    pub failures: Failures,
    pub clients_connected: AtomicU64,
    pub clients_total: AtomicU64,
    pub clients_refused: AtomicU64,
    pub clients_refused_uid: AtomicU64,
    pub clients_refused_fd_limit: AtomicU64,
    pub released_on_disconnect: AtomicU64,
    pub dmbs_reused: AtomicU64,
}

/// Device-wide gauges.
#[derive(Default)]
pub(crate) struct Totals {
    pub live_dmbs: AtomicU64,
    pub live_bytes: AtomicU64,
    pub live_attachments: AtomicU64,
    /// Σ [`reserve_of`] of live DMBs: what the byte quotas charge up front.
    pub reserved: AtomicU64,
    /// From the last sample: committed bytes above the reserves (see [`Registry::sample`]).
    pub extra: AtomicU64,
    /// From the last sample: committed bytes of all live DMBs (`st_blocks`).
    pub committed: AtomicU64,
    /// Live DMBs in their owners' pools.
    pub pooled: AtomicU64,
    /// Live DMBs whose memfd is shelved (kept without a descriptor, see `shelf`).
    pub shelved: AtomicU64,
}

/// What a DMB is charged against the byte quotas when it is registered: one 16 KiB unit (the
/// CDC header page and the first pages of data), or its size if smaller. What it commits
/// beyond that, once data flows, is added by the next sample of committed memory: memfd pages
/// exist only once touched, and the data path gives drained rings back (hole punching), so
/// the quotas count memory in use, not the DMBs' nominal sizes.
pub(crate) fn reserve_of(size: u64) -> u64 {
    size.min(16 * 1024)
}

/// The slot bitmap.
pub(crate) struct SlotMap {
    words: Box<[AtomicU64]>,
    max: u32,
    hint: AtomicUsize,
}

impl SlotMap {
    fn new(max: u32) -> SlotMap {
        let n = (max as usize).div_ceil(64);
        SlotMap {
            words: (0..n).map(|_| AtomicU64::new(0)).collect(),
            max,
            hint: AtomicUsize::new(0),
        }
    }

    fn valid_mask(&self, w: usize) -> u64 {
        let first = w as u32 * 64;
        let n = (self.max - first).min(64);
        if n == 64 {
            u64::MAX
        } else {
            (1u64 << n) - 1
        }
    }

    /// Takes a free slot with a CAS on its bit; `None` when all are taken.
    fn alloc(self: &Arc<Self>) -> Option<SlotGuard> {
        let n = self.words.len();
        let start = self.hint.load(Relaxed) % n.max(1);
        for i in 0..n {
            let w = (start + i) % n;
            let word = &self.words[w];
            let mask = self.valid_mask(w);
            let mut cur = word.load(Relaxed);
            loop {
                let free = !cur & mask;
                if free == 0 {
                    break;
                }
                let bit = free.trailing_zeros();
                match word.compare_exchange_weak(cur, cur | (1 << bit), AcqRel, Relaxed) {
                    Ok(_) => {
                        self.hint.store(w, Relaxed);
                        return Some(SlotGuard {
                            map: self.clone(),
                            slot: w as u32 * 64 + bit,
                        });
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    fn free(&self, slot: u32) {
        let (w, bit) = (slot as usize / 64, slot % 64);
        let prev = self.words[w].fetch_and(!(1u64 << bit), AcqRel);
        debug_assert!(prev & (1 << bit) != 0, "slot {slot} freed twice");
    }
}

/// Owns one slot bit; clears it on drop.
pub(crate) struct SlotGuard {
    map: Arc<SlotMap>,
    slot: u32,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.map.free(self.slot);
    }
}

/// Usage of one cgroup.
pub(crate) struct CgroupUsage {
    pub path: String,
    dmbs: AtomicU64,
    bytes: AtomicU64,
    refused: AtomicU64,
    /// Σ [`reserve_of`] of its live DMBs.
    reserved: AtomicU64,
    /// From the last sample: committed bytes above the reserves.
    extra: AtomicU64,
    /// From the last sample: committed bytes of its live DMBs.
    committed: AtomicU64,
}

/// Usage of one uid (`SO_PEERCRED` of its client connections).
pub(crate) struct UidUsage {
    pub uid: u32,
    pub conns: AtomicU64,
    dmbs: AtomicU64,
    /// Its `PAIR` requests waiting for their peers (each with a socket open in the daemon).
    pub parked: AtomicU64,
}

/// One DMB charged to a uid; released on drop.
pub(crate) struct UidCharge(Arc<UidUsage>);

impl Drop for UidCharge {
    fn drop(&mut self) {
        self.0.dmbs.fetch_sub(1, AcqRel);
    }
}

/// `detail` of a `QuotaDmbs` reply when the uid's limit refused it (0: the cgroup's).
pub(crate) const QUOTA_DETAIL_UID: u32 = 2;

/// A quota reservation (cgroup + device totals); released on drop.
pub(crate) struct Charge {
    cg: Arc<CgroupUsage>,
    totals: Arc<Totals>,
    size: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        let r = reserve_of(self.size);
        self.cg.dmbs.fetch_sub(1, AcqRel);
        self.cg.bytes.fetch_sub(self.size, AcqRel);
        self.cg.reserved.fetch_sub(r, AcqRel);
        self.totals.live_dmbs.fetch_sub(1, AcqRel);
        self.totals.live_bytes.fetch_sub(self.size, AcqRel);
        self.totals.reserved.fetch_sub(r, AcqRel);
    }
}

/// A live DMB. Field order is drop order: memfd, then slot, then charges.
pub(crate) struct DmbObj {
    /// Its memfd, by descriptor or shelved (see `shelf`).
    pub memfd: KeptFile,
    /// The owner's local state (a 4 KiB memfd it passed at registration, or what the daemon
    /// made for a `PAIR`: a page, or a slot of a page), for `OP_ADOPT`; kept as the memfd is.
    pub state: Option<LocalState>,
    slot: SlotGuard,
    _charge: Charge,
    _uid_charge: Option<UidCharge>,
    pub token: u64,
    /// Never reused, by any daemon instance (random start): a process that keeps a mapping of
    /// this DMB across its bindings (pooled DMBs) recognises it by id.
    pub id: u64,
    /// When it was registered (since the registry started).
    born: std::time::Duration,
    pub size_code: u8,
    pub size: u64,
    pub owner_uid: u32,
    pub owner_cgroup: Arc<CgroupUsage>,
    /// The registering client: its cgroup when it connected and its pid namespace, which an
    /// adopter (`OP_ADOPT`) must share.
    pub owner_client: ClientIdentity,
}

/// A connection end's local state (`smc-preload`'s `conn::Shared`): a page of its own, or a
/// slot of a page shared with other ends of the same client connection (see [`StateSlots`]).
pub(crate) enum LocalState {
    Page(KeptFile),
    Slot {
        chunk: Arc<StateChunk>,
        /// Its offset in the page ([`crate::proto::STATE_SLOT`] bytes from there).
        off: u32,
    },
}

impl LocalState {
    /// The file to pass (the page, or the page holding the slot).
    pub(crate) fn file(&self) -> &KeptFile {
        match self {
            LocalState::Page(f) => f,
            LocalState::Slot { chunk, .. } => &chunk.file,
        }
    }

    /// The slot's offset, if it is one.
    pub(crate) fn slot_off(&self) -> Option<u32> {
        match self {
            LocalState::Page(_) => None,
            LocalState::Slot { off, .. } => Some(*off),
        }
    }

    /// The fork epoch of its page, if it is a slot (see [`StateSlots::new_page`]).
    fn slot_epoch(&self) -> Option<u32> {
        match self {
            LocalState::Page(_) => None,
            LocalState::Slot { chunk, .. } => Some(chunk.epoch),
        }
    }

    /// Shelves its file (in the daemon's own shelf, leaving `reserve` of it free): a page at
    /// once; a page of slots once all its slots are handed out (before, the next `PAIR` of its
    /// client would open it again), or `force`d. Whether it was shelved now.
    fn shelve(&self, force: bool, reserve: u64) -> bool {
        self.to_shelve(force)
            .and_then(|f| f.shelve(reserve))
            .is_some_and(|now| now)
    }

    /// Its file, if it may be shelved now (see [`LocalState::shelve`]).
    fn to_shelve(&self, force: bool) -> Option<&KeptFile> {
        match self {
            LocalState::Page(f) => Some(f),
            LocalState::Slot { chunk, .. } => {
                (force || chunk.taken.load(Acquire) >= SLOTS_PER_CHUNK).then_some(&chunk.file)
            }
        }
    }
}

/// Slots in a page of local state.
const SLOTS_PER_CHUNK: u32 = (crate::proto::STATE_PAGE / crate::proto::STATE_SLOT) as u32;

/// A page of local state slots (a sealed 4 KiB memfd), handed out in order to the DMBs one
/// client connection registers, each slot once: a slot is never reused for another
/// connection end (a process that kept mapping it, a forked child the library did not see,
/// never finds another connection's state there). The page lives while the DMB of any of its
/// slots does (they hold it), and in the processes that map it.
///
/// Who maps it: the processes of the client connection that asked (one process, and the
/// children it forks), and those an adopter of one of its slots (same uid, cgroup and pid
/// namespace as the registering client): such an adopter maps the page, and with it the local
/// state of up to 15 other connection ends of that process: cursors, locks and counters,
/// never their bytes (rings are one memfd per DMB).
pub(crate) struct StateChunk {
    pub file: KeptFile,
    /// Slots handed out.
    taken: AtomicU32,
    /// The client's fork epoch when the page was made (see [`StateSlots::new_page`]).
    epoch: u32,
}

/// A client connection's page of local state slots being handed out (see [`StateChunk`]),
/// and its fork epoch: how many times the client said it forked
/// ([`crate::proto::PAIR_FLAG_NEW_SLOT_PAGE`]).
#[derive(Default)]
pub(crate) struct StateSlots(Mutex<(Option<Arc<StateChunk>>, u32)>);

impl StateSlots {
    /// The client forked: a child maps the pages of its slots so far, so its next slots come
    /// from a new page, and its pooled DMBs whose slot is on an older page are not bound again
    /// ([`StateSlots::epoch`], [`Registry::bind_pooled`]).
    pub(crate) fn new_page(&self) {
        let mut cur = self.0.lock().unwrap_or_else(|p| p.into_inner());
        cur.0 = None;
        cur.1 = cur.1.wrapping_add(1);
    }

    /// The client's fork epoch (see [`StateSlots::new_page`]).
    pub(crate) fn epoch(&self) -> u32 {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).1
    }

    /// The next slot of the current page (a new page when it is full); `None` when no page
    /// can be made (the connection end then has no local state with the daemon and cannot
    /// move to another process).
    pub(crate) fn take(&self) -> Option<LocalState> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let (cur, epoch) = &mut *g;
        let full = cur
            .as_ref()
            .is_none_or(|c| c.taken.load(Acquire) >= SLOTS_PER_CHUNK);
        if full {
            let f = sys::create_state_memfd(crate::proto::STATE_PAGE).ok()?;
            *cur = Some(Arc::new(StateChunk {
                file: KeptFile::new(f, crate::proto::STATE_PAGE),
                taken: AtomicU32::new(0),
                epoch: *epoch,
            }));
        }
        let chunk = cur.as_ref()?.clone();
        let i = chunk.taken.fetch_add(1, AcqRel);
        Some(LocalState::Slot {
            chunk,
            off: i * crate::proto::STATE_SLOT as u32,
        })
    }
}

/// The client connection that attaches a DMB: its id, uid and identity (see
/// [`Registry::attach`]).
#[derive(Clone, Copy)]
pub(crate) struct Attacher<'a> {
    pub conn: u64,
    pub uid: u32,
    pub ident: &'a ClientIdentity,
}

/// Who a client is beyond its uid, sampled when it connected (for `OP_ADOPT`).
#[derive(Clone)]
pub(crate) struct ClientIdentity {
    /// Its cgroup's usage entry (by its path when it connected).
    pub cgroup: Arc<CgroupUsage>,
    /// Inode of its pid namespace (`/proc/PID/ns/pid`); `None` when unknown (never matches).
    pub pidns: Option<u64>,
}

impl ClientIdentity {
    /// Same cgroup and the same, known, pid namespace.
    fn same(&self, o: &ClientIdentity) -> bool {
        Arc::ptr_eq(&self.cgroup, &o.cgroup)
            && matches!((self.pidns, o.pidns), (Some(a), Some(b)) if a == b)
    }
}

impl DmbObj {
    pub(crate) fn slot(&self) -> u32 {
        self.slot.slot
    }

    /// Shelves its memfd and state page in the daemon's own shelf, leaving `reserve` of it
    /// free (see `shelf`); false when its memfd keeps its descriptor.
    fn shelve(&self, reserve: u64) -> bool {
        let r = self.memfd.shelve(reserve);
        if r == Some(true) {
            self._charge.totals.shelved.fetch_add(1, AcqRel);
        }
        if let Some(s) = &self.state {
            s.shelve(false, reserve);
        }
        r.is_some()
    }
}

impl Drop for DmbObj {
    fn drop(&mut self) {
        if self.memfd.is_shelved() {
            self._charge.totals.shelved.fetch_sub(1, AcqRel);
        }
    }
}

struct Record {
    dmb: Arc<DmbObj>,
    refs: u32,
    unregistered: bool,
    /// The owner's socket of the connection the DMB is bound to (for a pooled DMB: the last
    /// one; nobody may attach then).
    owner: TcpIdentity,
    /// `SO_COOKIE` of the socket at the other end of the owner's connection (found in the
    /// kernel's connection table, or the other end of an `OP_PAIR`): the only socket that may
    /// attach.
    peer_cookie: Option<u64>,
    /// In its owner's pool: unbound, no attach, may be bound to a new connection of the owner
    /// whose peer is [`Record::attached_by`] (or anyone, if nobody ever attached).
    pooled: bool,
    /// The one client connection that ever attached it (see [`Registry::bind_pooled`]).
    attached_by: Option<u64>,
    /// Its uid and identity: another client connection attaches only if it is of the same
    /// tenant (see [`Registry::attach`]).
    attached_tenant: Option<(u32, ClientIdentity)>,
    /// Never to be bound again: attached by two client connections, or released by one that
    /// may still write into it.
    tainted: bool,
    /// Since when (registry time) it waits for the first attach by the other end of the
    /// connection it is bound to (`None`: attached, nobody may attach it, or a server's
    /// registration before its accept, whose client can still decline). Its files are not
    /// shelved meanwhile (for [`ATTACH_GRACE`] at most): that attach may come from a server
    /// past its CLC accept, which can no longer decline, when the daemon has no descriptor
    /// left to open a shelved file again (issue 14: resets, server `INTERR`).
    awaiting: Option<std::time::Duration>,
}

impl Record {
    /// Whether its files stay unshelved for an attach to come (see [`Record::awaiting`]).
    fn awaits_attach(&self, now: std::time::Duration) -> bool {
        self.awaiting
            .is_some_and(|t| now.saturating_sub(t) < ATTACH_GRACE)
    }
}

/// How long a DMB that waits for its first attach keeps its descriptors at most (see
/// [`Record::awaiting`]): longer than a server waits for its client's confirm and then for the
/// daemon (`smc-preload`'s `committed_wait`, ten CLC timeouts: 20 s by default). A DMB whose
/// peer never attaches (its connection failed) is released by its owner long before.
const ATTACH_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a pooled DMB could not be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindMiss {
    /// Not for this peer (yet): another process attached it, or an attach is still held.
    NotNow,
    /// Gone, or never to be bound again: forget it.
    Gone,
}

/// Which reference a release drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RefKind {
    Owner,
    Attach,
}

/// MemAvailable from /proc/meminfo, re-read at most every 200 ms.
struct MemFloor {
    epoch: Instant,
    checked_ms: AtomicU64,
    avail: AtomicU64,
}

impl MemFloor {
    fn available(&self) -> u64 {
        let now = self.epoch.elapsed().as_millis() as u64 + 1;
        let last = self.checked_ms.load(Relaxed);
        if last == 0 || now.saturating_sub(last) >= 200 {
            self.checked_ms.store(now, Relaxed);
            if let Some(v) = read_mem_available() {
                self.avail.store(v, Relaxed);
            }
        }
        self.avail.load(Relaxed)
    }
}

fn read_mem_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Key of the owner index: the owner's (local, peer) addresses.
type Tuple = (std::net::SocketAddr, std::net::SocketAddr);

/// Descriptors below the daemon's `RLIMIT_NOFILE` no new DMB takes: kept for the sockets
/// passed with requests (see `register`).
pub(crate) const RECEIVE_HEADROOM: u64 = 32;

/// With fewer descriptors than this left, a registration first shelves the files of
/// [`SHELVE_BATCH`] DMBs not shelved yet, whatever their age (the background sweep, see
/// [`Registry::shelve_tick`], did not keep up).
const SHELVE_HEADROOM: u64 = 256;
/// DMBs shelved at once when descriptors run short.
const SHELVE_BATCH: usize = 64;
/// Shelved DMBs sampled (through their mappings) per sample of committed memory, about.
const SHELVED_PER_SAMPLE: u64 = 512;

/// The whole device state.
pub(crate) struct Registry {
    shards: Box<[Mutex<HashMap<u64, Record>>]>,
    /// Live registrations by their owner's connection, for `attach_peer` (the latest
    /// registration of a connection wins; the token is checked again under its shard lock).
    owners: Box<[Mutex<HashMap<Tuple, u64>>]>,
    /// Live records by their owner socket's `SO_COOKIE`, for `OP_ADOPT`: kept for the record's
    /// life (after its owner's unregister too, while the peer still holds it).
    by_cookie: Box<[Mutex<HashMap<u64, u64>>]>,
    slots: Arc<SlotMap>,
    pub totals: Arc<Totals>,
    cgroups: Mutex<HashMap<String, Weak<CgroupUsage>>>,
    uids: Mutex<HashMap<u32, Weak<UidUsage>>>,
    mem: MemFloor,
    /// Milliseconds since `started` of the last sample of committed memory (0: never).
    sampled_ms: AtomicU64,
    sample_interval_ms: u64,
    /// Which turn of the shelved DMBs the next sample refreshes.
    sample_turn: AtomicU64,
    /// The shard the next walk for DMBs to shelve starts at.
    sweep_shard: AtomicUsize,
    /// The most live DMBs since the heap was last trimmed ([`Registry::trim_after_burst`]).
    peak_dmbs: AtomicU64,
    /// How long a DMB keeps its descriptors (`None`: for ever).
    shelve_after: Option<std::time::Duration>,
    pub counters: Counters,
    pub gid: Gid,
    /// The next DMB id (random start, see [`DmbObj::id`]).
    next_id: AtomicU64,
    started: Instant,
    max_dmbs: u32,
    max_total_bytes: u64,
    cgroup_max_dmbs: u64,
    cgroup_max_bytes: u64,
    uid_max_dmbs: u64,
    min_available_bytes: u64,
    require_same_cgroup: bool,
    /// References of clients that let go of a socket another process still holds.
    handed_on: super::handed_on::HandedOn,
}

/// Gives a map's memory back once it holds less than a quarter of what it has room for (a
/// burst of connections is over): amortised, a map never shrinks twice without having grown.
pub(crate) fn shrink_sparse<K: std::hash::Hash + Eq, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 64 && m.len() < m.capacity() / 4 {
        m.shrink_to(m.len() * 2);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard lock cannot leave a half-updated record (updates are
    // single assignments), so poisoning is ignored.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    pub(crate) fn new(cfg: &DaemonConfig, gid: Gid) -> Registry {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            owners: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            by_cookie: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            slots: Arc::new(SlotMap::new(cfg.max_dmbs)),
            totals: Arc::default(),
            cgroups: Mutex::new(HashMap::new()),
            uids: Mutex::new(HashMap::new()),
            mem: MemFloor {
                epoch: Instant::now(),
                checked_ms: AtomicU64::new(0),
                avail: AtomicU64::new(u64::MAX),
            },
            sampled_ms: AtomicU64::new(0),
            sample_interval_ms: cfg.commit_sample_ms,
            sample_turn: AtomicU64::new(0),
            sweep_shard: AtomicUsize::new(0),
            peak_dmbs: AtomicU64::new(0),
            shelve_after: cfg
                .shelve_after_ms
                .filter(|_| super::shelf::available())
                .map(std::time::Duration::from_millis),
            counters: Counters::default(),
            handed_on: super::handed_on::HandedOn::new(
                cfg.max_kept as usize,
                cfg.uid_max_kept as usize,
            ),
            gid,
            next_id: AtomicU64::new(sys::random_u64().unwrap_or_else(|_| {
                // No randomness: the clock still differs between daemon instances.
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            })),
            started: Instant::now(),
            max_dmbs: cfg.max_dmbs,
            max_total_bytes: cfg.max_total_bytes,
            cgroup_max_dmbs: cfg.cgroup_max_dmbs as u64,
            cgroup_max_bytes: cfg.cgroup_max_bytes,
            uid_max_dmbs: cfg.uid_max_dmbs as u64,
            min_available_bytes: cfg.min_available_bytes,
            require_same_cgroup: cfg.require_same_cgroup,
        }
    }

    fn shard(&self, token: u64) -> &Mutex<HashMap<u64, Record>> {
        // Tokens are uniformly random: any bits select a shard evenly.
        &self.shards[(token as usize) % SHARDS]
    }

    fn cookie_shard(&self, cookie: u64) -> &Mutex<HashMap<u64, u64>> {
        // Socket cookies are sequential: mix them before selecting a shard.
        &self.by_cookie[(cookie.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS]
    }

    fn owner_shard(&self, t: &Tuple) -> &Mutex<HashMap<Tuple, u64>> {
        use std::hash::BuildHasher;
        static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let h = SEED.get_or_init(Default::default).hash_one(t);
        &self.owners[(h as usize) % SHARDS]
    }

    /// The usage entry of a cgroup (shared by all its clients and DMBs).
    pub(crate) fn cgroup(&self, path: &str) -> Arc<CgroupUsage> {
        let mut map = lock(&self.cgroups);
        if let Some(cg) = map.get(path).and_then(Weak::upgrade) {
            return cg;
        }
        if map.len() >= 256 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let cg = Arc::new(CgroupUsage {
            path: path.to_owned(),
            dmbs: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            extra: AtomicU64::new(0),
            committed: AtomicU64::new(0),
        });
        map.insert(path.to_owned(), Arc::downgrade(&cg));
        cg
    }

    /// The usage entry of a uid (shared by all its client connections and DMBs).
    pub(crate) fn uid(&self, uid: u32) -> Arc<UidUsage> {
        let mut map = lock(&self.uids);
        if let Some(u) = map.get(&uid).and_then(Weak::upgrade) {
            return u;
        }
        if map.len() >= 256 {
            map.retain(|_, w| w.strong_count() > 0);
        }
        let u = Arc::new(UidUsage {
            uid,
            conns: AtomicU64::new(0),
            dmbs: AtomicU64::new(0),
            parked: AtomicU64::new(0),
        });
        map.insert(uid, Arc::downgrade(&u));
        u
    }

    /// Charges one DMB to `uid` (root is not limited).
    fn charge_uid(&self, uid: &Arc<UidUsage>) -> Result<Option<UidCharge>, Fail> {
        if uid.uid == 0 {
            return Ok(None);
        }
        if uid.dmbs.fetch_add(1, AcqRel) >= self.uid_max_dmbs {
            uid.dmbs.fetch_sub(1, AcqRel);
            return Err(Fail::UidDmbs);
        }
        Ok(Some(UidCharge(uid.clone())))
    }

    /// Samples committed memory when the last sample is older than the configured interval
    /// (one caller does it; the others use the figures as they are).
    fn maybe_sample(&self) {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        let last = self.sampled_ms.load(Relaxed);
        if last != 0 && now.saturating_sub(last) < self.sample_interval_ms {
            return;
        }
        if self
            .sampled_ms
            .compare_exchange(last, now, AcqRel, Relaxed)
            .is_ok()
        {
            self.sample();
        }
    }

    /// Committed memory of every live DMB (`fstat` of its memfd: `st_blocks`, the pages that
    /// exist), summed per cgroup and device-wide. No lock is held during the `fstat`s.
    pub(crate) fn sample(&self) {
        let mut dmbs: Vec<Arc<DmbObj>> = Vec::new();
        for sh in self.shards.iter() {
            dmbs.extend(lock(sh).values().map(|r| r.dmb.clone()));
        }
        // A shelved DMB is sampled through its mapping (~5 µs, ten times an `fstat`): at most
        // about SHELVED_PER_SAMPLE of them per sample, in turn by id; the others count as
        // last sampled.
        let shelved = self.totals.shelved.load(Relaxed);
        let turns = shelved.div_ceil(SHELVED_PER_SAMPLE).max(1);
        let turn = self.sample_turn.fetch_add(1, Relaxed) % turns;
        let mut per_cg: HashMap<*const CgroupUsage, (Arc<CgroupUsage>, u64, u64)> = HashMap::new();
        let (mut extra, mut committed) = (0u64, 0u64);
        for d in &dmbs {
            let c = d.memfd.committed(d.id % turns == turn);
            let x = c.saturating_sub(reserve_of(d.size));
            committed += c;
            extra += x;
            let e = per_cg
                .entry(Arc::as_ptr(&d.owner_cgroup))
                .or_insert_with(|| (d.owner_cgroup.clone(), 0, 0));
            e.1 += x;
            e.2 += c;
        }
        drop(dmbs);
        let all: Vec<Arc<CgroupUsage>> = lock(&self.cgroups)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        for cg in &all {
            let (x, c) = per_cg.get(&Arc::as_ptr(cg)).map_or((0, 0), |e| (e.1, e.2));
            cg.extra.store(x, Relaxed);
            cg.committed.store(c, Relaxed);
        }
        self.totals.extra.store(extra, Relaxed);
        self.totals.committed.store(committed, Relaxed);
    }

    fn charge(&self, cg: &Arc<CgroupUsage>, size: u64) -> Result<Charge, Fail> {
        if cg.dmbs.fetch_add(1, AcqRel) >= self.cgroup_max_dmbs {
            cg.dmbs.fetch_sub(1, AcqRel);
            cg.refused.fetch_add(1, Relaxed);
            return Err(Fail::QuotaDmbs);
        }
        self.maybe_sample();
        // The byte quotas count committed memory: the reserves of live DMBs plus what the
        // last sample found committed above them.
        let r = reserve_of(size);
        cg.bytes.fetch_add(size, AcqRel);
        if cg.reserved.fetch_add(r, AcqRel) + r + cg.extra.load(Relaxed) > self.cgroup_max_bytes {
            cg.reserved.fetch_sub(r, AcqRel);
            cg.bytes.fetch_sub(size, AcqRel);
            cg.dmbs.fetch_sub(1, AcqRel);
            cg.refused.fetch_add(1, Relaxed);
            return Err(Fail::QuotaBytes);
        }
        // From here on the Charge's Drop rolls everything back.
        self.totals.live_dmbs.fetch_add(1, AcqRel);
        self.totals.live_bytes.fetch_add(size, AcqRel);
        let charge = Charge {
            cg: cg.clone(),
            totals: self.totals.clone(),
            size,
        };
        if self.totals.reserved.fetch_add(r, AcqRel) + r + self.totals.extra.load(Relaxed)
            > self.max_total_bytes
        {
            return Err(Fail::TotalBytes);
        }
        if self.min_available_bytes > 0
            && self.mem.available() < self.min_available_bytes.saturating_add(size)
        {
            return Err(Fail::MemPressure);
        }
        Ok(charge)
    }

    /// Registers a DMB owned by the caller: quota, slot, memfd, token, refcount 1. `keep`: its
    /// files stay unshelved until the other end attaches it (see [`Record::awaiting`]; moot
    /// without `peer_cookie`: nobody may).
    // Each argument is one fact of the registration, from a different source.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register(
        &self,
        size_code: u8,
        owner: TcpIdentity,
        peer_cookie: Option<u64>,
        keep: bool,
        cg: &Arc<CgroupUsage>,
        uid: &Arc<UidUsage>,
        client: &ClientIdentity,
        state: Option<LocalState>,
    ) -> Result<Arc<DmbObj>, Fail> {
        let size = dmb_size_from_code_large(size_code).ok_or(Fail::BadSize)? as u64;
        let uid_charge = self.charge_uid(uid)?;
        let charge = self.charge(cg, size)?;
        let slot = self.slots.alloc().ok_or(Fail::MaxDmb)?;
        // No descriptor for it: the files of other DMBs are shelved to make room, and it is
        // tried once more (a registration is refused only if that finds none).
        let memfd = match sys::create_dmb_memfd(size) {
            Err(e)
                if e.raw_os_error() == Some(libc::EMFILE) && self.make_room(RECEIVE_HEADROOM) =>
            {
                sys::create_dmb_memfd(size)
            }
            r => r,
        }
        .map_err(|e| match e.raw_os_error() {
            Some(libc::EMFILE) => Fail::FdLimit,
            errno => Fail::Memfd(errno.unwrap_or(0)),
        })?;
        // The new file's number was the lowest free one: how close the table is to the limit,
        // without a probe descriptor of its own (`sys::near_fd_limit`) on every registration.
        let limit = sys::nofile_soft_limit();
        let lowest = std::os::fd::AsRawFd::as_raw_fd(&memfd) as u64;
        let mut near = lowest.saturating_add(RECEIVE_HEADROOM) >= limit;
        if self.shelve_after.is_some() && lowest.saturating_add(SHELVE_HEADROOM) >= limit {
            self.shelve_some(SHELVE_BATCH, None, false);
            near = !self.make_room(RECEIVE_HEADROOM);
        }
        // The last descriptors below the daemon's limit stay free for the sockets requests
        // pass: one the kernel drops leaves the daemon unable to tell which connection asked
        // (a PAIR's peer would wait for it in vain); refused here, the request is answered.
        if near {
            return Err(Fail::FdLimit);
        }
        let mut obj = DmbObj {
            memfd: KeptFile::new(memfd, size),
            state,
            slot,
            _charge: charge,
            _uid_charge: uid_charge,
            token: 0,
            id: self.next_id.fetch_add(1, Relaxed),
            born: self.started.elapsed(),
            size_code,
            size,
            owner_uid: uid.uid,
            owner_cgroup: cg.clone(),
            owner_client: client.clone(),
        };
        loop {
            let token = sys::random_u64().map_err(|_| Fail::Internal)?;
            if token == 0 {
                continue;
            }
            let mut shard = lock(self.shard(token));
            if let std::collections::hash_map::Entry::Vacant(v) = shard.entry(token) {
                // `obj` moves here only on the path that returns below.
                obj.token = token;
                let dmb = Arc::new(obj);
                v.insert(Record {
                    dmb: dmb.clone(),
                    refs: 1,
                    unregistered: false,
                    owner,
                    peer_cookie,
                    pooled: false,
                    attached_by: None,
                    attached_tenant: None,
                    tainted: false,
                    awaiting: peer_cookie.filter(|_| keep).map(|_| dmb.born),
                });
                drop(shard);
                let t = (owner.local, owner.peer);
                lock(self.owner_shard(&t)).insert(t, token);
                if let Some(c) = owner.cookie {
                    lock(self.cookie_shard(c)).insert(c, token);
                }
                if self.shelve_after.is_some_and(|a| a.is_zero()) {
                    // A DMB the other end is to attach keeps its memfd's descriptor until then
                    // (see `Record::awaiting`): shelved at that attach.
                    if peer_cookie.is_none() || !keep {
                        dmb.shelve(0);
                    }
                    if let Some(s) = &dmb.state {
                        s.shelve(true, 0);
                    }
                }
                return Ok(dmb);
            }
            // Clash with a live token: draw again.
        }
    }

    /// Makes room for a request that lacks only descriptors: while the daemon has fewer than
    /// `headroom` left below its `RLIMIT_NOFILE` (its lowest free descriptor against the
    /// limit, as `sys::near_fd_limit`), shelves the files of batches of DMBs (of any age; never
    /// the memfd of one that awaits its attach, see [`Record::awaiting`]), at most one walk over
    /// all the shards, until it has them. Whether it has them now (without shelves,
    /// `--shelve-after-ms never`: whether it had them). Before, a registration shelved one
    /// batch from 8 of the 64 shards and a `PAIR` that would wait for its peer none at all:
    /// under a burst of connections with the daemon at its limit (2000 connections under 1500
    /// descriptors), 50–72 `PAIR`s in 2 of 6 runs were refused with 1030–1082 descriptors held
    /// by DMB files that could have been shelved, and their sockets piled up in the closer's
    /// queue (the lowest free descriptor 14 below the limit).
    pub(crate) fn make_room(&self, headroom: u64) -> bool {
        if !sys::near_fd_limit(headroom) {
            return true;
        }
        if self.shelve_after.is_none() {
            return false;
        }
        // `shelve_some` walks 8 shards a call, from where the last walk stopped.
        for _ in 0..SHARDS.div_ceil(8) {
            if self.shelve_some(SHELVE_BATCH, None, false) > 0 && !sys::near_fd_limit(headroom) {
                return true;
            }
        }
        !sys::near_fd_limit(headroom)
    }

    /// A descriptor of `f` for a reply: the one kept, else opened again through its shelf;
    /// when that finds no descriptor left (`EMFILE`), the files of a batch of other DMBs are
    /// shelved first (their descriptors go, as far as `vm.max_map_count` leaves room) and it
    /// is tried once more.
    pub(crate) fn reopen(&self, f: &KeptFile) -> std::io::Result<Arc<std::os::fd::OwnedFd>> {
        match f.fd() {
            Err(e) if e.raw_os_error() == Some(libc::EMFILE) && self.shelve_after.is_some() => {
                if self.shelve_some(SHELVE_BATCH, None, false) == 0 {
                    return Err(e);
                }
                f.fd()
            }
            r => r,
        }
    }

    /// Shelves the files of at most `max` DMBs not shelved yet that were registered at least
    /// `min_age` ago (`None`: any), walking at most 8 shards from where the last walk stopped
    /// (a shard is locked only while its candidates are collected); how many it shelved.
    /// `holders` (the background sweep only: it waits for them): what the daemon's own shelf
    /// has no room for (less [`super::shelf::sweep_reserve`], left to the request paths) goes
    /// to holder processes (see `holder`).
    fn shelve_some(
        &self,
        max: usize,
        min_age: Option<std::time::Duration>,
        holders: bool,
    ) -> usize {
        let now = self.started.elapsed();
        let reserve = if holders {
            super::shelf::sweep_reserve()
        } else {
            0
        };
        let mut done = 0;
        // Those the daemon's own shelf had no room for, and whether they await their attach.
        let mut refused: Vec<(Arc<DmbObj>, bool)> = Vec::new();
        for _ in 0..8 {
            let i = self.sweep_shard.fetch_add(1, Relaxed) % SHARDS;
            let due: Vec<(Arc<DmbObj>, bool)> = lock(&self.shards[i])
                .values()
                .filter(|r| !r.dmb.memfd.is_shelved())
                .filter(|r| min_age.is_none_or(|a| now.saturating_sub(r.dmb.born) >= a))
                .take(max.saturating_sub(done + refused.len()))
                .map(|r| (r.dmb.clone(), r.awaits_attach(now)))
                .collect();
            // One that waits for its attach: its state page only (the attach does not pass it).
            for (d, awaits) in due {
                let ok = match (awaits, &d.state) {
                    (false, _) => d.shelve(reserve),
                    (true, Some(s)) => s.shelve(false, reserve),
                    (true, None) => false,
                };
                // (One awaiting its attach whose state page is shelved has nothing for them.)
                let for_holders = || {
                    !awaits
                        || d.state
                            .as_ref()
                            .and_then(|s| s.to_shelve(false))
                            .is_some_and(|f| !f.is_shelved())
                };
                if ok {
                    done += 1;
                } else if holders && for_holders() {
                    refused.push((d, awaits));
                }
            }
            if done + refused.len() >= max {
                break;
            }
        }
        if !refused.is_empty() {
            let files: Vec<&KeptFile> = refused
                .iter()
                .flat_map(|(d, awaits)| {
                    let state = d.state.as_ref().and_then(|s| s.to_shelve(false));
                    (!awaits).then_some(&d.memfd).into_iter().chain(state)
                })
                .collect();
            let moved = super::shelf::shelve_in_holders(&files);
            for (d, _) in &refused {
                if moved.contains(&(std::ptr::from_ref::<KeptFile>(&d.memfd) as usize)) {
                    d._charge.totals.shelved.fetch_add(1, AcqRel);
                    done += 1;
                }
            }
        }
        done
    }

    /// One turn of the background sweep (see `shelf`): with more than half of the daemon's
    /// descriptors held by DMB files, shelves those of DMBs older than `shelve_after` (a few
    /// at a time, so that the daemon never takes a CPU from the connections for long), and
    /// above three quarters those of any age. Whether there may be more to do at once.
    /// Files the daemon's own shelf has no room for go to holder processes (see `holder`),
    /// and with `shelve_after` 0 (every file at once, in the request paths, into the daemon's
    /// own shelf) so do those that found it full; the turn may wait for holders (it runs on a
    /// blocking thread).
    pub(crate) fn shelve_tick(&self) -> bool {
        let holders = super::holder::enabled();
        if holders {
            super::holder::tick();
        }
        let Some(after) = self.shelve_after else {
            return false;
        };
        if after.is_zero() {
            return holders && self.shelve_some(4 * SHELVE_BATCH, None, true) > 0;
        }
        let limit = sys::nofile_soft_limit();
        let held = super::shelf::held_descriptors();
        if held.saturating_mul(2) < limit {
            return false;
        }
        // With holders, more a turn: a turn waits for a holder's answer once (a message of
        // up to `holder::BATCH` files), and under load for its scheduling.
        let more = if holders { 4 } else { 1 };
        let n = if held.saturating_mul(4) >= limit.saturating_mul(3) {
            self.shelve_some(4 * more * SHELVE_BATCH, None, holders)
        } else {
            self.shelve_some(more * SHELVE_BATCH, Some(after), holders)
        };
        n > 0
    }

    /// Gives the heap's free memory back to the system (`malloc_trim`) once the live DMBs
    /// fell to half of their peak since the last time (a burst of connections ended: the
    /// maps shrank as they emptied, see [`shrink_sparse`]); called by the sweep.
    pub(crate) fn trim_after_burst(&self) {
        let live = self.totals.live_dmbs.load(Relaxed);
        let peak = self.peak_dmbs.fetch_max(live, Relaxed).max(live);
        if peak >= 2048 && live <= peak / 2 {
            self.peak_dmbs.store(live, Relaxed);
            // SAFETY: no preconditions; glibc walks its arenas under their locks.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }

    /// Takes an attach reference if `who` is the mirror of the owner's connection.
    /// `cg`: the quota key of the attacher's socket, asked for only when
    /// [`Registry::require_same_cgroup`] (see [`Registry::needs_attacher_cgroup`]).
    /// `by`: the attaching client (a pooled DMB is bound again only for a connection whose
    /// peer is the one client connection that ever attached it). Once attached, another client
    /// connection that holds the peer socket too (it moved, `SCM_RIGHTS` or `exec`) attaches
    /// only if it is of the first attacher's uid, cgroup and pid namespace, as `OP_ADOPT`
    /// requires: another tenant given the socket must not map the ring its first holder
    /// writes into (what it sent before, and sends after, the handover).
    pub(crate) fn attach(
        &self,
        token: u64,
        who: &TcpIdentity,
        cg: Option<&str>,
        by: Attacher<'_>,
    ) -> Result<Arc<DmbObj>, Fail> {
        self.attach_passing(token, who, cg, by).map(|a| a.0)
    }

    /// As [`Registry::attach`], with the descriptor of the DMB's memfd for the reply when it
    /// has one: taken with the reference, so that a shelving meanwhile (the DMB no longer
    /// waits for its attach, see [`Record::awaiting`]) cannot leave the reply to open the file
    /// again, which needs a descriptor the daemon at its limit does not have.
    pub(crate) fn attach_passing(
        &self,
        token: u64,
        who: &TcpIdentity,
        cg: Option<&str>,
        by: Attacher<'_>,
    ) -> Result<(Arc<DmbObj>, Option<Arc<std::os::fd::OwnedFd>>), Fail> {
        let mut shard = lock(self.shard(token));
        let rec = shard
            .get_mut(&token)
            .filter(|r| !r.unregistered && !r.pooled)
            .ok_or(Fail::StaleToken)?;
        if !is_mirror(&rec.owner, who) {
            return Err(Fail::BadProof);
        }
        match rec.peer_cookie {
            None => return Err(Fail::PeerUnknown),
            Some(c) if who.cookie != Some(c) => return Err(Fail::BadProof),
            Some(_) => {}
        }
        if self.require_same_cgroup && Some(rec.dmb.owner_cgroup.path.as_str()) != cg {
            return Err(Fail::OtherCgroup);
        }
        let second = rec.attached_by.is_some_and(|c| c != by.conn);
        if second
            && !rec
                .attached_tenant
                .as_ref()
                .is_some_and(|(uid, ident)| *uid == by.uid && ident.same(by.ident))
        {
            return Err(Fail::BadProof);
        }
        rec.refs = rec.refs.checked_add(1).ok_or(Fail::Internal)?;
        if rec.attached_by.is_none() {
            rec.attached_by = Some(by.conn);
            rec.attached_tenant = Some((by.uid, by.ident.clone()));
        } else if second {
            rec.tainted = true;
        }
        let first = rec.awaiting.take().is_some();
        self.totals.live_attachments.fetch_add(1, AcqRel);
        let dmb = rec.dmb.clone();
        let fd = dmb.memfd.held();
        drop(shard);
        if first && self.shelve_after.is_some_and(|a| a.is_zero()) {
            // Kept for this attach (see `register`); the reply still has `fd`.
            dmb.shelve(0);
        }
        Ok((dmb, fd))
    }

    /// Takes an attach reference on the live DMB registered by the other end of `who`'s
    /// connection. Only within one network namespace (where a mirrored 4-tuple is the real
    /// peer), so that without the token nothing is granted that the token path would refuse.
    pub(crate) fn attach_peer(
        &self,
        who: &TcpIdentity,
        cg: Option<&str>,
        by: Attacher<'_>,
    ) -> Result<(Arc<DmbObj>, Option<Arc<std::os::fd::OwnedFd>>), Fail> {
        let token = self.peer_token(who).ok_or(Fail::StaleToken)?;
        self.attach_passing(token, who, cg, by)
    }

    /// The proof an attach by the owner of `token` would make with the socket of its
    /// registration (the owner's socket and, when cgroups are compared, its quota key): for an
    /// attach whose socket the daemon could not receive (out of descriptors), when the caller
    /// holds the owner reference of `token` (checked by the caller). `None` when it is not
    /// bound to a connection.
    pub(crate) fn owner_proof(&self, token: u64) -> Option<(TcpIdentity, Option<String>)> {
        let shard = lock(self.shard(token));
        let rec = shard.get(&token).filter(|r| !r.unregistered && !r.pooled)?;
        let cg = self
            .require_same_cgroup
            .then(|| rec.dmb.owner_cgroup.path.clone());
        Some((rec.owner, cg))
    }

    /// `OP_ADOPT`: takes an attach reference on the DMB registered with `who`'s very socket
    /// (same `SO_COOKIE` and addresses: the socket moved to the caller), or with `peer`, on
    /// the DMB of the other end of that connection. Only for a caller of the owner's uid,
    /// cgroup and pid namespace: a process of another tenant that holds the socket gets
    /// nothing (`BadProof`).
    pub(crate) fn adopt(
        &self,
        who: &TcpIdentity,
        which: u8,
        slot_ok: bool,
        uid: u32,
        client: &ClientIdentity,
    ) -> Result<Arc<DmbObj>, Fail> {
        let cookie = who.cookie.ok_or(Fail::BadProof)?;
        let find = |c: u64| {
            lock(self.cookie_shard(c))
                .get(&c)
                .copied()
                .ok_or(Fail::StaleToken)
        };
        let token = find(cookie)?;
        let peer_cookie = {
            let mut shard = lock(self.shard(token));
            let rec = shard.get_mut(&token).ok_or(Fail::StaleToken)?;
            // A pooled DMB is bound to no connection (its owner socket is gone).
            if rec.pooled
                || rec.owner.cookie != Some(cookie)
                || rec.owner.local != who.local
                || rec.owner.peer != who.peer
            {
                return Err(Fail::StaleToken);
            }
            if rec.dmb.owner_uid != uid || !rec.dmb.owner_client.same(client) {
                return Err(Fail::BadProof);
            }
            if which == crate::proto::ADOPT_STATE {
                // No reference: the page lives on in the mappings of the processes using it.
                // Another process maps it from now on: the DMB (and with it the page) is never
                // bound to another connection of its owner.
                // A slot only to a caller that takes one (an older one would use the page's
                // first slot, another connection's).
                return match &rec.dmb.state {
                    Some(s) if slot_ok || s.slot_off().is_none() => {
                        rec.tainted = true;
                        Ok(rec.dmb.clone())
                    }
                    _ => Err(Fail::StaleToken),
                };
            }
            if which == crate::proto::ADOPT_OWN {
                rec.refs = rec.refs.checked_add(1).ok_or(Fail::Internal)?;
                rec.tainted = true;
                self.totals.live_attachments.fetch_add(1, AcqRel);
                return Ok(rec.dmb.clone());
            }
            rec.peer_cookie.ok_or(Fail::PeerUnknown)?
        };
        let ptoken = find(peer_cookie)?;
        let mut shard = lock(self.shard(ptoken));
        let rec = shard.get_mut(&ptoken).ok_or(Fail::StaleToken)?;
        // The other end's registration of this very connection: its owner socket is the peer
        // recorded for ours, and it recorded ours as its peer. Its owner may have closed and
        // pooled it (a short connection's end gives its DMB back at once): while our end still
        // holds its attach (`refs` > 1) it is bound to nothing else, and the bytes that end
        // wrote before its close are in our own DMB, which TCP would still deliver (CPython's
        // `test_multiprocessing_fork` `test_pickling`: the accepted socket was passed on after
        // its client sent and closed; before, the receiver failed with `ECONNRESET`).
        if (rec.pooled && rec.refs < 2)
            || rec.owner.cookie != Some(peer_cookie)
            || rec.peer_cookie != Some(cookie)
            || !is_mirror(&rec.owner, who)
        {
            return Err(Fail::StaleToken);
        }
        rec.refs = rec.refs.checked_add(1).ok_or(Fail::Internal)?;
        // A third process maps it: never bound to another connection of its owner.
        rec.tainted = true;
        self.totals.live_attachments.fetch_add(1, AcqRel);
        Ok(rec.dmb.clone())
    }

    /// The live, bound DMB registered by the other end of `who`'s connection, in `who`'s
    /// network namespace.
    pub(crate) fn peer_token(&self, who: &TcpIdentity) -> Option<u64> {
        let t = (who.peer, who.local);
        let token = lock(self.owner_shard(&t)).get(&t).copied()?;
        let shard = lock(self.shard(token));
        let rec = shard.get(&token)?;
        let same_ns = matches!(
            (rec.owner.netns_cookie, who.netns_cookie),
            (Some(a), Some(b)) if a == b
        );
        (same_ns && !rec.pooled && !rec.unregistered).then_some(token)
    }

    fn forget_cookie(&self, token: u64, cookie: u64) {
        let mut m = lock(self.cookie_shard(cookie));
        if m.get(&cookie) == Some(&token) {
            m.remove(&cookie);
            shrink_sparse(&mut m);
        }
    }

    fn forget_owner(&self, token: u64, owner: &TcpIdentity) {
        let t = (owner.local, owner.peer);
        let mut m = lock(self.owner_shard(&t));
        if m.get(&t) == Some(&token) {
            m.remove(&t);
            shrink_sparse(&mut m);
        }
    }

    /// Drops one reference; frees the DMB when it was the last one. `taint`: the releaser may
    /// still write into it (another process shares the connection): never bind it again.
    pub(crate) fn release(&self, token: u64, kind: RefKind, taint: bool) {
        let mut shard = lock(self.shard(token));
        let Some(rec) = shard.get_mut(&token) else {
            debug_assert!(false, "release of a reference that is not in the table");
            return;
        };
        let owner_gone = kind == RefKind::Owner && !rec.unregistered;
        match kind {
            RefKind::Owner => {
                rec.unregistered = true;
                rec.awaiting = None;
            }
            RefKind::Attach => {
                self.totals.live_attachments.fetch_sub(1, AcqRel);
            }
        }
        rec.tainted |= taint;
        rec.refs -= 1;
        if kind == RefKind::Owner && rec.pooled {
            // Freed from its pool.
            rec.pooled = false;
            self.totals.pooled.fetch_sub(1, AcqRel);
        }
        let owner = owner_gone.then_some(rec.owner);
        if rec.refs == 0 {
            let rec = shard.remove(&token);
            shrink_sparse(&mut shard);
            drop(shard);
            if let Some(c) = rec.as_ref().and_then(|r| r.owner.cookie) {
                self.forget_cookie(token, c);
            }
            // Last reference: the memfd, then the slot, then the charge are released here.
            drop(rec);
        } else {
            drop(shard);
        }
        if let Some(o) = owner {
            // No new attach after the owner's unregister.
            self.forget_owner(token, &o);
        }
    }

    /// The end of the connection that `token`'s reference `kind` was taken for: the owner's
    /// socket, or the other end's for an attach, in namespace `netns` when the releasing client
    /// knows it (an attacher may be in another namespace than the owner). `None` for a pooled
    /// DMB (bound to no connection) or an attach of an unknown peer.
    fn end_of(&self, token: u64, kind: RefKind, netns: Option<u64>) -> Option<TcpIdentity> {
        let shard = lock(self.shard(token));
        let rec = shard.get(&token).filter(|r| !r.pooled)?;
        match kind {
            RefKind::Owner => Some(TcpIdentity {
                netns_cookie: netns.or(rec.owner.netns_cookie),
                ..rec.owner
            }),
            RefKind::Attach => Some(TcpIdentity {
                local: rec.owner.peer,
                peer: rec.owner.local,
                cookie: Some(rec.peer_cookie?),
                netns_cookie: netns.or(rec.owner.netns_cookie),
                bound_if: rec.owner.bound_if,
            }),
        }
    }

    /// A client lets go of reference `kind` of `token` while its socket may have been handed
    /// on (see [`super::handed_on`]): kept while its end of the connection is still held by a
    /// process (the DMB is never bound again then), else released. `ns`: where the client's
    /// sockets are; `uid`: the client's (its share of the bounds). Whether it was kept.
    pub(crate) fn release_or_keep(
        &self,
        token: u64,
        kind: RefKind,
        taint: bool,
        uid: u32,
        ns: &super::handed_on::ClientNs,
    ) -> bool {
        use super::handed_on::Keep;
        for (netns, handle) in ns.candidates() {
            let Some(end) = self.end_of(token, kind, netns) else {
                break;
            };
            match self.handed_on.keep(token, kind, uid, end, handle) {
                Keep::Kept => {
                    if let Some(rec) = lock(self.shard(token)).get_mut(&token) {
                        rec.tainted = true;
                    }
                    return true;
                }
                Keep::Full => {
                    self.counters.failures.kept_full.fetch_add(1, Relaxed);
                    break;
                }
                Keep::NotHeld => {}
            }
        }
        self.release(token, kind, taint);
        false
    }

    /// Releases the kept references whose socket nobody holds any more (from the sweep).
    /// How many it released (each a state change for `WAIT`ers).
    pub(crate) fn handed_on_tick(&self) -> usize {
        let due = self.handed_on.due();
        for &(token, kind) in &due {
            self.release(token, kind, true);
        }
        due.len()
    }

    /// The owner gives its DMB back into its pool (it keeps the owner reference): unbound, no
    /// attach from now on. False (nothing changed) when it may not be bound again.
    pub(crate) fn pool(&self, token: u64) -> bool {
        let mut shard = lock(self.shard(token));
        let Some(rec) = shard.get_mut(&token) else {
            return false;
        };
        if rec.unregistered || rec.pooled || rec.tainted {
            return false;
        }
        rec.pooled = true;
        rec.awaiting = None;
        self.totals.pooled.fetch_add(1, AcqRel);
        let o = rec.owner;
        drop(shard);
        self.forget_owner(token, &o);
        // The index by its socket's cookie stays until it is bound again or freed: the other
        // end of the connection it served may move to another process after this close and
        // adopt it as its send ring (`adopt`, `ADOPT_PEER`: that end still holds its attach,
        // so it is not bound again meanwhile); never as anyone's own DMB (`adopt` refuses a
        // pooled record for `ADOPT_OWN` and `ADOPT_STATE`).
        true
    }

    /// Binds a pooled DMB to a new connection of its owner: `owner` is the owner's socket,
    /// `peer_cookie` the other end's, `peer_conn` the client connection of the other end (the
    /// only one that may have mapped it before, see [`Record::attached_by`]). Only when no
    /// attach is held (its last attacher released it: it writes no more), and, when its local
    /// state is a slot, for a caller that takes slots (`epoch`: its fork epoch, see
    /// [`StateSlots::new_page`]) and on a page of that epoch. For a peer of no known client
    /// connection (`peer_conn` `u64::MAX`: it registered alone and attaches by token), only one
    /// whose memfd kept its descriptor.
    pub(crate) fn bind_pooled(
        &self,
        token: u64,
        size_code: u8,
        owner: TcpIdentity,
        peer_cookie: u64,
        peer_conn: u64,
        epoch: Option<u32>,
    ) -> Result<Arc<DmbObj>, BindMiss> {
        let mut shard = lock(self.shard(token));
        let rec = shard.get_mut(&token).ok_or(BindMiss::Gone)?;
        if !rec.pooled || rec.unregistered || rec.tainted {
            return Err(BindMiss::Gone);
        }
        match (
            rec.dmb.state.as_ref().and_then(LocalState::slot_epoch),
            epoch,
        ) {
            // Its slot is on a page that a child its owner forked since maps.
            (Some(e), Some(now)) if e != now => return Err(BindMiss::Gone),
            // A caller that takes no slots now (it forked, and its daemon connection cannot
            // have a new page): its slots' pages are a child's too.
            (Some(_), None) => return Err(BindMiss::NotNow),
            _ => {}
        }
        if rec.dmb.size_code != size_code {
            return Err(BindMiss::NotNow);
        }
        if rec.refs != 1 || rec.attached_by.is_some_and(|c| c != peer_conn) {
            return Err(BindMiss::NotNow);
        }
        if peer_conn == u64::MAX && rec.dmb.memfd.is_shelved() {
            // Its peer (a registration, not a `PAIR`: see `Conn::pair_registered`) attaches it
            // by token later, maybe as a server past its CLC accept, when the daemon may have
            // no descriptor to open a shelved file again: only a DMB that kept its descriptor
            // waits for such an attach (see `Record::awaiting`).
            return Err(BindMiss::NotNow);
        }
        rec.pooled = false;
        self.totals.pooled.fetch_sub(1, AcqRel);
        self.counters.dmbs_reused.fetch_add(1, Relaxed);
        let old_cookie = rec.owner.cookie;
        rec.owner = owner;
        rec.peer_cookie = Some(peer_cookie);
        rec.awaiting = Some(self.started.elapsed());
        let dmb = rec.dmb.clone();
        drop(shard);
        // Not adopted through the socket of the connection it served before (see `pool`).
        if let Some(c) = old_cookie {
            self.forget_cookie(token, c);
        }
        let t = (owner.local, owner.peer);
        lock(self.owner_shard(&t)).insert(t, token);
        if let Some(c) = owner.cookie {
            lock(self.cookie_shard(c)).insert(c, token);
        }
        Ok(dmb)
    }

    /// Whether an attach needs the attacher socket's cgroup.
    pub(crate) fn needs_attacher_cgroup(&self) -> bool {
        self.require_same_cgroup
    }

    /// One page of live DMBs with slot >= `start`, in slot order. Each shard is locked only
    /// while its matching records are copied. Root (`caller` 0) sees every DMB with its token;
    /// any other uid only the DMBs its own clients registered, without tokens: the tuples and
    /// cgroup paths of other tenants are theirs.
    pub(crate) fn list(&self, start: u32, max: usize, caller: Option<u32>) -> DmbList {
        let with_token = caller == Some(0);
        let mut all: Vec<DmbInfo> = Vec::new();
        for shard in self.shards.iter() {
            let shard = lock(shard);
            all.extend(
                shard
                    .values()
                    .filter(|r| r.dmb.slot() >= start)
                    .filter(|r| with_token || Some(r.dmb.owner_uid) == caller)
                    .map(|r| DmbInfo {
                        slot: r.dmb.slot(),
                        size: r.dmb.size,
                        size_code: r.dmb.size_code,
                        refs: r.refs,
                        unregistered: r.unregistered,
                        owner_local: r.owner.local.to_string(),
                        owner_peer: r.owner.peer.to_string(),
                        owner_cgroup: truncate_path(&r.dmb.owner_cgroup.path),
                        token: with_token.then_some(r.dmb.token),
                        inode: with_token.then(|| r.dmb.memfd.ino()),
                    }),
            );
        }
        all.sort_unstable_by_key(|d| d.slot);
        let next = (all.len() > max).then(|| all[max].slot);
        all.truncate(max);
        DmbList { dmbs: all, next }
    }

    /// A snapshot of every counter.
    pub(crate) fn stats(&self, generation: u64, root: bool) -> Stats {
        self.maybe_sample();
        let c = &self.counters;
        let mut cgroups: Vec<CgroupStats> = if !root {
            Vec::new()
        } else {
            lock(&self.cgroups)
                .values()
                .filter_map(Weak::upgrade)
                .map(|cg| CgroupStats {
                    path: truncate_path(&cg.path),
                    dmbs: cg.dmbs.load(Relaxed),
                    bytes: cg.bytes.load(Relaxed),
                    committed_bytes: cg.committed.load(Relaxed),
                    refused: cg.refused.load(Relaxed),
                })
                .filter(|s| s.dmbs > 0 || s.refused > 0)
                .collect()
        };
        cgroups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.path.cmp(&b.path)));
        // Bounded so that the reply always fits one SEQPACKET record.
        cgroups.truncate(MAX_CGROUPS_LISTED);
        Stats {
            protocol_version: crate::proto::VERSION,
            gid: format!("{:016x}{:016x}", self.gid.gid, self.gid.gid_ext),
            uptime_secs: self.started.elapsed().as_secs(),
            generation,
            clients_connected: c.clients_connected.load(Relaxed),
            clients_total: c.clients_total.load(Relaxed),
            clients_refused: c.clients_refused.load(Relaxed),
            clients_refused_uid: c.clients_refused_uid.load(Relaxed),
            clients_refused_fd_limit: c.clients_refused_fd_limit.load(Relaxed),
            live_dmbs: self.totals.live_dmbs.load(Relaxed),
            live_bytes: self.totals.live_bytes.load(Relaxed),
            committed_bytes: self.totals.committed.load(Relaxed),
            live_attachments: self.totals.live_attachments.load(Relaxed),
            max_dmbs: self.max_dmbs as u64,
            released_on_disconnect: c.released_on_disconnect.load(Relaxed),
            dmbs_reused: c.dmbs_reused.load(Relaxed),
            dmbs_pooled: self.totals.pooled.load(Relaxed),
            dmbs_shelved: self.totals.shelved.load(Relaxed),
            files_in_holders: super::holder::figures().0,
            holders: super::holder::figures().1,
            refs_kept: self.handed_on.len() as u64,
            ops: OpsStats {
                query_gid: c.query_gid.snapshot(),
                register: c.register.snapshot(),
                attach: c.attach.snapshot(),
                attach_peer: c.attach_peer.snapshot(),
                detach: c.detach.snapshot(),
                unregister: c.unregister.snapshot(),
                stats: c.stats.snapshot(),
                wait: c.wait.snapshot(),
                list: c.list.snapshot(),
                pair: c.pair.snapshot(),
                invalid: c.invalid.snapshot(),
            },
            failures: c.failures.snapshot(),
            cgroups,
        }
    }
}

/// At most this many cgroups are listed in [`Stats`] (the busiest first).
const MAX_CGROUPS_LISTED: usize = 64;

/// Cgroup paths longer than this are cut (with a trailing `…`) in [`Stats`].
const MAX_PATH_LISTED: usize = 512;

fn truncate_path(p: &str) -> String {
    if p.len() <= MAX_PATH_LISTED {
        return p.to_owned();
    }
    let mut end = MAX_PATH_LISTED;
    while !p.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &p[..end])
}

/// The attach proof: the attacher's socket is the other end of the owner's connection.
///
/// - (local, peer) of the attacher equal (peer, local) of the owner;
/// - it is not the owner's own socket (socket cookies differ, when known);
/// - when both ends are loopback addresses, both sockets are in the same network namespace
///   (loopback traffic never leaves a namespace, so a mirrored loopback 4-tuple in another
///   namespace is a forgery). Non-loopback connections may legitimately cross namespaces
///   (containers on one host), so no namespace rule applies to them.
pub(crate) fn is_mirror(owner: &TcpIdentity, who: &TcpIdentity) -> bool {
    if owner.local != who.peer || owner.peer != who.local {
        return false;
    }
    if let (Some(a), Some(b)) = (owner.cookie, who.cookie) {
        if a == b {
            return false;
        }
    }
    if owner.local.ip().is_loopback() && owner.peer.ip().is_loopback() {
        if let (Some(a), Some(b)) = (owner.netns_cookie, who.netns_cookie) {
            if a != b {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn slot_bitmap_exhausts_and_reuses() {
        let m = Arc::new(SlotMap::new(70));
        let mut held: Vec<SlotGuard> = (0..70).map(|_| m.alloc().unwrap()).collect();
        let set: HashSet<u32> = held.iter().map(|g| g.slot).collect();
        assert_eq!(set.len(), 70);
        assert!(set.iter().all(|&s| s < 70));
        assert!(m.alloc().is_none());
        let g = held.pop().unwrap();
        let s = g.slot;
        drop(g);
        assert_eq!(m.alloc().unwrap().slot, s);
    }

    #[test]
    fn slot_bitmap_concurrent() {
        let m = Arc::new(SlotMap::new(1000));
        let got: Vec<Vec<SlotGuard>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..125).map(|_| m.alloc().unwrap()).collect::<Vec<_>>()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let set: HashSet<u32> = got.iter().flatten().map(|g| g.slot).collect();
        assert_eq!(set.len(), 1000);
        assert!(m.alloc().is_none());
    }

    fn id(l: &str, p: &str, cookie: u64, ns: u64) -> TcpIdentity {
        TcpIdentity {
            local: l.parse().unwrap(),
            peer: p.parse().unwrap(),
            cookie: Some(cookie),
            netns_cookie: Some(ns),
            bound_if: 0,
        }
    }

    #[test]
    fn mirror_rules() {
        let owner = id("127.0.0.1:1000", "127.0.0.1:2000", 1, 9);
        assert!(is_mirror(
            &owner,
            &id("127.0.0.1:2000", "127.0.0.1:1000", 2, 9)
        ));
        // Same socket.
        assert!(!is_mirror(
            &owner,
            &id("127.0.0.1:2000", "127.0.0.1:1000", 1, 9)
        ));
        // Not mirrored.
        assert!(!is_mirror(
            &owner,
            &id("127.0.0.1:1000", "127.0.0.1:2000", 2, 9)
        ));
        assert!(!is_mirror(
            &owner,
            &id("127.0.0.1:2001", "127.0.0.1:1000", 2, 9)
        ));
        // Loopback tuple from another netns.
        assert!(!is_mirror(
            &owner,
            &id("127.0.0.1:2000", "127.0.0.1:1000", 2, 8)
        ));
        // Non-loopback may cross namespaces.
        let o2 = id("10.0.0.1:1000", "10.0.0.2:2000", 1, 9);
        assert!(is_mirror(&o2, &id("10.0.0.2:2000", "10.0.0.1:1000", 2, 8)));
    }
}
