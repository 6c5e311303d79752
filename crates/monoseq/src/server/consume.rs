//! The consumer side of the log over HTTP: ordered page reads of a partition's PLog (with a
//! long-poll form), and live tails of a partition or a workspace as Server-Sent Events.
//!
//! Nothing a reader gets is at or beyond its partition's end (`CommandProcessor::plog_end`):
//! every event delivered is durable and final. A tail first sends what is stored from its
//! offset, then what its partition's [`Hub`] hands it: one hub per followed partition on this
//! node reads each new group once, when the partition's writer signals its new end, and
//! encodes each event's JSON once for every follower. A hub's buffer is bounded; a follower
//! that falls behind it is cut with a `slow_follower` message naming where to resume. On a
//! node that does not own the partition, page reads are relayed from the owner and the hub
//! long-polls the owner's page read, so followers there see the owner's end.

// The helpers return the answer a refused read gets: a `Response` (128 bytes) once per request,
// not on a hot path.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use clap::Args;
use monoseq_core::WsId;
use monoseq_store::{EventPeek, PageItem, PartitionId, WLogOffset, retired_ranges};
use monoseq_wire::{
    ErrorCode, EventBody, GapBody, HeartbeatBody, PLOG_PAGE_MAX, PlogEntryBody, PlogPageBody,
    SSE_EVENT, SSE_GAP, SSE_HEARTBEAT, SSE_SLOW_FOLLOWER, SlowFollowerBody, WAIT_MS_MAX,
    WLOG_PAGE_MAX,
};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, Sleep};

use super::AppState;
use super::answers::read_error;
use super::place::{Placed, Relay, unplaced};
use crate::base::error;
use crate::config::{FOLLOWER_HEARTBEAT_MS_DEFAULT, FollowLimits};
use crate::edge::PeerAddr;
use crate::forward::Forwarder;
use crate::json::{StoredEvent, StoredEventRef};
use crate::query;
use monoseq_membership::Unplaced;

/// Largest `--follower-buffer-events`.
const FOLLOWER_BUFFER_EVENTS_MAX: usize = 1 << 20;
/// Entries a page read answers when the request names no `limit`.
const PAGE_DEFAULT: usize = 100;
/// Entries a tail reads from the store per step while it catches up.
const CATCH_UP_PAGE: usize = PLOG_PAGE_MAX;
/// Bytes gathered for a tail past which they go to its connection at once.
const CHUNK_BYTES: usize = 64 * 1024;
/// What an event's JSON is sized for when a buffer is reserved for it (it grows past).
pub(super) const EVENT_JSON_BYTES: usize = 512;
/// How long a hub's read waits for a new event (on the writer's signal, or the owner's long
/// poll) before it looks again whether anyone still follows.
const HUB_WAIT: Duration = Duration::from_secs(1);
/// A hub's least pause between two hand-outs, per follower: a hand-out costs each follower
/// a wake-up and a write (about 2.4 µs of CPU), so pacing hand-outs by 20 µs a follower keeps
/// a partition's fan-out under about an eighth of a core whatever the rate, while the
/// events that arrive meanwhile go out in the same wake-up and write.
const HUB_PACE_PER_FOLLOWER: Duration = Duration::from_micros(20);
/// The shortest pause a hub takes: the runtime's timers count whole milliseconds, so a
/// shorter one would wait a millisecond anyway; below it (fewer than 50 followers) a hub hands
/// out as soon as events are acknowledged.
const HUB_PACE_MIN: Duration = Duration::from_millis(1);
/// The longest pause between two hand-outs (what pacing adds to a follower's latency),
/// unless `--follower-batch-ms` asks for a longer one.
const HUB_PACE_MAX: Duration = Duration::from_millis(2);
/// Longest `--follower-batch-ms`: a second of latency is as much as a live tail should add.
const FOLLOWER_BATCH_MS_MAX: u64 = 1_000;
/// Pause of a relaying hub after the owner did not answer.
const RELAY_RETRY: Duration = Duration::from_millis(200);
/// Time a relayed page read may take beyond its own wait.
const RELAY_GRACE: Duration = Duration::from_secs(5);
/// Seconds a follower refused for the cap is told to wait.
const RETRY_AFTER_FOLLOWERS_SECS: &str = "1";
/// Largest offset a read starts from (no log reaches near it; the store's block arithmetic
/// must not overflow).
pub(super) const OFFSET_READ_MAX: u64 = u64::MAX >> 1;

/// The `serve` flags of the consumer side.
#[derive(Debug, Clone, Default, Args)]
pub struct FollowArgs {
    /// Most live tails (SSE followers) this node serves at once; one more is answered 503
    /// with `Retry-After` [default: 1024]
    #[arg(long, env = "MONOSEQ_FOLLOWERS_MAX", value_name = "COUNT")]
    pub followers_max: Option<usize>,
    /// Events a followed partition keeps in memory for its followers on this node; a follower
    /// that falls further behind is cut with a `slow_follower` message and resumes from its
    /// offset. Memory is this many events per followed partition, whatever the follower count
    /// [default: 4096]
    #[arg(long, env = "MONOSEQ_FOLLOWER_BUFFER_EVENTS", value_name = "EVENTS")]
    pub follower_buffer_events: Option<usize>,
    /// Interval of a tail's heartbeat message while no event arrives [default: 5000]
    #[arg(long, env = "MONOSEQ_FOLLOWER_HEARTBEAT_MS", value_name = "MS")]
    pub follower_heartbeat_ms: Option<u64>,
    /// Hands a followed partition's new events to its followers at most every MS
    /// milliseconds: fewer and larger writes to each follower, so less CPU taken from the
    /// writers, for up to MS more latency; 0 hands them out as soon as they are durable
    /// (paced only past 50 followers of one partition) [default: 0]
    #[arg(long, env = "MONOSEQ_FOLLOWER_BATCH_MS", value_name = "MS")]
    pub follower_batch_ms: Option<u64>,
}

impl FollowArgs {
    /// The limits these flags give.
    ///
    /// # Errors
    ///
    /// A flag out of its range, named with the range.
    pub fn resolve(&self) -> anyhow::Result<FollowLimits> {
        let d = FollowLimits::default();
        let followers_max = self.followers_max.unwrap_or(d.followers_max);
        let buffer_events = self.follower_buffer_events.unwrap_or(d.buffer_events);
        let heartbeat_ms = self
            .follower_heartbeat_ms
            .unwrap_or(FOLLOWER_HEARTBEAT_MS_DEFAULT);
        anyhow::ensure!(
            followers_max >= 1,
            "--followers-max is at least 1 (got {followers_max})"
        );
        anyhow::ensure!(
            (1..=FOLLOWER_BUFFER_EVENTS_MAX).contains(&buffer_events),
            "--follower-buffer-events is 1 to {FOLLOWER_BUFFER_EVENTS_MAX} (got {buffer_events})"
        );
        anyhow::ensure!(
            (1..=WAIT_MS_MAX).contains(&heartbeat_ms),
            "--follower-heartbeat-ms is 1 to {WAIT_MS_MAX} (got {heartbeat_ms})"
        );
        let batch_ms = self.follower_batch_ms.unwrap_or(0);
        anyhow::ensure!(
            batch_ms <= FOLLOWER_BATCH_MS_MAX,
            "--follower-batch-ms is 0 to {FOLLOWER_BATCH_MS_MAX} (got {batch_ms})"
        );
        Ok(FollowLimits {
            followers_max,
            buffer_events,
            heartbeat: Duration::from_millis(heartbeat_ms),
            batch: Duration::from_millis(batch_ms),
        })
    }
}

/// One item a hub hands its followers: its JSON encoded once, shared by every follower.
#[derive(Debug)]
pub(super) struct Frame {
    /// First PLog offset it covers.
    from: u64,
    /// The offset after it.
    next: u64,
    /// An event's workspace and WLog offset (`None` for a gap).
    wlog: Option<(u64, u64)>,
    /// The whole SSE message of a partition's tail (`id:` the PLog offset, or a gap's last).
    sse: Bytes,
    /// Where the event's JSON lies in `sse` (a workspace's tail sends it with its own `id:`).
    json: std::ops::Range<usize>,
}

impl Frame {
    /// The event's or gap's JSON.
    pub(super) fn json(&self) -> &[u8] {
        &self.sse[self.json.clone()]
    }

    /// The first PLog offset it covers.
    pub(super) fn first(&self) -> u64 {
        self.from
    }

    /// The offset after it.
    pub(super) fn after(&self) -> u64 {
        self.next
    }

    /// Whether it is an event (else a gap).
    pub(super) fn is_event(&self) -> bool {
        self.wlog.is_some()
    }
}

/// The live side of one followed partition on this node.
struct Hub {
    tx: broadcast::Sender<Arc<Frame>>,
    /// The partition's end as this hub last learned it.
    end: AtomicU64,
}

/// Counters of the consumer side, for `/metrics` (registered by `Metrics::register_follow`).
#[derive(Debug, Default)]
pub(crate) struct FollowCounts {
    /// Tails being served now (the cap's count).
    pub(crate) followers: AtomicUsize,
    /// The same, as the `followers` gauge.
    pub(crate) followers_gauge: prometheus_client::metrics::gauge::Gauge,
    /// Tails cut for falling behind.
    pub(crate) cut_slow: prometheus_client::metrics::counter::Counter,
    /// Tails refused for the cap.
    pub(crate) refused: prometheus_client::metrics::counter::Counter,
    /// Events and gaps delivered to tails.
    pub(crate) delivered: prometheus_client::metrics::counter::Counter,
}

/// The consumer side of this node: its limits, its hubs and its counters.
pub(crate) struct Follow {
    limits: FollowLimits,
    hubs: Mutex<HashMap<u32, Arc<Hub>>>,
    pub(crate) counts: FollowCounts,
    /// Set when the server stops: every tail ends.
    closing: watch::Sender<bool>,
}

impl Follow {
    /// A receiver that sees `true` once the server stops.
    pub(super) fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// The limits of live tails.
    pub(super) fn limits(&self) -> &FollowLimits {
        &self.limits
    }

    pub(crate) fn new(limits: FollowLimits) -> Follow {
        Follow {
            limits,
            hubs: Mutex::default(),
            counts: FollowCounts::default(),
            closing: watch::Sender::new(false),
        }
    }

    /// Ends every tail (the server stops; clients resume elsewhere or later).
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Hub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Who a tail serves, for its log lines: the peer's address (when the edge knows it) and
/// what it follows.
#[derive(Debug, Clone)]
struct Follower {
    peer: Option<Arc<str>>,
    partition: u32,
    ws: Option<u64>,
}

impl Follower {
    /// An info line about this follower (connected, ended, refused), with why.
    fn log(&self, what: &str, why: &str) {
        let peer = self.peer.as_deref().unwrap_or("unknown");
        tracing::info!(
            peer,
            partition = self.partition,
            ws = self.ws,
            "follower {what}: {why}"
        );
    }
}

/// A tail counted against the cap while it lives; logs its end, with why, when it knows
/// whom it serves.
pub(super) struct Slot {
    st: Arc<AppState>,
    who: Option<Follower>,
    /// Why the tail ended, when it ended by itself (else its connection closed).
    ended: Option<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let counts = &self.st.follow.counts;
        counts.followers.fetch_sub(1, Ordering::AcqRel);
        counts.followers_gauge.dec();
        let Some(who) = &self.who else {
            return;
        };
        let why = self.ended.take().unwrap_or_else(|| {
            if *self.st.follow.closing.borrow() {
                "the server stops".to_owned()
            } else {
                "its connection closed".to_owned()
            }
        });
        who.log("ended", &why);
    }
}

/// Where a read or a tail starts: at a PLog (or WLog) offset, or at the current end
/// (`from=end`: only what is written from now on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// At this offset (1 or more).
    At(u64),
    /// At the end as the partition's owner knows it when the read starts.
    End,
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Start::At(offset) => write!(f, "{offset}"),
            Start::End => f.write_str("end"),
        }
    }
}

/// The offsets and sizes a read names, each checked with a 400 naming it.
struct ReadQuery {
    from: Start,
    limit: usize,
    wait: Duration,
}

/// Parses `from` (an offset or `end`), `limit` and `wait_ms` of a query (`from` defaults to
/// 1); refuses every parameter not in `accepted` (see [`query::params`]).
fn read_query(
    raw: Option<&str>,
    accepted: &[&str],
    limit_max: usize,
) -> Result<ReadQuery, Response> {
    let params = query::params(raw, accepted)?;
    let number = |name: &str, value: &str, what: &str| {
        value.parse::<u64>().map_err(|_| {
            bad_request(format!(
                "`{name}` is {what}, not {value:?}: send a decimal unsigned integer"
            ))
        })
    };
    let mut q = ReadQuery {
        from: Start::At(1),
        limit: PAGE_DEFAULT.min(limit_max),
        wait: Duration::ZERO,
    };
    match params.get("from") {
        None => {}
        Some("end") => q.from = Start::End,
        Some(value) => {
            let from = number("from", value, "an offset (1 or more) or `end`")?;
            if from == 0 {
                return Err(bad_request(
                    "`from` starts at 1 (the first offset), or is `end`",
                ));
            }
            q.from = Start::At(from);
        }
    }
    if let Some(value) = params.get("limit") {
        let n = number("limit", value, &format!("a count (1 to {limit_max})"))?;
        if n == 0 || n > limit_max as u64 {
            return Err(bad_request(format!(
                "`limit` is 1 to {limit_max} (got {n})"
            )));
        }
        q.limit = n as usize;
    }
    if let Some(value) = params.get("wait_ms") {
        let n = number(
            "wait_ms",
            value,
            &format!("milliseconds (0 to {WAIT_MS_MAX})"),
        )?;
        if n > WAIT_MS_MAX {
            return Err(bad_request(format!(
                "`wait_ms` is 0 to {WAIT_MS_MAX} (got {n})"
            )));
        }
        q.wait = Duration::from_millis(n);
    }
    Ok(q)
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
}

fn path_error(rejection: &PathRejection) -> Response {
    bad_request(format!(
        "the path's parameters are unsigned integers: {}",
        rejection.body_text()
    ))
}

/// 404 for a partition the server does not have.
pub(super) fn check_partition(st: &AppState, partition: u32) -> Result<(), Response> {
    let partitions = st.cp.config().partitions;
    if partition < partitions {
        return Ok(());
    }
    Err(unplaced(
        partition,
        Unplaced::NoSuchPartition { partitions },
    ))
}

/// The resume point a `Last-Event-ID` names (the offset after it), if sent.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, Response> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let id = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|id| *id < OFFSET_READ_MAX)
        .ok_or_else(|| {
            bad_request(format!(
                "`Last-Event-ID` is the last offset received, a decimal unsigned integer \
                 (got {value:?})"
            ))
        })?;
    Ok(Some(id + 1))
}

/// `GET /v1/partitions/{p}/events?from=N&limit=L&wait_ms=W`.
pub(super) async fn read_partition(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u32>, PathRejection>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let partition = match path {
        Ok(Path(p)) => p,
        Err(e) => return path_error(&e),
    };
    if let Err(r) = check_partition(&st, partition) {
        return r;
    }
    let q = match read_query(raw.as_deref(), query::PAGE_PARAMS, PLOG_PAGE_MAX) {
        Ok(q) => q,
        Err(r) => return r,
    };
    match owner_elsewhere(&st, partition, Forwarder::was_forwarded(&headers)) {
        // Passed on as the owner wrote it: this node neither decodes nor encodes the page.
        Ok(Some(relay)) => match relay_raw(&relay, partition, &q).await {
            Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
            Err(r) => r,
        },
        Ok(None) => {
            let from = match q.from {
                Start::At(from) => from,
                Start::End => st.cp.plog_end(partition),
            };
            local_page_answer(&st, partition, from, q.limit, q.wait).await
        }
        Err(r) => r,
    }
}

/// A page's JSON, written once into a buffer sized for it.
fn encode_page(page: &Page) -> Result<Bytes, Response> {
    let mut body = BytesMut::with_capacity((page.events.len() + 1) * EVENT_JSON_BYTES).writer();
    match serde_json::to_writer(&mut body, page) {
        Ok(()) => Ok(body.into_inner().freeze()),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e,
        )),
    }
}

/// A page as this node answers it: its events read from its store, or relayed from the owner.
pub(super) type Page = PlogPageBody<PageEvent>;

/// An event of a [`Page`].
#[derive(Debug)]
pub(super) enum PageEvent {
    /// Read from this node's store, written without building its body.
    Stored(StoredEvent),
    /// Relayed from the partition's owner.
    Relayed(EventBody),
}

impl PageEvent {
    pub(super) fn plog_offset(&self) -> u64 {
        match self {
            PageEvent::Stored(e) => e.0.plog_offset.0,
            PageEvent::Relayed(e) => e.plog_offset,
        }
    }

    /// Whether it passes a stream's filter.
    pub(super) fn passes(&self, filter: &super::filter::Filter) -> bool {
        match self {
            PageEvent::Stored(e) => filter.stored(&e.0),
            PageEvent::Relayed(e) => filter.relayed(e),
        }
    }

    /// Its workspace and WLog offset.
    fn wlog(&self) -> (u64, u64) {
        match self {
            PageEvent::Stored(e) => (e.0.ws.0, e.0.wlog_offset.0),
            PageEvent::Relayed(e) => (e.ws, e.wlog_offset),
        }
    }
}

impl serde::Serialize for PageEvent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            PageEvent::Stored(e) => e.serialize(s),
            PageEvent::Relayed(e) => e.serialize(s),
        }
    }
}

/// A page of partition `p` from `from`: read here when this node serves the partition (or is
/// the only node), else relayed from its owner. With `wait`, an empty page waits until an
/// event is durable there or the wait passes.
pub(super) async fn page(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    limit: usize,
    wait: Duration,
) -> Result<Page, Response> {
    page_from(st, p, Start::At(from), limit, wait).await
}

/// As [`page`], and what `then` makes of the page, on the thread that read it where this
/// node reads its store: the page's events are freed where they were allocated (as a page
/// read's answer is encoded), not on the task that asked. With `keep`, a page read from this
/// node's store holds only the events it passes (the others are read past, not built).
pub(super) async fn page_then<T: Send + 'static>(
    st: &Arc<AppState>,
    p: u32,
    (from, limit, wait): (u64, usize, Duration),
    keep: Option<Arc<super::filter::Filter>>,
    then: impl FnOnce(Page) -> T + Send + 'static,
) -> Result<T, Response> {
    if let Some(relay) = owner_elsewhere(st, p, false)? {
        let page = relay_page(&relay, p, Start::At(from), limit, wait).await?;
        return Ok(then(page));
    }
    wait_for_event(st, p, from, wait).await;
    read_local(st, p, (from, limit), keep, then).await
}

/// As [`page`], from a [`Start`]: `end` is the owner's end when the read starts.
async fn page_from(
    st: &Arc<AppState>,
    p: u32,
    from: Start,
    limit: usize,
    wait: Duration,
) -> Result<Page, Response> {
    if let Some(relay) = owner_elsewhere(st, p, false)? {
        return relay_page(&relay, p, from, limit, wait).await;
    }
    let from = match from {
        Start::At(from) => from,
        Start::End => st.cp.plog_end(p),
    };
    wait_for_event(st, p, from, wait).await;
    local_page(st, p, from, limit).await
}

/// With `wait`, waits (at most that long) until an event at `from` or above is durable in
/// partition `p` here: the long poll of a page read.
async fn wait_for_event(st: &AppState, p: u32, from: u64, wait: Duration) {
    if !wait.is_zero() && from >= st.cp.plog_end(p) {
        let mut end = st.cp.watch_plog_end(p);
        let _ = tokio::time::timeout(wait, end.wait_for(|end| *end > from)).await;
    }
}

/// The relay to the owner when another node owns partition `p`; `None` when it is read here;
/// the answer of a read that cannot be placed now (`relayed`: another node relayed it here).
fn owner_elsewhere(st: &AppState, p: u32, relayed: bool) -> Result<Option<Relay<'_>>, Response> {
    match st.place(p, relayed) {
        Placed::Local => Ok(None),
        Placed::Relay(relay) => Ok(Some(relay)),
        Placed::Unavailable(why) => Err(unplaced(p, why)),
    }
}

/// The end of partition `p` (the next PLog offset to be written) as its owner knows it: this
/// node's when it serves the partition (or is the only node), else asked of the owner (a page
/// read from `end`); 503 while the partition moves between nodes, or when the owner does
/// not answer.
pub(super) async fn partition_end(st: &Arc<AppState>, p: u32) -> Result<u64, Response> {
    match owner_elsewhere(st, p, false)? {
        None => Ok(st.cp.plog_end(p)),
        Some(relay) => Ok(relay_page(&relay, p, Start::End, 1, Duration::ZERO)
            .await?
            .end),
    }
}

/// The end of partition `p` as this node knows it without asking another: the true end where
/// it serves the partition, else a lower bound (what its hub or its writer last saw).
pub(super) fn known_end(st: &AppState, p: u32) -> u64 {
    hub_end(st, p)
}

/// A page read from this node's store, below this node's end of the partition.
async fn local_page(st: &Arc<AppState>, p: u32, from: u64, limit: usize) -> Result<Page, Response> {
    read_local(st, p, (from, limit), None, |page| page).await
}

/// A page read from this node's store as its JSON answer, encoded on the thread that read
/// it (its events are freed where they were allocated, not on another thread).
async fn local_page_answer(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    limit: usize,
    wait: Duration,
) -> Response {
    wait_for_event(st, p, from, wait).await;
    match read_local(st, p, (from, limit), None, |page| encode_page(&page)).await {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(e)) | Err(e) => e,
    }
}

/// Partition `p`'s page from `from` read from this node's store below this node's end (with
/// `keep`, of the events it passes), and what `then` makes of it on the reading thread.
async fn read_local<T: Send + 'static>(
    st: &Arc<AppState>,
    p: u32,
    (from, limit): (u64, usize),
    keep: Option<Arc<super::filter::Filter>>,
    then: impl FnOnce(Page) -> T + Send + 'static,
) -> Result<T, Response> {
    let end = st.cp.plog_end(p);
    if from > OFFSET_READ_MAX || from >= end {
        return Ok(then(Page {
            events: Vec::new(),
            next: from,
            end,
        }));
    }
    let store = st.cp.store().clone();
    let retired = retired_ranges(&(st.losses)(), p);
    let timer = st.metrics.latency.page_read.clone();
    let read = tokio::task::spawn_blocking(move || {
        let keep = keep
            .as_deref()
            .map(|f| move |e: &EventPeek<'_>| f.peeked(e));
        let keep = keep.as_ref().map(|k| k as &dyn Fn(&EventPeek<'_>) -> bool);
        let page = super::metrics::timed(&timer, || {
            store.read_plog_page_where(PartitionId(p), (from, limit, end), &retired, keep)
        })?;
        Ok(then(Page {
            events: page.items.into_iter().map(entry).collect(),
            next: page.next,
            end,
        }))
    })
    .await;
    match read {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(read_error(
            st,
            || format!("PLog of partition {p} from offset {from}"),
            &e,
        )),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e,
        )),
    }
}

/// A store page item as the wire carries it.
fn entry(item: PageItem) -> PlogEntryBody<PageEvent> {
    match item {
        PageItem::Event(e) => PlogEntryBody::Event(Box::new(PageEvent::Stored(StoredEvent(*e)))),
        PageItem::Gap(g) => PlogEntryBody::Gap {
            gap: GapBody {
                from: g.from,
                to: g.to,
                reason: g.cause.as_str().to_owned(),
            },
        },
    }
}

/// The body of partition `p`'s page read `q` answered by its owner (through `relay`).
async fn relay_raw(relay: &Relay<'_>, p: u32, q: &ReadQuery) -> Result<Bytes, Response> {
    relay
        .forwarder
        .read_raw(
            &relay_target(&relay.url, p, q.from, q.limit, q.wait),
            q.wait + RELAY_GRACE,
        )
        .await
}

/// The URL of partition `p`'s page read at its owner `url`.
fn relay_target(url: &str, p: u32, from: Start, limit: usize, wait: Duration) -> String {
    format!(
        "{url}/v1/partitions/{p}/events?from={from}&limit={limit}&wait_ms={}",
        wait.as_millis()
    )
}

/// A page of partition `p` read by its owner (through `relay`).
async fn relay_page(
    relay: &Relay<'_>,
    p: u32,
    from: Start,
    limit: usize,
    wait: Duration,
) -> Result<Page, Response> {
    let target = relay_target(&relay.url, p, from, limit, wait);
    let page = relay
        .forwarder
        .read_json::<PlogPageBody>(&target, wait + RELAY_GRACE)
        .await?;
    let events = page
        .events
        .into_iter()
        .map(|e| match e {
            PlogEntryBody::Event(e) => PlogEntryBody::Event(Box::new(PageEvent::Relayed(*e))),
            PlogEntryBody::Gap { gap } => PlogEntryBody::Gap { gap },
        })
        .collect();
    Ok(Page {
        events,
        next: page.next,
        end: page.end,
    })
}

/// `GET /v1/partitions/{p}/events/stream?from=N`: the partition's PLog as Server-Sent Events.
pub(super) async fn stream_partition(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u32>, PathRejection>,
    RawQuery(raw): RawQuery,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
) -> Response {
    let partition = match path {
        Ok(Path(p)) => p,
        Err(e) => return path_error(&e),
    };
    if let Err(r) = check_partition(&st, partition) {
        return r;
    }
    let who = Follower {
        peer: peer.map(|Extension(p)| p.0),
        partition,
        ws: None,
    };
    start_tail(&st, who, (raw.as_deref(), &headers)).await
}

/// `GET /v1/workspaces/{ws}/wlog/stream?from=N`: the workspace's WLog as Server-Sent Events.
pub(super) async fn stream_wlog(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u64>, PathRejection>,
    RawQuery(raw): RawQuery,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
) -> Response {
    let ws = match path {
        Ok(Path(ws)) => ws,
        Err(e) => return path_error(&e),
    };
    let who = Follower {
        peer: peer.map(|Extension(p)| p.0),
        partition: st.cp.partition_of(WsId(ws)),
        ws: Some(ws),
    };
    start_tail(&st, who, (raw.as_deref(), &headers)).await
}

/// Starts a tail for `who` (of a workspace's WLog when it names one) from where the request
/// asks, counted against the cap, on a task of its own that feeds the answer. Logs the
/// follower's connect, or why it was refused.
async fn start_tail(
    st: &Arc<AppState>,
    who: Follower,
    (raw, headers): (Option<&str>, &HeaderMap),
) -> Response {
    let from = match tail_start(st, &who, raw, headers).await {
        Ok(from) => from,
        Err(r) => {
            let why = format!("{} {}", r.status().as_u16(), refusal_code(&r));
            who.log("refused", &why);
            return r;
        }
    };
    let mut slot = match take_slot(st) {
        Ok(slot) => slot,
        Err(r) => {
            who.log(
                "refused",
                "this node serves its most live tails (--followers-max)",
            );
            return r;
        }
    };
    who.log("connected", &format!("from offset {from}"));
    slot.who = Some(who.clone());
    let handoff = Arc::new(Handoff::default());
    let out = Arc::clone(&handoff);
    let (partition, ws) = (who.partition, who.ws);
    let tail = async move {
        let mut slot = slot;
        let st = Arc::clone(&slot.st);
        let mut tail = Tail::new(&st, partition, out);
        let why = match ws {
            Some(ws) => tail.follow_wlog(ws, from).await,
            None => tail.follow_partition(from).await,
        };
        slot.ended = why;
    };
    sse_response(tail, handoff)
}

/// Where a tail for `who` starts: an offset, `end` resolved to the owner's end (of the
/// partition, or of the workspace's WLog).
async fn tail_start(
    st: &Arc<AppState>,
    who: &Follower,
    raw: Option<&str>,
    headers: &HeaderMap,
) -> Result<u64, Response> {
    match (stream_from(raw, headers)?, who.ws) {
        (Start::At(from), _) => Ok(from),
        (Start::End, None) => partition_end(st, who.partition).await,
        (Start::End, Some(ws)) => wlog_end(st, who.partition, ws).await,
    }
}

/// The status line's reason for a refusal's log line (its stable code is in the body, which
/// the log does not read).
fn refusal_code(r: &Response) -> &'static str {
    r.status().canonical_reason().unwrap_or("refused")
}

/// Where a tail starts: after `Last-Event-ID` when sent, else `from` (default 1; `end`).
fn stream_from(raw: Option<&str>, headers: &HeaderMap) -> Result<Start, Response> {
    let q = read_query(raw, query::STREAM_PARAMS, PLOG_PAGE_MAX)?;
    Ok(last_event_id(headers)?.map_or(q.from, Start::At))
}

/// The end of workspace `ws`'s WLog (in `partition`): the WLog offset after its last event
/// below the partition's end as its owner knows it.
async fn wlog_end(st: &Arc<AppState>, partition: u32, ws: u64) -> Result<u64, Response> {
    let plog_end = partition_end(st, partition).await?;
    let store = st.cp.store().clone();
    let found =
        tokio::task::spawn_blocking(move || wlog_end_below(&store, ws, Some(plog_end))).await;
    match found {
        Ok(Ok(end)) => Ok(end),
        Ok(Err(e)) => Err(read_error(st, || format!("WLog of workspace {ws}"), &e)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e,
        )),
    }
}

/// The WLog offset after workspace `ws`'s last stored event whose PLog offset is below
/// `plog_end` (every stored event when `None`), found by doubling then halving reads of one
/// event each (about 2 log2(n) reads for n events). Blocks on the store.
pub(super) fn wlog_end_below(
    store: &monoseq_store::EventStore<crate::config::Store>,
    ws: u64,
    plog_end: Option<u64>,
) -> Result<u64, monoseq_store::ReadError> {
    // Whether an event is stored at `offset` or after it, below the partition's end.
    let any_from = |offset: u64| {
        store.read_wlog(WsId(ws), WLogOffset(offset), 1).map(|e| {
            e.first()
                .is_some_and(|e| plog_end.is_none_or(|end| e.plog_offset.0 < end))
        })
    };
    let (mut below, mut above) = (0u64, 1u64);
    while above <= OFFSET_READ_MAX && any_from(above)? {
        below = above;
        above = above.saturating_mul(2);
    }
    // An event is at `below` or after it (or `below` is 0), none at `above` or after it.
    while above - below > 1 {
        let middle = below + (above - below) / 2;
        if any_from(middle)? {
            below = middle;
        } else {
            above = middle;
        }
    }
    Ok(below + 1)
}

/// Waits (at most `wait`) until partition `p` holds an event at `from` or after it, as its
/// owner knows it (a long poll of a page read, relayed where another node owns it); returns
/// at once when it already does. A failed wait returns early.
pub(super) async fn wait_for_plog(st: &Arc<AppState>, p: u32, from: u64, wait: Duration) {
    let _ = page(st, p, from, 1, wait).await;
}

/// Counts a new tail against `--followers-max`, or refuses it.
pub(super) fn take_slot(st: &Arc<AppState>) -> Result<Slot, Response> {
    let counts = &st.follow.counts;
    let max = st.follow.limits.followers_max;
    let taken = counts
        .followers
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        });
    if taken.is_err() {
        counts.refused.inc();
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TooManyFollowers,
            format!(
                "this node serves its most live tails ({max}, --followers-max); retry later or \
                 follow through another node"
            ),
        );
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from_static(RETRY_AFTER_FOLLOWERS_SECS),
        );
        return Err(r);
    }
    counts.followers_gauge.inc();
    Ok(Slot {
        st: Arc::clone(st),
        who: None,
        ended: None,
    })
}

/// A `text/event-stream` answer whose body runs `tail`: the connection polls the tail itself
/// whenever it can write, and takes each chunk the tail hands over through `handoff` (no task
/// of its own, no channel: one wake-up per hand-out, not two). A connection that closes drops
/// the tail with its body.
fn sse_response(
    tail: impl Future<Output = ()> + Send + 'static,
    handoff: Arc<Handoff>,
) -> Response {
    let mut tail = Box::pin(tail);
    let mut ended = false;
    let stream = futures_util::stream::poll_fn(move |cx| {
        if ended {
            return Poll::Ready(None);
        }
        let finished = tail.as_mut().poll(cx).is_ready();
        if let Some(chunk) = handoff.take() {
            return Poll::Ready(Some(Ok::<_, Infallible>(chunk)));
        }
        if finished {
            ended = true;
            return Poll::Ready(None);
        }
        Poll::Pending
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            // Served by the followers' lower-priority threads (`edge/lanes.rs`): once the tail
            // ends, the connection ends, so that no command rides those threads after it.
            (header::CONNECTION, "close"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// The chunk a tail hands its connection, taken by the body that polls the tail.
#[derive(Debug, Default)]
struct Handoff(Mutex<Option<Bytes>>);

impl Handoff {
    fn put(&self, chunk: Bytes) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(chunk);
    }

    fn take(&self) -> Option<Bytes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Pending once, then ready: a tail that handed over a chunk pauses here so that the body
/// polling it returns the chunk; the body polls it again when the connection wants more (so
/// it needs no wake-up).
struct HandedOver(bool);

impl Future for HandedOver {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        Poll::Pending
    }
}

/// Why a tail ended.
enum Ended {
    /// The connection closed, or the server stops.
    Gone,
    /// It fell behind its hub's buffer (cut with `slow_follower`).
    Slow,
}

/// One live tail: its connection, where it is, and the messages gathered for its next chunk.
struct Tail<'a> {
    st: &'a Arc<AppState>,
    partition: u32,
    out: Arc<Handoff>,
    closing: watch::Receiver<bool>,
    /// Messages not yet handed to the connection: everything a wake-up delivers goes out as
    /// one chunk (one write), not one per message.
    buf: BytesMut,
    /// Events and gaps in `buf`, for the delivered count.
    buffered: u64,
    /// When the tail last handed the connection a chunk (heartbeats go after a quiet
    /// interval).
    sent_at: Instant,
    /// Fires when a heartbeat may be due; re-armed only when it fires, never per message.
    beat: Pin<Box<Sleep>>,
}

impl<'a> Tail<'a> {
    fn new(st: &'a Arc<AppState>, partition: u32, out: Arc<Handoff>) -> Tail<'a> {
        let now = Instant::now();
        Tail {
            st,
            partition,
            out,
            closing: st.follow.closing.subscribe(),
            buf: BytesMut::new(),
            buffered: 0,
            sent_at: now,
            beat: Box::pin(tokio::time::sleep_until(now + st.follow.limits.heartbeat)),
        }
    }

    /// Adds one SSE message with `body` as its data to the next chunk, its JSON written in
    /// place.
    fn push<T: serde::Serialize + ?Sized>(
        &mut self,
        kind: &str,
        id: Option<u64>,
        body: &T,
    ) -> Result<(), Ended> {
        let start = self.buf.len();
        sse_head(&mut self.buf, kind, id);
        if serde_json::to_writer((&mut self.buf).writer(), body).is_err() {
            // Nothing of it goes out (a body of this server's types always encodes).
            self.buf.truncate(start);
            return Err(Ended::Gone);
        }
        self.buf.extend_from_slice(b"\n\n");
        if kind == SSE_EVENT || kind == SSE_GAP {
            self.buffered += 1;
        }
        Ok(())
    }

    /// Adds one SSE message whose data is JSON text already written (`json`).
    fn push_json(&mut self, kind: &str, id: u64, json: &[u8]) {
        sse_head(&mut self.buf, kind, Some(id));
        self.buf.extend_from_slice(json);
        self.buf.extend_from_slice(b"\n\n");
        self.buffered += 1;
    }

    /// Adds a message its hub encoded whole (`id`, `event`, `data`) to the next chunk.
    fn push_encoded(&mut self, sse: &[u8]) {
        self.buf.extend_from_slice(sse);
        self.buffered += 1;
    }

    /// Hands the gathered messages to the connection as one chunk; `Err` when it closed.
    async fn flush(&mut self) -> Result<(), Ended> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.out.put(chunk);
        HandedOver(false).await;
        self.st.follow.counts.delivered.inc_by(self.buffered);
        self.buffered = 0;
        self.sent_at = Instant::now();
        Ok(())
    }

    /// Flushes once the next chunk is large.
    async fn flush_large(&mut self) -> Result<(), Ended> {
        if self.buf.len() >= CHUNK_BYTES {
            self.flush().await?;
        }
        Ok(())
    }

    /// Sends one SSE message with `body` as its data, with what was gathered before it.
    async fn send_body<T: serde::Serialize>(
        &mut self,
        kind: &str,
        id: Option<u64>,
        body: &T,
    ) -> Result<(), Ended> {
        self.push(kind, id, body)?;
        self.flush().await
    }

    /// The last message of a tail cut for falling behind; answers why, for the log.
    async fn cut(&mut self, resume_from: u64) -> String {
        self.st.follow.counts.cut_slow.inc();
        // What was gathered is below `resume_from`: it goes first.
        let body = SlowFollowerBody {
            code: ErrorCode::SlowFollower,
            message: format!(
                "this follower fell more than the server's buffer \
                 (--follower-buffer-events) behind; reconnect from offset {resume_from} \
                 (Last-Event-ID or from=) and read faster"
            ),
            resume_from,
        };
        let _ = self.send_body(SSE_SLOW_FOLLOWER, None, &body).await;
        format!(
            "cut as a slow follower (more than --follower-buffer-events behind); told to \
             resume from {resume_from}"
        )
    }

    /// The partition's PLog from `from`: stored first, then live, until the connection closes.
    /// Answers why it ended when it ended by itself (cut as a slow follower).
    async fn follow_partition(&mut self, from: u64) -> Option<String> {
        let mut next = from;
        loop {
            match self.partition_round(&mut next).await {
                Ok(()) => continue,
                Err(Ended::Slow) => return Some(self.cut(next).await),
                Err(Ended::Gone) => return None,
            }
        }
    }

    /// Catches up from the store, then delivers the hub's frames from `next` until the hub
    /// ends (`Ok`: another round) or the tail ends. The store is read before the tail
    /// subscribes, so a long catch-up never counts against the hub's buffer; what was written
    /// in between is read when the first frame shows it was missed. Each wake-up takes every
    /// frame the hub holds for it and sends them as one chunk.
    async fn partition_round(&mut self, next: &mut u64) -> Result<(), Ended> {
        self.catch_up_plog(next, u64::MAX).await?;
        let mut rx = subscribe(self.st, self.partition);
        loop {
            let Some(first) = self.recv(&mut rx, *next).await? else {
                return Ok(());
            };
            let mut got = Some(first);
            while let Some(frame) = got.take() {
                self.take_plog_frame(&frame, next).await?;
                self.flush_large().await?;
                got = match try_recv(&mut rx)? {
                    Some(f) => Some(f),
                    None => break,
                };
            }
            self.flush().await?;
        }
    }

    /// Adds a hub frame to the next chunk when it is the tail's next, reading what the tail
    /// missed from the store first.
    async fn take_plog_frame(&mut self, frame: &Frame, next: &mut u64) -> Result<(), Ended> {
        if frame.next <= *next {
            return Ok(());
        }
        if frame.from > *next {
            self.catch_up_plog(next, frame.from).await?;
            if frame.from != *next {
                return Ok(());
            }
        }
        self.push_encoded(&frame.sse);
        *next = frame.next;
        Ok(())
    }

    /// Sends what is stored from `next` up to `until` (exclusive) and below the end.
    async fn catch_up_plog(&mut self, next: &mut u64, until: u64) -> Result<(), Ended> {
        while *next < until {
            let page = match page(
                self.st,
                self.partition,
                *next,
                CATCH_UP_PAGE,
                Duration::ZERO,
            )
            .await
            {
                Ok(page) => page,
                // Storage or the owner failed: the live side retries after its next frame
                // or heartbeat.
                Err(_) => break,
            };
            if page.events.is_empty() {
                break;
            }
            for e in &page.events {
                let (kind, id, after) = match e {
                    PlogEntryBody::Event(e) => (SSE_EVENT, e.plog_offset(), e.plog_offset() + 1),
                    PlogEntryBody::Gap { gap } => (SSE_GAP, gap.to, gap.to + 1),
                };
                if after > until {
                    return self.flush().await;
                }
                match e {
                    PlogEntryBody::Event(e) => self.push(kind, Some(id), &**e),
                    PlogEntryBody::Gap { gap } => self.push(kind, Some(id), gap),
                }?;
                *next = after;
                self.flush_large().await?;
            }
        }
        self.flush().await
    }

    /// The next frame of the hub; heartbeats while idle. `None` when the hub ended.
    async fn recv(
        &mut self,
        rx: &mut broadcast::Receiver<Arc<Frame>>,
        next: u64,
    ) -> Result<Option<Arc<Frame>>, Ended> {
        let heartbeat = self.st.follow.limits.heartbeat;
        loop {
            tokio::select! {
                got = rx.recv() => return match got {
                    Ok(f) => Ok(Some(f)),
                    Err(broadcast::error::RecvError::Lagged(_)) => Err(Ended::Slow),
                    Err(broadcast::error::RecvError::Closed) => Ok(None),
                },
                () = self.beat.as_mut() => {}
                _ = self.closing.wait_for(|c| *c) => return Err(Ended::Gone),
            }
            let due = self.sent_at + heartbeat;
            if Instant::now() < due {
                // Something was sent since the timer was armed: wait out the quiet interval.
                self.beat.as_mut().reset(due);
                continue;
            }
            let beat = HeartbeatBody {
                next,
                end: heartbeat_end(self.st, self.partition, next),
            };
            self.send_body(SSE_HEARTBEAT, None, &beat).await?;
            self.beat.as_mut().reset(self.sent_at + heartbeat);
        }
    }

    /// Workspace `ws`'s WLog from WLog offset `from`: stored first, then live. Answers why it
    /// ended when it ended by itself.
    async fn follow_wlog(&mut self, ws: u64, from: u64) -> Option<String> {
        let mut next = from;
        loop {
            match self.wlog_round(ws, &mut next).await {
                Ok(()) => continue,
                Err(Ended::Slow) => return Some(self.cut(next).await),
                Err(Ended::Gone) => return None,
            }
        }
    }

    /// As [`Tail::partition_round`], for the events of one workspace by WLog offset.
    async fn wlog_round(&mut self, ws: u64, next: &mut u64) -> Result<(), Ended> {
        self.catch_up_wlog(ws, next, u64::MAX).await?;
        let mut rx = subscribe(self.st, self.partition);
        loop {
            let Some(first) = self.recv(&mut rx, *next).await? else {
                return Ok(());
            };
            let mut got = Some(first);
            while let Some(frame) = got.take() {
                self.take_wlog_frame(&frame, ws, next).await?;
                self.flush_large().await?;
                got = match try_recv(&mut rx)? {
                    Some(f) => Some(f),
                    None => break,
                };
            }
            self.flush().await?;
        }
    }

    /// Adds a hub frame to the next chunk when it is the next event of `ws`'s WLog, reading
    /// what the tail missed from the store first.
    async fn take_wlog_frame(
        &mut self,
        frame: &Frame,
        ws: u64,
        next: &mut u64,
    ) -> Result<(), Ended> {
        let Some((frame_ws, wlog)) = frame.wlog else {
            return Ok(());
        };
        if frame_ws != ws || wlog < *next {
            return Ok(());
        }
        if wlog > *next {
            self.catch_up_wlog(ws, next, frame.next).await?;
            if wlog != *next {
                return Ok(());
            }
        }
        self.push_json(SSE_EVENT, wlog, frame.json());
        *next = wlog + 1;
        Ok(())
    }

    /// Sends the stored events of `ws`'s WLog from `next` whose PLog offsets are below the
    /// partition's end (and below `plog_until`); a jump in WLog offsets (numbers retired by a
    /// loss) is sent as a gap.
    async fn catch_up_wlog(
        &mut self,
        ws: u64,
        next: &mut u64,
        plog_until: u64,
    ) -> Result<(), Ended> {
        loop {
            let end = hub_end(self.st, self.partition).min(plog_until);
            let store = self.st.cp.store().clone();
            let from = *next;
            if from > OFFSET_READ_MAX {
                break;
            }
            let read = tokio::task::spawn_blocking(move || {
                store.read_wlog(WsId(ws), WLogOffset(from), WLOG_PAGE_MAX)
            })
            .await;
            let Ok(Ok(events)) = read else {
                break;
            };
            let mut sent = 0;
            for e in &events {
                if e.plog_offset.0 >= end {
                    return self.flush().await;
                }
                if e.wlog_offset.0 > *next {
                    let gap = GapBody {
                        from: *next,
                        to: e.wlog_offset.0 - 1,
                        reason: "retired".to_owned(),
                    };
                    self.push(SSE_GAP, Some(gap.to), &gap)?;
                }
                self.push(SSE_EVENT, Some(e.wlog_offset.0), &StoredEventRef(e))?;
                *next = e.wlog_offset.0 + 1;
                sent += 1;
                self.flush_large().await?;
            }
            if sent < WLOG_PAGE_MAX {
                break;
            }
        }
        self.flush().await
    }
}

/// The hub's next frame for a tail if it holds one now; `Err` when the tail fell behind.
fn try_recv(rx: &mut broadcast::Receiver<Arc<Frame>>) -> Result<Option<Arc<Frame>>, Ended> {
    match rx.try_recv() {
        Ok(f) => Ok(Some(f)),
        Err(broadcast::error::TryRecvError::Lagged(_)) => Err(Ended::Slow),
        Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => {
            Ok(None)
        }
    }
}

/// Writes an SSE message's head (`id:` when given, `event:`, the start of `data:`) into `buf`.
fn sse_head(buf: &mut BytesMut, kind: &str, id: Option<u64>) {
    use std::fmt::Write as _;
    // Writing into a `BytesMut` grows it and cannot fail.
    let _ = match id {
        Some(id) => write!(buf, "id: {id}\nevent: {kind}\ndata: "),
        None => write!(buf, "event: {kind}\ndata: "),
    };
}

/// The partition's end as this node's hub (or, serving it, its writer) knows it.
fn hub_end(st: &AppState, p: u32) -> u64 {
    let hub_end = st
        .follow
        .lock()
        .get(&p)
        .map_or(0, |h| h.end.load(Ordering::Acquire));
    hub_end.max(st.cp.plog_end(p))
}

/// The end a heartbeat carries: the true end where this node serves partition `p`, else the
/// end its hub last learned from the owner; none when this node knows no end from the owner,
/// or one below what the tail already sent (`next`), which a node that never owned the
/// partition would otherwise report.
fn heartbeat_end(st: &AppState, p: u32, next: u64) -> Option<u64> {
    let end = if st.cp.serves(p) || st.cluster.is_none() {
        st.cp.plog_end(p)
    } else {
        st.follow
            .lock()
            .get(&p)
            .map_or(0, |h| h.end.load(Ordering::Acquire))
    };
    (end >= next && end > 0).then_some(end)
}

/// A receiver of partition `p`'s hub, started when it has none.
pub(super) fn subscribe(st: &Arc<AppState>, p: u32) -> broadcast::Receiver<Arc<Frame>> {
    let mut hubs = st.follow.lock();
    if let Some(hub) = hubs.get(&p) {
        return hub.tx.subscribe();
    }
    let (tx, rx) = broadcast::channel(st.follow.limits.buffer_events);
    // Where another node owns the partition, this node's end is stale (1 on a node that never
    // owned it): the hub learns the owner's end with its first read (0 until then).
    let here = matches!(owner_elsewhere(st, p, false), Ok(None));
    let hub = Arc::new(Hub {
        tx,
        end: AtomicU64::new(if here { st.cp.plog_end(p) } else { 0 }),
    });
    hubs.insert(p, Arc::clone(&hub));
    let st = Arc::clone(st);
    tokio::spawn(async move { run_hub(st, p, hub).await });
    rx
}

/// Hands partition `p`'s new events to its followers on this node until none is left.
async fn run_hub(st: Arc<AppState>, p: u32, hub: Arc<Hub>) {
    let mut next = hub.end.load(Ordering::Acquire);
    let mut closing = st.follow.closing.subscribe();
    let mut handed = Instant::now();
    loop {
        let followers = hub.tx.receiver_count();
        let pace = HUB_PACE_PER_FOLLOWER
            .saturating_mul(u32::try_from(followers).unwrap_or(u32::MAX))
            .min(HUB_PACE_MAX)
            .max(st.follow.limits.batch);
        if pace >= HUB_PACE_MIN && handed.elapsed() < pace {
            // A pause of up to `--follower-batch-ms` ends early when the server stops.
            tokio::select! {
                () = tokio::time::sleep_until(handed + pace) => {}
                _ = closing.wait_for(|c| *c) => {}
            }
        }
        if hub.tx.receiver_count() == 0 || *closing.borrow() {
            let mut hubs = st.follow.lock();
            // A follower may have subscribed meanwhile: only a hub nobody follows ends.
            if hub.tx.receiver_count() == 0 || *closing.borrow() {
                hubs.remove(&p);
                st.cp.follow_plog(p, false);
                return;
            }
        }
        if matches!(owner_elsewhere(&st, p, false), Ok(None)) {
            st.cp.follow_plog(p, true);
            if next == 0 {
                // Became the owner before learning another's end: its own is true.
                next = st.cp.plog_end(p);
            }
            if hub_recent(&st, p, &hub, &mut next).await {
                handed = Instant::now();
                continue;
            }
        }
        let Ok(page) = hub_page(&st, p, next).await else {
            tokio::time::sleep(RELAY_RETRY).await;
            continue;
        };
        hub.end.fetch_max(page.end, Ordering::AcqRel);
        next = next.max(page.next);
        handed = Instant::now();
        for e in &page.events {
            let frame = match e {
                PlogEntryBody::Event(e) => {
                    st.metrics.latency.page_delivery(e);
                    frame(SSE_EVENT, e.plog_offset(), 1, Some(e.wlog()), &**e)
                }
                PlogEntryBody::Gap { gap } => {
                    frame(SSE_GAP, gap.from, gap.to + 1 - gap.from, None, gap)
                }
            };
            if let Some(frame) = frame {
                next = frame.next;
                // No follower now: the hub ends at the top of the loop.
                let _ = hub.tx.send(Arc::new(frame));
            }
        }
    }
}

/// A hub's next page of partition `p` from `next`: a long poll, here on the writer's end
/// signal, elsewhere on the owner. A hub that knows no end yet (`next` 0) starts at the
/// owner's, and that first read answers at once, so that heartbeats carry the owner's end
/// soon. A page is at most half the buffer, so that followers keeping up are never cut by one
/// page handed out at once.
async fn hub_page(st: &Arc<AppState>, p: u32, next: u64) -> Result<Page, Response> {
    let (from, wait) = if next == 0 {
        (Start::End, Duration::ZERO)
    } else {
        (Start::At(next), HUB_WAIT)
    };
    let limit = PLOG_PAGE_MAX.min(st.follow.limits.buffer_events / 2).max(1);
    page_from(st, p, from, limit, wait).await
}

/// Waits (at most [`HUB_WAIT`]) for partition `p`'s writer here to acknowledge events from
/// `next`, and hands them to the followers as the writer kept them, without reading the
/// store; false when it did not keep them all (the hub reads the store instead).
async fn hub_recent(st: &AppState, p: u32, hub: &Hub, next: &mut u64) -> bool {
    let mut end = st.cp.watch_plog_end(p);
    let from = *next;
    let _ = tokio::time::timeout(HUB_WAIT, end.wait_for(|end| *end > from)).await;
    let end = st.cp.plog_end(p);
    let Some(groups) = st.cp.recent_plog(p, from, end) else {
        return false;
    };
    hub.end.fetch_max(end, Ordering::AcqRel);
    for e in groups.iter().flat_map(|g| g.iter()) {
        let offset = e.plog_offset.0;
        if offset < *next || offset >= end {
            continue;
        }
        st.metrics.latency.follower_delivery(e.registered_at_ms);
        let wlog = Some((e.ws.0, e.wlog_offset.0));
        let Some(frame) = frame(SSE_EVENT, offset, 1, wlog, &StoredEventRef(e)) else {
            return false;
        };
        *next = frame.next;
        // No follower now: the hub ends at the top of its loop.
        let _ = hub.tx.send(Arc::new(frame));
    }
    true
}

/// An event (`kind` [`SSE_EVENT`]) or a gap covering `count` offsets from `from`, encoded
/// once for every follower.
fn frame<T: serde::Serialize + ?Sized>(
    kind: &str,
    from: u64,
    count: u64,
    wlog: Option<(u64, u64)>,
    body: &T,
) -> Option<Frame> {
    let next = from + count;
    let mut sse = BytesMut::with_capacity(EVENT_JSON_BYTES);
    sse_head(&mut sse, kind, Some(next - 1));
    let start = sse.len();
    let mut w = sse.writer();
    serde_json::to_writer(&mut w, body).ok()?;
    let mut sse = w.into_inner();
    let end = sse.len();
    sse.extend_from_slice(b"\n\n");
    Some(Frame {
        from,
        next,
        wlog,
        sse: sse.freeze(),
        json: start..end,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_follower_batch_interval_is_zero_unless_asked_and_refused_past_a_second() {
        let limits = FollowArgs::default().resolve().unwrap();
        assert_eq!(limits.batch, Duration::ZERO);
        let asked = FollowArgs {
            follower_batch_ms: Some(FOLLOWER_BATCH_MS_MAX),
            ..FollowArgs::default()
        };
        assert_eq!(asked.resolve().unwrap().batch, Duration::from_secs(1));
        let too_long = FollowArgs {
            follower_batch_ms: Some(FOLLOWER_BATCH_MS_MAX + 1),
            ..FollowArgs::default()
        };
        let refused = too_long.resolve().unwrap_err().to_string();
        assert_eq!(refused, "--follower-batch-ms is 0 to 1000 (got 1001)");
    }
}
