//! Trust levels, as the reference design's integration tests: corrupt the storage with a
//! conflicting key at the next record ID, the next PLog offset or the next WLog offset, write an
//! event, and check what is detected and what is overwritten. Each check runs with the PLog in
//! the key-value store and in segment files, where a PLog offset is never written twice.

mod common;

use std::sync::Arc;

use common::{APP, Command, Cp, KIND, Kv, PARTITION, WS};
use monoseq_core::{PLogOffset, WsId};
use monoseq_kv::{KeyBuf, KvStore, MemoryStore};
use monoseq_store::{
    AppendError, Event, EventStore, RecordId, RecordKind, Segments, Slot, TrustLevel, WLogOffset,
};

/// Where the PLog is kept: in the key-value store, or in segment files (key layout 4).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Kv,
    Segments,
}

/// The PLog's place for one test: segment files in a temporary directory, or none.
struct Place {
    segments: Option<Arc<Segments>>,
    _dir: Option<tempfile::TempDir>,
}

impl Place {
    fn new(layout: Layout) -> Place {
        match layout {
            Layout::Kv => Place {
                segments: None,
                _dir: None,
            },
            Layout::Segments => {
                let dir = tempfile::tempdir().unwrap();
                let segments = Segments::open(dir.path(), 1, &|_| 1).unwrap();
                Place {
                    segments: Some(Arc::new(segments)),
                    _dir: Some(dir),
                }
            }
        }
    }

    fn store(&self, kv: &Kv, trust: TrustLevel) -> EventStore<Kv> {
        match &self.segments {
            None => EventStore::new(Arc::clone(kv), APP, trust),
            Some(s) => EventStore::with_segments(Arc::clone(kv), APP, trust, Arc::clone(s)),
        }
    }
}

const JUNK: &[u8] = &[1];

#[derive(Clone, Copy, Debug, PartialEq)]
enum Target {
    RecordId,
    PLogOffset,
    WLogOffset,
}

struct Outcome {
    layout: Layout,
    result: Result<Event, AppendError>,
    /// The key the test corrupted, and what it holds after the write.
    corrupted: KeyBuf,
    after: Vec<u8>,
    /// Whether the event reached the PLog and the WLog, and the record the table.
    in_plog: bool,
    in_wlog: bool,
    record_written: bool,
    next: (PLogOffset, WLogOffset, RecordId),
    /// The end of the PLog's segment files before and after the write.
    log_ends: Option<(u64, u64)>,
    _place: Place,
}

/// Creates one CDoc, corrupts the key the next CDoc-creating command will use (in segment
/// files, the next PLog offset is taken by a retired frame), runs that command, and reports
/// what happened.
fn corrupt_then_write(layout: Layout, trust: TrustLevel, target: Target) -> Outcome {
    let kv = Arc::new(MemoryStore::new());
    let place = Place::new(layout);
    let mut cp = Cp::on(place.store(&kv, trust));
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
    let end = |s: &Arc<Segments>| s.end(PARTITION).unwrap();
    match &place.segments {
        Some(s) if target == Target::PLogOffset => s.retire_to(PARTITION, next_plog.0).unwrap(),
        _ => kv.put(corrupted.as_key(), JUNK).unwrap(),
    }
    let log_end = place.segments.as_ref().map(end);

    let result = cp.run(WS, &Command::create(RecordKind::CDoc));
    if let Ok(e) = &result {
        assert_eq!(
            (e.plog_offset, e.wlog_offset, e.created[0].id),
            (next_plog, next_wlog, next_id),
            "the command used the corrupted numbers"
        );
    }
    let after = kv.get(corrupted.as_key()).unwrap().unwrap_or_default();
    let in_plog = target != Target::PLogOffset
        && cp.store.read_event(PARTITION, next_plog).unwrap().is_some();
    let in_wlog =
        target != Target::WLogOffset && !cp.store.read_wlog(WS, next_wlog, 1).unwrap().is_empty();
    let record_written =
        target != Target::RecordId && cp.store.read_record(WS, next_id).unwrap().is_some();
    Outcome {
        layout,
        result,
        corrupted,
        after,
        in_plog,
        in_wlog,
        record_written,
        next: (next_plog, next_wlog, next_id),
        log_ends: log_end.zip(place.segments.as_ref().map(end)),
        _place: place,
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
    if let Some((before, after)) = o.log_ends {
        assert_eq!(before, after, "the event reached the segment log");
    }
    assert!(!o.in_wlog, "the event reached the WLog");
    assert!(!o.record_written, "the record was written");
}

fn assert_overwritten(o: &Outcome) {
    let event = o.result.as_ref().expect("no conflict is detected");
    assert_ne!(o.after, JUNK, "the corrupted key was not overwritten");
    if let Some((before, after)) = o.log_ends {
        assert_eq!(after, before + 1, "the event is in the segment log");
    }
    assert_eq!(
        (event.plog_offset, event.wlog_offset, event.created[0].id),
        o.next
    );
}

/// In segment files a PLog offset is taken once: an event at an offset the log holds is
/// refused at every trust level, and nothing of it is written.
fn assert_log_refuses_a_taken_offset(o: &Outcome) {
    let (offset, _, _) = o.next;
    match &o.result {
        Err(AppendError::NotAtEnd {
            event_index: 0,
            offset: at,
            end,
        }) => assert_eq!((*at, *end), (offset.0, offset.0 + 1)),
        other => panic!("expected the event refused as not at the log's end, got {other:?}"),
    }
    assert_eq!(o.log_ends, Some((offset.0 + 1, offset.0 + 1)));
    assert!(!o.in_wlog, "the event reached the WLog");
    assert!(!o.record_written, "the record was written");
}

/// The PLog target of `o`: a sequence violation in the key-value store at levels 0 and 1
/// (overwritten at level 2), refused in segment files at every level.
fn assert_plog_conflict(o: &Outcome, trust: TrustLevel) {
    let (offset, _, _) = o.next;
    match (o.layout, trust) {
        (Layout::Segments, _) => assert_log_refuses_a_taken_offset(o),
        (Layout::Kv, TrustLevel::Level2) => assert_overwritten(o),
        (Layout::Kv, _) => assert_violation(
            o,
            Slot::PLog {
                partition: PARTITION,
                offset,
            },
        ),
    }
}

/// The checks of every trust level, on the PLog kept as `$layout` says.
macro_rules! trust_level_tests {
    ($layout:expr) => {
        use super::*;

        #[test]
        fn level0_conflict_on_next_record_id_overwrites_nothing() {
            let o = corrupt_then_write($layout, TrustLevel::Level0, Target::RecordId);
            let (_, _, id) = o.next;
            assert_violation(&o, Slot::Record { ws: WS, id });
        }

        #[test]
        fn level0_conflict_on_next_plog_offset_overwrites_nothing() {
            let o = corrupt_then_write($layout, TrustLevel::Level0, Target::PLogOffset);
            assert_plog_conflict(&o, TrustLevel::Level0);
        }

        #[test]
        fn level0_conflict_on_next_wlog_offset_overwrites_nothing() {
            let o = corrupt_then_write($layout, TrustLevel::Level0, Target::WLogOffset);
            let (_, offset, _) = o.next;
            assert_violation(&o, Slot::WLog { ws: WS, offset });
        }

        #[test]
        fn level1_conflict_on_next_record_id_is_overwritten() {
            let o = corrupt_then_write($layout, TrustLevel::Level1, Target::RecordId);
            assert_overwritten(&o);
        }

        #[test]
        fn level1_conflict_on_next_plog_offset_overwrites_nothing() {
            let o = corrupt_then_write($layout, TrustLevel::Level1, Target::PLogOffset);
            assert_plog_conflict(&o, TrustLevel::Level1);
        }

        #[test]
        fn level1_conflict_on_next_wlog_offset_overwrites_nothing() {
            let o = corrupt_then_write($layout, TrustLevel::Level1, Target::WLogOffset);
            let (_, offset, _) = o.next;
            assert_violation(&o, Slot::WLog { ws: WS, offset });
        }

        #[test]
        fn level2_conflict_on_next_record_id_is_overwritten() {
            let o = corrupt_then_write($layout, TrustLevel::Level2, Target::RecordId);
            assert_overwritten(&o);
        }

        #[test]
        fn level2_conflict_on_next_plog_offset_is_overwritten_in_the_kv_only() {
            let o = corrupt_then_write($layout, TrustLevel::Level2, Target::PLogOffset);
            assert_plog_conflict(&o, TrustLevel::Level2);
        }

        #[test]
        fn level2_conflict_on_next_wlog_offset_is_overwritten() {
            let o = corrupt_then_write($layout, TrustLevel::Level2, Target::WLogOffset);
            assert_overwritten(&o);
        }

        #[test]
        fn level0_conflict_in_a_group_writes_no_event_of_the_group() {
            conflict_in_a_group_writes_no_event_of_the_group($layout);
        }

        #[test]
        fn a_record_created_twice_in_one_group_is_a_violation_at_level0_only() {
            record_created_twice_is_a_violation_at_level0_only($layout);
        }
    };
}

mod plog_in_the_kv {
    trust_level_tests!(Layout::Kv);
}

mod plog_in_segment_files {
    trust_level_tests!(Layout::Segments);
}

fn conflict_in_a_group_writes_no_event_of_the_group(layout: Layout) {
    let kv = Arc::new(MemoryStore::new());
    let place = Place::new(layout);
    let cp = Cp::on(place.store(&kv, TrustLevel::Level0));
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
    if let Some(segments) = &place.segments {
        assert_eq!(
            segments.end(PARTITION).unwrap(),
            1,
            "the group reached the log"
        );
    }
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

fn record_created_twice_is_a_violation_at_level0_only(layout: Layout) {
    let kv = Arc::new(MemoryStore::new());
    let place = Place::new(layout);
    let mut cp = Cp::on(place.store(&kv, TrustLevel::Level0));
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
    let level1 = place.store(&kv, TrustLevel::Level1);
    level1.append(PARTITION, &[twin]).unwrap();
}
