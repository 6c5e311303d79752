//! Engine bench: the figures behind the choice of the default embedded engine. Through the
//! `KvStore` contract, for each engine: appending ~200-byte log records (one partition,
//! big-endian offsets) in batches of 1 and of 100, flushed per batch (`Sync`) or not
//! (`Manual`); several writers sharing flushes (`GroupCommit` plus `sync` per write); a full
//! ordered scan; and the time to reopen the store.
//!
//! Run: `cargo bench -p monoseq-kv --features fjall,redb --bench engines [-- --records N
//! --sync-records N --sync-single-records N --writer-records N]`. Each case is cut into rounds
//! in which the engines take turns, so noise from other work on a shared machine falls on
//! every engine alike; read the figures as ratios between engines.

use std::ops::{Bound, ControlFlow};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use monoseq_kv::{Durability, Key, KvStore, Options, Order, WriteBatch};

const VALUE_BYTES: usize = 200;
const PARTITION: &[u8] = b"plog/app/0";

struct Args {
    /// Records of the non-durable cases and of the scan and reopen.
    records: u64,
    /// Records of the durable batch-of-100 case.
    sync_records: u64,
    /// Records of the durable batch-of-1 case (a flush each).
    sync_single_records: u64,
    /// Records written by each writer of the shared-flush case.
    writer_records: u64,
}

fn args() -> Args {
    let mut args = Args {
        records: 1_000_000,
        sync_records: 1_000_000,
        sync_single_records: 10_000,
        writer_records: 5_000,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut number = || {
            it.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{arg} needs a number"))
        };
        match arg.as_str() {
            "--records" => args.records = number(),
            "--sync-records" => args.sync_records = number(),
            "--sync-single-records" => args.sync_single_records = number(),
            "--writer-records" => args.writer_records = number(),
            _ => {} // `cargo bench` passes `--bench`.
        }
    }
    args
}

/// A deterministic, incompressible-looking value for record `n`.
fn value(n: u64, out: &mut [u8; VALUE_BYTES]) {
    let mut x = n.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_be_bytes()[..chunk.len()]);
    }
}

fn append(store: &dyn KvStore, first: u64, count: u64, batch_len: u64) -> Duration {
    let mut batch = WriteBatch::with_capacity(batch_len as usize, batch_len as usize * 230);
    let mut buf = [0u8; VALUE_BYTES];
    let started = Instant::now();
    let mut n = first;
    while n < first + count {
        batch.clear();
        for m in n..(n + batch_len).min(first + count) {
            value(m, &mut buf);
            batch.put(Key::new(PARTITION, &m.to_be_bytes()), &buf);
        }
        n += batch.len() as u64;
        store.write(&batch).expect("append");
    }
    store.sync().expect("sync");
    started.elapsed()
}

fn scan(store: &dyn KvStore, expected: u64) -> Duration {
    let started = Instant::now();
    let (mut count, mut bytes, mut last) = (0u64, 0usize, None::<u64>);
    store
        .scan(
            PARTITION,
            Bound::Unbounded,
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, value| {
                let n = u64::from_be_bytes(clustering.try_into().expect("8-byte offset"));
                assert!(last.is_none_or(|l| l < n), "scan out of order");
                last = Some(n);
                count += 1;
                bytes += value.len();
                ControlFlow::Continue(())
            },
        )
        .expect("scan");
    let elapsed = started.elapsed();
    assert_eq!(count, expected, "scan saw every record");
    assert_eq!(bytes, expected as usize * VALUE_BYTES);
    elapsed
}

fn shared_flush(store: Arc<dyn KvStore>, writers: u64, first: u64, per_writer: u64) -> Duration {
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut buf = [0u8; VALUE_BYTES];
                let partition = format!("plog/app/{w}");
                for n in first..first + per_writer {
                    value(n, &mut buf);
                    store
                        .put(Key::new(partition.as_bytes(), &n.to_be_bytes()), &buf)
                        .expect("put");
                    store.sync().expect("sync");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("writer");
    }
    started.elapsed()
}

fn dir_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Engines under test, by name.
type Open = fn(&Path, Options) -> Box<dyn KvStore>;

fn engines() -> Vec<(&'static str, Open)> {
    let mut engines: Vec<(&'static str, Open)> = Vec::new();
    #[cfg(feature = "fjall")]
    engines.push(("fjall", |path, options| {
        Box::new(monoseq_kv::FjallStore::open(path, options).expect("open fjall"))
    }));
    #[cfg(feature = "redb")]
    engines.push(("redb", |path, options| {
        Box::new(monoseq_kv::RedbStore::open(path, options).expect("open redb"))
    }));
    engines
}

/// Rounds each case is cut into; the engines take turns round by round, so that noise from
/// other work on the machine falls on all of them alike.
const ROUNDS: u64 = 10;

/// Prints one line per engine: total time, throughput, and time relative to the first engine.
fn report(case: &str, names: &[&str], count: u64, elapsed: &[Duration]) {
    let base = elapsed[0].as_secs_f64();
    for (name, elapsed) in names.iter().zip(elapsed) {
        let secs = elapsed.as_secs_f64();
        println!(
            "{case:<46} {name:<6} {count:>8} records {secs:>8.3} s {:>10.0} records/s {:>8.2} µs/record  time ×{:.2}",
            count as f64 / secs,
            secs * 1e6 / count as f64,
            secs / base,
        );
    }
}

struct Stores {
    stores: Vec<Box<dyn KvStore>>,
    dirs: Vec<tempfile::TempDir>,
}

fn open_all(engines: &[(&'static str, Open)], options: Options) -> Stores {
    let dirs: Vec<_> = engines
        .iter()
        .map(|_| tempfile::tempdir_in(target_dir()).expect("temporary directory"))
        .collect();
    let stores = engines
        .iter()
        .zip(&dirs)
        .map(|((_, open), dir)| open(dir.path(), options))
        .collect();
    Stores { stores, dirs }
}

/// Appends `count` records to each engine's store, `ROUNDS` turns each.
fn append_case(
    case: &str,
    names: &[&str],
    stores: &Stores,
    first: u64,
    count: u64,
    batch_len: u64,
) {
    let mut elapsed = vec![Duration::ZERO; stores.stores.len()];
    let per_round = count / ROUNDS;
    for round in 0..ROUNDS {
        for (i, store) in stores.stores.iter().enumerate() {
            elapsed[i] += append(&**store, first + round * per_round, per_round, batch_len);
        }
    }
    report(case, names, per_round * ROUNDS, &elapsed);
}

fn run(args: &Args) {
    let engines = engines();
    let names: Vec<&str> = engines.iter().map(|(name, _)| *name).collect();
    let manual = Options::default().durability(Durability::Manual);

    // Not durable, batches of 100; then scans and reopens of the same data.
    let stores = open_all(&engines, manual);
    append_case(
        "append, batch 100, not durable",
        &names,
        &stores,
        0,
        args.records,
        100,
    );
    let records = args.records / ROUNDS * ROUNDS;
    let best_of = |f: &mut dyn FnMut(usize) -> Duration| -> Vec<Duration> {
        let mut best = vec![Duration::MAX; engines.len()];
        for _ in 0..3 {
            for (i, b) in best.iter_mut().enumerate() {
                *b = (*b).min(f(i));
            }
        }
        best
    };
    let elapsed = best_of(&mut |i| scan(&*stores.stores[i], records));
    report("full ordered scan (best of 3)", &names, records, &elapsed);
    let Stores {
        stores: open_stores,
        dirs,
    } = stores;
    drop(open_stores);
    let mut reopened: Vec<Option<Box<dyn KvStore>>> = engines.iter().map(|_| None).collect();
    let elapsed = best_of(&mut |i| {
        reopened[i] = None;
        let started = Instant::now();
        let store = (engines[i].1)(dirs[i].path(), manual);
        let elapsed = started.elapsed();
        reopened[i] = Some(store);
        elapsed
    });
    for (i, name) in names.iter().enumerate() {
        println!(
            "{:<46} {name:<6} {:>8.3} s after {records} records, {:.0} MiB on disk  time ×{:.2}",
            "reopen (best of 3)",
            elapsed[i].as_secs_f64(),
            dir_bytes(dirs[i].path()) as f64 / f64::from(1 << 20),
            elapsed[i].as_secs_f64() / elapsed[0].as_secs_f64(),
        );
    }
    let elapsed = best_of(&mut |i| scan(&**reopened[i].as_ref().expect("reopened"), records));
    report(
        "full ordered scan after reopen (best of 3)",
        &names,
        records,
        &elapsed,
    );
    drop(reopened);
    drop(dirs);

    let stores = open_all(&engines, manual);
    append_case(
        "append, batch 1, not durable",
        &names,
        &stores,
        0,
        args.records,
        1,
    );
    drop(stores);

    let stores = open_all(&engines, Options::default().durability(Durability::Sync));
    append_case(
        "append, batch 100, durable",
        &names,
        &stores,
        0,
        args.sync_records,
        100,
    );
    append_case(
        "append, batch 1, durable",
        &names,
        &stores,
        args.sync_records,
        args.sync_single_records,
        1,
    );
    drop(stores);

    // Four writers, each write made durable by `sync`; group commit shares the flushes.
    let group = Options::default().durability(Durability::GroupCommit {
        max_delay: Duration::from_millis(5),
    });
    let stores = open_all(&engines, group);
    let mut elapsed = vec![Duration::ZERO; engines.len()];
    let per_round = args.writer_records / ROUNDS;
    let Stores {
        stores: open_stores,
        dirs: _dirs,
    } = stores;
    let shared: Vec<Arc<dyn KvStore>> = open_stores.into_iter().map(Arc::from).collect();
    for round in 0..ROUNDS {
        for (i, store) in shared.iter().enumerate() {
            elapsed[i] += shared_flush(Arc::clone(store), 4, round * per_round, per_round);
        }
    }
    report(
        "4 writers, batch 1, each synced (group commit)",
        &names,
        4 * per_round * ROUNDS,
        &elapsed,
    );
}

/// Benchmark data goes under the target directory, on the same disk as the build, never on a
/// memory-backed /tmp that would make flushes free.
fn target_dir() -> std::path::PathBuf {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"))
        .join("monoseq-kv-bench");
    std::fs::create_dir_all(&dir).expect("bench data directory");
    dir
}

fn main() {
    let args = args();
    println!(
        "monoseq-kv engines: {} records of {VALUE_BYTES} bytes ({} durable in batches of 100, {} \
         durable one by one, {} per writer); engines take turns in {ROUNDS} rounds",
        args.records, args.sync_records, args.sync_single_records, args.writer_records
    );
    run(&args);
}
