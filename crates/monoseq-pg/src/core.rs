//! What every operation of the crate shares, at the bottom of its modules: [`Inner`], the pool
//! of connections, the prepared statements' texts and the time limits; the read of many keys in
//! one query; and how often a write the server rolled back, or a compare-and-swap that lost a
//! race, is tried again. The store (`store.rs`), its views (`fenced.rs`, `lease.rs`), and the
//! writes (`write.rs`, `combine.rs`, `swap_each.rs`), scans (`scan.rs`) and fence checks
//! (`fence.rs`) all build on it, and it on none of them.

use std::time::Duration;

use deadpool_postgres::Pool;
use monoseq_kv::Key;

use crate::error::Failure;
use crate::exec::{Conn, within};
use crate::sql::Sql;

/// Attempts of a batch that the server rolled back for a serialization failure or a deadlock
/// (nothing of it was written, so it runs again).
pub(crate) const WRITE_ATTEMPTS_MAX: u32 = 5;
/// Attempts of a compare-and-swap whose comparison failed while a read right after found the
/// expected value again (a concurrent writer changed it back in between).
pub(crate) const CAS_ATTEMPTS_MAX: u32 = 64;

/// What every operation needs: the pool, the statements and the time limits.
pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) sql: Sql,
    pub(crate) connect_timeout: Duration,
    pub(crate) statement_timeout: Duration,
}

impl Inner {
    /// Longest a call that is not a scan may take: a connection, then its statements.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.connect_timeout + self.statement_timeout
    }

    pub(crate) async fn conn(&self) -> Result<Conn, Failure> {
        within(self.connect_timeout, Conn::get(&self.pool)).await
    }
}

/// The stored values of `keys` in order (`None` where absent), in one query on `conn`;
/// `what` names the operation in the error of an answer naming no key asked for.
pub(crate) async fn read_many<'a>(
    inner: &Inner,
    conn: &Conn,
    keys: impl ExactSizeIterator<Item = Key<'a>>,
    what: &str,
) -> Result<Vec<Option<Vec<u8>>>, Failure> {
    let mut values = vec![None; keys.len()];
    let (partitions, clusterings): (Vec<&[u8]>, Vec<&[u8]>) =
        keys.map(|k| (k.partition, k.clustering)).unzip();
    let client = conn.client()?;
    let statement = client.prepare_cached(&inner.sql.kv.get_many).await?;
    let rows = client
        .query(&statement, &[&partitions, &clusterings])
        .await?;
    for row in rows {
        let ordinal: i64 = row.try_get(0)?;
        let slot = usize::try_from(ordinal - 1)
            .ok()
            .and_then(|i| values.get_mut(i))
            .ok_or_else(|| {
                Failure::Corrupted(format!("{what}: the server answered key number {ordinal}"))
            })?;
        // Every key has a row; an absent one has no value (the column is never null).
        *slot = row.try_get::<_, Option<Vec<u8>>>(1)?;
    }
    Ok(values)
}
