//! The edge's limits on one request: the cap on requests in flight (503 `overloaded` past
//! it), and the body's read timeout (408 `body_timeout`), which wraps the body rather than
//! reading it, so the token check still runs first.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::Semaphore;

use super::trips::{Limit, metrics, ms};
use super::{EdgeLimits, RETRY_AFTER_SECS};
use monoseq_wire::ErrorCode;

/// The per-request limits: the cap on requests in flight, and the body's read timeout.
pub(super) async fn limit_request(
    State((requests, limits)): State<(Arc<Semaphore>, EdgeLimits)>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = requests.try_acquire() else {
        metrics().trip(Limit::RequestsMax, &limits);
        return unavailable(
            ErrorCode::Overloaded,
            "the server is answering its most requests at once; retry",
        );
    };
    metrics().requests.inc();
    let timed_out = Arc::new(AtomicBool::new(false));
    let deadline = tokio::time::Instant::now() + limits.body_read_timeout;
    let flag = Arc::clone(&timed_out);
    let request = request.map(|body| {
        Body::new(TimedBody {
            inner: body,
            deadline: Box::pin(tokio::time::sleep_until(deadline)),
            timed_out: flag,
        })
    });
    let answer = next.run(request).await;
    metrics().requests.dec();
    if timed_out.load(Ordering::Relaxed) {
        metrics().trip(Limit::BodyReadTimeout, &limits);
        let mut r = crate::base::error(
            StatusCode::REQUEST_TIMEOUT,
            ErrorCode::BodyTimeout,
            format!(
                "the request's body did not arrive within {} ms; nothing was done",
                ms(limits.body_read_timeout)
            ),
        );
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return r;
    }
    answer
}

fn unavailable(code: ErrorCode, message: &str) -> Response {
    let mut r = crate::base::error(StatusCode::SERVICE_UNAVAILABLE, code, message);
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

/// A request body that fails once its deadline passed (and says so in `timed_out`), read only
/// when a handler reads it: the token check still runs before any byte of it is read.
struct TimedBody {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timed_out: Arc<AtomicBool>,
}

/// The error a [`TimedBody`] ends with.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive in time")]
struct BodyTimedOut;

impl http_body::Body for TimedBody {
    type Data = axum::body::Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.timed_out.store(true, Ordering::Relaxed);
            return Poll::Ready(Some(Err(Box::new(BodyTimedOut))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;

    /// A body whose bytes never come.
    struct Never;

    impl http_body::Body for Never {
        type Data = axum::body::Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            Poll::Pending
        }
    }

    #[tokio::test]
    async fn a_body_past_its_deadline_fails_and_says_so() {
        let flag = Arc::new(AtomicBool::new(false));
        let body = Body::new(TimedBody {
            inner: Body::new(Never),
            deadline: Box::pin(tokio::time::sleep(Duration::from_millis(10))),
            timed_out: Arc::clone(&flag),
        });
        assert!(body.collect().await.is_err());
        assert!(flag.load(Ordering::Relaxed));
    }
}
