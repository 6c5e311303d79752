//! A command slowed by its storage is not silent: a group whose oldest command took a second
//! or more from its arrival to its durable answer is logged once, with where the time went,
//! and fast groups log nothing. A test binary of its own, so that the process's log
//! subscriber is this test's alone.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_cp::{Command, CommandProcessor, Config};
use monoseq_kv::{EmbeddedStore, FaultyStore, Options};
use monoseq_store::{AppId, EventStore, TrustLevel};
use serde_json::json;

/// Every log line written, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn order(ws: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "slow.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "slow.Doc", "fields": {}}],
    }))
    .expect("command")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_slowed_by_the_storage_sync_is_logged_with_where_its_time_went() {
    let log = Captured::default();
    let writer = log.clone();
    tracing::subscriber::set_global_default(
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish(),
    )
    .expect("the test's log subscriber");

    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = Arc::new(FaultyStore::new(
        EmbeddedStore::open(dir.path(), Options::default()).expect("open the embedded store"),
    ));
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 1,
        flush_delay: Duration::from_secs(10),
        ..Config::default()
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cp.ready() {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    for ws in 1..=3 {
        cp.submit(order(ws)).await.expect("a fast command");
    }
    assert!(
        !log.text()
            .contains("from its arrival to its durable answer"),
        "fast commands log nothing: {}",
        log.text()
    );

    // Every store sync takes 1.2 s now: two slow groups, the second within the interval.
    kv.on_sync(|| std::thread::sleep(Duration::from_millis(1_200)));
    cp.submit(order(4)).await.expect("a slow command");
    cp.submit(order(5)).await.expect("another slow command");
    kv.clear_hooks();

    let text = log.text();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("from its arrival to its durable answer"))
        .collect();
    assert_eq!(lines.len(), 1, "one line per interval: {text}");
    let line = lines[0];
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("partition=0"), "{line}");
    assert!(line.contains("check the storage's latency"), "{line}");
    let write_ms: u64 = line
        .split("write_ms=")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no write_ms: {line}"));
    assert!(write_ms >= 1_200, "the sync's time is in the write: {line}");
}
