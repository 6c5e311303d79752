//! Consumer positions: `GET` and `PUT /v1/consumers/{name}/partitions/{p}`, the listings
//! `GET /v1/consumers/{name}` and `GET /v1/consumers`, `DELETE /v1/consumers/{name}`, and the
//! `409`s a refused compare-and-set answers.
//!
//! A position is the PLog offset up to which the consumer has processed the partition (0:
//! nothing yet). A `PUT` is a compare-and-set on the stored position: it names the position
//! it read (`expected`; absent: none is stored yet), never moves it back unless it says
//! `force`, and never sets it at or beyond the partition's end (the next PLog offset to be
//! written), whatever `force` says. A consumer's lag on a partition is the number of events
//! written after its position: `end - 1 - offset`.

use serde::{Deserialize, Serialize};

/// The stable code of a `409` whose `expected` position is not the one stored.
pub const POSITION_CONFLICT: &str = "position_conflict";
/// The stable code of a `409` refusing to move a position back without `force`.
pub const POSITION_BACKWARDS: &str = "position_backwards";
/// The stable code of a `404` for a consumer without a position (on that partition).
pub const UNKNOWN_CONSUMER: &str = "unknown_consumer";
/// The stable code of a `409` refusing a position at or beyond the partition's end.
pub const POSITION_BEYOND_END: &str = "position_beyond_end";
/// The stable code of a `409` to a `DELETE` of a consumer whose positions kept being set
/// while they were deleted (stop the consumer, then delete it again).
pub const CONSUMER_ACTIVE: &str = "consumer_active";
/// The stable code of a `409` to a `PUT` or `DELETE` of a consumer group's position while a
/// member of the group holds the partition: only the member's commits move it then.
pub const PARTITION_HELD: &str = "partition_held";
/// Most positions one page of `GET /v1/consumers` lists; past it the page says `truncated`.
pub const CONSUMERS_PAGE_POSITIONS_MAX: usize = 1_000;

/// A consumer's position on a partition: the answer of `GET` and of a successful `PUT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionBody {
    /// The PLog offset the consumer has processed (0: nothing yet).
    pub offset: u64,
}

/// The body of `PUT /v1/consumers/{name}/partitions/{p}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutPositionBody {
    /// The new position.
    #[serde(deserialize_with = "crate::whole::number")]
    pub offset: u64,
    /// The position the writer read; the write happens only if it is still stored. Absent
    /// (or `null`): only when the consumer has no position on the partition yet.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::whole::optional"
    )]
    pub expected: Option<u64>,
    /// Allows `offset` below `expected` (a consumer rewinding to read again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force: bool,
}

/// The body of a `409` to a `PUT`: [`POSITION_CONFLICT`] or [`POSITION_BACKWARDS`], with the
/// position stored when it was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionConflictBody {
    /// [`POSITION_CONFLICT`] or [`POSITION_BACKWARDS`].
    pub code: String,
    /// What happened and what to do.
    pub message: String,
    /// The stored position (`null`: the consumer has none on the partition).
    pub current: Option<u64>,
}

/// `GET /v1/consumers/{name}`: every position of one consumer, in partition order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionsBody {
    /// The consumer.
    pub consumer: String,
    /// Its positions, one per partition it has set one on.
    pub partitions: Vec<PartitionPositionBody>,
}

/// One entry of [`PositionsBody`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPositionBody {
    /// The partition.
    pub partition: u32,
    /// The PLog offset processed.
    pub offset: u64,
}

/// The body of a `409` [`POSITION_BEYOND_END`]: the partition's end when the position was
/// refused. The largest position the partition takes is `end - 1` (its last event).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PositionBeyondEndBody {
    /// [`POSITION_BEYOND_END`].
    pub code: String,
    /// What happened and what to do.
    pub message: String,
    /// The partition's end: the next PLog offset to be written.
    pub end: u64,
}

/// `GET /v1/consumers[?after=NAME]`: every consumer's positions with each partition's end
/// and the consumer's lag, in name then partition order, at most
/// [`CONSUMERS_PAGE_POSITIONS_MAX`] positions a page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumersBody {
    /// The consumers of this page.
    pub consumers: Vec<ConsumerBody>,
    /// More positions are stored after this page: ask again with `after=` the last name
    /// listed (its listing may itself be cut when it alone has more positions than a page
    /// holds; `GET /v1/consumers/{name}` lists all of them).
    pub truncated: bool,
}

/// One consumer of [`ConsumersBody`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerBody {
    /// The consumer's name.
    pub name: String,
    /// Its positions, one per partition it has set one on.
    pub partitions: Vec<ConsumerPartitionBody>,
}

/// A consumer's position on one partition, with the partition's end and the lag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerPartitionBody {
    /// The partition.
    pub partition: u32,
    /// The PLog offset processed (0: nothing yet).
    pub offset: u64,
    /// The partition's end, the next PLog offset to be written (as its owner knows it);
    /// `null` when no node could tell (the partition is moving between nodes).
    pub end: Option<u64>,
    /// Events written after the position: `end - 1 - offset` (0 when the consumer is at the
    /// end); `null` with `end`.
    pub lag: Option<u64>,
}

/// The answer to `DELETE /v1/consumers/{name}`: what was deleted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeletedConsumerBody {
    /// The consumer.
    pub consumer: String,
    /// Its positions as they were when deleted, in partition order.
    pub removed: Vec<RemovedPositionBody>,
}

/// One position [`DeletedConsumerBody`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemovedPositionBody {
    /// The partition.
    pub partition: u32,
    /// The position deleted (`null`: its stored bytes were damaged).
    pub offset: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_put_without_expected_or_force_leaves_them_out_and_refuses_unknown_fields() {
        let first = PutPositionBody {
            offset: 3,
            expected: None,
            force: false,
        };
        assert_eq!(serde_json::to_string(&first).unwrap(), r#"{"offset":3}"#);
        let read: PutPositionBody =
            serde_json::from_str(r#"{"offset":3,"expected":null}"#).unwrap();
        assert_eq!(read, first);
        assert!(serde_json::from_str::<PutPositionBody>(r#"{"offset":3,"expectd":1}"#).is_err());
        assert!(serde_json::from_str::<PutPositionBody>(r#"{"offset":-1}"#).is_err());
        assert!(serde_json::from_str::<PutPositionBody>(r#"{"offset":"7"}"#).is_err());
    }

    #[test]
    fn a_conflict_names_no_position_as_null() {
        let body = PositionConflictBody {
            code: POSITION_CONFLICT.into(),
            message: "m".into(),
            current: None,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"code": "position_conflict", "message": "m", "current": null})
        );
    }

    #[test]
    fn a_listed_position_whose_end_is_unknown_says_null_for_end_and_lag() {
        let body = ConsumersBody {
            consumers: vec![ConsumerBody {
                name: "g".into(),
                partitions: vec![
                    ConsumerPartitionBody {
                        partition: 0,
                        offset: 5,
                        end: Some(9),
                        lag: Some(3),
                    },
                    ConsumerPartitionBody {
                        partition: 1,
                        offset: 0,
                        end: None,
                        lag: None,
                    },
                ],
            }],
            truncated: false,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({"consumers": [{"name": "g", "partitions": [
                {"partition": 0, "offset": 5, "end": 9, "lag": 3},
                {"partition": 1, "offset": 0, "end": null, "lag": null}
            ]}], "truncated": false})
        );
    }
}
