//! The answer bodies of stored events and records (`monoseq-wire`'s `EventBody`,
//! `RecordBody`) built from the event store's types. Field values are stored as JSON text;
//! they are shown as JSON again (or as a string if they are not valid JSON).

use monoseq_store::{ArgObject, Event, Field, Record, RecordKind};
use monoseq_wire::{ArgBody, EventBody, RecordBody, StoredKindBody};
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
