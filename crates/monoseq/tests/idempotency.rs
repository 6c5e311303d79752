//! Safe retries over HTTP (invariant 12 of docs/invariants.md) against the real binary: a client
//! whose request timed out while the server was stopped (SIGSTOP) retries with the same
//! `Idempotency-Key`, and clients whose server was killed (SIGKILL) under load, some between
//! writing an event and answering it, retry after the restart (half of them sent their keyed
//! commands in batches, each retried alone). Every key ends up in exactly one event, and a
//! retry of an answered command gets the same answer again.

mod common;

use std::collections::HashMap;
use std::process::Command as Process;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Server;
use serde_json::{Value, json};

const WORKSPACES: u64 = 6;

fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "retry.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "retry.Doc", "fields": {"n": n}}],
    })
}

fn signal(server: &Server, sig: &str) {
    let pid = server.child.id().to_string();
    assert!(
        Process::new("kill")
            .args([sig, &pid])
            .status()
            .expect("kill")
            .success()
    );
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> Result<(u16, bool, Value), reqwest::Error> {
    let r = client
        .post(format!("{url}/v1/commands"))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await?;
    let replayed = r.headers().get("idempotency-replayed").is_some();
    let status = r.status().as_u16();
    Ok((status, replayed, r.json().await?))
}

/// Sends until an answer other than 503 comes (the server may still be starting).
async fn send_until_answered(
    client: &reqwest::Client,
    url: &str,
    key: &str,
    body: &Value,
) -> (u16, bool, Value) {
    for _ in 0..400 {
        if let Ok((status, replayed, v)) = send(client, url, key, body).await
            && status != 503
        {
            return (status, replayed, v);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("key {key} never got an answer");
}

/// How many events of workspaces 1..=WORKSPACES carry each idempotency key.
async fn events_per_key(client: &reqwest::Client, url: &str) -> HashMap<String, usize> {
    let mut count = HashMap::new();
    for ws in 1..=WORKSPACES {
        let r: Value = client
            .get(format!("{url}/v1/workspaces/{ws}/wlog?from=1&limit=1000"))
            .send()
            .await
            .expect("read WLog")
            .json()
            .await
            .expect("json");
        for e in r["events"].as_array().expect("events") {
            if let Some(k) = e["idempotency_key"].as_str() {
                *count.entry(k.to_owned()).or_insert(0) += 1;
            }
        }
    }
    count
}

fn quick_client(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .expect("client")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_the_server_was_stopped_past_the_client_timeout_applies_once() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let client = quick_client(Duration::from_secs(5));
    let server = Server::start_ready(dir.path(), &[], &client).await;
    let impatient = quick_client(Duration::from_millis(300));
    for n in 0..4u64 {
        let key = format!("stopped-{n}");
        let body = command(1, n);
        signal(&server, "-STOP");
        let first = send(&impatient, &server.url, &key, &body).await;
        assert!(first.is_err(), "the stopped server cannot answer in time");
        tokio::time::sleep(Duration::from_millis(200)).await;
        signal(&server, "-CONT");
        let (status, _, answer) = send_until_answered(&client, &server.url, &key, &body).await;
        assert_eq!(status, 200, "{answer}");
        let (status, replayed, again) =
            send_until_answered(&client, &server.url, &key, &body).await;
        assert_eq!((status, replayed), (200, true));
        assert_eq!(again, answer, "a retry gets the original answer");
    }
    let count = events_per_key(&client, &server.url).await;
    for n in 0..4 {
        assert_eq!(count.get(&format!("stopped-{n}")), Some(&1), "{count:?}");
    }
    let (status, _, v) =
        send_until_answered(&client, &server.url, "stopped-0", &command(1, 9)).await;
    assert_eq!(
        (status, v["code"].as_str()),
        (422, Some("idempotency_key_reused"))
    );
    // A key is scoped to its workspace: in another workspace it is a new command.
    let (status, replayed, _) =
        send_until_answered(&client, &server.url, "stopped-0", &command(2, 0)).await;
    assert_eq!((status, replayed), (200, false));
    let r = client
        .post(format!("{}/v1/commands", server.url))
        .header("Idempotency-Key", "")
        .json(&command(1, 1))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 400);
}

/// What one client did: keys sent, with the answer where one came.
type Sent = Arc<Mutex<Vec<(String, Value, Option<Value>)>>>;

async fn client_load(url: String, sent: Sent, client_no: u64, round: u64) {
    if client_no % 2 == 1 {
        return batch_load(url, sent, client_no, round).await;
    }
    let client = quick_client(Duration::from_secs(3));
    for n in 0.. {
        let key = format!("r{round}-c{client_no}-{n}");
        let body = command(n % WORKSPACES + 1, n);
        match send(&client, &url, &key, &body).await {
            Ok((200, _, v)) => sent.lock().unwrap().push((key, body, Some(v))),
            Ok(_) => sent.lock().unwrap().push((key, body, None)),
            Err(_) => {
                sent.lock().unwrap().push((key, body, None));
                return; // the server is gone
            }
        }
    }
}

/// [`client_load`] with its keyed commands sent 4 to a batch (the key in each command of the
/// body): each command's result is its own answer, or none.
async fn batch_load(url: String, sent: Sent, client_no: u64, round: u64) {
    let client = quick_client(Duration::from_secs(3));
    for first in (0..).step_by(4) {
        let commands: Vec<(String, Value)> = (first..first + 4)
            .map(|n| {
                let key = format!("r{round}-b{client_no}-{n}");
                (key, command(n % WORKSPACES + 1, n))
            })
            .collect();
        let batch = commands
            .iter()
            .map(|(key, body)| (key.as_str(), body.clone()));
        let answered = common::keyed::post_keyed_batch(&client, &url, batch).await;
        let mut sent = sent.lock().unwrap();
        let Ok((_, answer)) = answered else {
            sent.extend(commands.into_iter().map(|(key, body)| (key, body, None)));
            return; // the server is gone
        };
        let results = answer["results"].as_array().cloned().unwrap_or_default();
        for (i, (key, body)) in commands.into_iter().enumerate() {
            let outcome = results
                .get(i)
                .filter(|r| r["status"] == 200)
                .map(|r| r["outcome"].clone());
            sent.push((key, body, outcome));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_after_a_crash_between_write_and_answer_apply_once() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let client = quick_client(Duration::from_secs(5));
    let sent: Sent = Arc::default();
    for round in 0..3u64 {
        let server = Server::start_ready(dir.path(), &[], &client).await;
        let load: Vec<_> = (0..8)
            .map(|c| tokio::spawn(client_load(server.url.clone(), Arc::clone(&sent), c, round)))
            .collect();
        tokio::time::sleep(Duration::from_millis(300 + 150 * round)).await;
        server.kill();
        for l in load {
            l.await.expect("client");
        }
    }
    let server = Server::start_ready(dir.path(), &[], &client).await;
    let sent = sent.lock().unwrap().clone();
    let unanswered = sent.iter().filter(|s| s.2.is_none()).count();
    assert!(unanswered > 0, "the crashes cut some commands off");
    let batched = sent
        .iter()
        .filter(|s| s.0.contains("-b") && s.2.is_some())
        .count();
    assert!(batched > 0, "commands sent in batches were answered");
    for (key, body, answer) in &sent {
        let (status, replayed, again) = send_until_answered(&client, &server.url, key, body).await;
        assert_eq!(status, 200, "{key}: {again}");
        if let Some(answer) = answer {
            assert!(replayed, "{key}: an answered command is replayed");
            assert_eq!(&again, answer, "{key}: a retry gets the original answer");
        }
    }
    let count = events_per_key(&client, &server.url).await;
    for (key, _, _) in &sent {
        assert_eq!(count.get(key), Some(&1), "{key} has one event");
    }
}
