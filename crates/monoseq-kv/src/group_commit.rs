//! Flush bookkeeping shared by the embedded backends: [`Commits`] counts acknowledged writes
//! and flushes, lets concurrent `sync` callers share one flush, and poisons the store after a
//! failed flush; [`Flusher`] is the background worker of [`Durability::GroupCommit`].
//!
//! [`Durability::GroupCommit`]: crate::Durability::GroupCommit

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{KvError, chain};
use crate::options::Durability;

/// Counts writes and flushes of one store.
#[derive(Debug, Default)]
pub(crate) struct Commits {
    /// Writes acknowledged so far.
    acked: AtomicU64,
    /// Writes covered by the last successful flush; the lock serialises flushes.
    flushed: Mutex<u64>,
    /// Set by a failed flush (or a failure that poisoned the engine itself): after it nothing
    /// is known about what reached the disk.
    poisoned: AtomicBool,
    /// The first such failure with its causes, named by every later error.
    first: OnceLock<String>,
}

/// The first failure of a store whose engine poisoned itself where the store could not see
/// why (fjall's background flush or compaction failed: fjall logs it).
pub(crate) const FIRST_UNSEEN: &str = "the storage engine stopped after a failure of its own \
     (a failed flush or compaction of its background workers; its own error line in the log \
     names it)";

impl Commits {
    /// Fails when an earlier flush failed, naming the first failure.
    pub(crate) fn check(&self) -> Result<(), KvError> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(self.poisoned_error());
        }
        Ok(())
    }

    fn poisoned_error(&self) -> KvError {
        KvError::poisoned(self.first.get().map_or(FIRST_UNSEEN, String::as_str))
    }

    /// Poisons the store because of `failure` (the first one is kept as the cause every later
    /// error names) and answers the store's poisoned error.
    pub(crate) fn poison(&self, failure: &KvError) -> KvError {
        let first = match failure {
            KvError::Poisoned { first } => first.clone(),
            other => chain(other),
        };
        let _ = self.first.set(first);
        self.poisoned.store(true, Ordering::Release);
        self.poisoned_error()
    }

    /// Records one more acknowledged write (call after it is visible).
    pub(crate) fn acknowledged(&self) {
        self.acked.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether some acknowledged write is not flushed yet.
    #[cfg(test)]
    pub(crate) fn dirty(&self) -> bool {
        self.acked.load(Ordering::Acquire) > self.flushed()
    }

    /// Writes acknowledged so far.
    pub(crate) fn acked(&self) -> u64 {
        self.acked.load(Ordering::Acquire)
    }

    /// Writes covered by the last successful flush.
    pub(crate) fn flushed(&self) -> u64 {
        *self.flushed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes every write acknowledged before the call durable with `flush`, unless a flush
    /// that started after them already did. A failed flush poisons.
    pub(crate) fn sync(&self, flush: impl FnOnce() -> Result<(), KvError>) -> Result<(), KvError> {
        self.check()?;
        let target = self.acked.load(Ordering::Acquire);
        let mut flushed = self.flushed.lock().unwrap_or_else(PoisonError::into_inner);
        if *flushed >= target {
            return Ok(());
        }
        self.check()?;
        // Every write counted here was visible before the flush starts, so the flush covers it.
        let covered = self.acked.load(Ordering::Acquire);
        match flush() {
            Ok(()) => {
                *flushed = covered;
                Ok(())
            }
            Err(error) => Err(self.poison(&error)),
        }
    }
}

/// What a worker does after one tick.
pub(crate) enum Tick {
    Continue,
    Stop,
}

enum Message {
    Stop,
}

/// A named background thread that calls `tick` every interval until stopped.
#[derive(Debug)]
pub(crate) struct Flusher {
    messages: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub(crate) fn spawn(
        name: &str,
        interval: Duration,
        mut tick: impl FnMut() -> Tick + Send + 'static,
    ) -> std::io::Result<Flusher> {
        let (messages, inbox) = sync_channel::<Message>(1);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                loop {
                    match inbox.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => {
                            if let Tick::Stop = tick() {
                                return;
                            }
                        }
                        Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Flusher {
            messages,
            thread: Some(thread),
        })
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        // A full channel means a stop is already queued; a closed one, that the thread ended.
        let _ = self.messages.try_send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The background flusher's rule: at each tick (every half of the group-commit delay), flush
/// only when a write acknowledged before the previous tick is still unflushed. A write is
/// flushed at most two ticks (one delay) after it returns, as `GroupCommit` promises; under
/// load, when the writers' own syncs cover every write within a tick, the flusher adds no
/// flush of its own to theirs.
#[derive(Debug, Default)]
pub(crate) struct Ticks {
    /// Writes acknowledged at the previous tick.
    seen: u64,
}

impl Ticks {
    /// At a tick where `acked` writes are acknowledged and `flushed` flushed: whether to flush.
    pub(crate) fn due(&mut self, acked: u64, flushed: u64) -> bool {
        let due = flushed < self.seen;
        self.seen = acked;
        due
    }

    /// One tick of the flusher over `commits`: flushes with `sync` when due; a failed flush
    /// (which poisoned the store) stops the flusher.
    pub(crate) fn tick(
        &mut self,
        commits: &Commits,
        sync: impl FnOnce() -> Result<(), KvError>,
    ) -> Tick {
        // `acked` is read first: a write counted in it was visible before the flushed count
        // was read, so a later tick's flush covers it.
        let acked = commits.acked();
        if self.due(acked, commits.flushed()) && sync().is_err() {
            // Poisoned: every later call reports it.
            return Tick::Stop;
        }
        Tick::Continue
    }
}

/// Starts the background flusher that `Durability::GroupCommit` needs (none for the other
/// modes): every half delay it flushes by the rule of [`Ticks`]; a failed flush (`sync`
/// returned an error, which poisons the store) stops it.
pub(crate) fn start_flusher<T: Send + Sync + 'static>(
    durability: Durability,
    store: std::sync::Arc<T>,
    commits: fn(&T) -> &Commits,
    sync: fn(&T) -> Result<(), KvError>,
) -> Result<Option<Flusher>, KvError> {
    let Durability::GroupCommit { max_delay } = durability else {
        return Ok(None);
    };
    let mut ticks = Ticks::default();
    Flusher::spawn("monoseq-kv-flush", max_delay / 2, move || {
        ticks.tick(commits(&store), || sync(&store))
    })
    .map(Some)
    .map_err(|source| KvError::Io {
        context: "starting the flusher thread",
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::{Arc, Barrier};

    use super::*;

    #[test]
    fn a_failed_flush_poisons_every_later_call_naming_the_first_failure() {
        let commits = Commits::default();
        commits.acknowledged();
        let failed = commits.sync(|| {
            Err(KvError::Io {
                context: "flushing the journal",
                source: std::io::Error::other("no space left on the test disk"),
            })
        });
        let named = |e: &KvError| {
            e.is_poisoned()
                && e.to_string().contains("flushing the journal")
                && e.to_string().contains("no space left on the test disk")
        };
        assert!(failed.as_ref().is_err_and(named), "{failed:?}");
        assert!(commits.check().as_ref().is_err_and(named));
        commits.acknowledged();
        let later = commits.sync(|| Err(KvError::poisoned("a later failure")));
        assert!(later.as_ref().is_err_and(named), "{later:?}");
        assert!(!later.is_err_and(|e| e.to_string().contains("a later failure")));
    }

    #[test]
    fn the_flusher_leaves_writes_the_writers_synced_within_a_tick_to_them() {
        let commits = Commits::default();
        let flushes = AtomicUsize::new(0);
        let flush = || {
            flushes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        let ack = |n: usize| (0..n).for_each(|_| commits.acknowledged());
        let mut ticks = Ticks::default();
        ack(10);
        ticks.tick(&commits, || commits.sync(flush));
        assert_eq!(flushes.load(Ordering::Relaxed), 0, "younger than a tick");
        // A writer syncs the 10 and writes 5 more before the next tick.
        commits.sync(flush).expect("a writer's sync");
        ack(5);
        ticks.tick(&commits, || commits.sync(flush));
        assert_eq!(
            flushes.load(Ordering::Relaxed),
            1,
            "what the writer synced is not flushed again, what it wrote since is younger than \
             a tick"
        );
        ticks.tick(&commits, || commits.sync(flush));
        assert_eq!(
            flushes.load(Ordering::Relaxed),
            2,
            "older than a tick: flushed"
        );
        ticks.tick(&commits, || commits.sync(flush));
        assert_eq!(flushes.load(Ordering::Relaxed), 2, "nothing new");
    }

    #[test]
    fn sync_with_nothing_written_since_the_last_flush_does_not_flush() {
        let commits = Commits::default();
        commits.acknowledged();
        let flushes = AtomicUsize::new(0);
        let flush = || {
            flushes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        };
        commits.sync(flush).expect("first sync");
        commits.sync(flush).expect("second sync");
        assert_eq!(flushes.load(Ordering::Relaxed), 1);
        assert!(!commits.dirty());
        commits.acknowledged();
        assert!(commits.dirty());
    }

    #[test]
    fn concurrent_syncs_share_flushes() {
        const THREADS: usize = 8;
        let commits = Arc::new(Commits::default());
        let flushes = Arc::new(AtomicUsize::new(0));
        let start = Arc::new(Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|_| {
                let (commits, flushes, start) = (
                    Arc::clone(&commits),
                    Arc::clone(&flushes),
                    Arc::clone(&start),
                );
                std::thread::spawn(move || {
                    commits.acknowledged();
                    start.wait();
                    commits
                        .sync(|| {
                            flushes.fetch_add(1, Ordering::Relaxed);
                            std::thread::sleep(Duration::from_millis(20));
                            Ok(())
                        })
                        .expect("sync");
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("syncing thread");
        }
        // Every write was acknowledged before any sync began, so the first flush covers all.
        assert_eq!(flushes.load(Ordering::Relaxed), 1);
        assert!(!commits.dirty());
    }
}
