//! Opening a data directory safely: the engine's own metadata (store ID, partition count, key
//! layout), checked against our identity file and high-water marks before anything is served.
//! An engine that came up empty, belongs to another store, or whose PLog ends below an
//! acknowledged mark is refused with what is missing and what to do; an operator may accept a
//! named loss, after which every number handed out before it stays retired.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use monoseq_core::{PLogOffset, ReplayedEvent, SeqStorage, Sequencer, Status, Step, WsKind};
use monoseq_kv::{Key, KvError, KvStore, WriteBatch, WriteError};

use crate::builtin::{
    CRECORD_ID_SEQUENCE, OWRECORD_ID_SEQUENCE, WLOG_OFFSET_SEQUENCE, built_in_params,
};
use crate::codec::FORMAT_VERSION;
use crate::identity::{AcceptedLoss, Identity, IdentityError, now_ms};
use crate::keys::{AppId, KEY_LAYOUT, KEY_LAYOUT_CHUNKS, KEY_LAYOUT_SEGMENTS, PartitionId};
use crate::marks::{Mark, Marks, MarksError};
use crate::plog::Segments;
use crate::store::{EventStore, TrustLevel};

const META_PARTITION: &[u8] = b"monoseq/meta";
const META_PARTITIONS: &[u8] = b"partitions";
const META_KEY_LAYOUT: &[u8] = b"key_layout";
const META_STORE_ID: &[u8] = b"store_id";

/// Most worker steps one actualization may take while a loss is accepted, so a failing engine
/// ends in an error rather than a loop.
const ACTUALIZE_STEPS_MAX: usize = 64;

/// How to open a data directory.
#[derive(Debug, Clone, Default)]
pub struct OpenPolicy {
    /// The partition count the operator configured, if any; a new store takes it (or
    /// `default_partitions`), an existing one must match it.
    pub partitions: Option<u32>,
    /// Partition count of a new store when none is configured.
    pub default_partitions: u32,
    /// The operator accepts a detected loss (`--accept-loss`): the loss is recorded and
    /// named, and numbers handed out before it are retired, instead of refusing to start.
    pub accept_loss: bool,
    /// How to continue a restored backup (`--marks-from`, `--skip-ahead`); without it a
    /// directory stamped as a backup is refused.
    pub restore: Option<crate::backup::Restore>,
}

/// Acknowledged events missing from one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    /// The partition.
    pub partition: u32,
    /// The last PLog offset the engine holds (0: none).
    pub plog_end: u64,
    /// The high-water mark: what was acknowledged.
    pub mark: Mark,
}

impl Loss {
    /// The loss accepted at `at_ms` (Unix milliseconds) by the operator: the PLog offsets
    /// after the end up to the mark are lost, and every number up to the mark is retired.
    #[must_use]
    pub fn accepted(&self, at_ms: u64) -> AcceptedLoss {
        AcceptedLoss {
            partition: self.partition,
            plog_from: self.plog_end + 1,
            plog_to: self.mark.plog,
            mark: self.mark,
            accepted_at_ms: at_ms,
            cause: crate::LossCause::AcceptedLoss,
        }
    }

    /// How many acknowledged events are missing.
    #[must_use]
    pub fn events(&self) -> u64 {
        self.mark.plog - self.plog_end
    }
}

impl std::fmt::Display for Loss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "partition {}: the PLog ends at offset {} but events up to {} were acknowledged \
             ({} missing: offsets {}..={}; WLog offsets up to {}, CRecord IDs up to {} and \
             ORecord IDs up to {} were handed out)",
            self.partition,
            self.plog_end,
            self.mark.plog,
            self.events(),
            self.plog_end + 1,
            self.mark.plog,
            self.mark.wlog,
            self.mark.crecord,
            self.mark.owrecord
        )
    }
}

/// Why a data directory is not served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DataDirError {
    /// The identity file cannot be read or is damaged.
    #[error(transparent)]
    Identity(#[from] IdentityError),
    /// The marks file cannot be read or is damaged.
    #[error(transparent)]
    Marks(#[from] MarksError),
    /// A restored backup that is not continued yet, or its stamp or the live marks given
    /// cannot be read.
    #[error(transparent)]
    Backup(#[from] crate::backup::BackupError),
    /// The engine failed.
    #[error("reading the engine in {dir}")]
    Storage {
        /// The data directory.
        dir: PathBuf,
        /// The engine's error.
        #[source]
        source: KvError,
    },
    /// The identity says the store holds data but the engine holds nothing.
    #[error(
        "the engine in {dir} is empty, but the identity file says it holds store {store_id} with \
         {partitions} partitions, acknowledged up to PLog offsets {marks}: the engine's files \
         were lost or replaced. Restore the data directory from a backup; or start with \
         --accept-loss to serve it empty, numbering above everything handed out before"
    )]
    EngineEmpty {
        /// The data directory.
        dir: PathBuf,
        /// The store the identity names.
        store_id: String,
        /// Its partitions.
        partitions: u32,
        /// Each partition's acknowledged PLog mark, comma separated.
        marks: String,
    },
    /// The engine holds another store.
    #[error(
        "the engine in {dir} holds store {found}, but the identity file names store {expected}: \
         the engine's files belong to another data directory. Put back this directory's own \
         files"
    )]
    ForeignEngine {
        /// The data directory.
        dir: PathBuf,
        /// The identity's store.
        expected: String,
        /// The engine's store.
        found: String,
    },
    /// The engine holds a store but its identity file is gone.
    #[error(
        "{dir} has no identity file, but its engine holds store {store_id}: the identity file \
         was deleted, so the store cannot prove it is whole. Restore the file from a backup; or \
         start with --accept-loss to rebuild it from what the engine holds"
    )]
    IdentityMissing {
        /// The data directory.
        dir: PathBuf,
        /// The engine's store.
        store_id: String,
    },
    /// The identity exists but the marks file is gone.
    #[error(
        "{dir} has no high-water marks file ({file}), so the store cannot prove it holds every \
         acknowledged event. Restore it from a backup; or start with --accept-loss to rebuild it \
         from what the engine holds"
    )]
    MarksMissing {
        /// The data directory.
        dir: PathBuf,
        /// The file's name.
        file: &'static str,
    },
    /// The partition count differs from the store's.
    #[error(
        "the data directory holds {stored} partitions but {configured} were configured; \
         workspaces are routed by `ws mod partitions`, so the count cannot change: start with \
         --partitions {stored}"
    )]
    Partitions {
        /// The store's count.
        stored: u32,
        /// The configured count.
        configured: u32,
    },
    /// The engine and the identity disagree on something recorded at creation.
    #[error("the data directory is inconsistent: {0}; restore it from a backup")]
    Inconsistent(String),
    /// Data in a key layout this build does not read.
    #[error(
        "the event store uses key layout {stored}, this build reads layout {KEY_LAYOUT} in a \
         database and layouts {KEY_LAYOUT}, {KEY_LAYOUT_SEGMENTS} and {KEY_LAYOUT_CHUNKS} in a \
         data directory (docs/format.md); run the monoseq version that wrote it, or start with \
         an empty data directory"
    )]
    KeyLayout {
        /// The stored layout.
        stored: u32,
    },
    /// A PLog's segment files are missing or damaged where acknowledged events must be.
    #[error(
        "the PLog's segment files in {dir} do not hold every acknowledged event: {source}. \
         Restore the data directory from a backup; or start with --accept-loss to serve what \
         is left (a log cut at its first damaged frame; damage inside a sealed segment is \
         refused even then)"
    )]
    Segments {
        /// The data directory.
        dir: PathBuf,
        /// What is missing or damaged.
        #[source]
        source: monoseq_seglog::SegError,
    },
    /// Bringing the key-value store up to the PLogs' segment files failed.
    #[error("writing the WLog entries and records of the PLog's last events again failed")]
    Redo(#[source] crate::store::AppendError),
    /// Acknowledged events are missing.
    #[error(
        "the store lost acknowledged events and is not served:\n  {}\nRestore the data \
         directory from a backup; or start with --accept-loss to serve what is left: the \
         missing events stay lost, and no number handed out before is handed out again",
        losses.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
    )]
    Lost {
        /// What is missing, per partition.
        losses: Vec<Loss>,
    },
    /// Rebuilding a partition's sequence state while accepting a loss failed.
    #[error("accepting the loss of partition {partition}: {message}")]
    Actualize {
        /// The partition.
        partition: u32,
        /// What failed.
        message: String,
    },
}

/// What opening did, for the log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpenReport {
    /// A new store was created.
    pub created: bool,
    /// A directory written before identity files existed got one.
    pub adopted: bool,
    /// The identity file was rebuilt from the engine (`--accept-loss`).
    pub identity_rebuilt: bool,
    /// The marks file was rebuilt from the engine (`--accept-loss`).
    pub marks_rebuilt: bool,
    /// Losses accepted by this open.
    pub accepted: Vec<Loss>,
    /// Partitions whose sequence state was moved past an accepted loss by this open.
    pub retired_partitions: Vec<u32>,
    /// A restored backup continued by this open.
    pub restored: Option<crate::backup::Restored>,
    /// `restore` was given but the directory is no restored backup (nothing was done).
    pub restore_unused: bool,
}

/// An opened, checked data directory.
#[derive(Debug)]
pub struct DataDir {
    /// Its identity.
    pub identity: Identity,
    /// Its high-water marks, raised as groups are acknowledged.
    pub marks: Arc<Marks>,
    /// What opening did.
    pub report: OpenReport,
    /// The PLogs' segment files (key layout 4); `None` for a directory whose PLogs are in its
    /// engine (layout 3, created before layout 4).
    pub segments: Option<Arc<Segments>>,
}

impl DataDir {
    /// The event store of `app` on the directory's engine `kv`, with its PLogs where the
    /// directory keeps them.
    pub fn event_store<S: KvStore>(&self, kv: S, app: AppId, trust: TrustLevel) -> EventStore<S> {
        EventStore::with_plogs(kv, app, trust, self.segments.clone())
    }
}

/// What the engine records about itself.
#[derive(Debug, Default)]
struct EngineMeta {
    partitions: Option<u32>,
    key_layout: Option<u32>,
    store_id: Option<String>,
}

fn read_meta(kv: &impl KvStore) -> Result<EngineMeta, KvError> {
    let get = |c: &[u8]| kv.get(Key::new(META_PARTITION, c));
    let u32_of =
        |v: Option<Vec<u8>>| v.and_then(|v| v.as_slice().try_into().ok().map(u32::from_be_bytes));
    Ok(EngineMeta {
        partitions: u32_of(get(META_PARTITIONS)?),
        key_layout: u32_of(get(META_KEY_LAYOUT)?),
        store_id: get(META_STORE_ID)?.map(|v| String::from_utf8_lossy(&v).into_owned()),
    })
}

fn write_meta(kv: &impl KvStore, identity: &Identity) -> Result<(), KvError> {
    let layout = identity.key_layout;
    let mut batch = WriteBatch::new();
    batch.put(
        Key::new(META_PARTITION, META_PARTITIONS),
        &identity.partitions.to_be_bytes(),
    );
    batch.put(
        Key::new(META_PARTITION, META_KEY_LAYOUT),
        &layout.to_be_bytes(),
    );
    batch.put(
        Key::new(META_PARTITION, META_STORE_ID),
        identity.store_id.as_bytes(),
    );
    kv.write(&batch)
        .map_err(|e| KvError::backend("writing the key layout and the store ID", e))?;
    kv.sync()
}

/// The partition count a store records, if any, for tools that only read it; an empty store
/// answers `None`. The store must be in this build's key layout (one without a layout record
/// but with a partition count is from before the record existed: layout 1).
///
/// # Errors
///
/// [`DataDirError::KeyLayout`] for another layout, [`DataDirError::Storage`] when the store
/// fails (`place` names it).
pub fn recorded_partitions(kv: &impl KvStore, place: &Path) -> Result<Option<u32>, DataDirError> {
    let meta = read_meta(kv).map_err(|source| DataDirError::Storage {
        dir: place.to_path_buf(),
        source,
    })?;
    check_layout(&meta, DATA_DIR_LAYOUTS)?;
    Ok(meta.partitions)
}

/// The key layouts a data directory may be in.
const DATA_DIR_LAYOUTS: &[u32] = &[KEY_LAYOUT, KEY_LAYOUT_SEGMENTS, KEY_LAYOUT_CHUNKS];

/// Fails unless the store is empty or in one of the `accepted` key layouts.
fn check_layout(meta: &EngineMeta, accepted: &[u32]) -> Result<(), DataDirError> {
    match meta.key_layout.or(meta.partitions.map(|_| 1)) {
        Some(stored) if !accepted.contains(&stored) => Err(DataDirError::KeyLayout { stored }),
        _ => Ok(()),
    }
}

/// Opens data directory `dir`, whose engine `kv` is already open, for application `app`:
/// creates the identity and marks of a new store, or checks an existing store against them.
///
/// # Errors
///
/// [`DataDirError`] naming what is missing or damaged and what to do.
pub fn open_data_dir<S: KvStore + Clone>(
    dir: &Path,
    kv: &S,
    app: AppId,
    policy: &OpenPolicy,
) -> Result<DataDir, DataDirError> {
    let meta = read_meta(kv).map_err(storage_in(dir))?;
    check_layout(&meta, DATA_DIR_LAYOUTS)?;
    let identity = match Identity::read(dir) {
        Ok(id) => id,
        Err(IdentityError::Damaged { .. }) if policy.accept_loss => None,
        Err(e) => return Err(e.into()),
    };
    let mut report = OpenReport::default();
    let identity = match (identity, &meta.store_id) {
        (None, None) => return create_or_adopt(dir, kv, app, policy, &meta),
        (None, Some(store_id)) => {
            let identity = rebuild_identity(dir, policy, &meta, store_id)?;
            report.identity_rebuilt = true;
            identity
        }
        (Some(identity), Some(found)) if *found != identity.store_id => {
            return Err(DataDirError::ForeignEngine {
                dir: dir.to_path_buf(),
                expected: identity.store_id,
                found: found.clone(),
            });
        }
        (Some(identity), _) => identity,
    };
    check_configured(policy, identity.partitions)?;
    check_engine_partitions(&meta, &identity)?;
    let marks = open_marks(dir, policy, identity.partitions)?;
    if meta.store_id.is_none() {
        // The identity names a store the engine does not hold: it came up empty.
        accept_empty_engine(dir, kv, policy, &identity, marks.as_ref())?;
    }
    let segments = open_segments(dir, policy, &identity, marks.as_ref())?;
    let store = store_of(kv, app, segments.as_ref());
    store.redo(policy.accept_loss).map_err(DataDirError::Redo)?;
    let marks = match marks {
        Some(m) => m,
        None => {
            report.marks_rebuilt = true;
            rebuild_marks(dir, &store, &identity)?
        }
    };
    let mut identity = identity;
    report.restored = continue_restore(dir, &store, policy, &mut identity, &marks)?;
    report.restore_unused = policy.restore.is_some() && report.restored.is_none();
    let mut guarded = DataDir {
        identity,
        marks: Arc::new(marks),
        report,
        segments,
    };
    check_losses(dir, &store, policy, &mut guarded)?;
    Ok(guarded)
}

/// The event store of `app` on `kv`, its PLogs in `segments` when given.
fn store_of<S: KvStore + Clone>(
    kv: &S,
    app: AppId,
    segments: Option<&Arc<Segments>>,
) -> EventStore<S> {
    EventStore::with_plogs(kv.clone(), app, TrustLevel::Level0, segments.cloned())
}

/// Opens the PLogs' segment files of a directory in key layout 4 (`None` for layout 3), each
/// required whole up to its acknowledged mark ([`durable_end`]); with `--accept-loss`, a log
/// damaged below it is cut at its first damaged frame instead (a loss the marks then name).
fn open_segments(
    dir: &Path,
    policy: &OpenPolicy,
    identity: &Identity,
    marks: Option<&Marks>,
) -> Result<Option<Arc<Segments>>, DataDirError> {
    if !crate::plog::keeps_segments(identity.key_layout) {
        return Ok(None);
    }
    let required = |p: u32| durable_end(identity, marks, p);
    let opened = match Segments::open(dir, identity.partitions, &required) {
        Err(source) if policy.accept_loss => {
            tracing::warn!(
                dir = %dir.display(),
                "the PLog's segment files lack acknowledged events ({source}); cutting each \
                 log at its first damaged frame, as --accept-loss allows"
            );
            Segments::open(dir, identity.partitions, &|_| 1)
        }
        opened => opened,
    };
    opened
        .map(|s| Some(Arc::new(s.in_layout(identity.key_layout))))
        .map_err(|source| DataDirError::Segments {
            dir: dir.to_path_buf(),
            source,
        })
}

/// One past the last offset partition `p`'s log must hold: its mark's, or, when an accepted
/// loss retired the mark, the first offset that loss lost (its log may hold the retired
/// offsets or not, as a crash left the acceptance).
fn durable_end(identity: &Identity, marks: Option<&Marks>, p: u32) -> u64 {
    let mark = marks.and_then(|m| m.get(p).ok()).map_or(0, |m| m.plog);
    if mark > identity.retired(p).plog {
        return mark + 1;
    }
    identity
        .losses_of(p)
        .map(|l| l.plog_from)
        .max()
        .unwrap_or(1)
}

/// The error of the engine of data directory `dir` failing.
fn storage_in(dir: &Path) -> impl Fn(KvError) -> DataDirError + '_ {
    move |source| DataDirError::Storage {
        dir: dir.to_path_buf(),
        source,
    }
}

/// Opens a directory with neither identity nor store ID in its engine: creates a new store,
/// or adopts one written before identity files existed (its marks scanned from the engine).
fn create_or_adopt<S: KvStore + Clone>(
    dir: &Path,
    kv: &S,
    app: AppId,
    policy: &OpenPolicy,
    meta: &EngineMeta,
) -> Result<DataDir, DataDirError> {
    let partitions = meta
        .partitions
        .or(policy.partitions)
        .unwrap_or(policy.default_partitions);
    check_configured(policy, partitions)?;
    let mut report = OpenReport::default();
    if meta.partitions.is_some() {
        report.adopted = true;
    } else {
        report.created = true;
    }
    // A new directory keeps its PLogs in segment files and its WLog entries and records'
    // references in chunks; one written before identity files existed keeps them where they
    // are.
    let layout = if report.created {
        KEY_LAYOUT_CHUNKS
    } else {
        meta.key_layout.unwrap_or(KEY_LAYOUT)
    };
    let identity = Identity::new(partitions, layout, FORMAT_VERSION);
    let segments = open_segments(dir, policy, &identity, None)?;
    write_meta(kv, &identity).map_err(storage_in(dir))?;
    let marks = if report.created {
        Marks::create(dir, partitions)?
    } else {
        let store = store_of(kv, app, segments.as_ref());
        Marks::create_with(
            dir,
            &scan_marks(&store, partitions).map_err(storage_in(dir))?,
        )?
    };
    identity.write(dir)?;
    Ok(DataDir {
        identity,
        marks: Arc::new(marks),
        report,
        segments,
    })
}

/// Rebuilds the identity file of a directory whose engine holds store `store_id`, when the
/// operator accepts a loss; refuses otherwise.
fn rebuild_identity(
    dir: &Path,
    policy: &OpenPolicy,
    meta: &EngineMeta,
    store_id: &str,
) -> Result<Identity, DataDirError> {
    if !policy.accept_loss {
        return Err(DataDirError::IdentityMissing {
            dir: dir.to_path_buf(),
            store_id: store_id.to_owned(),
        });
    }
    let partitions = meta.partitions.ok_or_else(|| {
        DataDirError::Inconsistent("the engine has a store ID but no partition count".into())
    })?;
    let layout = meta.key_layout.unwrap_or(KEY_LAYOUT);
    let mut identity = Identity::new(partitions, layout, FORMAT_VERSION);
    store_id.clone_into(&mut identity.store_id);
    identity.write(dir)?;
    Ok(identity)
}

/// Fails when the engine records another partition count than the identity.
fn check_engine_partitions(meta: &EngineMeta, identity: &Identity) -> Result<(), DataDirError> {
    match (meta.partitions, meta.key_layout) {
        (Some(p), _) if p != identity.partitions => Err(DataDirError::Inconsistent(format!(
            "the engine records {p} partitions, the identity file {}",
            identity.partitions
        ))),
        (_, Some(layout)) if layout != identity.key_layout => {
            Err(DataDirError::Inconsistent(format!(
                "the engine records key layout {layout}, the identity file {}",
                identity.key_layout
            )))
        }
        _ => Ok(()),
    }
}

/// The directory's marks; `None` when they are missing or damaged and the operator accepts a
/// loss (they are then rebuilt), an error when not.
fn open_marks(
    dir: &Path,
    policy: &OpenPolicy,
    partitions: u32,
) -> Result<Option<Marks>, DataDirError> {
    match Marks::open(dir, partitions) {
        Ok(Some(m)) => Ok(Some(m)),
        Ok(None) if !policy.accept_loss => Err(DataDirError::MarksMissing {
            dir: dir.to_path_buf(),
            file: crate::marks::MARKS_FILE,
        }),
        Err(e) if !policy.accept_loss => Err(e.into()),
        Ok(None) | Err(_) => Ok(None),
    }
}

/// Writes the identity's metadata into an engine that came up empty, when the operator
/// accepts the loss; refuses, naming the acknowledged marks, otherwise.
fn accept_empty_engine(
    dir: &Path,
    kv: &impl KvStore,
    policy: &OpenPolicy,
    identity: &Identity,
    marks: Option<&Marks>,
) -> Result<(), DataDirError> {
    if !policy.accept_loss {
        let marks = marks
            .map(|m| {
                m.all()
                    .iter()
                    .map(|m| m.plog.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_else(|| "unknown (no marks file)".into());
        return Err(DataDirError::EngineEmpty {
            dir: dir.to_path_buf(),
            store_id: identity.store_id.clone(),
            partitions: identity.partitions,
            marks,
        });
    }
    write_meta(kv, identity).map_err(storage_in(dir))
}

/// Rebuilds the marks file from what the engine holds; numbers an earlier accepted loss
/// retired stay retired.
fn rebuild_marks<S: KvStore + Clone>(
    dir: &Path,
    store: &EventStore<S>,
    identity: &Identity,
) -> Result<Marks, DataDirError> {
    let scanned = scan_marks(store, identity.partitions).map_err(storage_in(dir))?;
    let merged: Vec<Mark> = scanned
        .iter()
        .enumerate()
        .map(|(p, m)| m.max(&identity.retired(p as u32)))
        .collect();
    Ok(Marks::create_with(dir, &merged)?)
}

/// Continues a restored backup in `dir` as the policy says (see
/// [`crate::backup::continue_restored`]); `None` when `dir` is no backup.
fn continue_restore<S: KvStore + Clone>(
    dir: &Path,
    copy: &EventStore<S>,
    policy: &OpenPolicy,
    identity: &mut Identity,
    marks: &Marks,
) -> Result<Option<crate::backup::Restored>, DataDirError> {
    let retired_of = identity.clone();
    crate::backup::continue_restored(
        dir,
        identity,
        marks,
        |p| plog_end(copy, p, retired_of.retired(p).plog),
        policy.restore.as_ref(),
    )
}

/// Opens a store that has no data directory of ours (a database server): creates the engine's
/// metadata (store ID, partition count, key layout) in a new store, or checks an existing one
/// against the policy. The store's own durability and replication answer for losses there;
/// no identity or marks file is kept.
///
/// # Errors
///
/// [`DataDirError`]: another partition count or key layout, or an engine failure.
pub fn open_database<S: KvStore>(kv: &S, policy: &OpenPolicy) -> Result<Identity, DataDirError> {
    let storage = |source: KvError| DataDirError::Storage {
        dir: PathBuf::from("the database"),
        source,
    };
    let meta = read_meta(kv).map_err(storage)?;
    check_layout(&meta, &[KEY_LAYOUT])?;
    let partitions = meta
        .partitions
        .or(policy.partitions)
        .unwrap_or(policy.default_partitions);
    check_configured(policy, partitions)?;
    let mut identity = Identity::new(partitions, KEY_LAYOUT, FORMAT_VERSION);
    match meta.store_id {
        Some(id) => identity.store_id = id,
        None => {
            // Several nodes may open a new database at once: the first store ID written is
            // the store's, and every other opener reads the store again.
            if !create_meta(kv, &identity).map_err(storage)? {
                return open_database(kv, policy);
            }
        }
    }
    Ok(identity)
}

/// Writes a new store's records (as [`write_meta`]) only if no other opener wrote its store
/// ID first; answers whether it did.
fn create_meta<S: KvStore>(kv: &S, identity: &Identity) -> Result<bool, KvError> {
    let mut batch = WriteBatch::new();
    batch.insert_if_absent(
        Key::new(META_PARTITION, META_STORE_ID),
        identity.store_id.as_bytes(),
    );
    batch.put(
        Key::new(META_PARTITION, META_PARTITIONS),
        &identity.partitions.to_be_bytes(),
    );
    batch.put(
        Key::new(META_PARTITION, META_KEY_LAYOUT),
        &KEY_LAYOUT.to_be_bytes(),
    );
    match kv.write(&batch) {
        Ok(()) => kv.sync().map(|()| true),
        Err(WriteError::Conflict { .. }) => Ok(false),
        Err(e) => Err(KvError::backend(
            "writing the key layout and the store ID",
            e,
        )),
    }
}

fn check_configured(policy: &OpenPolicy, stored: u32) -> Result<(), DataDirError> {
    match policy.partitions {
        Some(configured) if configured != stored => {
            Err(DataDirError::Partitions { stored, configured })
        }
        _ => Ok(()),
    }
}

/// Compares every partition's PLog with its mark; refuses, or accepts and records the losses.
/// Then moves the sequence state of every partition with an accepted loss past it (again,
/// if a crash interrupted that last time).
fn check_losses<S: KvStore + Clone>(
    dir: &Path,
    store: &EventStore<S>,
    policy: &OpenPolicy,
    guarded: &mut DataDir,
) -> Result<(), DataDirError> {
    let (marks, identity) = (&guarded.marks, &guarded.identity);
    let marks = (0..identity.partitions)
        .map(|p| Ok((marks.get(p)?, identity.retired(p))))
        .collect::<Result<Vec<_>, DataDirError>>()?;
    let losses = find_losses(store, &marks).map_err(storage_in(dir))?;
    if !losses.is_empty() {
        if !policy.accept_loss {
            return Err(DataDirError::Lost { losses });
        }
        accept_losses(dir, guarded, losses)?;
    }
    retire_accepted(store, guarded)
}

/// Every partition whose stored PLog lacks the event at its mark (above what accepted losses
/// already retired), with where its PLog ends: `marks[p]` is partition `p`'s mark and what is
/// retired of it. The one search for losses, used when a data directory is opened and when a
/// cluster node starts with `--accept-loss`: a point read per partition, and a few more per
/// lost one ([`plog_end`]).
///
/// # Errors
///
/// The storage failing (a damaged event counts as missing).
pub fn find_losses<S: KvStore + Clone>(
    store: &EventStore<S>,
    marks: &[(Mark, Mark)],
) -> Result<Vec<Loss>, KvError> {
    let mut losses = Vec::new();
    for (p, (mark, retired)) in (0u32..).zip(marks) {
        if mark.plog <= retired.plog || holds(store, p, mark.plog)? {
            continue;
        }
        losses.push(Loss {
            partition: p,
            plog_end: plog_end(store, p, retired.plog)?,
            mark: mark.max(retired),
        });
    }
    Ok(losses)
}

/// Whether the stored PLog of `p` holds a sound event at `offset` (a damaged one ends what can
/// be trusted).
fn holds<S: KvStore + Clone>(store: &EventStore<S>, p: u32, offset: u64) -> Result<bool, KvError> {
    match store.read_event(PartitionId(p), PLogOffset(offset)) {
        Ok(found) => Ok(found.is_some()),
        Err(crate::ReadError::Storage(e)) => Err(e),
        Err(_) => Ok(false),
    }
}

/// The last PLog offset of partition `p` that the store holds above `floor` (an offset known
/// to be retired, or 0; `floor` when it holds none): the events above `floor` are contiguous,
/// so the end is found by point reads at doubling distances, then a binary search between the
/// last held and the first missing one. The one PLog end search: for losses, and for a
/// restored backup's end.
///
/// # Errors
///
/// The storage failing.
pub fn plog_end<S: KvStore + Clone>(
    store: &EventStore<S>,
    p: u32,
    floor: u64,
) -> Result<u64, KvError> {
    let (mut lo, mut step) = (floor, 1u64);
    let mut hi = loop {
        let probe = lo.saturating_add(step);
        if probe == lo || !holds(store, p, probe)? {
            break probe;
        }
        lo = probe;
        step = step.saturating_mul(2);
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if holds(store, p, mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(lo)
}

/// Records `losses` as accepted in the identity, durably, and in the report.
fn accept_losses(dir: &Path, guarded: &mut DataDir, losses: Vec<Loss>) -> Result<(), DataDirError> {
    let at = now_ms();
    for l in &losses {
        guarded.identity.losses.push(l.accepted(at));
    }
    // The decision is durable before anything acts on it.
    guarded.identity.write(dir)?;
    guarded.report.accepted = losses;
    Ok(())
}

/// Moves the sequence state of every partition whose checkpoint is not yet past its retired
/// mark past it.
fn retire_accepted<S: KvStore + Clone>(
    store: &EventStore<S>,
    guarded: &mut DataDir,
) -> Result<(), DataDirError> {
    for p in 0..guarded.identity.partitions {
        let retired = guarded.identity.retired(p);
        if ensure_retired(store.seq_storage(PartitionId(p)), p, retired)? {
            guarded.report.retired_partitions.push(p);
        }
    }
    Ok(())
}

/// Makes sure partition `p`'s stored sequence state is past its retired mark (an accepted
/// loss): when the stored next PLog offset is at or below it (the loss was just accepted, or
/// the storage lost the retirement too), [`retire_partition`] moves it past the mark. True when
/// it had to. Used at open for a data directory, and by the owner of a cluster partition before
/// it serves it (through the partition's fenced store).
///
/// # Errors
///
/// [`DataDirError::Actualize`] when the storage fails or refuses the read or the write.
pub fn ensure_retired<S: KvStore + Clone>(
    seq: crate::PLogSeqStorage<S>,
    p: u32,
    retired: Mark,
) -> Result<bool, DataDirError> {
    if retired.plog == 0 {
        return Ok(false);
    }
    let checkpoint = seq
        .read_next_plog_offset()
        .map_err(|e| DataDirError::Actualize {
            partition: p,
            message: format!("reading the checkpoint: {}", monoseq_kv::chain(&e)),
        })?;
    if checkpoint.0 > retired.plog {
        return Ok(false);
    }
    retire_partition(seq, p, retired)?;
    Ok(true)
}

/// Why a cluster partition's accepted losses are not settled ([`settle_losses`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// A loss was accepted after this process started: it does not know to continue above it.
    #[error(
        "a loss of partition {partition} (PLog offsets up to {plog}) was accepted after this \
         process started; it does not serve the partition until restarted, so that the numbers \
         handed out before the loss stay retired: restart this node"
    )]
    AcceptedLater {
        /// The partition.
        partition: u32,
        /// The highest PLog offset the loss retired.
        plog: u64,
    },
    /// Retiring the loss's numbers in the storage failed (tried again).
    #[error("retiring the numbers of partition {partition}'s accepted loss failed: {source}")]
    Retire {
        /// The partition.
        partition: u32,
        /// What failed.
        #[source]
        source: DataDirError,
    },
}

impl SettleError {
    /// Final for this process: only a restart settles it (a failed retirement is retried).
    #[must_use]
    pub fn needs_restart(&self) -> bool {
        matches!(self, SettleError::AcceptedLater { .. })
    }
}

/// The settle rule, between a cluster partition's lease and its start: `retired` (what every
/// loss accepted for partition `p` retired, as the node knows now) must be covered by `known`
/// (what this process started knowing, its command processor's `retired`), or the partition
/// is not served until a restart; then its numbers are retired in the storage, through `seq`
/// (the partition's fenced store), if the storage lacks that (the write of the node that
/// accepted the loss was lost too). True when it had to.
///
/// # Errors
///
/// [`SettleError`]: a loss accepted after this process started, or the storage failing.
pub fn settle_losses<S: KvStore + Clone>(
    seq: crate::PLogSeqStorage<S>,
    p: u32,
    known: Mark,
    retired: Mark,
) -> Result<bool, SettleError> {
    if !known.covers(&retired) {
        return Err(SettleError::AcceptedLater {
            partition: p,
            plog: retired.plog,
        });
    }
    ensure_retired(seq, p, retired).map_err(|source| SettleError::Retire {
        partition: p,
        source,
    })
}

/// Moves partition `p`'s stored sequence state past an accepted loss: brings its projection up
/// to its PLog end, then sets its next PLog offset to `retired.plog + 1`, so no PLog offset at
/// or below the mark is used again (the sequencer's parameters, [`crate::built_in_params_above`],
/// keep the other numbers above it). Used at open for a data directory, and by a cluster node
/// for a partition of a database that lost acknowledged writes.
///
/// # Errors
///
/// [`DataDirError::Actualize`] when the storage keeps failing or refuses the write.
pub fn retire_partition<S: KvStore + Clone>(
    seq: crate::PLogSeqStorage<S>,
    p: u32,
    retired: Mark,
) -> Result<(), DataDirError> {
    let failed = |message: String| DataDirError::Actualize {
        partition: p,
        message,
    };
    let params = built_in_params([WsKind(1)])
        .build()
        .map_err(|e| failed(monoseq_kv::chain(&e)))?;
    let segments = seq.segments().cloned();
    let seq = Arc::new(seq);
    let (sequencer, mut worker) = Sequencer::new_manual(params, Arc::clone(&seq));
    let mut steps = 0;
    while matches!(sequencer.status(), Status::None | Status::Actualizing) {
        steps += 1;
        match worker.step() {
            Step::RetryAfter(_) if steps >= ACTUALIZE_STEPS_MAX => {
                return Err(failed("the engine keeps failing while actualizing".into()));
            }
            Step::Stopped => return Err(failed("actualization stopped".into())),
            _ => {}
        }
    }
    drop(sequencer);
    if let Some(segments) = segments {
        segments
            .retire_to(PartitionId(p), retired.plog)
            .map_err(|e| failed(monoseq_kv::chain(&e)))?;
    }
    seq.write_values_and_next_plog_offset(&[], PLogOffset(retired.plog + 1))
        .map_err(|e| failed(monoseq_kv::chain(&e)))
}

/// Marks rebuilt from what the engine holds: per partition, the PLog end and the highest
/// numbers its events used.
fn scan_marks<S: KvStore + Clone>(
    store: &EventStore<S>,
    partitions: u32,
) -> Result<Vec<Mark>, KvError> {
    let mut marks = Vec::with_capacity(partitions as usize);
    for p in 0..partitions {
        let seq = store.seq_storage(PartitionId(p));
        let mut mark = Mark::default();
        let _ = seq.replay_plog(PLogOffset::FIRST, &mut |e: ReplayedEvent<'_>| {
            mark.plog = e.offset.0;
            for v in e.values {
                let slot = match v.key.seq {
                    s if s == WLOG_OFFSET_SEQUENCE.id => &mut mark.wlog,
                    s if s == CRECORD_ID_SEQUENCE.id => &mut mark.crecord,
                    s if s == OWRECORD_ID_SEQUENCE.id => &mut mark.owrecord,
                    _ => continue,
                };
                *slot = (*slot).max(v.value.0);
            }
            ControlFlow::Continue(())
        });
        marks.push(mark);
    }
    Ok(marks)
}

#[cfg(test)]
mod tests {
    use monoseq_kv::MemoryStore;

    use super::*;

    #[test]
    fn the_plog_end_and_the_losses_are_found_by_point_reads() {
        let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
        assert_eq!(plog_end(&store, 0, 0).expect("end"), 0, "an empty PLog");
        for n in 1..=37u64 {
            let event = crate::conformance::sample_event(n, 1, WsKind(1), n, n);
            store.append(PartitionId(0), &[event]).expect("append");
            assert_eq!(plog_end(&store, 0, 0).expect("end"), n);
        }
        assert_eq!(plog_end(&store, 0, 20).expect("end"), 37, "above a floor");
        assert_eq!(
            plog_end(&store, 0, 40).expect("end"),
            40,
            "nothing above the floor"
        );
        let mark = |plog, wlog| Mark {
            plog,
            wlog,
            ..Mark::default()
        };
        let marks = [
            (mark(50, 50), mark(10, 90)),
            (mark(5, 5), mark(5, 5)),
            (mark(3, 3), Mark::default()),
        ];
        let whole = find_losses(&store, &[(mark(37, 37), Mark::default())]).expect("search");
        assert_eq!(whole, Vec::new(), "the PLog holds its mark");
        let losses = find_losses(&store, &marks).expect("search");
        assert_eq!(
            losses,
            vec![
                Loss {
                    partition: 0,
                    plog_end: 37,
                    mark: mark(50, 90)
                },
                Loss {
                    partition: 2,
                    plog_end: 0,
                    mark: mark(3, 3)
                },
            ],
            "a loss retires what was retired before too; a partition whose mark is retired lost \
             nothing"
        );
        let accepted = losses[0].accepted(7);
        assert_eq!((accepted.plog_from, accepted.plog_to), (38, 50));
    }

    #[test]
    fn a_loss_accepted_after_the_start_is_not_settled_until_a_restart() {
        let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
        let retired = Mark {
            plog: 9,
            ..Mark::default()
        };
        let late = settle_losses(
            store.seq_storage(PartitionId(0)),
            0,
            Mark::default(),
            retired,
        )
        .expect_err("a loss this process does not know");
        assert!(
            late.needs_restart() && late.to_string().contains("restart"),
            "{late}"
        );
        let moved = settle_losses(store.seq_storage(PartitionId(0)), 0, retired, retired);
        assert!(
            moved.expect("settled"),
            "the numbers are retired in the storage"
        );
        let again = settle_losses(store.seq_storage(PartitionId(0)), 0, retired, retired);
        assert!(!again.expect("settled"), "once");
    }

    #[test]
    fn a_store_of_key_layout_1_is_refused_with_what_to_do() {
        let kv = MemoryStore::new();
        // What a server of layout 1 left: the partition count and no layout record.
        kv.put(
            Key::new(META_PARTITION, META_PARTITIONS),
            &4u32.to_be_bytes(),
        )
        .expect("put");
        let err = recorded_partitions(&kv, Path::new("d"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key layout 1") && err.contains("empty data directory"),
            "{err}"
        );
    }

    #[test]
    fn an_empty_store_records_no_partitions_and_a_current_one_its_count() {
        let kv = MemoryStore::new();
        assert_eq!(
            recorded_partitions(&kv, Path::new("d")).expect("empty"),
            None
        );
        let identity = Identity::new(6, KEY_LAYOUT, FORMAT_VERSION);
        write_meta(&kv, &identity).expect("meta");
        assert_eq!(
            recorded_partitions(&kv, Path::new("d")).expect("current"),
            Some(6)
        );
    }

    #[test]
    fn databases_opened_by_several_nodes_at_once_give_every_node_one_store_id() {
        let policy = OpenPolicy {
            default_partitions: 4,
            ..OpenPolicy::default()
        };
        for _ in 0..5 {
            // Every opener has read the store empty before the first one writes.
            let kv = monoseq_kv::FaultyStore::new(MemoryStore::new());
            let read_all = std::sync::Arc::new(std::sync::Barrier::new(4));
            let writes = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
            kv.on_write(move |_| {
                if writes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 4 {
                    read_all.wait();
                }
            });
            let ids: Vec<String> = std::thread::scope(|s| {
                let opens: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| open_database(&kv, &policy).expect("open").store_id))
                    .collect();
                opens.into_iter().map(|h| h.join().expect("join")).collect()
            });
            assert!(ids.iter().all(|id| *id == ids[0]), "{ids:?}");
        }
    }
}
