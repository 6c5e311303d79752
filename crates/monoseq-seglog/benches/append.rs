//! Segment log benchmarks: durable appends of groups of 100 events of ~120 bytes, one sync
//! per group (64 MiB segments, zero-filled 1 MiB ahead, as by default), and a sequential
//! read of 100 000 events in pages of 1 000.
//!
//! Run: `cargo bench -p monoseq-seglog --bench append`. Throughput is printed in events per
//! second ("elem/s"). `MONOSEQ_BENCH_DIR` picks the directory the logs are written in (by
//! default the system's temporary directory; a tmpfs there makes syncs free).

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoseq_seglog::{SegLog, SegOptions};

const GROUP_EVENTS: usize = 100;
const EVENT_BYTES: usize = 120;
const READ_EVENTS: u64 = 100_000;
const PAGE_EVENTS: usize = 1_000;

fn temp_dir() -> tempfile::TempDir {
    match std::env::var_os("MONOSEQ_BENCH_DIR") {
        Some(dir) => tempfile::tempdir_in(dir),
        None => tempfile::tempdir(),
    }
    .expect("temporary directory")
}

/// A group of events whose bytes vary with `at`.
fn group(at: u64) -> Vec<Vec<u8>> {
    (0..GROUP_EVENTS as u64)
        .map(|i| {
            let seed = (at + i).to_le_bytes();
            (0..EVENT_BYTES)
                .map(|b| seed[b % seed.len()] ^ b as u8)
                .collect()
        })
        .collect()
}

fn append_durable(c: &mut Criterion) {
    let dir = temp_dir();
    let mut log = SegLog::open(dir.path(), 0, SegOptions::default(), 1).expect("open");
    let mut g = c.benchmark_group("append_durable");
    g.throughput(Throughput::Elements(GROUP_EVENTS as u64));
    g.bench_function("group_of_100_sync_each", |b| {
        b.iter(|| {
            let at = log.end();
            log.append(at, &group(at)).expect("append");
            log.sync().expect("sync");
        });
    });
    g.finish();
}

fn read_sequential(c: &mut Criterion) {
    let dir = temp_dir();
    let mut log = SegLog::open(dir.path(), 0, SegOptions::default(), 1).expect("open");
    while log.end() <= READ_EVENTS {
        let at = log.end();
        log.append(at, &group(at)).expect("append");
    }
    log.sync().expect("sync");
    let mut g = c.benchmark_group("read_sequential");
    g.throughput(Throughput::Elements(READ_EVENTS));
    g.bench_function("100000_events_pages_of_1000", |b| {
        b.iter(|| {
            let mut from = log.start();
            let mut bytes = 0;
            while from <= READ_EVENTS {
                let page = log.read(from, PAGE_EVENTS, usize::MAX).expect("read");
                bytes += page.payloads().map(<[u8]>::len).sum::<usize>();
                from = page.end();
            }
            bytes
        });
    });
    g.finish();
}

criterion_group!(benches, append_durable, read_sequential);
criterion_main!(benches);
