//! Applies a batch's [`Plan`] in one transaction with a bounded number of statements, whatever
//! the batch size: one multi-row statement per kind (conditional inserts, upserts, deletes)
//! over `unnest` of arrays, pipelined so that a batch costs one round trip, or two when it
//! has conditions on several keys (their answer decides between COMMIT and ROLLBACK). A
//! fenced batch (`fenced.rs`) adds its lease check to the same pipeline, first in the
//! transaction.
//!
//! Isolation: READ COMMITTED is enough. A conditional insert decides on the unique index,
//! which sees committed and in-flight rows (it waits for a concurrent inserter of the same key
//! and then conflicts or not), not a snapshot; the other statements write blindly; and the
//! commit makes every row visible at once.

use std::collections::HashSet;

use futures_util::future::{join, join3, join4};
use monoseq_kv::Key;
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::error::Failure;
use crate::exec::Conn;
use crate::fenced::Fence;
use crate::plan::{Condition, Plan};
use crate::store::Inner;

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

async fn query_opt(
    conn: &Conn,
    statement: Option<&Statement>,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Vec<tokio_postgres::Row>>, Failure> {
    match statement {
        Some(statement) => Ok(Some(conn.client()?.query(statement, params).await?)),
        None => Ok(None),
    }
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

/// The fence check as it rides in a pipeline: `Ok(true)` without a fence.
async fn check_opt(conn: &Conn, fence: Option<(&Fence, &Statement)>) -> Result<bool, Failure> {
    match fence {
        Some((fence, statement)) => fence.check(conn, statement).await,
        None => Ok(true),
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

async fn apply_on(
    inner: &Inner,
    conn: &Conn,
    plan: &Plan<'_>,
    fence: Option<&Fence>,
) -> Result<Outcome, Failure> {
    if let Some(in_batch) = plan.conflict_in_batch {
        return conflict_without_writing(inner, conn, plan, in_batch).await;
    }
    let batch = Prepared::new(inner, conn, plan, fence).await?;
    let lone_insert = batch.upsert.is_none()
        && batch.delete.is_none()
        && batch.insert.is_some()
        && plan.conditions.len() == 1;
    match (&batch.check, &batch.insert) {
        (Some(_), None) => batch.in_one_round_trip().await,
        (Some(_), Some(_)) if lone_insert => batch.in_one_round_trip().await,
        (None, None) => batch.unconditional().await,
        (None, Some(insert)) if lone_insert => {
            // One conditional insert on its own is atomic.
            let inserted = conn
                .client()?
                .query(insert, &params(&batch.conditions))
                .await?;
            Ok(batch.lone_insert_outcome(inserted.is_empty()))
        }
        (_, Some(insert)) => batch.in_two_round_trips(insert).await,
    }
}

/// A batch ready to send: its statements prepared (or found in the connection's cache) before
/// any pipeline starts, so that no preparation slips between them, and their parameters.
struct Prepared<'a> {
    conn: &'a Conn,
    plan: &'a Plan<'a>,
    check: Option<(&'a Fence, Statement)>,
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
        fence: Option<&'a Fence>,
    ) -> Result<Prepared<'a>, Failure> {
        let client = conn.client()?;
        let sql = &inner.sql;
        let check = match fence {
            None => None,
            Some(fence) => Some((fence, fence.statement(inner, conn).await?)),
        };
        let mut statements = [None, None, None];
        let wanted = [
            (!plan.conditions.is_empty(), &sql.kv.insert_absent),
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
            plan,
            check,
            insert,
            upsert,
            delete,
            conditions: row_columns(plan.conditions.iter().map(|c| (c.key, c.value))),
            upserts: row_columns(plan.upserts.iter().copied()),
            deletes: key_columns(plan.deletes.iter().copied()),
        })
    }

    fn check(&self) -> Option<(&Fence, &Statement)> {
        self.check
            .as_ref()
            .map(|(fence, statement)| (*fence, statement))
    }

    fn lone_insert_outcome(&self, conflicted: bool) -> Outcome {
        match conflicted {
            true => Outcome::Conflict(self.plan.conditions.first().map_or(0, |c| c.index)),
            false => Outcome::Written,
        }
    }

    /// `BEGIN`, the fence, every statement and `COMMIT`, sent together. Only for a batch
    /// without conditions or with a lone conditional insert: one that conflicts writes
    /// nothing, so the `COMMIT` may follow it blindly.
    async fn in_one_round_trip(&self) -> Result<Outcome, Failure> {
        let (conn, client) = (self.conn, self.conn.client()?);
        let ((begin, held, inserted), (up, del, commit)) = join(
            join3(
                client.batch_execute("BEGIN"),
                check_opt(conn, self.check()),
                query_opt(conn, self.insert.as_ref(), &params(&self.conditions)),
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
        let inserted = inserted?;
        up?;
        del?;
        commit?;
        Ok(self.lone_insert_outcome(inserted.is_some_and(|rows| rows.is_empty())))
    }

    /// A batch without conditions or fence: one statement on its own is atomic; two go in one
    /// transaction, sent together.
    async fn unconditional(&self) -> Result<Outcome, Failure> {
        let (conn, client) = (self.conn, self.conn.client()?);
        let (upserts, deletes) = (params(&self.upserts), params(&self.deletes));
        let up = execute_opt(conn, self.upsert.as_ref(), &upserts);
        let del = execute_opt(conn, self.delete.as_ref(), &deletes);
        match (&self.upsert, &self.delete) {
            (Some(_), None) | (None, Some(_)) => {
                up.await?;
                del.await?;
            }
            _ => {
                let (begin, up, del, commit) = join4(
                    client.batch_execute("BEGIN"),
                    up,
                    del,
                    client.batch_execute("COMMIT"),
                )
                .await;
                begin?;
                up?;
                del?;
                commit?;
            }
        }
        Ok(Outcome::Written)
    }

    /// `BEGIN`, the fence if any, and the conditional inserts; then, on their answer,
    /// `ROLLBACK` or the other statements and `COMMIT`.
    async fn in_two_round_trips(&self, insert: &Statement) -> Result<Outcome, Failure> {
        let (conn, client) = (self.conn, self.conn.client()?);
        let (begin, held, inserted) = join3(
            client.batch_execute("BEGIN"),
            check_opt(conn, self.check()),
            client.query(insert, &params(&self.conditions)),
        )
        .await;
        begin?;
        if !held? {
            client.batch_execute("ROLLBACK").await?;
            return Ok(Outcome::Fenced);
        }
        let inserted = inserted?;
        if inserted.len() != self.plan.conditions.len() {
            return self.roll_back_conflict(&inserted).await;
        }
        let (up, del, commit) = join3(
            execute_opt(conn, self.upsert.as_ref(), &params(&self.upserts)),
            execute_opt(conn, self.delete.as_ref(), &params(&self.deletes)),
            client.batch_execute("COMMIT"),
        )
        .await;
        up?;
        del?;
        commit?;
        Ok(Outcome::Written)
    }

    /// Some conditional inserts conflicted: rolls back and names the first in batch order.
    async fn roll_back_conflict(
        &self,
        inserted: &[tokio_postgres::Row],
    ) -> Result<Outcome, Failure> {
        let mut written: HashSet<(&[u8], &[u8])> = HashSet::with_capacity(inserted.len());
        for row in inserted {
            written.insert((row.try_get(0)?, row.try_get(1)?));
        }
        self.conn.client()?.batch_execute("ROLLBACK").await?;
        let absent = |c: &Condition<'_>| written.contains(&(c.key.partition, c.key.clustering));
        match self.plan.first_conflict(|c| !absent(c)) {
            Some(index) => Ok(Outcome::Conflict(index)),
            None => Err(Failure::Corrupted(
                "a conditional insert wrote fewer rows than asked, yet every key came back as \
                 written"
                    .to_owned(),
            )),
        }
    }
}

/// A batch that conflicts within itself writes nothing: only the conditions before that
/// conflict are read, to report the first conflicting item.
async fn conflict_without_writing(
    inner: &Inner,
    conn: &Conn,
    plan: &Plan<'_>,
    in_batch: usize,
) -> Result<Outcome, Failure> {
    if plan.conditions.is_empty() {
        return Ok(Outcome::Conflict(in_batch));
    }
    let client = conn.client()?;
    let statement = client.prepare_cached(&inner.sql.kv.stored_keys).await?;
    let keys = key_columns(plan.conditions.iter().map(|c| c.key));
    let rows = client.query(&statement, &params(&keys)).await?;
    let mut stored: HashSet<(&[u8], &[u8])> = HashSet::with_capacity(rows.len());
    for row in &rows {
        stored.insert((row.try_get(0)?, row.try_get(1)?));
    }
    let index = plan.first_conflict(|c| stored.contains(&(c.key.partition, c.key.clustering)));
    Ok(Outcome::Conflict(index.unwrap_or(in_batch)))
}
