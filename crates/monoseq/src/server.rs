//! `monoseq serve`: the HTTP API over the command processor — command submission, reading
//! events, WLog ranges and records back, liveness, readiness and Prometheus metrics — with a
//! graceful, bounded shutdown. Errors are JSON `{"code", "message"}` with stable codes.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use anyhow::Context;
use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use monoseq_core::{PLogOffset, WsId};
use monoseq_cp::{CommandError, CommandProcessor, ErrorClass, IdempotencyKey, RETRY_AFTER_SECS};
use monoseq_store::{PartitionId, RecordId, WLogOffset};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;

use crate::base::error;
use crate::cluster::{Cluster, ClusterArgs, Owner};
use crate::config::{BODY_BYTES_MAX_DEFAULT, Settings, Store, open_storage};
use crate::forward::Forwarder;
use crate::json;
use crate::wire::CommandBody;

/// Most events one WLog read returns.
const WLOG_PAGE_MAX: usize = monoseq_wire::WLOG_PAGE_MAX;
/// Largest `from` of a WLog read that is scanned (no WLog offset comes near it); a read from
/// above answers no events (schemathesis found `from` = 2^64 − 2 overflowing the scan).
const WLOG_OFFSET_SCANNED_MAX: u64 = u64::MAX >> 1;

pub(crate) struct AppState {
    cp: CommandProcessor<Store>,
    /// This node's cluster membership and its forwarder (PostgreSQL storage only).
    cluster: Option<(Arc<Cluster>, Forwarder)>,
    /// What `GET /v1/info` answers.
    info: serde_json::Value,
    metrics: Metrics,
}

struct Metrics {
    registry: Registry,
    commands: Family<Vec<(String, String)>, Counter>,
    /// The `code="ok"` counter of `commands`, held so that a successful command costs no
    /// label allocation or family lookup.
    commands_ok: Counter,
    backlog: Gauge,
    actualizing: Gauge,
    checkpoint_lag: Gauge,
    cache_hit_ratio: Gauge<f64, AtomicU64>,
    replayed: Gauge,
    actualizations: Gauge,
    actualization_seconds: Gauge<f64, AtomicU64>,
    groups: Gauge,
    rebuilds: Gauge,
    unavailable: Gauge,
    replayed_commands: Gauge,
    /// Reads (and commands) that found corrupt bytes in storage.
    corrupted: Counter,
    /// Commands forwarded to the node owning their partition.
    forwarded: Counter,
    /// Partitions this node serves now.
    owned: Gauge,
    /// Corrupt places already logged, so each is logged once (bounded).
    corrupted_logged: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("monoseq");
        let commands: Family<Vec<(String, String)>, Counter> = Family::default();
        registry.register(
            "commands",
            "Commands answered, by outcome code (ok, busy, ...)",
            commands.clone(),
        );
        let mut gauge = |name: &str, help: &str| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let backlog = gauge(
            "backlog_values",
            "Unflushed sequence values, all partitions",
        );
        let actualizing = gauge("actualizing_partitions", "Partitions actualizing now");
        let checkpoint_lag = gauge(
            "checkpoint_lag_events",
            "Largest distance between a partition's PLog end and its persisted checkpoint",
        );
        let replayed = gauge(
            "actualization_replayed_events",
            "Events replayed by actualizations (grows during one: progress)",
        );
        let actualizations = gauge("actualizations", "Completed actualizations");
        let groups = gauge("group_commits", "Group commits written");
        let rebuilds = gauge(
            "partition_rebuilds",
            "Partitions rebuilt after their sequencer failed, since start",
        );
        let unavailable = gauge(
            "unavailable_partitions",
            "Partitions not serving now (starting or being rebuilt)",
        );
        let replayed_commands = gauge(
            "idempotent_replays",
            "Retries answered from the original event of their idempotency key",
        );
        let corrupted = Counter::default();
        registry.register(
            "corrupted_reads",
            "Reads that found corrupt bytes in storage (answered 500 corrupted)",
            corrupted.clone(),
        );
        let forwarded = Counter::default();
        registry.register(
            "forwarded_commands",
            "Commands forwarded to (or redirected to) the node owning their partition",
            forwarded.clone(),
        );
        let owned = Gauge::default();
        registry.register(
            "owned_partitions",
            "Partitions this node serves now",
            owned.clone(),
        );
        let mut ratio = |name: &str, help: &str| {
            let g: Gauge<f64, AtomicU64> = Gauge::default();
            registry.register(name, help, g.clone());
            g
        };
        let cache_hit_ratio = ratio(
            "cache_hit_ratio",
            "Share of transactions whose workspace numbers were in memory",
        );
        let actualization_seconds = ratio(
            "actualization_duration_seconds",
            "Duration of the longest last actualization among partitions",
        );
        crate::edge::metrics().register(&mut registry);
        let commands_ok = commands
            .get_or_create(&vec![("code".into(), "ok".into())])
            .clone();
        Metrics {
            registry,
            commands_ok,
            commands,
            backlog,
            actualizing,
            checkpoint_lag,
            cache_hit_ratio,
            replayed,
            actualizations,
            actualization_seconds,
            groups,
            rebuilds,
            unavailable,
            replayed_commands,
            corrupted,
            forwarded,
            owned,
            corrupted_logged: std::sync::Mutex::default(),
        }
    }
}

/// The router, for the server and for tests: commands and events, plus the named sequences
/// (`/v1/sequences/...`) on the same store, every route and the fallbacks behind the token
/// check of `auth`.
pub fn router(
    cp: CommandProcessor<Store>,
    info: serde_json::Value,
    auth: Arc<crate::auth::Auth>,
    cluster: Option<(Arc<Cluster>, Forwarder)>,
) -> Router {
    let sequences =
        monoseq_named::Sequences::new(monoseq_named::KvBackend::new(Arc::clone(cp.store().kv())));
    let state = Arc::new(AppState {
        cp,
        cluster,
        metrics: Metrics::new(),
        info,
    });
    let router = Router::new()
        .route(
            "/v1/info",
            get(|State(st): State<Arc<AppState>>| async move { axum::Json(st.info.clone()) }),
        )
        .route("/v1/commands", post(submit))
        .route("/v1/cluster", get(cluster_status))
        .route("/v1/marks", get(marks))
        .route(
            "/v1/partitions/{partition}/events/{offset}",
            get(read_event),
        )
        .route("/v1/workspaces/{ws}/wlog", get(read_wlog))
        .route("/v1/workspaces/{ws}/records/{id}", get(read_record))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/openapi.json", get(openapi))
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
        ));
    match crate::answer_log::AnswerLog::from_env() {
        Some(log) => router.layer(axum::middleware::from_fn_with_state(
            log,
            crate::answer_log::record,
        )),
        None => router,
    }
}

/// The OpenAPI 3.1 document of this API, as kept in the repository.
pub const OPENAPI: &str = include_str!("../../../docs/openapi.json");

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The answers while the storage opens (and the node joins its cluster): `/healthz` is alive,
/// `/readyz` and every other route answer 503 with `Retry-After`, behind the same token check.
fn opening_router(auth: Arc<crate::auth::Auth>) -> Router {
    let opening = || async {
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the server is opening its storage; retry",
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
        r
    };
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .fallback(opening)
        .layer(axum::middleware::from_fn_with_state(
            auth,
            crate::auth::require_token,
        ))
}

/// The server of [`opening_router`], on a second handle of the listening socket, until the
/// storage is open; the real router then takes over the same socket.
struct Opening {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Opening {
    fn serve(
        listener: tokio::net::TcpListener,
        security: &crate::auth::Security,
        limits: crate::edge::EdgeLimits,
    ) -> anyhow::Result<(tokio::net::TcpListener, Opening)> {
        let socket = listener.into_std()?;
        let second = tokio::net::TcpListener::from_std(socket.try_clone()?)?;
        let listener = tokio::net::TcpListener::from_std(socket)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = opening_router(Arc::clone(&security.auth));
        let until = async {
            let _ = stopped.await;
        };
        // The edge's limits hold while the storage opens too.
        let task = match security.tls.clone() {
            Some(tls) => tokio::spawn(async move {
                let listener = crate::tls::TlsListener::new(second, tls);
                let _ = crate::edge::serve(listener, app, limits, until).await;
            }),
            None => tokio::spawn(async move {
                let _ = crate::edge::serve(second, app, limits, until).await;
            }),
        };
        Ok((listener, Opening { stop, task }))
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// A path whose parameters do not parse: 400 with a JSON error, like every other error.
fn path_error(rejection: &axum::extract::rejection::PathRejection) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "bad_request",
        format!(
            "the path's parameters are unsigned integers: {}",
            rejection.body_text()
        ),
    )
}

/// Runs the server until SIGTERM or Ctrl-C, then shuts down within the configured bound.
pub async fn serve(
    mut settings: Settings,
    security: crate::auth::Security,
    cluster_args: ClusterArgs,
) -> anyhow::Result<()> {
    // The address first: a busy port refuses the start before any storage is touched.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let fresh = settings.storage == crate::config::Storage::Embedded && !settings.data_dir.exists();
    let local = listener.local_addr()?;
    let node = match settings.storage {
        crate::config::Storage::Postgres(_) => {
            Some(NodeStart::new(&settings, &cluster_args, &security, local)?)
        }
        crate::config::Storage::Embedded => None,
    };
    let (listener, opening) = Opening::serve(listener, &security, settings.edge)?;
    let (opened, cp, node) = match start(&mut settings, node).await {
        Ok(started) => started,
        Err(e) => {
            opening.stop().await;
            if fresh {
                // A start that failed leaves no new, empty data directory behind.
                let _ = std::fs::remove_dir_all(&settings.data_dir);
            }
            return Err(e);
        }
    };
    let cluster = match join_cluster(node, &settings, &cp, &opened).await {
        Ok(c) => c,
        Err(e) => {
            opening.stop().await;
            cp.shutdown(settings.shutdown_timeout).await;
            return Err(e);
        }
    };
    opening.stop().await;
    tracing::info!(address = %local, "listening");
    // Printed for scripts and tests that start the server on port 0.
    println!("monoseq listening on {}://{local}", security.scheme());
    security.log_start(local);
    let info = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "partitions": settings.partitions,
        "trust_level": match settings.trust {
            monoseq_store::TrustLevel::Level0 => 0,
            monoseq_store::TrustLevel::Level1 => 1,
            _ => 2,
        },
        "storage": settings.storage.describe(),
        "store_id": opened.identity.store_id,
        "idempotency_window_events": settings.idempotency_window_events,
    });
    let members = cluster.as_ref().map(|(c, _)| Arc::clone(c));
    if let Some((c, forwarder)) = &cluster {
        tokio::spawn(Arc::clone(c).probe_peers(forwarder.prober()));
    }
    let app = router(cp.clone(), info, Arc::clone(&security.auth), cluster).merge(
        crate::backup::Backups::router(
            crate::backup::Backups::new(&settings, &opened),
            Arc::clone(&security.auth),
        ),
    );
    // Stops on SIGTERM or Ctrl-C, or when another run took this node's name.
    let ended = members.clone();
    let stop = async move {
        match ended {
            Some(c) => {
                tokio::select! { () = shutdown_signal() => None, why = c.ended() => Some(why) }
            }
            None => {
                shutdown_signal().await;
                None
            }
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let signal = async move {
        let _ = stop_tx.send(stop.await);
    };
    match security.tls {
        Some(tls) => {
            let listener = crate::tls::TlsListener::new(listener, tls);
            crate::edge::serve(listener, app, settings.edge, signal).await?;
        }
        None => crate::edge::serve(listener, app, settings.edge, signal).await?,
    }
    let superseded = stop_rx.await.ok().flatten();
    if let Some(cluster) = members {
        // Every partition finished and handed over at once, not when its lease expires.
        cluster.leave().await;
    }
    // No new requests; in-flight ones finished. Flush the sequencers and stop.
    tracing::info!(timeout = ?settings.shutdown_timeout, "shutting down: finishing queued commands and flushing sequence numbers");
    let clean = cp.shutdown(settings.shutdown_timeout).await;
    if clean
        && let Some(kv) = opened.embedded
        && let Err(e) = tokio::task::spawn_blocking(move || kv.flush_memtables()).await?
    {
        tracing::warn!("writing the journal into table files at shutdown failed: {e}");
    }
    if clean {
        tracing::info!("stopped");
    } else {
        tracing::warn!(
            "shutdown timed out; unflushed numbers are recovered from the PLog at the next start"
        );
    }
    if let Some(why) = superseded {
        anyhow::bail!("{why}");
    }
    Ok(())
}

/// Opens the storage and starts the command processor on it; on PostgreSQL, with this node's
/// high-water marks (`cluster::marks::prepare`).
async fn start(
    settings: &mut Settings,
    node: Option<NodeStart>,
) -> anyhow::Result<(
    crate::config::Opened,
    CommandProcessor<Store>,
    Option<NodeReady>,
)> {
    let mut opened = {
        let mut s = settings.clone();
        let opened =
            tokio::task::spawn_blocking(move || open_storage(&mut s).map(|o| (o, s))).await??;
        *settings = opened.1;
        opened.0
    };
    let node = match (node, &opened.postgres) {
        (Some(node), Some(pg)) => {
            let table: Arc<dyn crate::cluster::FencedLeases> = Arc::new(
                crate::cluster::PgLeaseTable::new(Arc::clone(pg), &lease_pool(settings).await?),
            );
            let marks = crate::cluster::marks::prepare(
                &node.cluster,
                &node.forwarder.prober(),
                &table,
                &mut opened,
                settings.accept_loss,
            )
            .await?;
            Some(NodeReady {
                start: node,
                table,
                marks,
            })
        }
        _ => None,
    };
    log_opened(settings, &opened);
    let store =
        monoseq_store::EventStore::new(Arc::clone(&opened.kv), crate::config::APP, settings.trust);
    let mut config = settings.cp_config();
    config.retired = (0..opened.identity.partitions)
        .map(|p| opened.identity.retired(p))
        .collect();
    if settings.no_marks {
        tracing::warn!(
            "--no-marks: high-water marks are not kept; a loss of acknowledged events would go \
             unnoticed (benchmarks only)"
        );
    } else {
        config.marks = opened.marks.clone();
    }
    let cp = if opened.postgres.is_some() {
        // Partitions start as their leases are taken (`join_cluster`).
        CommandProcessor::start_unowned(store, config)?
    } else {
        CommandProcessor::start(store, config)?
    };
    Ok((opened, cp, node))
}

/// A second connection pool to the database, for the lease calls alone.
async fn lease_pool(settings: &Settings) -> anyhow::Result<monoseq_pg::PgStore> {
    let crate::config::Storage::Postgres(url) = settings.storage.clone() else {
        anyhow::bail!("leases are kept only in a PostgreSQL database");
    };
    let options =
        monoseq_pg::PgOptions::default().pool_connections(crate::cluster::LEASE_POOL_CONNECTIONS);
    tokio::task::spawn_blocking(move || monoseq_pg::PgStore::open(&url, options))
        .await?
        .map_err(|e| anyhow::anyhow!("opening the lease calls' connections: {e}"))
}

/// What a node of a cluster settles before its storage opens: its settings and how it reaches
/// the other nodes.
struct NodeStart {
    cluster: crate::cluster::ClusterSettings,
    forwarder: Forwarder,
}

impl NodeStart {
    fn new(
        settings: &Settings,
        args: &ClusterArgs,
        security: &crate::auth::Security,
        local: std::net::SocketAddr,
    ) -> anyhow::Result<NodeStart> {
        let cluster = args.resolve(&settings.cluster, settings.listen, local, security.scheme())?;
        let forwarder = Forwarder::new(
            &cluster.node_id,
            cluster.redirect,
            security.auth.outbound_authorization(),
            cluster.peer_ca_cert.as_deref().or(security.tls_cert()),
        )?;
        Ok(NodeStart { cluster, forwarder })
    }
}

/// A node whose storage and marks are open, ready to join.
struct NodeReady {
    start: NodeStart,
    table: Arc<dyn crate::cluster::FencedLeases>,
    marks: Arc<crate::cluster::NodeMarks>,
}

/// On PostgreSQL, joins the nodes sharing the database: takes a fair share of the partitions'
/// leases and forwards commands for the others.
async fn join_cluster(
    node: Option<NodeReady>,
    settings: &Settings,
    cp: &CommandProcessor<Store>,
    opened: &crate::config::Opened,
) -> anyhow::Result<Option<(Arc<Cluster>, Forwarder)>> {
    let Some(NodeReady {
        start: NodeStart { cluster, forwarder },
        table,
        marks,
    }) = node
    else {
        return Ok(None);
    };
    let members = Cluster::join(
        cluster,
        table,
        cp.clone(),
        (Arc::clone(&opened.kv), settings.trust),
        marks,
        forwarder.prober(),
    )
    .await?;
    Ok(Some((members, forwarder)))
}

/// One line for the opened store, then one per loss accepted or partition moved past one.
fn log_opened(settings: &Settings, dir: &crate::config::Opened) {
    let id = &dir.identity;
    let r = &dir.report;
    let recovery_policy = match settings.storage {
        crate::config::Storage::Embedded => crate::config::ENGINE_RECOVERY_POLICY,
        crate::config::Storage::Postgres(_) => crate::config::POSTGRES_RECOVERY_POLICY,
    };
    tracing::info!(
        storage = %settings.storage.describe(),
        data_dir = %settings.data_dir.display(),
        store_id = %id.store_id,
        partitions = id.partitions,
        key_layout = id.key_layout,
        created = r.created,
        adopted = r.adopted,
        accepted_losses = id.losses.len(),
        recovery_policy,
        "store opened"
    );
    if r.identity_rebuilt {
        tracing::warn!("identity file rebuilt from the engine (--accept-loss)");
    }
    if r.marks_rebuilt {
        tracing::warn!("high-water marks rebuilt from the engine (--accept-loss)");
    }
    crate::backup::log_restored(r);
    for loss in &r.accepted {
        tracing::warn!(
            partition = loss.partition,
            lost_events = loss.events(),
            "loss accepted (--accept-loss): {loss}; numbers handed out before it stay retired"
        );
    }
    for p in &r.retired_partitions {
        tracing::info!(
            partition = p,
            next_plog_offset = id.retired(*p).plog + 1,
            "sequence state moved past the accepted loss"
        );
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}

/// Corrupt places remembered for logging once; past it, each is logged again.
const CORRUPTED_LOGGED_MAX: usize = 1024;

/// Answers a failed read: corrupt bytes are a 500 `corrupted` naming the key (logged once per
/// place and counted), a storage fault a 503 with `Retry-After`.
fn read_error(
    st: &AppState,
    asked: impl FnOnce() -> String,
    e: &monoseq_store::ReadError,
) -> Response {
    use monoseq_store::ReadError;
    let place = match e {
        ReadError::Corrupt { slot, .. } | ReadError::Misplaced { slot, .. } => {
            Some(slot.to_string())
        }
        ReadError::Storage(monoseq_kv::KvError::Corrupted { .. }) => Some(asked()),
        _ => None,
    };
    match place {
        Some(place) => {
            st.metrics.corrupted.inc();
            let first = {
                let mut logged = st
                    .metrics
                    .corrupted_logged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if logged.len() >= CORRUPTED_LOGGED_MAX {
                    logged.clear();
                }
                logged.insert(place.clone())
            };
            if first {
                tracing::error!(place = %place, "corrupt data in storage: {e}");
            }
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(json!({"code": "corrupted", "key": place, "message": e.to_string()})),
            )
                .into_response()
        }
        None => {
            tracing::warn!("storage read failed: {e}");
            let mut r = error(StatusCode::SERVICE_UNAVAILABLE, "storage_unavailable", e);
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            r
        }
    }
}

fn command_error(e: &CommandError) -> Response {
    let status = status_of(e.class());
    let mut r = error(status, e.code(), e);
    if e.is_transient() {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    }
    r
}

/// The HTTP status of each kind of command error (the README lists them with their codes).
fn status_of(class: ErrorClass) -> StatusCode {
    match class {
        ErrorClass::Invalid => StatusCode::BAD_REQUEST,
        ErrorClass::NotFound => StatusCode::NOT_FOUND,
        ErrorClass::Conflict => StatusCode::CONFLICT,
        ErrorClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorClass::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorClass::Transient => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The request header that makes a retry safe (IETF httpapi idempotency-key draft).
const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set on an answer repeated for a retry with the same key.
const IDEMPOTENCY_REPLAYED: &str = "idempotency-replayed";

async fn submit(
    State(st): State<Arc<AppState>>,
    headers: axum::http::HeaderMap,
    body: Result<axum::Json<CommandBody>, JsonRejection>,
) -> Response {
    let cmd = match body {
        Ok(axum::Json(c)) => c,
        Err(rejection) => {
            let (status, code) = match &rejection {
                JsonRejection::JsonSyntaxError(_) => (StatusCode::BAD_REQUEST, "malformed_json"),
                JsonRejection::JsonDataError(_) => (StatusCode::BAD_REQUEST, "invalid_command"),
                JsonRejection::MissingJsonContentType(_) => {
                    (StatusCode::UNSUPPORTED_MEDIA_TYPE, "content_type")
                }
                _ if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                    (StatusCode::PAYLOAD_TOO_LARGE, "too_large")
                }
                _ => (StatusCode::BAD_REQUEST, "bad_request"),
            };
            st.metrics
                .commands
                .get_or_create(&vec![("code".into(), code.into())])
                .inc();
            return error(status, code, rejection.body_text());
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
    if let Some(answer) = route_elsewhere(&st, &cmd, &headers).await {
        return answer;
    }
    match st.cp.submit_keyed(crate::wire::command(cmd), key).await {
        Ok(out) => {
            st.metrics.commands_ok.inc();
            let replayed = out.replayed;
            let mut r = axum::Json(crate::wire::outcome(&out)).into_response();
            if replayed {
                r.headers_mut()
                    .insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
            }
            r
        }
        Err(e) => {
            st.metrics
                .commands
                .get_or_create(&vec![("code".into(), e.code().into())])
                .inc();
            command_error(&e)
        }
    }
}

async fn read_event(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(u32, u64)>, axum::extract::rejection::PathRejection>,
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
    1
}

fn page() -> usize {
    100
}

async fn read_wlog(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u64>, axum::extract::rejection::PathRejection>,
    query: Result<Query<WlogQuery>, axum::extract::rejection::QueryRejection>,
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
    let store = st.cp.store().clone();
    let read =
        tokio::task::spawn_blocking(move || store.read_wlog(WsId(ws), WLogOffset(q.from), q.limit))
            .await;
    match read {
        Ok(Ok(events)) => axum::Json(monoseq_wire::WlogPageBody {
            events: events.iter().map(json::event).collect(),
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
    path: Result<Path<(u64, u64)>, axum::extract::rejection::PathRejection>,
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
    cmd: &CommandBody,
    headers: &HeaderMap,
) -> Option<Response> {
    let (cluster, forwarder) = st.cluster.as_ref()?;
    let partition = st.cp.partition_of(WsId(cmd.ws));
    if st.cp.serves(partition) {
        return None;
    }
    let answer = match cluster.owner(partition) {
        Owner::Node { url, .. } if !Forwarder::was_forwarded(headers) => {
            st.metrics.forwarded.inc();
            forwarder.command(&url, cmd, headers).await
        }
        _ => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "partition_unavailable",
                format!(
                    "partition {partition} is moving between nodes (no live lease, or its owner \
                     changed just now); retry"
                ),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            r
        }
    };
    Some(answer)
}

/// `GET /v1/cluster`: the nodes, their partitions, epochs and lease ages.
async fn cluster_status(State(st): State<Arc<AppState>>) -> Response {
    let Some((cluster, _)) = &st.cluster else {
        return axum::Json(json!({
            "clustered": false,
            "message": "one node on embedded storage serves every partition",
            "partitions": st.cp.owned(),
        }))
        .into_response();
    };
    match cluster.status_json().await {
        Ok(mut v) => {
            v["clustered"] = json!(true);
            axum::Json(v).into_response()
        }
        Err(e) => {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                format!("reading the leases failed: {e:#}"),
            );
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
            r
        }
    }
}

/// `GET /v1/marks`: this node's high-water marks per partition and the losses accepted for
/// the store (other nodes merge them into theirs).
async fn marks(State(st): State<Arc<AppState>>) -> Response {
    if let Some((cluster, _)) = &st.cluster {
        return axum::Json(cluster.marks_answer()).into_response();
    }
    let marks = st.cp.config().marks.as_ref().map(|m| m.all());
    axum::Json(json!({
        "store_id": st.info["store_id"],
        "partitions": st.cp.config().partitions,
        "marks": marks.unwrap_or_default(),
        "losses": [],
    }))
    .into_response()
}

/// `GET /readyz`: 200 when this node can answer or forward a command for every partition
/// (on a cluster: each has a live owner, served here or by a node that answered a health probe
/// lately, and none is about to move); else 503 naming the partitions and why.
async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let unready = match &st.cluster {
        Some((cluster, _)) => cluster.unready(),
        None => st.cp.unready(),
    };
    if unready.is_empty() {
        return "ready".into_response();
    }
    let partitions: Vec<_> = unready
        .iter()
        .map(|(p, why)| json!({"partition": p, "reason": why}))
        .collect();
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({
            "code": "not_ready",
            "message": format!("{} partitions cannot be answered yet", unready.len()),
            "partitions": partitions,
        })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let s = st.cp.stats();
    let m = &st.metrics;
    m.backlog.set(s.backlog_values as i64);
    m.actualizing.set(s.actualizing_partitions as i64);
    m.replayed.set(s.replayed_events as i64);
    m.actualizations.set(s.actualizations as i64);
    m.groups.set(s.groups as i64);
    m.rebuilds.set(s.rebuilds as i64);
    m.unavailable.set(s.unavailable_partitions as i64);
    m.replayed_commands.set(s.replayed as i64);
    m.owned.set(st.cp.owned().len() as i64);
    let lookups = s.cache_hits + s.cache_misses;
    m.cache_hit_ratio.set(if lookups == 0 {
        0.0
    } else {
        s.cache_hits as f64 / lookups as f64
    });
    let (mut lag, mut longest) = (0u64, 0u64);
    for p in st.cp.partition_stats() {
        lag = lag.max(p.next_offset.saturating_sub(p.durable_offset));
        longest = longest.max(p.last_actualization_micros);
    }
    m.checkpoint_lag.set(lag as i64);
    m.actualization_seconds.set(longest as f64 / 1e6);
    let mut text = String::new();
    if let Err(e) = encode(&mut text, &m.registry) {
        return error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
