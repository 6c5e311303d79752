//! Ordered page reads of a partition's PLog for its consumers: the events from an offset on,
//! in offset order, never at or beyond the partition's end (what is durable and final), with
//! every range of numbers retired by an accepted loss or a restore given as an explicit
//! [`Gap`], so a reader never mistakes a retired range for silence, nor silence for a gap.

use std::ops::ControlFlow;

use monoseq_core::PLogOffset;
use monoseq_kv::{KvError, KvStore};

use crate::Event;
use crate::codec::EventPeek;
use crate::identity::{AcceptedLoss, LossCause};
use crate::keys::{self, PartitionId};
use crate::store::{EventStore, ReadError};

/// Most items (events and gaps) one page read returns.
pub const PLOG_PAGE_ITEMS_MAX: usize = 10_000;

/// A range of a PLog whose offsets were retired: no event is, or ever will be, delivered there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// First retired offset delivered by this gap (the asked offset when it starts inside).
    pub from: u64,
    /// Last retired offset (inclusive).
    pub to: u64,
    /// Why the range was retired.
    pub cause: LossCause,
}

/// One item of a page: an event, or a retired range.
#[derive(Debug, Clone, PartialEq)]
pub enum PageItem {
    /// The event at its PLog offset.
    Event(Box<Event>),
    /// A retired range, delivered in its place in offset order.
    Gap(Gap),
}

impl PageItem {
    /// The offset after this item: where the next item starts.
    #[must_use]
    pub fn next_offset(&self) -> u64 {
        match self {
            PageItem::Event(e) => e.plog_offset.0 + 1,
            PageItem::Gap(g) => g.to + 1,
        }
    }
}

/// The retired ranges of `partition` among `losses`, in offset order, empty ones left out.
#[must_use]
pub fn retired_ranges(losses: &[AcceptedLoss], partition: u32) -> Vec<Gap> {
    let mut ranges: Vec<Gap> = losses
        .iter()
        .filter(|l| l.partition == partition && l.plog_from <= l.plog_to)
        .map(|l| Gap {
            from: l.plog_from,
            to: l.plog_to,
            cause: l.cause,
        })
        .collect();
    ranges.sort_by_key(|g| (g.from, g.to));
    ranges
}

/// A page of a PLog read through a filter ([`EventStore::read_plog_page_where`]).
#[derive(Debug, Clone, PartialEq)]
pub struct PlogPage {
    /// The events kept and the retired ranges, in offset order.
    pub items: Vec<PageItem>,
    /// The offset after the last one read (kept, dropped or retired): where the next page
    /// starts; the asked offset when nothing was read.
    pub next: u64,
    /// How many events were read and dropped (checked, not built).
    pub dropped: u64,
}

impl<S: KvStore> EventStore<S> {
    /// Up to `limit` items (at most [`PLOG_PAGE_ITEMS_MAX`]) of `partition`'s PLog from offset
    /// `from` on and below `end`, in offset order: each stored event, and each range of
    /// `retired` (see [`retired_ranges`]) as one [`Gap`] from the first offset it covers at or
    /// after `from`. The page stops early at an offset below `end` that holds no event and is
    /// not retired (a store that lost acknowledged events; the partition refuses to serve
    /// then), so nothing is ever skipped silently.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails or a stored event is damaged or misplaced.
    pub fn read_plog_page(
        &self,
        partition: PartitionId,
        from: u64,
        limit: usize,
        end: u64,
        retired: &[Gap],
    ) -> Result<Vec<PageItem>, ReadError> {
        self.read_plog_page_where(partition, (from, limit, end), retired, None)
            .map(|page| page.items)
    }

    /// As [`EventStore::read_plog_page`] (the same `limit`, counting every event read, kept
    /// or not, and every gap), with `keep` deciding from each event's place and command name
    /// which events the page holds: only those are built (see [`decode_event_if`]); the others
    /// are only checked (checksum, place, structure: a damaged one is an error as it is
    /// unfiltered) and counted. The page says where the next one starts, so a reader that
    /// kept nothing still moves on. Without `keep`, every event is kept.
    ///
    /// # Errors
    ///
    /// As [`EventStore::read_plog_page`].
    ///
    /// [`decode_event_if`]: crate::decode_event_if
    pub fn read_plog_page_where(
        &self,
        partition: PartitionId,
        (from, limit, end): (u64, usize, u64),
        retired: &[Gap],
        keep: Option<&dyn Fn(&EventPeek<'_>) -> bool>,
    ) -> Result<PlogPage, ReadError> {
        let (mut items, mut dropped) = (Vec::new(), 0);
        let next = walk_page((from, limit, end), retired, &mut |step| match step {
            Step::Gap(gap) => {
                items.push(PageItem::Gap(gap));
                Ok(0)
            }
            Step::Events(first, bound) => {
                let mut next = first;
                self.scan_events(
                    partition,
                    (PLogOffset(first), PLogOffset(bound)),
                    keep,
                    &mut |offset, e| {
                        match e {
                            Some(e) => items.push(PageItem::Event(Box::new(e))),
                            None => dropped += 1,
                        }
                        next = offset + 1;
                    },
                )?;
                Ok(next)
            }
        })?;
        Ok(PlogPage {
            items,
            next,
            dropped,
        })
    }

    /// The page [`EventStore::read_plog_page`] reads, each event given to `visit` as the
    /// bytes stored for it (the event encoding, from the segment files or the key-value
    /// store), neither decoded nor checked: for a reader that checks them itself (each
    /// carries its CRC-32). Answers the offset the next page starts at (`from` when nothing
    /// was read). [`RETIRED_PAYLOAD`](crate::RETIRED_PAYLOAD) frames are no event: they lie
    /// in the retired ranges, given as gaps.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails.
    pub fn visit_plog_page_stored(
        &self,
        partition: PartitionId,
        (from, limit, end): (u64, usize, u64),
        retired: &[Gap],
        visit: &mut dyn FnMut(StoredItem<'_>),
    ) -> Result<u64, ReadError> {
        walk_page((from, limit, end), retired, &mut |step| match step {
            Step::Gap(gap) => {
                visit(StoredItem::Gap(gap));
                Ok(0)
            }
            Step::Events(first, bound) => {
                let mut next = first;
                let mut each = |offset: u64, bytes: &[u8]| {
                    if offset != next || offset >= bound {
                        return ControlFlow::Break(());
                    }
                    visit(StoredItem::Event { offset, bytes });
                    next += 1;
                    ControlFlow::Continue(())
                };
                match &self.segments {
                    Some(segments) => Self::visit_logged(segments, partition, first, &mut each)?,
                    None => self.visit_kv_plog(partition, first, &mut each)?,
                }
                Ok(next)
            }
        })
    }

    /// Calls `visit` with every value of `partition`'s PLog in the key-value store (key
    /// layout 3) from offset `from` on, in offset order, until it breaks or the log ends.
    fn visit_kv_plog(
        &self,
        partition: PartitionId,
        from: u64,
        visit: &mut dyn FnMut(u64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), KvError> {
        let app = self.app();
        self.scan_log(
            from,
            &|block| keys::plog_partition(app, partition, PLogOffset(block)),
            visit,
        )
    }
}

/// One item of a page read as stored ([`EventStore::visit_plog_page_stored`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredItem<'a> {
    /// The bytes stored for the event at `offset` (the event encoding, not checked).
    Event {
        /// Its PLog offset.
        offset: u64,
        /// Its encoded bytes.
        bytes: &'a [u8],
    },
    /// A retired range, in its place in offset order.
    Gap(Gap),
}

/// What a page read does next ([`walk_page`]).
enum Step {
    /// Deliver this retired range.
    Gap(Gap),
    /// Read the events from the first offset on, below the second, stopping at the first
    /// offset holding none; answer the offset after the last one read.
    Events(u64, u64),
}

/// The steps of a page read of up to `limit` items from `from` below `end` (see
/// [`EventStore::read_plog_page`]): each retired range of `retired` as one gap, the events
/// between them; stops at an offset below `end` that holds no event and is not retired (a
/// hole: never skipped silently). Answers where the next page starts.
fn walk_page(
    (from, limit, end): (u64, usize, u64),
    retired: &[Gap],
    step: &mut dyn FnMut(Step) -> Result<u64, ReadError>,
) -> Result<u64, ReadError> {
    let limit = (limit.min(PLOG_PAGE_ITEMS_MAX)) as u64;
    let (mut read, mut next, mut page_next) = (0u64, from.max(1), from);
    while read < limit && next < end {
        if let Some(gap) = retired.iter().find(|g| g.from <= next && next <= g.to) {
            step(Step::Gap(Gap { from: next, ..*gap }))?;
            read += 1;
            next = gap.to.saturating_add(1);
            page_next = next;
            continue;
        }
        // Events up to the next retired range, the end or the page's size.
        let bound = retired
            .iter()
            .filter(|g| g.from > next)
            .map(|g| g.from)
            .min()
            .unwrap_or(u64::MAX)
            .min(end)
            .min(next.saturating_add(limit - read));
        let first = next;
        next = step(Step::Events(first, bound))?;
        read += next - first;
        if next > first {
            page_next = next;
        }
        if next < bound {
            // A hole below the end that no loss retired: stop rather than skip it.
            break;
        }
    }
    Ok(page_next)
}
