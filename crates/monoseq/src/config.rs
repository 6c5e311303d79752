//! Server settings: defaults that just work, overridden by a TOML file, then by environment
//! variables (`MONOSEQ_*`), then by flags. Opening the storage they name, and settling the
//! partition count on what the store records: `storage.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use monoseq_core::WsKind;
use monoseq_store::TrustLevel;
use serde::Deserialize;

/// Default data directory.
pub const DATA_DIR_DEFAULT: &str = "./data";
/// Default listen address: loopback only.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8080";
/// Default partition count.
pub const PARTITIONS_DEFAULT: u32 = 8;
/// Default trust level of the built-in sequences.
pub const TRUST_LEVEL_DEFAULT: u8 = 0;
/// The workspace kind declared when none is given.
pub const WS_KIND_DEFAULT: u16 = 1;
/// Default bound on a graceful shutdown.
pub const SHUTDOWN_TIMEOUT_DEFAULT_SECS: u64 = 10;
/// Largest accepted request body.
pub const BODY_BYTES_MAX_DEFAULT: usize = 1024 * 1024;
/// Default of `--named-cache`: one number per durable write, no cache.
pub const NAMED_CACHE_DEFAULT: u64 = 1;
/// Bytes in a MiB.
const MIB: u64 = 1024 * 1024;
/// Default `--record-cache-mib`.
pub const RECORD_CACHE_MIB_DEFAULT: u64 = monoseq_cp::RECENT_RECORDS_BYTES_DEFAULT as u64 / MIB;
/// Largest `--record-cache-mib` (1 TiB).
pub const RECORD_CACHE_MIB_MAX: u64 = 1024 * 1024;
/// Default of `--backlog-values-max` on PostgreSQL: room for the numbers of a whole
/// [`monoseq_cp::FLUSH_DELAY_DEFAULT`] at full speed, so the flusher is not hurried earlier (a
/// flush there is a transaction rewriting one row per workspace it touched; PostgreSQL CPU per
/// command 30–31 → 22.6–24.4 µs, docs/benchmarks/pg-stats.md, "PostgreSQL cost per command").
pub const BACKLOG_VALUES_MAX_DEFAULT_POSTGRES: usize = 65_536;

/// Which storage a command opens; every command that opens the store flattens it. Each flag
/// also reads `MONOSEQ_<NAME>` from the environment.
#[derive(Debug, Clone, Default, Args)]
pub struct StorageArgs {
    /// TOML file with settings (flags and environment override it).
    #[arg(long, env = "MONOSEQ_CONFIG")]
    pub config: Option<PathBuf>,
    /// Storage: `embedded` (the embedded engine in --data-dir) or a PostgreSQL connection
    /// string, `postgres://user:password@host:port/database` [default: embedded].
    #[arg(long, env = "MONOSEQ_STORAGE")]
    pub storage: Option<String>,
    #[arg(long, env = "MONOSEQ_DATA_DIR",
          help = format!("Data directory of the embedded store [default: {DATA_DIR_DEFAULT}]"))]
    pub data_dir: Option<PathBuf>,
}

/// What the store holds: its partition count, trust level and workspace kinds (serve, bench,
/// inspect, verify).
#[derive(Debug, Clone, Default, Args)]
pub struct StoreArgs {
    #[arg(long, env = "MONOSEQ_PARTITIONS", help = format!(
        "Partitions; fixed once data exists [default: the count the store holds, or \
         {PARTITIONS_DEFAULT} for a new one]"))]
    pub partitions: Option<u32>,
    #[arg(long, env = "MONOSEQ_TRUST_LEVEL",
          help = format!("Sequences trust level 0, 1 or 2 [default: {TRUST_LEVEL_DEFAULT}]"))]
    pub trust_level: Option<u8>,
    #[arg(long, env = "MONOSEQ_WS_KINDS", value_delimiter = ',',
          help = format!("Workspace kinds, comma separated [default: {WS_KIND_DEFAULT}]"))]
    pub ws_kinds: Option<Vec<u16>>,
}

/// How the command processor runs the store (serve, and bench in-process).
#[derive(Debug, Clone, Default, Args)]
pub struct ProcessorArgs {
    #[arg(long, env = "MONOSEQ_GROUP_COMMANDS_MAX", help = format!(
        "Most commands per group commit [default: {}]", monoseq_cp::GROUP_COMMANDS_MAX_DEFAULT))]
    pub group_commands_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_BACKLOG_VALUES_MAX", help = format!(
        "Most unflushed sequence values per partition [default: {}; {} on PostgreSQL]",
        monoseq_cp::BACKLOG_VALUES_MAX_DEFAULT, BACKLOG_VALUES_MAX_DEFAULT_POSTGRES))]
    pub backlog_values_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_CACHE_WORKSPACES_MAX", help = format!(
        "Workspaces cached per partition [default: {}]",
        monoseq_core::CACHE_WORKSPACES_MAX_DEFAULT))]
    pub cache_workspaces_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_FLUSH_DELAY_MS", help = format!(
        "Longest wait of a partition's flusher to gather sequence numbers, milliseconds \
         [default: {}]", monoseq_cp::FLUSH_DELAY_DEFAULT.as_millis()))]
    pub flush_delay_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_SHUTDOWN_TIMEOUT_SECS", help = format!(
        "Bound on a graceful shutdown, seconds [default: {SHUTDOWN_TIMEOUT_DEFAULT_SECS}]"))]
    pub shutdown_timeout_secs: Option<u64>,
    #[arg(long, env = "MONOSEQ_IDEMPOTENCY_WINDOW_EVENTS", help = format!(
        "A retry with the same `Idempotency-Key` is recognised while its original is among \
         the partition's last this many events [default: {}]",
        monoseq_cp::IDEMPOTENCY_WINDOW_EVENTS_DEFAULT))]
    pub idempotency_window_events: Option<u64>,
    #[arg(long, env = "MONOSEQ_PARTITION_THREADS_MAX", help = format!(
        "Partitions that run on a thread of their own where they share no writer thread \
         (PostgreSQL, or --writer-threads 0); those past it run as tasks on the runtime (0: \
         all) [default: {}]", monoseq_cp::PARTITION_THREADS_MAX_DEFAULT))]
    pub partition_threads_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_WRITER_THREADS", help = format!(
        "Writer threads the partitions share on the embedded storage, where the groups of \
         one thread's partitions wait for one durable raise of their marks together; at most \
         one per partition (0: each partition runs on a thread of its own) [default: {}, \
         half this machine's cores]", monoseq_cp::writer_threads_default()))]
    pub writer_threads: Option<usize>,
    #[arg(long, env = "MONOSEQ_RECORD_CACHE_MIB", value_name = "MIB", help = format!(
        "Memory for the records the partitions' writers wrote lately, so that an update of \
         one reads nothing from the store; shared by the partitions, MiB (0: none) \
         [default: {RECORD_CACHE_MIB_DEFAULT}]"))]
    pub record_cache_mib: Option<u64>,
    /// Benchmarks only: the longest a marks cycle waits for the groups of other partitions
    /// already under way, microseconds (0: it waits for none) [default: 500].
    #[arg(long, hide = true)]
    pub marks_gather_us: Option<u64>,
}

/// Settings of `serve` alone: where to listen, whether to serve a store with a loss, and the
/// named sequences' number cache.
#[derive(Debug, Clone, Default, Args)]
pub struct ListenArgs {
    #[arg(long, env = "MONOSEQ_LISTEN", help = format!(
        "Address to listen on, an IP or a host name with a port [default: {LISTEN_DEFAULT}]"))]
    pub listen: Option<String>,
    /// Numbers of a named sequence that one durable write reserves for this server, which
    /// then answers `next` from memory until they run out (PostgreSQL's `CACHE`). A restart
    /// skips what was reserved and not handed out, and servers sharing a database hand out
    /// unique numbers, ordered only per server [default: 1, no cache: every number durable
    /// before it is answered, no gaps]
    #[arg(long, env = "MONOSEQ_NAMED_CACHE", value_name = "NUMBERS")]
    pub named_cache: Option<u64>,
    /// Serve a store that lost acknowledged events (a cut journal, lost engine files, a lost
    /// identity or marks file): the loss is logged and recorded, and no number handed out
    /// before it is handed out again. Without it such a store is refused.
    #[arg(long, env = "MONOSEQ_ACCEPT_LOSS")]
    pub accept_loss: bool,
}

/// The same settings as a TOML file spells them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsFile {
    storage: Option<String>,
    data_dir: Option<PathBuf>,
    listen: Option<String>,
    partitions: Option<u32>,
    trust_level: Option<u8>,
    ws_kinds: Option<Vec<u16>>,
    group_commands_max: Option<usize>,
    backlog_values_max: Option<usize>,
    cache_workspaces_max: Option<usize>,
    flush_delay_ms: Option<u64>,
    shutdown_timeout_secs: Option<u64>,
    idempotency_window_events: Option<u64>,
    partition_threads_max: Option<usize>,
    writer_threads: Option<usize>,
    record_cache_mib: Option<u64>,
    named_cache: Option<u64>,
    backup_root: Option<PathBuf>,
    cluster: Option<crate::cluster::ClusterFile>,
    security: Option<crate::auth::SecurityFile>,
    edge: Option<crate::edge::EdgeFile>,
}

/// Resolved settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub storage: Storage,
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub partitions: u32,
    /// `partitions` came from a flag, the environment or the file, not the default.
    pub partitions_configured: bool,
    pub trust: TrustLevel,
    pub ws_kinds: Vec<WsKind>,
    pub group_commands_max: usize,
    pub backlog_values_max: usize,
    pub cache_workspaces_max: usize,
    pub flush_delay: Duration,
    pub shutdown_timeout: Duration,
    pub idempotency_window_events: u64,
    pub partition_threads_max: usize,
    /// Writer threads the partitions share on the embedded storage (`--writer-threads`).
    pub writer_threads: usize,
    /// Memory for the writers' lately written records, MiB (`--record-cache-mib`).
    pub record_cache_mib: u64,
    /// Numbers of a named sequence one durable write reserves (`--named-cache`; 1: none).
    pub named_cache: u64,
    /// Serve a store with a detected loss (`--accept-loss`).
    pub accept_loss: bool,
    /// The marks cycle's gather bound, microseconds (`--marks-gather-us`, benchmarks only).
    pub marks_gather_us: Option<u64>,
    /// The settings file's `[cluster]` table (resolved with the cluster flags by `serve`).
    pub cluster: crate::cluster::ClusterFile,
    /// The settings file's `[security]` table, resolved with the flags by
    /// `auth::SecurityArgs::resolve`.
    pub security: crate::auth::SecurityFile,
    /// The settings file's `[edge]` table.
    pub edge_file: crate::edge::EdgeFile,
    /// The edge's limits (`serve`; resolved by `ServeArgs::resolve`, defaults otherwise).
    pub edge: crate::edge::EdgeLimits,
    /// How to continue a restored backup (`serve` only).
    pub restore: Option<monoseq_store::Restore>,
    /// The consumer side's limits (`serve`; defaults otherwise).
    pub follow: FollowLimits,
    /// The directory backups are written under (`--backup-root`, resolved by
    /// `ServeArgs::resolve`; `None`: backups disabled).
    pub backup_root: Option<PathBuf>,
}

/// `--shutdown-timeout-secs` over the file over the default.
fn shutdown_timeout(processor: &ProcessorArgs, file: &SettingsFile) -> Duration {
    Duration::from_secs(
        processor
            .shutdown_timeout_secs
            .or(file.shutdown_timeout_secs)
            .unwrap_or(SHUTDOWN_TIMEOUT_DEFAULT_SECS),
    )
}

/// The groups a command flattens, merged over the file over the defaults; a command passes
/// `Default::default()` for the groups it does not take.
pub fn resolve(
    storage: &StorageArgs,
    store: &StoreArgs,
    processor: &ProcessorArgs,
    listen: &ListenArgs,
) -> anyhow::Result<Settings> {
    let file = read_file(storage.config.as_deref())?;
    let trust = trust_of(store, &file)?;
    let ws_kinds = ws_kinds_of(store, &file)?;
    let storage_kind = Storage::parse(storage.storage.as_deref().or(file.storage.as_deref()))?;
    let (backlog_values_max, flush_delay) = numbers_flush(processor, &file, &storage_kind);
    let listen_text = listen.listen.as_deref().or(file.listen.as_deref());
    let shutdown_timeout = shutdown_timeout(processor, &file);
    let (partition_threads_max, writer_threads) = threads_of(processor, &file);
    let settings = Settings {
        storage: storage_kind,
        data_dir: storage
            .data_dir
            .clone()
            .or(file.data_dir)
            .unwrap_or_else(|| PathBuf::from(DATA_DIR_DEFAULT)),
        listen: listen_address(listen_text.unwrap_or(LISTEN_DEFAULT))?,
        partitions: store
            .partitions
            .or(file.partitions)
            .unwrap_or(PARTITIONS_DEFAULT),
        partitions_configured: store.partitions.or(file.partitions).is_some(),
        trust,
        ws_kinds,
        group_commands_max: processor
            .group_commands_max
            .or(file.group_commands_max)
            .unwrap_or(monoseq_cp::GROUP_COMMANDS_MAX_DEFAULT),
        backlog_values_max,
        cache_workspaces_max: processor
            .cache_workspaces_max
            .or(file.cache_workspaces_max)
            .unwrap_or(monoseq_core::CACHE_WORKSPACES_MAX_DEFAULT),
        flush_delay,
        shutdown_timeout,
        idempotency_window_events: processor
            .idempotency_window_events
            .or(file.idempotency_window_events)
            .unwrap_or(monoseq_cp::IDEMPOTENCY_WINDOW_EVENTS_DEFAULT),
        partition_threads_max,
        writer_threads,
        record_cache_mib: processor
            .record_cache_mib
            .or(file.record_cache_mib)
            .unwrap_or(RECORD_CACHE_MIB_DEFAULT),
        named_cache: listen
            .named_cache
            .or(file.named_cache)
            .unwrap_or(NAMED_CACHE_DEFAULT),
        accept_loss: listen.accept_loss,
        marks_gather_us: processor.marks_gather_us,
        cluster: file.cluster.unwrap_or_default(),
        security: file.security.unwrap_or_default(),
        edge_file: file.edge.unwrap_or_default(),
        edge: crate::edge::EdgeLimits::default(),
        restore: None,
        follow: FollowLimits::default(),
        backup_root: file.backup_root,
    };
    settings.validate()?;
    Ok(settings)
}

/// The partitions' threads of their own at most, and the writer threads they share: the flags
/// over the file over the defaults.
fn threads_of(processor: &ProcessorArgs, file: &SettingsFile) -> (usize, usize) {
    let own = processor
        .partition_threads_max
        .or(file.partition_threads_max)
        .unwrap_or(monoseq_cp::PARTITION_THREADS_MAX_DEFAULT);
    let shared = processor
        .writer_threads
        .or(file.writer_threads)
        .unwrap_or_else(monoseq_cp::writer_threads_default);
    (own, shared)
}

/// The backlog bound and the flush delay of the sequence numbers: the flags over the file over
/// the storage's defaults (PostgreSQL's backlog holds more, see
/// [`BACKLOG_VALUES_MAX_DEFAULT_POSTGRES`]).
fn numbers_flush(
    processor: &ProcessorArgs,
    file: &SettingsFile,
    storage: &Storage,
) -> (usize, Duration) {
    let backlog_default = match storage {
        Storage::Postgres(_) => BACKLOG_VALUES_MAX_DEFAULT_POSTGRES,
        _ => monoseq_cp::BACKLOG_VALUES_MAX_DEFAULT,
    };
    let delay_default = monoseq_cp::FLUSH_DELAY_DEFAULT;
    let backlog = processor
        .backlog_values_max
        .or(file.backlog_values_max)
        .unwrap_or(backlog_default);
    let delay = processor
        .flush_delay_ms
        .or(file.flush_delay_ms)
        .map_or(delay_default, Duration::from_millis);
    (backlog, delay)
}

/// The trust level: the flag over the file over the default.
fn trust_of(store: &StoreArgs, file: &SettingsFile) -> anyhow::Result<TrustLevel> {
    let trust_level = store
        .trust_level
        .or(file.trust_level)
        .unwrap_or(TRUST_LEVEL_DEFAULT);
    TrustLevel::try_from(trust_level).context("--trust-level")
}

/// The workspace kinds: the flag over the file over the default; at least one.
fn ws_kinds_of(store: &StoreArgs, file: &SettingsFile) -> anyhow::Result<Vec<WsKind>> {
    let ws_kinds: Vec<WsKind> = store
        .ws_kinds
        .clone()
        .or_else(|| file.ws_kinds.clone())
        .unwrap_or_else(|| vec![WS_KIND_DEFAULT])
        .into_iter()
        .map(WsKind)
        .collect();
    if ws_kinds.is_empty() {
        bail!("--ws-kinds is empty: declare at least one workspace kind");
    }
    Ok(ws_kinds)
}

/// The settings file, or no settings when none is given.
fn read_file(path: Option<&Path>) -> anyhow::Result<SettingsFile> {
    let Some(path) = path else {
        return Ok(SettingsFile::default());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str::<SettingsFile>(&text)
        .with_context(|| format!("parsing config file {}", path.display()))
}

impl Settings {
    /// Checks the limits the command processor and the sequencer would refuse, naming the
    /// flag (and the settings-file key) rather than the library's parameter.
    fn validate(&self) -> anyhow::Result<()> {
        let at_least_one = [
            ("--group-commands-max", self.group_commands_max as u64),
            ("--backlog-values-max", self.backlog_values_max as u64),
            ("--cache-workspaces-max", self.cache_workspaces_max as u64),
            (
                "--idempotency-window-events",
                self.idempotency_window_events,
            ),
            ("--named-cache", self.named_cache),
        ];
        if let Some((flag, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            bail!("{flag} must be at least 1");
        }
        if self.record_cache_mib > RECORD_CACHE_MIB_MAX {
            bail!(
                "--record-cache-mib is at most {RECORD_CACHE_MIB_MAX} (1 TiB), got {}",
                self.record_cache_mib
            );
        }
        if self.partitions_configured
            && !(1..=monoseq_cp::PARTITIONS_MAX).contains(&self.partitions)
        {
            bail!(
                "--partitions must be between 1 and {}, got {}",
                monoseq_cp::PARTITIONS_MAX,
                self.partitions
            );
        }
        let delay = monoseq_core::Params::builder()
            .kind(
                WsKind(1),
                [(monoseq_core::SeqId(1), monoseq_core::Number(1))],
            )
            .batcher_delay(self.flush_delay)
            .build();
        if let Err(monoseq_core::ParamsError::DurationOutOfRange { min, max, got, .. }) = delay {
            bail!(
                "--flush-delay-ms must be between {} and {} milliseconds, got {}",
                min.as_millis(),
                max.as_millis(),
                got.as_millis()
            );
        }
        Ok(())
    }

    /// The number cache of the named sequences this server serves.
    pub fn named_cache(&self) -> monoseq_named::CacheOptions {
        // `validate` refused 0.
        let numbers =
            std::num::NonZeroU64::new(self.named_cache).unwrap_or(std::num::NonZeroU64::MIN);
        monoseq_named::CacheOptions::new(numbers)
    }

    /// The command processor's configuration.
    pub fn cp_config(&self) -> monoseq_cp::Config {
        monoseq_cp::Config {
            app: APP,
            partitions: self.partitions,
            trust: self.trust,
            ws_kinds: self.ws_kinds.clone(),
            group_commands_max: self.group_commands_max,
            backlog_values_max: self.backlog_values_max,
            cache_workspaces_max: self.cache_workspaces_max,
            flush_delay: self.flush_delay,
            idempotency_window_events: self.idempotency_window_events,
            partition_threads_max: self.partition_threads_max,
            // A PostgreSQL write waits for the database: partitions sharing a thread would
            // wait in turn.
            writer_threads: match self.storage {
                Storage::Embedded => self.writer_threads,
                Storage::Postgres(_) => 0,
            },
            // `validate` bounds it to 1 TiB.
            recent_records_bytes: usize::try_from(self.record_cache_mib * MIB)
                .unwrap_or(usize::MAX),
            ..monoseq_cp::Config::default()
        }
    }
}

/// The first address `text` (`IP:port` or `host:port`) resolves to.
fn listen_address(text: &str) -> anyhow::Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .with_context(|| format!("--listen {text}: give an address and port, e.g. 127.0.0.1:8080"))?
        .next()
        .with_context(|| format!("--listen {text} resolves to no address"))
}

/// Where the data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Storage {
    /// The embedded engine in the data directory.
    Embedded,
    /// A PostgreSQL database (connection string).
    Postgres(String),
}

impl Storage {
    fn parse(text: Option<&str>) -> anyhow::Result<Storage> {
        match text {
            None | Some("embedded") => Ok(Storage::Embedded),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Ok(Storage::Postgres(url.to_owned()))
            }
            Some(other) => bail!(
                "unknown storage {other:?}: use `embedded` (the embedded engine in --data-dir) \
                 or a PostgreSQL connection string such as postgres://user@127.0.0.1:5432/db"
            ),
        }
    }

    /// What the storage is, for logs and `/v1/info`, without credentials.
    pub fn describe(&self) -> String {
        match self {
            Storage::Embedded => "embedded".to_owned(),
            Storage::Postgres(url) => {
                let host = url
                    .split_once("://")
                    .map(|(_, rest)| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
                    .unwrap_or(url);
                format!("postgres://{host}")
            }
        }
    }
}

pub use crate::base::Store;

/// Default most followers one node serves at once (`--followers-max`).
pub const FOLLOWERS_MAX_DEFAULT: usize = 1_024;
/// Default events a partition's hub keeps for its followers (`--follower-buffer-events`).
pub const FOLLOWER_BUFFER_EVENTS_DEFAULT: usize = 4_096;
/// Default interval of a tail's heartbeat while idle (`--follower-heartbeat-ms`).
pub const FOLLOWER_HEARTBEAT_MS_DEFAULT: u64 = 5_000;

/// The consumer side's limits, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowLimits {
    /// See `--followers-max`.
    pub followers_max: usize,
    /// See `--follower-buffer-events`.
    pub buffer_events: usize,
    /// See `--follower-heartbeat-ms`.
    pub heartbeat: Duration,
    /// See `--follower-batch-ms` (zero: hand out at once).
    pub batch: Duration,
}

impl Default for FollowLimits {
    fn default() -> FollowLimits {
        FollowLimits {
            followers_max: FOLLOWERS_MAX_DEFAULT,
            buffer_events: FOLLOWER_BUFFER_EVENTS_DEFAULT,
            heartbeat: Duration::from_millis(FOLLOWER_HEARTBEAT_MS_DEFAULT),
            batch: Duration::ZERO,
        }
    }
}

pub use crate::base::APP;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ServeArgs;

    #[test]
    fn the_settings_file_holds_a_security_table() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "write w-0123456789abcdef\n").unwrap();
        let file = dir.path().join("monoseq.toml");
        let toml = format!(
            "listen = \"0.0.0.0:8080\"\n[security]\ntokens_file = {:?}\nopen_health = true\n",
            tokens.display().to_string()
        );
        std::fs::write(&file, toml).unwrap();
        let settings = ServeArgs {
            storage: StorageArgs {
                config: Some(file),
                ..StorageArgs::default()
            },
            ..ServeArgs::default()
        }
        .resolve()
        .expect("the file resolves");
        let security = crate::auth::SecurityArgs::default()
            .resolve_with(
                &settings.security,
                settings.listen,
                crate::auth::EnvSecrets::default(),
            )
            .expect("tokens from the file's tokens file");
        assert_eq!(security.auth.count(crate::auth::Kind::Write), 1);
        assert!(security.auth.open_health);
    }

    #[test]
    fn on_postgres_the_backlog_holds_more_numbers_unless_set() {
        let mut args = ServeArgs::default();
        args.storage.storage = Some("postgres://u@127.0.0.1:5432/db".into());
        let on_pg = args.resolve().expect("resolves");
        assert_eq!(on_pg.flush_delay, monoseq_cp::FLUSH_DELAY_DEFAULT);
        assert_eq!(
            on_pg.backlog_values_max,
            BACKLOG_VALUES_MAX_DEFAULT_POSTGRES
        );
        args.processor.flush_delay_ms = Some(20);
        args.processor.backlog_values_max = Some(1000);
        let set = args.resolve().expect("resolves");
        assert_eq!(set.flush_delay, Duration::from_millis(20));
        assert_eq!(set.backlog_values_max, 1000);
        let embedded = ServeArgs::default().resolve().expect("resolves");
        assert_eq!(embedded.flush_delay, monoseq_cp::FLUSH_DELAY_DEFAULT);
        assert_eq!(
            embedded.backlog_values_max,
            monoseq_cp::BACKLOG_VALUES_MAX_DEFAULT
        );
    }

    #[test]
    fn flush_delay_comes_from_the_flag_over_the_file_over_the_default() {
        let defaults = ServeArgs::default().resolve().expect("defaults resolve");
        assert_eq!(defaults.flush_delay, monoseq_cp::FLUSH_DELAY_DEFAULT);
        assert_eq!(
            defaults.cp_config().flush_delay,
            monoseq_cp::FLUSH_DELAY_DEFAULT
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("monoseq.toml");
        std::fs::write(&file, "flush_delay_ms = 20\n").expect("write config");
        let mut args = ServeArgs::default();
        args.storage.config = Some(file);
        let from_file = args.resolve().expect("file resolves");
        assert_eq!(from_file.cp_config().flush_delay, Duration::from_millis(20));
        args.processor.flush_delay_ms = Some(0);
        assert_eq!(
            args.resolve().expect("flag resolves").flush_delay,
            Duration::ZERO
        );
    }

    #[test]
    fn partition_threads_come_from_the_flag_over_the_file_over_the_default() {
        let defaults = ServeArgs::default().resolve().expect("defaults resolve");
        assert_eq!(
            defaults.cp_config().partition_threads_max,
            monoseq_cp::PARTITION_THREADS_MAX_DEFAULT
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("monoseq.toml");
        std::fs::write(&file, "partition_threads_max = 3\n").expect("write config");
        let mut args = ServeArgs::default();
        args.storage.config = Some(file);
        let from_file = args.resolve().expect("file resolves");
        assert_eq!(from_file.cp_config().partition_threads_max, 3);
        args.processor.partition_threads_max = Some(0);
        let from_flag = args.resolve().expect("flag resolves");
        assert_eq!(from_flag.cp_config().partition_threads_max, 0);
    }

    #[test]
    fn writer_threads_come_from_the_flag_over_the_file_over_half_the_cores() {
        let defaults = ServeArgs::default().resolve().expect("defaults resolve");
        assert_eq!(
            defaults.cp_config().writer_threads,
            monoseq_cp::writer_threads_default()
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("monoseq.toml");
        std::fs::write(&file, "writer_threads = 3\n").expect("write config");
        let mut args = ServeArgs::default();
        args.storage.config = Some(file);
        let from_file = args.resolve().expect("file resolves");
        assert_eq!(from_file.cp_config().writer_threads, 3);
        args.processor.writer_threads = Some(0);
        let from_flag = args.resolve().expect("flag resolves");
        assert_eq!(from_flag.cp_config().writer_threads, 0);
        args.processor.writer_threads = Some(2);
        args.storage.storage = Some("postgres://localhost/monoseq".to_owned());
        let on_postgres = args.resolve().expect("PostgreSQL resolves");
        assert_eq!(
            on_postgres.cp_config().writer_threads,
            0,
            "a thread per partition on PostgreSQL"
        );
    }

    #[test]
    fn the_record_cache_comes_from_the_flag_over_the_file_over_the_default() {
        let bytes = |args: &ServeArgs| args.resolve().unwrap().cp_config().recent_records_bytes;
        assert_eq!(
            bytes(&ServeArgs::default()),
            monoseq_cp::RECENT_RECORDS_BYTES_DEFAULT
        );
        let dir = tempfile::tempdir().expect("temporary directory");
        let file = dir.path().join("monoseq.toml");
        std::fs::write(&file, "record_cache_mib = 16\n").expect("write config");
        let mut args = ServeArgs::default();
        args.storage.config = Some(file);
        assert_eq!(bytes(&args), 16 << 20);
        args.processor.record_cache_mib = Some(0);
        assert_eq!(bytes(&args), 0, "0 keeps no records");
        args.processor.record_cache_mib = Some(RECORD_CACHE_MIB_MAX + 1);
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("--record-cache-mib is at most"), "{err}");
    }

    #[test]
    fn a_refused_setting_is_named_by_its_flag() {
        let mut args = ServeArgs::default();
        args.processor.flush_delay_ms = Some(60_000);
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("--flush-delay-ms"), "{err}");
        assert!(!err.contains("batcher_delay"), "{err}");
        let mut args = ServeArgs::default();
        args.processor.group_commands_max = Some(0);
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("--group-commands-max"), "{err}");
        let mut args = ServeArgs::default();
        args.store.ws_kinds = Some(Vec::new());
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("--ws-kinds"), "{err}");
        let mut args = ServeArgs::default();
        args.listen.named_cache = Some(0);
        let err = args.resolve().unwrap_err().to_string();
        assert!(err.contains("--named-cache must be at least 1"), "{err}");
    }

    #[test]
    fn the_named_cache_is_off_unless_asked_for() {
        let numbers = |args: &ServeArgs| args.resolve().unwrap().named_cache().numbers_value();
        let mut args = ServeArgs::default();
        assert_eq!(numbers(&args).get(), NAMED_CACHE_DEFAULT);
        args.listen.named_cache = Some(32);
        assert_eq!(numbers(&args).get(), 32);
    }

    #[test]
    fn listen_takes_a_host_name_or_an_address_with_a_port() {
        assert!(listen_address("localhost:8080").unwrap().ip().is_loopback());
        assert_eq!(
            listen_address("127.0.0.1:9").unwrap(),
            "127.0.0.1:9".parse::<SocketAddr>().unwrap()
        );
        let err = listen_address("localhost").unwrap_err().to_string();
        assert!(err.contains("e.g. 127.0.0.1:8080"), "{err}");
    }
}
