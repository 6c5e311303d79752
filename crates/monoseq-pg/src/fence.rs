//! [`Fence`]: the check that a write of a fenced view (`fenced.rs`) commits only while the
//! lease of its partition still has the epoch the view was made with. Owns the check that rides
//! in each write's own transaction, and the error that names the lease's new holder.
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

use monoseq_kv::KvError;
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;

use crate::core::Inner;
use crate::error::Failure;
use crate::exec::Conn;

/// The lease epoch a write needs: partition and epoch as the lease table stores them, and the
/// highest write count of the lease row the view saw.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) partition: u32,
    pub(crate) epoch: u64,
    /// The node the lease was acquired for.
    node_id: Arc<str>,
    seen: Arc<AtomicI64>,
}

impl Fence {
    /// The fence of a view of `partition` under the lease epoch `epoch` acquired for
    /// `node_id`, which has seen no write yet.
    pub(crate) fn new(partition: u32, epoch: u64, node_id: &str) -> Fence {
        Fence {
            partition,
            epoch,
            node_id: node_id.into(),
            seen: Arc::new(AtomicI64::new(0)),
        }
    }

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

    /// The epoch and node of the lease of this fence's partition; `None` when it has no row.
    pub(crate) async fn holder(
        &self,
        inner: &Inner,
    ) -> Result<Option<(i64, Option<String>)>, Failure> {
        let conn = inner.conn().await?;
        let client = conn.client()?;
        let statement = client.prepare_cached(&inner.sql.leases.holder).await?;
        let row = client
            .query_opt(&statement, &[&self.partition_param()])
            .await?;
        let holder = match row {
            Some(row) => Some((row.try_get(0)?, row.try_get(1)?)),
            None => None,
        };
        conn.release();
        Ok(holder)
    }

    /// The error of a write this fence refused, naming who holds the lease now (`holder`, read
    /// after the refusal with [`Fence::holder`]; best effort).
    pub(crate) fn error(&self, holder: Result<Option<(i64, Option<String>)>, Failure>) -> KvError {
        let (partition, epoch) = (self.partition, self.epoch);
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
