//! Trust levels, as the reference design's integration tests: corrupt the storage with a
//! conflicting key at the next record ID, the next PLog offset or the next WLog offset, write an
//! event, and check what is detected and what is overwritten.

mod common;

use std::sync::Arc;

use common::{Command, Cp, KIND, PARTITION, WS};
use monoseq_core::{PLogOffset, WsId};
use monoseq_kv::{KeyBuf, KvStore, MemoryStore};
use monoseq_store::{AppendError, Event, RecordId, RecordKind, Slot, TrustLevel, WLogOffset};

const JUNK: &[u8] = &[1];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    RecordId,
    PLogOffset,
    WLogOffset,
}

struct Outcome {
    result: Result<Event, AppendError>,
    /// The key the test corrupted, and what it holds after the write.
    corrupted: KeyBuf,
    after: Vec<u8>,
    /// Whether the event reached the PLog and the WLog, and the record the table.
    in_plog: bool,
    in_wlog: bool,
    record_written: bool,
    next: (PLogOffset, WLogOffset, RecordId),
}

/// Creates one CDoc, corrupts the key the next CDoc-creating command will use, runs that
/// command, and reports what happened.
fn corrupt_then_write(trust: TrustLevel, target: Target) -> Outcome {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, trust);
    let first = cp.run_ok(WS, &Command::create(RecordKind::CDoc));
    cp.settle();
    let next_plog = first.plog_offset.next();
    let next_wlog = WLogOffset(first.wlog_offset.0 + 1);
    let next_id = RecordId(first.created[0].id.0 + 1);
    let corrupted = match target {
        Target::RecordId => cp.store.record_key(WS, next_id),
        Target::PLogOffset => cp.store.plog_key(PARTITION, next_plog),
        Target::WLogOffset => cp.store.wlog_key(WS, next_wlog),
    };
    kv.put(corrupted.as_key(), JUNK).unwrap();

    let result = cp.run(WS, &Command::create(RecordKind::CDoc));
    if let Ok(e) = &result {
        assert_eq!(
            (e.plog_offset, e.wlog_offset, e.created[0].id),
            (next_plog, next_wlog, next_id),
            "the command used the corrupted numbers"
        );
    }
    let after = kv.get(corrupted.as_key()).unwrap().unwrap();
    let in_plog = target != Target::PLogOffset
        && cp.store.read_event(PARTITION, next_plog).unwrap().is_some();
    let in_wlog =
        target != Target::WLogOffset && !cp.store.read_wlog(WS, next_wlog, 1).unwrap().is_empty();
    let record_written =
        target != Target::RecordId && cp.store.read_record(WS, next_id).unwrap().is_some();
    Outcome {
        result,
        corrupted,
        after,
        in_plog,
        in_wlog,
        record_written,
        next: (next_plog, next_wlog, next_id),
    }
}

fn assert_violation(o: &Outcome, expected: Slot) {
    match &o.result {
        Err(AppendError::SequenceViolation {
            event_index,
            slot,
            key,
        }) => {
            assert_eq!(*event_index, 0);
            assert_eq!(*slot, expected);
            assert_eq!(key, &o.corrupted);
        }
        other => panic!("expected a sequence violation at {expected}, got {other:?}"),
    }
    let message = o.result.as_ref().unwrap_err().to_string();
    assert!(message.contains("sequence violation"), "{message}");
    assert!(message.contains(&expected.to_string()), "{message}");
    assert_eq!(o.after, JUNK, "the corrupted key was overwritten");
    assert!(!o.in_plog, "the event reached the PLog");
    assert!(!o.in_wlog, "the event reached the WLog");
    assert!(!o.record_written, "the record was written");
}

fn assert_overwritten(o: &Outcome) {
    let event = o.result.as_ref().expect("no conflict is detected");
    assert_ne!(o.after, JUNK, "the corrupted key was not overwritten");
    assert_eq!(
        (event.plog_offset, event.wlog_offset, event.created[0].id),
        o.next
    );
}

#[test]
fn level0_conflict_on_next_record_id_overwrites_nothing() {
    let o = corrupt_then_write(TrustLevel::Level0, Target::RecordId);
    let (_, _, id) = o.next;
    assert_violation(&o, Slot::Record { ws: WS, id });
}

#[test]
fn level0_conflict_on_next_plog_offset_overwrites_nothing() {
    let o = corrupt_then_write(TrustLevel::Level0, Target::PLogOffset);
    let (offset, _, _) = o.next;
    assert_violation(
        &o,
        Slot::PLog {
            partition: PARTITION,
            offset,
        },
    );
}

#[test]
fn level0_conflict_on_next_wlog_offset_overwrites_nothing() {
    let o = corrupt_then_write(TrustLevel::Level0, Target::WLogOffset);
    let (_, offset, _) = o.next;
    assert_violation(&o, Slot::WLog { ws: WS, offset });
}

#[test]
fn level1_conflict_on_next_record_id_is_overwritten() {
    let o = corrupt_then_write(TrustLevel::Level1, Target::RecordId);
    assert_overwritten(&o);
}

#[test]
fn level1_conflict_on_next_plog_offset_overwrites_nothing() {
    let o = corrupt_then_write(TrustLevel::Level1, Target::PLogOffset);
    let (offset, _, _) = o.next;
    assert_violation(
        &o,
        Slot::PLog {
            partition: PARTITION,
            offset,
        },
    );
}

#[test]
fn level1_conflict_on_next_wlog_offset_overwrites_nothing() {
    let o = corrupt_then_write(TrustLevel::Level1, Target::WLogOffset);
    let (_, offset, _) = o.next;
    assert_violation(&o, Slot::WLog { ws: WS, offset });
}

#[test]
fn level2_conflict_on_next_record_id_is_overwritten() {
    assert_overwritten(&corrupt_then_write(TrustLevel::Level2, Target::RecordId));
}

#[test]
fn level2_conflict_on_next_plog_offset_is_overwritten() {
    assert_overwritten(&corrupt_then_write(TrustLevel::Level2, Target::PLogOffset));
}

#[test]
fn level2_conflict_on_next_wlog_offset_is_overwritten() {
    assert_overwritten(&corrupt_then_write(TrustLevel::Level2, Target::WLogOffset));
}

#[test]
fn level0_conflict_in_a_group_writes_no_event_of_the_group() {
    let kv = Arc::new(MemoryStore::new());
    let cp = Cp::new(&kv, TrustLevel::Level0);
    let event = |plog: u64, ws: u64, id: u64| Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: KIND,
        wlog_offset: WLogOffset(1),
        registered_at_ms: 0,
        command: "app.Cmd".into(),
        argument: None,
        created: vec![monoseq_store::Record {
            id: RecordId(id),
            kind: RecordKind::CDoc,
            name: "app.Doc".into(),
            fields: vec![],
        }],
        updated: vec![],
        idempotency: None,
    };
    let taken = cp.store.record_key(WsId(3), RecordId(322_685_000_131_072));
    kv.put(taken.as_key(), JUNK).unwrap();
    let group = [
        event(1, 1, 322_685_000_131_072),
        event(2, 2, 322_685_000_131_072),
        event(3, 3, 322_685_000_131_072),
    ];
    let err = cp.store.append(PARTITION, &group).unwrap_err();
    assert!(
        matches!(err, AppendError::SequenceViolation { event_index: 2, .. }),
        "{err}"
    );
    for (i, e) in group.iter().enumerate() {
        assert!(
            cp.store
                .read_event(PARTITION, e.plog_offset)
                .unwrap()
                .is_none(),
            "event {i} reached the PLog"
        );
        assert!(
            cp.store
                .read_wlog(e.ws, WLogOffset(1), 10)
                .unwrap()
                .is_empty()
        );
        if e.ws != WsId(3) {
            assert!(
                cp.store
                    .read_record(e.ws, e.created[0].id)
                    .unwrap()
                    .is_none()
            );
        }
    }
    assert_eq!(kv.get(taken.as_key()).unwrap().unwrap(), JUNK);
    // Without the conflict the same group is written whole.
    kv.delete(taken.as_key()).unwrap();
    cp.store.append(PARTITION, &group).unwrap();
    for e in &group {
        assert_eq!(
            cp.store
                .read_event(PARTITION, e.plog_offset)
                .unwrap()
                .as_ref(),
            Some(e)
        );
    }
}

#[test]
fn a_record_created_twice_in_one_group_is_a_violation_at_level0_only() {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let e = cp.run_ok(WS, &Command::create(RecordKind::WDoc));
    let mut twin = e.clone();
    twin.plog_offset = e.plog_offset.next();
    twin.wlog_offset = WLogOffset(e.wlog_offset.0 + 1);
    let err = cp.store.append(PARTITION, &[twin.clone()]).unwrap_err();
    assert!(matches!(
        err,
        AppendError::SequenceViolation {
            slot: Slot::Record { .. },
            ..
        }
    ));
    let level1 = monoseq_store::EventStore::new(Arc::clone(&kv), common::APP, TrustLevel::Level1);
    level1.append(PARTITION, &[twin]).unwrap();
}
