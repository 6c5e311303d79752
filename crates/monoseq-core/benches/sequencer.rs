//! Sequencer benchmarks: (a) cycles on one hot workspace, (b) cycles over 1 000 000 workspaces
//! rotating through the default 100 000-entry cache, (c) actualization of 1 000 000 events
//! spread over 1, 10 000 and 1 000 000 workspaces. One cycle is start, next(WLog offset),
//! 2 × next(record ID), flush, on the in-memory storage. A naive mutex-and-hash-map sequencer
//! runs beside them as a same-machine baseline.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use monoseq_core::mem::MemSeqStorage;
use monoseq_core::{
    Number, NumberKey, PLogOffset, Params, Runtime, SeqId, SeqStorage, SeqValue, Sequencer, Start,
    Status, Step, WsId, WsKind,
};

const KIND: WsKind = WsKind(1);
const WLOG: SeqId = SeqId(1);
const CREC: SeqId = SeqId(2);
const OWREC: SeqId = SeqId(3);

fn params() -> Params {
    params_with(Params::builder())
}

fn params_with(b: monoseq_core::ParamsBuilder) -> Params {
    b.kind(
        KIND,
        [
            (WLOG, Number(1)),
            (CREC, Number(322_685_000_131_072)),
            (OWREC, Number(322_680_000_131_072)),
        ],
    )
    .build()
    .unwrap()
}

/// One cycle; spins while the sequencer answers busy (counted), yielding the thread.
#[inline]
fn cycle<S: SeqStorage>(seq: &mut Sequencer<S>, ws: WsId, busy: &mut u64) -> Number {
    cycle_or(seq, ws, || {
        *busy += 1;
        std::thread::yield_now();
    })
}

/// One cycle; runs `on_busy` each time the sequencer answers busy, then tries again.
#[inline]
fn cycle_or<S: SeqStorage>(seq: &mut Sequencer<S>, ws: WsId, mut on_busy: impl FnMut()) -> Number {
    loop {
        match seq.start(KIND, ws).unwrap() {
            Start::Began(mut tx) => {
                let w = tx.next(WLOG).unwrap();
                let a = tx.next(CREC).unwrap();
                let b = tx.next(CREC).unwrap();
                tx.flush();
                return Number(w.0 ^ a.0 ^ b.0);
            }
            Start::Busy(_) => on_busy(),
        }
    }
}

fn ready<S: SeqStorage>(seq: &Sequencer<S>) {
    assert_eq!(
        seq.handle().wait_actualized(Duration::from_secs(600)),
        Status::Ready
    );
}

/// The naive baseline: every number behind one mutex in one hash map, no persistence.
fn naive_cycle(map: &Mutex<HashMap<NumberKey, u64>>, offset: &mut u64, ws: WsId) -> u64 {
    let mut m = map.lock().unwrap();
    *offset += 1;
    let mut x = *offset;
    for seq in [WLOG, CREC, CREC] {
        let e = m.entry(NumberKey { ws, seq }).or_insert(0);
        *e += 1;
        x ^= *e;
    }
    x
}

fn hot_workspace(c: &mut Criterion) {
    let runtime = Runtime::new(1).unwrap();
    let mut g = c.benchmark_group("a_hot_workspace");
    g.throughput(Throughput::Elements(1));
    let storage = MemSeqStorage::new();
    let mut seq = Sequencer::new(params(), storage, &runtime);
    ready(&seq);
    let mut busy = 0;
    g.bench_function("cycle", |b| {
        b.iter(|| cycle(&mut seq, black_box(WsId(7)), &mut busy))
    });
    let map = Mutex::new(HashMap::new());
    let mut offset = 0;
    g.bench_function("naive_baseline", |b| {
        b.iter(|| naive_cycle(&map, &mut offset, black_box(WsId(7))))
    });
    g.finish();
    eprintln!("a_hot_workspace: busy answers {busy}");
    seq.shutdown();
}

/// The backlog limit the `monoseq` server's command processor runs with.
const SERVER_BACKLOG: usize = 8192;

fn rotating_workspaces(c: &mut Criterion) {
    let runtime = Runtime::new(1).unwrap();
    let mut g = c.benchmark_group("b_rotating_1m_workspaces");
    g.throughput(Throughput::Elements(1));
    g.sample_size(20);
    rotate(&mut g, &runtime, "cycle", params());
    rotate(
        &mut g,
        &runtime,
        "cycle_server_backlog",
        params_with(Params::builder().backlog_values_max(SERVER_BACKLOG)),
    );
    rotate_inline_worker(&mut g);
    let map = Mutex::new(HashMap::new());
    let mut offset = 0;
    let mut j = 0u64;
    g.bench_function("naive_baseline", |b| {
        b.iter(|| {
            j += 1;
            naive_cycle(&map, &mut offset, WsId(j % ROTATING_WORKSPACES))
        })
    });
    g.finish();
}

const ROTATING_WORKSPACES: u64 = 1_000_000;

fn rotate(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    runtime: &Runtime,
    name: &str,
    params: Params,
) {
    let mut seq = Sequencer::new(params, MemSeqStorage::new(), runtime);
    ready(&seq);
    let mut busy = 0;
    let mut i = 0u64;
    // Warm up: one full rotation, so storage holds every workspace and the cache is full.
    for _ in 0..ROTATING_WORKSPACES {
        cycle(&mut seq, WsId(i % ROTATING_WORKSPACES), &mut busy);
        i += 1;
    }
    g.bench_function(name, |b| {
        b.iter(|| {
            i += 1;
            cycle(&mut seq, WsId(i % ROTATING_WORKSPACES), &mut busy)
        })
    });
    let stats = seq.cache_stats();
    let flushes = seq.handle().stats().flushes;
    eprintln!(
        "b_rotating_1m_workspaces/{name}: cache hits {} misses {}, busy answers {busy}, \
         flushes {flushes}",
        stats.hits, stats.misses
    );
    seq.shutdown();
}

/// The same rotation with the worker stepped on the benchmark's own thread whenever `start`
/// answers busy (`Sequencer::new_manual`, as an embedder's single-threaded event loop would):
/// each cycle then pays its share of flushing itself, with no hand-off between threads.
fn rotate_inline_worker(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    let (mut seq, mut worker) = Sequencer::new_manual(params(), MemSeqStorage::new());
    assert_eq!(worker.step(), Step::Idle);
    let mut steps = 0u64;
    let mut cycle_inline = |seq: &mut Sequencer<Arc<MemSeqStorage>>, ws: WsId| {
        cycle_or(seq, ws, || {
            worker.step();
            steps += 1;
        })
    };
    let mut i = 0u64;
    for _ in 0..ROTATING_WORKSPACES {
        cycle_inline(&mut seq, WsId(i % ROTATING_WORKSPACES));
        i += 1;
    }
    g.bench_function("cycle_inline_worker", |b| {
        b.iter(|| {
            i += 1;
            cycle_inline(&mut seq, WsId(i % ROTATING_WORKSPACES))
        })
    });
    eprintln!("b_rotating_1m_workspaces/cycle_inline_worker: worker steps {steps}");
}

/// A PLog of `events` events, each with one WLog offset and two record IDs, spread evenly over
/// `workspaces` workspaces.
/// Storage has room for every workspace, as a store that already holds them would: the timed
/// part is the sequencer's work, not the in-memory map growing.
fn plog(events: u64, workspaces: u64) -> Arc<MemSeqStorage> {
    let storage = MemSeqStorage::with_workspaces(workspaces as usize);
    for o in 1..=events {
        let ws = WsId(o % workspaces);
        let round = o / workspaces + 1;
        storage
            .append_event(
                PLogOffset(o),
                KIND,
                &[
                    SeqValue::new(ws, WLOG, Number(round)),
                    SeqValue::new(ws, CREC, Number(322_685_000_131_072 + 2 * round)),
                    SeqValue::new(ws, CREC, Number(322_685_000_131_073 + 2 * round)),
                ],
            )
            .unwrap();
    }
    storage
}

/// Times `run` on a fresh copy of `pristine` per iteration; `run` answers the time of its
/// measured part (the copy is made outside it).
fn on_copies(
    b: &mut criterion::Bencher<'_>,
    pristine: &MemSeqStorage,
    mut run: impl FnMut(Arc<MemSeqStorage>) -> Duration,
) {
    b.iter_custom(|iters| (0..iters).map(|_| run(pristine.snapshot())).sum());
}

fn naive_actualize(storage: &MemSeqStorage) {
    let mut max: HashMap<NumberKey, Number> = HashMap::new();
    let mut next = PLogOffset::FIRST;
    storage
        .replay_plog(PLogOffset::FIRST, &mut |e: monoseq_core::ReplayedEvent<
            '_,
        >| {
            for v in e.values {
                let n = max.entry(v.key).or_default();
                *n = (*n).max(v.value);
            }
            next = e.offset.next();
            std::ops::ControlFlow::Continue(())
        })
        .unwrap();
    let values: Vec<SeqValue> = max
        .into_iter()
        .map(|(key, value)| SeqValue { key, value })
        .collect();
    storage
        .write_values_and_next_plog_offset(&values, next)
        .unwrap();
}

fn actualization(c: &mut Criterion) {
    const EVENTS: u64 = 1_000_000;
    let mut g = c.benchmark_group("c_actualize_1m_events");
    g.throughput(Throughput::Elements(EVENTS));
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(20));
    for workspaces in [1u64, 10_000, 1_000_000] {
        let pristine = plog(EVENTS, workspaces);
        // Baseline: the least an actualizer does, folding every event into one hash map by
        // maximum and writing the result to the same storage at once, with no budget, no
        // compare with stored numbers and no checkpoint until the end.
        g.bench_with_input(
            BenchmarkId::new("naive_baseline", workspaces),
            &workspaces,
            |b, _| {
                on_copies(b, &pristine, |storage| {
                    let began = Instant::now();
                    naive_actualize(&storage);
                    began.elapsed()
                })
            },
        );
        g.bench_with_input(
            BenchmarkId::new("sequencer", workspaces),
            &workspaces,
            |b, _| {
                on_copies(b, &pristine, |storage| {
                    let (seq, mut worker) = Sequencer::new_manual(params(), storage);
                    let began = Instant::now();
                    assert_eq!(worker.step(), Step::Idle);
                    let elapsed = began.elapsed();
                    assert_eq!(seq.status(), Status::Ready);
                    black_box(seq);
                    elapsed
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, hot_workspace, rotating_workspaces, actualization);
criterion_main!(benches);
