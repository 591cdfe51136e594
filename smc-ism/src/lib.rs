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
//! - **Client** ([`Client`]): std + libc only, no threads, no global state, every fd
//!   `O_CLOEXEC`, `MSG_NOSIGNAL` on every send. Safe after `fork()`: a child reconnects on its
//!   first call. Fails fast when the daemon is down ([`IsmError::is_unavailable`]), so the data
//!   path falls back to TCP. Requests can be pipelined ([`Client::register_dmb_start`],
//!   [`Client::attach_peer_start`], … return a [`Ticket`] finished later), so that a handshake
//!   overlaps a daemon round trip with waiting for its peer, and references can be given back
//!   without waiting ([`Client::release_nowait`]: one record, no reply).
//! - **Protocol** ([`proto`]): `SOCK_SEQPACKET`, a 16-byte versioned header (magic, version, op,
//!   length, sequence), a status in every reply, fds as `SCM_RIGHTS`.
//!
//! # Device semantics (as Linux's `smc_loopback.c`)
//!
//! - Identity: a random 128-bit GID (version-4 UUID, [`Gid`]) created once and persisted, so it
//!   is stable across daemon restarts; CHID [`CHID_LOOPBACK`] (0xFFFF).
//! - `register_dmb(size_code, sock)`: `16 KiB << size_code` bytes (code ≤ 6); a free slot from a
//!   bitmap (atomic CAS per bit, so two callers can never get the same slot — the race of
//!   seed 004), a random 64-bit token unique among live DMBs (inserted only if vacant, redrawn on
//!   a clash), a fresh memfd sized with `ftruncate` (zero-filled, committed only when touched),
//!   refcount 1. The memfd is sealed (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`, and
//!   `MFD_NOEXEC_SEAL` where supported): a peer cannot truncate it under the other side (which
//!   would SIGBUS it) or map it executable.
//! - `attach_dmb(token, sock)`: +1 reference, same memfd; only for the connection's real peer
//!   (see *Attach proof*). Refused once the owner has unregistered.
//! - `attach_peer` (`OP_ATTACH_PEER`): the same attach, of the live DMB that the other end of
//!   the caller's very TCP connection registered, without the token — only when both sockets
//!   are in one network namespace (where a mirrored 4-tuple is necessarily the real peer), so
//!   nothing is granted that the token path would refuse. The data path's server sends it
//!   right after its CLC accept (its client registered while the accept was in flight) and
//!   checks the token against the confirm.
//! - `detach_dmb` / `unregister_dmb`: −1 reference. At 0 the token leaves the table and the
//!   daemon's memfd is closed, then the slot bit and the quota are released (in that order, by
//!   RAII), so a slot or token is reused only after the release. The memory itself lives on while
//!   any process still maps it.
//! - A client only ever releases references *it* holds: the daemon tracks, per connection, the
//!   owner and attach references it granted; releasing anything else is `NotHeld`. When the
//!   connection closes — the process exited, crashed or was SIGKILLed — the daemon releases all
//!   of them.
//! - Failures are immediate, never a wait: no free slot or the cgroup's DMB count quota →
//!   [`IsmError::MaxDmb`]/[`IsmError::QuotaDmbs`] (decline MAX_DMB); byte quotas, the device byte
//!   limit, MemAvailable below a floor, memfd/ftruncate errors → [`IsmError::QuotaBytes`] /
//!   [`IsmError::Mem`] (decline MEM). See [`IsmError::decline_reason`].
//! - Waiters: the only sleeping in the daemon is a `WAIT` request (used by tests and
//!   `smc-ctl stats --wait`-style tools), woken by a generation counter that every state change
//!   bumps. The waiter creates its wakeup future *before* it checks the generation (the bug of
//!   seed 000 was a wakeup skipped on one path; here every path that changes state bumps, and a
//!   bump between check and sleep cannot be lost).
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
//!    checks it is an AF_INET/AF_INET6 TCP socket in ESTABLISHED state (`TCP_INFO`), records its
//!    `getsockname`/`getpeername` (IPv4-mapped IPv6 normalised to IPv4), `SO_COOKIE` and
//!    `SO_NETNS_COOKIE` (Linux ≥ 5.14; skipped where unsupported), and **closes its copy
//!    immediately** — the daemon never keeps a TCP socket open (that would delay the FIN). A
//!    socket with `SO_LINGER` set is closed on a blocking thread, since its close may block.
//! 2. At `attach_dmb` the attacher passes *its* socket. The daemon checks it is an established
//!    TCP socket whose (local, peer) is exactly the owner's (peer, local), that it is not the
//!    owner's own socket (cookies differ), and — when both addresses are loopback addresses —
//!    that it lives in the owner's network namespace (loopback traffic never leaves a namespace,
//!    so a mirrored loopback 4-tuple elsewhere is a forgery). It closes the socket, then grants.
//!
//! So only a process holding the other end of that very TCP connection can attach: holding a
//! file descriptor of a connected socket is a capability the kernel does not hand out to
//! strangers. The owner needs no proof beyond its own socket; it only ever receives its own
//! memfd.
//!
//! Other rules: clients can release only references they hold (no remote unregister by token);
//! quotas per cgroup cap what one tenant can pin; tokens are never logged, never appear in
//! [`Stats`] nor in `Dmb`'s `Debug` output, and [`Client::list_dmbs`] includes them only for a
//! caller whose `SO_PEERCRED` uid is 0; the socket's mode (default 0666, so that every process can use SMC-D) and group
//! are configurable.
//!
//! *"A token of another cgroup is refused"* is interpreted as: an attach by a caller that does
//! not pass the mirror check is refused, whatever its cgroup. Cgroup membership alone neither
//! grants nor denies an attach, because SMC-D between containers on one host (different
//! cgroups) is the point of loopback-ism. [`DaemonConfig::require_same_cgroup`] additionally
//! refuses attaches across cgroups for sites that want it.
//!
//! Residual risks:
//! - A process that can create a network namespace (e.g. an unprivileged user namespace) can
//!   build a connection whose 4-tuple mirrors a victim's *non-loopback* connection (loopback
//!   tuples are caught by the namespace rule) — it also needs the victim's token, and the
//!   attach must happen while the DMB is live. Sites that do not need cross-namespace SMC-D can
//!   set `require_same_cgroup`, or restrict the socket's mode.
//! - After the owner's connection closes, a process that binds the freed port could rebuild the
//!   same 4-tuple before the owner unregisters (TIME_WAIT usually prevents this); it also needs
//!   the token.
//! - The caller's cgroup is read from `/proc/PID/cgroup` with the `SO_PEERCRED` pid when it
//!   connects; a process that changes cgroup later keeps its old quota bucket.
//! - Connections through NAT (DNAT/SNAT, port publishing) do not look mirrored: they fall back
//!   to TCP (safe, not faster).
//! - IPv6 scope ids (link-local addresses) are not compared, only addresses and ports.
//! - A peer that is attached can write anything into the DMB: the data path must treat every
//!   cursor and byte read from shared memory as untrusted input.
//! - Processes running as root can do anything regardless (read `/proc/PID/mem`, etc.).

#![warn(missing_docs)]

pub mod proto;

mod client;
mod error;
mod stats;
mod sys;

#[cfg(feature = "daemon")]
mod daemon;

pub use client::{
    default_socket_path, dmb_size, size_code_for, Client, Dmb, DmbMap, Gid, Ticket, CHID_LOOPBACK,
    DEFAULT_SOCKET_PATH, DEFAULT_TIMEOUT, DMB_MIN_SIZE, MAX_SIZE_CODE, SOCKET_ENV,
};
pub use error::{DeclineReason, IsmError, DECL_INTERR, DECL_MAX_DMB, DECL_MEM, DECL_NOSMCDDEV};
pub use stats::{CgroupStats, DmbInfo, DmbList, FailureStats, OpStats, OpsStats, Stats};

#[cfg(feature = "daemon")]
pub use daemon::{
    run_blocking, serve, serve_until, spawn, DaemonConfig, DaemonHandle, MetricsHook,
    DEFAULT_STATE_DIR,
};
