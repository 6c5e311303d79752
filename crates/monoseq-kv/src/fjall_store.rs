//! [`FjallStore`]: the embedded backend on fjall (an LSM-tree with a write-ahead journal).
//! Owns the mapping of the contract onto one fjall keyspace: opening its files ([`FjallFiles`],
//! which also repairs fjall's view of a directory whose journal is gone), keys laid out by
//! [`crate::encoding`], and a write as one fjall batch built before the write lock and
//! committed under it ([`FjallSession`]). The open path, the per-partition bounds, flushing per
//! [`Durability`] and the contract's control flow are shared with redb (`crate::embedded`,
//! `crate::engine`); `listing.rs` enumerates the stored partitions, `copy.rs` copies a running
//! store.

use std::ops::Bound;
use std::path::{Path, PathBuf};

use fjall::config::{CompressionPolicy, PartitioningPolicy};
use fjall::{CompressionType, Database, Keyspace, KeyspaceCreateOptions, PersistMode};

use crate::batch::{Op, WriteBatch};
use crate::embedded::{Access, Embedded, Files, storage};
use crate::encoding;
use crate::engine::{self, Bounded, Entry, WriteSession};
use crate::error::{CasError, KvError, OpenError, WriteError};
use crate::key::Key;
use crate::memory::is_empty_range;
use crate::options::{Durability, Options};
use crate::store::{BlockReads, EngineStats, KvStore, Order, Visitor};

mod copy;
mod listing;

pub use copy::CopyStats;

const KEYSPACE: &str = "kv";
/// Largest memtable of a keyspace this build creates: half fjall's default (64 MiB), so a flush
/// writes half as much at once and the journal, rotated at half its zero-filled length, holds
/// a whole memtable without growing (`vendor/fjall/PATCHES.md`). Stored with the keyspace:
/// a data directory created by an earlier build keeps its own.
pub const MEMTABLE_BYTES: u64 = 32 * 1024 * 1024;
/// How many level-0 tables fjall's leveled compaction gathers before merging them into level 1
/// (fjall's default: 4). Each flushed table holds keys of every workspace, so each merge
/// rewrites all of level 1: gathering 16 rewrites it a quarter as often. Level 1 keeps its size
/// (this times [`COMPACTION_TABLE_BYTES`], 256 MiB as by default); writes slow at 20 level-0
/// tables, so 4 flushes of room are left. The soak's writes replayed into fjall
/// (`scripts/bench compaction`): 0.83× the bytes written, 0.59× the time compacting
/// (`docs/benchmarks/soak.md`, "Compaction settings").
pub const COMPACTION_LEVEL0_TABLES: u8 = 16;
/// The size of the tables fjall's compactions write (fjall's default: 64 MiB).
pub const COMPACTION_TABLE_BYTES: u64 = 16 * 1024 * 1024;
/// The niceness of fjall's compacting workers (all but the one kept for flushes, on a machine
/// of two or more CPUs): compactions take the CPU the partitions and the HTTP server leave
/// instead of a fair share beside them (DESIGN.md, "What stalls a durable write …").
pub const COMPACTION_WORKER_NICE: i32 = 10;
/// fjall's version marker in its directory: present once a database was created there.
const VERSION_FILE: &str = "version";
/// fjall's folder of keyspaces in its directory.
const KEYSPACES_FOLDER: &str = "keyspaces";
/// The extension of fjall's journal files.
const JOURNAL_EXTENSION: &str = "jnl";

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
    store: Embedded<FjallFiles>,
}

/// The fjall database and its one keyspace.
pub(crate) struct FjallFiles {
    db: Database,
    kv: Keyspace,
}

impl std::fmt::Debug for FjallStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStore")
            .field("durability", &self.store.shared.durability)
            .finish_non_exhaustive()
    }
}

fn fault(context: &'static str, error: fjall::Error) -> KvError {
    use fjall::LsmError;
    match error {
        fjall::Error::Io(source) => KvError::Io { context, source },
        fjall::Error::Poisoned => KvError::poisoned(crate::group_commit::FIRST_UNSEEN),
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
        let store = Embedded::open(path.as_ref(), options, Access::ReadWrite)?;
        Ok(FjallStore { store })
    }

    /// Opens the store in directory `path` for reading only: every write answers
    /// [`KvError::ReadOnly`], no flusher runs and nothing is flushed on close; reads and
    /// [`FjallStore::partitions`] see what [`FjallStore::open`] would. fjall has no read-only
    /// mode: opening still recovers its journal (and creates one when it is missing), so a
    /// directory that must stay unchanged byte for byte is opened on a copy (`monoseq verify`
    /// does).
    ///
    /// # Errors
    ///
    /// As [`FjallStore::open`].
    pub fn open_read_only(
        path: impl AsRef<Path>,
        options: Options,
    ) -> Result<FjallStore, OpenError> {
        let store = Embedded::open(path.as_ref(), options, Access::ReadOnly)?;
        Ok(FjallStore { store })
    }

    /// Writes what the journal holds into table files and waits for it, so the next open
    /// replays no journal (a clean shutdown calls it; a restart is then faster).
    ///
    /// # Errors
    ///
    /// A [`KvError`] when writing the tables failed; the journal still holds everything.
    /// [`KvError::Poisoned`] at once when the store is poisoned: fjall's flush worker may be
    /// gone, and waiting for it would never end.
    pub fn flush_memtables(&self) -> Result<(), KvError> {
        let commits = &self.store.shared.commits;
        commits.check()?;
        if self.files().engine_poisoned() {
            return Err(commits.poison(&KvError::poisoned(crate::group_commit::FIRST_UNSEEN)));
        }
        self.files()
            .kv
            .rotate_memtable_and_wait()
            .map_err(|error| fault("writing the memtable to a table file", error))
    }

    /// The file fjall locks, exclusively, in its directory while a store has it open: a
    /// shared lock on it keeps a store from opening (and fails while one is open).
    pub const LOCK_FILE: &'static str = "lock";

    /// Whether directory `dir` holds fjall's files (its version marker or its keyspaces).
    #[must_use]
    pub fn holds_files(dir: &Path) -> bool {
        dir.join(VERSION_FILE).exists() || dir.join(KEYSPACES_FOLDER).exists()
    }

    fn files(&self) -> &FjallFiles {
        &self.store.shared.files
    }
}

impl Files for FjallFiles {
    /// Opens the database and its keyspace. fjall recovers its sequence number from the
    /// journal only: opened without one (deleted after a clean shutdown, whose table files hold
    /// everything), it starts from 0, and its scans, which read at the visible sequence number,
    /// see none of the table files while its point reads (at the newest) see them all. Such a
    /// directory is opened twice: the first open creates an empty journal, and the second
    /// recovers the number from the table files, so every read agrees.
    fn open(path: &Path, options: &Options) -> Result<FjallFiles, OpenError> {
        if lacks_journal(path) {
            drop(FjallFiles::open_once(path, options)?);
        }
        FjallFiles::open_once(path, options)
    }

    fn persist(&self) -> Result<(), KvError> {
        self.db
            .persist(PersistMode::SyncData)
            .map_err(|error| fault("flushing the journal", error))
    }
}

/// Whether `path` holds a fjall database (its version marker) but no journal.
fn lacks_journal(path: &Path) -> bool {
    if !path.join(VERSION_FILE).is_file() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(path) else {
        return false;
    };
    !entries.filter_map(Result::ok).any(|entry| {
        Path::new(&entry.file_name())
            .extension()
            .is_some_and(|ext| ext == JOURNAL_EXTENSION)
    })
}

impl FjallFiles {
    fn open_once(path: &Path, options: &Options) -> Result<FjallFiles, OpenError> {
        // fjall's journal recovery asserts on some damaged entries instead of answering an
        // error; a damaged directory must be refused, not crash the process.
        let opened = std::panic::catch_unwind(|| {
            Database::builder(path)
                .cache_size(options.cache_bytes)
                .journal_compression(CompressionType::None)
                .compaction_worker_nice(COMPACTION_WORKER_NICE)
                .open()
        })
        .map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            storage(
                path,
                KvError::Corrupted {
                    message: format!("fjall panicked while recovering the database ({why})"),
                },
            )
        })?;
        let db = opened.map_err(|error| match error {
            fjall::Error::Locked => OpenError::Locked {
                path: PathBuf::from(path),
            },
            other => storage(path, fault("opening the database", other)),
        })?;
        let kv = db
            .keyspace(KEYSPACE, keyspace_options)
            .map_err(|error| storage(path, fault("opening the keyspace", error)))?;
        Ok(FjallFiles { db, kv })
    }
}

/// The options of the keyspace a new data directory (or a backup's copy) is created with
/// (`docs/format.md`, "The embedded engine's files"): fjall's defaults but for data blocks
/// compressed with LZ4 on every level, a memtable of `MEMTABLE_BYTES`, level 1 merged from
/// [`COMPACTION_LEVEL0_TABLES`] tables of level 0, and every table's Bloom filter and
/// index written in partitions of 4 KiB under a small top-level block kept in memory. fjall's
/// default writes them whole above its fourth level, so a point read of a key (the numbers of
/// a workspace a restarted sequencer first touches) loaded its table's whole filter, about
/// 3.7 MiB, through a 64 MiB cache that cannot hold them all: after a restart on 4 GiB the
/// first seconds read 4.0–5.1 GB of table blocks, and a paced load's p99 reached 0.2–0.5 s
/// warm (`docs/benchmarks/soak.md`, "Filters and indexes read in partitions"). fjall stores the options with the keyspace and a directory
/// keeps those it was created with: one written before reads as it is (uncompressed blocks
/// carry their own type, as compressed ones do; a table says whether its filter and index are
/// partitioned).
pub fn keyspace_options() -> KeyspaceCreateOptions {
    KeyspaceCreateOptions::default()
        .data_block_compression_policy(CompressionPolicy::all(CompressionType::Lz4))
        .filter_block_partitioning_policy(PartitioningPolicy::all(true))
        .index_block_partitioning_policy(PartitioningPolicy::all(true))
        .max_memtable_size(MEMTABLE_BYTES)
        .compaction_strategy(std::sync::Arc::new(leveled_compaction(
            COMPACTION_LEVEL0_TABLES,
        )))
}

/// The leveled compaction a new data directory's keyspace takes, level 1 merged from
/// `level0_tables` tables of level 0 (the build's is [`COMPACTION_LEVEL0_TABLES`]; the
/// compaction bench tries others).
pub fn leveled_compaction(level0_tables: u8) -> fjall::compaction::Leveled {
    fjall::compaction::Leveled::default()
        .with_l0_threshold(level0_tables)
        .with_table_target_size(COMPACTION_TABLE_BYTES)
}

impl FjallFiles {
    /// Whether fjall refuses every write after a fatal failure of its own (asked after a
    /// failed write: a buffered persist, which a healthy database answers at once).
    fn engine_poisoned(&self) -> bool {
        matches!(
            self.db.persist(PersistMode::Buffer),
            Err(fjall::Error::Poisoned)
        )
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

    /// Builds the fjall batch of `items` with `durability`. Needs no lock, so writers build
    /// their batches (key encoding, value copies) concurrently and hold the write lock only to
    /// check conditions and commit.
    fn prepare<'a>(
        &self,
        durability: Durability,
        items: impl Iterator<Item = (Op, Key<'a>, &'a [u8])>,
    ) -> fjall::OwnedWriteBatch {
        let mut batch = self.db.batch();
        if durability == Durability::Sync {
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
}

impl FjallStore {
    /// Builds the fjall batch of `items` with the store's durability (see
    /// [`FjallFiles::prepare`]).
    fn prepare<'a>(
        &self,
        items: impl Iterator<Item = (Op, Key<'a>, &'a [u8])>,
    ) -> fjall::OwnedWriteBatch {
        self.files().prepare(self.store.shared.durability, items)
    }

    /// Takes the write lock for `prepared` (built by [`FjallStore::prepare`]).
    fn session(
        &self,
        prepared: fjall::OwnedWriteBatch,
    ) -> Result<Bounded<'_, FjallSession<'_>>, KvError> {
        Ok(Bounded {
            bounds: self.store.shared.write_lock()?,
            session: FjallSession {
                files: self.files(),
                prepared,
                buf: Vec::new(),
            },
        })
    }

    /// Commits the batch of `session`, under the write lock it holds. A failure that poisoned
    /// fjall (its journal write failed) poisons the store, naming it as the first cause.
    fn commit(&self, session: Bounded<'_, FjallSession<'_>>) -> Result<(), KvError> {
        let shared = &self.store.shared;
        shared.commits.check()?;
        if let Err(error) = session.session.prepared.commit() {
            let error = fault("committing a batch", error);
            return Err(if self.files().engine_poisoned() {
                shared.commits.poison(&error)
            } else {
                error
            });
        }
        shared.commits.acknowledged();
        Ok(())
    }
}

impl KvStore for FjallStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.files().get(key, &mut Vec::new())
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let mut buf = Vec::new();
        keys.iter()
            .map(|&key| self.files().get(key, &mut buf))
            .collect()
    }

    /// Under the write lock, which guards the bounds: most keys are answered from them.
    fn first_present(&self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
        if keys.is_empty() {
            return Ok(None);
        }
        self.session(self.prepare(std::iter::empty()))?
            .first_present(keys)
    }

    /// One seek from the end of each partition whose bound is not known yet, under the write
    /// lock, which guards the bounds. Each is run once before without the lock, its answer
    /// dropped: the table blocks it reads stay in the block cache, where the seek every writer
    /// waits for finds them.
    fn expect_inserts(&self, partitions: &[&[u8]]) -> Result<(), KvError> {
        if partitions.is_empty() {
            return Ok(());
        }
        for partition in partitions {
            self.files().highest_clustering(partition)?;
        }
        self.session(self.prepare(std::iter::empty()))?
            .learn(partitions)
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
        let range = self.files().kv.range(encoding::range(partition, from, to));
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
        let prepared = self.prepare(batch.iter().map(|item| (item.op, item.key, item.value)));
        let mut session = self.session(prepared)?;
        session.apply_checked(batch)?;
        self.commit(session)?;
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
        let mut session = self.session(self.prepare(std::iter::once(item)))?;
        engine::swap_checked(&mut session, key, expected, new)?;
        self.commit(session)?;
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        self.store.shared.sync()
    }

    fn engine_stats(&self) -> Option<EngineStats> {
        let FjallFiles { db, kv } = self.files();
        let count = |n: usize| n as u64;
        let m = kv.metrics();
        Some(EngineStats {
            memtable_bytes: db.write_buffer_size(),
            sealed_memtables: count(kv.sealed_memtable_count()),
            cache_bytes: db.cache_size(),
            cache_capacity_bytes: db.cache_capacity(),
            tables: count(kv.table_count()),
            level0_tables: count(kv.l0_table_count()),
            flushes_pending: count(db.outstanding_flushes()),
            compactions_running: count(db.active_compactions()),
            compactions_completed: count(db.compactions_completed()),
            compaction_seconds: db.time_compacting().as_secs_f64(),
            journals: count(db.journal_count()),
            data_blocks: block_reads(
                m.data_block_load_count(),
                m.data_block_load_cached_count(),
                m.data_block_io(),
            ),
            index_blocks: block_reads(
                m.index_block_load_count(),
                m.index_block_load_cached_count(),
                m.index_block_io(),
            ),
            filter_blocks: block_reads(
                m.filter_block_load_count(),
                m.filter_block_load_cached_count(),
                m.filter_block_io(),
            ),
        })
    }
}

/// One kind of block's reads from fjall's counters: every load and those from its cache (read
/// one after the other, so a load between them is clamped, not negative).
fn block_reads(loads: usize, cached: usize, file_bytes: u64) -> BlockReads {
    BlockReads {
        cached: cached as u64,
        from_file: loads.saturating_sub(cached) as u64,
        file_bytes,
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

/// A write of fjall, under the store's write lock (its [`Bounded`] holds it). The fjall batch
/// is built before the lock (key encoding and value copies run concurrently between writers)
/// and holds exactly the items the session applies, so applying an item adds nothing;
/// committing commits the batch.
pub(crate) struct FjallSession<'a> {
    files: &'a FjallFiles,
    prepared: fjall::OwnedWriteBatch,
    buf: Vec<u8>,
}

impl WriteSession for FjallSession<'_> {
    fn contains(&mut self, key: Key<'_>) -> Result<bool, KvError> {
        self.files.contains(key, &mut self.buf)
    }

    fn range_is_empty(&mut self, partition: &[u8], lo: &[u8], hi: &[u8]) -> Result<bool, KvError> {
        self.files.range_is_empty(partition, lo, hi)
    }

    fn read(&mut self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.files.get(key, &mut self.buf)
    }

    /// The item is in the prepared batch already.
    fn apply(&mut self, _op: Op, _key: Key<'_>, _value: &[u8]) -> Result<(), KvError> {
        Ok(())
    }

    fn highest_clustering(&mut self, partition: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.files.highest_clustering(partition)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announced_partitions_have_their_bounds_learned_at_once() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = FjallStore::open(dir.path(), Options::default()).expect("open");
        store.put(Key::new(b"full", &[3]), b"x").expect("put");
        store
            .expect_inserts(&[b"full", b"empty"])
            .expect("expect_inserts");
        let bounds = store.store.shared.write_lock().expect("write lock");
        assert!(bounds.knows(b"full") && bounds.knows(b"empty"));
        assert!(!bounds.above(b"full", &[3]), "the stored key is the bound");
        assert!(bounds.above(b"full", &[4]));
        assert!(bounds.above(b"empty", &[0]), "nothing is stored there");
        assert!(!bounds.knows(b"other"), "only announced ones are learned");
    }
}
