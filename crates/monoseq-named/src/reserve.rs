//! [`Reserver`]: the optional client-side reservation mode (Leaf-style segments). Numbers are
//! taken from storage a segment at a time with one `next` of increment = segment size, and the
//! next segment is fetched in the background once a tenth of the current one is used, so that
//! callers rarely wait for storage. Owns the two-segment buffer and its crash bound, and the
//! [`BlockSource`] contract a reserver takes its segments from ([`Sequences`] on storage, or
//! a client of a running server).

use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::address::Address;
use crate::backend::BoxFuture;
use crate::error::NextError;
use crate::sequences::{NextOptions, Sequences, TIMEOUT_DEFAULT};

/// Where a [`Reserver`] takes its segments: one atomic `next` of `options.increment_value()`
/// numbers at a time.
///
/// Obligation: `take` hands out the numbers `first..first + increment` to this caller alone,
/// across every process of the sequence, or fails having handed out none to it.
/// [`Sequences`] does so with one conditional write; an HTTP client does so through the
/// server's `next`.
pub trait BlockSource: Send + Sync + 'static {
    /// Takes `options.increment_value()` numbers of `address`; answers the first of them.
    ///
    /// # Errors
    ///
    /// A [`NextError`] when no number was taken (busy, storage fault, overflow, an invalid
    /// stored object, or a server that could not be reached).
    fn take<'a>(
        &'a self,
        address: &'a Address,
        options: &'a NextOptions,
    ) -> BoxFuture<'a, Result<u64, NextError>>;
}

impl BlockSource for Sequences {
    fn take<'a>(
        &'a self,
        address: &'a Address,
        options: &'a NextOptions,
    ) -> BoxFuture<'a, Result<u64, NextError>> {
        Box::pin(self.next(address, options))
    }
}

/// Options of a [`Reserver`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReserveOptions {
    block_size: NonZeroU64,
    initial: u64,
    timeout: Duration,
}

impl ReserveOptions {
    /// A reserver holding at most `block_size` numbers at a time: the segment it hands out
    /// from and the prefetched one, each `block_size / 2` numbers (with `block_size` 1 there is
    /// no prefetch). Initial value 1, timeout [`TIMEOUT_DEFAULT`] per segment fetch.
    pub fn new(block_size: NonZeroU64) -> ReserveOptions {
        ReserveOptions {
            block_size,
            initial: 1,
            timeout: TIMEOUT_DEFAULT,
        }
    }

    /// The first number if the sequence does not exist yet (default 1).
    #[must_use]
    pub fn initial(mut self, initial: u64) -> ReserveOptions {
        self.initial = initial;
        self
    }

    /// The timeout of each segment fetch (default [`TIMEOUT_DEFAULT`]).
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> ReserveOptions {
        self.timeout = timeout;
        self
    }

    fn segment(&self) -> (NonZeroU64, bool) {
        match NonZeroU64::new(self.block_size.get() / 2) {
            Some(half) => (half, true),
            None => (self.block_size, false),
        }
    }
}

/// Hands out numbers of one sequence from segments reserved in storage.
///
/// Guarantees: every number is unique across every process and reserver of the sequence
/// (each segment comes from one atomic `next`), and increases within one reserver. Numbers
/// of different processes interleave, and there are gaps: the numbers a reserver holds when
/// its process crashes or the reserver is dropped are never handed out. It holds at most one
/// block (`block_size` numbers: the rest of the current segment plus the prefetched one), so a
/// crash loses at most one block.
///
/// # Example
///
/// ```
/// use std::num::NonZeroU64;
/// use monoseq_kv::MemoryStore;
/// use monoseq_named::{KvBackend, ReserveOptions, Reserver, Sequences};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
/// let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
/// let options = ReserveOptions::new(NonZeroU64::new(1000).unwrap());
/// let ids = Reserver::new(sequences.clone(), "orders/id".parse()?, options);
/// assert_eq!(ids.next().await?, 1);
/// assert_eq!(ids.next().await?, 2);
/// // Storage already holds the end of the segment (and soon of the prefetched one).
/// assert!(sequences.get(&"orders/id".parse()?).await?.unwrap() >= 501);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # })?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Reserver {
    inner: Arc<Shared>,
}

impl std::fmt::Debug for Reserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reserver")
            .field("address", &self.inner.address)
            .finish_non_exhaustive()
    }
}

struct Shared {
    source: Box<dyn BlockSource>,
    address: Address,
    fetch: NextOptions,
    segment: u64,
    prefetch: bool,
    state: Mutex<State>,
    /// Woken when a fetch ends (with a segment or a failure).
    fetched: Notify,
}

#[derive(Default)]
struct State {
    current: Range<u64>,
    prefetched: Option<Range<u64>>,
    fetching: bool,
    /// The last fetch's failure, for the callers that waited on it.
    failure: Option<(u64, NextError)>,
    /// Fetches started, to tell a caller whether the failure is the one it waited for.
    fetches: u64,
}

impl Reserver {
    /// A reserver for `address` that takes its segments from `source` ([`Sequences`] on
    /// storage, or a client of a running server); it fetches its first segment on the first
    /// `next`.
    pub fn new(source: impl BlockSource, address: Address, options: ReserveOptions) -> Reserver {
        let (segment, prefetch) = options.segment();
        Reserver {
            inner: Arc::new(Shared {
                source: Box::new(source),
                address,
                fetch: NextOptions::new()
                    .initial(options.initial)
                    .increment(segment)
                    .timeout(options.timeout),
                segment: segment.get(),
                prefetch,
                state: Mutex::new(State::default()),
                fetched: Notify::new(),
            }),
        }
    }

    /// The next number. Takes a mutex and no storage round trip except when both segments are
    /// used up (then it waits for the fetch).
    ///
    /// # Errors
    ///
    /// The [`NextError`] of a failed segment fetch (busy, storage fault, overflow, invalid
    /// stored object); the next call tries again.
    pub async fn next(&self) -> Result<u64, NextError> {
        let shared = &self.inner;
        let mut waited_for = None;
        loop {
            let notified = shared.fetched.notified();
            tokio::pin!(notified);
            {
                let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                if state.current.is_empty()
                    && let Some(prefetched) = state.prefetched.take()
                {
                    state.current = prefetched;
                }
                if let Some(number) = state.current.next() {
                    let used = shared.segment - (state.current.end - state.current.start);
                    if shared.prefetch
                        && !state.fetching
                        && state.prefetched.is_none()
                        && used * 10 >= shared.segment
                    {
                        self.start_fetch(&mut state);
                    }
                    return Ok(number);
                }
                if let (Some(fetch), Some((failed, error))) = (waited_for, state.failure.as_ref())
                    && *failed == fetch
                {
                    return Err(error.clone_lossy());
                }
                if !state.fetching {
                    self.start_fetch(&mut state);
                }
                waited_for = Some(state.fetches);
                notified.as_mut().enable();
            }
            notified.await;
        }
    }

    /// Numbers held and not yet handed out (lost if the process stops now).
    pub fn held(&self) -> u64 {
        let state = self
            .inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (state.current.end - state.current.start)
            + state.prefetched.as_ref().map_or(0, |p| p.end - p.start)
    }

    fn start_fetch(&self, state: &mut State) {
        state.fetching = true;
        state.fetches += 1;
        state.failure = None;
        let fetch = state.fetches;
        let shared = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let result = shared.source.take(&shared.address, &shared.fetch).await;
            {
                let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.fetching = false;
                match result {
                    Ok(first) => {
                        let range = first..first + shared.segment;
                        if state.current.is_empty() && state.prefetched.is_none() {
                            state.current = range;
                        } else {
                            state.prefetched = Some(range);
                        }
                    }
                    Err(e) => state.failure = Some((fetch, e)),
                }
            }
            shared.fetched.notify_waiters();
        });
    }
}
