//! Event store reads and record updates: events by PLog offset, WLog ranges, records by ID,
//! field merging of updates inside and across groups, data written by format version 1, and
//! WLog entries that name their events in the PLog (and the copies written before them).

use std::sync::Arc;

use monoseq_core::{PLogOffset, WsId, WsKind};
use monoseq_kv::{KvStore, MemoryStore};
use monoseq_store::{
    AppId, AppendError, ArgObject, Event, EventStore, Field, PartitionId, ReadError, Record,
    RecordId, RecordKind, Slot, TrustLevel, WLogOffset, WLogRef, event_crc,
};

const P: PartitionId = PartitionId(3);

fn store() -> EventStore<Arc<MemoryStore>> {
    EventStore::new(Arc::new(MemoryStore::new()), AppId(9), TrustLevel::Level0)
}

fn event(plog: u64, ws: u64, wlog: u64) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: WsKind(1),
        wlog_offset: WLogOffset(wlog),
        registered_at_ms: 42,
        command: "app.Cmd".into(),
        argument: None,
        created: vec![],
        updated: vec![],
        idempotency: None,
    }
}

fn record(id: u64, fields: &[(&str, &str)]) -> Record {
    Record {
        id: RecordId(id),
        kind: RecordKind::CDoc,
        name: "app.Doc".into(),
        fields: fields
            .iter()
            .map(|(n, v)| Field::new(*n, v.as_bytes().to_vec()))
            .collect(),
    }
}

#[test]
fn events_read_back_by_plog_offset_and_by_wlog_range() {
    let s = store();
    let events = vec![
        event(1, 10, 1),
        event(2, 20, 1),
        event(3, 10, 2),
        event(4, 10, 3),
    ];
    s.append(P, &events[..2]).unwrap();
    s.append(P, &events[2..]).unwrap();
    for e in &events {
        assert_eq!(s.read_event(P, e.plog_offset).unwrap().as_ref(), Some(e));
    }
    assert_eq!(s.read_event(P, PLogOffset(5)).unwrap(), None);
    assert_eq!(s.read_event(PartitionId(4), PLogOffset(1)).unwrap(), None);
    let wlog = s.read_wlog(WsId(10), WLogOffset(2), 10).unwrap();
    assert_eq!(wlog, vec![events[2].clone(), events[3].clone()]);
    assert_eq!(
        s.read_wlog(WsId(10), WLogOffset(1), 1).unwrap(),
        vec![events[0].clone()]
    );
    assert!(s.read_wlog(WsId(30), WLogOffset(1), 10).unwrap().is_empty());
}

#[test]
fn a_wlog_entry_names_its_event_in_the_plog_instead_of_copying_it() {
    let s = store();
    let mut e = event(7, 10, 1);
    e.created = vec![record(500, &[("body", &"x".repeat(300))])];
    s.append(P, std::slice::from_ref(&e)).unwrap();
    let plog = s.kv().get(s.plog_key(P, PLogOffset(7)).as_key()).unwrap();
    let plog = plog.expect("the PLog holds the event");
    let wlog = s.kv().get(s.wlog_key(WsId(10), WLogOffset(1)).as_key());
    let wlog = wlog.unwrap().expect("the WLog holds an entry");
    assert!(wlog.len() <= 16, "{} bytes: not a reference", wlog.len());
    assert_eq!(
        WLogRef::decode(&wlog).unwrap(),
        WLogRef {
            partition: P,
            plog_offset: PLogOffset(7),
            event_crc: event_crc(&plog).unwrap(),
        }
    );
    assert_eq!(s.read_wlog(WsId(10), WLogOffset(1), 10).unwrap(), vec![e]);
}

#[test]
fn wlog_entries_written_as_copies_before_references_still_read_beside_references() {
    let s = store();
    let events: Vec<Event> = (1..=4).map(|n| event(n, 10, n)).collect();
    s.append(P, &events).unwrap();
    // Entries 2 and 3 as a build before WLog references wrote them: the event's bytes.
    for e in &events[1..3] {
        let bytes = e.encode().unwrap();
        let key = s.wlog_key(e.ws, e.wlog_offset);
        s.kv().put(key.as_key(), &bytes).unwrap();
    }
    assert_eq!(s.read_wlog(WsId(10), WLogOffset(1), 10).unwrap(), events);
    assert_eq!(
        s.read_wlog(WsId(10), WLogOffset(3), 1).unwrap(),
        vec![events[2].clone()]
    );
}

#[test]
fn a_wlog_entry_naming_a_missing_or_different_plog_event_is_an_error_not_a_wrong_event() {
    let s = store();
    let events: Vec<Event> = (1..=3).map(|n| event(n, 10, n)).collect();
    s.append(P, &events).unwrap();
    let dangling = |s: &EventStore<Arc<MemoryStore>>| match s.read_wlog(WsId(10), WLogOffset(1), 10)
    {
        Err(ReadError::Dangling {
            slot,
            target,
            found,
        }) => {
            assert_eq!(
                slot,
                Slot::WLog {
                    ws: WsId(10),
                    offset: WLogOffset(2)
                }
            );
            assert_eq!(
                target,
                Slot::PLog {
                    partition: P,
                    offset: PLogOffset(2)
                }
            );
            found
        }
        other => panic!("expected a dangling entry, got {other:?}"),
    };
    let at_2 = s.plog_key(P, PLogOffset(2));
    // Another event, with its own checksum, where the entry's event was.
    let mut other = event(2, 10, 2);
    other.registered_at_ms = 43;
    s.kv().put(at_2.as_key(), &other.encode().unwrap()).unwrap();
    assert!(dangling(&s).contains("checksum differs"));
    // No event there at all.
    s.kv().delete(at_2.as_key()).unwrap();
    assert_eq!(dangling(&s), "no event");
    let message = s
        .read_wlog(WsId(10), WLogOffset(1), 10)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("WLog offset 2 of workspace 10 refers to PLog offset 2 of partition 3"),
        "{message}"
    );
}

#[test]
fn updates_merge_fields_into_the_stored_record() {
    let s = store();
    let mut e1 = event(1, 10, 1);
    e1.created = vec![record(500, &[("a", "1"), ("b", "2")])];
    s.append(P, &[e1]).unwrap();
    let mut e2 = event(2, 10, 2);
    e2.updated = vec![record(500, &[("b", "20"), ("c", "30")])];
    s.append(P, &[e2.clone()]).unwrap();
    assert_eq!(
        s.read_record(WsId(10), RecordId(500)).unwrap(),
        Some(record(500, &[("a", "1"), ("b", "20"), ("c", "30")]))
    );
    // The event keeps the update as written (only the changed fields).
    assert_eq!(s.read_event(P, PLogOffset(2)).unwrap(), Some(e2));
}

#[test]
fn a_record_created_and_updated_in_one_group_ends_merged() {
    let s = store();
    let mut e1 = event(1, 10, 1);
    e1.created = vec![record(7, &[("a", "1")])];
    let mut e2 = event(2, 10, 2);
    e2.updated = vec![record(7, &[("a", "2")])];
    let mut e3 = event(3, 10, 3);
    e3.updated = vec![record(7, &[("z", "9")])];
    s.append(P, &[e1, e2, e3]).unwrap();
    assert_eq!(
        s.read_record(WsId(10), RecordId(7)).unwrap(),
        Some(record(7, &[("a", "2"), ("z", "9")]))
    );
}

#[test]
fn updating_an_unknown_record_writes_nothing() {
    let s = store();
    let mut e = event(1, 10, 1);
    e.updated = vec![record(404, &[("a", "1")])];
    let err = s.append(P, &[e]).unwrap_err();
    assert!(
        matches!(
            err,
            AppendError::UnknownRecord {
                event_index: 0,
                id: RecordId(404),
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("create the record first"));
    assert_eq!(s.read_event(P, PLogOffset(1)).unwrap(), None);
}

#[test]
fn an_invalid_argument_is_refused_before_anything_is_written() {
    let s = store();
    let mut e = event(1, 10, 1);
    e.argument = Some(ArgObject {
        id: RecordId(1),
        kind: RecordKind::CDoc,
        name: "app.Bad".into(),
        fields: vec![],
        children: vec![],
    });
    let err = s.append(P, &[event(2, 11, 1), e]).unwrap_err();
    assert!(
        matches!(err, AppendError::Encode { event_index: 1, .. }),
        "{err}"
    );
    assert_eq!(s.read_event(P, PLogOffset(2)).unwrap(), None);
}

#[test]
fn an_oversized_event_is_refused_with_its_index() {
    let s = store();
    let mut e = event(1, 10, 1);
    e.created = vec![record(1, &[])];
    e.created[0].fields = vec![Field::new(
        "blob",
        vec![0u8; monoseq_kv::limits::VALUE_BYTES_MAX],
    )];
    let err = s.append(P, &[e]).unwrap_err();
    assert!(
        matches!(
            err,
            AppendError::Encode { event_index: 0, .. }
                | AppendError::TooLarge { event_index: 0, .. }
        ),
        "{err}"
    );
}

#[test]
fn a_misplaced_event_is_reported() {
    let kv = Arc::new(MemoryStore::new());
    let s = EventStore::new(Arc::clone(&kv), AppId(9), TrustLevel::Level0);
    let bytes = event(5, 10, 1).encode().unwrap();
    kv.put(s.plog_key(P, PLogOffset(1)).as_key(), &bytes)
        .unwrap();
    let err = s.read_event(P, PLogOffset(1)).unwrap_err();
    assert!(err.to_string().contains("offset 5"), "{err}");
}

/// An event written by format version 1, kept as bytes: every later version must still read it.
const EVENT_V1: &str = include_str!("fixtures/event_v1.hex");

fn fixture_event() -> Event {
    Event {
        plog_offset: PLogOffset(42),
        ws: WsId(140_737_488_355_328),
        ws_kind: WsKind(7),
        wlog_offset: WLogOffset(9),
        registered_at_ms: 1_767_225_600_000,
        command: "app.MakeOrder".into(),
        argument: Some(ArgObject {
            id: RecordId(322_680_000_131_072),
            kind: RecordKind::ODoc,
            name: "app.Order".into(),
            fields: vec![Field::new("customer", br#""Ann""#.to_vec())],
            children: vec![ArgObject {
                id: RecordId(322_680_000_131_073),
                kind: RecordKind::ORecord,
                name: "app.Line".into(),
                fields: vec![Field::new("qty", b"2".to_vec())],
                children: vec![],
            }],
        }),
        created: vec![Record {
            id: RecordId(322_685_000_131_072),
            kind: RecordKind::CDoc,
            name: "app.Customer".into(),
            fields: vec![Field::new("name", br#""Ann""#.to_vec())],
        }],
        updated: vec![Record {
            id: RecordId(322_680_000_131_000),
            kind: RecordKind::WDoc,
            name: "app.Stock".into(),
            fields: vec![Field::new("left", b"3".to_vec())],
        }],
        idempotency: None,
    }
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn an_event_written_by_format_version_1_still_decodes() {
    let bytes = unhex(EVENT_V1);
    assert_eq!(Event::decode(&bytes).unwrap(), fixture_event());
    assert_eq!(
        fixture_event().encode().unwrap(),
        bytes,
        "version 1 encoding changed"
    );
}

#[test]
fn offset_zero_is_refused() {
    let s = store();
    let err = s.append(P, &[event(0, 10, 1)]).unwrap_err();
    assert!(err.to_string().contains("PLog offset 0"), "{err}");
    let err = s
        .append(P, &[event(1, 10, 1), event(2, 10, 0)])
        .unwrap_err();
    assert!(
        matches!(err, AppendError::ZeroOffset { event_index: 1, .. }),
        "{err}"
    );
    assert_eq!(s.read_event(P, PLogOffset(1)).unwrap(), None);
}

#[test]
fn wlog_reads_and_plog_walks_cross_blocks_and_stop_at_the_end() {
    let s = store();
    let n = monoseq_store::LOG_BLOCK_EVENTS * 2 + 10;
    let events: Vec<Event> = (1..=n).map(|i| event(i, 7, i)).collect();
    for chunk in events.chunks(1_000) {
        s.append(P, chunk).unwrap();
    }
    let all = s.read_wlog(WsId(7), WLogOffset(1), usize::MAX).unwrap();
    assert_eq!(all.len() as u64, n);
    assert!(all.iter().zip(1..).all(|(e, i)| e.wlog_offset.0 == i));
    let mid = s.read_wlog(WsId(7), WLogOffset(4_090), 20).unwrap();
    let offsets: Vec<u64> = mid.iter().map(|e| e.wlog_offset.0).collect();
    assert_eq!(offsets, (4_090..4_110).collect::<Vec<_>>());
    let mut walked = Vec::new();
    s.for_each_event(P, PLogOffset(4_000), PLogOffset(n + 100), &mut |e| {
        walked.push(e.plog_offset.0)
    })
    .unwrap();
    assert_eq!(walked, (4_000..=n).collect::<Vec<_>>());
    walked.clear();
    s.for_each_event(P, PLogOffset(10), PLogOffset(12), &mut |e| {
        walked.push(e.plog_offset.0)
    })
    .unwrap();
    assert_eq!(walked, vec![10, 11], "the walk ends before `to`");
}

#[test]
fn reads_from_the_end_of_the_number_space_answer_nothing_and_never_panic() {
    let s = store();
    let p = PartitionId(0);
    s.append(p, &[event(1, 7, 1), event(2, 7, 2)]).unwrap();
    for from in [u64::MAX, u64::MAX - 1, u64::MAX - 70_000, 1 << 63] {
        assert!(
            s.read_wlog(WsId(7), WLogOffset(from), 100)
                .unwrap()
                .is_empty(),
            "WLog from {from}"
        );
        let mut seen = 0;
        s.for_each_event(p, PLogOffset(from), PLogOffset(u64::MAX), &mut |_| {
            seen += 1
        })
        .unwrap();
        assert_eq!(seen, 0, "PLog from {from}");
    }
    assert_eq!(s.read_wlog(WsId(7), WLogOffset(1), 100).unwrap().len(), 2);
}
