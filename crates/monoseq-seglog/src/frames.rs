//! `Frames`: reads a segment's frames front to back, a block per `pread`, checking each
//! frame's length and CRC; used by the restart's scan and by reads.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::error::{Fault, SegError, io};
use crate::layout::{FRAME_HEAD_BYTES, PAYLOAD_BYTES_MAX, frame_crc, frame_head};

/// Bytes read at a time (more when one frame is longer).
pub(crate) const READ_BLOCK_BYTES: u64 = 256 << 10;
/// Bytes read at a time by a read of a few frames (a point read: the indexed frame is at most
/// 63 frames before the one wanted).
pub(crate) const SMALL_READ_BLOCK_BYTES: u64 = 16 << 10;

/// A cursor over the frames of one segment file, from a known frame on.
pub(crate) struct Frames<'a> {
    file: &'a File,
    path: &'a Path,
    /// Byte position of the next frame.
    pos: u64,
    /// Offset of the next frame.
    offset: u64,
    /// Nothing at or past this byte is read.
    limit: u64,
    buf: Vec<u8>,
    /// File position of `buf[0]`.
    buf_at: u64,
    /// Bytes read at a time (more when one frame is longer).
    block: u64,
}

impl<'a> Frames<'a> {
    /// A cursor at the frame of `offset` at byte `pos`, reading no byte at or past `limit`.
    pub(crate) fn new(file: &'a File, path: &'a Path, pos: u64, offset: u64, limit: u64) -> Self {
        Frames {
            file,
            path,
            pos,
            offset,
            limit,
            buf: Vec::new(),
            buf_at: pos,
            block: READ_BLOCK_BYTES,
        }
    }

    /// Reads [`SMALL_READ_BLOCK_BYTES`] at a time instead, for a read of a few frames.
    pub(crate) fn small(mut self) -> Self {
        self.block = SMALL_READ_BLOCK_BYTES;
        self
    }

    /// Byte position of the next frame.
    pub(crate) fn pos(&self) -> u64 {
        self.pos
    }

    /// Offset of the next frame.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The next frame, whole (head and payload), or why there is none at [`Frames::pos`].
    ///
    /// # Errors
    ///
    /// [`SegError::Io`] when the file cannot be read.
    pub(crate) fn next_frame(&mut self) -> Result<Result<&[u8], Fault>, SegError> {
        if !self.fill(FRAME_HEAD_BYTES)? {
            return Ok(Err(if self.rest_is_zero()? {
                Fault::End
            } else {
                Fault::Truncated
            }));
        }
        let (len, crc) = frame_head(self.window(FRAME_HEAD_BYTES)).unwrap_or_default();
        if len == 0 {
            return Ok(Err(Fault::End));
        }
        if len > PAYLOAD_BYTES_MAX {
            return Ok(Err(Fault::Length(len)));
        }
        let whole = FRAME_HEAD_BYTES + u64::from(len);
        if !self.fill(whole)? {
            return Ok(Err(Fault::Truncated));
        }
        let offset = self.offset;
        let start = (self.pos - self.buf_at) as usize;
        let frame = &self.buf[start..start + whole as usize];
        if frame_crc(offset, &frame[FRAME_HEAD_BYTES as usize..]) != crc {
            return Ok(Err(Fault::Checksum));
        }
        self.pos += whole;
        self.offset += 1;
        Ok(Ok(frame))
    }

    /// Whether every byte from [`Frames::pos`] to the limit is zero.
    ///
    /// # Errors
    ///
    /// [`SegError::Io`] when the file cannot be read.
    pub(crate) fn rest_is_zero(&mut self) -> Result<bool, SegError> {
        let mut at = self.pos;
        let mut block = Vec::new();
        while at < self.limit {
            let n = (self.limit - at).min(READ_BLOCK_BYTES);
            block.resize(n as usize, 0);
            self.file
                .read_exact_at(&mut block, at)
                .map_err(io("reading", self.path))?;
            if block.iter().any(|b| *b != 0) {
                return Ok(false);
            }
            at += n;
        }
        Ok(true)
    }

    /// The `n` bytes from [`Frames::pos`], which [`Frames::fill`] made present.
    fn window(&self, n: u64) -> &[u8] {
        let start = (self.pos - self.buf_at) as usize;
        &self.buf[start..start + n as usize]
    }

    /// Makes the `n` bytes from [`Frames::pos`] present in the buffer; `false` when the limit
    /// comes first.
    fn fill(&mut self, n: u64) -> Result<bool, SegError> {
        if self.pos + n > self.limit {
            return Ok(false);
        }
        let buf_end = self.buf_at + self.buf.len() as u64;
        if self.pos >= self.buf_at && self.pos + n <= buf_end {
            return Ok(true);
        }
        let len = n.max(self.block).min(self.limit - self.pos);
        self.buf.resize(len as usize, 0);
        self.buf_at = self.pos;
        self.file
            .read_exact_at(&mut self.buf, self.pos)
            .map_err(io("reading", self.path))?;
        Ok(true)
    }
}
