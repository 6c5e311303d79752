//! How the sequencer fails and heals (issue 12): a poison is reported whichever way the open
//! transaction ends; a newer sequencer on the same storage fences off the writes of an older one
//! (invariant 11 of docs/invariants.md); offsets and checkpoints at the edges are refused, never
//! handed out or panicked on; the backlog stays within its limit; a checkpoint that went back
//! poisons.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use monoseq_core::mem::{MemSeqStorage, Op};
use monoseq_core::{
    Busy, Number, NumberKey, PLogOffset, PoisonReason, SeqStorage, SeqValue, Sequencer, Start,
    StartError, Status, Step, StorageError, Worker, WsId,
};

type Store = Arc<MemSeqStorage>;

/// How the transaction open at the moment of the poison ends.
#[derive(Debug, Clone, Copy)]
enum Close {
    Flush,
    CommitPending,
    CommitPendingThenMarkDurable,
    CommitPendingThenSequencerActualize,
    Actualize,
    Drop,
}

/// Opens a transaction, makes the background worker panic inside a storage write while it is
/// open, ends it as `close` says, and checks that `start` and `stats` report the poison.
fn a_poison_during_a_transaction_is_reported_after(close: Close) {
    let storage = MemSeqStorage::new();
    let mut seq = new_seq(params(), &storage);
    let handle = seq.handle();
    let tx = begin(&mut seq, KIND, WsId(1));
    tx.flush(); // nothing to write yet: the worker stays idle
    let (reached_tx, reached_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let reached = Mutex::new(reached_tx);
    let release = Mutex::new(release_rx);
    storage.set_hook(move |op| {
        if let Op::WriteCheckpoint(_) = op {
            let _ = reached.lock().unwrap().send(());
            let _ = release.lock().unwrap().recv();
            panic!("a bug inside storage code");
        }
        Ok(())
    });
    // A committed transaction: its flush enters storage and waits there.
    let mut tx = begin(&mut seq, KIND, WsId(1));
    let n = tx.next(WLOG).unwrap();
    storage
        .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(1), WLOG, n)])
        .unwrap();
    tx.flush();
    reached_rx
        .recv_timeout(PATIENCE)
        .expect("the flush reached storage");
    // A transaction is open when the worker panics.
    let mut tx = match seq.start(KIND, WsId(2)).unwrap() {
        Start::Began(tx) => tx,
        Start::Busy(b) => panic!("busy: {b}"),
    };
    let n = tx.next(WLOG).unwrap();
    release_tx.send(()).unwrap();
    wait_until("the worker's panic poisoned the sequencer", || {
        handle.stats().poisoned
    });
    match close {
        Close::Flush => {
            storage
                .append_event(tx.plog_offset(), KIND, &[SeqValue::new(WsId(2), WLOG, n)])
                .unwrap();
            tx.flush();
        }
        Close::CommitPending => tx.commit_pending(),
        Close::CommitPendingThenMarkDurable => {
            tx.commit_pending();
            seq.mark_durable();
        }
        Close::CommitPendingThenSequencerActualize => {
            tx.commit_pending();
            seq.actualize();
        }
        Close::Actualize => tx.actualize(),
        Close::Drop => drop(tx),
    }
    for ws in [WsId(2), WsId(3)] {
        match seq.start(KIND, ws) {
            Err(StartError::Poisoned(PoisonReason::WorkerPanicked)) => {}
            Err(e) => panic!("{close:?}: unexpected error {e}"),
            Ok(Start::Began(tx)) => panic!("{close:?}: a poisoned sequencer began {tx:?}"),
            Ok(Start::Busy(b)) => panic!("{close:?}: a poisoned sequencer answered busy: {b}"),
        }
    }
    let stats = handle.stats();
    assert_eq!(stats.status, Status::Finished, "{close:?}");
    assert!(stats.poisoned, "{close:?}");
    assert_eq!(
        stats.poison,
        Some(PoisonReason::WorkerPanicked),
        "{close:?}"
    );
    assert_eq!(seq.status(), Status::Finished, "{close:?}");
}

#[test]
fn a_poison_is_reported_after_the_open_transaction_flushes() {
    a_poison_during_a_transaction_is_reported_after(Close::Flush);
}

#[test]
fn a_poison_is_reported_after_the_open_transaction_commits_pending() {
    a_poison_during_a_transaction_is_reported_after(Close::CommitPending);
}

#[test]
fn a_poison_is_reported_after_pending_transactions_are_marked_durable() {
    a_poison_during_a_transaction_is_reported_after(Close::CommitPendingThenMarkDurable);
}

#[test]
fn a_poison_is_reported_after_the_sequencer_is_asked_to_actualize() {
    a_poison_during_a_transaction_is_reported_after(Close::CommitPendingThenSequencerActualize);
}

#[test]
fn a_poison_is_reported_after_the_open_transaction_actualizes() {
    a_poison_during_a_transaction_is_reported_after(Close::Actualize);
}

#[test]
fn a_poison_is_reported_after_the_open_transaction_is_dropped() {
    a_poison_during_a_transaction_is_reported_after(Close::Drop);
}

fn manual(storage: &Store) -> (Sequencer<Store>, Worker<Store>) {
    let (seq, mut worker) = Sequencer::new_manual(
        builder().cache_workspaces_max(1).build().unwrap(),
        Arc::clone(storage),
    );
    assert_eq!(worker.step(), Step::Idle, "actualization");
    (seq, worker)
}

/// Commits one transaction on `ws` that takes the next WLog number; appends its event.
fn commit_wlog(seq: &mut Sequencer<Store>, storage: &MemSeqStorage, ws: WsId) -> Number {
    let Start::Began(mut tx) = seq.start(KIND, ws).unwrap() else {
        panic!("busy");
    };
    let n = tx.next(WLOG).unwrap();
    storage
        .append_event(tx.plog_offset(), KIND, &[SeqValue::new(ws, WLOG, n)])
        .unwrap();
    tx.flush();
    n
}

#[test]
fn a_late_write_of_an_old_worker_changes_nothing() {
    let storage = MemSeqStorage::new();
    let ws = WsId(1);
    // The old sequencer commits WLog number 1; its worker has not written it yet.
    let (mut old, mut old_worker) = manual(&storage);
    let old_handle = old.handle();
    assert_eq!(commit_wlog(&mut old, &storage, ws), Number(1));
    // It is dropped (or shut down without stopping in time): its worker lives on.
    drop(old);
    // A new sequencer on the same storage takes over and moves on to number 3.
    let (mut new, mut new_worker) = manual(&storage);
    assert_eq!(commit_wlog(&mut new, &storage, ws), Number(2));
    assert_eq!(commit_wlog(&mut new, &storage, ws), Number(3));
    assert_eq!(new_worker.step(), Step::Idle);
    let key = NumberKey { ws, seq: WLOG };
    assert_eq!(storage.number(key), Number(3));
    assert_eq!(storage.checkpoint(), Some(PLogOffset(4)));
    // The old worker's last write lands late: refused, and the old worker stops.
    assert_eq!(old_worker.step(), Step::Stopped);
    assert_eq!(
        storage.number(key),
        Number(3),
        "the stored number went back"
    );
    assert_eq!(
        storage.checkpoint(),
        Some(PLogOffset(4)),
        "the checkpoint went back"
    );
    let stats = old_handle.stats();
    assert!(stats.poisoned);
    assert_eq!(stats.poison, Some(PoisonReason::Fenced));
    // The new sequencer moves on (another workspace raises the checkpoint), and a restart
    // after it continues after number 3, never handing out 2 or 3 again.
    assert_eq!(commit_wlog(&mut new, &storage, WsId(2)), Number(1));
    assert_eq!(new_worker.step(), Step::Idle);
    drop(new);
    let (mut restarted, _w) = manual(&storage);
    assert_eq!(commit_wlog(&mut restarted, &storage, ws), Number(4));
}

#[test]
fn a_fenced_sequencer_answers_poisoned_from_start() {
    let storage = MemSeqStorage::new();
    let (mut old, mut old_worker) = manual(&storage);
    commit_wlog(&mut old, &storage, WsId(1));
    let (_new, _new_worker) = manual(&storage);
    assert_eq!(old_worker.step(), Step::Stopped);
    assert!(matches!(
        old.start(KIND, WsId(1)),
        Err(StartError::Poisoned(PoisonReason::Fenced))
    ));
    assert_eq!(old_worker.step(), Step::Stopped, "it never retries");
}

#[test]
fn a_claim_waits_for_the_old_generations_write_in_flight() {
    let storage = MemSeqStorage::new();
    let (mut old, mut old_worker) = manual(&storage);
    commit_wlog(&mut old, &storage, WsId(1));
    // The old worker's write enters storage and stalls there.
    let (reached_tx, reached_rx) = mpsc::channel::<()>();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let reached = Mutex::new(reached_tx);
    let release = Mutex::new(release_rx);
    let armed = AtomicBool::new(true);
    storage.set_hook(move |op| {
        if let Op::WriteCheckpoint(_) = op
            && armed.swap(false, Ordering::SeqCst)
        {
            let _ = reached.lock().unwrap().send(());
            let _ = release.lock().unwrap().recv();
        }
        Ok(())
    });
    let old_write = std::thread::spawn(move || old_worker.step());
    reached_rx
        .recv_timeout(PATIENCE)
        .expect("the old write began");
    // A new sequencer's actualization claims the storage: it waits for that write.
    let storage2 = Arc::clone(&storage);
    let (claimed_tx, claimed_rx) = mpsc::channel();
    let new = std::thread::spawn(move || {
        let (seq, mut worker) = Sequencer::new_manual(params(), storage2);
        let step = worker.step();
        claimed_tx.send(()).unwrap();
        (seq, worker, step)
    });
    assert_eq!(
        claimed_rx.recv_timeout(Duration::from_millis(200)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "the new sequencer actualized while an old write was in flight"
    );
    release_tx.send(()).unwrap();
    assert_eq!(
        old_write.join().unwrap(),
        Step::Idle,
        "the old write landed"
    );
    storage.clear_hook();
    let (mut seq, _worker, step) = new.join().unwrap();
    assert_eq!(step, Step::Idle);
    // The new sequencer read what the old write stored.
    assert_eq!(commit_wlog(&mut seq, &storage, WsId(1)), Number(2));
}

#[test]
fn start_refuses_an_offset_no_event_could_follow() {
    let storage = MemSeqStorage::new();
    storage.seed_projection(&[], PLogOffset(u64::MAX - 1));
    storage
        .append_event(
            PLogOffset(u64::MAX - 1),
            KIND,
            &[SeqValue::new(WsId(1), WLOG, Number(7))],
        )
        .unwrap();
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Idle);
    for _ in 0..2 {
        assert_eq!(
            seq.start(KIND, WsId(1)).unwrap_err(),
            StartError::PLogExhausted(PLogOffset(u64::MAX))
        );
    }
    assert_eq!(worker.step(), Step::Idle);
}

#[test]
fn an_event_at_the_last_offset_fails_replay_without_a_panic() {
    let storage = MemSeqStorage::new();
    storage.seed_projection(&[], PLogOffset(u64::MAX));
    storage
        .append_event(PLogOffset(u64::MAX), KIND, &[])
        .unwrap();
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    assert!(matches!(worker.step(), Step::RetryAfter(_)));
    // Damaged stored data is an error, never "busy".
    assert_eq!(seq.start(KIND, WsId(1)).unwrap_err(), StartError::Corrupted);
}

#[test]
fn a_stored_checkpoint_of_zero_is_refused_and_offset_zero_never_handed_out() {
    let storage = MemSeqStorage::new();
    storage.seed_projection(&[], PLogOffset(0));
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    for _ in 0..3 {
        assert!(matches!(worker.step(), Step::RetryAfter(_)));
        match seq.start(KIND, WsId(1)) {
            Err(StartError::Corrupted) => {}
            Err(e) => panic!("another error: {e}"),
            Ok(Start::Busy(b)) => panic!("busy, not an error: {b}"),
            Ok(Start::Began(tx)) => panic!("began at offset {}", tx.plog_offset()),
        }
    }
    let stats = seq.handle().stats();
    assert!(stats.storage_failing && stats.storage_corrupted);
    // Repaired: the sequencer heals.
    storage.seed_projection(&[], PLogOffset(1));
    assert_eq!(worker.step(), Step::Idle);
    let Start::Began(tx) = seq.start(KIND, WsId(1)).unwrap() else {
        panic!("busy after repair");
    };
    assert_eq!(tx.plog_offset(), PLogOffset(1));
    tx.flush();
}

#[test]
fn the_backlog_never_exceeds_its_limit_by_a_transactions_values() {
    let limit = 7;
    let storage = MemSeqStorage::new();
    let (mut seq, mut worker) = Sequencer::new_manual(
        builder().backlog_values_max(limit).build().unwrap(),
        storage,
    );
    assert_eq!(worker.step(), Step::Idle);
    let handle = seq.handle();
    let mut began = 0;
    for ws in 1..=10 {
        match seq.start(KIND, WsId(ws)).unwrap() {
            Start::Began(mut tx) => {
                // Every sequence of the kind: three new values.
                tx.next(WLOG).unwrap();
                tx.next(CREC).unwrap();
                tx.next(OWREC).unwrap();
                tx.flush();
                began += 1;
            }
            Start::Busy(b) => assert_eq!(b, Busy::BacklogFull),
        }
        let backlog = handle.stats().backlog_values;
        assert!(backlog <= limit, "backlog {backlog} over its limit {limit}");
    }
    assert_eq!(began, 2);
    assert_eq!(worker.step(), Step::Idle);
    assert!(matches!(
        seq.start(KIND, WsId(11)).unwrap(),
        Start::Began(_)
    ));
}

#[test]
fn a_checkpoint_read_back_below_one_written_poisons_the_next_sequencer() {
    let storage = MemSeqStorage::new();
    let (mut old, mut old_worker) = manual(&storage);
    commit_wlog(&mut old, &storage, WsId(1));
    commit_wlog(&mut old, &storage, WsId(1));
    assert_eq!(old_worker.step(), Step::Idle);
    assert_eq!(storage.checkpoint(), Some(PLogOffset(3)));
    drop((old, old_worker));
    // Storage loses the acknowledged checkpoint (a damaged or rolled-back store).
    storage.seed_projection(&[], PLogOffset(2));
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Stopped);
    let reason = PoisonReason::CheckpointWentBack {
        written: PLogOffset(3),
        read: PLogOffset(2),
    };
    assert_eq!(
        seq.start(KIND, WsId(1)).unwrap_err(),
        StartError::Poisoned(reason)
    );
    assert_eq!(seq.handle().stats().poison, Some(reason));
}

#[test]
fn an_exhausted_sequence_says_it_is_permanent() {
    let storage = MemSeqStorage::new();
    storage.seed_projection(
        &[SeqValue::new(WsId(1), WLOG, Number(u64::MAX))],
        PLogOffset(1),
    );
    let (mut seq, mut worker) = Sequencer::new_manual(params(), Arc::clone(&storage));
    assert_eq!(worker.step(), Step::Idle);
    let Start::Began(mut tx) = seq.start(KIND, WsId(1)).unwrap() else {
        panic!("busy");
    };
    let err = tx.next(WLOG).unwrap_err();
    assert!(err.is_exhausted(), "{err}");
    assert!(!tx.next(SeqIdExt::UNKNOWN).unwrap_err().is_exhausted());
    tx.actualize();
}

/// A sequence no kind declares.
struct SeqIdExt;
impl SeqIdExt {
    const UNKNOWN: monoseq_core::SeqId = monoseq_core::SeqId(99);
}

#[test]
fn storage_refuses_invalid_calls_with_errors_not_panics() {
    let storage = MemSeqStorage::new();
    let err: StorageError = storage
        .write_values_and_next_plog_offset(&[], PLogOffset(0))
        .unwrap_err();
    assert!(err.to_string().contains("below the first"), "{err}");
    let mut out = [Number(0); 1];
    assert!(
        storage
            .read_numbers(WsId(1), &[WLOG, CREC], &mut out)
            .is_err()
    );
}
