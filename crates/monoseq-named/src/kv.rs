//! [`KvBackend`]: named sequences on the ordered key-value contract (`monoseq_kv::KvStore`,
//! embedded or in memory). Owns the key mapping (one partition per sequence, tagged
//! [`KV_TAG`]) and the rule that a write is synced before it is acknowledged, whatever the
//! store's durability mode (the writes of several sequences share one sync).

use std::sync::Arc;

use monoseq_kv::{CasError, Key, KvStore, Swap, WriteError};

use crate::backend::{Backend, BoxFuture, ConditionalWrite, Object, Version, WriteFailure};
use crate::error::StorageError;

/// First byte of the partition key of every named sequence in a key-value store (the event
/// store uses tags 0x01 to 0x05). The rest of the partition key is the sequence's storage key
/// ([`crate::Address::key`]); the clustering columns are empty, so each sequence is its own
/// small partition.
pub const KV_TAG: u8 = 0x10;

/// Attempts of a `create` whose answers were lost (each read back and found absent).
const UNKNOWN_ATTEMPTS_MAX: u32 = 3;

/// Named sequences on a [`KvStore`]. Versions are the stored bytes: `replace` is a
/// compare-and-swap of the whole value, `create` an insert-if-absent. Every successful write is
/// followed by [`KvStore::sync`] before it returns, so a number is never handed out before it
/// is durable (with group commit, concurrent writers share that flush). It
/// [combines](Backend::combines): [`Backend::write_each`] makes the writes of several
/// sequences with one [`KvStore::compare_and_swap_each`] (on PostgreSQL one pipelined
/// transaction and one commit) and one sync. Storage calls run on tokio's blocking pool because the embedded
/// engines block on disk.
///
/// # Example
///
/// ```
/// use monoseq_kv::MemoryStore;
/// use monoseq_named::{KvBackend, NextOptions, Sequences};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
/// let address = "orders/invoice".parse()?;
/// assert_eq!(sequences.next(&address, &NextOptions::new()).await?, 1);
/// assert_eq!(sequences.get(&address).await?, Some(2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct KvBackend<S: KvStore> {
    store: Arc<S>,
}

impl<S: KvStore> std::fmt::Debug for KvBackend<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvBackend").finish_non_exhaustive()
    }
}

impl<S: KvStore> KvBackend<S> {
    /// A backend on `store`.
    pub fn new(store: S) -> KvBackend<S> {
        KvBackend::shared(Arc::new(store))
    }

    /// A backend on a store shared with other users (the event store, for instance).
    pub fn shared(store: Arc<S>) -> KvBackend<S> {
        KvBackend { store }
    }

    /// The store.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    async fn blocking<T: Send + 'static>(
        &self,
        context: &'static str,
        f: impl FnOnce(&S) -> T + Send + 'static,
    ) -> Result<T, StorageError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| StorageError::new(context, e))
    }
}

fn partition(key: &str) -> Vec<u8> {
    let mut partition = Vec::with_capacity(1 + key.len());
    partition.push(KV_TAG);
    partition.extend_from_slice(key.as_bytes());
    partition
}

fn sync_after_write<S: KvStore>(store: &S, bytes: Vec<u8>) -> Result<Version, WriteFailure> {
    store
        .sync()
        .map_err(|e| StorageError::new("syncing the sequence", e))?;
    Ok(Version::new(bytes))
}

/// [`Backend::write_each`] on the blocking pool: one [`KvStore::compare_and_swap_each`] for
/// every write, then one [`KvStore::sync`] for those that landed.
fn write_each_blocking<S: KvStore>(
    store: &S,
    writes: &[ConditionalWrite],
) -> Vec<Result<Version, WriteFailure>> {
    let partitions: Vec<Vec<u8>> = writes.iter().map(|w| partition(&w.key)).collect();
    let swaps: Vec<Swap<'_>> = writes
        .iter()
        .zip(&partitions)
        .map(|(write, partition)| Swap {
            key: Key::new(partition, b""),
            expected: write.expected.as_ref().map(Version::as_bytes),
            new: Some(&write.bytes),
        })
        .collect();
    let swapped = store.compare_and_swap_each(&swaps);
    let mut answers: Vec<Result<(), WriteFailure>> = swaps
        .iter()
        .zip(swapped)
        .map(|(swap, result)| swap_answer(swap, result))
        .collect();
    if answers.iter().any(Result::is_ok)
        && let Err(e) = store.sync()
    {
        let error = StorageError::new("syncing the sequences", e);
        for answer in answers.iter_mut().filter(|a| a.is_ok()) {
            *answer = Err(error.clone_lossy().into());
        }
    }
    answers
        .into_iter()
        .zip(writes)
        .map(|(answer, write)| answer.map(|()| Version::new(write.bytes.clone())))
        .collect()
}

/// What one swap of [`write_each_blocking`] answers. A lost answer is a conflict, as for
/// [`Backend::create`] and [`Backend::replace`]: the caller reads again, and what may have
/// landed stays a gap (it is never claimed: another writer may have stored the same bytes).
fn swap_answer(swap: &Swap<'_>, result: Result<(), CasError>) -> Result<(), WriteFailure> {
    let context = match swap.expected {
        None => "creating the sequence",
        Some(_) => "updating the sequence",
    };
    match result {
        Ok(()) => Ok(()),
        Err(CasError::Mismatch { .. }) => Err(WriteFailure::Conflict),
        Err(e) if e.is_outcome_unknown() => Err(WriteFailure::Conflict),
        Err(e) => Err(StorageError::new(context, e).into()),
    }
}

impl<S: KvStore> Backend for KvBackend<S> {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        let partition = partition(key);
        Box::pin(async move {
            let found = self
                .blocking("reading the sequence", move |store| {
                    store.get(Key::new(&partition, b""))
                })
                .await?
                .map_err(|e| StorageError::new("reading the sequence", e))?;
            Ok(found.map(|bytes| Object {
                version: Version::new(bytes.clone()),
                bytes,
            }))
        })
    }

    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        let partition = partition(key);
        Box::pin(async move {
            self.blocking("creating the sequence", move |store| {
                let key = Key::new(&partition, b"");
                let mut attempts = 0;
                loop {
                    attempts += 1;
                    match store.insert_if_absent(key, &bytes) {
                        Ok(()) => return sync_after_write(store, bytes),
                        Err(WriteError::Conflict { .. }) => return Err(WriteFailure::Conflict),
                        Err(e) if e.is_outcome_unknown() && attempts < UNKNOWN_ATTEMPTS_MAX => {
                            // Read back: absent means it did not land (try again). Present
                            // is a conflict even with our own bytes, which another process
                            // creating the sequence in the same millisecond may have written
                            // too: the caller reads it and writes on it, leaving a gap.
                            match store.get(key) {
                                Ok(None) => continue,
                                Ok(Some(_)) => return Err(WriteFailure::Conflict),
                                Err(read) => {
                                    return Err(
                                        StorageError::new("creating the sequence", read).into()
                                    );
                                }
                            }
                        }
                        Err(e) => {
                            return Err(StorageError::new("creating the sequence", e).into());
                        }
                    }
                }
            })
            .await?
        })
    }

    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        let partition = partition(key);
        let expected = expected.as_bytes().to_vec();
        Box::pin(async move {
            self.blocking("updating the sequence", move |store| {
                match store.compare_and_swap(
                    Key::new(&partition, b""),
                    Some(&expected),
                    Some(&bytes),
                ) {
                    Ok(()) => sync_after_write(store, bytes),
                    Err(CasError::Mismatch { .. }) => Err(WriteFailure::Conflict),
                    // The swap may have landed, but its number is never handed out: the caller
                    // reads the sequence again and swaps from what is stored. A landed swap
                    // leaves a gap; it cannot be claimed, because another writer that read
                    // the same version may have stored the very same bytes.
                    Err(e) if e.is_outcome_unknown() => Err(WriteFailure::Conflict),
                    Err(e) => Err(StorageError::new("updating the sequence", e).into()),
                }
            })
            .await?
        })
    }

    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        let partition = partition(key);
        Box::pin(async move {
            self.blocking("deleting the sequence", move |store| {
                store.delete(Key::new(&partition, b""))?;
                store.sync()?;
                Ok::<(), WriteError>(())
            })
            .await?
            .map_err(|e| StorageError::new("deleting the sequence", e))
        })
    }

    /// One hop to the blocking pool, one [`KvStore::compare_and_swap_each`] (on PostgreSQL one
    /// transaction and one commit) and one [`KvStore::sync`] for all of `writes`.
    fn write_each(
        &self,
        writes: Vec<ConditionalWrite>,
    ) -> BoxFuture<'_, Vec<Result<Version, WriteFailure>>> {
        Box::pin(async move {
            let count = writes.len();
            let written = self
                .blocking("writing the sequences", move |store| {
                    write_each_blocking(store, &writes)
                })
                .await;
            written.unwrap_or_else(|error| {
                (0..count)
                    .map(|_| Err(error.clone_lossy().into()))
                    .collect()
            })
        })
    }

    fn combines(&self) -> bool {
        true
    }
}
