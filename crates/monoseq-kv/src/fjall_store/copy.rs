//! [`FjallStore::copy_to`]: a consistent copy of a running store, for backups. One fjall
//! snapshot fixes the instant (every batch committed before the call, none after, each whole);
//! the copy is read from it while writers go on, and written as table files into a new
//! database by bulk ingestion.

use std::path::Path;
use std::time::{Duration, Instant};

use fjall::{CompressionType, Database, PersistMode, Readable};

use super::{FjallStore, KEYSPACE, fault, keyspace_options};
use crate::error::KvError;

/// What [`FjallStore::copy_to`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CopyStats {
    /// Keys copied.
    pub keys: u64,
    /// Bytes of keys and values copied.
    pub bytes: u64,
    /// How long taking the snapshot took: the only moment the copy touches the writers'
    /// path (it takes no lock they wait on).
    pub snapshot: Duration,
    /// How long reading and writing the copy took, syncs included.
    pub copy: Duration,
}

impl FjallStore {
    /// Copies what the store holds at the instant of the call into a new database in `dest`
    /// (which must not hold one): every batch committed before the call, whole, and nothing
    /// committed after. Writers are not held: the instant is a fjall snapshot, read while they
    /// go on. The copy is written as table files and synced before this returns; open it
    /// with [`FjallStore::open`].
    ///
    /// # Errors
    ///
    /// A [`KvError`] when reading the snapshot or writing the copy failed (the copy is then
    /// incomplete and must be discarded).
    pub fn copy_to(&self, dest: &Path) -> Result<CopyStats, KvError> {
        let started = Instant::now();
        let snapshot = self.files().db.snapshot();
        let snapshot_took = started.elapsed();
        let copy_started = Instant::now();
        let db = Database::builder(dest)
            .journal_compression(CompressionType::None)
            .open()
            .map_err(|e| fault("creating the copy's database", e))?;
        let kv = db
            .keyspace(KEYSPACE, keyspace_options)
            .map_err(|e| fault("creating the copy's keyspace", e))?;
        let (mut keys, mut bytes) = (0u64, 0u64);
        {
            let mut ingestion = kv
                .start_ingestion()
                .map_err(|e| fault("starting the copy", e))?;
            for guard in snapshot.iter(&self.files().kv) {
                let (key, value) = guard
                    .into_inner()
                    .map_err(|e| fault("reading the snapshot", e))?;
                keys += 1;
                bytes += (key.len() + value.len()) as u64;
                ingestion
                    .write(key, value)
                    .map_err(|e| fault("writing the copy", e))?;
            }
            ingestion
                .finish()
                .map_err(|e| fault("finishing the copy", e))?;
        }
        drop(snapshot);
        db.persist(PersistMode::SyncAll)
            .map_err(|e| fault("syncing the copy", e))?;
        drop(kv);
        drop(db);
        Ok(CopyStats {
            keys,
            bytes,
            snapshot: snapshot_took,
            copy: copy_started.elapsed(),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::{FjallStore, Key, KvStore, Options};

    #[test]
    fn a_copy_holds_what_was_committed_before_it_and_nothing_after() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = FjallStore::open(dir.path().join("live"), Options::default()).expect("open");
        for i in 0u32..1000 {
            store
                .put(Key::new(b"p", &i.to_be_bytes()), b"before")
                .expect("put");
        }
        let stats = store.copy_to(&dir.path().join("copy")).expect("copy");
        store
            .put(Key::new(b"p", &5000u32.to_be_bytes()), b"after")
            .expect("put");
        assert_eq!(stats.keys, 1000);
        drop(store);
        let copy = FjallStore::open(dir.path().join("copy"), Options::default()).expect("open");
        for i in 0u32..1000 {
            assert_eq!(
                copy.get(Key::new(b"p", &i.to_be_bytes())).expect("get"),
                Some(b"before".to_vec())
            );
        }
        assert_eq!(
            copy.get(Key::new(b"p", &5000u32.to_be_bytes()))
                .expect("get"),
            None
        );
    }
}
