//! What the binary's modules share and what depends on nothing else of the binary: the
//! application the server runs, the store type, the JSON error answer every endpoint gives,
//! an error chain rendered with each cause once, a log line's throttle, and the wait for a
//! stop signal. Kept at the
//! bottom of the module graph so that no import cycle runs through it.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use monoseq_kv::KvStore;
use monoseq_store::AppId;

/// A key-value store of either kind, as the server and the tools use it.
pub type Store = Arc<dyn KvStore>;

/// The application the server runs (one per data directory).
pub const APP: AppId = AppId(1);

/// The JSON error answer `{"code", "message"}` of every endpoint.
pub(crate) fn error(
    status: StatusCode,
    code: monoseq_wire::ErrorCode,
    message: impl std::fmt::Display,
) -> Response {
    (
        status,
        axum::Json(monoseq_wire::ErrorBody::new(code, message.to_string())),
    )
        .into_response()
}

pub(crate) use monoseq_kv::chain;

/// Resolves when the process is asked to stop: SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}

/// Counts occurrences of a condition and says when one is to be logged: the first, then at
/// most one per interval, each with the count since the last one logged.
pub(crate) struct LogThrottle {
    interval: std::time::Duration,
    /// Occurrences not yet logged, and when one was last logged.
    state: std::sync::Mutex<(u64, Option<std::time::Instant>)>,
}

impl LogThrottle {
    /// A throttle logging at most once per `interval`.
    pub(crate) const fn new(interval: std::time::Duration) -> LogThrottle {
        LogThrottle {
            interval,
            state: std::sync::Mutex::new((0, None)),
        }
    }

    /// Counts one occurrence; `Some(count)` (this one included) when it is to be logged.
    pub(crate) fn note(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.0 += 1;
        let now = std::time::Instant::now();
        if state
            .1
            .is_some_and(|at| now.duration_since(at) < self.interval)
        {
            return None;
        }
        let count = std::mem::take(&mut state.0);
        state.1 = Some(now);
        Some(count)
    }
}

#[cfg(test)]
mod tests {
    use super::LogThrottle;

    /// The first occurrence is logged, the next ones only once the interval has passed since,
    /// with the count of all of them.
    #[test]
    fn a_throttled_log_line_comes_once_per_interval_with_the_count_since() {
        let interval = std::time::Duration::from_secs(10);
        let throttle = LogThrottle::new(interval);
        assert_eq!(throttle.note(), Some(1));
        for _ in 0..5 {
            assert_eq!(throttle.note(), None);
        }
        throttle.state.lock().unwrap().1 = std::time::Instant::now().checked_sub(interval);
        assert_eq!(throttle.note(), Some(6));
        assert_eq!(throttle.note(), None);
    }
}
