//! High-water marks (`monoseq.marks`): per partition, the highest acknowledged PLog offset and
//! the highest WLog offset and record IDs handed out with acknowledged events, kept outside the
//! engine and made durable before the acknowledgement they cover. A store whose PLog ends below
//! its mark lost acknowledged events (a cut journal, lost files, a rolled-back copy); the mark
//! also says which numbers must never be handed out again if that loss is accepted.
//!
//! The file's layout, creating and reading it: `marks/file.rs`. Raises sharing one store sync
//! and one `fdatasync` (group commit): `marks/cycle.rs`.

mod cycle;
mod file;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex};

use monoseq_kv::KvError;

use serde::{Deserialize, Serialize};

use cycle::Cycles;
pub use cycle::{GATHER_MAX, GroupBegun};
pub use file::MARKS_FILE;

/// The high-water mark of one partition. Every field only grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Highest acknowledged PLog offset (0: none).
    pub plog: u64,
    /// Highest WLog offset of an acknowledged event, over the partition's workspaces.
    pub wlog: u64,
    /// Highest CRecord ID created by an acknowledged event.
    pub crecord: u64,
    /// Highest ORecord/WRecord ID created by an acknowledged event.
    pub owrecord: u64,
}

impl Mark {
    /// The field-wise maximum.
    #[must_use]
    pub fn max(&self, other: &Mark) -> Mark {
        Mark {
            plog: self.plog.max(other.plog),
            wlog: self.wlog.max(other.wlog),
            crecord: self.crecord.max(other.crecord),
            owrecord: self.owrecord.max(other.owrecord),
        }
    }

    /// Whether every field of `self` is at least `other`'s.
    #[must_use]
    pub fn covers(&self, other: &Mark) -> bool {
        self.max(other) == *self
    }
}

/// The mark a partition's writer starts from: `file` (the marks file, raised with what other
/// nodes acknowledged) and `acked` (what this process acknowledged since, kept while the
/// partition was released), field by field the higher, so no number either covers is handed
/// out again. Used by the command processor and the simulation alike.
#[must_use]
pub fn start_mark(file: Mark, acked: Mark) -> Mark {
    file.max(&acked)
}

/// The marks file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MarksError {
    /// An I/O call failed.
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
    /// The file is not a valid marks file for this store.
    #[error(
        "high-water marks file {path} is damaged ({reason}); the store cannot prove it holds \
         every acknowledged event: restore the data directory from a backup, or start with \
         --accept-loss to rebuild the marks from what the engine holds"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A partition outside the file.
    #[error("partition {partition} is not in the marks file ({partitions} partitions)")]
    NoSuchPartition {
        /// The partition asked for.
        partition: u32,
        /// Partitions in the file.
        partitions: u32,
    },
    /// The store's sync that must precede the raise failed (this caller ran it): nothing of
    /// the cycle was raised.
    #[error("syncing the store before raising the high-water marks failed")]
    Store(#[source] KvError),
    /// The cycle this raise waited for failed in another caller (its store sync, write or
    /// `fdatasync`): nothing of the cycle may be durable.
    #[error("the sync shared with other partitions' raises failed: {reason}")]
    Shared {
        /// The leader's error, as text.
        reason: String,
    },
}

/// The open marks file of a data directory.
#[derive(Debug)]
pub struct Marks {
    path: PathBuf,
    file: File,
    /// Newest copy per partition: its sequence number and mark (durable once its cycle ended).
    slots: Mutex<Vec<(u64, Mark)>>,
    /// Set from a slot's write until a sync covers it (a failed cycle leaves it set).
    unsynced: AtomicBool,
    cycles: Mutex<Cycles>,
    /// Signalled when a cycle ends: the raises of cycles of even numbers wait on the first,
    /// those of odd ones on the second, so that a cycle's end wakes its own raises and not
    /// those waiting for the next cycle (of which it wakes one, to lead it).
    cycle_ended: [Condvar; 2],
    /// Signalled when an announced group raises or ends without raising.
    group_settled: Condvar,
    /// The longest a leader waits for announced groups, in microseconds ([`GATHER_MAX`]
    /// unless set).
    gather_us: AtomicU64,
}

impl Marks {
    /// The path of the marks file in `dir`.
    #[must_use]
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(MARKS_FILE)
    }

    /// Partitions in the file.
    #[must_use]
    pub fn partitions(&self) -> u32 {
        self.lock().len() as u32
    }

    /// The mark of `partition` as last raised.
    ///
    /// # Errors
    ///
    /// [`MarksError::NoSuchPartition`] for a partition outside the file.
    pub fn get(&self, partition: u32) -> Result<Mark, MarksError> {
        let slots = self.lock();
        slots
            .get(partition as usize)
            .map(|(_, m)| *m)
            .ok_or(MarksError::NoSuchPartition {
                partition,
                partitions: slots.len() as u32,
            })
    }

    /// Every partition's mark.
    #[must_use]
    pub fn all(&self) -> Vec<Mark> {
        self.lock().iter().map(|(_, m)| *m).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Mark)>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::Mark;

    #[test]
    fn a_writer_starts_above_every_number_the_file_or_this_process_covers() {
        let file = Mark {
            plog: 9,
            wlog: 3,
            crecord: 7,
            owrecord: 0,
        };
        let acked = Mark {
            plog: 8,
            wlog: 5,
            crecord: 2,
            owrecord: 4,
        };
        let start = super::start_mark(file, acked);
        assert!(start.covers(&file) && start.covers(&acked), "{start:?}");
        assert_eq!(start, file.max(&acked));
    }

    /// A mark whose fields all differ, from its PLog offset.
    pub(super) fn mark(plog: u64) -> Mark {
        Mark {
            plog,
            wlog: plog / 2,
            crecord: 100 + plog,
            owrecord: 200 + plog,
        }
    }
}
