//! The PLog pass over a partition whose PLog is in segment files (key layouts 4 and 5): its log
//! opened read-only as it was left (nothing cut or created), read page by page in offset order;
//! frames that fail their check are reported and read around (from the next segment on);
//! offsets holding [`RETIRED_PAYLOAD`] hold no event, as missing offsets in the key-value
//! PLog. Then each partition's applied end, read before ([`read_applied`]), against its log's
//! end.

use std::ops::Range;
use std::path::Path;

use monoseq_kv::{Key, KvStore};
use monoseq_store::{AppId, RETIRED_PAYLOAD, Segments};

use super::PLogPass;
use crate::keys;
use crate::problem::Problem;
use crate::state::{Problems, State};

/// Events one page read holds at most.
const PAGE_EVENTS: usize = 1024;
/// Bytes one page read holds at most (more for one longer event).
const PAGE_BYTES: usize = 4 << 20;

impl<S: KvStore> PLogPass<'_, '_, S> {
    /// Reads the partition's log in data directory `dir`, every page from its start to its
    /// end, and remembers its end and tail for [`check_applied`].
    pub(super) fn read_segments(&mut self, dir: &Path) {
        let p = self.partition;
        let log = match Segments::open_log_read_only(dir, p) {
            Ok(log) => log,
            Err(e) => {
                self.segments_unreadable(&e);
                return;
            }
        };
        let end = log.end();
        let mut at = log.start();
        let mut limit = PAGE_EVENTS;
        while at < end {
            let e = match log.read(at, limit, PAGE_BYTES) {
                Ok(page) if page.is_empty() => break,
                Ok(page) => {
                    for (i, payload) in page.payloads().enumerate() {
                        if payload != RETIRED_PAYLOAD {
                            self.event_at(page.first() + i as u64, payload);
                        }
                    }
                    (at, limit) = (page.end(), PAGE_EVENTS);
                    continue;
                }
                Err(e) => e,
            };
            match e.damaged_offsets() {
                // Read the frames before the damaged one first.
                Some(r) if r.start > at && limit > (r.start - at) as usize => {
                    limit = (r.start - at) as usize;
                }
                Some(r) if r.start == at && r.end > at => {
                    (at, limit) = (r.end, PAGE_EVENTS);
                    self.segment_damaged(r, &e);
                }
                _ => {
                    self.segments_unreadable(&e);
                    return;
                }
            }
        }
        if self.compare.is_none()
            && let Some(part) = self.state.partitions.get_mut(p as usize)
        {
            part.log_end = Some(end);
            part.tail = log.tail().map(ToString::to_string);
        }
    }

    /// The partition's log does not open, or a read failed other than on a damaged frame:
    /// how far it goes is unknown.
    fn segments_unreadable(&mut self, e: &dyn std::fmt::Display) {
        if self.compare.is_some() {
            return;
        }
        let p = self.partition;
        self.problems
            .unreadable(format!("the PLog segment files of partition {p}"), e);
        if let Some(part) = self.state.partitions.get_mut(p as usize) {
            part.plog_unreadable = true;
        }
    }

    /// Offsets `r` do not read from their segment file (`e`): reported once, and not again as
    /// a gap when they follow what was read.
    fn segment_damaged(&mut self, r: Range<u64>, e: &dyn std::fmt::Display) {
        if self.compare.is_some() {
            return;
        }
        self.problems.push(Problem::PLogSegmentDamaged {
            partition: self.partition,
            from: r.start,
            to: r.end - 1,
            message: e.to_string(),
        });
        if self.next >= r.start {
            self.next = self.next.max(r.end);
        }
    }
}

/// The applied end the engine records for `partition` (key layouts 4 and 5): 1 when it records
/// none (the server then writes the WLog entries and records of every event of the log again);
/// `None`, reported, when it cannot be read or is damaged.
pub(crate) fn read_applied(
    kv: &impl KvStore,
    app: AppId,
    partition: u32,
    problems: &mut Problems,
) -> Option<u64> {
    let key = keys::applied(app, partition);
    match kv.get(Key::new(&key, &[])) {
        Ok(None) => Some(1),
        Ok(Some(v)) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => Some(u64::from_be_bytes(b)),
            Err(_) => {
                problems.push(Problem::AppliedDamaged {
                    partition,
                    len: v.len(),
                });
                None
            }
        },
        Err(e) => {
            problems.unreadable(format!("the applied end of partition {partition}"), &e);
            None
        }
    }
}

/// Each partition's applied end (key layouts 4 and 5) against the end of its log: the engine
/// holding WLog entries and records of offsets the log does not hold means the log lost them.
pub(crate) fn check_applied(state: &State, problems: &mut Problems) {
    for (p, part) in state.partitions.iter().enumerate() {
        let partition = p as u32;
        if let (Some(applied), Some(log_end)) = (part.applied, part.log_end)
            && applied > log_end
        {
            problems.push(Problem::AppliedAhead {
                partition,
                applied,
                log_end,
                tail: part.tail.clone(),
            });
        }
    }
}
