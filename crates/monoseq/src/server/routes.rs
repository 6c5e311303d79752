//! The HTTP routes of `monoseq serve` and their handlers: commands (and their forwarding to
//! the partition's owner), events, WLog pages and records, cluster and marks, liveness,
//! readiness, metrics and the OpenAPI document; and the router that puts them behind the token
//! check. A new route is one line in [`api_routes`] and its handler here.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use monoseq_core::{PLogOffset, WsId};
use monoseq_cp::{CommandError, CommandProcessor, IdempotencyKey};
use monoseq_membership::Unplaced;
use monoseq_store::{PartitionId, RecordId, WLogOffset};
use monoseq_wire::{
    ClusterBody, ErrorCode, IDEMPOTENCY_KEY, IDEMPOTENCY_REPLAYED, InfoBody, MarksBody,
    NotReadyBody, NotReadyPartitionBody, WLOG_PAGE_MAX,
};

use super::AppState;
use super::answers::{command_error, read_error, with_retry_after};
use super::consume;
use super::metrics::Metrics;
use super::place::{Placed, unplaced};
use crate::base::error;
use crate::cluster::Cluster;
use crate::config::{BODY_BYTES_MAX_DEFAULT, Store};
use crate::forward::Forwarder;
use crate::json;
use crate::wire::CommandBody;

/// Events one WLog read returns when the request names no `limit`.
const WLOG_PAGE_DEFAULT: usize = 100;
/// The WLog offset a read starts from when the request names no `from` (the first event).
const WLOG_FROM_DEFAULT: u64 = 1;
/// Largest `from` of a WLog read that is scanned (no WLog offset comes near it); a read from
/// above answers no events (schemathesis found `from` = 2^64 − 2 overflowing the scan).
const WLOG_OFFSET_SCANNED_MAX: u64 = u64::MAX >> 1;

/// The router, for the server and for tests: commands and events, plus the named sequences
/// (`/v1/sequences/...`) on the same store with the number cache `named_cache`, every route
/// and the fallbacks behind the token check of `auth`.
pub(super) fn router(
    cp: CommandProcessor<Store>,
    info: monoseq_wire::InfoBody,
    auth: Arc<crate::auth::Auth>,
    cluster: Option<(Arc<Cluster>, Forwarder)>,
    named_cache: monoseq_named::CacheOptions,
    (follow, losses): (Arc<super::consume::Follow>, super::Losses),
) -> Router {
    let sequences =
        monoseq_named::Sequences::new(monoseq_named::KvBackend::new(Arc::clone(cp.store().kv())))
            .with_cache(named_cache);
    let mut metrics = Metrics::new();
    metrics.register_follow(&follow.counts);
    if cp.store().kv().engine_stats().is_some() {
        metrics.register_engine();
    }
    cp.observe_groups(metrics.latency.group_observer());
    let node = cluster
        .as_ref()
        .map_or_else(|| "local".to_owned(), |(c, _)| c.advertise_url().to_owned());
    let state = Arc::new(AppState {
        cp,
        groups: super::groups::Groups::new(node),
        cluster,
        metrics,
        info,
        follow,
        losses,
    });
    let router = api_routes()
        .fallback(|| async {
            error(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                "no such endpoint; see README.md",
            )
        })
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX_DEFAULT))
        .with_state(state)
        .merge(monoseq_named_http::router(sequences))
        .merge(super::ui::token_route(Arc::clone(&auth)))
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                "this endpoint does not take that method; see README.md",
            )
        })
        // Every route's query parameters are checked by name, inside the token check.
        .layer(axum::middleware::from_fn(crate::query::refuse_unknown))
        // Last, so that it wraps every route, the merged ones and both fallbacks.
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::require_token,
        ))
        // The console's page and script hold no data: a browser loads them without a token
        // and sends its token with every API request.
        .merge(super::ui::assets());
    with_answer_log(router)
}

/// The routes over [`AppState`], before the fallbacks and the token check.
fn api_routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/v1/info", get(info))
        .route("/v1/commands", post(submit))
        .route("/v1/commands/batch", post(super::batch::submit_batch))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/marks", get(marks))
        .route(
            "/v1/partitions/{partition}/events/{offset}",
            get(read_event),
        )
        .route(
            "/v1/partitions/{partition}/events",
            get(consume::read_partition),
        )
        .route(
            "/v1/partitions/{partition}/events/stream",
            get(consume::stream_partition),
        )
        .route("/v1/workspaces/{ws}/wlog", get(read_wlog))
        .route("/v1/workspaces/{ws}/wlog/stream", get(consume::stream_wlog))
        .route("/v1/workspaces/{ws}/records/{id}", get(read_record))
        .route("/v1/events/stream", get(super::stream::stream_events))
        .route("/v1/groups", get(super::groups::list))
        .route(
            "/v1/groups/{group}",
            get(super::groups::show).delete(super::groups::delete),
        )
        .route("/v1/groups/{group}/stream", get(super::groups::join))
        .route(
            "/v1/groups/{group}/heartbeat",
            post(super::groups::heartbeat),
        )
        .route("/v1/groups/{group}/commit", post(super::groups::commit))
        .route(
            "/v1/groups/{group}/members/{session}",
            delete(super::groups::leave),
        )
        .route("/v1/consumers", get(super::positions::list_consumers))
        .route(
            "/v1/consumers/{name}",
            get(super::positions::get_positions).delete(super::positions::delete_consumer),
        )
        .route(
            "/v1/consumers/{name}/partitions/{partition}",
            get(super::positions::get_position).put(super::positions::put_position),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi))
}

/// With `MONOSEQ_ANSWER_LOG` set (a test aid), every answer is also appended to that file.
fn with_answer_log(router: Router) -> Router {
    match crate::answer_log::AnswerLog::from_env() {
        Some(log) => router.layer(axum::middleware::from_fn_with_state(
            log,
            crate::answer_log::record,
        )),
        None => router,
    }
}

/// `GET /v1/info`.
async fn info(State(st): State<Arc<AppState>>) -> axum::Json<InfoBody> {
    axum::Json(st.info.clone())
}

/// The OpenAPI 3.1 document of this API, as kept in the repository.
pub const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The answers while the storage opens (and the node joins its cluster): `/healthz` is alive,
/// `/readyz` and every other route answer 503 with `Retry-After`, behind the same token check.
pub(super) fn opening_router(auth: Arc<crate::auth::Auth>) -> Router {
    let opening = || async {
        with_retry_after(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            "the server is opening its storage; retry",
        ))
    };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .fallback(opening)
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::require_token,
        ))
}

/// A path whose parameters do not parse: 400 with a JSON error, like every other error.
fn path_error(rejection: &PathRejection) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        ErrorCode::BadRequest,
        format!(
            "the path's parameters are unsigned integers: {}",
            rejection.body_text()
        ),
    )
}

async fn submit(
    State(st): State<Arc<AppState>>,
    super::batch::Sent { headers, body }: super::batch::Sent,
) -> Response {
    let began = std::time::Instant::now();
    let (cmd, body) = match command_body(&headers, body) {
        Ok(read) => read,
        Err((status, code, message)) => {
            st.metrics.count_command(code.as_str());
            st.metrics.latency.command(code.as_str(), began);
            return error(status, code, message);
        }
    };
    let key = match headers.get(IDEMPOTENCY_KEY).map(|v| {
        v.to_str()
            .map_err(|_| CommandError::InvalidKey("the idempotency key is not ASCII".into()))
            .and_then(IdempotencyKey::new)
    }) {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(e)) => return command_error(&e),
    };
    if let Some(answer) = route_elsewhere(&st, cmd.ws, body, &headers).await {
        return answer;
    }
    match st.cp.submit_keyed(crate::wire::command(cmd), key).await {
        Ok(out) => {
            st.metrics.commands_ok.inc();
            st.metrics.latency.command("ok", began);
            let replayed = out.replayed;
            let mut r = axum::Json(crate::wire::outcome(out)).into_response();
            if replayed {
                r.headers_mut()
                    .insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
            }
            r
        }
        Err(e) => {
            let code = super::answers::command_code(&e).as_str();
            st.metrics.count_command(code);
            st.metrics.latency.command(code, began);
            command_error(&e)
        }
    }
}

/// A command's body: the command, and its bytes as sent (relayed unchanged when another node
/// owns its partition); or the status, code and message refusing it.
fn command_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(CommandBody, Bytes), (StatusCode, ErrorCode, String)> {
    let body = super::batch::json_bytes(headers, body, "a command")?;
    match serde_json::from_slice(&body) {
        Ok(cmd) => Ok((cmd, body)),
        Err(e) if e.is_data() => Err((
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidCommand,
            format!("the command is not valid: {e}"),
        )),
        Err(e) => Err((
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            format!("the body is not JSON: {e}"),
        )),
    }
}

async fn read_event(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(u32, u64)>, PathRejection>,
) -> Response {
    let (partition, offset) = match path {
        Ok(Path(p)) => p,
        Err(e) => return path_error(&e),
    };
    let partitions = st.cp.config().partitions;
    if partition >= partitions {
        return unplaced(partition, Unplaced::NoSuchPartition { partitions });
    }
    let store = st.cp.store().clone();
    let read = tokio::task::spawn_blocking(move || {
        store.read_event(PartitionId(partition), PLogOffset(offset))
    })
    .await;
    match read {
        Ok(Ok(Some(e))) => axum::Json(json::event(&e)).into_response(),
        Ok(Ok(None)) => error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no event at PLog offset {offset} of partition {partition}"),
        ),
        Ok(Err(e)) => read_error(
            &st,
            || format!("PLog offset {offset} of partition {partition}"),
            &e,
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}

/// The `from`, `limit` and `wait_ms` of a WLog page read, each checked with a 400 naming it.
struct WlogQuery {
    from: u64,
    limit: usize,
    wait: std::time::Duration,
}

// The refusal is the answer itself, built once per refused request.
#[allow(clippy::result_large_err)]
fn wlog_query(raw: Option<&str>) -> Result<WlogQuery, Response> {
    let params = crate::query::params(raw, crate::query::WLOG_PARAMS)?;
    let number = |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| {
        let Some(value) = params.get(name) else {
            return Ok(default);
        };
        match value.parse::<u64>() {
            Ok(n) if range.contains(&n) => Ok(n),
            _ => Err(error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!(
                    "`{name}` is {} to {} (got {value:?}): send a decimal unsigned integer",
                    range.start(),
                    range.end()
                ),
            )),
        }
    };
    let from = number("from", WLOG_FROM_DEFAULT, 1..=u64::MAX)?;
    let limit = number("limit", WLOG_PAGE_DEFAULT as u64, 1..=WLOG_PAGE_MAX as u64)?;
    let wait_ms = number("wait_ms", 0, 0..=monoseq_wire::WAIT_MS_MAX)?;
    Ok(WlogQuery {
        from,
        limit: limit as usize,
        wait: std::time::Duration::from_millis(wait_ms),
    })
}

/// `GET /v1/workspaces/{ws}/wlog?from=N&limit=L&wait_ms=W`: a page of the workspace's WLog,
/// with `next` and the WLog's `end`; with `wait_ms`, an empty page waits (at most that long)
/// for the workspace's next event.
async fn read_wlog(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u64>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Response {
    let ws = match path {
        Ok(Path(ws)) => ws,
        Err(e) => return path_error(&e),
    };
    let q = match wlog_query(raw.as_deref()) {
        Ok(q) => q,
        Err(r) => return r,
    };
    let partition = st.cp.partition_of(WsId(ws));
    let deadline = tokio::time::Instant::now() + q.wait;
    loop {
        let plog_end = consume::known_end(&st, partition);
        let page = match wlog_page(&st, ws, &q).await {
            Ok(page) => page,
            Err(r) => return r,
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !page.events.is_empty() || left.is_zero() {
            return axum::Json(page).into_response();
        }
        // Nothing yet: wait for the partition's next event (the owner's long poll), then
        // read again.
        consume::wait_for_plog(&st, partition, plog_end, left).await;
        if tokio::time::Instant::now() >= deadline {
            return match wlog_page(&st, ws, &q).await {
                Ok(page) => axum::Json(page).into_response(),
                Err(r) => r,
            };
        }
    }
}

/// A page of workspace `ws`'s WLog as `q` asks, with `next` and the WLog's `end`.
async fn wlog_page(
    st: &Arc<AppState>,
    ws: u64,
    q: &WlogQuery,
) -> Result<monoseq_wire::WlogPageBody, Response> {
    let (from, limit) = (q.from, q.limit);
    if from > WLOG_OFFSET_SCANNED_MAX {
        // No WLog reaches there, and the store's block arithmetic would overflow: nothing.
        return Ok(monoseq_wire::WlogPageBody {
            events: Vec::new(),
            next: from,
            end: from,
        });
    }
    // Where this node writes the partition (or is the only node), nothing at or beyond its
    // end: an event not yet synced is not answered. Another node's end here is stale, and the
    // owner's committed events on the shared database are read as they are.
    let partition = st.cp.partition_of(WsId(ws));
    let end = (st.cluster.is_none() || st.cp.serves(partition)).then(|| st.cp.plog_end(partition));
    let store = st.cp.store().clone();
    let read = tokio::task::spawn_blocking(move || {
        let events: Vec<_> = store
            .read_wlog(WsId(ws), WLogOffset(from), limit)?
            .iter()
            .take_while(|e| end.is_none_or(|end| e.plog_offset.0 < end))
            .map(json::event)
            .collect();
        let next = events.last().map_or(from, |e| e.wlog_offset + 1);
        // A page cut short after some events ends at the WLog's end; after a whole or an
        // empty one, the end is looked up.
        let wlog_end = match events.len() {
            0 => consume::wlog_end_below(&store, ws, end)?,
            n if n < limit => next,
            _ => consume::wlog_end_below(&store, ws, end)?.max(next),
        };
        Ok::<_, monoseq_store::ReadError>(monoseq_wire::WlogPageBody {
            events,
            next,
            end: wlog_end,
        })
    })
    .await;
    match read {
        Ok(Ok(page)) => Ok(page),
        Ok(Err(e)) => Err(read_error(
            st,
            || format!("WLog of workspace {ws} from offset {from}"),
            &e,
        )),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e,
        )),
    }
}

async fn read_record(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(u64, u64)>, PathRejection>,
) -> Response {
    let (ws, id) = match path {
        Ok(Path(p)) => p,
        Err(e) => return path_error(&e),
    };
    let store = st.cp.store().clone();
    let read = tokio::task::spawn_blocking(move || store.read_record(WsId(ws), RecordId(id))).await;
    match read {
        Ok(Ok(Some(r))) => axum::Json(json::record(&r)).into_response(),
        Ok(Ok(None)) => error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no record {id} in workspace {ws}"),
        ),
        Ok(Err(e)) => read_error(&st, || format!("record {id} of workspace {ws}"), &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}

/// The answer for a command this node does not run itself: the owner's answer (or a redirect
/// to it), or the answer of a command that cannot be placed now; `None` when it runs here.
async fn route_elsewhere(
    st: &AppState,
    ws: u64,
    body: Bytes,
    headers: &HeaderMap,
) -> Option<Response> {
    let partition = st.cp.partition_of(WsId(ws));
    let relay = match st.place(partition, Forwarder::was_forwarded(headers)) {
        Placed::Local => return None,
        Placed::Unavailable(why) => return Some(unplaced(partition, why)),
        Placed::Relay(relay) => relay,
    };
    st.metrics.forwarded.inc();
    let began = std::time::Instant::now();
    let answer = relay.forwarder.command(&relay.url, body, headers).await;
    st.metrics
        .latency
        .forward
        .observe(began.elapsed().as_secs_f64());
    if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
        // The owner read last did not answer, or no longer serves the partition.
        relay.cluster.read_soon();
    }
    Some(answer)
}

/// `GET /v1/cluster`: the nodes, their partitions, epochs and lease ages.
async fn cluster_status(State(st): State<Arc<AppState>>) -> Response {
    let Some((cluster, _)) = &st.cluster else {
        return axum::Json(ClusterBody::Single {
            clustered: false,
            message: "one node on embedded storage serves every partition".to_owned(),
            partitions: st.cp.owned(),
        })
        .into_response();
    };
    match cluster.status().await {
        Ok(status) => axum::Json(status).into_response(),
        Err(e) => with_retry_after(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StorageUnavailable,
            format!("reading the leases failed: {e:#}"),
        )),
    }
}

/// `GET /v1/marks`: this node's high-water marks per partition and the losses accepted for
/// the store (other nodes merge them into theirs).
async fn marks(State(st): State<Arc<AppState>>) -> Response {
    if let Some((cluster, _)) = &st.cluster {
        return axum::Json(cluster.marks_answer()).into_response();
    }
    let marks = st.cp.config().marks.as_ref().map(|m| m.all());
    axum::Json(MarksBody {
        store_id: st.info.store_id.clone(),
        partitions: st.cp.config().partitions,
        marks: marks.iter().flatten().map(crate::wire::mark_body).collect(),
        losses: Vec::new(),
    })
    .into_response()
}

/// `GET /readyz`: 200 when this node can answer or forward a command for every partition
/// (on a cluster: each has a live owner, served here or by a node whose own readiness, asked
/// lately and after this node read its lease, did not name it; and none is about to move); else
/// 503 naming the partitions and why.
async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let unready = match &st.cluster {
        Some((cluster, _)) => cluster.unready(),
        None => st.cp.unready(),
    };
    if unready.is_empty() {
        return "ready".into_response();
    }
    let message = format!("{} partitions cannot be answered yet", unready.len());
    let partitions = unready
        .into_iter()
        .map(|(partition, reason)| NotReadyPartitionBody { partition, reason })
        .collect();
    with_retry_after(
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(NotReadyBody {
                code: ErrorCode::NotReady,
                message,
                partitions: Some(partitions),
            }),
        )
            .into_response(),
    )
}

/// `GET /metrics`: the OpenMetrics text of every series.
async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    super::positions::refresh_consumer_lag(&st).await;
    match st.metrics.render(&st.cp) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, e),
    }
}
