//! The loopback-ism device, in userspace: a daemon that allocates, shares and frees DMBs
//! (memfd-backed shared memory named by a token), and the synchronous client the data path
//! (the LD_PRELOAD library) calls during the SMC-D handshake.
//!
//! # Pieces
//!
//! - **Daemon** (feature `daemon`, on by default; tokio): [`serve`] (until SIGINT/SIGTERM, what
//!   `smc-ctl daemon` calls), [`serve_until`] (until a future completes), [`run_blocking`]
//!   (builds its own runtime), [`spawn`] (own thread, returns a [`DaemonHandle`]). Configured
//!   by [`DaemonConfig`]: socket path (default `/run/smc/ctl.sock`) and mode, state directory
//!   (default `/var/lib/smc`, GID in `/var/lib/smc/gid`), slot count, quotas.
//! - **Client** ([`Client`]): std, libc, serde_json and smc-common only, no threads, no global
//!   state, every fd `O_CLOEXEC`, `MSG_NOSIGNAL` on every send. Safe after `fork()`: a child
//!   reconnects on its first call. Fails fast when the daemon is down
//!   ([`IsmError::is_unavailable`]), so the data path falls back to TCP. Requests can be
//!   pipelined ([`Client::register_dmb_start`], [`Client::attach_peer_start`], … return a
//!   [`Ticket`] finished later), so that a handshake overlaps a daemon round trip with waiting
//!   for its peer, and references can be given back without waiting
//!   ([`Client::release_nowait`]: one record, no reply).
//! - **Shared client** ([`SharedClient`], what the data path uses): one daemon connection for all
//!   threads of a process, no lock held while a thread waits for a reply.
//! - **Protocol** ([`proto`]): `SOCK_SEQPACKET`, a 16-byte versioned header (magic, version, op,
//!   length, sequence), a status in every reply, fds as `SCM_RIGHTS`.
//!
//! Modules: `client`, `shared`, [`proto`], `error` (errors and their decline reasons), `stats`
//! (the daemon's counters), `sys` (SCM_RIGHTS, memfds, socket inspection); the daemon's
//! `daemon/` holds `mod.rs` (configuration, listener, shutdown), `conn` (one client
//! connection), `registry` (the DMB table, quotas), `pair` (`OP_PAIR`), `diag` (sock_diag peer
//! lookups, quota cgroups), `grant` (the shortcut grant), `closer` (closing what clients pass),
//! `gid`, `metrics`.
//!
//! # Device semantics (as Linux's `smc_loopback.c`)
//!
//! - Identity: a random 128-bit GID (version-4 UUID, [`Gid`]) created once and persisted, so it
//!   is stable across daemon restarts; CHID
//!   [`smc_common::clc::LOOPBACK_CHID`] (0xFFFF).
//! - `register_dmb(size_code, sock)`: `16 KiB << size_code` bytes (code ≤ 10: Linux's SMC-D
//!   stops at 6, 1 MiB; the data path uses more only between two ends that both offer its
//!   large-DMB extension); a free slot from a
//!   bitmap (atomic CAS per bit, so two callers can never get the same slot), a random 64-bit token unique among live DMBs (inserted only if vacant, redrawn on
//!   a clash), a fresh memfd sized with `ftruncate` (zero-filled, committed only when touched),
//!   refcount 1. The memfd is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`, and
//!   `MFD_NOEXEC_SEAL` where supported): a peer cannot truncate it under the other side (which
//!   would SIGBUS it) or map it executable.
//! - `attach_dmb(token, sock)`: +1 reference, same memfd; only for the connection's real peer
//!   socket (see *Attach proof*). Refused once the owner has unregistered. A verified attach
//!   also marks the attacher's socket in the eBPF socket storage as allowed to switch on the
//!   `sk_msg` shortcut (`SOCK_SHORTCUT_GRANTED`, through the map `smc-ctl attach` pinned,
//!   [`DaemonConfig::bpf_sock_state_map`]): nothing else may enable it in an `ism` cgroup.
//! - A registration gets a fresh memfd. A DMB is used again only from its owner's pool
//!   (`OP_RELEASE` with `RELEASE_POOL_OWN`, then `OP_PAIR`): for a new connection of the same
//!   owner (client connection) whose other end is the one client connection that ever attached
//!   it, once that one released its attach (and never after a `RELEASE_TAINT_PEER` or a second
//!   attacher). So no ring shows an earlier connection's bytes to a process that could not map
//!   it before; the owner clears the CDC header before its peer learns the DMB is in use again.
//!   A DMB a process the socket moved to adopted (`OP_ADOPT`, below) is never bound again.
//!   Pooled DMBs stay charged to their quotas and are freed after `pool_idle_ms` unused.
//! - `pair` (`OP_PAIR`): both ends of a connection pass their sockets; the second to ask
//!   completes both (a DMB for each end, each attached by the other), so a connection costs one
//!   request per end. The proof is the mirror of `attach`: the two sockets are the two ends of
//!   one connection (mirrored 4-tuples in one namespace while the first socket, kept open while
//!   it waits, is still established; or the kernel's peer cookie between namespaces). A DMB it
//!   registers comes with a local state the daemon creates (what `register_dmb` may carry, for
//!   `adopt`), handed to the owner with the reply ([`Dmb::state`]); a pooled DMB keeps it. For
//!   a client that asks ([`SharedClient::set_state_slots`]) it is a 256-byte slot of a page the
//!   daemon hands out slot by slot, in order and never twice, to that client connection's DMBs
//!   ([`Dmb::state_slot`], [`Dmb::map_state`]); else a 4 KiB page of its own. A client that
//!   forked says so ([`SharedClient::forked`]): its next slots come from a new page, and no
//!   pooled DMB with a slot on an older page (which its child maps) is bound for it again.
//! - `attach_peer` (`OP_ATTACH_PEER`): the same attach, of the live DMB that the other end of
//!   the caller's very TCP connection registered, without the token — only when both sockets
//!   are in one network namespace, and — like every attach — only to the very peer socket
//!   recorded at registration, so nothing is granted that the token path would refuse. Once a
//!   DMB is attached, an attach (by token or by connection, or through `pair`) from another
//!   client connection is granted only to the first attacher's uid, cgroup and pid namespace,
//!   as `adopt`: another tenant given the peer socket does not map the ring its first holder
//!   writes into. The data path's server sends it
//!   right after its CLC accept (its client registered while the accept was in flight) and
//!   checks the token against the confirm.
//! - `adopt` (`OP_ADOPT`, [`Client::adopt_dmb`]): for a process an established connection's
//!   socket moved to (`SCM_RIGHTS`, `exec`): an attach of the DMB registered with that very
//!   socket (same `SO_COOKIE`), of the other end's DMB of that connection, or the owner's local
//!   state page (a sealed 4 KiB memfd it may pass with `register_dmb`, or the one `pair` created,
//!   kept with the DMB) —
//!   only to a client of the registering client's uid, cgroup and pid namespace, so another
//!   tenant that got hold of the socket gets nothing. Found for as long as the DMB lives (also
//!   after its owner's unregister, while the peer holds it, and the other end's DMB also back
//!   in its owner's pool while the moved end still attaches it); the socket may be in
//!   `CLOSE_WAIT` (its peer sent and closed: the bytes are still to be read, as over TCP).
//! - `leave_shortcut` (`OP_LEAVE_SHORTCUT`, [`proto::FEATURE_LEAVE_SHORTCUT`],
//!   [`SharedClient::leave_shortcut`]): the daemon (root) deletes the passed TCP socket from the
//!   pinned eBPF SOCKHASH (next to `SMC_SOCK_STATE`), keyed by its network namespace cookie
//!   and 4-tuple: the data path
//!   switches that SMC-D connection to TCP mid-stream (smc-preload DESIGN.md *Switch to TCP*),
//!   and a SOCKHASH member reads through `tcp_bpf`, which is not quite TCP (an established SMC-D
//!   socket gets no more `sock_ops` callbacks that would take it out). Only the caller's own
//!   socket; a redirect to it then falls back to TCP. The entry is deleted only when
//!   `SMC_PEERS` records the caller's very socket (`SO_COOKIE`) for that key (with no record,
//!   only a socket with socket storage, i.e. of an attached cgroup); a tuple rebuilt in a
//!   namespace of one's own names that namespace's entry, nobody else's.
//! - `sweep` (`OP_SWEEP`, [`proto::FEATURE_SWEEP`], [`SharedClient::sweep`]): before an exec
//!   into an image without the data path, the caller passes a listener whose SMC announcement
//!   it withdrew; the daemon (root) writes its key (namespace cookie, port) into the pinned
//!   `SMC_SWEEP` map and reads the pinned `iter/tcp` link in the listener's network namespace
//!   (a thread of its own enters it, `SIOCGSKNS`): the connections queued at that port whose
//!   clients announced SMC and that no data path claimed go into the eBPF quarantine, which
//!   strips their clients' CLC messages (`daemon/sweep.rs`). Authority is holding the
//!   listener (a listening TCP socket, else refused); the programs touch only that port's
//!   unclaimed sockets, and only while its listener is withdrawn, so a sweep anyone asks for
//!   changes nothing but what an image without the data path would read; and of those only
//!   connections whose own listener withdrew too (a wildcard, e.g. an `IPV6_V6ONLY` `[::]`
//!   anyone binds next to another's IPv4 listener of the port, covers no other listener's
//!   connections). One sweep at a time, on a blocking thread (never a worker), at most one
//!   queued per uid.
//!   A client whose Accept did not come passes its connected socket instead
//!   ([`proto::FEATURE_SWEEP_PEER`], [`SharedClient::sweep_peer`]) before it half-closes: the
//!   daemon looks its server end up in the pinned same-host maps (mirrored 4-tuple, its socket
//!   cookie) and sweeps for that one socket, which goes into the quarantine only when it is a
//!   passive socket whose client announced SMC and that no data path claimed (its FIN would
//!   make it `CLOSE_WAIT`, which a sockmap refuses, and an image without the data path that
//!   takes the listener over later would read the Proposal). Authority is holding the client
//!   socket: the only socket it can touch is its own connection's server end, whose data path
//!   (if one claims it later) then continues on TCP with the client.
//! - Recorded proof (`REGISTER_RECORD_PROOF`, [`proto::FEATURE_RECORDED_PROOF`]): a server's
//!   registration records what its socket proved (identity, cgroup key; not the socket); its
//!   attach of the client's DMB, which comes after the client's CLC confirm when it can no
//!   longer decline, passes its socket and names its own token: when the kernel dropped that
//!   socket (the daemon out of descriptors), the record of that registration of the same
//!   daemon connection stands in for it. The record goes at that attach's success or with the
//!   owner reference.
//! - `detach_dmb` / `unregister_dmb`: −1 reference. At 0 the token leaves the table and the
//!   daemon's memfd is closed, then the slot bit and the quota are released (in that order, by
//!   RAII), so a slot or token is reused only after the release. The memory itself lives on while
//!   any process still maps it.
//! - Shelves (`daemon/shelf.rs`): the daemon keeps a DMB's memfd and its state page as a
//!   `PROT_NONE` mapping of its own instead of a descriptor once the DMB has lived
//!   [`DaemonConfig::shelve_after_ms`] (at once when descriptors run short), and opens them
//!   again through `/proc/self/map_files` (its inode checked) when a client needs them: an
//!   established connection costs the daemon no descriptor, so its `RLIMIT_NOFILE` bounds only
//!   the connections being set up.
//!   Beyond what its own `vm.max_map_count` allows, the background sweep moves files into
//!   *holder processes* (`daemon/holder.rs`, [`DaemonConfig::max_holders`]): children of the
//!   daemon (`smc-ism-holder`, forked by a zygote it starts with it, same uid, no descriptor
//!   but their socket to the daemon) that map what they are passed and unmap what they are
//!   told; the daemon opens such a file through `/proc/<holder>/map_files` (the holder checked
//!   to be alive after the open, so its pid was not reused; the inode checked). No client can
//!   reach a holder or put a mapping into it. Holders die with the daemon (end of file on their
//!   socket, `PR_SET_PDEATHSIG` for their zygote) and at its shutdown; one that dies otherwise
//!   only makes the reopen of its files fail (`MEM`), mapped connections are unaffected.
//!   Request paths never wait for a holder (reopen: an `open` in `/proc`; release: an unmap
//!   message sent without waiting).
//! - A client only ever releases references *it* holds: the daemon tracks, per connection, the
//!   owner and attach references it granted; releasing anything else is `NotHeld`. When the
//!   connection closes — the process exited, crashed, was SIGKILLed or exec'd — the daemon
//!   releases all of them, except those whose end of the connection another process still
//!   holds (a forked child, an exec'd image, a receiver of the socket: `sock_diag` finds the
//!   very socket, same cookie, with an inode): those are kept, the DMB never reused, until
//!   that socket is closed everywhere, so that its holder can adopt them (`daemon/handed_on.rs`;
//!   also for an `OP_RELEASE` with `RELEASE_TAINT_PEER`). The socket is looked up in the
//!   namespace of the sockets that client passed (a container's through a sock_diag socket
//!   kept there while a client connection or a kept reference needs it; up to 8 namespaces
//!   per client connection, each looked up).
//! - Failures are immediate, never a wait: no free slot or the cgroup's DMB count quota →
//!   [`IsmError::MaxDmb`]/[`IsmError::QuotaDmbs`] (decline MAX_DMB); byte quotas, the device byte
//!   limit, MemAvailable below a floor, memfd/ftruncate errors → [`IsmError::QuotaBytes`] /
//!   [`IsmError::Mem`] (decline MEM). See [`IsmError::decline_reason`].
//! - Waiters: the only sleeping in the daemon is a `WAIT` request (used by the tests to wait
//!   for a state change instead of polling), woken by a generation counter that every state change
//!   bumps. The waiter creates its wakeup future *before* it checks the generation, so no wakeup
//!   is lost: every path that changes state bumps, and a bump between check and sleep wakes it.
//! - A restart of the daemon keeps the GID (file) and does not touch live connections: their
//!   memory is mapped in both processes and does not depend on the daemon. While the daemon is
//!   down, [`Client::connect`] fails at once and new connections use TCP; afterwards clients
//!   reconnect on their next call.
//!
//! # Concurrency
//!
//! No lock is held across I/O or an `.await`. Slots: a bitmap of atomic words. Tokens and
//! refcounts: 64 shards of `Mutex<HashMap>`, each held for a lookup-and-update only. Quotas and
//! gauges: atomics, reserve-then-check. Each client connection is a tokio task processing its
//! requests in order; different clients run in parallel.
//!
//! # Attach proof and threat model
//!
//! The token travels inside the CLC accept/confirm over the TCP connection, but it is only 64
//! bits that any local process could guess, sniff (e.g. with a packet capture of `lo`) or obtain
//! from a compromised peer. **The token alone is never enough to attach.**
//!
//! Proof design:
//! 1. At `register_dmb` the owner passes its connected TCP socket over `SCM_RIGHTS`. The daemon
//!    checks, with socket options only (`SO_TYPE` fails for a non-socket without asking its
//!    filesystem; an `fstat` of a FUSE file waits for its server), that it is an
//!    AF_INET/AF_INET6 `SOCK_STREAM` TCP socket in ESTABLISHED state (`TCP_INFO`), records its
//!    `getsockname`/`getpeername` (IPv4-mapped IPv6 normalised to IPv4), `SO_COOKIE` and
//!    `SO_NETNS_COOKIE`, and **looks up the peer socket**: the socket with the mirrored 4-tuple
//!    in the owner's network namespace (`NETLINK_SOCK_DIAG` exact lookup, in that namespace via
//!    `SIOCGSKNS`; a full socket of the connection, not a listener or TIME_WAIT), or, for a
//!    non-loopback connection whose peer is in another namespace, the cookie the eBPF programs
//!    recorded for it (`SMC_PEERS`, [`DaemonConfig::bpf_peers_map`]: the mirrored key in the
//!    namespace the kernel paired the owner's socket with by 4-tuple and both first sequence
//!    numbers, which its own entry names, never one that merely holds the tuple). That peer cookie is
//!    recorded with the DMB. The daemon then hands the socket to a closer thread — it never
//!    keeps a TCP socket open (that would delay the FIN).
//! 2. At `attach_dmb` (and `ATTACH_PEER`) the attacher passes *its* socket. The daemon checks it
//!    is an established TCP socket whose (local, peer) is exactly the owner's (peer, local) and
//!    whose `SO_COOKIE` is the recorded peer cookie. Socket cookies are unique for the kernel's
//!    lifetime, so a 4-tuple rebuilt after the owner's connection left the connection table
//!    (peer RST, SIGKILL, FIN acknowledged, while the owner's fd is still open) is refused, with
//!    or without the token. When no peer was found at registration, nobody can attach
//!    (`BadProof`, counted as `peer_unknown`; the data path falls back to TCP).
//!
//! So only the process holding the other end of that very TCP connection can attach: holding a
//! file descriptor of a connected socket is a capability the kernel does not hand out to
//! strangers.
//!
//! Closing what clients pass: the last `close` of a file can block for as long as another
//! process wants (a FUSE flush, a TCP socket with `SO_LINGER` and unsent data — the option can be
//! set from another copy after any check —, a tty draining). So every fd a client passes, and
//! every client connection at its end (its queue may hold passed fds), is closed on closer
//! threads (at most 64, at most 4 per uid, so one uid's stuck closes delay only its own), never
//! on the async workers; a uid with 256 closes outstanding is not read from until they finish
//! (asked after the wait for its next record, not before: each waiting connection would take
//! one more record), nor, while the daemon has fewer than 64 descriptors left, a connection
//! with any of its own outstanding; a request with more than two fds ends its connection. A
//! connection refused at accept is closed at once when no record queued on it holds an fd
//! (shut down, then read with `SO_PASSCRED`), else on a closer thread.
//! The fds of one request go to the closer after its reply is sent (one closer wakeup per uid
//! among them): a handshake waiting for that reply does not wait for the wakeups too.
//! The receive buffer holds `SCM_MAX_FD` fds, so the kernel never drops (and closes) passed
//! fds in the daemon's thread. `SO_LINGER {1, 0}` set by the daemon would avoid the wait but
//! would also make the owner's own close reset a legitimate connection. The owner needs no proof beyond its own socket; it only ever receives its own
//! memfd.
//!
//! Other rules: clients can release only references they hold (no remote unregister by token);
//! quotas per cgroup cap what one tenant can pin: they are charged to the cgroup the owner's
//! socket was created in (its id, from sock_diag, fixed by the kernel: neither forged by the
//! caller nor changed by moving or exiting), or rather to the nearest ancestor that
//! `smc-ctl attach` enabled ([`DaemonConfig::bpf_links_dir`]), so a sub-cgroup shares its
//! tenant's quota; every uid but root is limited to [`DaemonConfig::uid_max_clients`]
//! connections and [`DaemonConfig::uid_max_dmbs`] live DMBs (`SO_PEERCRED` at connect), and
//! root is never refused a connection; tokens are never logged, never appear in [`Stats`] nor
//! in `Dmb`'s `Debug` output; [`Client::list_dmbs`] shows a caller whose `SO_PEERCRED` uid is 0
//! everything with tokens, any other uid only the DMBs it registered, without tokens, and
//! [`Stats::cgroups`] is empty for it (other tenants' tuples and cgroup paths are theirs); the
//! socket's mode (default 0666, so that every process can use SMC-D) and group are
//! configurable.
//!
//! *"A token of another cgroup is refused"* is interpreted as: an attach by a caller that does
//! not pass the mirror check is refused, whatever its cgroup. Cgroup membership alone neither
//! grants nor denies an attach, because SMC-D between containers on one host (different
//! cgroups) is the point of loopback-ism. [`DaemonConfig::require_same_cgroup`] additionally
//! refuses attaches across cgroups for sites that want it.
//!
//! Residual risks:
//! - A non-loopback connection whose peer is in another network namespace is bound to the
//!   cookie in the eBPF map, which is keyed by 4-tuple alone: a process that can create a
//!   network namespace, is in an attached cgroup and establishes a socket with the victim's
//!   peer 4-tuple before the victim registers could have its own cookie recorded (it also
//!   needs the token). Sites that do not need cross-namespace SMC-D can set
//!   `require_same_cgroup`, or restrict the socket's mode.
//! - When the quota key cannot be found (sock_diag without cgroup ids), the caller's cgroup as
//!   read from `/proc/PID/cgroup` when it connected is used.
//! - Per-uid limits do not bound a process that controls many uids (a user namespace with a
//!   mapped uid range): together they can fill `max_clients` (root still connects) and occupy
//!   every closer thread.
//! - Connections through NAT (DNAT/SNAT, port publishing) do not look mirrored: they fall back
//!   to TCP (safe, not faster).
//! - IPv6 scope ids (link-local addresses) are not compared, only addresses and ports.
//! - A peer that is attached can write anything into the DMB: the data path must treat every
//!   cursor and byte read from shared memory as untrusted input.
//! - Processes running as root can do anything regardless (read `/proc/PID/mem`, etc.).
//! - A holder process (see *Shelves*) that dies by another hand (the OOM killer, an
//!   administrator's `kill`) takes the daemon's only way to the files it kept: adopting those
//!   connections (`OP_ADOPT`) or binding their pooled DMBs again declines `MEM`; their data
//!   path is unaffected.
//! - A local state slot's page holds the slots of up to 15 other connection ends of the same
//!   client connection (process): an adopter of one of them (which must be of that client's
//!   uid, cgroup and pid namespace) maps the page, and with it their cursors, locks, flags and
//!   counters — never their bytes (a DMB is one memfd, and two connections never share one).

#![warn(missing_docs)]

pub mod proto;

mod client;
mod error;
mod shared;
mod stats;
mod sys;

#[cfg(feature = "daemon")]
mod daemon;

pub use client::{
    default_socket_path, Client, Dmb, DmbMap, Gid, Ticket, DEFAULT_SOCKET_PATH, DEFAULT_TIMEOUT,
    SOCKET_ENV,
};
pub use error::{DeclineReason, IsmError};
pub use shared::SharedClient;
pub use stats::{CgroupStats, DmbInfo, DmbList, FailureStats, OpStats, OpsStats, Stats};

#[cfg(feature = "daemon")]
pub use daemon::{
    escape_label_value, run_blocking, serve, serve_until, spawn, ClientHook, DaemonConfig,
    DaemonHandle, MetricsHook, DEFAULT_STATE_DIR,
};
