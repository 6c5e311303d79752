//! The key-value backends the named-sequence tests run on, each on a fresh store: in memory,
//! and fjall and redb in a temporary directory that lives as long as the backend.

use std::sync::Arc;

use monoseq_kv::{FjallStore, MemoryStore, Options, RedbStore};
use monoseq_named::{
    Backend, BoxFuture, ConditionalWrite, KvBackend, Object, StorageError, Version, WriteFailure,
};

/// A backend shared by the tests and the `Sequences` under test.
pub type Shared = Arc<dyn Backend>;

/// A backend that keeps the temporary directory of its store alive.
struct InDir<B> {
    backend: B,
    _dir: tempfile::TempDir,
}

impl<B: Backend> Backend for InDir<B> {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        self.backend.load(key)
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.backend.create(key, bytes)
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        self.backend.replace(key, expected, bytes)
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.backend.remove(key)
    }
    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        self.backend.write_each(writes)
    }
    fn combines(&self) -> bool {
        self.backend.combines()
    }
}

pub fn memory() -> Shared {
    Arc::new(KvBackend::new(MemoryStore::new()))
}

pub fn fjall() -> Shared {
    let dir = tempfile::tempdir().unwrap();
    let store = FjallStore::open(dir.path(), Options::default()).unwrap();
    Arc::new(InDir {
        backend: KvBackend::new(store),
        _dir: dir,
    })
}

pub fn redb() -> Shared {
    let dir = tempfile::tempdir().unwrap();
    let store = RedbStore::open(dir.path(), Options::default()).unwrap();
    Arc::new(InDir {
        backend: KvBackend::new(store),
        _dir: dir,
    })
}
