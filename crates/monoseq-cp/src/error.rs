//! Why a command was not done, as a typed error with a stable code: what the caller can fix,
//! what heals on retry, and what is permanent. Nothing of a failed command was written, except
//! where a variant says the outcome is unknown.

use monoseq_core::ParamsError;
use monoseq_store::AppendError;

use crate::command::InvalidCommand;

/// Why a command was not done. Exhaustive: the server gives each variant its stable code, and a
/// new variant does not build until it has one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// The command is malformed.
    #[error(transparent)]
    Invalid(#[from] InvalidCommand),
    /// The workspace kind is not one of the application's.
    #[error("unknown workspace kind {0}: the application declares its workspace kinds")]
    UnknownWsKind(u16),
    /// An update names a record that does not exist.
    #[error("record {id} of workspace {ws} does not exist; create it first")]
    UnknownRecord {
        /// The workspace.
        ws: u64,
        /// The record.
        id: u64,
    },
    /// The command is too large for storage; refused before it took any number.
    #[error("{0}")]
    TooLarge(String),
    /// The partition cannot take commands now (actualizing, backlog full, queue full, or its
    /// group failed because of another command); retry after a short wait.
    #[error("server is busy: {0}; retry later")]
    Busy(String),
    /// The partition failed and is being rebuilt; it heals on its own; retry after a short wait.
    #[error("partition {partition} is unavailable: {reason}; it is being rebuilt, retry later")]
    Unavailable {
        /// The partition.
        partition: u32,
        /// What failed.
        reason: String,
    },
    /// A key the command needed already existed (trust levels 0 and 1): the partition
    /// actualized; the key is named.
    #[error("{0}")]
    SequenceViolation(String),
    /// A sequence reached its largest number: permanent, a retry cannot help.
    #[error("{0}; no more numbers can be handed out there")]
    Exhausted(String),
    /// Stored bytes the command needed are damaged: permanent until restored.
    #[error("{0}")]
    Corrupted(String),
    /// The idempotency key was used before with another request body.
    #[error(
        "idempotency key {key:?} was already used with a different request; use a new key for \
         a new request"
    )]
    KeyReused {
        /// The key.
        key: String,
    },
    /// The idempotency key is not acceptable.
    #[error("{0}")]
    InvalidKey(String),
    /// Storage failed; nothing was acknowledged, though the event may have been written (a
    /// retry with the same idempotency key is safe). Retry later.
    #[error("storage unavailable: {0}; retry later")]
    Storage(String),
    /// The command carried an expected WLog offset and its workspace's WLog does not end
    /// there: nothing was written and no number taken. Read the workspace's WLog up to
    /// `current`, decide again, and resend expecting `current`.
    #[error(
        "the WLog of workspace {ws} ends at offset {current}, not at the expected \
         {expected}; nothing was written: read the workspace's WLog up to {current} and resend \
         with expected_wlog_offset {current} if the command still holds"
    )]
    WlogConflict {
        /// The workspace.
        ws: u64,
        /// The offset the command expected.
        expected: u64,
        /// The WLog offset of the workspace's last event (0: none yet).
        current: u64,
    },
    /// The processor is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// This processor does not serve the command's partition (another node owns it, or its
    /// ownership is moving); nothing was written. Send it to the owner.
    #[error("partition {partition} is not served by this node; send the command to its owner")]
    NotOwner {
        /// The partition.
        partition: u32,
    },
}

impl CommandError {
    /// What kind of failure this is, for a caller choosing how to answer (the server maps it
    /// to an HTTP status).
    #[must_use]
    pub fn class(&self) -> ErrorClass {
        match self {
            CommandError::Invalid(_)
            | CommandError::UnknownWsKind(_)
            | CommandError::InvalidKey(_) => ErrorClass::Invalid,
            CommandError::UnknownRecord { .. } => ErrorClass::NotFound,
            CommandError::SequenceViolation(_)
            | CommandError::Exhausted(_)
            | CommandError::WlogConflict { .. } => ErrorClass::Conflict,
            CommandError::TooLarge(_) => ErrorClass::TooLarge,
            CommandError::KeyReused { .. } => ErrorClass::Unprocessable,
            CommandError::Corrupted(_) => ErrorClass::Damaged,
            CommandError::Busy(_)
            | CommandError::Unavailable { .. }
            | CommandError::Storage(_)
            | CommandError::ShuttingDown
            | CommandError::NotOwner { .. } => ErrorClass::Transient,
        }
    }

    /// With [`CommandError::WlogConflict`]: the WLog offset the workspace's WLog ends at.
    #[must_use]
    pub fn current_wlog_offset(&self) -> Option<u64> {
        match self {
            CommandError::WlogConflict { current, .. } => Some(*current),
            _ => None,
        }
    }

    /// Whether retrying the same command later can succeed.
    #[must_use]
    pub fn is_transient(&self) -> bool {
        self.class() == ErrorClass::Transient
    }

    /// The error for a group write that failed because of this command, or `None` when the
    /// failure concerns the whole group (a storage fault).
    pub(crate) fn of_append(e: &AppendError) -> Option<(usize, CommandError)> {
        match e {
            AppendError::SequenceViolation { event_index, .. }
            | AppendError::NotAtEnd { event_index, .. } => {
                Some((*event_index, CommandError::SequenceViolation(chain(e))))
            }
            AppendError::TooLarge { event_index, .. } | AppendError::Encode { event_index, .. } => {
                Some((*event_index, CommandError::TooLarge(chain(e))))
            }
            AppendError::UnknownRecord {
                event_index,
                ws,
                id,
                ..
            } => Some((
                *event_index,
                CommandError::UnknownRecord { ws: ws.0, id: id.0 },
            )),
            _ => None,
        }
    }
}

/// The kinds of [`CommandError`], by what the caller can do about them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The command is malformed: fix it.
    Invalid,
    /// Something the command names does not exist.
    NotFound,
    /// The command conflicts with stored state (a sequence violation, an exhausted sequence,
    /// or a WLog that does not end at the expected offset); retrying the same command does
    /// not help.
    Conflict,
    /// The command is over a limit.
    TooLarge,
    /// Well-formed but refused (an idempotency key reused with another command).
    Unprocessable,
    /// Stored data is damaged.
    Damaged,
    /// Retrying later can succeed.
    Transient,
}

/// Why the processor could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The partition count is 0 or above [`crate::PARTITIONS_MAX`].
    #[error("partitions must be between 1 and {max}, got {0}", max = crate::PARTITIONS_MAX)]
    Partitions(u32),
    /// A zero group size, queue depth or window.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// The sequencer refused its parameters.
    #[error("the sequencer refused its parameters")]
    Params(#[from] ParamsError),
    /// The high-water marks do not fit the partitions.
    #[error("high-water marks: {0}")]
    Marks(String),
}

/// The storage lost events a partition acknowledged: its stored PLog ends below its
/// high-water mark, and serving would hand the lost events' numbers out again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the storage lost acknowledged events of partition {partition}: PLog offsets up to {acked} \
     were acknowledged, the stored PLog now ends at {end} (a database failover to a standby \
     that was behind, or a restored backup?)"
)]
pub struct LostEvents {
    /// The partition.
    pub partition: u32,
    /// The highest PLog offset it acknowledged.
    pub acked: u64,
    /// The last PLog offset stored now.
    pub end: u64,
}

/// Why a step of a partition's start or recovery failed (the lifecycle retries it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StepError {
    /// Reading the PLog failed: the read's error, with its causes.
    #[error("{0}")]
    Read(String),
    /// Syncing the store or raising the high-water mark failed, with the causes.
    #[error("raising the high-water mark failed: {0}")]
    Raise(String),
    /// The thread the read ran on was lost.
    #[error("the reading thread was lost: {0}")]
    ThreadLost(String),
    /// The partition's writer was lost (a group's thread was).
    #[error("the writer was lost")]
    WriterLost,
    /// The storage failed fatally (a poisoned store or PLog: no write can succeed until the
    /// server is restarted), with the causes.
    #[error("{0}")]
    Fatal(String),
}

/// A command refused before it took any number because its event or records would not fit
/// the storage's limits (`e`, from a check of the command alone, names its event 0).
pub(crate) fn too_large(e: &AppendError) -> CommandError {
    CommandError::TooLarge(match e {
        AppendError::TooLarge { what, len, max, .. } => format!(
            "the command: {what:?} is {len} bytes, over the storage limit of {max}; make the \
             command smaller"
        ),
        AppendError::Encode { source, .. } => {
            format!("the command cannot be encoded: {}", chain(source))
        }
        other => chain(other),
    })
}

pub(crate) use monoseq_kv::chain;

#[cfg(test)]
mod tests {
    use monoseq_kv::Oversized;
    use monoseq_store::AppendError;

    use super::{CommandError, too_large};

    #[test]
    fn a_command_too_large_is_named_as_the_command_not_as_an_event_of_a_group() {
        let e = AppendError::TooLarge {
            event_index: 0,
            what: Oversized::Value,
            len: 10,
            max: 5,
        };
        assert_eq!(
            too_large(&e),
            CommandError::TooLarge(
                "the command: Value is 10 bytes, over the storage limit of 5; make the command \
                 smaller"
                    .into()
            )
        );
    }
}
