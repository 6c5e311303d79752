//! What the reading endpoints, `/v1/info`, `/v1/cluster`, `/readyz`'s refusal and every error
//! answer carry.
//! Answers accept unknown fields: a server may add one without breaking older clients.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize, Serializer};

use crate::ErrorCode;
use serde_json::{Map, Value};

/// Every error answer: a stable code and a message saying what to do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The stable code (`busy`, `not_owner`, `invalid_command`, …).
    pub code: ErrorCode,
    /// What happened and what to do, for people.
    pub message: String,
    /// With `corrupted`: the damaged place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// With `wlog_conflict`: the WLog offset the workspace's WLog ends at (the offset of its
    /// last event, 0 when it has none), to read up to and resend the command expecting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wlog_offset: Option<u64>,
}

impl ErrorBody {
    /// An error answer with `code` and `message` (and no damaged place).
    #[must_use]
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ErrorBody {
        ErrorBody {
            code,
            message: message.into(),
            key: None,
            current_wlog_offset: None,
        }
    }
}

/// `GET /readyz`'s 503: the partitions that cannot be answered yet, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotReadyBody {
    /// Always `not_ready`.
    pub code: ErrorCode,
    /// How many partitions, for people.
    pub message: String,
    /// Each partition not ready; absent from a `not_ready` of a node whose storage is still
    /// opening (no partition is known yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<NotReadyPartitionBody>>,
}

/// A partition of [`NotReadyBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotReadyPartitionBody {
    /// The partition.
    pub partition: u32,
    /// Why it cannot be answered yet.
    pub reason: String,
}

/// The kind of a stored record or argument object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredKindBody {
    /// Configuration document.
    CDoc,
    /// Configuration record.
    CRecord,
    /// Workflow document.
    WDoc,
    /// Workflow record.
    WRecord,
    /// Argument object (an event's argument).
    ODoc,
    /// Argument object's child.
    ORecord,
}

/// A record: `GET /v1/workspaces/{ws}/records/{id}`, and each record an event created or
/// updated.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RecordBody {
    /// The real ID.
    pub id: u64,
    /// Its kind.
    pub kind: StoredKindBody,
    /// Its type name.
    pub name: String,
    /// Field values (a value stored as text that is not JSON reads as a string).
    pub fields: Map<String, Value>,
}

/// An event's argument object or one of its children.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ArgBody {
    /// Its real ID (a number of the event, not a readable record).
    pub id: u64,
    /// `ODoc` or `ORecord`.
    pub kind: StoredKindBody,
    /// Its type name.
    pub name: String,
    /// Field values.
    pub fields: Map<String, Value>,
    /// Nested objects.
    pub children: Vec<ArgBody>,
}

/// A stored event: `GET /v1/partitions/{p}/events/{offset}` and the items of a WLog page.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct EventBody {
    /// Its PLog offset in its partition.
    pub plog_offset: u64,
    /// Its workspace.
    pub ws: u64,
    /// The workspace's kind.
    pub ws_kind: u16,
    /// Its offset in the workspace's WLog.
    pub wlog_offset: u64,
    /// When the server registered it, milliseconds since the Unix epoch.
    pub registered_at_ms: u64,
    /// The command's name.
    pub command: String,
    /// The argument object, with real IDs.
    pub argument: Option<ArgBody>,
    /// Records it created.
    pub created: Vec<RecordBody>,
    /// Records it updated (the changed fields).
    pub updated: Vec<RecordBody>,
    /// The `Idempotency-Key` it was submitted with.
    pub idempotency_key: Option<String>,
}

/// An event's JSON, written in this one place whatever form the event has: an
/// [`EventBody`] (its `Serialize` is this), or a server's stored event written straight from
/// its own type (`argument` and the records as that type writes them, through [`ArgJson`] and
/// [`RecordJson`]). Its fields, in their order, are [`EventBody`]'s.
#[derive(Debug, Clone, Copy)]
pub struct EventJson<'a, A, R> {
    /// [`EventBody::plog_offset`].
    pub plog_offset: u64,
    /// [`EventBody::ws`].
    pub ws: u64,
    /// [`EventBody::ws_kind`].
    pub ws_kind: u16,
    /// [`EventBody::wlog_offset`].
    pub wlog_offset: u64,
    /// [`EventBody::registered_at_ms`].
    pub registered_at_ms: u64,
    /// [`EventBody::command`].
    pub command: &'a str,
    /// [`EventBody::argument`], written as an [`ArgBody`].
    pub argument: Option<A>,
    /// [`EventBody::created`], written as a list of [`RecordBody`].
    pub created: R,
    /// [`EventBody::updated`], written as a list of [`RecordBody`].
    pub updated: R,
    /// [`EventBody::idempotency_key`].
    pub idempotency_key: Option<&'a str>,
}

impl<A: Serialize, R: Serialize> Serialize for EventJson<'_, A, R> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("EventBody", 10)?;
        m.serialize_field("plog_offset", &self.plog_offset)?;
        m.serialize_field("ws", &self.ws)?;
        m.serialize_field("ws_kind", &self.ws_kind)?;
        m.serialize_field("wlog_offset", &self.wlog_offset)?;
        m.serialize_field("registered_at_ms", &self.registered_at_ms)?;
        m.serialize_field("command", self.command)?;
        m.serialize_field("argument", &self.argument)?;
        m.serialize_field("created", &self.created)?;
        m.serialize_field("updated", &self.updated)?;
        m.serialize_field("idempotency_key", &self.idempotency_key)?;
        m.end()
    }
}

impl Serialize for EventBody {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        EventJson {
            plog_offset: self.plog_offset,
            ws: self.ws,
            ws_kind: self.ws_kind,
            wlog_offset: self.wlog_offset,
            registered_at_ms: self.registered_at_ms,
            command: &self.command,
            argument: self.argument.as_ref(),
            created: &self.created,
            updated: &self.updated,
            idempotency_key: self.idempotency_key.as_deref(),
        }
        .serialize(s)
    }
}

/// A record's JSON, written in this one place (as [`EventJson`] for an event): the fields of
/// [`RecordBody`], `fields` written as a JSON object.
#[derive(Debug, Clone, Copy)]
pub struct RecordJson<'a, F> {
    /// [`RecordBody::id`].
    pub id: u64,
    /// [`RecordBody::kind`].
    pub kind: StoredKindBody,
    /// [`RecordBody::name`].
    pub name: &'a str,
    /// [`RecordBody::fields`].
    pub fields: F,
}

impl<F: Serialize> Serialize for RecordJson<'_, F> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("RecordBody", 4)?;
        m.serialize_field("id", &self.id)?;
        m.serialize_field("kind", &self.kind)?;
        m.serialize_field("name", self.name)?;
        m.serialize_field("fields", &self.fields)?;
        m.end()
    }
}

impl Serialize for RecordBody {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        RecordJson {
            id: self.id,
            kind: self.kind,
            name: &self.name,
            fields: &self.fields,
        }
        .serialize(s)
    }
}

/// An argument object's JSON, written in this one place: the fields of [`ArgBody`].
#[derive(Debug, Clone, Copy)]
pub struct ArgJson<'a, F, C> {
    /// [`ArgBody::id`].
    pub id: u64,
    /// [`ArgBody::kind`].
    pub kind: StoredKindBody,
    /// [`ArgBody::name`].
    pub name: &'a str,
    /// [`ArgBody::fields`], written as a JSON object.
    pub fields: F,
    /// [`ArgBody::children`], written as a list of [`ArgBody`].
    pub children: C,
}

impl<F: Serialize, C: Serialize> Serialize for ArgJson<'_, F, C> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("ArgBody", 5)?;
        m.serialize_field("id", &self.id)?;
        m.serialize_field("kind", &self.kind)?;
        m.serialize_field("name", self.name)?;
        m.serialize_field("fields", &self.fields)?;
        m.serialize_field("children", &self.children)?;
        m.end()
    }
}

impl Serialize for ArgBody {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ArgJson {
            id: self.id,
            kind: self.kind,
            name: &self.name,
            fields: &self.fields,
            children: &self.children,
        }
        .serialize(s)
    }
}

/// `GET /v1/workspaces/{ws}/wlog`: consecutive events of one workspace's WLog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WlogPageBody {
    /// From the asked offset on, at most `limit`; fewer (or none) at the WLog's end.
    pub events: Vec<EventBody>,
    /// The WLog offset to ask for next: after the last event, or the asked one.
    #[serde(default)]
    pub next: u64,
    /// The WLog's end: the offset after the workspace's last event a reader may see now (the
    /// next one written takes it, unless a loss retired numbers).
    #[serde(default)]
    pub end: u64,
}

/// `GET /v1/token`: what the presented token may do, so that a client (the web console) shows
/// only the actions it may take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenScopeBody {
    /// `read` (GET only), `consume` (read, set consumer positions, take part in groups),
    /// `write` (every request but administration) or `admin` (every request); on a server
    /// without tokens, `write`, or `admin` under `--admin-on-loopback`.
    pub scope: String,
    /// Whether the server requires tokens.
    pub tokens: bool,
}

/// `GET /v1/info`: what the server serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InfoBody {
    /// The server's version.
    pub version: String,
    /// Partition count; a command goes to partition `ws mod partitions`.
    pub partitions: u32,
    /// Trust level of the built-in sequences (0, 1 or 2).
    pub trust_level: u8,
    /// `embedded` (with its data directory) or the PostgreSQL address without its password.
    pub storage: String,
    /// The store's ID.
    pub store_id: String,
    /// How many of a partition's last events a retry's `Idempotency-Key` is recognised in.
    pub idempotency_window_events: u64,
}

/// `GET /v1/cluster`: the nodes and the owner of each partition. One node on embedded storage
/// answers `clustered: false` and the partitions it serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClusterBody {
    /// Several nodes on one database.
    Clustered {
        /// Always `true`.
        clustered: bool,
        /// The answering node.
        node_id: String,
        /// The lease's length.
        lease_ms: i64,
        /// How often leases are renewed.
        renew_ms: u64,
        /// Every registered node.
        nodes: Vec<ClusterNodeBody>,
        /// Every partition's lease.
        partitions: Vec<ClusterPartitionBody>,
    },
    /// One node serving every partition.
    Single {
        /// Always `false`.
        clustered: bool,
        /// Why.
        message: String,
        /// The partitions served.
        partitions: Vec<u32>,
    },
}

/// A node of [`ClusterBody::Clustered`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNodeBody {
    /// Its name (`--node-id`).
    pub node_id: String,
    /// The run (process) that holds the name.
    #[serde(default)]
    pub run_id: Option<String>,
    /// The URL it advertises to clients and peers.
    pub url: String,
    /// How long ago it last renewed, in milliseconds.
    #[serde(default)]
    pub seen_ms_ago: u64,
    /// Whether it renewed lately.
    pub alive: bool,
    /// The partitions it holds a live lease on.
    pub partitions: Vec<u32>,
}

/// A partition of [`ClusterBody::Clustered`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterPartitionBody {
    /// The partition.
    pub partition: u32,
    /// Its lease's epoch.
    pub epoch: u64,
    /// The node holding a live lease on it, if any.
    pub owner: Option<String>,
    /// Time left on its lease, in milliseconds (negative: expired).
    #[serde(default)]
    pub expires_in_ms: i64,
    /// Time since its lease was last renewed, in milliseconds.
    #[serde(default)]
    pub lease_age_ms: i64,
    /// Whether the answering node serves it.
    #[serde(default)]
    pub served_here: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn both_shapes_of_the_cluster_view_are_read() {
        let single: ClusterBody = serde_json::from_value(json!({
            "clustered": false, "message": "one node", "partitions": [0, 1]
        }))
        .unwrap();
        assert!(
            matches!(single, ClusterBody::Single { ref partitions, .. } if partitions.len() == 2)
        );
        let many: ClusterBody = serde_json::from_value(json!({
            "clustered": true, "node_id": "n1", "lease_ms": 3000, "renew_ms": 1000,
            "nodes": [{"node_id": "n1", "run_id": "r", "url": "http://a", "seen_ms_ago": 1,
                       "alive": true, "partitions": [0]}],
            "partitions": [{"partition": 0, "epoch": 2, "owner": "n1", "expires_in_ms": 1,
                            "lease_age_ms": 2, "served_here": true}]
        }))
        .unwrap();
        assert!(
            matches!(many, ClusterBody::Clustered { ref nodes, .. } if nodes[0].url == "http://a")
        );
    }

    #[test]
    fn a_wlog_conflict_carries_the_current_offset() {
        let e: ErrorBody = serde_json::from_value(
            json!({"code": "wlog_conflict", "message": "m", "current_wlog_offset": 12}),
        )
        .unwrap();
        assert_eq!(e.current_wlog_offset, Some(12));
        let plain: ErrorBody =
            serde_json::from_value(json!({"code": "busy", "message": "m"})).unwrap();
        assert_eq!(plain.current_wlog_offset, None);
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"code": "busy", "message": "m"})
        );
    }

    #[test]
    fn an_answer_with_a_field_this_client_does_not_know_is_read() {
        let e: ErrorBody =
            serde_json::from_value(json!({"code": "busy", "message": "m", "new": 1})).unwrap();
        assert_eq!(e.code, ErrorCode::Busy);
    }
}
