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

mod connection;
mod lanes;
mod request;
mod settings;
mod trips;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{Semaphore, watch};

pub use settings::{EdgeArgs, EdgeFile};
use trips::Limit;
pub use trips::metrics;

/// Default of `--header-read-timeout-ms`.
pub const HEADER_READ_TIMEOUT_DEFAULT_MS: u64 = 10_000;
/// Default of `--body-read-timeout-ms`.
pub const BODY_READ_TIMEOUT_DEFAULT_MS: u64 = 30_000;
/// Default of `--idle-timeout-ms`.
pub const IDLE_TIMEOUT_DEFAULT_MS: u64 = 60_000;

// The client, and a node forwarding to its peers, let a kept-alive connection go before a
// server with the default closes it: a request sent on a connection being closed gets no answer.
const _: () =
    assert!(monoseq_client::IDLE_TIMEOUT_DEFAULT.as_millis() < IDLE_TIMEOUT_DEFAULT_MS as u128);
/// Default of `--connections-max`.
pub const CONNECTIONS_MAX_DEFAULT: usize = 8_192;
/// Default of `--requests-max`.
pub const REQUESTS_MAX_DEFAULT: usize = 2_048;
/// File descriptors kept for everything but connections (storage files, the database pool,
/// forwarding, logs) when the limit is checked against the connection cap.
pub const FD_RESERVE: u64 = 512;
/// Connections past the cap being answered 503 at once; past it they are closed unanswered.
const SHED_ANSWERS_MAX: usize = 64;
/// How long a connection past the cap gets to begin its request before it is answered anyway.
const SHED_REQUEST_WAIT: Duration = Duration::from_millis(250);
/// Bound on writing the 503 to a connection past the cap.
const SHED_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// Reads of what a connection past the cap sent, at most, before it is closed.
const SHED_DRAIN_READS_MAX: usize = 16;
/// A limit that trips is logged at most once per this interval (with the count since).
pub const TRIP_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Seconds of `Retry-After` on the edge's 503s.
pub(crate) const RETRY_AFTER_SECS: u64 = 1;

/// The edge's limits, resolved from the `serve` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EdgeLimits {
    pub header_read_timeout: Duration,
    pub body_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub connections_max: usize,
    pub requests_max: usize,
    /// Threads of the runtime live tails are served on ([`lanes`]).
    pub follower_threads: usize,
}

impl Default for EdgeLimits {
    fn default() -> EdgeLimits {
        EdgeLimits {
            header_read_timeout: Duration::from_millis(HEADER_READ_TIMEOUT_DEFAULT_MS),
            body_read_timeout: Duration::from_millis(BODY_READ_TIMEOUT_DEFAULT_MS),
            idle_timeout: Duration::from_millis(IDLE_TIMEOUT_DEFAULT_MS),
            connections_max: CONNECTIONS_MAX_DEFAULT,
            requests_max: REQUESTS_MAX_DEFAULT,
            follower_threads: lanes::follower_threads_default(),
        }
    }
}

/// Raises the soft file-descriptor limit toward what `limits.connections_max` needs (up to
/// the hard limit), logs what it found, and answers the connection cap that fits: the
/// configured one, or fewer when the descriptors cannot hold it.
pub fn check_descriptors(limits: &EdgeLimits) -> usize {
    // Once per process: the server serves the same socket while opening, then for good.
    static CHECKED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| check_descriptors_now(limits))
}

fn check_descriptors_now(limits: &EdgeLimits) -> usize {
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
                "the file-descriptor limit cannot be read ({}); keeping --connections-max",
                crate::base::chain(&e)
            );
            limits.connections_max
        }
    }
}

/// Turns Nagle's algorithm off on an accepted connection: a live tail writes a small chunk
/// whenever events are durable, and with it on such a chunk waits for the follower's delayed
/// acknowledgement of the one before (milliseconds, on every tenth event or so). Answers are
/// written whole, so they lose nothing by it.
pub fn no_delay(tcp: &tokio::net::TcpStream) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!("setting TCP_NODELAY on a connection failed: {e}");
    }
}

/// `listener` with [`no_delay`] on every connection it accepts.
pub fn without_delay(
    listener: tokio::net::TcpListener,
) -> axum::serve::TapIo<tokio::net::TcpListener, fn(&mut tokio::net::TcpStream)> {
    axum::serve::ListenerExt::tap_io(listener, |tcp| no_delay(tcp))
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
    L::Addr: std::fmt::Debug,
{
    let metrics = metrics();
    let connections_max = check_descriptors(&limits);
    let connections = Arc::new(Semaphore::new(connections_max));
    let shedding = Arc::new(Semaphore::new(SHED_ANSWERS_MAX));
    let requests = Arc::new(Semaphore::new(limits.requests_max));
    let app = app.layer(axum::middleware::from_fn_with_state(
        (requests, limits),
        request::limit_request,
    ));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
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
        let peer = PeerAddr(Arc::from(format!("{peer:?}")));
        tokio::spawn(async move {
            metrics.connections.inc();
            serve_connection(io, app, limits, (stop, peer)).await;
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

/// The address of a request's peer, as its connection was accepted (a request extension, for
/// the lines that say who a follower is).
#[derive(Debug, Clone)]
pub(crate) struct PeerAddr(pub(crate) Arc<str>);

/// Serves one accepted connection on the runtime its first request line chooses
/// ([`lanes`]); one whose first line does not come within the header timeout is cut, and one
/// still silent when the server stops is closed (as hyper closes an idle one).
async fn serve_connection<S>(
    mut io: S,
    app: Router,
    limits: EdgeLimits,
    (mut stop, peer): (watch::Receiver<bool>, PeerAddr),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let accepted = std::time::Instant::now();
    let first = tokio::select! {
        first = lanes::first_line(&mut io, limits.header_read_timeout) => first,
        _ = stop.wait_for(|stopping| *stopping) => return,
    };
    let Some(ahead) = first else {
        metrics().trip(Limit::HeaderReadTimeout, &limits);
        return;
    };
    // Only a tail starts the followers' runtime.
    let followers = lanes::is_tail(&ahead)
        .then(|| lanes::followers(limits.follower_threads))
        .flatten();
    let served = connection::serve(io, ahead, app, limits, stop, (accepted, peer));
    match followers {
        Some(followers) => {
            let _ = followers.spawn(served).await;
        }
        None => served.await,
    }
}

/// The answer to a connection past the cap: 503 with `Retry-After`, then closed.
///
/// The answer waits until the request begins (at most [`SHED_REQUEST_WAIT`]). An HTTP client
/// that reads an answer before it has sent its request takes the connection for broken, not
/// for a 503: hyper fails that request with "unexpected message" and, seen from monoseq's own
/// client, its next request then waited out its whole timeout. Before the close, what the
/// client sent and is already here is read: closing a socket with unread bytes resets the
/// connection, and a reset can discard the 503 before the client reads it.
async fn shed<S: AsyncRead + AsyncWrite + Unpin>(mut io: S) {
    let answer = shed_answer();
    let mut scratch = [0u8; 4096];
    let _ = tokio::time::timeout(SHED_REQUEST_WAIT, io.read(&mut scratch)).await;
    let _ = tokio::time::timeout(SHED_WRITE_TIMEOUT, async {
        let _ = io.write_all(&answer).await;
        let _ = io.shutdown().await;
    })
    .await;
    for _ in 0..SHED_DRAIN_READS_MAX {
        // A zero timeout polls the read once: what is here is read, nothing is waited for.
        match tokio::time::timeout(Duration::ZERO, io.read(&mut scratch)).await {
            Ok(Ok(n)) if n > 0 => {}
            _ => break,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_past_the_connection_cap_is_well_formed() {
        let answer = String::from_utf8(shed_answer()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["code"], "too_many_connections");
    }

    #[tokio::test]
    async fn every_connection_accepted_writes_without_waiting_for_the_peers_acknowledgement() {
        use axum::serve::Listener as _;
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = tcp.local_addr().unwrap();
        let mut listener = without_delay(tcp);
        let client = tokio::net::TcpStream::connect(address);
        let ((accepted, _), _client) = tokio::join!(listener.accept(), client);
        assert!(
            accepted.nodelay().unwrap(),
            "Nagle's algorithm is off: a tail's small chunk goes out at once"
        );
    }

    /// The thread that answered a request and its nice value, as "name nice".
    async fn who_answers() -> String {
        let me = rustix::thread::gettid();
        let nice = rustix::process::getpriority_process(Some(me)).unwrap();
        format!("{} {nice}", std::thread::current().name().unwrap_or(""))
    }

    async fn get(address: std::net::SocketAddr, path: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(address).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        tcp.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).await.unwrap();
        answer.split_once("\r\n\r\n").unwrap().1.to_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_connection_that_has_sent_nothing_does_not_hold_up_the_servers_stop() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = tcp.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(tcp, Router::new(), EdgeLimits::default(), async {
            let _ = stopped.await;
        }));
        let _silent = tokio::net::TcpStream::connect(address).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = stop.send(());
        let began = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("the server stopped without waiting out the silent connection's head timeout")
            .unwrap()
            .unwrap();
        assert!(began.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_tails_connection_is_served_by_the_lower_priority_followers_threads() {
        let app = Router::new()
            .route(
                "/v1/partitions/0/events/stream",
                axum::routing::get(who_answers),
            )
            .route(
                "/v1/workspaces/5/wlog/stream",
                axum::routing::get(who_answers),
            )
            .route("/v1/partitions/0/events", axum::routing::get(who_answers));
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = tcp.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(tcp, app, EdgeLimits::default(), async {
            let _ = stopped.await;
        }));
        // The followers' priority, or the test's own when that is lower (run under `nice`):
        // a priority is only ever lowered.
        let own = rustix::process::getpriority_process(None).unwrap();
        for tail in [
            "/v1/partitions/0/events/stream?from=1",
            "/v1/workspaces/5/wlog/stream",
        ] {
            let answer = get(address, tail).await;
            assert_eq!(
                answer,
                format!("monoseq-follow {}", lanes::FOLLOWER_NICE.max(own)),
                "{tail} is served at the followers' priority"
            );
        }
        let page = get(address, "/v1/partitions/0/events?from=1").await;
        assert!(
            !page.starts_with("monoseq-follow"),
            "a page read is served by the server's own threads: {page}"
        );
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }
}
