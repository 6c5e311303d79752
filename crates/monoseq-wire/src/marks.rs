//! What `GET /v1/marks` answers: a node's high-water marks per partition and the losses
//! accepted for the store. Nodes read each other's and merge them; an operator may compare
//! nodes with it.

use serde::{Deserialize, Serialize};

/// `GET /v1/marks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarksBody {
    /// The store (database) the marks belong to.
    pub store_id: String,
    /// Its partition count.
    pub partitions: u32,
    /// Per partition, in partition order, the highest numbers acknowledged that the node
    /// knows of.
    pub marks: Vec<MarkBody>,
    /// Losses accepted for the store, oldest first.
    #[serde(default)]
    pub losses: Vec<AcceptedLossBody>,
}

/// The high-water mark of one partition. Every field only grows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkBody {
    /// Highest acknowledged PLog offset (0: none).
    pub plog: u64,
    /// Highest WLog offset of an acknowledged event, over the partition's workspaces.
    pub wlog: u64,
    /// Highest CRecord ID created by an acknowledged event.
    pub crecord: u64,
    /// Highest ORecord/WRecord ID created by an acknowledged event.
    pub owrecord: u64,
}

/// A loss of acknowledged events that an operator accepted (`serve --accept-loss`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedLossBody {
    /// The partition.
    pub partition: u32,
    /// First lost PLog offset.
    pub plog_from: u64,
    /// Last lost PLog offset (the high-water mark at the time).
    pub plog_to: u64,
    /// The high-water mark when the loss was accepted: every number at or below it stays
    /// retired.
    pub mark: MarkBody,
    /// When the loss was accepted (Unix milliseconds).
    pub accepted_at_ms: u64,
    /// How the loss came about (absent from older nodes: an accepted loss).
    #[serde(default)]
    pub cause: LossCauseBody,
}

/// How the numbers of an [`AcceptedLossBody`] came to be retired.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LossCauseBody {
    /// An operator started with `--accept-loss` over a store that lost acknowledged events.
    #[default]
    AcceptedLoss,
    /// A restored backup was continued: what the store acknowledged after the backup is gone.
    Restore,
}
