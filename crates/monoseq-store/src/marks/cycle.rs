//! Raising marks: raises of all partitions share cycles (group commit).
//!
//! One caller, the cycle's leader, first makes the store durable with its `sync_store`, then
//! writes every raise waiting for the cycle and syncs the file once. So a mark reaches the disk only after the events it covers, and a
//! power loss can leave a mark below the store's end, never above it.
//!
//! A partition announces each group it starts writing ([`Marks::begin_group`]); a leader first
//! waits, at most [`GATHER_MAX`], for the groups announced before it to raise too, so that one
//! cycle covers the groups of several partitions instead of each paying its own pair of syncs.
//! With no other group under way it waits for nothing.

use std::collections::VecDeque;
use std::os::unix::fs::FileExt;
use std::sync::MutexGuard;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use monoseq_kv::KvError;

use super::file::{encode_slot, io, slot_at};
use super::{Mark, Marks, MarksError};

/// Failed cycles kept for the waiters that have not read their outcome yet.
const FAILURES_KEPT: usize = 64;

/// The longest a cycle's leader waits for the groups announced before it to raise too.
pub const GATHER_MAX: Duration = Duration::from_micros(500);

/// The raise cycles: tickets handed out, tickets done, and the raises waiting for a cycle.
#[derive(Debug, Default)]
pub(super) struct Cycles {
    /// Tickets handed out so far (one per raise).
    requested: u64,
    /// Every ticket up to this one is done (raised durably, or failed).
    done: u64,
    /// A leader is running a cycle.
    leading: bool,
    /// The number of the cycle that takes the raises waiting now (cycles are numbered from 0
    /// in the order they take their raises).
    taking: u64,
    /// Raises not yet taken by a cycle.
    waiting: Vec<(u32, Mark)>,
    /// The latest failed cycles: their first and last tickets and the error.
    failed: VecDeque<(u64, u64, String)>,
    /// Groups announced so far ([`Marks::begin_group`]).
    begun: u64,
    /// Announced groups that raised since, or ended without raising.
    settled: u64,
    /// A leader is waiting for announced groups until `settled` reaches `gather_until`: the
    /// group that settles it wakes the leader (the ones before it do not).
    gathering: bool,
    gather_until: u64,
}

/// A group a partition has started to write, announced so that a cycle starting meanwhile
/// waits for its raise ([`GroupBegun::raise_after`]). Dropped without raising, it stops
/// being waited for.
#[derive(Debug)]
#[must_use = "a group is waited for until it raises or is dropped"]
pub struct GroupBegun<'a> {
    marks: &'a Marks,
    settled: bool,
}

impl GroupBegun<'_> {
    /// [`Marks::raise_after`] for the group announced.
    ///
    /// # Errors
    ///
    /// As [`Marks::raise_after`].
    pub fn raise_after(
        mut self,
        partition: u32,
        mark: &Mark,
        sync_store: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), MarksError> {
        self.settled = true;
        self.marks
            .raise_cycle(&[(partition, *mark)], sync_store, true)
    }
}

impl Drop for GroupBegun<'_> {
    fn drop(&mut self) {
        if !self.settled {
            self.marks.settle(&mut self.marks.cycles());
        }
    }
}

/// A cycle's end, run when its leader is done or unwinds (then the cycle failed).
struct CycleEnd<'a> {
    marks: &'a Marks,
    number: u64,
    first: u64,
    last: u64,
    failure: Option<String>,
}

impl Drop for CycleEnd<'_> {
    fn drop(&mut self) {
        let failure = if std::thread::panicking() {
            Some("the cycle's store sync or marks write panicked".to_owned())
        } else {
            self.failure.take()
        };
        self.marks
            .end_cycle(self.number, (self.first, self.last), failure);
    }
}

impl Marks {
    /// durable. Concurrent raises share one `fdatasync`. A raise that changes nothing returns
    /// once every earlier raise is durable.
    ///
    /// # Errors
    ///
    /// [`MarksError`] when writing or syncing failed: the mark may not be durable, so the
    /// caller must not acknowledge what it covers.
    pub fn raise(&self, partition: u32, mark: &Mark) -> Result<(), MarksError> {
        self.raise_after(partition, mark, || Ok(()))
    }

    /// [`Marks::raise`] once the store holding the events `mark` covers is durable: the cycle
    /// that takes this raise runs one caller's `sync_store` before it writes the marks. Every
    /// caller's `sync_store` must make durable every write to the same store acknowledged
    /// before the call (a group commit's `sync` does).
    ///
    /// # Errors
    ///
    /// [`MarksError::Store`] when this caller's `sync_store` failed, [`MarksError::Shared`]
    /// when another caller's cycle failed, other [`MarksError`]s when writing or syncing the
    /// file failed. Nothing the mark covers may be acknowledged then.
    pub fn raise_after(
        &self,
        partition: u32,
        mark: &Mark,
        sync_store: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), MarksError> {
        self.raise_cycle(&[(partition, *mark)], sync_store, false)
    }

    /// [`Marks::raise_after`] for several partitions at once, as one caller: the raises of
    /// the groups of the partitions that share a writer thread (one wait for all of them).
    ///
    /// # Errors
    ///
    /// As [`Marks::raise_after`]; [`MarksError::NoSuchPartition`] (raising nothing) when a
    /// partition is outside the file.
    pub fn raise_all_after(
        &self,
        raises: &[(u32, Mark)],
        sync_store: impl FnOnce() -> Result<(), KvError>,
    ) -> Result<(), MarksError> {
        self.raise_cycle(raises, sync_store, false)
    }

    /// Announces a group that will raise soon (through the answer's
    /// [`GroupBegun::raise_after`]): a cycle that starts before it raises waits for it, at
    /// most the gather bound ([`GATHER_MAX`]), so that both share one store sync and one
    /// `fdatasync`.
    pub fn begin_group(&self) -> GroupBegun<'_> {
        self.cycles().begun += 1;
        GroupBegun {
            marks: self,
            settled: false,
        }
    }

    /// Sets the gather bound: the longest a cycle's leader waits for the groups announced
    /// before it (zero: it waits for none).
    pub fn set_gather(&self, gather: Duration) {
        let us = u64::try_from(gather.as_micros()).unwrap_or(u64::MAX);
        self.gather_us.store(us, Ordering::Relaxed);
    }

    /// [`Marks::raise_after`], settling an announced group first when `settles`.
    fn raise_cycle(
        &self,
        raises: &[(u32, Mark)],
        sync_store: impl FnOnce() -> Result<(), KvError>,
        settles: bool,
    ) -> Result<(), MarksError> {
        let partitions = self.partitions();
        if let Some(&(partition, _)) = raises.iter().find(|(p, _)| *p >= partitions) {
            if settles {
                self.settle(&mut self.cycles());
            }
            return Err(MarksError::NoSuchPartition {
                partition,
                partitions,
            });
        }
        let mut cycles = self.cycles();
        // One ticket for the caller: the raises are taken by one cycle together.
        cycles.requested += 1;
        let ticket = cycles.requested;
        cycles.waiting.extend_from_slice(raises);
        // The next cycle to take raises takes this one: its end wakes this caller.
        let ended = &self.cycle_ended[parity(cycles.taking)];
        if settles {
            self.settle(&mut cycles);
        }
        while cycles.leading && cycles.done < ticket {
            cycles = ended.wait(cycles).unwrap_or_else(|e| e.into_inner());
        }
        if cycles.done >= ticket {
            return match cycles
                .failed
                .iter()
                .find(|f| f.0 <= ticket && ticket <= f.1)
            {
                None => Ok(()),
                Some((_, _, reason)) => Err(MarksError::Shared {
                    reason: reason.clone(),
                }),
            };
        }
        // This caller leads the cycle of every raise waiting now, its own included, after the
        // groups announced before now raised too (or the gather bound passed).
        cycles.leading = true;
        cycles = self.gather(cycles);
        let number = cycles.taking;
        cycles.taking += 1;
        let first = cycles.done + 1;
        let last = cycles.requested;
        let batch = std::mem::take(&mut cycles.waiting);
        drop(cycles);
        // Ends the cycle even when the store's sync panics, so that no later raise waits for
        // a leader that is gone.
        let mut ending = CycleEnd {
            marks: self,
            number,
            first,
            last,
            failure: None,
        };
        let result = sync_store()
            .map_err(MarksError::Store)
            .and_then(|()| self.write_cycle(batch));
        ending.failure = result.as_ref().err().map(|e| monoseq_kv::chain(e));
        drop(ending);
        result
    }

    /// Counts an announced group as settled, waking a leader waiting for groups once the last
    /// group it waits for settled.
    fn settle(&self, cycles: &mut Cycles) {
        cycles.settled += 1;
        if cycles.gathering && cycles.settled == cycles.gather_until {
            self.group_settled.notify_all();
        }
    }

    /// A leader's wait for the groups announced before now to raise (or end without raising),
    /// at most the gather bound.
    fn gather<'a>(&'a self, mut cycles: MutexGuard<'a, Cycles>) -> MutexGuard<'a, Cycles> {
        let announced = cycles.begun;
        if cycles.settled >= announced {
            return cycles;
        }
        let gather = Duration::from_micros(self.gather_us.load(Ordering::Relaxed));
        // No deadline past what an `Instant` holds: then only the groups end the wait.
        let deadline = Instant::now().checked_add(gather);
        cycles.gathering = true;
        cycles.gather_until = announced;
        while cycles.settled < announced {
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                break;
            }
            cycles = self
                .group_settled
                .wait_timeout(cycles, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        cycles.gathering = false;
        cycles
    }

    /// Ends cycle `number`, of tickets `first..=last`, failed with `failure` if any: wakes
    /// every caller waiting for it, and one of those waiting for the next cycle (if any) to
    /// lead that one; the others sleep on until it ends.
    fn end_cycle(&self, number: u64, (first, last): (u64, u64), failure: Option<String>) {
        let mut cycles = self.cycles();
        cycles.leading = false;
        cycles.done = last;
        if let Some(reason) = failure {
            if cycles.failed.len() == FAILURES_KEPT {
                cycles.failed.pop_front();
            }
            cycles.failed.push_back((first, last, reason));
        }
        let next_waits = cycles.requested > last;
        drop(cycles);
        self.cycle_ended[parity(number)].notify_all();
        if next_waits {
            self.cycle_ended[parity(number + 1)].notify_one();
        }
    }

    /// Writes a cycle's raises (each partition's slot at most once) and syncs the file unless
    /// every write is synced already. Only a cycle's leader calls it.
    fn write_cycle(&self, mut batch: Vec<(u32, Mark)>) -> Result<(), MarksError> {
        batch.sort_unstable_by_key(|(p, _)| *p);
        let mut slots = self.lock();
        let mut raises = batch.into_iter().peekable();
        while let Some((partition, mut mark)) = raises.next() {
            while let Some((_, m)) = raises.next_if(|(p, _)| *p == partition) {
                mark = mark.max(&m);
            }
            let (seq, old) = &mut slots[partition as usize];
            let new = old.max(&mark);
            if new == *old {
                continue;
            }
            let next = *seq + 1;
            let at = slot_at(partition, next);
            self.unsynced.store(true, Ordering::Release);
            self.file
                .write_all_at(&encode_slot(next, &new), at)
                .map_err(io("writing", &self.path))?;
            *seq = next;
            *old = new;
        }
        drop(slots);
        if self.unsynced.load(Ordering::Acquire) {
            self.file.sync_data().map_err(io("syncing", &self.path))?;
            self.unsynced.store(false, Ordering::Release);
        }
        Ok(())
    }

    fn cycles(&self) -> MutexGuard<'_, Cycles> {
        self.cycles.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Which of [`Marks`]' two `cycle_ended` condition variables the raises of cycle `number`
/// wait on.
fn parity(number: u64) -> usize {
    usize::from(number % 2 == 1)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::marks::tests::mark;

    #[test]
    fn concurrent_raises_all_become_durable() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = std::sync::Arc::new(Marks::create(dir.path(), 8).expect("create"));
        let threads: Vec<_> = (0..8u32)
            .map(|p| {
                let marks = std::sync::Arc::clone(&marks);
                std::thread::spawn(move || {
                    for plog in 1..=50 {
                        marks.raise(p, &mark(plog)).expect("raise");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread");
        }
        drop(marks);
        let marks = Marks::open(dir.path(), 8).expect("open").expect("present");
        assert!(marks.all().iter().all(|m| *m == mark(50)));
    }

    #[test]
    fn raises_waiting_for_a_cycle_share_the_next_ones_store_sync() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::{Arc, Barrier};
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Arc::new(Marks::create(dir.path(), 8).expect("create"));
        let syncs = Arc::new(AtomicU32::new(0));
        let start = Arc::new(Barrier::new(8));
        let threads: Vec<_> = (0..8u32)
            .map(|p| {
                let (marks, syncs, start) = (marks.clone(), syncs.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    marks.raise_after(p, &mark(u64::from(p) + 1), || {
                        // The first cycle's sync is slow: the other raises queue behind it.
                        if syncs.fetch_add(1, Ordering::AcqRel) == 0 {
                            std::thread::sleep(std::time::Duration::from_millis(200));
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        for t in threads {
            t.join().expect("thread").expect("raised");
        }
        assert_eq!(
            syncs.load(Ordering::Acquire),
            2,
            "one leader, then one cycle for the rest"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 8).expect("read");
        assert_eq!(on_disk, (1..=8).map(mark).collect::<Vec<_>>());
    }

    #[test]
    fn raising_several_partitions_at_once_takes_one_store_sync_and_refuses_an_unknown_one_whole() {
        use std::cell::Cell;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Marks::create(dir.path(), 4).expect("create");
        let syncs = Cell::new(0);
        let raises = [(0, mark(3)), (2, mark(5)), (3, mark(7)), (2, mark(4))];
        marks
            .raise_all_after(&raises, || {
                syncs.set(syncs.get() + 1);
                Ok(())
            })
            .expect("raised");
        assert_eq!(syncs.get(), 1, "one store sync for every partition");
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 4).expect("read");
        assert_eq!(on_disk, vec![mark(3), Mark::default(), mark(5), mark(7)]);
        let refused = marks.raise_all_after(&[(1, mark(9)), (4, mark(9))], || {
            syncs.set(syncs.get() + 1);
            Ok(())
        });
        assert!(
            matches!(
                refused,
                Err(MarksError::NoSuchPartition {
                    partition: 4,
                    partitions: 4
                })
            ),
            "{refused:?}"
        );
        assert_eq!(syncs.get(), 1, "nothing synced for a refused raise");
        assert_eq!(marks.get(1).expect("partition 1"), Mark::default());
    }

    /// New marks of two partitions in `dir` whose cycles wait at most `bound` for groups.
    fn gathering(dir: &Path, bound: std::time::Duration) -> std::sync::Arc<Marks> {
        let marks = Marks::create(dir, 2).expect("create");
        marks.set_gather(bound);
        std::sync::Arc::new(marks)
    }

    /// Runs `raise` on another thread and waits at most ten seconds for its answer.
    fn within_ten_seconds<T: Send + 'static>(raise: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(raise());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("answered within ten seconds")
    }

    #[test]
    fn a_cycle_waits_for_a_group_begun_before_it_so_both_share_one_store_sync() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        // A gather bound far longer than the test, so only the group's raise ends the wait.
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let syncs = Arc::new(AtomicU32::new(0));
        let (begun_tx, begun_rx) = std::sync::mpsc::channel();
        let (raise_tx, raise_rx) = std::sync::mpsc::channel::<()>();
        let slow = {
            let (marks, syncs) = (marks.clone(), syncs.clone());
            std::thread::spawn(move || {
                let group = marks.begin_group();
                begun_tx.send(()).expect("send");
                raise_rx.recv().expect("told to raise");
                group.raise_after(1, &mark(9), || {
                    syncs.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                })
            })
        };
        begun_rx.recv().expect("the slow group has begun");
        let leader = {
            let (marks, syncs) = (marks.clone(), syncs.clone());
            std::thread::spawn(move || {
                marks.begin_group().raise_after(0, &mark(4), || {
                    syncs.fetch_add(1, Ordering::AcqRel);
                    Ok(())
                })
            })
        };
        // The leader is waiting for the slow group; let the group raise.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(syncs.load(Ordering::Acquire), 0, "the leader waits");
        raise_tx.send(()).expect("send");
        leader.join().expect("thread").expect("raised");
        slow.join().expect("thread").expect("raised");
        assert_eq!(
            syncs.load(Ordering::Acquire),
            1,
            "one cycle, one store sync for both groups"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 2).expect("read");
        assert_eq!(on_disk, vec![mark(4), mark(9)]);
    }

    #[test]
    fn a_group_dropped_without_raising_is_waited_for_no_longer() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let abandoned = marks.begin_group();
        let raising = marks.clone();
        let leader =
            std::thread::spawn(move || raising.begin_group().raise_after(0, &mark(2), || Ok(())));
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !leader.is_finished(),
            "the leader waits for the other group"
        );
        drop(abandoned);
        let answered = within_ten_seconds(move || leader.join().expect("thread"));
        answered.expect("raised once the other group was dropped");
        assert_eq!(marks.get(0).expect("partition 0"), mark(2));
    }

    #[test]
    fn a_lone_group_and_a_raise_without_a_group_wait_for_nobody() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_secs(60));
        let lone = marks.clone();
        within_ten_seconds(move || lone.begin_group().raise_after(0, &mark(3), || Ok(())))
            .expect("raised");
        let plain = marks.clone();
        within_ten_seconds(move || plain.raise_after(1, &mark(5), || Ok(()))).expect("raised");
        assert_eq!(marks.all(), vec![mark(3), mark(5)]);
    }

    #[test]
    fn a_cycle_waits_at_most_its_gather_bound_for_a_group_that_never_raises() {
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = gathering(dir.path(), Duration::from_millis(50));
        let _stuck = marks.begin_group();
        let raising = marks.clone();
        within_ten_seconds(move || raising.begin_group().raise_after(1, &mark(6), || Ok(())))
            .expect("raised after the bound");
        assert_eq!(marks.get(1).expect("partition 1"), mark(6));
    }

    #[test]
    fn a_store_sync_that_panics_fails_its_cycle_and_the_next_raise_still_leads_one() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = std::sync::Arc::new(Marks::create(dir.path(), 2).expect("create"));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            marks.raise_after(0, &mark(3), || panic!("the store's sync panicked"))
        }));
        assert!(panicked.is_err(), "the panic reaches the caller");
        // Not waiting forever for the leader that unwound: on another thread, bounded.
        let (tx, rx) = std::sync::mpsc::channel();
        let raising = marks.clone();
        std::thread::spawn(move || {
            let _ = tx.send(raising.raise_after(1, &mark(5), || Ok(())));
        });
        let next = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("a raise after a panicked cycle is answered");
        next.expect("the next cycle raises");
        assert_eq!(marks.get(1).expect("partition 1"), mark(5));
        assert_eq!(marks.get(0).expect("partition 0"), Mark::default());
    }

    #[test]
    fn a_failed_store_sync_raises_nothing_and_fails_every_raise_of_its_cycle() {
        use std::sync::Arc;
        use std::time::Duration;
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Arc::new(Marks::create(dir.path(), 4).expect("create"));
        // A slow first cycle, behind which two raises queue; the second cycle takes both, and
        // its leader's store sync fails.
        let first = {
            let marks = marks.clone();
            std::thread::spawn(move || {
                marks.raise_after(0, &mark(3), || {
                    std::thread::sleep(Duration::from_millis(200));
                    Ok(())
                })
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        let queued: Vec<_> = [1u32, 2]
            .into_iter()
            .map(|p| {
                let marks = marks.clone();
                std::thread::spawn(move || {
                    marks.raise_after(p, &mark(7), || Err(KvError::poisoned("a test")))
                })
            })
            .collect();
        first.join().expect("thread").expect("the first cycle");
        let mut answers: Vec<_> = queued
            .into_iter()
            .map(|t| t.join().expect("thread"))
            .collect();
        answers.sort_by_key(|a| matches!(a, Err(MarksError::Shared { .. })));
        assert!(
            matches!(
                &answers[0],
                Err(MarksError::Store(KvError::Poisoned { .. }))
            ),
            "the leader's own error: {answers:?}"
        );
        assert!(
            matches!(&answers[1], Err(MarksError::Shared { reason }) if reason.contains("poisoned")),
            "the other raise of the cycle: {answers:?}"
        );
        let on_disk = Marks::read_file(&Marks::path(dir.path()), 4).expect("read");
        assert_eq!(on_disk[0], mark(3));
        assert_eq!(
            on_disk[1..],
            [Mark::default(); 3],
            "nothing of the failed cycle"
        );
        marks
            .raise_after(1, &mark(7), || Ok(()))
            .expect("a later cycle");
        assert_eq!(marks.get(1).expect("partition 1"), mark(7));
    }
}
