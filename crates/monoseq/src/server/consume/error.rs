//! Why a read or a tail of the consumer side is refused: one [`ConsumeError`] per refusal,
//! given its status, stable code and headers in one place (its `IntoResponse`).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use monoseq_membership::Unplaced;
use monoseq_wire::ErrorCode;

use super::super::answers::ReadFailure;
use super::super::place::unplaced;
use crate::base::error;
use crate::query::QueryError;

/// Seconds a follower refused for the cap is told to wait.
const RETRY_AFTER_FOLLOWERS_SECS: &str = "1";

/// Why the consumer side refuses a request (or a hub, a tail, a stream's reader cannot read).
#[derive(Debug)]
pub(in crate::server) enum ConsumeError {
    /// 400 `bad_request`: what is malformed and what to send.
    BadRequest(String),
    /// 404 `no_such_partition`, or 503 `partition_unavailable` with `Retry-After` while the
    /// partition has no owner to read from.
    Unplaced { partition: u32, why: Unplaced },
    /// 503 `too_many_followers` with `Retry-After`: this node serves `--followers-max` tails.
    TooManyFollowers { max: usize },
    /// A relayed read that failed: the owner's own refusal, `owner_unreachable` or
    /// `node_unauthorized`, passed on as it came.
    Relay(Box<Response>),
    /// A failed store read (logged and counted): 500 `corrupted` or 503 `storage_unavailable`.
    Read(ReadFailure),
    /// 500 `internal`: a read's thread failed, or a page did not encode.
    Internal(String),
}

impl ConsumeError {
    /// 400 with `message`.
    pub(super) fn bad_request(message: impl std::fmt::Display) -> ConsumeError {
        ConsumeError::BadRequest(message.to_string())
    }

    /// A relayed read's failed answer.
    pub(super) fn relay(answer: Response) -> ConsumeError {
        ConsumeError::Relay(Box::new(answer))
    }

    /// 500 for what failed (`e`).
    pub(super) fn internal(e: impl std::fmt::Display) -> ConsumeError {
        ConsumeError::Internal(e.to_string())
    }

    /// The status line's reason of its answer, for a log line (the stable code is in the
    /// body).
    pub(super) fn status(&self) -> StatusCode {
        match self {
            ConsumeError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ConsumeError::Unplaced {
                why: Unplaced::NoSuchPartition { .. },
                ..
            } => StatusCode::NOT_FOUND,
            ConsumeError::Unplaced { .. } | ConsumeError::TooManyFollowers { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ConsumeError::Relay(r) => r.status(),
            ConsumeError::Read(ReadFailure::Corrupted { .. }) | ConsumeError::Internal(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            ConsumeError::Read(ReadFailure::Unavailable(_)) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl From<QueryError> for ConsumeError {
    fn from(e: QueryError) -> ConsumeError {
        ConsumeError::BadRequest(e.0)
    }
}

impl From<ReadFailure> for ConsumeError {
    fn from(e: ReadFailure) -> ConsumeError {
        ConsumeError::Read(e)
    }
}

impl IntoResponse for ConsumeError {
    fn into_response(self) -> Response {
        match self {
            ConsumeError::BadRequest(message) => {
                error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
            }
            ConsumeError::Unplaced { partition, why } => unplaced(partition, why),
            ConsumeError::TooManyFollowers { max } => {
                let mut r = error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::TooManyFollowers,
                    format!(
                        "this node serves its most live tails ({max}, --followers-max); retry \
                         later or follow through another node"
                    ),
                );
                r.headers_mut().insert(
                    header::RETRY_AFTER,
                    HeaderValue::from_static(RETRY_AFTER_FOLLOWERS_SECS),
                );
                r
            }
            ConsumeError::Relay(answer) => *answer,
            ConsumeError::Read(failure) => failure.into_response(),
            ConsumeError::Internal(message) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                message,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every refusal, as a tail's log line names it and as its answer says it.
    #[test]
    fn a_refusal_logs_the_status_it_answers() {
        let refusals = [
            ConsumeError::bad_request("`from` starts at 1"),
            ConsumeError::Unplaced {
                partition: 9,
                why: Unplaced::NoSuchPartition { partitions: 4 },
            },
            ConsumeError::Unplaced {
                partition: 1,
                why: Unplaced::Moving,
            },
            ConsumeError::TooManyFollowers { max: 2 },
            ConsumeError::relay(StatusCode::BAD_GATEWAY.into_response()),
            ConsumeError::Read(ReadFailure::Unavailable("disk".into())),
            ConsumeError::Read(ReadFailure::Corrupted {
                place: "k".into(),
                message: "bad".into(),
            }),
            ConsumeError::internal("a reading thread panicked"),
        ];
        for e in refusals {
            let (logged, what) = (e.status(), format!("{e:?}"));
            let answer = e.into_response();
            assert_eq!(answer.status(), logged, "{what}");
            let retry = answer.headers().get(header::RETRY_AFTER).is_some();
            assert_eq!(retry, logged == StatusCode::SERVICE_UNAVAILABLE, "{what}");
        }
    }
}
