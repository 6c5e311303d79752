//! The client against scripted nodes (small axum servers on loopback): retries keep one
//! `Idempotency-Key` and honour `Retry-After`, commands go to the owner named by
//! `/v1/cluster` or by a redirect, and a refused connection or `not_owner` moves them on.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use monoseq_client::{Client, CommandBody};
use serde_json::json;

/// What a scripted node received: the path and the idempotency key of each command.
type Log = Arc<Mutex<Vec<String>>>;

async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

fn ok() -> Response {
    axum::Json(json!({"partition": 1, "plog_offset": 5, "wlog_offset": 2, "ids": {}}))
        .into_response()
}

fn unavailable(code: &str, retry_after: u64) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        [(header::RETRY_AFTER, retry_after.to_string())],
        axum::Json(json!({"code": code, "message": "retry"})),
    )
        .into_response()
}

fn key(headers: &HeaderMap) -> String {
    headers
        .get("idempotency-key")
        .map_or("-", |k| k.to_str().unwrap())
        .to_owned()
}

/// A node of `partitions` partitions whose `/v1/cluster` names `owner` (node "n2" at that URL)
/// for every partition, and whose commands are answered by `answer(attempt)`.
fn node(log: Log, partitions: u32, owner: Option<String>, answer: fn(usize) -> Response) -> Router {
    let info = json!({"version": "t", "partitions": partitions, "trust_level": 0,
                      "storage": "embedded", "store_id": "s", "idempotency_window_events": 10});
    let cluster = match owner {
        Some(url) => json!({"clustered": true, "node_id": "n1", "lease_ms": 1000, "renew_ms": 300,
            "nodes": [{"node_id": "n2", "url": url, "alive": true, "partitions": [0, 1]}],
            "partitions": [{"partition": 0, "epoch": 1, "owner": "n2"},
                           {"partition": 1, "epoch": 1, "owner": "n2"}]}),
        None => json!({"clustered": false, "message": "one", "partitions": [0, 1]}),
    };
    Router::new()
        .route("/v1/info", get(move || async move { axum::Json(info) }))
        .route(
            "/v1/cluster",
            get(move || async move { axum::Json(cluster) }),
        )
        .route(
            "/v1/commands",
            post(move |headers: HeaderMap| async move {
                let attempt = {
                    let mut log = log.lock().unwrap();
                    log.push(key(&headers));
                    log.len()
                };
                answer(attempt)
            }),
        )
}

fn order() -> CommandBody {
    CommandBody::new(1, 1, "app.Order")
}

#[tokio::test]
async fn retries_of_a_busy_command_carry_its_one_key_and_wait_for_retry_after() {
    let log = Log::default();
    let url = serve(node(log.clone(), 2, None, |n| match n {
        1 => unavailable("busy", 1),
        2 => unavailable("storage_unavailable", 0),
        _ => ok(),
    }))
    .await;
    let client = Client::new(&url).unwrap();
    let began = Instant::now();
    let done = client.submit(&order()).await.unwrap();
    assert!(
        began.elapsed() >= Duration::from_secs(1),
        "Retry-After: 1 was not honoured"
    );
    assert_eq!(done.attempts, 3);
    assert_eq!(done.outcome.plog_offset, 5);
    let keys = log.lock().unwrap().clone();
    assert_eq!(keys, vec![done.key.clone(); 3], "one key for every attempt");
    // The next logical command gets a key of its own.
    let again = client.submit(&order()).await.unwrap();
    assert_ne!(again.key, done.key);
}

/// A writer for a test's own log: what the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn each_attempt_and_each_wait_is_logged_at_debug_level() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // This test's runtime has one thread: the client's calls log to this subscriber.
    let _default = tracing::subscriber::set_default(subscriber);
    let log = Log::default();
    let url = serve(node(log.clone(), 2, None, |n| match n {
        1 => unavailable("storage_unavailable", 0),
        _ => ok(),
    }))
    .await;
    let client = Client::new(&url).unwrap();
    client.submit(&order()).await.unwrap();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let has = |parts: &[&str]| lines.iter().any(|l| parts.iter().all(|p| l.contains(p)));
    assert!(
        has(&[
            "answered",
            "POST",
            "/v1/commands",
            "status=503",
            "elapsed_ms"
        ]),
        "{text}"
    );
    assert!(
        has(&["retrying after a wait", "storage_unavailable", "wait_ms"]),
        "{text}"
    );
    assert!(has(&["answered", "/v1/commands", "status=200"]), "{text}");
}

#[tokio::test]
async fn retries_stop_at_the_retry_timeout_with_the_last_answer() {
    let log = Log::default();
    let url = serve(node(log.clone(), 2, None, |_| unavailable("busy", 0))).await;
    let client = Client::builder([url])
        .retry_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let e = client.submit(&order()).await.unwrap_err();
    assert_eq!((e.status(), e.code().as_str()), (Some(503), "busy"), "{e}");
    assert!(log.lock().unwrap().len() >= 2);
}

#[tokio::test]
async fn a_command_goes_to_the_owner_that_the_cluster_view_names() {
    let (seed_log, owner_log) = (Log::default(), Log::default());
    let owner = serve(node(owner_log.clone(), 2, None, |_| ok())).await;
    let seed = serve(node(seed_log.clone(), 2, Some(owner.clone()), |_| ok())).await;
    let client = Client::new(&seed).unwrap();
    client.submit(&order()).await.unwrap();
    assert_eq!(
        seed_log.lock().unwrap().len(),
        0,
        "the seed was asked only for the view"
    );
    assert_eq!(owner_log.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn node_of_names_the_owner_that_the_cluster_view_names_so_batches_can_be_gathered_by_owner() {
    let owner = serve(node(Log::default(), 2, None, |_| ok())).await;
    let seed = serve(node(Log::default(), 2, Some(owner.clone()), |_| ok())).await;
    let client = Client::new(&seed).unwrap();
    assert_eq!(client.node_of(1).await, owner);
    assert_eq!(client.node_of(2).await, owner);
}

#[tokio::test]
async fn a_client_that_read_the_server_info_first_still_sends_commands_to_the_owner() {
    let (seed_log, owner_log) = (Log::default(), Log::default());
    let owner = serve(node(owner_log.clone(), 2, None, |_| ok())).await;
    let seed = serve(node(seed_log.clone(), 2, Some(owner.clone()), |_| ok())).await;
    let client = Client::new(&seed).unwrap();
    assert_eq!(client.info().await.unwrap().partitions, 2);
    for _ in 0..3 {
        client.submit(&order()).await.unwrap();
    }
    assert_eq!(
        seed_log.lock().unwrap().len(),
        0,
        "knowing the partition count is not knowing the owners"
    );
    assert_eq!(owner_log.lock().unwrap().len(), 3);
}

#[tokio::test]
async fn a_view_older_than_its_maximum_age_is_asked_for_again() {
    let (first_log, second_log) = (Log::default(), Log::default());
    let first = serve(node(first_log.clone(), 2, None, |_| ok())).await;
    let second = serve(node(second_log.clone(), 2, None, |_| ok())).await;
    // The seed names `first` as the owner until the partition moves to `second`; a node that
    // no longer owns it would still forward (and answer) the command, so only a refresh of
    // the view can tell the client.
    let owner = Arc::new(Mutex::new(first.clone()));
    let seed_owner = Arc::clone(&owner);
    let seed = serve(
        Router::new()
            .route(
                "/v1/info",
                get(|| async {
                    axum::Json(json!({"version": "t", "partitions": 2, "trust_level": 0,
                        "storage": "pg", "store_id": "s", "idempotency_window_events": 10}))
                }),
            )
            .route(
                "/v1/cluster",
                get(move || {
                    let url = seed_owner.lock().unwrap().clone();
                    async move {
                        axum::Json(json!({"clustered": true, "node_id": "n1", "lease_ms": 1000,
                            "renew_ms": 300,
                            "nodes": [{"node_id": "n2", "url": url, "alive": true,
                                       "partitions": [0, 1]}],
                            "partitions": [{"partition": 0, "epoch": 1, "owner": "n2"},
                                           {"partition": 1, "epoch": 1, "owner": "n2"}]}))
                    }
                }),
            ),
    )
    .await;
    let client = Client::builder([seed])
        .view_max_age(Duration::from_millis(200))
        .build()
        .unwrap();
    client.submit(&order()).await.unwrap();
    *owner.lock().unwrap() = second.clone();
    client.submit(&order()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    client.submit(&order()).await.unwrap();
    assert_eq!(
        first_log.lock().unwrap().len(),
        2,
        "the view was trusted while fresh"
    );
    assert_eq!(
        second_log.lock().unwrap().len(),
        1,
        "an old view was asked for again"
    );
}

#[tokio::test]
async fn a_redirect_teaches_the_owner_and_keeps_the_key() {
    let (seed_log, owner_log) = (Log::default(), Log::default());
    let owner = serve(node(owner_log.clone(), 2, None, |_| ok())).await;
    let location = format!("{owner}/v1/commands");
    let seed_router = Router::new()
        .route(
            "/v1/info",
            get(|| async {
                axum::Json(json!({"version": "t", "partitions": 2,
            "trust_level": 0, "storage": "e", "store_id": "s", "idempotency_window_events": 1}))
            }),
        )
        .route(
            "/v1/cluster",
            get(|| async { StatusCode::SERVICE_UNAVAILABLE }),
        )
        .route(
            "/v1/commands",
            post({
                let log = seed_log.clone();
                move |headers: HeaderMap| async move {
                    log.lock().unwrap().push(key(&headers));
                    (
                        StatusCode::TEMPORARY_REDIRECT,
                        [(header::LOCATION, location)],
                    )
                }
            }),
        );
    let seed = serve(seed_router).await;
    let client = Client::new(&seed).unwrap();
    let first = client.submit(&order()).await.unwrap();
    client.submit(&order()).await.unwrap();
    assert_eq!(
        seed_log.lock().unwrap().len(),
        1,
        "the second went straight to the owner"
    );
    let owner_keys = owner_log.lock().unwrap().clone();
    assert_eq!(owner_keys.len(), 2);
    assert_eq!(owner_keys[0], first.key);
    assert_eq!(seed_log.lock().unwrap()[0], first.key);
}

/// A node that answers `/v1/info` but has no cluster view to give (503), and answers
/// commands with `answer`.
fn viewless(log: Log, answer: fn(usize) -> Response) -> Router {
    let info = json!({"version": "t", "partitions": 2, "trust_level": 0, "storage": "e",
                      "store_id": "s", "idempotency_window_events": 1});
    Router::new()
        .route("/v1/info", get(move || async move { axum::Json(info) }))
        .route(
            "/v1/commands",
            post(move |headers: HeaderMap| async move {
                let attempt = {
                    let mut log = log.lock().unwrap();
                    log.push(key(&headers));
                    log.len()
                };
                answer(attempt)
            }),
        )
}

/// `node` with a `/v1/cluster` whose first answer is a 503 (the client's first refresh learns
/// no owner) and whose later ones name node "n2" at `owner` for partitions 0 and 1.
fn moved_away(node: Router, owner: &str) -> Router {
    let views = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let owner_view = json!({"clustered": true, "node_id": "n1", "lease_ms": 1000, "renew_ms": 300,
        "nodes": [{"node_id": "n2", "url": owner, "alive": true, "partitions": [0, 1]}],
        "partitions": [{"partition": 0, "epoch": 2, "owner": "n2"},
                       {"partition": 1, "epoch": 2, "owner": "n2"}]});
    node.route(
        "/v1/cluster",
        get(move || async move {
            match views.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => unavailable("storage_unavailable", 1),
                _ => axum::Json(owner_view).into_response(),
            }
        }),
    )
}

#[tokio::test]
async fn a_refused_connection_moves_the_command_to_the_next_node() {
    // A port nothing listens on: bound, then closed.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let log = Log::default();
    let live = viewless(log.clone(), |_| ok()).route(
        "/v1/cluster",
        get(|| async { unavailable("storage_unavailable", 1) }),
    );
    let live = serve(live).await;
    let client = Client::builder([dead, live]).build().unwrap();
    let done = client.submit(&order()).await.unwrap();
    assert_eq!(done.attempts, 2, "the first went to the refusing node");
    assert_eq!(log.lock().unwrap().as_slice(), [done.key]);
}

#[tokio::test]
async fn not_owner_refreshes_the_view_and_goes_to_the_new_owner_without_asking_the_old_one_again() {
    let (moved_log, owner_log) = (Log::default(), Log::default());
    let owner = serve(node(owner_log.clone(), 2, None, |_| ok())).await;
    // The node that lost the partition answers not_owner; its first view of the cluster (the
    // client's first refresh) has no owners, its later ones name the owner.
    let moved = moved_away(
        viewless(moved_log.clone(), |_| unavailable("not_owner", 60)),
        &owner,
    );
    let moved = serve(moved).await;
    // Retry-After says 60 s, past the client's retry timeout: a client that honoured it would
    // give up at once and answer the refusal.
    let client = Client::builder([moved])
        .retry_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let done = client
        .submit(&order())
        .await
        .expect("a moved partition is retried at its owner without waiting Retry-After");
    // The not_owner answer came within REFRESH_INTERVAL_MIN of the client's first refresh:
    // the client waits until the next refresh is allowed and takes it, rather than send the
    // command back to the node that refused it, so that node is asked once.
    assert_eq!(*moved_log.lock().unwrap(), vec![done.key.clone()]);
    assert_eq!(owner_log.lock().unwrap().as_slice(), [done.key]);
}

#[tokio::test]
async fn a_batch_meeting_a_moved_partition_waits_for_a_new_view_instead_of_asking_the_old_owner_again()
 {
    // Answers a batch's commands alike: `result` for each, and logs one entry per batch.
    fn batch_node(log: Log, result: serde_json::Value) -> Router {
        Router::new().route(
            "/v1/commands/batch",
            post(move |body: axum::Json<serde_json::Value>| async move {
                log.lock().unwrap().push("batch".into());
                let n = body.0["commands"].as_array().unwrap().len();
                axum::Json(json!({"results": vec![result; n]}))
            }),
        )
    }
    let (moved_log, owner_log) = (Log::default(), Log::default());
    let outcome = json!({"partition": 1, "plog_offset": 5, "wlog_offset": 2, "ids": {}});
    let owner = serve(batch_node(
        owner_log.clone(),
        json!({"status": 200, "outcome": outcome}),
    ))
    .await;
    let not_owner = json!({"status": 503, "retry_after": 1,
                           "error": {"code": "not_owner", "message": "moved"}});
    let moved = viewless(Log::default(), |_| ok()).merge(batch_node(moved_log.clone(), not_owner));
    let moved = serve(moved_away(moved, &owner)).await;
    let client = Client::builder([moved]).build().unwrap();
    let commands: Vec<_> = (0..4)
        .map(|ws| monoseq_client::BatchCommandBody::new(CommandBody::new(ws, 1, "app.Order"), None))
        .collect();
    let results = client.submit_batch(&commands).await.unwrap();
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    assert_eq!(
        moved_log.lock().unwrap().len(),
        1,
        "the old owner was asked again"
    );
    assert_eq!(owner_log.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn wlog_pages_stream_until_the_end() {
    use futures_util::TryStreamExt;
    let router = Router::new().route(
        "/v1/workspaces/7/wlog",
        get(
            |q: axum::extract::Query<std::collections::HashMap<String, u64>>| async move {
                let from = q.0["from"];
                let limit = q.0["limit"];
                let events: Vec<_> = (from..=5.min(from + limit - 1))
                    .map(|o| {
                        json!({"plog_offset": o, "ws": 7, "ws_kind": 1, "wlog_offset": o,
                    "registered_at_ms": 0, "command": "c", "argument": null, "created": [],
                    "updated": [], "idempotency_key": null})
                    })
                    .collect();
                axum::Json(json!({"events": events}))
            },
        ),
    );
    let client = Client::new(&serve(router).await).unwrap();
    let pages: Vec<Vec<_>> = client.wlog(7, 1, 2).try_collect().await.unwrap();
    let offsets: Vec<Vec<u64>> = pages
        .iter()
        .map(|p| p.iter().map(|e| e.wlog_offset).collect())
        .collect();
    assert_eq!(offsets, [vec![1, 2], vec![3, 4], vec![5]]);
}

#[tokio::test]
async fn an_unkeyed_command_is_retried_only_after_answers_that_applied_nothing() {
    let log = Log::default();
    let url = serve(viewless(log.clone(), |n| match n {
        1 => unavailable("busy", 0),
        2 => unavailable("owner_unreachable", 0),
        _ => ok(),
    }))
    .await;
    let client = Client::new(&url).unwrap();
    // busy: nothing applied, retried; owner_unreachable: it may have been, so returned.
    let e = client.submit_unkeyed(&order()).await.unwrap_err();
    assert_eq!(e.code().as_str(), "owner_unreachable", "{e}");
    assert_eq!(
        log.lock().unwrap().as_slice(),
        ["-", "-"],
        "two attempts, neither keyed"
    );
}
