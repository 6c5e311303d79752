//! The event model: an event's place in the PLog and WLog, the records it creates and updates,
//! and its argument object; plus which sequence numbers an event uses.

use monoseq_core::{Number, PLogOffset, SeqId, WsId, WsKind};

use crate::builtin::{CRECORD_ID_SEQUENCE, OWRECORD_ID_SEQUENCE, WLOG_OFFSET_SEQUENCE};

/// The ID of a record (and of the argument object and its children).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RecordId(pub u64);

impl std::fmt::Display for RecordId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The position of an event in its workspace's WLog. The first event sits at 1.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WLogOffset(pub u64);

impl std::fmt::Display for WLogOffset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// The kind of a record; it decides which sequence hands out its ID
/// ([`RecordKind::id_sequence`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// A configuration document.
    CDoc,
    /// A configuration record (a CDoc's child).
    CRecord,
    /// A workflow document.
    WDoc,
    /// A workflow record (a WDoc's child).
    WRecord,
    /// An operation document (a command's argument).
    ODoc,
    /// An operation record (an ODoc's child).
    ORecord,
}

impl RecordKind {
    /// All kinds, in their encoding order (code 1 to 6).
    pub const ALL: [RecordKind; 6] = [
        RecordKind::CDoc,
        RecordKind::CRecord,
        RecordKind::WDoc,
        RecordKind::WRecord,
        RecordKind::ODoc,
        RecordKind::ORecord,
    ];

    /// The kind's byte in the encoding (see `docs/format.md`).
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            RecordKind::CDoc => 1,
            RecordKind::CRecord => 2,
            RecordKind::WDoc => 3,
            RecordKind::WRecord => 4,
            RecordKind::ODoc => 5,
            RecordKind::ORecord => 6,
        }
    }

    /// The kind with the given encoding byte, if any.
    #[must_use]
    pub fn from_code(code: u8) -> Option<RecordKind> {
        match code {
            1 => Some(RecordKind::CDoc),
            2 => Some(RecordKind::CRecord),
            3 => Some(RecordKind::WDoc),
            4 => Some(RecordKind::WRecord),
            5 => Some(RecordKind::ODoc),
            6 => Some(RecordKind::ORecord),
            _ => None,
        }
    }

    /// Whether an argument object (or one of its children) may have this kind: ODoc or ORecord.
    #[must_use]
    pub fn is_operation(self) -> bool {
        matches!(self, RecordKind::ODoc | RecordKind::ORecord)
    }
}

/// A named field value. The value is opaque bytes to the store; the command processor keeps
/// the JSON text of the value there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The field's name.
    pub name: String,
    /// The field's value.
    pub value: Vec<u8>,
}

impl Field {
    /// A field from its parts.
    #[must_use]
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Field {
        Field {
            name: name.into(),
            value: value.into(),
        }
    }
}

/// A record an event creates or updates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The record's ID.
    pub id: RecordId,
    /// The record's kind.
    pub kind: RecordKind,
    /// The record's type name (a qualified name such as `app.Order`).
    pub name: String,
    /// For a created record, all its fields; for an updated one, the fields it changes.
    pub fields: Vec<Field>,
}

/// The argument object of a command: an ODoc with nested ORecord children, each with its ID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgObject {
    /// The object's ID.
    pub id: RecordId,
    /// ODoc for the root, ORecord for children (the encoder checks both are operation kinds).
    pub kind: RecordKind,
    /// The object's type name.
    pub name: String,
    /// The object's fields.
    pub fields: Vec<Field>,
    /// Nested objects, at most [`ARG_DEPTH_MAX`](crate::ARG_DEPTH_MAX) levels in all.
    pub children: Vec<ArgObject>,
}

/// An event: what a command wrote, at its place in the partition's PLog and the workspace's
/// WLog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The event's offset in its partition's PLog.
    pub plog_offset: PLogOffset,
    /// The workspace the command ran in.
    pub ws: WsId,
    /// The workspace's kind.
    pub ws_kind: WsKind,
    /// The event's offset in the workspace's WLog.
    pub wlog_offset: WLogOffset,
    /// When the command processor registered the event, in milliseconds since the Unix epoch.
    pub registered_at_ms: u64,
    /// The command's name.
    pub command: String,
    /// The command's argument object, if it has one with IDs.
    pub argument: Option<ArgObject>,
    /// Records the event creates.
    pub created: Vec<Record>,
    /// Records the event updates. Updates use no sequence number.
    pub updated: Vec<Record>,
    /// The client's idempotency key with what answering a retry needs, for a command that
    /// carried one.
    pub idempotency: Option<Idempotency>,
}

/// What a command sent with an idempotency key keeps in its event, so that a retry with the
/// same key gets the original answer, also after a restart (the window is rebuilt from the
/// PLog).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Idempotency {
    /// The key the client sent.
    pub key: String,
    /// A fingerprint of the request body: a retry with the same key and another body is
    /// refused.
    pub fingerprint: u64,
    /// The command's raw IDs with the real IDs they got, as answered.
    pub raw_ids: Vec<(u64, u64)>,
}

impl RecordKind {
    /// The sequence that hands out IDs of new records of this kind: CDocs and CRecords take
    /// CRecord IDs; ODocs, ORecords, WDocs and WRecords take OWRecord IDs.
    #[must_use]
    pub fn id_sequence(self) -> SeqId {
        match self {
            RecordKind::CDoc | RecordKind::CRecord => CRECORD_ID_SEQUENCE.id,
            RecordKind::WDoc | RecordKind::WRecord | RecordKind::ODoc | RecordKind::ORecord => {
                OWRECORD_ID_SEQUENCE.id
            }
        }
    }
}

impl Event {
    /// Calls `f` with every sequence number the event used: its WLog offset, the IDs of the
    /// records it creates, and the IDs of its argument object and the object's children.
    /// Updated records use no number. The PLog offset is not reported: it is the event's
    /// place, kept by the sequencer per partition.
    pub fn for_each_number(&self, mut f: impl FnMut(SeqId, Number)) {
        f(WLOG_OFFSET_SEQUENCE.id, Number(self.wlog_offset.0));
        if let Some(arg) = &self.argument {
            arg.for_each_id(&mut |kind, id| f(kind.id_sequence(), Number(id.0)));
        }
        for r in &self.created {
            f(r.kind.id_sequence(), Number(r.id.0));
        }
    }
}

impl ArgObject {
    /// Calls `f` with the kind and ID of this object and of every descendant, depth first.
    pub fn for_each_id(&self, f: &mut impl FnMut(RecordKind, RecordId)) {
        f(self.kind, self.id);
        for c in &self.children {
            c.for_each_id(f);
        }
    }
}
