//! The binary encoding of a PLog page (`Accept: application/vnd.monoseq.events`): the same
//! entries as [`crate::PlogPageBody`], each event carried as the bytes the server stores
//! (the event encoding of docs/format.md, with its own CRC-32), never decoded by the server.
//! A fixed header, then per entry its kind and offset; docs/format.md ("Binary PLog page")
//! gives every byte. [`EventsPageWriter`] writes one; [`EventsPage::decode`] reads and checks
//! one: its structure, each event's CRC, and that each event names the offset it is carried at.

use crate::GapBody;

/// The media type of the binary encoding of `GET /v1/partitions/{p}/events`.
pub const EVENTS_BINARY: &str = "application/vnd.monoseq.events";
/// The first four bytes of a binary page.
pub const EVENTS_MAGIC: [u8; 4] = *b"MSQE";
/// The version of the binary page this build writes and reads.
pub const EVENTS_VERSION: u8 = 1;
/// Bytes of the fixed header.
pub const EVENTS_HEADER_BYTES: usize = 40;
/// The kind byte of an event entry.
const KIND_EVENT: u8 = 1;
/// The kind byte of a gap entry.
const KIND_GAP: u8 = 2;
/// Bytes of an encoded event's own header: its version byte and CRC-32.
const EVENT_HEAD_BYTES: usize = 5;

/// Writes a binary page: the header, then each entry in offset order, then [`Self::finish`].
#[derive(Debug)]
pub struct EventsPageWriter {
    buf: Vec<u8>,
    count: u32,
}

impl EventsPageWriter {
    /// A page of `partition` read from `from`, whose end is `end`, with room for `capacity`
    /// bytes of entries.
    #[must_use]
    pub fn new(partition: u32, from: u64, end: u64, capacity: usize) -> EventsPageWriter {
        let mut buf = Vec::with_capacity(EVENTS_HEADER_BYTES + capacity);
        buf.extend_from_slice(&EVENTS_MAGIC);
        buf.extend_from_slice(&[EVENTS_VERSION, 0, 0, 0]);
        buf.extend_from_slice(&partition.to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes()); // count, set by `finish`
        buf.extend_from_slice(&from.to_le_bytes());
        buf.extend_from_slice(&0u64.to_le_bytes()); // next, set by `finish`
        buf.extend_from_slice(&end.to_le_bytes());
        EventsPageWriter { buf, count: 0 }
    }

    /// Appends the event stored at `offset`, as its stored bytes.
    ///
    /// # Errors
    ///
    /// [`EventsPageError::TooLong`] for more than `u32::MAX` bytes (no stored event is).
    pub fn event(&mut self, offset: u64, bytes: &[u8]) -> Result<(), EventsPageError> {
        let len = u32::try_from(bytes.len()).map_err(|_| EventsPageError::TooLong { offset })?;
        self.buf.push(KIND_EVENT);
        self.buf.extend_from_slice(&offset.to_le_bytes());
        self.buf.extend_from_slice(&len.to_le_bytes());
        self.buf.extend_from_slice(bytes);
        self.count += 1;
        Ok(())
    }

    /// Appends a retired range `from..=to` and why it was retired (`accepted_loss`,
    /// `restore`; at most 255 bytes, longer is cut).
    pub fn gap(&mut self, from: u64, to: u64, reason: &str) {
        let reason = &reason.as_bytes()[..reason.len().min(usize::from(u8::MAX))];
        self.buf.push(KIND_GAP);
        self.buf.extend_from_slice(&from.to_le_bytes());
        self.buf.extend_from_slice(&to.to_le_bytes());
        self.buf.push(reason.len() as u8);
        self.buf.extend_from_slice(reason);
        self.count += 1;
    }

    /// The page's bytes, `next` being the offset to ask for next.
    #[must_use]
    pub fn finish(mut self, next: u64) -> Vec<u8> {
        self.buf[12..16].copy_from_slice(&self.count.to_le_bytes());
        self.buf[24..32].copy_from_slice(&next.to_le_bytes());
        self.buf
    }
}

/// One entry of a decoded binary page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsEntry<'a> {
    /// The event at `offset`: its stored bytes (docs/format.md, "Event"), CRC checked.
    Event {
        /// Its PLog offset.
        offset: u64,
        /// Its encoded bytes, as stored.
        bytes: &'a [u8],
    },
    /// A retired range in its place.
    Gap(GapBody),
}

/// A decoded binary page: what [`crate::PlogPageBody`] says, events as stored bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventsPage<'a> {
    /// The partition read.
    pub partition: u32,
    /// The offset asked for.
    pub from: u64,
    /// The offset to ask for next: after the last entry, or the asked one.
    pub next: u64,
    /// The partition's end: the next offset to be written.
    pub end: u64,
    /// The entries, in offset order.
    pub entries: Vec<EventsEntry<'a>>,
}

/// Why a binary page does not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventsPageError {
    /// The body ends inside the header or an entry (a cut transfer).
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Its byte position in the body.
        at: usize,
    },
    /// Not a binary page of a version this build reads (a JSON body, another format).
    NotAPage {
        /// What the header holds instead.
        found: String,
    },
    /// An entry of an unknown kind.
    Kind {
        /// The kind byte.
        kind: u8,
        /// Its byte position in the body.
        at: usize,
    },
    /// An event's stored CRC-32 does not match its bytes: damaged on the way or in storage.
    Crc {
        /// The offset it was carried at.
        offset: u64,
    },
    /// An event's bytes name another offset than the one it is carried at, or none.
    Misplaced {
        /// The offset it was carried at.
        offset: u64,
        /// The offset its bytes name (`None`: they hold none).
        found: Option<u64>,
    },
    /// Entries out of order, or past `next` or the end.
    Order {
        /// The offending entry's first offset.
        offset: u64,
        /// The lowest offset it could have had.
        expected: u64,
    },
    /// A gap's reason is not UTF-8.
    Reason {
        /// The gap's first offset.
        offset: u64,
    },
    /// Bytes after the last entry the header counts.
    Trailing {
        /// How many.
        extra: usize,
    },
    /// An event too long to carry (more than `u32::MAX` bytes).
    TooLong {
        /// Its offset.
        offset: u64,
    },
}

impl std::fmt::Display for EventsPageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const RETRY: &str = "read the page again";
        match self {
            Self::Truncated { what, at } => write!(
                f,
                "the binary page ends inside {what} at byte {at}: it was cut on the way; {RETRY}"
            ),
            Self::NotAPage { found } => write!(
                f,
                "not a binary PLog page of version {EVENTS_VERSION} ({found}): the server may \
                 predate it; read the JSON page"
            ),
            Self::Kind { kind, at } => write!(f, "unknown entry kind {kind} at byte {at}"),
            Self::Crc { offset } => write!(
                f,
                "the event at offset {offset} fails its CRC-32: its bytes were damaged; {RETRY}, \
                 and run `monoseq verify` on the server if it persists"
            ),
            Self::Misplaced { offset, found } => match found {
                Some(found) => write!(
                    f,
                    "the event carried at offset {offset} names offset {found}"
                ),
                None => write!(f, "the event carried at offset {offset} names no offset"),
            },
            Self::Order { offset, expected } => write!(
                f,
                "an entry at offset {offset} where the page allows {expected} or later (and \
                 below its next offset and end)"
            ),
            Self::Reason { offset } => write!(
                f,
                "the gap from offset {offset} has a reason that is not UTF-8"
            ),
            Self::Trailing { extra } => write!(f, "{extra} bytes after the page's last entry"),
            Self::TooLong { offset } => write!(f, "the event at offset {offset} is over 4 GiB"),
        }
    }
}

impl std::error::Error for EventsPageError {}

/// A cursor over a body.
struct Reader<'a> {
    body: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], EventsPageError> {
        let got = self
            .at
            .checked_add(n)
            .and_then(|end| self.body.get(self.at..end))
            .ok_or(EventsPageError::Truncated { what, at: self.at })?;
        self.at += n;
        Ok(got)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, EventsPageError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, EventsPageError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, EventsPageError> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
}

impl<'a> EventsPage<'a> {
    /// Reads a binary page, checking its header, every entry's structure and order, each
    /// event's CRC-32 and the offset its bytes name.
    ///
    /// # Errors
    ///
    /// [`EventsPageError`] naming the first thing wrong.
    pub fn decode(body: &'a [u8]) -> Result<EventsPage<'a>, EventsPageError> {
        let mut r = Reader { body, at: 0 };
        let head = r.take(8, "the header")?;
        if head[..4] != EVENTS_MAGIC || head[4] != EVENTS_VERSION || head[5..8] != [0, 0, 0] {
            let shown = String::from_utf8_lossy(&body[..body.len().min(8)]).into_owned();
            return Err(EventsPageError::NotAPage {
                found: format!("it starts with {shown:?}"),
            });
        }
        let partition = r.u32("the header")?;
        let count = r.u32("the header")?;
        let (from, next, end) = (
            r.u64("the header")?,
            r.u64("the header")?,
            r.u64("the header")?,
        );
        let mut page = EventsPage {
            partition,
            from,
            next,
            end,
            entries: Vec::with_capacity((count as usize).min(body.len() / 14)),
        };
        let mut low = from;
        for _ in 0..count {
            let (entry, after) = entry(&mut r, low, next.min(end))?;
            page.entries.push(entry);
            low = after;
        }
        if low > next {
            return Err(EventsPageError::Order {
                offset: next,
                expected: low,
            });
        }
        match body.len() - r.at {
            0 => Ok(page),
            extra => Err(EventsPageError::Trailing { extra }),
        }
    }

    /// Each event's offset and stored bytes, in order (gaps left out).
    pub fn events(&self) -> impl Iterator<Item = (u64, &'a [u8])> + '_ {
        self.entries.iter().filter_map(|e| match e {
            EventsEntry::Event { offset, bytes } => Some((*offset, *bytes)),
            EventsEntry::Gap(_) => None,
        })
    }
}

/// Reads one entry at or after offset `low`, an event below `below`; answers it and the
/// offset after it.
fn entry<'a>(
    r: &mut Reader<'a>,
    low: u64,
    below: u64,
) -> Result<(EventsEntry<'a>, u64), EventsPageError> {
    let at = r.at;
    match r.u8("an entry")? {
        KIND_EVENT => {
            let offset = r.u64("an event's offset")?;
            if offset < low || offset >= below {
                return Err(EventsPageError::Order {
                    offset,
                    expected: low,
                });
            }
            let len = r.u32("an event's length")? as usize;
            let bytes = r.take(len, "an event's bytes")?;
            check_event(offset, bytes)?;
            Ok((EventsEntry::Event { offset, bytes }, offset + 1))
        }
        KIND_GAP => {
            let (from, to) = (r.u64("a gap")?, r.u64("a gap")?);
            if from < low || to < from {
                return Err(EventsPageError::Order {
                    offset: from,
                    expected: low,
                });
            }
            let len = r.u8("a gap's reason")? as usize;
            let reason = std::str::from_utf8(r.take(len, "a gap's reason")?)
                .map_err(|_| EventsPageError::Reason { offset: from })?;
            let gap = GapBody {
                from,
                to,
                reason: reason.to_owned(),
            };
            Ok((EventsEntry::Gap(gap), to.saturating_add(1)))
        }
        kind => Err(EventsPageError::Kind { kind, at }),
    }
}

/// Checks an encoded event carried at `offset`: its CRC-32 (little-endian, bytes 1 to 4, of
/// every byte after them) and its first body field, the PLog offset (a LEB128 varint).
fn check_event(offset: u64, bytes: &[u8]) -> Result<(), EventsPageError> {
    if bytes.len() < EVENT_HEAD_BYTES {
        return Err(EventsPageError::Misplaced {
            offset,
            found: None,
        });
    }
    let stored = u32::from_le_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]);
    if crc32fast::hash(&bytes[EVENT_HEAD_BYTES..]) != stored {
        return Err(EventsPageError::Crc { offset });
    }
    let found = varint(&bytes[EVENT_HEAD_BYTES..]);
    if found != Some(offset) {
        return Err(EventsPageError::Misplaced { offset, found });
    }
    Ok(())
}

/// The LEB128 varint `bytes` starts with (at most 10 bytes), if any.
fn varint(bytes: &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (i, &b) in bytes.iter().take(10).enumerate() {
        let part = u64::from(b & 0x7f);
        if i == 9 && b > 1 {
            return None;
        }
        value |= part << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event's bytes as the store encodes them, reduced to what the page checks.
    fn event(offset: u64) -> Vec<u8> {
        let mut body = Vec::new();
        let mut n = offset;
        while n >= 0x80 {
            body.push((n as u8) | 0x80);
            n >>= 7;
        }
        body.push(n as u8);
        body.extend_from_slice(b"rest of the event");
        let mut out = vec![1];
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    fn page() -> Vec<u8> {
        let mut w = EventsPageWriter::new(3, 4, 400, 0);
        w.event(4, &event(4)).unwrap();
        w.gap(5, 299, "restore");
        w.event(300, &event(300)).unwrap();
        w.finish(301)
    }

    #[test]
    fn a_page_reads_back_as_written() {
        let body = page();
        let p = EventsPage::decode(&body).unwrap();
        assert_eq!((p.partition, p.from, p.next, p.end), (3, 4, 301, 400));
        let events: Vec<_> = p.events().map(|(o, b)| (o, b.to_vec())).collect();
        assert_eq!(events, vec![(4, event(4)), (300, event(300))]);
        let gap = GapBody {
            from: 5,
            to: 299,
            reason: "restore".into(),
        };
        assert_eq!(p.entries[1], EventsEntry::Gap(gap));
        let empty = EventsPageWriter::new(0, 9, 9, 0).finish(9);
        assert_eq!(empty.len(), EVENTS_HEADER_BYTES);
        assert!(EventsPage::decode(&empty).unwrap().entries.is_empty());
    }

    #[test]
    fn cut_damaged_or_foreign_bodies_are_refused() {
        let body = page();
        for cut in 0..body.len() {
            let e = EventsPage::decode(&body[..cut]).unwrap_err();
            assert!(matches!(e, EventsPageError::Truncated { .. }), "{cut}: {e}");
        }
        let mut flipped = body.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        let e = EventsPage::decode(&flipped).unwrap_err();
        assert_eq!(e, EventsPageError::Crc { offset: 300 });
        assert!(e.to_string().contains("CRC-32"), "{e}");
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(
            EventsPage::decode(&longer).unwrap_err(),
            EventsPageError::Trailing { extra: 1 }
        );
        let json = br#"{"events":[],"next":1,"end":1}"#;
        assert!(matches!(
            EventsPage::decode(json),
            Err(EventsPageError::NotAPage { .. })
        ));
        // An event carried at another offset than the one its bytes name.
        let mut w = EventsPageWriter::new(3, 1, 400, 0);
        w.event(7, &event(8)).unwrap();
        let moved = w.finish(8);
        let e = EventsPage::decode(&moved).unwrap_err();
        assert_eq!(
            e,
            EventsPageError::Misplaced {
                offset: 7,
                found: Some(8)
            }
        );
    }
}
