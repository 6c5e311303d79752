//! What handling a command costs the processor itself, apart from storage I/O: the CPU time of
//! one command from its submission (validation, encoding, the storable check) through its
//! group (sequencing, the read of an updated record, numbering, the batch write) to its
//! answer, for creates and for updates. One partition ([`ManualPartition`], the writer the
//! partition task drives) runs on this thread over the in-memory store (no journal, no sync,
//! no marks), in groups of [`GROUP_COMMANDS`]; its sequencer's numbers are flushed every
//! [`FLUSH_EVERY_GROUPS`] groups, as a busy partition's flusher does. The time measured is
//! this thread's CPU time, not the wall clock, so that other processes on the machine do not
//! count; and from it the CPU time spent inside the store's batch writes (`KvStore::write`: the
//! memory engine putting the group's event, WLog entry and records, and the sequencer's
//! flushes) is taken out, because those writes are the same bytes whatever the processor does
//! and would otherwise be half of what is measured. Reads stay in: reading an updated record
//! is the processor's work. The store's writes per command are printed to standard error
//! (`command_cost/updates: the store's writes took 3.1 µs CPU per command besides`).
//!
//! `command_cost/creates`: every command creates a CDoc and carries an argument ODoc referring
//! to it. `command_cost/updates`: one record per workspace is created first, then every
//! command sets a field of its workspace's record and carries an argument ODoc naming it (the
//! commands of `monoseq bench` and `monoseq bench --updates`).
//!
//! Run: `cargo bench -p monoseq-cp --bench command_cost`; `scripts/bench command-cost` runs it
//! against an earlier build too (`MONOSEQ_BEFORE_TREE`). Only [`run_group`] and [`open`]
//! depend on the partition's API, so that the same file runs on earlier builds.

use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use monoseq_cp::{Command, CommandError, Config, ManualPartition, Outcome};
use monoseq_kv::{
    CasError, Key, KvError, KvStore, MemoryStore, Order, Visitor, WriteBatch, WriteError,
};
use monoseq_store::{AppId, EventStore, Mark, TrustLevel};
use serde_json::json;

/// Workspaces the commands spread over (`monoseq bench`'s default).
const WORKSPACES: u64 = 1_000;
/// Commands per group: what a partition's group holds at 64 clients over 4 partitions.
const GROUP_COMMANDS: usize = 16;
/// Groups between two flushes of the sequencer's numbers.
const FLUSH_EVERY_GROUPS: u64 = 64;
/// Most sequencer steps a start takes before the bench gives up.
const START_STEPS_MAX: u64 = 1_000;

type Partition = ManualPartition<Arc<TimedStore>>;

/// This thread's CPU time so far.
fn thread_cpu() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The in-memory store, counting the CPU time its batch writes take.
#[derive(Debug, Default)]
struct TimedStore {
    inner: MemoryStore,
    /// CPU time inside [`KvStore::write`] so far, in nanoseconds.
    write_ns: AtomicU64,
}

impl TimedStore {
    fn writes(&self) -> Duration {
        Duration::from_nanos(self.write_ns.load(Ordering::Relaxed))
    }
}

impl KvStore for TimedStore {
    fn get(&self, key: Key<'_>) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key)
    }

    fn get_many(&self, keys: &[Key<'_>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.inner.get_many(keys)
    }

    fn scan(
        &self,
        partition: &[u8],
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        order: Order,
        visit: &mut Visitor<'_>,
    ) -> Result<(), KvError> {
        self.inner.scan(partition, from, to, order, visit)
    }

    fn write(&self, batch: &WriteBatch) -> Result<(), WriteError> {
        let began = thread_cpu();
        let written = self.inner.write(batch);
        let took = thread_cpu().saturating_sub(began);
        self.write_ns
            .fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
        written
    }

    fn compare_and_swap(
        &self,
        key: Key<'_>,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<(), CasError> {
        self.inner.compare_and_swap(key, expected, new)
    }

    fn sync(&self) -> Result<(), KvError> {
        self.inner.sync()
    }
}

/// Creates a CDoc (raw ID 1) in `ws`, with an argument ODoc referring to it.
fn create(ws: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "bench.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "bench.Doc", "fields": {"n": ws}}],
        "argument": {"raw_id": 2, "name": "bench.Arg", "fields": {"doc": {"$raw": 1}}},
    }))
    .expect("a valid command")
}

/// Sets field `n` of record `id` of `ws`, with an argument ODoc naming it.
fn update(ws: u64, id: u64, n: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "bench.Update",
        "update": [{"id": id, "fields": {"n": n}}],
        "argument": {"raw_id": 1, "name": "bench.Arg", "fields": {"doc": id}},
    }))
    .expect("a valid command")
}

/// Partition 0 of `store`, serving; the simulated time it took.
fn open(store: EventStore<Arc<TimedStore>>) -> (Partition, u64) {
    let config = Config {
        partitions: 1,
        ..Config::default()
    };
    let mut part = ManualPartition::open(store, &config, 0, Mark::default()).expect("open");
    let mut ms = 0;
    while !part.ready() {
        assert!(ms < START_STEPS_MAX, "the partition did not start");
        part.step();
        part.advance(ms);
        ms += 1;
    }
    (part, ms)
}

/// Runs one group of `commands` at simulated time `ms`; their answers.
fn run_group(part: &mut Partition, ms: u64, commands: Vec<Command>) -> Vec<Outcome> {
    for (tag, cmd) in commands.into_iter().enumerate() {
        part.submit(tag as u64, cmd, None, ms);
    }
    let answers: Vec<(u64, Result<Outcome, CommandError>)> = part.advance(ms);
    answers
        .into_iter()
        .map(|(_, a)| a.expect("the command succeeds"))
        .collect()
}

/// A serving partition, the simulated time and the groups run so far.
struct Bench {
    part: Partition,
    store: Arc<TimedStore>,
    ms: u64,
    groups: u64,
    /// The commands handed out so far.
    n: u64,
    /// The commands measured, and the CPU time the store's writes took in them.
    measured: (u64, Duration),
}

impl Bench {
    fn new() -> Bench {
        let store = Arc::new(TimedStore::default());
        let events = EventStore::new(Arc::clone(&store), AppId(1), TrustLevel::Level0);
        let (part, ms) = open(events);
        Bench {
            part,
            store,
            ms,
            groups: 0,
            n: 0,
            measured: (0, Duration::ZERO),
        }
    }

    /// Runs the groups of commands; the answers in order.
    fn run(&mut self, groups: Vec<Vec<Command>>) -> Vec<Outcome> {
        let mut out = Vec::with_capacity(groups.len() * GROUP_COMMANDS);
        for group in groups {
            out.extend(run_group(&mut self.part, self.ms, group));
            self.ms += 1;
            self.groups += 1;
            if self.groups.is_multiple_of(FLUSH_EVERY_GROUPS) {
                self.part.step();
            }
        }
        out
    }

    /// The next `count` commands in groups: creates, or (with `records`, by workspace)
    /// updates.
    fn commands(&mut self, count: u64, records: Option<&[u64]>) -> Vec<Vec<Command>> {
        let mut groups = Vec::new();
        for i in 0..count {
            if i % GROUP_COMMANDS as u64 == 0 {
                groups.push(Vec::with_capacity(GROUP_COMMANDS));
            }
            self.n += 1;
            // Spread over the workspaces as `monoseq bench`'s clients are.
            let ws = (self.n * 7_919) % WORKSPACES + 1;
            let cmd = match records {
                Some(ids) => update(ws, ids[(ws - 1) as usize], self.n),
                None => create(ws),
            };
            if let Some(group) = groups.last_mut() {
                group.push(cmd);
            }
        }
        groups
    }

    /// CPU time of `iters` commands, the store's writes taken out. The commands are made
    /// before the clock starts.
    fn measure(&mut self, iters: u64, records: Option<&[u64]>) -> Duration {
        let groups = self.commands(iters, records);
        let writes = self.store.writes();
        let began = thread_cpu();
        let answers = self.run(groups);
        let cpu = thread_cpu().saturating_sub(began);
        let writes = self.store.writes().saturating_sub(writes);
        assert_eq!(answers.len() as u64, iters, "every command was answered");
        self.measured.0 += iters;
        self.measured.1 += writes;
        cpu.saturating_sub(writes)
    }

    /// Prints the CPU time the store's writes took per measured command.
    fn report_writes(&self, name: &str) {
        let (commands, writes) = self.measured;
        let per = writes.as_secs_f64() * 1e6 / commands.max(1) as f64;
        eprintln!("{name}: the store's writes took {per:.2} µs CPU per command besides");
    }
}

fn command_cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("command_cost");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    let mut creates = Bench::new();
    group.bench_function("creates", |b| {
        b.iter_custom(|iters| creates.measure(iters, None));
    });
    creates.report_writes("command_cost/creates");
    drop(creates);
    let mut updates = Bench::new();
    let setup: Vec<Command> = (1..=WORKSPACES).map(create).collect();
    let groups = setup.chunks(GROUP_COMMANDS).map(<[_]>::to_vec).collect();
    let records: Vec<u64> = updates.run(groups).iter().map(|o| o.ids[&1]).collect();
    group.bench_function("updates", |b| {
        b.iter_custom(|iters| updates.measure(iters, Some(&records)));
    });
    updates.report_writes("command_cost/updates");
    group.finish();
}

criterion_group!(benches, command_cost);
criterion_main!(benches);
