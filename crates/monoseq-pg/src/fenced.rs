//! [`FencedPgStore`]: a view of a store whose every write commits only while the lease of one
//! partition still has the epoch the view was made with. Owns the fence check that rides in
//! each write's own transaction, and the error that names the lease's new holder.
//!
//! The check is one statement, sent in the same pipeline as the write (no extra round trip):
//!
//! ```sql
//! WITH held AS (UPDATE monoseq_leases SET writes = writes + 1
//!     WHERE partition = $1 AND epoch = $2 AND writes >= $3 AND node_id = $4 RETURNING writes)
//! SELECT 1 / count(*), max(writes) FROM held
//! ```
//!
//! The owner is checked beside the epoch because an epoch alone names a lease only while the
//! database keeps every acquisition: after it went back in time, the acquisition of an epoch it
//! lost can be made again by another node, and the first holder, still running, would pass a
//! check of the epoch alone.
//!
//! When the lease has another epoch or owner (or no row) it divides by zero: the error aborts the
//! transaction, every statement after it fails without writing, and the `COMMIT` sent with
//! them rolls back. Plain SQL, no procedural code, as the crate's other statements.
//!
//! The lease row also counts the fenced writes committed under it (`writes`; a transaction
//! that carries several batches of one view counts once), and the view remembers the highest
//! count it saw (`$3`). The count goes back only with the database: a
//! failover to a standby that was behind, or a restored backup. Then the view's next write is
//! refused like a takeover, before it can hand out numbers the database lost: the partition
//! stops, is taken again, and its new actualization finds the PLog below its high-water mark.
//!
//! Why READ COMMITTED with a row lock is enough: `acquire` changes the epoch with an `UPDATE`
//! of the lease row, which conflicts with the lock the write's own `UPDATE` holds to its
//! commit. A write that locked the row first keeps it until its commit, so the takeover waits
//! for that write to commit and its `UPDATE` then sees the lease as the write left it. A write
//! whose check meets a takeover in flight waits for it; PostgreSQL then re-evaluates the
//! `WHERE` on the newest committed row version, finds the new epoch and refuses. A write that
//! starts after the takeover committed reads the new epoch. So once `acquire` returned, no
//! write of an earlier epoch can commit, and every earlier one that committed did so before
//! the takeover: the new owner reads it. A server ends a transaction whose client vanished
//! after [`crate::IDLE_IN_TRANSACTION_TIMEOUT`], releasing the row.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use monoseq_kv::{CasError, Key, KvError, KvStore, Order, Visitor, WriteBatch, WriteError};
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;

use crate::error::Failure;
use crate::exec::Conn;
use crate::store::{Core, Inner};

/// The lease epoch a write needs: partition and epoch as the lease table stores them, and the
/// highest write count of the lease row the view saw.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    partition: u32,
    epoch: u64,
    /// The node the lease was acquired for.
    node_id: Arc<str>,
    seen: Arc<AtomicI64>,
}

impl Fence {
    /// The partition as the table's `integer` column takes it. No lease row has a negative
    /// partition ([`crate::LEASE_PARTITIONS_MAX`]), so an out-of-range one is always fenced.
    fn partition_param(&self) -> i32 {
        i32::try_from(self.partition).unwrap_or(-1)
    }

    /// The epoch as the table's `bigint` column takes it. No lease has a negative epoch, so an
    /// out-of-range one is always fenced.
    fn epoch_param(&self) -> i64 {
        i64::try_from(self.epoch).unwrap_or(-1)
    }

    /// Where a combined transaction (`combine.rs`) checks this fence among others: by
    /// partition, so that concurrent transactions lock lease rows in one order.
    pub(crate) fn order(&self) -> (u32, u64) {
        (self.partition, self.epoch)
    }

    /// Whether `other` is this view's own fence (same lease epoch, same count of writes seen):
    /// one check in a transaction serves both.
    pub(crate) fn same(&self, other: &Fence) -> bool {
        self.order() == other.order() && Arc::ptr_eq(&self.seen, &other.seen)
    }

    /// The fence check, prepared (or found in the connection's cache).
    pub(crate) async fn statement(&self, inner: &Inner, conn: &Conn) -> Result<Statement, Failure> {
        Ok(conn
            .client()?
            .prepare_cached(&inner.sql.leases.fence)
            .await?)
    }

    /// Runs the check inside the caller's open transaction: `Ok(true)` when the lease still
    /// has the epoch, the owner and at least the write count the view saw (its row is then
    /// locked to the commit), `Ok(false)` when it does not (the transaction is aborted and
    /// nothing after it writes).
    pub(crate) async fn check(&self, conn: &Conn, statement: &Statement) -> Result<bool, Failure> {
        let client = conn.client()?;
        let seen = self.seen.load(Ordering::Acquire);
        let result = client
            .query_one(
                statement,
                &[
                    &self.partition_param(),
                    &self.epoch_param(),
                    &seen,
                    &&*self.node_id,
                ],
            )
            .await;
        match result {
            Ok(row) => {
                // Raised even if the write then fails to commit: a count only rises, so one
                // that did not commit is still below every later one.
                let writes: i64 = row.try_get(1)?;
                self.seen
                    .fetch_max(writes.saturating_sub(1), Ordering::AcqRel);
                Ok(true)
            }
            Err(e) if e.code() == Some(&SqlState::DIVISION_BY_ZERO) => Ok(false),
            Err(e) => Err(Failure::Postgres(e)),
        }
    }

    /// The error of a write this fence refused, naming who holds the lease now (read after
    /// the refusal; best effort).
    pub(crate) fn error(&self, core: &Core) -> KvError {
        let (partition, epoch) = (self.partition, self.epoch);
        let holder = core.run(
            core.inner.call_timeout(),
            crate::lease::holder(&core.inner, self.partition_param()),
        );
        // Compared as the view's epoch, not as its parameter (an epoch past i64::MAX is -1).
        let newer = |held: i64| u64::try_from(held).is_ok_and(|held| held > epoch);
        let same = |held: i64| u64::try_from(held).is_ok_and(|held| held == epoch);
        let now = match holder {
            Ok(Some((held, Some(node)))) if newer(held) => {
                format!("a newer owner has epoch {held}: node {node:?}")
            }
            Ok(Some((held, None))) if newer(held) => {
                format!("a newer owner had epoch {held} and released it")
            }
            Ok(Some((held, None))) if same(held) => "the lease was released".to_owned(),
            Ok(Some((held, Some(node)))) if same(held) && *node != *self.node_id => {
                format!(
                    "node {node:?} holds this epoch: the database went back in time and lost \
                     this node's acquisition of the lease (a failover to a standby that was \
                     behind, or a restored backup?)"
                )
            }
            Ok(Some((held, _))) if same(held) => {
                "the lease row counts fewer writes than this node committed under it: the \
                 database went back in time and lost acknowledged writes (a failover to a \
                 standby that was behind, or a restored backup?)"
                    .to_owned()
            }
            Ok(Some((held, _))) => format!(
                "the lease has epoch {held}, which is not newer: this view's epoch did not come \
                 from Leases::acquire"
            ),
            Ok(None) => "the lease row is missing: call Leases::ensure_partitions".to_owned(),
            Err(failure) => format!(
                "the current holder could not be read: {}",
                failure.into_kv("reading a lease")
            ),
        };
        KvError::Fenced {
            message: format!("partition {partition} with epoch {epoch} ({now})"),
        }
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
            fence: Fence {
                partition,
                epoch,
                node_id: node_id.into(),
                seen: Arc::new(AtomicI64::new(0)),
            },
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
