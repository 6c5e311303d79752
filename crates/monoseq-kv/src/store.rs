//! The storage contract: [`KvStore`], the ordered key-value store every backend implements,
//! with the obligations a backend keeps. The conformance suite checks them; it is the
//! definition of "a backend".

use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use crate::batch::WriteBatch;
use crate::error::{CasError, KvError, WriteError};
use crate::key::Key;

/// Receives the entries of a [`KvStore::scan`]: `(clustering, value)`. Answering
/// [`ControlFlow::Break`] stops the scan. The slices are valid only during the call, which is
/// what lets a backend scan millions of entries without allocating per entry.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> ControlFlow<()> + 'a;

/// The order of a [`KvStore::scan`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// Increasing clustering columns.
    #[default]
    Ascending,
    /// Decreasing clustering columns (for instance to find the last entry of a log).
    Descending,
}

/// One compare-and-swap of [`KvStore::compare_and_swap_each`]: the arguments of
/// [`KvStore::compare_and_swap`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Swap<'a> {
    /// The key to swap.
    pub key: Key<'a>,
    /// The value it must hold (`None`: the key must be absent).
    pub expected: Option<&'a [u8]>,
    /// Its new value (`None`: delete it).
    pub new: Option<&'a [u8]>,
}

/// An ordered key-value store: partitions addressed by a partition key, each holding entries
/// ordered by their clustering columns (unsigned bytes, lexicographic).
///
/// Obligations every backend keeps (the conformance suite checks them):
///
/// - **Atomic batches.** [`write`](KvStore::write) applies the whole batch or nothing, across
///   partitions. Items take effect in batch order, as if applied one after another; an
///   [`InsertIfAbsent`](crate::Op::InsertIfAbsent) sees the effect of earlier items of the same
///   batch. After `Ok` every item is visible; after `Err` none is, and a reader never sees part
///   of a batch, even across a crash.
/// - **Visibility after return.** A write that returned `Ok` is seen by every read that starts
///   after it returned, from any thread.
/// - **Linearizable conditions.** [`InsertIfAbsent`](crate::Op::InsertIfAbsent) items and
///   [`compare_and_swap`](KvStore::compare_and_swap) decide against the latest value and no
///   concurrent write slips between the check and the write: of many concurrent inserts of one
///   key exactly one succeeds, and concurrent compare-and-swaps lose no update.
/// - **Ordered scans.** [`scan`](KvStore::scan) visits the entries of one partition between its
///   bounds in strictly increasing (or decreasing) clustering order, each key at most once.
///   Entries written before the scan started are seen unless changed since; writes concurrent
///   with a scan may or may not be seen.
/// - **Durability.** What [`sync`](KvStore::sync) returned `Ok` for, and every write a backend
///   documents as durable on return, survives a crash of the process or of the machine.
///   After a crash the store holds a prefix of the acknowledged batches, whole.
/// - **Limits.** Writes over [`crate::limits`] fail with `TooLarge` and write nothing.
/// - **Unknown outcomes are named.** A write whose request left but whose answer was lost (a
///   dropped connection, a timeout after the commit was sent) fails with
///   [`KvError::OutcomeUnknown`]: it was applied whole or not at all, and a read that starts
///   after the error returned tells which. Every other error means nothing was written.
/// - **Errors, not panics.** A storage fault returns [`KvError`] (inside the operation's
///   error); the caller may retry. Reads of keys never written answer `None` or nothing.
pub trait KvStore: Send + Sync + 'static {
    /// The value at `key`.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when storage cannot answer.
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError>;

    /// The values at `keys`, in the same order (`None` where absent). Each answer obeys the
    /// visibility rule; the answers need not come from one snapshot.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when storage cannot answer.
    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError>;

    /// Visits the entries of `partition` whose clustering columns lie between `from` and `to`,
    /// in `order`, until `visit` answers [`ControlFlow::Break`] or the range ends. Bounds
    /// compare clustering columns as unsigned bytes; an empty range visits nothing.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when reading failed; entries visited before it stay valid.
    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError>;

    /// Applies `batch` atomically (see the obligations above). An empty batch succeeds.
    ///
    /// # Errors
    ///
    /// - [`WriteError::Conflict`] when an insert-if-absent item found its key present (the
    ///   first such item, in batch order); nothing is written.
    /// - [`WriteError::TooLarge`] when an item is over a limit; nothing is written.
    /// - [`WriteError::Storage`] on a storage fault; nothing is written, except after
    ///   [`KvError::OutcomeUnknown`], when the batch may have been written whole.
    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError>;

    /// Replaces the value at `key` with `new` (`None`: deletes it) if the stored value equals
    /// `expected` (`None`: the key is absent).
    ///
    /// # Errors
    ///
    /// - [`CasError::Mismatch`] with the stored value when it differs from `expected`; nothing
    ///   is written.
    /// - [`CasError::TooLarge`] when `key` or `new` is over a limit.
    /// - [`CasError::Storage`] on a storage fault; nothing is written, except after
    ///   [`KvError::OutcomeUnknown`], when the swap may have happened.
    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError>;

    /// The compare-and-swaps of `swaps`, each deciding on its own condition exactly as
    /// [`compare_and_swap`](KvStore::compare_and_swap) would, with one answer per swap, in
    /// order. A key named twice is swapped in list order (the second sees the first's outcome).
    /// Together they are not atomic: some may swap while others fail, and a failed condition
    /// fails only its own swap. A backend may carry them in one round trip and one commit; by
    /// default they run one after another.
    ///
    /// # Errors
    ///
    /// Each answer is what [`compare_and_swap`](KvStore::compare_and_swap) would answer for
    /// its swap; a storage fault may fail several (each [`KvError::OutcomeUnknown`] among them
    /// may have swapped).
    fn compare_and_swap_each(&self, swaps: &[Swap<'_>]) -> Vec<Result<(), CasError>> {
        swaps
            .iter()
            .map(|swap| self.compare_and_swap(swap.key, swap.expected, swap.new))
            .collect()
    }

    /// The index of the first of `keys` that is stored (`None`: every one is absent), for a
    /// caller that checks the absence of keys itself before a write with no conditions. An
    /// embedded store answers most from its per-partition bounds, without a lookup, as it
    /// does for an insert-if-absent.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when storage cannot answer.
    fn first_present(&self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
        Ok(self.get_many(keys)?.iter().position(Option::is_some))
    }

    /// Says that keys are about to be inserted into `partitions`, which their writer fills
    /// in clustering order (a sequencer's next block of numbers): fjall's store learns their
    /// bounds now, so that the absence of those keys is answered without a lookup when they
    /// come. Writers that announce their partitions at different moments spread those reads
    /// out, instead of every writer learning a new block's bound at its first keys, under the
    /// write lock that all of them wait for. Only a hint: no answer of the store changes; the
    /// other backends ignore it.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when storage cannot be read.
    fn expect_inserts(&self, partitions: &[&[u8]]) -> Result<(), KvError> {
        let _ = partitions;
        Ok(())
    }

    /// Makes every write that returned `Ok` before this call durable. Concurrent callers may
    /// share one flush. A backend whose writes are durable on return does nothing.
    ///
    /// # Errors
    ///
    /// A [`KvError`] when flushing failed; the writes stay visible but may not be durable.
    fn sync(&self) -> Result<(), KvError>;

    /// What the backend's storage engine holds in memory and does in the background now, for
    /// an operator's metrics; `None` for a backend without such an engine of its own.
    fn engine_stats(&self) -> Option<EngineStats> {
        None
    }

    /// Writes `value` at `key`, replacing any (a one-item [`write`](KvStore::write)).
    ///
    /// # Errors
    ///
    /// As [`write`](KvStore::write).
    fn put(&self, key: Key<'_>, value: &[u8]) -> Result<(), WriteError> {
        let mut batch = WriteBatch::with_capacity(1, key_len(key) + value.len());
        batch.put(key, value);
        self.write(&batch)
    }

    /// Writes `value` at `key` if `key` is absent (a one-item [`write`](KvStore::write)).
    ///
    /// # Errors
    ///
    /// [`WriteError::Conflict`] when `key` is present, else as [`write`](KvStore::write).
    fn insert_if_absent(&self, key: Key<'_>, value: &[u8]) -> Result<(), WriteError> {
        let mut batch = WriteBatch::with_capacity(1, key_len(key) + value.len());
        batch.insert_if_absent(key, value);
        self.write(&batch)
    }

    /// Removes `key`; an absent key is fine (a one-item [`write`](KvStore::write)).
    ///
    /// # Errors
    ///
    /// As [`write`](KvStore::write).
    fn delete(&self, key: Key<'_>) -> Result<(), WriteError> {
        let mut batch = WriteBatch::with_capacity(1, key_len(key));
        batch.delete(key);
        self.write(&batch)
    }
}

/// An embedded engine's memory and background work at one moment ([`KvStore::engine_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Bytes the engine counts in its memtables, the active one and those sealed and waiting
    /// for their flush.
    pub memtable_bytes: u64,
    /// Memtables sealed and waiting for their flush to a table file.
    pub sealed_memtables: u64,
    /// Bytes its block cache holds.
    pub cache_bytes: u64,
    /// The most its block cache may hold, in bytes.
    pub cache_capacity_bytes: u64,
    /// Table files.
    pub tables: u64,
    /// Table files in level 0: flushed and not compacted yet.
    pub level0_tables: u64,
    /// Memtable flushes queued or running.
    pub flushes_pending: u64,
    /// Compactions running now.
    pub compactions_running: u64,
    /// Compactions completed since the store was opened.
    pub compactions_completed: u64,
    /// Time every compaction since the store was opened took, in seconds.
    pub compaction_seconds: f64,
    /// Journal files on disk.
    pub journals: u64,
    /// Blocks of its tables' data read since the store was opened.
    pub data_blocks: BlockReads,
    /// Blocks of its tables' indexes read since the store was opened.
    pub index_blocks: BlockReads,
    /// Blocks of its tables' Bloom filters read since the store was opened (a lookup of an
    /// absent key reads one per table it may be in, unless the filter is pinned in memory).
    pub filter_blocks: BlockReads,
}

/// Reads of one kind of table block since the store was opened ([`EngineStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockReads {
    /// Blocks found in the engine's block cache.
    pub cached: u64,
    /// Blocks read from their table file (the OS's page cache or the disk).
    pub from_file: u64,
    /// Bytes of the blocks read from their table files.
    pub file_bytes: u64,
}

fn key_len(key: Key<'_>) -> usize {
    key.partition.len() + key.clustering.len()
}

macro_rules! forward_kv_store {
    ($ty:ty) => {
        impl<T: KvStore + ?Sized> KvStore for $ty {
            fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
                (**self).get(key)
            }

            fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
                (**self).get_many(keys)
            }

            fn scan(
                &self,
                partition: &[u8],
                from: Bound<&[u8]>,
                to: Bound<&[u8]>,
                order: Order,
                visit: &mut Visitor<'_>,
            ) -> Result<(), KvError> {
                (**self).scan(partition, from, to, order, visit)
            }

            fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
                (**self).write(batch)
            }

            fn compare_and_swap(
                &self,
                key: Key<'_>,
                expected: Option<&[u8]>,
                new: Option<&[u8]>,
            ) -> Result<(), CasError> {
                (**self).compare_and_swap(key, expected, new)
            }

            fn compare_and_swap_each(&self, swaps: &[Swap<'_>]) -> Vec<Result<(), CasError>> {
                (**self).compare_and_swap_each(swaps)
            }

            fn first_present(&self, keys: &[Key<'_>]) -> Result<Option<usize>, KvError> {
                (**self).first_present(keys)
            }

            fn expect_inserts(&self, partitions: &[&[u8]]) -> Result<(), KvError> {
                (**self).expect_inserts(partitions)
            }

            fn sync(&self) -> Result<(), KvError> {
                (**self).sync()
            }

            fn engine_stats(&self) -> Option<EngineStats> {
                (**self).engine_stats()
            }
        }
    };
}

forward_kv_store!(Arc<T>);
forward_kv_store!(Box<T>);
