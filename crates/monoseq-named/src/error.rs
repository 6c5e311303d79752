//! Errors of named sequences, one enum per kind of operation ([`NextError`], [`SetError`],
//! [`ReadError`], [`DeleteError`]) plus [`AddressError`] for addresses and [`StorageError`] for
//! backend faults. The edges (the HTTP API, `monoseq seq`) give each variant its stable code
//! (`monoseq_wire::ErrorCode`) beside its message; the enums are exhaustive, so a new variant
//! does not build until every edge has given it one.

use std::time::Duration;

/// An address (scope or name) that is not allowed. Nothing was read or written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddressError {
    /// A part is empty.
    #[error("the {what} is empty; give a non-empty {what}")]
    Empty {
        /// Which part.
        what: &'static str,
    },
    /// A part is too long.
    #[error("the {what} is {len} bytes long, over the limit of {max} bytes")]
    TooLong {
        /// Which part.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A part looks like a path (`/`, `\`, a leading `.` as in `..`): refused so that no
    /// address can reach outside its scope's keys.
    #[error("the {what} {text:?} looks like a path; names may not contain '/' or start with '.'")]
    PathLike {
        /// Which part.
        what: &'static str,
        /// The text given.
        text: String,
    },
    /// A part has a character outside `A-Z a-z 0-9 _ - . :`.
    #[error(
        "the {what} {text:?} contains {found:?}; use only letters, digits and '_', '-', '.', ':'"
    )]
    InvalidChar {
        /// Which part.
        what: &'static str,
        /// The text given.
        text: String,
        /// The first character not allowed.
        found: char,
    },
    /// The scope part of a textual address does not follow `[scope/]name`.
    #[error(
        "scope {text:?} is not one of RESOURCE, resource=R, plugin=P, resource=R/plugin=P, \
         prefix=SEGMENTS"
    )]
    Malformed {
        /// The scope text.
        text: String,
    },
}

/// A backend fault: storage did not answer, or answered something unexpected. The operation
/// may be retried.
#[derive(Debug, thiserror::Error)]
#[error("sequence storage failed while {context}: {message}; check the storage and retry")]
pub struct StorageError {
    context: &'static str,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl StorageError {
    /// A fault met while doing `context` (for instance "reading the sequence").
    pub fn new(
        context: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> StorageError {
        let source = source.into();
        StorageError {
            context,
            message: source.to_string(),
            source: Some(source),
        }
    }

    /// A fault described by a message only.
    pub fn message(context: &'static str, message: impl Into<String>) -> StorageError {
        StorageError {
            context,
            message: message.into(),
            source: None,
        }
    }

    /// A copy without its source (for answering several callers the same fault).
    pub(crate) fn clone_lossy(&self) -> StorageError {
        StorageError {
            context: self.context,
            message: self.message.clone(),
            source: None,
        }
    }
}

/// A `next` or `increment` did not hand out a number. No number was handed out; storage may
/// have consumed some (a gap) only when the error says so.
#[derive(Debug, thiserror::Error)]
pub enum NextError {
    /// The initial value is over [`crate::VALUE_MAX`].
    #[error("initial value {value} is over the largest value {max}")]
    InvalidValue {
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// The metadata is over [`crate::METADATA_BYTES_MAX`].
    #[error("metadata is {len} bytes of JSON, over the limit of {max} bytes")]
    MetadataTooLarge {
        /// Its JSON length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Handing out the numbers asked for would pass [`crate::VALUE_MAX`]; nothing was written.
    #[error(
        "sequence {address} is at {value}; adding {increment} would pass the largest value \
         {max}. Reset it or use another sequence"
    )]
    Overflow {
        /// The sequence.
        address: String,
        /// Its stored value.
        value: u64,
        /// The increment asked for.
        increment: u64,
        /// The largest value.
        max: u64,
    },
    /// The stored object is not a valid sequence; it was left as it is.
    #[error(
        "the object at {key} is not a valid sequence ({reason}); it was not changed. \
         Inspect it, then delete it to start the sequence over"
    )]
    InvalidStored {
        /// Its storage key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Other writers kept winning the race until the timeout: try again later.
    #[error(
        "sequence {address} is busy: gave up after {attempts} attempts in {waited:?} \
         (timeout {timeout:?}); retry later or with a longer timeout"
    )]
    Busy {
        /// The sequence.
        address: String,
        /// Conditional writes tried.
        attempts: u32,
        /// Time spent.
        waited: Duration,
        /// The timeout given.
        timeout: Duration,
    },
    /// Too many calls of this process already wait for this sequence
    /// ([`crate::LANE_CALLS_MAX`]); nothing was tried: retry later.
    #[error(
        "sequence {address} is busy: {waiting} calls of this process already wait for it, the \
         most allowed is {max}; retry later"
    )]
    LaneFull {
        /// The sequence.
        address: String,
        /// Calls waiting.
        waiting: usize,
        /// The bound.
        max: usize,
    },
    /// A storage fault.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A `reset` or `set` did not write. Nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// The value is over [`crate::VALUE_MAX`].
    #[error("value {value} is over the largest value {max}")]
    InvalidValue {
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// The metadata is over [`crate::METADATA_BYTES_MAX`].
    #[error("metadata is {len} bytes of JSON, over the limit of {max} bytes")]
    MetadataTooLarge {
        /// Its JSON length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The stored object is not a valid sequence; it was left as it is.
    #[error(
        "the object at {key} is not a valid sequence ({reason}); it was not changed. \
         Inspect it, then delete it to start the sequence over"
    )]
    InvalidStored {
        /// Its storage key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Other writers kept winning the race until the timeout.
    #[error(
        "sequence {address} is busy: gave up after {attempts} attempts in {waited:?}; \
         retry later or with a longer timeout"
    )]
    Busy {
        /// The sequence.
        address: String,
        /// Conditional writes tried.
        attempts: u32,
        /// Time spent.
        waited: Duration,
    },
    /// A storage fault.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A read (`get`, `get_data`, `exists`) failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stored object is not a valid sequence.
    #[error(
        "the object at {key} is not a valid sequence ({reason}). Inspect it, then delete it \
         to start the sequence over"
    )]
    InvalidStored {
        /// Its storage key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A storage fault.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// A `delete` failed; the sequence may or may not be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteError {
    /// A storage fault.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl NextError {
    /// A copy for another waiter of the same failed write (a storage fault keeps its message,
    /// not its source).
    pub(crate) fn clone_lossy(&self) -> NextError {
        match self {
            NextError::InvalidValue { value, max } => NextError::InvalidValue {
                value: *value,
                max: *max,
            },
            NextError::MetadataTooLarge { len, max } => NextError::MetadataTooLarge {
                len: *len,
                max: *max,
            },
            NextError::Overflow {
                address,
                value,
                increment,
                max,
            } => NextError::Overflow {
                address: address.clone(),
                value: *value,
                increment: *increment,
                max: *max,
            },
            NextError::InvalidStored { key, reason } => NextError::InvalidStored {
                key: key.clone(),
                reason: reason.clone(),
            },
            NextError::Busy {
                address,
                attempts,
                waited,
                timeout,
            } => NextError::Busy {
                address: address.clone(),
                attempts: *attempts,
                waited: *waited,
                timeout: *timeout,
            },
            NextError::LaneFull {
                address,
                waiting,
                max,
            } => NextError::LaneFull {
                address: address.clone(),
                waiting: *waiting,
                max: *max,
            },
            NextError::Storage(e) => NextError::Storage(e.clone_lossy()),
        }
    }
}
