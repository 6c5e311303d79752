//! What the passes read from, and the helpers every pass shares: whole partitions read in key
//! order, progress reports, and how an unexpected log entry is described.

use std::ops::{Bound, ControlFlow};
use std::path::Path;

use monoseq_kv::{KvError, KvStore, Order};
use monoseq_store::{AppId, WLogEntry};

use crate::listing::PartitionList;
use crate::{Progress, Stage};

/// Events between two progress reports.
pub(crate) const PROGRESS_EVERY: u64 = 4096;

/// What the passes read from.
pub(crate) struct Source<'a, S> {
    pub(crate) kv: &'a S,
    pub(crate) app: AppId,
    pub(crate) list: Option<&'a PartitionList>,
    /// Key layouts 4 and 5: the data directory whose segment files hold the PLogs.
    pub(crate) segments: Option<&'a Path>,
    /// Key layout 5: the WLog entries and created records' references are in chunks.
    pub(crate) chunked: bool,
}

/// Reads a whole partition, calling `visit` with each entry's clustering and value.
pub(crate) fn scan_all<S: KvStore>(
    kv: &S,
    partition: &[u8],
    visit: &mut dyn FnMut(&[u8], &[u8]),
) -> Result<(), KvError> {
    kv.scan(
        partition,
        Bound::Unbounded,
        Bound::Unbounded,
        Order::Ascending,
        &mut |c, v| {
            visit(c, v);
            ControlFlow::Continue(())
        },
    )
}

/// The sorted union of two sorted sequences, each element once.
pub(crate) fn union<T: Ord + Copy>(
    a: impl IntoIterator<Item = T>,
    b: impl IntoIterator<Item = T>,
) -> Vec<T> {
    let mut all: Vec<T> = a.into_iter().chain(b).collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Reports `done` items of `total` of `stage` every few thousand items and at the end.
pub(crate) fn report(progress: &mut dyn FnMut(Progress), stage: Stage, done: u64, total: u64) {
    if done.is_multiple_of(PROGRESS_EVERY) || done == total {
        progress(Progress {
            stage,
            done,
            total: Some(total),
        });
    }
}

/// What a log entry that is not the expected event holds, for messages.
pub(crate) fn describe_entry(bytes: &[u8]) -> String {
    match WLogEntry::decode(bytes) {
        Ok(WLogEntry::Ref(r)) => format!(
            "it refers to PLog offset {} of partition {}",
            r.plog_offset, r.partition
        ),
        Ok(WLogEntry::Copy(e)) => format!(
            "it holds the event of PLog offset {} of workspace {} at WLog offset {}",
            e.plog_offset, e.ws, e.wlog_offset
        ),
        Err(e) => format!("it does not decode: {e}"),
    }
}
