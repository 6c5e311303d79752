//! Engine bench: the figures behind the choice of the default embedded engine. Through the
//! `KvStore` contract, for each engine: appending ~200-byte log records (one partition,
//! big-endian offsets) in batches of 1 and of 100, flushed per batch (`Sync`) or not
//! (`Manual`); several writers sharing flushes (`GroupCommit` plus `sync` per write); a full
//! ordered scan; and the time to reopen the store.
//!
//! Run: `cargo bench -p monoseq-kv --bench engines [-- --records N --sync-records N]`.
//! Each case runs once (a million records is long enough to time); read the figures as
//! ratios between engines, since the machine is shared.

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

fn shared_flush(store: Arc<dyn KvStore>, writers: u64, per_writer: u64) -> Duration {
    let started = Instant::now();
    let threads: Vec<_> = (0..writers)
        .map(|w| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut buf = [0u8; VALUE_BYTES];
                let partition = format!("plog/app/{w}");
                for n in 0..per_writer {
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

fn report(engine: &str, case: &str, count: u64, elapsed: Duration) {
    let per_second = count as f64 / elapsed.as_secs_f64();
    println!(
        "{engine:<6} {case:<44} {count:>9} records {:>9.3} s {:>12.0} records/s {:>9.2} µs/record",
        elapsed.as_secs_f64(),
        per_second,
        elapsed.as_secs_f64() * 1e6 / count as f64,
    );
}

type Open = fn(&Path, Options) -> Box<dyn KvStore>;

fn bench_engine(engine: &str, open: Open, args: &Args) {
    let manual = Options::default().durability(Durability::Manual);
    let sync = Options::default().durability(Durability::Sync);

    // Not durable, batches of 100, then scan and reopen over the same data.
    let dir = tempfile::tempdir_in(target_dir()).expect("temporary directory");
    let store = open(dir.path(), manual);
    let elapsed = append(&*store, 0, args.records, 100);
    report(
        engine,
        "append, batch 100, not durable",
        args.records,
        elapsed,
    );
    let elapsed = scan(&*store, args.records);
    report(engine, "full ordered scan", args.records, elapsed);
    drop(store);
    let started = Instant::now();
    let store = open(dir.path(), manual);
    let reopened = started.elapsed();
    assert!(
        store
            .get(Key::new(PARTITION, &0u64.to_be_bytes()))
            .expect("get")
            .is_some()
    );
    println!(
        "{engine:<6} {:<44} {:>9.3} s after {} records ({:.0} MiB on disk)",
        "reopen",
        reopened.as_secs_f64(),
        args.records,
        dir_bytes(dir.path()) as f64 / (1 << 20) as f64
    );
    let elapsed = scan(&*store, args.records);
    report(
        engine,
        "full ordered scan after reopen",
        args.records,
        elapsed,
    );
    drop(store);
    drop(dir);

    // Not durable, batches of 1.
    let dir = tempfile::tempdir_in(target_dir()).expect("temporary directory");
    let store = open(dir.path(), manual);
    let elapsed = append(&*store, 0, args.records, 1);
    report(
        engine,
        "append, batch 1, not durable",
        args.records,
        elapsed,
    );
    drop(store);
    drop(dir);

    // Durable, batches of 100 and of 1.
    let dir = tempfile::tempdir_in(target_dir()).expect("temporary directory");
    let store = open(dir.path(), sync);
    let elapsed = append(&*store, 0, args.sync_records, 100);
    report(
        engine,
        "append, batch 100, durable",
        args.sync_records,
        elapsed,
    );
    let elapsed = append(&*store, args.sync_records, args.sync_single_records, 1);
    report(
        engine,
        "append, batch 1, durable",
        args.sync_single_records,
        elapsed,
    );
    drop(store);
    drop(dir);

    // Four writers, each write made durable by `sync`, flushes shared by group commit.
    let dir = tempfile::tempdir_in(target_dir()).expect("temporary directory");
    let group = Options::default().durability(Durability::GroupCommit {
        max_delay: Duration::from_millis(5),
    });
    let store: Arc<dyn KvStore> = Arc::from(open(dir.path(), group));
    let elapsed = shared_flush(Arc::clone(&store), 4, args.writer_records);
    report(
        engine,
        "4 writers, batch 1, each synced (group commit)",
        4 * args.writer_records,
        elapsed,
    );
    drop(store);
    drop(dir);
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
        "monoseq-kv engines: {} records of {VALUE_BYTES} bytes, durable batch-1 case {} records",
        args.records, args.sync_single_records
    );
    #[cfg(feature = "fjall")]
    bench_engine(
        "fjall",
        |path, options| Box::new(monoseq_kv::FjallStore::open(path, options).expect("open fjall")),
        &args,
    );
    #[cfg(feature = "redb")]
    bench_engine(
        "redb",
        |path, options| Box::new(monoseq_kv::RedbStore::open(path, options).expect("open redb")),
        &args,
    );
}
