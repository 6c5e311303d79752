//! Reads from every offset return exactly the frames appended, over random payload sizes,
//! segment sizes, zero-fill steps, groups, reopen points and torn tails cut at reopening.

use std::os::unix::fs::FileExt;
use std::path::Path;

use monoseq_seglog::{FRAME_HEAD_BYTES, HEADER_BYTES, SegLog, SegOptions};
use proptest::prelude::*;

/// A step of a run: append a group of payloads of these lengths, reopen the log, or write
/// these bytes after the data (a torn tail: never acknowledged) and reopen.
#[derive(Debug, Clone)]
enum Step {
    Append(Vec<usize>),
    Reopen,
    TornReopen(Vec<u8>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop::collection::vec(1usize..400, 1..12).prop_map(Step::Append),
        1 => Just(Step::Reopen),
        1 => prop::collection::vec(any::<u8>(), 1..300).prop_map(Step::TornReopen),
    ]
}

/// The last segment in `dir` (whose frames hold the model's payloads from offset `start` on)
/// and the byte position after its data.
fn last_segment(dir: &Path, model: &[Vec<u8>], start: u64) -> (std::path::PathBuf, u64) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").file_name().into_string().expect("name"))
        .collect();
    names.sort();
    let name = names.pop().expect("a segment");
    let first: u64 = name.trim_end_matches(".seg").parse().expect("offset");
    let data_end = HEADER_BYTES
        + model[(first - start) as usize..]
            .iter()
            .map(|p| FRAME_HEAD_BYTES + p.len() as u64)
            .sum::<u64>();
    (dir.join(name), data_end)
}

/// Writes `tail` right after the data of the last segment in `dir`.
fn write_torn_tail(dir: &Path, model: &[Vec<u8>], start: u64, tail: &[u8]) {
    let (path, data_end) = last_segment(dir, model, start);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    file.write_all_at(tail, data_end).expect("write");
}

/// Whether every byte after the data of the last segment in `dir` is zero.
fn zero_after_data(dir: &Path, model: &[Vec<u8>], start: u64) -> bool {
    let (path, data_end) = last_segment(dir, model, start);
    let bytes = std::fs::read(path).expect("read");
    bytes[data_end as usize..].iter().all(|b| *b == 0)
}

/// The payload of `offset`, `len` bytes long.
fn payload(offset: u64, len: usize) -> Vec<u8> {
    let seed = offset.to_le_bytes();
    (0..len).map(|i| seed[i % seed.len()] ^ (i as u8)).collect()
}

/// Every read from every offset `from` gives the model's payloads from `from` on, up to the
/// page's limits.
fn check_reads(log: &SegLog, model: &[Vec<u8>], start: u64) -> Result<(), TestCaseError> {
    let end = start + model.len() as u64;
    prop_assert_eq!(log.end(), end);
    for from in start..=end {
        for (max_events, max_bytes) in [(usize::MAX, usize::MAX), (3, usize::MAX), (1000, 500)] {
            let page = log.read(from, max_events, max_bytes).expect("read");
            prop_assert_eq!(page.first(), from);
            let want = &model[(from - start) as usize..];
            prop_assert!(page.len() <= max_events && page.len() <= want.len());
            prop_assert!(page.len() == 1 || page.frames().len() <= max_bytes);
            if max_events == usize::MAX && max_bytes == usize::MAX {
                prop_assert_eq!(page.len(), want.len());
            }
            for (got, want) in page.payloads().zip(want) {
                prop_assert_eq!(got, want.as_slice());
            }
            prop_assert_eq!(page.payloads().count(), page.len());
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn reads_from_every_offset_return_exactly_the_frames_appended(
        segment_bytes in 64u64..3000,
        preallocate_bytes in 1u64..2000,
        start in prop_oneof![Just(1u64), 1u64..1_000_000],
        steps in prop::collection::vec(step(), 1..20),
    ) {
        let dir = tempfile::tempdir().expect("temporary directory");
        let options = SegOptions { segment_bytes, preallocate_bytes, start_offset: start };
        let mut log = SegLog::open(dir.path(), 7, options.clone(), start).expect("open");
        let mut model: Vec<Vec<u8>> = Vec::new();
        for step in steps {
            match &step {
                Step::Append(lens) => {
                    let at = start + model.len() as u64;
                    let group: Vec<Vec<u8>> = lens
                        .iter()
                        .enumerate()
                        .map(|(i, len)| payload(at + i as u64, *len))
                        .collect();
                    prop_assert_eq!(log.append(at, &group).expect("append"), at + group.len() as u64);
                    model.extend(group);
                }
                Step::Reopen | Step::TornReopen(_) => {
                    log.sync().expect("sync");
                    drop(log);
                    let end = start + model.len() as u64;
                    if let Step::TornReopen(tail) = &step {
                        write_torn_tail(dir.path(), &model, start, tail);
                    }
                    log = SegLog::open(dir.path(), 7, options.clone(), end).expect("reopen");
                    prop_assert!(zero_after_data(dir.path(), &model, start), "the torn tail is cut");
                }
            }
            check_reads(&log, &model, start)?;
        }
        drop(log);
        // Unsynced appends are in the page cache: all of them are found again.
        let log = SegLog::open(dir.path(), 7, options, start + model.len() as u64).expect("reopen");
        check_reads(&log, &model, start)?;
    }
}
