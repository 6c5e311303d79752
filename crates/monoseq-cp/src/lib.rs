//! monoseq command processor: validates commands, routes each to its partition
//! (`workspace ID mod partitions`), runs the sequencing transaction around a group-committed
//! event write, and answers with the PLog offset, the WLog offset and the real IDs of the
//! command's raw IDs.
//!
//! No client is told "done" before its event is durable, and the persisted sequence state
//! never gets ahead of the durable PLog: numbers of a group are committed as pending and reach
//! the sequencer's backlog only once the group's batch is written.

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod acked;
mod command;
mod error;
mod idempotency;
mod lifecycle;
#[cfg(feature = "simulation")]
mod manual;
mod outcome;
mod partition;
mod processor;
mod recent;
mod table;
mod threads;
mod writer;

pub use command::{
    ARG_DEPTH_MAX, COMMAND_RECORDS_MAX, Command, InvalidCommand, KindName, NewArg, NewRecord,
    RAW_ID_MAX, RAW_REF_KEY, RecordUpdate,
};
pub use error::{CommandError, ConfigError, ErrorClass, LostEvents, StepError};
pub use idempotency::{
    IDEMPOTENCY_KEY_BYTES_MAX, IDEMPOTENCY_WINDOW_EVENTS_DEFAULT, IdempotencyKey,
};
pub use lifecycle::{
    ACTUALIZE_WAIT, Action, Actualization, End, GroupOutcome, Input, Lifecycle, PartitionState,
    REBUILD_DELAY_MAX, REBUILD_DELAY_MIN, RETRY_WAIT,
};
#[cfg(feature = "simulation")]
pub use manual::{Answer, ManualPartition, operation_command, operation_key};
pub use outcome::{GroupObserver, Outcome};
pub use processor::{
    BACKLOG_VALUES_MAX_DEFAULT, CommandProcessor, Config, FLUSH_DELAY_DEFAULT,
    GROUP_COMMANDS_MAX_DEFAULT, PARTITION_THREADS_MAX_DEFAULT, PARTITIONS_MAX, ProcessorStats,
    QUEUE_COMMANDS_MAX_DEFAULT, RETRY_AFTER_SECS, Unready, writer_threads_default,
};
pub use recent::RECENT_RECORDS_BYTES_DEFAULT;
pub use table::{Held, Partitions};
