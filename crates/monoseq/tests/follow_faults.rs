//! Followers through faults on real nodes and a real PostgreSQL: while keyed load runs on a
//! cluster of two nodes, one follower per partition follows it through the nodes (each resuming
//! from the last offset it saw on whichever node answers); one node is SIGKILLed mid-load.
//! Every acknowledged event reaches its partition's follower exactly once, in PLog order, and
//! nothing else does (invariant 15 of docs/invariants.md). Beside them, one consumer per
//! partition reads pages through the nodes and stores its position with compare-and-set after
//! each: its position never goes back, and ends past every acknowledged event (invariant 17).

mod common;
mod faults;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::sse::Sse;
use faults::keyed::{self, Load, PARTITIONS};
use faults::node::Node;

/// Longest the followers may take to receive every acknowledged event after the load stops.
const CATCH_UP_BOUND: Duration = Duration::from_secs(60);
/// Longest a follower waits for a message before it reconnects (heartbeats come every 5 s).
const SILENCE: Duration = Duration::from_secs(8);

/// What one follower received: the ids in arrival order, and anything out of order.
#[derive(Debug, Default)]
struct Received {
    ids: Vec<u64>,
    wrong: Vec<String>,
}

/// Follows partition `p` through the nodes of `urls` in turn until `done`, resuming after the
/// last id received.
async fn follow(p: u64, urls: keyed::Urls, done: Arc<AtomicBool>, got: Arc<Mutex<Received>>) {
    let client = keyed::client(Duration::from_secs(3600));
    let mut turn = p as usize;
    while !done.load(Ordering::SeqCst) {
        turn += 1;
        let url = {
            let urls = urls.lock().unwrap();
            urls[turn % urls.len()].clone()
        };
        let last = got.lock().unwrap().ids.last().copied();
        let stream = format!("{url}/v1/partitions/{p}/events/stream?from=1");
        let Some(mut tail) = Sse::try_open(&client, &stream, last).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        while !done.load(Ordering::SeqCst) {
            let Some(m) = tail.next(SILENCE).await else {
                break;
            };
            if m.event != "event" {
                continue;
            }
            let id = m.id.expect("an event has an id");
            let mut got = got.lock().unwrap();
            let expected = got.ids.last().map_or(1, |l| l + 1);
            if id != expected || m.data["plog_offset"] != id {
                got.wrong
                    .push(format!("expected {expected}, got {id} via {url}"));
            }
            got.ids.push(id);
        }
    }
}

/// What one consumer did: the positions it stored, in order, and anything wrong.
#[derive(Debug, Default)]
struct Consumed {
    stored: Vec<u64>,
    wrong: Vec<String>,
}

/// Consumes partition `p` through the nodes of `urls` in turn until `done`: reads its stored
/// position, the page after it, checks the page starts there and is contiguous, and stores the
/// new position expecting the one it read.
async fn consume(p: u64, urls: keyed::Urls, done: Arc<AtomicBool>, got: Arc<Mutex<Consumed>>) {
    let client = keyed::client(Duration::from_secs(5));
    let mut turn = p as usize;
    while !done.load(Ordering::SeqCst) {
        turn += 1;
        let url = {
            let urls = urls.lock().unwrap();
            urls[turn % urls.len()].clone()
        };
        let position = format!("{url}/v1/consumers/projector/partitions/{p}");
        let stored = match client.get(&position).send().await {
            Ok(r) if r.status() == 200 => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["offset"].as_u64()),
            Ok(r) if r.status() == 404 => None,
            _ => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let from = stored.unwrap_or(0) + 1;
        let page = format!("{url}/v1/partitions/{p}/events?from={from}&limit=50&wait_ms=500");
        let Ok(answer) = client.get(&page).send().await else {
            continue;
        };
        if answer.status() != 200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let Ok(page) = answer.json::<serde_json::Value>().await else {
            continue;
        };
        let events = page["events"].as_array().cloned().unwrap_or_default();
        for (i, e) in events.iter().enumerate() {
            if e["plog_offset"].as_u64() != Some(from + i as u64) {
                got.lock()
                    .unwrap()
                    .wrong
                    .push(format!("page from {from} via {url}: {e}"));
            }
        }
        let Some(last) = events.last().and_then(|e| e["plog_offset"].as_u64()) else {
            continue;
        };
        let mut body = serde_json::json!({"offset": last});
        if let Some(stored) = stored {
            body["expected"] = stored.into();
        }
        if let Ok(r) = client.put(&position).json(&body).send().await
            && r.status() == 200
        {
            let mut got = got.lock().unwrap();
            let previous = got.stored.last().copied();
            if previous.is_some_and(|l| l > last) {
                got.wrong
                    .push(format!("position went back to {last} after {previous:?}"));
            }
            got.stored.push(last);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_and_consumers_through_a_sigkilled_node_get_every_acknowledged_event_once_in_order() {
    let db = common::Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let n1 = Node::start(None, &db, "n1", "127.0.0.1:0", dir.path());
    let n2 = Node::start(None, &db, "n2", "127.0.0.1:0", dir.path());
    let client = keyed::client(Duration::from_secs(10));
    keyed::balanced(&client, &n1.url, &["n1", "n2"]).await;
    let urls = keyed::urls(&[&n1.url, &n2.url]);
    let done = Arc::new(AtomicBool::new(false));
    let followers: Vec<_> = (0..PARTITIONS)
        .map(|p| {
            let got = Arc::new(Mutex::new(Received::default()));
            let task = tokio::spawn(follow(
                p,
                Arc::clone(&urls),
                Arc::clone(&done),
                Arc::clone(&got),
            ));
            (got, task)
        })
        .collect();
    let consumers: Vec<_> = (0..PARTITIONS)
        .map(|p| {
            let got = Arc::new(Mutex::new(Consumed::default()));
            let task = tokio::spawn(consume(
                p,
                Arc::clone(&urls),
                Arc::clone(&done),
                Arc::clone(&got),
            ));
            (got, task)
        })
        .collect();
    let load = Load::start(&urls, 4, "follow");
    assert!(load.progress(150, Duration::from_secs(60)).await.is_some());
    // A crash of one node mid-load: its partitions move to the other after their lease.
    urls.lock().unwrap().retain(|u| *u != n1.url);
    drop(n1);
    assert!(
        load.progress(150, Duration::from_secs(90)).await.is_some(),
        "the surviving node never took the load over"
    );
    let (acks, _) = load.stop().await;
    let mut acked: HashMap<u64, Vec<u64>> = HashMap::new();
    for a in &acks {
        acked.entry(a.partition).or_default().push(a.plog);
    }
    let deadline = Instant::now() + CATCH_UP_BOUND;
    loop {
        let behind: Vec<u64> = (0..PARTITIONS)
            .filter(|p| {
                let top = acked
                    .get(p)
                    .and_then(|v| v.iter().max())
                    .copied()
                    .unwrap_or(0);
                followers[*p as usize]
                    .0
                    .lock()
                    .unwrap()
                    .ids
                    .last()
                    .copied()
                    .unwrap_or(0)
                    < top
            })
            .collect();
        if behind.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "followers of {behind:?} never caught up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    done.store(true, Ordering::SeqCst);
    for (p, (got, task)) in followers.into_iter().enumerate() {
        task.abort();
        let got = got.lock().unwrap();
        assert!(got.wrong.is_empty(), "partition {p}: {:?}", got.wrong);
        let ids = &got.ids;
        assert_eq!(
            *ids,
            (1..=ids.len() as u64).collect::<Vec<_>>(),
            "partition {p}: every event once, in order"
        );
        for plog in acked
            .get(&(p as u64))
            .map(Vec::as_slice)
            .unwrap_or_default()
        {
            assert!(
                ids.contains(plog),
                "partition {p}: acknowledged {plog} never delivered"
            );
        }
    }
    for (p, (got, task)) in consumers.into_iter().enumerate() {
        task.abort();
        let got = got.lock().unwrap();
        assert!(
            got.wrong.is_empty(),
            "consumer of partition {p}: {:?}",
            got.wrong
        );
    }
    drop(n2);
}
