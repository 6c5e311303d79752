//! Driver: runs the background workers of many sequencers on one shared tokio runtime. Each
//! sequencer costs one small async task, not an OS thread; storage calls run on the runtime's
//! bounded blocking pool. This is the only module that sleeps or reads the clock for the
//! background work, and the one that logs it (actualizations, poison, fencing).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::Instrument;

use crate::shared::{PoisonReason, Shared, Status};
use crate::storage::SeqStorage;
use crate::worker::{Step, Worker};

/// Default blocking threads (storage calls in flight at once) per runtime.
pub const BLOCKING_THREADS_DEFAULT: usize = 8;

/// A shared runtime for the background work of any number of sequencers.
///
/// # Example
///
/// ```
/// let runtime = monoseq_core::Runtime::new(2)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Runtime {
    handle: tokio::runtime::Handle,
    _owned: Option<Arc<OwnedRuntime>>,
}

#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            // Never block in drop (it may run inside another runtime); abandoned storage calls
            // finish on their own.
            rt.shutdown_background();
        }
    }
}

impl Runtime {
    /// A runtime with `worker_threads` async threads (at least 1) and
    /// [`BLOCKING_THREADS_DEFAULT`] threads for storage calls.
    ///
    /// # Errors
    ///
    /// The I/O error of creating the threads.
    pub fn new(worker_threads: usize) -> std::io::Result<Runtime> {
        Runtime::with_blocking_threads(worker_threads, BLOCKING_THREADS_DEFAULT)
    }

    /// A runtime with `worker_threads` async threads and at most `blocking_threads` storage
    /// calls in flight (both at least 1).
    ///
    /// # Errors
    ///
    /// The I/O error of creating the threads.
    pub fn with_blocking_threads(
        worker_threads: usize,
        blocking_threads: usize,
    ) -> std::io::Result<Runtime> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(worker_threads.max(1))
            .max_blocking_threads(blocking_threads.max(1))
            .thread_name("monoseq-bg")
            .enable_time()
            .build()?;
        Ok(Runtime {
            handle: rt.handle().clone(),
            _owned: Some(Arc::new(OwnedRuntime(Some(rt)))),
        })
    }

    /// Uses an existing tokio runtime (it must have time enabled).
    #[must_use]
    pub fn from_handle(handle: tokio::runtime::Handle) -> Runtime {
        Runtime {
            handle,
            _owned: None,
        }
    }

    pub(crate) fn spawn<S: SeqStorage>(
        &self,
        worker: Worker<S>,
        shared: Arc<Shared<S>>,
    ) -> DriverHandle {
        let (done_tx, done_rx) = mpsc::sync_channel(1);
        // The driver's log lines carry the caller's span (the command processor's names the
        // partition).
        let span = tracing::Span::current();
        self.handle.spawn(
            async move {
                drive(worker, &shared).await;
                let _ = done_tx.send(());
            }
            .instrument(span),
        );
        DriverHandle {
            done: std::sync::Mutex::new(done_rx),
        }
    }
}

/// Lets `shutdown` wait, with a bound, for the driver task to end.
#[derive(Debug)]
pub(crate) struct DriverHandle {
    /// In a mutex only so the sequencer is `Sync` (a `Receiver` is not).
    done: std::sync::Mutex<mpsc::Receiver<()>>,
}

impl DriverHandle {
    /// Waits up to `timeout`; answers whether the driver ended.
    pub(crate) fn wait(self, timeout: Duration) -> bool {
        self.done
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(timeout)
            .is_ok()
    }
}

/// How long one blocking call keeps running steps back to back while the backlog stays urgent,
/// before giving other sequencers' workers a turn on the blocking pool. Each return to the
/// runtime costs a thread hand-off (tens of microseconds on a virtual machine) while the
/// backlog keeps filling: a budget of 64 steps made that happen every 2–3 ms under load.
const HOT_RUN_MAX: Duration = Duration::from_millis(10);

/// While transactions keep filling the backlog to its urgent size faster than this, the
/// worker stays on its blocking thread between flushes, parked until a commit makes the
/// backlog urgent, instead of going back to sleep on the runtime: waking a sleeping worker
/// takes a thread hand-off, long on a busy or virtual machine, while the backlog keeps filling
/// towards its limit.
const HOT_WAIT: Duration = Duration::from_millis(1);

/// Runs steps on the blocking pool: one, or more while transactions keep the backlog
/// urgent (saves a thread hand-off per flush under load), waiting for them between steps.
/// `None` when a step panicked: the worker is lost.
async fn run_steps<S: SeqStorage>(
    worker: Worker<S>,
    shared: Arc<Shared<S>>,
    final_flush: bool,
) -> Option<(Worker<S>, Step)> {
    tokio::task::spawn_blocking(move || {
        let mut worker = worker;
        if final_flush {
            if let Err(e) = worker.final_flush()
                && e.is_fenced()
            {
                tracing::warn!(
                    error = %e,
                    "last flush of a stopped sequencer refused by the fence: a newer sequencer \
                     owns the storage"
                );
            }
            return (worker, Step::Stopped);
        }
        let urgent = shared.params.backlog_urgent();
        // Hot: the backlog filled up before its batching delay, so transactions come fast.
        let mut hot = shared.backlog_len.load(Ordering::Acquire) >= urgent;
        let began = Instant::now();
        let mut step = worker.step();
        while step == Step::Idle && began.elapsed() < HOT_RUN_MAX {
            if shared.backlog_len.load(Ordering::Acquire) >= urgent
                || (hot && wait_backlog(&shared, urgent))
            {
                hot = true;
                step = worker.step();
            } else {
                break;
            }
        }
        (worker, step)
    })
    .await
    .ok()
}

/// How long [`wait_backlog`] polls before it parks.
const BACKLOG_SPIN: Duration = Duration::from_micros(50);

/// Waits up to [`HOT_WAIT`] for committed values to fill the backlog to `urgent`, or for
/// shutdown; answers whether the backlog is urgent.
fn wait_backlog<S: SeqStorage>(shared: &Shared<S>, urgent: usize) -> bool {
    let began = Instant::now();
    let deadline = began + HOT_WAIT;
    shared.begin_backlog_wait();
    loop {
        if shared.backlog_len_now() >= urgent || shared.stop.load(Ordering::Acquire) {
            break;
        }
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        if now - began < BACKLOG_SPIN {
            // Waking a parked thread takes tens of microseconds on a virtual machine, while
            // the backlog keeps filling; a short spin that yields the CPU to any other runnable
            // thread avoids it.
            std::thread::yield_now();
        } else {
            // A stale unpark only ends the park early: the loop checks again.
            std::thread::park_timeout(deadline - now);
        }
    }
    shared.end_backlog_wait();
    shared.backlog_len_now() >= urgent && !shared.stop.load(Ordering::Acquire)
}

async fn drive<S: SeqStorage>(mut worker: Worker<S>, shared: &Arc<Shared<S>>) {
    // The actualization under way, across its retries.
    let mut actualization: Option<Actualization> = None;
    loop {
        if shared.stop.load(Ordering::Acquire) {
            break;
        }
        let actualizing = matches!(shared.status(), Status::None | Status::Actualizing);
        if !actualizing && !batch(shared).await {
            break;
        }
        match run_until_idle(worker, shared, actualizing, &mut actualization).await {
            Drove::Idle(w) => worker = w,
            Drove::Stopped(w) => {
                worker = w;
                break;
            }
            Drove::Panicked => return,
        }
        // Sleep until a transaction, an actualization request or shutdown wakes us.
        shared.wake.notified().await;
    }
    // One last attempt to persist what is unflushed; `shutdown` bounds how long it may take.
    if !shared.poisoned.load(Ordering::Acquire) {
        let _ = run_steps(worker, Arc::clone(shared), true).await;
    }
}

/// The batching window: gathers more transactions for up to the batcher delay, unless the
/// backlog fills up first. Answers `false` when shutdown was requested meanwhile.
async fn batch<S: SeqStorage>(shared: &Shared<S>) -> bool {
    let delay = shared.params.batcher_delay;
    if delay.is_zero()
        || shared.backlog_len.load(Ordering::Acquire) >= shared.params.backlog_urgent()
    {
        return true;
    }
    let _ = tokio::time::timeout(delay, shared.wake.notified()).await;
    !shared.stop.load(Ordering::Acquire)
}

/// How a run of steps ended.
enum Drove<S: SeqStorage> {
    /// Nothing left to do until something wakes the worker.
    Idle(Worker<S>),
    /// Shutdown or poison: only the final flush is left.
    Stopped(Worker<S>),
    /// A step panicked: the worker is lost, the sequencer poisoned.
    Panicked,
}

/// Runs steps until the worker is idle or stopped, waiting out each retry delay.
async fn run_until_idle<S: SeqStorage>(
    mut worker: Worker<S>,
    shared: &Arc<Shared<S>>,
    actualizing: bool,
    actualization: &mut Option<Actualization>,
) -> Drove<S> {
    loop {
        let began = Instant::now();
        if actualizing && actualization.is_none() {
            *actualization = Some(Actualization::start(shared, began));
        }
        let Some((w, step)) = run_steps(worker, Arc::clone(shared), false).await else {
            shared.poison(PoisonReason::WorkerPanicked);
            log_poison(shared);
            return Drove::Panicked;
        };
        worker = w;
        if actualizing {
            record_attempt(shared, began, step, actualization);
        }
        match step {
            Step::Idle => return Drove::Idle(worker),
            Step::Stopped => {
                log_poison(shared);
                return Drove::Stopped(worker);
            }
            Step::RetryAfter(d) => {
                let _ = tokio::time::timeout(d, wait_stop(shared)).await;
                if shared.stop.load(Ordering::Acquire) {
                    return Drove::Stopped(worker);
                }
            }
        }
    }
}

/// An actualization under way (across its retries): when it began, and the events replayed
/// before it.
struct Actualization {
    began: Instant,
    replayed_before: u64,
}

impl Actualization {
    fn start<S: SeqStorage>(shared: &Shared<S>, began: Instant) -> Actualization {
        tracing::info!("sequencer actualization started");
        Actualization {
            began,
            replayed_before: shared.metrics.replayed_events.load(Ordering::Relaxed),
        }
    }

    fn log_end<S: SeqStorage>(self, shared: &Shared<S>, step: Step) {
        let replayed =
            shared.metrics.replayed_events.load(Ordering::Relaxed) - self.replayed_before;
        tracing::info!(
            events_replayed = replayed,
            duration_ms = %format_args!("{:.1}", self.began.elapsed().as_secs_f64() * 1e3),
            next_offset = shared.metrics.next_offset.load(Ordering::Relaxed),
            checkpoint = shared.metrics.durable_offset.load(Ordering::Relaxed),
            outcome = ?step,
            "sequencer actualization ended"
        );
    }
}

/// Records how long an attempt at actualization (which began at `began`) took, and logs the
/// end of the actualization when it ended (done, stopped or poisoned); a failed attempt is
/// retried silently, its storage errors counted in the sequencer's stats.
fn record_attempt<S: SeqStorage>(
    shared: &Shared<S>,
    began: Instant,
    step: Step,
    actualization: &mut Option<Actualization>,
) {
    shared
        .metrics
        .last_actualization_micros
        .store(began.elapsed().as_micros() as u64, Ordering::Relaxed);
    if matches!(step, Step::RetryAfter(_)) {
        return;
    }
    if let Some(a) = actualization.take() {
        a.log_end(shared, step);
    }
}

/// Logs why the sequencer is poisoned, if it is: a fenced write at warn (a newer sequencer
/// took over, as intended), anything else at error.
fn log_poison<S: SeqStorage>(shared: &Shared<S>) {
    match shared.poison_reason() {
        None => {}
        Some(PoisonReason::Fenced) => tracing::warn!(
            reason = %PoisonReason::Fenced,
            "sequencer write refused by the fence; its worker stops"
        ),
        Some(reason) => tracing::error!(%reason, "sequencer poisoned; its worker stops"),
    }
}

/// Resolves once shutdown is requested (woken through the same `Notify`).
async fn wait_stop<S: SeqStorage>(shared: &Shared<S>) {
    while !shared.stop.load(Ordering::Acquire) {
        shared.wake.notified().await;
    }
}
