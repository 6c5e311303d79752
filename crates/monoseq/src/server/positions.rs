//! Consumer positions over HTTP: `GET` and `PUT /v1/consumers/{name}/partitions/{p}`, the
//! listings `GET /v1/consumers/{name}` and `GET /v1/consumers` (every consumer, with each
//! partition's end and the lag), and `DELETE /v1/consumers/{name}`, answered by any node
//! straight from the shared store (the compare-and-swap decides between writers, so no write
//! is forwarded to a partition's owner); and each consumer's lag behind its partition's end
//! for `/metrics`, at most [`CONSUMER_LAG_SERIES_MAX`] series.
//!
//! A refused compare-and-set is `409 position_conflict` with the stored position; a `PUT`
//! that would move a position back without `"force": true` is `409 position_backwards`, also
//! with the stored position (a 409 rather than a 400: whether it is backwards depends on what
//! is stored, and the client's next step is the same, read and decide). A `PUT` at or beyond
//! the partition's end is `409 position_beyond_end` with the end, forced or not. A consumer
//! group's position on a partition one of its members holds is `409 partition_held` to a `PUT`
//! or `DELETE` (forced or not): only the member's commits move it, so nothing a consumer sends
//! moves a group's position under its holder. The end is
//! the owner's: a node that does not own the partition accepts a position below the end it
//! knows (a lower bound), and asks the owner for anything above (a page read from `end`, as
//! it relays reads); while the partition moves between nodes it answers 503, having written
//! nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use monoseq_cp::CommandProcessor;
use monoseq_kv::KvError;
use monoseq_store::{ConsumerName, PartitionId, PositionError, SetPosition};
use monoseq_wire::{
    CONSUMERS_PAGE_POSITIONS_MAX, ConsumerBody, ConsumerPartitionBody, ConsumersBody,
    DeletedConsumerBody, ErrorCode, PartitionPositionBody, PositionBeyondEndBody, PositionBody,
    PositionConflictBody, PositionsBody, PutPositionBody, RemovedPositionBody,
};

use super::AppState;
use super::answers::with_retry_after;
use super::consume;
use crate::base::{chain, error};
use crate::config::Store;
use crate::query;

/// Most `monoseq_consumer_lag_events` series one `/metrics` answer carries (consumer ×
/// partition pairs, in consumer name then partition order): it bounds the scrape's size and
/// the store read behind it. Past it, `monoseq_consumer_lag_truncated` is 1.
pub(super) const CONSUMER_LAG_SERIES_MAX: usize = 1_000;
/// Owners asked at once for their partitions' ends by one `GET /v1/consumers`.
const ENDS_ASKED_AT_ONCE: usize = 16;

/// `GET /v1/consumers/{name}/partitions/{partition}`.
pub(super) async fn get_position(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let (consumer, partition) = match consumer_partition(&st, path) {
        Ok(cp) => cp,
        Err((status, code, message)) => return error(status, code, message),
    };
    let store = st.cp.store().clone();
    let name = consumer.clone();
    let read = tokio::task::spawn_blocking(move || store.position(&name, partition)).await;
    match read {
        Ok(Ok(Some(offset))) => axum::Json(PositionBody { offset }).into_response(),
        Ok(Ok(None)) => error(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownConsumer,
            format!(
                "consumer {consumer} has no position on partition {partition}: set one with \
                 PUT and no \"expected\""
            ),
        ),
        Ok(Err(e)) => position_error(&st, &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}

/// `PUT /v1/consumers/{name}/partitions/{partition}`: a compare-and-set of the position.
pub(super) async fn put_position(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (consumer, partition) = match consumer_partition(&st, path) {
        Ok(cp) => cp,
        Err((status, code, message)) => return error(status, code, message),
    };
    let put = match put_body(&headers, body) {
        Ok(put) => put,
        Err((status, code, message)) => return error(status, code, message),
    };
    let end = match end_above(&st, partition.0, put.offset).await {
        Ok(end) => end,
        Err(r) => return r,
    };
    let store = st.cp.store().clone();
    let set = SetPosition {
        offset: put.offset,
        expected: put.expected,
        force: put.force,
    };
    let write = tokio::task::spawn_blocking(move || {
        let written = store.set_position_below(&consumer, partition, set, end);
        if let Err(PositionError::Storage(KvError::OutcomeUnknown { .. })) = &written {
            // Landed or not: read it back, so that a write that landed is answered as done
            // (a 503 says nothing changed).
            if let Ok(Some(stored)) = store.position(&consumer, partition)
                && stored == set.offset
            {
                return Ok(());
            }
        }
        written
    })
    .await;
    match write {
        Ok(Ok(())) => axum::Json(PositionBody { offset: put.offset }).into_response(),
        Ok(Err(e)) => position_error(&st, &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}

/// `GET /v1/consumers/{name}`: every position of the consumer, in partition order.
pub(super) async fn get_positions(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let consumer = match consumer_of(path) {
        Ok(c) => c,
        Err((status, code, message)) => return error(status, code, message),
    };
    let store = st.cp.store().clone();
    let name = consumer.clone();
    let read = tokio::task::spawn_blocking(move || store.positions(&name)).await;
    match read {
        Ok(Ok(positions)) if positions.is_empty() => error(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownConsumer,
            format!("consumer {consumer} has no position on any partition"),
        ),
        Ok(Ok(positions)) => axum::Json(PositionsBody {
            consumer: consumer.to_string(),
            partitions: positions
                .into_iter()
                .map(|(partition, offset)| PartitionPositionBody {
                    partition: partition.0,
                    offset,
                })
                .collect(),
        })
        .into_response(),
        Ok(Err(e)) => position_error(&st, &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}

/// The end of `partition` to check a new position `offset` against: the end this node knows
/// (its own when it owns the partition, else a lower bound) when `offset` is below it, else
/// the owner's (asked; 503 while the partition moves between nodes).
async fn end_above(st: &Arc<AppState>, partition: u32, offset: u64) -> Result<u64, Response> {
    let known = consume::known_end(st, partition);
    if offset < known {
        return Ok(known);
    }
    consume::partition_end(st, partition)
        .await
        .map_err(IntoResponse::into_response)
}

/// `GET /v1/consumers[?after=NAME]`: every consumer's positions, each with its partition's
/// end and the lag, in name then partition order; at most [`CONSUMERS_PAGE_POSITIONS_MAX`]
/// positions, whole consumers but for one alone over it.
pub(super) async fn list_consumers(
    State(st): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
) -> Response {
    let after = match query::params(raw.as_deref(), query::CONSUMERS_PARAMS) {
        Ok(q) => q.get("after").map(ConsumerName::new).transpose(),
        Err(r) => return r,
    };
    let after = match after {
        Ok(after) => after,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!("`after` is the last consumer name of the page before: {e}"),
            );
        }
    };
    let store = st.cp.store().clone();
    // One more than a page: the first position of the next page tells whether the page's
    // last consumer goes on past it.
    let read = tokio::task::spawn_blocking(move || {
        store.positions_after(after.as_ref(), CONSUMERS_PAGE_POSITIONS_MAX + 1)
    })
    .await;
    let mut positions = match read {
        Ok(Ok((positions, _))) => positions,
        Ok(Err(e)) => return position_error(&st, &e),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    };
    let more = positions.len() > CONSUMERS_PAGE_POSITIONS_MAX;
    if let Some(next) = positions.get(CONSUMERS_PAGE_POSITIONS_MAX).cloned() {
        positions.truncate(CONSUMERS_PAGE_POSITIONS_MAX);
        // A consumer going on past the page is listed whole on the next one, unless it is
        // alone on this one.
        if positions.first().map(|p| &p.consumer) != Some(&next.consumer) {
            positions.retain(|p| p.consumer != next.consumer);
        }
    }
    let ends = partition_ends(&st, &positions).await;
    let mut consumers: Vec<ConsumerBody> = Vec::new();
    for p in positions {
        let end = ends.get(&p.partition.0).copied().flatten();
        let entry = ConsumerPartitionBody {
            partition: p.partition.0,
            offset: p.offset,
            end,
            lag: end.map(|end| lag(end, p.offset)),
        };
        match consumers.last_mut() {
            Some(c) if c.name == p.consumer.as_str() => c.partitions.push(entry),
            _ => consumers.push(ConsumerBody {
                name: p.consumer.to_string(),
                partitions: vec![entry],
            }),
        }
    }
    axum::Json(ConsumersBody {
        consumers,
        truncated: more,
    })
    .into_response()
}

/// Events of a partition whose end is `end` written after position `offset`: events are
/// offsets 1 to `end - 1`, and the consumer processed those up to `offset`.
fn lag(end: u64, offset: u64) -> u64 {
    end.saturating_sub(1).saturating_sub(offset)
}

/// The end of each partition `positions` name, as its owner knows it (`None`: no node could
/// tell); owners are asked [`ENDS_ASKED_AT_ONCE`] at a time.
async fn partition_ends(
    st: &Arc<AppState>,
    positions: &[monoseq_store::ConsumerPosition],
) -> std::collections::HashMap<u32, Option<u64>> {
    let mut partitions: Vec<u32> = positions.iter().map(|p| p.partition.0).collect();
    partitions.sort_unstable();
    partitions.dedup();
    let mut ends = std::collections::HashMap::with_capacity(partitions.len());
    for chunk in partitions.chunks(ENDS_ASKED_AT_ONCE) {
        let asked = chunk
            .iter()
            .map(|&p| async move { (p, consume::partition_end(st, p).await.ok()) });
        ends.extend(futures_util::future::join_all(asked).await);
    }
    ends
}

/// `DELETE /v1/consumers/{name}`: deletes every position of the consumer (and its lag
/// series), answering what was deleted; 404 `unknown_consumer` when it has none.
pub(super) async fn delete_consumer(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let consumer = match consumer_of(path) {
        Ok(c) => c,
        Err((status, code, message)) => return error(status, code, message),
    };
    let store = st.cp.store().clone();
    let name = consumer.clone();
    let deleted = tokio::task::spawn_blocking(move || store.delete_positions(&name)).await;
    let removed = match deleted {
        Ok(Ok(removed)) => removed,
        Ok(Err(e)) => return position_error(&st, &e),
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    };
    if removed.is_empty() {
        return error(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownConsumer,
            format!("consumer {consumer} has no position on any partition: nothing to delete"),
        );
    }
    for (partition, _) in &removed {
        st.metrics.consumer_lag.remove(&vec![
            ("consumer".to_owned(), consumer.to_string()),
            ("partition".to_owned(), partition.0.to_string()),
        ]);
    }
    tracing::info!(
        consumer = %consumer,
        positions = removed.len(),
        "consumer deleted: its positions and lag series are removed"
    );
    axum::Json(DeletedConsumerBody {
        consumer: consumer.to_string(),
        removed: removed
            .into_iter()
            .map(|(partition, offset)| RemovedPositionBody {
                partition: partition.0,
                offset,
            })
            .collect(),
    })
    .into_response()
}

/// The consumer a `/v1/consumers/{name}` path names, or why it is refused (400).
fn consumer_of(path: Result<Path<String>, PathRejection>) -> Result<ConsumerName, Refusal> {
    match path {
        Ok(Path(name)) => ConsumerName::new(&name).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                e.to_string(),
            )
        }),
        Err(e) => Err(bad_path(&e)),
    }
}

/// A refused request: status, stable code and message.
type Refusal = (StatusCode, ErrorCode, String);

/// The consumer and partition of a path, or why they are refused: 400 naming what does not
/// parse, 404 `no_such_partition` for a partition the server does not have.
fn consumer_partition(
    st: &AppState,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<(ConsumerName, PartitionId), Refusal> {
    let (name, partition) = match path {
        Ok(Path(p)) => p,
        Err(e) => return Err(bad_path(&e)),
    };
    let consumer = ConsumerName::new(&name).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            e.to_string(),
        )
    })?;
    let Ok(partition) = partition.parse::<u32>() else {
        return Err((
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!(
                "the partition {:?} is not a partition number (an unsigned integer)",
                partition.chars().take(32).collect::<String>()
            ),
        ));
    };
    let partitions = st.cp.config().partitions;
    if partition >= partitions {
        return Err((
            StatusCode::NOT_FOUND,
            ErrorCode::NoSuchPartition,
            format!(
                "partition {partition} does not exist: the server has partitions 0 to {}",
                partitions - 1
            ),
        ));
    }
    Ok((consumer, PartitionId(partition)))
}

fn bad_path(rejection: &PathRejection) -> Refusal {
    (
        StatusCode::BAD_REQUEST,
        ErrorCode::BadRequest,
        format!(
            "the path is /v1/consumers/<name>[/partitions/<partition>]: {}",
            rejection.body_text()
        ),
    )
}

/// The body of a `PUT`, or why it is refused: 413 when too large, 415 without a JSON
/// content type, 400 naming the field that is not as documented.
fn put_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<PutPositionBody, Refusal> {
    let body = super::batch::json_bytes(headers, body, "a position")?;
    let refused = |what: String| {
        (
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!(
                "the body is {{\"offset\": N, \"expected\": M, \"force\": false}} (N and M \
                 unsigned integers, expected and force optional): {what}"
            ),
        )
    };
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| refused(format!("not JSON: {e}")))?;
    if !value.is_object() {
        // serde would read a struct from an array too; the document says an object.
        return Err(refused("not a JSON object".into()));
    }
    serde_json::from_value(value.clone())
        .map_err(|e| refused(invalid_field(&value).unwrap_or_else(|| e.to_string())))
}

/// The first field of a `PUT` body that is not as documented, said for people.
fn invalid_field(body: &serde_json::Value) -> Option<String> {
    let fields = body.as_object()?;
    let offset = fields.get("offset");
    if offset.is_none() {
        return Some("offset is missing".into());
    }
    for (name, value) in [("offset", offset), ("expected", fields.get("expected"))] {
        match value {
            Some(v) if v.is_null() && name == "expected" => {}
            Some(v) if v.as_u64().is_none() => {
                return Some(format!(
                    "{name} is {v}, not an unsigned integer (a PLog offset, 0 to 2^64 - 1)"
                ));
            }
            _ => {}
        }
    }
    if fields.get("force").is_some_and(|f| !f.is_boolean()) {
        return Some("force is true or false".into());
    }
    let unknown: Vec<&String> = fields
        .keys()
        .filter(|k| !["offset", "expected", "force"].contains(&k.as_str()))
        .collect();
    (!unknown.is_empty()).then(|| format!("unknown fields {unknown:?}"))
}

/// The answer to a position that was not read or set.
fn position_error(st: &AppState, e: &PositionError) -> Response {
    let conflict = |code: ErrorCode, current: Option<u64>| {
        (
            StatusCode::CONFLICT,
            axum::Json(PositionConflictBody {
                code: code.to_owned(),
                message: e.to_string(),
                current,
            }),
        )
            .into_response()
    };
    match e {
        PositionError::Conflict { current, .. } => conflict(ErrorCode::PositionConflict, *current),
        PositionError::Backwards { current, .. } => {
            conflict(ErrorCode::PositionBackwards, Some(*current))
        }
        PositionError::BeyondEnd { end, .. } => (
            StatusCode::CONFLICT,
            axum::Json(PositionBeyondEndBody {
                code: ErrorCode::PositionBeyondEnd,
                message: e.to_string(),
                end: *end,
            }),
        )
            .into_response(),
        PositionError::StillWritten { .. } => error(
            StatusCode::CONFLICT,
            ErrorCode::ConsumerActive,
            e.to_string(),
        ),
        PositionError::HeldByMember { .. } => error(
            StatusCode::CONFLICT,
            ErrorCode::PartitionHeld,
            e.to_string(),
        ),
        PositionError::Corrupt {
            consumer,
            partition,
            ..
        } => {
            st.metrics.corrupted.inc();
            let place = format!("position of consumer {consumer} on partition {partition}");
            tracing::error!(place = %place, "corrupt data in storage: {e}");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(monoseq_wire::ErrorBody {
                    key: Some(place),
                    ..monoseq_wire::ErrorBody::new(ErrorCode::Corrupted, chain(e))
                }),
            )
                .into_response()
        }
        _ => {
            let message = chain(e);
            tracing::warn!("storage of positions failed: {message}");
            with_retry_after(error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StorageUnavailable,
                message,
            ))
        }
    }
}

/// Sets `monoseq_consumer_lag_events` from the stored positions (at most
/// [`CONSUMER_LAG_SERIES_MAX`]) and the end of each partition this node serves: with several
/// nodes, each reports the lag on the partitions it owns. A position at or past the last
/// event has lag 0. A failed read of the positions leaves the series as they were.
pub(super) async fn refresh_consumer_lag(st: &AppState) {
    let store = st.cp.store().clone();
    let read =
        tokio::task::spawn_blocking(move || store.all_positions(CONSUMER_LAG_SERIES_MAX)).await;
    let (positions, more) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => {
            tracing::warn!(
                "reading the consumer positions for /metrics failed: {}",
                chain(&e)
            );
            return;
        }
        Err(e) => {
            tracing::warn!("reading the consumer positions for /metrics failed: {e}");
            return;
        }
    };
    let series = &st.metrics.consumer_lag;
    series.clear();
    for p in positions {
        let Some(end) = plog_end(&st.cp, p.partition.0) else {
            continue;
        };
        let behind = lag(end, p.offset);
        series
            .get_or_create(&vec![
                ("consumer".to_owned(), p.consumer.to_string()),
                ("partition".to_owned(), p.partition.0.to_string()),
            ])
            .set(i64::try_from(behind).unwrap_or(i64::MAX));
    }
    st.metrics.consumer_lag_truncated.set(i64::from(more));
}

/// The end of `partition`'s PLog (the next offset to be written) when this node serves it
/// (another node's view of it is only a lower bound, and the owner reports it).
fn plog_end(cp: &CommandProcessor<Store>, partition: u32) -> Option<u64> {
    cp.serves(partition).then(|| cp.plog_end(partition))
}
