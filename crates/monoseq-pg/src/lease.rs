//! [`Leases`]: partition ownership among several nodes on one database, as rows of
//! `monoseq_leases (partition, epoch, node_id, expires_at)`, and the node registry
//! `monoseq_nodes (node_id, url, seen_at, run_id, dir_id)`. Owns the lease statements and their guarantees:
//! every change of a lease is one conditional statement, every time is the database's clock
//! (`now()`), and every takeover increments the epoch that fences the writes
//! ([`crate::FencedPgStore`]).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join4;
use monoseq_kv::KvError;

use crate::core::Inner;
use crate::error::Failure;
use crate::store::{Core, PgStore};

/// Most partitions whose leases [`Leases::ensure_partitions`] creates (as many as a command
/// processor hosts).
pub const LEASE_PARTITIONS_MAX: u32 = 65_536;
/// Longest lease [`Leases::acquire`] and [`Leases::renew`] grant: past it a dead node blocks
/// its partitions too long.
pub const LEASE_DURATION_MAX: Duration = Duration::from_secs(3600);

/// The leases of partitions and the registry of nodes in a store's schema, made by
/// [`crate::PgStore::leases`]. Cheap to clone; the calls block like the store's and share its
/// connections and time limits.
///
/// A lease row is free (`node_id` null) or held by a node until `expires_at`. Its epoch
/// increments on every takeover and never otherwise, so a (partition, epoch) pair names one
/// ownership: writes fenced with it ([`crate::PgStore::fenced`]) stop committing as soon as
/// another node took the partition. Expiry is judged by the database's clock only, so the
/// nodes' clocks may disagree; a node should still renew well before its lease runs out
/// (for example every third of it) and stop serving a partition when a renewal did not
/// confirm it in time.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use monoseq_pg::{PgOptions, PgStore};
///
/// let store = PgStore::open("postgresql://monoseq:secret@db.example/monoseq", PgOptions::default())?;
/// let leases = store.leases();
/// let lease = Duration::from_secs(10);
/// leases.ensure_partitions(4)?;
/// leases.heartbeat("node-a", "run-1", "http://10.0.0.1:8080", lease)?;
/// let mut held = Vec::new();
/// for partition in 0..4 {
///     if let Some(epoch) = leases.acquire(partition, "node-a", lease)? {
///         held.push((partition, epoch));
///     }
/// }
/// let renewed = leases.renew("node-a", &held, lease)?;
/// held.retain(|(partition, _)| renewed.contains(partition));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Leases {
    core: Arc<Core>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases")
            .field("location", &self.core.location)
            .finish_non_exhaustive()
    }
}

/// A lease as [`Leases::status`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseStatus {
    /// The partition the lease is of.
    pub partition: u32,
    /// Incremented by every takeover; 0 until the first.
    pub epoch: u64,
    /// The node that holds or last held it; `None` when it is free.
    pub node_id: Option<String>,
    /// Milliseconds until it expires by the database's clock; zero or negative once expired.
    pub expires_in_ms: i64,
}

impl LeaseStatus {
    /// The node whose lease is live at the time of the status, if any.
    pub fn live_owner(&self) -> Option<&str> {
        self.node_id.as_deref().filter(|_| self.expires_in_ms > 0)
    }
}

/// A node as [`Leases::status`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct NodeStatus {
    /// The node's ID (what it gave to [`Leases::heartbeat`]).
    pub node_id: String,
    /// Where the node serves (what it gave to [`Leases::heartbeat`]).
    pub url: String,
    /// Milliseconds since its last heartbeat by the database's clock.
    pub seen_ago_ms: i64,
    /// The run (one start of the node's process) that heartbeats under the name.
    pub run_id: String,
    /// The identity of the directory whose lock the run held (empty: none recorded).
    pub dir_id: String,
}

/// Every lease and every node, read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClusterStatus {
    /// By partition.
    pub leases: Vec<LeaseStatus>,
    /// By node ID.
    pub nodes: Vec<NodeStatus>,
}

impl ClusterStatus {
    /// The lease of `partition`, if its row exists.
    pub fn lease(&self, partition: u32) -> Option<&LeaseStatus> {
        self.leases
            .iter()
            .find(|lease| lease.partition == partition)
    }

    /// The registered node `node_id`, if any.
    pub fn node(&self, node_id: &str) -> Option<&NodeStatus> {
        self.nodes.iter().find(|node| node.node_id == node_id)
    }
}

/// A caller's argument out of range, as the error the lease calls return.
fn invalid(message: String) -> KvError {
    KvError::Backend {
        message,
        source: None,
    }
}

fn partition_param(partition: u32) -> Result<i32, KvError> {
    i32::try_from(partition)
        .ok()
        .filter(|_| partition < LEASE_PARTITIONS_MAX)
        .ok_or_else(|| {
            invalid(format!(
                "partition {partition} has no lease: partitions go from 0 to \
                 {LEASE_PARTITIONS_MAX} (excluded)"
            ))
        })
}

fn lease_param(lease: Duration) -> Result<i64, KvError> {
    let ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    if ms == 0 || lease > LEASE_DURATION_MAX {
        return Err(invalid(format!(
            "a lease of {lease:?} is out of range: it must be at least 1 ms and at most \
             {LEASE_DURATION_MAX:?}"
        )));
    }
    Ok(ms)
}

/// The partitions and epochs of `held` as statement parameters.
fn held_params(held: &[(u32, u64)]) -> Result<(Vec<i32>, Vec<i64>), KvError> {
    let mut partitions = Vec::with_capacity(held.len());
    let mut epochs = Vec::with_capacity(held.len());
    for &(partition, epoch) in held {
        partitions.push(partition_param(partition)?);
        // No lease has an epoch past i64::MAX: such a pair is simply not renewed.
        epochs.push(i64::try_from(epoch).unwrap_or(-1));
    }
    Ok((partitions, epochs))
}

/// A partition column's value.
fn partition_of(partition: i32) -> Result<u32, Failure> {
    u32::try_from(partition)
        .map_err(|_| Failure::Corrupted(format!("the lease table holds partition {partition}")))
}

/// The partitions a renewal or release answered, in order.
fn partitions_answered(rows: Vec<i32>) -> Result<Vec<u32>, Failure> {
    let mut renewed = rows
        .into_iter()
        .map(partition_of)
        .collect::<Result<Vec<u32>, _>>()?;
    renewed.sort_unstable();
    Ok(renewed)
}

/// The partitions in the first column of `rows` (a renewal's or a release's), in order.
fn partitions_in_rows(rows: &[tokio_postgres::Row]) -> Result<Vec<u32>, Failure> {
    let partitions = rows
        .iter()
        .map(|row| row.try_get(0))
        .collect::<Result<Vec<i32>, _>>()?;
    partitions_answered(partitions)
}

/// A bigint column that must hold a non-negative number.
fn unsigned(value: i64, what: &str) -> Result<u64, Failure> {
    u64::try_from(value)
        .map_err(|_| Failure::Corrupted(format!("the lease table holds {what} {value}")))
}

/// Runs one statement text with `params` on a pooled connection; answers its rows.
async fn query(
    inner: &Inner,
    text: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<tokio_postgres::Row>, Failure> {
    let conn = inner.conn().await?;
    let client = conn.client()?;
    let statement = client.prepare_cached(text).await?;
    let rows = client.query(&statement, params).await?;
    conn.release();
    Ok(rows)
}

async fn status(inner: &Inner) -> Result<ClusterStatus, Failure> {
    let conn = inner.conn().await?;
    let client = conn.client()?;
    let sql = &inner.sql;
    let lease_statement = client.prepare_cached(&sql.leases.status).await?;
    let node_statement = client.prepare_cached(&sql.nodes.status).await?;
    // One snapshot for both reads, and one `now()`.
    let (begin, lease_rows, node_rows, commit) = join4(
        client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"),
        client.query(&lease_statement, &[]),
        client.query(&node_statement, &[]),
        client.batch_execute("COMMIT"),
    )
    .await;
    begin?;
    let (lease_rows, node_rows) = (lease_rows?, node_rows?);
    commit?;
    conn.release();
    let mut leases = Vec::with_capacity(lease_rows.len());
    for row in lease_rows {
        let partition: i32 = row.try_get(0)?;
        leases.push(LeaseStatus {
            partition: u32::try_from(partition).map_err(|_| {
                Failure::Corrupted(format!("the lease table holds partition {partition}"))
            })?,
            epoch: unsigned(row.try_get(1)?, "epoch")?,
            node_id: row.try_get(2)?,
            expires_in_ms: row.try_get(3)?,
        });
    }
    let mut nodes = Vec::with_capacity(node_rows.len());
    for row in node_rows {
        nodes.push(NodeStatus {
            node_id: row.try_get(0)?,
            url: row.try_get(1)?,
            seen_ago_ms: row.try_get(2)?,
            run_id: row.try_get(3)?,
            dir_id: row.try_get(4)?,
        });
    }
    Ok(ClusterStatus { leases, nodes })
}

impl PgStore {
    /// The partition leases and node registry of this database (tables `monoseq_leases` and
    /// `monoseq_nodes` in the store's schema), on the store's connections. Cheap to clone;
    /// usable from any thread.
    pub fn leases(&self) -> Leases {
        Leases::new(Arc::clone(&self.core))
    }
}

impl Leases {
    pub(crate) fn new(core: Arc<Core>) -> Leases {
        Leases { core }
    }

    fn run<T>(
        &self,
        context: &'static str,
        future: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, KvError> {
        self.core
            .run(self.core.inner.call_timeout(), future)
            .map_err(|f| f.into_kv(context))
    }

    /// Makes sure the leases of partitions `0..partitions` exist, creating the missing ones
    /// free with epoch 0; existing rows (and rows of higher partitions) are left as they are.
    /// Idempotent, and safe when several nodes call it at once (`INSERT … ON CONFLICT DO
    /// NOTHING`).
    ///
    /// # Errors
    ///
    /// A storage error when the database fails; [`KvError::Backend`] when `partitions` is over
    /// [`LEASE_PARTITIONS_MAX`].
    pub fn ensure_partitions(&self, partitions: u32) -> Result<(), KvError> {
        if partitions > LEASE_PARTITIONS_MAX {
            return Err(invalid(format!(
                "{partitions} partitions asked; at most {LEASE_PARTITIONS_MAX} have leases"
            )));
        }
        let count = i32::try_from(partitions).unwrap_or(i32::MAX);
        let text = &self.core.inner.sql.leases.ensure;
        self.run(
            "creating partition leases",
            query(&self.core.inner, text, &[&count]),
        )
        .map(drop)
    }

    /// Records that run `run_id` of node `node_id` is alive and serves at `url` (`seen_at` =
    /// the database's `now()`), only if the name is new, already this run's, or its last
    /// heartbeat is at least `stale` old; answers whether it did. One conditional statement:
    /// of two runs under one live name, only the one holding it keeps heartbeating.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails.
    pub fn heartbeat(
        &self,
        node_id: &str,
        run_id: &str,
        url: &str,
        stale: Duration,
    ) -> Result<bool, KvError> {
        self.claim(node_id, run_id, url, stale, "")
    }

    /// [`Leases::heartbeat`] of a run that holds the lock of the directory whose identity is
    /// `dir_id`, recorded with the run: it also takes a name recorded with the same `dir_id`
    /// (not empty) however fresh its heartbeat, because the run recorded there held that lock
    /// and so is dead. Only a run claiming its name calls it: a member heartbeats with
    /// [`Leases::heartbeat_and_renew`], which never takes a name by its directory.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails.
    pub fn claim(
        &self,
        node_id: &str,
        run_id: &str,
        url: &str,
        stale: Duration,
        dir_id: &str,
    ) -> Result<bool, KvError> {
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        let text = &self.core.inner.sql.nodes.heartbeat;
        self.run("recording a node's heartbeat", async {
            let rows = query(
                &self.core.inner,
                text,
                &[&node_id, &url, &run_id, &stale_ms, &dir_id],
            )
            .await?;
            Ok(!rows.is_empty())
        })
    }

    /// Removes the row of `node_id` from the registry if run `run_id` holds it (its leases
    /// are untouched: release them first, or let them expire).
    ///
    /// # Errors
    ///
    /// A storage error when the database fails.
    pub fn leave(&self, node_id: &str, run_id: &str) -> Result<(), KvError> {
        let text = &self.core.inner.sql.nodes.leave;
        self.run(
            "removing a node from the registry",
            query(&self.core.inner, text, &[&node_id, &run_id]),
        )
        .map(drop)
    }

    /// Takes the lease of `partition` for `node_id` for `lease`, only if it is free or expired
    /// by the database's clock: increments its epoch, sets the node and `expires_at = now() +
    /// lease`, and answers the new epoch. Answers `None` when a node holds it live, this one
    /// included (renew it instead). One conditional `UPDATE`: of concurrent calls at most one
    /// wins, and a live lease of another node is never taken.
    ///
    /// When it returns, no write fenced with an earlier epoch of the partition can commit any
    /// more, and every one that did is visible.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails (a failure after the statement left may still
    /// have taken the lease: it then shows in [`Leases::status`] and expires unused);
    /// [`KvError::Backend`] when `partition` is not below [`LEASE_PARTITIONS_MAX`] or `lease`
    /// is not between 1 ms and [`LEASE_DURATION_MAX`]. A partition whose row does not exist
    /// ([`Leases::ensure_partitions`]) answers `None`.
    pub fn acquire(
        &self,
        partition: u32,
        node_id: &str,
        lease: Duration,
    ) -> Result<Option<u64>, KvError> {
        let (partition, ms) = (partition_param(partition)?, lease_param(lease)?);
        let text = &self.core.inner.sql.leases.acquire;
        self.run("acquiring a partition lease", async {
            let rows = query(&self.core.inner, text, &[&partition, &node_id, &ms]).await?;
            match rows.first() {
                Some(row) => Ok(Some(unsigned(row.try_get(0)?, "epoch")?)),
                None => Ok(None),
            }
        })
    }

    /// [`Leases::acquire`] of each of `partitions` in one statement: the partitions taken with
    /// their new epochs, in partition order; one that a node holds live, or that has no row,
    /// is left out. The rows are locked in partition order, as renewals and combined writes
    /// lock them, so that none of them waits for another in a cycle. As with `acquire`, when it
    /// returns no write fenced with an earlier epoch of a partition taken can commit any more.
    ///
    /// # Errors
    ///
    /// As [`Leases::acquire`].
    pub fn acquire_many(
        &self,
        partitions: &[u32],
        node_id: &str,
        lease: Duration,
    ) -> Result<Vec<(u32, u64)>, KvError> {
        let ms = lease_param(lease)?;
        let partitions = partitions
            .iter()
            .map(|&p| partition_param(p))
            .collect::<Result<Vec<i32>, _>>()?;
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        let text = &self.core.inner.sql.leases.acquire_many;
        self.run("acquiring partition leases", async {
            let rows = query(&self.core.inner, text, &[&partitions, &node_id, &ms]).await?;
            let mut taken = Vec::with_capacity(rows.len());
            for row in rows {
                let partition = partition_of(row.try_get(0)?)?;
                taken.push((partition, unsigned(row.try_get(1)?, "epoch")?));
            }
            taken.sort_unstable();
            Ok(taken)
        })
    }

    /// Extends by `lease` (from the database's `now()`) every lease of `held` (partition,
    /// epoch) that `node_id` still holds with that epoch, in one statement; answers the
    /// partitions extended. A partition missing from the answer was lost (taken over, or
    /// released): stop serving it. A lease that expired but was not taken over still has its
    /// epoch and is extended, which is safe: nobody else wrote meanwhile.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails (then treat every lease as unconfirmed until
    /// it expires); [`KvError::Backend`] when a partition or `lease` is out of range (as in
    /// [`Leases::acquire`]).
    pub fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, KvError> {
        let ms = lease_param(lease)?;
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (partitions, epochs) = held_params(held)?;
        let text = &self.core.inner.sql.leases.renew;
        self.run("renewing partition leases", async {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] =
                [&node_id, &partitions, &epochs, &ms];
            partitions_in_rows(&query(&self.core.inner, text, &params).await?)
        })
    }

    /// [`Leases::heartbeat`] and, only when it was recorded, [`Leases::renew`], in one
    /// statement (one round trip): the partitions extended, or `None` when the name is another
    /// run's (nothing was extended). A node that heartbeats with every renewal confirms its name
    /// as often as its leases, however slow the database's answers. It keeps the directory
    /// identity its run claimed the name with ([`Leases::claim`]), and never takes a name by it.
    ///
    /// # Errors
    ///
    /// As [`Leases::heartbeat`] and [`Leases::renew`].
    pub fn heartbeat_and_renew(
        &self,
        node_id: &str,
        run_id: &str,
        url: &str,
        stale: Duration,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Option<Vec<u32>>, KvError> {
        let ms = lease_param(lease)?;
        let stale_ms = i64::try_from(stale.as_millis()).unwrap_or(i64::MAX);
        let (partitions, epochs) = held_params(held)?;
        let text = &self.core.inner.sql.leases.heartbeat_renew;
        self.run(
            "recording a node's heartbeat and renewing its leases",
            async {
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
                    &node_id,
                    &url,
                    &run_id,
                    &stale_ms,
                    &partitions,
                    &epochs,
                    &ms,
                ];
                let rows = query(&self.core.inner, text, &params).await?;
                let row = rows.first().ok_or_else(|| {
                    Failure::Corrupted("a heartbeat with renewal answered no row".to_owned())
                })?;
                if !row.try_get::<_, bool>(0)? {
                    return Ok(None);
                }
                let renewed: Vec<i32> = row.try_get(1)?;
                partitions_answered(renewed).map(Some)
            },
        )
    }

    /// Frees the lease of `partition` at once (no node, `expires_at = now()`), only if
    /// `node_id` still holds it with `epoch`; answers whether it did. The epoch stays: the
    /// next [`Leases::acquire`] increments it. Release only after the last write for the
    /// partition returned; writes fenced with `epoch` still commit until that acquire.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails; [`KvError::Backend`] when `partition` is out
    /// of range.
    pub fn release(&self, node_id: &str, partition: u32, epoch: u64) -> Result<bool, KvError> {
        let partition = partition_param(partition)?;
        let Ok(epoch) = i64::try_from(epoch) else {
            return Ok(false);
        };
        let text = &self.core.inner.sql.leases.release;
        self.run("releasing a partition lease", async {
            let conn = self.core.inner.conn().await?;
            let client = conn.client()?;
            let statement = client.prepare_cached(text).await?;
            let changed = client
                .execute(&statement, &[&partition, &node_id, &epoch])
                .await?;
            conn.release();
            Ok(changed == 1)
        })
    }

    /// [`Leases::release`] of each of `held` (partition, epoch) in one statement: answers the
    /// partitions freed, in partition order. A lease another node holds, or that `node_id`
    /// holds with another epoch, is left as it is. The rows are locked in partition order, as
    /// renewals, acquisitions and combined writes lock them.
    ///
    /// # Errors
    ///
    /// As [`Leases::release`].
    pub fn release_many(&self, node_id: &str, held: &[(u32, u64)]) -> Result<Vec<u32>, KvError> {
        if held.is_empty() {
            return Ok(Vec::new());
        }
        let (partitions, epochs) = held_params(held)?;
        let text = &self.core.inner.sql.leases.release_many;
        self.run("releasing partition leases", async {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
                [&node_id, &partitions, &epochs];
            partitions_in_rows(&query(&self.core.inner, text, &params).await?)
        })
    }

    /// Every lease (partition, epoch, node, milliseconds to expiry) and every registered node
    /// (ID, URL, milliseconds since its heartbeat), read in one snapshot with one `now()` of
    /// the database.
    ///
    /// # Errors
    ///
    /// A storage error when the database fails.
    pub fn status(&self) -> Result<ClusterStatus, KvError> {
        self.run("reading the partition leases", status(&self.core.inner))
    }
}
