//! The reference design's test plan and edge cases (docs/invariants.md) as plain functions, so the
//! seed plan runs them once each and the stress test runs them in a loop on several threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use super::*;
use monoseq_core::mem::{MemSeqStorage, Op};
use monoseq_core::{
    Busy, Number, NumberKey, PLogOffset, SeqValue, Start, Status, StorageError, WsId,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn key(ws: u64, seq: monoseq_core::SeqId) -> NumberKey {
    NumberKey { ws: WsId(ws), seq }
}

pub fn basic_usage_continues_after_the_plog_and_persists_on_flush() {
    let storage = MemSeqStorage::new();
    storage
        .append_event(
            PLogOffset(42),
            KIND,
            &[SeqValue::new(WsId(7), WLOG, Number(13))],
        )
        .unwrap();
    let mut seq = new_seq(params(), &storage);
    let mut tx = begin(&mut seq, KIND, WsId(7));
    assert_eq!(tx.plog_offset(), PLogOffset(43));
    assert_eq!(tx.next(WLOG).unwrap(), Number(14));
    storage
        .append_event(
            PLogOffset(43),
            KIND,
            &[SeqValue::new(WsId(7), WLOG, Number(14))],
        )
        .unwrap();
    tx.flush();
    wait_until("the flusher persisted offset 44 and number 14", || {
        storage.checkpoint() == Some(PLogOffset(44)) && storage.number(key(7, WLOG)) == Number(14)
    });
    assert!(seq.shutdown().stopped_in_time);
}

pub fn actualization_after_an_error_hands_out_the_same_offset_and_numbers_again() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let (offset, numbers) = {
        let mut tx = begin(&mut seq, KIND, WsId(1));
        let numbers = [
            tx.next(WLOG).unwrap(),
            tx.next(CREC).unwrap(),
            tx.next(CREC).unwrap(),
        ];
        let offset = tx.plog_offset();
        // The event write failed: nothing reached the PLog.
        tx.actualize();
        (offset, numbers)
    };
    assert_eq!(offset, PLogOffset(1));
    assert_eq!(
        numbers,
        [Number(1), CREC_INITIAL, Number(CREC_INITIAL.0 + 1)]
    );
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        storage.number(key(1, CREC)),
        Number(0),
        "rolled-back numbers reached storage"
    );

    let mut tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.plog_offset(), offset);
    assert_eq!(
        [
            tx.next(WLOG).unwrap(),
            tx.next(CREC).unwrap(),
            tx.next(CREC).unwrap()
        ],
        numbers
    );
    tx.flush();
    seq.shutdown();
}

pub fn dropping_an_unfinished_transaction_actualizes() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    {
        let mut tx = begin(&mut seq, KIND, WsId(5));
        assert_eq!(tx.next(OWREC).unwrap(), OWREC_INITIAL);
    }
    assert!(matches!(seq.status(), Status::Actualizing | Status::Ready));
    let mut tx = begin(&mut seq, KIND, WsId(5));
    assert_eq!(tx.plog_offset(), PLogOffset(1));
    assert_eq!(tx.next(OWREC).unwrap(), OWREC_INITIAL);
    tx.flush();
}

pub fn an_event_written_despite_a_reported_error_is_found_by_actualization() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let mut tx = begin(&mut seq, KIND, WsId(1));
    let n = tx.next(CREC).unwrap();
    // The write landed but the caller saw an error (timeout): it actualizes.
    storage
        .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(1), CREC, n)])
        .unwrap();
    tx.actualize();
    let mut tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.plog_offset(), PLogOffset(2));
    assert_eq!(tx.next(CREC).unwrap(), Number(n.0 + 1));
    tx.flush();
}

pub fn several_storages_with_workspaces_and_kinds_continue_where_their_plog_ends() {
    // Empty storage.
    let empty = MemSeqStorage::new();
    let mut seq = new_seq(params(), &empty);
    let mut tx = begin(&mut seq, KIND2, WsId(9));
    assert_eq!(tx.plog_offset(), PLogOffset(1));
    assert_eq!(tx.next(WLOG).unwrap(), Number(1));
    assert_eq!(tx.next(OWREC).unwrap(), OWREC_INITIAL);
    tx.flush();
    seq.shutdown();

    // Three workspaces of two kinds; a stored projection plus a PLog tail after it.
    let storage = MemSeqStorage::new();
    storage.seed_projection(
        &[
            SeqValue::new(WsId(1), WLOG, Number(10)),
            SeqValue::new(WsId(2), CREC, Number(CREC_INITIAL.0 + 100)),
        ],
        PLogOffset(20),
    );
    let events: [(u64, monoseq_core::WsKind, Vec<SeqValue>); 3] = [
        (20, KIND, vec![SeqValue::new(WsId(1), WLOG, Number(11))]),
        (
            21,
            KIND2,
            vec![
                SeqValue::new(WsId(3), WLOG, Number(4)),
                SeqValue::new(WsId(3), OWREC, Number(OWREC_INITIAL.0 + 7)),
            ],
        ),
        (
            22,
            KIND,
            vec![
                SeqValue::new(WsId(2), CREC, Number(CREC_INITIAL.0 + 102)),
                SeqValue::new(WsId(2), CREC, Number(CREC_INITIAL.0 + 101)),
            ],
        ),
    ];
    for (o, k, v) in &events {
        storage.append_event(PLogOffset(*o), *k, v).unwrap();
    }
    let mut seq = new_seq(params(), &storage);
    let mut tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.plog_offset(), PLogOffset(23));
    assert_eq!(tx.next(WLOG).unwrap(), Number(12));
    tx.flush();
    let mut tx = begin(&mut seq, KIND, WsId(2));
    assert_eq!(tx.plog_offset(), PLogOffset(24));
    assert_eq!(tx.next(WLOG).unwrap(), Number(1));
    assert_eq!(tx.next(CREC).unwrap(), Number(CREC_INITIAL.0 + 103));
    tx.flush();
    let mut tx = begin(&mut seq, KIND2, WsId(3));
    assert_eq!(tx.next(WLOG).unwrap(), Number(5));
    assert_eq!(tx.next(OWREC).unwrap(), Number(OWREC_INITIAL.0 + 8));
    let err = tx.next(CREC).unwrap_err();
    assert!(err.to_string().contains("unknown sequence 2"), "{err}");
    tx.flush();
    let err = seq.start(monoseq_core::WsKind(77), WsId(1)).unwrap_err();
    assert!(
        err.to_string().contains("unknown workspace kind 77"),
        "{err}"
    );
    seq.shutdown();
}

pub fn new_must_start_actualization_and_start_is_busy_until_it_ends() {
    let storage = MemSeqStorage::new();
    let gate = Arc::new(Barrier::new(2));
    let release = Arc::new(Barrier::new(2));
    let blocked = Arc::new(AtomicBool::new(true));
    {
        let (gate, release, blocked) = (gate.clone(), release.clone(), blocked.clone());
        storage.set_hook(move |op| {
            if op == Op::ReadNextPLogOffset && blocked.swap(false, Ordering::SeqCst) {
                gate.wait();
                release.wait();
            }
            Ok(())
        });
    }
    let mut seq = new_seq(params(), &storage);
    gate.wait(); // actualization is inside storage now
    assert_eq!(seq.status(), Status::Actualizing);
    for _ in 0..3 {
        assert!(matches!(
            seq.start(KIND, WsId(1)).unwrap(),
            Start::Busy(Busy::Actualizing)
        ));
    }
    assert!(matches!(
        seq.start_wait(KIND, WsId(1), Duration::from_millis(10))
            .unwrap(),
        Start::Busy(Busy::Actualizing)
    ));
    release.wait();
    let tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.plog_offset(), PLogOffset(1));
    tx.flush();
}

pub fn long_recovery_gives_correct_numbers_for_any_tail_length() {
    let limit = 5;
    for events in 0..=10 * limit as u64 {
        let storage = MemSeqStorage::new();
        for o in 1..=events {
            let ws = WsId(o % 7);
            storage
                .append_event(
                    PLogOffset(o),
                    KIND,
                    &[
                        SeqValue::new(ws, WLOG, Number(o)),
                        SeqValue::new(ws, CREC, Number(CREC_INITIAL.0 + o)),
                    ],
                )
                .unwrap();
        }
        let mut seq = new_seq(with_limit(limit), &storage);
        for w in 0..7u64 {
            // The last event of workspace w is the largest o <= events with o % 7 == w.
            let last = (1..=events).rev().find(|o| o % 7 == w);
            let mut tx = begin(&mut seq, KIND, WsId(w));
            assert_eq!(tx.plog_offset(), PLogOffset(events + 1 + w));
            let expect_wlog = last.map_or(1, |o| o + 1);
            let expect_crec = last.map_or(CREC_INITIAL.0, |o| CREC_INITIAL.0 + o + 1);
            assert_eq!(
                tx.next(WLOG).unwrap(),
                Number(expect_wlog),
                "events={events} ws={w}"
            );
            assert_eq!(
                tx.next(CREC).unwrap(),
                Number(expect_crec),
                "events={events} ws={w}"
            );
            tx.flush();
        }
        seq.shutdown();
    }
}

pub fn multiple_actualizes_keep_numbers_strictly_increasing() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut last_committed: std::collections::HashMap<WsId, Number> = Default::default();
    let mut last_offset = PLogOffset(0);
    for round in 0..100 {
        let ws = WsId(rng.random_range(1..4));
        let mut tx = begin(&mut seq, KIND, ws);
        let offset = tx.plog_offset();
        assert_eq!(offset, last_offset.next(), "round {round}");
        let n = rng.random_range(1..4);
        let numbers: Vec<Number> = (0..n).map(|_| tx.next(OWREC).unwrap()).collect();
        assert!(numbers.windows(2).all(|w| w[0] < w[1]));
        let last = last_committed.get(&ws).copied().unwrap_or(Number(0));
        assert!(numbers[0] > last, "round {round}: {numbers:?} after {last}");
        if rng.random_bool(0.5) {
            let values: Vec<SeqValue> = numbers
                .iter()
                .map(|&v| SeqValue::new(ws, OWREC, v))
                .collect();
            storage.append_event(offset, KIND, &values).unwrap();
            tx.flush();
            last_committed.insert(ws, *numbers.last().unwrap());
            last_offset = offset;
        } else {
            tx.actualize();
        }
    }
    seq.shutdown();
}

pub fn flush_permanently_failing_makes_start_busy_over_the_limit_and_numbers_continue_after_healing()
 {
    let limit = 5;
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(with_limit(limit), &storage);
    let handle = seq.handle();
    let commit = |seq: &mut monoseq_core::Sequencer<Arc<MemSeqStorage>>, ws: u64| -> bool {
        match seq.start(KIND, WsId(ws)).unwrap() {
            Start::Began(mut tx) => {
                let n = tx.next(CREC).unwrap();
                storage
                    .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(ws), CREC, n)])
                    .unwrap();
                tx.flush();
                true
            }
            Start::Busy(_) => false,
        }
    };
    // Recovered; the first transaction is fine.
    assert_eq!(handle.wait_actualized(PATIENCE), Status::Ready);
    assert!(commit(&mut seq, 100));
    wait_until("the first transaction was flushed", || {
        handle.stats().backlog_values == 0
    });
    storage.set_hook(|op| match op {
        Op::WriteValue { .. } | Op::WriteCheckpoint(_) => Err(StorageError::new("disk full")),
        _ => Ok(()),
    });
    let mut succeeded = 0;
    while commit(&mut seq, succeeded + 1) {
        succeeded += 1;
        assert!(succeeded <= 100, "start never became busy");
    }
    // One value per transaction, distinct keys; `start` keeps room for the kind's three
    // sequences, so the backlog never holds more than the limit.
    assert_eq!(succeeded, limit as u64 - 3 + 1);
    assert!(handle.stats().backlog_values <= limit);
    wait_until("the flusher reported failing storage", || {
        handle.stats().storage_failing
    });
    assert!(matches!(
        seq.start(KIND, WsId(1)).unwrap(),
        Start::Busy(Busy::StorageUnavailable)
    ));
    storage.clear_hook();
    wait_until("the backlog drained", || handle.stats().backlog_values == 0);
    let mut tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.plog_offset(), PLogOffset(succeeded + 1 + 1));
    assert_eq!(tx.next(CREC).unwrap(), Number(CREC_INITIAL.0 + 1));
    tx.flush();
    let report = seq.shutdown();
    assert!(report.stopped_in_time);
}

/// Parameters whose live backlog and replay window both hold `limit` values: the reference design's
/// tests run with one limit for both.
fn with_limit(limit: usize) -> monoseq_core::Params {
    builder()
        .backlog_values_max(limit)
        .replay_values_max(limit)
        .build()
        .unwrap()
}
