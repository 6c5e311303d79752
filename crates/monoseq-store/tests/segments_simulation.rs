//! Seeded simulation of the event store with its PLogs in segment files (key layout 4, or
//! layout 5 with its index in chunks of a few events, half the seeds each), checked against an
//! oracle: the same groups in the key-value layout (layout 3), given every group the segmented
//! store stored.
//!
//! Each seed runs groups of creates and updates (of records created earlier, in the same group
//! or in one whose store write failed) on a few partitions, with segments sealed every few
//! groups and the faults this layout must come through:
//! - the key-value store's writes failing, applied with their answers lost, or lost with
//!   their answers; its reads failing (the absence check, the records read for an update);
//!   the store poisoned (the process then restarts);
//! - groups that use a WLog offset or record ID a second time (a sequencer gone wrong), which
//!   level 0 must refuse with nothing written to the store or the log;
//! - crashes, after which the key-value store holds only a prefix of its writes since it last
//!   synced (as fjall's journal keeps them), and each partition's active segment ends in a torn
//!   frame or garbage after its data, where an append was cut short;
//! - half the groups written as a partition's writer writes them on a shared flush: frames
//!   written back, the flush, then the batch, which one in ten never gets (its mark's raise
//!   failed) and the partition's next group must write from the log.
//!
//! The contract checked at each group: an answered group is in the log whole, and so is one
//! that answers `OutcomeUnknown`; any other error wrote nothing to it. After every restart
//! (the logs opened with the stored end as their durable end, then the redo a start runs) and
//! at the end, every read answers as the oracle's: the events, pages, replay, WLogs and
//! records.
//!
//! `MONOSEQ_SIM_SEEDS=n` runs more seeds, `MONOSEQ_SIM_SEED=s` replays one.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use monoseq_core::{PLogOffset, ReplayedEvent, SeqStorage, WsId, WsKind};
use monoseq_kv::{
    CasError, FaultOp, FaultyStore, Key, KeyBuf, KvError, KvStore, MemoryStore, Order, Visitor,
    WriteBatch, WriteError,
};
use monoseq_seglog::SegOptions;
use monoseq_store::{
    AppId, AppendError, CRECORD_ID_SEQUENCE, Event, EventStore, Field, PLOG_DIR, PartitionId,
    Record, RecordId, RecordKind, Segments, TrustLevel, WLogOffset,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEEDS_DEFAULT: u64 = 150;
const ACTIONS_PER_SEED: usize = 120;
const APP: AppId = AppId(1);
const KIND: WsKind = WsKind(1);

type Kv = Arc<FaultyStore<Arc<Journaled>>>;

/// A write the key-value store applied, in order.
enum Applied {
    Batch(WriteBatch),
    Swap(KeyBuf, Option<Vec<u8>>),
}

/// An in-memory key-value store that keeps every write it applied, and how many of them its
/// last sync made durable, so that a crash can keep any prefix from there on.
#[derive(Default)]
struct Journaled {
    mem: MemoryStore,
    applied: Mutex<Vec<Applied>>,
    synced: AtomicUsize,
}

impl Journaled {
    fn log(&self) -> std::sync::MutexGuard<'_, Vec<Applied>> {
        self.applied.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The store a crash leaves: the first `keep` writes (at least the synced ones).
    fn crashed(&self, rng: &mut ChaCha8Rng) -> Journaled {
        let log = self.log();
        let keep = rng.random_range(self.synced.load(Ordering::SeqCst)..=log.len());
        let fresh = Journaled::default();
        for write in &log[..keep] {
            let batch = match write {
                Applied::Batch(batch) => batch.clone(),
                Applied::Swap(key, value) => {
                    let mut batch = WriteBatch::new();
                    match value {
                        Some(v) => batch.put(key.as_key(), v),
                        None => batch.delete(key.as_key()),
                    };
                    batch
                }
            };
            fresh.write(&batch).expect("a kept write applies again");
        }
        fresh.synced.store(keep, Ordering::SeqCst);
        fresh
    }
}

impl KvStore for Journaled {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.mem.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.mem.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.mem.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        let mut log = self.log();
        self.mem.write(batch)?;
        log.push(Applied::Batch(batch.clone()));
        Ok(())
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        let mut log = self.log();
        self.mem.compare_and_swap(key, expected, new)?;
        log.push(Applied::Swap(key.to_owned(), new.map(<[u8]>::to_vec)));
        Ok(())
    }

    fn sync(&self) -> Result<(), KvError> {
        let log = self.log();
        self.synced.store(log.len(), Ordering::SeqCst);
        Ok(())
    }
}

/// The numbers a correct sequencer hands out, and the records each workspace holds.
#[derive(Clone, Default)]
struct Numbers {
    plog: BTreeMap<u32, u64>,
    wlog: BTreeMap<u64, u64>,
    records: BTreeMap<u64, Vec<u64>>,
    next_record: u64,
}

fn record_id(n: u64) -> RecordId {
    RecordId(CRECORD_ID_SEQUENCE.initial.0 + n)
}

impl Numbers {
    fn event(&mut self, rng: &mut ChaCha8Rng, p: u32, workspaces: u64) -> Event {
        let plog = {
            let next = self.plog.entry(p).or_insert(0);
            *next += 1;
            *next
        };
        let ws = 100 * u64::from(p + 1) + rng.random_range(0..workspaces);
        let wlog = {
            let next = self.wlog.entry(ws).or_insert(0);
            *next += 1;
            *next
        };
        let mut event = Event {
            plog_offset: PLogOffset(plog),
            ws: WsId(ws),
            ws_kind: KIND,
            wlog_offset: WLogOffset(wlog),
            registered_at_ms: 1_767_225_600_000 + plog,
            command: "app.Cmd".into(),
            argument: None,
            created: vec![],
            updated: vec![],
            idempotency: None,
        };
        let made = self.records.entry(ws).or_default();
        let field = |name: String| Field::new(name, plog.to_string().into_bytes());
        if !made.is_empty() && rng.random_bool(0.5) {
            let n = made[rng.random_range(0..made.len())];
            let fields = vec![field(format!("f{}", rng.random_range(0..4)))];
            event.updated = vec![record(n, fields)];
        } else {
            self.next_record += 1;
            made.push(self.next_record);
            event.created = vec![record(self.next_record, vec![field("at".into())])];
        }
        event
    }
}

fn record(n: u64, fields: Vec<Field>) -> Record {
    Record {
        id: record_id(n),
        kind: RecordKind::CDoc,
        name: "app.Doc".into(),
        fields,
    }
}

/// What one group's append left, by the log's end.
#[derive(Debug, PartialEq)]
enum Fate {
    Stored,
    NotStored,
}

struct Sim {
    rng: ChaCha8Rng,
    dir: tempfile::TempDir,
    partitions: u32,
    workspaces: u64,
    options: SegOptions,
    /// Key layout 5's events a chunk; `None`: layout 4.
    chunk_events: Option<usize>,
    journal: Arc<Journaled>,
    kv: Kv,
    segments: Arc<Segments>,
    store: EventStore<Kv>,
    oracle: EventStore<Arc<MemoryStore>>,
    numbers: Numbers,
    /// Partitions whose store may be behind their log (a group answered `OutcomeUnknown`):
    /// their reads are compared after the next redo.
    behind: Vec<bool>,
    poisoned: bool,
    stats: Stats,
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Stats {
    /// Seeds in key layout 5.
    chunked: u64,
    stored: u64,
    unknown: u64,
    not_stored: u64,
    refused: u64,
    crashes: u64,
    redone: u64,
    /// Groups written back whose batch was never applied (their raise failed).
    unapplied: u64,
}

/// A temporary directory in memory where there is one (the simulation is about what the store
/// does with what the files keep, not about a disk's speed).
fn temp_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::tempdir_in(shm)
    {
        return dir;
    }
    tempfile::tempdir().expect("a temporary directory")
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let dir = temp_dir();
        let partitions = rng.random_range(1..=3);
        let options = SegOptions {
            segment_bytes: rng.random_range(300..=4_000),
            preallocate_bytes: rng.random_range(64..=2_048),
            ..SegOptions::default()
        };
        let chunk_events = rng.random_bool(0.5).then(|| rng.random_range(2..=12));
        let journal = Arc::new(Journaled::default());
        let kv: Kv = Arc::new(FaultyStore::new(Arc::clone(&journal)));
        let segments = Segments::open_with(dir.path(), partitions, &|_| 1, options.clone())
            .expect("new logs open")
            .with_shared_flush()
            .expect("plog/ opens");
        let segments = Arc::new(in_layout(segments, chunk_events));
        let store = EventStore::with_segments(
            Arc::clone(&kv),
            APP,
            TrustLevel::Level0,
            Arc::clone(&segments),
        );
        Sim {
            workspaces: rng.random_range(1..=4),
            rng,
            dir,
            partitions,
            options,
            chunk_events,
            journal,
            kv,
            segments,
            store,
            oracle: EventStore::new(Arc::new(MemoryStore::new()), APP, TrustLevel::Level0),
            numbers: Numbers::default(),
            behind: vec![false; partitions as usize],
            poisoned: false,
            stats: Stats {
                chunked: u64::from(chunk_events.is_some()),
                ..Stats::default()
            },
        }
    }

    fn end(&self, p: u32) -> u64 {
        self.segments.end(PartitionId(p)).expect("the log's end")
    }

    /// The next group of partition `p`: its events, and the numbers after it.
    fn next_group(&mut self, p: u32) -> (Vec<Event>, Numbers) {
        let mut numbers = self.numbers.clone();
        let len = self.rng.random_range(1..=5);
        let events = (0..len)
            .map(|_| numbers.event(&mut self.rng, p, self.workspaces))
            .collect();
        (events, numbers)
    }

    /// One fault armed for the next store call of its kind, or none.
    fn arm_fault(&mut self) {
        match self.rng.random_range(0..100) {
            0..=7 => self.kv.fail_next(FaultOp::Write, 1),
            8..=13 => self.kv.lose_answers_next(1),
            14..=19 => self.kv.lose_requests_next(1),
            20..=25 => self.kv.fail_next(FaultOp::Read, 1),
            26 => {
                self.kv.poison("the simulation poisoned the store");
                self.poisoned = true;
            }
            _ => {}
        }
    }

    fn group(&mut self) {
        let p = self.rng.random_range(0..self.partitions);
        let (events, numbers) = self.next_group(p);
        self.arm_fault();
        let before = self.end(p);
        let mut unapplied = false;
        let answer = if self.rng.random_bool(0.5) {
            self.store.append(PartitionId(p), &events)
        } else {
            // A writer's group: written back, the flush, then its batch, unless its mark's
            // raise failed (its batch is then never applied).
            let raise_fails = self.rng.random_bool(0.1);
            self.store
                .read_updated_records(&events)
                .and_then(|stored| self.store.append_deferred(PartitionId(p), &events, stored))
                .and_then(|_| self.store.sync().map_err(AppendError::Storage))
                .and_then(|()| {
                    unapplied = raise_fails;
                    if raise_fails {
                        Ok(())
                    } else {
                        self.store.apply_deferred(PartitionId(p))
                    }
                })
        };
        self.kv.heal();
        let fate = match self.end(p) - before {
            0 => Fate::NotStored,
            n if n == events.len() as u64 => Fate::Stored,
            n => panic!("a group of {} events added {n} to the log", events.len()),
        };
        match &answer {
            Ok(()) if unapplied => {
                assert_eq!(fate, Fate::Stored, "a group written back is not in the log");
                self.stats.unapplied += 1;
                self.behind[p as usize] = true;
            }
            Ok(()) => {
                assert_eq!(fate, Fate::Stored, "an answered group is not in the log");
                self.stats.stored += 1;
                self.behind[p as usize] = false;
            }
            Err(AppendError::Storage(e)) if e.is_outcome_unknown() => {
                assert_eq!(fate, Fate::Stored, "a group answered {e} is not in the log");
                self.stats.unknown += 1;
                self.behind[p as usize] = true;
            }
            Err(AppendError::Storage(e)) if e.is_poisoned() => {}
            Err(e) => {
                assert_eq!(
                    fate,
                    Fate::NotStored,
                    "a group refused with {e} is in the log"
                );
                self.stats.not_stored += 1;
                // The redo before it may have failed with its write applied or not.
                self.behind[p as usize] = true;
            }
        }
        if fate == Fate::Stored {
            self.oracle
                .append(PartitionId(p), &events)
                .expect("the oracle takes every stored group");
            self.numbers = numbers;
        }
        if self.poisoned {
            self.restart();
        }
    }

    /// A group that uses a WLog offset or a record ID a second time: refused, nothing written.
    fn conflicting_group(&mut self) {
        let p = self.rng.random_range(0..self.partitions);
        let (mut events, _) = self.next_group(p);
        let used: Vec<(u64, u64)> = self
            .numbers
            .wlog
            .iter()
            .filter(|(ws, _)| **ws / 100 == u64::from(p + 1))
            .map(|(ws, n)| (*ws, *n))
            .collect();
        if used.is_empty() {
            return;
        }
        let (ws, last) = used[self.rng.random_range(0..used.len())];
        let reused = self
            .numbers
            .records
            .get(&ws)
            .and_then(|r| r.first().copied());
        let unused = self.numbers.next_record + 1_000;
        let i = self.rng.random_range(0..events.len());
        // The events after it may update the records it no longer creates.
        events.truncate(i + 1);
        let e = &mut events[i];
        e.ws = WsId(ws);
        e.updated.clear();
        match reused {
            Some(n) if self.rng.random_bool(0.5) => {
                e.wlog_offset = WLogOffset(last + 1_000);
                e.created = vec![record(n, vec![])];
            }
            _ => {
                e.wlog_offset = WLogOffset(self.rng.random_range(1..=last));
                e.created = vec![record(unused, vec![])];
            }
        }
        let before = (self.end(p), self.journal.log().len());
        let answer = self.store.append(PartitionId(p), &events);
        assert!(
            matches!(answer, Err(AppendError::SequenceViolation { .. })),
            "a group reusing a number was answered {answer:?}"
        );
        let after = (self.end(p), self.journal.log().len());
        // A redo of a partition behind its log may write; the refused group itself does not.
        if !self.behind[p as usize] {
            assert_eq!(
                before, after,
                "a refused group wrote to the log or the store"
            );
        }
        assert_eq!(before.0, after.0, "a refused group reached the log");
        self.behind[p as usize] = false;
        self.stats.refused += 1;
    }

    /// A crash and a start: the store keeps a prefix of its writes since its last sync, each
    /// active segment ends in torn bytes, and the start redoes what the store lost.
    fn restart(&mut self) {
        let ends: Vec<u64> = (0..self.partitions).map(|p| self.end(p)).collect();
        let journal = Arc::new(self.journal.crashed(&mut self.rng));
        // The logs keep no state of their own beyond their files (no buffer, nothing done on
        // drop), so the files are torn and opened again while the old handles still exist.
        for p in 0..self.partitions {
            tear_active_segment(&mut self.rng, &self.dir.path().join(PLOG_DIR), p);
        }
        self.journal = journal;
        self.kv = Arc::new(FaultyStore::new(Arc::clone(&self.journal)));
        let segments = Segments::open_with(
            self.dir.path(),
            self.partitions,
            &|p| ends[p as usize],
            self.options.clone(),
        )
        .expect("the logs open at their durable ends")
        .with_shared_flush()
        .expect("plog/ opens");
        self.segments = Arc::new(in_layout(segments, self.chunk_events));
        self.store = EventStore::with_segments(
            Arc::clone(&self.kv),
            APP,
            TrustLevel::Level0,
            Arc::clone(&self.segments),
        );
        self.stats.redone += self.store.redo(false).expect("the redo at start");
        self.behind.fill(false);
        self.poisoned = false;
        self.stats.crashes += 1;
        self.check();
    }

    /// Every read of the partitions not behind their logs answers as the oracle's.
    fn check(&self) {
        for p in 0..self.partitions {
            if self.behind[p as usize] {
                continue;
            }
            self.check_partition(PartitionId(p));
        }
    }

    fn check_partition(&self, p: PartitionId) {
        let end = self.end(p.0);
        let got = all_events(&self.store, p);
        let want = all_events(&self.oracle, p);
        assert_eq!(got.len() as u64, end - 1, "partition {p}'s log end");
        assert_eq!(got, want, "partition {p}'s events");
        let from = self.rng.clone().random_range(1..=end);
        assert_eq!(
            self.store
                .read_plog_page(p, from, 50, end, &[])
                .expect("page"),
            self.oracle
                .read_plog_page(p, from, 50, end, &[])
                .expect("page"),
            "partition {p}'s page from {from}"
        );
        assert_eq!(
            replay(&self.store, p),
            replay(&self.oracle, p),
            "replay of {p}"
        );
        for (&ws, _) in self
            .numbers
            .wlog
            .range(100 * u64::from(p.0 + 1)..100 * u64::from(p.0 + 2))
        {
            assert_eq!(
                self.store
                    .read_wlog(WsId(ws), WLogOffset(1), 10_000)
                    .expect("WLog"),
                self.oracle
                    .read_wlog(WsId(ws), WLogOffset(1), 10_000)
                    .expect("WLog"),
                "the WLog of {ws}"
            );
            for &n in self.numbers.records.get(&ws).into_iter().flatten() {
                let read = self
                    .store
                    .read_record(WsId(ws), record_id(n))
                    .expect("record");
                assert!(read.is_some(), "record {n} of {ws} is missing");
                assert_eq!(
                    read,
                    self.oracle
                        .read_record(WsId(ws), record_id(n))
                        .expect("record"),
                    "record {n} of {ws}"
                );
            }
        }
    }

    fn run(mut self) -> Stats {
        for _ in 0..ACTIONS_PER_SEED {
            match self.rng.random_range(0..100) {
                0..=69 => self.group(),
                70..=76 => self.conflicting_group(),
                77..=84 => {
                    // fjall's flusher: the store's writes so far become durable.
                    self.journal.sync().expect("sync");
                }
                85..=91 => self.restart(),
                _ => self.check(),
            }
        }
        self.kv.heal();
        self.restart();
        for p in 0..self.partitions {
            let (events, numbers) = self.next_group(p);
            self.store
                .append(PartitionId(p), &events)
                .expect("a group after the faults");
            self.oracle
                .append(PartitionId(p), &events)
                .expect("the oracle's group");
            self.numbers = numbers;
        }
        self.check();
        self.stats
    }
}

/// Every event of `p`'s PLog.
fn all_events<S: KvStore>(store: &EventStore<S>, p: PartitionId) -> Vec<Event> {
    let mut all = Vec::new();
    store
        .for_each_event(p, PLogOffset(1), PLogOffset(u64::MAX), &mut |e| all.push(e))
        .expect("the PLog reads");
    all
}

/// Every event the replay of `p`'s PLog passes, with its numbers sorted.
fn replay<S: KvStore + Clone>(store: &EventStore<S>, p: PartitionId) -> Vec<(u64, String)> {
    let mut seen = Vec::new();
    store
        .seq_storage(p)
        .replay_plog(PLogOffset(1), &mut |e: ReplayedEvent<'_>| {
            let mut values = e.values.to_vec();
            values.sort_by_key(|v| (v.key, v.value));
            seen.push((e.offset.0, format!("{values:?}")));
            ControlFlow::Continue(())
        })
        .expect("the PLog replays");
    seen
}

/// The last segment file of partition `p`'s log in `plog`.
fn active_segment(plog: &Path, p: u32) -> PathBuf {
    let mut files: Vec<PathBuf> = std::fs::read_dir(plog.join(p.to_string()))
        .expect("the log's directory")
        .map(|e| e.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|x| x == "seg"))
        .collect();
    files.sort();
    files.pop().expect("a log has a segment")
}

/// What a write cut short leaves after the data of `p`'s active segment: a frame's length and
/// part of the rest, or garbage.
fn tear_active_segment(rng: &mut ChaCha8Rng, plog: &Path, p: u32) {
    if rng.random_bool(0.3) {
        return;
    }
    let path = active_segment(plog, p);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect("the active segment opens");
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .expect("the active segment reads");
    // Frames from byte 32: a length word, a CRC word, the payload; a zero length ends them.
    let mut at = 32;
    while at + 8 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        at += 8 + len;
    }
    let torn_len: u32 = rng.random_range(1..=64);
    let mut torn = torn_len.to_le_bytes().to_vec();
    torn.extend((0..rng.random_range(0..=torn_len + 4)).map(|_| rng.random::<u8>()));
    file.seek(SeekFrom::Start(at as u64)).expect("seek");
    file.write_all(&torn).expect("the torn bytes are written");
}

/// `segments` in key layout 5 with chunks of `chunk_events` events, or as they are.
fn in_layout(segments: Segments, chunk_events: Option<usize>) -> Segments {
    match chunk_events {
        Some(n) => segments.with_chunks(n),
        None => segments,
    }
}

fn run_seed(seed: u64) -> Stats {
    Sim::new(seed).run()
}

#[test]
fn simulated_crashes_and_store_faults_on_segment_files_lose_nothing_stored_and_reissue_nothing() {
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
    let mut total = Stats::default();
    for seed in seeds {
        let stats = std::panic::catch_unwind(|| run_seed(seed)).unwrap_or_else(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!(
                "simulation failed at seed {seed}: {msg}\nreplay: MONOSEQ_SIM_SEED={seed} \
                 cargo test -p monoseq-store --test segments_simulation"
            )
        });
        total.chunked += stats.chunked;
        total.stored += stats.stored;
        total.unknown += stats.unknown;
        total.not_stored += stats.not_stored;
        total.refused += stats.refused;
        total.crashes += stats.crashes;
        total.redone += stats.redone;
        total.unapplied += stats.unapplied;
    }
    eprintln!("simulation on segment files: {total:?}");
    // Every fault path ran: groups stored with unknown outcomes, refused, and redone.
    assert!(
        total.chunked > 0
            && total.stored > 0
            && total.unknown > 0
            && total.not_stored > 0
            && total.refused > 0
            && total.crashes > 0
            && total.unapplied > 0
            && total.redone > 0,
        "{total:?}"
    );
}

#[test]
fn a_seed_replays_exactly() {
    assert_eq!(run_seed(11), run_seed(11));
}
