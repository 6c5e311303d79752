//! The versioned binary event encoding (layout in `docs/format.md`): encoding, full decoding,
//! the allocation-free scan that replay uses to read an event's sequence numbers, and the WLog
//! entry that names an event's place in the PLog.
//!
//! Decoding never trusts its input: every length is checked against the bytes left, nesting
//! is bounded by [`ARG_DEPTH_MAX`], and a CRC-32 over the body rejects damaged bytes, so
//! corrupted or truncated input gives a [`DecodeError`], never a panic.

use std::collections::{HashMap, HashSet};

use monoseq_core::{Number, PLogOffset, SeqValue, WsId, WsKind};

use crate::builtin::WLOG_OFFSET_SEQUENCE;
use crate::event::{
    ArgObject, Event, Field, Idempotency, Record, RecordId, RecordKind, WLogOffset,
};
use crate::keys::PartitionId;

/// The version byte of records and of events without an idempotency section.
pub const FORMAT_VERSION: u8 = 1;
/// The version byte of an event that carries an idempotency section (`docs/format.md`): the
/// body of version 1 followed by the key, the request fingerprint and the raw-to-real ID
/// pairs. Events without a key keep version 1, byte for byte.
pub const FORMAT_VERSION_KEYED: u8 = 2;
/// The version byte of a WLog entry that names its event's place in the PLog instead of holding
/// a copy of the event (`docs/format.md`, "WLog entry"). Entries written before it hold the
/// event itself (version 1 or 2), and both are read.
pub const FORMAT_VERSION_WLOG_REF: u8 = 3;
/// The version byte of a record value that names the event that created the record instead of
/// holding the record (`docs/format.md`, "Record reference"; key layout 4 only): the record as
/// that event created it, not updated since.
pub const FORMAT_VERSION_RECORD_REF: u8 = 4;
/// The version byte of a WLog reference without a checksum of its own (`docs/format.md`, "WLog
/// entry"; key layout 4 writes it): the fields of version [`FORMAT_VERSION_WLOG_REF`]. The
/// embedded engine checksums the blocks it stores, and a reader checks the event it names.
pub const FORMAT_VERSION_WLOG_REF_BARE: u8 = 5;
/// The version byte of a record reference without a checksum of its own (`docs/format.md`,
/// "Record reference"; key layout 4 writes it): the fields of version
/// [`FORMAT_VERSION_RECORD_REF`].
pub const FORMAT_VERSION_RECORD_REF_BARE: u8 = 6;
/// The version byte of a WLog chunk (`docs/format.md`, "Index chunks"; key layout 5): where
/// the events of a run of one workspace's WLog offsets are, one key for the run.
pub const FORMAT_VERSION_WLOG_CHUNK: u8 = 7;
/// The version byte of a records chunk (`docs/format.md`, "Index chunks"; key layout 5): which
/// events created a run of one workspace's records, one key for the run.
pub const FORMAT_VERSION_RECORD_CHUNK: u8 = 8;
/// Most nesting levels of an argument object (the root is level 1).
pub const ARG_DEPTH_MAX: usize = 16;
/// Largest encoded event, in bytes: the largest value the key-value contract stores.
pub const EVENT_BYTES_MAX: usize = monoseq_kv::limits::VALUE_BYTES_MAX;

/// Bytes before the body: the version byte and the CRC-32 of the body.
const HEADER_BYTES: usize = 5;

/// Why an event could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The argument object (or a child) has a kind other than ODoc/ORecord.
    #[error(
        "argument object {id} has kind {kind:?}; argument objects are ODocs with ORecord children"
    )]
    ArgumentKind {
        /// The object's ID.
        id: RecordId,
        /// Its kind.
        kind: RecordKind,
    },
    /// The argument object nests deeper than [`ARG_DEPTH_MAX`].
    #[error("argument object nests deeper than {ARG_DEPTH_MAX} levels; flatten it")]
    ArgumentTooDeep,
    /// The encoded event would exceed [`EVENT_BYTES_MAX`].
    #[error(
        "event encodes to {len} bytes, more than the {EVENT_BYTES_MAX} allowed; split the command"
    )]
    TooLarge {
        /// The encoded length.
        len: usize,
    },
}

/// Why bytes are not a valid event. Stored bytes that fail to decode are damaged: restore
/// them from a replica or backup; nothing in them can be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The version byte names a format this code does not read.
    #[error(
        "event format version {0} is not supported (this build reads versions {FORMAT_VERSION} and {FORMAT_VERSION_KEYED}, {FORMAT_VERSION_WLOG_REF} and {FORMAT_VERSION_WLOG_REF_BARE} in the WLog, {FORMAT_VERSION_RECORD_REF} and {FORMAT_VERSION_RECORD_REF_BARE} in the records); upgrade monoseq or check the bytes are an event"
    )]
    UnsupportedVersion(u8),
    /// The body's checksum does not match: the bytes were damaged.
    #[error(
        "event checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the stored event is damaged; restore it from a backup"
    )]
    Checksum {
        /// The checksum in the bytes.
        stored: u32,
        /// The checksum of the body as read.
        computed: u32,
    },
    /// The bytes end before the event does.
    #[error("event truncated while reading {what} at byte {at}: the stored event is incomplete")]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Byte position.
        at: usize,
    },
    /// A value is out of its range (an over-long varint, a workspace kind above 65535, a flag
    /// other than 0 or 1).
    #[error("event field {what} at byte {at} is out of range: the stored event is damaged")]
    OutOfRange {
        /// What was being read.
        what: &'static str,
        /// Byte position.
        at: usize,
    },
    /// A record kind byte is unknown, or not allowed where it stands.
    #[error("invalid record kind {code} at byte {at}: the stored event is damaged")]
    InvalidKind {
        /// The byte.
        code: u8,
        /// Byte position.
        at: usize,
    },
    /// A name is not UTF-8.
    #[error("{what} at byte {at} is not UTF-8: the stored event is damaged")]
    InvalidUtf8 {
        /// What was being read.
        what: &'static str,
        /// Byte position.
        at: usize,
    },
    /// The argument object nests deeper than [`ARG_DEPTH_MAX`].
    #[error("argument object at byte {at} nests deeper than {ARG_DEPTH_MAX} levels")]
    TooDeep {
        /// Byte position.
        at: usize,
    },
    /// Bytes remain after the event.
    #[error("{extra} unexpected bytes after the event: the stored event is damaged")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
}

/// The place of an event, as [`decode_numbers`] returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventHead {
    /// The event's PLog offset.
    pub plog_offset: PLogOffset,
    /// Its workspace.
    pub ws: WsId,
    /// The workspace's kind.
    pub ws_kind: WsKind,
    /// Its WLog offset.
    pub wlog_offset: WLogOffset,
}

/// What [`decode_event_if`] shows of an event before deciding to build it: its place and its
/// command name, borrowed from the encoded bytes (not checked to be UTF-8 yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventPeek<'a> {
    /// The event's place.
    pub head: EventHead,
    /// Its command name, as stored.
    pub command: &'a [u8],
}

// ---------------------------------------------------------------------------------------------
// Encoding

impl Event {
    /// Encodes the event, appending to `out`.
    ///
    /// # Errors
    ///
    /// [`EncodeError`] when the argument object has a non-operation kind or nests too deep, or
    /// the event is too large; `out` is then left as it was.
    ///
    /// # Example
    ///
    /// ```
    /// use monoseq_core::{PLogOffset, WsId, WsKind};
    /// use monoseq_store::{Event, WLogOffset};
    ///
    /// let event = Event {
    ///     plog_offset: PLogOffset(1),
    ///     ws: WsId(7),
    ///     ws_kind: WsKind(1),
    ///     wlog_offset: WLogOffset(1),
    ///     registered_at_ms: 0,
    ///     command: "app.Ping".into(),
    ///     argument: None,
    ///     created: vec![],
    ///     updated: vec![],
    ///     idempotency: None,
    /// };
    /// let mut bytes = Vec::new();
    /// event.encode_into(&mut bytes).unwrap();
    /// assert_eq!(Event::decode(&bytes).unwrap(), event);
    /// ```
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(), EncodeError> {
        let start = out.len();
        let r = self.encode_body(out, start);
        if r.is_err() {
            out.truncate(start);
        }
        r
    }

    /// Encodes the event into a new vector.
    ///
    /// # Errors
    ///
    /// As [`Event::encode_into`].
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut out = Vec::with_capacity(64);
        self.encode_into(&mut out)?;
        Ok(out)
    }

    /// The length [`Event::encode`] would give, without encoding: the same checks, from the
    /// same code (writing into a counter instead of a buffer).
    ///
    /// # Errors
    ///
    /// As [`Event::encode_into`].
    pub fn encoded_len(&self) -> Result<usize, EncodeError> {
        let mut len = Len(HEADER_BYTES);
        self.put_body(&mut len)?;
        if len.0 > EVENT_BYTES_MAX {
            return Err(EncodeError::TooLarge { len: len.0 });
        }
        Ok(len.0)
    }

    fn encode_body(&self, out: &mut Vec<u8>, start: usize) -> Result<(), EncodeError> {
        out.push(if self.idempotency.is_some() {
            FORMAT_VERSION_KEYED
        } else {
            FORMAT_VERSION
        });
        out.extend_from_slice(&[0; 4]);
        self.put_body(out)?;
        let len = out.len() - start;
        if len > EVENT_BYTES_MAX {
            return Err(EncodeError::TooLarge { len });
        }
        let crc = crc32fast::hash(&out[start + HEADER_BYTES..]);
        out[start + 1..start + HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
        Ok(())
    }

    /// Everything after the header (version and checksum).
    fn put_body(&self, out: &mut impl Sink) -> Result<(), EncodeError> {
        put_varint(out, self.plog_offset.0);
        put_varint(out, self.ws.0);
        put_varint(out, u64::from(self.ws_kind.0));
        put_varint(out, self.wlog_offset.0);
        put_varint(out, self.registered_at_ms);
        put_bytes(out, self.command.as_bytes());
        match &self.argument {
            None => out.byte(0),
            Some(arg) => {
                out.byte(1);
                put_arg(out, arg, 1)?;
            }
        }
        for list in [&self.created, &self.updated] {
            put_varint(out, list.len() as u64);
            for r in list {
                put_record(out, r);
            }
        }
        if let Some(k) = &self.idempotency {
            put_bytes(out, k.key.as_bytes());
            out.bytes(&k.fingerprint.to_le_bytes());
            put_varint(out, k.raw_ids.len() as u64);
            for &(raw, real) in &k.raw_ids {
                put_varint(out, raw);
                put_varint(out, real);
            }
        }
        Ok(())
    }
}

/// Where the encoder writes: a buffer, or a counter of the bytes it would hold.
trait Sink {
    fn byte(&mut self, b: u8);
    fn bytes(&mut self, b: &[u8]);
}

impl Sink for Vec<u8> {
    #[inline]
    fn byte(&mut self, b: u8) {
        self.push(b);
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Counts what an encoding would write.
struct Len(usize);

impl Sink for Len {
    #[inline]
    fn byte(&mut self, _: u8) {
        self.0 += 1;
    }

    #[inline]
    fn bytes(&mut self, b: &[u8]) {
        self.0 += b.len();
    }
}

fn put_varint(out: &mut impl Sink, mut v: u64) {
    while v >= 0x80 {
        out.byte((v as u8) | 0x80);
        v >>= 7;
    }
    out.byte(v as u8);
}

fn put_bytes(out: &mut impl Sink, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.bytes(b);
}

fn put_fields(out: &mut impl Sink, fields: &[Field]) {
    put_varint(out, fields.len() as u64);
    for f in fields {
        put_bytes(out, f.name.as_bytes());
        put_bytes(out, &f.value);
    }
}

fn put_record(out: &mut impl Sink, r: &Record) {
    out.byte(r.kind.code());
    put_varint(out, r.id.0);
    put_bytes(out, r.name.as_bytes());
    put_fields(out, &r.fields);
}

fn put_arg(out: &mut impl Sink, a: &ArgObject, depth: usize) -> Result<(), EncodeError> {
    if depth > ARG_DEPTH_MAX {
        return Err(EncodeError::ArgumentTooDeep);
    }
    if !a.kind.is_operation() {
        return Err(EncodeError::ArgumentKind {
            id: a.id,
            kind: a.kind,
        });
    }
    out.byte(a.kind.code());
    put_varint(out, a.id.0);
    put_bytes(out, a.name.as_bytes());
    put_fields(out, &a.fields);
    put_varint(out, a.children.len() as u64);
    for c in &a.children {
        put_arg(out, c, depth + 1)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Decoding

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    version: u8,
}

impl<'a> Reader<'a> {
    /// Checks version (an event's) and checksum and positions the reader at the body.
    fn open(buf: &'a [u8]) -> Result<Reader<'a>, DecodeError> {
        Reader::open_versions(buf, &[FORMAT_VERSION, FORMAT_VERSION_KEYED])
    }

    /// Checks that the version is one of `versions`, checks the checksum and positions the
    /// reader at the body.
    fn open_versions(buf: &'a [u8], versions: &[u8]) -> Result<Reader<'a>, DecodeError> {
        let Some(&version) = buf.first() else {
            return Err(DecodeError::Truncated {
                what: "version",
                at: 0,
            });
        };
        if !versions.contains(&version) {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let Some(crc_bytes) = buf.get(1..HEADER_BYTES) else {
            return Err(DecodeError::Truncated {
                what: "checksum",
                at: 1,
            });
        };
        let mut crc = [0u8; 4];
        crc.copy_from_slice(crc_bytes);
        let stored = u32::from_le_bytes(crc);
        let computed = crc32fast::hash(&buf[HEADER_BYTES..]);
        if stored != computed {
            return Err(DecodeError::Checksum { stored, computed });
        }
        Ok(Reader {
            buf,
            pos: HEADER_BYTES,
            version,
        })
    }

    /// Opens a reference of version `checked` (checksum checked, as [`Reader::open_versions`])
    /// or `bare` (no checksum of its own: its reader checks the event it names), positioned at
    /// its fields.
    fn open_reference(buf: &'a [u8], checked: u8, bare: u8) -> Result<Reader<'a>, DecodeError> {
        if buf.first() != Some(&bare) {
            return Reader::open_versions(buf, &[checked]);
        }
        Ok(Reader {
            buf,
            pos: 1,
            version: bare,
        })
    }

    #[inline]
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(DecodeError::Truncated { what, at: self.pos }),
        }
    }

    #[inline]
    fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(DecodeError::Truncated { what, at });
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(DecodeError::OutOfRange { what, at });
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
            shift += 7;
        }
    }

    /// Opens a value of version `version` that has no checksum of its own, positioned after
    /// the version byte.
    fn open_bare(buf: &'a [u8], version: u8) -> Result<Reader<'a>, DecodeError> {
        match buf.first() {
            Some(&v) if v == version => Ok(Reader {
                buf,
                pos: 1,
                version,
            }),
            Some(&v) => Err(DecodeError::UnsupportedVersion(v)),
            None => Err(DecodeError::Truncated {
                what: "version",
                at: 0,
            }),
        }
    }

    /// A count of items of at least `least` bytes each: at least 1, and no more than the
    /// bytes left could hold (so a damaged count allocates nothing).
    fn items(&mut self, what: &'static str, least: usize) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = self.varint(what)?;
        let left = (self.buf.len() - self.pos) / least;
        match usize::try_from(n) {
            Ok(n) if n >= 1 && n <= left => Ok(n),
            _ => Err(DecodeError::OutOfRange { what, at }),
        }
    }

    /// A number stored as its difference from `before`, which it must exceed.
    fn ascending(&mut self, before: u64, what: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        let step = self.varint(what)?;
        before
            .checked_add(step)
            .filter(|_| step > 0)
            .ok_or(DecodeError::OutOfRange { what, at })
    }

    /// A varint that must fit a `u32`.
    fn varint_u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let at = self.pos;
        u32::try_from(self.varint(what)?).map_err(|_| DecodeError::OutOfRange { what, at })
    }

    /// A little-endian `u32` of four bytes.
    fn u32_le(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        let at = self.pos;
        let word = self.buf.get(at..at + 4).and_then(|b| b.try_into().ok());
        let word = word.map(u32::from_le_bytes);
        let word = word.ok_or(DecodeError::Truncated { what, at })?;
        self.pos += 4;
        Ok(word)
    }

    /// A count of items that each take at least one byte: bounded by the bytes left, so a
    /// damaged count can neither over-allocate nor loop long.
    #[inline]
    fn count(&mut self, what: &'static str) -> Result<usize, DecodeError> {
        let at = self.pos;
        let n = self.varint(what)?;
        let left = self.buf.len() - self.pos;
        if n > left as u64 {
            return Err(DecodeError::Truncated { what, at });
        }
        Ok(n as usize)
    }

    #[inline]
    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let at = self.pos;
        let len = self.count(what)?;
        let end = self.pos + len;
        let Some(b) = self.buf.get(self.pos..end) else {
            return Err(DecodeError::Truncated { what, at });
        };
        self.pos = end;
        Ok(b)
    }

    #[inline]
    fn str(&mut self, what: &'static str) -> Result<&'a str, DecodeError> {
        let at = self.pos;
        let b = self.bytes(what)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8 { what, at })
    }

    #[inline]
    fn kind(
        &mut self,
        what: &'static str,
        operation_only: bool,
    ) -> Result<RecordKind, DecodeError> {
        let at = self.pos;
        let code = self.u8(what)?;
        match RecordKind::from_code(code) {
            Some(k) if !operation_only || k.is_operation() => Ok(k),
            _ => Err(DecodeError::InvalidKind { code, at }),
        }
    }

    fn head(&mut self) -> Result<(EventHead, u64), DecodeError> {
        let plog_offset = PLogOffset(self.varint("PLog offset")?);
        let ws = WsId(self.varint("workspace")?);
        let at = self.pos;
        let kind = self.varint("workspace kind")?;
        let ws_kind = u16::try_from(kind).map_err(|_| DecodeError::OutOfRange {
            what: "workspace kind",
            at,
        })?;
        let wlog_offset = WLogOffset(self.varint("WLog offset")?);
        let registered_at_ms = self.varint("registration time")?;
        Ok((
            EventHead {
                plog_offset,
                ws,
                ws_kind: WsKind(ws_kind),
                wlog_offset,
            },
            registered_at_ms,
        ))
    }

    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        let at = self.pos;
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(DecodeError::OutOfRange { what, at }),
        }
    }

    fn fields(&mut self) -> Result<Vec<Field>, DecodeError> {
        let n = self.count("field count")?;
        let mut fields = Vec::with_capacity(n);
        for _ in 0..n {
            let name = self.str("field name")?.to_owned();
            let value = self.bytes("field value")?.to_vec();
            fields.push(Field { name, value });
        }
        Ok(fields)
    }

    /// Skips fields without checking that names are UTF-8 (see [`decode_numbers`]).
    fn skip_fields(&mut self) -> Result<(), DecodeError> {
        let n = self.count("field count")?;
        for _ in 0..n {
            self.bytes("field name")?;
            self.bytes("field value")?;
        }
        Ok(())
    }

    fn record(&mut self) -> Result<Record, DecodeError> {
        let kind = self.kind("record kind", false)?;
        let id = RecordId(self.varint("record ID")?);
        let name = self.str("record name")?.to_owned();
        let fields = self.fields()?;
        Ok(Record {
            id,
            kind,
            name,
            fields,
        })
    }

    fn arg(&mut self, depth: usize) -> Result<ArgObject, DecodeError> {
        if depth > ARG_DEPTH_MAX {
            return Err(DecodeError::TooDeep { at: self.pos });
        }
        let kind = self.kind("argument kind", true)?;
        let id = RecordId(self.varint("argument ID")?);
        let name = self.str("argument name")?.to_owned();
        let fields = self.fields()?;
        let n = self.count("argument children")?;
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            children.push(self.arg(depth + 1)?);
        }
        Ok(ArgObject {
            id,
            kind,
            name,
            fields,
            children,
        })
    }

    fn scan_arg(
        &mut self,
        depth: usize,
        ws: WsId,
        out: &mut impl Numbers,
    ) -> Result<(), DecodeError> {
        if depth > ARG_DEPTH_MAX {
            return Err(DecodeError::TooDeep { at: self.pos });
        }
        let kind = self.kind("argument kind", true)?;
        let id = self.varint("argument ID")?;
        out.number(SeqValue::new(ws, kind.id_sequence(), Number(id)));
        self.bytes("argument name")?;
        self.skip_fields()?;
        let n = self.count("argument children")?;
        for _ in 0..n {
            self.scan_arg(depth + 1, ws, out)?;
        }
        Ok(())
    }

    /// The rest of an event after its command name, read as [`decode_numbers`] reads it: the
    /// structure checked to its end, the sequence numbers used given to `out`.
    fn numbers_after_command(
        &mut self,
        ws: WsId,
        out: &mut impl Numbers,
    ) -> Result<(), DecodeError> {
        self.records_after_command(ws, out)?;
        self.skip_idempotency()?;
        self.end()
    }

    /// The argument object and the created and updated records after an event's command
    /// name, their structure checked and their sequence numbers given to `out`.
    fn records_after_command(
        &mut self,
        ws: WsId,
        out: &mut impl Numbers,
    ) -> Result<(), DecodeError> {
        if self.flag("argument flag")? {
            self.scan_arg(1, ws, out)?;
        }
        let n = self.count("created count")?;
        for _ in 0..n {
            let kind = self.kind("record kind", false)?;
            let id = self.varint("record ID")?;
            out.number(SeqValue::new(ws, kind.id_sequence(), Number(id)));
            self.bytes("record name")?;
            self.skip_fields()?;
        }
        let n = self.count("updated count")?;
        for _ in 0..n {
            self.kind("record kind", false)?;
            self.varint("record ID")?;
            self.bytes("record name")?;
            self.skip_fields()?;
        }
        Ok(())
    }

    /// Reads past the idempotency section of a keyed event (version 2), checking it as
    /// [`Reader::idempotency`] does, without building it.
    fn skip_idempotency(&mut self) -> Result<(), DecodeError> {
        if self.version != FORMAT_VERSION_KEYED {
            return Ok(());
        }
        self.str("idempotency key")?;
        self.fingerprint()?;
        let n = self.count("raw ID count")?;
        for _ in 0..n {
            self.varint("raw ID")?;
            self.varint("real ID")?;
        }
        Ok(())
    }

    /// The request fingerprint of a keyed event.
    fn fingerprint(&mut self) -> Result<u64, DecodeError> {
        let Some(bytes) = self.buf.get(self.pos..self.pos + 8) else {
            return Err(DecodeError::Truncated {
                what: "request fingerprint",
                at: self.pos,
            });
        };
        let mut f = [0u8; 8];
        f.copy_from_slice(bytes);
        self.pos += 8;
        Ok(u64::from_le_bytes(f))
    }

    /// The idempotency section of a keyed event (version 2), if the event has one.
    fn idempotency(&mut self) -> Result<Option<Idempotency>, DecodeError> {
        if self.version != FORMAT_VERSION_KEYED {
            return Ok(None);
        }
        let key = self.str("idempotency key")?.to_owned();
        let fingerprint = self.fingerprint()?;
        let n = self.count("raw ID count")?;
        let mut raw_ids = Vec::with_capacity(n);
        for _ in 0..n {
            let raw = self.varint("raw ID")?;
            raw_ids.push((raw, self.varint("real ID")?));
        }
        Ok(Some(Idempotency {
            key,
            fingerprint,
            raw_ids,
        }))
    }

    fn end(&self) -> Result<(), DecodeError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes { extra }),
        }
    }
}

impl Event {
    /// Decodes an event.
    ///
    /// # Errors
    ///
    /// [`DecodeError`] when the bytes are not a whole, undamaged event of a supported version.
    pub fn decode(bytes: &[u8]) -> Result<Event, DecodeError> {
        let mut r = Reader::open(bytes)?;
        let (head, registered_at_ms) = r.head()?;
        let command = r.str("command")?;
        Event::decode_after_command(&mut r, head, registered_at_ms, command)
    }

    /// The rest of [`Event::decode`], once the reader is past the command name.
    fn decode_after_command(
        r: &mut Reader<'_>,
        head: EventHead,
        registered_at_ms: u64,
        command: &str,
    ) -> Result<Event, DecodeError> {
        let command = command.to_owned();
        let argument = if r.flag("argument flag")? {
            Some(r.arg(1)?)
        } else {
            None
        };
        let n = r.count("created count")?;
        let mut created = Vec::with_capacity(n);
        for _ in 0..n {
            created.push(r.record()?);
        }
        let n = r.count("updated count")?;
        let mut updated = Vec::with_capacity(n);
        for _ in 0..n {
            updated.push(r.record()?);
        }
        let idempotency = r.idempotency()?;
        r.end()?;
        Ok(Event {
            plog_offset: head.plog_offset,
            ws: head.ws,
            ws_kind: head.ws_kind,
            wlog_offset: head.wlog_offset,
            registered_at_ms,
            command,
            argument,
            created,
            updated,
            idempotency,
        })
    }
}

/// Reads an event's place and appends the sequence numbers it used to `out`, without building
/// the event: the WLog offset, then the argument object's IDs, then the created records' IDs
/// (the same numbers as [`Event::for_each_number`]). It checks version, checksum, structure,
/// kinds and nesting as [`Event::decode`] does, but not that names are UTF-8 (names are not
/// read here, and that check was a quarter of the time): whatever `decode` accepts it accepts,
/// and it also accepts bytes with a valid checksum whose names are not UTF-8, which the
/// encoder never writes. Numbers are not filtered here.
///
/// # Errors
///
/// [`DecodeError`] as [`Event::decode`]; `out` may then hold some of the event's numbers.
pub fn decode_numbers(bytes: &[u8], out: &mut Vec<SeqValue>) -> Result<EventHead, DecodeError> {
    let mut r = Reader::open(bytes)?;
    let (head, _) = r.head()?;
    out.push(SeqValue::new(
        head.ws,
        WLOG_OFFSET_SEQUENCE.id,
        Number(head.wlog_offset.0),
    ));
    r.bytes("command")?;
    r.numbers_after_command(head.ws, out)?;
    Ok(head)
}

/// Reads an event's place and command name, and builds the event only when `keep` keeps it:
/// the place, and the event when kept. The checksum is checked before `keep` is asked, so a
/// damaged event is an error whatever `keep` would say; a kept event is checked and built as
/// [`Event::decode`] does, one not kept is checked as [`decode_numbers`] checks an event (all
/// but its names being UTF-8, which a valid checksum vouches for) without allocating.
///
/// # Errors
///
/// [`DecodeError`] as [`Event::decode`].
///
/// # Example
///
/// ```
/// use monoseq_core::{PLogOffset, WsId, WsKind};
/// use monoseq_store::{Event, WLogOffset, decode_event_if};
///
/// let event = Event {
///     plog_offset: PLogOffset(1),
///     ws: WsId(7),
///     ws_kind: WsKind(1),
///     wlog_offset: WLogOffset(1),
///     registered_at_ms: 0,
///     command: "app.Ping".into(),
///     argument: None,
///     created: vec![],
///     updated: vec![],
///     idempotency: None,
/// };
/// let bytes = event.encode().unwrap();
/// let (head, kept) = decode_event_if(&bytes, |e| e.command == b"app.Pong").unwrap();
/// assert_eq!((head.plog_offset, kept), (PLogOffset(1), None));
/// let (_, kept) = decode_event_if(&bytes, |e| e.command == b"app.Ping").unwrap();
/// assert_eq!(kept, Some(event));
/// ```
pub fn decode_event_if(
    bytes: &[u8],
    keep: impl FnOnce(&EventPeek<'_>) -> bool,
) -> Result<(EventHead, Option<Event>), DecodeError> {
    let mut r = Reader::open(bytes)?;
    let (head, registered_at_ms) = r.head()?;
    let at = r.pos;
    let command = r.bytes("command")?;
    if !keep(&EventPeek { head, command }) {
        r.numbers_after_command(head.ws, &mut NoNumbers)?;
        return Ok((head, None));
    }
    let command = std::str::from_utf8(command).map_err(|_| DecodeError::InvalidUtf8 {
        what: "command",
        at,
    })?;
    let event = Event::decode_after_command(&mut r, head, registered_at_ms, command)?;
    Ok((head, Some(event)))
}

/// Reads an event's place and its idempotency section (`None` for an event sent without a
/// key) without building the event: what a partition's idempotency window needs of each event
/// it reads back at start. Checks version, checksum and structure as [`decode_numbers`] does.
///
/// # Errors
///
/// [`DecodeError`] as [`Event::decode`].
///
/// # Example
///
/// ```
/// use monoseq_core::{PLogOffset, WsId, WsKind};
/// use monoseq_store::{Event, Idempotency, WLogOffset, decode_idempotency};
///
/// let mut event = Event {
///     plog_offset: PLogOffset(1),
///     ws: WsId(7),
///     ws_kind: WsKind(1),
///     wlog_offset: WLogOffset(1),
///     registered_at_ms: 0,
///     command: "app.Ping".into(),
///     argument: None,
///     created: vec![],
///     updated: vec![],
///     idempotency: None,
/// };
/// let (head, key) = decode_idempotency(&event.encode().unwrap()).unwrap();
/// assert_eq!((head.ws, key), (WsId(7), None));
/// let sent = Idempotency { key: "k-1".into(), fingerprint: 9, raw_ids: vec![(1, 2)] };
/// event.idempotency = Some(sent.clone());
/// let (_, key) = decode_idempotency(&event.encode().unwrap()).unwrap();
/// assert_eq!(key, Some(sent));
/// ```
pub fn decode_idempotency(bytes: &[u8]) -> Result<(EventHead, Option<Idempotency>), DecodeError> {
    let mut r = Reader::open(bytes)?;
    let (head, _) = r.head()?;
    r.bytes("command")?;
    r.records_after_command(head.ws, &mut NoNumbers)?;
    let key = r.idempotency()?;
    r.end()?;
    Ok((head, key))
}

/// Where [`Reader::numbers_after_command`] puts the sequence numbers it reads.
trait Numbers {
    fn number(&mut self, v: SeqValue);
}

impl Numbers for Vec<SeqValue> {
    #[inline]
    fn number(&mut self, v: SeqValue) {
        self.push(v);
    }
}

/// Reads past the numbers.
struct NoNumbers;

impl Numbers for NoNumbers {
    #[inline]
    fn number(&mut self, _: SeqValue) {}
}

// ---------------------------------------------------------------------------------------------
// WLog entries

/// Where a WLog entry's event is: what a WLog entry of version [`FORMAT_VERSION_WLOG_REF`]
/// holds instead of a copy of the event (`docs/format.md`, "WLog entry").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WLogRef {
    /// The partition whose PLog holds the event.
    pub partition: PartitionId,
    /// The event's PLog offset.
    pub plog_offset: PLogOffset,
    /// The checksum stored in the event's header: names the event's exact bytes.
    pub event_crc: u32,
}

/// What a WLog entry says about its event: where it is, and its checksum. An entry written
/// before WLog references holds the event itself ([`WLogTarget::partition`] is `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WLogTarget {
    /// The partition whose PLog holds the event; `None` for an entry holding a copy.
    pub partition: Option<PartitionId>,
    /// The event's PLog offset.
    pub plog_offset: PLogOffset,
    /// The checksum in the event's header.
    pub event_crc: u32,
}

/// The checksum stored in an encoded event's header, if the bytes are long enough to hold one
/// (it is not checked here).
#[must_use]
pub fn event_crc(event: &[u8]) -> Option<u32> {
    let bytes: [u8; 4] = event.get(1..HEADER_BYTES)?.try_into().ok()?;
    Some(u32::from_le_bytes(bytes))
}

impl WLogRef {
    /// Encodes the reference with a checksum of its own (version [`FORMAT_VERSION_WLOG_REF`],
    /// which key layout 3, a database's among them, writes), appending to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        put_checksummed(out, FORMAT_VERSION_WLOG_REF, |out| self.encode_fields(out));
    }

    /// Encodes the reference without a checksum of its own (version
    /// [`FORMAT_VERSION_WLOG_REF_BARE`], which key layout 4 writes), appending to `out`.
    pub fn encode_bare_into(&self, out: &mut Vec<u8>) {
        out.push(FORMAT_VERSION_WLOG_REF_BARE);
        self.encode_fields(out);
    }

    fn encode_fields(&self, out: &mut Vec<u8>) {
        put_varint(out, u64::from(self.partition.0));
        put_varint(out, self.plog_offset.0);
        out.extend_from_slice(&self.event_crc.to_le_bytes());
    }

    /// Whether a stored WLog entry is a reference (of either version) rather than a copy of
    /// the event, by its version byte.
    #[must_use]
    pub fn is_ref(bytes: &[u8]) -> bool {
        matches!(
            bytes.first(),
            Some(&(FORMAT_VERSION_WLOG_REF | FORMAT_VERSION_WLOG_REF_BARE))
        )
    }

    /// Decodes a WLog entry of version [`FORMAT_VERSION_WLOG_REF`] or
    /// [`FORMAT_VERSION_WLOG_REF_BARE`].
    ///
    /// # Errors
    ///
    /// [`DecodeError`] when the bytes are not a whole reference (of version 3: an undamaged
    /// one).
    pub fn decode(bytes: &[u8]) -> Result<WLogRef, DecodeError> {
        let mut r =
            Reader::open_reference(bytes, FORMAT_VERSION_WLOG_REF, FORMAT_VERSION_WLOG_REF_BARE)?;
        let partition = r.varint_u32("partition")?;
        let plog_offset = PLogOffset(r.varint("PLog offset")?);
        let crc = r.u32_le("event checksum")?;
        r.end()?;
        Ok(WLogRef {
            partition: PartitionId(partition),
            plog_offset,
            event_crc: crc,
        })
    }
}

/// A stored WLog entry: where its event is in the PLog, or (written before WLog references, so
/// the rare case, boxed) a copy of the event.
#[derive(Clone, Debug, PartialEq)]
pub enum WLogEntry {
    /// Where the event is.
    Ref(WLogRef),
    /// The event itself.
    Copy(Box<Event>),
}

impl WLogEntry {
    /// Decodes a stored WLog entry of either form, told apart by its version byte.
    ///
    /// # Errors
    ///
    /// [`DecodeError`] when the bytes are neither an undamaged reference nor an undamaged event.
    pub fn decode(bytes: &[u8]) -> Result<WLogEntry, DecodeError> {
        if WLogRef::is_ref(bytes) {
            WLogRef::decode(bytes).map(WLogEntry::Ref)
        } else {
            Event::decode(bytes).map(|e| WLogEntry::Copy(Box::new(e)))
        }
    }
}

impl WLogTarget {
    /// Reads what a stored WLog entry (a reference or a copy of the event) says about its
    /// event; a copy is checked as [`decode_numbers`] checks an event.
    ///
    /// # Errors
    ///
    /// [`DecodeError`] when the bytes are neither an undamaged reference nor an undamaged event.
    pub fn decode(bytes: &[u8]) -> Result<WLogTarget, DecodeError> {
        if WLogRef::is_ref(bytes) {
            let r = WLogRef::decode(bytes)?;
            return Ok(WLogTarget {
                partition: Some(r.partition),
                plog_offset: r.plog_offset,
                event_crc: r.event_crc,
            });
        }
        let head = decode_numbers(bytes, &mut Vec::new())?;
        Ok(WLogTarget {
            partition: None,
            plog_offset: head.plog_offset,
            event_crc: event_crc(bytes).unwrap_or_default(),
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Record values

/// The length [`encode_record_value`] would give, without encoding.
pub(crate) fn record_value_len(r: &Record) -> usize {
    let mut len = Len(HEADER_BYTES);
    put_record(&mut len, r);
    len.0
}

/// The length [`encode_record_value`] would give for `stored` with `changes` merged into its
/// fields as the store merges an update (the first field of a changed name takes the value of
/// the name's last change; a new name is appended once, with its last value), without
/// building the merged record.
pub(crate) fn merged_record_value_len(stored: &Record, changes: &[Field]) -> usize {
    let last: HashMap<&str, &[u8]> = changes
        .iter()
        .map(|c| (c.name.as_str(), c.value.as_slice()))
        .collect();
    let mut len = Len(HEADER_BYTES);
    len.byte(stored.kind.code());
    put_varint(&mut len, stored.id.0);
    put_bytes(&mut len, stored.name.as_bytes());
    let (mut fields, mut count) = (Len(0), 0u64);
    let mut named: HashSet<&str> = HashSet::with_capacity(stored.fields.len() + changes.len());
    for f in &stored.fields {
        let first = named.insert(f.name.as_str());
        let value = match last.get(f.name.as_str()) {
            Some(v) if first => v,
            _ => f.value.as_slice(),
        };
        put_bytes(&mut fields, f.name.as_bytes());
        put_bytes(&mut fields, value);
        count += 1;
    }
    for c in changes {
        if named.insert(c.name.as_str()) {
            put_bytes(&mut fields, c.name.as_bytes());
            put_bytes(
                &mut fields,
                last.get(c.name.as_str()).copied().unwrap_or_default(),
            );
            count += 1;
        }
    }
    put_varint(&mut len, count);
    len.0 + fields.0
}

/// Encodes the stored value of a record (layout in `docs/format.md`, "Record value"), appending
/// to `out`.
pub(crate) fn encode_record_value(out: &mut Vec<u8>, r: &Record) {
    put_checksummed(out, FORMAT_VERSION, |out| put_record(out, r));
}

/// Appends `version`, the CRC-32 of what `body` appends, and that body: the header of every
/// value that carries its own checksum.
fn put_checksummed(out: &mut Vec<u8>, version: u8, body: impl FnOnce(&mut Vec<u8>)) {
    let start = out.len();
    out.push(version);
    out.extend_from_slice(&[0; 4]);
    body(out);
    let crc = crc32fast::hash(&out[start + HEADER_BYTES..]);
    out[start + 1..start + HEADER_BYTES].copy_from_slice(&crc.to_le_bytes());
}

/// A stored record value: the record, or where the event that created it is.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum RecordValue {
    /// The record as last written.
    Full(Record),
    /// The record as the event it names created it.
    Ref(RecordRef),
}

/// Decodes the stored value of a record, of either form (told apart by the version byte).
pub(crate) fn decode_record_value(bytes: &[u8]) -> Result<RecordValue, DecodeError> {
    if RecordRef::is_ref(bytes) {
        return RecordRef::decode(bytes).map(RecordValue::Ref);
    }
    let mut r = Reader::open(bytes)?;
    if r.version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(r.version));
    }
    let record = r.record()?;
    r.end()?;
    Ok(RecordValue::Full(record))
}

/// Where a record created by an event, and not updated since, is: the value of version
/// [`FORMAT_VERSION_RECORD_REF`] a records-table entry holds instead of the record, in key
/// layout 4 (`docs/format.md`, "Record reference"). The record is the event's created record
/// at `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordRef {
    /// The partition whose PLog holds the event.
    pub partition: PartitionId,
    /// The event's PLog offset.
    pub plog_offset: PLogOffset,
    /// The record's position among the event's created records (from 0).
    pub index: u32,
    /// The checksum stored in the event's header: names the event's exact bytes.
    pub event_crc: u32,
}

impl RecordRef {
    /// Encodes the reference with a checksum of its own (version
    /// [`FORMAT_VERSION_RECORD_REF`], as builds before [`FORMAT_VERSION_RECORD_REF_BARE`]
    /// wrote it), appending to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        put_checksummed(out, FORMAT_VERSION_RECORD_REF, |out| {
            self.encode_fields(out)
        });
    }

    /// Encodes the reference without a checksum of its own (version
    /// [`FORMAT_VERSION_RECORD_REF_BARE`], which key layout 4 writes), appending to `out`.
    pub fn encode_bare_into(&self, out: &mut Vec<u8>) {
        out.push(FORMAT_VERSION_RECORD_REF_BARE);
        self.encode_fields(out);
    }

    fn encode_fields(&self, out: &mut Vec<u8>) {
        put_varint(out, u64::from(self.partition.0));
        put_varint(out, self.plog_offset.0);
        put_varint(out, u64::from(self.index));
        out.extend_from_slice(&self.event_crc.to_le_bytes());
    }

    /// Whether a stored record value is a reference (of either version) rather than the
    /// record, by its version byte.
    #[must_use]
    pub fn is_ref(bytes: &[u8]) -> bool {
        matches!(
            bytes.first(),
            Some(&(FORMAT_VERSION_RECORD_REF | FORMAT_VERSION_RECORD_REF_BARE))
        )
    }

    /// Decodes a record value of version [`FORMAT_VERSION_RECORD_REF`] or
    /// [`FORMAT_VERSION_RECORD_REF_BARE`].
    ///
    /// # Errors
    ///
    /// [`DecodeError`] when the bytes are not a whole reference (of version 4: an undamaged
    /// one).
    pub fn decode(bytes: &[u8]) -> Result<RecordRef, DecodeError> {
        let mut r = Reader::open_reference(
            bytes,
            FORMAT_VERSION_RECORD_REF,
            FORMAT_VERSION_RECORD_REF_BARE,
        )?;
        let partition = r.varint_u32("partition")?;
        let plog_offset = PLogOffset(r.varint("PLog offset")?);
        let index = r.varint_u32("created record index")?;
        let crc = r.u32_le("event checksum")?;
        r.end()?;
        Ok(RecordRef {
            partition: PartitionId(partition),
            plog_offset,
            index,
            event_crc: crc,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Index chunks (key layout 5)

/// Where the event at one WLog offset is, as a WLog chunk holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedWLog {
    /// The WLog offset.
    pub offset: u64,
    /// The event's PLog offset, in the chunk's partition.
    pub plog: u64,
    /// The checksum in the event's header.
    pub crc: u32,
}

/// Which event created one record, as a records chunk holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedRecord {
    /// The record's ID.
    pub id: u64,
    /// The creating event's PLog offset, in the chunk's partition.
    pub plog: u64,
    /// The record's position among the event's created records.
    pub index: u32,
    /// The checksum in the event's header.
    pub crc: u32,
}

/// Encodes a WLog chunk of `partition` (`entries` in ascending WLog and PLog offsets, at least
/// one), appending to `out`: the version, the partition, the count, then each entry's WLog
/// and PLog offsets (the first whole, the others as the difference from the one before) and
/// its event's checksum.
pub fn encode_wlog_chunk(out: &mut Vec<u8>, partition: PartitionId, entries: &[ChunkedWLog]) {
    out.push(FORMAT_VERSION_WLOG_CHUNK);
    put_varint(out, u64::from(partition.0));
    put_varint(out, entries.len() as u64);
    let (mut offset, mut plog) = (0, 0);
    for e in entries {
        debug_assert!(e.offset > offset && e.plog > plog);
        put_varint(out, e.offset - offset);
        put_varint(out, e.plog - plog);
        out.extend_from_slice(&e.crc.to_le_bytes());
        (offset, plog) = (e.offset, e.plog);
    }
}

/// Decodes a WLog chunk: its partition and entries.
///
/// # Errors
///
/// [`DecodeError`] when the bytes are not a whole chunk, or its offsets do not ascend.
pub fn decode_wlog_chunk(bytes: &[u8]) -> Result<(PartitionId, Vec<ChunkedWLog>), DecodeError> {
    let mut r = Reader::open_bare(bytes, FORMAT_VERSION_WLOG_CHUNK)?;
    let partition = PartitionId(r.varint_u32("partition")?);
    let count = r.items("WLog chunk entries", 1 + 1 + 4)?;
    let mut entries = Vec::with_capacity(count);
    let (mut offset, mut plog) = (0u64, 0u64);
    for _ in 0..count {
        offset = r.ascending(offset, "WLog offset")?;
        plog = r.ascending(plog, "PLog offset")?;
        let crc = r.u32_le("event checksum")?;
        entries.push(ChunkedWLog { offset, plog, crc });
    }
    r.end()?;
    Ok((partition, entries))
}

/// Encodes a records chunk of `partition` (`entries` in ascending IDs and not descending PLog
/// offsets, at least one), appending to `out`: the version, the partition, the count, then each
/// record's ID and its event's PLog offset (the first whole, the others as the difference from
/// the one before), its index among the event's created records, and its event's checksum
/// unless it is the event of the record before.
pub fn encode_record_chunk(out: &mut Vec<u8>, partition: PartitionId, entries: &[ChunkedRecord]) {
    out.push(FORMAT_VERSION_RECORD_CHUNK);
    put_varint(out, u64::from(partition.0));
    put_varint(out, entries.len() as u64);
    let (mut id, mut plog) = (0, 0);
    for e in entries {
        debug_assert!(e.id > id && e.plog >= plog && e.plog > 0);
        put_varint(out, e.id - id);
        put_varint(out, e.plog - plog);
        put_varint(out, u64::from(e.index));
        if e.plog != plog {
            out.extend_from_slice(&e.crc.to_le_bytes());
        }
        (id, plog) = (e.id, e.plog);
    }
}

/// Decodes a records chunk: its partition and entries.
///
/// # Errors
///
/// [`DecodeError`] when the bytes are not a whole chunk, or its IDs do not ascend.
pub fn decode_record_chunk(bytes: &[u8]) -> Result<(PartitionId, Vec<ChunkedRecord>), DecodeError> {
    let mut r = Reader::open_bare(bytes, FORMAT_VERSION_RECORD_CHUNK)?;
    let partition = PartitionId(r.varint_u32("partition")?);
    let count = r.items("records chunk entries", 1 + 1 + 1)?;
    let mut entries = Vec::with_capacity(count);
    let (mut id, mut plog, mut crc) = (0u64, 0u64, 0u32);
    for _ in 0..count {
        id = r.ascending(id, "record ID")?;
        let at = r.pos;
        let step = r.varint("PLog offset")?;
        let next = plog
            .checked_add(step)
            .filter(|&p| p > 0)
            .ok_or(DecodeError::OutOfRange {
                what: "PLog offset",
                at,
            })?;
        let index = r.varint_u32("created record index")?;
        if next != plog {
            crc = r.u32_le("event checksum")?;
        }
        plog = next;
        entries.push(ChunkedRecord {
            id,
            plog,
            index,
            crc,
        });
    }
    r.end()?;
    Ok((partition, entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reference_decodes_as_encoded_and_a_damaged_one_does_not() {
        let r = RecordRef {
            partition: PartitionId(3),
            plog_offset: PLogOffset(1 << 40),
            index: 300,
            event_crc: 0xdead_beef,
        };
        let mut bytes = Vec::new();
        r.encode_into(&mut bytes);
        assert_eq!(decode_record_value(&bytes), Ok(RecordValue::Ref(r)));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x21;
            assert!(decode_record_value(&bad).is_err(), "byte {i} flipped");
        }
        assert!(decode_record_value(&bytes[..bytes.len() - 1]).is_err());

        // The bare version holds the same fields in four bytes less; its damage is found where
        // the event it names is checked (`segments.rs`), but a cut one does not decode.
        let mut bare = Vec::new();
        r.encode_bare_into(&mut bare);
        assert_eq!(bare.len() + 4, bytes.len());
        assert_eq!(bare[0], FORMAT_VERSION_RECORD_REF_BARE);
        assert_eq!(decode_record_value(&bare), Ok(RecordValue::Ref(r)));
        for cut in 0..bare.len() {
            assert!(decode_record_value(&bare[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = bare.clone();
        longer.push(0);
        assert!(decode_record_value(&longer).is_err());
    }

    #[test]
    fn a_wlog_reference_decodes_as_encoded_in_either_version() {
        let r = WLogRef {
            partition: PartitionId(7),
            plog_offset: PLogOffset(1 << 33),
            event_crc: 0x0bad_cafe,
        };
        let (mut checked, mut bare) = (Vec::new(), Vec::new());
        r.encode_into(&mut checked);
        r.encode_bare_into(&mut bare);
        assert_eq!(bare.len() + 4, checked.len());
        for bytes in [&checked, &bare] {
            assert!(WLogRef::is_ref(bytes));
            assert_eq!(WLogEntry::decode(bytes), Ok(WLogEntry::Ref(r)));
            let target = WLogTarget::decode(bytes).expect("a reference");
            assert_eq!(target.partition, Some(r.partition));
            assert_eq!(
                (target.plog_offset, target.event_crc),
                (r.plog_offset, r.event_crc)
            );
            for cut in 0..bytes.len() {
                assert!(WLogRef::decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        for i in 0..checked.len() {
            let mut bad = checked.clone();
            bad[i] ^= 0x21;
            assert_ne!(WLogRef::decode(&bad), Ok(r), "byte {i} flipped");
        }
    }

    #[test]
    fn a_record_values_length_is_the_length_of_its_encoding() {
        for (id, fields) in [(1, 0), (300, 1), (u64::MAX, 5)] {
            let r = Record {
                id: RecordId(id),
                kind: RecordKind::CDoc,
                name: "app.Order".repeat(fields + 1),
                fields: (0..fields)
                    .map(|i| Field {
                        name: format!("f{i}"),
                        value: vec![7; 200 * i],
                    })
                    .collect(),
            };
            let mut out = Vec::new();
            encode_record_value(&mut out, &r);
            assert_eq!(record_value_len(&r), out.len(), "{r:?}");
        }
    }
}
