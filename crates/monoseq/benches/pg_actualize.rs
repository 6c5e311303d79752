//! A sequencer's whole actualization from PostgreSQL, beside the same from the embedded store
//! (fjall) in the same run: 100 000 events over 10 000 workspaces (one new CDoc each, as the
//! event store's `actualize` group writes them) are appended through `EventStore`; each
//! iteration resets the stored checkpoint to the PLog's first offset and times a fresh
//! `Sequencer::new_manual` whose `Worker` is stepped until it is no longer actualizing. The
//! store's part alone (`replay_plog`: scan the PLog and decode each event's numbers) is
//! measured beside it.
//!
//! The two stores alternate in rounds (postgres first in odd rounds, embedded first in even
//! ones), so each ratio is taken between neighbouring measurements on this noisy machine.
//!
//! Run: `cargo bench -p monoseq --bench pg_actualize`. `MONOSEQ_BENCH_EVENTS` sets the events
//! (default 100 000), `MONOSEQ_BENCH_WORKSPACES` the workspaces they spread over (default
//! 10 000), `MONOSEQ_BENCH_ROUNDS` the rounds (default 3).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use monoseq_core::{PLogOffset, ReplayEnd, SeqStorage, Sequencer, Status, WsKind};
use monoseq_kv::{Durability, EmbeddedStore, KvStore, Options};
use monoseq_pg::testing::{DATABASE, PgCluster};
use monoseq_pg::{PgOptions, PgStore};
use monoseq_store::{AppId, Event, EventStore, PartitionId, TrustLevel, built_in_params};

const APP: AppId = AppId(1);
const PARTITION: PartitionId = PartitionId(0);
const KIND: WsKind = WsKind(1);
const GROUP_EVENTS: usize = 1000;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The benchmarks' typical small event (`monoseq_store::conformance::sample_event`).
fn event(plog: u64, ws: u64, wlog: u64, id: u64) -> Event {
    monoseq_store::conformance::sample_event(plog, ws, KIND, wlog, id)
}

/// Writes `n` events spread round-robin over `workspaces`, in groups of 1 000.
fn populate(store: &EventStore<Arc<dyn KvStore>>, n: u64, workspaces: u64) {
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

/// Sets the stored checkpoint to the PLog's first offset: the next actualization replays the
/// whole PLog.
fn reset_checkpoint(store: &EventStore<Arc<dyn KvStore>>) {
    store
        .seq_storage(PARTITION)
        .write_values_and_next_plog_offset(&[], PLogOffset::FIRST)
        .unwrap();
}

fn actualize(c: &mut Criterion) {
    let n = env_u64("MONOSEQ_BENCH_EVENTS", 100_000);
    let workspaces = env_u64("MONOSEQ_BENCH_WORKSPACES", 10_000);
    let rounds = env_u64("MONOSEQ_BENCH_ROUNDS", 3);

    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let pg: Arc<dyn KvStore> =
        Arc::new(PgStore::open(&cluster.url(DATABASE), PgOptions::default()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let embedded: Arc<dyn KvStore> = Arc::new(
        EmbeddedStore::open(dir.path(), Options::default().durability(Durability::Sync)).unwrap(),
    );
    let stores: Vec<(&str, EventStore<Arc<dyn KvStore>>)> =
        [("postgres", pg), ("embedded", embedded)]
            .into_iter()
            .map(|(name, kv)| {
                let store = EventStore::new(kv, APP, TrustLevel::Level2);
                let t = Instant::now();
                populate(&store, n, workspaces);
                eprintln!(
                    "populated {name} with {n} events over {workspaces} workspaces in {:?}",
                    t.elapsed()
                );
                (name, store)
            })
            .collect();

    let mut g = c.benchmark_group("actualize");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(n));
    for round in 1..=rounds {
        let order: Vec<usize> = if round % 2 == 1 {
            vec![0, 1]
        } else {
            vec![1, 0]
        };
        for i in order {
            let (name, store) = &stores[i];
            let id = format!("{name}/{workspaces}ws/r{round}");
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
            // As in monoseq-store's `actualize` group: the first iteration writes every
            // workspace's numbers, later ones read them and find nothing newer to write (a
            // restart whose projection kept up).
            g.bench_function(BenchmarkId::new("sequencer", &id), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        reset_checkpoint(store);
                        let params = built_in_params([KIND]).build().unwrap();
                        let (seq, mut worker) =
                            Sequencer::new_manual(params, store.seq_storage(PARTITION));
                        let t = Instant::now();
                        while matches!(seq.status(), Status::None | Status::Actualizing) {
                            worker.step();
                        }
                        total += t.elapsed();
                        assert_eq!(seq.status(), Status::Ready);
                        assert_eq!(
                            seq.storage().replayed_events(),
                            n,
                            "replayed the whole PLog"
                        );
                    }
                    total
                });
            });
        }
    }
    g.finish();
}

criterion_group!(benches, actualize);
criterion_main!(benches);
