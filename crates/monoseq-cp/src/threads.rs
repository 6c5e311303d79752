//! Writer threads shared by partitions: with high-water marks (a data directory's store),
//! each partition's task runs on one of a few threads with the tasks of other partitions, and
//! the groups they appended together wait for one raise of their marks.
//!
//! A thread polls its tasks until none can go on; each group its tasks appended meanwhile
//! waits in [`Raises`]. The thread then raises all their marks in one call
//! ([`Marks::raise_all_after`], after the store's sync) and wakes them to answer their
//! commands. So one thread's groups share one marks cycle and one wait, and a partition's
//! thread is woken once for the groups of all its partitions rather than once per group.
//! Nothing is acknowledged earlier than before: a group is answered only after the cycle
//! that raised its mark (`finish_group`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use futures_util::stream::FuturesUnordered;
use futures_util::{FutureExt, StreamExt};
use monoseq_kv::KvError;
use monoseq_store::{Mark, Marks, MarksError};
use tokio::sync::{mpsc, oneshot};

/// A partition's task, handed to the thread that runs it.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The store's sync that precedes every raise: it makes every group appended before it
/// durable, whatever its partition.
pub(crate) type SyncStore = Arc<dyn Fn() -> Result<(), KvError> + Send + Sync>;

/// A group's raise waiting for its thread: the partition, the mark, where to answer.
type Waiting = (u32, Mark, oneshot::Sender<Result<(), MarksError>>);

/// The raises of one thread's appended groups, waiting for the thread to run them.
#[derive(Default)]
pub(crate) struct Raises {
    waiting: Mutex<Vec<Waiting>>,
}

impl Raises {
    /// Waits for the raise of `partition`'s mark to `mark`, which the thread runs with those
    /// of its other groups once none of its tasks can go on; how it went.
    pub(crate) async fn raise(&self, partition: u32, mark: Mark) -> Result<(), MarksError> {
        let (tx, rx) = oneshot::channel();
        self.lock().push((partition, mark, tx));
        rx.await.unwrap_or_else(|_| {
            Err(MarksError::Shared {
                reason: "the writer thread stopped before raising the mark".to_owned(),
            })
        })
    }

    /// Raises every waiting mark in one call after the store's sync and answers each group;
    /// whether there were any.
    fn run(&self, marks: &Marks, sync: &SyncStore) -> bool {
        let waiting = std::mem::take(&mut *self.lock());
        if waiting.is_empty() {
            return false;
        }
        let raises: Vec<(u32, Mark)> = waiting.iter().map(|(p, m, _)| (*p, *m)).collect();
        let raised = std::panic::catch_unwind(AssertUnwindSafe(|| {
            marks.raise_all_after(&raises, || sync())
        }))
        .unwrap_or_else(|_| {
            Err(MarksError::Shared {
                reason: "the store's sync or the marks' write panicked".to_owned(),
            })
        });
        // The first group gets the error itself (a poisoned store stops its partition at
        // once), the others its text: each group that failed is written again or stops.
        let ok = raised.is_ok();
        let mut first = Some(raised);
        for (_, _, tx) in waiting {
            let answer = match first.take() {
                Some(answer) => answer,
                None if ok => Ok(()),
                None => Err(MarksError::Shared {
                    reason: "the raise shared with another partition's group failed".to_owned(),
                }),
            };
            let _ = tx.send(answer);
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One shared thread: where its tasks are sent, and their raises.
struct Thread {
    tasks: mpsc::UnboundedSender<Task>,
    raises: Arc<Raises>,
}

/// The shared writer threads of a processor, started as partitions need them.
pub(crate) struct WriterThreads {
    count: usize,
    marks: Arc<Marks>,
    sync: SyncStore,
    threads: Mutex<Vec<Option<Thread>>>,
}

impl WriterThreads {
    /// `count` threads raising `marks` after `sync`: at least one, at most one for each of
    /// the `partitions` (a larger count would start no more threads).
    pub(crate) fn new(
        count: usize,
        partitions: u32,
        marks: Arc<Marks>,
        sync: SyncStore,
    ) -> WriterThreads {
        let count = count.clamp(1, partitions.max(1) as usize);
        WriterThreads {
            count,
            marks,
            sync,
            threads: Mutex::new((0..count).map(|_| None).collect()),
        }
    }

    /// The raises of partition `p`'s thread, and a way to run its task there (started if
    /// it is not running yet); `Err` when the system refused the thread.
    pub(crate) fn place(
        &self,
        p: u32,
        runtime: &tokio::runtime::Handle,
    ) -> std::io::Result<(Arc<Raises>, mpsc::UnboundedSender<Task>)> {
        let i = p as usize % self.count;
        let mut threads = self.threads.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = &threads[i]
            && !t.tasks.is_closed()
        {
            return Ok((Arc::clone(&t.raises), t.tasks.clone()));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let raises = Arc::new(Raises::default());
        let run = serve(
            rx,
            Arc::clone(&raises),
            Arc::clone(&self.marks),
            Arc::clone(&self.sync),
        );
        let runtime = runtime.clone();
        std::thread::Builder::new()
            .name(format!("monoseq-w{i}"))
            .spawn(move || runtime.block_on(run))?;
        threads[i] = Some(Thread {
            tasks: tx.clone(),
            raises: Arc::clone(&raises),
        });
        Ok((raises, tx))
    }
}

/// A shared thread's work: runs the tasks sent to it until the sender is gone and every task
/// ended, raising their groups' marks whenever none of them can go on.
async fn serve(
    mut new: mpsc::UnboundedReceiver<Task>,
    raises: Arc<Raises>,
    marks: Arc<Marks>,
    sync: SyncStore,
) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    std::future::poll_fn(|cx| {
        loop {
            while open {
                match new.poll_recv(cx) {
                    // A panic ends its own task only, not the thread's other partitions.
                    Poll::Ready(Some(task)) => running.push(AssertUnwindSafe(task).catch_unwind()),
                    Poll::Ready(None) => open = false,
                    Poll::Pending => break,
                }
            }
            while let Poll::Ready(Some(ended)) = running.poll_next_unpin(cx) {
                if ended.is_err() {
                    tracing::error!("a partition's task panicked on its writer thread; it stopped");
                }
            }
            // None of the tasks can go on: the groups they appended wait for one raise.
            if raises.run(&marks, &sync) {
                continue;
            }
            if !open && running.is_empty() {
                return Poll::Ready(());
            }
            return Poll::Pending;
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writer_thread_count_beyond_the_partitions_keeps_one_slot_per_partition() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let marks = Arc::new(Marks::create(dir.path(), 2).expect("marks"));
        let sync: SyncStore = Arc::new(|| Ok(()));
        let threads = WriterThreads::new(usize::MAX, 2, Arc::clone(&marks), Arc::clone(&sync));
        assert_eq!(threads.count, 2);
        let threads = WriterThreads::new(0, 2, marks, sync);
        assert_eq!(threads.count, 1, "at least one");
    }
}
