//! PostgreSQL store benchmarks, each beside the same measurement on the embedded store
//! (fjall, flushed on every write so both are durable on return) in the same run: single-row
//! puts and gets, batches of 100 items (conditional inserts, the event store's level-0 path, and puts),
//! and a PLog replay through `PLogSeqStorage::replay_plog`. The group `fence` measures the
//! same batches through the plain store and through a `FencedPgStore` holding its lease,
//! durable and with the server's `fsync` off.
//!
//! Run: `cargo bench -p monoseq --bench pg`. The server is a private cluster in a temporary
//! directory on the same disk as the embedded store, `fsync` and `synchronous_commit` on.
//! `MONOSEQ_BENCH_EVENTS` sets the events in the replayed PLog (default 100 000).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use monoseq_core::{PLogOffset, ReplayEnd, SeqStorage, WsKind};
use monoseq_kv::{Durability, EmbeddedStore, Key, KvStore, Options, WriteBatch};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{PgOptions, PgStore};
use monoseq_store::{AppId, Event, EventStore, PartitionId, TrustLevel};

const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(0);
const KIND: WsKind = WsKind(1);
const GROUP_EVENTS: usize = 1000;
const WORKSPACES: u64 = 1000;

fn events_in_plog() -> u64 {
    std::env::var("MONOSEQ_BENCH_EVENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// The two stores under test, each in a fresh place.
struct Stores {
    _cluster: PgCluster,
    _dir: tempfile::TempDir,
    pg: Arc<dyn KvStore>,
    embedded: Arc<dyn KvStore>,
}

impl Stores {
    fn new() -> Stores {
        let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
        let pg = PgStore::open(&cluster.url(DATABASE), PgOptions::default()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let embedded =
            EmbeddedStore::open(dir.path(), Options::default().durability(Durability::Sync))
                .unwrap();
        Stores {
            _cluster: cluster,
            _dir: dir,
            pg: Arc::new(pg),
            embedded: Arc::new(embedded),
        }
    }

    fn each(&self) -> [(&'static str, &Arc<dyn KvStore>); 2] {
        [("postgres", &self.pg), ("embedded", &self.embedded)]
    }
}

fn writes(c: &mut Criterion) {
    let stores = Stores::new();
    let mut g = c.benchmark_group("write");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    for (name, store) in stores.each() {
        let mut next = 0u64;
        g.throughput(Throughput::Elements(1));
        g.bench_function(BenchmarkId::new("put_single", name), |b| {
            b.iter(|| {
                next += 1;
                store
                    .put(Key::new(b"single", &next.to_be_bytes()), &[7; 100])
                    .unwrap();
            });
        });
        // A read of a stored key: the round trip without a commit's log flush.
        let mut at = 0u64;
        g.bench_function(BenchmarkId::new("get_single", name), |b| {
            b.iter(|| {
                at = at % next + 1;
                store
                    .get(Key::new(b"single", &at.to_be_bytes()))
                    .unwrap()
                    .unwrap()
            });
        });
        g.throughput(Throughput::Elements(100));
        let mut batch = WriteBatch::with_capacity(100, 100 * 120);
        for (kind, conditional) in [("batch100_insert_if_absent", true), ("batch100_put", false)] {
            g.bench_function(BenchmarkId::new(kind, name), |b| {
                b.iter(|| {
                    batch.clear();
                    for _ in 0..100 {
                        next += 1;
                        let clustering = next.to_be_bytes();
                        let key = Key::new(b"batch", &clustering);
                        match conditional {
                            true => batch.insert_if_absent(key, &[7; 100]),
                            false => batch.put(key, &[7; 100]),
                        };
                    }
                    store.write(&batch).unwrap();
                });
            });
        }
    }
    g.finish();
}

/// The `fence` cases: name and insert-if-absent items (0: a single put).
const FENCE_CASES: [(&str, u64); 3] = [
    ("put_single", 0),
    ("batch3_insert_if_absent", 3),
    ("batch100_insert_if_absent", 100),
];
/// Pairs of writes (one plain, one fenced, alternating) of the interleaved comparison.
const INTERLEAVED_PAIRS: usize = 300;

/// Refills `batch` with write number `n` of a `fence` case.
fn fence_batch(batch: &mut WriteBatch, n: u64, items: u64) {
    batch.clear();
    if items == 0 {
        batch.put(Key::new(b"single", &n.to_be_bytes()), &[7; 100]);
    }
    for i in 0..items {
        let clustering = [n.to_be_bytes(), i.to_be_bytes()].concat();
        batch.insert_if_absent(Key::new(b"batch", &clustering), &[7; 100]);
    }
}

/// Alternates plain and fenced writes of one case and prints both medians and their ratio:
/// on a loaded machine, the load drifts between criterion's separate measurements, while
/// alternating writes share it.
fn interleaved(views: &[(&str, &dyn KvStore); 2], case: &str, items: u64, next: &mut u64) {
    let mut batch = WriteBatch::with_capacity(100, 100 * 120);
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..INTERLEAVED_PAIRS {
        for ((_, view), times) in views.iter().zip(&mut times) {
            *next += 1;
            fence_batch(&mut batch, *next, items);
            let began = Instant::now();
            view.write(&batch).unwrap();
            times.push(began.elapsed());
        }
    }
    let [plain, fenced] = times.map(|mut t| {
        t.sort();
        t[t.len() / 2]
    });
    eprintln!(
        "fence/{case} interleaved ({INTERLEAVED_PAIRS} pairs): plain median {plain:?}, fenced \
         median {fenced:?}, fenced/plain {:.2}",
        fenced.as_secs_f64() / plain.as_secs_f64()
    );
}

/// Writes through the plain store and through a fenced view of it, case by case: a single
/// put, a command-like batch of 3 insert-if-absent items, and 100 of them; first durable,
/// then with the server's `fsync` off, which takes the disk's flush (whose latency varies
/// tenfold on a shared machine) out of both sides and leaves the fence's own cost.
fn fence(c: &mut Criterion) {
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let store = PgStore::open(&cluster.url(DATABASE), PgOptions::default()).unwrap();
    let leases = store.leases();
    leases.ensure_partitions(1).unwrap();
    let epoch = leases
        .acquire(0, "bench", Duration::from_secs(3600))
        .unwrap()
        .unwrap();
    let fenced = store.fenced(0, epoch, "bench");
    let views: [(&str, &dyn KvStore); 2] = [("plain", &store), ("fenced", &fenced)];
    let mut g = c.benchmark_group("fence");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    let mut next = 0u64;
    let mut batch = WriteBatch::with_capacity(100, 100 * 120);
    for (disk, fsync) in [("durable", "on"), ("fsync_off", "off")] {
        cluster
            .psql(DATABASE, &format!("ALTER SYSTEM SET fsync = {fsync}"))
            .unwrap();
        cluster.psql(DATABASE, "SELECT pg_reload_conf()").unwrap();
        for (case, items) in FENCE_CASES {
            interleaved(&views, &format!("{case}/{disk}"), items, &mut next);
            g.throughput(Throughput::Elements(items.max(1)));
            for (name, view) in views {
                g.bench_function(BenchmarkId::new(format!("{case}/{disk}"), name), |b| {
                    b.iter(|| {
                        next += 1;
                        fence_batch(&mut batch, next, items);
                        view.write(&batch).unwrap();
                    });
                });
            }
        }
    }
    g.finish();
}

/// The benchmarks' typical small event (`monoseq_store::conformance::sample_event`).
fn event(plog: u64, ws: u64, wlog: u64, id: u64) -> Event {
    monoseq_store::conformance::sample_event(plog, ws, KIND, wlog, id)
}

fn populate<S: KvStore>(store: &EventStore<S>, n: u64) {
    let mut group = Vec::with_capacity(GROUP_EVENTS);
    for i in 0..n {
        let ws = 1 + i % WORKSPACES;
        let k = i / WORKSPACES;
        group.push(event(i + 1, ws, k + 1, 322_685_000_131_072 + k));
        if group.len() == GROUP_EVENTS {
            store.append(PARTITION, &group).unwrap();
            group.clear();
        }
    }
    store.append(PARTITION, &group).unwrap();
}

fn replay(c: &mut Criterion) {
    let stores = Stores::new();
    let n = events_in_plog();
    let mut g = c.benchmark_group("replay_plog");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(n));
    for (name, kv) in stores.each() {
        let store = EventStore::new(Arc::clone(kv), APP, TrustLevel::Level2);
        let began = Instant::now();
        populate(&store, n);
        eprintln!("populated {name} with {n} events in {:?}", began.elapsed());
        let seq = store.seq_storage(PARTITION);
        g.bench_function(BenchmarkId::new("events", name), |b| {
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
    }
    g.finish();
}

criterion_group!(benches, writes, replay, fence);
criterion_main!(benches);
