//! The marks file (`monoseq.marks`): its layout, creating, opening and reading it, and where a
//! partition's slot lies.
//!
//! Layout (all integers little-endian): a 64-byte header (`MSQMARKS`, format, partition count,
//! CRC-32 of the header), then per partition two 64-byte slots holding a sequence number, the
//! four marks and a CRC-32. A raise writes the slot not holding the newest copy, so a torn
//! write damages at most the copy being written; reading takes the valid slot with the highest
//! sequence.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex};

use super::cycle::{Cycles, GATHER_MAX};
use super::{Mark, Marks, MarksError};

/// The marks file's name inside the data directory.
pub const MARKS_FILE: &str = "monoseq.marks";

const MAGIC: &[u8; 8] = b"MSQMARKS";
const MARKS_FORMAT: u32 = 1;
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 64;
const CRC_AT: usize = 60;

impl Marks {
    /// Creates the marks file of a new store in `dir` (every mark 0), durably.
    ///
    /// # Errors
    ///
    /// [`MarksError::Io`] when the file cannot be written.
    pub fn create(dir: &Path, partitions: u32) -> Result<Marks, MarksError> {
        Marks::create_with(dir, &vec![Mark::default(); partitions as usize])
    }

    /// Creates the marks file in `dir` holding `marks` (one per partition), durably,
    /// replacing any.
    ///
    /// # Errors
    ///
    /// [`MarksError::Io`] when the file cannot be written.
    pub fn create_with(dir: &Path, marks: &[Mark]) -> Result<Marks, MarksError> {
        let path = Marks::path(dir);
        let tmp = dir.join(format!("{MARKS_FILE}.tmp"));
        let partitions = u32::try_from(marks.len()).unwrap_or(u32::MAX);
        let mut bytes = vec![0u8; (HEADER_BYTES + 2 * SLOT_BYTES * u64::from(partitions)) as usize];
        bytes[..HEADER_BYTES as usize].copy_from_slice(&header(partitions));
        for (p, mark) in marks.iter().enumerate() {
            let at = (HEADER_BYTES + 2 * SLOT_BYTES * p as u64) as usize;
            bytes[at..at + SLOT_BYTES as usize].copy_from_slice(&encode_slot(1, mark));
        }
        std::fs::write(&tmp, &bytes).map_err(io("writing", &tmp))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io("syncing", &tmp))?;
        std::fs::rename(&tmp, &path).map_err(io("renaming into place", &path))?;
        // The directory's entry for the renamed file, made durable as the file is.
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("syncing directory", dir))?;
        Marks::open(dir, partitions)?.ok_or_else(|| MarksError::Damaged {
            path,
            reason: "vanished after creation".into(),
        })
    }

    /// Reads the marks file at `path` (any name: a copy from another machine) without
    /// writing to it: every partition's mark, checking it holds `partitions` partitions.
    ///
    /// # Errors
    ///
    /// [`MarksError`] when it cannot be read, is damaged or holds another partition count.
    pub fn read_file(path: &Path, partitions: u32) -> Result<Vec<Mark>, MarksError> {
        let file = File::open(path).map_err(io("opening", path))?;
        let slots = Marks::load(&file, path, partitions)?;
        Ok(slots.into_iter().map(|(_, m)| m).collect())
    }

    /// Opens the marks file in `dir`, checking it holds `partitions` partitions; `None` when
    /// there is none.
    ///
    /// # Errors
    ///
    /// [`MarksError`] when it cannot be read, is damaged or holds another partition count.
    pub fn open(dir: &Path, partitions: u32) -> Result<Option<Marks>, MarksError> {
        let path = Marks::path(dir);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(MarksError::Io {
                    what: "opening",
                    path,
                    source,
                });
            }
        };
        let slots = Marks::load(&file, &path, partitions)?;
        Ok(Some(Marks {
            path,
            file,
            slots: Mutex::new(slots),
            unsynced: AtomicBool::new(false),
            cycles: Mutex::new(Cycles::default()),
            cycle_ended: [Condvar::new(), Condvar::new()],
            group_settled: Condvar::new(),
            gather_us: AtomicU64::new(GATHER_MAX.as_micros() as u64),
        }))
    }

    /// Every partition's newest valid copy in `file` (at `path`), which must hold
    /// `partitions` partitions.
    fn load(file: &File, path: &Path, partitions: u32) -> Result<Vec<(u64, Mark)>, MarksError> {
        let damaged = |reason: String| MarksError::Damaged {
            path: path.to_path_buf(),
            reason,
        };
        let len = file.metadata().map_err(io("reading", path))?.len();
        let want = HEADER_BYTES + 2 * SLOT_BYTES * u64::from(partitions);
        let mut head = [0u8; HEADER_BYTES as usize];
        if len < HEADER_BYTES {
            return Err(damaged(format!("{len} bytes, shorter than its header")));
        }
        file.read_exact_at(&mut head, 0)
            .map_err(io("reading", path))?;
        if head != header(u32::from_le_bytes(word(&head, 12))) {
            return Err(damaged("the header does not check out".into()));
        }
        let stored = u32::from_le_bytes(word(&head, 12));
        if stored != partitions {
            return Err(damaged(format!(
                "it holds {stored} partitions, the store has {partitions}"
            )));
        }
        if len != want {
            return Err(damaged(format!("{len} bytes where {want} belong")));
        }
        let mut slots = Vec::with_capacity(partitions as usize);
        let mut pair = vec![0u8; 2 * SLOT_BYTES as usize];
        for p in 0..partitions {
            file.read_exact_at(&mut pair, HEADER_BYTES + 2 * SLOT_BYTES * u64::from(p))
                .map_err(io("reading", path))?;
            let (a, b) = pair.split_at(SLOT_BYTES as usize);
            let newest = [decode_slot(a), decode_slot(b)]
                .into_iter()
                .flatten()
                .max_by_key(|(seq, _)| *seq)
                .ok_or_else(|| {
                    damaged(format!("both copies of partition {p}'s mark are damaged"))
                })?;
            slots.push(newest);
        }
        Ok(slots)
    }
}

/// Where the copy with sequence `seq` of `partition`'s mark lies: the slot not holding the
/// copy before it.
pub(super) fn slot_at(partition: u32, seq: u64) -> u64 {
    HEADER_BYTES + 2 * SLOT_BYTES * u64::from(partition) + (seq % 2) * SLOT_BYTES
}

pub(super) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MarksError {
    let path = path.to_path_buf();
    move |source| MarksError::Io { what, path, source }
}

fn word(bytes: &[u8], at: usize) -> [u8; 4] {
    let mut w = [0u8; 4];
    w.copy_from_slice(&bytes[at..at + 4]);
    w
}

fn header(partitions: u32) -> [u8; HEADER_BYTES as usize] {
    let mut h = [0u8; HEADER_BYTES as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&MARKS_FORMAT.to_le_bytes());
    h[12..16].copy_from_slice(&partitions.to_le_bytes());
    let crc = crc32fast::hash(&h[..CRC_AT]);
    h[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    h
}

pub(super) fn encode_slot(seq: u64, mark: &Mark) -> [u8; SLOT_BYTES as usize] {
    let mut s = [0u8; SLOT_BYTES as usize];
    for (i, v) in [seq, mark.plog, mark.wlog, mark.crecord, mark.owrecord]
        .into_iter()
        .enumerate()
    {
        s[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let crc = crc32fast::hash(&s[..CRC_AT]);
    s[CRC_AT..].copy_from_slice(&crc.to_le_bytes());
    s
}

/// A slot's sequence number and mark, or `None` when it was never written or is damaged.
fn decode_slot(s: &[u8]) -> Option<(u64, Mark)> {
    let crc = u32::from_le_bytes(word(s, CRC_AT));
    if crc != crc32fast::hash(&s[..CRC_AT]) {
        return None;
    }
    let at = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&s[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let seq = at(0);
    (seq > 0).then(|| {
        (
            seq,
            Mark {
                plog: at(1),
                wlog: at(2),
                crecord: at(3),
                owrecord: at(4),
            },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marks::tests::mark;

    #[test]
    fn raised_marks_survive_reopening() {
        let dir = tempfile::tempdir().expect("temporary directory");
        assert!(Marks::open(dir.path(), 4).expect("open").is_none());
        let marks = Marks::create(dir.path(), 4).expect("create");
        for plog in 1..=5 {
            marks.raise(2, &mark(plog)).expect("raise");
        }
        marks
            .raise(2, &mark(3))
            .expect("a lower mark changes nothing");
        drop(marks);
        let marks = Marks::open(dir.path(), 4).expect("open").expect("present");
        assert_eq!(marks.get(2).expect("partition 2"), mark(5));
        assert_eq!(marks.get(0).expect("partition 0"), Mark::default());
        assert!(marks.get(4).is_err());
    }

    #[test]
    fn a_torn_newest_copy_falls_back_to_the_older_one() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Marks::create(dir.path(), 2).expect("create");
        marks.raise(1, &mark(7)).expect("raise");
        marks.raise(1, &mark(8)).expect("raise");
        drop(marks);
        // Sequence 3 (mark 8) sits in slot 1 of partition 1: damage it.
        let path = Marks::path(dir.path());
        let mut bytes = std::fs::read(&path).expect("read");
        let at = (HEADER_BYTES + 2 * SLOT_BYTES + SLOT_BYTES + 10) as usize;
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).expect("write");
        let marks = Marks::open(dir.path(), 2).expect("open").expect("present");
        assert_eq!(marks.get(1).expect("partition 1"), mark(7));
    }

    #[test]
    fn a_damaged_or_foreign_marks_file_is_refused() {
        let dir = tempfile::tempdir().expect("temporary directory");
        Marks::create(dir.path(), 2).expect("create");
        let err = Marks::open(dir.path(), 3).unwrap_err().to_string();
        assert!(err.contains("holds 2 partitions"), "{err}");
        let path = Marks::path(dir.path());
        let mut bytes = std::fs::read(&path).expect("read");
        bytes[3] ^= 1;
        std::fs::write(&path, &bytes).expect("write");
        let err = Marks::open(dir.path(), 2).unwrap_err().to_string();
        assert!(
            err.contains("damaged") && err.contains("--accept-loss"),
            "{err}"
        );
        std::fs::write(&path, b"short").expect("write");
        assert!(Marks::open(dir.path(), 2).is_err());
    }
}
