//! `SegError`: every way opening, appending to, syncing or reading a segment log fails, each
//! saying what happened and what to do; and `Fault`, why a frame was not read.

use std::path::PathBuf;

/// Why a frame could not be read where one was expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// A zero length word or the end of the file: the data ends there.
    End,
    /// The file ends inside the frame.
    Truncated,
    /// The length word is larger than a payload may be.
    Length(u32),
    /// The CRC does not match the frame's offset, length and payload.
    Checksum,
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::End => f.write_str("the written data ends"),
            Fault::Truncated => f.write_str("the file ends inside the frame"),
            Fault::Length(len) => write!(f, "the frame's length word reads {len}"),
            Fault::Checksum => f.write_str("the frame's CRC does not match"),
        }
    }
}

/// A segment log could not be opened, written, synced or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SegError {
    /// An I/O call failed.
    #[error("{what} {path}: check the disk and the directory's permissions")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Data is missing or damaged where it must be whole: below the durable end, or inside a
    /// sealed segment.
    #[error(
        "{path}: no valid frame for offset {offset} at byte {position} ({fault}), but offsets \
         below {needed} must be there: the partition's log is damaged; restore it from a backup \
         or a replica"
    )]
    Damaged {
        /// The segment.
        path: PathBuf,
        /// The first offset not read.
        offset: u64,
        /// Where its frame was looked for.
        position: u64,
        /// Why it was not read.
        fault: Fault,
        /// One past the offset that must be there (the durable end, or the next segment's
        /// first offset).
        needed: u64,
    },
    /// No segment holds offsets `from..to`: a segment file is missing.
    #[error(
        "{dir}: no segment holds offsets {from} to {to}: a segment file is missing; restore it \
         from a backup or a replica"
    )]
    Missing {
        /// The log's directory.
        dir: PathBuf,
        /// The first missing offset.
        from: u64,
        /// The last missing offset.
        to: u64,
    },
    /// Two segments hold the same offsets.
    #[error(
        "{path} holds offsets up to {last}, but the next segment starts at {next}: segments \
         overlap; remove the file that does not belong to this log"
    )]
    Overlap {
        /// The earlier segment.
        path: PathBuf,
        /// Its last offset.
        last: u64,
        /// The next segment's first offset.
        next: u64,
    },
    /// A file named as a segment does not start with a segment header.
    #[error(
        "{path} does not start with a valid segment header: it is damaged or not a segment; \
         restore it from a backup, or move it out of the directory"
    )]
    Header {
        /// The file.
        path: PathBuf,
    },
    /// A segment of a format this build does not read.
    #[error(
        "{path} is a segment of format {version}; this build reads format {supported}: run a \
         build that reads it"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// Its format.
        version: u32,
        /// The format this build reads.
        supported: u32,
    },
    /// A segment's header names another partition than the log's.
    #[error(
        "{path} belongs to partition {found}, not {expected}: a directory was copied into the \
         wrong place; put it back where it belongs"
    )]
    Partition {
        /// The file.
        path: PathBuf,
        /// The partition its header names.
        found: u32,
        /// The log's partition.
        expected: u32,
    },
    /// A segment's header names another first offset than its file name.
    #[error(
        "{path}'s header says it starts at offset {found}, its name says {named}: the file was \
         renamed or damaged; restore it from a backup"
    )]
    Renamed {
        /// The file.
        path: PathBuf,
        /// The first offset its header names.
        found: u64,
        /// The first offset its name gives.
        named: u64,
    },
    /// An append did not start at the log's end.
    #[error("an append starts at offset {given}, the log ends at {end}: append from the end only")]
    NotAtEnd {
        /// The offset given.
        given: u64,
        /// The log's end (its next offset).
        end: u64,
    },
    /// A payload is empty or longer than [`crate::PAYLOAD_BYTES_MAX`].
    #[error(
        "the payload of offset {offset} has {len} bytes; a payload has 1 to {max} bytes: split \
         or check it"
    )]
    Payload {
        /// Its offset.
        offset: u64,
        /// Its length.
        len: usize,
        /// The largest payload.
        max: u32,
    },
    /// A read starts below the log's first offset.
    #[error("offset {from} is below the log's first offset {start}: read from {start} on")]
    BelowStart {
        /// The offset asked for.
        from: u64,
        /// The log's first offset.
        start: u64,
    },
    /// An earlier write or sync failed, so what the files hold is not known.
    #[error(
        "an earlier {what} failed, so the log's files are not known to hold what was appended: \
         reopen the log, which cuts what was not written whole"
    )]
    Poisoned {
        /// What failed.
        what: &'static str,
    },
    /// Invalid options.
    #[error("invalid segment log options: {0}")]
    Options(&'static str),
    /// An append or sync of a log opened read-only.
    #[error("the log in {dir} was opened read-only: it takes no append or sync")]
    ReadOnly {
        /// The log's directory.
        dir: PathBuf,
    },
}

impl SegError {
    /// For [`SegError::Damaged`], the offsets it leaves unread: from the damaged frame's to
    /// the one before `needed` (for a read, the next segment's first offset, where reading
    /// can go on); `None` for any other error.
    #[must_use]
    pub fn damaged_offsets(&self) -> Option<std::ops::Range<u64>> {
        match self {
            SegError::Damaged { offset, needed, .. } => Some(*offset..*needed),
            _ => None,
        }
    }
}

/// Maps an I/O error to [`SegError::Io`].
pub(crate) fn io(
    what: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> SegError {
    let path = path.to_path_buf();
    move |source| SegError::Io { what, path, source }
}
