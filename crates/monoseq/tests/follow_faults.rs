//! Followers and consumers through faults on real nodes and a real PostgreSQL: while keyed load
//! runs on a cluster of two nodes, one follower and one consumer per partition read it through
//! the nodes (`faults/readers.rs`); one node is SIGKILLed mid-load. Every acknowledged event
//! reaches its partition's follower exactly once, in PLog order, and nothing else does, and no
//! consumer's position goes back (invariants 15 and 17 of docs/invariants.md). A follower through
//! a node that does not own its partition hears the owner's end in heartbeats and is not cut by
//! a relayed page with a small `--follower-buffer-events`.

mod common;
mod faults;

use std::time::Duration;

use common::keyed::{self, Load};
use faults::readers::Readers;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn followers_and_consumers_through_a_sigkilled_node_get_every_acknowledged_event_once_in_order()
 {
    let db = common::Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let n1 = faults::node(&db, "n1", dir.path()).start();
    let n2 = faults::node(&db, "n2", dir.path()).start();
    let client = keyed::client(Duration::from_secs(10));
    keyed::balanced(&client, &n1.url, &["n1", "n2"]).await;
    let urls = keyed::urls(&[&n1.url, &n2.url]);
    let readers = Readers::start(&urls);
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
    readers.check(&acks).await;
    drop(n2);
}

/// Writes `n` events (at most 1 000) into workspace `ws` of `url` in batches, sending again
/// what was answered 503 (nothing written) while a partition moves.
async fn fill(http: &reqwest::Client, url: &str, ws: u64, n: u64) {
    let mut left = n;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while left > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "{left} events unwritten"
        );
        let commands: Vec<serde_json::Value> = (0..left)
            .map(|i| serde_json::json!({"ws": ws, "ws_kind": 1, "command": "fill.Do", "create": [{"raw_id": 1, "kind": "CDoc", "name": "fill.Doc", "fields": {"n": i}}]}))
            .collect();
        let r = http
            .post(format!("{url}/v1/commands/batch"))
            .json(&serde_json::json!({ "commands": commands }))
            .send()
            .await
            .unwrap();
        if r.status() == 503 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        assert_eq!(r.status(), 200);
        let answer: serde_json::Value = r.json().await.unwrap();
        for result in answer["results"].as_array().unwrap() {
            match result["status"].as_u64() {
                Some(200) => left -= 1,
                Some(503) => {}
                _ => panic!("{result}"),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_through_a_node_that_does_not_own_its_partition_hears_the_owners_end_and_is_not_cut_by_a_relayed_page()
 {
    use common::sse::Sse;
    let db = common::Backend::postgres_url();
    let dir = tempfile::tempdir().unwrap();
    let small = [
        "--follower-buffer-events",
        "8",
        "--follower-heartbeat-ms",
        "200",
    ];
    let a = common::node::Node::on(&db, "a", dir.path())
        .args(&small)
        .start();
    let b = common::node::Node::on(&db, "b", dir.path())
        .args(&small)
        .start();
    let http = keyed::client(Duration::from_secs(10));
    // The node that does not own partition 0 (workspace 6 of 6) serves the follower.
    let owners = keyed::balanced(&http, &a.url, &["a", "b"]).await;
    let relay = if owners[&0].0 == "a" { &b.url } else { &a.url };
    fill(&http, relay, 6, 600).await;
    let mut tail = Sse::open(
        &http,
        &format!("{relay}/v1/partitions/0/events/stream?from=1"),
        None,
    )
    .await;
    let mut next = 1;
    let mut beats = Vec::new();
    // Every event once, in order; then more in bursts, live; never a slow_follower cut.
    for round in 0..3 {
        let until = 601 + 20 * round;
        while next < until {
            let m = tail
                .next(Duration::from_secs(20))
                .await
                .unwrap_or_else(|| panic!("no message after {next}"));
            match m.event.as_str() {
                "event" => {
                    assert_eq!(m.id, Some(next), "{m:?}");
                    next += 1;
                }
                "heartbeat" => beats.push(m.data),
                other => panic!("{other} after {next}: {:?}", m.data),
            }
        }
        // Idle: heartbeats carry the owner's end, never one below what was delivered.
        let m = tail.next(Duration::from_secs(10)).await.unwrap();
        assert_eq!(m.event, "heartbeat", "{m:?}");
        assert_eq!(m.data["end"], next, "{:?}", m.data);
        fill(&http, relay, 6, 20).await;
    }
    for beat in &beats {
        assert!(
            beat["end"].is_null() || beat["end"].as_u64() >= beat["next"].as_u64(),
            "a heartbeat behind the follower: {beat}"
        );
    }
}
