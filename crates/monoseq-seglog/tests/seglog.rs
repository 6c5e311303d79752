//! The segment log's behaviour: round trips, restarts that cut torn tails above the durable
//! end and refuse damage below it, sealed segments' footers, refused directories, appends and
//! reads at the edges.

mod common;

use std::path::{Path, PathBuf};

use common::{
    assert_holds_payloads, flip, open, payload, payloads, position, segment, small, write_at,
};
use monoseq_seglog::{
    Fault, HEADER_BYTES, INDEX_EVERY, OPEN_SEALED_MAX, SegError, SegLog, SegOptions,
};

/// The last segment file in `dir`: its first offset and path.
fn last_segment(dir: &Path) -> (u64, PathBuf) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .filter(|n| n.ends_with(".seg"))
        .collect();
    names.sort();
    let name = names.pop().expect("a segment");
    let first = name.trim_end_matches(".seg").parse().expect("offset");
    (first, dir.join(name))
}

/// A log in `dir` holding offsets `1..end`, synced and closed.
fn written(dir: &Path, options: &SegOptions, end: u64) {
    let mut log = open(dir, options, 1);
    let mut at = 1;
    while at < end {
        let to = (at + 5).min(end);
        assert_eq!(log.append(at, &payloads(at, to)).expect("append"), to);
        at = to;
    }
    log.sync().expect("sync");
}

/// Every byte of `path` from `from` on is zero.
fn assert_zero_from(path: &Path, from: u64) {
    let bytes = std::fs::read(path).expect("read");
    assert!(bytes.len() as u64 > from, "the file is zero-filled ahead");
    let at = bytes[from as usize..].iter().position(|b| *b != 0);
    assert_eq!(at, None, "a non-zero byte after the data at {from}");
}

#[test]
fn a_log_round_trips_across_sealed_segments_and_the_active_one_when_reopened() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = SegOptions {
        segment_bytes: 16 << 10,
        preallocate_bytes: 4 << 10,
        ..SegOptions::default()
    };
    written(dir.path(), &options, 1500);
    let mut log = open(dir.path(), &options, 1500);
    assert!(log.segments() >= 4, "{} segments", log.segments());
    assert_eq!((log.start(), log.end()), (1, 1500));
    for page in [1, 63, 64, 65, 1000] {
        assert_holds_payloads(&log, page);
    }
    let end = log.append(1500, &payloads(1500, 1600)).expect("append");
    log.sync().expect("sync");
    drop(log);
    let log = open(dir.path(), &options, end);
    assert_eq!(log.end(), 1600);
    assert_holds_payloads(&log, 10_000);
}

#[test]
fn pages_keep_to_their_event_and_byte_limits_but_always_hold_one_frame() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 200);
    let log = open(dir.path(), &small(), 200);
    let page = log.read(10, 5, usize::MAX).expect("read");
    assert_eq!((page.first(), page.end(), page.len()), (10, 15, 5));
    let one = log.read(10, 5, 1).expect("read");
    assert_eq!(one.len(), 1, "the first frame even past the byte limit");
    let bytes = log.read(10, 1000, 300).expect("read");
    assert!(bytes.frames().len() <= 300 && bytes.len() > 1);
    let next = log.read(10, 1000, 300 + 8 + payload(bytes.end()).len());
    assert_eq!(next.expect("read").len(), bytes.len() + 1);
    assert!(log.read(10, 0, usize::MAX).expect("read").is_empty());
}

#[test]
fn reading_at_or_past_the_end_returns_nothing_and_below_the_start_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = SegOptions {
        start_offset: 100,
        ..small()
    };
    let mut log = open(dir.path(), &options, 100);
    assert!(log.read(100, 10, 1000).expect("read").is_empty());
    log.append(100, &payloads(100, 150)).expect("append");
    assert!(log.read(150, 10, 1000).expect("read").is_empty());
    assert!(log.read(u64::MAX, 10, 1000).expect("read").is_empty());
    let err = log.read(99, 10, 1000).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::BelowStart {
                from: 99,
                start: 100
            }
        ),
        "{err}"
    );
}

#[test]
fn an_append_not_at_the_end_or_with_a_bad_payload_is_refused_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut log = open(dir.path(), &small(), 1);
    log.append(1, &payloads(1, 4)).expect("append");
    for given in [1, 3, 5] {
        let err = log.append(given, &payloads(given, given + 1)).unwrap_err();
        assert!(matches!(err, SegError::NotAtEnd { end: 4, .. }), "{err}");
    }
    let empty: &[u8] = &[];
    let err = log.append(4, &[b"ok".as_slice(), empty]).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::Payload {
                offset: 5,
                len: 0,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(log.end(), 4);
    assert_eq!(log.append(4, &[] as &[Vec<u8>]).expect("nothing"), 4);
    log.append(4, &payloads(4, 6)).expect("append");
    assert_holds_payloads(&log, 100);
}

/// A log of `1..end` in `dir` whose active segment gets `tail` written after its data;
/// returns the active segment's path and the data's end.
fn with_tail(dir: &Path, end: u64, tail: impl FnOnce(&Path, u64)) -> (PathBuf, u64) {
    written(dir, &small(), end);
    let (first, path) = last_segment(dir);
    let data_end = position(first, end);
    tail(&path, data_end);
    (path, data_end)
}

/// Reopened with every offset below `end` acknowledged, the tail is cut, the room after the
/// data zero again, and appends continue from `end`.
fn assert_tail_cut(dir: &Path, path: &Path, data_end: u64, end: u64) {
    let mut log = open(dir, &small(), end);
    assert_eq!(log.end(), end);
    assert_zero_from(path, data_end);
    log.append(end, &payloads(end, end + 30)).expect("append");
    log.sync().expect("sync");
    drop(log);
    let log = open(dir, &small(), end + 30);
    assert_holds_payloads(&log, 7);
}

#[test]
fn a_partial_frame_above_the_durable_end_is_cut_and_appends_continue_after_it() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (path, data_end) = with_tail(dir.path(), 40, |path, at| {
        let mut frame = Vec::new();
        frame.extend_from_slice(&200u32.to_le_bytes());
        frame.extend_from_slice(&[0xab; 30]);
        write_at(path, at, &frame);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("open");
        file.set_len(at + frame.len() as u64).expect("truncate");
    });
    assert_tail_cut(dir.path(), &path, data_end, 40);
}

#[test]
fn a_frame_with_a_bad_crc_above_the_durable_end_is_cut() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (path, data_end) = with_tail(dir.path(), 40, |path, _| {
        let mut log = open(path.parent().expect("dir"), &small(), 40);
        log.append(40, &payloads(40, 43)).expect("append");
        drop(log);
        let (first, _) = last_segment(path.parent().expect("dir"));
        flip(path, position(first, 41) + 10, 0x40);
    });
    let (first, _) = last_segment(dir.path());
    // Offset 40 stays (written whole, if never acknowledged); 41 and 42 are cut.
    assert_eq!(data_end, position(first, 40));
    assert_tail_cut(dir.path(), &path, position(first, 41), 41);
}

#[test]
fn garbage_after_the_data_is_cut() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (path, data_end) = with_tail(dir.path(), 40, |path, at| {
        write_at(path, at + 4, b"not a frame, after a zero length word");
    });
    assert_tail_cut(dir.path(), &path, data_end, 40);
}

#[test]
fn a_torn_tail_reaching_below_the_durable_end_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let (path, _) = with_tail(dir.path(), 40, |_, _| {});
    let (first, _) = last_segment(dir.path());
    assert!(first < 39, "offset 39 is in the active segment");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .expect("open");
    file.set_len(position(first, 39) + 10).expect("truncate");
    let err = SegLog::open(dir.path(), 0, small(), 40).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::Damaged {
                offset: 39,
                fault: Fault::Truncated,
                needed: 40,
                ..
            }
        ),
        "{err}"
    );
    // Acknowledged up to 38 only: 39 was never acknowledged, and is cut.
    let log = open(dir.path(), &small(), 39);
    assert_eq!(log.end(), 39);
}

/// A log of `1..40` whose frame of offset 30 (in the active segment) has `at(frame)` flipped;
/// reopened with everything acknowledged, it is refused naming offset 30 and its position.
fn assert_damage_refused(within: u64, mask: u8) {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 40);
    let (first, path) = last_segment(dir.path());
    assert!(first < 30, "offset 30 is in the active segment");
    let frame = position(first, 30);
    flip(&path, frame + within, mask);
    let err = SegLog::open(dir.path(), 0, small(), 40).unwrap_err();
    let SegError::Damaged {
        path: named,
        offset,
        position,
        needed,
        ..
    } = &err
    else {
        panic!("not refused as damage: {err:?}");
    };
    assert_eq!(
        (named, *offset, *position, *needed),
        (&path, 30, frame, 40),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("offset 30") && message.contains("restore"),
        "{message}"
    );
}

#[test]
fn a_flipped_payload_byte_below_the_durable_end_is_refused_naming_the_offset() {
    assert_damage_refused(8 + 3, 0x01);
}

#[test]
fn a_flipped_length_word_below_the_durable_end_is_refused_naming_the_offset() {
    assert_damage_refused(0, 0x02);
    assert_damage_refused(3, 0x80);
}

#[test]
fn a_flipped_crc_below_the_durable_end_is_refused_naming_the_offset() {
    assert_damage_refused(5, 0x10);
}

#[test]
fn a_sealed_segment_whose_footer_fails_its_crc_is_indexed_from_its_frames() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = SegOptions {
        segment_bytes: 8 << 10,
        preallocate_bytes: 1 << 10,
        ..SegOptions::default()
    };
    written(dir.path(), &options, 600);
    let first = segment(dir.path(), 1);
    let len = std::fs::metadata(&first).expect("stat").len();
    flip(&first, len - 20, 0x01);
    let log = open(dir.path(), &options, 600);
    assert!(log.segments() >= 3);
    assert_holds_payloads(&log, 1);
    assert_holds_payloads(&log, 100);
}

#[test]
fn a_sealed_segment_whose_footer_and_frames_fail_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let first = segment(dir.path(), 1);
    let len = std::fs::metadata(&first).expect("stat").len();
    flip(&first, len - 20, 0x01);
    flip(&first, position(1, 5) + 9, 0x01);
    // Even with nothing acknowledged: a sealed segment is whole.
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::Damaged {
                offset: 5,
                fault: Fault::Checksum,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_truncated_sealed_segment_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let first = segment(dir.path(), 1);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .expect("open");
    file.set_len(position(1, 6) + 3).expect("truncate");
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(
        matches!(&err, SegError::Damaged { offset: 6, fault: Fault::Truncated, path, .. } if *path == first),
        "{err}"
    );
}

#[test]
fn a_missing_segment_in_the_middle_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 200);
    let mut names: Vec<u64> = std::fs::read_dir(dir.path())
        .expect("list")
        .filter_map(|e| {
            e.expect("entry")
                .file_name()
                .to_str()?
                .strip_suffix(".seg")?
                .parse()
                .ok()
        })
        .collect();
    names.sort_unstable();
    assert!(names.len() >= 4);
    std::fs::remove_file(segment(dir.path(), names[2])).expect("remove");
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    let (from, to) = (names[2], names[3] - 1);
    assert!(
        matches!(err, SegError::Missing { from: f, to: t, .. } if (f, t) == (from, to)),
        "{err}"
    );
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn a_missing_first_segment_or_whole_log_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let err = SegLog::open(dir.path(), 0, small(), 5).unwrap_err();
    assert!(
        matches!(err, SegError::Missing { from: 1, to: 4, .. }),
        "{err}"
    );
    written(dir.path(), &small(), 100);
    std::fs::remove_file(segment(dir.path(), 1)).expect("remove");
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(matches!(err, SegError::Missing { from: 1, .. }), "{err}");
}

#[test]
fn a_segment_of_another_partition_is_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let err = SegLog::open(dir.path(), 3, small(), 1).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::Partition {
                found: 0,
                expected: 3,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_renamed_segment_a_damaged_header_and_an_unknown_format_are_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let (first, last) = last_segment(dir.path());
    std::fs::rename(&last, segment(dir.path(), first + 1)).expect("rename");
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(
        matches!(err, SegError::Missing { .. } | SegError::Renamed { .. }),
        "{err}"
    );
    std::fs::rename(segment(dir.path(), first + 1), &last).expect("rename back");
    let one = segment(dir.path(), 1);
    flip(&one, 17, 0x01);
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(matches!(err, SegError::Header { .. }), "{err}");
    flip(&one, 17, 0x01);
    write_at(&one, 8, &7u32.to_le_bytes());
    let err = SegLog::open(dir.path(), 0, small(), 1).unwrap_err();
    assert!(
        matches!(
            err,
            SegError::Format {
                version: 7,
                supported: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_segment_whose_creation_was_cut_short_is_created_again() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let mut log = open(dir.path(), &small(), 100);
    let end = log.end();
    while log.end() == end || log.segments() == 1 {
        let at = log.end();
        log.append(at, &payloads(at, at + 1)).expect("append");
    }
    drop(log);
    let (first, last) = last_segment(dir.path());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .expect("open");
    file.set_len(HEADER_BYTES / 2).expect("truncate");
    let mut log = open(dir.path(), &small(), first);
    assert_eq!(log.end(), first);
    log.append(first, &payloads(first, first + 50))
        .expect("append");
    assert_holds_payloads(&log, 9);
    drop(log);
    // Had anything in it been acknowledged, it is damage.
    let (first, last) = last_segment(dir.path());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .expect("open");
    file.set_len(HEADER_BYTES / 2).expect("truncate");
    let err = SegLog::open(dir.path(), 0, small(), first + 1).unwrap_err();
    assert!(matches!(err, SegError::Header { .. }), "{err}");
}

#[test]
fn a_sealed_last_segment_gets_a_new_active_one_and_a_half_written_footer_is_cut() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 100);
    let (first, last) = last_segment(dir.path());
    assert!(first > 1);
    std::fs::remove_file(&last).expect("remove the active segment");
    let log = open(dir.path(), &small(), first);
    assert_eq!((log.end(), log.segments()), (first, log.segments()));
    assert!(segment(dir.path(), first).exists());
    assert_holds_payloads(&log, 3);
    drop(log);
    // A seal cut short: the footer's first bytes written after the data, the file not cut.
    let mut log = open(dir.path(), &small(), first);
    log.append(first, &payloads(first, first + 5))
        .expect("append");
    drop(log);
    let data_end = position(first, first + 5);
    write_at(
        &segment(dir.path(), first),
        data_end + 4,
        &[3, 0, 0, 0, 1, 2, 3],
    );
    let log = open(dir.path(), &small(), first + 5);
    assert_eq!(log.end(), first + 5);
    assert_zero_from(&segment(dir.path(), first), data_end);
}

#[test]
fn after_a_failed_seal_every_call_is_refused_until_reopened() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut log = open(dir.path(), &small(), 1);
    log.append(1, &payloads(1, 5)).expect("append");
    // The next segment cannot be created: a directory holds each name it could have.
    let blockers: Vec<PathBuf> = (5..100).map(|o| segment(dir.path(), o)).collect();
    for b in &blockers {
        std::fs::create_dir(b).expect("mkdir");
    }
    let mut at = 5;
    let err = loop {
        match log.append(at, &payloads(at, at + 1)) {
            Ok(end) => at = end,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, SegError::Io { .. }), "{err}");
    let err = log.append(at + 1, &payloads(at + 1, at + 2)).unwrap_err();
    assert!(matches!(err, SegError::Poisoned { what: "seal" }), "{err}");
    assert!(matches!(log.sync().unwrap_err(), SegError::Poisoned { .. }));
    drop(log);
    for b in &blockers {
        std::fs::remove_dir(b).expect("rmdir");
    }
    // The seal was done, the next segment not created: reopening creates it.
    let mut log = open(dir.path(), &small(), at + 1);
    assert_eq!(log.end(), at + 1);
    log.append(at + 1, &payloads(at + 1, at + 40))
        .expect("append");
    assert_holds_payloads(&log, 4);
}

#[test]
fn options_out_of_bounds_are_refused() {
    let dir = tempfile::tempdir().expect("temporary directory");
    for options in [
        SegOptions {
            segment_bytes: HEADER_BYTES,
            ..small()
        },
        SegOptions {
            segment_bytes: monoseq_seglog::SEGMENT_BYTES_MAX + 1,
            ..small()
        },
        SegOptions {
            preallocate_bytes: 0,
            ..small()
        },
    ] {
        let err = SegLog::open(dir.path(), 0, options, 1).unwrap_err();
        assert!(matches!(err, SegError::Options(_)), "{err}");
    }
    assert_eq!(
        std::fs::read_dir(dir.path()).expect("list").count(),
        0,
        "nothing created"
    );
}

#[test]
fn readers_share_the_log_with_its_writer_behind_a_read_write_lock() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let log = std::sync::Arc::new(std::sync::RwLock::new(open(dir.path(), &small(), 1)));
    let writer = {
        let log = log.clone();
        std::thread::spawn(move || {
            for at in (1..600).step_by(3) {
                log.write()
                    .expect("lock")
                    .append(at, &payloads(at, at + 3))
                    .expect("append");
                log.read().expect("lock").sync().expect("sync");
            }
        })
    };
    let mut from = 1;
    while from < 601 {
        let page = log
            .read()
            .expect("lock")
            .read(from, 50, usize::MAX)
            .expect("read");
        for (i, p) in page.payloads().enumerate() {
            assert_eq!(p, payload(from + i as u64));
        }
        from = page.end();
    }
    writer.join().expect("the writer");
}

/// The descriptors this process holds open on files in `dir` (from `/proc/self/fd`).
fn descriptors_in(dir: &Path) -> usize {
    open_names(dir).len()
}

/// A log of many segments keeps only the last [`OPEN_SEALED_MAX`] sealed ones it sealed or
/// read open (descriptors and sparse indexes), whether it wrote them or opened them at a
/// restart, and reopens the others from their footers to read them: its memory and
/// descriptors do not grow with its length, and every offset still reads back.
#[test]
fn a_long_log_keeps_a_bounded_number_of_sealed_segments_open_and_reopens_the_others() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let options = small();
    let mut log = open(dir.path(), &options, 1);
    let bound = OPEN_SEALED_MAX + 1;
    let mut at = 1;
    while at < 3000 {
        let to = at + 5;
        log.append(at, &payloads(at, to)).expect("append");
        assert!(log.open_files() <= bound, "{} files open", log.open_files());
        at = to;
    }
    log.sync().expect("sync");
    assert!(
        log.segments() > 4 * bound,
        "{} segments: too few to test the bound",
        log.segments()
    );
    assert_eq!(descriptors_in(dir.path()), log.open_files());
    drop(log);

    let log = open(dir.path(), &options, at);
    assert_eq!(
        (log.open_files(), descriptors_in(dir.path())),
        (1, 1),
        "a restart leaves the sealed segments closed"
    );
    for page in [7, 200] {
        assert_holds_payloads(&log, page);
        assert_eq!(log.open_files(), bound);
        assert_eq!(descriptors_in(dir.path()), bound);
    }
    let per_segment = log.index_entries();
    assert!(
        per_segment < 3000 / INDEX_EVERY as usize / 4,
        "{per_segment} index entries in memory"
    );
    // A segment closed again reads as before.
    let first = log.read(1, 10, usize::MAX).expect("read");
    assert_eq!(first.payloads().next(), Some(payload(1).as_slice()));
    assert_eq!(log.open_files(), bound);
    // The one closed next is the one read longest ago, not the one opened first: read the
    // oldest kept open again, then open another closed one.
    let sealed = sealed_firsts(dir.path());
    let oldest_kept = sealed[sealed.len() - OPEN_SEALED_MAX + 1];
    let next_oldest = sealed[sealed.len() - OPEN_SEALED_MAX + 2];
    log.read(oldest_kept, 1, usize::MAX).expect("read");
    log.read(sealed[1], 1, usize::MAX).expect("read");
    let open = open_names(dir.path());
    assert!(open.contains(&segment(dir.path(), oldest_kept)), "{open:?}");
    assert!(
        !open.contains(&segment(dir.path(), next_oldest)),
        "{open:?}"
    );
}

/// The first offsets of the sealed segments in `dir` (all but the last), in order.
fn sealed_firsts(dir: &Path) -> Vec<u64> {
    let mut firsts: Vec<u64> = std::fs::read_dir(dir)
        .expect("list")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect();
    firsts.sort_unstable();
    firsts.pop();
    firsts
}

/// The files in `dir` this process holds open.
fn open_names(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// A sealed segment closed after the log was opened, then damaged on the disk, is refused
/// when it is read again (its frames or footer no longer what the log found), not misread.
#[test]
fn a_closed_sealed_segment_damaged_after_the_open_is_refused_when_read_again() {
    let dir = tempfile::tempdir().expect("temporary directory");
    written(dir.path(), &small(), 600);
    let log = open(dir.path(), &small(), 600);
    let path = segment(dir.path(), 1);
    let len = std::fs::metadata(&path).expect("the first segment").len();
    // The footer's last bytes, then a frame: each a damage the reopen finds.
    flip(&path, len - 1, 0xFF);
    flip(&path, position(1, 3) + 9, 0x01);
    let err = log.read(1, 10, usize::MAX).expect_err("a damaged segment");
    assert!(matches!(err, SegError::Damaged { .. }), "{err}");
    assert!(
        err.to_string().contains("restore it from a backup"),
        "{err}"
    );
}
