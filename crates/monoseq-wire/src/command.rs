//! `POST /v1/commands`: the command a client sends and the answer it gets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /v1/commands`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// The workspace the command runs in; its partition is `ws mod partitions`.
    pub ws: u64,
    /// The workspace's kind.
    pub ws_kind: u16,
    /// The command's name.
    pub command: String,
    /// Records to create, each with a raw ID.
    #[serde(default)]
    pub create: Vec<NewRecordBody>,
    /// Existing records to update, by real ID.
    #[serde(default)]
    pub update: Vec<RecordUpdateBody>,
    /// The argument object, with raw IDs.
    #[serde(default)]
    pub argument: Option<NewArgBody>,
}

impl CommandBody {
    /// A command that creates, updates and carries nothing yet.
    #[must_use]
    pub fn new(ws: u64, ws_kind: u16, command: impl Into<String>) -> CommandBody {
        CommandBody {
            ws,
            ws_kind,
            command: command.into(),
            create: Vec::new(),
            update: Vec::new(),
            argument: None,
        }
    }
}

/// A record to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRecordBody {
    /// The client's placeholder ID.
    pub raw_id: u64,
    /// `CDoc`, `CRecord`, `WDoc` or `WRecord`.
    pub kind: KindBody,
    /// The record's type name.
    pub name: String,
    /// Field values; `{"$raw": n}` refers to another record of the command.
    #[serde(default)]
    pub fields: Map<String, Value>,
}

impl NewRecordBody {
    /// A record without fields.
    #[must_use]
    pub fn new(raw_id: u64, kind: KindBody, name: impl Into<String>) -> NewRecordBody {
        NewRecordBody {
            raw_id,
            kind,
            name: name.into(),
            fields: Map::new(),
        }
    }
}

/// An update of an existing record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordUpdateBody {
    /// The record's real ID.
    pub id: u64,
    /// The fields to change.
    pub fields: Map<String, Value>,
}

/// The argument object or one of its children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewArgBody {
    /// The client's placeholder ID.
    pub raw_id: u64,
    /// The type name.
    pub name: String,
    /// Field values.
    #[serde(default)]
    pub fields: Map<String, Value>,
    /// Nested objects.
    #[serde(default)]
    pub children: Vec<NewArgBody>,
}

/// A record kind a command may create, as clients spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KindBody {
    /// Configuration document.
    CDoc,
    /// Configuration record.
    CRecord,
    /// Workflow document.
    WDoc,
    /// Workflow record.
    WRecord,
}

/// The answer to a command (also to its retries with the same `Idempotency-Key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeBody {
    /// The partition that ran it.
    pub partition: u32,
    /// The event's PLog offset.
    pub plog_offset: u64,
    /// The event's WLog offset.
    pub wlog_offset: u64,
    /// Real IDs by raw ID.
    pub ids: BTreeMap<u64, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_of_a_command_are_refused() {
        let e = serde_json::from_value::<CommandBody>(json!({
            "ws": 7, "ws_kind": 1, "command": "c", "extra": 1
        }))
        .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn an_outcome_round_trips_with_its_ids_keyed_by_raw_id() {
        let text = r#"{"partition":7,"plog_offset":1,"wlog_offset":1,"ids":{"1":322685000131072}}"#;
        let outcome: OutcomeBody = serde_json::from_str(text).unwrap();
        assert_eq!(outcome.ids[&1], 322_685_000_131_072);
        assert_eq!(serde_json::to_string(&outcome).unwrap(), text);
    }
}
