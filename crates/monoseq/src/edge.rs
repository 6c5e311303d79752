//! The edge: the accept loop and the connections of the HTTP server, with the limits that keep
//! it answering under hostile or broken clients. A request's head must arrive within
//! `header_read_timeout_ms` of the connection's start or of its first byte after an answer; its
//! body within `body_read_timeout_ms` of the request's start; a kept-alive connection with no
//! request is closed after `idle_timeout_ms`; at most `connections_max` connections are served
//! (one more is answered 503 and closed) and at most `requests_max` requests run at once (one
//! more is answered 503 `overloaded`). Each limit that trips is counted
//! (`monoseq_edge_limit_trips_total{limit}`) and logged, at most once per
//! [`TRIP_LOG_INTERVAL`] per limit with the count since. At start the file-descriptor limit is
//! raised toward the connection cap and checked against it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Semaphore, watch};

/// Default of `--header-read-timeout-ms`.
pub const HEADER_READ_TIMEOUT_DEFAULT_MS: u64 = 10_000;
/// Default of `--body-read-timeout-ms`.
pub const BODY_READ_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// Default of `--idle-timeout-ms`.
pub const IDLE_TIMEOUT_DEFAULT_MS: u64 = 60_000;
/// Default of `--connections-max`.
pub const CONNECTIONS_MAX_DEFAULT: usize = 8_192;
/// Default of `--requests-max`.
pub const REQUESTS_MAX_DEFAULT: usize = 2_048;
/// File descriptors kept for everything but connections (storage files, the database pool,
/// forwarding, logs) when the limit is checked against the connection cap.
pub const FD_RESERVE: u64 = 512;
/// Connections past the cap being answered 503 at once; past it they are closed unanswered.
const SHED_ANSWERS_MAX: usize = 64;
/// Bound on writing the 503 to a connection past the cap.
const SHED_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// A limit that trips is logged at most once per this interval (with the count since).
pub const TRIP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Seconds of `Retry-After` on the edge's 503s.
const RETRY_AFTER_SECS: u64 = 1;

/// The edge's limits, resolved from the `serve` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub connections_max: usize,
    pub requests_max: usize,
}

impl Default for EdgeLimits {
    fn default() -> EdgeLimits {
        EdgeLimits {
            header_read_timeout: Duration::from_millis(HEADER_READ_TIMEOUT_DEFAULT_MS),
            body_read_timeout: Duration::from_millis(BODY_READ_TIMEOUT_DEFAULT_MS),
            idle_timeout: Duration::from_millis(IDLE_TIMEOUT_DEFAULT_MS),
            connections_max: CONNECTIONS_MAX_DEFAULT,
            requests_max: REQUESTS_MAX_DEFAULT,
        }
    }
}

/// The edge's flags of `serve` (each also `MONOSEQ_<NAME>`, and a key of the settings file's
/// `[edge]` table).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct EdgeArgs {
    #[arg(long, env = "MONOSEQ_HEADER_READ_TIMEOUT_MS", help = format!(
        "Time for a request's head to arrive, from the connection's start or the first byte \
         after an answer; past it the connection is closed [default: \
         {HEADER_READ_TIMEOUT_DEFAULT_MS}]"))]
    pub header_read_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_BODY_READ_TIMEOUT_MS", help = format!(
        "Time for a request's body to arrive, from the request's start; past it the answer \
         is 408 body_timeout [default: {BODY_READ_TIMEOUT_DEFAULT_MS}]"))]
    pub body_read_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_IDLE_TIMEOUT_MS", help = format!(
        "A kept-alive connection without a request for this long is closed [default: \
         {IDLE_TIMEOUT_DEFAULT_MS}]"))]
    pub idle_timeout_ms: Option<u64>,
    #[arg(long, env = "MONOSEQ_CONNECTIONS_MAX", help = format!(
        "Most connections served at once; one more is answered 503 and closed [default: \
         {CONNECTIONS_MAX_DEFAULT}, fewer if the file-descriptor limit cannot hold them]"))]
    pub connections_max: Option<usize>,
    #[arg(long, env = "MONOSEQ_REQUESTS_MAX", help = format!(
        "Most requests answered at once; one more is answered 503 overloaded [default: \
         {REQUESTS_MAX_DEFAULT}]"))]
    pub requests_max: Option<usize>,
}

/// The settings file's `[edge]` table.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeFile {
    pub header_read_timeout_ms: Option<u64>,
    pub body_read_timeout_ms: Option<u64>,
    pub idle_timeout_ms: Option<u64>,
    pub connections_max: Option<usize>,
    pub requests_max: Option<usize>,
}

impl EdgeArgs {
    /// The limits: flags and environment over the file over the defaults.
    ///
    /// # Errors
    ///
    /// When a limit is 0.
    pub fn resolve(&self, file: &EdgeFile) -> anyhow::Result<EdgeLimits> {
        let pick = |flag: Option<u64>, file: Option<u64>, default: u64, name: &str| {
            let value = flag.or(file).unwrap_or(default);
            anyhow::ensure!(value > 0, "--{name} must be at least 1");
            Ok(value)
        };
        let as_u64 = |v: Option<usize>| v.map(|v| v as u64);
        Ok(EdgeLimits {
            header_read_timeout: Duration::from_millis(pick(
                self.header_read_timeout_ms,
                file.header_read_timeout_ms,
                HEADER_READ_TIMEOUT_DEFAULT_MS,
                "header-read-timeout-ms",
            )?),
            body_read_timeout: Duration::from_millis(pick(
                self.body_read_timeout_ms,
                file.body_read_timeout_ms,
                BODY_READ_TIMEOUT_DEFAULT_MS,
                "body-read-timeout-ms",
            )?),
            idle_timeout: Duration::from_millis(pick(
                self.idle_timeout_ms,
                file.idle_timeout_ms,
                IDLE_TIMEOUT_DEFAULT_MS,
                "idle-timeout-ms",
            )?),
            connections_max: pick(
                as_u64(self.connections_max),
                as_u64(file.connections_max),
                CONNECTIONS_MAX_DEFAULT as u64,
                "connections-max",
            )? as usize,
            requests_max: pick(
                as_u64(self.requests_max),
                as_u64(file.requests_max),
                REQUESTS_MAX_DEFAULT as u64,
                "requests-max",
            )? as usize,
        })
    }
}

/// Which limit tripped (the `limit` label of the metric, and the setting's name).
#[derive(Debug, Clone, Copy)]
enum Limit {
    HeaderReadTimeout,
    BodyReadTimeout,
    IdleTimeout,
    ConnectionsMax,
    RequestsMax,
}

impl Limit {
    const ALL: [Limit; 5] = [
        Limit::HeaderReadTimeout,
        Limit::BodyReadTimeout,
        Limit::IdleTimeout,
        Limit::ConnectionsMax,
        Limit::RequestsMax,
    ];

    fn name(self) -> &'static str {
        match self {
            Limit::HeaderReadTimeout => "header_read_timeout",
            Limit::BodyReadTimeout => "body_read_timeout",
            Limit::IdleTimeout => "idle_timeout",
            Limit::ConnectionsMax => "connections_max",
            Limit::RequestsMax => "requests_max",
        }
    }
}

/// The edge's metrics: trips by limit, open connections, requests in flight. One set per
/// process (one server per process), registered with the server's metrics.
pub struct EdgeMetrics {
    trips: Family<Vec<(String, String)>, Counter>,
    connections: Gauge,
    requests: Gauge,
    /// Per limit: trips not yet logged, and when one was last logged.
    unlogged: [AtomicU64; 5],
    logged_at: std::sync::Mutex<[Option<Instant>; 5]>,
}

/// The process's edge metrics.
pub fn metrics() -> &'static EdgeMetrics {
    static METRICS: std::sync::OnceLock<EdgeMetrics> = std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let trips = Family::<Vec<(String, String)>, Counter>::default();
        for limit in Limit::ALL {
            // Every label present from the start: a dashboard sees 0, not nothing.
            let _ = trips.get_or_create(&vec![("limit".into(), limit.name().into())]);
        }
        EdgeMetrics {
            trips,
            connections: Gauge::default(),
            requests: Gauge::default(),
            unlogged: Default::default(),
            logged_at: std::sync::Mutex::default(),
        }
    })
}

impl EdgeMetrics {
    /// Registers the edge's metrics with the server's.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "edge_limit_trips",
            "Connections or requests cut or refused by an edge limit, by limit",
            self.trips.clone(),
        );
        registry.register(
            "edge_open_connections",
            "Connections being served now",
            self.connections.clone(),
        );
        registry.register(
            "edge_requests_in_flight",
            "Requests being answered now",
            self.requests.clone(),
        );
    }

    fn trip(&self, limit: Limit, limits: &EdgeLimits) {
        self.trips
            .get_or_create(&vec![("limit".into(), limit.name().into())])
            .inc();
        let i = limit as usize;
        let unlogged = self.unlogged[i].fetch_add(1, Ordering::Relaxed) + 1;
        let now = Instant::now();
        let mut logged_at = self.logged_at.lock().unwrap_or_else(|p| p.into_inner());
        if logged_at[i].is_some_and(|at| now.duration_since(at) < TRIP_LOG_INTERVAL) {
            return;
        }
        logged_at[i] = Some(now);
        drop(logged_at);
        self.unlogged[i].fetch_sub(unlogged, Ordering::Relaxed);
        let (setting, value) = match limit {
            Limit::HeaderReadTimeout => {
                ("--header-read-timeout-ms", ms(limits.header_read_timeout))
            }
            Limit::BodyReadTimeout => ("--body-read-timeout-ms", ms(limits.body_read_timeout)),
            Limit::IdleTimeout => ("--idle-timeout-ms", ms(limits.idle_timeout)),
            Limit::ConnectionsMax => ("--connections-max", limits.connections_max as u64),
            Limit::RequestsMax => ("--requests-max", limits.requests_max as u64),
        };
        tracing::warn!(
            limit = limit.name(),
            setting,
            value,
            trips = unlogged,
            "edge limit tripped: {} (counted in monoseq_edge_limit_trips_total; logged at most \
             once per {TRIP_LOG_INTERVAL:?})",
            match limit {
                Limit::HeaderReadTimeout =>
                    "a connection sent no complete request head in time; closed",
                Limit::BodyReadTimeout => "a request body did not arrive in time; answered 408",
                Limit::IdleTimeout => "an idle kept-alive connection was closed",
                Limit::ConnectionsMax => "a connection past the cap was answered 503 and closed",
                Limit::RequestsMax => "a request past the cap was answered 503 overloaded",
            }
        );
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Raises the soft file-descriptor limit toward what `limits.connections_max` needs (up to
/// the hard limit), logs what it found, and answers the connection cap that fits: the
/// configured one, or fewer when the descriptors cannot hold it.
pub fn check_descriptors(limits: &EdgeLimits) -> usize {
    let wanted = limits.connections_max as u64 + FD_RESERVE;
    let found = rlimit::increase_nofile_limit(wanted);
    let hard = rlimit::getrlimit(rlimit::Resource::NOFILE).map_or(0, |(_, hard)| hard);
    match found {
        Ok(soft) if soft >= wanted => {
            tracing::info!(
                descriptors = soft,
                hard_limit = hard,
                connections_max = limits.connections_max,
                reserve = FD_RESERVE,
                "file-descriptor limit holds the connection cap"
            );
            limits.connections_max
        }
        Ok(soft) => {
            let fits = usize::try_from(soft.saturating_sub(FD_RESERVE))
                .unwrap_or(usize::MAX)
                .max(1);
            tracing::warn!(
                descriptors = soft,
                hard_limit = hard,
                connections_max = limits.connections_max,
                serving = fits,
                "the file-descriptor limit is below --connections-max plus {FD_RESERVE} kept \
                 for storage: serving at most {fits} connections; raise the limit (ulimit -n, \
                 LimitNOFILE=) or lower --connections-max"
            );
            fits
        }
        Err(e) => {
            tracing::warn!(
                connections_max = limits.connections_max,
                "the file-descriptor limit cannot be read ({e}); keeping --connections-max"
            );
            limits.connections_max
        }
    }
}

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
    fn new() -> Activity {
        Activity {
            started: Instant::now(),
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

/// A connection's stream that tells its [`Activity`] about every byte.
struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
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

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then lets the
/// requests in flight finish (idle connections close at once).
///
/// # Errors
///
/// None today; the signature leaves room for accept errors a listener may report.
pub async fn serve<L>(
    mut listener: L,
    app: Router,
    limits: EdgeLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    L: axum::serve::Listener,
{
    let metrics = metrics();
    let connections_max = check_descriptors(&limits);
    let connections = Arc::new(Semaphore::new(connections_max));
    let shedding = Arc::new(Semaphore::new(SHED_ANSWERS_MAX));
    let requests = Arc::new(Semaphore::new(limits.requests_max));
    let app = app.layer(axum::middleware::from_fn_with_state(
        (requests, limits),
        limit_request,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (io, _) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let Ok(permit) = Arc::clone(&connections).try_acquire_owned() else {
            metrics.trip(Limit::ConnectionsMax, &limits);
            if let Ok(answering) = Arc::clone(&shedding).try_acquire_owned() {
                tokio::spawn(async move {
                    shed(io).await;
                    drop(answering);
                });
            }
            continue;
        };
        let app = app.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            metrics.connections.inc();
            connection(io, app, limits, stop).await;
            metrics.connections.dec();
            drop(permit);
        });
    }
    let _ = stop_tx.send(true);
    // Every connection task holds a permit until it ends.
    let all = u32::try_from(connections_max).unwrap_or(u32::MAX);
    let _ = connections.acquire_many(all).await;
    Ok(())
}

/// The answer to a connection past the cap: 503 with `Retry-After`, then closed.
async fn shed<S: AsyncWrite + Unpin>(mut io: S) {
    let answer = shed_answer();
    let _ = tokio::time::timeout(SHED_WRITE_TIMEOUT, async {
        let _ = io.write_all(&answer).await;
        let _ = io.shutdown().await;
    })
    .await;
}

/// The bytes of the 503 that [`shed`] writes.
fn shed_answer() -> Vec<u8> {
    let body = r#"{"code":"too_many_connections","message":"the server holds its most connections (--connections-max); retry"}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: {RETRY_AFTER_SECS}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Serves one connection, cutting it when its watchdog finds a limit passed, and finishing it
/// gracefully when the server stops.
async fn connection<S>(io: S, app: Router, limits: EdgeLimits, mut stop: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = hyper_util::rt::TokioIo::new(Tracked {
        inner: io,
        activity: Arc::clone(&activity),
    });
    let tower = hyper_util::service::TowerToHyperService::new(app);
    let watched = Arc::clone(&activity);
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
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

/// The per-request limits: the cap on requests in flight, and the body's read timeout.
async fn limit_request(
    State((requests, limits)): State<(Arc<Semaphore>, EdgeLimits)>,
    request: Request,
    next: Next,
) -> Response {
    let Ok(_permit) = requests.try_acquire() else {
        metrics().trip(Limit::RequestsMax, &limits);
        return unavailable(
            "overloaded",
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
            "body_timeout",
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

fn unavailable(code: &str, message: &str) -> Response {
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

    #[test]
    fn a_fresh_silent_connection_is_owed_a_head_and_an_answered_one_is_idle() {
        let limits = EdgeLimits {
            header_read_timeout: Duration::from_millis(0),
            idle_timeout: Duration::from_secs(3600),
            ..EdgeLimits::default()
        };
        let a = Activity::new();
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

    #[test]
    fn the_answer_past_the_connection_cap_is_well_formed() {
        let answer = String::from_utf8(shed_answer()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "too_many_connections");
    }
}
