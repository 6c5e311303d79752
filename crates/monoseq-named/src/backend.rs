//! The storage contract of named sequences: [`Backend`], a store of small objects with
//! versioned reads and conditional writes (create-if-absent, replace-if-unchanged). Owns the
//! obligations every backend keeps; the S3 and key-value backends implement it.

use std::future::Future;
use std::pin::Pin;

use crate::error::StorageError;

/// A boxed, sendable future (what [`Backend`] methods return, so that the trait is usable as
/// `dyn Backend`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// An opaque version token of a stored object: an S3 ETag, or for the key-value backends the
/// stored bytes themselves (compare-and-swap compares values). Two reads of an object that
/// was not written in between give equal versions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(Vec<u8>);

impl Version {
    /// A version from its bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Version {
        Version(bytes.into())
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// An object as read: its bytes and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// The object's bytes.
    pub bytes: Vec<u8>,
    /// Its version, for a later [`Backend::replace`].
    pub version: Version,
}

/// Why a conditional write did not write.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteFailure {
    /// The condition failed: the object exists (create) or changed or vanished since it was
    /// read (replace). Nothing was written, or (a replace whose answer was lost) what may have
    /// been written is not the caller's to use; read again and retry.
    #[error("the object changed since it was read")]
    Conflict,
    /// A storage fault. The write may or may not have happened.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// One conditional write of [`Backend::write_each`]: a [`Backend::create`] of `key` when
/// `expected` is `None`, else a [`Backend::replace`] of it if still at `expected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionalWrite {
    /// The object's key.
    pub key: String,
    /// The version it must still have; `None`: no object may be there.
    pub expected: Option<Version>,
    /// The bytes to write.
    pub bytes: Vec<u8>,
}

/// A store of small objects with conditional writes: what named sequences need of S3 and of
/// the key-value contract.
///
/// Obligations of every backend (the backend test suite checks them):
///
/// - **Linearizable conditions.** [`create`](Backend::create) writes only if no object is at
///   the key, [`replace`](Backend::replace) only if the object is still at the version read;
///   the check and the write are one atomic step, so of many concurrent conditional writes
///   against one state exactly one succeeds. A lost race is [`WriteFailure::Conflict`], never
///   an overwrite.
/// - **Visibility.** A write that returned `Ok` is seen by every read that starts after it.
/// - **Durability.** A write that returned `Ok` survives a crash of the process (and, for a
///   durable backend, of the machine).
/// - **No expiry.** Nothing a backend holds on a caller's behalf expires or can be taken over:
///   a caller that stalls between read and write finds its write refused.
pub trait Backend: Send + Sync + 'static {
    /// The object at `key`, with its version.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when storage cannot answer.
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>>;

    /// Writes `bytes` at `key` if no object is there; answers the new version.
    ///
    /// # Errors
    ///
    /// [`WriteFailure::Conflict`] when an object exists; [`WriteFailure::Storage`] on a fault.
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>>;

    /// Replaces the object at `key` with `bytes` if it is still at version `expected`;
    /// answers the new version.
    ///
    /// # Errors
    ///
    /// [`WriteFailure::Conflict`] when the object changed or is gone; [`WriteFailure::Storage`]
    /// on a fault.
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>>;

    /// Removes the object at `key` (an absent key is fine).
    ///
    /// # Errors
    ///
    /// A [`StorageError`] on a fault; the object may or may not be gone.
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>>;

    /// Makes each of `writes` (distinct keys) on its own condition, exactly as
    /// [`create`](Backend::create) or [`replace`](Backend::replace) would, and answers each in
    /// order: a failed condition or a fault on one key fails only that key, and every write
    /// answered `Ok` is durable. Together they are not atomic. By default they run one after
    /// another; a backend that carries them in about the cost of one write (one sync, one
    /// commit) overrides it and says so with [`combines`](Backend::combines).
    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        Box::pin(async move {
            let mut answers = Vec::with_capacity(writes.len());
            for write in writes {
                let answer = match &write.expected {
                    None => self.create(&write.key, write.bytes).await,
                    Some(expected) => self.replace(&write.key, expected, write.bytes).await,
                };
                answers.push(answer);
            }
            answers
        })
    }

    /// Whether [`write_each`](Backend::write_each) costs about one write whatever its length.
    /// Then [`crate::Sequences`] hands the ready writes of all its sequences to one call;
    /// otherwise each sequence writes on its own, concurrently with the others. Default:
    /// `false`.
    fn combines(&self) -> bool {
        false
    }
}

impl<B: Backend + ?Sized> Backend for std::sync::Arc<B> {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        (**self).load(key)
    }

    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        (**self).create(key, bytes)
    }

    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        (**self).replace(key, expected, bytes)
    }

    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        (**self).remove(key)
    }

    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        (**self).write_each(writes)
    }

    fn combines(&self) -> bool {
        (**self).combines()
    }
}
