//! [`FencedPgStore`]: a view of a store whose every write commits only while the lease of one
//! partition still has the epoch the view was made with; the check each write carries, and why
//! it is enough, are in `fence.rs`.

use std::sync::Arc;

use monoseq_kv::{CasError, Key, KvError, KvStore, Order, Visitor, WriteBatch, WriteError};

use crate::fence::Fence;
use crate::store::{Core, PgStore};

impl PgStore {
    /// A view of this store whose every batch write and compare-and-swap commits only while
    /// the lease of `partition` still has `epoch` and `node_id` as its owner (the node it was
    /// acquired for; checked in the write's own transaction, see [`FencedPgStore`]). Reads pass
    /// through unchanged. Cheap; shares the store's connections.
    pub fn fenced(&self, partition: u32, epoch: u64, node_id: &str) -> FencedPgStore {
        FencedPgStore::new(Arc::clone(&self.core), partition, epoch, node_id)
    }
}

/// A view of a [`crate::PgStore`] that writes for one partition under one lease epoch (from
/// [`crate::Leases::acquire`]), made by [`crate::PgStore::fenced`].
///
/// Guarantee: every [`KvStore::write`] batch and every [`KvStore::compare_and_swap`] checks,
/// in its own transaction and before writing, that the lease of the partition still has this
/// epoch and this owner, and share-locks the lease row to the commit. Once another node's
/// `acquire` of the partition returned, every write through this view fails with
/// `WriteError::Storage(KvError::Fenced { .. })` / `CasError::Storage(KvError::Fenced { .. })`
/// and writes nothing; every write that returned `Ok` committed before that takeover, so the
/// new owner reads it. The check looks at the epoch and the owner only: a lease that expired
/// but was not taken over still admits its owner's writes, which is safe because nobody else
/// wrote.
///
/// Reads (`get`, `get_many`, `scan`) pass through without a check; [`KvStore::sync`] does
/// nothing, as on the store. A batch that conflicts within itself writes nothing and is
/// answered `Conflict` without the check.
///
/// The fence costs no extra round trip: `BEGIN`, the check, the batch's statements and
/// `COMMIT` travel together, one round trip whatever the batch holds. Writes of one partition wait for a takeover or
/// a renewal of its lease in flight, and those wait for the writes in flight.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use monoseq_kv::{Key, KvError, KvStore, WriteError};
/// use monoseq_pg::{PgOptions, PgStore};
///
/// let store = PgStore::open("postgresql://monoseq:secret@db.example/monoseq", PgOptions::default())?;
/// let leases = store.leases();
/// leases.ensure_partitions(8)?;
/// if let Some(epoch) = leases.acquire(3, "node-a", Duration::from_secs(10))? {
///     let partition = store.fenced(3, epoch, "node-a");
///     match partition.put(Key::new(b"p3", b"k"), b"v") {
///         Ok(()) => {}
///         Err(WriteError::Storage(KvError::Fenced { .. })) => { /* stop serving partition 3 */ }
///         Err(other) => return Err(other.into()),
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct FencedPgStore {
    core: Arc<Core>,
    fence: Fence,
}

impl FencedPgStore {
    pub(crate) fn new(core: Arc<Core>, partition: u32, epoch: u64, node_id: &str) -> FencedPgStore {
        FencedPgStore {
            core,
            fence: Fence::new(partition, epoch, node_id),
        }
    }

    /// The partition whose lease fences the writes.
    pub fn partition(&self) -> u32 {
        self.fence.partition
    }

    /// The epoch the lease must still have for a write to commit.
    pub fn epoch(&self) -> u64 {
        self.fence.epoch
    }
}

impl std::fmt::Debug for FencedPgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FencedPgStore")
            .field("location", &self.core.location)
            .field("partition", &self.fence.partition)
            .field("epoch", &self.fence.epoch)
            .finish_non_exhaustive()
    }
}

impl KvStore for FencedPgStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.core.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.core.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: std::ops::Bound<&[u8]>,
        to: std::ops::Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.core.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        self.core.write(batch, Some(&self.fence))
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.core
            .compare_and_swap(key, expected, new, Some(&self.fence))
    }

    /// Does nothing: every commit returned is already durable (`synchronous_commit = on`).
    fn sync(&self) -> Result<(), KvError> {
        Ok(())
    }
}
