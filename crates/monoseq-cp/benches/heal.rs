//! Healing benchmark: how long a partition whose sequencer was poisoned (its checkpoint write
//! panicked) takes to serve commands again, on the embedded store. One partition, one client
//! submitting one command at a time; each measured iteration arms one panic, submits until a
//! command fails, then until one succeeds again, and reports the time from the panic to that
//! success (the rebuild waits `REBUILD_DELAY_MIN` first, then actualizes from the PLog).
//! `heal/one_command`, one command's round trip on the same partition while it serves, is the
//! baseline measured in the same run.
//!
//! Run: `cargo bench -p monoseq-cp --bench heal`. Criterion prints the median and the spread;
//! the first failure after the panic and the time from it to the next success are printed to
//! standard error for each iteration when `MONOSEQ_BENCH_HEAL_TRACE` is set.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use monoseq_cp::{Command, CommandProcessor, Config, REBUILD_DELAY_MIN};
use monoseq_kv::{EmbeddedStore, FaultyStore, Options};
use monoseq_store::{AppId, EventStore, TrustLevel};
use serde_json::json;

/// Backtrace of the last injected panic, printed if the bench stalls.
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// The checkpoint table's tag (`docs/format.md`).
const TAG_CHECKPOINT: u8 = 0x05;
/// Pause between two tries while the partition does not serve (the timer's resolution).
const RETRY_PAUSE: Duration = Duration::from_millis(1);
/// Bound on one heal; a longer one fails the bench.
const HEAL_BOUND: Duration = Duration::from_secs(30);

/// When the next write holding a checkpoint key must panic, and when the last one did.
#[derive(Default)]
struct Trap {
    checkpoint_panics: AtomicU32,
    panicked_at: Mutex<Option<Instant>>,
}

type Store = Arc<FaultyStore<EmbeddedStore>>;

/// The embedded store behind a fault-injecting wrapper whose write hook springs `trap`.
fn store(dir: &std::path::Path, trap: &Arc<Trap>) -> Store {
    let kv = Arc::new(FaultyStore::new(
        EmbeddedStore::open(dir, Options::default()).expect("open the store"),
    ));
    let trap = Arc::clone(trap);
    kv.on_write(move |batch| {
        let checkpoint = batch
            .iter()
            .any(|i| i.key.partition.first() == Some(&TAG_CHECKPOINT));
        if checkpoint
            && trap
                .checkpoint_panics
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                .is_ok()
        {
            *trap.panicked_at.lock().expect("not poisoned") = Some(Instant::now());
            panic!("injected: the checkpoint write panics");
        }
    });
    kv
}

fn command(ws: u64) -> Command {
    serde_json::from_value(json!({
        "ws": ws, "ws_kind": 1, "command": "heal.Create",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "heal.Doc", "fields": {"n": ws}}],
    }))
    .expect("valid command")
}

/// One poison and heal: returns (panic → first success, first failure → first success).
async fn poison_and_heal(
    cp: &CommandProcessor<Store>,
    kv: &Trap,
    ws: &mut u64,
) -> (Duration, Duration) {
    *kv.panicked_at.lock().expect("not poisoned") = None;
    kv.checkpoint_panics.store(1, Ordering::Release);
    let armed = Instant::now();
    let failed_at = loop {
        *ws = *ws % 100 + 1;
        if cp.submit(command(*ws)).await.is_err() {
            break Instant::now();
        }
        if armed.elapsed() > HEAL_BOUND {
            let fired = kv
                .panicked_at
                .lock()
                .expect("not poisoned")
                .map(|t| t - armed);
            let trace = LAST_PANIC.lock().expect("not poisoned").take();
            panic!(
                "no command failed after the panic was armed (panic fired {fired:?} after \
                 arming); unready {:?}; {:?}; the panic's backtrace:\n{}",
                cp.unready(),
                cp.stats(),
                trace.unwrap_or_default()
            );
        }
    };
    loop {
        *ws = *ws % 100 + 1;
        if cp.submit(command(*ws)).await.is_ok() {
            let served = Instant::now();
            let panicked = kv
                .panicked_at
                .lock()
                .expect("not poisoned")
                .expect("the panic fired");
            return (served - panicked, served - failed_at);
        }
        assert!(
            failed_at.elapsed() < HEAL_BOUND,
            "the partition never served again"
        );
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

fn heal(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let dir = tempfile::tempdir().expect("a temporary directory");
    let trap = Arc::new(Trap::default());
    let kv = store(dir.path(), &trap);
    let config = Config {
        partitions: 1,
        ..Config::default()
    };
    let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
    let cp = runtime.block_on(async {
        let cp = CommandProcessor::start(store, config).expect("start");
        while !cp.ready() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        cp
    });
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let bt = std::backtrace::Backtrace::force_capture();
        *LAST_PANIC.lock().unwrap_or_else(|e| e.into_inner()) = Some(format!("{info}\n{bt}"));
        if std::env::var_os("MONOSEQ_BENCH_HEAL_TRACE").is_some() {
            default_hook(info);
        }
    }));
    let trace = std::env::var_os("MONOSEQ_BENCH_HEAL_TRACE").is_some();
    eprintln!("heal: first rebuild delay (REBUILD_DELAY_MIN) {REBUILD_DELAY_MIN:?}");
    let mut ws = 0;
    let mut group = c.benchmark_group("heal");
    group.sample_size(20);
    // Baseline of the same run: one command on the same partition while it serves.
    group.bench_function("one_command", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let began = Instant::now();
                for _ in 0..iters {
                    ws = ws % 100 + 1;
                    cp.submit(command(ws)).await.expect("the partition serves");
                }
                began.elapsed()
            })
        });
    });
    group.bench_function("poison_to_serving", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let (from_panic, from_failure) = poison_and_heal(&cp, &trap, &mut ws).await;
                    if trace {
                        eprintln!(
                            "heal: panic to serving {:.1} ms, first failure to serving {:.1} ms",
                            from_panic.as_secs_f64() * 1e3,
                            from_failure.as_secs_f64() * 1e3
                        );
                    }
                    total += from_panic;
                }
                total
            })
        });
    });
    group.finish();
    runtime.block_on(cp.shutdown(Duration::from_secs(10)));
}

criterion_group!(benches, heal);
criterion_main!(benches);
