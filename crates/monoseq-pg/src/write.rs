//! Applies a batch's [`Plan`] in one transaction with a bounded number of statements, whatever
//! the batch size: one multi-row statement per kind (conditional inserts, upserts, deletes)
//! over `unnest` of arrays, pipelined so that a batch costs one round trip, or two when it
//! has conditions (their answer decides between COMMIT and ROLLBACK).
//!
//! Isolation: READ COMMITTED is enough. A conditional insert decides on the unique index,
//! which sees committed and in-flight rows (it waits for a concurrent inserter of the same key
//! and then conflicts or not), not a snapshot; the other statements write blindly; and the
//! commit makes every row visible at once.

use std::collections::HashSet;

use futures_util::future::{join, join4};
use monoseq_kv::Key;
use tokio_postgres::Statement;
use tokio_postgres::types::ToSql;

use crate::error::Failure;
use crate::exec::Conn;
use crate::plan::{Condition, Plan};
use crate::store::Inner;

/// How a batch ended when the server answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Committed.
    Written,
    /// The item at this index found its key present; nothing was written.
    Conflict(usize),
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

/// Applies `plan` on one pooled connection.
pub(crate) async fn apply(inner: &Inner, plan: &Plan<'_>) -> Result<Outcome, Failure> {
    let conn = inner.conn().await?;
    let outcome = apply_on(inner, &conn, plan).await?;
    conn.release();
    Ok(outcome)
}

async fn apply_on(inner: &Inner, conn: &Conn, plan: &Plan<'_>) -> Result<Outcome, Failure> {
    if let Some(in_batch) = plan.conflict_in_batch {
        return conflict_without_writing(inner, conn, plan, in_batch).await;
    }
    let client = conn.client()?;
    let sql = &inner.sql;
    // Prepared (or found in the connection's cache) before the pipeline starts, so that no
    // preparation slips between its statements.
    let insert = match plan.conditions.is_empty() {
        true => None,
        false => Some(client.prepare_cached(&sql.insert_absent).await?),
    };
    let upsert = match plan.upserts.is_empty() {
        true => None,
        false => Some(client.prepare_cached(&sql.upsert).await?),
    };
    let delete = match plan.deletes.is_empty() {
        true => None,
        false => Some(client.prepare_cached(&sql.delete).await?),
    };
    let conditions = row_columns(plan.conditions.iter().map(|c| (c.key, c.value)));
    let upserts = row_columns(plan.upserts.iter().copied());
    let deletes = key_columns(plan.deletes.iter().copied());
    let Some(insert) = insert else {
        // No condition: one statement on its own is atomic; two go in one transaction, sent
        // together.
        match (&upsert, &delete) {
            (Some(_), None) | (None, Some(_)) => {
                execute_opt(conn, upsert.as_ref(), &params(&upserts)).await?;
                execute_opt(conn, delete.as_ref(), &params(&deletes)).await?;
            }
            _ => {
                let (begin, up, del, commit) = join4(
                    client.batch_execute("BEGIN"),
                    execute_opt(conn, upsert.as_ref(), &params(&upserts)),
                    execute_opt(conn, delete.as_ref(), &params(&deletes)),
                    client.batch_execute("COMMIT"),
                )
                .await;
                begin?;
                up?;
                del?;
                commit?;
            }
        }
        return Ok(Outcome::Written);
    };
    if upsert.is_none() && delete.is_none() && plan.conditions.len() == 1 {
        // One conditional insert on its own is atomic.
        let inserted = client.query(&insert, &params(&conditions)).await?;
        return Ok(match inserted.is_empty() {
            true => Outcome::Conflict(plan.conditions.first().map_or(0, |c| c.index)),
            false => Outcome::Written,
        });
    }
    let (begin, inserted) = join(
        client.batch_execute("BEGIN"),
        client.query(&insert, &params(&conditions)),
    )
    .await;
    begin?;
    let inserted = inserted?;
    if inserted.len() != plan.conditions.len() {
        let mut written: HashSet<(&[u8], &[u8])> = HashSet::with_capacity(inserted.len());
        for row in &inserted {
            written.insert((row.try_get(0)?, row.try_get(1)?));
        }
        client.batch_execute("ROLLBACK").await?;
        let absent = |c: &Condition<'_>| written.contains(&(c.key.partition, c.key.clustering));
        let index = plan.first_conflict(|c| !absent(c));
        return match index {
            Some(index) => Ok(Outcome::Conflict(index)),
            None => Err(Failure::Corrupted(
                "a conditional insert wrote fewer rows than asked, yet every key came back as \
                 written"
                    .to_owned(),
            )),
        };
    }
    let (up, del, commit) = futures_util::future::join3(
        execute_opt(conn, upsert.as_ref(), &params(&upserts)),
        execute_opt(conn, delete.as_ref(), &params(&deletes)),
        client.batch_execute("COMMIT"),
    )
    .await;
    up?;
    del?;
    commit?;
    Ok(Outcome::Written)
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
    let statement = client.prepare_cached(&inner.sql.stored_keys).await?;
    let keys = key_columns(plan.conditions.iter().map(|c| c.key));
    let rows = client.query(&statement, &params(&keys)).await?;
    let mut stored: HashSet<(&[u8], &[u8])> = HashSet::with_capacity(rows.len());
    for row in &rows {
        stored.insert((row.try_get(0)?, row.try_get(1)?));
    }
    let index = plan.first_conflict(|c| stored.contains(&(c.key.partition, c.key.clustering)));
    Ok(Outcome::Conflict(index.unwrap_or(in_batch)))
}
