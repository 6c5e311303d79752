//! monoseq-wire: the JSON bodies of monoseq's HTTP API, shared by the server (`monoseq serve`)
//! and its client (`monoseq-client`), and the binary encoding of a PLog page (`events_bin`:
//! each event as the bytes the server stores for it). Owns the wire format — field names, defaults, which
//! request fields are refused — and nothing else: no HTTP, no I/O, no domain logic. The server
//! converts these to and from the command processor's types, so the wire can change without
//! touching the domain, and the domain without breaking clients.
//!
//! Requests refuse unknown fields (a typo is an error, not a silently ignored field); answers
//! accept them, so an older client reads a newer server's answers.
//!
//! # Example
//!
//! ```
//! use monoseq_wire::{CommandBody, KindBody, NewRecordBody};
//!
//! let mut command = CommandBody::new(7, 1, "app.CreateOrder");
//! command.create.push(NewRecordBody::new(1, KindBody::CDoc, "app.Order"));
//! let json = serde_json::to_value(&command).expect("serializes");
//! assert_eq!(json["create"][0]["kind"], "CDoc");
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod admin;
mod answers;
mod batch;
mod codes;
mod command;
mod consume;
mod events_bin;
mod groups;
mod marks;
mod positions;
mod sequences;
pub mod whole;

pub use admin::{BackupBody, BackupRequestBody};
pub use answers::{
    ArgBody, ArgJson, ClusterBody, ClusterNodeBody, ClusterPartitionBody, ErrorBody, EventBody,
    EventJson, InfoBody, NotReadyBody, NotReadyPartitionBody, RecordBody, RecordJson,
    StoredKindBody, TokenScopeBody, WlogPageBody,
};
pub use batch::{
    BATCH_COMMANDS_MAX, BatchAnswerBody, BatchBody, BatchCommandBody, BatchResultBody, RawBatchBody,
};
pub use codes::ErrorCode;
pub use command::{
    CommandBody, KindBody, NewArgBody, NewRecordBody, OutcomeBody, RecordUpdateBody, partition_of,
};
pub use consume::{
    GapBody, HeartbeatBody, PLOG_PAGE_MAX, PlogEntryBody, PlogPageBody, SSE_EVENT, SSE_GAP,
    SSE_HEARTBEAT, SSE_SLOW_FOLLOWER, SlowFollowerBody, WAIT_MS_MAX,
};
pub use events_bin::{
    EVENTS_BINARY, EVENTS_HEADER_BYTES, EVENTS_MAGIC, EVENTS_VERSION, EventsEntry, EventsPage,
    EventsPageError, EventsPageWriter,
};
pub use groups::{
    AssignedBody, AssignedPartitionBody, CommitBody, CommitPositionBody, GroupBody,
    GroupMemberBody, GroupPartitionBody, GroupSummaryBody, GroupsBody, JoinedBody, ProgressBody,
    RevokedBody, SSE_ASSIGNED, SSE_JOINED, SSE_PROGRESS, SSE_REVOKED, SSE_SESSION_ENDED,
    SessionBody, SessionEndedBody, StaleGenerationBody, StreamHeartbeatBody, TaggedEventBody,
    TaggedGapBody,
};
pub use marks::{AcceptedLossBody, LossCauseBody, MarkBody, MarksBody};
pub use positions::{
    CONSUMERS_PAGE_POSITIONS_MAX, ConsumerBody, ConsumerPartitionBody, ConsumersBody,
    DeletedConsumerBody, PartitionPositionBody, PositionBeyondEndBody, PositionBody,
    PositionConflictBody, PositionsBody, PutPositionBody, RemovedPositionBody,
};
pub use sequences::{
    Checked, NextRequestBody, ResetRequestBody, SequenceExistsBody, SequenceValueBody,
};

/// The request header that makes a command safe to retry (IETF httpapi idempotency-key draft).
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// Set to `true` on an answer repeated for a retry with the same key.
pub const IDEMPOTENCY_REPLAYED: &str = "idempotency-replayed";
/// Longest `Idempotency-Key` accepted, in bytes (printable ASCII).
pub const IDEMPOTENCY_KEY_BYTES_MAX: usize = 255;
/// Most events one `GET /v1/workspaces/{ws}/wlog` answers (`limit` at most this).
pub const WLOG_PAGE_MAX: usize = 1_000;
