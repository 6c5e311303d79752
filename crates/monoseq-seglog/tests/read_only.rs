//! A log opened read-only is read as it was left: nothing created, cut or written; a torn tail
//! described instead of cut; damage in a sealed segment read around, page by page.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_holds_payloads, flip, open, payload, payloads, position, small, write_at};
use monoseq_seglog::{Fault, SegError, SegLog};

/// A log in `dir` holding offsets `1..end` in small segments, synced and closed.
fn written(dir: &Path, end: u64) {
    let mut log = open(dir, &small(), 1);
    let mut at = 1;
    while at < end {
        let to = (at + 5).min(end);
        log.append(at, &payloads(at, to)).expect("append");
        at = to;
    }
    log.sync().expect("sync");
}

/// Every file of `dir`, name and bytes, sorted.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| {
            let path = e.expect("entry").path();
            let bytes = std::fs::read(&path).expect("read");
            (path, bytes)
        })
        .collect();
    all.sort();
    all
}

/// The first offsets of the segments in `dir`, in order.
fn firsts(dir: &Path) -> Vec<u64> {
    files(dir)
        .iter()
        .filter_map(|(p, _)| p.file_stem()?.to_str()?.parse().ok())
        .collect()
}

#[test]
fn a_torn_tail_is_described_not_cut_and_nothing_is_written() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), 40);
    let first = *firsts(dir.path()).last().expect("a segment");
    let (path, _) = files(dir.path()).pop().expect("a segment");
    let at = position(first, 40);
    write_at(&path, at, &200u32.to_le_bytes());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(at + 4).expect("truncate");
    drop(file);
    let before = files(dir.path());

    let log = SegLog::open_read_only(dir.path(), 0, small()).expect("open");
    assert_eq!((log.start(), log.end()), (1, 40));
    assert_holds_payloads(&log, 7);
    let tail = log.tail().expect("a tail");
    assert_eq!((tail.offset, tail.position), (40, at));
    assert_eq!(tail.fault, Fault::Truncated);
    assert!(tail.to_string().contains("offset 40"), "{tail}");
    assert!(matches!(log.sync().unwrap_err(), SegError::ReadOnly { .. }));
    let mut log = log;
    assert!(matches!(
        log.append(40, &payloads(40, 41)).unwrap_err(),
        SegError::ReadOnly { .. }
    ));
    drop(log);
    assert_eq!(files(dir.path()), before, "nothing written");

    // A writable open cuts what the read-only one left.
    drop(open(dir.path(), &small(), 40));
    assert_ne!(files(dir.path()), before);
    let log = SegLog::open_read_only(dir.path(), 0, small()).expect("open");
    assert_eq!((log.end(), log.tail()), (40, None));
}

#[test]
fn a_sealed_last_segment_gets_no_new_one_and_a_missing_or_empty_directory_is_no_log() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), 200);
    let last = *firsts(dir.path()).last().expect("a segment");
    std::fs::remove_file(common::segment(dir.path(), last)).expect("remove the active one");
    let before = files(dir.path());
    let log = SegLog::open_read_only(dir.path(), 0, small()).expect("open");
    assert_eq!((log.end(), log.tail()), (last, None));
    assert_holds_payloads(&log, 50);
    assert_eq!(files(dir.path()), before, "no active segment created");

    let missing = dir.path().join("none");
    let err = SegLog::open_read_only(&missing, 0, small()).unwrap_err();
    assert!(matches!(err, SegError::Io { .. }), "{err}");
    assert!(!missing.exists());
    let empty = tempfile::tempdir().expect("temporary directory");
    let log = SegLog::open_read_only(empty.path(), 0, small()).expect("open");
    assert_eq!((log.start(), log.end()), (1, 1));
    assert!(log.read(1, 10, 1 << 20).expect("read").is_empty());
    assert_eq!(files(empty.path()), vec![]);
}

#[test]
fn damage_in_a_sealed_segment_names_what_it_leaves_unread_and_the_rest_reads() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), 200);
    let segments = firsts(dir.path());
    let next = segments[1];
    assert!(next > 6, "offset 5 is in the first, sealed segment");
    flip(&common::segment(dir.path(), 1), position(1, 5) + 9, 0x01);

    let log = SegLog::open_read_only(dir.path(), 0, small()).expect("open");
    let err = log.read(1, 100, usize::MAX).unwrap_err();
    assert_eq!(err.damaged_offsets(), Some(5..next), "{err}");
    assert_eq!(
        SegError::ReadOnly {
            dir: dir.path().into()
        }
        .damaged_offsets(),
        None
    );
    // A page that ends before the damaged frame reads whole.
    let page = log.read(1, 4, usize::MAX).expect("read before the damage");
    assert_eq!(page.payloads().collect::<Vec<_>>(), payloads(1, 5));
    let page = log
        .read(next, 1000, usize::MAX)
        .expect("read after the damage");
    assert_eq!(page.end(), 200);
    assert_eq!(page.payloads().next(), Some(payload(next).as_slice()));
}
