//! Options of the embedded backends: [`Durability`] (when a write reaches stable storage) and
//! [`Options`], validated when a store opens.

use std::time::Duration;

use crate::error::OpenError;

/// Longest allowed [`Durability::GroupCommit`] delay: past it a crash loses too much.
pub const GROUP_COMMIT_DELAY_MAX: Duration = Duration::from_secs(1);

/// Default read cache of an embedded store, in bytes.
pub const CACHE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// When a write of an embedded store reaches stable storage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Durability {
    /// Every write is flushed to stable storage (`fdatasync`) before it returns: what returned
    /// `Ok` survives a power loss.
    #[default]
    Sync,
    /// Writes return once visible; every half `max_delay` a background flusher flushes when a
    /// write older than its previous look is still unflushed (so a write is durable at most
    /// `max_delay` plus one flush after it returns, and writes that callers' syncs cover get
    /// no flush of the flusher's own), and [`KvStore::sync`](crate::KvStore::sync) makes writes
    /// durable at once. A crash loses at most the writes of that last stretch that no `sync`
    /// covered; each batch is lost whole or kept whole.
    GroupCommit {
        /// Longest time from a write's return to its flush; at most
        /// [`GROUP_COMMIT_DELAY_MAX`], more than zero.
        max_delay: Duration,
    },
    /// Nothing is flushed except by [`KvStore::sync`](crate::KvStore::sync) and on close:
    /// for bulk loads and tests. A crash loses what no `sync` covered, whole batches at a time.
    Manual,
}

/// Options of an embedded store.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use monoseq_kv::{Durability, Options};
///
/// let options = Options::default()
///     .durability(Durability::GroupCommit { max_delay: Duration::from_millis(2) })
///     .cache_bytes(16 << 20);
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    pub(crate) durability: Durability,
    pub(crate) cache_bytes: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            durability: Durability::default(),
            cache_bytes: CACHE_BYTES_DEFAULT,
        }
    }
}

impl Options {
    /// Sets when writes reach stable storage (default [`Durability::Sync`]).
    #[must_use]
    pub fn durability(mut self, durability: Durability) -> Options {
        self.durability = durability;
        self
    }

    /// Sets the read cache size (default [`CACHE_BYTES_DEFAULT`]).
    #[must_use]
    pub fn cache_bytes(mut self, cache_bytes: u64) -> Options {
        self.cache_bytes = cache_bytes;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), OpenError> {
        if let Durability::GroupCommit { max_delay } = self.durability
            && (max_delay.is_zero() || max_delay > GROUP_COMMIT_DELAY_MAX)
        {
            return Err(OpenError::InvalidOption(format!(
                "group commit max_delay is {max_delay:?}; it must be more than zero and at most \
                 {GROUP_COMMIT_DELAY_MAX:?}"
            )));
        }
        Ok(())
    }
}
