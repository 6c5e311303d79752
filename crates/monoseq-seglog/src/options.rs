//! `SegOptions`: a segment's size limit, how far ahead it is zero-filled, where a new log
//! starts; their defaults and bounds.

use crate::error::SegError;
use crate::layout::HEADER_BYTES;

/// A segment is sealed once its data passes this many bytes, by default.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 << 20;
/// Largest size limit of a segment.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// An active segment is zero-filled this many bytes ahead at a time, by default.
pub const PREALLOCATE_BYTES_DEFAULT: u64 = 1 << 20;
/// The first offset of a new log, by default (a PLog's first offset).
pub const START_OFFSET_DEFAULT: u64 = 1;

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
    /// log's first segment must (a missing first segment is damage).
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
