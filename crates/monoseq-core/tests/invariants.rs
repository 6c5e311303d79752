//! Invariants 1–8 of docs/invariants.md, one test (or more) each, on the real sequencer with
//! injected storage faults, slow writes and crashes (a crash drops the sequencer and restarts from
//! the image storage held at that moment).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use common::*;
use monoseq_core::mem::{MemSeqStorage, Op};
use monoseq_core::{
    Number, NumberKey, PLogOffset, SeqStorage, SeqValue, Sequencer, Start, Status, Step,
    StorageError, WsId,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Runs committed transactions on random workspaces; appends each event before flushing.
/// Returns the committed events.
fn drive(
    seq: &mut Sequencer<Arc<MemSeqStorage>>,
    storage: &MemSeqStorage,
    rng: &mut ChaCha8Rng,
    transactions: usize,
    workspaces: u64,
) -> Vec<(PLogOffset, Vec<SeqValue>)> {
    let mut committed = Vec::new();
    let mut done = 0;
    while done < transactions {
        let ws = WsId(rng.random_range(1..=workspaces));
        let mut tx = match seq.start(KIND, ws).unwrap() {
            Start::Began(tx) => tx,
            Start::Busy(_) => {
                std::thread::yield_now();
                continue;
            }
        };
        let mut values = vec![SeqValue::new(ws, WLOG, tx.next(WLOG).unwrap())];
        for _ in 0..rng.random_range(0..3) {
            values.push(SeqValue::new(ws, CREC, tx.next(CREC).unwrap()));
        }
        if storage
            .append_event(tx.plog_offset(), KIND, &values)
            .is_ok()
        {
            committed.push((tx.plog_offset(), values));
            tx.flush();
        } else {
            tx.actualize();
        }
        done += 1;
    }
    committed
}

/// Checks invariant 4 on a storage image: every event before the checkpoint has its numbers
/// (or larger ones) stored.
fn assert_projection_not_ahead_of_values(image: &MemSeqStorage) {
    let checkpoint = image.checkpoint().unwrap_or(PLogOffset::FIRST);
    let numbers = image.numbers();
    for (offset, _, values) in image.events() {
        if offset >= checkpoint {
            break;
        }
        for v in values {
            let stored = numbers.get(&v.key).copied().unwrap_or_default();
            assert!(
                stored >= v.value,
                "checkpoint {checkpoint} covers event {offset} but {:?} is stored as {stored}, event used {}",
                v.key,
                v.value
            );
        }
    }
}

#[test]
fn a_number_is_never_handed_out_twice_across_crashes_and_restarts() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut storage = MemSeqStorage::new();
    let mut seen: HashMap<NumberKey, Vec<Number>> = HashMap::new();
    for _restart in 0..15 {
        let mut seq = new_seq(params(), &storage);
        let committed = drive(&mut seq, &storage, &mut rng, 200, 20);
        for (_, values) in committed {
            for v in values {
                seen.entry(v.key).or_default().push(v.value);
            }
        }
        // Crash: whatever storage holds now is all a restart gets.
        let image = storage.snapshot();
        drop(seq);
        storage = image;
    }
    for (key, numbers) in &seen {
        let mut sorted = numbers.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            numbers.len(),
            "{key:?} handed out a number twice"
        );
    }
}

#[test]
fn committed_numbers_increase_strictly_and_rolled_back_numbers_are_handed_out_again() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let mut last: HashMap<NumberKey, Number> = HashMap::new();
    for _ in 0..300 {
        let ws = WsId(rng.random_range(1..=3));
        let mut tx = begin(&mut seq, KIND, ws);
        let offset = tx.plog_offset();
        let a = tx.next(CREC).unwrap();
        let b = tx.next(CREC).unwrap();
        let key = NumberKey { ws, seq: CREC };
        if let Some(&prev) = last.get(&key) {
            assert_eq!(
                a,
                Number(prev.0 + 1),
                "numbers of committed events are not contiguous"
            );
        }
        if rng.random_bool(0.3) {
            tx.actualize();
            let mut again = begin(&mut seq, KIND, ws);
            assert_eq!(again.plog_offset(), offset);
            assert_eq!(
                again.next(CREC).unwrap(),
                a,
                "rolled-back number not handed out again"
            );
            assert_eq!(again.next(CREC).unwrap(), b);
            storage
                .append_event(offset, KIND, &[SeqValue::new(ws, CREC, b)])
                .unwrap();
            again.flush();
        } else {
            storage
                .append_event(offset, KIND, &[SeqValue::new(ws, CREC, b)])
                .unwrap();
            tx.flush();
        }
        last.insert(key, b);
    }
}

#[test]
fn plog_offsets_of_committed_events_are_contiguous_from_one() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut storage = MemSeqStorage::new();
    let mut offsets = Vec::new();
    for _ in 0..5 {
        let mut seq = new_seq(params(), &storage);
        offsets.extend(
            drive(&mut seq, &storage, &mut rng, 100, 5)
                .into_iter()
                .map(|(o, _)| o.0),
        );
        seq.shutdown();
        storage = storage.snapshot();
    }
    let expected: Vec<u64> = (1..=offsets.len() as u64).collect();
    assert_eq!(offsets, expected);
    let in_plog: Vec<u64> = storage.events().iter().map(|e| e.0.0).collect();
    assert_eq!(in_plog, expected);
}

#[test]
fn checkpoint_is_never_persisted_ahead_of_the_values_it_covers_with_slow_writes_and_crashes() {
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for round in 0..40 {
        let storage = MemSeqStorage::new();
        // Slow writes, and a crash at a random write step: the image taken there is what a
        // restart would find.
        let crash_at = rng.random_range(0..400usize);
        let writes = Arc::new(AtomicUsize::new(0));
        let image: Arc<Mutex<Option<Arc<MemSeqStorage>>>> = Arc::default();
        {
            let weak = Arc::downgrade(&storage);
            let (writes, image) = (writes.clone(), image.clone());
            storage.set_hook(move |op| {
                if matches!(op, Op::WriteValue { .. } | Op::WriteCheckpoint(_)) {
                    std::thread::sleep(Duration::from_micros(50));
                    if writes.fetch_add(1, Ordering::SeqCst) == crash_at {
                        let s = weak.upgrade().expect("storage alive");
                        *image.lock().unwrap() = Some(s.snapshot());
                    }
                }
                Ok(())
            });
        }
        let mut seq = new_seq(
            builder()
                .backlog_values_max(8)
                .replay_values_max(8)
                .build()
                .unwrap(),
            &storage,
        );
        drive(&mut seq, &storage, &mut rng, 150, 30);
        seq.shutdown();
        let crashed = image
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| storage.snapshot());
        assert_projection_not_ahead_of_values(&crashed);
        assert_projection_not_ahead_of_values(&storage);
        // A restart from the crash image continues past every committed number.
        let mut seq = new_seq(params(), &crashed);
        let max_wlog = crashed
            .events()
            .iter()
            .flat_map(|e| e.2.clone())
            .filter(|v| {
                v.key
                    == NumberKey {
                        ws: WsId(1),
                        seq: WLOG,
                    }
            })
            .map(|v| v.value)
            .max()
            .unwrap_or(Number(0));
        let mut tx = begin(&mut seq, KIND, WsId(1));
        assert_eq!(
            tx.next(WLOG).unwrap(),
            Number(max_wlog.0 + 1),
            "round {round}"
        );
        tx.flush();
    }
}

#[test]
fn replay_never_lowers_a_sequence_even_with_numbers_below_the_initial_value() {
    let storage = MemSeqStorage::new();
    let ws = WsId(1);
    storage.seed_projection(
        &[
            SeqValue::new(ws, CREC, Number(CREC_INITIAL.0 + 50)),
            SeqValue::new(ws, WLOG, Number(30)),
        ],
        PLogOffset(10),
    );
    // The tail holds lower numbers: a singleton ID (65538) and a raw ID, both below the CRecord
    // initial value, an old WLog number, and a new one in an event of its own.
    storage
        .append_event(
            PLogOffset(10),
            KIND,
            &[
                SeqValue::new(ws, CREC, Number(65_538)),
                SeqValue::new(ws, CREC, Number(2)),
                SeqValue::new(ws, WLOG, Number(31)),
            ],
        )
        .unwrap();
    storage
        .append_event(PLogOffset(11), KIND, &[SeqValue::new(ws, WLOG, Number(5))])
        .unwrap();
    let mut seq = new_seq(
        builder()
            .backlog_values_max(3)
            .replay_values_max(1)
            .build()
            .unwrap(),
        &storage,
    );
    let mut tx = begin(&mut seq, KIND, ws);
    assert_eq!(tx.next(CREC).unwrap(), Number(CREC_INITIAL.0 + 51));
    assert_eq!(tx.next(WLOG).unwrap(), Number(32));
    tx.actualize();
    // Stored values were never lowered by the replay's inline flushes either.
    assert!(storage.number(NumberKey { ws, seq: CREC }) >= Number(CREC_INITIAL.0 + 50));
    assert!(storage.number(NumberKey { ws, seq: WLOG }) >= Number(31));
    let mut tx = begin(&mut seq, KIND, ws);
    assert_eq!(tx.next(CREC).unwrap(), Number(CREC_INITIAL.0 + 51));
    tx.flush();
}

#[test]
fn replay_over_many_workspaces_never_lowers_stored_numbers() {
    // More workspaces than one replay window holds, so windows are written (in chunks) while
    // the replay goes on, and the known-stored set fills and empties.
    const WORKSPACES: u64 = 12_000;
    let storage = MemSeqStorage::new();
    let seeded: Vec<SeqValue> = (0..WORKSPACES)
        .filter(|ws| ws % 3 == 0)
        .map(|ws| SeqValue::new(WsId(ws), WLOG, Number(1_000 + ws)))
        .collect();
    storage.seed_projection(&seeded, PLogOffset(1));
    let mut expected: HashMap<u64, u64> = seeded.iter().map(|v| (v.key.ws.0, v.value.0)).collect();
    let mut offset = 1;
    for round in 1..=3u64 {
        for ws in 0..WORKSPACES {
            storage
                .append_event(
                    PLogOffset(offset),
                    KIND,
                    &[SeqValue::new(WsId(ws), WLOG, Number(round * 10))],
                )
                .unwrap();
            offset += 1;
            let e = expected.entry(ws).or_default();
            *e = (*e).max(round * 10);
        }
    }
    let mut seq = new_seq(
        builder().replay_values_max(5_000).build().unwrap(),
        &storage,
    );
    let mut tx = begin(&mut seq, KIND, WsId(3));
    assert_eq!(tx.next(WLOG).unwrap(), Number(1_004));
    tx.flush();
    seq.shutdown();
    for (ws, n) in expected {
        let stored = storage.number(NumberKey {
            ws: WsId(ws),
            seq: WLOG,
        });
        let want = if ws == 3 { 1_004 } else { n };
        assert!(
            stored >= Number(n),
            "workspace {ws}: stored {stored}, expected {want}"
        );
    }
}

#[test]
fn replay_never_lowers_a_number_it_wrote_earlier_in_the_same_replay() {
    // One value per window: every event is compared and written on its own, and the windows
    // alternate between workspaces met before and new ones.
    let storage = MemSeqStorage::new();
    let (x, y) = (WsId(1), WsId(2));
    for (o, (ws, n)) in [(x, 10), (y, 5), (x, 20), (x, 15), (y, 3), (x, 12)]
        .into_iter()
        .enumerate()
    {
        storage
            .append_event(
                PLogOffset(o as u64 + 1),
                KIND,
                &[SeqValue::new(ws, WLOG, Number(n))],
            )
            .unwrap();
    }
    let mut seq = new_seq(builder().replay_values_max(1).build().unwrap(), &storage);
    let mut tx = begin(&mut seq, KIND, x);
    assert_eq!(tx.next(WLOG).unwrap(), Number(21));
    tx.actualize();
    assert_eq!(storage.number(NumberKey { ws: x, seq: WLOG }), Number(20));
    assert_eq!(storage.number(NumberKey { ws: y, seq: WLOG }), Number(5));
    seq.shutdown();
}

#[test]
fn shutdown_during_replay_never_writes_numbers_not_yet_compared_with_storage() {
    let storage = MemSeqStorage::new();
    let ws = WsId(1);
    storage.seed_projection(&[SeqValue::new(ws, WLOG, Number(100))], PLogOffset(1));
    // A PLog tail whose numbers are lower than the stored one (overwritten at trust level 2).
    for o in 1..=20u64 {
        storage
            .append_event(PLogOffset(o), KIND, &[SeqValue::new(ws, WLOG, Number(o))])
            .unwrap();
    }
    let reached = Arc::new(AtomicBool::new(false));
    let release = Arc::new(AtomicBool::new(false));
    let (at, gate) = (Arc::clone(&reached), Arc::clone(&release));
    storage.set_hook(move |op| {
        if op == Op::ReplayEvent(PLogOffset(10)) {
            at.store(true, Ordering::Release);
            while !gate.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        Ok(())
    });
    let seq = new_seq(builder().build().unwrap(), &storage);
    let handle = seq.handle();
    while !reached.load(Ordering::Acquire) {
        std::thread::yield_now();
    }
    let shutdown = std::thread::spawn(move || seq.shutdown());
    while handle.status() != Status::Finished {
        std::thread::yield_now();
    }
    // Replay resumes, sees the stop, and the shutdown's last flush runs.
    release.store(true, Ordering::Release);
    assert!(shutdown.join().unwrap().stopped_in_time);
    storage.clear_hook();
    assert_eq!(storage.number(NumberKey { ws, seq: WLOG }), Number(100));
}

#[test]
fn memory_is_bounded_by_cache_and_backlog_not_by_workspace_count() {
    let storage = MemSeqStorage::new();
    let cache = 100;
    let limit = 50;
    let mut seq = new_seq(
        builder()
            .cache_workspaces_max(cache)
            .backlog_values_max(limit)
            .build()
            .unwrap(),
        &storage,
    );
    let handle = seq.handle();
    let mut peak_backlog = 0;
    let mut ws = 0u64;
    while ws < 20_000 {
        match seq.start(KIND, WsId(ws)).unwrap() {
            Start::Began(mut tx) => {
                let v = tx.next(WLOG).unwrap();
                storage
                    .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(ws), WLOG, v)])
                    .unwrap();
                tx.flush();
                ws += 1;
            }
            Start::Busy(_) => std::thread::yield_now(),
        }
        assert!(seq.cached_workspaces() <= cache);
        peak_backlog = peak_backlog.max(handle.stats().backlog_values);
    }
    // Over the limit by at most one transaction's values (a transaction starts at limit).
    assert!(peak_backlog <= limit + 3, "backlog reached {peak_backlog}");
    assert_eq!(seq.cached_workspaces(), cache);
}

#[test]
fn restart_replays_only_the_tail_after_the_checkpoint() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    drive(&mut seq, &storage, &mut rng, 1_000, 50);
    assert!(seq.shutdown().stopped_in_time);
    assert_eq!(storage.checkpoint(), Some(PLogOffset(1_001)));
    // Ten more events reach the PLog but not the projection (a crash before the flusher ran).
    let tail = storage.snapshot();
    for o in 1_001..1_011u64 {
        tail.append_event(
            PLogOffset(o),
            KIND,
            &[SeqValue::new(WsId(1), OWREC, Number(OWREC_INITIAL.0 + o))],
        )
        .unwrap();
    }
    let seq = new_seq(params(), &tail);
    let handle = seq.handle();
    assert_eq!(handle.wait_actualized(PATIENCE), Status::Ready);
    assert_eq!(handle.stats().replayed_events, 10);
    // Actualization flushes promptly: the checkpoint lag is gone right after it.
    assert_eq!(tail.checkpoint(), Some(PLogOffset(1_011)));
}

#[test]
fn checkpoint_lag_stays_bounded_while_transactions_run() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    drive(&mut seq, &storage, &mut rng, 500, 10);
    // With no new transactions, the flusher catches up within the batcher delay.
    wait_until("the checkpoint reached the PLog end", || {
        storage.checkpoint() == Some(PLogOffset(501))
    });
}

#[test]
fn storage_faults_never_panic_and_the_sequencer_heals_with_storage() {
    let storage = MemSeqStorage::new();
    storage.fail_all("connection refused");
    let mut seq = new_seq(params(), &storage);
    let handle = seq.handle();
    wait_until("actualization reported failing storage", || {
        handle.stats().storage_failing
    });
    assert!(matches!(
        seq.start(KIND, WsId(1)).unwrap(),
        Start::Busy(monoseq_core::Busy::StorageUnavailable)
    ));
    storage.clear_hook();
    let mut tx = begin(&mut seq, KIND, WsId(1));
    assert_eq!(tx.next(WLOG).unwrap(), Number(1));
    storage
        .append_event(
            tx.plog_offset(),
            KIND,
            &[SeqValue::new(WsId(1), WLOG, Number(1))],
        )
        .unwrap();
    tx.flush();
    // Reads fail for a workspace not in memory: busy, not a panic; then healed.
    storage.set_hook(|op| match op {
        Op::ReadNumbers(_) => Err(StorageError::new("timeout")),
        _ => Ok(()),
    });
    assert!(matches!(
        seq.start(KIND, WsId(2)).unwrap(),
        Start::Busy(monoseq_core::Busy::StorageUnavailable)
    ));
    storage.clear_hook();
    let tx = begin(&mut seq, KIND, WsId(2));
    tx.flush();
    assert!(handle.stats().storage_errors > 0);
}

#[test]
fn shutdown_finishes_while_storage_is_down() {
    // Storage fails every call: actualization retries with backoff.
    let storage = MemSeqStorage::new();
    storage.fail_all("storage down");
    let seq = new_seq(
        builder()
            .shutdown_timeout(Duration::from_millis(500))
            .build()
            .unwrap(),
        &storage,
    );
    std::thread::sleep(Duration::from_millis(30));
    let began = Instant::now();
    let report = seq.shutdown();
    assert!(began.elapsed() < Duration::from_secs(2));
    assert!(
        report.stopped_in_time,
        "the retry wait did not notice shutdown"
    );

    // Storage hangs inside a call: shutdown still returns, after its timeout.
    let storage = MemSeqStorage::new();
    let hang = Arc::new(AtomicBool::new(true));
    {
        let hang = hang.clone();
        storage.set_hook(move |_| {
            while hang.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            Ok(())
        });
    }
    let seq = new_seq(
        builder()
            .shutdown_timeout(Duration::from_millis(300))
            .build()
            .unwrap(),
        &storage,
    );
    std::thread::sleep(Duration::from_millis(20));
    let began = Instant::now();
    let report = seq.shutdown();
    let took = began.elapsed();
    hang.store(false, Ordering::SeqCst);
    assert!(!report.stopped_in_time);
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

#[test]
fn shutdown_flushes_what_is_unflushed() {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(
        builder()
            .batcher_delay(Duration::from_secs(5))
            .build()
            .unwrap(),
        &storage,
    );
    let mut tx = begin(&mut seq, KIND, WsId(3));
    let n = tx.next(CREC).unwrap();
    storage
        .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(3), CREC, n)])
        .unwrap();
    tx.flush();
    let report = seq.shutdown();
    assert!(report.stopped_in_time);
    assert_eq!(report.unflushed_values, 0);
    assert_eq!(
        storage.number(NumberKey {
            ws: WsId(3),
            seq: CREC
        }),
        n
    );
    assert_eq!(storage.read_next_plog_offset().unwrap(), PLogOffset(2));
}

#[test]
fn flusher_keeps_values_that_changed_during_its_write() {
    // Slow writes: transactions of a few hot workspaces commit while the flusher writes.
    let storage = MemSeqStorage::new();
    storage.set_hook(|op| {
        if matches!(op, Op::WriteValue { .. }) {
            std::thread::sleep(Duration::from_micros(300));
        }
        Ok(())
    });
    let mut seq = new_seq(params(), &storage);
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let committed = drive(&mut seq, &storage, &mut rng, 3_000, 3);
    assert!(seq.shutdown().stopped_in_time);
    let mut last: HashMap<NumberKey, Number> = HashMap::new();
    for (_, values) in committed {
        for v in values {
            last.insert(v.key, v.value);
        }
    }
    // After a clean shutdown the projection is exact: nothing newer was dropped.
    assert_eq!(storage.checkpoint(), Some(PLogOffset(3_001)));
    for (key, n) in &last {
        assert_eq!(storage.number(*key), *n, "{key:?} lost its last value");
    }
}

/// Holds the flusher's write at its first value until the test releases it, then lets it
/// succeed or fail; returns (entered, release).
fn gate_first_write(storage: &MemSeqStorage, fail: bool) -> (mpsc::Receiver<()>, mpsc::Sender<()>) {
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let gate = Mutex::new(Some((entered_tx, release_rx)));
    storage.set_hook(move |op| {
        if let Op::WriteValue { index: 0, .. } = op
            && let Some((entered, release)) = gate.lock().unwrap().take()
        {
            entered.send(()).unwrap();
            release.recv().unwrap();
            if fail {
                return Err(StorageError::new("disk stalled, then failed"));
            }
        }
        Ok(())
    });
    (entered_rx, release_tx)
}

/// One committed transaction on `ws`: its WLog offset and, when `record`, a record ID.
fn commit_one(
    seq: &mut Sequencer<Arc<MemSeqStorage>>,
    ws: WsId,
    record: bool,
) -> (Number, Option<Number>) {
    let mut tx = seq.start(KIND, ws).unwrap().began().expect("not busy");
    let wlog = tx.next(WLOG).unwrap();
    let rec = record.then(|| tx.next(CREC).unwrap());
    tx.flush();
    (wlog, rec)
}

#[test]
fn numbers_being_written_are_read_back_from_memory_not_from_older_storage() {
    let storage = MemSeqStorage::new();
    let params = builder().cache_workspaces_max(1).build().unwrap();
    let (mut seq, mut worker) = Sequencer::new_manual(params, Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Idle);
    let (first, _) = commit_one(&mut seq, WsId(1), false);
    let (entered, release) = gate_first_write(&storage, false);
    std::thread::scope(|s| {
        let flusher = s.spawn(|| worker.step());
        entered.recv().unwrap();
        // Workspace 2 evicts workspace 1 from the one-entry cache; while its number is being
        // written, storage still holds none, so only memory can answer.
        commit_one(&mut seq, WsId(2), false);
        let (again, _) = commit_one(&mut seq, WsId(1), false);
        release.send(()).unwrap();
        assert_eq!(flusher.join().unwrap(), Step::Idle);
        assert_eq!(again, Number(first.0 + 1), "a number was handed out twice");
    });
    assert_eq!(worker.step(), Step::Idle);
    assert_eq!(
        storage.number(NumberKey {
            ws: WsId(1),
            seq: WLOG
        }),
        Number(first.0 + 1)
    );
}

#[test]
fn a_failed_write_keeps_its_numbers_beside_those_committed_during_it() {
    let storage = MemSeqStorage::new();
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Idle);
    let (_, record) = commit_one(&mut seq, WsId(1), true);
    commit_one(&mut seq, WsId(2), false);
    let (entered, release) = gate_first_write(&storage, true);
    let wlog = std::thread::scope(|s| {
        let flusher = s.spawn(|| worker.step());
        entered.recv().unwrap();
        // Newer than the WLog offset in flight; the record ID in flight has no newer one.
        let (wlog, _) = commit_one(&mut seq, WsId(1), false);
        release.send(()).unwrap();
        assert!(matches!(flusher.join().unwrap(), Step::RetryAfter(_)));
        wlog
    });
    storage.clear_hook();
    assert_eq!(worker.step(), Step::Idle);
    let stored = |ws, seq| storage.number(NumberKey { ws: WsId(ws), seq });
    assert_eq!(stored(1, WLOG), wlog);
    assert_eq!(stored(1, CREC), record.unwrap());
    assert_eq!(stored(2, WLOG), Number(1));
    assert_eq!(seq.handle().stats().backlog_values, 0);
    assert_eq!(storage.checkpoint(), Some(PLogOffset(4)));
}
