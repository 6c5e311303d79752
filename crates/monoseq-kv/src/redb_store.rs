//! [`RedbStore`]: the embedded backend on redb (a copy-on-write B-tree in one file).
//! Owns the mapping of the contract onto one redb table: keys laid out by
//! [`crate::encoding`], one redb write transaction per batch (redb runs one at a time, so
//! conditions are checked and the batch committed with no write in between), and flushing per
//! [`Durability`] (non-durable commits made durable by a later durable one).

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::batch::{Op, WriteBatch, first_conflict};
use crate::encoding;
use crate::error::{CasError, KvError, OpenError, WriteError};
use crate::group_commit::{Commits, Flusher, start_flusher};
use crate::key::{Key, limits};
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
    inner: Arc<Inner>,
    /// Stopped before the final flush on drop.
    flusher: Option<Flusher>,
}

struct Inner {
    db: Database,
    durability: Durability,
    commits: Commits,
}

impl std::fmt::Debug for RedbStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbStore")
            .field("durability", &self.inner.durability)
            .finish_non_exhaustive()
    }
}

fn fault(context: &'static str, error: impl Into<redb::Error>) -> KvError {
    match error.into() {
        redb::Error::Io(source) => KvError::Io { context, source },
        redb::Error::PreviousIo => KvError::Poisoned,
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
        let path = path.as_ref();
        options.validate()?;
        let storage = |source: KvError| OpenError::Storage {
            path: PathBuf::from(path),
            source,
        };
        std::fs::create_dir_all(path).map_err(|source| {
            storage(KvError::Io {
                context: "creating the data directory",
                source,
            })
        })?;
        let db = Database::builder()
            .set_cache_size(usize::try_from(options.cache_bytes).unwrap_or(usize::MAX))
            .create(path.join(FILE_NAME))
            .map_err(|error| match error {
                redb::DatabaseError::DatabaseAlreadyOpen => OpenError::Locked {
                    path: PathBuf::from(path),
                },
                other => storage(fault("opening the database", other)),
            })?;
        let tx = db
            .begin_write()
            .map_err(|error| storage(fault("creating the table", error)))?;
        tx.open_table(TABLE)
            .map_err(|error| storage(fault("creating the table", error)))?;
        tx.commit()
            .map_err(|error| storage(fault("creating the table", error)))?;
        let inner = Arc::new(Inner {
            db,
            durability: options.durability,
            commits: Commits::default(),
        });
        let flusher = start_flusher(
            options.durability,
            Arc::clone(&inner),
            |i| i.commits.dirty(),
            Inner::sync_now,
        )
        .map_err(storage)?;
        Ok(RedbStore { inner, flusher })
    }
}

impl Inner {
    /// A durable commit of nothing, which makes every earlier non-durable commit durable.
    fn sync_now(&self) -> Result<(), KvError> {
        self.commits.sync(|| {
            let mut tx = self
                .db
                .begin_write()
                .map_err(|error| fault("flushing", error))?;
            tx.set_durability(redb::Durability::Immediate)
                .map_err(|error| fault("flushing", error))?;
            tx.commit().map_err(|error| fault("flushing", error))
        })
    }

    fn begin_write(&self) -> Result<WriteTransaction, KvError> {
        self.commits.check()?;
        let mut tx = self
            .db
            .begin_write()
            .map_err(|error| fault("starting a write", error))?;
        let durability = match self.durability {
            Durability::Sync => redb::Durability::Immediate,
            Durability::GroupCommit { .. } | Durability::Manual => redb::Durability::None,
        };
        tx.set_durability(durability)
            .map_err(|error| fault("starting a write", error))?;
        Ok(tx)
    }

    fn commit(&self, tx: WriteTransaction) -> Result<(), KvError> {
        tx.commit()
            .map_err(|error| fault("committing a batch", error))?;
        self.commits.acknowledged();
        Ok(())
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
            .inner
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
            .inner
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
        type Entry = redb::Result<(
            redb::AccessGuard<'static, &'static [u8]>,
            redb::AccessGuard<'static, &'static [u8]>,
        )>;
        let mut step = |entry: Entry| -> Result<ControlFlow<()>, KvError> {
            let (key, value) = entry.map_err(|error| fault("scanning a partition", error))?;
            Ok(visit(
                encoding::clustering(partition, key.value()),
                value.value(),
            ))
        };
        match order {
            Order::Ascending => {
                for entry in range {
                    if step(entry)?.is_break() {
                        break;
                    }
                }
            }
            Order::Descending => {
                for entry in range.rev() {
                    if step(entry)?.is_break() {
                        break;
                    }
                }
            }
        }
        Ok(())
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        batch.check_limits()?;
        if batch.is_empty() {
            return Ok(());
        }
        let tx = self.inner.begin_write()?;
        {
            let mut table = tx
                .open_table(TABLE)
                .map_err(|error| fault("opening the table", error))?;
            let mut buf = Vec::new();
            let conflict = first_conflict(batch, |key| {
                read_value(&table, key, &mut buf).map(|value| value.is_some())
            })?;
            if let Some(index) = conflict {
                let key = batch.get(index).map(|item| item.key.to_owned());
                return Err(WriteError::Conflict {
                    index,
                    key: key.unwrap_or_default(),
                });
            }
            for item in batch.iter() {
                encoding::encode_into(item.key, &mut buf);
                match item.op {
                    Op::Put | Op::InsertIfAbsent => {
                        table
                            .insert(&buf[..], item.value)
                            .map_err(|error| fault("writing a key", error))?;
                    }
                    Op::Delete => {
                        table
                            .remove(&buf[..])
                            .map_err(|error| fault("deleting a key", error))?;
                    }
                }
            }
        }
        self.inner.commit(tx)?;
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        if let Some((what, len, max)) = limits::exceeded(key, new.unwrap_or_default()) {
            return Err(CasError::TooLarge { what, len, max });
        }
        let tx = self.inner.begin_write()?;
        {
            let mut table = tx
                .open_table(TABLE)
                .map_err(|error| fault("opening the table", error))?;
            let mut buf = Vec::new();
            let current = read_value(&table, key, &mut buf)?;
            if current.as_deref() != expected {
                return Err(CasError::Mismatch { current });
            }
            match new {
                Some(value) => {
                    table
                        .insert(&buf[..], value)
                        .map_err(|error| fault("writing a key", error))?;
                }
                None => {
                    table
                        .remove(&buf[..])
                        .map_err(|error| fault("deleting a key", error))?;
                }
            }
        }
        self.inner.commit(tx)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        match self.inner.durability {
            Durability::Sync => self.inner.commits.check(),
            Durability::GroupCommit { .. } | Durability::Manual => self.inner.sync_now(),
        }
    }
}

impl Drop for RedbStore {
    fn drop(&mut self) {
        drop(self.flusher.take());
        // Best effort: what this misses was never acknowledged as durable.
        let _ = self.sync();
    }
}
