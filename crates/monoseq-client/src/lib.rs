//! monoseq-client: the Rust client of monoseq's HTTP API. Owns what every caller would
//! otherwise write by hand: typed commands and answers (the server's own wire types,
//! `monoseq-wire`), retries that are safe (one `Idempotency-Key` per logical command, reused
//! on every retry; `Retry-After` honoured, with jittered backoff), and, given several nodes,
//! sending each command to its partition's owner (learned from `/v1/cluster` and from 307
//! redirects, refreshed on `not_owner`, a redirect or a refused connection). A command may
//! carry an append condition (`CommandBody::with_expected_wlog_offset`); a refusal on it is
//! [`ClientError::WlogConflict`] with the workspace's current WLog offset. Reads: events,
//! WLog pages as a stream, records, partition pages and live tails ([`Client::follow`]);
//! consumer positions, set by compare-and-set; a consumer group's member
//! ([`Client::join_group`]); named sequences ([`SequencesClient`]). It
//! depends on an HTTP client, the wire types and the named-sequence domain only: no server
//! framework, no storage engine, no database driver (the architecture test holds it to
//! that). Each attempt
//! (status or error, and its time) and each wait before a retry is logged at debug level
//! through `tracing`.
//!
//! # Example
//!
//! ```no_run
//! use monoseq_client::{Client, CommandBody, KindBody, NewRecordBody};
//!
//! # async fn run() -> Result<(), monoseq_client::ClientError> {
//! let client = Client::builder(["http://127.0.0.1:8080"]).build()?;
//! let mut order = CommandBody::new(7, 1, "app.CreateOrder");
//! order.create.push(NewRecordBody::new(1, KindBody::CDoc, "app.Order"));
//! let done = client.submit(&order).await?; // retried with the same key until answered
//! let event = client.event(done.outcome.partition, done.outcome.plog_offset).await?;
//! # let _ = event;
//! # Ok(())
//! # }
//! ```

#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod batch;
mod builder;
mod client;
mod error;
mod follow;
mod group;
mod key;
mod positions;
mod routing;
mod sequences;

pub use builder::{
    BACKOFF_FIRST_DEFAULT, BACKOFF_MAX_DEFAULT, CONNECT_TIMEOUT_DEFAULT, ClientBuilder,
    IDLE_TIMEOUT_DEFAULT, REQUEST_TIMEOUT_DEFAULT, RETRY_TIMEOUT_DEFAULT, VIEW_MAX_AGE_DEFAULT,
};
pub use client::{BACKUP_TIMEOUT, Client, Submitted};
pub use error::ClientError;
pub use follow::{FOLLOW_IDLE_MAX, FollowItem, SSE_MESSAGE_MAX, StoredEntry, StoredPage};
pub use group::{GroupCommitter, GroupConsumer, GroupItem, GroupOptions};
pub use key::new_idempotency_key;
pub use monoseq_wire::{
    ArgBody, BATCH_COMMANDS_MAX, BackupBody, BackupRequestBody, BatchCommandBody, BatchResultBody,
    ClusterBody, CommandBody, EVENTS_BINARY, ErrorBody, ErrorCode, EventBody, EventsPageError,
    GapBody, InfoBody, KindBody, NewArgBody, NewRecordBody, OutcomeBody, PlogEntryBody,
    PlogPageBody, RecordBody, RecordUpdateBody, StoredKindBody,
};
pub use monoseq_wire::{
    AssignedBody, AssignedPartitionBody, GroupBody, JoinedBody, ProgressBody, RevokedBody,
};
pub use monoseq_wire::{
    ConsumerBody, ConsumerPartitionBody, ConsumersBody, DeletedConsumerBody, PartitionPositionBody,
    PositionBody, PositionsBody, PutPositionBody, RemovedPositionBody,
};
pub use sequences::{SEQUENCES_GRACE, SequencesClient, SequencesError};
