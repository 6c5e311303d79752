//! [`ClientError`]: what a call through the client can end with, after its retries.

use monoseq_wire::{ErrorBody, ErrorCode};

/// A call through [`crate::Client`] failed (after the retries its kind allows).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error: its status, stable code and message. A 503 here
    /// means the retries ran out of time (`ClientBuilder::retry_timeout`).
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The command carried an expected WLog offset
    /// ([`CommandBody::expected_wlog_offset`](crate::CommandBody::expected_wlog_offset)) and
    /// its workspace's WLog ends elsewhere: it was not applied and took no number (HTTP 409,
    /// `wlog_conflict`). Read the workspace's events up to `current_wlog_offset`
    /// ([`crate::Client::wlog`]), decide again, and resend expecting it (with a new
    /// idempotency key, or the same one: a refusal is not remembered).
    #[error("{message} (wlog_conflict, HTTP 409)")]
    WlogConflict {
        /// The WLog offset the workspace's WLog ends at: its last event's (0: none yet).
        current_wlog_offset: u64,
        /// The server's message.
        message: String,
    },
    /// No answer (connection refused, reset, timed out) on the last attempt. A command may or
    /// may not have been applied: send it again with the same `Idempotency-Key`
    /// ([`crate::Client::submit_with_key`]) and it is applied at most once.
    #[error("no answer from the server; check that it runs and is reachable")]
    Transport(#[source] reqwest::Error),
    /// A command of a batch without an idempotency key got no answer from `node` (connection
    /// lost, timed out): it may or may not have run, so it was not sent again.
    #[error(
        "no answer from {node} for this command of a batch ({reason}); it may have run: send \
         commands with an idempotency key to have them retried safely"
    )]
    Unanswered {
        /// The node the batch went to.
        node: String,
        /// Why there was no answer.
        reason: String,
    },
    /// A position's compare-and-set was refused (HTTP 409): `position_conflict` when the stored
    /// position is not the one expected, `position_backwards` when the new one is below it
    /// and not forced. Read the position (`current` is what was stored) and decide again.
    #[error("{message} ({code}, HTTP 409)")]
    PositionConflict {
        /// [`ErrorCode::PositionConflict`] or [`ErrorCode::PositionBackwards`].
        code: ErrorCode,
        /// The server's message.
        message: String,
        /// The stored position (`None`: the consumer has none on the partition).
        current: Option<u64>,
    },
    /// A position at or beyond the partition's end was refused (HTTP 409,
    /// `position_beyond_end`), forced or not: a consumer cannot have processed an event that
    /// is not written yet. The largest position the partition takes now is `end - 1`.
    #[error("{message} (position_beyond_end, HTTP 409)")]
    PositionBeyondEnd {
        /// The server's message.
        message: String,
        /// The partition's end when it was refused: the next PLog offset to be written.
        end: u64,
    },
    /// The answer is not what the API documents.
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    /// The client cannot be built as asked (a URL, the token, the CA certificate).
    #[error("{0}")]
    Config(String),
}

impl ClientError {
    /// The stable code: the server's, or the client's own ([`ErrorCode::Transport`],
    /// [`ErrorCode::Protocol`], [`ErrorCode::Config`]).
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Api { code, .. } | ClientError::PositionConflict { code, .. } => *code,
            ClientError::WlogConflict { .. } => ErrorCode::WlogConflict,
            ClientError::PositionBeyondEnd { .. } => ErrorCode::PositionBeyondEnd,
            ClientError::Transport(_) | ClientError::Unanswered { .. } => ErrorCode::Transport,
            ClientError::Protocol(_) => ErrorCode::Protocol,
            ClientError::Config(_) => ErrorCode::Config,
        }
    }

    /// The HTTP status the server answered, if it answered.
    #[must_use]
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::PositionConflict { .. }
            | ClientError::WlogConflict { .. }
            | ClientError::PositionBeyondEnd { .. } => Some(409),
            _ => None,
        }
    }

    /// With [`ClientError::WlogConflict`]: the offset the workspace's WLog ends at.
    #[must_use]
    pub fn current_wlog_offset(&self) -> Option<u64> {
        match self {
            ClientError::WlogConflict {
                current_wlog_offset,
                ..
            } => Some(*current_wlog_offset),
            _ => None,
        }
    }

    /// The error of a server's answer with `status` and error `body`.
    pub(crate) fn of_body(status: u16, body: ErrorBody) -> ClientError {
        match body.current_wlog_offset {
            Some(current_wlog_offset) if body.code == ErrorCode::WlogConflict => {
                ClientError::WlogConflict {
                    current_wlog_offset,
                    message: body.message,
                }
            }
            _ => ClientError::Api {
                status,
                code: body.code,
                message: body.message,
            },
        }
    }
}
