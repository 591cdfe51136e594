//! Every environment knob of the library, read once at load ([`load`], from the library's
//! constructor, while the environment is the one the program was started with: servers such
//! as nginx clear it for their workers) into one [`Config`]. A value that does not parse takes
//! its default.

use crate::forklock::ForkOnce;

/// The library's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// `SMC_DISABLE=1`: no connection of this process becomes SMC.
    pub disable: bool,
    /// `SMC_DEBUG` (set, not `0`): one line per decision on stderr.
    pub debug: bool,
    /// `SMC_CLC_TIMEOUT_MS` (2000): how long a handshake waits for the peer's next message.
    pub clc_timeout_ms: u64,
    /// `SMC_ACCEPT_WAIT_MS` (100): how long a client waits for its server's Accept (at most
    /// the CLC timeout). The server answers only once its program accepted the connection,
    /// while TCP's connect completes and its writes queue before that: a client of a server
    /// that accepts later declines and goes on over TCP.
    pub accept_wait_ms: u64,
    /// `SMC_CONNECT_WAIT_MS` (200): how long `connect` waits for a non-blocking connect to
    /// complete before leaving the decision to the first operation.
    pub connect_wait_ms: u64,
    /// `SMC_DMB_SIZE`: the DMB size asked for (else what TCP on this host holds).
    pub dmb_size: Option<u64>,
    /// `SMC_PIPELINE` (not `0`): daemon requests sent ahead of need.
    pub pipeline: bool,
    /// `SMC_PAIR` (not `0`): daemon `PAIR` requests when the daemon offers them.
    pub pair: bool,
    /// `SMC_STATE_SLOTS` (not `0`): a connection end's local state is a 256-byte slot of a
    /// page the daemon shares among this process's connection ends, when it offers that
    /// (else a 4 KiB page each).
    pub state_slots: bool,
    /// `SMC_ACCEPT_ASYNC` (not `0`): an accepted socket's handshake may continue after `accept`.
    pub accept_async: bool,
    /// `SMC_NO_SHORTCUT=1`: no sk_msg doorbell shortcut.
    pub no_shortcut: bool,
    /// `SMC_SHORT_BYTES` (1 MiB): the short-connection policy's threshold in bytes (0: off).
    pub short_bytes: u64,
    /// `SMC_SHORT_TURNS` (8): its threshold in turns (changes of direction).
    pub short_turns: u64,
    /// `SMC_SHORT_PROBE` (256): every how many skipped connections one probes SMC again.
    pub short_probe: u64,
    /// `SMC_PRELOAD_ASSUME_PEER=1` (tests): take every peer for one that announced SMC.
    pub assume_peer: bool,
    /// `SMC_TEST_EPOLL_CTL_PAUSE_MS` (tests, 0): a pause inside `epoll_ctl(ADD)` of a socket
    /// not yet on SMC, between its registration and its membership, that widens the window in
    /// which another thread decides its handshake (the conformance suite's
    /// `epoll_exclusive_decided_during_ctl`).
    pub test_epoll_ctl_pause_ms: u64,
    /// `SMC_SPIN_US` (100): the spin budget before a wait sleeps.
    pub spin_us: u64,
    /// `SMC_SPIN_YIELD` (64): spins between yields.
    pub spin_yield: u32,
    /// `SMC_SPIN_ROOM_US` (0): the spin budget of a writer waiting for room.
    pub spin_room_us: u64,
    /// `SMC_SPIN_GIVE_WAY` (not `0`): a spin whose yield let another task run ends there, and
    /// the thread spins less until a spin succeeds without that (`conn::spin_pause`).
    pub spin_give_way: bool,
    /// `SMC_PROCS_DIR` (`/run/smc/procs`): the statistics directory.
    pub procs_dir: String,
    /// `SMC_STATS_KEEP=1`: leave the statistics file at exit.
    pub stats_keep: bool,
    /// The daemon's socket (`SMC_CTL_SOCK`, see `smc_ism::default_socket_path`).
    pub daemon_path: std::path::PathBuf,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn num<T: std::str::FromStr>(name: &str, default: T) -> T {
    var(name).and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn is_1(name: &str) -> bool {
    var(name).is_some_and(|v| v == "1")
}

fn not_0(name: &str) -> bool {
    var(name).is_none_or(|v| v != "0")
}

impl Config {
    /// From the environment.
    pub fn from_env() -> Config {
        Config {
            disable: is_1("SMC_DISABLE"),
            debug: var("SMC_DEBUG").is_some_and(|v| !v.is_empty() && v != "0"),
            clc_timeout_ms: num("SMC_CLC_TIMEOUT_MS", 2000),
            accept_wait_ms: num("SMC_ACCEPT_WAIT_MS", 100),
            connect_wait_ms: num("SMC_CONNECT_WAIT_MS", 200),
            dmb_size: var("SMC_DMB_SIZE").and_then(|v| v.parse().ok()),
            pipeline: not_0("SMC_PIPELINE"),
            pair: not_0("SMC_PAIR"),
            state_slots: not_0("SMC_STATE_SLOTS"),
            accept_async: not_0("SMC_ACCEPT_ASYNC"),
            no_shortcut: is_1("SMC_NO_SHORTCUT"),
            short_bytes: num("SMC_SHORT_BYTES", 1 << 20),
            short_turns: num("SMC_SHORT_TURNS", 8),
            short_probe: num("SMC_SHORT_PROBE", 256),
            assume_peer: is_1("SMC_PRELOAD_ASSUME_PEER"),
            test_epoll_ctl_pause_ms: num("SMC_TEST_EPOLL_CTL_PAUSE_MS", 0),
            spin_us: num("SMC_SPIN_US", 100),
            spin_yield: num("SMC_SPIN_YIELD", 64),
            spin_room_us: num("SMC_SPIN_ROOM_US", 0),
            spin_give_way: not_0("SMC_SPIN_GIVE_WAY"),
            procs_dir: var("SMC_PROCS_DIR").unwrap_or_else(|| "/run/smc/procs".to_string()),
            stats_keep: is_1("SMC_STATS_KEEP"),
            daemon_path: smc_ism::default_socket_path(),
        }
    }
}

static CONFIG: ForkOnce<Config> = ForkOnce::new();

/// Unit tests start their own daemon after other tests may have read the configuration.
#[cfg(test)]
pub(crate) static TEST_DAEMON: ForkOnce<std::path::PathBuf> = ForkOnce::new();

/// The daemon's socket.
pub fn daemon_path() -> &'static std::path::Path {
    #[cfg(test)]
    if let Some(p) = TEST_DAEMON.get() {
        return p;
    }
    &config().daemon_path
}

/// The configuration (read from the environment at the first call: [`load`] makes that the
/// library's load).
pub fn config() -> &'static Config {
    CONFIG.get_or_init(Config::from_env)
}

/// Reads the configuration now (the library's constructor).
pub fn load() {
    let _ = config();
}
