//! [`Sequences`]: every operation of the reference design on a [`Backend`], made atomic without
//! locks by optimistic concurrency (read value and version, conditional write, retry with jittered
//! backoff until the caller's timeout). Owns the options ([`NextOptions`], [`SetOptions`]) and the
//! in-process combining of concurrent `next` calls on one sequence into one conditional write (one
//! "lane" per sequence with a leader task), which keeps writers of one process from racing each
//! other and turns N waiting callers into one storage round trip: between batches the process
//! remembers the state it last wrote, so a batch writes on it without reading first (a stale memory
//! is refused like a stale read). On a backend that [combines](Backend::combines), the leaders of
//! different sequences hand their writes to one combiner (`combine.rs`), so the ready batches of
//! every sequence share one durable write. With a number cache (`cache.rs`) a `next` takes its
//! numbers from this process's block of the sequence without a storage call, and a lane's write
//! reserves a whole block.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use monoseq_backoff::Backoff;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::address::Address;
use crate::backend::{Backend, ConditionalWrite, Object, Version, WriteFailure};
use crate::cache::{CacheOptions, NumberCache};
use crate::combine::Combiner;
use crate::error::{DeleteError, NextError, ReadError, SetError, StorageError};
use crate::record::{METADATA_BYTES_MAX, Metadata, SequenceData, VALUE_MAX, metadata_len, now_ms};

/// Default timeout of an operation (the reference design's `lockTimeout`, docs/invariants.md).
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Longest timeout accepted; longer ones are cut to it.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(300);
/// First backoff after a lost race; it doubles per attempt up to [`BACKOFF_MAX`], and each
/// sleep is drawn uniformly between zero and that bound (full jitter).
pub const BACKOFF_FIRST: Duration = Duration::from_millis(1);
/// Largest backoff bound.
pub const BACKOFF_MAX: Duration = Duration::from_millis(100);
/// Most concurrent `next` calls of one process served by one conditional write.
pub const COMBINE_CALLS_MAX: usize = 1024;
/// Most `next` calls of one process waiting in one sequence's lane (besides the batch being
/// written); a call past it answers [`NextError::LaneFull`] at once instead of queueing, so
/// memory stays bounded while storage is slow.
pub const LANE_CALLS_MAX: usize = 16 * COMBINE_CALLS_MAX;
/// Most sequences whose last written state this process remembers between batches (so that
/// a batch writes without reading first); past it the memory is dropped and refilled.
const KNOWN_SEQUENCES_MAX: usize = 4096;

/// Options of [`Sequences::next`] and [`Sequences::increment`].
///
/// # Example
///
/// ```
/// use std::num::NonZeroU64;
/// use std::time::Duration;
/// use monoseq_named::NextOptions;
///
/// let options = NextOptions::new()
///     .initial(1000)
///     .increment(NonZeroU64::new(100).unwrap()) // reserve 100 numbers at once
///     .timeout(Duration::from_secs(1));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NextOptions {
    initial: u64,
    increment: NonZeroU64,
    timeout: Duration,
    metadata: Option<Metadata>,
}

impl Default for NextOptions {
    fn default() -> NextOptions {
        NextOptions {
            initial: 1,
            increment: NonZeroU64::MIN,
            timeout: TIMEOUT_DEFAULT,
            metadata: None,
        }
    }
}

impl NextOptions {
    /// Initial value 1, increment 1, timeout [`TIMEOUT_DEFAULT`], no metadata.
    pub fn new() -> NextOptions {
        NextOptions::default()
    }

    /// The first number of a sequence that does not exist yet (default 1).
    #[must_use]
    pub fn initial(mut self, initial: u64) -> NextOptions {
        self.initial = initial;
        self
    }

    /// How many numbers to take (default 1): `next` returns the first of them, the stored
    /// value advances by this much (batch reservation).
    #[must_use]
    pub fn increment(mut self, increment: NonZeroU64) -> NextOptions {
        self.increment = increment;
        self
    }

    /// How long to keep retrying lost races before answering busy (default
    /// [`TIMEOUT_DEFAULT`], at most [`TIMEOUT_MAX`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> NextOptions {
        self.timeout = timeout.min(TIMEOUT_MAX);
        self
    }

    /// Metadata to store with the sequence, replacing what it had. Calls carrying metadata
    /// are not combined with others.
    #[must_use]
    pub fn metadata(mut self, metadata: Metadata) -> NextOptions {
        self.metadata = Some(metadata);
        self
    }

    /// The increment.
    pub fn increment_value(&self) -> NonZeroU64 {
        self.increment
    }

    /// The timeout.
    pub fn timeout_value(&self) -> Duration {
        self.timeout
    }

    /// The initial value.
    pub fn initial_value(&self) -> u64 {
        self.initial
    }

    /// The metadata, if any.
    pub fn metadata_value(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }
}

/// Options of [`Sequences::reset`] and [`Sequences::set`].
#[derive(Debug, Clone, PartialEq)]
pub struct SetOptions {
    timeout: Duration,
    metadata: Option<Metadata>,
}

impl Default for SetOptions {
    fn default() -> SetOptions {
        SetOptions {
            timeout: TIMEOUT_DEFAULT,
            metadata: None,
        }
    }
}

impl SetOptions {
    /// Timeout [`TIMEOUT_DEFAULT`], metadata kept as stored.
    pub fn new() -> SetOptions {
        SetOptions::default()
    }

    /// How long to keep retrying lost races (default [`TIMEOUT_DEFAULT`], at most
    /// [`TIMEOUT_MAX`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> SetOptions {
        self.timeout = timeout.min(TIMEOUT_MAX);
        self
    }

    /// Metadata replacing the stored one (without it the stored metadata is kept).
    #[must_use]
    pub fn metadata(mut self, metadata: Metadata) -> SetOptions {
        self.metadata = Some(metadata);
        self
    }

    /// The timeout.
    pub fn timeout_value(&self) -> Duration {
        self.timeout
    }

    /// The metadata, if any.
    pub fn metadata_value(&self) -> Option<&Metadata> {
        self.metadata.as_ref()
    }
}

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

/// A sequence as this process last wrote it, with the version that write answered.
struct Known {
    data: SequenceData,
    version: Version,
}

/// One `next` call waiting in a lane.
struct Waiter {
    increment: u64,
    initial: u64,
    metadata: Option<Metadata>,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
    reply: oneshot::Sender<Result<u64, NextError>>,
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
    /// - [`NextError::Busy`]: the timeout passed while other writers won (or storage was too
    ///   slow); if a write was in flight it may have consumed numbers (a gap, never a
    ///   duplicate).
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

    /// Queues `waiter` in the lane of `address`: `true` when it starts the lane (its caller
    /// starts the leader).
    fn queue(&self, address: &Address, waiter: Waiter) -> Result<bool, NextError> {
        let mut lanes = self
            .inner
            .lanes
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match lanes.get_mut(address.key()) {
            Some(lane) if lane.len() >= LANE_CALLS_MAX => Err(NextError::LaneFull {
                address: address.to_string(),
                waiting: lane.len(),
                max: LANE_CALLS_MAX,
            }),
            Some(lane) => {
                lane.push_back(waiter);
                Ok(false)
            }
            None => {
                lanes.insert(address.key().to_owned(), VecDeque::from([waiter]));
                Ok(true)
            }
        }
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
                reason,
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
    /// - [`SetError::Busy`], [`SetError::Storage`].
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

    /// The attempts of [`Sequences::reset`] until one writes or the timeout passes.
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
            let busy = || SetError::Busy {
                address: address.to_string(),
                attempts,
                waited: started.elapsed(),
            };
            if let Some(data) = self
                .reset_once(address, value, options, deadline, &busy)
                .await?
            {
                return Ok(data);
            }
            if !backoff(attempts, deadline).await {
                return Err(busy());
            }
        }
    }

    /// One read and conditional write of [`Sequences::reset`]: the sequence written, or `None`
    /// when another writer won the race. `busy` is the error of running out of time.
    async fn reset_once(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
        deadline: Instant,
        busy: impl Fn() -> SetError,
    ) -> Result<Option<SequenceData>, SetError> {
        let backend = &self.inner.backend;
        let loaded = tokio::time::timeout_at(deadline, backend.load(address.key()))
            .await
            .map_err(|_| busy())??;
        let now = now_ms();
        let metadata = options.metadata.clone();
        let (data, written) = match loaded {
            None => {
                let data = created(address, value, metadata, now);
                let write = backend.create(address.key(), data.encode());
                (data, tokio::time::timeout_at(deadline, write).await)
            }
            Some(Object { bytes, version }) => {
                let old = SequenceData::decode(&bytes, address.name()).map_err(|reason| {
                    SetError::InvalidStored {
                        key: address.key().to_owned(),
                        reason,
                    }
                })?;
                let data = rewritten(old, value, metadata, now);
                let write = backend.replace(address.key(), &version, data.encode());
                (data, tokio::time::timeout_at(deadline, write).await)
            }
        };
        match written.map_err(|_| busy())? {
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

/// The leader of a lane: serves the queued calls of one sequence, batch after batch, until the
/// lane is empty, then removes it.
async fn lead_lane(inner: Arc<Inner>, address: Address) {
    let mut guard = LaneGuard {
        inner: &inner,
        key: address.key(),
        finished: false,
    };
    let mut known = inner.take_known(address.key());
    loop {
        let batch = {
            let mut lanes = inner.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            let lane = lanes
                .get_mut(address.key())
                .expect("a lane lives while its leader runs");
            if lane.is_empty() {
                // Remembered before the lane goes, so that the next leader finds it.
                inner.keep_known(address.key(), known);
                lanes.remove(address.key());
                guard.finished = true;
                return;
            }
            take_batch(lane)
        };
        let batch = serve_from_block(&inner, address.key(), batch);
        if !batch.is_empty() {
            serve_batch(&inner, &address, batch, &mut known).await;
        }
    }
}

impl Inner {
    /// Makes one sequence's conditional write: through the combiner, with the writes of other
    /// sequences, when the backend combines; else on its own.
    async fn write(&self, write: ConditionalWrite) -> Result<Version, WriteFailure> {
        if let Some(combiner) = &self.combiner {
            return combiner.write(write).await;
        }
        match &write.expected {
            None => self.backend.create(&write.key, write.bytes).await,
            Some(expected) => {
                self.backend
                    .replace(&write.key, expected, write.bytes)
                    .await
            }
        }
    }

    /// The state this process last wrote for `key`, taken out for a lane's leader.
    fn take_known(&self, key: &str) -> Option<Known> {
        self.known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
    }

    /// Remembers what a leader last wrote (nothing when its last attempt did not succeed).
    fn keep_known(&self, key: &str, known: Option<Known>) {
        let Some(known) = known else { return };
        let mut all = self.known.lock().unwrap_or_else(PoisonError::into_inner);
        if all.len() >= KNOWN_SEQUENCES_MAX {
            all.clear();
        }
        all.insert(key.to_owned(), known);
    }
}

/// Removes a lane whose leader stopped early (its task was cancelled, as when the runtime
/// shuts down, or it panicked), so that the next call starts a new leader instead of queueing
/// behind none. The waiters still queued get an error when their reply is dropped.
struct LaneGuard<'a> {
    inner: &'a Inner,
    key: &'a str,
    finished: bool,
}

impl Drop for LaneGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let mut lanes = self
                .inner
                .lanes
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            lanes.remove(self.key);
        }
    }
}

/// Answers the waiters at the front of `batch` whose numbers this process's block holds (a
/// refill may have installed it since they queued); returns the others.
fn serve_from_block(inner: &Inner, key: &str, batch: Vec<Waiter>) -> Vec<Waiter> {
    let Some(cache) = &inner.cache else {
        return batch;
    };
    let mut waiters = batch.into_iter();
    let mut rest = Vec::new();
    for waiter in waiters.by_ref() {
        let taken = match waiter.metadata {
            None => cache.take(key, waiter.increment),
            Some(_) => None,
        };
        match taken {
            Some(first) => {
                let _ = waiter.reply.send(Ok(first));
            }
            None => {
                rest.push(waiter);
                break;
            }
        }
    }
    rest.extend(waiters);
    rest
}

/// The first waiter and the compatible ones right behind it (same initial value, no
/// metadata), as many as fit below [`VALUE_MAX`] and [`COMBINE_CALLS_MAX`].
fn take_batch(lane: &mut VecDeque<Waiter>) -> Vec<Waiter> {
    let first = lane.pop_front().expect("the lane is not empty");
    let mut total = first.increment;
    let combinable = first.metadata.is_none();
    let initial = first.initial;
    let mut batch = vec![first];
    while combinable && batch.len() < COMBINE_CALLS_MAX {
        let Some(next) = lane.front() else { break };
        if next.metadata.is_some() || next.initial != initial {
            break;
        }
        match total.checked_add(next.increment) {
            Some(sum) if sum <= VALUE_MAX => total = sum,
            _ => break,
        }
        batch.push(lane.pop_front().expect("front exists"));
    }
    batch
}

/// Serves one batch with one conditional write per attempt: the waiters get consecutive
/// ranges, in order. Waiters whose deadline passed are answered busy between attempts.
/// `known` is what this process last wrote, if that write succeeded: the attempt writes on it
/// without reading first, and leaves in it what it wrote, or nothing.
async fn serve_batch(
    inner: &Inner,
    address: &Address,
    mut batch: Vec<Waiter>,
    known: &mut Option<Known>,
) {
    let mut attempts = 0u32;
    loop {
        // Answer the waiters out of time before trying (again).
        let now = Instant::now();
        let (expired, live): (Vec<Waiter>, Vec<Waiter>) =
            batch.into_iter().partition(|w| w.deadline <= now);
        for waiter in expired {
            answer_busy(waiter, address, attempts);
        }
        batch = live;
        let Some(deadline) = batch.iter().map(|w| w.deadline).max() else {
            return;
        };
        attempts += 1;
        match attempt(inner, address, &mut batch, deadline, known).await {
            Attempt::Done => return,
            Attempt::Stale => {}
            Attempt::Lost => {
                // Sleep no later than the earliest deadline; the loop answers it then.
                let earliest = batch.iter().map(|w| w.deadline).min().unwrap_or(deadline);
                backoff(attempts, earliest).await;
            }
            Attempt::TimedOut => {
                for waiter in batch {
                    answer_busy(waiter, address, attempts);
                }
                return;
            }
            Attempt::Failed(error) => {
                let mut waiters = batch.into_iter();
                if let Some(last) = waiters.next_back() {
                    for waiter in waiters {
                        let _ = waiter.reply.send(Err(error.clone_lossy()));
                    }
                    let _ = last.reply.send(Err(error));
                }
                return;
            }
        }
    }
}

fn answer_busy(waiter: Waiter, address: &Address, attempts: u32) {
    let _ = waiter.reply.send(Err(NextError::Busy {
        address: address.to_string(),
        attempts,
        waited: waiter.started.elapsed(),
        timeout: waiter.timeout,
    }));
}

enum Attempt {
    /// Every waiter of the batch was answered.
    Done,
    /// Another writer won; retry.
    Lost,
    /// The state this process remembered had changed (another process wrote, or a `reset`,
    /// `set` or `delete`); retry at once with a fresh read.
    Stale,
    /// Storage did not answer before the latest deadline.
    TimedOut,
    /// An error every waiter gets.
    Failed(NextError),
}

/// One conditional write for the whole batch, on the state this process last wrote if it
/// knows it, else on a fresh read (a stale `known` is refused like a stale read, and the
/// retry reads). With a cache it stores the ceiling of a whole block, and once it is durable
/// keeps the numbers past the batch's as the block. On success, answers every waiter, leaves
/// what it wrote in `known` and returns [`Attempt::Done`]; waiters that would overflow are
/// answered with [`NextError::Overflow`] and dropped from the batch.
async fn attempt(
    inner: &Inner,
    address: &Address,
    batch: &mut Vec<Waiter>,
    deadline: Instant,
    known: &mut Option<Known>,
) -> Attempt {
    // Taken before anything is read: a `reset`, `set` or `delete` of this process that drops
    // the block from here on revokes it, and this attempt then installs nothing.
    let ticket = inner.cache.as_ref().map(|c| c.begin_refill(address.key()));
    let remembered = known.is_some();
    let (old, version) = match known.take() {
        Some(Known { data, version }) => (Some(data), Some(version)),
        None => match load_stored(&*inner.backend, address, deadline).await {
            Ok(stored) => stored,
            Err(failed) => return failed,
        },
    };
    let start = old.as_ref().map_or(batch[0].initial, |old| old.value);
    let end = keep_fitting(batch, address, start);
    if batch.is_empty() {
        return Attempt::Done;
    }
    let ceiling = inner.cache.as_ref().map_or(end, |c| c.ceiling(start, end));
    let metadata = batch[0].metadata.clone();
    let now = now_ms();
    let (data, expected) = match (old, version) {
        (Some(old), Some(version)) => (rewritten(old, ceiling, metadata, now), Some(version)),
        _ => (created(address, ceiling, metadata, now), None),
    };
    let write = ConditionalWrite {
        key: address.key().to_owned(),
        expected,
        bytes: data.encode(),
    };
    match tokio::time::timeout_at(deadline, inner.write(write)).await {
        Err(_) => Attempt::TimedOut,
        Ok(Err(WriteFailure::Conflict)) if remembered => Attempt::Stale,
        Ok(Err(WriteFailure::Conflict)) => Attempt::Lost,
        Ok(Err(WriteFailure::Storage(e))) => Attempt::Failed(NextError::Storage(e)),
        Ok(Ok(version)) => {
            *known = Some(Known { data, version });
            // Before the answers, so that a caller's next call already finds the block.
            if let (Some(cache), Some(ticket)) = (&inner.cache, ticket) {
                cache.install(address.key(), ticket, end, ceiling);
            }
            let mut value = start;
            for waiter in batch.drain(..) {
                let _ = waiter.reply.send(Ok(value));
                value += waiter.increment;
            }
            debug_assert_eq!(value, end);
            Attempt::Done
        }
    }
}

/// The stored sequence and its version (both `None` when absent), or how the attempt ends.
async fn load_stored(
    backend: &dyn Backend,
    address: &Address,
    deadline: Instant,
) -> Result<(Option<SequenceData>, Option<Version>), Attempt> {
    let loaded = match tokio::time::timeout_at(deadline, backend.load(address.key())).await {
        Err(_) => return Err(Attempt::TimedOut),
        Ok(Err(e)) => return Err(Attempt::Failed(NextError::Storage(e))),
        Ok(Ok(loaded)) => loaded,
    };
    match loaded {
        None => Ok((None, None)),
        Some(Object { bytes, version }) => match SequenceData::decode(&bytes, address.name()) {
            Ok(old) => Ok((Some(old), Some(version))),
            Err(reason) => Err(Attempt::Failed(NextError::InvalidStored {
                key: address.key().to_owned(),
                reason,
            })),
        },
    }
}

/// Keeps the prefix of `batch` whose numbers, from `start`, stay at or below [`VALUE_MAX`];
/// answers the others [`NextError::Overflow`]. Returns the value after the kept prefix.
fn keep_fitting(batch: &mut Vec<Waiter>, address: &Address, start: u64) -> u64 {
    let mut end = start;
    let mut fits = 0;
    for waiter in batch.iter() {
        match end.checked_add(waiter.increment) {
            Some(next) if next <= VALUE_MAX => {
                end = next;
                fits += 1;
            }
            _ => break,
        }
    }
    for waiter in batch.drain(fits..) {
        let _ = waiter.reply.send(Err(NextError::Overflow {
            address: address.to_string(),
            value: end,
            increment: waiter.increment,
            max: VALUE_MAX,
        }));
    }
    end
}
