//! What the segment log's tests share: payloads that name their offset, small options, file
//! surgery.

#![allow(dead_code)]

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use monoseq_seglog::{FRAME_HEAD_BYTES, HEADER_BYTES, SegLog, SegOptions};

/// The payload of `offset`: its decimal digits, repeated to a length that varies with it.
pub fn payload(offset: u64) -> Vec<u8> {
    let digits = format!("{offset}-");
    digits
        .bytes()
        .cycle()
        .take(1 + (offset as usize * 7) % 90)
        .collect()
}

/// Payloads of `from..to`.
pub fn payloads(from: u64, to: u64) -> Vec<Vec<u8>> {
    (from..to).map(payload).collect()
}

/// Small segments, so a few hundred events fill several.
pub fn small() -> SegOptions {
    SegOptions {
        segment_bytes: 1024,
        preallocate_bytes: 256,
        ..SegOptions::default()
    }
}

/// The segment file starting at `first` in `dir`.
pub fn segment(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.seg"))
}

/// Byte position of the frame of `offset` in the segment starting at `first`, whose payloads
/// are [`payload`]s.
pub fn position(first: u64, offset: u64) -> u64 {
    HEADER_BYTES
        + (first..offset)
            .map(|o| FRAME_HEAD_BYTES + payload(o).len() as u64)
            .sum::<u64>()
}

/// XORs the byte at `at` of `path` with `mask`.
pub fn flip(path: &Path, at: u64, mask: u8) {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open");
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).expect("read");
    b[0] ^= mask;
    file.write_all_at(&b, at).expect("write");
}

/// Writes `bytes` at `at` of `path`.
pub fn write_at(path: &Path, at: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    file.write_all_at(bytes, at).expect("write");
}

/// Every offset of `log` read back, one page of up to `page` events at a time, is its
/// [`payload`].
pub fn assert_holds_payloads(log: &SegLog, page: usize) {
    let mut from = log.start();
    while from < log.end() {
        let got = log.read(from, page, usize::MAX).expect("read");
        assert!(!got.is_empty(), "a read below the end returns a frame");
        for (i, p) in got.payloads().enumerate() {
            assert_eq!(p, payload(from + i as u64), "offset {}", from + i as u64);
        }
        from = got.end();
    }
    assert_eq!(from, log.end());
}

/// Opens the log of partition 0 in `dir`.
pub fn open(dir: &Path, options: &SegOptions, durable_end: u64) -> SegLog {
    SegLog::open(dir, 0, options.clone(), durable_end).expect("open")
}
