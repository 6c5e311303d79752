//! `SegLog`: one partition's log in its directory: open (restart), append, sync, read; and
//! `SegOptions`, how it lays out its segments.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use crate::error::SegError;
use crate::frames::Frames;
use crate::layout::{HEADER_BYTES, INDEX_EVERY, PAYLOAD_BYTES_MAX, put_frame};
use crate::page::Page;
use crate::recover::{Place, Tail, open_segments};
use crate::segment::{Open, Segment};

/// A segment is sealed once its data passes this many bytes, by default.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 << 20;
/// Largest size limit of a segment.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// An active segment is zero-filled this many bytes ahead at a time, by default.
pub const PREALLOCATE_BYTES_DEFAULT: u64 = 1 << 20;
/// The first offset of a new log, by default (a PLog's first offset).
pub const START_OFFSET_DEFAULT: u64 = 1;
/// Sealed segments a log keeps open (their file descriptor and sparse index) after they were
/// read or sealed, the latest; the others are reopened when read. So a log of any length holds
/// a bounded number of descriptors and index entries.
pub const OPEN_SEALED_MAX: usize = 8;

/// How a segment log lays out its segments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegOptions {
    /// A segment is sealed, and the next one started, once its frames pass this many bytes
    /// (more than the header, at most [`SEGMENT_BYTES_MAX`]).
    pub segment_bytes: u64,
    /// The active segment is zero-filled (written and synced) this many bytes ahead of its
    /// data at a time, so that a later sync writes data only (at least 1, at most
    /// [`SEGMENT_BYTES_MAX`]).
    pub preallocate_bytes: u64,
    /// The offset the log starts at: a new log's first segment begins there, and an existing
    /// log's first segment at or below it (a missing first segment is damage).
    pub start_offset: u64,
}

impl Default for SegOptions {
    fn default() -> Self {
        SegOptions {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            preallocate_bytes: PREALLOCATE_BYTES_DEFAULT,
            start_offset: START_OFFSET_DEFAULT,
        }
    }
}

impl SegOptions {
    /// Checks the bounds each field's doc gives.
    ///
    /// # Errors
    ///
    /// [`SegError::Options`] naming the field out of bounds.
    pub fn validate(&self) -> Result<(), SegError> {
        if self.segment_bytes <= HEADER_BYTES || self.segment_bytes > SEGMENT_BYTES_MAX {
            return Err(SegError::Options(
                "segment_bytes must be more than the header and at most SEGMENT_BYTES_MAX",
            ));
        }
        if self.preallocate_bytes == 0 || self.preallocate_bytes > SEGMENT_BYTES_MAX {
            return Err(SegError::Options(
                "preallocate_bytes must be at least 1 and at most SEGMENT_BYTES_MAX",
            ));
        }
        Ok(())
    }
}

/// One partition's log: a directory of segments, the last one active.
///
/// `append` takes `&mut self`; `sync` and `read` take `&self`, so a caller that shares the log
/// behind a read-write lock holds the write lock only for an append (one `write`, and rarely a
/// zero-fill or a seal), while syncs and reads go on beside each other.
#[derive(Debug)]
pub struct SegLog {
    dir: PathBuf,
    partition: u32,
    options: SegOptions,
    /// In offset order; the last one is active (unsealed).
    segments: Vec<Segment>,
    /// An append's frames, kept between appends.
    buf: Vec<u8>,
    /// Where each of an append's frames starts in `buf`.
    positions: Vec<u64>,
    /// What failed first, once a write or sync failed.
    poisoned: OnceLock<&'static str>,
    /// The first offsets of the sealed segments whose files are open, the one read latest
    /// last: at most [`OPEN_SEALED_MAX`].
    kept_open: Mutex<VecDeque<u64>>,
    /// Opened by [`SegLog::open_read_only`]: takes no append or sync.
    read_only: bool,
    /// What a read-only open found after the data, when not zeros.
    tail: Option<Tail>,
}

impl SegLog {
    /// Opens (or creates) the log of `partition` in `dir`, whose acknowledged offsets end
    /// below `durable_end` (one past the highest offset ever acknowledged; `start_offset`
    /// when none was).
    ///
    /// Every offset below `durable_end` must be there whole. Frames after the last valid one
    /// of the active segment, all above `durable_end`, are cut (a `warn` line says what).
    ///
    /// # Errors
    ///
    /// [`SegError::Damaged`] or [`SegError::Missing`] when offsets below `durable_end` (or
    /// inside a sealed segment) are missing or damaged; [`SegError::Header`],
    /// [`SegError::Format`], [`SegError::Partition`], [`SegError::Renamed`],
    /// [`SegError::Overlap`] for a file that does not belong; [`SegError::Io`];
    /// [`SegError::Options`].
    pub fn open(
        dir: impl AsRef<Path>,
        partition: u32,
        options: SegOptions,
        durable_end: u64,
    ) -> Result<SegLog, SegError> {
        SegLog::open_as(dir.as_ref(), partition, options, durable_end, false)
    }

    /// Opens the log of `partition` in `dir` for reading only, as it is: its files are opened
    /// read-only and nothing is created, cut or written. Sealed segments are checked as by
    /// [`SegLog::open`]; the last segment's data ends at its first frame that does not read
    /// whole (what follows, when not zeros, is [`SegLog::tail`]: a writable open would cut it
    /// or refuse it); an empty directory is an empty log. It takes no append or sync
    /// ([`SegError::ReadOnly`]).
    ///
    /// # Errors
    ///
    /// As [`SegLog::open`], but that nothing below a durable end is required: a missing
    /// directory is [`SegError::Io`].
    pub fn open_read_only(
        dir: impl AsRef<Path>,
        partition: u32,
        options: SegOptions,
    ) -> Result<SegLog, SegError> {
        let start = options.start_offset;
        SegLog::open_as(dir.as_ref(), partition, options, start, true)
    }

    fn open_as(
        dir: &Path,
        partition: u32,
        options: SegOptions,
        durable_end: u64,
        read_only: bool,
    ) -> Result<SegLog, SegError> {
        options.validate()?;
        let dir = dir.to_path_buf();
        let opened = open_segments(&Place {
            dir: &dir,
            partition,
            start_offset: options.start_offset,
            preallocate_bytes: options.preallocate_bytes,
            durable_end,
            read_only,
        })?;
        Ok(SegLog {
            dir,
            partition,
            options,
            segments: opened.segments,
            buf: Vec::new(),
            positions: Vec::new(),
            poisoned: OnceLock::new(),
            kept_open: Mutex::new(VecDeque::new()),
            read_only,
            tail: opened.tail,
        })
    }

    /// For a log opened read-only, what follows the data of its last segment when that is not
    /// zeros (a torn append or damage); `None` otherwise.
    #[must_use]
    pub fn tail(&self) -> Option<&Tail> {
        self.tail.as_ref()
    }

    /// The log's directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log's partition.
    #[must_use]
    pub fn partition(&self) -> u32 {
        self.partition
    }

    /// The first offset the log holds (or will hold).
    #[must_use]
    pub fn start(&self) -> u64 {
        self.segments
            .first()
            .map_or(self.options.start_offset, |s| s.first)
    }

    /// One past the last offset appended: the next append's first offset.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.segments
            .last()
            .map_or(self.options.start_offset, |s| s.next)
    }

    /// How many segment files the log has.
    #[must_use]
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// How many sparse index entries the log keeps in memory (8 bytes each).
    #[must_use]
    pub fn index_entries(&self) -> usize {
        self.segments.iter().map(Segment::index_entries).sum()
    }

    /// Every segment file of the log, in offset order, with how many of its first bytes hold
    /// the log's data now: a sealed segment's whole file, the active one's header and frames
    /// (not its zero-filled room). Those bytes never change once written (an append writes
    /// after them, a seal its footer after the data), so copying them, with no hold on the
    /// log meanwhile, copies the log as it stood at this call: whole frames, ending at
    /// [`SegLog::end`] as it was.
    #[must_use]
    pub fn data_files(&self) -> Vec<(PathBuf, u64)> {
        self.segments
            .iter()
            .map(|s| {
                let bytes = if s.sealed { s.allocated } else { s.data_end };
                (s.path.clone(), bytes)
            })
            .collect()
    }

    /// How many of the log's segment files are open: the active one, and the sealed ones
    /// read lately (at most [`OPEN_SEALED_MAX`]).
    #[must_use]
    pub fn open_files(&self) -> usize {
        self.segments.iter().filter(|s| s.is_open()).count()
    }

    /// Appends `payloads` as the frames of offsets `first_offset`, `first_offset + 1`, …
    /// with one `write` (and, when they pass the zero-filled room, a zero-fill and its sync
    /// first); returns the new end. Once the active segment passes its size limit it is
    /// sealed and the next one created, both synced. Nothing is durable before
    /// [`SegLog::sync`] (or a seal).
    ///
    /// # Errors
    ///
    /// [`SegError::NotAtEnd`] when `first_offset` is not [`SegLog::end`];
    /// [`SegError::Payload`] for an empty or too long payload (nothing is written then);
    /// [`SegError::Io`], after which the log is poisoned: every later call answers
    /// [`SegError::Poisoned`] until it is reopened; [`SegError::Poisoned`].
    pub fn append<P: AsRef<[u8]>>(
        &mut self,
        first_offset: u64,
        payloads: &[P],
    ) -> Result<u64, SegError> {
        self.check_poisoned()?;
        let end = self.end();
        if first_offset != end {
            return Err(SegError::NotAtEnd {
                given: first_offset,
                end,
            });
        }
        self.frame(end, payloads)?;
        if payloads.is_empty() {
            return Ok(end);
        }
        let (preallocate, limit) = (self.options.preallocate_bytes, self.options.segment_bytes);
        let (buf, positions) = (
            std::mem::take(&mut self.buf),
            std::mem::take(&mut self.positions),
        );
        let written = self
            .active_mut()
            .and_then(|active| active.append(&buf, &positions, preallocate));
        (self.buf, self.positions) = (buf, positions);
        written.map_err(|e| self.poison("write", e))?;
        if self.active()?.data_end >= limit {
            self.roll().map_err(|e| self.poison("seal", e))?;
        }
        Ok(self.end())
    }

    /// Makes every frame appended durable: `fdatasync` of the active segment (a new segment
    /// and its directory entry were synced when it was created).
    ///
    /// # Errors
    ///
    /// [`SegError::Io`], after which the log is poisoned (a failed sync may have dropped
    /// pages); [`SegError::Poisoned`].
    pub fn sync(&self) -> Result<(), SegError> {
        self.check_poisoned()?;
        let active = self.active()?;
        active
            .held_file()?
            .sync_data()
            .map_err(crate::error::io("syncing", &active.path))
            .map_err(|e| self.poison("sync", e))
    }

    /// Sends every frame appended to the disk and waits until it took them, without asking it
    /// to flush its cache: `sync_file_range` (wait for writeback under way, write, wait) over
    /// the active segment. The frames are durable once the disk's cache is flushed afterwards,
    /// by an `fdatasync` of any file on the same file system: their blocks were allocated and
    /// written (zero-filled) and that fill synced before, so overwriting them in place needs no
    /// metadata, where the file system overwrites in place (ext4; not a copy-on-write one).
    /// Elsewhere than Linux it is [`SegLog::sync`].
    ///
    /// # Errors
    ///
    /// As [`SegLog::sync`]: a failed write poisons the log.
    pub fn write_back(&self) -> Result<(), SegError> {
        self.write_back_with(crate::segment::write_back)
    }

    /// Starts sending every frame appended to the disk, without waiting for it: the
    /// [`SegLog::write_back`] that must follow waits. Several logs' writes started one after
    /// another reach the disk together, where each log's whole write-back in turn would wait
    /// for the disk once a log. Elsewhere than Linux it does nothing (the write-back syncs).
    ///
    /// # Errors
    ///
    /// As [`SegLog::sync`]: a failed write poisons the log.
    pub fn start_write_back(&self) -> Result<(), SegError> {
        self.write_back_with(crate::segment::start_write_back)
    }

    /// Runs `write` (a write-back, or its start) on the active segment's file; a failure
    /// poisons the log.
    fn write_back_with(
        &self,
        write: fn(&std::fs::File) -> std::io::Result<()>,
    ) -> Result<(), SegError> {
        self.check_poisoned()?;
        let active = self.active()?;
        write(active.held_file()?)
            .map_err(crate::error::io("writing back", &active.path))
            .map_err(|e| self.poison("write back", e))
    }

    /// Up to `max_events` frames from offset `from` on, in offset order, their bytes at most
    /// `max_bytes` (but the first frame's, which is always returned; none when `max_events`
    /// is 0), each frame's length and
    /// CRC checked; empty at or past the end. It seeks once per segment (to the indexed frame
    /// at or below `from`, at most 63 frames before it) and reads on sequentially.
    ///
    /// # Errors
    ///
    /// [`SegError::BelowStart`] when `from` is below [`SegLog::start`];
    /// [`SegError::Damaged`] when a frame fails its check; [`SegError::Io`].
    pub fn read(&self, from: u64, max_events: usize, max_bytes: usize) -> Result<Page, SegError> {
        let start = self.start();
        if from < start {
            return Err(SegError::BelowStart { from, start });
        }
        let mut page = Page::new(from);
        if max_events == 0 {
            return Ok(page);
        }
        let first = self.segments.partition_point(|s| s.first <= from);
        for segment in self.segments.iter().skip(first.saturating_sub(1)) {
            if page.end() >= segment.next {
                continue;
            }
            let open = segment.open()?;
            if segment.sealed {
                self.keep_open(segment.first);
            }
            if !read_segment(segment, &open, &mut page, max_events, max_bytes)? {
                break;
            }
        }
        Ok(page)
    }

    /// Encodes `payloads`' frames from offset `end` into the append buffer.
    fn frame<P: AsRef<[u8]>>(&mut self, end: u64, payloads: &[P]) -> Result<(), SegError> {
        self.buf.clear();
        self.positions.clear();
        for (i, payload) in payloads.iter().enumerate() {
            let payload = payload.as_ref();
            let offset = end + i as u64;
            if payload.is_empty() || payload.len() > PAYLOAD_BYTES_MAX as usize {
                return Err(SegError::Payload {
                    offset,
                    len: payload.len(),
                    max: PAYLOAD_BYTES_MAX,
                });
            }
            self.positions.push(self.buf.len() as u64);
            put_frame(&mut self.buf, offset, payload);
        }
        Ok(())
    }

    /// Seals the active segment and starts the next.
    fn roll(&mut self) -> Result<(), SegError> {
        let active = self.active_mut()?;
        active.seal()?;
        let (first, next) = (active.first, active.next);
        self.keep_open(first);
        let segment = Segment::create(
            &self.dir,
            self.partition,
            next,
            self.options.preallocate_bytes,
        )?;
        self.segments.push(segment);
        Ok(())
    }

    /// Counts the sealed segment starting at `first` among the ones kept open, the one read or
    /// sealed latest; closes the one read longest ago past [`OPEN_SEALED_MAX`].
    fn keep_open(&self, first: u64) {
        let mut kept = self
            .kept_open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.retain(|&f| f != first);
        kept.push_back(first);
        while kept.len() > OPEN_SEALED_MAX {
            let Some(oldest) = kept.pop_front() else {
                break;
            };
            if let Ok(i) = self.segments.binary_search_by_key(&oldest, |s| s.first) {
                self.segments[i].close();
            }
        }
    }

    fn active(&self) -> Result<&Segment, SegError> {
        self.segments
            .last()
            .filter(|s| !s.sealed)
            .ok_or(SegError::Poisoned { what: "seal" })
    }

    fn active_mut(&mut self) -> Result<&mut Segment, SegError> {
        self.segments
            .last_mut()
            .filter(|s| !s.sealed)
            .ok_or(SegError::Poisoned { what: "seal" })
    }

    fn check_poisoned(&self) -> Result<(), SegError> {
        if self.read_only {
            return Err(SegError::ReadOnly {
                dir: self.dir.clone(),
            });
        }
        match self.poisoned.get() {
            Some(what) => Err(SegError::Poisoned { what }),
            None => Ok(()),
        }
    }

    /// Marks the log poisoned by `what`, a failure outside it that may have dropped frames it
    /// wrote (a flush of the directory holding it): every later append, sync or write-back
    /// answers [`SegError::Poisoned`].
    pub fn poison_by(&self, what: &'static str) {
        if self.poisoned.set(what).is_ok() {
            tracing::error!(dir = %self.dir.display(), "segment log poisoned by a failed {what}");
        }
    }

    /// What poisoned the log, if anything did ([`SegError::Poisoned`]).
    #[must_use]
    pub fn poisoned(&self) -> Option<&'static str> {
        self.poisoned.get().copied()
    }

    /// Marks the log poisoned by a failed `what`; returns `e`.
    fn poison(&self, what: &'static str, e: SegError) -> SegError {
        let _ = self.poisoned.set(what);
        tracing::error!(dir = %self.dir.display(), error = %e, "segment log poisoned by a failed {what}");
        e
    }
}

/// Adds to `page` the frames of `segment` from [`Page::end`] on; `false` once the page is
/// full.
fn read_segment(
    segment: &Segment,
    open: &Open,
    page: &mut Page,
    max_events: usize,
    max_bytes: usize,
) -> Result<bool, SegError> {
    let from = page.end();
    let (pos, offset) = open.indexed(segment.first, from);
    let mut frames = Frames::new(&open.file, &segment.path, pos, offset, segment.data_end);
    if max_events <= INDEX_EVERY as usize {
        frames = frames.small();
    }
    while frames.offset() < segment.next {
        if page.len() >= max_events {
            return Ok(false);
        }
        let (offset, position) = (frames.offset(), frames.pos());
        match frames.next_frame()? {
            Ok(_) if offset < from => {}
            Ok(frame) if page.takes(frame.len(), max_events, max_bytes) => page.push(frame),
            Ok(_) => return Ok(false),
            Err(fault) => {
                return Err(SegError::Damaged {
                    path: segment.path.clone(),
                    offset,
                    position,
                    fault,
                    needed: segment.next,
                });
            }
        }
    }
    Ok(true)
}
