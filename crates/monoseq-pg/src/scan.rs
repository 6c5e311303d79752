//! Ordered scans of one partition as keyset pagination (`WHERE partition = $1 AND clustering >
//! $last … ORDER BY clustering LIMIT $n`), page after page, rows streamed to the visitor as
//! they arrive (borrowed from the driver's receive buffer, never collected). Owns the page
//! sizes and the rule that a scan fails only when the server makes no progress for a
//! statement timeout, however long the whole scan takes.

use std::ops::{Bound, ControlFlow};
use std::pin::pin;

use futures_util::{FutureExt, StreamExt};
use monoseq_kv::{Order, Visitor};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::core::Inner;
use crate::error::Failure;
use crate::exec::within;

/// Rows of a scan's first page: small, because many scans stop after a few entries (the last
/// entry of a log, a bounded read).
const PAGE_ROWS_FIRST: i64 = 256;
/// Each next page is this many times larger ...
const PAGE_ROWS_GROWTH: i64 = 8;
/// ... up to this many rows: what a visitor that stops early may leave unread, and what a
/// page costs the server to sort and send.
const PAGE_ROWS_MAX: i64 = 16_384;

/// Whether no clustering columns lie between the bounds (such scans ask the server nothing).
fn is_empty_range(from: Bound<&[u8]>, to: Bound<&[u8]>) -> bool {
    match (from, to) {
        (Bound::Included(a), Bound::Included(b)) => a > b,
        (Bound::Included(a), Bound::Excluded(b))
        | (Bound::Excluded(a), Bound::Included(b))
        | (Bound::Excluded(a), Bound::Excluded(b)) => a >= b,
        (_, Bound::Excluded(b)) => b.is_empty(),
        _ => false,
    }
}

fn bound_value(bound: Bound<&[u8]>) -> Option<&[u8]> {
    match bound {
        Bound::Included(b) | Bound::Excluded(b) => Some(b),
        Bound::Unbounded => None,
    }
}

/// Visits the entries of `partition` between the bounds in `order` (see
/// [`monoseq_kv::KvStore::scan`]).
pub(crate) async fn scan(
    inner: &Inner,
    partition: &[u8],
    from: Bound<&[u8]>,
    to: Bound<&[u8]>,
    order: Order,
    visit: &mut Visitor<'_>,
) -> Result<(), Failure> {
    if is_empty_range(from, to) {
        return Ok(());
    }
    let conn = inner.conn().await?;
    let client = conn.client()?;
    // The clustering of the last row of the previous page: the next page starts after it.
    let mut last: Option<Vec<u8>> = None;
    let mut limit = PAGE_ROWS_FIRST;
    loop {
        let resume = last.as_deref().map(Bound::Excluded);
        let (lower, upper) = match (order, resume) {
            (Order::Ascending, Some(after)) => (after, to),
            (Order::Descending, Some(before)) => (from, before),
            (_, None) => (from, to),
        };
        let statement = within(inner.statement_timeout, async {
            Ok(client
                .prepare_cached(inner.sql.scan(&lower, &upper, order))
                .await?)
        })
        .await?;
        let (lower_value, upper_value) = (bound_value(lower), bound_value(upper));
        let mut params: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(4);
        params.push(&partition);
        if let Some(value) = &lower_value {
            params.push(value);
        }
        if let Some(value) = &upper_value {
            params.push(value);
        }
        params.push(&limit);
        let rows = within(inner.statement_timeout, async {
            Ok(client.query_raw(&statement, params).await?)
        })
        .await?;
        let (seen, stopped, next_last) = visit_page(inner, rows, limit, &mut last, visit).await?;
        if stopped {
            // The rest of the page was read and dropped by the driver: the connection is in
            // step and goes back to the pool.
            break;
        }
        if seen < limit {
            break;
        }
        last = next_last;
        limit = (limit * PAGE_ROWS_GROWTH).min(PAGE_ROWS_MAX);
    }
    conn.release();
    Ok(())
}

/// Streams one page to `visit`: answers how many rows it saw, whether the visitor stopped, and
/// the clustering of the page's last row when the page was full (in `last`'s buffer).
async fn visit_page(
    inner: &Inner,
    rows: tokio_postgres::RowStream,
    limit: i64,
    last: &mut Option<Vec<u8>>,
    visit: &mut Visitor<'_>,
) -> Result<(i64, bool, Option<Vec<u8>>), Failure> {
    let mut rows = pin!(rows);
    let mut seen: i64 = 0;
    let mut next_last: Option<Vec<u8>> = None;
    while let Some(row) = next_row(inner, rows.as_mut()).await? {
        seen += 1;
        let clustering: &[u8] = row.try_get(0)?;
        let value: &[u8] = row.try_get(1)?;
        if visit(clustering, value) == ControlFlow::Break(()) {
            return Ok((seen, true, None));
        }
        if seen == limit {
            let mut buf = last.take().unwrap_or_default();
            buf.clear();
            buf.extend_from_slice(clustering);
            next_last = Some(buf);
        }
    }
    Ok((seen, false, next_last))
}

/// The next row of a page; waits at most a statement timeout when none is buffered yet.
async fn next_row(
    inner: &Inner,
    mut rows: std::pin::Pin<&mut tokio_postgres::RowStream>,
) -> Result<Option<Row>, Failure> {
    // Rows usually arrive many per network read: take a buffered one without arming a timer.
    if let Some(row) = rows.next().now_or_never() {
        return Ok(row.transpose()?);
    }
    within(inner.statement_timeout, async {
        Ok(rows.next().await.transpose()?)
    })
    .await
}
