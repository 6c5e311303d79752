//! The Rust client (`monoseq-client`) against the real binary: a command and its retry with
//! the same key, reading it back (event, record, WLog as a stream of pages), the server's
//! info and cluster view, a named sequence, a bearer token over TLS with a CA, and kept-alive
//! connections let go before the server's idle timeout closes them.

mod common;
mod security;

use std::time::Duration;

use common::{Server, metric, metrics};
use futures_util::TryStreamExt;
use monoseq_client::{Client, CommandBody, KindBody, NewRecordBody};

fn order(ws: u64, total: u64) -> CommandBody {
    let mut command = CommandBody::new(ws, 1, "app.CreateOrder");
    let mut record = NewRecordBody::new(1, KindBody::CDoc, "app.Order");
    record.fields.insert("total".into(), total.into());
    command.create.push(record);
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_is_applied_once_and_read_back_through_the_client() {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_ready(dir.path(), &["--partitions", "4"], &reqwest::Client::new()).await;
    let client = Client::new(&server.url).unwrap();

    let first = client.submit(&order(6, 10)).await.unwrap();
    assert_eq!((first.outcome.partition, first.outcome.plog_offset), (2, 1));
    assert!(!first.replayed);
    // The same key again (a retry whose first answer was lost): the original answer.
    let again = client
        .submit_with_key(&order(6, 10), &first.key)
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.outcome, first.outcome);

    let event = client.event(2, 1).await.unwrap().expect("the event");
    assert_eq!(event.idempotency_key.as_deref(), Some(first.key.as_str()));
    assert!(client.event(2, 99).await.unwrap().is_none());
    let id = first.outcome.ids[&1];
    let record = client.record(6, id).await.unwrap().expect("the record");
    assert_eq!(record.fields["total"], 10);
    for total in 11..=14 {
        client.submit(&order(6, total)).await.unwrap();
    }
    let pages: Vec<Vec<_>> = client.wlog(6, 1, 2).try_collect().await.unwrap();
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), [2, 2, 1]);

    let info = client.info().await.unwrap();
    assert_eq!(info.partitions, 4);
    assert!(matches!(
        client.cluster().await.unwrap(),
        monoseq_client::ClusterBody::Single { .. }
    ));
    let address = "orders/invoice".parse().unwrap();
    let options = monoseq_named::NextOptions::new().initial(1000);
    assert_eq!(
        client.sequences().next(&address, &options).await.unwrap(),
        1000
    );
    assert_eq!(
        client.sequences().next(&address, &options).await.unwrap(),
        1001
    );

    let refused = client
        .submit(&CommandBody::new(6, 99, "app.Bad"))
        .await
        .unwrap_err();
    assert_eq!(
        (refused.status(), refused.code().as_str()),
        (Some(400), "unknown_workspace_kind")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_presents_its_token_over_tls_trusting_the_given_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = security::Pki::new(dir.path());
    let tokens = security::both_tokens(dir.path());
    let server = security::launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
            "--tokens-file",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .expect("server starts");
    server.ready(&pki.client(), Some(security::READ)).await;
    let ca = std::fs::read(&pki.ca).unwrap();
    let client = Client::builder([server.url.clone()])
        .token(security::WRITE)
        .ca_pem(ca.clone())
        .build()
        .unwrap();
    let done = client.submit(&order(3, 1)).await.unwrap();
    assert!(
        client
            .event(done.outcome.partition, 1)
            .await
            .unwrap()
            .is_some()
    );

    let without = Client::builder([server.url.clone()])
        .ca_pem(ca)
        .build()
        .unwrap();
    let refused = without.submit(&order(3, 1)).await.unwrap_err();
    assert_eq!(
        (refused.status(), refused.code().as_str()),
        (Some(401), "unauthorized")
    );
    // A client that does not trust the CA gets no answer at all.
    let untrusting = Client::builder([server.url.clone()])
        .token(security::WRITE)
        .retry_timeout(std::time::Duration::ZERO)
        .build()
        .unwrap();
    let e = untrusting.submit(&order(3, 1)).await.unwrap_err();
    assert_eq!(e.code().as_str(), "transport", "{e}");
}

/// A scripted node of `partitions` partitions whose `/v1/cluster` names, for each partition
/// `p`, an owner at `http://p{p}.invalid`: the URL `Client::node_of` answers names the
/// partition the client routed to.
async fn scripted_node(partitions: u32) -> String {
    use axum::routing::get;
    use serde_json::json;
    let info = json!({"version": "t", "partitions": partitions, "trust_level": 0,
                      "storage": "embedded", "store_id": "s", "idempotency_window_events": 10});
    let nodes: Vec<_> = (0..partitions)
        .map(|p| {
            json!({"node_id": format!("n{p}"), "url": format!("http://p{p}.invalid"),
                        "alive": true, "partitions": [p]})
        })
        .collect();
    let leases: Vec<_> = (0..partitions)
        .map(|p| json!({"partition": p, "epoch": 1, "owner": format!("n{p}")}))
        .collect();
    let cluster = json!({"clustered": true, "node_id": "n0", "lease_ms": 60_000,
                         "renew_ms": 20_000, "nodes": nodes, "partitions": leases});
    let router = axum::Router::new()
        .route("/v1/info", get(move || async move { axum::Json(info) }))
        .route(
            "/v1/cluster",
            get(move || async move { axum::Json(cluster) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// The client routes a workspace to the partition the server runs it in (`WsId::partition`,
/// which the processor and the server's routes use), for many partition counts and
/// workspaces, the largest included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_routes_each_workspace_to_the_partition_the_server_runs_it_in() {
    use monoseq_core::WsId;
    let workspaces: Vec<u64> = (0..300)
        .chain([1 << 32, (1 << 32) + 7, u64::MAX - 1, u64::MAX])
        .chain((0..40).map(|i| 0x9E37_79B9_7F4A_7C15_u64.wrapping_mul(i + 1)))
        .collect();
    for partitions in [1, 2, 3, 4, 7, 8, 13, 64, 100, 1_000] {
        let client = Client::new(&scripted_node(partitions).await).unwrap();
        client.refresh().await.unwrap();
        for &ws in &workspaces {
            let server = WsId(ws).partition(partitions);
            assert_eq!(
                client.node_of(ws).await,
                format!("http://p{server}.invalid"),
                "workspace {ws} among {partitions} partitions"
            );
        }
    }
}

/// A connection the server closes for idleness while the client picks it for a request gets
/// no answer, and a command without a key is not sent again: the client lets its unused
/// connections go first. One whose idle timeout outlasts the server's leaves the server to
/// close its connection (counted), which shows the count would catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_closes_an_unused_connection_before_the_servers_idle_timeout_does() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let server = Server::start_ready(dir.path(), &["--idle-timeout-ms", "3000"], &http).await;
    let idle_closes = async || {
        metric(
            &metrics(&http, &server.url).await,
            "monoseq_edge_limit_trips_total{limit=\"idle_timeout\"}",
        )
    };
    for (client_idle, server_closes) in [
        (Duration::from_millis(300), 0),
        (Duration::from_secs(60), 1),
    ] {
        let client = Client::builder([server.url.clone()])
            .idle_timeout(client_idle)
            .build()
            .unwrap();
        let before = idle_closes().await;
        client
            .submit_unkeyed(&order(3, 1))
            .await
            .expect("a command");
        // Past the server's idle timeout (with room for a busy machine's timers), or until it
        // closed the connection.
        let waited = std::time::Instant::now();
        while waited.elapsed() < Duration::from_millis(4500)
            || (server_closes > 0
                && idle_closes().await == before
                && waited.elapsed() < Duration::from_secs(15))
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            idle_closes().await - before,
            server_closes,
            "connections the server closed for idleness, the client's idle timeout {client_idle:?}"
        );
        client
            .submit_unkeyed(&order(3, 2))
            .await
            .expect("a command after the pause");
        drop(client);
    }
}
