//! Consumer positions: `GET` and `PUT /v1/consumers/{name}/partitions/{p}`, the listing
//! `GET /v1/consumers/{name}`, and the `409` a refused compare-and-set answers.
//!
//! A position is the PLog offset up to which the consumer has processed the partition (0:
//! nothing yet). A `PUT` is a compare-and-set on the stored position: it names the position
//! it read (`expected`; absent: none is stored yet), and never moves it back unless it says
//! `force`.

use serde::{Deserialize, Serialize};

/// The stable code of a `409` whose `expected` position is not the one stored.
pub const POSITION_CONFLICT: &str = "position_conflict";
/// The stable code of a `409` refusing to move a position back without `force`.
pub const POSITION_BACKWARDS: &str = "position_backwards";
/// The stable code of a `404` for a consumer without a position (on that partition).
pub const UNKNOWN_CONSUMER: &str = "unknown_consumer";

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
}
