//! Appends on an expected WLog offset (invariant 16): a command whose workspace's WLog does not
//! end where it expects is refused with the current offset and takes no number (the next
//! command gets exactly what it would have got); 0 means "no event yet"; of concurrent
//! commands on one expected offset exactly one succeeds; a retry with the same idempotency key
//! gets its original answer, and the key's fingerprint includes the condition.

use std::sync::Arc;
use std::time::Duration;

use monoseq_cp::{Command, CommandError, CommandProcessor, Config, ErrorClass, IdempotencyKey};
use monoseq_kv::{KvStore, MemoryStore};
use monoseq_store::{CRECORD_ID_SEQUENCE, EventStore, OWRECORD_ID_SEQUENCE};
use serde_json::json;

type Mem = Arc<MemoryStore>;

/// A command of workspace `ws` creating one CDoc (raw ID 1) and one WDoc (raw ID 2), on
/// `expected` if given.
fn create(ws: u64, expected: Option<u64>) -> Command {
    let mut c: Command = serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "app.Create",
        "create": [
            {"raw_id": 1, "kind": "CDoc", "name": "app.Doc"},
            {"raw_id": 2, "kind": "WDoc", "name": "app.Flow"}
        ]
    }))
    .unwrap();
    c.expected_wlog_offset = expected;
    c
}

fn processor(partitions: u32) -> CommandProcessor<Mem> {
    let config = Config {
        partitions,
        ..Config::default()
    };
    let store = EventStore::new(Arc::new(MemoryStore::new()), config.app, config.trust);
    CommandProcessor::start(store, config).unwrap()
}

async fn ready<S: KvStore + Clone + Send + Sync + 'static>(cp: &CommandProcessor<S>) {
    for _ in 0..2000 {
        if cp.ready() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("processor never became ready");
}

fn conflict(e: &CommandError) -> u64 {
    assert!(matches!(e, CommandError::WlogConflict { .. }), "{e}");
    assert_eq!(e.class(), ErrorClass::Conflict);
    assert!(!e.is_transient());
    e.current_wlog_offset()
        .expect("a conflict names the current offset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mismatch_is_refused_with_the_current_offset_and_takes_no_number() {
    let cp = processor(1);
    ready(&cp).await;
    let crec = CRECORD_ID_SEQUENCE.initial.0;
    let owrec = OWRECORD_ID_SEQUENCE.initial.0;
    let first = cp.submit(create(7, None)).await.unwrap();
    assert_eq!((first.plog_offset, first.wlog_offset), (1, 1));
    let actualizations = cp.stats().actualizations;
    // Behind, ahead, far ahead, and on another workspace of the same partition.
    for expected in [0, 2, 5, u64::MAX] {
        let e = cp.submit(create(7, Some(expected))).await.unwrap_err();
        assert_eq!(conflict(&e), 1, "expected {expected}");
        assert!(
            e.to_string().contains("workspace 7 ends at offset 1"),
            "{e}"
        );
    }
    let e = cp.submit(create(8, Some(3))).await.unwrap_err();
    assert_eq!(conflict(&e), 0, "workspace 8 has no event yet");
    // The next accepted command gets exactly what it would have got without the refusals.
    let next = cp.submit(create(7, Some(1))).await.unwrap();
    assert_eq!((next.plog_offset, next.wlog_offset), (2, 2));
    assert_eq!(
        next.ids.into_iter().collect::<Vec<_>>(),
        [(1, crec + 1), (2, owrec + 1)]
    );
    let other = cp.submit(create(8, None)).await.unwrap();
    assert_eq!((other.plog_offset, other.wlog_offset), (3, 1));
    assert_eq!(other.ids[&1], crec, "record IDs are per workspace");
    let stats = cp.stats();
    assert_eq!(
        stats.actualizations, actualizations,
        "a refusal cost an actualization"
    );
    assert_eq!((stats.committed, stats.failed), (3, 5));
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_means_the_workspace_has_no_event_yet() {
    let cp = processor(2);
    ready(&cp).await;
    let out = cp.submit(create(5, Some(0))).await.unwrap();
    assert_eq!(out.wlog_offset, 1);
    let e = cp.submit(create(5, Some(0))).await.unwrap_err();
    assert_eq!(conflict(&e), 1);
    let out = cp.submit(create(5, Some(1))).await.unwrap();
    assert_eq!(out.wlog_offset, 2);
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_commands_on_the_same_expected_offset_exactly_one_succeeds() {
    const TASKS: usize = 16;
    const ROUNDS: u64 = 30;
    let cp = Arc::new(processor(1));
    ready(&cp).await;
    for round in 0..ROUNDS {
        // The WLog ends at the offset of the previous round's one success.
        let end = round;
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let cp = Arc::clone(&cp);
                tokio::spawn(async move { cp.submit(create(3, Some(end))).await })
            })
            .collect();
        let mut won = Vec::new();
        let mut refused = Vec::new();
        for t in tasks {
            match t.await.unwrap() {
                Ok(out) => won.push(out),
                Err(e) => refused.push(conflict(&e)),
            }
        }
        assert_eq!(won.len(), 1, "round {round}: {} succeeded", won.len());
        assert_eq!(won[0].wlog_offset, end + 1);
        assert_eq!(
            won[0].plog_offset,
            round + 1,
            "refusals took no PLog offset"
        );
        assert!(
            refused.iter().all(|&c| c == end + 1),
            "round {round}: {refused:?}"
        );
    }
    let cp = Arc::into_inner(cp).expect("the tasks are done");
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_gets_its_original_answer_and_a_refusal_is_not_remembered() {
    let cp = processor(1);
    ready(&cp).await;
    let key = || Some(IdempotencyKey::new("open-9").unwrap());
    let out = cp.submit_keyed(create(9, Some(0)), key()).await.unwrap();
    assert_eq!(out.wlog_offset, 1);
    // The WLog moved on, but the retry is answered from its event before the condition.
    let again = cp.submit_keyed(create(9, Some(0)), key()).await.unwrap();
    assert!(again.replayed);
    assert_eq!(
        (again.plog_offset, again.wlog_offset, again.ids.clone()),
        (out.plog_offset, out.wlog_offset, out.ids.clone())
    );
    // The condition is part of the key's fingerprint.
    let e = cp
        .submit_keyed(create(9, Some(1)), key())
        .await
        .unwrap_err();
    assert!(matches!(e, CommandError::KeyReused { .. }), "{e}");
    let e = cp.submit_keyed(create(9, None), key()).await.unwrap_err();
    assert!(matches!(e, CommandError::KeyReused { .. }), "{e}");
    // A refused command is not remembered: its retry is decided again, on the WLog then.
    let refused_key = || Some(IdempotencyKey::new("late-9").unwrap());
    let e = cp
        .submit_keyed(create(9, Some(0)), refused_key())
        .await
        .unwrap_err();
    assert_eq!(conflict(&e), 1);
    cp.submit(create(9, None)).await.unwrap();
    let e = cp
        .submit_keyed(create(9, Some(0)), refused_key())
        .await
        .unwrap_err();
    assert_eq!(conflict(&e), 2, "the retry sees the offset of its own time");
    let out = cp
        .submit_keyed(create(9, Some(2)), refused_key())
        .await
        .unwrap();
    assert_eq!(out.wlog_offset, 3, "the key is free for a new condition");
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}
