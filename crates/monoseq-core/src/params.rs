//! Parameters of a sequencer: the sequence types of every workspace kind and the limits that
//! bound memory and latency. Validated once, at construction; a `Params` value is always valid.

use std::time::Duration;

use crate::types::{Number, SeqId, WsKind};

/// Default limit of unflushed values (the reference design's `MaxNumUnflushedValues`,
/// docs/invariants.md).
pub const BACKLOG_VALUES_MAX_DEFAULT: usize = 500;
/// Default most distinct values actualization holds before writing them (its memory budget: these
/// values plus at most twice as many remembered stored numbers, about 20 MiB). Separate from the
/// live backlog limit: a replay that must write every few hundred values rewrites the projection of
/// every workspace again and again when the PLog tail spreads over many workspaces.
pub const REPLAY_VALUES_MAX_DEFAULT: usize = 1 << 18;
/// Default number of workspaces whose numbers the cache keeps (the reference design's
/// `LRUCacheSize`, docs/invariants.md).
pub const CACHE_WORKSPACES_MAX_DEFAULT: usize = 100_000;
/// Default longest wait of the flusher to gather a batch (the reference design's `BatcherDelay`,
/// docs/invariants.md).
pub const BATCHER_DELAY_DEFAULT: Duration = Duration::from_millis(5);
/// Default first delay before retrying a failed storage call.
pub const RETRY_DELAY_MIN_DEFAULT: Duration = Duration::from_millis(5);
/// Default longest delay between retries of a failing storage call (the reference design's 500 ms,
/// docs/invariants.md).
pub const RETRY_DELAY_MAX_DEFAULT: Duration = Duration::from_millis(500);
/// Default bound on how long `shutdown` waits for background work.
pub const SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Longest accepted batcher delay: beyond it the checkpoint would lag for no gain.
pub const BATCHER_DELAY_MAX: Duration = Duration::from_secs(10);
/// Most sequences one workspace kind may define; keeps a workspace's cache entry small.
pub const KIND_SEQUENCES_MAX: usize = 64;

/// Why parameters were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamsError {
    /// No workspace kind was declared, so no transaction could ever start.
    #[error("no sequence types: declare at least one workspace kind with its sequences")]
    NoSequenceTypes,
    /// A kind was declared without sequences.
    #[error("workspace kind {0} has no sequences: give it at least one (SeqId, initial value)")]
    KindWithoutSequences(WsKind),
    /// A kind was declared twice.
    #[error("workspace kind {0} is declared twice: merge its sequences into one declaration")]
    DuplicateKind(WsKind),
    /// A sequence was declared twice for one kind.
    #[error("sequence {seq} of workspace kind {kind} is declared twice")]
    DuplicateSequence {
        /// The kind.
        kind: WsKind,
        /// The repeated sequence.
        seq: SeqId,
    },
    /// Too many sequences for one kind.
    #[error(
        "workspace kind {kind} declares {count} sequences; at most {KIND_SEQUENCES_MAX} are allowed"
    )]
    TooManySequences {
        /// The kind.
        kind: WsKind,
        /// How many it declared.
        count: usize,
    },
    /// An initial value of 0: 0 means "nothing handed out yet" in storage, so sequences start at 1
    /// or more.
    #[error(
        "sequence {seq} of workspace kind {kind} has initial value 0; initial values start at 1"
    )]
    InitialValueZero {
        /// The kind.
        kind: WsKind,
        /// The sequence.
        seq: SeqId,
    },
    /// The backlog limit cannot hold one transaction of a kind: `start` keeps room for every
    /// sequence of the kind, so it would answer busy for ever.
    #[error(
        "backlog_values_max {backlog_values_max} is below the {sequences} sequences of \
         workspace kind {kind}: raise it to at least {sequences}"
    )]
    BacklogBelowKindSequences {
        /// The limit given.
        backlog_values_max: usize,
        /// A kind with more sequences.
        kind: WsKind,
        /// How many sequences it declares.
        sequences: usize,
    },
    /// A zero limit or capacity.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// A duration out of its accepted range.
    #[error("{name} must be between {min:?} and {max:?}, got {got:?}")]
    DurationOutOfRange {
        /// The parameter.
        name: &'static str,
        /// The value given.
        got: Duration,
        /// Smallest accepted value.
        min: Duration,
        /// Largest accepted value.
        max: Duration,
    },
}

/// The sequences of one workspace kind, in declaration order, with their initial values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KindSequences {
    pub(crate) kind: WsKind,
    pub(crate) seqs: Vec<SeqId>,
    pub(crate) initial: Vec<Number>,
}

impl KindSequences {
    /// Position of `seq` among the kind's sequences; kinds have a handful, so a scan beats a hash.
    #[inline]
    pub(crate) fn index_of(&self, seq: SeqId) -> Option<usize> {
        self.seqs.iter().position(|&s| s == seq)
    }
}

/// Validated parameters of a sequencer.
///
/// # Example
///
/// ```
/// use monoseq_core::{Number, Params, SeqId, WsKind};
///
/// let params = Params::builder()
///     .kind(WsKind(1), [(SeqId(1), Number(1)), (SeqId(2), Number(322_685_000_131_072))])
///     .backlog_values_max(500)
///     .build()
///     .unwrap();
/// assert_eq!(params.backlog_values_max(), 500);
///
/// let err = Params::builder().kind(WsKind(1), [(SeqId(1), Number(0))]).build().unwrap_err();
/// assert!(err.to_string().contains("initial value 0"));
/// ```
#[derive(Debug, Clone)]
pub struct Params {
    pub(crate) kinds: Vec<KindSequences>,
    pub(crate) backlog_values_max: usize,
    pub(crate) replay_values_max: usize,
    pub(crate) cache_workspaces_max: usize,
    pub(crate) batcher_delay: Duration,
    pub(crate) retry_delay_min: Duration,
    pub(crate) retry_delay_max: Duration,
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))] // used by the driver
    pub(crate) shutdown_timeout: Duration,
}

impl Params {
    /// Starts a builder with the defaults of the reference design and no workspace kinds.
    pub fn builder() -> ParamsBuilder {
        ParamsBuilder {
            kinds: Vec::new(),
            backlog_values_max: BACKLOG_VALUES_MAX_DEFAULT,
            replay_values_max: REPLAY_VALUES_MAX_DEFAULT,
            cache_workspaces_max: CACHE_WORKSPACES_MAX_DEFAULT,
            batcher_delay: BATCHER_DELAY_DEFAULT,
            retry_delay_min: RETRY_DELAY_MIN_DEFAULT,
            retry_delay_max: RETRY_DELAY_MAX_DEFAULT,
            shutdown_timeout: SHUTDOWN_TIMEOUT_DEFAULT,
        }
    }

    /// Most unflushed values before `start` answers busy.
    #[must_use]
    pub fn backlog_values_max(&self) -> usize {
        self.backlog_values_max
    }

    /// Most distinct values actualization holds before writing them.
    #[must_use]
    pub fn replay_values_max(&self) -> usize {
        self.replay_values_max
    }

    /// Most workspaces whose numbers the cache keeps.
    #[must_use]
    pub fn cache_workspaces_max(&self) -> usize {
        self.cache_workspaces_max
    }

    /// Longest wait of the flusher to gather a batch.
    #[must_use]
    pub fn batcher_delay(&self) -> Duration {
        self.batcher_delay
    }

    /// The initial value of `seq` for workspaces of `kind`, if the kind has that sequence.
    #[must_use]
    pub fn initial_value(&self, kind: WsKind, seq: SeqId) -> Option<Number> {
        let k = self.kind(kind)?;
        k.index_of(seq).map(|i| k.initial[i])
    }

    /// Every workspace kind with its sequences and initial values, in declaration order.
    pub fn kinds(&self) -> impl Iterator<Item = (WsKind, impl Iterator<Item = (SeqId, Number)>)> {
        self.kinds.iter().map(|k| {
            (
                k.kind,
                k.seqs.iter().copied().zip(k.initial.iter().copied()),
            )
        })
    }

    /// Backlog size at which the flusher skips its batching delay and keeps flushing back to
    /// back: a quarter of the limit, so it is running well before `start` turns busy.
    #[inline]
    pub(crate) fn backlog_urgent(&self) -> usize {
        (self.backlog_values_max / 4).max(1)
    }

    #[inline]
    pub(crate) fn kind(&self, kind: WsKind) -> Option<&KindSequences> {
        self.kinds.iter().find(|k| k.kind == kind)
    }
}

/// Builds [`Params`]; see [`Params::builder`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ParamsBuilder {
    kinds: Vec<(WsKind, Vec<(SeqId, Number)>)>,
    backlog_values_max: usize,
    replay_values_max: usize,
    cache_workspaces_max: usize,
    batcher_delay: Duration,
    retry_delay_min: Duration,
    retry_delay_max: Duration,
    shutdown_timeout: Duration,
}

impl ParamsBuilder {
    /// Declares a workspace kind with its sequences and their initial values.
    pub fn kind(mut self, kind: WsKind, seqs: impl IntoIterator<Item = (SeqId, Number)>) -> Self {
        self.kinds.push((kind, seqs.into_iter().collect()));
        self
    }

    /// Most unflushed values before `start` answers busy (the reference design's
    /// `MaxNumUnflushedValues`, docs/invariants.md).
    pub fn backlog_values_max(mut self, n: usize) -> Self {
        self.backlog_values_max = n;
        self
    }

    /// Most distinct values actualization holds before writing them (its memory budget).
    pub fn replay_values_max(mut self, n: usize) -> Self {
        self.replay_values_max = n;
        self
    }

    /// Most workspaces whose numbers the cache keeps (the reference design's `LRUCacheSize`,
    /// docs/invariants.md).
    pub fn cache_workspaces_max(mut self, n: usize) -> Self {
        self.cache_workspaces_max = n;
        self
    }

    /// Longest wait of the flusher to gather a batch (the reference design's `BatcherDelay`,
    /// docs/invariants.md).
    pub fn batcher_delay(mut self, d: Duration) -> Self {
        self.batcher_delay = d;
        self
    }

    /// First and longest delay between retries of a failing storage call.
    pub fn retry_delay(mut self, min: Duration, max: Duration) -> Self {
        self.retry_delay_min = min;
        self.retry_delay_max = max;
        self
    }

    /// Bound on how long `shutdown` waits for background work.
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }

    /// Validates and returns the parameters.
    ///
    /// # Errors
    ///
    /// [`ParamsError`] names the first invalid parameter: no kinds, a kind without sequences
    /// or declared twice, a duplicate sequence, an initial value of 0, a zero limit or
    /// capacity, a backlog limit below a kind's sequence count, or a delay out of range.
    pub fn build(self) -> Result<Params, ParamsError> {
        if self.kinds.is_empty() {
            return Err(ParamsError::NoSequenceTypes);
        }
        let mut kinds: Vec<KindSequences> = Vec::with_capacity(self.kinds.len());
        for (kind, seqs) in &self.kinds {
            if kinds.iter().any(|k| k.kind == *kind) {
                return Err(ParamsError::DuplicateKind(*kind));
            }
            kinds.push(kind_sequences(*kind, seqs)?);
        }
        self.check_limits(&kinds)?;
        self.check_delays()?;
        Ok(Params {
            kinds,
            backlog_values_max: self.backlog_values_max,
            replay_values_max: self.replay_values_max,
            cache_workspaces_max: self.cache_workspaces_max,
            batcher_delay: self.batcher_delay,
            retry_delay_min: self.retry_delay_min,
            retry_delay_max: self.retry_delay_max,
            shutdown_timeout: self.shutdown_timeout,
        })
    }

    /// The counts: none is zero, and the backlog holds at least one transaction of every kind.
    fn check_limits(&self, kinds: &[KindSequences]) -> Result<(), ParamsError> {
        if self.backlog_values_max == 0 {
            return Err(ParamsError::Zero("backlog_values_max"));
        }
        if let Some(k) = kinds
            .iter()
            .find(|k| k.seqs.len() > self.backlog_values_max)
        {
            return Err(ParamsError::BacklogBelowKindSequences {
                backlog_values_max: self.backlog_values_max,
                kind: k.kind,
                sequences: k.seqs.len(),
            });
        }
        if self.cache_workspaces_max == 0 {
            return Err(ParamsError::Zero("cache_workspaces_max"));
        }
        if self.replay_values_max == 0 {
            return Err(ParamsError::Zero("replay_values_max"));
        }
        Ok(())
    }

    /// The delays, each within its range.
    fn check_delays(&self) -> Result<(), ParamsError> {
        check_range(
            "batcher_delay",
            self.batcher_delay,
            Duration::ZERO,
            BATCHER_DELAY_MAX,
        )?;
        check_range(
            "retry_delay_min",
            self.retry_delay_min,
            RETRY_DELAY_MIN_LOWEST,
            RETRY_DELAY_MIN_HIGHEST,
        )?;
        check_range(
            "retry_delay_max",
            self.retry_delay_max,
            self.retry_delay_min,
            RETRY_DELAY_MAX_HIGHEST,
        )?;
        check_range(
            "shutdown_timeout",
            self.shutdown_timeout,
            SHUTDOWN_TIMEOUT_LOWEST,
            SHUTDOWN_TIMEOUT_HIGHEST,
        )
    }
}

/// Lowest accepted shortest retry delay.
const RETRY_DELAY_MIN_LOWEST: Duration = Duration::from_micros(1);
/// Highest accepted shortest retry delay.
const RETRY_DELAY_MIN_HIGHEST: Duration = Duration::from_secs(60);
/// Highest accepted longest retry delay.
const RETRY_DELAY_MAX_HIGHEST: Duration = Duration::from_secs(600);
/// Lowest accepted shutdown timeout.
const SHUTDOWN_TIMEOUT_LOWEST: Duration = Duration::from_millis(1);
/// Highest accepted shutdown timeout.
const SHUTDOWN_TIMEOUT_HIGHEST: Duration = Duration::from_secs(600);

/// The validated sequences of one kind: at least one, at most [`KIND_SEQUENCES_MAX`], none
/// twice, none starting at 0.
fn kind_sequences(kind: WsKind, seqs: &[(SeqId, Number)]) -> Result<KindSequences, ParamsError> {
    if seqs.is_empty() {
        return Err(ParamsError::KindWithoutSequences(kind));
    }
    if seqs.len() > KIND_SEQUENCES_MAX {
        return Err(ParamsError::TooManySequences {
            kind,
            count: seqs.len(),
        });
    }
    let mut entry = KindSequences {
        kind,
        seqs: Vec::with_capacity(seqs.len()),
        initial: Vec::with_capacity(seqs.len()),
    };
    for &(seq, initial) in seqs {
        if entry.seqs.contains(&seq) {
            return Err(ParamsError::DuplicateSequence { kind, seq });
        }
        if initial.0 == 0 {
            return Err(ParamsError::InitialValueZero { kind, seq });
        }
        entry.seqs.push(seq);
        entry.initial.push(initial);
    }
    Ok(entry)
}

fn check_range(
    name: &'static str,
    got: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ParamsError> {
    if got < min || got > max {
        return Err(ParamsError::DurationOutOfRange {
            name,
            got,
            min,
            max,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_kind() -> ParamsBuilder {
        Params::builder().kind(WsKind(1), [(SeqId(1), Number(1))])
    }

    #[test]
    fn defaults_are_the_seed_defaults() {
        let p = one_kind().build().unwrap();
        assert_eq!(p.backlog_values_max(), 500);
        assert_eq!(p.cache_workspaces_max(), 100_000);
        assert_eq!(p.batcher_delay(), Duration::from_millis(5));
        assert_eq!(p.initial_value(WsKind(1), SeqId(1)), Some(Number(1)));
        assert_eq!(p.initial_value(WsKind(1), SeqId(2)), None);
        assert_eq!(p.initial_value(WsKind(2), SeqId(1)), None);
    }

    #[test]
    fn invalid_kinds_are_refused_with_the_kind_named() {
        assert_eq!(
            Params::builder().build().unwrap_err(),
            ParamsError::NoSequenceTypes
        );
        assert_eq!(
            Params::builder().kind(WsKind(3), []).build().unwrap_err(),
            ParamsError::KindWithoutSequences(WsKind(3))
        );
        assert_eq!(
            one_kind()
                .kind(WsKind(1), [(SeqId(2), Number(1))])
                .build()
                .unwrap_err(),
            ParamsError::DuplicateKind(WsKind(1))
        );
        let many = (0..=KIND_SEQUENCES_MAX as u16).map(|i| (SeqId(i), Number(1)));
        assert!(matches!(
            Params::builder().kind(WsKind(1), many).build().unwrap_err(),
            ParamsError::TooManySequences { .. }
        ));
    }

    #[test]
    fn invalid_sequences_are_refused_with_the_sequence_named() {
        assert_eq!(
            Params::builder()
                .kind(WsKind(1), [(SeqId(1), Number(1)), (SeqId(1), Number(5))])
                .build()
                .unwrap_err(),
            ParamsError::DuplicateSequence {
                kind: WsKind(1),
                seq: SeqId(1)
            }
        );
        assert_eq!(
            Params::builder()
                .kind(WsKind(1), [(SeqId(7), Number(0))])
                .build()
                .unwrap_err(),
            ParamsError::InitialValueZero {
                kind: WsKind(1),
                seq: SeqId(7)
            }
        );
    }

    #[test]
    fn invalid_limits_are_refused_with_the_parameter_named() {
        assert_eq!(
            one_kind().backlog_values_max(0).build().unwrap_err(),
            ParamsError::Zero("backlog_values_max")
        );
        assert_eq!(
            Params::builder()
                .kind(WsKind(1), [(SeqId(1), Number(1)), (SeqId(2), Number(1))])
                .backlog_values_max(1)
                .build()
                .unwrap_err(),
            ParamsError::BacklogBelowKindSequences {
                backlog_values_max: 1,
                kind: WsKind(1),
                sequences: 2,
            }
        );
        assert_eq!(
            one_kind().cache_workspaces_max(0).build().unwrap_err(),
            ParamsError::Zero("cache_workspaces_max")
        );
        assert_eq!(
            one_kind().replay_values_max(0).build().unwrap_err(),
            ParamsError::Zero("replay_values_max")
        );
    }

    #[test]
    fn delays_out_of_range_are_refused_with_the_parameter_named() {
        let err = one_kind()
            .batcher_delay(Duration::from_secs(11))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("batcher_delay"), "{err}");
        let err = one_kind()
            .retry_delay(Duration::from_secs(1), Duration::from_millis(1))
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("retry_delay_max"), "{err}");
    }
}
