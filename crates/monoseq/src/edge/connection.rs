//! One connection of the edge: hyper's HTTP/1 serving the router, beside a watchdog that cuts
//! the connection when a head is overdue or a kept-alive connection idled too long, never one
//! with a request in flight.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;

use super::EdgeLimits;
use super::trips::{Limit, metrics, ms};

/// What a connection's watchdog reads: where the connection is in its request cycle.
struct Activity {
    started: Instant,
    /// Milliseconds since `started` of the last byte read or written.
    last_io_ms: AtomicU64,
    /// Milliseconds since `started` when the current wait for a head began (the connection's
    /// start, or the first byte after an answer); `u64::MAX` while idle or in a request.
    head_since_ms: AtomicU64,
    /// Milliseconds since `started` of the last answer (idle since then, if no head began).
    idle_since_ms: AtomicU64,
    in_flight: AtomicUsize,
}

const NONE: u64 = u64::MAX;

impl Activity {
    fn new(started: Instant) -> Activity {
        Activity {
            started,
            last_io_ms: AtomicU64::new(0),
            head_since_ms: AtomicU64::new(0),
            idle_since_ms: AtomicU64::new(NONE),
            in_flight: AtomicUsize::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        ms(self.started.elapsed())
    }

    fn read(&self) {
        let now = self.now_ms();
        self.last_io_ms.store(now, Ordering::Relaxed);
        // The first byte after an answer starts the next head's clock.
        if self.in_flight.load(Ordering::Relaxed) == 0
            && self.idle_since_ms.swap(NONE, Ordering::Relaxed) != NONE
        {
            self.head_since_ms.store(now, Ordering::Relaxed);
        }
    }

    fn request_began(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_since_ms.store(NONE, Ordering::Relaxed);
        self.idle_since_ms.store(NONE, Ordering::Relaxed);
    }

    fn request_ended(&self) {
        if self.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.idle_since_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// The limit this connection is past now, if any.
    fn overdue(&self, limits: &EdgeLimits) -> Option<Limit> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let now = self.now_ms();
        let head = self.head_since_ms.load(Ordering::Relaxed);
        if head != NONE && now.saturating_sub(head) > ms(limits.header_read_timeout) {
            return Some(Limit::HeaderReadTimeout);
        }
        let idle = self.idle_since_ms.load(Ordering::Relaxed);
        let quiet = idle.max(self.last_io_ms.load(Ordering::Relaxed));
        (idle != NONE && now.saturating_sub(quiet) > ms(limits.idle_timeout))
            .then_some(Limit::IdleTimeout)
    }
}

/// A connection's stream that tells its [`Activity`] about every byte, and gives back first
/// what the edge read ahead of hyper (the first request line, `lanes::first_line`).
struct Tracked<S> {
    ahead: Bytes,
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.ahead.is_empty() {
            let n = buf.remaining().min(self.ahead.len());
            buf.put_slice(&self.ahead.split_to(n));
            self.activity.read();
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            let now = self.activity.now_ms();
            self.activity.last_io_ms.store(now, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves one connection (`ahead`: its first bytes, already read from `io`), cutting it when
/// its watchdog finds a limit passed, and finishing it gracefully when the server stops.
pub(super) async fn serve<S>(
    io: S,
    ahead: Vec<u8>,
    app: Router,
    limits: EdgeLimits,
    mut stop: watch::Receiver<bool>,
    (accepted, peer): (Instant, super::PeerAddr),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(accepted));
    let io = hyper_util::rt::TokioIo::new(Tracked {
        ahead: Bytes::from(ahead),
        inner: io,
        activity: Arc::clone(&activity),
    });
    let tower = hyper_util::service::TowerToHyperService::new(app);
    let watched = Arc::clone(&activity);
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            request.extensions_mut().insert(peer.clone());
            let activity = Arc::clone(&watched);
            activity.request_began();
            let answer = hyper::service::Service::call(&tower, request);
            async move {
                let answer = answer.await;
                activity.request_ended();
                answer
            }
        });
    let conn = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let tick = limits
        .header_read_timeout
        .min(limits.idle_timeout)
        .div_f64(4.0)
        .clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut stopping = *stop.borrow();
    if stopping {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep(tick) => {
                if let Some(limit) = activity.overdue(&limits) {
                    metrics().trip(limit, &limits);
                    return; // dropping the connection closes it
                }
            }
            changed = stop.changed(), if !stopping => {
                stopping = true;
                if changed.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn what_was_read_ahead_is_read_again_before_the_rest() {
        let (mut ours, mut theirs) = tokio::io::duplex(1024);
        theirs
            .write_all(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let ahead = super::super::lanes::first_line(&mut ours, Duration::from_secs(5))
            .await
            .unwrap();
        assert!(ahead.starts_with(b"GET /a HTTP/1.1\r\n"));
        theirs.write_all(b"more").await.unwrap();
        drop(theirs);
        let mut again = Tracked {
            ahead: Bytes::from(ahead),
            inner: ours,
            activity: Arc::new(Activity::new(Instant::now())),
        };
        let mut all = String::new();
        again.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET /a HTTP/1.1\r\nhost: x\r\n\r\nmore");
    }

    #[test]
    fn a_fresh_silent_connection_is_owed_a_head_and_an_answered_one_is_idle() {
        let limits = EdgeLimits {
            header_read_timeout: Duration::from_millis(0),
            idle_timeout: Duration::from_secs(3600),
            ..EdgeLimits::default()
        };
        let a = Activity::new(Instant::now());
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(a.overdue(&limits), Some(Limit::HeaderReadTimeout)));
        a.request_began();
        assert!(
            a.overdue(&limits).is_none(),
            "a request in flight is never cut"
        );
        a.request_ended();
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            a.overdue(&limits).is_none(),
            "idle, within the idle timeout"
        );
        a.read();
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(a.overdue(&limits), Some(Limit::HeaderReadTimeout)));
    }
}
