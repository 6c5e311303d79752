//! The command processor on the in-memory and the embedded store: numbering, raw-ID
//! resolution, group commit, bad input, sequence violations, and 1 000 partitions in one
//! process.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use monoseq_core::{PLogOffset, WsId, WsKind};
use monoseq_cp::{Command, CommandError, CommandProcessor, Config, ErrorClass};
use monoseq_kv::{FaultyStore, KvStore, MemoryStore, WriteBatch};
use monoseq_store::{
    AppId, CRECORD_ID_SEQUENCE, EventStore, OWRECORD_ID_SEQUENCE, PartitionId, RecordId,
    RecordKind, TrustLevel,
};
use serde_json::json;

/// The PLog's table tag (`docs/format.md`).
const TAG_PLOG: u8 = 0x01;

fn cmd(v: serde_json::Value) -> Command {
    serde_json::from_value(v).unwrap()
}

fn order(ws: u64) -> Command {
    cmd(json!({
        "ws": ws, "ws_kind": 1, "command": "app.CreateOrder",
        "create": [
            {"raw_id": 1, "kind": "CDoc", "name": "app.Order", "fields": {"number": 5, "customer": {"$raw": 2}}},
            {"raw_id": 2, "kind": "WDoc", "name": "app.Customer", "fields": {"name": "Ann"}}
        ],
        "argument": {"raw_id": 3, "name": "app.Arg", "children": [{"raw_id": 4, "name": "app.Line"}]}
    }))
}

type Mem = Arc<MemoryStore>;

fn processor(config: Config) -> (CommandProcessor<Mem>, EventStore<Mem>) {
    let store = EventStore::new(Arc::new(MemoryStore::new()), config.app, config.trust);
    let cp = CommandProcessor::start(store.clone(), config).unwrap();
    (cp, store)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_gets_offsets_and_real_ids_and_is_stored_with_references_resolved() {
    let (cp, store) = processor(Config {
        partitions: 4,
        ..Config::default()
    });
    ready(&cp).await;
    let out = cp.submit(order(7)).await.unwrap();
    assert_eq!(out.partition, 3);
    assert_eq!((out.plog_offset, out.wlog_offset), (1, 1));
    let crec = CRECORD_ID_SEQUENCE.initial.0;
    let owrec = OWRECORD_ID_SEQUENCE.initial.0;
    assert_eq!(
        out.ids.into_iter().collect::<Vec<_>>(),
        vec![(1, crec), (2, owrec), (3, owrec + 1), (4, owrec + 2)]
    );
    let event = store
        .read_event(PartitionId(3), PLogOffset(1))
        .unwrap()
        .unwrap();
    assert_eq!(event.ws, WsId(7));
    let order = store.read_record(WsId(7), RecordId(crec)).unwrap().unwrap();
    let customer = order.fields.iter().find(|f| f.name == "customer").unwrap();
    assert_eq!(customer.value, owrec.to_string().into_bytes());

    // The next command continues every sequence; an update merges fields.
    let upd = cmd(json!({"ws": 7, "ws_kind": 1, "command": "app.Rename",
        "update": [{"id": crec, "fields": {"number": 6}}]}));
    let out = cp.submit(upd).await.unwrap();
    assert_eq!((out.plog_offset, out.wlog_offset), (2, 2));
    let order = store.read_record(WsId(7), RecordId(crec)).unwrap().unwrap();
    assert!(
        order
            .fields
            .iter()
            .any(|f| f.name == "number" && f.value == b"6")
    );
    let out = cp.submit(order_again(7)).await.unwrap();
    assert_eq!(out.ids[&1], crec + 1);
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}

fn order_again(ws: u64) -> Command {
    order(ws)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_reads_its_record_once_and_stores_the_merge_with_the_record_s_kind_and_name() {
    let kv = Arc::new(FaultyStore::new(MemoryStore::new()));
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let config = Config {
        partitions: 1,
        ..Config::default()
    };
    let cp = CommandProcessor::start(store.clone(), config).unwrap();
    ready(&cp).await;
    let crec = cp.submit(order(7)).await.unwrap().ids[&1];
    let block = store.record_key(WsId(7), RecordId(crec)).partition;
    let reads = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&reads);
    kv.on_read(move |partition| {
        if partition == block.as_slice() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let update = cmd(json!({"ws": 7, "ws_kind": 1, "command": "app.Note",
        "create": [{"raw_id": 1, "kind": "WDoc", "name": "app.Note"}],
        "update": [{"id": crec, "fields": {"number": 6, "note": {"$raw": 1}}}]}));
    let out = cp.submit(update).await.unwrap();
    assert_eq!(
        reads.load(Ordering::SeqCst),
        1,
        "the updated record was read more than once"
    );
    kv.clear_hooks();
    let note = out.ids[&1].to_string().into_bytes();
    let stored = store.read_record(WsId(7), RecordId(crec)).unwrap().unwrap();
    let value = |name: &str| {
        let field = stored.fields.iter().find(|f| f.name == name);
        field.map(|f| f.value.clone())
    };
    assert_eq!(value("number"), Some(b"6".to_vec()));
    assert_eq!(value("note"), Some(note.clone()));
    assert!(value("customer").is_some(), "{stored:?}");
    let event = store
        .read_event(PartitionId(0), PLogOffset(out.plog_offset))
        .unwrap()
        .unwrap();
    let updated = &event.updated[0];
    assert_eq!(
        (updated.kind, updated.name.as_str()),
        (RecordKind::CDoc, "app.Order")
    );
    let changed = updated.fields.iter().find(|f| f.name == "note").unwrap();
    assert_eq!(changed.value, note);
    assert!(cp.shutdown(Duration::from_secs(10)).await);
}

/// A processor of one partition over a store that counts the reads of record `id`'s block of
/// workspace 7 (set once the record exists), with `recent_records_bytes`.
struct Counted {
    kv: Arc<FaultyStore<MemoryStore>>,
    store: EventStore<Arc<FaultyStore<MemoryStore>>>,
    cp: CommandProcessor<Arc<FaultyStore<MemoryStore>>>,
    reads: Arc<AtomicU64>,
}

impl Counted {
    async fn start(recent_records_bytes: usize) -> Counted {
        let kv = Arc::new(FaultyStore::new(MemoryStore::new()));
        let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
        let config = Config {
            partitions: 1,
            recent_records_bytes,
            ..Config::default()
        };
        let cp = CommandProcessor::start(store.clone(), config).unwrap();
        ready(&cp).await;
        Counted {
            kv,
            store,
            cp,
            reads: Arc::default(),
        }
    }

    /// Counts the reads of record `id`'s block from now on.
    fn count_reads_of(&self, id: u64) {
        let block = self.store.record_key(WsId(7), RecordId(id)).partition;
        let counted = Arc::clone(&self.reads);
        self.kv.on_read(move |partition| {
            if partition == block.as_slice() {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        });
    }

    /// Sets field `name` of record `id` of workspace 7 to `n`, retrying while the partition
    /// does not serve.
    async fn set(&self, id: u64, name: &str, n: u64) -> Result<(), CommandError> {
        let update = cmd(json!({"ws": 7, "ws_kind": 1, "command": "app.Set",
            "update": [{"id": id, "fields": {name: n}}]}));
        for _ in 0..2000 {
            match self.cp.submit(update.clone()).await {
                Err(e) if e.is_transient() => tokio::time::sleep(Duration::from_millis(5)).await,
                other => return other.map(drop),
            }
        }
        panic!("the partition never served the update again");
    }

    fn field(&self, id: u64, name: &str) -> Option<Vec<u8>> {
        let stored = self
            .store
            .read_record(WsId(7), RecordId(id))
            .unwrap()
            .unwrap();
        let field = stored.fields.iter().find(|f| f.name == name);
        field.map(|f| f.value.clone())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_of_a_record_its_partition_wrote_lately_reads_nothing_and_merges_onto_it() {
    let c = Counted::start(monoseq_cp::RECENT_RECORDS_BYTES_DEFAULT).await;
    let crec = c.cp.submit(order(7)).await.unwrap().ids[&1];
    c.count_reads_of(crec);
    c.set(crec, "number", 6).await.unwrap();
    assert_eq!(
        c.reads.load(Ordering::SeqCst),
        1,
        "the first update reads it"
    );
    c.set(crec, "other", 7).await.unwrap();
    c.set(crec, "number", 8).await.unwrap();
    assert_eq!(
        c.reads.load(Ordering::SeqCst),
        1,
        "an update read a record its partition had just written"
    );
    c.kv.clear_hooks();
    assert_eq!(c.field(crec, "number"), Some(b"8".to_vec()));
    assert_eq!(c.field(crec, "other"), Some(b"7".to_vec()));
    assert!(c.field(crec, "customer").is_some());
    assert!(c.cp.shutdown(Duration::from_secs(10)).await);

    // Without a budget for them, every update reads its record.
    let c = Counted::start(0).await;
    let crec = c.cp.submit(order(7)).await.unwrap().ids[&1];
    c.count_reads_of(crec);
    c.set(crec, "number", 6).await.unwrap();
    c.set(crec, "number", 8).await.unwrap();
    assert_eq!(c.reads.load(Ordering::SeqCst), 2);
    assert!(c.cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_group_write_whose_answer_was_lost_an_update_merges_onto_what_landed() {
    let c = Counted::start(monoseq_cp::RECENT_RECORDS_BYTES_DEFAULT).await;
    let crec = c.cp.submit(order(7)).await.unwrap().ids[&1];
    c.set(crec, "number", 6).await.unwrap();
    // The next group's write lands, but its answer is lost.
    c.kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_PLOG)));
    c.kv.lose_answers_next(1);
    let lost = cmd(json!({"ws": 7, "ws_kind": 1, "command": "app.Set",
        "update": [{"id": crec, "fields": {"lost": 1}}]}));
    let lost = c.cp.submit(lost).await;
    assert!(lost.is_err(), "{lost:?}");
    c.kv.clear_hooks();
    assert_eq!(
        c.field(crec, "lost"),
        Some(b"1".to_vec()),
        "the write landed"
    );
    c.set(crec, "number", 9).await.unwrap();
    assert_eq!(
        c.field(crec, "lost"),
        Some(b"1".to_vec()),
        "the update lost what landed"
    );
    assert_eq!(c.field(crec, "number"), Some(b"9".to_vec()));
    assert!(c.cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_write_whose_answer_was_lost_left_stored_is_acknowledged_without_another_write() {
    let c = Counted::start(monoseq_cp::RECENT_RECORDS_BYTES_DEFAULT).await;
    let first = c.cp.submit(order(7)).await.unwrap().plog_offset;
    assert_eq!(c.cp.plog_end(0), first + 1);
    // The next group's write lands, but its answer is lost.
    c.kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_PLOG)));
    c.kv.lose_answers_next(1);
    assert!(c.cp.submit(order(7)).await.is_err());
    c.kv.clear_hooks();
    assert!(
        c.store
            .read_event(PartitionId(0), PLogOffset(first + 1))
            .unwrap()
            .is_some(),
        "the write landed"
    );
    // No other command: the read-back after the failure acknowledges what it found, so a
    // follower of the partition gets it now, not at the next write.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while c.cp.plog_end(0) < first + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the landed event stayed beyond the partition's end ({})",
            c.cp.plog_end(0)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(c.cp.plog_end(0), first + 2);
    assert!(c.cp.shutdown(Duration::from_secs(10)).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error_and_writes_nothing() {
    let (cp, store) = processor(Config {
        partitions: 1,
        ..Config::default()
    });
    ready(&cp).await;
    let cases = [
        (
            json!({"ws": 1, "ws_kind": 9, "command": "c"}),
            "UnknownWsKind",
        ),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c", "create": [
                {"raw_id": 1, "kind": "CDoc", "name": "a"}, {"raw_id": 1, "kind": "CDoc", "name": "b"}]}),
            "Invalid(",
        ),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c", "create": [
                {"raw_id": 1, "kind": "CDoc", "name": "a", "fields": {"x": {"$raw": 7}}}]}),
            "Invalid(",
        ),
        (
            json!({"ws": 1, "ws_kind": 1, "command": "c", "update": [{"id": 99, "fields": {}}]}),
            "UnknownRecord",
        ),
    ];
    for (c, variant) in cases {
        let err = cp.submit(cmd(c.clone())).await.unwrap_err();
        assert!(format!("{err:?}").starts_with(variant), "{c}: {err:?}");
        assert!(
            matches!(
                err.class(),
                ErrorClass::Invalid | ErrorClass::NotFound | ErrorClass::TooLarge
            ),
            "{err}"
        );
    }
    assert_eq!(
        store.read_event(PartitionId(0), PLogOffset(1)).unwrap(),
        None
    );
    // The next good command still gets offset 1.
    assert_eq!(cp.submit(order(1)).await.unwrap().plog_offset, 1);
}

/// A batch's commands are answered in its order, each as it would be alone; a partition's
/// share that its queue has no room for is refused busy whole and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_answered_in_order_and_a_share_with_no_room_is_refused_busy_whole() {
    let (cp, store) = processor(Config {
        partitions: 2,
        queue_commands_max: 4,
        ..Config::default()
    });
    ready(&cp).await;
    let bad = || cmd(json!({"ws": 2, "ws_kind": 9, "command": "c"}));
    // Five commands for partition 1 (no room for them in its queue of 4), two for partition 0
    // and a refused one between them.
    let batch = vec![
        (order(1), None),
        (order(2), None),
        (bad(), None),
        (order(3), None),
        (order(5), None),
        (order(7), None),
        (order(4), None),
        (order(9), None),
    ];
    let answers = cp.submit_all(batch).await;
    let codes: Vec<String> = answers
        .iter()
        .map(|a| match a {
            Ok(out) => format!("p{}", out.partition),
            Err(CommandError::Busy(_)) => "busy".to_owned(),
            Err(e) => format!("{e:?}").split('(').next().unwrap().to_owned(),
        })
        .collect();
    assert_eq!(
        codes,
        [
            "busy",
            "p0",
            "UnknownWsKind",
            "busy",
            "busy",
            "busy",
            "p0",
            "busy"
        ]
    );
    assert_eq!(
        store.read_event(PartitionId(1), PLogOffset(1)).unwrap(),
        None,
        "the refused share wrote nothing"
    );
    // A share that fits is written, in the batch's order.
    let answers = cp
        .submit_all((0..4).map(|n| (order(2 * n + 1), None)).collect())
        .await;
    let offsets: Vec<u64> = answers
        .into_iter()
        .map(|a| a.unwrap().plog_offset)
        .collect();
    assert_eq!(offsets, [1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_commands_are_group_committed_with_contiguous_offsets() {
    let (cp, _store) = processor(Config {
        partitions: 2,
        ..Config::default()
    });
    ready(&cp).await;
    let mut tasks = Vec::new();
    for i in 0..2_000u64 {
        let cp = cp.clone();
        let ws = i % 50 + 1;
        tasks.push(tokio::spawn(
            async move { (ws, cp.submit(order(ws)).await) },
        ));
    }
    let mut offsets = [Vec::new(), Vec::new()];
    let mut ids = HashSet::new();
    let mut wlogs = HashSet::new();
    for t in tasks {
        let (ws, out) = t.await.unwrap();
        let out = out.unwrap();
        offsets[out.partition as usize].push(out.plog_offset);
        assert!(
            wlogs.insert((ws, out.wlog_offset)),
            "WLog offset handed out twice"
        );
        for (_, id) in out.ids {
            assert!(
                ids.insert((ws, id)),
                "record ID {id} of workspace {ws} handed out twice"
            );
        }
    }
    for o in &mut offsets {
        o.sort();
        assert_eq!(*o, (1..=o.len() as u64).collect::<Vec<_>>());
    }
    let stats = cp.stats();
    assert_eq!(stats.committed, 2_000);
    assert!(
        stats.groups < 2_000,
        "no group commit: {} groups",
        stats.groups
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_partitions_run_in_one_process() {
    let (cp, _store) = processor(Config {
        partitions: 1_000,
        cache_workspaces_max: 100,
        ..Config::default()
    });
    ready(&cp).await;
    let mut tasks = Vec::new();
    for ws in 1..=2_000u64 {
        let cp = cp.clone();
        tasks.push(tokio::spawn(async move { cp.submit(order(ws)).await }));
    }
    for (i, t) in tasks.into_iter().enumerate() {
        let out = t.await.unwrap().unwrap();
        assert_eq!(out.partition, ((i as u64 + 1) % 1_000) as u32);
        assert!(out.plog_offset <= 2);
    }
    assert!(cp.shutdown(Duration::from_secs(30)).await);
}

/// A processor of one partition at level 0 whose workspace `ws` wrote one order, with
/// something already stored at that workspace's next CRecord ID (corrupt storage).
async fn next_crecord_taken(ws: u64) -> (CommandProcessor<Mem>, EventStore<Mem>) {
    let (cp, store) = processor(Config {
        partitions: 1,
        trust: TrustLevel::Level0,
        ..Config::default()
    });
    ready(&cp).await;
    let first = cp.submit(order(ws)).await.unwrap();
    let next = RecordId(first.ids[&1] + 1);
    let key = store.record_key(WsId(ws), next);
    let mut batch = WriteBatch::new();
    batch.put(key.as_key(), b"x");
    store.kv().write(&batch).unwrap();
    (cp, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_record_id_is_a_sequence_violation_naming_the_key_at_level_0() {
    // Corrupt storage: something already sits at the next CRecord ID.
    let (cp, store) = next_crecord_taken(3).await;
    let err = cp.submit(order(3)).await.unwrap_err();
    assert!(matches!(err, CommandError::SequenceViolation(_)), "{err}");
    assert!(err.to_string().contains("sequence violation"), "{err}");
    assert_eq!(err.class(), ErrorClass::Conflict);
    // Nothing of it was written: the PLog still ends at offset 1.
    assert_eq!(
        store.read_event(PartitionId(0), PLogOffset(2)).unwrap(),
        None
    );
    // The partition actualizes (answering busy meanwhile), then another workspace of it is
    // not affected.
    ready(&cp).await;
    let ok = cp.submit(order(4)).await.unwrap();
    assert_eq!(ok.plog_offset, 2);
}

/// A batch's command retried after its group failed because of the next command of its share
/// is written once the partition has actualized: the retrying group does not wait for the
/// rest of a share it took already.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batchs_command_retried_after_its_group_failed_waits_for_nothing_more() {
    // Something already sits at workspace 3's next CRecord ID.
    let (cp, _store) = next_crecord_taken(3).await;
    // Workspace 5's command is marked as followed by workspace 3's, which fails the group.
    let answers = tokio::time::timeout(
        Duration::from_secs(20),
        cp.submit_all(vec![(order(5), None), (order(3), None)]),
    )
    .await
    .expect("both commands are answered without another arriving");
    assert_eq!(answers[0].as_ref().unwrap().plog_offset, 2);
    assert!(
        matches!(answers[1], Err(CommandError::SequenceViolation(_))),
        "{:?}",
        answers[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn level_2_overwrites_a_taken_record_id() {
    let (cp, store) = processor(Config {
        partitions: 1,
        trust: TrustLevel::Level2,
        ..Config::default()
    });
    ready(&cp).await;
    let first = cp.submit(order(3)).await.unwrap();
    let next = RecordId(first.ids[&1] + 1);
    let mut batch = WriteBatch::new();
    batch.put(store.record_key(WsId(3), next).as_key(), b"x");
    store.kv().write(&batch).unwrap();
    let out = cp.submit(order(3)).await.unwrap();
    assert_eq!(out.ids[&1], next.0);
    assert!(store.read_record(WsId(3), next).unwrap().is_some());
}

#[test]
fn invalid_configuration_is_refused() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _g = rt.enter();
    let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
    let err = CommandProcessor::start(
        store.clone(),
        Config {
            partitions: 0,
            ..Config::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("partitions"), "{err}");
    let err = CommandProcessor::start(
        store,
        Config {
            ws_kinds: vec![],
            ..Config::default()
        },
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("sequence"), "{err}");
    let _ = WsKind(1);
    let _: Option<CommandError> = None;
}
