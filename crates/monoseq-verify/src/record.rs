//! Decoding a records-table value ("Record value, format version 1" in `docs/format.md`):
//! version, CRC-32 of the rest, then kind, ID, name and fields, ending exactly at the end; or
//! (key layout 4) a record reference, "format version 4" or 6, which the store's decoder reads.
//! `monoseq-store` keeps its decoder private and its public reader looks one key up at a time,
//! so the records pass, which scans whole blocks, decodes here. A unit test checks it against
//! values the event store writes.

use monoseq_store::{DecodeError, FORMAT_VERSION, RecordKind, RecordRef};

use crate::state::{RecordState, State};

/// What the checks need of a stored record: its kind and ID, or where the event that created
/// it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredRecord {
    /// A record stored whole.
    Whole { kind: RecordKind, id: u64 },
    /// A reference to the event that created it.
    Ref(RecordRef),
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.pos)
            .ok_or(DecodeError::Truncated { what, at: self.pos })?;
        self.pos += 1;
        Ok(b)
    }

    fn varint(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        let at = self.pos;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self
                .u8(what)
                .map_err(|_| DecodeError::Truncated { what, at })?;
            if shift == 63 && b > 1 {
                return Err(DecodeError::OutOfRange { what, at });
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(DecodeError::OutOfRange { what, at })
    }

    fn bytes(&mut self, what: &'static str) -> Result<&[u8], DecodeError> {
        let at = self.pos;
        let len = self.varint(what)?;
        let left = (self.buf.len() - self.pos) as u64;
        if len > left {
            return Err(DecodeError::Truncated { what, at });
        }
        let end = self.pos + len as usize;
        let b = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::Truncated { what, at })?;
        self.pos = end;
        Ok(b)
    }

    fn str(&mut self, what: &'static str) -> Result<(), DecodeError> {
        let at = self.pos;
        let b = self.bytes(what)?;
        std::str::from_utf8(b).map_err(|_| DecodeError::InvalidUtf8 { what, at })?;
        Ok(())
    }
}

/// Decodes and fully checks a stored record value.
pub(crate) fn decode_record(buf: &[u8]) -> Result<StoredRecord, DecodeError> {
    if RecordRef::is_ref(buf) {
        return RecordRef::decode(buf).map(StoredRecord::Ref);
    }
    let version = *buf.first().ok_or(DecodeError::Truncated {
        what: "version",
        at: 0,
    })?;
    if version != FORMAT_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let crc: [u8; 4] =
        buf.get(1..5)
            .and_then(|b| b.try_into().ok())
            .ok_or(DecodeError::Truncated {
                what: "checksum",
                at: 1,
            })?;
    let stored = u32::from_le_bytes(crc);
    let computed = crc32fast::hash(buf.get(5..).unwrap_or_default());
    if stored != computed {
        return Err(DecodeError::Checksum { stored, computed });
    }
    let mut r = Reader { buf, pos: 5 };
    let at = r.pos;
    let code = r.u8("record kind")?;
    let kind = RecordKind::from_code(code).ok_or(DecodeError::InvalidKind { code, at })?;
    let id = r.varint("record ID")?;
    r.str("record name")?;
    let count = r.varint("field count")?;
    if count > (buf.len() - r.pos) as u64 {
        return Err(DecodeError::Truncated {
            what: "field count",
            at: r.pos,
        });
    }
    for _ in 0..count {
        r.str("field name")?;
        r.bytes("field value")?;
    }
    match buf.len() - r.pos {
        0 => Ok(StoredRecord::Whole { kind, id }),
        extra => Err(DecodeError::TrailingBytes { extra }),
    }
}

/// A record some event created or updated: its workspace and ID, and what the PLog pass found.
pub(crate) type ExpectedRecord = ((u64, u64), RecordState);

/// The workspace whose records are checked, its partition and the last offset of its PLog,
/// and whether the store may hold record references (key layouts 4 and 5).
pub(crate) struct Place {
    pub(crate) ws: u64,
    pub(crate) partition: u32,
    pub(crate) plog_last: u64,
    pub(crate) refs_allowed: bool,
}

impl Place {
    /// The place of workspace `ws`'s records (partition 0 for a workspace no event names).
    pub(crate) fn of(state: &State, ws: u64, refs_allowed: bool) -> Place {
        let partition = state.workspaces.get(&ws).map_or(0, |w| w.partition);
        let part = state.partitions.get(partition as usize);
        Place {
            ws,
            partition,
            plog_last: part.map_or(0, |p| p.plog_last),
            refs_allowed,
        }
    }
}

/// What the place reference `r` names holds instead of the event that created the record of
/// workspace `at.ws` (`expected`, as the PLog pass found it; `None`: no event did); `None`
/// when it is that event (its partition, PLog offset and checksum) and the record sits where
/// the reference says among its created records. Used for the references stored under a
/// record's own key (key layouts 4 and 5) and those in records chunks (key layout 5).
pub(crate) fn reference_found(
    at: &Place,
    r: &RecordRef,
    expected: Option<RecordState>,
) -> Option<String> {
    let partition = at.partition;
    let index = u16::try_from(r.index).unwrap_or(u16::MAX);
    let created = expected.filter(|e| e.kind != 0);
    Some(match created {
        _ if r.partition.0 != partition => {
            format!("no event of the workspace (its events are in partition {partition})")
        }
        _ if r.plog_offset.0 == 0 || r.plog_offset.0 > at.plog_last => "no event".to_owned(),
        Some(e) if e.offset != r.plog_offset.0 => {
            format!(
                "another event (the record's was at PLog offset {})",
                e.offset
            )
        }
        Some(e) if e.crc != r.event_crc => "another event (its checksum differs)".to_owned(),
        Some(e) if e.index != index => {
            format!(
                "an event whose created record {} is another record",
                r.index
            )
        }
        Some(_) => return None,
        None => "no event that creates the record".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use monoseq_core::{PLogOffset, WsId, WsKind};
    use monoseq_kv::{KvStore, MemoryStore};
    use monoseq_store::{
        AppId, Event, EventStore, Field, PartitionId, Record, RecordId, TrustLevel, WLogOffset,
    };

    use super::*;

    #[test]
    fn record_values_the_event_store_writes_decode_and_damaged_ones_do_not() {
        let kv = Arc::new(MemoryStore::new());
        let store = EventStore::new(Arc::clone(&kv), AppId(1), TrustLevel::Level0);
        let id = RecordId(322_685_000_131_072 + 300);
        let event = Event {
            plog_offset: PLogOffset(1),
            ws: WsId(5),
            ws_kind: WsKind(1),
            wlog_offset: WLogOffset(1),
            registered_at_ms: 0,
            command: "app.New".into(),
            argument: None,
            created: vec![Record {
                id,
                kind: RecordKind::CRecord,
                name: "app.Line".into(),
                fields: vec![
                    Field::new("qty", b"3".to_vec()),
                    Field::new("é", vec![0xff]),
                ],
            }],
            updated: vec![],
            idempotency: None,
        };
        store.append(PartitionId(0), &[event]).expect("append");
        let key = store.record_key(WsId(5), id);
        let value = kv.get(key.as_key()).expect("get").expect("present");
        assert_eq!(
            decode_record(&value),
            Ok(StoredRecord::Whole {
                kind: RecordKind::CRecord,
                id: id.0
            })
        );
        for i in 0..value.len() {
            let mut bad = value.clone();
            bad[i] ^= 0x5a;
            assert!(decode_record(&bad).is_err(), "byte {i} flipped");
        }
        assert!(decode_record(&value[..value.len() - 1]).is_err());
        assert!(decode_record(&[]).is_err());
    }
}
