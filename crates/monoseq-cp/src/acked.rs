//! [`Acked`]: what this process acknowledged of one partition (its high-water mark), and the
//! signal the partition's followers wait on. Every PLog offset below [`Acked::end`] is durable
//! and final: its event was synced and its mark raised before any client was answered. The
//! partition's writer raises it after each group; readers never see beyond it, so a follower
//! never receives an event that a crash could still take back.
//!
//! While the partition has followers here, the writer also keeps the groups it acknowledged
//! lately ([`Recent`]), so that new events reach the followers from the write path without a
//! read of the store.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use monoseq_store::{Event, Mark};
use tokio::sync::watch;

/// Most events [`Recent`] keeps: a follower further behind reads the store.
pub const RECENT_EVENTS_MAX: usize = 4_096;

/// A partition's acknowledged mark, shared by its writer (which raises it) and its readers.
#[derive(Debug)]
pub(crate) struct Acked {
    mark: Mutex<Mark>,
    /// The PLog's end (`mark.plog + 1`), published to waiting readers when it moves.
    end: watch::Sender<u64>,
    recent: Recent,
}

/// The groups a partition's writer acknowledged lately, oldest first, at most
/// [`RECENT_EVENTS_MAX`] events: kept only while someone follows the partition here.
#[derive(Debug, Default)]
struct Recent {
    followed: AtomicBool,
    groups: Mutex<Kept>,
}

/// The kept groups and how many events they hold.
#[derive(Debug, Default)]
struct Kept {
    groups: VecDeque<KeptGroup>,
    events: usize,
}

/// One kept group (never empty) with its first and last PLog offsets beside it, so that a
/// search reads no event.
#[derive(Debug)]
struct KeptGroup {
    first: u64,
    last: u64,
    events: Arc<[Event]>,
}

impl Kept {
    fn clear(&mut self) {
        self.groups.clear();
        self.events = 0;
    }
}

impl Recent {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.groups.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for Acked {
    fn default() -> Acked {
        Acked::new(Mark::default())
    }
}

impl Acked {
    /// Starts from `mark`.
    pub(crate) fn new(mark: Mark) -> Acked {
        Acked {
            mark: Mutex::new(mark),
            end: watch::Sender::new(mark.plog.saturating_add(1)),
            recent: Recent::default(),
        }
    }

    /// Keeps a group's events (consecutive PLog offsets, just made durable) for the
    /// partition's followers, before the end that covers them is published; nothing is kept
    /// while nobody follows the partition.
    pub(crate) fn keep(&self, events: Vec<Event>) {
        if events.is_empty() || !self.recent.followed.load(Ordering::Acquire) {
            return;
        }
        let mut kept = self.recent.lock();
        let consecutive = events
            .windows(2)
            .all(|w| w[1].plog_offset.0 == w[0].plog_offset.0 + 1);
        if !consecutive {
            // Never expected of a group; its followers read the store, which shows any hole.
            kept.clear();
            return;
        }
        kept.events += events.len();
        while kept.events > RECENT_EVENTS_MAX
            && let Some(old) = kept.groups.pop_front()
        {
            kept.events -= old.events.len();
        }
        let (first, last) = (events[0].plog_offset.0, last(&events));
        kept.groups.push_back(KeptGroup {
            first,
            last,
            events: events.into(),
        });
    }

    /// Forgets the kept groups: the writer starts (what it acknowledges next need not follow
    /// them), or nobody follows the partition any longer.
    pub(crate) fn forget_kept(&self) {
        self.recent.lock().clear();
    }

    /// Starts or stops keeping groups for followers.
    pub(crate) fn set_followed(&self, followed: bool) {
        self.recent.followed.store(followed, Ordering::Release);
        if !followed {
            self.forget_kept();
        }
    }

    /// The kept groups holding the events from PLog offset `from` below `until`, in order and
    /// without a hole (the first holds `from`, each next one starts where the one before it
    /// ended), and no further than the acknowledged end; `None` when they do not hold `from`
    /// (read the store then). The first and last group may hold events outside the range.
    pub(crate) fn kept(&self, from: u64, until: u64) -> Option<Vec<Arc<[Event]>>> {
        let until = until.min(self.end());
        if from >= until {
            return Some(Vec::new());
        }
        let kept = self.recent.lock();
        let groups = &kept.groups;
        // Groups are kept in PLog order: the first one ending at or after `from`.
        let start = groups.partition_point(|g| g.last < from);
        if groups.get(start)?.first > from {
            return None;
        }
        let mut out = Vec::new();
        let mut next = from;
        for g in groups.iter().skip(start) {
            if g.first > next || next >= until {
                break;
            }
            next = g.last + 1;
            out.push(Arc::clone(&g.events));
        }
        (next >= until).then_some(out)
    }

    /// The mark now.
    pub(crate) fn get(&self) -> Mark {
        *self.lock()
    }

    /// Replaces the mark (the writer's own, after a group or a read-back).
    pub(crate) fn set(&self, mark: Mark) {
        *self.lock() = mark;
        self.publish(mark.plog);
    }

    /// Raises the mark field-wise to at least `mark`.
    pub(crate) fn raise(&self, mark: Mark) {
        let raised = {
            let mut held = self.lock();
            *held = held.max(&mark);
            held.plog
        };
        self.publish(raised);
    }

    /// The PLog offset the next acknowledged event gets: every offset below it is final.
    pub(crate) fn end(&self) -> u64 {
        *self.end.borrow()
    }

    /// A receiver that wakes when [`Acked::end`] moves.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.end.subscribe()
    }

    /// Tells waiting readers of a new end; wakes nobody when it did not move.
    fn publish(&self, plog: u64) {
        let end = plog.saturating_add(1);
        self.end.send_if_modified(|held| {
            let moved = *held != end;
            *held = end;
            moved
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Mark> {
        self.mark.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The PLog offset of a kept group's last event.
fn last(group: &[Event]) -> u64 {
    group.last().map_or(0, |e| e.plog_offset.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(plog: u64) -> Mark {
        Mark {
            plog,
            ..Mark::default()
        }
    }

    #[test]
    fn the_end_follows_the_acknowledged_mark_and_wakes_readers() {
        let acked = Acked::default();
        assert_eq!(acked.end(), 1);
        let mut rx = acked.subscribe();
        acked.raise(mark(5));
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 6);
        acked.raise(mark(3));
        assert_eq!(acked.end(), 6, "raising never lowers");
        assert!(
            !rx.has_changed().unwrap(),
            "no wake when the end did not move"
        );
        acked.set(mark(9));
        assert_eq!(acked.end(), 10);
        assert_eq!(acked.get().plog, 9);
    }

    fn event(plog: u64) -> Event {
        Event {
            plog_offset: monoseq_core::PLogOffset(plog),
            ws: monoseq_core::WsId(1),
            ws_kind: monoseq_core::WsKind(1),
            wlog_offset: monoseq_store::WLogOffset(plog),
            registered_at_ms: 0,
            command: "c".to_owned(),
            argument: None,
            created: Vec::new(),
            updated: Vec::new(),
            idempotency: None,
        }
    }

    /// Keeps the group of `offsets` and acknowledges it, as the writer does.
    fn write(acked: &Acked, offsets: std::ops::RangeInclusive<u64>) {
        acked.keep(offsets.clone().map(event).collect());
        acked.set(mark(*offsets.end()));
    }

    fn offsets(groups: &[Arc<[Event]>]) -> Vec<u64> {
        groups
            .iter()
            .flat_map(|g| g.iter().map(|e| e.plog_offset.0))
            .collect()
    }

    #[test]
    fn kept_groups_hand_over_every_acknowledged_event_from_an_offset_in_order() {
        let acked = Acked::default();
        acked.set_followed(true);
        write(&acked, 1..=3);
        write(&acked, 4..=4);
        write(&acked, 5..=7);
        assert_eq!(
            offsets(&acked.kept(1, u64::MAX).unwrap()),
            (1..=7).collect::<Vec<_>>()
        );
        // The groups holding 4..6: the last one whole (the reader skips what it has not asked).
        assert_eq!(offsets(&acked.kept(4, 6).unwrap()), vec![4, 5, 6, 7]);
        assert_eq!(
            acked.kept(8, u64::MAX).unwrap().len(),
            0,
            "nothing from the end on"
        );
    }

    #[test]
    fn nothing_is_kept_beyond_the_acknowledged_end_or_when_nobody_follows() {
        let acked = Acked::default();
        write(&acked, 1..=2);
        assert!(
            acked.kept(1, u64::MAX).is_none(),
            "not followed: read the store"
        );
        acked.set_followed(true);
        // Kept before it is acknowledged: a reader never gets it early.
        acked.keep(vec![event(3)]);
        assert_eq!(acked.kept(3, u64::MAX).unwrap().len(), 0);
        acked.set(mark(3));
        assert_eq!(offsets(&acked.kept(3, u64::MAX).unwrap()), vec![3]);
        acked.set_followed(false);
        assert!(
            acked.kept(3, u64::MAX).is_none(),
            "forgotten when nobody follows"
        );
    }

    #[test]
    fn a_hole_or_an_offset_no_longer_kept_sends_the_reader_to_the_store() {
        let acked = Acked::default();
        acked.set_followed(true);
        write(&acked, 1..=2);
        // Acknowledged without being kept (a covered tail at a start): 3..=4 missing here.
        acked.set(mark(4));
        write(&acked, 5..=6);
        assert!(acked.kept(1, u64::MAX).is_none(), "3 and 4 are not kept");
        assert_eq!(offsets(&acked.kept(5, u64::MAX).unwrap()), vec![5, 6]);
        // A group with a hole is never handed over.
        acked.keep(vec![event(7), event(9)]);
        acked.set(mark(9));
        assert!(acked.kept(5, u64::MAX).is_none());
        // Past the bound, the oldest groups go.
        let next = 10;
        let last = next + RECENT_EVENTS_MAX as u64;
        write(&acked, next..=last);
        assert!(acked.kept(next, u64::MAX).is_some());
        write(&acked, last + 1..=last + 1);
        assert!(
            acked.kept(next, u64::MAX).is_none(),
            "evicted past the bound"
        );
        assert!(acked.kept(last + 1, u64::MAX).is_some());
    }
}
