//! Readers of a cluster under faults: one follower per partition (an SSE tail through the
//! nodes in turn, resuming after the last id it saw) and one consumer per partition (pages
//! through the nodes, its position stored with compare-and-set after each), and the check that
//! every acknowledged event reached them once, in order, with positions never going back
//! (invariants 15 and 17 of docs/invariants.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::keyed::{self, Ack};
use crate::common::node::PARTITIONS;
use crate::common::sse::Sse;

/// Longest the followers may take to receive every acknowledged event after the load stops.
const CATCH_UP_BOUND: Duration = Duration::from_secs(60);
/// Longest a follower waits for a message before it reconnects (heartbeats come every 5 s).
const SILENCE: Duration = Duration::from_secs(8);

/// The node of `urls` whose turn it is (round robin over the nodes a client may use now).
fn at(urls: &keyed::Urls, turn: usize) -> String {
    let urls = urls.lock().unwrap();
    urls[turn % urls.len()].clone()
}

/// What one follower received: the ids in arrival order, and anything out of order.
#[derive(Debug, Default)]
pub struct Received {
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
        let url = at(&urls, turn);
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
pub struct Consumed {
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
        let url = at(&urls, turn);
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

/// The followers and consumers of every partition, running until checked.
pub struct Readers {
    done: Arc<AtomicBool>,
    followers: Vec<(Arc<Mutex<Received>>, tokio::task::JoinHandle<()>)>,
    consumers: Vec<(Arc<Mutex<Consumed>>, tokio::task::JoinHandle<()>)>,
}

impl Readers {
    /// A follower and a consumer of every partition, through the nodes of `urls`.
    pub fn start(urls: &keyed::Urls) -> Readers {
        let done = Arc::new(AtomicBool::new(false));
        let followers = (0..PARTITIONS)
            .map(|p| {
                let got = Arc::new(Mutex::new(Received::default()));
                let task = tokio::spawn(follow(
                    p,
                    Arc::clone(urls),
                    Arc::clone(&done),
                    Arc::clone(&got),
                ));
                (got, task)
            })
            .collect();
        let consumers = (0..PARTITIONS)
            .map(|p| {
                let got = Arc::new(Mutex::new(Consumed::default()));
                let task = tokio::spawn(consume(
                    p,
                    Arc::clone(urls),
                    Arc::clone(&done),
                    Arc::clone(&got),
                ));
                (got, task)
            })
            .collect();
        Readers {
            done,
            followers,
            consumers,
        }
    }

    /// Waits until every reader is past every acknowledged event of its partition, then checks
    /// each follower got every event once, in order, and no consumer's position went back.
    pub async fn check(self, acks: &[Ack]) {
        let mut acked: HashMap<u64, Vec<u64>> = HashMap::new();
        for a in acks {
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
                    let i = *p as usize;
                    self.followers[i]
                        .0
                        .lock()
                        .unwrap()
                        .ids
                        .last()
                        .copied()
                        .unwrap_or(0)
                        < top
                        || self.consumers[i]
                            .0
                            .lock()
                            .unwrap()
                            .stored
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
                "readers of {behind:?} never caught up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.done.store(true, Ordering::SeqCst);
        for (p, (got, task)) in self.followers.into_iter().enumerate() {
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
        for (p, (got, task)) in self.consumers.into_iter().enumerate() {
            task.abort();
            let got = got.lock().unwrap();
            assert!(
                got.wrong.is_empty(),
                "consumer of partition {p}: {:?}",
                got.wrong
            );
        }
    }
}
