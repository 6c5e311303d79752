//! Streams over many partitions and consumer groups.
//!
//! `GET /v1/events/stream` (a **subscription**) and `GET /v1/groups/{g}/stream` (a group
//! member's **session**) are Server-Sent Events streams whose messages carry their partition:
//! `event` ([`TaggedEventBody`]), `gap` ([`TaggedGapBody`]), `progress` ([`ProgressBody`]:
//! how far a partition has been read, filtered-out events included), `heartbeat`
//! ([`StreamHeartbeatBody`]). A session adds `joined` ([`JoinedBody`]), `assigned`
//! ([`AssignedBody`]), `revoked` ([`RevokedBody`]) and `session_ended`
//! ([`SessionEndedBody`]). A member commits with `POST /v1/groups/{g}/commit`
//! ([`CommitBody`]), refused `409 stale_generation` ([`StaleGenerationBody`]) when it no
//! longer holds the partition.

use serde::{Deserialize, Serialize};

use crate::consume::GapBody;

/// SSE event name of how far a partition was read (filtered-out events included).
pub const SSE_PROGRESS: &str = "progress";
/// SSE event name of a session's start.
pub const SSE_JOINED: &str = "joined";
/// SSE event name of partitions given to a member.
pub const SSE_ASSIGNED: &str = "assigned";
/// SSE event name of partitions taken from a member.
pub const SSE_REVOKED: &str = "revoked";
/// SSE event name of a session's last message.
pub const SSE_SESSION_ENDED: &str = "session_ended";
/// The stable code of a commit from a session that does not hold the partition.
pub const STALE_GENERATION: &str = "stale_generation";
/// The stable code of a heartbeat or leave naming a session no node hosts (it ended).
pub const UNKNOWN_SESSION: &str = "unknown_session";
/// The stable code of a `503` to a heartbeat or leave sent to another node than the one hosting
/// the session, which did not answer when the request was relayed to it.
pub const HOST_UNREACHABLE: &str = "host_unreachable";
/// The stable code of a join refused because the group is full.
pub const GROUP_FULL: &str = "group_full";
/// The stable code of a `404` for a group that does not exist.
pub const UNKNOWN_GROUP: &str = "unknown_group";

/// `event` message of a multi-partition stream: an event with its partition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaggedEventBody<E = crate::EventBody> {
    /// The event's partition.
    pub partition: u32,
    /// The event (its `plog_offset` is its offset in the partition).
    pub event: E,
}

/// `gap` message of a multi-partition stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaggedGapBody {
    /// The gap's partition.
    pub partition: u32,
    /// The retired range.
    pub gap: GapBody,
}

/// `progress` message: everything of `partition` below `next` was read (delivered or filtered
/// out), so a consumer may store `next - 1` as its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgressBody {
    /// The partition.
    pub partition: u32,
    /// The next offset the stream will read there.
    pub next: u64,
}

/// `heartbeat` message of a multi-partition stream: sent while nothing else is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHeartbeatBody {
    /// The resume vector (`partition:offset` pairs, comma-separated): what `from=` (or
    /// `Last-Event-ID`) takes to resume after everything delivered so far.
    pub resume: String,
}

/// `joined` message, the first of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinedBody {
    /// The group.
    pub group: String,
    /// The member's name.
    pub member: String,
    /// This session's identifier: heartbeats, commits and the leave name it.
    pub session: String,
    /// The session timeout, milliseconds: without a heartbeat or commit for this long, the
    /// session ends and its partitions go to other members.
    pub session_timeout_ms: u64,
    /// How often to send a heartbeat, milliseconds (a third of the timeout).
    pub heartbeat_ms: u64,
}

/// One partition given to a member, with where its delivery starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedPartitionBody {
    /// The partition.
    pub partition: u32,
    /// The group's committed position there (0: nothing yet): delivery starts after it.
    pub position: u64,
}

/// `assigned` message: partitions now held by this member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignedBody {
    /// The group's generation; commits carry it.
    pub generation: u64,
    /// The partitions given, each with the position delivery starts after.
    pub partitions: Vec<AssignedPartitionBody>,
}

/// `revoked` message: partitions this member no longer holds. Nothing more of them is
/// delivered, and commits on them are refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevokedBody {
    /// The group's generation.
    pub generation: u64,
    /// The partitions taken.
    pub partitions: Vec<u32>,
}

/// `session_ended` message, the last of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionEndedBody {
    /// `session_expired` (no heartbeat within the timeout), `replaced` (a new session of the
    /// same member name took over), `left` or `server_stopping`.
    pub reason: String,
    /// What happened and what to do.
    pub message: String,
}

/// A session named by a heartbeat or a leave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionBody {
    /// The session, as `joined` named it.
    pub session: String,
}

/// One position of a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitPositionBody {
    /// The partition.
    #[serde(deserialize_with = "crate::whole::number")]
    pub partition: u32,
    /// The offset processed.
    #[serde(deserialize_with = "crate::whole::number")]
    pub offset: u64,
}

/// The body of `POST /v1/groups/{g}/commit`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitBody {
    /// The committing session.
    pub session: String,
    /// The generation of the member's latest `assigned` message.
    #[serde(deserialize_with = "crate::whole::number")]
    pub generation: u64,
    /// The positions, at most one per partition.
    pub positions: Vec<CommitPositionBody>,
}

/// `409 stale_generation`: the session does not hold `partition`; nothing of the commit from
/// that partition on was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StaleGenerationBody {
    /// [`STALE_GENERATION`].
    pub code: String,
    /// What happened and what to do.
    pub message: String,
    /// The partition refused.
    pub partition: u32,
    /// The positions of the commit that were stored before it.
    pub committed: Vec<CommitPositionBody>,
}

/// One member of `GET /v1/groups/{g}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMemberBody {
    /// The member's name.
    pub member: String,
    /// Its session.
    pub session: String,
    /// The node hosting its stream.
    pub node: String,
    /// Its session timeout, milliseconds.
    pub session_timeout_ms: u64,
    /// Whether it is giving up its partitions.
    pub leaving: bool,
    /// The partitions it holds.
    pub partitions: Vec<u32>,
}

/// One partition of `GET /v1/groups/{g}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPartitionBody {
    /// The partition.
    pub partition: u32,
    /// The holding member's name (`null`: nobody).
    pub member: Option<String>,
    /// `free`, `held` or `revoking`.
    pub state: String,
    /// The group's position (0: nothing processed).
    pub offset: u64,
    /// The partition's end (the next offset to be written); `null` when it could not be read.
    pub end: Option<u64>,
    /// Events written after the position; `null` when the end could not be read.
    pub lag: Option<u64>,
}

/// `GET /v1/groups/{g}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupBody {
    /// The group.
    pub group: String,
    /// Its generation.
    pub generation: u64,
    /// Its members.
    pub members: Vec<GroupMemberBody>,
    /// Every partition, in order.
    pub partitions: Vec<GroupPartitionBody>,
}

/// One group of `GET /v1/groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupSummaryBody {
    /// The group.
    pub group: String,
    /// Its generation.
    pub generation: u64,
    /// Its member count.
    pub members: usize,
}

/// `GET /v1/groups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupsBody {
    /// The groups, in name order.
    pub groups: Vec<GroupSummaryBody>,
    /// Whether more exist than listed.
    pub truncated: bool,
}
