//! The PLog-backed sequence storage: its obligations as the core's `SeqStorage` trait states
//! them, the sequencer running on it unchanged, built-in initial values, the #688 rule, and a
//! restart that replays only the tail after the checkpoint.

mod common;

use std::ops::ControlFlow;
use std::sync::Arc;

use common::{APP, Command, Cp, KIND, PARTITION, WS};
use monoseq_core::{
    Number, NumberKey, PLogOffset, ReplayEnd, SeqId, SeqStorage, SeqValue, Start, WsId, WsKind,
};
use monoseq_kv::{KvStore, MemoryStore};
use monoseq_store::{
    CRECORD_ID_SEQUENCE, Event, EventStore, OWRECORD_ID_SEQUENCE, PLOG_OFFSET_SEQUENCE,
    PartitionId, Record, RecordId, RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE, WLogOffset,
};

fn replay_all<S: SeqStorage>(s: &S, from: PLogOffset) -> Vec<(PLogOffset, WsKind, Vec<SeqValue>)> {
    let mut seen = Vec::new();
    let end = s
        .replay_plog(from, &mut |e| {
            seen.push((e.offset, e.ws_kind, e.values.to_vec()));
            ControlFlow::Continue(())
        })
        .unwrap();
    assert_eq!(end, ReplayEnd::Completed);
    seen
}

fn raw_event(plog: u64, ws: u64, wlog: u64, created: &[(RecordKind, u64)]) -> Event {
    Event {
        plog_offset: PLogOffset(plog),
        ws: WsId(ws),
        ws_kind: KIND,
        wlog_offset: WLogOffset(wlog),
        registered_at_ms: 0,
        command: "app.Cmd".into(),
        argument: None,
        created: created
            .iter()
            .map(|&(kind, id)| Record {
                id: RecordId(id),
                kind,
                name: "app.Doc".into(),
                fields: vec![],
            })
            .collect(),
        updated: vec![],
        idempotency: None,
    }
}

#[test]
fn empty_storage_reads_first_offset_and_zero_numbers() {
    let store = EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0);
    let s = store.seq_storage(PARTITION);
    assert_eq!(s.read_next_plog_offset().unwrap(), PLogOffset::FIRST);
    let mut out = [Number(9); 3];
    s.read_numbers(WS, &[SeqId(2), SeqId(3), SeqId(4)], &mut out)
        .unwrap();
    assert_eq!(out, [Number(0); 3]);
    assert!(replay_all(&s, PLogOffset::FIRST).is_empty());
}

#[test]
fn values_and_checkpoint_read_back_per_workspace_and_partition() {
    let kv = Arc::new(MemoryStore::new());
    let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
    let p0 = store.seq_storage(PartitionId(0));
    let p1 = store.seq_storage(PartitionId(1));
    p0.write_values_and_next_plog_offset(
        &[
            SeqValue::new(WsId(1), SeqId(2), Number(5)),
            SeqValue::new(WsId(1), SeqId(4), Number(322_680_000_131_080)),
            SeqValue::new(WsId(2), SeqId(2), Number(7)),
        ],
        PLogOffset(13),
    )
    .unwrap();
    assert_eq!(p0.read_next_plog_offset().unwrap(), PLogOffset(13));
    assert_eq!(p1.read_next_plog_offset().unwrap(), PLogOffset::FIRST);
    let mut out = [Number(0); 3];
    p0.read_numbers(WsId(1), &[SeqId(4), SeqId(3), SeqId(2)], &mut out)
        .unwrap();
    assert_eq!(out, [Number(322_680_000_131_080), Number(0), Number(5)]);
    // Numbers belong to the workspace, not the partition; another application sees none.
    let mut one = [Number(0)];
    p1.read_numbers(WsId(2), &[SeqId(2)], &mut one).unwrap();
    assert_eq!(one, [Number(7)]);
    let other_app = EventStore::new(Arc::clone(&kv), monoseq_store::AppId(2), TrustLevel::Level0)
        .seq_storage(PartitionId(0));
    other_app
        .read_numbers(WsId(2), &[SeqId(2)], &mut one)
        .unwrap();
    assert_eq!(one, [Number(0)]);
    assert_eq!(
        other_app.read_next_plog_offset().unwrap(),
        PLogOffset::FIRST
    );
}

#[test]
fn replay_passes_each_event_from_the_offset_with_its_numbers() {
    let store = EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0);
    let events: Vec<Event> = (1..=5)
        .map(|i| {
            raw_event(
                i,
                100 + i % 2,
                i.div_ceil(2),
                &[(RecordKind::CRecord, 322_685_000_131_071 + i)],
            )
        })
        .collect();
    store.append(PARTITION, &events).unwrap();
    let s = store.seq_storage(PARTITION);
    let seen = replay_all(&s, PLogOffset(3));
    assert_eq!(seen.len(), 3);
    for ((offset, kind, values), e) in seen.iter().zip(&events[2..]) {
        assert_eq!(*offset, e.plog_offset);
        assert_eq!(*kind, KIND);
        assert_eq!(
            values,
            &vec![
                SeqValue::new(e.ws, WLOG_OFFSET_SEQUENCE.id, Number(e.wlog_offset.0)),
                SeqValue::new(e.ws, CRECORD_ID_SEQUENCE.id, Number(e.created[0].id.0)),
            ]
        );
    }
    assert_eq!(s.replayed_events(), 3);
}

#[test]
fn replay_crosses_log_blocks_and_stops_when_asked() {
    let store = EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level2);
    let n = monoseq_store::LOG_BLOCK_EVENTS * 2 + 10;
    let events: Vec<Event> = (1..=n).map(|i| raw_event(i, 1, i, &[])).collect();
    store.append(PARTITION, &events).unwrap();
    let s = store.seq_storage(PARTITION);
    let seen = replay_all(&s, PLogOffset(5));
    assert_eq!(seen.len() as u64, n - 4);
    assert!(seen.windows(2).all(|w| w[1].0 == w[0].0.next()));
    assert_eq!(seen.last().unwrap().0, PLogOffset(n));

    let mut count = 0;
    let end = s
        .replay_plog(PLogOffset::FIRST, &mut |_| {
            count += 1;
            if count == 5000 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!((end, count), (ReplayEnd::Stopped, 5000));
    // The WLog reads across its blocks the same way.
    let wlog = store.read_wlog(WsId(1), WLogOffset(4000), 200).unwrap();
    assert_eq!(wlog.len(), 200);
    assert_eq!(wlog[199].wlog_offset, WLogOffset(4199));
}

#[test]
fn replay_leaves_out_numbers_below_the_initial_value() {
    // #688: a singleton or an external ID in the PLog never moves a sequence.
    let store = EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0);
    store
        .append(
            PARTITION,
            &[raw_event(
                1,
                1,
                1,
                &[
                    (RecordKind::CDoc, 65_538),
                    (RecordKind::WDoc, 322_679_999_999_999),
                    (RecordKind::CDoc, 322_685_000_131_072),
                ],
            )],
        )
        .unwrap();
    let seen = replay_all(&store.seq_storage(PARTITION), PLogOffset::FIRST);
    assert_eq!(
        seen[0].2,
        vec![
            SeqValue::new(WsId(1), WLOG_OFFSET_SEQUENCE.id, Number(1)),
            SeqValue::new(WsId(1), CRECORD_ID_SEQUENCE.id, Number(322_685_000_131_072)),
        ]
    );
}

#[test]
fn a_damaged_event_in_the_plog_fails_replay_with_a_clear_error() {
    let kv = Arc::new(MemoryStore::new());
    let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
    store
        .append(
            PARTITION,
            &[raw_event(1, 1, 1, &[]), raw_event(2, 1, 2, &[])],
        )
        .unwrap();
    kv.put(
        store.plog_key(PARTITION, PLogOffset(2)).as_key(),
        &[1, 2, 3],
    )
    .unwrap();
    let s = store.seq_storage(PARTITION);
    let mut passed = 0;
    let err = s
        .replay_plog(PLogOffset::FIRST, &mut |_| {
            passed += 1;
            ControlFlow::Continue(())
        })
        .unwrap_err();
    assert_eq!(passed, 1);
    assert!(err.to_string().contains("PLog offset 2"), "{err}");
    assert!(store.read_event(PARTITION, PLogOffset(2)).is_err());
}

#[test]
fn built_in_sequences_start_at_their_initial_values() {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let Start::Began(mut tx) = cp.seq.start(KIND, WS).unwrap() else {
        panic!("busy");
    };
    assert_eq!(tx.plog_offset().0, PLOG_OFFSET_SEQUENCE.initial.0);
    assert_eq!(tx.plog_offset(), PLogOffset(1));
    assert_eq!(tx.next(WLOG_OFFSET_SEQUENCE.id).unwrap(), Number(1));
    assert_eq!(
        tx.next(CRECORD_ID_SEQUENCE.id).unwrap(),
        Number(322_685_000_131_072)
    );
    assert_eq!(
        tx.next(OWRECORD_ID_SEQUENCE.id).unwrap(),
        Number(322_680_000_131_072)
    );
    tx.actualize();
    // Through a whole command: a CDoc, a WDoc and an argument with two children.
    cp.settle();
    let e = cp.run_ok(
        WS,
        &Command {
            creates: vec![RecordKind::CDoc, RecordKind::WDoc],
            argument_children: Some(2),
            updates: vec![],
        },
    );
    assert_eq!(e.plog_offset, PLogOffset(1));
    assert_eq!(e.wlog_offset, WLogOffset(1));
    let arg = e.argument.as_ref().unwrap();
    assert_eq!(arg.id, RecordId(322_680_000_131_072));
    assert_eq!(arg.children[0].id, RecordId(322_680_000_131_073));
    assert_eq!(arg.children[1].id, RecordId(322_680_000_131_074));
    assert_eq!(e.created[0].id, RecordId(322_685_000_131_072));
    assert_eq!(e.created[1].id, RecordId(322_680_000_131_075));
}

#[test]
fn sequencer_runs_on_the_event_store_and_survives_restart() {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let cmd = Command {
        creates: vec![RecordKind::CRecord, RecordKind::ORecord],
        argument_children: Some(1),
        updates: vec![],
    };
    let mut last = None;
    for i in 0..300u64 {
        last = Some(cp.run_ok(WsId(1 + i % 7), &cmd));
        if i % 50 == 0 {
            cp.settle();
        }
    }
    let last = last.unwrap();
    assert_eq!(last.plog_offset, PLogOffset(300));
    drop(cp);

    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let e = cp.run_ok(last.ws, &cmd);
    assert_eq!(e.plog_offset, PLogOffset(301));
    assert_eq!(e.wlog_offset.0, last.wlog_offset.0 + 1);
    // Numbers continue after the last ones used in that workspace.
    assert!(e.created[0].id > last.created[0].id);
    assert!(e.argument.as_ref().unwrap().id > last.created[1].id);
    // Updates use no number and merge into the stored record.
    let target = e.created[0].id;
    let u = cp.run_ok(
        last.ws,
        &Command {
            updates: vec![(
                target,
                RecordKind::CRecord,
                vec![monoseq_store::Field::new("name", br#""y""#.to_vec())],
            )],
            ..Command::default()
        },
    );
    assert_eq!(u.wlog_offset.0, e.wlog_offset.0 + 1);
    let stored = cp.store.read_record(last.ws, target).unwrap().unwrap();
    assert_eq!(stored.fields[0].value, br#""y""#.to_vec());
}

#[test]
fn restart_replays_only_the_events_after_the_checkpoint() {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let cmd = Command::create(RecordKind::CDoc);
    for i in 0..2_000u64 {
        cp.run_ok(WsId(1 + i % 100), &cmd);
        if i % 100 == 99 {
            cp.settle();
        }
    }
    // Let the checkpoint reach offset 2001, then write a tail it does not cover.
    cp.settle();
    assert_eq!(
        cp.storage.read_next_plog_offset().unwrap(),
        PLogOffset(2_001)
    );
    const TAIL: u64 = 37;
    for i in 0..TAIL {
        cp.run_ok(WsId(1 + i % 100), &cmd);
    }
    assert_eq!(
        cp.storage.read_next_plog_offset().unwrap(),
        PLogOffset(2_001)
    );
    drop(cp);

    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    assert_eq!(cp.storage.replayed_events(), TAIL);
    let e = cp.run_ok(WsId(1), &cmd);
    assert_eq!(e.plog_offset, PLogOffset(2_001 + TAIL));
    // And the checkpoint advanced right after actualization.
    cp.settle();
    assert_eq!(
        cp.storage.read_next_plog_offset().unwrap(),
        PLogOffset(2_002 + TAIL)
    );
}

#[test]
fn a_sequence_violation_leads_to_actualization_and_then_numbers_continue() {
    let kv = Arc::new(MemoryStore::new());
    let mut cp = Cp::new(&kv, TrustLevel::Level0);
    let first = cp.run_ok(WS, &Command::create(RecordKind::CDoc));
    cp.settle();
    // Another writer used the next PLog offset behind the sequencer's back (with a real event).
    let foreign = raw_event(2, 77, 1, &[]);
    cp.store.append(PARTITION, &[foreign]).unwrap();
    let err = cp.run(WS, &Command::create(RecordKind::CDoc)).unwrap_err();
    assert!(err.to_string().contains("sequence violation"));
    cp.settle();
    // Actualization read the foreign event: the next command takes offset 3.
    let e = cp.run_ok(WS, &Command::create(RecordKind::CDoc));
    assert_eq!(e.plog_offset, PLogOffset(3));
    assert_eq!(e.wlog_offset, WLogOffset(2));
    assert_eq!(e.created[0].id.0, first.created[0].id.0 + 1);
}

#[test]
fn sequencer_with_background_driver_runs_on_the_event_store() {
    use std::time::Duration;
    let kv = Arc::new(MemoryStore::new());
    let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
    let storage = Arc::new(store.seq_storage(PARTITION));
    let runtime = monoseq_core::Runtime::new(1).unwrap();
    let params = monoseq_store::built_in_params([KIND])
        .batcher_delay(Duration::from_millis(1))
        .build()
        .unwrap();
    let mut seq = monoseq_core::Sequencer::new(params, Arc::clone(&storage), &runtime);
    for i in 1..=50u64 {
        let Start::Began(mut tx) = seq.start_wait(KIND, WS, Duration::from_secs(20)).unwrap()
        else {
            panic!("busy");
        };
        let wlog = tx.next(WLOG_OFFSET_SEQUENCE.id).unwrap();
        let id = tx.next(CRECORD_ID_SEQUENCE.id).unwrap();
        assert_eq!(tx.plog_offset(), PLogOffset(i));
        assert_eq!(wlog, Number(i));
        assert_eq!(id, Number(322_685_000_131_071 + i));
        let e = raw_event(i, WS.0, wlog.0, &[(RecordKind::CDoc, id.0)]);
        store.append(PARTITION, &[e]).unwrap();
        tx.flush();
    }
    let report = seq.shutdown();
    assert!(report.stopped_in_time);
    assert_eq!(report.unflushed_values, 0);
    // Shutdown flushed: the projection covers every event, so a restart replays nothing.
    assert_eq!(storage.read_next_plog_offset().unwrap(), PLogOffset(51));
    let mut out = [Number(0); 2];
    storage
        .read_numbers(
            WS,
            &[WLOG_OFFSET_SEQUENCE.id, CRECORD_ID_SEQUENCE.id],
            &mut out,
        )
        .unwrap();
    assert_eq!(out, [Number(50), Number(322_685_000_131_121)]);
}

#[test]
fn a_damaged_projection_gives_an_error_that_says_how_to_recover() {
    let kv = Arc::new(MemoryStore::new());
    let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
    let s = store.seq_storage(PARTITION);
    s.write_values_and_next_plog_offset(&[SeqValue::new(WS, SeqId(2), Number(3))], PLogOffset(4))
        .unwrap();
    // Overwrite every stored value of the projection with a byte that is no number.
    let mut keys = Vec::new();
    for tag in [4u8, 5] {
        let mut prefix = vec![tag];
        if tag == 4 {
            // Layout 3: `04 app:varint ws_block:varint`, clustering `ws mod 4096:be16 seq:be16`.
            const { assert!(APP.0 < 0x80 && WS.0 < 4096) };
            prefix.extend_from_slice(&[APP.0 as u8, 0]);
            let [a, b] = (WS.0 as u16).to_be_bytes();
            keys.push((prefix, vec![a, b, 0, 2]));
        } else {
            prefix.extend_from_slice(&APP.0.to_be_bytes());
            prefix.extend_from_slice(&PARTITION.0.to_be_bytes());
            keys.push((prefix, Vec::new()));
        }
    }
    for (p, c) in &keys {
        kv.put(monoseq_kv::Key::new(p, c), &[7]).unwrap();
    }
    let err = s.read_next_plog_offset().unwrap_err();
    assert!(err.to_string().contains("checkpoint"), "{err}");
    let mut out = [Number(0)];
    let err = s.read_numbers(WS, &[SeqId(2)], &mut out).unwrap_err();
    assert!(err.to_string().contains("workspace 1001"), "{err}");
    // The range read of many workspaces meets the same damage and says the same.
    let many: Vec<NumberKey> = (WS.0 - 20..WS.0 + 20)
        .map(|ws| NumberKey {
            ws: WsId(ws),
            seq: SeqId(2),
        })
        .collect();
    let mut out = vec![Number(0); many.len()];
    let err = s.read_numbers_many(&many, &mut out).unwrap_err();
    assert!(err.to_string().contains("workspace 1001"), "{err}");
}

#[test]
fn numbers_of_many_workspaces_read_back_as_one_by_one_whether_dense_or_scattered() {
    let store = EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0);
    let s = store.seq_storage(PARTITION);
    // Stored: every third workspace of 0..10 000 (crossing numbers blocks of 4 096), two
    // sequences each, and a few far-away workspaces.
    let mut stored = Vec::new();
    for ws in (0..10_000u64)
        .step_by(3)
        .chain([1 << 40, (1 << 40) + 5, u64::MAX])
    {
        stored.push(SeqValue::new(WsId(ws), SeqId(2), Number(ws ^ 0xff)));
        stored.push(SeqValue::new(WsId(ws), SeqId(4), Number(ws ^ 0xf0f)));
    }
    s.write_values_and_next_plog_offset(&stored, PLogOffset(9))
        .unwrap();
    let dense = (4_000..4_200u64).flat_map(|ws| [2u16, 3, 4].map(|q| (ws, q)));
    let scattered = (0..10_000u64)
        .step_by(997)
        .chain([1 << 40, (1 << 40) + 1, (1 << 40) + 5, u64::MAX])
        .flat_map(|ws| [2u16, 4].map(|q| (ws, q)));
    for keys in [dense.collect::<Vec<_>>(), scattered.collect()] {
        let keys: Vec<NumberKey> = keys
            .into_iter()
            .map(|(ws, q)| NumberKey {
                ws: WsId(ws),
                seq: SeqId(q),
            })
            .collect();
        let mut many = vec![Number(7); keys.len()];
        s.read_numbers_many(&keys, &mut many).unwrap();
        for (key, got) in keys.iter().zip(&many) {
            let mut one = [Number(7)];
            s.read_numbers(key.ws, &[key.seq], &mut one).unwrap();
            assert_eq!(*got, one[0], "{key:?}");
        }
        assert!(many.iter().any(|n| n.0 != 0) && many.iter().any(|n| n.0 == 0));
    }
}
