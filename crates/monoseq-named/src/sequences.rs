//! [`Sequences`]: every operation of the reference design on a [`Backend`], made atomic without
//! locks by optimistic concurrency (read value and version, conditional write, retry with jittered
//! backoff until the caller's timeout). The timeout bounds the retries, never an attempt: every
//! call makes at least one attempt (a timeout of 0 tries once), and a write once started is
//! waited for, so a busy answer always means that nothing was written. The options are in `sequences/options.rs`; concurrent
//! `next` calls on one sequence are combined into one conditional write in `sequences/lane.rs`.

mod lane;
mod options;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use monoseq_backoff::Backoff;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::address::Address;
use crate::backend::{Backend, Object, WriteFailure};
use crate::cache::{CacheOptions, NumberCache};
use crate::combine::Combiner;
use crate::error::{DeleteError, NextError, ReadError, SetError, StorageError};
use crate::record::{METADATA_BYTES_MAX, Metadata, SequenceData, VALUE_MAX, metadata_len, now_ms};
pub use lane::{COMBINE_CALLS_MAX, LANE_CALLS_MAX};
use lane::{Known, Waiter, lead_lane};
pub use options::{NextOptions, SetOptions, TIMEOUT_DEFAULT, TIMEOUT_MAX};

/// First backoff after a lost race; it doubles per attempt up to [`BACKOFF_MAX`], and each
/// sleep is drawn uniformly between zero and that bound (full jitter).
pub const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Largest backoff bound.
pub const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// Named sequences on one backend: cheap to clone, safe to share between tasks. Needs a tokio
/// runtime with a timer (`enable_time`) to run its futures.
///
/// Atomicity comes from conditional writes only: there is no lock, so nothing can expire
/// while a caller is stalled, and a caller that resumes after others wrote finds its write
/// refused and reads again. Within one process, concurrent `next` calls on one sequence queue
/// behind one leader task that serves them together with one conditional write (numbers in
/// call order); on a backend that [combines](Backend::combines) writes, the conditional writes
/// of different sequences go out together in one [`Backend::write_each`], each succeeding or
/// failing on its own condition. Across processes they race through the backend.
///
/// With a number cache ([`Sequences::with_cache`], PostgreSQL's `CACHE`), one write reserves
/// a block of numbers and later calls of this process take theirs from it in memory; numbers
/// stay unique across processes but are ordered only within each, and what a crashed or
/// restarted process reserved and did not hand out is a gap.
///
/// # Example
///
/// ```
/// use monoseq_kv::MemoryStore;
/// use monoseq_named::{Address, KvBackend, NextOptions, Scope, Sequences, SetOptions};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
/// let invoice = Address::new(Scope::resource("invoices")?, "number")?;
/// let first = sequences.next(&invoice, &NextOptions::new().initial(1000)).await?;
/// assert_eq!(first, 1000);
/// assert_eq!(sequences.increment(&invoice, &NextOptions::new()).await?, 1002);
/// sequences.reset(&invoice, 1, &SetOptions::new()).await?;
/// assert_eq!(sequences.next(&invoice, &NextOptions::new()).await?, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Sequences {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sequences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sequences").finish_non_exhaustive()
    }
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// Carries the writes of all lanes in shared calls, when the backend combines them.
    combiner: Option<Arc<Combiner>>,
    /// One lane per sequence with a running leader; the leader removes it when idle.
    lanes: Mutex<HashMap<String, VecDeque<Waiter>>>,
    /// The state this process last wrote, per sequence whose lane is idle. Only a hint: a
    /// batch writes conditionally on it, and a stale one is refused like a stale read.
    known: Mutex<HashMap<String, Known>>,
    /// The blocks of reserved numbers, when the cache is on.
    cache: Option<NumberCache>,
}

impl Sequences {
    /// Sequences stored in `backend`.
    pub fn new(backend: impl Backend) -> Sequences {
        let backend: Arc<dyn Backend> = Arc::new(backend);
        let combiner = backend
            .combines()
            .then(|| Arc::new(Combiner::new(Arc::clone(&backend))));
        Sequences::build(backend, combiner, CacheOptions::default())
    }

    fn build(
        backend: Arc<dyn Backend>,
        combiner: Option<Arc<Combiner>>,
        cache: CacheOptions,
    ) -> Sequences {
        Sequences {
            inner: Arc::new(Inner {
                backend,
                combiner,
                lanes: Mutex::new(HashMap::new()),
                known: Mutex::new(HashMap::new()),
                cache: NumberCache::new(cache),
            }),
        }
    }

    /// These sequences with a number cache (PostgreSQL's `CACHE`): with
    /// [`CacheOptions::numbers_value`] N above 1, a `next` of increment i takes i numbers from
    /// this process's block of the sequence when the block holds them, with no storage call;
    /// otherwise one conditional write reserves max(N, i) numbers (the stored value moves past
    /// the whole block), answers the calls waiting, and keeps the rest as the block once the
    /// write is durable. Concurrent callers of one sequence wait for one refill, and the
    /// refills of different sequences share durable writes as other writes do.
    ///
    /// What it costs: a crash or restart skips what was reserved and not handed out (a gap,
    /// never a repeat), and numbers are ordered only per process: another process sharing the
    /// storage reserves above this one's block while this one still hands it out. `get` here
    /// answers the block's next number; elsewhere the stored value (the reserved ceiling). A
    /// `reset`, `set` or `delete` through this value drops the block first (and any block a
    /// refill in flight would install); through another process it does not reach the block
    /// until it runs out. N = 1 (the default) is the behaviour without the option.
    ///
    /// Meant to be called on a new `Sequences`: the value returned shares the backend and
    /// starts with no block, lane or remembered state of its own.
    ///
    /// # Example
    ///
    /// ```
    /// use std::num::NonZeroU64;
    /// use monoseq_kv::MemoryStore;
    /// use monoseq_named::{CacheOptions, KvBackend, NextOptions, Sequences};
    ///
    /// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
    /// let cache = CacheOptions::new(NonZeroU64::new(32).unwrap());
    /// let sequences = Sequences::new(KvBackend::new(MemoryStore::new())).with_cache(cache);
    /// let ids = "orders/id".parse()?;
    /// assert_eq!(sequences.next(&ids, &NextOptions::new()).await?, 1); // stores 33
    /// assert_eq!(sequences.next(&ids, &NextOptions::new()).await?, 2); // from memory
    /// assert_eq!(sequences.get(&ids).await?, Some(3));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # })?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn with_cache(self, cache: CacheOptions) -> Sequences {
        let inner = &self.inner;
        Sequences::build(Arc::clone(&inner.backend), inner.combiner.clone(), cache)
    }

    /// Hands out the sequence's current value and advances it by the increment (the reference
    /// design's pre-increment `next`). A sequence that does not exist is created at the initial
    /// value. With increment N the caller owns the N numbers starting at the returned one.
    ///
    /// A number is returned only after the write that advanced past it is durable, so it is
    /// never handed out again (short of a `reset`, `set` or `delete`).
    ///
    /// # Errors
    ///
    /// - [`NextError::InvalidValue`], [`NextError::MetadataTooLarge`]: bad options.
    /// - [`NextError::Overflow`]: the sequence would pass [`VALUE_MAX`].
    /// - [`NextError::InvalidStored`]: the stored object is not a sequence (left unchanged).
    /// - [`NextError::Busy`]: the timeout passed while other writers won; nothing was written
    ///   (an attempt under way when the timeout passes runs to its end, and a timeout of 0
    ///   makes one attempt).
    /// - [`NextError::LaneFull`]: [`LANE_CALLS_MAX`] calls of this process already wait for
    ///   this sequence; nothing was tried.
    /// - [`NextError::Storage`]: a storage fault.
    pub async fn next(&self, address: &Address, options: &NextOptions) -> Result<u64, NextError> {
        if options.initial > VALUE_MAX {
            return Err(NextError::InvalidValue {
                value: options.initial,
                max: VALUE_MAX,
            });
        }
        if let Some(len) = oversized_metadata(options.metadata.as_ref()) {
            return Err(NextError::MetadataTooLarge {
                len,
                max: METADATA_BYTES_MAX,
            });
        }
        if let (Some(cache), None) = (&self.inner.cache, &options.metadata)
            && let Some(first) = cache.take(address.key(), options.increment.get())
        {
            return Ok(first);
        }
        let started = Instant::now();
        let (reply, answer) = oneshot::channel();
        let waiter = Waiter {
            increment: options.increment.get(),
            initial: options.initial,
            metadata: options.metadata.clone(),
            started,
            deadline: started + options.timeout,
            timeout: options.timeout,
            reply,
        };
        if self.queue(address, waiter)? {
            // A task of its own, so that a caller dropping its future never strands the
            // callers queued behind it.
            tokio::spawn(lead_lane(Arc::clone(&self.inner), address.clone()));
        }
        answer.await.unwrap_or_else(|_| {
            Err(NextError::Storage(StorageError::message(
                "waiting for the sequence's writer",
                "the writer task ended without answering (runtime shutting down?)",
            )))
        })
    }

    /// How many `next` calls of this process wait in the lane of `address` (not counting the
    /// batch being written): the queue that [`LANE_CALLS_MAX`] bounds.
    pub fn waiting_calls(&self, address: &Address) -> usize {
        self.inner
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(address.key())
            .map_or(0, VecDeque::len)
    }

    /// Advances the sequence by the increment and returns the value after it (the reference
    /// design's post-increment `increment`): `next + increment`.
    ///
    /// # Errors
    ///
    /// As [`Sequences::next`].
    pub async fn increment(
        &self,
        address: &Address,
        options: &NextOptions,
    ) -> Result<u64, NextError> {
        let first = self.next(address, options).await?;
        Ok(first + options.increment.get())
    }

    /// The stored value (what the next `next` returns), `None` if the sequence does not exist.
    /// With a [cache](Sequences::with_cache), the next number of this process's block when it
    /// holds one (no storage call).
    ///
    /// # Errors
    ///
    /// [`ReadError::InvalidStored`] or [`ReadError::Storage`].
    pub async fn get(&self, address: &Address) -> Result<Option<u64>, ReadError> {
        if let Some(next) = self.cached_next(address) {
            return Ok(Some(next));
        }
        Ok(self.get_data(address).await?.map(|data| data.value))
    }

    /// The stored sequence (value, name, times, metadata), `None` if it does not exist. With a
    /// [cache](Sequences::with_cache), its value is the next number of this process's block
    /// when it holds one.
    ///
    /// # Errors
    ///
    /// [`ReadError::InvalidStored`] or [`ReadError::Storage`].
    pub async fn get_data(&self, address: &Address) -> Result<Option<SequenceData>, ReadError> {
        let Some(object) = self.inner.backend.load(address.key()).await? else {
            return Ok(None);
        };
        let mut data = SequenceData::decode(&object.bytes, address.name()).map_err(|reason| {
            ReadError::InvalidStored {
                key: address.key().to_owned(),
                reason: reason.to_string(),
            }
        })?;
        if let Some(next) = self.cached_next(address) {
            data.value = next;
        }
        Ok(Some(data))
    }

    /// The next number of this process's block of `address`, if it holds one.
    fn cached_next(&self, address: &Address) -> Option<u64> {
        self.inner.cache.as_ref()?.peek(address.key())
    }

    /// Drops this process's block of `address` (a `reset`, `set` or `delete` runs), and the
    /// right of a refill in flight to install one.
    fn drop_block(&self, address: &Address) {
        if let Some(cache) = &self.inner.cache {
            cache.drop_block(address.key());
        }
    }

    /// Whether an object exists at the sequence's key (valid or not).
    ///
    /// # Errors
    ///
    /// [`ReadError::Storage`].
    pub async fn exists(&self, address: &Address) -> Result<bool, ReadError> {
        Ok(self.inner.backend.load(address.key()).await?.is_some())
    }

    /// Sets the stored value to `value` (the next `next` returns it), creating the sequence if
    /// needed. Numbers handed out before may be handed out again: this is an operator's tool.
    /// With a [cache](Sequences::with_cache), this process's block is dropped before the write
    /// and again after it (a refill that ran meanwhile installs nothing); other processes'
    /// blocks stay until used.
    ///
    /// # Errors
    ///
    /// - [`SetError::InvalidValue`], [`SetError::MetadataTooLarge`]: bad input.
    /// - [`SetError::InvalidStored`]: the stored object is not a sequence (left unchanged:
    ///   delete it first).
    /// - [`SetError::Busy`]: the timeout passed while other writers won; nothing was written
    ///   (as for [`Sequences::next`], every call makes at least one attempt and a write once
    ///   started is waited for).
    /// - [`SetError::Storage`].
    pub async fn reset(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, SetError> {
        if value > VALUE_MAX {
            return Err(SetError::InvalidValue {
                value,
                max: VALUE_MAX,
            });
        }
        if let Some(len) = oversized_metadata(options.metadata.as_ref()) {
            return Err(SetError::MetadataTooLarge {
                len,
                max: METADATA_BYTES_MAX,
            });
        }
        self.drop_block(address);
        let written = self.reset_loop(address, value, options).await;
        self.drop_block(address);
        written
    }

    /// The attempts of [`Sequences::reset`]: the first always, then more after lost races
    /// while the timeout has not passed.
    async fn reset_loop(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, SetError> {
        let started = Instant::now();
        let deadline = started + options.timeout;
        let mut attempts = 0;
        loop {
            attempts += 1;
            if let Some(data) = self.reset_once(address, value, options).await? {
                return Ok(data);
            }
            if !backoff(attempts, deadline).await {
                return Err(SetError::Busy {
                    address: address.to_string(),
                    attempts,
                    waited: started.elapsed(),
                });
            }
        }
    }

    /// One read and conditional write of [`Sequences::reset`]: the sequence written, or `None`
    /// when another writer won the race (nothing was written). Runs to its end whatever the
    /// caller's timeout: a write cut short could land after its caller was told it had not.
    async fn reset_once(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<Option<SequenceData>, SetError> {
        let backend = &self.inner.backend;
        let loaded = backend.load(address.key()).await?;
        let now = now_ms();
        let metadata = options.metadata.clone();
        let (data, written) = match loaded {
            None => {
                let data = created(address, value, metadata, now);
                let written = backend.create(address.key(), data.encode()).await;
                (data, written)
            }
            Some(Object { bytes, version }) => {
                let old = SequenceData::decode(&bytes, address.name()).map_err(|reason| {
                    SetError::InvalidStored {
                        key: address.key().to_owned(),
                        reason: reason.to_string(),
                    }
                })?;
                let data = rewritten(old, value, metadata, now);
                let written = backend
                    .replace(address.key(), &version, data.encode())
                    .await;
                (data, written)
            }
        };
        match written {
            Ok(_) => Ok(Some(data)),
            Err(WriteFailure::Storage(e)) => Err(e.into()),
            Err(WriteFailure::Conflict) => Ok(None),
        }
    }

    /// Seed 003's `set`: [`Sequences::reset`] (with metadata through [`SetOptions`]).
    ///
    /// # Errors
    ///
    /// As [`Sequences::reset`].
    pub async fn set(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, SetError> {
        self.reset(address, value, options).await
    }

    /// Deletes the sequence (absent is fine). A later `next` starts it over at its initial
    /// value, so numbers may be handed out again. With a [cache](Sequences::with_cache), this
    /// process's block is dropped as by [`Sequences::reset`].
    ///
    /// # Errors
    ///
    /// [`DeleteError::Storage`].
    pub async fn delete(&self, address: &Address) -> Result<(), DeleteError> {
        self.drop_block(address);
        let removed = self.inner.backend.remove(address.key()).await;
        self.drop_block(address);
        Ok(removed?)
    }
}

/// The length of `metadata` when it is over [`METADATA_BYTES_MAX`].
fn oversized_metadata(metadata: Option<&Metadata>) -> Option<usize> {
    metadata
        .map(metadata_len)
        .filter(|&len| len > METADATA_BYTES_MAX)
}

/// A new sequence at `address` holding `value`, written at `now` (Unix milliseconds).
fn created(address: &Address, value: u64, metadata: Option<Metadata>, now: u64) -> SequenceData {
    SequenceData {
        name: address.name().to_owned(),
        value,
        created_at_ms: now,
        updated_at_ms: now,
        revision: 1,
        metadata: metadata.unwrap_or_default(),
    }
}

/// Stored sequence `old` holding `value` in its next revision, written at `now` (Unix
/// milliseconds); its metadata stays unless `metadata` replaces it.
fn rewritten(old: SequenceData, value: u64, metadata: Option<Metadata>, now: u64) -> SequenceData {
    SequenceData {
        value,
        updated_at_ms: now.max(old.created_at_ms),
        revision: old.revision + 1,
        metadata: metadata.unwrap_or(old.metadata),
        ..old
    }
}

/// The backoff after a lost race: [`BACKOFF_FIRST`] doubling to [`BACKOFF_MAX`].
const BACKOFF: Backoff = Backoff::new(BACKOFF_FIRST, BACKOFF_MAX);

/// Sleeps a jittered backoff before attempt `attempts + 1`; `false` when the deadline leaves
/// no time for another attempt.
async fn backoff(attempts: u32, deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    tokio::time::sleep_until((now + BACKOFF.jittered(attempts)).min(deadline)).await;
    Instant::now() < deadline
}
