//! Opening storage: the embedded engine through its data directory's identity and high-water
//! marks, or a PostgreSQL database through its recorded metadata, for serving or for a tool;
//! and what each relies on after a crash, named in the log at every start.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use monoseq_kv::{EmbeddedStore, Options};

use crate::base::{APP, Store};
use crate::config::{Settings, Storage};

/// An opened storage: the store, the embedded engine when it is one (for its maintenance
/// calls), and what opening found.
pub struct Opened {
    pub kv: Store,
    pub embedded: Option<Arc<EmbeddedStore>>,
    /// The database, when the storage is PostgreSQL (its leases and fenced views).
    pub postgres: Option<Arc<monoseq_pg::PgStore>>,
    pub identity: monoseq_store::Identity,
    /// High-water marks (embedded storage only: they live in the data directory).
    pub marks: Option<Arc<monoseq_store::Marks>>,
    pub report: monoseq_store::OpenReport,
    /// The PLogs' segment files (a data directory in key layout 4).
    pub segments: Option<Arc<monoseq_store::Segments>>,
    /// How long opening the embedded storage took, by step.
    pub took: Option<OpenTook>,
}

/// How long opening an embedded data directory took, by step (named in the "store opened"
/// line, so a slow start says where its time went).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenTook {
    /// The engine's own open and recovery (fjall's journal and tables).
    pub engine: Duration,
    /// The rest: identity, high-water marks, the PLogs' segment logs (their tails checked)
    /// and the redo that brings the engine up to them.
    pub data_dir: Duration,
}

impl Opened {
    /// The event store on this storage, writing with `trust`, its PLogs where the storage
    /// keeps them.
    pub fn event_store(
        &self,
        trust: monoseq_store::TrustLevel,
    ) -> monoseq_store::EventStore<Store> {
        let kv = Arc::clone(&self.kv);
        monoseq_store::EventStore::with_plogs(kv, APP, trust, self.segments.clone())
    }
}

/// Opens the configured storage for serving: the embedded engine through its data
/// directory's identity and high-water marks ([`open_data_dir`]), or a PostgreSQL database
/// through its recorded metadata. Settles `settings.partitions` on the store's count.
pub fn open_storage(settings: &mut Settings) -> anyhow::Result<Opened> {
    match settings.storage.clone() {
        Storage::Embedded => {
            let (kv, dir, took) = open_data_dir(settings)?;
            Ok(Opened {
                kv: kv.clone(),
                embedded: Some(kv),
                postgres: None,
                identity: dir.identity,
                marks: Some(dir.marks),
                report: dir.report,
                segments: dir.segments,
                took: Some(took),
            })
        }
        Storage::Postgres(url) => {
            let pg = open_pg(&url)?;
            let kv: Store = pg.clone();
            let policy = monoseq_store::OpenPolicy {
                partitions: settings
                    .partitions_configured
                    .then_some(settings.partitions),
                default_partitions: settings.partitions,
                accept_loss: settings.accept_loss,
                restore: None,
            };
            let identity = monoseq_store::open_database(&kv, &policy)?;
            settings.partitions = identity.partitions;
            Ok(Opened {
                kv,
                embedded: None,
                postgres: Some(pg),
                identity,
                marks: None,
                report: monoseq_store::OpenReport::default(),
                segments: None,
                took: None,
            })
        }
    }
}

/// Opens a PostgreSQL store (schema created or migrated).
pub fn open_postgres(url: &str) -> anyhow::Result<Store> {
    Ok(open_pg(url)?)
}

/// Opens a PostgreSQL store (schema created or migrated), as itself.
fn open_pg(url: &str) -> anyhow::Result<Arc<monoseq_pg::PgStore>> {
    // The store's errors name their causes in their own text: no chain, so nothing is said
    // twice.
    let store = monoseq_pg::PgStore::open(url, monoseq_pg::PgOptions::default()).map_err(|e| {
        anyhow::anyhow!(
            "opening PostgreSQL storage {}: {}",
            Storage::Postgres(url.to_owned()).describe(),
            crate::base::chain(&e)
        )
    })?;
    Ok(Arc::new(store))
}

/// Opens the configured storage for a tool (no identity check, nothing created): the
/// embedded engine in an existing data directory, or the PostgreSQL database.
pub fn open_for_tool(settings: &Settings) -> anyhow::Result<Store> {
    match &settings.storage {
        Storage::Embedded => {
            if !settings.data_dir.exists() {
                bail!(
                    "data directory {} does not exist; give the right --data-dir",
                    settings.data_dir.display()
                );
            }
            Ok(open_store(&settings.data_dir)?)
        }
        Storage::Postgres(url) => open_postgres(url),
    }
}

/// The PLogs' segment files of the data directory, for a tool, when it keeps its PLogs there
/// (key layout 4): each log required whole up to its mark, as a start requires it.
pub fn tool_segments(
    settings: &Settings,
    partitions: u32,
) -> anyhow::Result<Option<Arc<monoseq_store::Segments>>> {
    let Storage::Embedded = settings.storage else {
        return Ok(None);
    };
    let dir = &settings.data_dir;
    let Some(identity) = monoseq_store::Identity::read(dir)? else {
        return Ok(None);
    };
    if !monoseq_store::keeps_segments(identity.key_layout) {
        return Ok(None);
    }
    let marks = monoseq_store::Marks::open(dir, partitions).ok().flatten();
    let durable = |p: u32| {
        marks
            .as_ref()
            .and_then(|m| m.get(p).ok())
            .map_or(1, |m| m.plog + 1)
    };
    let segments = monoseq_store::Segments::open(dir, partitions, &durable)
        .with_context(|| format!("opening the PLog's segment files in {}", dir.display()))?;
    Ok(Some(Arc::new(segments.in_layout(identity.key_layout))))
}

/// Longest time a write of the sequence projection may wait for its flush. Events are never
/// left waiting: the command processor syncs every group before answering.
pub const GROUP_COMMIT_DELAY: Duration = Duration::from_millis(5);

/// What the embedded engine does with a damaged journal when it opens, named in the log at
/// every start.
pub const ENGINE_RECOVERY_POLICY: &str = concat!(
    "fjall journal recovery TolerateCorruptTail: a damaged last batch of the journal is ",
    "dropped silently; the high-water marks catch an acknowledged one"
);

/// What a PostgreSQL store relies on after a crash, named in the log at every start.
pub const POSTGRES_RECOVERY_POLICY: &str = concat!(
    "PostgreSQL: every commit is durable on return (synchronous_commit on); its write-ahead log ",
    "recovers acknowledged groups; no high-water marks are kept on this node"
);

/// Opens the embedded store in `dir` (creating it) with group commit: concurrent partitions
/// share flushes, and the command processor syncs before it acknowledges.
pub fn open_store(dir: &Path) -> anyhow::Result<Arc<EmbeddedStore>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("creating data directory {}", dir.display()))?;
    let options = Options::default().durability(monoseq_kv::Durability::GroupCommit {
        max_delay: GROUP_COMMIT_DELAY,
    });
    let store = EmbeddedStore::open(dir, options)
        .with_context(|| format!("opening data directory {}", dir.display()))?;
    Ok(Arc::new(store))
}

/// Opens the data directory for serving: the engine, then its identity and high-water marks
/// (`monoseq_store::open_data_dir`), which refuse a store that lost or damaged acknowledged
/// data unless `settings.accept_loss`. Settles `settings.partitions` on the store's count.
/// Answers how long each step took, too.
pub fn open_data_dir(
    settings: &mut Settings,
) -> anyhow::Result<(Arc<EmbeddedStore>, monoseq_store::DataDir, OpenTook)> {
    let began = std::time::Instant::now();
    let kv = open_store(&settings.data_dir)?;
    let engine = began.elapsed();
    let policy = monoseq_store::OpenPolicy {
        partitions: settings
            .partitions_configured
            .then_some(settings.partitions),
        default_partitions: settings.partitions,
        accept_loss: settings.accept_loss,
        restore: settings.restore.clone(),
    };
    let dir = monoseq_store::open_data_dir(&settings.data_dir, &kv, APP, &policy)?;
    settings.partitions = dir.identity.partitions;
    let took = OpenTook {
        engine,
        data_dir: began.elapsed().saturating_sub(engine),
    };
    Ok((kv, dir, took))
}

/// Applies `--marks-gather-us` (benchmarks only) to the marks, if both are there.
pub fn set_marks_gather(marks: Option<&monoseq_store::Marks>, gather_us: Option<u64>) {
    if let (Some(marks), Some(us)) = (marks, gather_us) {
        marks.set_gather(std::time::Duration::from_micros(us));
        tracing::warn!(
            gather_us = us,
            "--marks-gather-us: the marks cycle's gather bound is set (benchmarks only)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::ServeArgs;

    #[test]
    fn a_new_data_directory_gets_an_identity_and_a_second_start_passes() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut args = ServeArgs::default();
        args.storage.data_dir = Some(dir.path().join("data"));
        args.store.partitions = Some(4);
        let mut settings = args.resolve().expect("settings");
        let (kv, opened, _) = open_data_dir(&mut settings).expect("first start");
        assert!(opened.report.created);
        monoseq_store::recorded_partitions(&*kv, dir.path()).expect("recorded layout passes");
        drop((kv, opened));
        settings.partitions_configured = false;
        settings.partitions = 8;
        let (_kv, opened, _) = open_data_dir(&mut settings).expect("second start");
        assert!(!opened.report.created);
        assert_eq!(
            settings.partitions, 4,
            "the store's count wins when none is configured"
        );
    }
}
