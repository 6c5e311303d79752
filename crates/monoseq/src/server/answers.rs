//! The error answers the handlers share: a failed read (corrupt bytes or a storage fault), a
//! refused command, and the `Retry-After` header of every transient one.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use monoseq_cp::{CommandError, ErrorClass, RETRY_AFTER_SECS};
use monoseq_wire::{ErrorBody, ErrorCode};

use super::AppState;
use crate::base::{chain, error};

/// Marks an answer as transient: the client retries after [`RETRY_AFTER_SECS`].
pub(super) fn with_retry_after(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

/// Corrupt places remembered for logging once; past it, each is logged again.
const CORRUPTED_LOGGED_MAX: usize = 1024;

/// Answers a failed read: corrupt bytes are a 500 `corrupted` naming the key (logged once per
/// place and counted), a storage fault a 503 with `Retry-After`.
pub(super) fn read_error(
    st: &AppState,
    asked: impl FnOnce() -> String,
    e: &monoseq_store::ReadError,
) -> Response {
    read_failure(st, asked, e).into_response()
}

/// A failed read, logged (a corrupt place once) and counted, as [`read_error`] answers it.
#[derive(Debug)]
pub(super) enum ReadFailure {
    /// 500 `corrupted`, naming the damaged place.
    Corrupted { place: String, message: String },
    /// 503 `storage_unavailable` with `Retry-After`.
    Unavailable(String),
}

/// What a failed read is (see [`read_error`]), logged and counted.
pub(super) fn read_failure(
    st: &AppState,
    asked: impl FnOnce() -> String,
    e: &monoseq_store::ReadError,
) -> ReadFailure {
    use monoseq_store::ReadError;
    let place = match e {
        ReadError::Corrupt { slot, .. }
        | ReadError::Misplaced { slot, .. }
        | ReadError::Dangling { slot, .. } => Some(slot.to_string()),
        ReadError::Storage(monoseq_kv::KvError::Corrupted { .. }) => Some(asked()),
        _ => None,
    };
    let message = chain(e);
    match place {
        Some(place) => {
            st.metrics.corrupted.inc();
            if first_report(st, &place) {
                tracing::error!(place = %place, "corrupt data in storage: {message}");
            }
            ReadFailure::Corrupted { place, message }
        }
        None => {
            tracing::warn!("storage read failed: {message}");
            ReadFailure::Unavailable(message)
        }
    }
}

impl IntoResponse for ReadFailure {
    fn into_response(self) -> Response {
        match self {
            ReadFailure::Corrupted { place, message } => (
                StatusCode::INTERNAL_SERVER_ERROR,
                axum::Json(ErrorBody {
                    key: Some(place),
                    ..ErrorBody::new(ErrorCode::Corrupted, message)
                }),
            )
                .into_response(),
            ReadFailure::Unavailable(message) => with_retry_after(error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::StorageUnavailable,
                message,
            )),
        }
    }
}

/// Whether a corrupt place is reported for the first time (remembered up to
/// [`CORRUPTED_LOGGED_MAX`] places, then forgotten all at once).
fn first_report(st: &AppState, place: &str) -> bool {
    let mut logged = st
        .metrics
        .corrupted_logged
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if logged.len() >= CORRUPTED_LOGGED_MAX {
        logged.clear();
    }
    logged.insert(place.to_owned())
}

/// Answers a refused command with the status of its class and its stable code (a
/// `wlog_conflict` with the offset the workspace's WLog ends at).
pub(super) fn command_error(e: &CommandError) -> Response {
    let status = status_of(e.class());
    if let Some(current) = e.current_wlog_offset() {
        let body = monoseq_wire::ErrorBody {
            code: command_code(e),
            message: chain(e),
            key: None,
            current_wlog_offset: Some(current),
        };
        return (status, axum::Json(body)).into_response();
    }
    let r = error(status, command_code(e), chain(e));
    if e.is_transient() {
        with_retry_after(r)
    } else {
        r
    }
}

/// The HTTP status of each kind of command error (the README lists them with their codes).
/// The stable code of a refused command.
pub(crate) fn command_code(e: &CommandError) -> ErrorCode {
    match e {
        CommandError::Invalid(_) => ErrorCode::InvalidCommand,
        CommandError::UnknownWsKind(_) => ErrorCode::UnknownWorkspaceKind,
        CommandError::UnknownRecord { .. } => ErrorCode::UnknownRecord,
        CommandError::TooLarge(_) => ErrorCode::TooLarge,
        CommandError::Busy(_) => ErrorCode::Busy,
        CommandError::Unavailable { .. } => ErrorCode::PartitionUnavailable,
        CommandError::SequenceViolation(_) => ErrorCode::SequenceViolation,
        CommandError::Exhausted(_) => ErrorCode::SequenceExhausted,
        CommandError::Corrupted(_) => ErrorCode::Corrupted,
        CommandError::KeyReused { .. } => ErrorCode::IdempotencyKeyReused,
        CommandError::InvalidKey(_) => ErrorCode::InvalidIdempotencyKey,
        CommandError::Storage(_) => ErrorCode::StorageUnavailable,
        CommandError::ShuttingDown => ErrorCode::ShuttingDown,
        CommandError::NotOwner { .. } => ErrorCode::NotOwner,
        CommandError::WlogConflict { .. } => ErrorCode::WlogConflict,
    }
}

pub(super) fn status_of(class: ErrorClass) -> StatusCode {
    match class {
        ErrorClass::Invalid => StatusCode::BAD_REQUEST,
        ErrorClass::NotFound => StatusCode::NOT_FOUND,
        ErrorClass::Conflict => StatusCode::CONFLICT,
        ErrorClass::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorClass::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorClass::Transient => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}
