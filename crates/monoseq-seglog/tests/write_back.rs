//! `SegLog::write_back` leaves none of the active segment's pages dirty or under writeback
//! when it returns (the disk took them), without an `fdatasync`. Read through `cachestat(2)`
//! (Linux 6.5 or later).
#![cfg(target_os = "linux")]

use std::fs::File;

use monoseq_seglog::page_cache::{PageCounts, page_counts};
use monoseq_seglog::{SegLog, SegOptions};

/// The page cache's counts of `file`'s pages.
fn pages(file: &File) -> PageCounts {
    page_counts(file).expect("cachestat(2) (Linux 6.5 or later)")
}

#[test]
fn a_written_back_segment_has_no_dirty_page_left_without_an_fdatasync() {
    // On the disk the tests build on: a tmpfs never writes pages back.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a directory");
    let options = SegOptions {
        segment_bytes: 64 << 20,
        preallocate_bytes: 8 << 20,
        ..SegOptions::default()
    };
    let mut log = SegLog::open(dir.path(), 0, options, 0).expect("a new log");
    let payloads = vec![vec![7u8; 1000]; 4000];
    let start = log.start();
    log.append(start, &payloads).expect("an append");
    let segment = std::fs::read_dir(dir.path())
        .expect("the log's directory")
        .map(|e| e.expect("an entry").path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment file");
    let file = File::open(&segment).expect("the segment");
    let before = pages(&file);
    assert!(
        before.dirty > 0,
        "the append left no dirty page to write back: {before:?}"
    );
    log.write_back().expect("the write-back");
    let after = pages(&file);
    assert_eq!(
        (after.dirty, after.writeback),
        (0, 0),
        "after the write-back: {after:?}"
    );
}

#[test]
fn only_an_ext4_file_system_is_taken_to_overwrite_in_place() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a directory");
    // `stat` names ext2, ext3 and ext4 alike by their one magic number.
    let kind = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(dir.path())
        .output()
        .expect("stat runs");
    let ext4 = String::from_utf8_lossy(&kind.stdout).trim() == "ext2/ext3";
    assert_eq!(monoseq_seglog::overwrites_in_place(dir.path()), ext4);
    assert!(!monoseq_seglog::overwrites_in_place(std::path::Path::new(
        "/proc"
    )));
    assert!(!monoseq_seglog::overwrites_in_place(
        &dir.path().join("missing")
    ));
}
