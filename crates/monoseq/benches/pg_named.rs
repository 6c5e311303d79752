//! Named sequences (`monoseq_named::Sequences` on `KvBackend`) on PostgreSQL, beside the same
//! on the embedded store (fjall) in the same run: `next` on one sequence taken one after
//! another, and by 16 concurrent callers of one `Sequences` (which combines them into shared
//! conditional writes). Each criterion element is one number; the contended cases report the
//! time per number with 16 callers.
//!
//! Both stores are durable on return: PostgreSQL commits with `synchronous_commit = on`, and
//! `KvBackend` syncs the embedded store after every write. The embedded store runs in two
//! modes: `Durability::Sync` (one flush per write) and the server's group commit
//! (`GroupCommit { max_delay: 5 ms }`, what `monoseq serve` opens).
//!
//! The stores alternate in rounds (postgres first in odd rounds, last in even ones), so each
//! ratio is taken between neighbouring measurements on this noisy machine.
//!
//! Run: `cargo bench -p monoseq --bench pg_named`. `MONOSEQ_BENCH_ROUNDS` sets the rounds
//! (default 3).

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use monoseq_kv::{Durability, EmbeddedStore, Options};
use monoseq_named::{Address, KvBackend, NextOptions, Sequences};
use monoseq_pg::PgOptions;
use monoseq_pg::testing::PgCluster;
use tokio::runtime::Runtime;

const CALLERS: u64 = 16;

fn address() -> Address {
    "bench/counter".parse().unwrap()
}

/// `iters` numbers taken one after another.
fn sequential(rt: &Runtime, sequences: &Sequences, iters: u64) -> Duration {
    let address = address();
    rt.block_on(async {
        let started = Instant::now();
        for _ in 0..iters {
            sequences.next(&address, &NextOptions::new()).await.unwrap();
        }
        started.elapsed()
    })
}

/// `iters` numbers taken by `CALLERS` tasks of one `Sequences`.
fn contended(rt: &Runtime, sequences: &Sequences, iters: u64) -> Duration {
    let address = address();
    rt.block_on(async {
        let started = Instant::now();
        let per_caller = iters.div_ceil(CALLERS);
        let mut tasks = Vec::new();
        for _ in 0..CALLERS {
            let sequences = sequences.clone();
            let address = address.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..per_caller {
                    sequences.next(&address, &NextOptions::new()).await.unwrap();
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        started.elapsed()
    })
}

fn next(c: &mut Criterion) {
    let rounds = std::env::var("MONOSEQ_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3u64);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cluster = PgCluster::start().unwrap_or_else(|e| panic!("{e}"));
    let root = tempfile::tempdir().unwrap();
    let embedded = |dir: &str, durability: Durability| {
        let store = EmbeddedStore::open(
            root.path().join(dir),
            Options::default().durability(durability),
        )
        .unwrap();
        Sequences::new(KvBackend::new(store))
    };
    let stores: Vec<(&str, Sequences)> = vec![
        (
            "postgres",
            Sequences::new(KvBackend::new(
                cluster.fresh_store(PgOptions::default()).unwrap(),
            )),
        ),
        ("embedded_sync", embedded("sync", Durability::Sync)),
        (
            "embedded_group_commit",
            embedded(
                "group",
                Durability::GroupCommit {
                    max_delay: Duration::from_millis(5),
                },
            ),
        ),
    ];

    let mut g = c.benchmark_group("named_next");
    g.throughput(Throughput::Elements(1))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    for round in 1..=rounds {
        let mut order: Vec<usize> = (0..stores.len()).collect();
        if round % 2 == 0 {
            order.reverse();
        }
        for i in order {
            let (name, sequences) = &stores[i];
            let id = format!("{name}/r{round}");
            g.bench_function(BenchmarkId::new("sequential", &id), |b| {
                b.iter_custom(|iters| sequential(&rt, sequences, iters))
            });
            g.bench_function(BenchmarkId::new("16_callers", &id), |b| {
                b.iter_custom(|iters| contended(&rt, sequences, iters))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, next);
criterion_main!(benches);
