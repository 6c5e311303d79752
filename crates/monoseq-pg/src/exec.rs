//! Runs the store's async driver from the contract's blocking calls: a small tokio runtime the
//! store owns drives the connections, and the calling thread waits for its operation with a
//! plain park/unpark executor. Owns the rule that a connection goes back to the pool only
//! after an operation ended cleanly; any other end (error, timeout, panic) discards it.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};
use std::time::Duration;

use deadpool_postgres::{ClientWrapper, Object, Pool};
use tokio::runtime::Runtime;

use crate::error::Failure;

/// Worker threads of a store's runtime: they only move bytes between sockets and the callers
/// (rows are decoded on the calling thread), so one is enough.
const RUNTIME_WORKER_THREADS: usize = 1;

/// Builds the runtime that drives a store's connections.
pub(crate) fn runtime() -> std::io::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(RUNTIME_WORKER_THREADS)
        .thread_name("monoseq-pg")
        .enable_io()
        .enable_time()
        .build()
}

struct Unparker(Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on the calling thread, inside `runtime`'s context (for timers
/// and for spawning connection tasks).
///
/// Unlike `Runtime::block_on` it never panics when the caller is itself inside an async
/// runtime or inside another `block_on` (a scan's visitor may call the store again): it just
/// blocks the thread, as a store on a local disk would. Callers on an async runtime should
/// still use `spawn_blocking`, as for any blocking store.
///
/// The future runs outside tokio's cooperative budget: a caller inside a tokio `block_on`
/// (a partition's own thread) would otherwise see the pool and the timers answer "yield"
/// once that budget is spent, and since only the caller's executor restores it, this loop
/// would poll forever.
pub(crate) fn block_on<F: Future>(runtime: &Runtime, future: F) -> F::Output {
    let _context = runtime.enter();
    let waker = Waker::from(Arc::new(Unparker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = pin!(tokio::task::unconstrained(future));
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return output;
        }
        // A wake-up between the poll and here leaves a token: `park` returns at once.
        thread::park();
    }
}

/// `future`, failing with [`Failure::Timeout`] after `limit`.
pub(crate) async fn within<T>(
    limit: Duration,
    future: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, future).await {
        Ok(result) => result,
        Err(_) => Err(Failure::Timeout(limit)),
    }
}

/// A pooled connection that is discarded on drop unless [`Conn::release`] hands it back: a
/// connection left mid-transaction or mid-answer by an error or a timeout must never serve
/// another call.
pub(crate) struct Conn {
    object: Option<Object>,
}

impl Conn {
    /// A connection from `pool`.
    pub(crate) async fn get(pool: &Pool) -> Result<Conn, Failure> {
        let object = pool.get().await?;
        Ok(Conn {
            object: Some(object),
        })
    }

    /// The client, with its statement cache.
    pub(crate) fn client(&self) -> Result<&ClientWrapper, Failure> {
        match &self.object {
            Some(object) => Ok(object),
            None => Err(Failure::Corrupted(
                "a released connection was used again".to_owned(),
            )),
        }
    }

    /// Hands the connection back to the pool: the operation ended cleanly (no transaction
    /// open, every answer read).
    pub(crate) fn release(mut self) {
        drop(self.object.take());
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            // Detached from the pool: dropping the client closes the connection, and the
            // server rolls back whatever transaction it had open.
            drop(Object::take(object));
        }
    }
}
