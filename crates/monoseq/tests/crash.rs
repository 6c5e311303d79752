//! Crash test: the server runs as a child process under concurrent load, one command per
//! request and batches (`POST /v1/commands/batch`, whose shares of a partition go in one group
//! commit), and is killed with SIGKILL at random moments, many times, restarting each time.
//! Afterwards `verify` passes, every PLog offset is contiguous, every acknowledged event is
//! stored as acknowledged and is in its workspace's WLog, and no offset or record ID
//! acknowledged to a client was ever handed out twice.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::keyed::{self, Ack, assert_once, assert_read_back};
use common::{Backend, Server};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

const ROUNDS: usize = 10;
const CLIENTS: usize = 12;
const WORKSPACES: u64 = 30;
const PARTITIONS: &str = "3";
/// Every `BATCH_EVERY`th client sends batches of `BATCH_COMMANDS` commands instead of one
/// command per request: with 3 partitions, most batches give a partition several commands.
const BATCH_EVERY: u64 = 3;
const BATCH_COMMANDS: u64 = 8;

/// Every acknowledged event is in its workspace's WLog at its WLog offset, read back through
/// the WLog (whose entries name the PLog events), and each workspace's WLog has no gap.
async fn assert_wlogs_name_the_acknowledged_events(
    probe: &reqwest::Client,
    url: &str,
    acks: &[Ack],
) {
    let mut by_ws: HashMap<u64, Vec<&Ack>> = HashMap::new();
    for a in acks {
        by_ws.entry(a.ws).or_default().push(a);
    }
    for (ws, acked) in by_ws {
        let mut events: Vec<Value> = Vec::new();
        loop {
            let from = events.len() + 1;
            let r = probe
                .get(format!(
                    "{url}/v1/workspaces/{ws}/wlog?from={from}&limit=1000"
                ))
                .send()
                .await
                .unwrap();
            let status = r.status();
            let page: Value = r.json().await.unwrap();
            assert_eq!(status, 200, "workspace {ws}'s WLog from {from}: {page}");
            let page = page["events"].as_array().expect("a WLog page").clone();
            let last = page.len() < 1000;
            events.extend(page);
            if last {
                break;
            }
        }
        for (i, e) in events.iter().enumerate() {
            assert_eq!(e["wlog_offset"], i as u64 + 1, "workspace {ws}'s WLog: {e}");
        }
        for a in acked {
            let e = usize::try_from(a.wlog - 1).ok().and_then(|i| events.get(i));
            let e = e.unwrap_or_else(|| panic!("{a:?} is missing from its WLog"));
            assert_eq!(
                (&e["plog_offset"], &e["ws"]),
                (&json!(a.plog), &json!(a.ws)),
                "{a:?}: {e}"
            );
            assert_eq!(e["created"][0]["id"], a.ids[0], "{a:?}: {e}");
        }
    }
}

fn command(ws: u64, n: u64) -> Value {
    json!({
        "ws": ws, "ws_kind": 1, "command": "crash.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "crash.Doc", "fields": {"n": n}},
                   {"raw_id": 2, "kind": "WRecord", "name": "crash.Row"}],
        "argument": {"raw_id": 3, "name": "crash.Arg", "fields": {"doc": {"$raw": 1}}}
    })
}

/// Sends one client's commands until the server is gone, recording each acknowledgement: one
/// command per request, or batches for every [`BATCH_EVERY`]th client.
async fn load(url: String, acks: Arc<Mutex<Vec<Ack>>>, batched: Arc<AtomicUsize>, client_no: u64) {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    if client_no.is_multiple_of(BATCH_EVERY) {
        load_batches((client, url), acks, batched, client_no).await;
    } else {
        load_commands((client, url), acks, client_no).await;
    }
}

async fn load_commands(
    (client, url): (reqwest::Client, String),
    acks: Arc<Mutex<Vec<Ack>>>,
    client_no: u64,
) {
    let mut n = client_no;
    loop {
        let ws = n % WORKSPACES + 1;
        n += CLIENTS as u64;
        let sent = std::time::Instant::now();
        let body = match post(&client, &format!("{url}/v1/commands"), &command(ws, n)).await {
            Posted::Answered(body) => body,
            Posted::Unavailable => continue,
            Posted::Gone => return,
        };
        acks.lock().unwrap().push(Ack::of("", ws, &body, sent));
    }
}

/// What a POST came to while the server may be killed at any moment.
enum Posted {
    /// 200, with its body (any other answer fails the test).
    Answered(Value),
    /// 503 (a partition starting): try again.
    Unavailable,
    /// No answer: the server is gone.
    Gone,
}

async fn post(client: &reqwest::Client, url: &str, body: &Value) -> Posted {
    let Ok(r) = client.post(url).json(body).send().await else {
        return Posted::Gone;
    };
    if r.status() == 503 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        return Posted::Unavailable;
    }
    let status = r.status();
    let Ok(body) = r.json::<Value>().await else {
        return Posted::Gone;
    };
    assert_eq!(status, 200, "{body}");
    Posted::Answered(body)
}

/// Batches of [`BATCH_COMMANDS`] commands over as many workspaces; each command's result is its
/// own: acknowledged (200), or refused for now (503 while a partition starts, 429 when busy).
async fn load_batches(
    (client, url): (reqwest::Client, String),
    acks: Arc<Mutex<Vec<Ack>>>,
    batched: Arc<AtomicUsize>,
    client_no: u64,
) {
    let mut n = client_no;
    loop {
        let mut sent_ws = Vec::new();
        let mut commands = Vec::new();
        for _ in 0..BATCH_COMMANDS {
            let ws = n % WORKSPACES + 1;
            n += CLIENTS as u64;
            sent_ws.push(ws);
            commands.push(command(ws, n));
        }
        let sent = std::time::Instant::now();
        let batch = json!({ "commands": commands });
        let body = match post(&client, &format!("{url}/v1/commands/batch"), &batch).await {
            Posted::Answered(body) => body,
            Posted::Unavailable => continue,
            Posted::Gone => return,
        };
        let results = body["results"].as_array().expect("a result per command");
        assert_eq!(results.len(), sent_ws.len(), "{body}");
        for (ws, result) in sent_ws.into_iter().zip(results) {
            match result["status"].as_u64() {
                Some(200) => {
                    let ack = Ack::of("", ws, &result["outcome"], sent);
                    acks.lock().unwrap().push(ack);
                    batched.fetch_add(1, Ordering::Relaxed);
                }
                Some(429 | 503) => {}
                _ => panic!("a batch's command got a wrong answer: {result}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_no_acknowledged_event_and_reuses_no_number() {
    crash_rounds(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_sigkill_at_random_moments_loses_no_acknowledged_event_and_reuses_no_number() {
    crash_rounds(Backend::postgres()).await;
}

async fn crash_rounds(backend: Backend) {
    let mut args: Vec<String> = vec!["--partitions".into(), PARTITIONS.into()];
    args.extend(backend.args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let seed: u64 = std::env::var("MONOSEQ_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xC0FFEE);
    eprintln!("crash test seed {seed} (MONOSEQ_CRASH_SEED replays it)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let acks: Arc<Mutex<Vec<Ack>>> = Arc::default();
    let batched: Arc<AtomicUsize> = Arc::default();
    let probe = reqwest::Client::new();
    for round in 0..ROUNDS {
        let server = Server::start_ready(dir.path(), &args, &probe).await;
        let clients: Vec<_> = (0..CLIENTS as u64)
            .map(|c| {
                tokio::spawn(load(
                    server.url.clone(),
                    Arc::clone(&acks),
                    Arc::clone(&batched),
                    c + round as u64,
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..900))).await;
        server.kill();
        for c in clients {
            c.await.expect("a client saw a wrong answer");
        }
    }
    let acks = acks.lock().unwrap().clone();
    let batched = batched.load(Ordering::Relaxed);
    assert!(acks.len() > 30, "too little load: {} acks", acks.len());
    assert!(batched > 30, "too few batched commands: {batched} acks");
    eprintln!(
        "{ROUNDS} crashes, {} acknowledged commands ({batched} of them in batches)",
        acks.len()
    );

    // No offset or number acknowledged twice.
    assert_once(&acks);

    // Every acknowledged event is stored as acknowledged; PLogs are contiguous.
    let server = Server::start_ready(dir.path(), &args, &probe).await;
    let reader = keyed::rust_client(&[&server.url], Duration::from_secs(20));
    assert_read_back(&reader, &acks).await;
    let mut ends: HashMap<u64, u64> = HashMap::new();
    for a in &acks {
        let end = ends.entry(a.partition).or_default();
        *end = (*end).max(a.plog);
    }
    assert_wlogs_name_the_acknowledged_events(&probe, &server.url, &acks).await;
    for (p, end) in ends {
        for offset in 1..=end {
            let r = probe
                .get(format!("{}/v1/partitions/{p}/events/{offset}", server.url))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "partition {p} has a gap at {offset}");
        }
    }
    server.terminate(Duration::from_secs(15));
    let verify = backend.verify(dir.path());
    assert!(
        verify.status.success(),
        "verify failed:\n{}\n{}",
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
}
