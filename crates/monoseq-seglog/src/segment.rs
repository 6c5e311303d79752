//! `Segment`: one segment file and what is known of it (offsets, data end, sparse index):
//! creating it, checking its header, reading its footer, scanning its frames, appending,
//! zero-filling ahead, cutting a torn tail and sealing.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::error::{Fault, SegError, io};
use crate::frames::Frames;
use crate::layout::{
    FOOTER_FIXED_BYTES, FOOTER_TAIL_BYTES, FORMAT_VERSION, Footer, HEADER_BYTES, HeaderRead,
    INDEX_EVERY, footer, footer_bytes, footer_len, header, read_footer, read_header,
};

/// Largest block of zeros written at once when zero-filling ahead.
const ZERO_BLOCK_BYTES: u64 = 1 << 20;
/// The file name's suffix.
const SUFFIX: &str = ".seg";
/// Digits of the first offset in a file name (`u64::MAX` has 20).
const NAME_DIGITS: usize = 20;

/// One segment file.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) path: PathBuf,
    /// Its first offset.
    pub(crate) first: u64,
    /// One past its last offset (`first` when it holds no frame).
    pub(crate) next: u64,
    /// Byte position after its last frame.
    pub(crate) data_end: u64,
    /// Whether it ends with a footer (it then takes no frame).
    pub(crate) sealed: bool,
    /// The file's length: the zero-filled room of an active segment ends there.
    pub(crate) allocated: u64,
    /// The open file and the sparse index.
    body: Body,
}

/// A segment's open file and its sparse index: the byte position of frame
/// `first + i * INDEX_EVERY`, for every such frame it holds.
#[derive(Debug)]
pub(crate) struct Open {
    pub(crate) file: File,
    pub(crate) index: Vec<u64>,
}

/// Where a segment's [`Open`] file and index are.
#[derive(Debug)]
enum Body {
    /// Held for good: the active segment's, and a read-only log's last one's.
    Held(Open),
    /// A sealed segment's, while its log keeps it among the last read (`None`: closed, and
    /// reopened from the file when read again), so that a log of any length holds a bounded
    /// number of descriptors and index entries.
    Kept(Mutex<Option<Arc<Open>>>),
}

impl Body {
    /// The held file and index (an active segment's); a sealed segment takes no write.
    fn held(&mut self) -> Result<&mut Open, SegError> {
        match self {
            Body::Held(open) => Ok(open),
            Body::Kept(_) => Err(SegError::Poisoned { what: "seal" }),
        }
    }
}

/// A segment's file and index, open for a read.
pub(crate) enum Opened<'a> {
    Held(&'a Open),
    Kept(Arc<Open>),
}

impl std::ops::Deref for Opened<'_> {
    type Target = Open;

    fn deref(&self) -> &Open {
        match self {
            Opened::Held(open) => open,
            Opened::Kept(open) => open,
        }
    }
}

/// What a scan of a segment's frames found.
#[derive(Debug)]
pub(crate) struct Scan {
    /// One past the last valid frame's offset.
    pub(crate) next: u64,
    /// Byte position after the last valid frame.
    pub(crate) data_end: u64,
    /// The sparse index of the valid frames.
    pub(crate) index: Vec<u64>,
    /// Why the scan stopped.
    pub(crate) fault: Fault,
    /// Whether every byte after the data is zero (as an active segment's are).
    pub(crate) clean: bool,
}

/// The name of the segment whose first offset is `first`.
pub(crate) fn file_name(first: u64) -> String {
    format!("{first:0NAME_DIGITS$}{SUFFIX}")
}

/// The first offset a segment file's name gives; `None` for another file.
pub(crate) fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SUFFIX)?;
    let ok = digits.len() == NAME_DIGITS && digits.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| digits.parse().ok()).flatten()
}

/// Syncs the directory `dir`, so the entries created in it are durable.
/// Writes the file's dirty pages to the disk and waits for them ([`crate::SegLog::write_back`]);
/// elsewhere than Linux, `fdatasync`.
pub(crate) fn write_back(file: &File) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        sync_file_range(
            file,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    }
    #[cfg(not(target_os = "linux"))]
    file.sync_data()
}

/// Starts writing the file's dirty pages to the disk without waiting for them
/// ([`crate::SegLog::start_write_back`]); elsewhere than Linux, nothing (the
/// [`write_back`] that follows syncs).
pub(crate) fn start_write_back(file: &File) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        sync_file_range(file, libc::SYNC_FILE_RANGE_WRITE)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        Ok(())
    }
}

/// `sync_file_range(2)` over the whole of `file` with `flags`.
#[cfg(target_os = "linux")]
fn sync_file_range(file: &File, flags: std::ffi::c_uint) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;

    // SAFETY: `sync_file_range` reads and writes no memory of the caller: its arguments are a
    // file descriptor borrowed from a `File` that is open for the whole call, two integers
    // (0, 0: the whole file) and flags. A bad descriptor or argument makes it fail with an
    // error code, which is returned.
    #[expect(unsafe_code, reason = "see safety")]
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the file system holding `dir` overwrites a file's written blocks in place, so that
/// bytes written over them ([`crate::SegLog::write_back`]) are durable once the disk's cache is
/// flushed, with no metadata of their own to sync: ext4 (the one file system known here to do
/// so; a copy-on-write one writes new blocks). `false` when it cannot be told.
#[must_use]
pub fn overwrites_in_place(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::ffi::OsStrExt;

        /// `EXT4_SUPER_MAGIC` (ext2 and ext3 mounted by the ext4 driver report it too).
        const EXT4: i64 = 0xEF53;
        let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
            return false;
        };
        let mut stat = std::mem::MaybeUninit::<libc::statfs>::zeroed();
        // SAFETY: `statfs` reads the NUL-terminated `path`, alive for the call, and writes one
        // `struct statfs` into `stat`, a zeroed value of that type borrowed for the call; it
        // touches no other memory. The value is read only when it answered 0 (written).
        #[expect(unsafe_code, reason = "see safety")]
        let rc = unsafe { libc::statfs(path.as_ptr(), stat.as_mut_ptr()) };
        if rc != 0 {
            return false;
        }
        // SAFETY: written by the successful call above (and zeroed before it in any case).
        #[expect(unsafe_code, reason = "see safety")]
        let stat = unsafe { stat.assume_init() };
        #[allow(
            clippy::unnecessary_cast,
            reason = "f_type's width differs by architecture"
        )]
        let kind = stat.f_type as i64;
        kind == EXT4
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), SegError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing directory", dir))
}

impl Segment {
    /// Creates the empty active segment of `partition` starting at `first` in `dir`: its
    /// header and `preallocate` zero bytes, synced, and the directory's entry synced.
    pub(crate) fn create(
        dir: &Path,
        partition: u32,
        first: u64,
        preallocate: u64,
    ) -> Result<Segment, SegError> {
        let path = dir.join(file_name(first));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io("creating segment", &path))?;
        file.write_all_at(&header(partition, first), 0)
            .map_err(io("writing the header of", &path))?;
        let mut segment = Segment {
            path,
            first,
            next: first,
            data_end: HEADER_BYTES,
            sealed: false,
            allocated: HEADER_BYTES,
            body: Body::Held(Open {
                file,
                index: Vec::new(),
            }),
        };
        segment.zero_fill_to(HEADER_BYTES + preallocate)?;
        segment
            .held()?
            .file
            .sync_all()
            .map_err(io("syncing", &segment.path))?;
        sync_dir(dir)?;
        tracing::debug!(path = %segment.path.display(), "segment created");
        Ok(segment)
    }

    /// Opens the segment file at `path` (for writing too when `write`) and reads its header:
    /// the file, its length, what the header holds.
    pub(crate) fn open_file(path: &Path, write: bool) -> Result<(File, u64, HeaderRead), SegError> {
        let file = OpenOptions::new()
            .read(true)
            .write(write)
            .open(path)
            .map_err(io("opening segment", path))?;
        let len = file.metadata().map_err(io("reading", path))?.len();
        let mut h = vec![0u8; len.min(HEADER_BYTES) as usize];
        file.read_exact_at(&mut h, 0).map_err(io("reading", path))?;
        Ok((file, len, read_header(&h)))
    }

    /// Checks what [`Segment::open_file`] read in the header of `path` (named as starting at
    /// `first`) against the log's partition.
    pub(crate) fn check_header(
        path: &Path,
        read: HeaderRead,
        partition: u32,
        first: u64,
    ) -> Result<(), SegError> {
        let path = path.to_path_buf();
        match read {
            HeaderRead::Invalid => Err(SegError::Header { path }),
            HeaderRead::Version(version) => Err(SegError::Format {
                path,
                version,
                supported: FORMAT_VERSION,
            }),
            HeaderRead::Valid { partition: p, .. } if p != partition => Err(SegError::Partition {
                path,
                found: p,
                expected: partition,
            }),
            HeaderRead::Valid { first: f, .. } if f != first => Err(SegError::Renamed {
                path,
                found: f,
                named: first,
            }),
            HeaderRead::Valid { .. } => Ok(()),
        }
    }

    /// The sealed segment at `path` (`len` bytes) whose footer is `footer`, closed: its file
    /// and index are read again when it is read ([`Segment::open`]).
    pub(crate) fn sealed(path: PathBuf, first: u64, len: u64, footer: Footer) -> Segment {
        let at = len - footer_bytes(footer.index.len());
        Segment {
            path,
            first,
            next: footer.last + 1,
            data_end: at,
            sealed: true,
            allocated: len,
            body: Body::Kept(Mutex::new(None)),
        }
    }

    /// The segment taken as sealed, closed (one whose footer is damaged, read whole from its
    /// frames): its file and index are read again when it is read ([`Segment::open`]).
    pub(crate) fn closed(mut self) -> Segment {
        self.sealed = true;
        self.body = Body::Kept(Mutex::new(None));
        self
    }

    /// The file and index of the segment for a read: a closed sealed segment's are read again
    /// from its footer, or from its frames when the footer is damaged, and checked against
    /// what the log knows of the segment.
    ///
    /// # Errors
    ///
    /// [`SegError::Io`]; [`SegError::Damaged`] when the file no longer holds the frames it
    /// held when the log was opened.
    pub(crate) fn open(&self) -> Result<Opened<'_>, SegError> {
        let kept = match &self.body {
            Body::Held(open) => return Ok(Opened::Held(open)),
            Body::Kept(kept) => kept,
        };
        let mut kept = lock(kept);
        if let Some(open) = &*kept {
            return Ok(Opened::Kept(Arc::clone(open)));
        }
        let open = Arc::new(self.reopen()?);
        *kept = Some(Arc::clone(&open));
        Ok(Opened::Kept(open))
    }

    /// Closes a sealed segment's file and drops its index (until [`Segment::open`]); readers
    /// holding them keep them until they are done.
    pub(crate) fn close(&self) {
        if let Body::Kept(kept) = &self.body {
            lock(kept).take();
        }
    }

    /// Whether the segment's file is open.
    pub(crate) fn is_open(&self) -> bool {
        match &self.body {
            Body::Held(_) => true,
            Body::Kept(kept) => lock(kept).is_some(),
        }
    }

    /// The entries of the segment's index in memory (none while closed).
    pub(crate) fn index_entries(&self) -> usize {
        match &self.body {
            Body::Held(open) => open.index.len(),
            Body::Kept(kept) => lock(kept).as_ref().map_or(0, |o| o.index.len()),
        }
    }

    /// A closed sealed segment's file and index, read again: the footer's, or the frames'
    /// when the footer is damaged (as the log's open found them).
    fn reopen(&self) -> Result<Open, SegError> {
        let (file, len, _) = Segment::open_file(&self.path, false)?;
        let changed = |fault, position| SegError::Damaged {
            path: self.path.clone(),
            offset: self.first,
            position,
            fault,
            needed: self.next,
        };
        let index = match Segment::footer(&self.path, &file, self.first, len)? {
            Some(footer)
                if footer.last + 1 == self.next
                    && len - footer_bytes(footer.index.len()) == self.data_end =>
            {
                footer.index
            }
            Some(_) => return Err(changed(Fault::Checksum, len)),
            None => {
                let scan = Segment::scan(&self.path, &file, self.first, len)?;
                if scan.next < self.next {
                    return Err(changed(scan.fault, scan.data_end));
                }
                scan.index
            }
        };
        Ok(Open { file, index })
    }

    /// The file of a segment whose file is held (the active one's).
    ///
    /// # Errors
    ///
    /// [`SegError::Poisoned`] for a sealed segment (an append or sync after a failed seal).
    pub(crate) fn held_file(&self) -> Result<&File, SegError> {
        match &self.body {
            Body::Held(open) => Ok(&open.file),
            Body::Kept(_) => Err(SegError::Poisoned { what: "seal" }),
        }
    }

    /// The held file and index (an active segment's).
    fn held(&mut self) -> Result<&mut Open, SegError> {
        self.body.held()
    }

    /// The footer of the segment in `file` (`len` bytes, starting at offset `first`) when it
    /// has one that checks out; `None` when it has none or a damaged one.
    pub(crate) fn footer(
        path: &Path,
        file: &File,
        first: u64,
        len: u64,
    ) -> Result<Option<Footer>, SegError> {
        if len < HEADER_BYTES + FOOTER_FIXED_BYTES {
            return Ok(None);
        }
        let mut tail = [0u8; FOOTER_TAIL_BYTES as usize];
        file.read_exact_at(&mut tail, len - FOOTER_TAIL_BYTES)
            .map_err(io("reading", path))?;
        let Some(whole) = footer_len(&tail) else {
            return Ok(None);
        };
        if whole < FOOTER_FIXED_BYTES || whole > len - HEADER_BYTES {
            return Ok(None);
        }
        let at = len - whole;
        let mut body = vec![0u8; (whole - FOOTER_TAIL_BYTES) as usize];
        file.read_exact_at(&mut body, at)
            .map_err(io("reading", path))?;
        Ok(read_footer(&body, first, at))
    }

    /// Scans the frames of `file` (`len` bytes, starting at offset `first`) from the header
    /// to the first that fails.
    pub(crate) fn scan(path: &Path, file: &File, first: u64, len: u64) -> Result<Scan, SegError> {
        let mut frames = Frames::new(file, path, HEADER_BYTES, first, len);
        let mut index = Vec::new();
        let fault = loop {
            let (pos, offset) = (frames.pos(), frames.offset());
            match frames.next_frame()? {
                Ok(_) if (offset - first).is_multiple_of(INDEX_EVERY) => index.push(pos),
                Ok(_) => {}
                Err(fault) => break fault,
            }
        };
        let clean = fault == Fault::End && frames.rest_is_zero()?;
        Ok(Scan {
            next: frames.offset(),
            data_end: frames.pos(),
            index,
            fault,
            clean,
        })
    }

    /// The active segment in `file` (`len` bytes) holding what `scan` found.
    pub(crate) fn active(path: PathBuf, file: File, first: u64, len: u64, scan: Scan) -> Segment {
        Segment {
            path,
            first,
            next: scan.next,
            data_end: scan.data_end,
            sealed: false,
            allocated: len,
            body: Body::Held(Open {
                file,
                index: scan.index,
            }),
        }
    }

    /// Cuts everything after the data (a torn tail): truncates the file there, zero-fills
    /// `preallocate` bytes again, syncs.
    pub(crate) fn cut(&mut self, preallocate: u64) -> Result<(), SegError> {
        let data_end = self.data_end;
        self.held()?
            .file
            .set_len(data_end)
            .map_err(io("truncating", &self.path))?;
        self.allocated = data_end;
        self.zero_fill_to(data_end + preallocate)?;
        self.held()?
            .file
            .sync_data()
            .map_err(io("syncing", &self.path))
    }

    /// Appends `frames` (whole frames from offset [`Segment::next`] on, frame `i` at byte
    /// `positions[i]` of them) with one write, after zero-filling ahead (and syncing the
    /// zeros) when they pass the zero-filled room.
    pub(crate) fn append(
        &mut self,
        frames: &[u8],
        positions: &[u64],
        preallocate: u64,
    ) -> Result<(), SegError> {
        debug_assert!(!self.sealed, "a sealed segment takes no frame");
        let end = self.data_end + frames.len() as u64;
        if end > self.allocated {
            let chunks = (end - self.allocated).div_ceil(preallocate);
            self.zero_fill_to(self.allocated + chunks * preallocate)?;
            self.held()?
                .file
                .sync_data()
                .map_err(io("syncing the zero-filled room of", &self.path))?;
        }
        let (first, next, data_end) = (self.first, self.next, self.data_end);
        let open = self.body.held()?;
        open.file
            .write_all_at(frames, data_end)
            .map_err(io("appending to", &self.path))?;
        for (i, relative) in positions.iter().enumerate() {
            let offset = next + i as u64;
            if (offset - first).is_multiple_of(INDEX_EVERY) {
                open.index.push(data_end + relative);
            }
        }
        self.next += positions.len() as u64;
        self.data_end = end;
        Ok(())
    }

    /// Seals the segment: writes its footer after the data, truncates the file to the
    /// footer's end, syncs.
    pub(crate) fn seal(&mut self) -> Result<(), SegError> {
        debug_assert!(
            self.next > self.first,
            "only a segment holding frames is sealed"
        );
        let (first, last, data_end) = (self.first, self.next - 1, self.data_end);
        let path = &self.path;
        let open = self.body.held()?;
        let f = Footer {
            index: open.index.clone(),
            last,
        };
        let bytes = footer(first, &f);
        open.file
            .write_all_at(&bytes, data_end)
            .map_err(io("writing the footer of", path))?;
        let len = data_end + bytes.len() as u64;
        open.file.set_len(len).map_err(io("truncating", path))?;
        open.file.sync_data().map_err(io("syncing", path))?;
        if let Body::Held(open) = std::mem::replace(&mut self.body, Body::Kept(Mutex::new(None))) {
            self.body = Body::Kept(Mutex::new(Some(Arc::new(open))));
        }
        self.sealed = true;
        self.allocated = len;
        tracing::debug!(
            path = %self.path.display(),
            last = self.next - 1,
            bytes = len,
            "segment sealed"
        );
        Ok(())
    }

    /// Writes zeros from the zero-filled room's end to byte `to`.
    fn zero_fill_to(&mut self, to: u64) -> Result<(), SegError> {
        let zeros = vec![0u8; to.saturating_sub(self.allocated).min(ZERO_BLOCK_BYTES) as usize];
        while self.allocated < to {
            let n = (to - self.allocated).min(zeros.len() as u64) as usize;
            let at = self.allocated;
            self.held()?
                .file
                .write_all_at(&zeros[..n], at)
                .map_err(io("zero-filling", &self.path))?;
            self.allocated += n as u64;
        }
        Ok(())
    }
}

impl Open {
    /// The byte position and offset of the indexed frame at or below `offset` (which the
    /// segment starting at `first` holds).
    pub(crate) fn indexed(&self, first: u64, offset: u64) -> (u64, u64) {
        let i = ((offset - first) / INDEX_EVERY) as usize;
        let i = i.min(self.index.len().saturating_sub(1));
        let pos = self.index.get(i).copied().unwrap_or(HEADER_BYTES);
        (pos, first + i as u64 * INDEX_EVERY)
    }
}

/// A segment's kept body, locked (a poisoned lock holds a sound value: it is only ever set
/// whole).
fn lock(kept: &Mutex<Option<Arc<Open>>>) -> MutexGuard<'_, Option<Arc<Open>>> {
    kept.lock().unwrap_or_else(PoisonError::into_inner)
}
