//! The HTTP API's JSON bodies: the edge's serde counterparts of the command processor's domain
//! types. The wire format is defined here (field names, defaults, unknown fields refused), so
//! that it can change without touching the domain, and the domain without breaking clients.

use std::collections::BTreeMap;

use monoseq_cp::{Command, KindName, NewArg, NewRecord, Outcome, RecordUpdate};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `POST /v1/commands`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// The workspace the command runs in.
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

/// A record kind as clients spell it.
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

/// The answer to a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
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

impl From<CommandBody> for Command {
    fn from(b: CommandBody) -> Command {
        Command {
            ws: b.ws,
            ws_kind: b.ws_kind,
            command: b.command,
            create: b.create.into_iter().map(NewRecord::from).collect(),
            update: b.update.into_iter().map(RecordUpdate::from).collect(),
            argument: b.argument.map(NewArg::from),
        }
    }
}

impl From<NewRecordBody> for NewRecord {
    fn from(b: NewRecordBody) -> NewRecord {
        NewRecord {
            raw_id: b.raw_id,
            kind: b.kind.into(),
            name: b.name,
            fields: b.fields,
        }
    }
}

impl From<RecordUpdateBody> for RecordUpdate {
    fn from(b: RecordUpdateBody) -> RecordUpdate {
        RecordUpdate {
            id: b.id,
            fields: b.fields,
        }
    }
}

impl From<NewArgBody> for NewArg {
    fn from(b: NewArgBody) -> NewArg {
        NewArg {
            raw_id: b.raw_id,
            name: b.name,
            fields: b.fields,
            children: b.children.into_iter().map(NewArg::from).collect(),
        }
    }
}

impl From<KindBody> for KindName {
    fn from(k: KindBody) -> KindName {
        match k {
            KindBody::CDoc => KindName::CDoc,
            KindBody::CRecord => KindName::CRecord,
            KindBody::WDoc => KindName::WDoc,
            KindBody::WRecord => KindName::WRecord,
        }
    }
}

impl From<&Outcome> for OutcomeBody {
    fn from(o: &Outcome) -> OutcomeBody {
        OutcomeBody {
            partition: o.partition,
            plog_offset: o.plog_offset,
            wlog_offset: o.wlog_offset,
            ids: o.ids.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_becomes_the_domain_command_field_by_field() {
        let body: CommandBody = serde_json::from_value(serde_json::json!({
            "ws": 7, "ws_kind": 1, "command": "app.Create",
            "create": [{"raw_id": 1, "kind": "WRecord", "name": "app.Row", "fields": {"n": 1}}],
            "update": [{"id": 9, "fields": {"paid": true}}],
            "argument": {"raw_id": 2, "name": "app.Arg", "children": [{"raw_id": 3, "name": "c"}]}
        }))
        .expect("a valid body");
        let cmd = Command::from(body);
        assert_eq!(
            (cmd.ws, cmd.ws_kind, cmd.command.as_str()),
            (7, 1, "app.Create")
        );
        assert_eq!(cmd.create[0].kind, KindName::WRecord);
        assert_eq!(cmd.update[0].id, 9);
        let arg = cmd.argument.expect("argument");
        assert_eq!((arg.raw_id, arg.children[0].raw_id), (2, 3));
    }

    #[test]
    fn unknown_fields_are_refused() {
        let e = serde_json::from_value::<CommandBody>(serde_json::json!({
            "ws": 7, "ws_kind": 1, "command": "c", "extra": 1
        }))
        .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }
}
