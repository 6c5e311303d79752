//! The open path and the lifetime the embedded backends share. An engine supplies its
//! [`Files`] (how it opens, creates or recovers its files in a data directory, and how it
//! flushes them); [`Embedded::open`] validates the options, opens the files, keeps the state
//! every embedded store holds beside them ([`Shared`]: durability, flush bookkeeping, the write
//! lock with the per-partition bounds, whether it is read-only) and starts the background
//! flusher; dropping an [`Embedded`] stops the flusher and flushes what was acknowledged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::bounds::Bounds;
use crate::engine;
use crate::error::{KvError, OpenError};
use crate::group_commit::{Commits, Flusher, start_flusher};
use crate::options::{Durability, Options};

/// An engine's files in one data directory: what differs between the embedded backends when
/// they open and flush.
pub(crate) trait Files: Sized + Send + Sync + 'static {
    /// Opens the engine's files in `path`, creating them when absent and recovering them after
    /// a crash. Answers [`OpenError::Locked`] when another store holds them.
    fn open(path: &Path, options: &Options) -> Result<Self, OpenError>;

    /// Makes every committed write durable: one flush to disk.
    fn persist(&self) -> Result<(), KvError>;
}

/// Whether a store accepts writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    ReadWrite,
    /// Every write answers [`KvError::ReadOnly`]; no flusher runs and nothing is flushed on
    /// close.
    ReadOnly,
}

/// What an open embedded store holds beside its engine's files.
pub(crate) struct Shared<F> {
    pub(crate) files: F,
    pub(crate) durability: Durability,
    pub(crate) commits: Commits,
    access: Access,
    /// Serialises the store's writes with its engine's own (conditions are checked and the
    /// batch committed under it) and guards the bounds of the partitions written, which spare
    /// most insert-if-absent lookups.
    write_lock: Mutex<Bounds>,
}

impl<F: Files> Shared<F> {
    /// Makes every acknowledged write durable, sharing one flush between concurrent callers.
    pub(crate) fn sync_now(&self) -> Result<(), KvError> {
        self.commits.sync(|| self.files.persist())
    }

    /// Takes the write lock, which guards the bounds; fails when the store is read-only or
    /// poisoned, before anything is written.
    pub(crate) fn write_lock(&self) -> Result<MutexGuard<'_, Bounds>, KvError> {
        if self.access == Access::ReadOnly {
            return Err(KvError::ReadOnly);
        }
        self.commits.check()?;
        Ok(self
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }

    /// `KvStore::sync` of an embedded store (a read-only one has nothing to flush).
    pub(crate) fn sync(&self) -> Result<(), KvError> {
        if self.access == Access::ReadOnly {
            return Ok(());
        }
        engine::sync(self.durability, &self.commits, || self.sync_now())
    }
}

/// An open embedded store: its engine's files with what [`Shared`] keeps, and its background
/// flusher.
pub(crate) struct Embedded<F: Files> {
    pub(crate) shared: Arc<Shared<F>>,
    /// Stopped before the final flush on drop.
    flusher: Option<Flusher>,
}

impl<F: Files> Embedded<F> {
    /// Opens the store in directory `path`: the one open path of every embedded backend.
    ///
    /// # Errors
    ///
    /// [`OpenError::InvalidOption`] for options out of range; the engine's [`Files::open`]
    /// errors; [`OpenError::Storage`] when the flusher thread cannot start.
    pub(crate) fn open(path: &Path, options: Options, access: Access) -> Result<Self, OpenError> {
        options.validate()?;
        let files = F::open(path, &options)?;
        let durability = match access {
            Access::ReadWrite => options.durability,
            Access::ReadOnly => Durability::Manual,
        };
        let shared = Arc::new(Shared {
            files,
            durability,
            commits: Commits::default(),
            access,
            write_lock: Mutex::new(Bounds::default()),
        });
        let flusher = start_flusher(
            durability,
            Arc::clone(&shared),
            |s| &s.commits,
            Shared::sync_now,
        )
        .map_err(|source| storage(path, source))?;
        Ok(Embedded { shared, flusher })
    }
}

impl<F: Files> Drop for Embedded<F> {
    fn drop(&mut self) {
        drop(self.flusher.take());
        // Best effort: what this misses was never acknowledged as durable, and fjall's next
        // open recovers its journal up to the last intact batch.
        let _ = self.shared.sync();
    }
}

/// An error of opening the store at `path`.
pub(crate) fn storage(path: &Path, source: KvError) -> OpenError {
    OpenError::Storage {
        path: PathBuf::from(path),
        source,
    }
}
