//! Commands as clients send them (JSON, with raw IDs), their validation, and the replacement of
//! raw IDs by real ones once the sequencer handed them out. Everything here is pure: no I/O.

use std::collections::{BTreeMap, HashMap};

use monoseq_core::{WsId, WsKind};
use monoseq_store::{ArgObject, Field, Record, RecordId, RecordKind};
#[cfg(feature = "json")]
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

/// Largest raw ID a command may use (raw IDs are small client-side placeholders).
pub const RAW_ID_MAX: u64 = 65_535;
/// Most records (created, updated and argument objects together) one command may carry.
pub const COMMAND_RECORDS_MAX: usize = 1_000;
/// Deepest nesting of the argument object.
pub const ARG_DEPTH_MAX: usize = monoseq_store::ARG_DEPTH_MAX;
/// The JSON key that marks a reference to a raw ID inside a field value: `{"$raw": 1}`.
pub const RAW_REF_KEY: &str = "$raw";

/// A command: the records it creates and updates and its argument object. Its serialized JSON
/// is the canonical form an idempotency fingerprint hashes (stored with every keyed event), not
/// the wire format: the server reads its own request bodies (feature `json` reads this type
/// from JSON, for tests and tools).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json", derive(Deserialize))]
#[serde(deny_unknown_fields)]
pub struct Command {
    /// The workspace the command runs in.
    pub ws: u64,
    /// The workspace's kind.
    pub ws_kind: u16,
    /// The command's name, e.g. `app.CreateOrder`.
    pub command: String,
    /// Records to create, each with a raw ID.
    #[serde(default)]
    pub create: Vec<NewRecord>,
    /// Existing records to update, by real ID.
    #[serde(default)]
    pub update: Vec<RecordUpdate>,
    /// The argument object (an ODoc with nested ORecords), with raw IDs.
    #[serde(default)]
    pub argument: Option<NewArg>,
    /// Applies the command only if its workspace's WLog ends at this offset: the WLog offset
    /// of the workspace's last event, 0 when it has none yet. Otherwise the command is refused
    /// with [`CommandError::WlogConflict`](crate::CommandError::WlogConflict) and takes no
    /// number. Part of the idempotency fingerprint when present; left out of it when absent,
    /// so fingerprints of commands without it are what they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_wlog_offset: Option<u64>,
}

/// A record to create.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json", derive(Deserialize))]
#[serde(deny_unknown_fields)]
pub struct NewRecord {
    /// The client's placeholder ID, unique in the command, 1 to [`RAW_ID_MAX`].
    pub raw_id: u64,
    /// `CDoc`, `CRecord`, `WDoc` or `WRecord`.
    pub kind: KindName,
    /// The record's type name.
    pub name: String,
    /// Field values; `{"$raw": n}` refers to another record of the command.
    #[serde(default)]
    pub fields: serde_json::Map<String, Value>,
}

/// An update of an existing record.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json", derive(Deserialize))]
#[serde(deny_unknown_fields)]
pub struct RecordUpdate {
    /// The record's real ID.
    pub id: u64,
    /// The fields to change; `{"$raw": n}` refers to a record the command creates.
    pub fields: serde_json::Map<String, Value>,
}

/// The argument object or one of its children.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "json", derive(Deserialize))]
#[serde(deny_unknown_fields)]
pub struct NewArg {
    /// The client's placeholder ID, unique in the command.
    pub raw_id: u64,
    /// The type name.
    pub name: String,
    /// Field values.
    #[serde(default)]
    pub fields: serde_json::Map<String, Value>,
    /// Nested objects (ORecords).
    #[serde(default)]
    pub children: Vec<NewArg>,
}

/// A record kind as clients spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "json", derive(Deserialize))]
pub enum KindName {
    /// Configuration document.
    CDoc,
    /// Configuration record.
    CRecord,
    /// Workflow document.
    WDoc,
    /// Workflow record.
    WRecord,
}

impl From<KindName> for RecordKind {
    fn from(k: KindName) -> RecordKind {
        match k {
            KindName::CDoc => RecordKind::CDoc,
            KindName::CRecord => RecordKind::CRecord,
            KindName::WDoc => RecordKind::WDoc,
            KindName::WRecord => RecordKind::WRecord,
        }
    }
}

/// Why a command was refused before anything was handed out or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidCommand {
    /// A raw ID is 0 or above [`RAW_ID_MAX`].
    #[error("raw ID {0} is out of range: use 1 to {RAW_ID_MAX}")]
    RawIdOutOfRange(u64),
    /// Two records of the command use the same raw ID.
    #[error("raw ID {0} is used twice in the command; give every new record its own raw ID")]
    DuplicateRawId(u64),
    /// A field refers to a raw ID the command does not define.
    #[error("field {field:?} refers to raw ID {raw}, which no record of this command has")]
    UnknownRawRef {
        /// The field.
        field: String,
        /// The raw ID.
        raw: u64,
    },
    /// A `$raw` reference that is not a positive integer.
    #[error("field {0:?} has a malformed reference: write {{\"$raw\": <raw ID>}}")]
    MalformedRef(String),
    /// Too many records.
    #[error("the command carries {0} records; at most {COMMAND_RECORDS_MAX} are allowed")]
    TooManyRecords(usize),
    /// The argument object nests too deeply.
    #[error("the argument object nests deeper than {ARG_DEPTH_MAX} levels")]
    ArgumentTooDeep,
    /// The command name is empty.
    #[error("the command name is empty")]
    EmptyName,
    /// The workspace ID is 0.
    #[error("workspace 0 does not exist; workspace IDs start at 1")]
    ZeroWorkspace,
    /// The same record is updated twice.
    #[error("record {0} is updated twice in one command; merge the updates")]
    DuplicateUpdate(u64),
}

/// The records a validated command needs numbers for, in hand-out order.
#[derive(Debug)]
pub(crate) struct Plan {
    pub(crate) ws: WsId,
    pub(crate) ws_kind: WsKind,
    /// Raw IDs with the sequence kind of record they create: created records first, then the
    /// argument tree depth-first.
    pub(crate) raw_ids: Vec<(u64, RecordKind)>,
}

/// Checks a command without I/O and lists the numbers it needs.
pub(crate) fn plan(cmd: &Command) -> Result<Plan, InvalidCommand> {
    if cmd.command.is_empty() {
        return Err(InvalidCommand::EmptyName);
    }
    if cmd.ws == 0 {
        return Err(InvalidCommand::ZeroWorkspace);
    }
    let mut raw_ids: Vec<(u64, RecordKind)> = Vec::new();
    for r in &cmd.create {
        raw_ids.push((r.raw_id, r.kind.into()));
    }
    if let Some(arg) = &cmd.argument {
        collect_args(arg, RecordKind::ODoc, 1, &mut raw_ids)?;
    }
    let records = raw_ids.len() + cmd.update.len();
    if records > COMMAND_RECORDS_MAX {
        return Err(InvalidCommand::TooManyRecords(records));
    }
    let mut seen = HashMap::with_capacity(raw_ids.len());
    for &(raw, _) in &raw_ids {
        if raw == 0 || raw > RAW_ID_MAX {
            return Err(InvalidCommand::RawIdOutOfRange(raw));
        }
        if seen.insert(raw, ()).is_some() {
            return Err(InvalidCommand::DuplicateRawId(raw));
        }
    }
    let mut updated = HashMap::with_capacity(cmd.update.len());
    for u in &cmd.update {
        if updated.insert(u.id, ()).is_some() {
            return Err(InvalidCommand::DuplicateUpdate(u.id));
        }
    }
    let known = |raw: u64| seen.contains_key(&raw);
    for r in &cmd.create {
        check_refs(&r.fields, &known)?;
    }
    for u in &cmd.update {
        check_refs(&u.fields, &known)?;
    }
    if let Some(arg) = &cmd.argument {
        check_arg_refs(arg, &known)?;
    }
    Ok(Plan {
        ws: WsId(cmd.ws),
        ws_kind: WsKind(cmd.ws_kind),
        raw_ids,
    })
}

fn collect_args(
    arg: &NewArg,
    kind: RecordKind,
    depth: usize,
    out: &mut Vec<(u64, RecordKind)>,
) -> Result<(), InvalidCommand> {
    if depth > ARG_DEPTH_MAX {
        return Err(InvalidCommand::ArgumentTooDeep);
    }
    out.push((arg.raw_id, kind));
    for child in &arg.children {
        collect_args(child, RecordKind::ORecord, depth + 1, out)?;
    }
    Ok(())
}

fn check_arg_refs(arg: &NewArg, known: &impl Fn(u64) -> bool) -> Result<(), InvalidCommand> {
    check_refs(&arg.fields, known)?;
    arg.children
        .iter()
        .try_for_each(|c| check_arg_refs(c, known))
}

fn check_refs(
    fields: &serde_json::Map<String, Value>,
    known: &impl Fn(u64) -> bool,
) -> Result<(), InvalidCommand> {
    for (name, value) in fields {
        if let Some(raw) = raw_ref(name, value)?
            && !known(raw)
        {
            return Err(InvalidCommand::UnknownRawRef {
                field: name.clone(),
                raw,
            });
        }
    }
    Ok(())
}

/// The raw ID a field value refers to, if it is a `{"$raw": n}` object.
fn raw_ref(field: &str, value: &Value) -> Result<Option<u64>, InvalidCommand> {
    let Value::Object(obj) = value else {
        return Ok(None);
    };
    let Some(r) = obj.get(RAW_REF_KEY) else {
        return Ok(None);
    };
    match (r.as_u64(), obj.len()) {
        (Some(raw), 1) if raw > 0 => Ok(Some(raw)),
        _ => Err(InvalidCommand::MalformedRef(field.to_owned())),
    }
}

/// Builds the stored fields: references replaced by real IDs, values kept as JSON text.
pub(crate) fn fields(map: &serde_json::Map<String, Value>, ids: &BTreeMap<u64, u64>) -> Vec<Field> {
    map.iter()
        .map(|(name, value)| {
            let value = match raw_ref(name, value) {
                Ok(Some(raw)) => Value::from(ids[&raw]),
                _ => value.clone(),
            };
            Field::new(name.clone(), value.to_string())
        })
        .collect()
}

fn arg_object(arg: &NewArg, kind: RecordKind, ids: &BTreeMap<u64, u64>) -> ArgObject {
    ArgObject {
        id: RecordId(ids[&arg.raw_id]),
        kind,
        name: arg.name.clone(),
        fields: fields(&arg.fields, ids),
        children: arg
            .children
            .iter()
            .map(|c| arg_object(c, RecordKind::ORecord, ids))
            .collect(),
    }
}

/// The created records, the updates and the argument object with real IDs. `updated` gives the
/// stored kind and type name of each updated record, in `cmd.update` order.
pub(crate) fn resolve(
    cmd: &Command,
    ids: &BTreeMap<u64, u64>,
    updated: &[(RecordKind, String)],
) -> (Vec<Record>, Vec<Record>, Option<ArgObject>) {
    let created = cmd
        .create
        .iter()
        .map(|r| Record {
            id: RecordId(ids[&r.raw_id]),
            kind: r.kind.into(),
            name: r.name.clone(),
            fields: fields(&r.fields, ids),
        })
        .collect();
    let updated = cmd
        .update
        .iter()
        .zip(updated)
        .map(|(u, (kind, name))| Record {
            id: RecordId(u.id),
            kind: *kind,
            name: name.clone(),
            fields: fields(&u.fields, ids),
        })
        .collect();
    let argument = cmd
        .argument
        .as_ref()
        .map(|a| arg_object(a, RecordKind::ODoc, ids));
    (created, updated, argument)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cmd(v: Value) -> Command {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_valid_command_lists_created_records_then_the_argument_tree() {
        let c = cmd(json!({
            "ws": 7, "ws_kind": 1, "command": "app.Order",
            "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order",
                        "fields": {"customer": {"$raw": 2}}},
                       {"raw_id": 2, "kind": "WDoc", "name": "app.Customer"}],
            "argument": {"raw_id": 3, "name": "app.Arg",
                         "children": [{"raw_id": 4, "name": "app.Line", "fields": {"order": {"$raw": 1}}}]}
        }));
        let p = plan(&c).unwrap();
        assert_eq!(
            p.raw_ids,
            vec![
                (1, RecordKind::CDoc),
                (2, RecordKind::WDoc),
                (3, RecordKind::ODoc),
                (4, RecordKind::ORecord)
            ]
        );
        let ids = BTreeMap::from([(1, 100), (2, 200), (3, 300), (4, 400)]);
        let (created, _, arg) = resolve(&c, &ids, &[]);
        assert_eq!(created[0].fields[0].value, b"200");
        assert_eq!(arg.unwrap().children[0].fields[0].value, b"100");
    }

    #[test]
    fn bad_commands_are_refused_with_the_reason() {
        let base = json!({"ws": 7, "ws_kind": 1, "command": "c"});
        let with = |extra: Value| {
            let mut v = base.clone();
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            plan(&cmd(v)).unwrap_err()
        };
        assert_eq!(
            with(
                json!({"create": [{"raw_id": 1, "kind": "CDoc", "name": "a"},
                                   {"raw_id": 1, "kind": "CDoc", "name": "b"}]})
            ),
            InvalidCommand::DuplicateRawId(1)
        );
        assert_eq!(
            with(json!({"create": [{"raw_id": 1, "kind": "CDoc", "name": "a",
                                    "fields": {"x": {"$raw": 9}}}]})),
            InvalidCommand::UnknownRawRef {
                field: "x".into(),
                raw: 9
            }
        );
        assert_eq!(
            with(json!({"create": [{"raw_id": 0, "kind": "CDoc", "name": "a"}]})),
            InvalidCommand::RawIdOutOfRange(0)
        );
        assert_eq!(
            with(json!({"create": [{"raw_id": 1, "kind": "CDoc", "name": "a",
                                    "fields": {"x": {"$raw": "one"}}}]})),
            InvalidCommand::MalformedRef("x".into())
        );
        assert_eq!(
            with(json!({"update": [{"id": 5, "fields": {}}, {"id": 5, "fields": {}}]})),
            InvalidCommand::DuplicateUpdate(5)
        );
        assert_eq!(
            plan(&cmd(json!({"ws": 0, "ws_kind": 1, "command": "c"}))).unwrap_err(),
            InvalidCommand::ZeroWorkspace
        );
        let mut deep = json!({"raw_id": 1, "name": "a"});
        for i in 2..=(ARG_DEPTH_MAX as u64 + 1) {
            deep = json!({"raw_id": i, "name": "a", "children": [deep]});
        }
        assert_eq!(
            with(json!({ "argument": deep })),
            InvalidCommand::ArgumentTooDeep
        );
    }
}
