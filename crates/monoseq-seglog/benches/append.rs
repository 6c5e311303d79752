//! Segment log benchmarks: durable appends of groups of 100 events of ~120 bytes, one sync
//! per group (64 MiB segments, zero-filled 1 MiB ahead, as by default), beside the floor:
//! the same bytes written with one `pwrite` into a file written ahead, and an `fdatasync`;
//! appends without a sync (the log's own cost); a sequential read of 100 000 events in
//! pages of 1 000; and a page of 1 000 read from a sealed segment kept open against one
//! reopened from its file and footer (a log keeps only the last `OPEN_SEALED_MAX` open).
//!
//! Run: `cargo bench -p monoseq-seglog --bench append`. Throughput is printed in events per
//! second ("elem/s"). `MONOSEQ_BENCH_DIR` picks the directory the logs are written in (by
//! default the system's temporary directory). On a tmpfs syncs cost nothing, so the durable
//! pair compares the log's own work with a bare write's; the log then grows by gigabytes of
//! memory while it runs.

use std::os::unix::fs::FileExt;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use monoseq_seglog::{OPEN_SEALED_MAX, SegLog, SegOptions};

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
    // Groups made before, as the bare write's bytes are.
    let groups: Vec<Vec<Vec<u8>>> = (0..64).map(|i| group(i * GROUP_EVENTS as u64)).collect();
    let mut i = 0;
    g.bench_function("group_of_100_sync_each", |b| {
        b.iter(|| {
            let at = log.end();
            log.append(at, &groups[i % groups.len()]).expect("append");
            log.sync().expect("sync");
            i += 1;
        });
    });
    let file_dir = temp_dir();
    let file = std::fs::File::create(file_dir.path().join("bare")).expect("create");
    let ahead = 256 << 20;
    file.set_len(0).expect("truncate");
    let zeros = vec![0u8; 1 << 20];
    for at in (0..ahead).step_by(zeros.len()) {
        file.write_all_at(&zeros, at).expect("zero-fill");
    }
    file.sync_all().expect("sync");
    let bytes: Vec<u8> = group(0).concat();
    let frame_bytes = (bytes.len() + GROUP_EVENTS * 8) as u64;
    let mut at = 0;
    g.bench_function("bare_pwrite_fdatasync_same_bytes", |b| {
        b.iter(|| {
            file.write_all_at(&bytes, at).expect("write");
            file.sync_data().expect("sync");
            at = (at + frame_bytes) % (ahead - frame_bytes);
        });
    });
    g.finish();
    // Short: each iteration adds 13 KB to the log's files.
    let mut g = c.benchmark_group("append");
    g.throughput(Throughput::Elements(GROUP_EVENTS as u64));
    g.warm_up_time(std::time::Duration::from_millis(500));
    g.measurement_time(std::time::Duration::from_secs(2));
    g.bench_function("group_of_100_no_sync", |b| {
        b.iter(|| {
            let at = log.end();
            log.append(at, &groups[i % groups.len()]).expect("append");
            i += 1;
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

/// Pages of 1 000 events from sealed 64 MiB segments: cycling over more segments than the
/// log keeps open (every read reopens one: the file, its header and its footer's index of
/// about 10 000 entries) against reading one segment over and over (kept open).
fn read_reopened(c: &mut Criterion) {
    let dir = temp_dir();
    let mut log = SegLog::open(dir.path(), 0, SegOptions::default(), 1).expect("open");
    let mut firsts = vec![log.end()];
    while firsts.len() <= OPEN_SEALED_MAX + 2 {
        let (at, segments) = (log.end(), log.segments());
        log.append(at, &group(at)).expect("append");
        if log.segments() > segments {
            firsts.push(log.end() - GROUP_EVENTS as u64);
        }
    }
    log.sync().expect("sync");
    // Sealed segments only: the last first offset is the active segment's.
    firsts.pop();
    let read = |from: u64| {
        let page = log.read(from, PAGE_EVENTS, usize::MAX).expect("read");
        page.payloads().map(<[u8]>::len).sum::<usize>()
    };
    let mut g = c.benchmark_group("read_sealed_page");
    g.throughput(Throughput::Elements(PAGE_EVENTS as u64));
    g.bench_function("kept_open", |b| b.iter(|| read(firsts[0])));
    let mut i = 0;
    g.bench_function("reopened", |b| {
        b.iter(|| {
            i = (i + 1) % firsts.len();
            read(firsts[i])
        });
    });
    g.finish();
}

criterion_group!(benches, append_durable, read_sequential, read_reopened);
criterion_main!(benches);
