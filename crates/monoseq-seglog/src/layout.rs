//! The bytes of a segment (described in the crate's doc): the header, a frame's head and its
//! CRC, the footer. Encoding and checking only, no I/O.

/// The header's magic.
pub(crate) const MAGIC: &[u8; 8] = b"MSQSEGMT";
/// The footer's trailing magic.
pub(crate) const FOOTER_MAGIC: &[u8; 8] = b"MSQSEGFT";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of a segment's header; the first frame starts there.
pub const HEADER_BYTES: u64 = 32;
/// Bytes before a frame's payload: its length and its CRC.
pub const FRAME_HEAD_BYTES: u64 = 8;
/// One index entry per this many frames: frame `n` of a segment (`n` from 0) is indexed when
/// `n` is a multiple of it.
pub const INDEX_EVERY: u64 = 64;
/// Largest payload of one frame. A longer length word is damage (or a torn tail).
pub const PAYLOAD_BYTES_MAX: u32 = 16 << 20;
/// Bytes of a footer besides its entries: the zero word, the entry count, the last offset,
/// the CRC, the footer's length and the magic.
pub(crate) const FOOTER_FIXED_BYTES: u64 = 4 + 4 + 8 + 4 + 4 + 8;
/// Bytes of one footer entry: an offset and its frame's byte position.
pub(crate) const FOOTER_ENTRY_BYTES: u64 = 16;
/// Bytes at the footer's end that locate it: its length and the magic.
pub(crate) const FOOTER_TAIL_BYTES: u64 = 4 + 8;

/// Appends little-endian integers and bytes to a buffer.
pub(crate) struct Put<'a>(pub(crate) &'a mut Vec<u8>);

impl Put<'_> {
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
}

/// Reads little-endian integers and bytes from a slice, front to back; `None` past its end.
pub(crate) struct Take<'a>(pub(crate) &'a [u8]);

impl<'a> Take<'a> {
    pub(crate) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        let b = self.bytes(size_of::<u32>())?;
        Some(u32::from_le_bytes(b.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        let b = self.bytes(size_of::<u64>())?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

/// A segment's header.
pub(crate) fn header(partition: u32, first: u64) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER_BYTES as usize);
    Put(&mut h)
        .bytes(MAGIC)
        .u32(FORMAT_VERSION)
        .u32(partition)
        .u64(first)
        .u32(0);
    let crc = crc32fast::hash(&h);
    Put(&mut h).u32(crc);
    debug_assert_eq!(h.len() as u64, HEADER_BYTES);
    h
}

/// What a header holds, or why it is not one.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum HeaderRead {
    /// A header of this format: its partition and first offset.
    Valid { partition: u32, first: u64 },
    /// The magic is there but the format is another.
    Version(u32),
    /// Not a header: short, zero, another file or damaged.
    Invalid,
}

pub(crate) fn read_header(h: &[u8]) -> HeaderRead {
    let mut t = Take(h);
    if t.bytes(MAGIC.len()) != Some(MAGIC.as_slice()) {
        return HeaderRead::Invalid;
    }
    match t.u32() {
        Some(FORMAT_VERSION) => {}
        Some(other) => return HeaderRead::Version(other),
        None => return HeaderRead::Invalid,
    }
    let (Some(partition), Some(first), Some(_reserved)) = (t.u32(), t.u64(), t.u32()) else {
        return HeaderRead::Invalid;
    };
    let crc_at = h.len() - t.0.len();
    match t.u32() {
        Some(crc) if crc == crc32fast::hash(&h[..crc_at]) => HeaderRead::Valid { partition, first },
        _ => HeaderRead::Invalid,
    }
}

/// The CRC-32 of the frame holding `offset` with `payload`: over the offset, the length word
/// and the payload, so a frame read at another offset's place fails it.
pub(crate) fn frame_crc(offset: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&offset.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends the frame of `offset` holding `payload` (at most [`PAYLOAD_BYTES_MAX`] bytes).
pub(crate) fn put_frame(out: &mut Vec<u8>, offset: u64, payload: &[u8]) {
    Put(out)
        .u32(payload.len() as u32)
        .u32(frame_crc(offset, payload))
        .bytes(payload);
}

/// A frame head's length and CRC.
pub(crate) fn frame_head(head: &[u8]) -> Option<(u32, u32)> {
    let mut t = Take(head);
    Some((t.u32()?, t.u32()?))
}

/// A sealed segment's index as its footer keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Footer {
    /// Byte position of every [`INDEX_EVERY`]th frame.
    pub(crate) index: Vec<u64>,
    /// The segment's last offset.
    pub(crate) last: u64,
}

/// The footer of a segment starting at `first`.
pub(crate) fn footer(first: u64, f: &Footer) -> Vec<u8> {
    let mut out = Vec::with_capacity(footer_bytes(f.index.len()) as usize);
    Put(&mut out).u32(0).u32(f.index.len() as u32);
    for (i, pos) in f.index.iter().enumerate() {
        Put(&mut out).u64(first + i as u64 * INDEX_EVERY).u64(*pos);
    }
    Put(&mut out).u64(f.last);
    let crc = crc32fast::hash(&out);
    let len = out.len() as u64 + FOOTER_TAIL_BYTES + size_of::<u32>() as u64;
    Put(&mut out).u32(crc).u32(len as u32).bytes(FOOTER_MAGIC);
    out
}

/// Bytes of a footer holding `entries` index entries.
pub(crate) fn footer_bytes(entries: usize) -> u64 {
    FOOTER_FIXED_BYTES + entries as u64 * FOOTER_ENTRY_BYTES
}

/// The footer's length from the footer's last [`FOOTER_TAIL_BYTES`], when they end with the
/// magic.
pub(crate) fn footer_len(tail: &[u8]) -> Option<u64> {
    let mut t = Take(tail);
    let len = t.u32()?;
    (t.bytes(FOOTER_MAGIC.len())? == FOOTER_MAGIC).then_some(u64::from(len))
}

/// The footer whose bytes before its last [`FOOTER_TAIL_BYTES`] are `f` (a segment starting at
/// `first` whose footer starts at byte `at`), when
/// its CRC and every entry check out: entry `i` names offset `first + i * INDEX_EVERY`, the
/// positions grow from [`HEADER_BYTES`] and stay below `at`, the last offset is covered.
pub(crate) fn read_footer(f: &[u8], first: u64, at: u64) -> Option<Footer> {
    let mut t = Take(f);
    let (zero, count) = (t.u32()?, t.u32()?);
    if zero != 0 || footer_bytes(count as usize) != f.len() as u64 + FOOTER_TAIL_BYTES {
        return None;
    }
    let mut index = Vec::with_capacity(count as usize);
    for i in 0..u64::from(count) {
        let (offset, pos) = (t.u64()?, t.u64()?);
        let floor = index
            .last()
            .map_or(HEADER_BYTES, |p| p + FRAME_HEAD_BYTES + 1);
        if offset != first + i * INDEX_EVERY || pos < floor || pos >= at {
            return None;
        }
        index.push(pos);
    }
    let last = t.u64()?;
    let crc_at = f.len() - t.0.len();
    let crc = t.u32()?;
    let whole = index.first() == Some(&HEADER_BYTES)
        && last >= first
        && (last - first) / INDEX_EVERY + 1 == u64::from(count);
    (whole && crc == crc32fast::hash(&f[..crc_at])).then_some(Footer { index, last })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_reads_back_and_any_flipped_byte_is_caught() {
        let h = header(7, 4096);
        assert_eq!(
            read_header(&h),
            HeaderRead::Valid {
                partition: 7,
                first: 4096
            }
        );
        for i in 0..h.len() {
            let mut bad = h.clone();
            bad[i] ^= 0x10;
            assert_ne!(read_header(&bad), read_header(&h), "byte {i}");
        }
        let mut newer = h.clone();
        newer[8] = 2;
        assert_eq!(read_header(&newer), HeaderRead::Version(2));
        assert_eq!(read_header(&h[..10]), HeaderRead::Invalid);
    }

    #[test]
    fn a_footer_reads_back_and_any_flipped_byte_is_caught() {
        let f = Footer {
            index: vec![HEADER_BYTES, 900, 1800],
            last: 100 + 2 * INDEX_EVERY + 5,
        };
        let bytes = footer(100, &f);
        assert_eq!(bytes.len() as u64, footer_bytes(3));
        let tail = &bytes[bytes.len() - FOOTER_TAIL_BYTES as usize..];
        assert_eq!(footer_len(tail), Some(bytes.len() as u64));
        let body = &bytes[..bytes.len() - FOOTER_TAIL_BYTES as usize];
        assert_eq!(read_footer(body, 100, 5000), Some(f.clone()));
        for i in 0..body.len() {
            let mut bad = body.to_vec();
            bad[i] ^= 0x01;
            assert_eq!(read_footer(&bad, 100, 5000), None, "byte {i}");
        }
        assert_eq!(read_footer(body, 101, 5000), None, "another first offset");
        assert_eq!(read_footer(body, 100, 1800), None, "an entry past the data");
    }
}
