//! A cancelled transaction leaves every sequence as if it never started: two sequencers run the
//! same seeded schedule of transactions (flushed, committed as pending, or actualized), group
//! writes and background steps; one of them also runs cancelled transactions, each after a
//! look at `current`, in between. Both must hand out the same PLog offsets and numbers, run the
//! same actualizations and end with the same stored image. `current` is checked on the way:
//! equal on both, and `next` hands out one past it (or the initial value).
//!
//! `MONOSEQ_CANCEL_SEEDS=n` runs more seeds, `MONOSEQ_CANCEL_SEED=s` replays one.

mod common;

use std::sync::Arc;

use common::*;
use monoseq_core::mem::MemSeqStorage;
use monoseq_core::{
    Number, PLogOffset, Params, SeqId, SeqValue, Sequencer, Start, Step, Worker, WsId, WsKind,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 300;
const ACTIONS_PER_SEED: usize = 400;

type Store = Arc<MemSeqStorage>;

/// One sequencer with its own storage and the events of its pending group.
struct Twin {
    seq: Sequencer<Store>,
    worker: Worker<Store>,
    storage: Store,
    pending: Vec<Event>,
}

impl Twin {
    fn new(params: Params) -> Twin {
        let storage = MemSeqStorage::new();
        let (seq, worker) = Sequencer::new_manual(params, Arc::clone(&storage));
        Twin {
            seq,
            worker,
            storage,
            pending: Vec::new(),
        }
    }

    fn step(&mut self) {
        assert_eq!(
            self.worker.step(),
            Step::Idle,
            "the worker fails only with storage"
        );
    }

    fn write_pending(&mut self) {
        write_pending(&self.storage, &mut self.pending);
    }
}

type Event = (PLogOffset, WsKind, Vec<SeqValue>);

fn write_pending(storage: &MemSeqStorage, pending: &mut Vec<Event>) {
    for (offset, kind, values) in pending.drain(..) {
        storage
            .append_event(offset, kind, &values)
            .expect("storage without faults");
    }
}

/// What one transaction did, compared between the twins.
#[derive(Debug, PartialEq, Eq)]
enum Done {
    Busy,
    Ran {
        offset: PLogOffset,
        current: Vec<Number>,
        handed_out: Vec<Number>,
    },
}

/// How a transaction ends.
#[derive(Clone, Copy)]
enum End {
    Flush,
    Pending,
    Actualize,
}

fn transaction(twin: &mut Twin, kind: WsKind, ws: WsId, seqs: &[SeqId], end: End) -> Done {
    let params = twin.seq.params().clone();
    let Twin {
        seq,
        storage,
        pending,
        ..
    } = twin;
    let Ok(Start::Began(mut tx)) = seq.start(kind, ws) else {
        return Done::Busy;
    };
    let offset = tx.plog_offset();
    let current: Vec<Number> = seqs
        .iter()
        .map(|&s| tx.current(s).expect("a declared sequence"))
        .collect();
    let mut values = Vec::new();
    let mut handed_out = Vec::new();
    for (&s, &before) in seqs.iter().zip(&current) {
        let n = tx.next(s).expect("far from exhausted");
        let initial = params.initial_value(kind, s).expect("declared");
        let repeated = values.iter().any(|v: &SeqValue| v.key.seq == s);
        if !repeated {
            assert_eq!(
                n,
                Number(before.0 + 1).max(initial),
                "next hands out one past current, or the initial value"
            );
        }
        values.push(SeqValue::new(ws, s, n));
        handed_out.push(n);
    }
    match end {
        End::Flush => {
            write_pending(storage, pending);
            storage
                .append_event(offset, kind, &values)
                .expect("storage without faults");
            tx.flush();
        }
        End::Pending => {
            pending.push((offset, kind, values));
            tx.commit_pending();
        }
        End::Actualize => {
            pending.clear();
            tx.actualize();
        }
    }
    Done::Ran {
        offset,
        current,
        handed_out,
    }
}

/// A transaction that looks at every sequence of its kind and cancels (a cancel after a `next`
/// is `cancel_after_next_hands_the_transaction_back`).
fn cancelled(twin: &mut Twin, kind: WsKind, ws: WsId) {
    let seqs: Vec<SeqId> = twin
        .seq
        .params()
        .kinds()
        .find(|(k, _)| *k == kind)
        .map(|(_, s)| s.map(|(id, _)| id).collect())
        .expect("declared kind");
    let Ok(Start::Began(tx)) = twin.seq.start(kind, ws) else {
        return;
    };
    for s in seqs {
        tx.current(s).expect("a declared sequence");
    }
    tx.cancel().expect("nothing was handed out");
}

fn run_seed(seed: u64) -> u64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let params = builder()
        .backlog_values_max(rng.random_range(6..=30))
        .cache_workspaces_max(rng.random_range(1..=4))
        .build()
        .unwrap();
    let workspaces = rng.random_range(1..=6);
    let mut plain = Twin::new(params.clone());
    let mut cancelling = Twin::new(params);
    let mut cancels = 0;
    for _ in 0..ACTIONS_PER_SEED {
        match rng.random_range(0..100) {
            0..=39 => {
                let kind = if rng.random_bool(0.7) { KIND } else { KIND2 };
                let ws = WsId(rng.random_range(1..=workspaces));
                let mut seqs = vec![WLOG];
                for _ in 0..rng.random_range(0..3) {
                    seqs.push(if kind == KIND { CREC } else { OWREC });
                }
                let end = [
                    End::Flush,
                    End::Flush,
                    End::Pending,
                    End::Pending,
                    End::Actualize,
                ][rng.random_range(0..5)];
                let a = transaction(&mut plain, kind, ws, &seqs, end);
                let b = transaction(&mut cancelling, kind, ws, &seqs, end);
                assert_eq!(a, b, "a cancelled transaction changed what came after it");
            }
            40..=49 => {
                plain.write_pending();
                plain.seq.mark_durable();
                cancelling.write_pending();
                cancelling.seq.mark_durable();
            }
            50..=69 => {
                plain.step();
                cancelling.step();
            }
            _ => {
                for _ in 0..rng.random_range(1..=3) {
                    let kind = if rng.random_bool(0.5) { KIND } else { KIND2 };
                    let ws = WsId(rng.random_range(1..=workspaces + 2));
                    cancelled(&mut cancelling, kind, ws);
                    cancels += 1;
                }
            }
        }
    }
    for twin in [&mut plain, &mut cancelling] {
        twin.write_pending();
        twin.seq.mark_durable();
        for _ in 0..4 {
            twin.step();
        }
    }
    let (a, b) = (plain.seq.handle().stats(), cancelling.seq.handle().stats());
    assert_eq!(
        (a.actualizations, a.next_offset, a.durable_offset),
        (b.actualizations, b.next_offset, b.durable_offset),
        "a cancel actualized or moved the PLog offset"
    );
    assert_eq!(plain.storage.events(), cancelling.storage.events());
    assert_eq!(plain.storage.numbers(), cancelling.storage.numbers());
    assert_eq!(plain.storage.checkpoint(), cancelling.storage.checkpoint());
    cancels
}

#[test]
fn a_cancelled_transaction_leaves_every_sequence_as_if_it_never_started() {
    let seeds: Vec<u64> = match std::env::var("MONOSEQ_CANCEL_SEED") {
        Ok(s) => vec![s.parse().expect("MONOSEQ_CANCEL_SEED must be a number")],
        Err(_) => {
            let n = std::env::var("MONOSEQ_CANCEL_SEEDS")
                .ok()
                .map_or(SEEDS_DEFAULT, |s| {
                    s.parse().expect("MONOSEQ_CANCEL_SEEDS must be a number")
                });
            (0..n).collect()
        }
    };
    let mut cancels = 0;
    for seed in seeds {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(c) => cancels += c,
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "seed {seed}: {msg}\nreplay: MONOSEQ_CANCEL_SEED={seed} cargo test -p \
                     monoseq-core --test cancel"
                );
            }
        }
    }
    assert!(cancels > 0, "the schedules cancelled nothing");
}

#[test]
fn cancel_after_next_hands_the_transaction_back() {
    let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
    assert_eq!(worker.step(), Step::Idle);
    let Ok(Start::Began(mut tx)) = seq.start(KIND, WsId(1)) else {
        panic!("busy");
    };
    assert_eq!(tx.current(WLOG), Ok(Number(0)));
    assert_eq!(tx.next(WLOG), Ok(Number(1)));
    assert_eq!(
        tx.current(WLOG),
        Ok(Number(1)),
        "current sees this transaction's next"
    );
    let tx = tx.cancel().expect_err("a number was handed out");
    assert_eq!(tx.plog_offset(), PLogOffset(1), "handed back unchanged");
    tx.flush();
    let Ok(Start::Began(tx)) = seq.start(KIND, WsId(1)) else {
        panic!("busy after a flush");
    };
    assert_eq!(tx.plog_offset(), PLogOffset(2));
    assert_eq!(tx.current(WLOG), Ok(Number(1)));
    assert!(
        tx.current(SeqId(99))
            .is_err_and(|e| e.to_string().contains("unknown sequence"))
    );
    tx.cancel().expect("nothing handed out");
    assert_eq!(seq.handle().stats().actualizations, 1, "only the first one");
}

#[test]
fn a_cancel_does_not_allocate() {
    let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
    assert_eq!(worker.step(), Step::Idle);
    let look = |seq: &mut Sequencer<Store>| {
        let Ok(Start::Began(tx)) = seq.start(KIND, WsId(3)) else {
            panic!("busy");
        };
        let _ = tx.current(WLOG);
        tx.cancel().expect("nothing handed out");
    };
    look(&mut seq);
    let hot = allocation_counter::measure(|| {
        for _ in 0..10_000 {
            look(&mut seq);
        }
    });
    assert_eq!(hot.count_total, 0, "current and cancel allocated");
}
