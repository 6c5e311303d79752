//! [`FjallStore`]: the embedded backend on fjall (an LSM-tree with a write-ahead journal).
//! Owns the mapping of the contract onto one fjall keyspace: keys laid out by
//! [`crate::encoding`], writes serialised by one lock so that conditions are checked and the
//! batch committed with no write in between ([`FjallSession`]), per-partition bounds that
//! spare lookups, and flushing per [`Durability`]. The contract's control flow around these
//! is shared with redb (`crate::engine`).

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::batch::{Op, WriteBatch};
use crate::bounds::Bounds;
use crate::encoding;
use crate::engine::{self, Entry, WriteSession};
use crate::error::{CasError, KvError, OpenError, WriteError};
use crate::group_commit::{Commits, Flusher, start_flusher};
use crate::key::Key;
use crate::memory::is_empty_range;
use crate::options::{Durability, Options};
use crate::store::{KvStore, Order, Visitor};

mod copy;

pub use copy::CopyStats;

const KEYSPACE: &str = "kv";

/// The fjall embedded backend. Its data directory is locked while it is open.
///
/// # Example
///
/// ```
/// use monoseq_kv::{FjallStore, Key, KvStore, Options};
///
/// let dir = tempfile::tempdir()?;
/// let store = FjallStore::open(dir.path(), Options::default())?;
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// drop(store);
/// let store = FjallStore::open(dir.path(), Options::default())?;
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FjallStore {
    inner: Arc<Inner>,
    /// Declared after `inner` uses it: stopped first on drop.
    flusher: Option<Flusher>,
}

struct Inner {
    db: Database,
    kv: Keyspace,
    durability: Durability,
    /// Serialises writes: conditions are checked and the batch committed under it. Guards
    /// the bounds of the partitions written, which spare most insert-if-absent lookups.
    write_lock: Mutex<Bounds>,
    commits: Commits,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("durability", &self.inner.durability)
            .finish_non_exhaustive()
    }
}

fn fault(context: &'static str, error: fjall::Error) -> KvError {
    use fjall::LsmError;
    match error {
        fjall::Error::Io(source) => KvError::Io { context, source },
        fjall::Error::Poisoned => KvError::Poisoned,
        // Bytes that fail their checksum or do not decode: damage, not a passing fault.
        fjall::Error::Storage(
            e @ (LsmError::ChecksumMismatch { .. }
            | LsmError::Decompress(_)
            | LsmError::InvalidTag(_)
            | LsmError::InvalidTrailer
            | LsmError::InvalidHeader(_)
            | LsmError::Utf8(_)),
        ) => KvError::Corrupted {
            message: format!("fjall found damaged bytes while {context}: {e}"),
        },
        e @ (fjall::Error::Decompress(_)
        | fjall::Error::InvalidTrailer
        | fjall::Error::InvalidTag(_)
        | fjall::Error::JournalRecovery(_)) => KvError::Corrupted {
            message: format!("fjall found damaged bytes while {context}: {e}"),
        },
        other => KvError::backend(format!("fjall failed while {context}"), FjallError(other)),
    }
}

/// fjall's error, carried as a source.
#[derive(Debug)]
struct FjallError(fjall::Error);

impl std::fmt::Display for FjallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.0, f)
    }
}

impl std::error::Error for FjallError {}

impl FjallStore {
    /// Opens (creating if needed) the store in directory `path`, recovering after a crash.
    ///
    /// # Errors
    ///
    /// - [`OpenError::Locked`] when another store (in this or another process) has it open.
    /// - [`OpenError::InvalidOption`] when `options` are out of range.
    /// - [`OpenError::Storage`] when the directory cannot be read, created or recovered.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<FjallStore, OpenError> {
        let path = path.as_ref();
        options.validate()?;
        let storage = |source: KvError| OpenError::Storage {
            path: PathBuf::from(path),
            source,
        };
        // fjall's journal recovery asserts on some damaged entries instead of answering an
        // error; a damaged directory must be refused, not crash the process.
        let opened = std::panic::catch_unwind(|| {
            Database::builder(path)
                .cache_size(options.cache_bytes)
                .open()
        })
        .map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            storage(KvError::Corrupted {
                message: format!("fjall panicked while recovering the database ({why})"),
            })
        })?;
        let db = opened.map_err(|error| match error {
            fjall::Error::Locked => OpenError::Locked {
                path: PathBuf::from(path),
            },
            other => storage(fault("opening the database", other)),
        })?;
        let kv = db
            .keyspace(KEYSPACE, KeyspaceCreateOptions::default)
            .map_err(|error| storage(fault("opening the keyspace", error)))?;
        let inner = Arc::new(Inner {
            db,
            kv,
            durability: options.durability,
            write_lock: Mutex::new(Bounds::default()),
            commits: Commits::default(),
        });
        let flusher = start_flusher(
            options.durability,
            Arc::clone(&inner),
            |i| i.commits.dirty(),
            Inner::sync_now,
        )
        .map_err(storage)?;
        Ok(FjallStore { inner, flusher })
    }

    /// Writes what the journal holds into table files and waits for it, so the next open
    /// replays no journal (a clean shutdown calls it; a restart is then faster).
    ///
    /// # Errors
    ///
    /// A [`KvError`] when writing the tables failed; the journal still holds everything.
    pub fn flush_memtables(&self) -> Result<(), KvError> {
        self.inner
            .kv
            .rotate_memtable_and_wait()
            .map_err(|error| fault("writing the memtable to a table file", error))
    }
}

impl Inner {
    fn sync_now(&self) -> Result<(), KvError> {
        self.commits.sync(|| {
            self.db
                .persist(PersistMode::SyncData)
                .map_err(|error| fault("flushing the journal", error))
        })
    }

    fn get(&self, key: Key<'_>, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>, KvError> {
        if !encoding::storable(key.partition) {
            return Ok(None);
        }
        encoding::encode_into(key, buf);
        let value = self
            .kv
            .get(&buf[..])
            .map_err(|error| fault("reading a key", error))?;
        Ok(value.map(|value| value.to_vec()))
    }

    fn contains(&self, key: Key<'_>, buf: &mut Vec<u8>) -> Result<bool, KvError> {
        if !encoding::storable(key.partition) {
            return Ok(false);
        }
        encoding::encode_into(key, buf);
        self.kv
            .contains_key(&buf[..])
            .map_err(|error| fault("reading a key", error))
    }

    /// Whether no stored key of `partition` has clustering columns in `lo..=hi`: one seek.
    fn range_is_empty(&self, partition: &[u8], lo: &[u8], hi: &[u8]) -> Result<bool, KvError> {
        if !encoding::storable(partition) {
            return Ok(true);
        }
        let range = encoding::range(partition, Bound::Included(lo), Bound::Included(hi));
        match self.kv.range(range).next() {
            None => Ok(true),
            Some(guard) => guard
                .into_inner()
                .map(|_| false)
                .map_err(|error| fault("reading a key range", error)),
        }
    }

    /// The highest clustering stored in `partition`: one seek from its end.
    fn highest_clustering(&self, partition: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        if !encoding::storable(partition) {
            return Ok(None);
        }
        let range = encoding::range(partition, Bound::Unbounded, Bound::Unbounded);
        match self.kv.range(range).next_back() {
            None => Ok(None),
            Some(guard) => guard
                .key()
                .map(|key| Some(encoding::clustering(partition, &key).to_vec()))
                .map_err(|error| fault("reading a key range", error)),
        }
    }

    /// Builds the fjall batch of `items` with the configured durability. Needs no lock, so
    /// writers build their batches (key encoding, value copies) concurrently and hold the
    /// write lock only to check conditions and commit.
    fn prepare<'a>(
        &self,
        items: impl Iterator<Item = (Op, Key<'a>, &'a [u8])>,
    ) -> fjall::OwnedWriteBatch {
        let mut batch = self.db.batch();
        if self.durability == Durability::Sync {
            batch = batch.durability(Some(PersistMode::SyncData));
        }
        let mut key = Vec::new();
        for (op, k, value) in items {
            encoding::encode_into(k, &mut key);
            match op {
                Op::Put | Op::InsertIfAbsent => batch.insert(&self.kv, &key[..], value),
                Op::Delete => batch.remove(&self.kv, &key[..]),
            }
        }
        batch
    }

    /// Commits a batch built by [`Inner::prepare`]. Caller holds the write lock (a
    /// [`FjallSession`]).
    fn commit(&self, batch: fjall::OwnedWriteBatch) -> Result<(), KvError> {
        self.commits.check()?;
        batch
            .commit()
            .map_err(|error| fault("committing a batch", error))?;
        self.commits.acknowledged();
        Ok(())
    }
}

impl KvStore for FjallStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key, &mut Vec::new())
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let mut buf = Vec::new();
        keys.iter()
            .map(|&key| self.inner.get(key, &mut buf))
            .collect()
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        if !encoding::storable(partition) || is_empty_range(from, to) {
            return Ok(());
        }
        let range = self.inner.kv.range(encoding::range(partition, from, to));
        let entries = range.map(|guard| {
            guard
                .into_inner()
                .map_err(|error| fault("scanning a partition", error))
        });
        engine::scan_entries(partition, entries, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        if engine::nothing_to_write(batch)? {
            return Ok(());
        }
        let prepared = self
            .inner
            .prepare(batch.iter().map(|item| (item.op, item.key, item.value)));
        let mut session = self.inner.session(prepared);
        session.learn_bounds(batch)?;
        engine::apply_checked(&mut session, batch)?;
        session.commit()?;
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        engine::check_swap(key, new)?;
        let item = match new {
            Some(value) => (Op::Put, key, value),
            None => (Op::Delete, key, &[][..]),
        };
        let mut session = self
            .inner
            .session(self.inner.prepare(std::iter::once(item)));
        engine::swap_checked(&mut session, key, expected, new)?;
        session.commit()?;
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        engine::sync(self.inner.durability, &self.inner.commits, || {
            self.inner.sync_now()
        })
    }
}

/// A fjall entry as its range yields it.
impl Entry for fjall::KvPair {
    fn key(&self) -> &[u8] {
        &self.0
    }

    fn value(&self) -> &[u8] {
        &self.1
    }
}

/// A write under the store's write lock. The fjall batch is built before the lock (key
/// encoding and value copies run concurrently between writers) and holds exactly the items
/// the session applies; applying an item raises its partition's bound, committing commits
/// the batch.
struct FjallSession<'a> {
    inner: &'a Inner,
    bounds: MutexGuard<'a, Bounds>,
    prepared: fjall::OwnedWriteBatch,
    buf: Vec<u8>,
}

impl Inner {
    /// Takes the write lock for `prepared` (built by [`Inner::prepare`]).
    fn session(&self, prepared: fjall::OwnedWriteBatch) -> FjallSession<'_> {
        let bounds = self
            .write_lock
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        FjallSession {
            inner: self,
            bounds,
            prepared,
            buf: Vec::new(),
        }
    }
}

impl FjallSession<'_> {
    /// Learns the bound of the partitions `batch` inserts into if absent, from their second
    /// visit on.
    fn learn_bounds(&mut self, batch: &WriteBatch) -> Result<(), KvError> {
        for item in batch.iter().filter(|i| i.op == Op::InsertIfAbsent) {
            let partition = item.key.partition;
            if !self.bounds.knows(partition) && self.bounds.worth_learning(partition) {
                let highest = self.inner.highest_clustering(partition)?;
                self.bounds.learn(partition, highest.as_deref());
            }
        }
        Ok(())
    }

    fn commit(self) -> Result<(), KvError> {
        self.inner.commit(self.prepared)
    }
}

impl WriteSession for FjallSession<'_> {
    fn contains(&mut self, key: Key<'_>) -> Result<bool, KvError> {
        if self.bounds.above(key.partition, key.clustering) {
            return Ok(false);
        }
        self.inner.contains(key, &mut self.buf)
    }

    fn range_is_empty(&mut self, partition: &[u8], lo: &[u8], hi: &[u8]) -> Result<bool, KvError> {
        if self.bounds.above(partition, lo) {
            return Ok(true);
        }
        self.inner.range_is_empty(partition, lo, hi)
    }

    fn read(&mut self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key, &mut self.buf)
    }

    /// The item is in the prepared batch already; its bound is raised before the commit (a
    /// bound too high if the commit fails is still a bound).
    fn apply(&mut self, op: Op, key: Key<'_>, _value: &[u8]) -> Result<(), KvError> {
        if op != Op::Delete {
            self.bounds.wrote(key.partition, key.clustering);
        }
        Ok(())
    }
}

impl Drop for FjallStore {
    fn drop(&mut self) {
        drop(self.flusher.take());
        // Best effort: a failure here is reported by the next open's recovery, not lost
        // silently (fjall recovers the journal up to its last intact batch).
        let _ = self.sync();
    }
}
