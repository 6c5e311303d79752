//! The answer bodies of stored events and records (`monoseq-wire`'s `EventBody`,
//! `RecordBody`) built from the event store's types. Field values are stored as JSON text;
//! they are shown as JSON again (or as a string if they are not valid JSON).
//!
//! [`StoredEvent`] writes an event straight from the store's type, without building the body,
//! through the one encoding of an event (`monoseq_wire::EventJson`, which `EventBody` is
//! written by too): the page reads and live tails, which answer thousands of events per
//! request, use it (each stored field value is checked and copied as it is, not parsed into a
//! tree and printed again).

use monoseq_store::{ArgObject, Event, Field, Record, RecordKind};
use monoseq_wire::{
    ArgBody, ArgJson, EventBody, EventJson, RecordBody, RecordJson, StoredKindBody,
};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

fn kind(k: RecordKind) -> StoredKindBody {
    match k {
        RecordKind::CDoc => StoredKindBody::CDoc,
        RecordKind::CRecord => StoredKindBody::CRecord,
        RecordKind::WDoc => StoredKindBody::WDoc,
        RecordKind::WRecord => StoredKindBody::WRecord,
        RecordKind::ODoc => StoredKindBody::ODoc,
        RecordKind::ORecord => StoredKindBody::ORecord,
    }
}

fn fields(fields: &[Field]) -> Map<String, Value> {
    fields
        .iter()
        .map(|f| {
            let v = serde_json::from_slice(&f.value)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&f.value).into_owned()));
            (f.name.clone(), v)
        })
        .collect()
}

/// A record's answer body.
pub fn record(r: &Record) -> RecordBody {
    RecordBody {
        id: r.id.0,
        kind: kind(r.kind),
        name: r.name.clone(),
        fields: fields(&r.fields),
    }
}

fn arg(a: &ArgObject) -> ArgBody {
    ArgBody {
        id: a.id.0,
        kind: kind(a.kind),
        name: a.name.clone(),
        fields: fields(&a.fields),
        children: a.children.iter().map(arg).collect(),
    }
}

/// An event's answer body.
pub fn event(e: &Event) -> EventBody {
    EventBody {
        plog_offset: e.plog_offset.0,
        ws: e.ws.0,
        ws_kind: e.ws_kind.0,
        wlog_offset: e.wlog_offset.0,
        registered_at_ms: e.registered_at_ms,
        command: e.command.clone(),
        argument: e.argument.as_ref().map(arg),
        created: e.created.iter().map(record).collect(),
        updated: e.updated.iter().map(record).collect(),
        idempotency_key: e.idempotency.as_ref().map(|i| i.key.as_str().to_owned()),
    }
}

/// A stored event, written as JSON that decodes to its [`EventBody`] (see the module's
/// documentation).
#[derive(Debug, Clone)]
pub struct StoredEvent(pub Event);

impl Serialize for StoredEvent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        StoredEventRef(&self.0).serialize(s)
    }
}

/// [`StoredEvent`] for a borrowed event.
#[derive(Debug, Clone, Copy)]
pub struct StoredEventRef<'a>(pub &'a Event);

impl Serialize for StoredEventRef<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        EventJson {
            plog_offset: e.plog_offset.0,
            ws: e.ws.0,
            ws_kind: e.ws_kind.0,
            wlog_offset: e.wlog_offset.0,
            registered_at_ms: e.registered_at_ms,
            command: &e.command,
            argument: e.argument.as_ref().map(StoredArg),
            created: StoredRecords(&e.created),
            updated: StoredRecords(&e.updated),
            idempotency_key: e.idempotency.as_ref().map(|i| i.key.as_str()),
        }
        .serialize(s)
    }
}

struct StoredArg<'a>(&'a ArgObject);

impl Serialize for StoredArg<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let a = self.0;
        ArgJson {
            id: a.id.0,
            kind: kind(a.kind),
            name: &a.name,
            fields: StoredFields(&a.fields),
            children: StoredArgs(&a.children),
        }
        .serialize(s)
    }
}

struct StoredArgs<'a>(&'a [ArgObject]);

impl Serialize for StoredArgs<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for a in self.0 {
            seq.serialize_element(&StoredArg(a))?;
        }
        seq.end()
    }
}

struct StoredRecords<'a>(&'a [Record]);

impl Serialize for StoredRecords<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for r in self.0 {
            seq.serialize_element(&StoredRecord(r))?;
        }
        seq.end()
    }
}

struct StoredRecord<'a>(&'a Record);

impl Serialize for StoredRecord<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let r = self.0;
        RecordJson {
            id: r.id.0,
            kind: kind(r.kind),
            name: &r.name,
            fields: StoredFields(&r.fields),
        }
        .serialize(s)
    }
}

/// Field values as a JSON object in name order (as a `Map` holds them), the last of a
/// repeated name winning (as a `Map` keeps it).
struct StoredFields<'a>(&'a [Field]);

impl Serialize for StoredFields<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fields = self.0;
        let sorted = fields.windows(2).all(|w| w[0].name < w[1].name);
        let mut m = s.serialize_map(Some(fields.len()))?;
        if sorted {
            for f in fields {
                m.serialize_entry(&f.name, &StoredValue(&f.value))?;
            }
        } else {
            // Written by a processor that did not sort them: ordered here, as rarely as that.
            let mut ordered: std::collections::BTreeMap<&str, &[u8]> = Default::default();
            for f in fields {
                ordered.insert(&f.name, &f.value);
            }
            for (name, value) in ordered {
                m.serialize_entry(name, &StoredValue(value))?;
            }
        }
        m.end()
    }
}

/// A stored field value: its JSON text as it is (checked, not parsed into a tree), or a
/// string when it is not JSON.
struct StoredValue<'a>(&'a [u8]);

impl Serialize for StoredValue<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match serde_json::from_slice::<&RawValue>(self.0) {
            Ok(raw) => raw.serialize(s),
            Err(_) => String::from_utf8_lossy(self.0).serialize(s),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use monoseq_core::{PLogOffset, WsId, WsKind};
    use monoseq_store::{Idempotency, RecordId, WLogOffset};

    use super::*;

    fn field(name: &str, value: &[u8]) -> Field {
        Field::new(name, value.to_vec())
    }

    pub(crate) fn stored_event(fields: Vec<Field>) -> Event {
        Event {
            plog_offset: PLogOffset(41),
            ws: WsId(7),
            ws_kind: WsKind(2),
            wlog_offset: WLogOffset(3),
            registered_at_ms: 1_700_000_000_123,
            command: "app.Order.create".into(),
            argument: Some(ArgObject {
                id: RecordId(5),
                kind: RecordKind::ODoc,
                name: "app.OrderArg".into(),
                fields: fields.clone(),
                children: vec![ArgObject {
                    id: RecordId(6),
                    kind: RecordKind::ORecord,
                    name: "app.Line".into(),
                    fields: vec![field("qty", b"2")],
                    children: Vec::new(),
                }],
            }),
            created: vec![Record {
                id: RecordId(9),
                kind: RecordKind::WDoc,
                name: "app.Order".into(),
                fields,
            }],
            updated: vec![Record {
                id: RecordId(8),
                kind: RecordKind::CDoc,
                name: "app.Customer".into(),
                fields: vec![field("orders", b"12")],
            }],
            idempotency: Some(Idempotency {
                key: "k-1".into(),
                fingerprint: 77,
                raw_ids: vec![(1, 9)],
            }),
        }
    }

    /// Values as this server stores them: the JSON text of each value, fields by name.
    pub(crate) fn stored_fields() -> Vec<Field> {
        vec![
            field("amount", b"12.5"),
            field("big", b"18446744073709551615"),
            field("lines", br#"[{"a":1},{"b":[true,null]}]"#),
            field("name", "\"Ann \\\"Ex\\\" Ämple\\n\"".as_bytes()),
            field("neg", b"-3"),
            field("nested", br#"{"x":{"y":"z"}}"#),
        ]
    }

    #[test]
    fn a_stored_event_is_written_byte_for_byte_as_its_event_body() {
        let e = stored_event(stored_fields());
        let fast = serde_json::to_string(&StoredEvent(e.clone())).unwrap();
        let body = serde_json::to_string(&event(&e)).unwrap();
        assert_eq!(fast, body);
        let none = Event {
            argument: None,
            idempotency: None,
            ..e
        };
        let fast = serde_json::to_string(&StoredEventRef(&none)).unwrap();
        assert_eq!(fast, serde_json::to_string(&event(&none)).unwrap());
    }

    #[test]
    fn a_stored_event_decodes_to_its_event_body_whatever_its_stored_text() {
        // Not in name order, a repeated name, text that is not JSON, non-canonical JSON.
        let e = stored_event(vec![
            field("zeta", b"1e2"),
            field("alpha", b"not json"),
            field("mid", b"{ \"b\": 1, \"a\": 2 }"),
            field("alpha", b"\"second\""),
            field("bytes", &[0xff, 0xfe]),
        ]);
        let fast = serde_json::to_vec(&StoredEvent(e.clone())).unwrap();
        let decoded: EventBody = serde_json::from_slice(&fast).unwrap();
        assert_eq!(decoded, event(&e));
    }
}
