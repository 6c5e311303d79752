//! `next` throughput of named sequences: sequential and under contention, on the in-memory
//! and embedded (fjall) key-value backends, on an S3-compatible server (moto, started on a
//! free port unless `MONOSEQ_S3_ENDPOINT` is set), and with the reservation mode. Each
//! criterion iteration is one number; contended cases report the time per number with 16
//! callers. Contention comes in three shapes: 16 tasks of one `Sequences` on one sequence
//! (combined into shared conditional writes), the same 16 tasks spread over 4 sequences (the
//! ready writes of the 4 combined into one durable write where the backend combines), and 4
//! `Sequences` × 4 tasks on one store (separate writers racing through compare-and-swap, as
//! separate processes would; not run on moto, which is not atomic under simultaneous
//! conditional writes).
//!
//! Run: `cargo bench -p monoseq-named --bench next [-- FILTER]`.

#[allow(dead_code)]
#[path = "../tests/support/moto.rs"]
mod moto;

use std::num::NonZeroU64;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoseq_kv::{Durability, FjallStore, MemoryStore, Options};
use monoseq_named::{
    Address, Backend, KvBackend, NextOptions, ReserveOptions, Reserver, Sequences,
};
use tokio::runtime::Runtime;

const CALLERS: u64 = 16;

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

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

/// `iters` numbers taken by `CALLERS` tasks spread over `instances` (each its own writer) and
/// over `spread` sequences.
fn contended(rt: &Runtime, instances: &[Sequences], spread: u64, iters: u64) -> Duration {
    rt.block_on(async {
        let started = Instant::now();
        let per_caller = iters.div_ceil(CALLERS);
        let mut tasks = Vec::new();
        for caller in 0..CALLERS {
            let sequences = instances[caller as usize % instances.len()].clone();
            let address: Address = match spread {
                1 => address(),
                _ => format!("bench/counter{}", caller % spread).parse().unwrap(),
            };
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

/// `iters` numbers from one reserver (block of 10 000).
fn reserved(rt: &Runtime, reserver: &Reserver, iters: u64) -> Duration {
    rt.block_on(async {
        let started = Instant::now();
        for _ in 0..iters {
            reserver.next().await.unwrap();
        }
        started.elapsed()
    })
}

fn reserver(sequences: &Sequences) -> Reserver {
    Reserver::new(
        sequences.clone(),
        address(),
        ReserveOptions::new(NonZeroU64::new(10_000).unwrap()),
    )
}

fn cases(
    c: &mut Criterion,
    name: &str,
    rt: &Runtime,
    make: &dyn Fn() -> Arc<dyn Backend>,
    races: bool,
) {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(4));
    let one = Sequences::new(make());
    group.bench_function("sequential", |b| {
        b.iter_custom(|iters| sequential(rt, &one, iters))
    });
    group.bench_function("16_tasks_one_writer", |b| {
        b.iter_custom(|iters| contended(rt, std::slice::from_ref(&one), 1, iters))
    });
    group.bench_function("16_tasks_one_writer_4_sequences", |b| {
        b.iter_custom(|iters| contended(rt, std::slice::from_ref(&one), 4, iters))
    });
    if races {
        let backend = make();
        let writers: Vec<Sequences> = (0..4)
            .map(|_| Sequences::new(Arc::clone(&backend)))
            .collect();
        group.bench_function("4_writers_x_4_tasks", |b| {
            b.iter_custom(|iters| contended(rt, &writers, 1, iters))
        });
    }
    let reserver = reserver(&one);
    group.bench_function("reserved_block_10000", |b| {
        b.iter_custom(|iters| reserved(rt, &reserver, iters))
    });
    group.finish();
}

/// Fresh fjall stores in directories under `root`.
fn fjall(root: &Path, durability: Durability) -> impl Fn() -> Arc<dyn Backend> {
    let root = root.to_owned();
    let made = AtomicU32::new(0);
    move || {
        let dir = root.join(made.fetch_add(1, Ordering::SeqCst).to_string());
        let store = FjallStore::open(&dir, Options::default().durability(durability)).unwrap();
        Arc::new(KvBackend::new(store)) as Arc<dyn Backend>
    }
}

fn benches(c: &mut Criterion) {
    let rt = runtime();
    let root = tempfile::tempdir().unwrap();
    cases(
        c,
        "memory",
        &rt,
        &|| Arc::new(KvBackend::new(MemoryStore::new())),
        true,
    );
    cases(
        c,
        "fjall_sync",
        &rt,
        &fjall(root.path(), Durability::Sync),
        true,
    );
    cases(
        c,
        "fjall_group_commit",
        &rt,
        &fjall(
            root.path(),
            Durability::GroupCommit {
                max_delay: Duration::from_millis(2),
            },
        ),
        true,
    );
    cases(
        c,
        "s3_moto",
        &rt,
        &|| Arc::new(moto::backend("bench")),
        false,
    );
}

criterion_group!(named, benches);
criterion_main!(named);
