//! The HTTP routes of `monoseq serve` and their handlers: commands (and their forwarding to
//! the partition's owner), events, WLog pages and records, cluster and marks, liveness,
//! readiness, metrics and the OpenAPI document; and the router that puts them behind the token
//! check. A new route is one line in [`api_routes`] and its handler here.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use monoseq_core::{PLogOffset, WsId};
use monoseq_cp::{CommandError, CommandProcessor, IdempotencyKey};
use monoseq_store::{PartitionId, RecordId, WLogOffset};
use monoseq_wire::{
    ClusterBody, IDEMPOTENCY_KEY, IDEMPOTENCY_REPLAYED, InfoBody, MarksBody, NotReadyBody,
    NotReadyPartitionBody, WLOG_PAGE_MAX,
};
use serde::Deserialize;

use super::AppState;
use super::answers::{command_error, read_error, with_retry_after};
use super::consume;
use super::metrics::Metrics;
use crate::base::error;
use crate::cluster::{Cluster, Owner};
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
    cp.observe_groups(metrics.latency.group_observer());
    let state = Arc::new(AppState {
        cp,
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
                "not_found",
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
                "method_not_allowed",
                "this endpoint does not take that method; see README.md",
            )
        })
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
        .route("/v1/consumers/{name}", get(super::positions::get_positions))
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
            "not_ready",
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
        "bad_request",
        format!(
            "the path's parameters are unsigned integers: {}",
            rejection.body_text()
        ),
    )
}

async fn submit(
    State(st): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let began = std::time::Instant::now();
    let (cmd, body) = match command_body(&headers, body) {
        Ok(read) => read,
        Err((status, code, message)) => {
            st.metrics.count_command(code);
            st.metrics.latency.command(code, began);
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
            let mut r = axum::Json(crate::wire::outcome(&out)).into_response();
            if replayed {
                r.headers_mut()
                    .insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
            }
            r
        }
        Err(e) => {
            st.metrics.count_command(e.code());
            st.metrics.latency.command(e.code(), began);
            command_error(&e)
        }
    }
}

/// A command's body: the command, and its bytes as sent (relayed unchanged when another node
/// owns its partition); or the status, code and message refusing it.
fn command_body(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(CommandBody, Bytes), (StatusCode, &'static str, String)> {
    let body = super::batch::json_bytes(headers, body, "a command")?;
    match serde_json::from_slice(&body) {
        Ok(cmd) => Ok((cmd, body)),
        Err(e) if e.is_data() => Err((
            StatusCode::BAD_REQUEST,
            "invalid_command",
            format!("the command is not valid: {e}"),
        )),
        Err(e) => Err((
            StatusCode::BAD_REQUEST,
            "malformed_json",
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
        return error(
            StatusCode::NOT_FOUND,
            "no_such_partition",
            format!(
                "partition {partition} does not exist: the server has partitions 0 to {}",
                partitions - 1
            ),
        );
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
            "not_found",
            format!("no event at PLog offset {offset} of partition {partition}"),
        ),
        Ok(Err(e)) => read_error(
            &st,
            || format!("PLog offset {offset} of partition {partition}"),
            &e,
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

#[derive(Deserialize)]
struct WlogQuery {
    #[serde(default = "one")]
    from: u64,
    #[serde(default = "page")]
    limit: usize,
}

fn one() -> u64 {
    WLOG_FROM_DEFAULT
}

fn page() -> usize {
    WLOG_PAGE_DEFAULT
}

async fn read_wlog(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u64>, PathRejection>,
    query: Result<Query<WlogQuery>, QueryRejection>,
) -> Response {
    let ws = match path {
        Ok(Path(ws)) => ws,
        Err(e) => return path_error(&e),
    };
    let Ok(Query(q)) = query else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "query parameters are from=<WLog offset>&limit=<count>",
        );
    };
    if q.from == 0 || q.limit == 0 || q.limit > WLOG_PAGE_MAX {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            format!("from starts at 1 and limit is 1 to {WLOG_PAGE_MAX}"),
        );
    }
    if q.from > WLOG_OFFSET_SCANNED_MAX {
        // No WLog reaches there, and the store's block arithmetic would overflow: nothing.
        return axum::Json(monoseq_wire::WlogPageBody { events: Vec::new() }).into_response();
    }
    // Where this node writes the partition (or is the only node), nothing at or beyond its
    // end: an event not yet synced is not answered. Another node's end here is stale, and the
    // owner's committed events on the shared database are read as they are.
    let partition = st.cp.partition_of(WsId(ws));
    let end = (st.cluster.is_none() || st.cp.serves(partition)).then(|| st.cp.plog_end(partition));
    let store = st.cp.store().clone();
    let read =
        tokio::task::spawn_blocking(move || store.read_wlog(WsId(ws), WLogOffset(q.from), q.limit))
            .await;
    match read {
        Ok(Ok(events)) => axum::Json(monoseq_wire::WlogPageBody {
            events: events
                .iter()
                .take_while(|e| end.is_none_or(|end| e.plog_offset.0 < end))
                .map(json::event)
                .collect(),
        })
        .into_response(),
        Ok(Err(e)) => read_error(
            &st,
            || format!("WLog of workspace {ws} from offset {}", q.from),
            &e,
        ),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
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
            "not_found",
            format!("no record {id} in workspace {ws}"),
        ),
        Ok(Err(e)) => read_error(&st, || format!("record {id} of workspace {ws}"), &e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}

/// With several nodes: the answer for a command whose partition this node does not serve
/// (the owner's answer, a redirect to it, or "unavailable" while the partition moves); `None`
/// when it is served here.
async fn route_elsewhere(
    st: &AppState,
    ws: u64,
    body: Bytes,
    headers: &HeaderMap,
) -> Option<Response> {
    let (cluster, forwarder) = st.cluster.as_ref()?;
    let partition = st.cp.partition_of(WsId(ws));
    if st.cp.serves(partition) {
        return None;
    }
    let answer = match cluster.owner(partition) {
        Owner::Node { url, .. } if !Forwarder::was_forwarded(headers) => {
            st.metrics.forwarded.inc();
            let began = std::time::Instant::now();
            let answer = forwarder.command(&url, body, headers).await;
            st.metrics
                .latency
                .forward
                .observe(began.elapsed().as_secs_f64());
            if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
                // The owner read last did not answer, or no longer serves the partition.
                cluster.read_soon();
            }
            answer
        }
        _ => with_retry_after(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "partition_unavailable",
            format!(
                "partition {partition} is moving between nodes (no live lease, or its owner \
                     changed just now); retry"
            ),
        )),
    };
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
            "storage_unavailable",
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
                code: "not_ready".to_owned(),
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
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e),
    }
}
