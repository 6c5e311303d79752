//! Appends on an expected WLog offset against the real binary, over HTTP and through the Rust
//! client: a command (or a batch item) whose workspace's WLog does not end at its
//! `expected_wlog_offset` is refused `409 wlog_conflict` with `current_wlog_offset` and takes no
//! number; of concurrent commands on one expected offset exactly one succeeds; a retry with the
//! same `Idempotency-Key` gets its original answer; a malformed offset is a 400 naming the
//! field. (Every answer is also checked against docs/openapi.json when the server stops.)

mod common;

use common::Server;
use monoseq_client::{BatchCommandBody, Client, ClientError, CommandBody, KindBody, NewRecordBody};
use serde_json::{Value, json};

fn command(ws: u64, expected: Option<u64>) -> Value {
    let mut c = json!({"ws": ws, "ws_kind": 1, "command": "app.Append",
                       "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Doc"}]});
    if let Some(n) = expected {
        c["expected_wlog_offset"] = json!(n);
    }
    c
}

async fn post(http: &reqwest::Client, url: &str, body: &Value, key: Option<&str>) -> (u16, Value) {
    let mut r = http.post(format!("{url}/v1/commands")).json(body);
    if let Some(key) = key {
        r = r.header("idempotency-key", key);
    }
    let answer = r.send().await.unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

async fn post_raw(http: &reqwest::Client, url: &str, body: String) -> (u16, Value) {
    let answer = http
        .post(format!("{url}/v1/commands"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    (answer.status().as_u16(), answer.json().await.unwrap())
}

fn assert_conflict(status: u16, body: &Value, current: u64) {
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["code"], "wlog_conflict", "{body}");
    assert_eq!(body["current_wlog_offset"], current, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_is_refused_409_with_the_current_offset_and_takes_no_number() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &http).await;
    let url = &server.url;
    let (status, first) = post(&http, url, &command(7, None), None).await;
    assert_eq!(status, 200, "{first}");
    for expected in [0, 2, 9, u64::MAX] {
        let (status, body) = post(&http, url, &command(7, Some(expected)), None).await;
        assert_conflict(status, &body, 1);
        let message = body["message"].as_str().unwrap();
        assert!(
            message.contains("workspace 7 ends at offset 1"),
            "{message}"
        );
    }
    // The refusals took nothing: the next command gets PLog 2, WLog 2 and the next record ID.
    let (status, next) = post(&http, url, &command(7, Some(1)), None).await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(
        (next["plog_offset"].as_u64(), next["wlog_offset"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(
        next["ids"]["1"].as_u64().unwrap(),
        first["ids"]["1"].as_u64().unwrap() + 1
    );
    let none = http
        .get(format!("{url}/v1/partitions/0/events/3"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 404, "no event was written for a refusal");
    // 0: the workspace has no event yet.
    let (status, body) = post(&http, url, &command(11, Some(0)), None).await;
    assert_eq!(
        (status, body["wlog_offset"].as_u64()),
        (200, Some(1)),
        "{body}"
    );
    let (status, body) = post(&http, url, &command(11, Some(0)), None).await;
    assert_conflict(status, &body, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_sixteen_clients_on_the_same_expected_offset_exactly_one_succeeds() {
    const CLIENTS: usize = 16;
    const ROUNDS: u64 = 10;
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    for round in 0..ROUNDS {
        let attempts: Vec<_> = (0..CLIENTS)
            .map(|_| {
                let (http, url) = (http.clone(), server.url.clone());
                tokio::spawn(async move { post(&http, &url, &command(5, Some(round)), None).await })
            })
            .collect();
        let mut won = 0;
        for a in attempts {
            let (status, body) = a.await.unwrap();
            if status == 200 {
                won += 1;
                assert_eq!(body["wlog_offset"], round + 1, "{body}");
            } else {
                assert_conflict(status, &body, round + 1);
            }
        }
        assert_eq!(won, 1, "round {round}: {won} of {CLIENTS} succeeded");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_items_carry_their_own_condition_in_the_order_sent() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "4"], &http).await;
    let batch = json!({"commands": [
        command(3, Some(0)),
        command(3, Some(0)),
        command(4, Some(5)),
        command(3, Some(1)),
        command(3, None),
        {"ws": 4, "ws_kind": 1, "command": "c", "expected_wlog_offset": -1},
    ]});
    let answer = http
        .post(format!("{}/v1/commands/batch", server.url))
        .json(&batch)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    let answer: Value = answer.json().await.unwrap();
    let results = answer["results"].as_array().unwrap();
    let statuses: Vec<u64> = results
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [200, 409, 409, 200, 200, 400], "{answer}");
    assert_eq!(results[0]["outcome"]["wlog_offset"], 1);
    assert_eq!(results[1]["error"]["code"], "wlog_conflict");
    assert_eq!(
        results[1]["error"]["current_wlog_offset"], 1,
        "the first won"
    );
    assert_eq!(results[2]["error"]["current_wlog_offset"], 0);
    assert_eq!(results[3]["outcome"]["wlog_offset"], 2);
    assert_eq!(results[4]["outcome"]["wlog_offset"], 3);
    assert_eq!(
        results[3]["outcome"]["plog_offset"].as_u64().unwrap() + 1,
        results[4]["outcome"]["plog_offset"].as_u64().unwrap(),
        "the refusals between took no PLog offset"
    );
    assert_eq!(results[5]["error"]["code"], "invalid_command");
    let message = results[5]["error"]["message"].as_str().unwrap();
    assert!(message.contains("expected_wlog_offset"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_gets_its_original_answer() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &http).await;
    let url = &server.url;
    let (status, original) = post(&http, url, &command(9, Some(0)), Some("open-9")).await;
    assert_eq!(status, 200, "{original}");
    // The WLog has moved past 0 since, but the retry is answered from its event.
    let answer = http
        .post(format!("{url}/v1/commands"))
        .header("idempotency-key", "open-9")
        .json(&command(9, Some(0)))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    assert_eq!(answer.headers()["idempotency-replayed"], "true");
    assert_eq!(answer.json::<Value>().await.unwrap(), original);
    // The same key with another condition is another request.
    let (status, body) = post(&http, url, &command(9, Some(1)), Some("open-9")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    // A refusal is not remembered: its retry is decided on the WLog of its own time.
    let (status, body) = post(&http, url, &command(9, Some(0)), Some("late-9")).await;
    assert_conflict(status, &body, 1);
    post(&http, url, &command(9, None), None).await;
    let (status, body) = post(&http, url, &command(9, Some(0)), Some("late-9")).await;
    assert_conflict(status, &body, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_expected_offset_is_a_400_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "1"], &http).await;
    for bad in ["-1", "\"12\"", "18446744073709551616", "1.5", "true", "[1]"] {
        let body =
            format!(r#"{{"ws": 2, "ws_kind": 1, "command": "c", "expected_wlog_offset": {bad}}}"#);
        let (status, answer) = post_raw(&http, &server.url, body).await;
        assert_eq!(status, 400, "{bad}: {answer}");
        assert_eq!(answer["code"], "invalid_command", "{bad}: {answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains("expected_wlog_offset"), "{bad}: {message}");
    }
    // The largest offset is well-formed (and conflicts).
    let body = format!(
        r#"{{"ws": 2, "ws_kind": 1, "command": "c", "expected_wlog_offset": {}}}"#,
        u64::MAX
    );
    let (status, answer) = post_raw(&http, &server.url, body).await;
    assert_conflict(status, &answer, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_sends_the_condition_and_names_the_current_offset() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let server = Server::start_ready(dir.path(), &["--partitions", "2"], &http).await;
    let client = Client::new(&server.url).unwrap();
    let mut open = CommandBody::new(21, 1, "app.Open").with_expected_wlog_offset(0);
    open.create
        .push(NewRecordBody::new(1, KindBody::CDoc, "app.Doc"));
    let done = client.submit(&open).await.unwrap();
    assert_eq!((done.outcome.wlog_offset, done.attempts), (1, 1));
    let e = client.submit(&open).await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::WlogConflict {
                current_wlog_offset: 1,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        (e.code().as_str(), e.status(), e.current_wlog_offset()),
        ("wlog_conflict", Some(409), Some(1))
    );
    assert!(e.to_string().contains("ends at offset 1"), "{e}");
    let results = client
        .submit_batch(&[
            BatchCommandBody::new(open.clone().with_expected_wlog_offset(1), None),
            BatchCommandBody::new(open.clone().with_expected_wlog_offset(1), None),
        ])
        .await
        .unwrap();
    assert_eq!(results[0].as_ref().unwrap().outcome.wlog_offset, 2);
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(e.current_wlog_offset(), Some(2), "{e:?}");
}
