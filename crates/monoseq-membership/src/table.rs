//! The lease table contract: partition leases with epochs and the node registry, kept by a
//! database whose clock alone judges expiry. [`crate::MemoryLeaseTable`] is its reference;
//! the binary holds the PostgreSQL one.

use std::fmt;
use std::time::Duration;

/// One partition's lease as the table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The partition.
    pub partition: u32,
    /// Its epoch: raised by every acquisition, never otherwise.
    pub epoch: u64,
    /// The holder or last holder (`None`: free).
    pub node_id: Option<String>,
    /// Milliseconds until the lease expires by the table's clock (zero or negative: expired).
    pub expires_in_ms: i64,
}

impl LeaseRow {
    /// The node whose lease is live at the time of the read, if any.
    #[must_use]
    pub fn live_owner(&self) -> Option<&str> {
        self.node_id.as_deref().filter(|_| self.expires_in_ms > 0)
    }
}

/// A node as the table knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    /// Its name.
    pub node_id: String,
    /// The run (process start) that last heartbeated under the name.
    pub run_id: String,
    /// Where it is reached.
    pub url: String,
    /// Milliseconds since its last heartbeat by the table's clock.
    pub seen_ms_ago: u64,
    /// The identity of the marks directory whose lock the run held when it claimed the name
    /// (empty: none recorded).
    pub dir_id: String,
}

/// A run's claim on its node's name, as [`LeaseTable::heartbeat_and_renew`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameClaim<'a> {
    /// The node's name.
    pub node_id: &'a str,
    /// This run.
    pub run_id: &'a str,
    /// Where it serves.
    pub url: &'a str,
    /// How old another run's last heartbeat must be for this run to take the name over.
    pub stale: Duration,
    /// The identity of the directory whose lock this run holds (empty: none). An earlier run
    /// that recorded the same identity held that lock too, so it is dead: a claim
    /// ([`LeaseTable::heartbeat`]) takes the name from it at once, without waiting for it to
    /// go stale.
    pub dir_id: &'a str,
}

/// Leases and nodes, read in one snapshot at one instant of the table's clock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableStatus {
    /// Every partition's lease, by partition.
    pub leases: Vec<LeaseRow>,
    /// Every node that has not left, by name.
    pub nodes: Vec<NodeRow>,
}

impl TableStatus {
    /// The lease of `partition`, if its row exists.
    #[must_use]
    pub fn lease(&self, partition: u32) -> Option<&LeaseRow> {
        self.leases.iter().find(|l| l.partition == partition)
    }

    /// The registered node `node_id`, if any.
    #[must_use]
    pub fn node(&self, node_id: &str) -> Option<&NodeRow> {
        self.nodes.iter().find(|n| n.node_id == node_id)
    }
}

/// A lease call that failed. It may still have been applied (its answer was lost): every
/// caller treats a failure as "unknown" and reads the table again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError {
    /// What failed, for the log.
    pub message: String,
}

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (the call may or may not have been applied; the next round reads the table again)",
            self.message
        )
    }
}

impl std::error::Error for TableError {}

/// The table of leases and nodes. Every call may block; every time is the table's clock, never
/// a node's; every change is one conditional step, so concurrent callers never both win.
///
/// Obligations of an implementation:
/// - `acquire` takes a partition only when it is free or expired, and raises its epoch; a
///   (partition, epoch) pair therefore names one acquisition by one caller.
/// - `renew` and `release` change a lease only when the caller holds it with the given epoch.
/// - `heartbeat` records the run under the name only when the name is new, already this run's,
///   its last heartbeat is older than `stale`, or it was recorded with the claim's non-empty
///   `dir_id`; it answers whether it did, and records the claim's `dir_id` with the run.
/// - `heartbeat_and_renew` is one step: it renews only when its heartbeat was recorded. Its
///   heartbeat never takes the name by `dir_id` (a member keeps its name by its run, so two
///   live runs that claim one directory cannot take the name from each other in turn).
/// - `status` reads every row in one snapshot at one instant.
pub trait LeaseTable: Send + Sync {
    /// Creates the free leases of partitions `0..partitions` that are missing.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn ensure_partitions(&self, partitions: u32) -> Result<(), TableError>;

    /// Records that the claiming run is alive now, if the name is free, this run's, stale (last
    /// seen `name.stale` ago or longer), or recorded with `name.dir_id` (not empty): the run
    /// there held the lock this run holds, so it is dead. Answers whether it did.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn heartbeat(&self, name: &NameClaim<'_>) -> Result<bool, TableError>;

    /// Forgets `node_id` if run `run_id` holds the name.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn leave(&self, node_id: &str, run_id: &str) -> Result<(), TableError>;

    /// Takes each of `partitions` for `lease` that is free or expired, raising its epoch; the
    /// partitions taken with their new epochs, in partition order. A partition whose lease
    /// another holder (or this node: renew it) holds live, or that has no row, is left out.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn acquire(
        &self,
        partitions: &[u32],
        node_id: &str,
        lease: Duration,
    ) -> Result<Vec<(u32, u64)>, TableError>;

    /// Extends by `lease` every lease of `held` (partition, epoch) that `node_id` still holds
    /// with that epoch; the partitions extended.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, TableError>;

    /// [`LeaseTable::heartbeat`] and, only when it was recorded, [`LeaseTable::renew`], in one
    /// step (one round trip): the partitions renewed, or `None` when the name is another
    /// run's (nothing was renewed).
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn heartbeat_and_renew(
        &self,
        name: &NameClaim<'_>,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Option<Vec<u32>>, TableError>;

    /// Frees at once each lease of `held` (partition, epoch) that `node_id` holds with that
    /// epoch, in one step; answers the partitions freed, in order.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn release(&self, node_id: &str, held: &[(u32, u64)]) -> Result<Vec<u32>, TableError>;

    /// Every lease and node, in one snapshot.
    ///
    /// # Errors
    ///
    /// When the table cannot be reached.
    fn status(&self) -> Result<TableStatus, TableError>;
}
