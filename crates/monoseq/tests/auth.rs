//! Bearer-token authentication end to end, against the real binary over real HTTP: refused
//! requests answer 401/403 and write nothing, every route is covered, health is open only on
//! request, tokens never reach the log, and unsafe settings refuse the start.

mod security;

use reqwest::Method;
use security::{READ, WRITE, WRONG, both_tokens, launch, order, send, tokens_file};
use serde_json::{Value, json};

/// A server with [`WRITE`] and [`READ`] from a tokens file, ready.
async fn secured(dir: &std::path::Path, extra: &[&str]) -> (security::Launched, reqwest::Client) {
    let tokens = both_tokens(dir);
    let tokens = tokens.to_str().expect("UTF-8 path");
    let mut args = vec!["--tokens-file", tokens];
    args.extend_from_slice(extra);
    let server = launch(&dir.join("data"), "127.0.0.1:0", &args, &[]).expect("server starts");
    let client = reqwest::Client::new();
    server.ready(&client, Some(WRITE)).await;
    (server, client)
}

/// Asserts a 401 `unauthorized` JSON answer with a Bearer challenge.
fn assert_unauthorized((status, challenge, body): &(u16, Option<String>, Value)) {
    assert_eq!(*status, 401, "{body}");
    assert_eq!(body["code"], "unauthorized", "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    let challenge = challenge.as_deref().expect("a WWW-Authenticate header");
    assert!(challenge.starts_with("Bearer"), "{challenge}");
}

/// Asserts a 403 `forbidden` JSON answer.
fn assert_forbidden((status, _, body): &(u16, Option<String>, Value)) {
    assert_eq!(*status, 403, "{body}");
    assert_eq!(body["code"], "forbidden", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_a_token_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = secured(dir.path(), &[]).await;
    let url = &server.url;
    let commands = format!("{url}/v1/commands");
    assert_unauthorized(&send(&client, Method::POST, &commands, None, Some(&order(3))).await);
    let next = format!("{url}/v1/sequences/orders/invoice/next");
    assert_unauthorized(&send(&client, Method::POST, &next, None, Some(&json!({}))).await);
    assert_unauthorized(&send(&client, Method::GET, &format!("{url}/v1/info"), None, None).await);

    // Nothing was appended: the PLog is empty, the sequence does not exist, and the first
    // accepted command gets PLog offset 1.
    let event = format!("{url}/v1/partitions/3/events/1");
    let (status, _, body) = send(&client, Method::GET, &event, Some(WRITE), None).await;
    assert_eq!(status, 404, "{body}");
    let value = format!("{url}/v1/sequences/orders/invoice/value");
    let (status, _, body) = send(&client, Method::GET, &value, Some(WRITE), None).await;
    assert_eq!((status, &body), (200, &json!({"value": null})));
    let (status, _, body) = send(
        &client,
        Method::POST,
        &commands,
        Some(WRITE),
        Some(&order(3)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["plog_offset"], 1, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (server, client) = secured(dir.path(), &[]).await;
    let url = &server.url;
    let commands = format!("{url}/v1/commands");
    let refused = send(
        &client,
        Method::POST,
        &commands,
        Some(WRONG),
        Some(&order(1)),
    )
    .await;
    assert_unauthorized(&refused);
    let event = format!("{url}/v1/partitions/1/events/1");
    assert_unauthorized(&send(&client, Method::GET, &event, Some(WRONG), None).await);
    // A token of the right length but another scheme is no bearer token.
    let basic = client
        .get(&event)
        .header("authorization", format!("Basic {WRITE}"))
        .send()
        .await
        .unwrap();
    assert_eq!(basic.status().as_u16(), 401);
    let (status, _, body) = send(&client, Method::GET, &event, Some(WRITE), None).await;
    assert_eq!(status, 404, "nothing was appended: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_token_reads_everything_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    // The write token from the file, the read token from the environment.
    let tokens = tokens_file(dir.path(), &format!("write {WRITE}\n"));
    let env_tokens = format!("read:{READ}");
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--partitions",
            "4",
        ],
        &[("MONOSEQ_TOKENS", &env_tokens)],
    )
    .expect("server starts");
    let client = reqwest::Client::new();
    server.ready(&client, Some(READ)).await;
    let url = &server.url;

    let commands = format!("{url}/v1/commands");
    assert_forbidden(
        &send(
            &client,
            Method::POST,
            &commands,
            Some(READ),
            Some(&order(5)),
        )
        .await,
    );
    let seq = format!("{url}/v1/sequences/orders/invoice");
    let next = json!({"initial": 1000});
    assert_forbidden(
        &send(
            &client,
            Method::POST,
            &format!("{seq}/next"),
            Some(READ),
            Some(&next),
        )
        .await,
    );
    let reset = json!({"value": 7});
    assert_forbidden(
        &send(
            &client,
            Method::POST,
            &format!("{seq}/reset"),
            Some(READ),
            Some(&reset),
        )
        .await,
    );
    assert_forbidden(&send(&client, Method::DELETE, &seq, Some(READ), None).await);

    // Nothing was written by the refused requests.
    let event = format!("{url}/v1/partitions/1/events/1");
    let (status, _, _) = send(&client, Method::GET, &event, Some(READ), None).await;
    assert_eq!(status, 404);
    let (status, _, body) = send(
        &client,
        Method::GET,
        &format!("{seq}/value"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!((status, &body), (200, &json!({"value": null})));

    // The write token writes; the read token reads it all back.
    let (status, _, out) = send(
        &client,
        Method::POST,
        &commands,
        Some(WRITE),
        Some(&order(5)),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["plog_offset"], 1, "{out}");
    let id = out["ids"]["1"].as_u64().expect("a record ID");
    let (status, _, out) = send(
        &client,
        Method::POST,
        &format!("{seq}/next"),
        Some(WRITE),
        Some(&next),
    )
    .await;
    assert_eq!((status, &out), (200, &json!({"value": 1000})));
    for path in [
        "/v1/partitions/1/events/1".to_owned(),
        "/v1/workspaces/5/wlog?from=1&limit=10".to_owned(),
        format!("/v1/workspaces/5/records/{id}"),
        "/v1/sequences/orders/invoice/value".to_owned(),
        "/v1/sequences/orders/invoice/data".to_owned(),
        "/v1/sequences/orders/invoice/exists".to_owned(),
        "/v1/info".to_owned(),
        "/healthz".to_owned(),
        "/readyz".to_owned(),
    ] {
        let r = client
            .get(format!("{url}{path}"))
            .bearer_auth(READ)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "GET {path} with the read token");
    }
    let metrics = client
        .get(format!("{url}/metrics"))
        .bearer_auth(READ)
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    let text = metrics.text().await.unwrap();
    assert!(
        text.contains("monoseq_commands_total{code=\"ok\"} 1"),
        "{text}"
    );
}

/// The least token a route needs, in order of what each may send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Needs {
    Read,
    Consume,
    Write,
}

/// A consume token of the test servers.
const CONSUME: &str = "consume-token-0123456789abcdef-C1";

/// Every route of the server (its own, the named sequences', both fallbacks), with the kind
/// of token it needs. The router in `server.rs` and `monoseq_named::router` are the source.
fn routes() -> Vec<(Method, &'static str, Needs)> {
    vec![
        (Method::GET, "/v1/info", Needs::Read),
        (Method::POST, "/v1/commands", Needs::Write),
        (Method::POST, "/v1/commands/batch", Needs::Write),
        (Method::GET, "/v1/partitions/0/events/1", Needs::Read),
        (Method::GET, "/v1/partitions/0/events", Needs::Read),
        (Method::GET, "/v1/workspaces/1/wlog", Needs::Read),
        (Method::GET, "/v1/workspaces/1/records/1", Needs::Read),
        (Method::GET, "/healthz", Needs::Read),
        (Method::GET, "/readyz", Needs::Read),
        (Method::GET, "/metrics", Needs::Read),
        (Method::GET, "/v1/cluster", Needs::Read),
        (Method::GET, "/v1/marks", Needs::Read),
        (Method::GET, "/v1/openapi.json", Needs::Read),
        (Method::GET, "/v1/consumers", Needs::Read),
        (Method::GET, "/v1/consumers/c", Needs::Read),
        (Method::GET, "/v1/consumers/c/partitions/0", Needs::Read),
        (Method::PUT, "/v1/consumers/c/partitions/0", Needs::Consume),
        (
            Method::PUT,
            "/v1/consumers/a%2Fb/partitions/0",
            Needs::Consume,
        ),
        (Method::DELETE, "/v1/consumers/c", Needs::Write),
        (Method::PUT, "/v1/consumers/c", Needs::Write),
        (Method::POST, "/v1/consumers/c/partitions/0", Needs::Write),
        // Consumer groups: a consume token may join them (GET and POST under /v1/groups/).
        (Method::GET, "/v1/groups/g", Needs::Read),
        (Method::POST, "/v1/groups/g/members", Needs::Consume),
        (Method::DELETE, "/v1/groups/g", Needs::Write),
        (Method::POST, "/v1/sequences/s/n/next", Needs::Write),
        (Method::POST, "/v1/sequences/s/n/increment", Needs::Write),
        (Method::POST, "/v1/sequences/s/n/reset", Needs::Write),
        (Method::POST, "/v1/sequences/s/n/set", Needs::Write),
        (Method::PUT, "/v1/sequences/s/n/set", Needs::Write),
        (Method::DELETE, "/v1/sequences/s/n", Needs::Write),
        (Method::GET, "/v1/sequences/s/n/value", Needs::Read),
        (Method::GET, "/v1/sequences/s/n/data", Needs::Read),
        (Method::GET, "/v1/sequences/s/n/exists", Needs::Read),
        // The fallbacks: no such path, a method a route does not take.
        (Method::GET, "/no/such/endpoint", Needs::Read),
        (Method::POST, "/no/such/endpoint", Needs::Write),
        (Method::DELETE, "/v1/commands", Needs::Write),
        (Method::PUT, "/metrics", Needs::Write),
        (Method::PATCH, "/v1/info", Needs::Write),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_needs_a_token_and_each_kind_sends_only_what_its_scope_allows() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = tokens_file(
        dir.path(),
        &format!("write {WRITE}\nread {READ}\nconsume {CONSUME}\n"),
    );
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tokens-file", tokens.to_str().unwrap()],
        &[],
    )
    .expect("server starts");
    let client = reqwest::Client::new();
    server.ready(&client, Some(WRITE)).await;
    let body = json!({"offset": 0});
    for (method, path, needs) in routes() {
        let url = format!("{}{path}", server.url);
        let refused = send(&client, method.clone(), &url, None, Some(&body)).await;
        assert_eq!(
            refused.0, 401,
            "{method} {path} without a token: {}",
            refused.2
        );
        let wrong = send(&client, method.clone(), &url, Some(WRONG), Some(&body)).await;
        assert_eq!(
            wrong.0, 401,
            "{method} {path} with a wrong token: {}",
            wrong.2
        );
        for (token, kind) in [
            (READ, Needs::Read),
            (CONSUME, Needs::Consume),
            (WRITE, Needs::Write),
        ] {
            let (status, _, answer) =
                send(&client, method.clone(), &url, Some(token), Some(&body)).await;
            if kind < needs {
                assert_eq!(
                    status, 403,
                    "{method} {path} with a {kind:?} token: {answer}"
                );
                assert_eq!(answer["code"], "forbidden");
                let message = answer["message"].as_str().unwrap();
                assert!(
                    message.contains(&format!(
                        "needs a {} token",
                        format!("{needs:?}").to_lowercase()
                    )),
                    "{message}"
                );
            } else {
                assert!(
                    status != 401 && status != 403,
                    "{method} {path} with a {kind:?} token: {status} {answer}"
                );
            }
        }
    }
    // A consume token sets a position; it may not delete the consumer, a write token may.
    let position = format!("{}/v1/consumers/c/partitions/1", server.url);
    let (status, _, answer) =
        send(&client, Method::PUT, &position, Some(CONSUME), Some(&body)).await;
    assert_eq!(status, 200, "{answer}");
    let url = format!("{}/v1/consumers/c", server.url);
    let (status, _, _) = send(&client, Method::DELETE, &url, Some(CONSUME), None).await;
    assert_eq!(status, 403);
    let (status, _, answer) = send(&client, Method::DELETE, &url, Some(WRITE), None).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_without_a_token_only_with_open_health() {
    let closed_dir = tempfile::tempdir().unwrap();
    let (closed, client) = secured(closed_dir.path(), &[]).await;
    let open_dir = tempfile::tempdir().unwrap();
    let (open, _) = secured(open_dir.path(), &["--open-health"]).await;
    for path in ["/healthz", "/readyz"] {
        assert_unauthorized(
            &send(
                &client,
                Method::GET,
                &format!("{}{path}", closed.url),
                None,
                None,
            )
            .await,
        );
        let r = client
            .get(format!("{}{path}", open.url))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path} with --open-health");
    }
    // Only health opens.
    for path in ["/metrics", "/v1/info"] {
        assert_unauthorized(
            &send(
                &client,
                Method::GET,
                &format!("{}{path}", open.url),
                None,
                None,
            )
            .await,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_appear_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let node_token = "node-token-0123456789abcdef-N1";
    let tokens = both_tokens(dir.path());
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[("MONOSEQ_NODE_TOKEN", node_token), ("RUST_LOG", "trace")],
    )
    .expect("server starts");
    let client = reqwest::Client::new();
    server.ready(&client, Some(WRITE)).await;
    let commands = format!("{}/v1/commands", server.url);
    for token in [WRITE, READ, WRONG, node_token] {
        send(
            &client,
            Method::POST,
            &commands,
            Some(token),
            Some(&order(2)),
        )
        .await;
        send(
            &client,
            Method::POST,
            &commands,
            Some(token),
            Some(&json!({"bad": 1})),
        )
        .await;
    }
    let log = server.log_text();
    assert!(
        log.contains("authentication on"),
        "the start says auth is on: {log}"
    );
    assert!(
        log.contains("\"write_tokens\":1") && log.contains("\"read_tokens\":1"),
        "{log}"
    );
    assert!(
        server
            .terminate(std::time::Duration::from_secs(20))
            .success()
    );
    let log = std::fs::read_to_string(dir.path().join("data.log")).unwrap();
    for token in [WRITE, READ, WRONG, node_token] {
        assert!(!log.contains(token), "a token in the log: {log}");
    }
}

#[test]
fn a_malformed_tokens_file_refuses_the_start_naming_the_line_but_not_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "secret-0123456789abcdef-S1";
    let tokens = tokens_file(
        dir.path(),
        &format!("write {WRITE}\n# a comment\n{secret}\n"),
    );
    let log = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tokens-file", tokens.to_str().unwrap()],
        &[],
    )
    .err()
    .expect("the start is refused");
    assert!(log.contains("line 3"), "{log}");
    assert!(log.contains(&tokens.display().to_string()), "{log}");
    assert!(!log.contains(secret) && !log.contains(WRITE), "{log}");
    let short = tokens_file(dir.path(), "read short\n");
    let log = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tokens-file", short.to_str().unwrap()],
        &[],
    )
    .err()
    .expect("a short token is refused");
    assert!(
        log.contains("line 1") && log.contains("shorter than 16"),
        "{log}"
    );
}

#[test]
fn a_non_loopback_listener_without_tokens_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let log = launch(&dir.path().join("data"), "0.0.0.0:0", &[], &[])
        .err()
        .expect("the start is refused");
    assert!(
        log.contains("--tokens-file") && log.contains("--allow-unauthenticated"),
        "the error says what to do: {log}"
    );
    assert!(
        !dir.path().join("data").exists(),
        "refused before the data directory is touched"
    );
    let tokens = both_tokens(dir.path());
    let server = launch(
        &dir.path().join("data"),
        "0.0.0.0:0",
        &["--tokens-file", tokens.to_str().unwrap()],
        &[],
    )
    .expect("with tokens it starts");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_through_a_server_with_tokens_sends_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _client) = secured(dir.path(), &[]).await;
    let seq = |extra: &[&str], env: &[(&str, &str)]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_monoseq"))
            .args(["seq", "next", "orders/invoice", "--url", &server.url])
            .args(extra)
            .env_remove("MONOSEQ_TOKEN")
            .envs(env.iter().copied())
            .output()
            .expect("run monoseq seq");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, _, err) = seq(&[], &[]);
    assert!(!ok && err.contains("unauthorized"), "{err}");
    let (ok, out, err) = seq(&["--token", WRITE], &[]);
    assert!(ok, "{err}");
    assert_eq!(out, "1");
    let (ok, out, err) = seq(&[], &[("MONOSEQ_TOKEN", WRITE)]);
    assert!(ok, "{err}");
    assert_eq!(out, "2");
    let (ok, _, err) = seq(&["--token", READ], &[]);
    assert!(!ok && err.contains("forbidden"), "{err}");
    assert!(!err.contains(READ), "the token is never printed: {err}");
}

/// An admin token of the test servers.
const ADMIN: &str = "admin-token-0123456789abcdef-A1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn administration_needs_an_admin_token_which_may_send_everything() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("backups");
    std::fs::create_dir(&root).unwrap();
    let tokens = tokens_file(
        dir.path(),
        &format!("admin {ADMIN}\nwrite {WRITE}\nread {READ}\n"),
    );
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tokens-file",
            tokens.to_str().unwrap(),
            "--backup-root",
            root.to_str().unwrap(),
        ],
        &[],
    )
    .expect("server starts");
    let client = reqwest::Client::new();
    server.ready(&client, Some(ADMIN)).await;
    let url = &server.url;
    // A relative path: refused by the route (400), so only the token check can answer 403.
    let body = json!({"to": "relative"});
    for path in ["/v1/admin/backup", "/v1/admin/nothing"] {
        let admin = format!("{url}{path}");
        assert_unauthorized(&send(&client, Method::POST, &admin, None, Some(&body)).await);
        for token in [READ, WRITE] {
            let refused = send(&client, Method::POST, &admin, Some(token), Some(&body)).await;
            assert_forbidden(&refused);
            assert!(
                refused.2["message"]
                    .as_str()
                    .unwrap()
                    .contains("admin token"),
                "{}",
                refused.2
            );
        }
        let get = send(&client, Method::GET, &admin, Some(READ), None).await;
        assert_forbidden(&get);
    }
    let backup = format!("{url}/v1/admin/backup");
    let (status, _, answer) = send(&client, Method::POST, &backup, Some(ADMIN), Some(&body)).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (400, Some("backup_path_relative")),
        "{answer}"
    );
    // The admin token may send every other request too.
    for (method, path, body) in [
        (Method::POST, "/v1/commands", Some(order(2))),
        (Method::GET, "/v1/info", None),
        (Method::GET, "/metrics", None),
    ] {
        let (status, _, answer) = send(
            &client,
            method.clone(),
            &format!("{url}{path}"),
            Some(ADMIN),
            body.as_ref(),
        )
        .await;
        assert_eq!(status, 200, "{method} {path} with an admin token: {answer}");
    }
    assert!(
        std::fs::read_dir(&root).unwrap().next().is_none(),
        "nothing written"
    );
    let log = server.log_text();
    assert!(log.contains("admin_tokens=1"), "{log}");
    assert!(!log.contains(ADMIN), "the token is never logged: {log}");
}

#[test]
fn a_wrong_backup_root_or_loopback_administration_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let refused = |listen: &str, args: &[&str]| {
        launch(&data, listen, args, &[])
            .err()
            .expect("the start is refused")
    };
    let missing = dir.path().join("missing");
    let log = refused("127.0.0.1:0", &["--backup-root", missing.to_str().unwrap()]);
    assert!(
        log.contains(&format!("--backup-root {}", missing.display())) && log.contains("create"),
        "{log}"
    );
    let file = dir.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let log = refused("127.0.0.1:0", &["--backup-root", file.to_str().unwrap()]);
    assert!(log.contains("is not a directory"), "{log}");
    let log = refused("127.0.0.1:0", &["--backup-root", ""]);
    assert!(
        log.contains("a value is required for '--backup-root"),
        "{log}"
    );
    let tokens = both_tokens(dir.path());
    let log = refused(
        "127.0.0.1:0",
        &[
            "--admin-on-loopback",
            "--tokens-file",
            tokens.to_str().unwrap(),
        ],
    );
    assert!(
        log.contains("--admin-on-loopback") && log.contains("admin <token>"),
        "{log}"
    );
    let log = refused(
        "0.0.0.0:0",
        &["--admin-on-loopback", "--allow-unauthenticated"],
    );
    assert!(
        log.contains("--admin-on-loopback") && log.contains("not a loopback address"),
        "{log}"
    );
    assert!(
        !data.exists(),
        "refused before the data directory is touched"
    );
    // Inside the data directory: the directory exists, so the refusal comes after it is named.
    std::fs::create_dir_all(data.join("inside")).unwrap();
    let inside = data.join("inside");
    let log = refused("127.0.0.1:0", &["--backup-root", inside.to_str().unwrap()]);
    assert!(log.contains("lies inside the data directory"), "{log}");
}
