//! Backups of a data directory: the stamp a backup carries (`monoseq.backup`), and what
//! starting on a restored copy takes. A copy holds the numbers of its own, older instant; the
//! store it was taken from went on acknowledging after it. Served as-is, the copy would hand
//! those numbers out again, so a stamped directory is refused until the operator says how far
//! the store got: its live marks (`--marks-from`) or a margin (`--skip-ahead`). Then every
//! number up to there is retired, as an accepted loss is, and the stamp is removed.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::identity::{AcceptedLoss, Identity, now_ms, sync_dir};
use crate::marks::{MARKS_FILE, Mark, Marks, MarksError};

/// The stamp's file name inside a backup.
pub const BACKUP_FILE: &str = "monoseq.backup";
/// The stamp format this build writes and reads.
pub const BACKUP_FORMAT: u32 = 1;

/// The stamp of a backup: which store it copies, when, and the marks it was taken with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupStamp {
    /// Version of this file's format.
    pub format: u32,
    /// The store copied.
    pub store_id: String,
    /// Its partition count.
    pub partitions: u32,
    /// When the copy's instant was fixed (Unix milliseconds).
    pub taken_at_ms: u64,
    /// Every partition's high-water mark at that instant (also the copy's marks file).
    pub marks: Vec<Mark>,
}

/// How an operator continues a restored backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// The live marks: a marks file, or a data directory holding one, of the store the
    /// backup was taken from (`--marks-from`).
    MarksFrom(PathBuf),
    /// Every sequence of every partition continues this far above the backup's marks
    /// (`--skip-ahead`).
    SkipAhead(u64),
}

/// A backup stamp or live marks could not be read, or a restored backup is not served yet.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// Reading or writing a file failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The stamp is not a valid one.
    #[error("backup stamp {path} is damaged ({reason})")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The live marks cannot be used.
    #[error("the live marks {path} cannot be used: {reason}")]
    LiveMarks {
        /// What was given.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// A restored backup, and no word on how far the store got after it.
    #[error(
        "{dir} is a restored backup of store {store_id}, taken {age} ago (Unix ms {taken_at_ms}; \
         PLog marks then: {marks}). The store it was taken from may have acknowledged commands \
         after that, and serving this copy as-is would hand their numbers out again. Start it once with \
         `--marks-from PATH`, PATH being the {MARKS_FILE} file (or the data directory) of the \
         machine the backup was taken from, to continue above everything it acknowledged; or, \
         if that file is lost, with `--skip-ahead N`: every sequence of every partition then \
         continues N above the backup's marks, so choose N above what any partition can have \
         handed out since the backup (commands per second times seconds since, times the \
         records per command). --accept-loss does not apply here"
    )]
    NotContinued {
        /// The data directory.
        dir: PathBuf,
        /// The store.
        store_id: String,
        /// How long ago, in words.
        age: String,
        /// When it was taken.
        taken_at_ms: u64,
        /// Each partition's PLog mark at the backup, comma separated.
        marks: String,
    },
}

impl BackupStamp {
    /// The stamp's path in `dir`.
    #[must_use]
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(BACKUP_FILE)
    }

    /// The stamp of `dir`, if it is a backup.
    ///
    /// # Errors
    ///
    /// [`BackupError`] when the stamp cannot be read or is damaged.
    pub fn read(dir: &Path) -> Result<Option<BackupStamp>, BackupError> {
        let path = BackupStamp::path(dir);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(BackupError::Io {
                    what: "reading",
                    path,
                    source,
                });
            }
        };
        let stamp: BackupStamp =
            serde_json::from_slice(&text).map_err(|e| BackupError::Damaged {
                path: path.clone(),
                reason: monoseq_kv::chain(&e),
            })?;
        if stamp.format != BACKUP_FORMAT || stamp.marks.len() != stamp.partitions as usize {
            return Err(BackupError::Damaged {
                path,
                reason: format!(
                    "format {} with {} marks for {} partitions",
                    stamp.format,
                    stamp.marks.len(),
                    stamp.partitions
                ),
            });
        }
        Ok(Some(stamp))
    }

    /// Writes the stamp into `dir`, durably.
    ///
    /// # Errors
    ///
    /// [`BackupError::Io`] when writing or syncing failed.
    pub fn write(&self, dir: &Path) -> Result<(), BackupError> {
        let path = BackupStamp::path(dir);
        let io = |what: &'static str| {
            let path = path.clone();
            move |source| BackupError::Io { what, path, source }
        };
        let mut text = serde_json::to_string_pretty(self).unwrap_or_default();
        text.push('\n');
        let mut file = std::fs::File::create(&path).map_err(io("creating"))?;
        file.write_all(text.as_bytes()).map_err(io("writing"))?;
        file.sync_all().map_err(io("syncing"))?;
        sync_dir(dir).map_err(io("syncing the directory of"))
    }
}

/// What continuing a restored backup did, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Restored {
    /// When the backup was taken (Unix milliseconds).
    pub taken_at_ms: u64,
    /// How the operator continued it, in words.
    pub how: String,
    /// Per partition retired: the partition, the copy's PLog end, and the mark up to which
    /// every number is retired.
    pub retired: Vec<(u32, u64, Mark)>,
}

/// The live marks named by `--marks-from`: a marks file, or a data directory holding one
/// (whose identity, if any, must name `store_id`).
fn live_marks(path: &Path, store_id: &str, partitions: u32) -> Result<Vec<Mark>, BackupError> {
    let refused = |reason: String| BackupError::LiveMarks {
        path: path.to_path_buf(),
        reason,
    };
    let (file, dir) = if path.is_dir() {
        (path.join(MARKS_FILE), path.to_path_buf())
    } else {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        (path.to_path_buf(), dir)
    };
    if !file.exists() {
        return Err(refused(format!("{} does not exist", file.display())));
    }
    if let Ok(Some(identity)) = Identity::read(&dir)
        && identity.store_id != store_id
    {
        return Err(refused(format!(
            "they belong to store {}, the backup to store {store_id}",
            identity.store_id
        )));
    }
    Marks::read_file(&file, partitions).map_err(|e: MarksError| refused(monoseq_kv::chain(&e)))
}

fn plus(mark: &Mark, n: u64) -> Mark {
    Mark {
        plog: mark.plog.saturating_add(n),
        wlog: mark.wlog.saturating_add(n),
        crecord: mark.crecord.saturating_add(n),
        owrecord: mark.owrecord.saturating_add(n),
    }
}

/// How long ago `ms` was, in words.
fn age(ms: u64) -> String {
    let s = now_ms().saturating_sub(ms) / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, (s % 3600) / 60),
        _ => format!("{} days {} h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// Continues a restored backup in `dir` as `restore` says, or refuses it when `restore` is
/// `None`: records, per partition the copy may not cover, a loss from the copy's PLog end
/// (`plog_ends`) up to the live mark (or the backup's mark plus the margin), durably in the
/// identity, raises the marks to it, then removes the stamp. The caller's loss check then
/// retires every number up to it. `Ok(None)` when `dir` is no backup.
pub(crate) fn continue_restored(
    dir: &Path,
    identity: &mut Identity,
    marks: &Marks,
    plog_ends: impl Fn(u32) -> Result<u64, monoseq_kv::KvError>,
    restore: Option<&Restore>,
) -> Result<Option<Restored>, crate::DataDirError> {
    let Some(stamp) = BackupStamp::read(dir)? else {
        return Ok(None);
    };
    check_stamp(&stamp, identity)?;
    let Some(restore) = restore else {
        return Err(not_continued(dir, stamp).into());
    };
    let (targets, how) = restore_targets(restore, &stamp, identity)?;
    let retired = accept_restore_losses(identity, marks, &stamp, &targets, plog_ends)?;
    // The decision is durable before anything acts on it; the stamp goes last, so a crash in
    // between asks again (and retiring again changes nothing).
    identity.write(dir)?;
    for (p, _, mark) in &retired {
        marks.raise(*p, mark)?;
    }
    remove_stamp(dir)?;
    Ok(Some(Restored {
        taken_at_ms: stamp.taken_at_ms,
        how,
        retired,
    }))
}

/// Refuses a stamp of another store or partition count than the identity's.
fn check_stamp(stamp: &BackupStamp, identity: &Identity) -> Result<(), crate::DataDirError> {
    if stamp.store_id != identity.store_id || stamp.partitions != identity.partitions {
        return Err(crate::DataDirError::Inconsistent(format!(
            "the backup stamp names store {} with {} partitions, the identity store {} with {}",
            stamp.store_id, stamp.partitions, identity.store_id, identity.partitions
        )));
    }
    Ok(())
}

/// The refusal of a restored backup started without `--marks-from` or `--skip-ahead`.
fn not_continued(dir: &Path, stamp: BackupStamp) -> BackupError {
    BackupError::NotContinued {
        dir: dir.to_path_buf(),
        store_id: stamp.store_id,
        age: age(stamp.taken_at_ms),
        taken_at_ms: stamp.taken_at_ms,
        marks: stamp
            .marks
            .iter()
            .map(|m| m.plog.to_string())
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// The mark every partition's numbers are retired up to, as `restore` says, and how, in
/// words.
fn restore_targets(
    restore: &Restore,
    stamp: &BackupStamp,
    identity: &Identity,
) -> Result<(Vec<Mark>, String), BackupError> {
    Ok(match restore {
        Restore::MarksFrom(path) => (
            live_marks(path, &identity.store_id, identity.partitions)?,
            format!("with the live marks of {}", path.display()),
        ),
        Restore::SkipAhead(n) => (
            stamp.marks.iter().map(|m| plus(m, *n)).collect(),
            format!("{n} ahead of the backup's marks (--skip-ahead {n})"),
        ),
    })
}

/// Records in `identity` (not yet durably) a loss for every partition whose copy does not
/// cover its target: from the copy's PLog end up to the target. Answers, per such partition,
/// the partition, its PLog end and the mark retired up to.
fn accept_restore_losses(
    identity: &mut Identity,
    marks: &Marks,
    stamp: &BackupStamp,
    targets: &[Mark],
    plog_ends: impl Fn(u32) -> Result<u64, monoseq_kv::KvError>,
) -> Result<Vec<(u32, u64, Mark)>, crate::DataDirError> {
    let at = now_ms();
    let mut retired = Vec::new();
    for p in 0..identity.partitions {
        let copy = marks.get(p)?.max(&stamp.marks[p as usize]);
        let target = targets[p as usize];
        if copy.covers(&target) {
            // The store acknowledged nothing in this partition after the backup.
            continue;
        }
        let plog_end = plog_ends(p).map_err(|e| crate::DataDirError::Actualize {
            partition: p,
            message: monoseq_kv::chain(&e),
        })?;
        let mut mark = target.max(&copy);
        mark.plog = mark.plog.max(plog_end);
        identity.losses.push(AcceptedLoss {
            partition: p,
            plog_from: plog_end + 1,
            plog_to: mark.plog,
            mark,
            accepted_at_ms: at,
            cause: crate::LossCause::Restore,
        });
        retired.push((p, plog_end, mark));
    }
    Ok(retired)
}

/// Removes the backup stamp of `dir`, durably.
fn remove_stamp(dir: &Path) -> Result<(), BackupError> {
    let path = BackupStamp::path(dir);
    std::fs::remove_file(&path)
        .and_then(|()| sync_dir(dir))
        .map_err(|source| BackupError::Io {
            what: "removing",
            path,
            source,
        })
}
