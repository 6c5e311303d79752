//! [`RedbStore`]: the embedded backend on redb (a copy-on-write B-tree in one file).
//! Owns the mapping of the contract onto one redb table: opening its file ([`RedbFiles`]), keys
//! laid out by [`crate::encoding`], one redb write transaction per batch (redb runs one at a
//! time, so conditions are checked and the batch committed with no write in between:
//! [`RedbSession`]), and a flush as a durable commit of nothing (which makes the non-durable
//! commits before it durable). The open path, the per-partition bounds, flushing per
//! [`Durability`] and the contract's control flow are shared with fjall (`crate::embedded`,
//! `crate::engine`).

use std::ops::Bound;
use std::path::{Path, PathBuf};

use redb::{
    AccessGuard, Database, ReadableDatabase, ReadableTable, Table, TableDefinition,
    WriteTransaction,
};

use crate::batch::{Op, WriteBatch};
use crate::embedded::{Access, Embedded, Files, storage};
use crate::encoding;
use crate::engine::{self, Bounded, Entry, WriteSession};
use crate::error::{CasError, KvError, OpenError, WriteError};
use crate::key::Key;
use crate::memory::is_empty_range;
use crate::options::{Durability, Options};
use crate::store::{KvStore, Order, Visitor};

const TABLE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("kv");
/// The database file inside the data directory.
const FILE_NAME: &str = "kv.redb";

/// The redb embedded backend. Its data directory is locked while it is open.
///
/// # Example
///
/// ```
/// use monoseq_kv::{Key, KvStore, Options, RedbStore};
///
/// let dir = tempfile::tempdir()?;
/// let store = RedbStore::open(dir.path(), Options::default())?;
/// store.put(Key::new(b"p", b"a"), b"1")?;
/// drop(store);
/// let store = RedbStore::open(dir.path(), Options::default())?;
/// assert_eq!(store.get(Key::new(b"p", b"a"))?, Some(b"1".to_vec()));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct RedbStore {
    store: Embedded<RedbFiles>,
}

/// The redb database.
pub(crate) struct RedbFiles {
    db: Database,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("durability", &self.store.shared.durability)
            .finish_non_exhaustive()
    }
}

fn fault(context: &'static str, error: impl Into<redb::Error>) -> KvError {
    match error.into() {
        redb::Error::Io(source) => KvError::Io { context, source },
        redb::Error::PreviousIo => KvError::poisoned(
            "redb stopped after an earlier failed write to its file (its first error was \
             answered to the write that hit it)",
        ),
        redb::Error::Corrupted(message) => KvError::Corrupted { message },
        other => KvError::backend(format!("redb failed while {context}"), other),
    }
}

impl RedbStore {
    /// Opens (creating if needed) the store in directory `path`, recovering after a crash.
    ///
    /// # Errors
    ///
    /// - [`OpenError::Locked`] when another store (in this or another process) has it open.
    /// - [`OpenError::InvalidOption`] when `options` are out of range.
    /// - [`OpenError::Storage`] when the directory cannot be read, created or recovered.
    pub fn open(path: impl AsRef<Path>, options: Options) -> Result<RedbStore, OpenError> {
        let store = Embedded::open(path.as_ref(), options, Access::ReadWrite)?;
        Ok(RedbStore { store })
    }

    fn files(&self) -> &RedbFiles {
        &self.store.shared.files
    }

    fn begin_write(&self) -> Result<WriteTransaction, KvError> {
        self.store.shared.commits.check()?;
        let mut tx = self
            .files()
            .db
            .begin_write()
            .map_err(|error| fault("starting a write", error))?;
        let durability = match self.store.shared.durability {
            Durability::Sync => redb::Durability::Immediate,
            Durability::GroupCommit { .. } | Durability::Manual => redb::Durability::None,
        };
        tx.set_durability(durability)
            .map_err(|error| fault("starting a write", error))?;
        Ok(tx)
    }

    /// Opens the table of `tx` behind the store's bounds, holding its write lock.
    fn session<'tx>(
        &'tx self,
        tx: &'tx WriteTransaction,
    ) -> Result<Bounded<'tx, RedbSession<'tx>>, KvError> {
        let session = RedbSession::open(tx)?;
        Ok(Bounded {
            bounds: self.store.shared.write_lock()?,
            session,
        })
    }

    fn commit(&self, tx: WriteTransaction) -> Result<(), KvError> {
        tx.commit()
            .map_err(|error| fault("committing a batch", error))?;
        self.store.shared.commits.acknowledged();
        Ok(())
    }
}

impl Files for RedbFiles {
    fn open(path: &Path, options: &Options) -> Result<RedbFiles, OpenError> {
        std::fs::create_dir_all(path).map_err(|source| {
            storage(
                path,
                KvError::Io {
                    context: "creating the data directory",
                    source,
                },
            )
        })?;
        let db = Database::builder()
            .set_cache_size(usize::try_from(options.cache_bytes).unwrap_or(usize::MAX))
            .create(path.join(FILE_NAME))
            .map_err(|error| match error {
                redb::DatabaseError::DatabaseAlreadyOpen => OpenError::Locked {
                    path: PathBuf::from(path),
                },
                other => storage(path, fault("opening the database", other)),
            })?;
        let tx = db
            .begin_write()
            .map_err(|error| storage(path, fault("creating the table", error)))?;
        tx.open_table(TABLE)
            .map_err(|error| storage(path, fault("creating the table", error)))?;
        tx.commit()
            .map_err(|error| storage(path, fault("creating the table", error)))?;
        Ok(RedbFiles { db })
    }

    /// A durable commit of nothing, which makes every earlier non-durable commit durable.
    fn persist(&self) -> Result<(), KvError> {
        let mut tx = self
            .db
            .begin_write()
            .map_err(|error| fault("flushing", error))?;
        tx.set_durability(redb::Durability::Immediate)
            .map_err(|error| fault("flushing", error))?;
        tx.commit().map_err(|error| fault("flushing", error))
    }
}

fn read_value(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: Key<'_>,
    buf: &mut Vec<u8>,
) -> Result<Option<Vec<u8>>, KvError> {
    if !encoding::storable(key.partition) {
        return Ok(None);
    }
    encoding::encode_into(key, buf);
    let value = table
        .get(&buf[..])
        .map_err(|error| fault("reading a key", error))?;
    Ok(value.map(|guard| guard.value().to_vec()))
}

fn as_slices(bounds: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> (Bound<&[u8]>, Bound<&[u8]>) {
    (
        bounds.0.as_ref().map(Vec::as_slice),
        bounds.1.as_ref().map(Vec::as_slice),
    )
}

impl KvStore for RedbStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.get_many(&[key])
            .map(|mut values| values.pop().flatten())
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let tx = self
            .files()
            .db
            .begin_read()
            .map_err(|error| fault("starting a read", error))?;
        let table = tx
            .open_table(TABLE)
            .map_err(|error| fault("starting a read", error))?;
        let mut buf = Vec::new();
        keys.iter()
            .map(|&key| read_value(&table, key, &mut buf))
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
        let tx = self
            .files()
            .db
            .begin_read()
            .map_err(|error| fault("starting a read", error))?;
        let table = tx
            .open_table(TABLE)
            .map_err(|error| fault("starting a read", error))?;
        let bounds = encoding::range(partition, from, to);
        let range = table
            .range::<&[u8]>(as_slices(&bounds))
            .map_err(|error| fault("scanning a partition", error))?;
        let entries =
            range.map(|entry| entry.map_err(|error| fault("scanning a partition", error)));
        engine::scan_entries(partition, entries, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        if engine::nothing_to_write(batch)? {
            return Ok(());
        }
        let tx = self.begin_write()?;
        // redb runs one write transaction at a time: the bounds need not be held over the
        // commit, no other write can begin before it ends.
        self.session(&tx)?.apply_checked(batch)?;
        self.commit(tx)?;
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        engine::check_swap(key, new)?;
        let tx = self.begin_write()?;
        engine::swap_checked(&mut self.session(&tx)?, key, expected, new)?;
        self.commit(tx)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        self.store.shared.sync()
    }
}

/// A redb entry as its range yields it.
impl Entry
    for (
        AccessGuard<'_, &'static [u8]>,
        AccessGuard<'_, &'static [u8]>,
    )
{
    fn key(&self) -> &[u8] {
        self.0.value()
    }

    fn value(&self) -> &[u8] {
        self.1.value()
    }
}

/// A write inside a redb write transaction (redb runs one at a time). Items are inserted into
/// or removed from the table as they are applied; the caller commits the transaction.
struct RedbSession<'tx> {
    table: Table<'tx, &'static [u8], &'static [u8]>,
    buf: Vec<u8>,
}

impl<'tx> RedbSession<'tx> {
    fn open(tx: &'tx WriteTransaction) -> Result<RedbSession<'tx>, KvError> {
        let table = tx
            .open_table(TABLE)
            .map_err(|error| fault("opening the table", error))?;
        Ok(RedbSession {
            table,
            buf: Vec::new(),
        })
    }
}

impl WriteSession for RedbSession<'_> {
    fn contains(&mut self, key: Key<'_>) -> Result<bool, KvError> {
        read_value(&self.table, key, &mut self.buf).map(|value| value.is_some())
    }

    /// Not probed: redb looks the keys up one by one.
    fn range_is_empty(&mut self, _: &[u8], _: &[u8], _: &[u8]) -> Result<bool, KvError> {
        Ok(false)
    }

    fn read(&mut self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        read_value(&self.table, key, &mut self.buf)
    }

    fn apply(&mut self, op: Op, key: Key<'_>, value: &[u8]) -> Result<(), KvError> {
        encoding::encode_into(key, &mut self.buf);
        match op {
            Op::Put | Op::InsertIfAbsent => {
                self.table
                    .insert(&self.buf[..], value)
                    .map_err(|error| fault("writing a key", error))?;
            }
            Op::Delete => {
                self.table
                    .remove(&self.buf[..])
                    .map_err(|error| fault("deleting a key", error))?;
            }
        }
        Ok(())
    }

    fn highest_clustering(&mut self, partition: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        if !encoding::storable(partition) {
            return Ok(None);
        }
        let bounds = encoding::range(partition, Bound::Unbounded, Bound::Unbounded);
        let last = self
            .table
            .range::<&[u8]>(as_slices(&bounds))
            .map_err(|error| fault("reading a key range", error))?
            .next_back();
        match last {
            None => Ok(None),
            Some(entry) => entry
                .map(|(key, _)| Some(encoding::clustering(partition, key.value()).to_vec()))
                .map_err(|error| fault("reading a key range", error)),
        }
    }
}
