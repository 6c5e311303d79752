//! The OpenAPI document (`docs/openapi.json`) against the real server: it is what
//! `GET /v1/openapi.json` serves, every operation it lists answers as it says (the answers of
//! this test, like those of every end-to-end test, are checked when the server is dropped),
//! and a deliberately wrong document is caught by the same check.

mod common;

use common::Server;
use common::openapi::{Answer, Contract, contract};
use serde_json::{Value, json};

/// Requests that reach every documented operation, with answers good and bad.
async fn exercise(client: &reqwest::Client, url: &str) {
    let command = json!({"ws": 6, "ws_kind": 1, "command": "app.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order", "fields": {"total": 1}}],
        "argument": {"raw_id": 2, "name": "app.Arg", "fields": {"order": {"$raw": 1}},
                     "children": [{"raw_id": 3, "name": "app.Line"}]}});
    let post = |body: Value, key: Option<&str>| {
        let mut r = client.post(format!("{url}/v1/commands")).json(&body);
        if let Some(key) = key {
            r = r.header("idempotency-key", key);
        }
        r.send()
    };
    let out: Value = post(command.clone(), Some("k-1"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = out["ids"]["1"].as_u64().unwrap();
    let replay = post(command.clone(), Some("k-1")).await.unwrap();
    assert_eq!(replay.headers()["idempotency-replayed"], "true");
    let long_key = "k".repeat(300);
    for (body, key) in [
        (
            json!({"ws": 6, "ws_kind": 1, "command": "app.Pay", "update": [{"id": id, "fields": {"paid": true}}]}),
            None,
        ),
        (
            json!({"ws": 6, "ws_kind": 1, "command": "c", "update": [{"id": 5, "fields": {}}]}),
            None,
        ),
        (json!({"ws": 6, "ws_kind": 9, "command": "c"}), None),
        (
            json!({"ws": 6, "ws_kind": 1, "command": "c", "bogus": 1}),
            None,
        ),
        (
            json!({"ws": 6, "ws_kind": 1, "command": "other"}),
            Some("k-1"),
        ),
        (command.clone(), Some(&long_key)),
        (
            json!({"ws": 6, "ws_kind": 1, "command": "c", "expected_wlog_offset": 0}),
            None,
        ),
        (
            json!({"ws": 6, "ws_kind": 1, "command": "c", "expected_wlog_offset": -1}),
            None,
        ),
    ] {
        post(body, key).await.unwrap();
    }
    client
        .post(format!("{url}/v1/commands"))
        .body("{")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    client
        .post(format!("{url}/v1/commands"))
        .body("{}")
        .send()
        .await
        .unwrap();
    // The server answers 413 before reading the rest of an oversized body and closes the
    // connection; a client of its own keeps that closed connection out of the shared pool (the
    // answer is checked against the document with all the others, from the server's log).
    let big = json!({"ws": 6, "ws_kind": 1, "command": "x".repeat(2 << 20)});
    let _ = reqwest::Client::new()
        .post(format!("{url}/v1/commands"))
        .json(&big)
        .send()
        .await;
    for path in [
        "/v1/partitions/2/events/1".to_owned(),
        "/v1/partitions/2/events/99".into(),
        "/v1/partitions/99/events/1".into(),
        "/v1/partitions/x/events/1".into(),
        "/v1/workspaces/6/wlog?from=1&limit=10".into(),
        "/v1/workspaces/6/wlog".into(),
        "/v1/workspaces/6/wlog?from=0".into(),
        "/v1/workspaces/6/wlog?limit=5000".into(),
        format!("/v1/workspaces/6/records/{id}"),
        "/v1/workspaces/6/records/7".into(),
        "/v1/workspaces/6/records/-1".into(),
        "/v1/info".into(),
        "/v1/cluster".into(),
        "/v1/marks".into(),
        "/v1/openapi.json".into(),
        "/healthz".into(),
        "/readyz".into(),
        "/metrics".into(),
        "/v1/nothing".into(),
        "/v1/sequences/orders/invoice/value".into(),
        "/v1/sequences/orders/invoice/data".into(),
        "/v1/sequences/orders/invoice/exists".into(),
        "/v1/sequences/orders/invoice/frobnicate".into(),
        "/v1/partitions/2/events?from=end".into(),
        "/v1/partitions/2/events?limt=1".into(),
        "/v1/workspaces/6/wlog?from=1&wait_ms=10".into(),
        "/v1/info?verbose=1".into(),
        "/v1/consumers?after=a".into(),
        "/v1/consumers?after=".into(),
    ] {
        client.get(format!("{url}{path}")).send().await.unwrap();
    }
    // Consumers: set, refused beyond the end, listed, deleted (and deleted again: 404).
    let position = format!("{url}/v1/consumers/c/partitions/2");
    for body in [json!({"offset": 1}), json!({"offset": 99, "expected": 1})] {
        client.put(&position).json(&body).send().await.unwrap();
    }
    client
        .get(format!("{url}/v1/consumers"))
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        client
            .delete(format!("{url}/v1/consumers/c"))
            .send()
            .await
            .unwrap();
    }
    let seq = |op: &str| format!("{url}/v1/sequences/orders/invoice/{op}");
    for (op, body) in [
        ("next", json!({"initial": 1000})),
        ("next", json!({"increment": 10, "metadata": {"team": "a"}})),
        ("increment", json!({})),
        ("next", json!({"increment": 0})),
        ("next", json!({"initial": "x"})),
        ("reset", json!({"value": 5})),
        ("set", json!({"value": 18446744073709551615u64})),
        ("next", json!({})),
        ("reset", json!({})),
    ] {
        client.post(seq(op)).json(&body).send().await.unwrap();
    }
    for op in ["value", "data", "exists"] {
        client.get(seq(op)).send().await.unwrap();
    }
    client
        .delete(format!("{url}/v1/sequences/orders/invoice"))
        .send()
        .await
        .unwrap();
    client.get(seq("data")).send().await.unwrap();
    client
        .delete(format!("{url}/v1/commands"))
        .send()
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_as_the_document_says_and_the_document_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let client = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &client).await;
    let served: Value = client
        .get(format!("{}/v1/openapi.json", server.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kept: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    assert_eq!(served, kept, "the served document is the repository's");
    assert_eq!(kept["openapi"], "3.1.0");
    exercise(&client, &server.url).await;
    // Dropping the server checks every answer above against the document.
}

#[test]
fn every_operation_documents_its_errors_and_the_token_answers() {
    let doc: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    for (path, operations) in doc["paths"].as_object().unwrap() {
        for (method, op) in operations.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            // An operation answered without a token (`"security": []`: the console's assets)
            // refuses none.
            let open = op["security"].as_array().is_some_and(Vec::is_empty);
            for status in ["401", "403"].into_iter().filter(|_| !open) {
                assert!(
                    responses.contains_key(status),
                    "{method} {path} lacks {status}"
                );
            }
            assert!(
                op["operationId"].is_string(),
                "{method} {path} has no operationId"
            );
            assert!(
                responses.contains_key("400"),
                "{method} {path} lacks 400 (an unknown query parameter is refused everywhere)"
            );
            if let Some(unavailable) = responses.get("503") {
                assert!(
                    !unavailable["headers"]["Retry-After"].is_null(),
                    "{method} {path}: a 503 without Retry-After"
                );
            }
        }
    }
}

/// The codes an error answer may carry are the wire crate's `ErrorCode::ALL`, in its order:
/// a code added to the server without the document (or the reverse) fails here.
#[test]
fn the_document_lists_exactly_the_error_codes_the_server_can_answer() {
    let doc: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    let listed: Vec<&str> = doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"]
        .as_array()
        .expect("Error.code lists its codes")
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    let codes: Vec<&str> = monoseq_client::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(listed, codes);
}

/// Codes a server answers that no documented operation lists: `slow_follower` is the last
/// message of a stream (its own schema lists it), and `unknown_operation` answers a named
/// sequence's path that names no operation, which the document does not list as a path.
const CODES_OUTSIDE_OPERATIONS: [&str; 2] = ["slow_follower", "unknown_operation"];

/// The codes an error answer may carry, found anywhere in `schema` (an `enum` or `const` of a
/// `code` property), following references to other schemas but not to `Error` itself.
fn codes_in(doc: &Value, schema: &Value, out: &mut std::collections::BTreeSet<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(code) = map.get("properties").and_then(|p| p.get("code")) {
                let listed = code["enum"].as_array().cloned().unwrap_or_default();
                for c in listed.iter().chain(code.get("const")) {
                    out.insert(c.as_str().expect("a code is a string").to_owned());
                }
            }
            if let Some(target) = map.get("$ref").and_then(Value::as_str) {
                let name = target.rsplit('/').next().unwrap();
                if name != "Error" {
                    let kind = if target.contains("/responses/") {
                        "responses"
                    } else {
                        "schemas"
                    };
                    codes_in(doc, &doc["components"][kind][name], out);
                }
            }
            for (key, value) in map {
                if key != "properties" {
                    codes_in(doc, value, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| codes_in(doc, v, out)),
        _ => {}
    }
}

/// Every error answer of every operation says which codes it can carry; each is a code of
/// `ErrorCode::ALL`, and every code of `ErrorCode::ALL` is listed by some operation (except
/// [`CODES_OUTSIDE_OPERATIONS`]): a code the server can no longer answer, or an operation's list
/// naming a code that does not exist, fails here. Schemathesis' response check then holds each
/// real answer to its operation's list.
#[test]
fn every_operation_lists_the_codes_it_answers_and_every_code_is_answered_somewhere() {
    let doc: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    let known: std::collections::BTreeSet<String> = monoseq_client::ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    let mut answered = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let Some(responses) = op.get("responses").and_then(Value::as_object) else {
                continue;
            };
            for (status, response) in responses {
                if !status.starts_with('4') && !status.starts_with('5') {
                    continue;
                }
                let mut codes = std::collections::BTreeSet::new();
                codes_in(&doc, response, &mut codes);
                assert!(
                    !codes.is_empty(),
                    "{method} {path} {status} lists no code it can answer"
                );
                let unknown: Vec<_> = codes.difference(&known).collect();
                assert!(
                    unknown.is_empty(),
                    "{method} {path} {status} lists codes no server answers: {unknown:?}"
                );
                answered.extend(codes);
            }
        }
    }
    let unlisted: Vec<&String> = known
        .difference(&answered)
        .filter(|c| !CODES_OUTSIDE_OPERATIONS.contains(&c.as_str()))
        .collect();
    assert!(
        unlisted.is_empty(),
        "codes no operation lists (list them where they are answered, or remove them): {unlisted:?}"
    );
}

#[test]
fn a_deliberately_wrong_document_is_caught() {
    let answer = Answer {
        method: "POST".into(),
        path: "/v1/commands".into(),
        status: 200,
        headers: [("content-type".to_owned(), "application/json".to_owned())].into(),
        body: r#"{"partition":2,"plog_offset":1,"wlog_offset":1,"ids":{"1":322685000131072}}"#
            .into(),
    };
    assert_eq!(contract().check(&answer), Ok(()));
    // The document says offsets are strings: the real answer breaks it.
    let mut wrong: Value = serde_json::from_str(common::openapi::DOCUMENT).unwrap();
    wrong["components"]["schemas"]["Outcome"]["properties"]["plog_offset"] =
        json!({"type": "string"});
    let e = Contract::new(wrong).check(&answer).unwrap_err();
    assert!(e.contains("plog_offset") || e.contains("string"), "{e}");
    // A status the document does not list, and a 503 without its Retry-After, are caught too.
    let teapot = Answer {
        status: 418,
        ..answer.clone()
    };
    assert!(
        contract()
            .check(&teapot)
            .unwrap_err()
            .contains("not documented")
    );
    let busy = Answer {
        status: 503,
        body: r#"{"code":"busy","message":"m"}"#.into(),
        ..answer
    };
    assert!(contract().check(&busy).unwrap_err().contains("Retry-After"));
}
