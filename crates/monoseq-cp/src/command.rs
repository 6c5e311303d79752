//! Commands as clients send them (JSON, with raw IDs), their validation, and the replacement of
//! raw IDs by real ones once the sequencer handed them out. Everything here is pure: no I/O.

use std::collections::{BTreeMap, HashSet};

use std::io::Write as _;

use monoseq_core::{PLogOffset, WsId, WsKind};
use monoseq_store::{
    ArgObject, Event, Field, Idempotency, Record, RecordId, RecordKind, WLogOffset,
};
#[cfg(feature = "json")]
use serde::Deserialize;
use serde::Serialize;
use serde_json::Value;

use crate::idempotency::{Fingerprint, IdempotencyKey};

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

impl KindName {
    /// The kind as clients spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            KindName::CDoc => "CDoc",
            KindName::CRecord => "CRecord",
            KindName::WDoc => "WDoc",
            KindName::WRecord => "WRecord",
        }
    }
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
    let raw_of = |&(raw, _): &(u64, RecordKind)| raw;
    let mut seen = Seen::new(raw_ids.len());
    for (i, &(raw, _)) in raw_ids.iter().enumerate() {
        if raw == 0 || raw > RAW_ID_MAX {
            return Err(InvalidCommand::RawIdOutOfRange(raw));
        }
        if seen.repeats(&raw_ids, i, raw_of) {
            return Err(InvalidCommand::DuplicateRawId(raw));
        }
    }
    let mut updated = Seen::new(cmd.update.len());
    for (i, u) in cmd.update.iter().enumerate() {
        if updated.repeats(&cmd.update, i, |u| u.id) {
            return Err(InvalidCommand::DuplicateUpdate(u.id));
        }
    }
    let known = |raw: u64| seen.contains(&raw_ids, raw, raw_of);
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

/// Lists of at most this many IDs are searched for repeats by a scan; longer ones through a
/// hash set (a command of a few records is checked without hashing or allocating).
const SCAN_IDS_MAX: usize = 16;

/// Which IDs of a list were seen, the list taken in order: a short list is scanned, a long
/// one's IDs are kept in a set.
enum Seen {
    Scan,
    Hashed(HashSet<u64>),
}

impl Seen {
    fn new(len: usize) -> Seen {
        if len <= SCAN_IDS_MAX {
            Seen::Scan
        } else {
            Seen::Hashed(HashSet::with_capacity(len))
        }
    }

    /// Whether the ID of `items[i]` is the ID of one of `items[..i]` (called for every `i` in
    /// order).
    fn repeats<T>(&mut self, items: &[T], i: usize, id: impl Fn(&T) -> u64) -> bool {
        let this = id(&items[i]);
        match self {
            Seen::Scan => items[..i].iter().any(|x| id(x) == this),
            Seen::Hashed(set) => !set.insert(this),
        }
    }

    /// Whether `wanted` is the ID of one of `items`, once every one was seen.
    fn contains<T>(&self, items: &[T], wanted: u64, id: impl Fn(&T) -> u64) -> bool {
        match self {
            Seen::Scan => items.iter().any(|x| id(x) == wanted),
            Seen::Hashed(set) => set.contains(&wanted),
        }
    }
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

/// The placeholder of every number in a [`Draft`]: the largest, so that the draft is as large
/// as its event can be once numbered.
const NUMBER_PLACEHOLDER: u64 = u64::MAX;

/// A checked command, encoded once: its event with every number at [`NUMBER_PLACEHOLDER`] (the
/// largest event it can give, which the storable check measures before any number is taken),
/// and where its numbers go once handed out ([`Draft::number`]).
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    /// The event. Its updated records have kind `CDoc` and no name until their stored kind and
    /// name are read.
    pub(crate) event: Event,
    /// The fields that refer to a raw ID: the field's place in the event's field order
    /// (created records, updated records, then the argument tree depth-first), and the raw ID.
    refs: Vec<(usize, u64)>,
}

/// Encodes a checked command into its draft event: every field value becomes its stored JSON
/// text here, once; with `key`, the command's fingerprint is taken from the same encoding and
/// the event carries the key. The fingerprint is returned too.
pub(crate) fn draft(cmd: Command, plan: &Plan, key: Option<&IdempotencyKey>) -> (Draft, u64) {
    let mut enc = Encoder {
        fingerprint: key.map(|_| Fingerprint::default()),
        refs: Vec::new(),
        place: 0,
    };
    enc.text(b"{\"ws\":");
    enc.number(cmd.ws);
    enc.text(b",\"ws_kind\":");
    enc.number(u64::from(cmd.ws_kind));
    enc.text(b",\"command\":");
    enc.string(&cmd.command);
    enc.text(b",\"create\":[");
    let mut created = Vec::with_capacity(cmd.create.len());
    for (i, r) in cmd.create.into_iter().enumerate() {
        enc.comma(i);
        created.push(enc.created(r));
    }
    enc.text(b"],\"update\":[");
    let mut updated = Vec::with_capacity(cmd.update.len());
    for (i, u) in cmd.update.into_iter().enumerate() {
        enc.comma(i);
        updated.push(enc.updated(u));
    }
    enc.text(b"],\"argument\":");
    let argument = match cmd.argument {
        Some(arg) => Some(enc.argument(arg, RecordKind::ODoc)),
        None => {
            enc.text(b"null");
            None
        }
    };
    if let Some(offset) = cmd.expected_wlog_offset {
        enc.text(b",\"expected_wlog_offset\":");
        enc.number(offset);
    }
    enc.text(b"}");
    let fingerprint = enc.fingerprint.as_ref().map_or(0, Fingerprint::finish);
    let mut raw_ids: Vec<(u64, u64)> = plan
        .raw_ids
        .iter()
        .map(|&(raw, _)| (raw, NUMBER_PLACEHOLDER))
        .collect();
    raw_ids.sort_unstable();
    let event = Event {
        plog_offset: PLogOffset(NUMBER_PLACEHOLDER),
        ws: plan.ws,
        ws_kind: plan.ws_kind,
        wlog_offset: WLogOffset(NUMBER_PLACEHOLDER),
        registered_at_ms: NUMBER_PLACEHOLDER,
        command: cmd.command,
        argument,
        created,
        updated,
        idempotency: key.map(|k| Idempotency {
            key: k.as_str().to_owned(),
            fingerprint,
            raw_ids,
        }),
    };
    let refs = enc.refs;
    (Draft { event, refs }, fingerprint)
}

/// Turns a command's parts into the event's, writing the command's canonical JSON to the
/// fingerprint (when one is taken) in the same pass.
struct Encoder {
    fingerprint: Option<Fingerprint>,
    refs: Vec<(usize, u64)>,
    /// The place of the next field in the event's field order.
    place: usize,
}

impl Encoder {
    fn text(&mut self, json: &[u8]) {
        if let Some(f) = &mut self.fingerprint {
            f.text(json);
        }
    }

    fn string(&mut self, s: &str) {
        if let Some(f) = &mut self.fingerprint {
            f.string(s);
        }
    }

    fn number(&mut self, n: u64) {
        if let Some(f) = &mut self.fingerprint {
            f.number(n);
        }
    }

    /// The comma before the `i`th element of a list.
    fn comma(&mut self, i: usize) {
        if i > 0 {
            self.text(b",");
        }
    }

    /// The fields, each value as its JSON text; a reference to a raw ID as the placeholder,
    /// noted in `refs`.
    fn fields(&mut self, map: serde_json::Map<String, Value>) -> Vec<Field> {
        self.text(b"{");
        let mut out = Vec::with_capacity(map.len());
        for (i, (name, value)) in map.into_iter().enumerate() {
            self.comma(i);
            self.string(&name);
            self.text(b":");
            let json = value.to_string();
            self.text(json.as_bytes());
            let value = match raw_ref(&name, &value) {
                Ok(Some(raw)) => {
                    self.refs.push((self.place, raw));
                    NUMBER_PLACEHOLDER.to_string().into_bytes()
                }
                _ => json.into_bytes(),
            };
            self.place += 1;
            out.push(Field { name, value });
        }
        self.text(b"}");
        out
    }

    fn created(&mut self, r: NewRecord) -> Record {
        self.text(b"{\"raw_id\":");
        self.number(r.raw_id);
        self.text(b",\"kind\":");
        self.string(r.kind.as_str());
        self.text(b",\"name\":");
        self.string(&r.name);
        self.text(b",\"fields\":");
        let fields = self.fields(r.fields);
        self.text(b"}");
        Record {
            id: RecordId(NUMBER_PLACEHOLDER),
            kind: r.kind.into(),
            name: r.name,
            fields,
        }
    }

    fn updated(&mut self, u: RecordUpdate) -> Record {
        self.text(b"{\"id\":");
        self.number(u.id);
        self.text(b",\"fields\":");
        let fields = self.fields(u.fields);
        self.text(b"}");
        Record {
            id: RecordId(u.id),
            kind: RecordKind::CDoc,
            name: String::new(),
            fields,
        }
    }

    fn argument(&mut self, arg: NewArg, kind: RecordKind) -> ArgObject {
        self.text(b"{\"raw_id\":");
        self.number(arg.raw_id);
        self.text(b",\"name\":");
        self.string(&arg.name);
        self.text(b",\"fields\":");
        let fields = self.fields(arg.fields);
        self.text(b",\"children\":[");
        let mut children = Vec::with_capacity(arg.children.len());
        for (i, child) in arg.children.into_iter().enumerate() {
            self.comma(i);
            children.push(self.argument(child, RecordKind::ORecord));
        }
        self.text(b"]}");
        ArgObject {
            id: RecordId(NUMBER_PLACEHOLDER),
            kind,
            name: arg.name,
            fields,
            children,
        }
    }
}

impl Draft {
    /// Numbers the event in place with the IDs handed out (`ids` by raw ID, one for every raw
    /// ID of `plan`, the plan the draft was made with): the records it creates, the argument
    /// tree, the fields that refer to them and the idempotency answer. Every number is
    /// overwritten, so a draft numbered for a group that failed is numbered again for the
    /// next. The PLog and WLog offsets, the time and the updated records' kinds and names are
    /// the caller's to set.
    pub(crate) fn number(&mut self, plan: &Plan, ids: &BTreeMap<u64, u64>) {
        let event = &mut self.event;
        let mut numbers = plan.raw_ids.iter().map(|(raw, _)| ids[raw]);
        for r in &mut event.created {
            r.id = RecordId(numbers.next().unwrap_or(NUMBER_PLACEHOLDER));
        }
        if let Some(arg) = &mut event.argument {
            number_args(arg, &mut numbers);
        }
        let mut refs = self.refs.iter().peekable();
        let mut place = 0;
        let mut patch = |fields: &mut Vec<Field>| {
            for f in fields {
                if let Some((_, raw)) = refs.next_if(|(at, _)| *at == place) {
                    f.value.clear();
                    let _ = write!(f.value, "{}", ids[raw]);
                }
                place += 1;
            }
        };
        for r in event.created.iter_mut().chain(&mut event.updated) {
            patch(&mut r.fields);
        }
        if let Some(arg) = &mut event.argument {
            arg_fields(arg, &mut patch);
        }
        if let Some(i) = &mut event.idempotency {
            i.raw_ids.clear();
            i.raw_ids.extend(ids.iter().map(|(&raw, &id)| (raw, id)));
        }
    }

    /// The event numbered, the draft left as it is.
    #[cfg(test)]
    pub(crate) fn numbered(&self, plan: &Plan, ids: &BTreeMap<u64, u64>) -> Event {
        let mut draft = self.clone();
        draft.number(plan, ids);
        draft.event
    }

    /// Takes the event out for the group's write, leaving an empty one; the group gives it
    /// back with [`Draft::give_back`] if its write fails and the command is retried.
    pub(crate) fn take_event(&mut self) -> Event {
        let empty = Event {
            plog_offset: PLogOffset(0),
            ws: self.event.ws,
            ws_kind: self.event.ws_kind,
            wlog_offset: WLogOffset(0),
            registered_at_ms: 0,
            command: String::new(),
            argument: None,
            created: Vec::new(),
            updated: Vec::new(),
            idempotency: None,
        };
        std::mem::replace(&mut self.event, empty)
    }

    /// Gives back the event [`Draft::take_event`] took: numbered or not, it is numbered again
    /// before it is written.
    pub(crate) fn give_back(&mut self, event: Event) {
        self.event = event;
    }
}

/// Gives the argument tree its IDs, depth first.
fn number_args(arg: &mut ArgObject, numbers: &mut impl Iterator<Item = u64>) {
    arg.id = RecordId(numbers.next().unwrap_or(NUMBER_PLACEHOLDER));
    for child in &mut arg.children {
        number_args(child, numbers);
    }
}

/// Calls `f` with the fields of the argument tree, depth first.
fn arg_fields(arg: &mut ArgObject, f: &mut impl FnMut(&mut Vec<Field>)) {
    f(&mut arg.fields);
    for child in &mut arg.children {
        arg_fields(child, f);
    }
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
        let (draft, _) = draft(c, &p, None);
        let event = draft.numbered(&p, &ids);
        assert_eq!(event.created[0].id, RecordId(100));
        assert_eq!(event.created[0].fields[0].value, b"200");
        let arg = event.argument.unwrap();
        assert_eq!((arg.id, arg.children[0].id), (RecordId(300), RecordId(400)));
        assert_eq!(arg.children[0].fields[0].value, b"100");
    }

    /// Commands covering every part of the canonical JSON: escapes, nesting, empty and full
    /// lists, references, every kind, with and without an expected WLog offset.
    fn varied() -> Vec<Command> {
        let mut deep = json!({"raw_id": 10, "name": "leaf", "fields": {"x": {"$raw": 1}}});
        for i in 11..14 {
            deep = json!({"raw_id": i, "name": format!("n{i}"), "children": [deep,
                          {"raw_id": i + 10, "name": "sib", "fields": {"é\"\\\n": [1, 2.5, null]}}]});
        }
        [
            json!({"ws": 1, "ws_kind": 1, "command": "c"}),
            json!({"ws": u64::MAX, "ws_kind": 65535, "command": "quote \" and \u{1}",
                   "expected_wlog_offset": 0}),
            json!({"ws": 7, "ws_kind": 2, "command": "app.Order",
                   "create": [{"raw_id": 1, "kind": "CDoc", "name": "o",
                               "fields": {"b": true, "a": {"$raw": 2}, "n": -1.5e300,
                                          "s": "π\t", "o": {"k": [{}]}}},
                              {"raw_id": 2, "kind": "CRecord", "name": "r"},
                              {"raw_id": 3, "kind": "WDoc", "name": "w", "fields": {}},
                              {"raw_id": 4, "kind": "WRecord", "name": "wr",
                               "fields": {"$raw": {"$raw": 3}}}],
                   "update": [{"id": 9, "fields": {"paid": {"$raw": 1}, "z": 0}},
                              {"id": 10, "fields": {}}],
                   "argument": deep,
                   "expected_wlog_offset": 12345}),
        ]
        .into_iter()
        .map(cmd)
        .collect()
    }

    #[test]
    fn the_fingerprint_taken_while_encoding_is_the_serialized_command_s() {
        let key = IdempotencyKey::new("k").unwrap();
        for c in varied() {
            let p = plan(&c).unwrap();
            let expected = crate::idempotency::fingerprint(&c);
            let (d, f) = draft(c.clone(), &p, Some(&key));
            assert_eq!(f, expected, "{c:?}");
            assert_eq!(d.event.idempotency.unwrap().fingerprint, expected);
        }
    }

    #[test]
    fn a_numbered_draft_is_the_event_with_every_reference_resolved() {
        for c in varied() {
            let p = plan(&c).unwrap();
            let ids: BTreeMap<u64, u64> = p
                .raw_ids
                .iter()
                .map(|&(raw, _)| (raw, 1_000 + raw))
                .collect();
            let (d, _) = draft(c.clone(), &p, None);
            let event = d.numbered(&p, &ids);
            // The fields as JSON, a reference replaced by its record's ID.
            let text = |map: &serde_json::Map<String, Value>| -> Vec<Field> {
                map.iter()
                    .map(|(name, value)| {
                        let value = match raw_ref(name, value) {
                            Ok(Some(raw)) => Value::from(ids[&raw]),
                            _ => value.clone(),
                        };
                        Field::new(name.clone(), value.to_string())
                    })
                    .collect()
            };
            for (r, new) in event.created.iter().zip(&c.create) {
                assert_eq!(r.id, RecordId(ids[&new.raw_id]));
                assert_eq!(r.fields, text(&new.fields));
            }
            for (r, u) in event.updated.iter().zip(&c.update) {
                assert_eq!((r.id, &r.fields), (RecordId(u.id), &text(&u.fields)));
            }
            fn check(
                a: &ArgObject,
                n: &NewArg,
                ids: &BTreeMap<u64, u64>,
                text: &dyn Fn(&serde_json::Map<String, Value>) -> Vec<Field>,
            ) {
                assert_eq!(a.id, RecordId(ids[&n.raw_id]));
                assert_eq!(a.fields, text(&n.fields));
                for (a, n) in a.children.iter().zip(&n.children) {
                    check(a, n, ids, text);
                }
            }
            if let (Some(a), Some(n)) = (&event.argument, &c.argument) {
                check(a, n, &ids, &text);
            }
        }
    }

    #[test]
    fn repeats_and_unknown_references_are_found_in_long_lists_as_in_short_ones() {
        for n in [2, SCAN_IDS_MAX as u64, SCAN_IDS_MAX as u64 + 1, 100] {
            let created = |dup: bool| -> Vec<Value> {
                (1..=n)
                    .map(|i| {
                        let raw = if dup && i == n { 1 } else { i };
                        json!({"raw_id": raw, "kind": "CDoc", "name": "a",
                               "fields": {"x": {"$raw": 1}}})
                    })
                    .collect()
            };
            let plan_of = |v: Value| plan(&cmd(v));
            let ok =
                plan_of(json!({"ws": 7, "ws_kind": 1, "command": "c", "create": created(false)}));
            assert_eq!(ok.unwrap().raw_ids.len() as u64, n);
            let dup =
                plan_of(json!({"ws": 7, "ws_kind": 1, "command": "c", "create": created(true)}));
            assert_eq!(
                dup.unwrap_err(),
                InvalidCommand::DuplicateRawId(1),
                "{n} records"
            );
            let mut refs = created(false);
            refs[0]["fields"]["x"] = json!({"$raw": n + 1});
            let unknown = plan_of(json!({"ws": 7, "ws_kind": 1, "command": "c", "create": refs}));
            assert_eq!(
                unknown.unwrap_err(),
                InvalidCommand::UnknownRawRef {
                    field: "x".into(),
                    raw: n + 1
                },
                "{n} records"
            );
            let updates: Vec<Value> = (1..=n)
                .map(|i| json!({"id": if i == n { 1 } else { i }, "fields": {}}))
                .collect();
            let twice = plan_of(json!({"ws": 7, "ws_kind": 1, "command": "c", "update": updates}));
            assert_eq!(
                twice.unwrap_err(),
                InvalidCommand::DuplicateUpdate(1),
                "{n} updates"
            );
        }
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
