//! Consumer positions over HTTP: `GET` and `PUT /v1/consumers/{name}/partitions/{p}` and the
//! listing `GET /v1/consumers/{name}`, answered by any node straight from the shared store
//! (the compare-and-swap decides between writers, so nothing is forwarded to a partition's
//! owner); and each consumer's lag behind its partition's end for `/metrics`, at most
//! [`CONSUMER_LAG_SERIES_MAX`] series.
//!
//! A refused compare-and-set is `409 position_conflict` with the stored position; a `PUT`
//! that would move a position back without `"force": true` is `409 position_backwards`, also
//! with the stored position (a 409 rather than a 400: whether it is backwards depends on what
//! is stored, and the client's next step is the same, read and decide).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use monoseq_cp::CommandProcessor;
use monoseq_store::{ConsumerName, PartitionId, PositionError, SetPosition};
use monoseq_wire::{
    POSITION_BACKWARDS, POSITION_CONFLICT, PartitionPositionBody, PositionBody,
    PositionConflictBody, PositionsBody, PutPositionBody, UNKNOWN_CONSUMER,
};

use super::AppState;
use super::answers::with_retry_after;
use crate::base::{chain, error};
use crate::config::Store;

/// Most `monoseq_consumer_lag_events` series one `/metrics` answer carries (consumer ×
/// partition pairs, in consumer name then partition order): it bounds the scrape's size and
/// the store read behind it. Past it, `monoseq_consumer_lag_truncated` is 1.
pub(super) const CONSUMER_LAG_SERIES_MAX: usize = 1_000;

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
            UNKNOWN_CONSUMER,
            format!(
                "consumer {consumer} has no position on partition {partition}: set one with \
                 PUT and no \"expected\""
            ),
        ),
        Ok(Err(e)) => position_error(&st, &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
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
    let store = st.cp.store().clone();
    let set = SetPosition {
        offset: put.offset,
        expected: put.expected,
        force: put.force,
    };
    let write =
        tokio::task::spawn_blocking(move || store.set_position(&consumer, partition, set)).await;
    match write {
        Ok(Ok(())) => axum::Json(PositionBody { offset: put.offset }).into_response(),
        Ok(Err(e)) => position_error(&st, &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// `GET /v1/consumers/{name}`: every position of the consumer, in partition order.
pub(super) async fn get_positions(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let consumer = match path {
        Ok(Path(name)) => match ConsumerName::new(&name) {
            Ok(c) => c,
            Err(e) => return error(StatusCode::BAD_REQUEST, "bad_request", e),
        },
        Err(e) => {
            let (status, code, message) = bad_path(&e);
            return error(status, code, message);
        }
    };
    let store = st.cp.store().clone();
    let name = consumer.clone();
    let read = tokio::task::spawn_blocking(move || store.positions(&name)).await;
    match read {
        Ok(Ok(positions)) if positions.is_empty() => error(
            StatusCode::NOT_FOUND,
            UNKNOWN_CONSUMER,
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
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// A refused request: status, stable code and message.
type Refusal = (StatusCode, &'static str, String);

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
    let consumer = ConsumerName::new(&name)
        .map_err(|e| (StatusCode::BAD_REQUEST, "bad_request", e.to_string()))?;
    let Ok(partition) = partition.parse::<u32>() else {
        return Err((
            StatusCode::BAD_REQUEST,
            "bad_request",
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
            "no_such_partition",
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
        "bad_request",
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
            "bad_request",
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
    let conflict = |code: &str, current: Option<u64>| {
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
        PositionError::Conflict { current, .. } => conflict(POSITION_CONFLICT, *current),
        PositionError::Backwards { current, .. } => conflict(POSITION_BACKWARDS, Some(*current)),
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
                    ..monoseq_wire::ErrorBody::new("corrupted", chain(e))
                }),
            )
                .into_response()
        }
        _ => {
            let message = chain(e);
            tracing::warn!("storage of positions failed: {message}");
            with_retry_after(error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
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
    let lag = &st.metrics.consumer_lag;
    lag.clear();
    for p in positions {
        let Some(end) = plog_end(&st.cp, p.partition.0) else {
            continue;
        };
        // Events stored are 1 to end - 1; the consumer processed those up to its offset.
        let behind = end.saturating_sub(1).saturating_sub(p.offset);
        lag.get_or_create(&vec![
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
