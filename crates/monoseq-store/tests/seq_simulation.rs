//! Seeded simulation of the sequencer on `PLogSeqStorage` over the in-memory key-value store behind
//! a `FaultyStore`: transactions (committed, group-committed, rolled back, written despite a
//! reported error, abandoned), failing reads, scans and writes (of the event store and of the
//! projection alike), and restarts after which the old sequencer's worker lives on and steps late
//! (its writes must be fenced off). After every action the sequencer is checked against a model of
//! the PLog, and the stored projection against the PLog (invariants 1 to 5 and 11 of
//! docs/invariants.md); events are written at trust level 0, so a PLog offset, WLog offset or
//! record ID handed out twice fails the write and the test.
//!
//! The sequencer runs in manual mode, so one seed is one exact schedule.
//! `MONOSEQ_SIM_SEEDS=n` runs more seeds, `MONOSEQ_SIM_SEED=s` replays one.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;

use monoseq_core::{
    Number, NumberKey, PLogOffset, Params, PoisonReason, SeqId, SeqStorage, SeqValue, Sequencer,
    Start, StartError, Step, Worker, WsId, WsKind,
};
use monoseq_kv::{FaultOp, FaultyStore, MemoryStore};
use monoseq_store::{
    AppId, AppendError, CRECORD_ID_SEQUENCE, Event, EventStore, OWRECORD_ID_SEQUENCE,
    PLogSeqStorage, PartitionId, Record, RecordId, RecordKind, TrustLevel, WLOG_OFFSET_SEQUENCE,
    WLogOffset, built_in_params,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 1_000;
const ACTIONS_PER_SEED: usize = 300;
const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(0);
const KIND: WsKind = WsKind(1);
const WLOG: SeqId = WLOG_OFFSET_SEQUENCE.id;
const CREC: SeqId = CRECORD_ID_SEQUENCE.id;
const OWREC: SeqId = OWRECORD_ID_SEQUENCE.id;

type Kv = Arc<FaultyStore<Arc<MemoryStore>>>;
type Storage = Arc<PLogSeqStorage<Kv>>;

struct Sim {
    rng: ChaCha8Rng,
    params: Params,
    workspaces: u64,
    mem: Arc<MemoryStore>,
    kv: Kv,
    events: EventStore<Kv>,
    /// One storage value for the partition, shared by every sequencer: its fence orders them.
    storage: Storage,
    seq: (Sequencer<Storage>, Worker<Storage>),
    /// Workers of sequencers replaced by a restart, still stepping now and then.
    old_workers: Vec<Worker<Storage>>,
    /// The model: every event in the PLog, with the numbers it used.
    plog: BTreeMap<PLogOffset, Vec<SeqValue>>,
    /// Events of transactions committed as pending (group commit), not yet written.
    pending: Vec<Event>,
    began: u64,
    restarts: u64,
    fenced: u64,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let params = built_in_params([KIND])
            .backlog_values_max(rng.random_range(3..=20))
            .replay_values_max(rng.random_range(1..=20))
            .cache_workspaces_max(rng.random_range(1..=8))
            .build()
            .unwrap();
        let mem = Arc::new(MemoryStore::new());
        let kv: Kv = Arc::new(FaultyStore::new(Arc::clone(&mem)));
        let events = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level0);
        let storage = Arc::new(events.seq_storage(PARTITION));
        let seq = Sequencer::new_manual(params.clone(), Arc::clone(&storage));
        Sim {
            workspaces: rng.random_range(1..=10),
            rng,
            params,
            mem,
            kv,
            events,
            storage,
            seq,
            old_workers: Vec::new(),
            plog: BTreeMap::new(),
            pending: Vec::new(),
            began: 0,
            restarts: 0,
            fenced: 0,
        }
    }

    /// A new sequencer on the same storage value; the old one's worker lives on.
    fn restart(&mut self) {
        let new = Sequencer::new_manual(self.params.clone(), Arc::clone(&self.storage));
        let (old_seq, old_worker) = std::mem::replace(&mut self.seq, new);
        drop(old_seq);
        self.old_workers.push(old_worker);
        self.pending.clear();
        self.restarts += 1;
    }

    fn initial(&self, seq: SeqId) -> Number {
        self.params.initial_value(KIND, seq).unwrap()
    }

    /// The number `next` must hand out for `key`: one past the largest the PLog (and the
    /// pending group) shows used, or the initial value.
    fn expected_next(&self, key: NumberKey) -> Number {
        let pending = self.pending.iter().flat_map(event_values);
        self.plog
            .values()
            .flatten()
            .copied()
            .chain(pending)
            .filter(|v| v.key == key)
            .map(|v| Number(v.value.0 + 1))
            .max()
            .unwrap_or_else(|| self.initial(key.seq))
    }

    fn expected_offset(&self) -> PLogOffset {
        let pending = self.pending.last().map(|e| e.plog_offset);
        self.plog
            .keys()
            .next_back()
            .copied()
            .max(pending)
            .map_or(PLogOffset::FIRST, PLogOffset::next)
    }

    fn write(&mut self, events: Vec<Event>) -> bool {
        write(&self.events, &mut self.plog, events)
    }

    fn transaction(&mut self) {
        let ws = WsId(self.rng.random_range(1..=self.workspaces));
        let expect_offset = self.expected_offset();
        let ids: Vec<RecordKind> = (0..self.rng.random_range(0..3))
            .map(|_| [RecordKind::CDoc, RecordKind::WDoc][self.rng.random_range(0..2)])
            .collect();
        let mut expected = BTreeMap::new();
        for seq in [WLOG, CREC, OWREC] {
            expected.insert(seq, self.expected_next(NumberKey { ws, seq }));
        }
        let outcome = self.rng.random_range(0..100);
        if self.seq.0.handle().stats().poison == Some(PoisonReason::Fenced) {
            // A late first claim of an old worker (manual workers outlive their sequencer)
            // took the storage over: replace this sequencer too.
            assert!(matches!(
                self.seq.0.start(KIND, ws),
                Err(StartError::Poisoned(PoisonReason::Fenced))
            ));
            self.fenced += 1;
            self.restart();
            return;
        }
        let (events, plog, pending) = (&self.events, &mut self.plog, &mut self.pending);
        let mut tx = match self.seq.0.start(KIND, ws) {
            Ok(Start::Began(tx)) => tx,
            Ok(Start::Busy(_)) => return,
            Err(e) => panic!("{e}"),
        };
        self.began += 1;
        assert_eq!(
            tx.plog_offset(),
            expect_offset,
            "PLog offset not contiguous"
        );
        let mut take = |seq: SeqId| {
            let n = tx.next(seq).unwrap();
            let want = expected.get_mut(&seq).unwrap();
            assert_eq!(n, *want, "next handed out a wrong {seq} number in {ws}");
            want.0 += 1;
            n
        };
        let wlog = take(WLOG);
        let created: Vec<Record> = ids
            .iter()
            .map(|&kind| Record {
                id: RecordId(take(kind.id_sequence()).0),
                kind,
                name: "app.Doc".into(),
                fields: vec![],
            })
            .collect();
        let event = Event {
            plog_offset: tx.plog_offset(),
            ws,
            ws_kind: KIND,
            wlog_offset: WLogOffset(wlog.0),
            registered_at_ms: 0,
            command: "app.Cmd".into(),
            argument: None,
            created,
            updated: vec![],
            idempotency: None,
        };
        match outcome {
            // The group and this event are durable: commit.
            0..=54 => {
                let mut group = std::mem::take(pending);
                group.push(event);
                if write(events, plog, group) {
                    tx.flush();
                } else {
                    tx.actualize();
                }
            }
            // Group commit: handed out now, written with the group later.
            55..=69 => {
                pending.push(event);
                tx.commit_pending();
            }
            // The write failed before reaching the PLog.
            70..=82 => {
                pending.clear();
                tx.actualize();
            }
            // The write reached the PLog but the caller saw an error.
            83..=94 => {
                let mut group = std::mem::take(pending);
                group.push(event);
                write(events, plog, group);
                tx.actualize();
            }
            // The caller gave up without finishing.
            _ => {
                pending.clear();
                drop(tx);
            }
        }
    }

    fn write_group(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let group = std::mem::take(&mut self.pending);
        if self.rng.random_bool(0.8) && self.write(group) {
            self.seq.0.mark_durable();
        } else {
            self.seq.0.actualize();
        }
    }

    fn step_worker(&mut self) {
        match self.seq.1.step() {
            Step::Idle | Step::RetryAfter(_) => {}
            Step::Stopped => assert_eq!(
                self.seq.0.handle().stats().poison,
                Some(PoisonReason::Fenced),
                "the current worker stopped for another reason than a later claim"
            ),
            other => panic!("unexpected step {other:?}"),
        }
    }

    fn step_old_worker(&mut self) {
        if self.old_workers.is_empty() {
            return;
        }
        let i = self.rng.random_range(0..self.old_workers.len());
        if self.old_workers[i].step() == Step::Stopped {
            self.old_workers.swap_remove(i);
        }
    }

    fn faults(&mut self) {
        let op = [FaultOp::Read, FaultOp::Scan, FaultOp::Write][self.rng.random_range(0..3)];
        match self.rng.random_range(0..4) {
            0 => self.kv.heal(),
            1 => self.kv.fail(op, true),
            _ => self.kv.fail_next(op, self.rng.random_range(1..=3)),
        }
    }

    /// Invariant 4 on the stored projection: every event before the checkpoint has its
    /// numbers (or larger ones) stored.
    fn check_projection(&self) {
        let direct = PLogSeqStorage::new(Arc::clone(&self.mem), APP, PARTITION);
        let checkpoint = direct.read_next_plog_offset().unwrap();
        let mut out = [Number(0)];
        for (offset, values) in self.plog.range(..checkpoint) {
            for v in values {
                direct
                    .read_numbers(v.key.ws, &[v.key.seq], &mut out)
                    .unwrap();
                assert!(
                    out[0] >= v.value,
                    "checkpoint {checkpoint} covers event {offset}, but {:?} is stored as {} < {}",
                    v.key,
                    out[0],
                    v.value
                );
            }
        }
        // The PLog holds exactly the model's events.
        let mut seen = Vec::new();
        direct
            .replay_plog(PLogOffset::FIRST, &mut |e| {
                seen.push(e.offset);
                ControlFlow::Continue(())
            })
            .unwrap();
        assert_eq!(seen, self.plog.keys().copied().collect::<Vec<_>>());
    }

    fn run(&mut self) {
        for _ in 0..ACTIONS_PER_SEED {
            match self.rng.random_range(0..100) {
                0..=44 => self.transaction(),
                45..=49 => self.write_group(),
                50..=79 => self.step_worker(),
                80..=84 => self.step_old_worker(),
                85..=91 => self.faults(),
                92..=94 => self.restart(),
                _ => self.check_projection(),
            }
            if self.rng.random_range(0..100) < 3 {
                self.check_projection();
            }
        }
        // Heal, let the workers catch up, and check the final state.
        self.kv.heal();
        self.write_group();
        for mut old in std::mem::take(&mut self.old_workers) {
            for _ in 0..4 {
                old.step();
            }
        }
        for _ in 0..4 {
            self.step_worker();
        }
        self.transaction();
        self.step_worker();
        self.check_projection();
    }
}

/// Appends `events` to the PLog and the model; false when storage failed (nothing written).
/// A sequence violation (a number handed out twice) fails the test.
fn write(
    store: &EventStore<Kv>,
    plog: &mut BTreeMap<PLogOffset, Vec<SeqValue>>,
    events: Vec<Event>,
) -> bool {
    match store.append(PARTITION, &events) {
        Ok(()) => {
            for e in events {
                plog.insert(e.plog_offset, event_values(&e).collect());
            }
            true
        }
        Err(e @ AppendError::SequenceViolation { .. }) => panic!("{e}"),
        Err(_) => false,
    }
}

fn event_values(e: &Event) -> impl Iterator<Item = SeqValue> + '_ {
    std::iter::once(SeqValue::new(e.ws, WLOG, Number(e.wlog_offset.0))).chain(
        e.created
            .iter()
            .map(|r| SeqValue::new(e.ws, r.kind.id_sequence(), Number(r.id.0))),
    )
}

fn run_seed(seed: u64) -> (u64, u64, u64) {
    let mut sim = Sim::new(seed);
    sim.run();
    (sim.began, sim.restarts, sim.fenced)
}

#[test]
fn simulated_schedules_on_the_event_store_with_faults_and_late_old_workers_keep_every_invariant() {
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
    let (mut began, mut restarts, mut fenced) = (0, 0, 0);
    for seed in seeds {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok((b, r, f)) => {
                began += b;
                restarts += r;
                fenced += f;
            }
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!(
                    "simulation failed at seed {seed}: {msg}\nreplay: MONOSEQ_SIM_SEED={seed} \
                     cargo test -p monoseq-store --test seq_simulation"
                );
            }
        }
    }
    eprintln!("simulation: {began} transactions began, {restarts} restarts, {fenced} fenced");
    assert!(
        began > 0 && restarts > 0,
        "began {began}, restarts {restarts}"
    );
}

#[test]
fn a_seed_replays_exactly() {
    assert_eq!(run_seed(7), run_seed(7));
}
