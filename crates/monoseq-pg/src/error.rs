//! Turns driver, pool and timeout failures into the contract's errors ([`KvError`],
//! [`OpenError`]) with messages that say what to do, and tells which failures a retry of the
//! whole transaction cures (serialization failures, deadlocks).

use std::path::PathBuf;
use std::time::Duration;

use deadpool_postgres::{PoolError, TimeoutType};
use monoseq_kv::{KvError, OpenError};
use tokio_postgres::error::SqlState;

/// What failed, from the store's point of view.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The driver or the server reported an error.
    Postgres(tokio_postgres::Error),
    /// No connection could be had (connect, authentication, pool exhausted).
    Pool(PoolError),
    /// The server did not answer in time; the connection was dropped.
    Timeout(Duration),
    /// Something the store read is not what it wrote.
    Corrupted(String),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Failure {
        Failure::Postgres(error)
    }
}

impl From<PoolError> for Failure {
    fn from(error: PoolError) -> Failure {
        Failure::Pool(error)
    }
}

impl Failure {
    /// Whether the server rolled the transaction back because of concurrent transactions
    /// (serialization failure, deadlock): nothing was written and the same transaction may
    /// simply run again.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Failure::Postgres(e) => matches!(
                e.code(),
                Some(code) if *code == SqlState::T_R_SERIALIZATION_FAILURE
                    || *code == SqlState::T_R_DEADLOCK_DETECTED
            ),
            _ => false,
        }
    }

    /// Whether a write that failed this way may still have been applied: the connection was
    /// lost or timed out after the request left, so the commit's outcome is unknown.
    pub(crate) fn outcome_unknown(&self) -> bool {
        match self {
            Failure::Postgres(e) => e.as_db_error().is_none(),
            Failure::Timeout(_) => true,
            Failure::Pool(_) | Failure::Corrupted(_) => false,
        }
    }

    /// The contract's error, for an operation described by `context`.
    pub(crate) fn into_kv(self, context: &'static str) -> KvError {
        match self {
            Failure::Postgres(e) => {
                let hint = hint(&e);
                KvError::backend(
                    format!("PostgreSQL failed while {context} ({}){hint}", describe(&e)),
                    e,
                )
            }
            Failure::Pool(PoolError::Backend(e)) => {
                let hint = hint(&e);
                KvError::backend(
                    format!(
                        "cannot connect to PostgreSQL while {context} ({}){hint}",
                        describe(&e)
                    ),
                    e,
                )
            }
            Failure::Pool(PoolError::Timeout(kind)) => KvError::Backend {
                message: format!(
                    "no connection to PostgreSQL while {context}: {}; check that the server \
                     runs and accepts connections (the store reconnects by itself)",
                    match kind {
                        TimeoutType::Wait => "every pooled connection stayed busy too long",
                        TimeoutType::Create => "connecting took too long",
                        TimeoutType::Recycle => "checking a pooled connection took too long",
                    }
                ),
                source: None,
            },
            Failure::Pool(other) => KvError::backend(
                format!("the connection pool failed while {context}"),
                other.to_string(),
            ),
            Failure::Timeout(limit) => KvError::Backend {
                message: format!(
                    "PostgreSQL did not answer within {limit:?} while {context}; the connection \
                     was dropped. Check the server and the network; the store reconnects by \
                     itself"
                ),
                source: None,
            },
            Failure::Corrupted(message) => KvError::Corrupted { message },
        }
    }

    /// The contract's [`KvError::OutcomeUnknown`] for a write described by `what` whose answer
    /// was lost this way; `settled` tells whether the server was seen to have finished every
    /// transaction on the write's keys since (then a read tells the outcome).
    pub(crate) fn into_unknown(self, what: &str, settled: bool) -> KvError {
        unknown_outcome(what, &self.lost_answer(), settled)
    }

    /// How the answer of a write that failed this way was lost, for
    /// [`unknown_outcome`].
    pub(crate) fn lost_answer(&self) -> String {
        match self {
            Failure::Postgres(e) => {
                format!("the connection to PostgreSQL failed ({})", describe(e))
            }
            Failure::Timeout(limit) => {
                format!("PostgreSQL did not answer within {limit:?}; the connection was dropped")
            }
            Failure::Pool(e) => format!("the connection pool failed ({e})"),
            Failure::Corrupted(m) => m.clone(),
        }
    }

    /// The contract's open error for a store at `location`.
    pub(crate) fn into_open(self, location: &str, context: &'static str) -> OpenError {
        storage_open_error(location, self.into_kv(context))
    }
}

/// The contract's [`KvError::OutcomeUnknown`] for a write described by `what` whose answer
/// was lost as `cause` says; `settled` tells whether the server was seen to have finished
/// every transaction on the write's keys since (then a read tells the outcome).
pub(crate) fn unknown_outcome(what: &str, cause: &str, settled: bool) -> KvError {
    let after = match settled {
        true => "the server has ended the transaction since, so a read now tells which",
        false => {
            "the transaction was not seen to end on the server (it may still be running \
             there): read back once the server answers again"
        }
    };
    KvError::OutcomeUnknown {
        message: format!("{what}: {cause} after the request was sent; {after}"),
    }
}

/// An [`OpenError::Storage`] for the store at `location` (the connection string without its
/// password, and the schema).
pub(crate) fn storage_open_error(location: &str, source: KvError) -> OpenError {
    OpenError::Storage {
        path: PathBuf::from(location),
        source,
    }
}

/// `e` with its causes (the driver's own message names only the kind of failure).
fn describe(e: &tokio_postgres::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// What the user can do about `e`, as a sentence to append.
fn hint(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        let advice = if *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
        {
            "the server refused the credentials: check the user and password of the connection \
             string"
        } else if *code == SqlState::INVALID_CATALOG_NAME {
            "the database does not exist: create it or fix the connection string"
        } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
            "the user lacks a privilege on the store's schema or tables: grant it"
        } else if *code == SqlState::QUERY_CANCELED {
            "the statement ran past the statement timeout"
        } else if *code == SqlState::ADMIN_SHUTDOWN
            || *code == SqlState::CRASH_SHUTDOWN
            || *code == SqlState::CANNOT_CONNECT_NOW
        {
            "the server is shutting down or starting: retry once it is up"
        } else {
            "see the server's message"
        };
        return format!("; SQLSTATE {}: {advice}", code.code());
    }
    if e.is_closed() || std::error::Error::source(e).is_some() {
        return "; the connection failed or was lost: check that the server runs and is \
                reachable at the connection string's host and port (the store reconnects by \
                itself)"
            .to_owned();
    }
    String::new()
}
