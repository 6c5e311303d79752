//! Errors of named sequences, one enum per kind of operation ([`NextError`], [`SetError`],
//! [`ReadError`], [`DeleteError`]) plus [`AddressError`] for addresses and [`StorageError`] for
//! backend faults. Every error has a stable [`code`](NextError::code), which the edges (the HTTP
//! API, `monoseq seq`) report beside its message.

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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
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
#[non_exhaustive]
pub enum DeleteError {
    /// A storage fault.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Stable error codes of the operations, as the edges report them (the HTTP API adds its own
/// for requests it cannot route: `monoseq_named_http::code`).
pub mod code {
    /// The address is not allowed ([`crate::AddressError`]).
    pub const INVALID_ADDRESS: &str = "invalid_address";
    /// A value is negative, fractional or over [`crate::VALUE_MAX`].
    pub const INVALID_VALUE: &str = "invalid_value";
    /// An increment is 0, negative or over [`crate::VALUE_MAX`].
    pub const INVALID_INCREMENT: &str = "invalid_increment";
    /// The metadata is not a JSON object or is too large.
    pub const INVALID_METADATA: &str = "invalid_metadata";
    /// The request is malformed (not JSON, wrong field types, unknown operation).
    pub const BAD_REQUEST: &str = "bad_request";
    /// The sequence would pass [`crate::VALUE_MAX`].
    pub const OVERFLOW: &str = "overflow";
    /// The stored object is not a valid sequence.
    pub const INVALID_STORED: &str = "invalid_stored";
    /// The sequence does not exist.
    pub const NOT_FOUND: &str = "not_found";
    /// Contention outlasted the timeout.
    pub const BUSY: &str = "busy";
    /// Storage failed.
    pub const STORAGE: &str = "storage_unavailable";
}

impl AddressError {
    /// The stable error code: [`code::INVALID_ADDRESS`].
    pub fn code(&self) -> &'static str {
        code::INVALID_ADDRESS
    }
}

impl NextError {
    /// The stable error code (see [`code`]).
    pub fn code(&self) -> &'static str {
        match self {
            NextError::InvalidValue { .. } => code::INVALID_VALUE,
            NextError::MetadataTooLarge { .. } => code::INVALID_METADATA,
            NextError::Overflow { .. } => code::OVERFLOW,
            NextError::InvalidStored { .. } => code::INVALID_STORED,
            NextError::Busy { .. } | NextError::LaneFull { .. } => code::BUSY,
            NextError::Storage(_) => code::STORAGE,
        }
    }
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

impl SetError {
    /// The stable error code (see [`code`]).
    pub fn code(&self) -> &'static str {
        match self {
            SetError::InvalidValue { .. } => code::INVALID_VALUE,
            SetError::MetadataTooLarge { .. } => code::INVALID_METADATA,
            SetError::InvalidStored { .. } => code::INVALID_STORED,
            SetError::Busy { .. } => code::BUSY,
            SetError::Storage(_) => code::STORAGE,
        }
    }
}

impl ReadError {
    /// The stable error code (see [`code`]).
    pub fn code(&self) -> &'static str {
        match self {
            ReadError::InvalidStored { .. } => code::INVALID_STORED,
            ReadError::Storage(_) => code::STORAGE,
        }
    }
}

impl DeleteError {
    /// The stable error code (see [`code`]).
    pub fn code(&self) -> &'static str {
        match self {
            DeleteError::Storage(_) => code::STORAGE,
        }
    }
}
