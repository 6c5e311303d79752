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
}
