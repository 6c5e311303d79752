//! `Page`: what a read returns, the frames of consecutive offsets as they are stored, one
//! contiguous byte range, and an iterator over their payloads.

use crate::layout::{FRAME_HEAD_BYTES, Take};

/// The frames of consecutive offsets from [`Page::first`], as stored: each is `len:u32 ‖
/// crc:u32 ‖ payload` (the crate's doc), checked when read. [`Page::frames`] is one contiguous
/// byte range a later step can send or copy whole; [`Page::payloads`] borrows each payload
/// from it without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    first: u64,
    count: usize,
    frames: Vec<u8>,
}

impl Page {
    pub(crate) fn new(first: u64) -> Page {
        Page {
            first,
            count: 0,
            frames: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, frame: &[u8]) {
        self.frames.extend_from_slice(frame);
        self.count += 1;
    }

    /// Whether another frame of `frame_bytes` stays within `max_events` and `max_bytes`; the
    /// first frame always does.
    pub(crate) fn takes(&self, frame_bytes: usize, max_events: usize, max_bytes: usize) -> bool {
        self.count == 0 || (self.count < max_events && self.frames.len() + frame_bytes <= max_bytes)
    }

    /// The offset of the first frame (the offset read from, when the page is empty).
    #[must_use]
    pub fn first(&self) -> u64 {
        self.first
    }

    /// One past the offset of the last frame: where the next page starts.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.first + self.count as u64
    }

    /// How many frames it holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether it holds no frame.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The frames, contiguous, as stored.
    #[must_use]
    pub fn frames(&self) -> &[u8] {
        &self.frames
    }

    /// The frames' bytes, owned.
    #[must_use]
    pub fn into_frames(self) -> Vec<u8> {
        self.frames
    }

    /// Each frame's payload in offset order, borrowed from [`Page::frames`].
    pub fn payloads(&self) -> impl Iterator<Item = &[u8]> {
        let mut rest = Take(&self.frames);
        std::iter::from_fn(move || {
            let len = rest.u32()?;
            rest.bytes(FRAME_HEAD_BYTES as usize - size_of::<u32>())?;
            rest.bytes(len as usize)
        })
    }
}
