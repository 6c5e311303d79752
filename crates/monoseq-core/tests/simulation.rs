//! Deterministic simulation of the sequencer: seeded schedules of transactions, flushes,
//! cancels, actualizations, background steps, storage failures and crashes (also in the middle of a
//! storage write), checked after every action against a model of the PLog.
//!
//! The sequencer runs in manual mode: the simulation decides when its worker steps, so one seed
//! is one exact schedule. `MONOSEQ_SIM_SEEDS=n` runs more seeds, `MONOSEQ_SIM_SEED=s` replays one.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::*;
use monoseq_core::mem::{MemSeqStorage, Op};
use monoseq_core::{
    Busy, Number, NumberKey, PLogOffset, Params, SeqId, SeqValue, Sequencer, Start, StartError,
    Step, StorageError, Worker, WsId, WsKind,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 2_000;
const ACTIONS_PER_SEED: usize = 300;

/// Storage faults of one simulated run, decided by the hook's own seeded generator.
struct Faults {
    rng: Mutex<ChaCha8Rng>,
    /// Per mille of storage operations that fail.
    fail_per_mille: AtomicU64,
    /// Per mille of write steps where the machine crashes.
    crash_per_mille: AtomicU64,
    /// The machine crashed: every operation fails until restart.
    crashed: AtomicBool,
    /// What storage held at the crash.
    image: Mutex<Option<Arc<MemSeqStorage>>>,
}

type Store = Arc<MemSeqStorage>;
type Event = (PLogOffset, WsKind, Vec<SeqValue>);

struct Sim {
    rng: ChaCha8Rng,
    params: Params,
    workspaces: u64,
    storage: Arc<MemSeqStorage>,
    faults: Arc<Faults>,
    seq: Option<(Sequencer<Store>, Worker<Store>)>,
    /// The model: every event in the PLog (committed, or written despite a reported error).
    plog: BTreeMap<PLogOffset, (WsKind, Vec<SeqValue>)>,
    /// Events of transactions committed as pending (group commit), not yet written.
    pending: Vec<Event>,
    crashes: u64,
    began: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let params = builder()
            .backlog_values_max(rng.random_range(3..=20))
            .replay_values_max(rng.random_range(1..=20))
            .cache_workspaces_max(rng.random_range(1..=8))
            .build()
            .unwrap();
        let faults = Arc::new(Faults {
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed ^ 0x5eed)),
            fail_per_mille: AtomicU64::new(0),
            crash_per_mille: AtomicU64::new(0),
            crashed: AtomicBool::new(false),
            image: Mutex::new(None),
        });
        let workspaces = rng.random_range(1..=10);
        let mut sim = Sim {
            rng,
            params,
            workspaces,
            storage: MemSeqStorage::new(),
            faults,
            seq: None,
            plog: BTreeMap::new(),
            pending: Vec::new(),
            crashes: 0,
            began: 0,
        };
        sim.boot(MemSeqStorage::new());
        sim
    }

    /// Starts a sequencer on `storage` with the fault hook installed.
    fn boot(&mut self, storage: Arc<MemSeqStorage>) {
        self.faults.crashed.store(false, Ordering::SeqCst);
        let faults = Arc::clone(&self.faults);
        let weak = Arc::downgrade(&storage);
        storage.set_hook(move |op| {
            if faults.crashed.load(Ordering::SeqCst) {
                return Err(StorageError::new("machine is down"));
            }
            let mut rng = faults.rng.lock().unwrap();
            let is_write = matches!(op, Op::WriteValue { .. } | Op::WriteCheckpoint(_));
            if is_write && rng.random_range(0..1000) < faults.crash_per_mille.load(Ordering::SeqCst)
            {
                let s = weak.upgrade().expect("storage alive during its own call");
                *faults.image.lock().unwrap() = Some(s.snapshot());
                faults.crashed.store(true, Ordering::SeqCst);
                return Err(StorageError::new("crash"));
            }
            if !matches!(op, Op::AppendEvent(_))
                && rng.random_range(0..1000) < faults.fail_per_mille.load(Ordering::SeqCst)
            {
                return Err(StorageError::new("injected failure"));
            }
            Ok(())
        });
        self.storage = Arc::clone(&storage);
        self.seq = Some(Sequencer::new_manual(self.params.clone(), storage));
    }

    /// Drops the sequencer and restarts from what storage holds (at the crash, if one
    /// happened inside a write).
    fn crash_and_restart(&mut self) {
        self.seq = None;
        self.pending.clear();
        self.crashes += 1;
        let image = self
            .faults
            .image
            .lock()
            .unwrap()
            .take()
            .unwrap_or_else(|| self.storage.snapshot());
        self.check_projection(&image);
        self.boot(image);
    }

    fn initial(&self, kind: WsKind, seq: SeqId) -> Number {
        self.params.initial_value(kind, seq).unwrap()
    }

    /// The number `next` must hand out for `key`: one past the largest number the PLog shows
    /// used (ignoring numbers below the initial value), or the initial value.
    fn expected_next(&self, kind: WsKind, key: NumberKey) -> Number {
        let initial = self.initial(kind, key.seq);
        let used = self
            .plog
            .values()
            .map(|(_, vs)| vs)
            .chain(self.pending.iter().map(|(_, _, vs)| vs))
            .flat_map(|vs| vs.iter())
            .filter(|v| v.key == key && v.value >= initial)
            .map(|v| v.value)
            .max();
        used.map_or(initial, |u| Number(u.0 + 1))
    }

    fn next_offset(&self) -> PLogOffset {
        let last = self.pending.last().map(|p| p.0);
        self.plog
            .keys()
            .next_back()
            .copied()
            .max(last)
            .map_or(PLogOffset::FIRST, |o| o.next())
    }

    /// Invariant 4 on a storage image: the checkpoint never covers an event whose numbers are
    /// not stored.
    fn check_projection(&self, image: &MemSeqStorage) {
        let checkpoint = image.checkpoint().unwrap_or(PLogOffset::FIRST);
        for (&offset, (kind, values)) in self.plog.range(..checkpoint) {
            for v in values {
                match self.params.initial_value(*kind, v.key.seq) {
                    Some(initial) if v.value >= initial => {}
                    _ => continue,
                }
                let stored = image.number(v.key);
                assert!(
                    stored >= v.value,
                    "checkpoint {checkpoint} covers event {offset}, but {:?} is stored as {stored} < {}",
                    v.key,
                    v.value
                );
            }
        }
    }

    fn transaction(&mut self) {
        let kind = if self.rng.random_bool(0.7) {
            KIND
        } else {
            KIND2
        };
        let ws = WsId(self.rng.random_range(1..=self.workspaces));
        let expect_offset = self.next_offset();
        let seqs: Vec<SeqId> = (0..self.rng.random_range(0..4))
            .map(|_| [WLOG, CREC, OWREC][self.rng.random_range(0..3)])
            .collect();
        let outcome = self.rng.random_range(0..100);
        let external = self.rng.random_bool(0.1);
        let mut expected: Vec<(NumberKey, Number)> = Vec::new();
        for &s in &seqs {
            if self.params.initial_value(kind, s).is_some() {
                let key = NumberKey { ws, seq: s };
                let base = expected
                    .iter()
                    .rev()
                    .find(|(k, _)| *k == key)
                    .map(|(_, n)| Number(n.0 + 1));
                let n = base.unwrap_or_else(|| self.expected_next(kind, key));
                expected.push((key, n));
            }
        }
        let old_wlog = self.expected_next(kind, NumberKey { ws, seq: WLOG }) > Number(2);
        // Per sequence, its initial value and the number `next` must hand out, if declared.
        let model = [WLOG, CREC, OWREC].map(|s| {
            let declared = self.params.initial_value(kind, s);
            (
                s,
                declared.map(|i| (i, self.expected_next(kind, NumberKey { ws, seq: s }))),
            )
        });
        let (seq, _) = self.seq.as_mut().unwrap();
        let mut tx = match seq.start(kind, ws) {
            Ok(Start::Began(tx)) => tx,
            Ok(Start::Busy(Busy::Actualizing | Busy::BacklogFull | Busy::StorageUnavailable)) => {
                return;
            }
            Ok(Start::Busy(other)) => panic!("unexpected busy reason {other:?}"),
            Err(StartError::Poisoned(r)) => panic!("poisoned without a panic in storage: {r}"),
            Err(e) => panic!("{e}"),
        };
        self.began += 1;
        assert_eq!(
            tx.plog_offset(),
            expect_offset,
            "PLog offset not contiguous"
        );
        for (s, declared) in model {
            let Some((initial, next)) = declared else {
                assert!(tx.current(s).is_err(), "current of an undeclared sequence");
                continue;
            };
            let current = tx.current(s).unwrap();
            if next > initial {
                assert_eq!(
                    Number(current.0 + 1),
                    next,
                    "current is not the last number"
                );
            } else {
                assert!(
                    current < initial,
                    "current {current} but nothing handed out"
                );
            }
        }
        if outcome >= 97 {
            // Refused after a look at `current`: cancelled, as if it never started (the next
            // transaction's offset and numbers are checked against the model).
            tx.cancel().expect("nothing was handed out");
            return;
        }
        let mut values = Vec::new();
        let mut expected = expected.into_iter();
        for &s in &seqs {
            match tx.next(s) {
                Ok(n) => {
                    let (key, want) = expected.next().unwrap();
                    assert_eq!((key.seq, n), (s, want), "next handed out a wrong number");
                    values.push(SeqValue { key, value: n });
                }
                Err(e) => assert!(
                    e.to_string().contains("unknown sequence"),
                    "unexpected error {e}"
                ),
            }
        }
        let handed_out = !values.is_empty();
        if external {
            // An event may carry numbers this transaction did not hand out: a reserved or
            // singleton ID below the initial value, and an old, already used WLog number
            // (out of order in the PLog).
            if kind == KIND {
                values.push(SeqValue::new(ws, CREC, Number(65_538)));
            }
            if old_wlog {
                values.push(SeqValue::new(ws, WLOG, Number(1)));
            }
        }
        let offset = tx.plog_offset();
        match outcome {
            // The event (after the pending ones) is durable: commit.
            0..=54 => {
                if write_pending(&self.storage, &mut self.plog, &mut self.pending)
                    && self.storage.append_event(offset, kind, &values).is_ok()
                {
                    self.plog.insert(offset, (kind, values));
                    tx.flush();
                } else {
                    self.pending.clear();
                    tx.actualize();
                }
            }
            // Group commit: handed out now, written with the group later.
            55..=69 => {
                self.pending.push((offset, kind, values));
                tx.commit_pending();
            }
            // The write failed before reaching the PLog.
            70..=82 => {
                self.pending.clear();
                tx.actualize();
            }
            // The write reached the PLog but the caller saw an error.
            83..=94 => {
                if write_pending(&self.storage, &mut self.plog, &mut self.pending)
                    && self.storage.append_event(offset, kind, &values).is_ok()
                {
                    self.plog.insert(offset, (kind, values));
                }
                self.pending.clear();
                tx.actualize();
            }
            // The caller gave up without finishing.
            95 => {
                self.pending.clear();
                drop(tx);
            }
            // The caller cancels; once `next` handed out a number the transaction is handed
            // back, and it gives up on it.
            _ => match tx.cancel() {
                Ok(()) => assert!(!handed_out, "cancelled after handing out numbers"),
                Err(tx) => {
                    assert!(
                        handed_out,
                        "a transaction without numbers was not cancelled"
                    );
                    self.pending.clear();
                    drop(tx);
                }
            },
        }
    }

    /// Writes the pending group: all of it (then marks it durable), a prefix, or nothing
    /// (then actualizes).
    fn write_group(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let (seq, _) = self.seq.as_mut().unwrap();
        let outcome = self.rng.random_range(0..100);
        if outcome < 70 {
            if write_pending(&self.storage, &mut self.plog, &mut self.pending) {
                seq.mark_durable();
                return;
            }
        } else if outcome < 85 {
            let keep = self.rng.random_range(0..self.pending.len());
            self.pending.truncate(keep);
            write_pending(&self.storage, &mut self.plog, &mut self.pending);
        }
        self.pending.clear();
        seq.actualize();
    }

    fn step_worker(&mut self) {
        let (_, worker) = self.seq.as_mut().unwrap();
        match worker.step() {
            Step::Idle | Step::RetryAfter(_) => {}
            other => panic!("worker stopped unexpectedly: {other:?}"),
        }
        if self.faults.crashed.load(Ordering::SeqCst) {
            self.crash_and_restart();
        }
    }

    fn run(&mut self) {
        for _ in 0..ACTIONS_PER_SEED {
            match self.rng.random_range(0..100) {
                0..=44 => self.transaction(),
                45..=49 => self.write_group(),
                50..=84 => self.step_worker(),
                85..=89 => {
                    let f = [0, 0, 50, 300, 1000][self.rng.random_range(0..5)];
                    self.faults.fail_per_mille.store(f, Ordering::SeqCst);
                }
                90..=93 => {
                    let c = [0, 0, 20, 200][self.rng.random_range(0..4)];
                    self.faults.crash_per_mille.store(c, Ordering::SeqCst);
                }
                94..=96 => self.crash_and_restart(),
                _ => {
                    let image = self.storage.snapshot();
                    self.check_projection(&image);
                }
            }
        }
        // Heal, let the worker catch up, and check the final state.
        self.faults.fail_per_mille.store(0, Ordering::SeqCst);
        self.faults.crash_per_mille.store(0, Ordering::SeqCst);
        if self.faults.crashed.load(Ordering::SeqCst) {
            self.crash_and_restart();
        }
        self.write_group();
        for _ in 0..4 {
            self.step_worker();
        }
        self.transaction();
        self.step_worker();
        let image = self.storage.snapshot();
        self.check_projection(&image);
    }
}

/// Appends the pending events in order, moving each to the PLog model as it lands; false on the
/// first failure.
fn write_pending(
    storage: &MemSeqStorage,
    plog: &mut BTreeMap<PLogOffset, (WsKind, Vec<SeqValue>)>,
    pending: &mut Vec<Event>,
) -> bool {
    for (offset, kind, values) in std::mem::take(pending) {
        if storage.append_event(offset, kind, &values).is_err() {
            return false;
        }
        plog.insert(offset, (kind, values));
    }
    true
}

fn run_seed(seed: u64) -> (u64, u64) {
    let mut sim = Sim::new(seed);
    sim.run();
    (sim.began, sim.crashes)
}

#[test]
fn simulated_schedules_with_faults_and_crashes_keep_every_invariant() {
    let seeds: Vec<u64> = match std::env::var("MONOSEQ_SIM_SEED") {
        Ok(s) => vec![s.parse().expect("MONOSEQ_SIM_SEED must be a number")],
        Err(_) => {
            let n = std::env::var("MONOSEQ_SIM_SEEDS")
                .ok()
                .map_or(SEEDS_DEFAULT, |s| {
                    s.parse().expect("MONOSEQ_SIM_SEEDS must be a number")
                });
            (0..n).collect()
        }
    };
    let (mut began, mut crashes) = (0, 0);
    for seed in seeds {
        let result = std::panic::catch_unwind(|| run_seed(seed));
        match result {
            Ok((b, c)) => {
                began += b;
                crashes += c;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "simulation failed at seed {seed}: {msg}\nreplay: MONOSEQ_SIM_SEED={seed} cargo test -p monoseq-core --test simulation"
                );
            }
        }
    }
    eprintln!("simulation: {began} transactions began, {crashes} crashes");
    // The schedules must actually exercise transactions and crashes.
    assert!(began > 0 && crashes > 0, "began {began}, crashes {crashes}");
}

#[test]
fn a_seed_replays_exactly() {
    let a = run_seed(42);
    let b = run_seed(42);
    assert_eq!(a, b);
}
