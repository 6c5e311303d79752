//! Applies a batch's [`Plan`] in one transaction with a bounded number of statements, whatever
//! the batch size: one multi-row statement per kind (inserts of absent keys, upserts, deletes)
//! over `unnest` of arrays, in one round trip. A batch of one statement without a fence is
//! that statement in autocommit; any other sends `BEGIN`, its statements and `COMMIT`
//! together. The inserts carry no `ON CONFLICT`: a present key fails the statement, which
//! aborts the transaction, so the `COMMIT` sent behind it rolls back without a second round
//! trip; only then are the keys read to name the first conflicting item. A fenced batch
//! (`fence.rs`) adds its lease check to the same pipeline, first in the transaction.
//!
//! Isolation: READ COMMITTED is enough. An insert decides on the unique index, which sees
//! committed and in-flight rows (it waits for a concurrent inserter of the same key and then
//! fails or not), not a snapshot; the other statements write blindly; and the commit makes
//! every row visible at once.

use std::collections::HashSet;

use futures_util::future::{join, join_all, join3};
use monoseq_kv::Key;
use tokio_postgres::Statement;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::core::Inner;
use crate::error::Failure;
use crate::exec::Conn;
use crate::fence::Fence;
use crate::plan::{Condition, Plan};

/// How a batch ended when the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Committed.
    Written,
    /// The item at this index found its key present; nothing was written.
    Conflict(usize),
    /// The fence found another lease epoch; nothing was written.
    Fenced,
}

/// Key columns of `keys`, as the `unnest` arrays take them.
fn key_columns<'a>(keys: impl ExactSizeIterator<Item = Key<'a>>) -> [Vec<&'a [u8]>; 2] {
    let mut columns = [
        Vec::with_capacity(keys.len()),
        Vec::with_capacity(keys.len()),
    ];
    for key in keys {
        columns[0].push(key.partition);
        columns[1].push(key.clustering);
    }
    columns
}

/// Rows of `(key, value)` pairs, as the `unnest` arrays take them.
fn row_columns<'a>(rows: impl ExactSizeIterator<Item = (Key<'a>, &'a [u8])>) -> [Vec<&'a [u8]>; 3] {
    let n = rows.len();
    let mut columns = [
        Vec::with_capacity(n),
        Vec::with_capacity(n),
        Vec::with_capacity(n),
    ];
    for (key, value) in rows {
        columns[0].push(key.partition);
        columns[1].push(key.clustering);
        columns[2].push(value);
    }
    columns
}

fn params<'a, const N: usize>(columns: &'a [Vec<&'a [u8]>; N]) -> [&'a (dyn ToSql + Sync); N] {
    std::array::from_fn(|i| &columns[i] as &(dyn ToSql + Sync))
}

async fn execute_opt(
    conn: &Conn,
    statement: Option<&Statement>,
    params: &[&(dyn ToSql + Sync)],
) -> Result<(), Failure> {
    if let Some(statement) = statement {
        conn.client()?.execute(statement, params).await?;
    }
    Ok(())
}

/// The fence checks as they ride in a pipeline, in order: `Ok(true)` when every one held (or
/// there is none). The first that fails aborts the transaction, so the ones after it fail
/// too: the first answer that is not a hold decides.
async fn check_all(conn: &Conn, checks: &[(&Fence, Statement)]) -> Result<bool, Failure> {
    let answers = join_all(
        checks
            .iter()
            .map(|(fence, statement)| fence.check(conn, statement)),
    )
    .await;
    for answer in answers {
        if !answer? {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Whether the server refused an insert because a key was present (SQLSTATE 23505): the
/// statement, and the transaction around it, wrote nothing.
fn is_key_present(failure: &Failure) -> bool {
    match failure {
        Failure::Postgres(e) => e.code() == Some(&SqlState::UNIQUE_VIOLATION),
        _ => false,
    }
}

/// Applies `plan` on one pooled connection, in a transaction that first checks `fence` when
/// there is one.
pub(crate) async fn apply(
    inner: &Inner,
    plan: &Plan<'_>,
    fence: Option<&Fence>,
) -> Result<Outcome, Failure> {
    let conn = inner.conn().await?;
    let outcome = apply_on(inner, &conn, plan, fence).await?;
    conn.release();
    Ok(outcome)
}

/// Applies `plan`, the union of several batches over distinct keys (`combine.rs`), on one
/// pooled connection, in one transaction that first checks every one of `fences` (distinct,
/// in lock order), in one round trip. Unlike [`apply`] it does not look for the item that
/// conflicted: a key found present is an error (the transaction wrote nothing), and the
/// batches then go each alone.
pub(crate) async fn apply_combined(
    inner: &Inner,
    plan: &Plan<'_>,
    fences: &[&Fence],
) -> Result<Outcome, Failure> {
    let conn = inner.conn().await?;
    let batch = Prepared::new(inner, &conn, plan, fences).await?;
    match batch.send().await {
        Err(failure) if is_key_present(&failure) => {
            // Every answer was read and the transaction rolled back: the connection is idle.
            conn.release();
            Err(failure)
        }
        Err(failure) => Err(failure),
        Ok(outcome) => {
            conn.release();
            Ok(outcome)
        }
    }
}

async fn apply_on(
    inner: &Inner,
    conn: &Conn,
    plan: &Plan<'_>,
    fence: Option<&Fence>,
) -> Result<Outcome, Failure> {
    if let Some(in_batch) = plan.conflict_in_batch {
        return conflict_without_writing(inner, conn, plan, in_batch).await;
    }
    let batch = Prepared::new(inner, conn, plan, fence.as_slice()).await?;
    let mut attempt = 1;
    loop {
        let written = batch.send().await;
        let failure = match written {
            Err(failure) if is_key_present(&failure) => failure,
            other => return other,
        };
        if let Some(index) = stored_conflict(inner, conn, plan).await? {
            return Ok(Outcome::Conflict(index));
        }
        // The present key was deleted before it could be named: the batch may fit now.
        if attempt >= CONFLICT_ATTEMPTS_MAX {
            return Err(failure);
        }
        attempt += 1;
    }
}

/// Attempts of a batch whose insert found a key present that a read right after no longer
/// finds (a concurrent delete): nothing was written, so it runs again.
const CONFLICT_ATTEMPTS_MAX: u32 = 3;

/// A batch ready to send: its statements prepared (or found in the connection's cache) before
/// any pipeline starts, so that no preparation slips between them, and their parameters.
struct Prepared<'a> {
    conn: &'a Conn,
    /// The fence checks, first in the transaction, in the order given.
    checks: Vec<(&'a Fence, Statement)>,
    insert: Option<Statement>,
    upsert: Option<Statement>,
    delete: Option<Statement>,
    conditions: [Vec<&'a [u8]>; 3],
    upserts: [Vec<&'a [u8]>; 3],
    deletes: [Vec<&'a [u8]>; 2],
}

impl<'a> Prepared<'a> {
    async fn new(
        inner: &Inner,
        conn: &'a Conn,
        plan: &'a Plan<'a>,
        fences: &[&'a Fence],
    ) -> Result<Prepared<'a>, Failure> {
        let client = conn.client()?;
        let sql = &inner.sql;
        let mut checks = Vec::with_capacity(fences.len());
        for fence in fences {
            checks.push((*fence, fence.statement(inner, conn).await?));
        }
        let mut statements = [None, None, None];
        let wanted = [
            (!plan.conditions.is_empty(), &sql.kv.insert_new),
            (!plan.upserts.is_empty(), &sql.kv.upsert),
            (!plan.deletes.is_empty(), &sql.kv.delete),
        ];
        for (slot, (wanted, text)) in statements.iter_mut().zip(wanted) {
            if wanted {
                *slot = Some(client.prepare_cached(text).await?);
            }
        }
        let [insert, upsert, delete] = statements;
        Ok(Prepared {
            conn,
            checks,
            insert,
            upsert,
            delete,
            conditions: row_columns(plan.conditions.iter().map(|c| (c.key, c.value))),
            upserts: row_columns(plan.upserts.iter().copied()),
            deletes: key_columns(plan.deletes.iter().copied()),
        })
    }

    /// How many statements write (inserts, upserts, deletes).
    fn statements(&self) -> usize {
        [&self.insert, &self.upsert, &self.delete]
            .iter()
            .filter(|s| s.is_some())
            .count()
    }

    /// Sends the batch: its only statement alone when it has no fence, else the whole
    /// transaction in one round trip.
    async fn send(&self) -> Result<Outcome, Failure> {
        match self.statements() {
            1 if self.checks.is_empty() => self.alone().await,
            _ => self.in_one_round_trip().await,
        }
    }

    /// The batch's only statement, without a fence, in autocommit: one statement is atomic.
    async fn alone(&self) -> Result<Outcome, Failure> {
        let conn = self.conn;
        execute_opt(conn, self.insert.as_ref(), &params(&self.conditions)).await?;
        execute_opt(conn, self.upsert.as_ref(), &params(&self.upserts)).await?;
        execute_opt(conn, self.delete.as_ref(), &params(&self.deletes)).await?;
        Ok(Outcome::Written)
    }

    /// `BEGIN`, the fences, every statement and `COMMIT`, sent together. A statement that fails
    /// (a fence, or an insert that finds a key present) aborts the transaction: the ones after
    /// it fail without writing and the `COMMIT` rolls it back.
    async fn in_one_round_trip(&self) -> Result<Outcome, Failure> {
        let (conn, client) = (self.conn, self.conn.client()?);
        let ((begin, held, inserted), (up, del, commit)) = join(
            join3(
                client.batch_execute("BEGIN"),
                check_all(conn, &self.checks),
                execute_opt(conn, self.insert.as_ref(), &params(&self.conditions)),
            ),
            join3(
                execute_opt(conn, self.upsert.as_ref(), &params(&self.upserts)),
                execute_opt(conn, self.delete.as_ref(), &params(&self.deletes)),
                client.batch_execute("COMMIT"),
            ),
        )
        .await;
        begin?;
        if !held? {
            // The failed check aborted the transaction; the COMMIT rolled it back.
            commit?;
            return Ok(Outcome::Fenced);
        }
        inserted?;
        up?;
        del?;
        commit?;
        Ok(Outcome::Written)
    }
}

/// The item a failed batch reports (nothing of it was written): the first in batch order
/// whose condition finds its key stored, or that conflicts within the batch; `None` when
/// there is neither.
async fn stored_conflict(
    inner: &Inner,
    conn: &Conn,
    plan: &Plan<'_>,
) -> Result<Option<usize>, Failure> {
    if plan.conditions.is_empty() {
        return Ok(plan.first_conflict(|_| false));
    }
    let client = conn.client()?;
    let statement = client.prepare_cached(&inner.sql.kv.stored_keys).await?;
    let keys = key_columns(plan.conditions.iter().map(|c| c.key));
    let rows = client.query(&statement, &params(&keys)).await?;
    let mut stored: HashSet<(&[u8], &[u8])> = HashSet::with_capacity(rows.len());
    for row in &rows {
        if row.try_get::<_, Option<bool>>(2)?.is_some() {
            stored.insert((row.try_get(0)?, row.try_get(1)?));
        }
    }
    Ok(plan
        .first_conflict(|c: &Condition<'_>| stored.contains(&(c.key.partition, c.key.clustering))))
}

/// A batch that conflicts within itself writes nothing: only the conditions before that
/// conflict are read, to report the first conflicting item.
async fn conflict_without_writing(
    inner: &Inner,
    conn: &Conn,
    plan: &Plan<'_>,
    in_batch: usize,
) -> Result<Outcome, Failure> {
    let index = stored_conflict(inner, conn, plan).await?;
    Ok(Outcome::Conflict(index.unwrap_or(in_batch)))
}
