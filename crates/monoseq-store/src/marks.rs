//! High-water marks (`monoseq.marks`): per partition, the highest acknowledged PLog offset and
//! the highest WLog offset and record IDs handed out with acknowledged events, kept outside the
//! engine and made durable before the acknowledgement they cover. A store whose PLog ends below
//! its mark lost acknowledged events (a cut journal, lost files, a rolled-back copy); the mark
//! also says which numbers must never be handed out again if that loss is accepted.
//!
//! Layout (all integers little-endian): a 64-byte header (`MSQMARKS`, format, partition count,
//! CRC-32 of the header), then per partition two 64-byte slots holding a sequence number, the
//! four marks and a CRC-32. A raise writes the slot not holding the newest copy, so a torn
//! write damages at most the copy being written; reading takes the valid slot with the highest
//! sequence.
//!
//! Raises of all partitions share cycles (group commit): one caller, the cycle's leader, first
//! makes the store durable with its `sync_store`, then writes every raise waiting for the cycle
//! and syncs the file once. So a mark reaches the disk only after the events it covers, and a
//! power loss can leave a mark below the store's end, never above it.
//!
//! A partition announces each group it starts writing ([`Marks::begin_group`]); a leader first
//! waits, at most [`GATHER_MAX`], for the groups announced before it to raise too, so that one
//! cycle covers the groups of several partitions instead of each paying its own pair of syncs.
//! With no other group under way it waits for nothing.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use monoseq_kv::KvError;

use serde::{Deserialize, Serialize};

/// The marks file's name inside the data directory.
pub const MARKS_FILE: &str = "monoseq.marks";

const MAGIC: &[u8; 8] = b"MSQMARKS";
const MARKS_FORMAT: u32 = 1;
const HEADER_BYTES: u64 = 64;
const SLOT_BYTES: u64 = 64;
const CRC_AT: usize = 60;

/// The high-water mark of one partition. Every field only grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    /// Highest acknowledged PLog offset (0: none).
    pub plog: u64,
    /// Highest WLog offset of an acknowledged event, over the partition's workspaces.
    pub wlog: u64,
    /// Highest CRecord ID created by an acknowledged event.
    pub crecord: u64,
    /// Highest ORecord/WRecord ID created by an acknowledged event.
    pub owrecord: u64,
}

impl Mark {
    /// The field-wise maximum.
    #[must_use]
    pub fn max(&self, other: &Mark) -> Mark {
        Mark {
            plog: self.plog.max(other.plog),
            wlog: self.wlog.max(other.wlog),
            crecord: self.crecord.max(other.crecord),
            owrecord: self.owrecord.max(other.owrecord),
        }
    }

    /// Whether every field of `self` is at least `other`'s.
    #[must_use]
    pub fn covers(&self, other: &Mark) -> bool {
        self.max(other) == *self
    }
}

/// The marks file could not be opened, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MarksError {
    /// An I/O call failed.
    #[error("{what} {path}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a valid marks file for this store.
    #[error(
        "high-water marks file {path} is damaged ({reason}); the store cannot prove it holds \
         every acknowledged event: restore the data directory from a backup, or start with \
         --accept-loss to rebuild the marks from what the engine holds"
    )]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A partition outside the file.
    #[error("partition {partition} is not in the marks file ({partitions} partitions)")]
    NoSuchPartition {
        /// The partition asked for.
        partition: u32,
        /// Partitions in the file.
        partitions: u32,
    },
    /// The store's sync that must precede the raise failed (this caller ran it): nothing of
    /// the cycle was raised.
    #[error("syncing the store before raising the high-water marks failed")]
    Store(#[source] KvError),
    /// The cycle this raise waited for failed in another caller (its store sync, write or
    /// `fdatasync`): nothing of the cycle may be durable.
    #[error("the sync shared with other partitions' raises failed: {reason}")]
    Shared {
        /// The leader's error, as text.
        reason: String,
    },
}

/// Failed cycles kept for the waiters that have not read their outcome yet.
const FAILURES_KEPT: usize = 64;

/// The longest a cycle's leader waits for the groups announced before it to raise too.
pub const GATHER_MAX: Duration = Duration::from_micros(500);

/// The raise cycles: tickets handed out, tickets done, and the raises waiting for a cycle.
#[derive(Debug, Default)]
struct Cycles {
    /// Tickets handed out so far (one per raise).
    requested: u64,
    /// Every ticket up to this one is done (raised durably, or failed).
    done: u64,
    /// A leader is running a cycle.
    leading: bool,
    /// Raises not yet taken by a cycle.
    waiting: Vec<(u32, Mark)>,
    /// The latest failed cycles: their first and last tickets and the error.
    failed: VecDeque<(u64, u64, String)>,
    /// Groups announced so far ([`Marks::begin_group`]).
    begun: u64,
    /// Announced groups that raised since, or ended without raising.
    settled: u64,
    /// A leader is waiting for announced groups (so a settling one wakes it).
    gathering: bool,
}

/// A group a partition has started to write, announced so that a cycle starting meanwhile
/// waits for its raise ([`GroupBegun::raise_after`]). Dropped without raising, it stops
/// being waited for.
#[derive(Debug)]
#[must_use = "a group is waited for until it raises or is dropped"]
pub struct GroupBegun<'a> {
    marks: &'a Marks,
    settled: bool,
}

impl GroupBegun<'_> {
    /// [`Marks::raise_after`] for the group announced.
    ///
    /// # Errors
    ///
    /// As [`Marks::raise_after`].
    pub fn raise_after(
        mut self,
        partition: u32,
        mark: &Mark,
        sync_store: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), MarksError> {
        self.settled = true;
        self.marks.raise_cycle(partition, mark, sync_store, true)
    }
}

impl Drop for GroupBegun<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.marks.settle(&mut self.marks.cycles());
        }
    }
}

/// A cycle's end, run when its leader is done or unwinds (then the cycle failed).
struct CycleEnd<'a> {
    marks: &'a Marks,
    first: u64,
    last: u64,
    failure: Option<String>,
}

impl Drop for CycleEnd<'_> {
    fn drop(&mut self) {
        let failure = if std::thread::panicking() {
            Some("the cycle's store sync or marks write panicked".to_owned())
        } else {
            self.failure.take()
        };
        self.marks.end_cycle(self.first, self.last, failure);
    }
}

/// The open marks file of a data directory.
#[derive(Debug)]
pub struct Marks {
    path: PathBuf,
    file: File,
    /// Newest copy per partition: its sequence number and mark (durable once its cycle ended).
    slots: Mutex<Vec<(u64, Mark)>>,
    /// Set from a slot's write until a sync covers it (a failed cycle leaves it set).
    unsynced: AtomicBool,
    cycles: Mutex<Cycles>,
    /// Signalled when a cycle ends.
    cycle_ended: Condvar,
    /// Signalled when an announced group raises or ends without raising.
    group_settled: Condvar,
    /// The longest a leader waits for announced groups, in microseconds ([`GATHER_MAX`]
    /// unless set).
    gather_us: AtomicU64,
}

impl Marks {
    /// The path of the marks file in `dir`.
    #[must_use]
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(MARKS_FILE)
    }

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
        crate::identity::sync_dir(dir).map_err(io("syncing directory", dir))?;
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
            cycle_ended: Condvar::new(),
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

    /// Partitions in the file.
    #[must_use]
    pub fn partitions(&self) -> u32 {
        self.lock().len() as u32
    }

    /// The mark of `partition` as last raised.
    ///
    /// # Errors
    ///
    /// [`MarksError::NoSuchPartition`] for a partition outside the file.
    pub fn get(&self, partition: u32) -> Result<Mark, MarksError> {
        let slots = self.lock();
        slots
            .get(partition as usize)
            .map(|(_, m)| *m)
            .ok_or(MarksError::NoSuchPartition {
                partition,
                partitions: slots.len() as u32,
            })
    }

    /// Every partition's mark.
    #[must_use]
    pub fn all(&self) -> Vec<Mark> {
        self.lock().iter().map(|(_, m)| *m).collect()
    }

    /// Raises the mark of `partition` to at least `mark` (field-wise) and returns once that is
    /// durable. Concurrent raises share one `fdatasync`. A raise that changes nothing returns
    /// once every earlier raise is durable.
    ///
    /// # Errors
    ///
    /// [`MarksError`] when writing or syncing failed: the mark may not be durable, so the
    /// caller must not acknowledge what it covers.
    pub fn raise(&self, partition: u32, mark: &Mark) -> Result<(), MarksError> {
        self.raise_after(partition, mark, || Ok(()))
    }

    /// [`Marks::raise`] once the store holding the events `mark` covers is durable: the cycle
    /// that takes this raise runs one caller's `sync_store` before it writes the marks. Every
    /// caller's `sync_store` must make durable every write to the same store acknowledged
    /// before the call (a group commit's `sync` does).
    ///
    /// # Errors
    ///
    /// [`MarksError::Store`] when this caller's `sync_store` failed, [`MarksError::Shared`]
    /// when another caller's cycle failed, other [`MarksError`]s when writing or syncing the
    /// file failed. Nothing the mark covers may be acknowledged then.
    pub fn raise_after(
        &self,
        partition: u32,
        mark: &Mark,
        sync_store: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), MarksError> {
        self.raise_cycle(partition, mark, sync_store, false)
    }

    /// Announces a group that will raise soon (through the answer's
    /// [`GroupBegun::raise_after`]): a cycle that starts before it raises waits for it, at
    /// most the gather bound ([`GATHER_MAX`]), so that both share one store sync and one
    /// `fdatasync`.
    pub fn begin_group(&self) -> GroupBegun<'_> {
        self.cycles().begun += 1;
        GroupBegun {
            marks: self,
            settled: false,
        }
    }

    /// Sets the gather bound: the longest a cycle's leader waits for the groups announced
    /// before it (zero: it waits for none).
    pub fn set_gather(&self, gather: Duration) {
        let us = u64::try_from(gather.as_micros()).unwrap_or(u64::MAX);
        self.gather_us.store(us, Ordering::Relaxed);
    }

    /// [`Marks::raise_after`], settling an announced group first when `settles`.
    fn raise_cycle(
        &self,
        partition: u32,
        mark: &Mark,
        sync_store: impl FnOnce() -> Result<(), KvError>,
        settles: bool,
    ) -> Result<(), MarksError> {
        let partitions = self.partitions();
        if partition >= partitions {
            if settles {
                self.settle(&mut self.cycles());
            }
            return Err(MarksError::NoSuchPartition {
                partition,
                partitions,
            });
        }
        let mut cycles = self.cycles();
        cycles.requested += 1;
        let ticket = cycles.requested;
        cycles.waiting.push((partition, *mark));
        if settles {
            self.settle(&mut cycles);
        }
        while cycles.leading && cycles.done < ticket {
            cycles = self
                .cycle_ended
                .wait(cycles)
                .unwrap_or_else(|e| e.into_inner());
        }
        if cycles.done >= ticket {
            return match cycles
                .failed
                .iter()
                .find(|f| f.0 <= ticket && ticket <= f.1)
            {
                None => Ok(()),
                Some((_, _, reason)) => Err(MarksError::Shared {
                    reason: reason.clone(),
                }),
            };
        }
        // This caller leads the cycle of every raise waiting now, its own included, after the
        // groups announced before now raised too (or the gather bound passed).
        cycles.leading = true;
        cycles = self.gather(cycles);
        let first = cycles.done + 1;
        let last = cycles.requested;
        let batch = std::mem::take(&mut cycles.waiting);
        drop(cycles);
        // Ends the cycle even when the store's sync panics, so that no later raise waits for
        // a leader that is gone.
        let mut ending = CycleEnd {
            marks: self,
            first,
            last,
            failure: None,
        };
        let result = sync_store()
            .map_err(MarksError::Store)
            .and_then(|()| self.write_cycle(batch));
        ending.failure = result.as_ref().err().map(|e| monoseq_kv::chain(e));
        drop(ending);
        result
    }

    /// Counts an announced group as settled, waking a leader waiting for groups.
    fn settle(&self, cycles: &mut Cycles) {
        cycles.settled += 1;
        if cycles.gathering {
            self.group_settled.notify_all();
        }
    }

    /// A leader's wait for the groups announced before now to raise (or end without raising),
    /// at most the gather bound.
    fn gather<'a>(&'a self, mut cycles: MutexGuard<'a, Cycles>) -> MutexGuard<'a, Cycles> {
        let announced = cycles.begun;
        if cycles.settled >= announced {
            return cycles;
        }
        let gather = Duration::from_micros(self.gather_us.load(Ordering::Relaxed));
        // No deadline past what an `Instant` holds: then only the groups end the wait.
        let deadline = Instant::now().checked_add(gather);
        cycles.gathering = true;
        while cycles.settled < announced {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            cycles = self
                .group_settled
                .wait_timeout(cycles, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        cycles.gathering = false;
        cycles
    }

    /// Ends the cycle of tickets `first..=last`, failed with `failure` if any, and wakes every
    /// caller waiting for it.
    fn end_cycle(&self, first: u64, last: u64, failure: Option<String>) {
        let mut cycles = self.cycles();
        cycles.leading = false;
        cycles.done = last;
        if let Some(reason) = failure {
            if cycles.failed.len() == FAILURES_KEPT {
                cycles.failed.pop_front();
            }
            cycles.failed.push_back((first, last, reason));
        }
        drop(cycles);
        self.cycle_ended.notify_all();
    }

    /// Writes a cycle's raises (each partition's slot at most once) and syncs the file unless
    /// every write is synced already. Only a cycle's leader calls it.
    fn write_cycle(&self, mut batch: Vec<(u32, Mark)>) -> Result<(), MarksError> {
        batch.sort_unstable_by_key(|(p, _)| *p);
        let mut slots = self.lock();
        let mut raises = batch.into_iter().peekable();
        while let Some((partition, mut mark)) = raises.next() {
            while let Some((_, m)) = raises.next_if(|(p, _)| *p == partition) {
                mark = mark.max(&m);
            }
            let (seq, old) = &mut slots[partition as usize];
            let new = old.max(&mark);
            if new == *old {
                continue;
            }
            let next = *seq + 1;
            let at = HEADER_BYTES + 2 * SLOT_BYTES * u64::from(partition) + (next % 2) * SLOT_BYTES;
            self.unsynced.store(true, Ordering::Release);
            self.file
                .write_all_at(&encode_slot(next, &new), at)
                .map_err(io("writing", &self.path))?;
            *seq = next;
            *old = new;
        }
        drop(slots);
        if self.unsynced.load(Ordering::Acquire) {
            self.file.sync_data().map_err(io("syncing", &self.path))?;
            self.unsynced.store(false, Ordering::Release);
        }
        Ok(())
    }

    fn cycles(&self) -> MutexGuard<'_, Cycles> {
        self.cycles.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Mark)>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MarksError {
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

fn encode_slot(seq: u64, mark: &Mark) -> [u8; SLOT_BYTES as usize] {
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

    fn mark(plog: u64) -> Mark {
        Mark {
            plog,
            wlog: plog / 2,
            crecord: 100 + plog,
            owrecord: 200 + plog,
        }
    }

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

    #[test]
    fn concurrent_raises_all_become_durable() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = std::sync::Arc::new(Marks::create(dir.path(), 8).expect("create"));
        let threads: Vec<_> = (0..8u32)
            .map(|p| {
                let marks = std::sync::Arc::clone(&marks);
                std::thread::spawn(move || {
                    for plog in 1..=50 {
                        marks.raise(p, &mark(plog)).expect("raise");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        drop(marks);
        let marks = Marks::open(dir.path(), 8).expect("open").expect("present");
        assert!(marks.all().iter().all(|m| *m == mark(50)));
    }

    #[test]
    fn raises_waiting_for_a_cycle_share_the_next_ones_store_sync() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::{Arc, Barrier};
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Arc::new(Marks::create(dir.path(), 8).expect("create"));
        let syncs = Arc::new(AtomicU32::new(0));
        let start = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8u32)
            .map(|p| {
                let (marks, syncs, start) = (marks.clone(), syncs.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    marks.raise_after(p, &mark(u64::from(p) + 1), || {
                        // The first cycle's sync is slow: the other raises queue behind it.
                        if syncs.fetch_add(1, Ordering::AcqRel) == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(200));
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread").expect("raised");
        }
        assert_eq!(
            syncs.load(Ordering::Acquire),
            2,
            "one leader, then one cycle for the rest"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 8).expect("read");
        assert_eq!(on_disk, (1..=8).map(mark).collect::<Vec<_>>());
    }

    /// New marks of two partitions in `dir` whose cycles wait at most `bound` for groups.
    fn gathering(dir: &Path, bound: std::time::Duration) -> std::sync::Arc<Marks> {
        let marks = Marks::create(dir, 2).expect("create");
        marks.set_gather(bound);
        std::sync::Arc::new(marks)
    }

    /// Runs `raise` on another thread and waits at most ten seconds for its answer.
    fn within_ten_seconds<T: Send + 'static>(raise: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(raise());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("answered within ten seconds")
    }

    #[test]
    fn a_cycle_waits_for_a_group_begun_before_it_so_both_share_one_store_sync() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        // A gather bound far longer than the test, so only the group's raise ends the wait.
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let syncs = Arc::new(AtomicU32::new(0));
        let (begun_tx, begun_rx) = std::sync::mpsc::channel();
        let (raise_tx, raise_rx) = std::sync::mpsc::channel::<()>();
        let slow = {
            let (marks, syncs) = (marks.clone(), syncs.clone());
            std::thread::spawn(move || {
                let group = marks.begin_group();
                begun_tx.send(()).expect("send");
                raise_rx.recv().expect("told to raise");
                group.raise_after(1, &mark(9), || {
                    syncs.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                })
            })
        };
        begun_rx.recv().expect("the slow group has begun");
        let leader = {
            let (marks, syncs) = (marks.clone(), syncs.clone());
            std::thread::spawn(move || {
                marks.begin_group().raise_after(0, &mark(4), || {
                    syncs.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                })
            })
        };
        // The leader is waiting for the slow group; let the group raise.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(syncs.load(Ordering::Acquire), 0, "the leader waits");
        raise_tx.send(()).expect("send");
        leader.join().expect("thread").expect("raised");
        slow.join().expect("thread").expect("raised");
        assert_eq!(
            syncs.load(Ordering::Acquire),
            1,
            "one cycle, one store sync for both groups"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 2).expect("read");
        assert_eq!(on_disk, vec![mark(4), mark(9)]);
    }

    #[test]
    fn a_group_dropped_without_raising_is_waited_for_no_longer() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let abandoned = marks.begin_group();
        let raising = marks.clone();
        let leader =
            std::thread::spawn(move || raising.begin_group().raise_after(0, &mark(2), || Ok(())));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !leader.is_finished(),
            "the leader waits for the other group"
        );
        drop(abandoned);
        let answered = within_ten_seconds(move || leader.join().expect("thread"));
        answered.expect("raised once the other group was dropped");
        assert_eq!(marks.get(0).expect("partition 0"), mark(2));
    }

    #[test]
    fn a_lone_group_and_a_raise_without_a_group_wait_for_nobody() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let lone = marks.clone();
        within_ten_seconds(move || lone.begin_group().raise_after(0, &mark(3), || Ok(())))
            .expect("raised");
        let plain = marks.clone();
        within_ten_seconds(move || plain.raise_after(1, &mark(5), || Ok(()))).expect("raised");
        assert_eq!(marks.all(), vec![mark(3), mark(5)]);
    }

    #[test]
    fn a_cycle_waits_at_most_its_gather_bound_for_a_group_that_never_raises() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_millis(50));
        let _stuck = marks.begin_group();
        let raising = marks.clone();
        within_ten_seconds(move || raising.begin_group().raise_after(1, &mark(6), || Ok(())))
            .expect("raised after the bound");
        assert_eq!(marks.get(1).expect("partition 1"), mark(6));
    }

    #[test]
    fn a_store_sync_that_panics_fails_its_cycle_and_the_next_raise_still_leads_one() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = std::sync::Arc::new(Marks::create(dir.path(), 2).expect("create"));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            marks.raise_after(0, &mark(3), || panic!("the store's sync panicked"))
        }));
        assert!(panicked.is_err(), "the panic reaches the caller");
        // Not waiting forever for the leader that unwound: on another thread, bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let raising = marks.clone();
        std::thread::spawn(move || {
            let _ = tx.send(raising.raise_after(1, &mark(5), || Ok(())));
        });
        let next = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a raise after a panicked cycle is answered");
        next.expect("the next cycle raises");
        assert_eq!(marks.get(1).expect("partition 1"), mark(5));
        assert_eq!(marks.get(0).expect("partition 0"), Mark::default());
    }

    #[test]
    fn a_failed_store_sync_raises_nothing_and_fails_every_raise_of_its_cycle() {
        use std::sync::Arc;
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Arc::new(Marks::create(dir.path(), 4).expect("create"));
        // A slow first cycle, behind which two raises queue; the second cycle takes both, and
        // its leader's store sync fails.
        let first = {
            let marks = marks.clone();
            std::thread::spawn(move || {
                marks.raise_after(0, &mark(3), || {
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(())
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let queued: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|p| {
                let marks = marks.clone();
                std::thread::spawn(move || {
                    marks.raise_after(p, &mark(7), || Err(KvError::poisoned("a test")))
                })
            })
            .collect();
        first.join().expect("thread").expect("the first cycle");
        let mut answers: Vec<_> = queued
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        answers.sort_by_key(|a| matches!(a, Err(MarksError::Shared { .. })));
        assert!(
            matches!(
                &answers[0],
                Err(MarksError::Store(KvError::Poisoned { .. }))
            ),
            "the leader's own error: {answers:?}"
        );
        assert!(
            matches!(&answers[1], Err(MarksError::Shared { reason }) if reason.contains("poisoned")),
            "the other raise of the cycle: {answers:?}"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 4).expect("read");
        assert_eq!(on_disk[0], mark(3));
        assert_eq!(
            on_disk[1..],
            [Mark::default(); 3],
            "nothing of the failed cycle"
        );
        marks
            .raise_after(1, &mark(7), || Ok(()))
            .expect("a later cycle");
        assert_eq!(marks.get(1).expect("partition 1"), mark(7));
    }
}
