//! [`Acked`]: what this process acknowledged of one partition (its high-water mark), and the
//! signal the partition's followers wait on. Every PLog offset below [`Acked::end`] is durable
//! and final: its event was synced and its mark raised before any client was answered. The
//! partition's writer raises it after each group; readers never see beyond it, so a follower
//! never receives an event that a crash could still take back.

use std::sync::Mutex;

use monoseq_store::Mark;
use tokio::sync::watch;

/// A partition's acknowledged mark, shared by its writer (which raises it) and its readers.
#[derive(Debug)]
pub(crate) struct Acked {
    mark: Mutex<Mark>,
    /// The PLog's end (`mark.plog + 1`), published to waiting readers when it moves.
    end: watch::Sender<u64>,
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
        }
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
}
