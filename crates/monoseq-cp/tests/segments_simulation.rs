//! A seeded simulation of one server's partitions on the layout it runs by default: each
//! PLog in segment files, the WLog entries and records in the key-value store (the in-memory
//! one behind a fault-injecting wrapper). The real lifecycle and writer (`ManualPartition`:
//! groups, read-back after a failed write, heal) run in simulated time through failed writes,
//! writes whose answer is lost after they were applied, writes lost before, and crashes (every
//! object dropped, the files kept as a killed process leaves them in the page cache; the next
//! run opens the logs against its marks and redoes the store up to them, as a start does).
//! Clients send keyed commands and retry each with its key until answered: each creates a
//! record, then updates the record it created, and so on; store syncs fail too (a group whose
//! frames are in the log fails to raise its mark).
//!
//! Checked as the run goes and at its end:
//! - every answer to a key is the answer it first got (a retry is never written twice);
//! - no command is refused for good (an update finds the record its client's earlier command
//!   created, whatever failed in between);
//! - no PLog offset is acknowledged to two keys (numbers are never issued twice);
//! - once the faults stop, every acknowledged command's event, WLog entry and created record
//!   read back from the store, with no further command needed to bring the store up to the
//!   log, and each updated record holds its client's last acknowledged update.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use monoseq_core::{PLogOffset, WsId};
use monoseq_cp::{
    Command, Config, IdempotencyKey, ManualPartition, Outcome, RecordUpdate, operation_command,
    operation_key,
};
use monoseq_kv::{FaultOp, FaultyStore, MemoryStore};
use monoseq_store::{
    AppId, EventStore, Mark, PartitionId, RecordId, Segments, TrustLevel, WLogOffset,
};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

type Kv = Arc<FaultyStore<MemoryStore>>;

/// The WLog table's tag (`docs/format.md`): a batch holding a WLog entry is a group's.
const TAG_WLOG: u8 = 0x02;

const PARTITIONS: u32 = 2;
/// Workspaces the clients write to, one client each.
const CLIENTS: u64 = 4;
/// Simulated milliseconds per tick.
const TICK_MS: u64 = 10;
/// Ticks with faults, then ticks without, for every answer to come.
const FAULT_TICKS: u64 = 600;
const CALM_TICKS: u64 = 200;
/// How long a client waits for an answer before it sends its command again.
const CLIENT_TIMEOUT_MS: u64 = 500;
/// Per tick, out of 1 000: a crash of the server; a fault of the next store write.
const CRASH_PER_MILLE: u32 = 5;
const FAULT_PER_MILLE: u32 = 80;

/// One client: its workspace, its current operation, and when it last sent it; once the
/// faults stop, the last operation it sends; the record its last create made, and the last
/// update of it acknowledged.
struct Client {
    ws: u64,
    op: u64,
    sent_at: Option<u64>,
    last: Option<u64>,
    record: Option<u64>,
    updated: Option<(u64, u64)>,
}

impl Client {
    /// Its current operation: an even one creates a record, an odd one updates the record the
    /// operation before it created (the same body on every retry).
    fn command(&self) -> Command {
        match self.record {
            Some(id) if self.op % 2 == 1 => {
                let mut fields = serde_json::Map::new();
                fields.insert("n".into(), self.op.into());
                Command {
                    update: vec![RecordUpdate { id, fields }],
                    create: Vec::new(),
                    ..operation_command(self.ws, self.op)
                }
            }
            _ => operation_command(self.ws, self.op),
        }
    }
}

/// The server's state that a crash loses.
struct Run {
    parts: Vec<ManualPartition<Kv>>,
    /// The client each tag was sent for, and the operation.
    tags: BTreeMap<u64, (usize, u64)>,
    next_tag: u64,
}

/// What the run learned.
#[derive(Debug, Default, PartialEq, Eq)]
struct Stats {
    acknowledged: usize,
    crashes: u32,
    faults: u32,
    /// A hash of every key's answer: one seed, one history.
    digest: u64,
}

fn config() -> Config {
    Config {
        partitions: PARTITIONS,
        idempotency_window_events: 10_000,
        group_commands_max: 4,
        ..Config::default()
    }
}

/// A start: the logs opened against the marks (`acked`), the store redone up to them, and
/// every partition opened with what was acknowledged of it.
fn start(dir: &Path, kv: &Kv, acked: &[Mark]) -> Run {
    let segments = Segments::open(dir, PARTITIONS, &|p| acked[p as usize].plog + 1)
        .expect("the logs hold every acknowledged event");
    let store = EventStore::with_segments(
        Arc::clone(kv),
        AppId(1),
        TrustLevel::Level0,
        Arc::new(segments),
    );
    // A start's redo meets the store's faults too: retried until it is through.
    while store.redo(false).is_err() {}
    let parts = (0..PARTITIONS)
        .map(|p| {
            ManualPartition::open(store.clone(), &config(), p, acked[p as usize])
                .expect("a valid configuration")
        })
        .collect();
    Run {
        parts,
        tags: BTreeMap::new(),
        next_tag: 0,
    }
}

/// Makes the next store write fail, lose its answer after it was applied, or lose its
/// request; or the next store sync fail.
fn inject(kv: &Kv, rng: &mut ChaCha8Rng) {
    match rng.random_range(0..4u32) {
        0 => kv.fail_next(FaultOp::Write, 1),
        1 => kv.lose_answers_next(1),
        2 => kv.fail_next(FaultOp::Sync, 1),
        _ => kv.lose_requests_next(1),
    }
}

fn run_seed(seed: u64) -> Stats {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    // On a tmpfs where there is one: a group's sync costs nothing there, and a crash keeps
    // the files as the page cache keeps them for a killed process.
    let shm = Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    }
    .expect("a directory");
    let kv: Kv = Arc::new(FaultyStore::new(MemoryStore::new()));
    // Lost writes are groups' batches (their frames already in the log); any write may fail.
    kv.lose_only(|b| b.iter().any(|i| i.key.partition.first() == Some(&TAG_WLOG)));
    let mut acked = vec![Mark::default(); PARTITIONS as usize];
    let mut run = start(dir.path(), &kv, &acked);
    let mut clients: Vec<Client> = (0..CLIENTS)
        .map(|ws| Client {
            ws: ws + 1,
            op: 0,
            sent_at: None,
            last: None,
            record: None,
            updated: None,
        })
        .collect();
    // Every key's first answer, and the key each PLog offset was acknowledged to.
    let mut answered: BTreeMap<String, Outcome> = BTreeMap::new();
    let mut offsets: BTreeMap<(u32, u64), String> = BTreeMap::new();
    let mut stats = Stats::default();

    for tick in 0..FAULT_TICKS + CALM_TICKS {
        let now = tick * TICK_MS;
        let faulty = tick < FAULT_TICKS;
        if faulty && rng.random_range(0..1_000u32) < CRASH_PER_MILLE {
            stats.crashes += 1;
            drop(run);
            run = start(dir.path(), &kv, &acked);
            for c in &mut clients {
                c.sent_at = None;
            }
        }
        if faulty && rng.random_range(0..1_000u32) < FAULT_PER_MILLE {
            stats.faults += 1;
            inject(&kv, &mut rng);
        }
        if tick == FAULT_TICKS {
            // The clients finish their current operations and send no more, and the store
            // loses the next group's batch (one of the last): what was acknowledged must be
            // in the store without a later command bringing it up to the log.
            kv.heal();
            kv.lose_requests_next(1);
            for c in &mut clients {
                c.last = Some(c.op);
            }
        }
        for (i, c) in clients.iter_mut().enumerate() {
            if c.sent_at.is_some_and(|at| now < at + CLIENT_TIMEOUT_MS)
                || c.last.is_some_and(|last| c.op > last)
            {
                continue;
            }
            let p = WsId(c.ws).partition(PARTITIONS);
            let tag = run.next_tag;
            run.next_tag += 1;
            run.tags.insert(tag, (i, c.op));
            let key = IdempotencyKey::new(&operation_key(c.ws, c.op)).expect("a valid key");
            run.parts[p as usize].submit(tag, c.command(), Some(key), now);
            c.sent_at = Some(now);
        }
        for (p, part) in run.parts.iter_mut().enumerate() {
            let _ = part.step();
            let answers = part.advance(now);
            // What a partition acknowledged is in its marks before the answers leave.
            if !part.starting() {
                acked[p] = acked[p].max(&part.acked());
            }
            for (tag, answer) in answers {
                let Some((i, op)) = run.tags.remove(&tag) else {
                    continue;
                };
                let c = &mut clients[i];
                let out = match answer {
                    Ok(out) => out,
                    Err(e) => {
                        assert!(
                            e.is_transient(),
                            "seed {seed}: client {i}'s operation {op} refused for good: {e}"
                        );
                        // Refused for now: sent again at the client's next try.
                        if c.op == op {
                            c.sent_at = None;
                        }
                        continue;
                    }
                };
                let key = operation_key(c.ws, op);
                let created = out.ids.get(&1).copied();
                match answered.get(&key) {
                    Some(first) => assert_eq!(
                        (first.plog_offset, first.wlog_offset, &first.ids),
                        (out.plog_offset, out.wlog_offset, &out.ids),
                        "seed {seed}: key {key} was answered twice differently"
                    ),
                    None => {
                        let slot = (out.partition, out.plog_offset);
                        if let Some(other) = offsets.insert(slot, key.clone()) {
                            panic!(
                                "seed {seed}: PLog offset {} of partition {} acknowledged to \
                                 {other} and to {key}",
                                out.plog_offset, out.partition
                            );
                        }
                        answered.insert(key, out);
                    }
                }
                if c.op == op {
                    match created {
                        Some(id) => c.record = Some(id),
                        None => c.updated = c.record.map(|id| (id, op)),
                    }
                    c.op += 1;
                    c.sent_at = None;
                }
            }
        }
    }
    stats.acknowledged = answered.len();
    stats.digest = {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        for (key, out) in &answered {
            (
                key,
                out.partition,
                out.plog_offset,
                out.wlog_offset,
                &out.ids,
            )
                .hash(&mut h);
        }
        h.finish()
    };

    // No command comes after the last answers: the store alone must hold what they said.
    drop(run);
    let store = EventStore::with_segments(
        Arc::clone(&kv),
        AppId(1),
        TrustLevel::Level0,
        Arc::new(
            Segments::open(dir.path(), PARTITIONS, &|p| acked[p as usize].plog + 1)
                .expect("the logs open"),
        ),
    );
    for (key, out) in &answered {
        let ws = WsId(
            key[1..key.find('-').expect("a key")]
                .parse()
                .expect("a workspace"),
        );
        let event = store
            .read_event(PartitionId(out.partition), PLogOffset(out.plog_offset))
            .expect("the event reads");
        assert!(event.is_some(), "seed {seed}: {key}'s event at {out:?}");
        let wlog = store
            .read_wlog(ws, WLogOffset(out.wlog_offset), 1)
            .expect("the WLog reads");
        assert_eq!(
            wlog.first().map(|e| e.plog_offset.0),
            Some(out.plog_offset),
            "seed {seed}: {key}'s WLog entry {}",
            out.wlog_offset
        );
        for id in out.ids.values() {
            let record = store
                .read_record(ws, RecordId(*id))
                .expect("the record reads");
            assert!(record.is_some(), "seed {seed}: {key}'s record {id}");
        }
    }
    for c in &clients {
        let Some((id, op)) = c.updated else { continue };
        let record = store
            .read_record(WsId(c.ws), RecordId(id))
            .expect("the record reads")
            .expect("an updated record is stored");
        let n = record
            .fields
            .iter()
            .find(|f| f.name == "n")
            .map(|f| &f.value[..]);
        assert_eq!(
            n,
            Some(op.to_string().as_bytes()),
            "seed {seed}: record {id} of workspace {} holds its last acknowledged update {op}",
            c.ws
        );
    }
    stats
}

#[test]
fn simulated_crashes_and_store_faults_on_segment_files_lose_no_acknowledged_command() {
    let seeds: u64 = std::env::var("MONOSEQ_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    let mut total = Stats::default();
    for seed in 0..seeds {
        let stats = run_seed(seed);
        total.acknowledged += stats.acknowledged;
        total.crashes += stats.crashes;
        total.faults += stats.faults;
    }
    eprintln!("{seeds} seeds: {total:?}");
    // The faults happened and the clients were answered through them.
    assert!(total.crashes > 0 && total.faults > 0, "{total:?}");
    assert!(
        total.acknowledged as u64 > seeds * CLIENTS * 20,
        "{total:?}"
    );
}

#[test]
fn a_seed_replays_exactly() {
    assert_eq!(run_seed(7), run_seed(7));
}
