//! The command processor when things go wrong, on the real embedded engine: safe retries with
//! idempotency keys (also across a restart), bad commands refused before they take numbers,
//! a slow storage call that stalls no other partition, a permanent condition that is not
//! "retry later", and a partition whose sequencer fails (a storage call panics) rebuilt under
//! load while readiness says so.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_core::{Number, PLogOffset, SeqStorage, SeqValue, WsId};
use monoseq_cp::{
    Command, CommandError, CommandProcessor, Config, ErrorClass, IdempotencyKey, Unready,
};
use monoseq_kv::{EmbeddedStore, FaultyStore, KvStore, Options};
use monoseq_store::{AppId, EventStore, PartitionId, RecordId, TrustLevel, WLOG_OFFSET_SEQUENCE};
use serde_json::json;

/// The embedded engine behind a fault-injecting wrapper whose hooks slow reads down or make
/// checkpoint writes panic (a broken storage call).
type Store = Arc<FaultyStore<EmbeddedStore>>;

fn open(dir: &std::path::Path) -> Store {
    Arc::new(FaultyStore::new(
        EmbeddedStore::open(dir, Options::default()).expect("open the embedded store"),
    ))
}

/// The checkpoint table's tag (`docs/format.md`).
const TAG_CHECKPOINT: u8 = 0x05;

/// Makes the next `panics` writes of a checkpoint panic.
fn panic_on_checkpoints(kv: &Store, panics: &Arc<AtomicU32>) {
    let left = Arc::clone(panics);
    kv.on_write(move |batch| {
        let checkpoint = batch
            .iter()
            .any(|i| i.key.partition.first() == Some(&TAG_CHECKPOINT));
        if checkpoint
            && left
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            panic!("injected: the checkpoint write panics");
        }
    });
}

/// Makes every read of partition key `partition` take `pause`.
fn slow_reads_of(kv: &Store, partition: Vec<u8>, pause: Duration) {
    kv.on_read(move |p| {
        if p == partition.as_slice() {
            std::thread::sleep(pause);
        }
    });
}

fn order(ws: u64, n: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "heal.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "heal.Doc", "fields": {"n": n}}],
    }))
    .expect("command")
}

fn config(partitions: u32) -> Config {
    Config {
        partitions,
        flush_delay: Duration::from_millis(5),
        ..Config::default()
    }
}

fn processor(kv: &Store, partitions: u32) -> CommandProcessor<Store> {
    let store = EventStore::new(Arc::clone(kv), AppId(1), TrustLevel::Level0);
    CommandProcessor::start(store, config(partitions)).expect("start")
}

async fn ready(cp: &CommandProcessor<Store>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cp.ready() {
        assert!(Instant::now() < deadline, "never ready: {:?}", cp.unready());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn key(k: &str) -> Option<IdempotencyKey> {
    Some(IdempotencyKey::new(k).expect("valid key"))
}

/// Events of workspace `ws` in its WLog.
fn wlog_len(cp: &CommandProcessor<Store>, ws: u64) -> usize {
    cp.store()
        .read_wlog(WsId(ws), monoseq_store::WLogOffset(1), 1_000)
        .expect("read WLog")
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_same_key_gets_the_original_answer_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 2);
    ready(&cp).await;
    let first = cp
        .submit_keyed(order(7, 1), key("k-1"))
        .await
        .expect("first");
    assert!(!first.replayed);
    let again = cp
        .submit_keyed(order(7, 1), key("\"k-1\""))
        .await
        .expect("retry");
    assert!(
        again.replayed,
        "the retry is answered from the original event"
    );
    assert_eq!(
        (again.plog_offset, again.wlog_offset),
        (first.plog_offset, first.wlog_offset)
    );
    assert_eq!(again.ids, first.ids);
    assert_eq!(wlog_len(&cp, 7), 1, "one event per key");
    let other = cp.submit_keyed(order(7, 2), key("k-1")).await.unwrap_err();
    assert!(matches!(other, CommandError::KeyReused { .. }), "{other}");
    assert_eq!(other.class(), ErrorClass::Unprocessable);
    // Without a key the same command is a new command.
    let plain = cp.submit(order(7, 1)).await.expect("plain");
    assert_eq!(plain.wlog_offset, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_of_one_key_write_one_event() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let tries: Vec<_> = (0..24)
        .map(|_| {
            let cp = cp.clone();
            tokio::spawn(async move { cp.submit_keyed(order(3, 9), key("same")).await })
        })
        .collect();
    let mut answers = HashSet::new();
    for t in tries {
        let o = t.await.expect("task").expect("answer");
        answers.insert((o.plog_offset, o.wlog_offset, o.ids));
    }
    assert_eq!(answers.len(), 1, "every try got the same answer");
    assert_eq!(wlog_len(&cp, 3), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_recognised_after_a_restart() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 2);
    ready(&cp).await;
    let mut first = Vec::new();
    for n in 0..20 {
        let o = cp
            .submit_keyed(order(n % 4 + 1, n), key(&format!("r-{n}")))
            .await
            .expect("submit");
        first.push(o);
    }
    assert!(cp.shutdown(Duration::from_secs(5)).await);
    drop(kv);
    let kv = open(dir.path());
    let cp = processor(&kv, 2);
    ready(&cp).await;
    for (n, o) in first.iter().enumerate() {
        let n = n as u64;
        let again = cp
            .submit_keyed(order(n % 4 + 1, n), key(&format!("r-{n}")))
            .await
            .expect("retry");
        assert!(again.replayed);
        assert_eq!((again.plog_offset, &again.ids), (o.plog_offset, &o.ids));
    }
    for ws in 1..=4 {
        assert_eq!(wlog_len(&cp, ws), 5);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_too_large_to_store_is_refused_before_it_takes_numbers() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let big = "x".repeat(monoseq_kv::limits::VALUE_BYTES_MAX);
    let cmd: Command = serde_json::from_value(json!({
        "ws": 5, "ws_kind": 1, "command": "heal.Big",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "heal.Doc", "fields": {"b": big}}],
    }))
    .expect("command");
    let before = cp.stats().actualizations;
    let err = cp.submit(cmd).await.unwrap_err();
    assert!(matches!(err, CommandError::TooLarge(_)), "{err}");
    assert_eq!(err.class(), ErrorClass::TooLarge, "{err}");
    assert!(err.to_string().contains("the command"), "{err}");
    // Nothing was sequenced: no actualization, and the next command gets offset 1.
    let next = cp.submit(order(5, 1)).await.expect("next command");
    assert_eq!((next.plog_offset, next.wlog_offset), (1, 1));
    assert_eq!(cp.stats().actualizations, before);
}

#[tokio::test(flavor = "current_thread")]
async fn a_slow_storage_read_in_one_partition_does_not_stall_another() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 2);
    ready(&cp).await;
    let doc = cp
        .submit(order(2, 1))
        .await
        .expect("create a record in partition 0");
    let id = doc.ids[&1];
    let record_key = cp.store().record_key(WsId(2), RecordId(id));
    slow_reads_of(
        &kv,
        record_key.partition.clone(),
        Duration::from_millis(1500),
    );
    let update: Command = serde_json::from_value(json!({
        "ws": 2, "ws_kind": 1, "command": "heal.Update",
        "update": [{"id": id, "fields": {"n": 2}}],
    }))
    .expect("command");
    let slow = tokio::spawn({
        let cp = cp.clone();
        async move { cp.submit(update).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let began = Instant::now();
    for n in 0..5 {
        cp.submit(order(3, n)).await.expect("partition 1 serves");
    }
    let took = began.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "partition 1 waited {took:?} for partition 0's slow read"
    );
    kv.clear_hooks();
    slow.await
        .expect("task")
        .expect("the slow update ends well");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_sequence_is_a_permanent_error_not_busy() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    {
        let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
        store
            .seq_storage(PartitionId(0))
            .write_values_and_next_plog_offset(
                &[SeqValue::new(
                    WsId(4),
                    WLOG_OFFSET_SEQUENCE.id,
                    Number(u64::MAX),
                )],
                PLogOffset::FIRST,
            )
            .expect("seed an exhausted WLog");
    }
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let err = cp.submit(order(4, 1)).await.unwrap_err();
    assert!(matches!(err, CommandError::Exhausted(_)), "{err}");
    assert_eq!(err.class(), ErrorClass::Conflict, "{err}");
    assert!(!err.is_transient());
    // The failed transaction rolled back (an actualization); then other workspaces work.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match cp.submit(order(5, 1)).await {
            Ok(_) => break,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => panic!("other workspaces still work: {e}"),
        }
    }
    let again = cp.submit(order(4, 2)).await.unwrap_err();
    assert!(matches!(again, CommandError::Exhausted(_)), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_partition_is_rebuilt_under_load_and_readiness_says_so() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 2);
    ready(&cp).await;
    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4u64)
        .map(|c| {
            let (cp, acked, stop) = (cp.clone(), Arc::clone(&acked), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    match cp.submit(order(c % 2 + 2, n)).await {
                        Ok(o) => acked
                            .lock()
                            .unwrap()
                            .push((o.partition, o.plog_offset, o.ids)),
                        Err(e) => assert!(e.is_transient(), "not transient: {e}"),
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Every checkpoint write panics for a while: the partition's sequencer is poisoned,
    // and each rebuild fails too until storage works again.
    let panics = Arc::new(AtomicU32::new(6));
    panic_on_checkpoints(&kv, &panics);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen_rebuilding = false;
    while panics.load(Ordering::Acquire) > 0 || !cp.ready() {
        seen_rebuilding |= cp
            .unready()
            .iter()
            .any(|(_, why)| why.starts_with("rebuilding"));
        assert!(
            Instant::now() < deadline,
            "never healed: {:?}",
            cp.unready()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let after = acked.lock().unwrap().len();
    let deadline = Instant::now() + Duration::from_secs(10);
    while acked.lock().unwrap().len() < after + 20 {
        assert!(
            Instant::now() < deadline,
            "no command succeeded after the rebuild"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("client");
    }
    assert!(
        seen_rebuilding,
        "readiness named the partition being rebuilt"
    );
    assert!(cp.stats().rebuilds >= 1);
    let acked = acked.lock().unwrap();
    let mut offsets = HashSet::new();
    let mut ids = HashSet::new();
    for (p, plog, got) in acked.iter() {
        assert!(
            offsets.insert((*p, *plog)),
            "PLog offset {plog} of {p} handed out twice"
        );
        for id in got.values() {
            assert!(ids.insert((*p, *id)), "record ID {id} handed out twice");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_event_in_the_replayed_tail_is_corrupted_not_busy() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let last = cp.submit(order(6, 1)).await.expect("submit").plog_offset;
    assert!(cp.shutdown(Duration::from_secs(5)).await);
    // An event after the checkpoint (its numbers not flushed yet), whose bytes are damaged.
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let key = store.plog_key(PartitionId(0), PLogOffset(last + 1));
    kv.put(key.as_key(), b"\x01garbage")
        .expect("put damaged bytes");
    let cp = processor(&kv, 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match cp.submit(order(6, 2)).await {
            Err(e) if matches!(e, CommandError::Corrupted(_)) => break e,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            other => panic!("a damaged PLog must answer corrupted, got {other:?}"),
        }
    };
    assert_eq!(err.class(), ErrorClass::Damaged);
    assert!(
        !err.is_transient(),
        "corrupt bytes are an error, never busy"
    );
    let unready = cp.unready_partitions();
    assert!(
        unready.iter().any(|(_, why)| *why == Unready::Corrupted),
        "{unready:?}"
    );
    assert!(
        cp.unready()
            .iter()
            .any(|(_, why)| why == "corrupted: stored data the partition needs is damaged"),
        "/readyz shows the reason as before"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_outage_answers_503_and_the_partition_heals_with_storage() {
    use monoseq_kv::FaultOp;
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let cp = CommandProcessor::start(store.clone(), config(1)).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cp.ready() {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let before = cp.submit(order(9, 0)).await.expect("before the outage");
    kv.fail(FaultOp::Write, true);
    kv.fail(FaultOp::Sync, true);
    for n in 1..=5 {
        let e = cp.submit(order(9, n)).await.unwrap_err();
        assert!(e.is_transient(), "an outage is retryable: {e}");
        assert_eq!(e.class(), ErrorClass::Transient, "{e}");
    }
    kv.heal();
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        match cp.submit(order(9, 9)).await {
            Ok(o) => break o,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the partition did not heal with storage: {e}"),
        }
    };
    // Nothing of the failed commands was written; numbering continues right after.
    assert_eq!(after.plog_offset, before.plog_offset + 1);
    assert_eq!(after.wlog_offset, before.wlog_offset + 1);
    assert_eq!(
        store
            .read_wlog(WsId(9), monoseq_store::WLogOffset(1), 100)
            .expect("read")
            .len(),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_failing_for_one_command_answers_it_and_retries_the_others() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let taken = cp.submit(order(11, 0)).await.expect("first");
    // The next CRecord ID of workspace 11 is taken behind the sequencer's back: at trust level
    // 0 the command that gets it conflicts, and only that one.
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let next_id = taken.ids[&1] + 1;
    kv.put(
        store.record_key(WsId(11), RecordId(next_id)).as_key(),
        b"\x01taken",
    )
    .expect("put");
    let tries: Vec<_> = (1..=8u64)
        .map(|n| {
            let cp = cp.clone();
            tokio::spawn(async move {
                // Innocent commands may meet the partition actualizing (busy): they retry.
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    match cp.submit(order(if n == 1 { 11 } else { 12 }, n)).await {
                        Err(e) if e.is_transient() && Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        answer => break answer,
                    }
                }
            })
        })
        .collect();
    let mut violations = 0;
    let mut ok = 0;
    for t in tries {
        match t.await.expect("task") {
            Ok(_) => ok += 1,
            Err(CommandError::SequenceViolation(_)) => violations += 1,
            Err(e) => panic!("an innocent command failed: {e}"),
        }
    }
    assert_eq!((violations, ok), (1, 7), "the culprit alone is refused");
}

/// The PLog table's tag (`docs/format.md`).
const TAG_PLOG: u8 = 0x01;

/// Submits `cmd` with `k` until it is answered, retrying transient errors as a client would.
async fn submit_until_answered(
    cp: &CommandProcessor<Store>,
    cmd: impl Fn() -> Command,
    k: &str,
) -> monoseq_cp::Outcome {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match cp.submit_keyed(cmd(), key(k)).await {
            Ok(o) => return o,
            Err(e) if e.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => panic!("the retry of {k} was not answered: {e}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_answer_gets_the_original_answer_not_a_second_event() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let before = cp.submit_keyed(order(5, 0), key("a")).await.expect("first");
    kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_PLOG)));
    kv.lose_answers_next(1);
    let lost = cp.submit_keyed(order(5, 1), key("b")).await.unwrap_err();
    assert!(lost.is_transient(), "a lost answer is retryable: {lost}");
    let again = submit_until_answered(&cp, || order(5, 1), "b").await;
    assert!(
        again.replayed,
        "the write had landed: the retry is answered from it"
    );
    assert_eq!(again.plog_offset, before.plog_offset + 1);
    assert_eq!(wlog_len(&cp, 5), 2, "one event per key");
    let next = cp.submit_keyed(order(5, 2), key("c")).await.expect("next");
    assert_eq!(next.plog_offset, before.plog_offset + 2);
    assert_eq!(next.wlog_offset, before.wlog_offset + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_request_is_applied_once() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(dir.path());
    let cp = processor(&kv, 1);
    ready(&cp).await;
    let before = cp.submit_keyed(order(6, 0), key("a")).await.expect("first");
    kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_PLOG)));
    kv.lose_requests_next(1);
    let lost = cp.submit_keyed(order(6, 1), key("b")).await.unwrap_err();
    assert!(lost.is_transient(), "a lost request is retryable: {lost}");
    let again = submit_until_answered(&cp, || order(6, 1), "b").await;
    assert!(!again.replayed, "nothing had landed: the retry is applied");
    assert_eq!(again.plog_offset, before.plog_offset + 1);
    let twice = cp.submit_keyed(order(6, 1), key("b")).await.expect("again");
    assert!(twice.replayed);
    assert_eq!(wlog_len(&cp, 6), 2, "one event per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_plog_ends_below_its_mark_is_refused_before_any_command() {
    use monoseq_store::{Mark, Marks};
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(&dir.path().join("engine"));
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    // Partition 0 acknowledged events up to PLog offset 5 that the store no longer holds (a
    // database restored to an earlier point); partition 1 is whole.
    let lost = Mark {
        plog: 5,
        wlog: 5,
        crecord: 0,
        owrecord: 0,
    };
    let marks = Marks::create_with(dir.path(), &[lost, Mark::default()]).expect("marks");
    let config = Config {
        marks: Some(Arc::new(marks)),
        ..config(2)
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    let why = loop {
        let unready = cp.unready_partitions();
        if let [(p, Unready::Refused { reason })] = unready.as_slice() {
            break (*p, reason.clone());
        }
        assert!(Instant::now() < deadline, "not refused: {unready:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert_eq!(why.0, 0, "{why:?}");
    assert!(why.1.contains("up to 5 were acknowledged"), "{why:?}");
    assert_eq!(
        cp.unready(),
        vec![(0, format!("refused: {}", why.1))],
        "/readyz shows the reason as before"
    );
    let e = cp.submit(order(2, 1)).await.unwrap_err();
    assert!(matches!(e, CommandError::Corrupted(_)), "{e}");
    cp.submit(order(1, 1))
        .await
        .expect("the whole partition serves");
}

/// A power loss keeps any part of what was written but not synced. So a group's mark must reach
/// the marks file only after the store's sync that covers the group's events: written beside
/// that sync, a mark could survive a power loss that its events did not, and the restart would
/// refuse the store for events that were never acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_groups_mark_reaches_the_marks_file_only_after_the_store_sync_covering_its_events() {
    use monoseq_store::Marks;
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(&dir.path().join("engine"));
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let marks = Arc::new(Marks::create(dir.path(), 2).expect("marks"));
    let config = Config {
        marks: Some(Arc::clone(&marks)),
        // No background flush syncs between a group's raise and its answer.
        flush_delay: Duration::from_secs(10),
        ..config(2)
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    ready(&cp).await;
    // The highest PLog offset acknowledged, and what the marks file held during each sync.
    let acked = Arc::new(AtomicU64::new(0));
    let seen: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default();
    let path = Marks::path(dir.path());
    let (during, answered) = (Arc::clone(&seen), Arc::clone(&acked));
    kv.on_sync(move || {
        // Long enough for a raise running beside the sync to reach the file.
        std::thread::sleep(Duration::from_millis(20));
        let on_disk = Marks::read_file(&path, 2).expect("read the marks file");
        let highest = on_disk.iter().map(|m| m.plog).max().unwrap_or(0);
        let acked = answered.load(Ordering::Acquire);
        during.lock().expect("seen").push((highest, acked));
    });
    let mut last = 0;
    for n in 1..=5 {
        let outcome = cp.submit(order(2, n)).await.expect("applied");
        assert!(outcome.plog_offset > last);
        last = outcome.plog_offset;
        acked.store(last, Ordering::Release);
    }
    kv.clear_hooks();
    let seen = seen.lock().expect("seen").clone();
    assert!(seen.len() >= 5, "a sync per group: {seen:?}");
    for (on_disk, acked) in &seen {
        assert!(
            on_disk <= acked,
            "the marks file said {on_disk} while only {acked} was acknowledged: {seen:?}"
        );
    }
    let partition = cp.partition_of(WsId(2));
    assert_eq!(marks.get(partition).expect("mark").plog, last);
}

/// The WLog entries' table tag (`docs/format.md`).
const TAG_WLOG: u8 = 0x02;

/// With the PLogs in segment files a group's log is made durable before its WLog entries and
/// records are written to the key-value store. When that write fails, the group's events are
/// stored, and a retry of one of its commands is answered from the log (the read-back finds
/// its key). Its WLog entry and created record must then be readable too: the store is
/// brought up to the log before the partition serves again, not at its next append (which may
/// never come).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_answered_from_the_log_after_a_failed_store_write_finds_its_wlog_entry_and_record()
{
    use monoseq_store::{Marks, Segments};
    let dir = tempfile::tempdir().expect("temporary directory");
    let kv = open(&dir.path().join("engine"));
    let segments = Segments::open(dir.path(), 1, &|_| 1).expect("the segment logs");
    let store = EventStore::with_segments(
        Arc::clone(&kv),
        AppId(1),
        TrustLevel::Level0,
        Arc::new(segments),
    );
    let marks = Marks::create(dir.path(), 1).expect("marks");
    let config = Config {
        marks: Some(Arc::new(marks)),
        ..config(1)
    };
    let cp = CommandProcessor::start(store, config).expect("start");
    ready(&cp).await;
    let first = cp.submit_keyed(order(7, 0), key("a")).await.expect("first");

    // The next batch of WLog entries is lost on its way: the group's frames are in its log.
    kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_WLOG)));
    kv.lose_requests_next(1);
    let lost = cp.submit_keyed(order(7, 1), key("b")).await.unwrap_err();
    assert!(lost.is_transient(), "{lost}");
    kv.clear_hooks();
    let again = submit_until_answered(&cp, || order(7, 1), "b").await;
    assert!(again.replayed, "the retry is answered from the log");
    assert_eq!(again.plog_offset, first.plog_offset + 1);

    assert_eq!(wlog_len(&cp, 7), 2, "the acknowledged event is in its WLog");
    let id = *again.ids.values().next().expect("a created record");
    let record = cp
        .store()
        .read_record(WsId(7), RecordId(id))
        .expect("read the record");
    assert!(record.is_some(), "the acknowledged record {id} reads back");
}
