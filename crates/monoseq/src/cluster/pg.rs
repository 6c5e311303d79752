//! [`PgLeaseTable`]: the membership's lease table on a PostgreSQL database (`monoseq_pg`'s
//! `Leases`, through a connection pool of its own), and the fenced store view of a partition.

use std::sync::Arc;
use std::time::Duration;

use monoseq_kv::KvError;
use monoseq_membership::{LeaseRow, LeaseTable, NameClaim, NodeRow, TableError, TableStatus};

use crate::base::Store;

/// Connections of the lease calls' own pool.
pub const LEASE_POOL_CONNECTIONS: usize = 2;

/// A lease table that can also give the store view whose writes are fenced by a lease.
pub trait FencedLeases: LeaseTable + 'static {
    /// The store view whose every write is conditional on `partition`'s lease still having
    /// `epoch` and `node_id` (the node it was acquired for) as its owner.
    fn fenced(&self, partition: u32, epoch: u64, node_id: &str) -> Store;
}

/// The leases of a PostgreSQL database.
pub struct PgLeaseTable {
    store: Arc<monoseq_pg::PgStore>,
    leases: monoseq_pg::Leases,
}

impl PgLeaseTable {
    /// The lease table of `store`'s database, reached through `own`: a store with a pool of
    /// its own, so that renewals never wait behind the partitions' writes for a connection.
    #[must_use]
    pub fn new(store: Arc<monoseq_pg::PgStore>, own: &monoseq_pg::PgStore) -> PgLeaseTable {
        PgLeaseTable {
            store,
            leases: own.leases(),
        }
    }
}

fn table_error(e: KvError) -> TableError {
    TableError {
        message: e.to_string(),
    }
}

impl LeaseTable for PgLeaseTable {
    fn ensure_partitions(&self, partitions: u32) -> Result<(), TableError> {
        self.leases
            .ensure_partitions(partitions)
            .map_err(table_error)
    }

    fn heartbeat(&self, name: &NameClaim<'_>) -> Result<bool, TableError> {
        self.leases
            .claim(name.node_id, name.run_id, name.url, name.stale, name.dir_id)
            .map_err(table_error)
    }

    fn leave(&self, node_id: &str, run_id: &str) -> Result<(), TableError> {
        self.leases.leave(node_id, run_id).map_err(table_error)
    }

    fn acquire(
        &self,
        partitions: &[u32],
        node_id: &str,
        lease: Duration,
    ) -> Result<Vec<(u32, u64)>, TableError> {
        self.leases
            .acquire_many(partitions, node_id, lease)
            .map_err(table_error)
    }

    fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, TableError> {
        self.leases.renew(node_id, held, lease).map_err(table_error)
    }

    fn heartbeat_and_renew(
        &self,
        name: &NameClaim<'_>,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Option<Vec<u32>>, TableError> {
        self.leases
            .heartbeat_and_renew(name.node_id, name.run_id, name.url, name.stale, held, lease)
            .map_err(table_error)
    }

    fn release(&self, node_id: &str, held: &[(u32, u64)]) -> Result<Vec<u32>, TableError> {
        self.leases.release_many(node_id, held).map_err(table_error)
    }

    fn status(&self) -> Result<TableStatus, TableError> {
        let status = self.leases.status().map_err(table_error)?;
        Ok(TableStatus {
            leases: status
                .leases
                .into_iter()
                .map(|l| LeaseRow {
                    partition: l.partition,
                    epoch: l.epoch,
                    node_id: l.node_id,
                    expires_in_ms: l.expires_in_ms,
                })
                .collect(),
            nodes: status
                .nodes
                .into_iter()
                .map(|n| NodeRow {
                    node_id: n.node_id,
                    run_id: n.run_id,
                    url: n.url,
                    seen_ms_ago: n.seen_ago_ms.max(0).unsigned_abs(),
                    dir_id: n.dir_id,
                })
                .collect(),
        })
    }
}

impl FencedLeases for PgLeaseTable {
    fn fenced(&self, partition: u32, epoch: u64, node_id: &str) -> Store {
        Arc::new(self.store.fenced(partition, epoch, node_id))
    }
}
