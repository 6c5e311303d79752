//! monoseq-verify: reads a whole monoseq store and reports every broken invariant, changing
//! nothing. [`Verifier`] works on any [`KvStore`]: the engine's metadata and the data directory's
//! identity and marks ([`DirFiles`]), every PLog block of every partition (past gaps), or in key
//! layouts 4 and 5 every page of its segment files and its applied end
//! ([`Verifier::segments_in`]), the numbers each event uses (invariants 1–5 and 10 of
//! docs/invariants.md), each event's WLog entry, the records table and the stored projection.
//! In key layout 5 (the index in chunks) the WLog entries and created records' references are
//! read from their chunks, each chunk checked to decode and hold the run its key names, each
//! entry against its event as a layout 4 entry or reference is; the events at or above a
//! partition's indexed end (at most its applied end) are expected in no chunk, as the server
//! holds their entries in memory only. [`verify_data_dir`] does it for a data directory of the
//! embedded engine without ever opening the engine on it: it works on a [`Snapshot`] copy.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use monoseq_core::{PLogOffset, WsId, WsKind};
//! use monoseq_kv::{KvStore, MemoryStore};
//! use monoseq_store::{AppId, Event, EventStore, PartitionId, TrustLevel, WLogOffset};
//! use monoseq_verify::Verifier;
//!
//! let kv = Arc::new(MemoryStore::new());
//! let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
//! let event = |plog, wlog| Event {
//!     plog_offset: PLogOffset(plog),
//!     ws: WsId(7),
//!     ws_kind: WsKind(1),
//!     wlog_offset: WLogOffset(wlog),
//!     registered_at_ms: 0,
//!     command: "app.Ping".into(),
//!     argument: None,
//!     created: vec![],
//!     updated: vec![],
//!     idempotency: None,
//! };
//! store.append(PartitionId(0), &[event(1, 1), event(2, 2)])?;
//! let report = Verifier::new(&kv, AppId(1)).partitions(1).run(&mut |_| {});
//! assert!(report.is_ok(), "{:?}", report.problems);
//!
//! // Lose the first event: the gap is found, the WLog offsets the PLog holds start at 2, and
//! // the WLog entry of the lost event belongs to no event.
//! kv.delete(store.plog_key(PartitionId(0), PLogOffset(1)).as_key())?;
//! let report = Verifier::new(&kv, AppId(1)).partitions(1).run(&mut |_| {});
//! let kinds: Vec<_> = report.problems.iter().map(|p| p.kind()).collect();
//! assert_eq!(kinds, ["plog-gap", "wlog-offset-skipped", "wlog-orphan"]);
//! println!("{}", report.problems[0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used))]
#![cfg_attr(not(test), warn(clippy::expect_used))]

mod chunks;
mod files;
mod keys;
mod listing;
mod passes;
mod plog;
mod problem;
mod record;
mod snapshot;
mod source;
mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::path::Path;

use monoseq_kv::{FjallStore, Key, KvStore};
use monoseq_store::{AppId, Identity, KEY_LAYOUT_CHUNKS, Mark, keeps_segments};

pub use files::DirFiles;
pub use listing::{ListError, PartitionList};
pub use plog::PLOG_EMPTY_BLOCKS_PROBED;
pub use problem::{ChunkTable, DirFile, Problem, Sequence};
pub use snapshot::{Snapshot, SnapshotError};

use crate::plog::PLogPass;
use crate::source::Source;
use crate::state::{PartitionState, Problems, State};

/// Problems a [`Report`] lists by default; the rest are only counted.
pub const PROBLEMS_MAX_DEFAULT: usize = 10_000;

/// Where verification is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Stage {
    /// Reading a partition's PLog; `done` counts events over all partitions so far.
    PLog {
        /// The partition being read.
        partition: u32,
        /// How many there are.
        partitions: u32,
    },
    /// Reading WLog blocks for entries no event names; `done` counts blocks (in key layout 5,
    /// workspaces whose WLog chunks were read).
    WLog,
    /// Reading records blocks; `done` counts blocks (in key layout 5, first the workspaces'
    /// buckets whose records chunks were read, then the blocks).
    Records,
    /// Reading numbers blocks; `done` counts blocks.
    Numbers,
}

/// A progress report, sent every few thousand items and at the end of each stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The stage.
    pub stage: Stage,
    /// Items done in this stage.
    pub done: u64,
    /// Items in this stage, when known.
    pub total: Option<u64>,
}

/// What verification found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Report {
    /// The problems found, in the order found, up to the configured maximum.
    pub problems: Vec<Problem>,
    /// How many problems were found in all.
    pub problems_total: u64,
    /// Partitions read.
    pub partitions: u32,
    /// PLog entries read.
    pub events: u64,
    /// Workspaces the events name.
    pub workspaces: u64,
    /// Records the events create or update.
    pub records: u64,
    /// Stored numbers read.
    pub numbers: u64,
    /// Whether a [`PartitionList`] said which blocks exist, so that entries of workspaces no
    /// event names were searched too.
    pub listed: bool,
}

impl Report {
    /// Whether nothing is wrong.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems_total == 0
    }
}

/// Verification of one application's store; configure, then [`run`](Verifier::run).
#[derive(Debug)]
pub struct Verifier<'a, S> {
    kv: &'a S,
    app: AppId,
    files: Option<&'a DirFiles>,
    list: Option<&'a PartitionList>,
    segments: Option<&'a Path>,
    partitions: Option<u32>,
    problems_max: usize,
}

impl<'a, S: KvStore> Verifier<'a, S> {
    /// Verification of `app`'s data in `kv`.
    pub fn new(kv: &'a S, app: AppId) -> Verifier<'a, S> {
        Verifier {
            kv,
            app,
            files: None,
            list: None,
            segments: None,
            partitions: None,
            problems_max: PROBLEMS_MAX_DEFAULT,
        }
    }

    /// Also checks the data directory's identity and marks, and honours the losses the
    /// identity records as accepted.
    #[must_use]
    pub fn files(mut self, files: &'a DirFiles) -> Self {
        self.files = Some(files);
        self
    }

    /// Reads the blocks `list` names (and only those) instead of following the PLogs, so that
    /// entries of workspaces no event names are found too.
    #[must_use]
    pub fn partition_list(mut self, list: &'a PartitionList) -> Self {
        self.list = Some(list);
        self
    }

    /// The data directory the store is in: a store in key layout 4 or 5
    /// ([`monoseq_store::KEY_LAYOUT_SEGMENTS`], [`monoseq_store::KEY_LAYOUT_CHUNKS`]) keeps its
    /// PLogs in segment files under its `plog/`, read from there (opened read-only: nothing
    /// is cut or created). A store in layout 3 is read from the key-value store alone.
    #[must_use]
    pub fn segments_in(mut self, dir: &'a Path) -> Self {
        self.segments = Some(dir);
        self
    }

    /// The partition count to use when neither the engine nor the identity records one.
    #[must_use]
    pub fn partitions(mut self, partitions: u32) -> Self {
        self.partitions = Some(partitions);
        self
    }

    /// Most problems the report lists (the rest are counted).
    #[must_use]
    pub fn problems_max(mut self, max: usize) -> Self {
        self.problems_max = max;
        self
    }

    /// Reads everything and reports every problem found; never writes. Storage faults are
    /// problems too ([`Problem::Unreadable`]): what they cover is left unverified and the rest
    /// is still read.
    pub fn run(&self, progress: &mut dyn FnMut(Progress)) -> Report {
        let mut problems = Problems::new(self.problems_max);
        let mut report = Report {
            listed: self.list.is_some(),
            ..Report::default()
        };
        let Some(known) = self.read_files(&mut problems) else {
            return finish(report, problems);
        };
        report.partitions = known.partitions;
        let src = Source {
            kv: self.kv,
            app: self.app,
            list: self.list,
            segments: known.segments,
            chunked: known.chunked,
        };
        let mut state = self.initial_state(&known, &mut problems);
        for p in 0..known.partitions {
            PLogPass::new(&src, p, &mut state, &mut problems, progress).run(known.mark_plog(p));
        }
        check_checkpoints(&state, &mut problems);
        if src.segments.is_some() {
            plog::check_applied(&state, &mut problems);
        }
        if src.chunked {
            chunks::check_indexed(&state, &mut problems);
        }
        if let Some(marks) = known.marks {
            files::check_against_marks(marks, &state.partitions, &mut problems);
        }
        report.events = state.events;
        report.workspaces = state.workspaces.len() as u64;
        report.records = state.records.len() as u64;
        let differing = if src.chunked {
            chunks::wlog_chunks(&src, &mut state, &mut problems, progress)
        } else {
            passes::wlog_entries(&src, &mut state, &mut problems, progress)
        };
        if !differing.is_empty() {
            let parts: BTreeSet<u32> = differing
                .iter()
                .filter_map(|ws| state.workspaces.get(ws).map(|w| w.partition))
                .collect();
            for p in parts {
                PLogPass::new(&src, p, &mut state, &mut problems, progress)
                    .comparing(&differing)
                    .run(known.mark_plog(p));
            }
        }
        passes::records(&src, &mut state, &mut problems, progress);
        report.numbers = passes::numbers(&src, &state, &mut problems, progress);
        finish(report, problems)
    }

    /// The engine's metadata, then the identity and marks when the data directory's files
    /// are given, checked against each other; `None` when verification cannot go on (a key
    /// layout it does not know, segment files it was not given, or no partition count
    /// anywhere).
    fn read_files(&self, problems: &mut Problems) -> Option<Known<'a>> {
        let meta = files::read_meta(self.kv, problems);
        if !files::check_layout(&meta, problems) {
            return None;
        }
        let identity = self
            .files
            .and_then(|f| files::check_identity(f, &meta, problems));
        let marks = self
            .files
            .and_then(|f| files::check_marks(f, identity, &meta, problems));
        let layout = files::layout(&meta, identity, self.segments.is_some())?;
        let segments = match (keeps_segments(layout), self.segments) {
            (true, None) => {
                problems.push(Problem::Unreadable {
                    what: "the PLogs".into(),
                    message: format!(
                        "the store keeps them in segment files (key layout {layout}), and no \
                         data directory was given to read them from"
                    ),
                });
                return None;
            }
            (true, dir) => dir,
            (false, _) => None,
        };
        let Some(partitions) = meta
            .partitions
            .or(identity.map(|i| i.partitions))
            .or(self.partitions)
        else {
            problems.push(Problem::NoPartitionCount);
            return None;
        };
        Some(Known {
            partitions,
            identity,
            marks,
            segments,
            chunked: layout == KEY_LAYOUT_CHUNKS,
        })
    }

    /// Each partition's checkpoint and accepted losses, before any PLog is read; PLog blocks
    /// the list names for partitions past the count are problems.
    fn initial_state(&self, known: &Known<'_>, problems: &mut Problems) -> State {
        let n = known.partitions;
        let identity = known.identity;
        let partitions = (0..n)
            .map(|p| {
                let checkpoint = read_checkpoint(self.kv, self.app, p, problems);
                let applied = known
                    .segments
                    .and_then(|_| plog::read_applied(self.kv, self.app, p, problems));
                // `None` outside key layout 5; `Some(None)` when damaged or unreadable.
                let indexed = known
                    .chunked
                    .then(|| chunks::read_indexed(self.kv, self.app, p, problems));
                PartitionState {
                    checkpoint,
                    losses: identity.map_or_else(Vec::new, |i| i.losses_of(p).copied().collect()),
                    retired: identity.map(|i| i.retired(p)).unwrap_or_default(),
                    applied,
                    indexed: indexed.flatten(),
                    indexed_unknown: indexed.is_some_and(|i| i.is_none()),
                    ..PartitionState::default()
                }
            })
            .collect();
        if let Some(list) = self.list {
            for &p in list.plog.keys().filter(|&&p| p >= n) {
                problems.push(Problem::PLogUnknownPartition {
                    partition: p,
                    partitions: n,
                });
            }
        }
        if let Some(dir) = known.segments {
            for p in segment_logs_past(dir, n) {
                problems.push(Problem::PLogUnknownPartition {
                    partition: p,
                    partitions: n,
                });
            }
        }
        State {
            partitions,
            ..State::default()
        }
    }
}

/// The partitions past the store's `partitions` whose log directory `dir/plog/` holds (a
/// directory named by a partition number), in order; none when `plog/` cannot be listed (the
/// logs' own reads report what they miss).
fn segment_logs_past(dir: &Path, partitions: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir(dir.join(monoseq_store::PLOG_DIR)) else {
        return Vec::new();
    };
    let mut past: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| p >= partitions)
        .collect();
    past.sort_unstable();
    past
}

/// What the files and the engine's metadata say before any log is read.
struct Known<'f> {
    partitions: u32,
    identity: Option<&'f Identity>,
    marks: Option<&'f [Mark]>,
    /// The data directory whose segment files hold the PLogs (key layouts 4 and 5).
    segments: Option<&'f Path>,
    /// Key layout 5: the WLog entries and created records' references are in chunks.
    chunked: bool,
}

impl Known<'_> {
    /// The PLog offset of `partition`'s high-water mark (0 without marks).
    fn mark_plog(&self, partition: u32) -> u64 {
        self.marks
            .and_then(|m| m.get(partition as usize))
            .map_or(0, |m| m.plog)
    }
}

/// A checkpoint says the stored numbers are exact up to it, so the PLog must reach it (or the
/// numbers an accepted loss retired must). A partition whose PLog could not be read is left
/// out: it is reported unreadable, and how far it goes is unknown.
fn check_checkpoints(state: &State, problems: &mut Problems) {
    for (p, part) in state.partitions.iter().enumerate() {
        let plog_next = (part.plog_last + 1).max(part.retired.plog + 1);
        if part.checkpoint > plog_next && !part.plog_unreadable {
            problems.push(Problem::CheckpointAhead {
                partition: p as u32,
                checkpoint: part.checkpoint,
                plog_next,
            });
        }
    }
}

fn finish(mut report: Report, problems: Problems) -> Report {
    report.problems = problems.list;
    report.problems_total = problems.total;
    report
}

/// The first PLog offset `partition`'s stored numbers do not cover (1 when there is no
/// checkpoint, or when it is damaged, which is reported).
fn read_checkpoint(kv: &impl KvStore, app: AppId, partition: u32, problems: &mut Problems) -> u64 {
    let key = keys::checkpoint(app, partition);
    match kv.get(Key::new(&key, &[])) {
        Ok(None) => 1,
        Ok(Some(v)) => match <[u8; 8]>::try_from(v.as_slice()).map(u64::from_be_bytes) {
            Ok(n) if n >= 1 => n,
            other => {
                problems.push(Problem::CheckpointDamaged {
                    partition,
                    len: v.len(),
                    value: other.ok(),
                });
                1
            }
        },
        Err(e) => {
            problems.unreadable(format!("the checkpoint of partition {partition}"), &e);
            1
        }
    }
}

/// Why a data directory could not be verified at all (problems in its data are in the
/// [`Report`] instead).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyDirError {
    /// The directory could not be copied.
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// The engine could not be opened on the copy.
    #[error("the engine's files are damaged: opening them failed")]
    Open(#[from] monoseq_kv::OpenError),
}

/// Verifies data directory `dir` of the embedded engine (fjall) for `app`, reading a
/// [`Snapshot`] copy so that no byte of `dir` changes, opened once and read-only through the kv
/// crate (the same open a server's reads go through), with a [`PartitionList`] of the copy so
/// that every block is read, and in key layouts 4 and 5 the copy's segment files. When the
/// engine's keys cannot all be read (damaged files), that is a problem and verification goes
/// on without the list, reporting what each read finds.
/// `partitions` is used only when neither the engine nor the identity records a partition
/// count.
///
/// # Errors
///
/// [`VerifyDirError`] when the directory is missing, not a data directory, in use, or its
/// engine cannot be opened; every other problem is in the [`Report`].
pub fn verify_data_dir(
    dir: &Path,
    app: AppId,
    partitions: Option<u32>,
    progress: &mut dyn FnMut(Progress),
) -> Result<Report, VerifyDirError> {
    let snapshot = Snapshot::copy(dir)?;
    let kv = FjallStore::open_read_only(snapshot.path(), monoseq_kv::Options::default())?;
    let list = PartitionList::from_store(&kv, app);
    let engine_partitions = monoseq_store::recorded_partitions(&kv, dir).ok().flatten();
    let files = DirFiles::read(snapshot.path(), engine_partitions);
    let mut verifier = Verifier::new(&kv, app)
        .files(&files)
        .segments_in(snapshot.path());
    if let Ok(list) = &list {
        verifier = verifier.partition_list(list);
    }
    if let Some(p) = partitions {
        verifier = verifier.partitions(p);
    }
    let mut report = verifier.run(progress);
    if let Err(e) = list {
        report.problems.insert(
            0,
            Problem::Unreadable {
                what: "the engine's keys (verified without a list of its blocks)".into(),
                message: e.to_string(),
            },
        );
        report.problems_total += 1;
    }
    drop(kv);
    drop(snapshot);
    Ok(report)
}
