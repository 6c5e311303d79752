//! [`MemoryLeaseTable`]: the reference lease table, a mutex over plain rows on a clock the
//! caller sets (a simulated database clock). Kept obviously right: it is the oracle the
//! simulation trusts.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::table::{LeaseRow, LeaseTable, NameClaim, NodeRow, TableError, TableStatus};

/// A lease row: epoch, holder, expiry in the table's milliseconds.
#[derive(Debug, Clone, Default)]
struct Lease {
    epoch: u64,
    node_id: Option<String>,
    expires_at_ms: u64,
}

/// A node row.
#[derive(Debug, Clone)]
struct Node {
    run_id: String,
    url: String,
    seen_at_ms: u64,
    dir_id: String,
}

#[derive(Debug, Default)]
struct Rows {
    now_ms: u64,
    leases: BTreeMap<u32, Lease>,
    nodes: BTreeMap<String, Node>,
}

impl Rows {
    /// A heartbeat of `name`; `by_dir`: a claim that may take the name from a run recorded
    /// with its directory (not a member's heartbeat).
    fn heartbeat(&mut self, name: &NameClaim<'_>, by_dir: bool) -> bool {
        let now = self.now_ms;
        let claimable = self.nodes.get(name.node_id).is_none_or(|n| {
            n.run_id == name.run_id
                || now.saturating_sub(n.seen_at_ms) >= ms(name.stale)
                || (by_dir && !name.dir_id.is_empty() && n.dir_id == name.dir_id)
        });
        if claimable {
            // A member's heartbeat keeps the identity its run claimed the name with, and
            // records none when it takes a stale name over (as the PostgreSQL table does).
            let dir_id = match self.nodes.get(name.node_id) {
                _ if by_dir => name.dir_id.to_owned(),
                Some(n) if n.run_id == name.run_id => n.dir_id.clone(),
                _ => String::new(),
            };
            self.nodes.insert(
                name.node_id.to_owned(),
                Node {
                    run_id: name.run_id.to_owned(),
                    url: name.url.to_owned(),
                    seen_at_ms: now,
                    dir_id,
                },
            );
        }
        claimable
    }

    fn renew(&mut self, node_id: &str, held: &[(u32, u64)], lease: Duration) -> Vec<u32> {
        let now = self.now_ms;
        let mut renewed = Vec::new();
        for &(p, epoch) in held {
            if let Some(l) = self.leases.get_mut(&p)
                && l.epoch == epoch
                && l.node_id.as_deref() == Some(node_id)
            {
                l.expires_at_ms = now + ms(lease);
                renewed.push(p);
            }
        }
        renewed.sort_unstable();
        renewed
    }
}

/// The in-memory lease table. Its clock stands still until [`MemoryLeaseTable::set_now`]
/// moves it.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use monoseq_membership::{LeaseTable, MemoryLeaseTable};
///
/// let table = MemoryLeaseTable::new();
/// table.ensure_partitions(2)?;
/// let lease = Duration::from_millis(1_000);
/// assert_eq!(table.acquire(&[0, 1], "a", lease)?, [(0, 1), (1, 1)]);
/// assert_eq!(table.acquire(&[0], "b", lease)?, [], "a's lease is live");
/// table.set_now(1_000);
/// assert_eq!(table.acquire(&[0], "b", lease)?, [(0, 2)], "expired: b takes it");
/// assert!(!table.write_allowed(0, 1, "a"), "a's writes are fenced off");
/// assert!(table.write_allowed(0, 2, "b"));
/// # Ok::<(), monoseq_membership::TableError>(())
/// ```
#[derive(Debug, Default)]
pub struct MemoryLeaseTable {
    rows: Mutex<Rows>,
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl MemoryLeaseTable {
    /// An empty table at time 0.
    #[must_use]
    pub fn new() -> MemoryLeaseTable {
        MemoryLeaseTable::default()
    }

    fn rows(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Moves the table's clock to `now_ms`.
    ///
    /// # Panics
    ///
    /// When `now_ms` is earlier than the clock: a database clock does not go back.
    pub fn set_now(&self, now_ms: u64) {
        let mut rows = self.rows();
        assert!(now_ms >= rows.now_ms, "the table's clock went back");
        rows.now_ms = now_ms;
    }

    /// The table's clock.
    #[must_use]
    pub fn now(&self) -> u64 {
        self.rows().now_ms
    }

    /// The fence: whether a write of `partition` under `epoch` by `node_id` commits (the lease
    /// still has that epoch and that owner, as `monoseq_pg`'s fence checks; expiry does not
    /// matter, as nobody else can have written meanwhile).
    #[must_use]
    pub fn write_allowed(&self, partition: u32, epoch: u64, node_id: &str) -> bool {
        self.rows()
            .leases
            .get(&partition)
            .is_some_and(|l| l.epoch == epoch && l.node_id.as_deref() == Some(node_id))
    }

    /// The lease of `partition`: epoch, holder, and whether it is live now.
    #[must_use]
    pub fn lease(&self, partition: u32) -> Option<(u64, Option<String>, bool)> {
        let rows = self.rows();
        rows.leases
            .get(&partition)
            .map(|l| (l.epoch, l.node_id.clone(), l.expires_at_ms > rows.now_ms))
    }

    /// The run that holds `node_id`'s name, with its last heartbeat.
    #[must_use]
    pub fn node(&self, node_id: &str) -> Option<(String, u64)> {
        self.rows()
            .nodes
            .get(node_id)
            .map(|n| (n.run_id.clone(), n.seen_at_ms))
    }
}

impl LeaseTable for MemoryLeaseTable {
    fn ensure_partitions(&self, partitions: u32) -> Result<(), TableError> {
        let mut rows = self.rows();
        let now = rows.now_ms;
        for p in 0..partitions {
            rows.leases.entry(p).or_insert(Lease {
                expires_at_ms: now,
                ..Lease::default()
            });
        }
        Ok(())
    }

    fn heartbeat(&self, name: &NameClaim<'_>) -> Result<bool, TableError> {
        Ok(self.rows().heartbeat(name, true))
    }

    fn leave(&self, node_id: &str, run_id: &str) -> Result<(), TableError> {
        let mut rows = self.rows();
        if rows.nodes.get(node_id).is_some_and(|n| n.run_id == run_id) {
            rows.nodes.remove(node_id);
        }
        Ok(())
    }

    fn acquire(
        &self,
        partitions: &[u32],
        node_id: &str,
        lease: Duration,
    ) -> Result<Vec<(u32, u64)>, TableError> {
        let mut rows = self.rows();
        let now = rows.now_ms;
        let mut taken = Vec::new();
        for &p in partitions {
            if let Some(l) = rows.leases.get_mut(&p)
                && (l.node_id.is_none() || l.expires_at_ms <= now)
            {
                l.epoch += 1;
                l.node_id = Some(node_id.to_owned());
                l.expires_at_ms = now + ms(lease);
                taken.push((p, l.epoch));
            }
        }
        taken.sort_unstable();
        Ok(taken)
    }

    fn renew(
        &self,
        node_id: &str,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Vec<u32>, TableError> {
        Ok(self.rows().renew(node_id, held, lease))
    }

    fn heartbeat_and_renew(
        &self,
        name: &NameClaim<'_>,
        held: &[(u32, u64)],
        lease: Duration,
    ) -> Result<Option<Vec<u32>>, TableError> {
        let mut rows = self.rows();
        Ok(rows
            .heartbeat(name, false)
            .then(|| rows.renew(name.node_id, held, lease)))
    }

    fn release(&self, node_id: &str, held: &[(u32, u64)]) -> Result<Vec<u32>, TableError> {
        let mut rows = self.rows();
        let now = rows.now_ms;
        let mut released = Vec::new();
        for &(p, epoch) in held {
            if let Some(l) = rows.leases.get_mut(&p)
                && l.epoch == epoch
                && l.node_id.as_deref() == Some(node_id)
            {
                l.node_id = None;
                l.expires_at_ms = now;
                released.push(p);
            }
        }
        released.sort_unstable();
        Ok(released)
    }

    fn status(&self) -> Result<TableStatus, TableError> {
        let rows = self.rows();
        let now = rows.now_ms;
        let since =
            |t: u64| i64::try_from(t).unwrap_or(i64::MAX) - i64::try_from(now).unwrap_or(i64::MAX);
        Ok(TableStatus {
            leases: rows
                .leases
                .iter()
                .map(|(p, l)| LeaseRow {
                    partition: *p,
                    epoch: l.epoch,
                    node_id: l.node_id.clone(),
                    expires_in_ms: since(l.expires_at_ms),
                })
                .collect(),
            nodes: rows
                .nodes
                .iter()
                .map(|(id, n)| NodeRow {
                    node_id: id.clone(),
                    run_id: n.run_id.clone(),
                    url: n.url.clone(),
                    seen_ms_ago: now.saturating_sub(n.seen_at_ms),
                    dir_id: n.dir_id.clone(),
                })
                .collect(),
        })
    }
}
