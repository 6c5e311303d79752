//! Event store benchmarks: actualization straight from the embedded stores (the PLog scan
//! alone, and the sequencer's whole actualization on top of it) with the events of one
//! workspace and of 100 000 workspaces; durable event appends with group commit; the
//! decoding that replay relies on; and reading a page of a workspace's WLog.
//!
//! Run: `cargo bench -p monoseq-store --bench event_store`. `MONOSEQ_BENCH_EVENTS` sets the
//! number of events in the PLog (default 1 000 000); filters that start with a group's name
//! (`-- actualize`, `-- append_durable/events/fjall`) pick groups and skip preparing the
//! others. Throughput is printed in events per second ("elem/s").

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use monoseq_core::{
    Number, PLogOffset, ReplayEnd, SeqId, SeqStorage, SeqValue, Sequencer, Status, WsId, WsKind,
};
use monoseq_kv::{Durability, FjallStore, KvStore, Options, RedbStore};
use monoseq_store::{
    AppId, Event, EventStore, PartitionId, TrustLevel, built_in_params, decode_numbers,
};

const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(0);
const KIND: WsKind = WsKind(1);
const GROUP_EVENTS: usize = 1000;

fn events_in_plog() -> u64 {
    std::env::var("MONOSEQ_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000)
}

/// The benchmarks' typical small event (`monoseq_store::conformance::sample_event`).
fn event(plog: u64, ws: u64, wlog: u64, id: u64) -> Event {
    monoseq_store::conformance::sample_event(plog, ws, KIND, wlog, id)
}

/// Writes `n` events spread round-robin over `workspaces` into `store`, in groups.
fn populate<S: KvStore>(store: &EventStore<S>, n: u64, workspaces: u64) {
    let mut group = Vec::with_capacity(GROUP_EVENTS);
    for i in 0..n {
        let ws = 1 + i % workspaces;
        let k = i / workspaces; // events already in this workspace
        group.push(event(i + 1, ws, k + 1, 322_685_000_131_072 + k));
        if group.len() == GROUP_EVENTS {
            store.append(PARTITION, &group).unwrap();
            group.clear();
        }
    }
    store.append(PARTITION, &group).unwrap();
    store.sync().unwrap();
}

enum Engine {
    Fjall,
    Redb,
}

impl Engine {
    fn name(&self) -> &'static str {
        match self {
            Engine::Fjall => "fjall",
            Engine::Redb => "redb",
        }
    }

    fn open(&self, dir: &std::path::Path, durability: Durability) -> Arc<dyn KvStore> {
        let options = Options::default().durability(durability);
        match self {
            Engine::Fjall => Arc::new(FjallStore::open(dir, options).unwrap()),
            Engine::Redb => Arc::new(RedbStore::open(dir, options).unwrap()),
        }
    }
}

/// Whether the command line selects benchmarks of `group`: no filter, or a filter that starts
/// with the group's name (or is a prefix of it). Lets a run of other groups skip populating
/// the PLogs, which takes tens of seconds.
fn selected(group: &str) -> bool {
    let mut args = std::env::args().skip(1);
    let mut filters = Vec::new();
    while let Some(a) = args.next() {
        if a.starts_with("--") {
            // Options that take a value.
            if matches!(
                a.as_str(),
                "--profile-time" | "--save-baseline" | "--baseline" | "--sample-size"
            ) {
                args.next();
            }
        } else {
            filters.push(a);
        }
    }
    // A filter is a regular expression: `a|b` selects the groups either alternative does.
    filters.is_empty()
        || filters
            .iter()
            .flat_map(|f| f.split('|'))
            .any(|f| f.starts_with(group) || group.starts_with(f))
}

fn actualize(c: &mut Criterion) {
    if !selected("actualize") {
        return;
    }
    let n = events_in_plog();
    let mut g = c.benchmark_group("actualize");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(n));
    for engine in [Engine::Fjall, Engine::Redb] {
        for workspaces in [1u64, 100_000] {
            let dir = tempfile::tempdir().unwrap();
            let kv = engine.open(dir.path(), Durability::Manual);
            let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level2);
            let t = Instant::now();
            populate(&store, n, workspaces);
            eprintln!(
                "populated {} with {n} events over {workspaces} workspaces in {:?}",
                engine.name(),
                t.elapsed()
            );
            let id = format!("{}/{workspaces}ws", engine.name());

            // The store's part: scan the PLog and decode each event's numbers (the batcher
            // only folds them, so the figure is the store's, not a map's).
            g.bench_function(BenchmarkId::new("replay_plog", &id), |b| {
                let seq = store.seq_storage(PARTITION);
                b.iter(|| {
                    let mut fold = 0u64;
                    let end = seq
                        .replay_plog(PLogOffset::FIRST, &mut |e| {
                            for v in e.values {
                                fold = fold.wrapping_add(v.value.0 ^ v.key.ws.0);
                            }
                            ControlFlow::Continue(())
                        })
                        .unwrap();
                    assert_eq!(end, ReplayEnd::Completed);
                    fold
                });
            });

            // The whole actualization of a new sequencer with no checkpoint: replay, merge,
            // compare with the stored numbers and write what is new, with the default
            // parameters. Between iterations only the checkpoint is reset, so the stored
            // numbers are those the first iteration wrote: later iterations read every
            // workspace's numbers and find nothing newer to write, as a restart whose
            // projection kept up does.
            g.bench_function(BenchmarkId::new("sequencer", &id), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        reset_projection(&store);
                        let params = built_in_params([KIND]).build().unwrap();
                        let (seq, mut worker) =
                            Sequencer::new_manual(params, store.seq_storage(PARTITION));
                        let t = Instant::now();
                        while seq.status() != Status::Ready {
                            worker.step();
                        }
                        total += t.elapsed();
                        assert_eq!(
                            seq.storage().replayed_events(),
                            n,
                            "replayed the whole PLog"
                        );
                    }
                    total
                });
            });
            drop(store);
            drop(kv);
        }
    }
    g.finish();
}

/// Resets the checkpoint so that the next actualization replays the whole PLog.
fn reset_projection<S: KvStore + Clone>(store: &EventStore<S>) {
    store
        .seq_storage(PARTITION)
        .write_values_and_next_plog_offset(&[], PLogOffset::FIRST)
        .unwrap();
}

fn append(c: &mut Criterion) {
    let mut g = c.benchmark_group("append_durable");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5));
    for engine in [Engine::Fjall, Engine::Redb] {
        for trust in [TrustLevel::Level0, TrustLevel::Level2] {
            for group in [1usize, 100, 1000] {
                let dir = tempfile::tempdir().unwrap();
                // Every write is flushed before it returns: one fsync per group.
                let kv = engine.open(dir.path(), Durability::Sync);
                let store = EventStore::new(kv, APP, trust);
                let mut next = 1u64;
                g.throughput(Throughput::Elements(group as u64));
                let id = format!("{}/{trust:?}/group{group}", engine.name());
                g.bench_function(BenchmarkId::new("events", id), |b| {
                    let mut events = Vec::with_capacity(group);
                    b.iter(|| {
                        events.clear();
                        for _ in 0..group {
                            let ws = 1 + next % 1000;
                            let k = next / 1000;
                            events.push(event(next, ws, k + 1, 322_685_000_131_072 + k));
                            next += 1;
                        }
                        store.append(PARTITION, &events).unwrap();
                    });
                });
            }
        }
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let bytes = event(1, 7, 1, 322_685_000_131_072).encode().unwrap();
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(1));
    g.bench_function(format!("numbers/{}B", bytes.len()), |b| {
        let mut out: Vec<SeqValue> = Vec::with_capacity(8);
        b.iter(|| {
            out.clear();
            decode_numbers(std::hint::black_box(&bytes), &mut out).unwrap()
        });
    });
    g.bench_function(format!("full/{}B", bytes.len()), |b| {
        b.iter(|| Event::decode(std::hint::black_box(&bytes)).unwrap());
    });
    g.finish();
}

/// Reading a workspace's numbers (what a sequencer's cache miss costs) among 100 000
/// workspaces' projections.
fn read_numbers(c: &mut Criterion) {
    if !selected("read_numbers") {
        return;
    }
    let mut g = c.benchmark_group("read_numbers");
    g.throughput(Throughput::Elements(1));
    for engine in [Engine::Fjall, Engine::Redb] {
        let dir = tempfile::tempdir().unwrap();
        let kv = engine.open(dir.path(), Durability::Manual);
        let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level2);
        let seq = store.seq_storage(PARTITION);
        let ids = [SeqId(2), SeqId(3), SeqId(4)];
        let mut values = Vec::new();
        for ws in 1..=100_000u64 {
            for (i, &s) in ids[..2].iter().enumerate() {
                values.push(SeqValue::new(WsId(ws), s, Number(ws + i as u64)));
            }
            if values.len() >= 10_000 {
                seq.write_values_and_next_plog_offset(&values, PLogOffset(2))
                    .unwrap();
                values.clear();
            }
        }
        kv.sync().unwrap();
        let mut ws = 0u64;
        let mut out = [Number(0); 3];
        g.bench_function(engine.name(), |b| {
            b.iter(|| {
                ws = ws * 6_364_136_223_846_793_005 % 100_000 + 1;
                seq.read_numbers(WsId(ws), &ids, &mut out).unwrap();
            });
        });
    }
    g.finish();
}

/// Reading a page of 1 000 events of a workspace's WLog among 100 workspaces whose events
/// interleave in the PLog, with the WLog entries as written (references to the PLog events,
/// resolved by one read of the PLog) and rewritten as the copies written before references.
fn read_wlog(c: &mut Criterion) {
    if !selected("read_wlog") {
        return;
    }
    const WORKSPACES: u64 = 100;
    const PAGE: usize = 1000;
    let mut g = c.benchmark_group("read_wlog");
    g.throughput(Throughput::Elements(PAGE as u64));
    for entries in ["references", "copies"] {
        let dir = tempfile::tempdir().unwrap();
        let kv = Engine::Fjall.open(dir.path(), Durability::Manual);
        let store = EventStore::new(Arc::clone(&kv), APP, TrustLevel::Level2);
        populate(&store, WORKSPACES * PAGE as u64, WORKSPACES);
        if entries == "copies" {
            for plog in 1..=WORKSPACES * PAGE as u64 {
                let key = store.plog_key(PARTITION, PLogOffset(plog));
                let bytes = kv.get(key.as_key()).unwrap().unwrap();
                let e = Event::decode(&bytes).unwrap();
                kv.put(store.wlog_key(e.ws, e.wlog_offset).as_key(), &bytes)
                    .unwrap();
            }
        }
        kv.sync().unwrap();
        let mut ws = 0u64;
        g.bench_function(entries, |b| {
            b.iter(|| {
                ws = ws % WORKSPACES + 1;
                let events = store
                    .read_wlog(WsId(ws), monoseq_store::WLogOffset(1), PAGE)
                    .unwrap();
                assert_eq!(events.len(), PAGE);
            });
        });
    }
    g.finish();
}

criterion_group!(benches, decode, read_numbers, read_wlog, actualize, append);
criterion_main!(benches);
