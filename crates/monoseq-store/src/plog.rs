//! [`Segments`]: the PLogs of a data directory kept in segment files (`monoseq-seglog`), one
//! log per partition in `plog/{partition}` (key layout 4). A group's events are appended to
//! their partition's log and made durable first (synced, or on one ext4 device written back
//! and flushed once for every partition: [`Segments::flush`]); only then do its WLog entries
//! and records reach the key-value store, with the partition's applied end in the same batch. So the store
//! never holds the effect of an event the log lost, and a restart brings the store up to the
//! log again ("redo", [`crate::EventStore::redo`]) from that applied end.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock};

use monoseq_kv::KvError;
use monoseq_seglog::{Page, SegError, SegLog, SegOptions};

use crate::keys::PartitionId;

/// The directory of a data directory that holds the partitions' segment logs.
pub const PLOG_DIR: &str = "plog";

/// The payload of an offset an accepted loss retired ([`Segments::retire_to`]): a log takes
/// every offset in order, so the offsets a loss skipped hold this one byte, which no encoded
/// event is (an event is longer). Readers find no event there, as at an offset never written.
pub const RETIRED_PAYLOAD: &[u8] = &[0];

/// Events one step of a scan over segments reads at most.
pub(crate) const SCAN_PAGE_EVENTS: usize = 1024;
/// Bytes one step of a scan over segments reads at most (more for one longer event).
pub(crate) const SCAN_PAGE_BYTES: usize = 1 << 20;

/// The segment logs of every partition of a data directory.
#[derive(Debug)]
pub struct Segments {
    dir: PathBuf,
    logs: Vec<PartitionLog>,
    /// `plog/` itself, open, when every log lies on one ext4 file system: then a group's
    /// frames are only written back ([`SegLog::write_back`]) and the marks cycle's one
    /// [`Segments::flush`] makes every partition's durable at once; `None`: each group syncs
    /// its own segment.
    shared_flush: Option<std::fs::File>,
    /// Key layout 5: each partition's WLog entries and created records' references are held
    /// and written in chunks of this many events; `None`: a key each (layout 4).
    chunk_events: Option<usize>,
    /// That index by application, shared by every event store on these logs (made by the
    /// first).
    index: Mutex<Vec<(crate::AppId, std::sync::Arc<crate::chunks::Chunks>)>>,
}

/// One partition's log, and how far the key-value store has applied it.
#[derive(Debug)]
pub(crate) struct PartitionLog {
    pub(crate) log: RwLock<SegLog>,
    /// One past the last offset whose WLog entry and records the key-value store holds;
    /// `None` until read from the store. Held through a group's append and a redo, so a
    /// partition's groups reach the store in log order.
    pub(crate) applied: Mutex<Option<u64>>,
    /// With a shared flush, the key-value batch of the group last appended, and the applied
    /// ends before and after it, written once the flush made the group's frames durable
    /// ([`crate::EventStore::apply_deferred`]).
    pub(crate) deferred: Mutex<Option<Deferred>>,
    /// With a shared flush, frames were appended since the last [`Segments::flush`] took this
    /// log: the next flush writes them back before it syncs. Set after the append, so a flush
    /// that finds it set finds the frames in the page cache.
    pub(crate) unflushed: AtomicBool,
}

/// `open(p)` for every partition `0..partitions`, on as many threads at once as the machine
/// has cores: a log's open reads and checks its active segment through (tens of MiB after a
/// crash), so the logs' reads overlap and their checks share the cores. The results in
/// partition order.
fn each_partition<T: Send>(partitions: u32, open: impl Fn(u32) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZeroUsize::get)
        .min(partitions as usize);
    if threads <= 1 {
        return (0..partitions).map(open).collect();
    }
    let next = AtomicU32::new(0);
    let mut opened: Vec<(u32, T)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let p = next.fetch_add(1, Ordering::Relaxed);
                        if p >= partitions {
                            return mine;
                        }
                        mine.push((p, open(p)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    });
    opened.sort_unstable_by_key(|(p, _)| *p);
    opened.into_iter().map(|(_, t)| t).collect()
}

/// What a failed shared flush is called where it poisons the logs.
const FLUSH: &str =
    "flush of the PLog segments' writes (their write-back and the fdatasync of plog/)";

/// Whether a data directory in key `layout` keeps its PLogs in segment files (layouts 4 and 5).
#[must_use]
pub fn keeps_segments(layout: u32) -> bool {
    layout == crate::KEY_LAYOUT_SEGMENTS || layout == crate::KEY_LAYOUT_CHUNKS
}

impl Segments {
    /// These logs as a data directory in key `layout` keeps them: in layout 5 with the index
    /// in chunks of [`crate::CHUNK_EVENTS`] events ([`Segments::with_chunks`]).
    #[must_use]
    pub fn in_layout(self, layout: u32) -> Segments {
        if layout == crate::KEY_LAYOUT_CHUNKS {
            self.with_chunks(crate::CHUNK_EVENTS)
        } else {
            self
        }
    }

    /// These logs in key layout 5: each partition's WLog entries and created records'
    /// references are held in memory and written every `events` events (normally
    /// [`crate::CHUNK_EVENTS`]) as one key per workspace, records bucket and run, by every
    /// event store on them. Such a store's [`crate::EventStore::redo`] must run before
    /// anything is read: it reads back from these files what was held when it last closed.
    #[must_use]
    pub fn with_chunks(mut self, events: usize) -> Segments {
        self.chunk_events = Some(events.max(1));
        self
    }

    /// The events a chunk holds (key layout 5), or `None` (layout 4).
    pub fn chunk_events(&self) -> Option<usize> {
        self.chunk_events
    }

    /// The index in chunks of `app` on these logs (key layout 5), made by the first caller.
    pub(crate) fn index(&self, app: crate::AppId) -> Option<std::sync::Arc<crate::chunks::Chunks>> {
        let events = self.chunk_events?;
        let mut index = self
            .index
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((_, chunks)) = index.iter().find(|(a, _)| *a == app) {
            return Some(std::sync::Arc::clone(chunks));
        }
        let chunks =
            std::sync::Arc::new(crate::chunks::Chunks::new(app, self.partitions(), events));
        index.push((app, std::sync::Arc::clone(&chunks)));
        Some(chunks)
    }

    /// Opens (or creates) the logs of partitions `0..partitions` in `dir/plog`, each with the
    /// durable end `durable_end` gives it (one past its highest acknowledged offset): frames
    /// above it that do not read whole are cut, data missing or damaged below it is an error.
    ///
    /// # Errors
    ///
    /// The [`SegError`] of the first log that does not open.
    pub fn open(
        dir: &Path,
        partitions: u32,
        durable_end: &dyn Fn(u32) -> u64,
    ) -> Result<Segments, SegError> {
        Segments::open_with(dir, partitions, durable_end, SegOptions::default())
    }

    /// [`Segments::open`] with segments of the given `options` (the default ones in a data
    /// directory; smaller ones let a test seal segments after a few events).
    ///
    /// # Errors
    ///
    /// As [`Segments::open`].
    pub fn open_with(
        dir: &Path,
        partitions: u32,
        durable_end: &dyn Fn(u32) -> u64,
        options: SegOptions,
    ) -> Result<Segments, SegError> {
        let dir = dir.join(PLOG_DIR);
        let ends: Vec<u64> = (0..partitions).map(durable_end).collect();
        let logs = each_partition(partitions, |p| {
            let log = SegLog::open(
                dir.join(p.to_string()),
                p,
                options.clone(),
                ends[p as usize],
            )?;
            Ok(PartitionLog {
                log: RwLock::new(log),
                applied: Mutex::new(None),
                deferred: Mutex::new(None),
                unflushed: AtomicBool::new(false),
            })
        })
        .into_iter()
        .collect::<Result<Vec<_>, SegError>>()?;
        let shared_flush = shared_flush(&dir, partitions);
        Ok(Segments {
            dir,
            logs,
            shared_flush,
            chunk_events: None,
            index: Mutex::default(),
        })
    }

    /// The logs made to share one flush per marks cycle whatever their file system, for tests
    /// of the write order it brings on a file system the check does not take (a tmpfs). Not
    /// for data: where a file system writes new blocks or journals data, a flush of `plog/`
    /// does not make frames written back durable.
    ///
    /// # Errors
    ///
    /// [`KvError::Io`] when `plog/` cannot be opened.
    pub fn with_shared_flush(mut self) -> Result<Segments, KvError> {
        if self.shared_flush.is_none() {
            let dir = std::fs::File::open(&self.dir).map_err(|source| KvError::Io {
                context: "opening plog/ to flush it",
                source,
            })?;
            self.shared_flush = Some(dir);
        }
        Ok(self)
    }

    /// Whether the logs share one flush per marks cycle (`Segments::shared_flush`).
    #[must_use]
    pub fn shares_flush(&self) -> bool {
        self.shared_flush.is_some()
    }

    /// Makes every frame appended with a deferred sync so far, of every partition, durable:
    /// writes back each log appended to since the last flush (marked by its append),
    /// all started before any is waited for, so the disk takes them together, then one
    /// `fdatasync` (of `plog/`), which flushes the disk's cache. With no shared flush,
    /// nothing to do (each group synced its segment).
    ///
    /// # Errors
    ///
    /// A poisoned [`KvError`] when a write-back or the sync failed: nothing written back since
    /// the last flush may be durable (a failed `fdatasync` may have dropped the pages, and a
    /// later one would not say so), so every log is poisoned as a failed sync of its own
    /// segment poisons it: nothing more is appended, and the store must be opened again.
    pub fn flush(&self) -> Result<(), KvError> {
        let Some(dir) = &self.shared_flush else {
            return Ok(());
        };
        let taken: Vec<&PartitionLog> = self
            .logs
            .iter()
            .filter(|log| log.unflushed.swap(false, Ordering::AcqRel))
            .collect();
        let written = taken
            .iter()
            .try_for_each(|log| read_log(log).start_write_back())
            .and_then(|()| taken.iter().try_for_each(|log| read_log(log).write_back()));
        let poison = |what: String| {
            for log in &self.logs {
                read_log(log).poison_by(FLUSH);
            }
            KvError::poisoned(format!("{FLUSH}: {what}"))
        };
        written.map_err(|e| poison(monoseq_kv::chain(&e)))?;
        dir.sync_data().map_err(|e| poison(e.to_string()))
    }

    /// Opens `partition`'s log in data directory `dir` for reading only, as it is
    /// ([`SegLog::open_read_only`]): nothing is created, cut or written, so a torn or damaged
    /// log reads as it was left ([`SegLog::tail`]), for verification. Offsets holding
    /// [`RETIRED_PAYLOAD`] hold no event.
    ///
    /// # Errors
    ///
    /// The [`SegError`] of a log that does not open.
    pub fn open_log_read_only(dir: &Path, partition: u32) -> Result<SegLog, SegError> {
        SegLog::open_read_only(
            dir.join(PLOG_DIR).join(partition.to_string()),
            partition,
            SegOptions::default(),
        )
    }

    /// The directory holding the logs (`plog/` of the data directory).
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How many partitions' logs there are.
    #[must_use]
    pub fn partitions(&self) -> u32 {
        self.logs.len() as u32
    }

    /// One past the last offset of `partition`'s log.
    ///
    /// # Errors
    ///
    /// [`KvError::Backend`] for a partition the directory does not have.
    pub fn end(&self, partition: PartitionId) -> Result<u64, KvError> {
        Ok(read_log(self.log(partition)?).end())
    }

    /// Fills `partition`'s log up to offset `last` (inclusive) with [`RETIRED_PAYLOAD`]
    /// frames, synced, so that it takes `last + 1` next: the offsets an accepted loss retired.
    /// Nothing is written when the log is already past `last`.
    ///
    /// # Errors
    ///
    /// The log's append or sync failing, as a [`KvError`].
    pub fn retire_to(&self, partition: PartitionId, last: u64) -> Result<(), KvError> {
        let log = self.log(partition)?;
        let _held = applied(log);
        let mut written = false;
        loop {
            let mut log = write_log(log);
            let end = log.end();
            if end > last {
                break;
            }
            let n = (last - end + 1).min(SCAN_PAGE_EVENTS as u64) as usize;
            log.append(end, &vec![RETIRED_PAYLOAD; n])
                .map_err(seg_error)?;
            written = true;
        }
        if written {
            read_log(log).sync().map_err(seg_error)?;
            tracing::warn!(
                partition = partition.0,
                "the PLog's offsets up to {last} that an accepted loss retired are marked retired \
                 in its segment files"
            );
        }
        Ok(())
    }

    /// Copies every partition's log into `dest/plog` (a new data directory's), each file
    /// synced; answers the bytes copied. Each log is held against appends only while its files
    /// are listed ([`SegLog::data_files`]): the copy holds the log as it stood then, whole
    /// frames, at least every event acknowledged before the call, while the partition goes on
    /// appending.
    ///
    /// # Errors
    ///
    /// A [`KvError::Io`] naming what failed; the copy must then be discarded.
    pub fn copy_to(&self, dest: &Path) -> Result<u64, KvError> {
        self.copy_logs(dest, &mut |_| {})
    }

    /// [`Segments::copy_to`], calling `copied` with a partition's log after each of its files.
    fn copy_logs(
        &self,
        dest: &Path,
        copied: &mut dyn FnMut(&PartitionLog),
    ) -> Result<u64, KvError> {
        let io = |context: &'static str| move |source| KvError::Io { context, source };
        let mut bytes = 0;
        for (p, log) in self.logs.iter().enumerate() {
            let to = dest.join(PLOG_DIR).join(p.to_string());
            std::fs::create_dir_all(&to).map_err(io("creating a copy's PLog directory"))?;
            let files = read_log(log).data_files();
            for (path, len) in files {
                let name = path.file_name().unwrap_or_default();
                bytes += copy_prefix(&path, &to.join(name), len)
                    .map_err(io("copying a PLog's segment file"))?;
                copied(log);
            }
            sync_dir(&to).map_err(io("syncing a copy's PLog directory"))?;
        }
        sync_dir(&dest.join(PLOG_DIR)).map_err(io("syncing a copy's PLog directory"))?;
        Ok(bytes)
    }

    /// `partition`'s log.
    pub(crate) fn log(&self, partition: PartitionId) -> Result<&PartitionLog, KvError> {
        self.logs
            .get(partition.0 as usize)
            .ok_or_else(|| KvError::Backend {
                message: format!(
                    "partition {partition} has no PLog in {}: the data directory has {} \
                     partitions",
                    self.dir.display(),
                    self.logs.len()
                ),
                source: None,
            })
    }

    /// Up to `max_events` events of `partition` from offset `from` on, or from the log's
    /// start if that is later (see [`SegLog::read`]).
    pub(crate) fn read(
        &self,
        partition: PartitionId,
        from: u64,
        max_events: usize,
        max_bytes: usize,
    ) -> Result<Page, KvError> {
        let log = self.log(partition)?;
        let log = read_log(log);
        let from = from.max(log.start());
        log.read(from, max_events, max_bytes).map_err(seg_error)
    }
}

/// `plog/` open, when a group's frames may be written back and made durable by one flush per
/// marks cycle: on Linux, with `plog/` on ext4 ([`monoseq_seglog::overwrites_in_place`]) and
/// every partition's log on the same device as it (a flush covers one device). Logged once.
fn shared_flush(dir: &Path, partitions: u32) -> Option<std::fs::File> {
    use std::os::unix::fs::MetadataExt;

    let device = |d: &Path| std::fs::metadata(d).map(|m| m.dev()).ok();
    let plog = device(dir)?;
    let one_device = (0..partitions).all(|p| device(&dir.join(p.to_string())) == Some(plog));
    let shared = one_device
        && monoseq_seglog::overwrites_in_place(dir)
        && !journals_data(
            plog,
            &std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default(),
        );
    let opened = if shared {
        std::fs::File::open(dir)
            .inspect_err(|e| tracing::warn!("could not open {} to flush it: {e}", dir.display()))
            .ok()
    } else {
        None
    };
    match opened {
        Some(_) => tracing::info!(
            dir = %dir.display(),
            "the PLog segments share one flush per marks cycle (ext4, one device): a group's \
             frames are written back, and one fdatasync makes every partition's durable"
        ),
        None => tracing::info!(
            dir = %dir.display(),
            "each group syncs its own PLog segment (the segments are not all on one ext4 \
             device, where one flush would make every partition's writes durable)"
        ),
    }
    opened
}

/// Whether a mount of the device `dev` (`st_dev`) in `mountinfo` (`/proc/self/mountinfo`'s
/// text) writes file data through its journal (ext4's `data=journal`): then written-back
/// bytes are durable only once the journal commits, which a flush of another file may not do.
/// A device that mounts cannot be found is taken as journalling data (no shared flush).
fn journals_data(dev: u64, mountinfo: &str) -> bool {
    // Linux's encoding of a device number (glibc's `major`, `minor`): the minor's low 8 bits,
    // the major's low 12, the minor's rest, the major's rest.
    let mask = |bits: u32| (1u64 << bits) - 1;
    let major = (dev >> 8) & mask(12) | (dev >> 32) & !mask(12);
    let minor = dev & mask(8) | (dev >> 12) & !mask(8);
    let id = format!("{major}:{minor}");
    let mut found = false;
    for line in mountinfo.lines() {
        let mut fields = line.split(' ');
        if fields.nth(2) != Some(id.as_str()) {
            continue;
        }
        found = true;
        // The super block's options are the last field, after the " - " separator.
        let options = line.rsplit(' ').next().unwrap_or_default();
        if options.split(',').any(|o| o == "data=journal") {
            return true;
        }
    }
    !found
}

/// Copies the first `len` bytes of `from` into a new file `to` and syncs it; answers `len`.
fn copy_prefix(from: &Path, to: &Path, len: u64) -> std::io::Result<u64> {
    let mut source = std::fs::File::open(from)?.take(len);
    let mut target = std::fs::File::create_new(to)?;
    let copied = std::io::copy(&mut source, &mut target)?;
    if copied != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{} ended after {copied} of {len} bytes", from.display()),
        ));
    }
    target.sync_all()?;
    Ok(copied)
}

/// Makes a directory's entries durable.
fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// The log for reading and syncing (a poisoned lock still holds a sound log: every write to it
/// is one call that either finished or poisoned the log itself).
pub(crate) fn read_log(log: &PartitionLog) -> std::sync::RwLockReadGuard<'_, SegLog> {
    log.log
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The log for appending.
pub(crate) fn write_log(log: &PartitionLog) -> std::sync::RwLockWriteGuard<'_, SegLog> {
    log.log
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The applied end of a partition, held.
pub(crate) fn applied(log: &PartitionLog) -> MutexGuard<'_, Option<u64>> {
    log.applied
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A group whose frames wait for the shared flush: its key-value batch, what it adds to the
/// index in chunks (key layout 5), and the applied ends before and after it.
#[derive(Debug)]
pub(crate) struct Deferred {
    pub(crate) batch: monoseq_kv::WriteBatch,
    pub(crate) index: crate::chunks::GroupIndex,
    pub(crate) end: u64,
    pub(crate) next: u64,
}

/// The group of a partition kept for [`crate::EventStore::apply_deferred`].
pub(crate) fn deferred(log: &PartitionLog) -> MutexGuard<'_, Option<Deferred>> {
    log.deferred
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A segment log's error as the key-value contract's: damage stays damage.
pub(crate) fn seg_error(e: SegError) -> KvError {
    match e {
        SegError::Poisoned { .. } => KvError::poisoned(e.to_string()),
        SegError::Damaged { .. }
        | SegError::Missing { .. }
        | SegError::Overlap { .. }
        | SegError::Header { .. }
        | SegError::Format { .. }
        | SegError::Partition { .. }
        | SegError::Renamed { .. } => KvError::Corrupted {
            message: e.to_string(),
        },
        e => KvError::backend("the PLog's segment log failed", e),
    }
}

#[cfg(test)]
mod tests {
    use super::{Segments, journals_data, read_log, write_log};

    /// A failed flush of `plog/` poisons every partition's log: the frames written back since
    /// the last good flush may be lost, and a later flush would not say so. Nothing more is
    /// appended, and no redo writes their effect to the key-value store.
    #[test]
    fn a_failed_shared_flush_poisons_every_log_and_refuses_the_redo() {
        use std::sync::Arc;

        use crate::{AppId, AppendError, EventStore, PartitionId, TrustLevel};

        let dir = tempfile::tempdir().expect("a directory");
        let mut segments = Segments::open(dir.path(), 2, &|_| 1).expect("the logs open");
        // `fdatasync` of a procfs file fails (EINVAL): a flush that fails.
        segments.shared_flush = Some(std::fs::File::open("/proc/self/stat").expect("procfs"));
        write_log(&segments.logs[0])
            .append(1, &[vec![1u8; 50]])
            .expect("an append");
        read_log(&segments.logs[0])
            .write_back()
            .expect("written back");
        let e = segments.flush().expect_err("the flush fails");
        assert!(e.is_poisoned(), "{e}");
        for log in &segments.logs {
            let end = read_log(log).end();
            let refused = write_log(log).append(end, &[vec![2u8; 50]]);
            assert!(
                matches!(refused, Err(monoseq_seglog::SegError::Poisoned { .. })),
                "{refused:?}"
            );
        }
        let store = EventStore::with_segments(
            monoseq_kv::MemoryStore::new(),
            AppId(1),
            TrustLevel::Level0,
            Arc::new(segments),
        );
        let redo = store.redo_partition(PartitionId(0));
        assert!(
            matches!(&redo, Err(AppendError::Storage(e)) if e.is_poisoned()),
            "{redo:?}"
        );
    }

    /// The logs open side by side, on as many threads as there are cores, yet each lands in
    /// its own partition's place, and of two logs that do not open the error is the lower
    /// partition's, as when they opened one after another.
    #[test]
    fn logs_opened_side_by_side_keep_their_partitions_and_the_lowest_error() {
        let dir = tempfile::tempdir().expect("a directory");
        {
            let segments = Segments::open(dir.path(), 8, &|_| 1).expect("the logs open");
            for (p, log) in segments.logs.iter().enumerate() {
                let payloads: Vec<Vec<u8>> = (0..=p).map(|_| vec![p as u8 + 1; 40]).collect();
                write_log(log).append(1, &payloads).expect("an append");
                write_log(log).sync().expect("synced");
            }
        }
        for _ in 0..5 {
            let segments = Segments::open(dir.path(), 8, &|p| p as u64 + 2).expect("reopened");
            for (p, log) in segments.logs.iter().enumerate() {
                let log = read_log(log);
                assert_eq!(log.end(), p as u64 + 2, "partition {p}'s log");
                let page = log.read(1, 100, 1 << 20).expect("a page");
                assert!(
                    page.payloads()
                        .all(|e| e == vec![p as u8 + 1; 40].as_slice()),
                    "partition {p} reads its own events"
                );
            }
            // Partitions 2 and 5 must hold more than they do: each log's open refuses.
            let short = |p: u32| {
                if p == 2 || p == 5 {
                    50
                } else {
                    u64::from(p) + 2
                }
            };
            let e = Segments::open(dir.path(), 8, &short).expect_err("two logs lack events");
            let text = e.to_string();
            assert!(
                text.contains(&format!("plog{}2", std::path::MAIN_SEPARATOR)),
                "the lower partition's error: {text}"
            );
        }
    }

    /// A copy of the logs (a backup's) holds no log against appends while it copies its
    /// files: the partition appends between them, and the copy ends where the log ended
    /// when its files were listed, frame for frame.
    #[test]
    fn a_copy_of_the_logs_holds_no_log_against_appends_and_ends_where_they_ended() {
        use monoseq_seglog::{SegLog, SegOptions};

        let dir = tempfile::tempdir().expect("a directory");
        let options = SegOptions {
            segment_bytes: 4 << 10,
            preallocate_bytes: 1 << 10,
            ..SegOptions::default()
        };
        let segments =
            Segments::open_with(dir.path(), 1, &|_| 1, options.clone()).expect("the logs open");
        let log = &segments.logs[0];
        for at in (1..400).step_by(10) {
            let payloads: Vec<Vec<u8>> = (at..at + 10).map(|o| vec![o as u8; 100]).collect();
            write_log(log).append(at, &payloads).expect("an append");
        }
        let listed = read_log(log).end();
        assert!(read_log(log).segments() > 3, "several segments to copy");
        let dest = tempfile::tempdir().expect("a directory");
        let mut appended = 0;
        segments
            .copy_logs(dest.path(), &mut |log| {
                let mut held = log
                    .log
                    .try_write()
                    .expect("the copy holds the log against appends");
                let end = held.end();
                held.append(end, &[vec![0xAB; 300]]).expect("an append");
                appended += 1;
            })
            .expect("the copy");
        assert!(appended > 3);
        assert_eq!(read_log(log).end(), listed + appended);
        let copy = SegLog::open_read_only(dest.path().join(super::PLOG_DIR).join("0"), 0, options)
            .expect("the copy opens");
        assert_eq!(
            copy.end(),
            listed,
            "the copy ends where the log did when listed"
        );
        assert!(copy.tail().is_none(), "the copy ends with whole frames");
        let (a, b) = (
            copy.read(1, 1000, usize::MAX).expect("the copy reads"),
            read_log(log)
                .read(1, 1000, usize::MAX)
                .expect("the log reads"),
        );
        assert!(
            a.payloads().eq(b.payloads().take(a.len())),
            "the copy's frames differ"
        );
        assert_eq!(a.len() as u64, listed - 1);
    }

    const MOUNTINFO: &str = "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
        27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard\n\
        28 1 254:16 / /data rw,relatime - ext4 /dev/vdb rw,data=journal\n";

    #[test]
    fn only_a_mount_writing_data_through_its_journal_or_none_found_is_taken_as_journalling() {
        // 254:0 and 254:16 as `st_dev` numbers.
        assert!(!journals_data(254 << 8, MOUNTINFO), "an ordered ext4 mount");
        assert!(
            journals_data((254 << 8) | 16, MOUNTINFO),
            "a data=journal mount"
        );
        assert!(
            journals_data((253 << 8) | 1, MOUNTINFO),
            "a device with no mount found"
        );
    }
}
