//! A fatal storage failure is not silent and not a flood: when the store is poisoned (its
//! engine refuses every write after a failed flush), each partition that meets it logs it
//! once with its first cause, its partition and what to do, stops writing, answers commands
//! with it, and readiness and the processor's failure list name it. A test binary of its own,
//! so that the process's log subscriber is this test's alone.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_cp::{Command, CommandError, CommandProcessor, Config};
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
        "ws": ws, "ws_kind": 1, "command": "fatal.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "fatal.Doc", "fields": {}}],
    }))
    .expect("command")
}

/// The injected first failure.
const FIRST: &str = "flushing the journal: No space left on device (os error 28)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_store_is_logged_once_per_partition_with_its_first_cause_and_named_by_readiness()
{
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
        partitions: 2,
        flush_delay: Duration::from_millis(5),
        ..Config::default()
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cp.ready() {
        assert!(Instant::now() < deadline, "never ready");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    for ws in 1..=4 {
        cp.submit(order(ws))
            .await
            .expect("a command before the failure");
    }

    kv.poison(FIRST);
    let mut answers = Vec::new();
    for round in 0..10 {
        for ws in 1..=4 {
            answers.push(cp.submit(order(ws + 4 * round)).await);
        }
    }
    for answer in &answers {
        let e = answer
            .as_ref()
            .expect_err("nothing is written after the failure");
        assert!(matches!(e, CommandError::Storage(_)), "{e}");
        assert!(
            e.to_string().contains(FIRST),
            "the first cause is named: {e}"
        );
    }

    let unready = cp.unready();
    assert_eq!(
        unready.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        vec![0, 1],
        "both partitions wrote and failed: {unready:?}"
    );
    for (_, why) in &unready {
        assert!(why.contains("the storage failed fatally"), "{why}");
        assert!(why.contains(FIRST), "{why}");
        assert!(why.contains("restart the server"), "{why}");
    }
    assert_eq!(
        cp.storage_failures()
            .iter()
            .map(|(p, _)| *p)
            .collect::<Vec<_>>(),
        vec![0, 1]
    );

    let text = log.text();
    let fatal: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("the storage failed fatally"))
        .collect();
    assert_eq!(
        fatal.len(),
        2,
        "once per partition, not per command: {text}"
    );
    for (p, line) in fatal.iter().enumerate() {
        assert!(line.contains("ERROR"), "{line}");
        assert!(line.contains(FIRST), "{line}");
        assert!(line.contains("check the disk"), "{line}");
        assert!(
            fatal.iter().any(|l| l.contains(&format!("partition={p}"))),
            "partition {p} is named: {text}"
        );
    }
    assert!(
        !text.contains("writing a group of"),
        "no line per failed group: {text}"
    );
    assert!(
        !text.contains("partition failed"),
        "no rebuild loop: {text}"
    );
}
