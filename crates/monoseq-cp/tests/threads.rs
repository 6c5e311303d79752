//! Where partitions run: up to `partition_threads_max` on a thread of their own (named
//! `monoseq-p<N>`), the others as tasks on the runtime. Both serve alike, and a released
//! partition's thread ends and is reused. A test binary of its own, so that the process's
//! threads are this test's alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use monoseq_cp::{Command, CommandProcessor, Config};
use monoseq_kv::MemoryStore;
use monoseq_store::{AppId, EventStore, TrustLevel};
use serde_json::json;

fn order(ws: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "threads.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "threads.Doc", "fields": {}}],
    }))
    .expect("command")
}

/// The names of this process's partition threads, sorted.
fn partition_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("the process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with("monoseq-p"))
        .collect();
    names.sort();
    names
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_beyond_the_thread_limit_run_as_tasks_and_a_released_ones_thread_is_reused() {
    let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 4,
        partition_threads_max: 2,
        ..Config::default()
    };
    let cp = CommandProcessor::start(store.clone(), config).expect("start");
    until("ready", || cp.ready()).await;
    assert_eq!(partition_threads(), ["monoseq-p0", "monoseq-p1"]);
    for ws in 4..8 {
        let outcome = cp.submit(order(ws)).await.expect("every partition serves");
        assert_eq!(outcome.partition, (ws % 4) as u32);
    }

    assert!(
        cp.release(0, Duration::from_secs(10)).await,
        "released in time"
    );
    until("partition 0's thread ends", || {
        partition_threads() == ["monoseq-p1"]
    })
    .await;
    // Partition 0 gets the thread back; partitions 2 and 3 stay tasks.
    cp.acquire(0, store).expect("acquire again");
    until("ready again", || cp.ready()).await;
    assert_eq!(partition_threads(), ["monoseq-p0", "monoseq-p1"]);
    cp.submit(order(8)).await.expect("partition 0 serves again");
    assert!(
        cp.shutdown(Duration::from_secs(10)).await,
        "stopped in time"
    );
    until("every partition thread ends", || {
        partition_threads().is_empty()
    })
    .await;
}
