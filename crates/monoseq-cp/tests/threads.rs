//! Where partitions run: up to `partition_threads_max` on a thread of their own (named
//! `monoseq-p<N>`), the others as tasks on the runtime. Both serve alike, and a released
//! partition's thread ends and is reused. With high-water marks they share writer threads
//! (`monoseq-w<N>`) instead. A test binary of its own, its tests one at a time, so that the
//! process's threads are the running test's alone.

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

/// The names of this process's threads that start with `prefix`, sorted.
fn threads_named(prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .expect("the process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name.starts_with(prefix))
        .collect();
    names.sort();
    names
}

/// The names of this process's partition threads, sorted.
fn partition_threads() -> Vec<String> {
    threads_named("monoseq-p")
}

/// Held by each test for its whole run: `cargo test` runs a binary's tests side by side, and
/// each counts the process's threads.
static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_beyond_the_thread_limit_run_as_tasks_and_a_released_ones_thread_is_reused() {
    let _alone = ALONE.lock().await;
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

/// The names of this process's shared writer threads, sorted.
fn writer_threads() -> Vec<String> {
    threads_named("monoseq-w")
}

/// With high-water marks the partitions share writer threads: four partitions run on one
/// (`monoseq-w0`), none on a thread of its own. The groups the thread appended wait for one
/// raise of their marks, and each command is answered only once the marks file on disk covers
/// its event, whichever partition it went to. A released partition comes back to the same
/// thread, which ends with the processor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_sharing_a_writer_thread_answer_only_once_the_marks_on_disk_cover_their_events()
{
    let _alone = ALONE.lock().await;
    use monoseq_kv::FaultyStore;
    use monoseq_store::Marks;
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = Arc::new(FaultyStore::new(MemoryStore::new()));
    // Each store sync, the first step of a raise, takes a while: an answer given before its
    // raise ended would find the marks file behind it.
    kv.on_sync(|| std::thread::sleep(Duration::from_millis(5)));
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let marks = Arc::new(Marks::create(dir.path(), 4).expect("marks"));
    let config = Config {
        partitions: 4,
        marks: Some(Arc::clone(&marks)),
        writer_threads: 1,
        ..Config::default()
    };
    let cp = CommandProcessor::start(store.clone(), config).expect("start");
    until("ready", || cp.ready()).await;
    assert_eq!(writer_threads(), ["monoseq-w0"]);
    assert!(partition_threads().is_empty(), "{:?}", partition_threads());

    let path = Marks::path(dir.path());
    let mut answers = tokio::task::JoinSet::new();
    for ws in 1..=64u64 {
        let (cp, path) = (cp.clone(), path.clone());
        answers.spawn(async move {
            let outcome = cp.submit(order(ws)).await.expect("applied");
            let on_disk = Marks::read_file(&path, 4).expect("read the marks file");
            (outcome, on_disk)
        });
    }
    let mut served = [0u32; 4];
    while let Some(answer) = answers.join_next().await {
        let (outcome, on_disk) = answer.expect("task");
        let p = outcome.partition as usize;
        served[p] += 1;
        assert!(
            on_disk[p].plog >= outcome.plog_offset,
            "partition {p}'s offset {} was answered while the marks file said {}",
            outcome.plog_offset,
            on_disk[p].plog
        );
    }
    assert_eq!(served, [16; 4], "every partition served its workspaces");

    assert!(
        cp.release(0, Duration::from_secs(10)).await,
        "released in time"
    );
    cp.acquire(0, store).expect("acquire again");
    until("ready again", || cp.ready()).await;
    assert_eq!(
        writer_threads(),
        ["monoseq-w0"],
        "the same thread serves it"
    );
    let again = cp
        .submit(order(68))
        .await
        .expect("partition 0 serves again");
    assert!(marks.get(0).expect("partition 0").plog >= again.plog_offset);
    assert!(
        cp.shutdown(Duration::from_secs(10)).await,
        "stopped in time"
    );
    until("the writer thread ends", || writer_threads().is_empty()).await;
}
