//! Followers and consumers through faults on real nodes and a real PostgreSQL: while keyed load
//! runs on a cluster of two nodes, one follower and one consumer per partition read it through
//! the nodes (`faults/readers.rs`); one node is SIGKILLed mid-load. Every acknowledged event
//! reaches its partition's follower exactly once, in PLog order, and nothing else does, and no
//! consumer's position goes back (invariants 15 and 17 of docs/invariants.md).

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
