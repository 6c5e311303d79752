//! The options of the operations: [`NextOptions`] for `next` and `increment`, [`SetOptions`]
//! for `reset` and `set`, and the timeouts they default to and are cut to.

use std::num::NonZeroU64;
use std::time::Duration;

use crate::record::Metadata;
#[cfg(doc)]
use crate::sequences::Sequences;

/// Default timeout of an operation (the reference design's `lockTimeout`, docs/invariants.md).
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Longest timeout accepted; longer ones are cut to it.
pub const TIMEOUT_MAX: Duration = Duration::from_secs(300);

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
    pub(super) initial: u64,
    pub(super) increment: NonZeroU64,
    pub(super) timeout: Duration,
    pub(super) metadata: Option<Metadata>,
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
    pub(super) timeout: Duration,
    pub(super) metadata: Option<Metadata>,
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
