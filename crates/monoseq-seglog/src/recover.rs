//! Opening a log's directory: every segment's header checked, the sealed ones' indexes read
//! from their footers (rebuilt from their frames when a footer is damaged), the active one
//! scanned; gaps and damage below the durable end refused, a torn tail above it cut. Opened
//! read-only, nothing is created, cut or written: what follows the data is described instead.

use std::path::{Path, PathBuf};

use crate::error::{Fault, SegError, io};
use crate::layout::HeaderRead;
use crate::segment::{Segment, parse_name, sync_dir};

/// Where a log lies and what it must hold.
pub(crate) struct Place<'a> {
    pub(crate) dir: &'a Path,
    pub(crate) partition: u32,
    /// Where a new log starts; an existing one's first segment starts at or below it.
    pub(crate) start_offset: u64,
    /// Zeros written ahead of an active segment's data at a time.
    pub(crate) preallocate_bytes: u64,
    /// One past the highest offset ever acknowledged.
    pub(crate) durable_end: u64,
    /// Whether to open for reading only: files opened read-only, nothing created or cut.
    pub(crate) read_only: bool,
}

/// What a log opened read-only holds after the data of its last segment when that is not
/// zeros: a torn append (nothing acknowledged; a writable open cuts it) or damage (frames
/// lost, if offsets from [`Tail::offset`] on were acknowledged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tail {
    /// The last segment.
    pub path: PathBuf,
    /// The first offset not read: the log's end.
    pub offset: u64,
    /// Where its frame was looked for.
    pub position: u64,
    /// Why it was not read.
    pub fault: Fault,
    /// The file's length: not every byte from `position` to it is zero.
    pub file_bytes: u64,
}

impl std::fmt::Display for Tail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: no valid frame for offset {} at byte {} ({}), yet bytes up to {} are not all \
             zero: a torn append, or frames damaged",
            self.path.display(),
            self.offset,
            self.position,
            self.fault,
            self.file_bytes
        )
    }
}

/// The segments a log's directory holds, in offset order, and the tail a read-only open left.
pub(crate) struct Opened {
    pub(crate) segments: Vec<Segment>,
    pub(crate) tail: Option<Tail>,
}

/// The log's segments in offset order, the last one active (unsealed, zero-filled ahead);
/// read-only, the last one as found (sealed or not, and none in an empty directory).
pub(crate) fn open_segments(at: &Place<'_>) -> Result<Opened, SegError> {
    let start = at.start_offset;
    if !at.read_only {
        std::fs::create_dir_all(at.dir).map_err(io("creating directory", at.dir))?;
    }
    let names = list(at.dir)?;
    let Some(&(lowest, _)) = names.first() else {
        if at.read_only {
            return Ok(Opened {
                segments: Vec::new(),
                tail: None,
            });
        }
        if at.durable_end > start {
            return Err(missing(at.dir, start, at.durable_end));
        }
        if let Some(parent) = at.dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        let first = Segment::create(at.dir, at.partition, start, at.preallocate_bytes)?;
        return Ok(Opened {
            segments: vec![first],
            tail: None,
        });
    };
    if lowest > start {
        return Err(missing(at.dir, start, lowest));
    }
    let mut segments = Vec::with_capacity(names.len() + 1);
    for pair in names.windows(2) {
        let ((first, path), (next, _)) = (&pair[0], &pair[1]);
        segments.push(open_inner(at, path.clone(), *first, *next)?);
    }
    let mut tail = None;
    if let Some((first, path)) = names.last() {
        let last = if at.read_only {
            let (last, found) = open_last_read_only(at, path.clone(), *first)?;
            tail = found;
            vec![last]
        } else {
            open_last(at, path.clone(), *first)?
        };
        segments.extend(last);
    }
    Ok(Opened { segments, tail })
}

/// The segment files in `dir` (their first offset and path), in offset order.
fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, SegError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("listing", dir))? {
        let entry = entry.map_err(io("listing", dir))?;
        if let Some(first) = entry.file_name().to_str().and_then(parse_name) {
            names.push((first, entry.path()));
        }
    }
    names.sort_unstable();
    Ok(names)
}

/// [`SegError::Missing`] for offsets `from..to`.
fn missing(dir: &Path, from: u64, to: u64) -> SegError {
    SegError::Missing {
        dir: dir.to_path_buf(),
        from,
        to: to - 1,
    }
}

/// A segment followed by the one starting at `next`: sealed, its index from its footer or,
/// when that is damaged, from its frames, which must reach `next`.
fn open_inner(at: &Place<'_>, path: PathBuf, first: u64, next: u64) -> Result<Segment, SegError> {
    let (file, len, head) = Segment::open_file(&path, !at.read_only)?;
    Segment::check_header(&path, head, at.partition, first)?;
    let segment = match Segment::footer(&path, &file, first, len)? {
        Some(footer) => Segment::sealed(path, first, len, footer),
        None => {
            let scan = Segment::scan(&path, &file, first, len)?;
            if scan.next < next {
                return Err(SegError::Damaged {
                    path,
                    offset: scan.next,
                    position: scan.data_end,
                    fault: scan.fault,
                    needed: next,
                });
            }
            tracing::warn!(
                path = %path.display(),
                frames = scan.next - first,
                "a sealed segment's footer is damaged; its index was rebuilt from its frames"
            );
            Segment::active(path, file, first, len, scan).closed()
        }
    };
    match segment.next {
        n if n < next => Err(missing(at.dir, n, next)),
        n if n > next => Err(SegError::Overlap {
            path: segment.path,
            last: n - 1,
            next,
        }),
        _ => Ok(segment),
    }
}

/// The last segment, and the new active one when it is sealed.
fn open_last(at: &Place<'_>, path: PathBuf, first: u64) -> Result<Vec<Segment>, SegError> {
    let prealloc = at.preallocate_bytes;
    let (file, len, head) = Segment::open_file(&path, true)?;
    if head == HeaderRead::Invalid && first >= at.durable_end {
        // Created but never synced whole: nothing in it was acknowledged.
        drop(file);
        std::fs::remove_file(&path).map_err(io("removing", &path))?;
        tracing::warn!(
            path = %path.display(),
            "a segment whose creation was cut short was created again"
        );
        return Ok(vec![Segment::create(
            at.dir,
            at.partition,
            first,
            prealloc,
        )?]);
    }
    Segment::check_header(&path, head, at.partition, first)?;
    if let Some(footer) = Segment::footer(&path, &file, first, len)? {
        let sealed = Segment::sealed(path, first, len, footer);
        if sealed.next < at.durable_end {
            return Err(missing(at.dir, sealed.next, at.durable_end));
        }
        let active = Segment::create(at.dir, at.partition, sealed.next, prealloc)?;
        return Ok(vec![sealed, active]);
    }
    let scan = Segment::scan(&path, &file, first, len)?;
    if scan.next < at.durable_end {
        return Err(SegError::Damaged {
            path,
            offset: scan.next,
            position: scan.data_end,
            fault: scan.fault,
            needed: at.durable_end,
        });
    }
    let (clean, fault) = (scan.clean, scan.fault);
    let mut active = Segment::active(path, file, first, len, scan);
    if !clean {
        active.cut(prealloc)?;
        tracing::warn!(
            path = %active.path.display(),
            offset = active.next,
            position = active.data_end,
            bytes = len - active.data_end,
            durable_end = at.durable_end,
            "a torn tail above the durable end was cut ({fault}): it held nothing acknowledged"
        );
    }
    Ok(vec![active])
}

/// The last segment as found, opened read-only: sealed, or scanned to the end of its data;
/// with what follows that data when it is not zeros. Nothing is cut or created.
fn open_last_read_only(
    at: &Place<'_>,
    path: PathBuf,
    first: u64,
) -> Result<(Segment, Option<Tail>), SegError> {
    let (file, len, head) = Segment::open_file(&path, false)?;
    Segment::check_header(&path, head, at.partition, first)?;
    if let Some(footer) = Segment::footer(&path, &file, first, len)? {
        return Ok((Segment::sealed(path, first, len, footer), None));
    }
    let scan = Segment::scan(&path, &file, first, len)?;
    let tail = (!scan.clean).then(|| Tail {
        path: path.clone(),
        offset: scan.next,
        position: scan.data_end,
        fault: scan.fault,
        file_bytes: len,
    });
    Ok((Segment::active(path, file, first, len, scan), tail))
}
