//! monoseq-seglog: a partition's PLog kept as append-only segment files. Owns the files'
//! layout, appending and syncing, reading a page from an offset through a sparse index, and
//! the restart: torn tails above the durable end cut, damage below it refused. The payloads
//! (encoded events, which carry their own CRC) are opaque bytes here.
//!
//! # Layout
//!
//! A log is one directory holding its segments, each named `{first offset:020}.seg` (twenty
//! decimal digits). Offsets are consecutive over the segments: the segment after one whose
//! last offset is `n` starts at `n + 1`, and the `i`-th frame of a segment (from 0) holds
//! offset `first + i`. Only the last segment is active (takes appends); the others are
//! sealed. Integers are little-endian; a CRC is the CRC-32 (IEEE) of `crc32fast`.
//!
//! **Header**, 32 bytes at byte 0:
//!
//! | bytes  | field                                             |
//! |--------|---------------------------------------------------|
//! | 0..8   | magic `MSQSEGMT`                                  |
//! | 8..12  | format version, `u32` ([`FORMAT_VERSION`], 1)     |
//! | 12..16 | partition, `u32`                                  |
//! | 16..24 | first offset, `u64` (equal to the file's name)    |
//! | 24..28 | reserved, zero                                    |
//! | 28..32 | CRC of bytes 0..28                                |
//!
//! **Frames** from byte 32 on, back to back, one per offset:
//!
//! | bytes        | field                                                        |
//! |--------------|--------------------------------------------------------------|
//! | 0..4         | `len`, `u32`: the payload's length, 1 to [`PAYLOAD_BYTES_MAX`] |
//! | 4..8         | CRC of the frame's offset (`u64`), `len` (`u32`) and payload   |
//! | 8..8+len     | payload                                                       |
//!
//! The offset inside the CRC makes a frame read at another offset's place fail. A zero length
//! word, or the end of the file, ends the data.
//!
//! **Zero-filled room.** An active segment's file runs on past its data, zero-filled:
//! created with [`SegOptions::preallocate_bytes`] of zeros after the header, and extended by
//! whole multiples of it (written and synced) before an append would pass it, so a sync after
//! an append writes data, not the file's size. The data ends at the first zero length word.
//!
//! **Footer**, written after the last frame when a segment is sealed (its data passed
//! [`SegOptions::segment_bytes`]); the file is then cut to the footer's end and synced:
//!
//! | bytes            | field                                                          |
//! |------------------|----------------------------------------------------------------|
//! | 0..4             | zero (the end of the data, for a scan)                         |
//! | 4..8             | `n`, `u32`: index entries                                      |
//! | 8..8+16n         | per entry: offset `first + 64 i` (`u64`), its frame's byte position (`u64`) |
//! | +0..8            | the segment's last offset, `u64`                               |
//! | +8..12           | CRC of the footer's bytes before it                            |
//! | +12..16          | the footer's length in bytes, `u32` (`32 + 16 n`)              |
//! | +16..24          | magic `MSQSEGFT`                                               |
//!
//! A reader finds the footer from the file's last 12 bytes. There is an entry for every
//! [`INDEX_EVERY`]th (64th) frame of the segment, the first at byte 32.
//!
//! # Restart
//!
//! [`SegLog::open`] takes the durable end (one past the highest offset ever acknowledged).
//! Sealed segments' indexes come from their footers; a footer that fails its check is
//! rebuilt from the frames (a `warn` line), which must then reach the next segment's first
//! offset. The active segment is scanned; the first frame whose length or CRC fails, or a
//! zero length, ends its data. Data missing or damaged below the durable end is an error
//! naming the file, the offset and the byte position; anything else after the data (a torn
//! frame, a half-written footer, garbage) lies above it and is cut: truncated, zero-filled
//! again, synced, and a `warn` line says what. A gap between segments, a header naming
//! another partition, first offset or format are errors.
//!
//! [`SegLog::open_read_only`] opens a log as it is, to verify it: nothing is created, cut or
//! written; what follows the active segment's data, when not zeros, is described ([`Tail`]).
//!
//! # Memory
//!
//! Bounded, whatever the log's length. The sparse index takes 8 bytes per 64 frames (a `u64`
//! byte position; the offset is implied), about 0.13 byte per event, but only the active
//! segment's and those of the last [`OPEN_SEALED_MAX`] sealed segments sealed or read are in
//! memory, each with its file open; the others are closed (a path and four integers each)
//! and reopened from their footers when read again, their footers checked against what the
//! open found. An append's frames are encoded into one buffer kept between appends; a read
//! holds one block of 256 KiB (more for a longer frame) and the page it returns.
//!
//! # Example
//!
//! ```
//! use monoseq_seglog::{SegLog, SegOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let mut log = SegLog::open(dir.path(), 0, SegOptions::default(), 1)?;
//! let end = log.append(1, &[b"first event".as_slice(), b"second"])?;
//! log.sync()?;
//! assert_eq!(end, 3);
//! drop(log);
//!
//! let log = SegLog::open(dir.path(), 0, SegOptions::default(), 3)?;
//! let page = log.read(2, 100, 1 << 20)?;
//! assert_eq!(page.payloads().collect::<Vec<_>>(), [b"second".as_slice()]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod error;
mod frames;
mod layout;
mod log;
mod page;
#[cfg(all(feature = "testing", target_os = "linux"))]
pub mod page_cache;
mod recover;
mod segment;

pub use error::{Fault, SegError};
pub use layout::{FORMAT_VERSION, FRAME_HEAD_BYTES, HEADER_BYTES, INDEX_EVERY, PAYLOAD_BYTES_MAX};
pub use log::{
    OPEN_SEALED_MAX, PREALLOCATE_BYTES_DEFAULT, SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX,
    START_OFFSET_DEFAULT, SegLog, SegOptions,
};
pub use page::Page;
pub use recover::Tail;
pub use segment::overwrites_in_place;
