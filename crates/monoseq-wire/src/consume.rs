//! What the consumer side of the log carries: a page of a partition's PLog with its end, the
//! gap entries that stand for retired ranges, and the messages of a live tail (Server-Sent
//! Events: `event`, `gap`, `heartbeat`, `slow_follower`).

use serde::{Deserialize, Serialize};

use crate::ErrorCode;

use crate::answers::EventBody;

/// Most entries one `GET /v1/partitions/{p}/events` answers (`limit` at most this).
pub const PLOG_PAGE_MAX: usize = 1_000;
/// Longest `wait_ms` of a long-polling page read, in milliseconds.
pub const WAIT_MS_MAX: u64 = 60_000;

/// SSE event name of a stored event (`id:` is its offset).
pub const SSE_EVENT: &str = "event";
/// SSE event name of a retired range (`id:` is its last offset).
pub const SSE_GAP: &str = "gap";
/// SSE event name of the message sent while idle (with the end).
pub const SSE_HEARTBEAT: &str = "heartbeat";
/// SSE event name of the last message to a follower that fell too far behind.
pub const SSE_SLOW_FOLLOWER: &str = "slow_follower";

/// A range of offsets that were retired (by an operator's accepted loss or a restored backup):
/// no event is, or will ever be, delivered there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GapBody {
    /// First retired offset delivered (the asked offset when the read started inside).
    pub from: u64,
    /// Last retired offset (inclusive).
    pub to: u64,
    /// `accepted_loss` or `restore` (PLog), `retired` (a WLog's numbers).
    pub reason: String,
}

/// One entry of a page: an event, or a gap. `E` is how the event is carried: a client decodes
/// an [`EventBody`]; a server may write its stored events through a type of its own that
/// encodes to the same JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PlogEntryBody<E = EventBody> {
    /// A retired range in its place: `{"gap": {...}}`.
    Gap {
        /// The range.
        gap: GapBody,
    },
    /// An event.
    Event(Box<E>),
}

/// `GET /v1/partitions/{p}/events`: consecutive entries of a partition's PLog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlogPageBody<E = EventBody> {
    /// From the asked offset on, in offset order, at most `limit`; fewer (or none) at the end.
    pub events: Vec<PlogEntryBody<E>>,
    /// The offset to ask for next: after the last entry, or the asked one.
    pub next: u64,
    /// The partition's end: the next offset to be written; every offset below it is final.
    pub end: u64,
}

/// `heartbeat` message of a live tail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatBody {
    /// The next offset this follower will receive.
    pub next: u64,
    /// The end of the followed log as the server knows it now: the partition's PLog end, or
    /// on a workspace's tail its WLog's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

/// `slow_follower` message: the last one of a stream that fell behind its bounded buffer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlowFollowerBody {
    /// Always `slow_follower`.
    pub code: ErrorCode,
    /// What happened and what to do.
    pub message: String,
    /// Where to resume (with `from=` or `Last-Event-ID`): nothing from there on was delivered.
    pub resume_from: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_page_reads_events_and_gaps_in_their_order() {
        let page: PlogPageBody = serde_json::from_value(json!({
            "events": [
                {"plog_offset": 4, "ws": 1, "ws_kind": 1, "wlog_offset": 4,
                 "registered_at_ms": 1, "command": "c", "argument": null, "created": [],
                 "updated": [], "idempotency_key": null},
                {"gap": {"from": 5, "to": 9, "reason": "accepted_loss"}}
            ],
            "next": 10, "end": 12
        }))
        .unwrap();
        assert!(matches!(&page.events[0], PlogEntryBody::Event(e) if e.plog_offset == 4));
        assert!(matches!(&page.events[1], PlogEntryBody::Gap { gap } if gap.to == 9));
        let back = serde_json::to_value(&page).unwrap();
        assert_eq!(back["events"][1]["gap"]["from"], 5);
    }
}
