//! Errors of the storage contract, one enum per kind of operation: [`KvError`] for storage
//! faults (every operation), [`WriteError`] for batches, [`CasError`] for compare-and-swap and
//! [`OpenError`] for opening a backend. A fault is always an error value, never a panic.

use std::path::PathBuf;

use crate::key::{KeyBuf, Oversized};

/// A storage fault: the backend could not do what was asked. Nothing is implied about the
/// data, except where a variant says so; the operation may be retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// An I/O call failed.
    #[error("storage I/O failed while {context}; check the disk and retry")]
    Io {
        /// What the backend was doing.
        context: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The engine stopped accepting writes after a fatal failure (typically a failed flush or
    /// journal write, after which nothing is known about what reached the disk); every later
    /// write fails the same way, naming that first failure. Only closing and re-opening the
    /// store recovers: the engine then replays its journal.
    #[error(
        "{POISONED}: {first}. Nothing more is written: check the disk (free space, errors in \
         the kernel log), then close and re-open the store (restart the server); it recovers \
         from its journal"
    )]
    Poisoned {
        /// The first fatal failure with its causes, as far as the store knows it.
        first: String,
    },
    /// Stored bytes do not decode; the data directory is damaged or was written by something
    /// else.
    #[error("stored data is corrupted: {message}; restore the data directory from a backup")]
    Corrupted {
        /// What did not decode.
        message: String,
    },
    /// The write was refused because this node no longer owns the partition it writes for: it
    /// was fenced by the epoch of a lease that another node took over (the backend checks the
    /// epoch in the same transaction as the write). Nothing of the write was stored, and no
    /// later write through the same fenced view can succeed: stop serving the partition and
    /// forward its work to the new owner. Retrying does not help.
    #[error(
        "this node no longer holds the lease of {message}; nothing was written. The partition \
         is served by its new owner: stop writing for it here"
    )]
    Fenced {
        /// Which partition and epoch were fenced, and what the lease now holds (for example
        /// `partition 3 with epoch 7 (a newer owner has epoch 8: node "b")`).
        message: String,
    },
    /// The write was sent but its answer was lost (the connection dropped, or the backend did
    /// not answer in time, after the request left): it may have been applied, whole, or not at
    /// all. This is the only error after which a write may be visible. Read back what the write
    /// would have changed before deciding anything that depends on it: a blind retry may apply
    /// it twice, and answering "failed" may deny what is stored.
    #[error(
        "the outcome of a write is unknown: {message}. It may have been applied whole, or not \
         at all: read back what it wrote before answering anyone"
    )]
    OutcomeUnknown {
        /// What was written and how its answer was lost.
        message: String,
    },
    /// The store was opened read-only ([`FjallStore::open_read_only`]); nothing was written.
    ///
    /// [`FjallStore::open_read_only`]: crate::FjallStore::open_read_only
    #[error("the store was opened read-only, so nothing was written; open it for writing instead")]
    ReadOnly,
    /// The backend reported a failure the contract has no better name for.
    #[error("storage backend failed: {message}")]
    Backend {
        /// What failed.
        message: String,
        /// The backend's own error, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
}

/// How a [`KvError::Poisoned`] begins.
pub const POISONED: &str = "storage is poisoned by an earlier fatal failure";

impl KvError {
    /// A poisoned store's error naming its first fatal failure.
    pub fn poisoned(first: impl Into<String>) -> KvError {
        KvError::Poisoned {
            first: first.into(),
        }
    }

    /// Whether the store is poisoned ([`KvError::Poisoned`]): no later write can succeed until
    /// it is re-opened.
    #[must_use]
    pub fn is_poisoned(&self) -> bool {
        matches!(self, KvError::Poisoned { .. })
    }

    /// Whether the write that failed this way may have been applied ([`KvError::OutcomeUnknown`]).
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, KvError::OutcomeUnknown { .. })
    }

    /// A backend failure described by a message and caused by `source`.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> KvError {
        KvError::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// A batch was not applied: nothing of it is visible (see [`crate::KvStore::write`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteError {
    /// An insert-if-absent item found its key present; the batch was not applied.
    #[error(
        "key already exists (batch item {index}, {key}); nothing of the batch was written. \
         Read the key to find out who wrote it"
    )]
    Conflict {
        /// Position of the conflicting item in the batch.
        index: usize,
        /// The conflicting key.
        key: KeyBuf,
    },
    /// An item is over a size limit; the batch was not applied.
    #[error("batch item {index}: {what:?} is {len} bytes, over the limit of {max} bytes")]
    TooLarge {
        /// Position of the item in the batch.
        index: usize,
        /// Which part is too large.
        what: Oversized,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A storage fault; the batch was not applied, unless the fault is
    /// [`KvError::OutcomeUnknown`] (then it may have been applied whole).
    #[error(transparent)]
    Storage(#[from] KvError),
}

impl WriteError {
    /// Whether the batch may have been applied (its answer was lost).
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, WriteError::Storage(e) if e.is_outcome_unknown())
    }
}

/// A compare-and-swap did not swap.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CasError {
    /// The stored value is not the expected one; nothing was written.
    #[error("compare-and-swap mismatch: the stored value differs from the expected one")]
    Mismatch {
        /// The value stored at the time of the comparison (`None`: the key is absent).
        current: Option<Vec<u8>>,
    },
    /// The new value is over a size limit; nothing was written.
    #[error("compare-and-swap: {what:?} is {len} bytes, over the limit of {max} bytes")]
    TooLarge {
        /// Which part is too large.
        what: Oversized,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A storage fault; nothing was written, unless the fault is [`KvError::OutcomeUnknown`]
    /// (then the swap may have happened).
    #[error(transparent)]
    Storage(#[from] KvError),
}

impl CasError {
    /// Whether the swap may have happened (its answer was lost).
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, CasError::Storage(e) if e.is_outcome_unknown())
    }
}

/// A backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Another process, or another open store in this process, holds the data directory.
    #[error(
        "data directory {} is locked by another monoseq store (this process or another); \
         stop it or use another directory",
        path.display()
    )]
    Locked {
        /// The data directory.
        path: PathBuf,
    },
    /// An option is out of its allowed range.
    #[error("invalid storage option: {0}")]
    InvalidOption(String),
    /// Opening or recovering failed.
    #[error("cannot open the store at {}", path.display())]
    Storage {
        /// The data directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: KvError,
    },
}

/// An error and each of its causes, once each, joined by `": "` (the form of anyhow's `{:#}`):
/// every layer's message says what it was doing, its source what failed. Where an error becomes
/// text (a message field, an answer), this keeps the causes that `to_string` alone drops.
#[must_use]
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// Whether `e` or one of its causes is [`KvError::Poisoned`]: a fatal storage failure, not a
/// passing one. Decided on the error's type, never on its text: a wrapper of its own must keep
/// the `KvError` as its source (`#[source]` or `#[from]`, not `#[error(transparent)]`).
#[must_use]
pub fn is_poisoned(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut layer = Some(e);
    while let Some(l) = layer {
        // `WriteError` and `CasError` show their `KvError` transparently (it is not a layer of
        // the chain), so they are looked into.
        let kv = l.downcast_ref::<KvError>().or_else(|| {
            match (l.downcast_ref::<WriteError>(), l.downcast_ref::<CasError>()) {
                (Some(WriteError::Storage(k)), _) | (_, Some(CasError::Storage(k))) => Some(k),
                _ => None,
            }
        });
        if kv.is_some_and(KvError::is_poisoned) {
            return true;
        }
        layer = l.source();
    }
    false
}
