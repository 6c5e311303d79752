//! What a command answers and what the processor counts: [`Outcome`], the answer to a
//! successful command (also to its retries), and [`Counters`], the processor's totals that
//! every partition's writer adds to. Shared by the processor and the writers.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

/// The answer to a successful command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The partition that ran it.
    pub partition: u32,
    /// The event's PLog offset.
    pub plog_offset: u64,
    /// The event's WLog offset.
    pub wlog_offset: u64,
    /// Real IDs of the command's raw IDs.
    pub ids: BTreeMap<u64, u64>,
    /// The answer repeats the original one of a command with the same idempotency key;
    /// nothing was written now.
    pub replayed: bool,
}

/// Counters of the whole processor.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) committed: AtomicU64,
    pub(crate) replayed: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) groups: AtomicU64,
    pub(crate) cache_hits: AtomicU64,
    pub(crate) cache_misses: AtomicU64,
}
