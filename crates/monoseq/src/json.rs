//! JSON views of stored events and records for the HTTP API. Field values are stored as JSON
//! text; they are shown as JSON again (or as a string if they are not valid JSON).

use monoseq_store::{ArgObject, Event, Field, Record, RecordKind};
use serde_json::{Map, Value, json};

fn kind(k: RecordKind) -> &'static str {
    match k {
        RecordKind::CDoc => "CDoc",
        RecordKind::CRecord => "CRecord",
        RecordKind::WDoc => "WDoc",
        RecordKind::WRecord => "WRecord",
        RecordKind::ODoc => "ODoc",
        RecordKind::ORecord => "ORecord",
    }
}

fn fields(fields: &[Field]) -> Value {
    let map: Map<String, Value> = fields
        .iter()
        .map(|f| {
            let v = serde_json::from_slice(&f.value)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&f.value).into_owned()));
            (f.name.clone(), v)
        })
        .collect();
    Value::Object(map)
}

/// A record as JSON.
pub fn record(r: &Record) -> Value {
    json!({"id": r.id.0, "kind": kind(r.kind), "name": r.name, "fields": fields(&r.fields)})
}

fn arg(a: &ArgObject) -> Value {
    json!({
        "id": a.id.0, "kind": kind(a.kind), "name": a.name, "fields": fields(&a.fields),
        "children": a.children.iter().map(arg).collect::<Vec<_>>(),
    })
}

/// An event as JSON.
pub fn event(e: &Event) -> Value {
    json!({
        "plog_offset": e.plog_offset.0,
        "ws": e.ws.0,
        "ws_kind": e.ws_kind.0,
        "wlog_offset": e.wlog_offset.0,
        "registered_at_ms": e.registered_at_ms,
        "command": e.command,
        "argument": e.argument.as_ref().map(arg),
        "created": e.created.iter().map(record).collect::<Vec<_>>(),
        "updated": e.updated.iter().map(record).collect::<Vec<_>>(),
        "idempotency_key": e.idempotency.as_ref().map(|i| i.key.as_str()),
    })
}
