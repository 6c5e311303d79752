//! What a command answers and what the processor counts: [`Outcome`], the answer to a
//! successful command (also to its retries), and [`Counters`], the processor's totals that
//! every partition's writer adds to. Shared by the processor and the writers.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

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
    /// Told of every group written (set once by [`crate::CommandProcessor::observe_groups`]).
    pub(crate) group_observer: OnceLock<Arc<dyn GroupObserver>>,
}

/// Told of every group a partition's writer made durable: its commands, how long its append
/// to the store took, and how long it then took to become durable (the store's sync and the
/// raise of the partition's high-water mark, shared with the groups of other partitions that
/// sync together). Called on the writer's thread, once per group: it must be cheap and must
/// not block.
pub trait GroupObserver: Send + Sync + 'static {
    /// A group of `commands` commands was appended in `write`, then synced in `sync`.
    fn group_written(&self, commands: usize, write: Duration, sync: Duration);
}

impl std::fmt::Debug for dyn GroupObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GroupObserver")
    }
}

impl Counters {
    /// Tells the observer, if any, of a group written.
    pub(crate) fn group_written(&self, commands: usize, write: Duration, sync: Duration) {
        if let Some(o) = self.group_observer.get() {
            o.group_written(commands, write, sync);
        }
    }
}
