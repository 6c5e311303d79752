//! The data directory's own files (identity and high-water marks) and the engine's metadata
//! records: reading them without judging ([`DirFiles::read`]), then checking them against each
//! other before the logs are read, and the marks against the PLogs after.

use std::path::Path;

use monoseq_kv::{Key, KvStore};
use monoseq_store::{
    FORMAT_VERSION, Identity, IdentityError, KEY_LAYOUT, KEY_LAYOUT_CHUNKS, KEY_LAYOUT_SEGMENTS,
    Mark, Marks, MarksError,
};

use crate::keys;
use crate::problem::{DirFile, Problem};
use crate::state::{PartitionState, Problems};

/// The data directory's files as read, errors included: verification reports a missing or
/// damaged file as a problem instead of stopping.
#[derive(Debug)]
pub struct DirFiles {
    /// The identity file: `Ok(None)` when there is none.
    pub identity: Result<Option<Identity>, IdentityError>,
    /// The marks, one per partition: `Ok(None)` when there is no marks file.
    pub marks: Result<Option<Vec<Mark>>, MarksError>,
}

impl DirFiles {
    /// Reads the identity and marks files of `dir`. The marks file is read for the identity's
    /// partition count, or `partitions` (the engine's) when there is no readable identity.
    ///
    /// Reading the marks opens the file for writing (that is how `monoseq_store::Marks` opens
    /// it) but writes nothing; call this on a snapshot when even that must not happen.
    #[must_use]
    pub fn read(dir: &Path, partitions: Option<u32>) -> DirFiles {
        let identity = Identity::read(dir);
        let count = identity
            .as_ref()
            .ok()
            .and_then(|i| i.as_ref().map(|i| i.partitions))
            .or(partitions);
        let marks = match count {
            Some(n) => Marks::open(dir, n).map(|m| m.map(|m| m.all())),
            None if Marks::path(dir).exists() => Err(MarksError::Damaged {
                path: Marks::path(dir),
                reason: "no partition count to read it with (no identity, no engine metadata)"
                    .into(),
            }),
            None => Ok(None),
        };
        DirFiles { identity, marks }
    }
}

/// What the engine records about itself under `monoseq/meta`.
#[derive(Debug, Default)]
pub(crate) struct EngineMeta {
    pub(crate) partitions: Option<u32>,
    pub(crate) key_layout: Option<u32>,
    pub(crate) store_id: Option<String>,
}

/// Reads the engine's metadata; damaged records are reported and read as absent.
pub(crate) fn read_meta(kv: &impl KvStore, problems: &mut Problems) -> EngineMeta {
    let mut get = |name: &'static str, clustering: &[u8]| -> Option<Vec<u8>> {
        match kv.get(Key::new(keys::META_PARTITION, clustering)) {
            Ok(v) => v,
            Err(e) => {
                problems.unreadable(format!("the engine's metadata record `{name}`"), &e);
                None
            }
        }
    };
    let partitions = get("partitions", keys::META_PARTITIONS);
    let key_layout = get("key_layout", keys::META_KEY_LAYOUT);
    let store_id = get("store_id", keys::META_STORE_ID);
    let mut be32 = |key: &'static str, v: Option<Vec<u8>>| {
        let v = v?;
        match <[u8; 4]>::try_from(v.as_slice()) {
            Ok(b) => Some(u32::from_be_bytes(b)),
            Err(_) => {
                problems.push(Problem::MetaDamaged { key, len: v.len() });
                None
            }
        }
    };
    EngineMeta {
        partitions: be32("partitions", partitions),
        key_layout: be32("key_layout", key_layout),
        store_id: store_id.map(|v| String::from_utf8_lossy(&v).into_owned()),
    }
}

fn inconsistent(
    what: &'static str,
    a_name: &'static str,
    a: impl ToString,
    b_name: &'static str,
    b: impl ToString,
) -> Problem {
    Problem::Inconsistent {
        what,
        a_name,
        a: a.to_string(),
        b_name,
        b: b.to_string(),
    }
}

/// The key layouts this build reads: 3 (the PLog in the key-value store), 4 (the PLog in
/// segment files) and 5 (as 4, the WLog entries and created records' references in chunks).
const LAYOUTS_READ: &str = "3, 4 or 5";

/// Whether this build reads key layout `layout`.
fn reads(layout: u32) -> bool {
    layout == KEY_LAYOUT || layout == KEY_LAYOUT_SEGMENTS || layout == KEY_LAYOUT_CHUNKS
}

/// Whether the engine's data is in a key layout this build reads; reports it if not (then
/// nothing else can be read).
pub(crate) fn check_layout(meta: &EngineMeta, problems: &mut Problems) -> bool {
    match meta.key_layout.or(meta.partitions.map(|_| 1)) {
        Some(stored) if !reads(stored) => {
            problems.push(inconsistent(
                "key layout",
                "the engine",
                stored,
                "this build",
                LAYOUTS_READ,
            ));
            false
        }
        _ => true,
    }
}

/// The key layout to read the store in: the engine's, else the identity's, else 4 when the
/// store's segment files were given (`segments`), else 3; `None` when it is one this build
/// does not read (reported by [`check_layout`] or [`check_identity`]). A layout 5 store that
/// records its layout nowhere is read as layout 4: its chunks are not read, and its WLog
/// entries and created records are reported missing.
pub(crate) fn layout(
    meta: &EngineMeta,
    identity: Option<&Identity>,
    segments: bool,
) -> Option<u32> {
    let fallback = if segments {
        KEY_LAYOUT_SEGMENTS
    } else {
        KEY_LAYOUT
    };
    let layout = meta
        .key_layout
        .or(identity.map(|i| i.key_layout))
        .unwrap_or(fallback);
    reads(layout).then_some(layout)
}

/// The identity file when it is readable; a problem when it is unreadable, or missing while
/// the engine names a store.
fn readable_identity<'f>(
    files: &'f DirFiles,
    meta: &EngineMeta,
    problems: &mut Problems,
) -> Option<&'f Identity> {
    match &files.identity {
        Err(e) => {
            problems.push(Problem::FileUnreadable {
                file: DirFile::Identity,
                message: e.to_string(),
            });
            None
        }
        Ok(None) => {
            if let Some(store_id) = &meta.store_id {
                problems.push(Problem::FileMissing {
                    file: DirFile::Identity,
                    store_id: store_id.clone(),
                });
            }
            None
        }
        Ok(Some(i)) => Some(i),
    }
}

/// Checks the identity against the engine; returns the identity when it is readable.
pub(crate) fn check_identity<'f>(
    files: &'f DirFiles,
    meta: &EngineMeta,
    problems: &mut Problems,
) -> Option<&'f Identity> {
    let identity = readable_identity(files, meta, problems)?;
    if meta.store_id.as_deref() != Some(identity.store_id.as_str()) {
        problems.push(Problem::ForeignEngine {
            identity: identity.store_id.clone(),
            engine: meta.store_id.clone(),
        });
    }
    if let Some(p) = meta.partitions
        && p != identity.partitions
    {
        problems.push(inconsistent(
            "partition count",
            "the engine",
            p,
            "the identity file",
            identity.partitions,
        ));
    }
    if !reads(identity.key_layout) {
        problems.push(inconsistent(
            "key layout",
            "the identity file",
            identity.key_layout,
            "this build",
            LAYOUTS_READ,
        ));
    } else if let Some(engine) = meta.key_layout
        && engine != identity.key_layout
    {
        problems.push(inconsistent(
            "key layout",
            "the engine",
            engine,
            "the identity file",
            identity.key_layout,
        ));
    }
    if identity.event_format != FORMAT_VERSION {
        problems.push(inconsistent(
            "event format",
            "the identity file",
            identity.event_format,
            "this build",
            FORMAT_VERSION,
        ));
    }
    Some(identity)
}

/// Checks the marks file is there and readable; returns the marks when they are.
pub(crate) fn check_marks<'f>(
    files: &'f DirFiles,
    identity: Option<&Identity>,
    meta: &EngineMeta,
    problems: &mut Problems,
) -> Option<&'f [Mark]> {
    match &files.marks {
        Err(e) => {
            problems.push(Problem::FileUnreadable {
                file: DirFile::Marks,
                message: e.to_string(),
            });
            None
        }
        Ok(None) => {
            let store_id = identity
                .map(|i| i.store_id.clone())
                .or_else(|| meta.store_id.clone());
            if let Some(store_id) = store_id {
                problems.push(Problem::FileMissing {
                    file: DirFile::Marks,
                    store_id,
                });
            }
            None
        }
        Ok(Some(m)) => Some(m),
    }
}

/// Marks are lower bounds: each partition's PLog must reach its mark, unless an accepted loss
/// retired what is missing. Being ahead of a mark is fine (a crash between the engine's write
/// and the mark's). A partition whose PLog could not be read is left out: it is reported
/// unreadable, and how far it goes is unknown.
pub(crate) fn check_against_marks(
    marks: &[Mark],
    partitions: &[PartitionState],
    problems: &mut Problems,
) {
    for (p, (mark, part)) in marks.iter().zip(partitions).enumerate() {
        if part.plog_unreadable {
            continue;
        }
        let found = [part.plog_last, part.max[0], part.max[1], part.max[2]];
        let marked = [mark.plog, mark.wlog, mark.crecord, mark.owrecord];
        let retired = [
            part.retired.plog,
            part.retired.wlog,
            part.retired.crecord,
            part.retired.owrecord,
        ];
        let names = ["events", "WLog offsets", "CRecord IDs", "OWRecord IDs"];
        // One problem per partition: the first field short of its mark.
        if let Some(i) = (0..4).find(|&i| found[i] < marked[i] && marked[i] > retired[i]) {
            problems.push(Problem::BelowMark {
                partition: p as u32,
                what: names[i],
                found: found[i],
                mark_value: marked[i],
                mark: *mark,
            });
        }
    }
}
