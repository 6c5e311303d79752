//! One stream over many partitions: `GET /v1/events/stream?partitions=all|0,3,7&from=…`
//! (a **subscription**), and the feed a group member's session shares with it.
//!
//! Each partition of a feed has a reader task that reads its PLog page after page (from this
//! node's store, or relayed from the partition's owner, through `consume::page`, whose long
//! poll waits for new events), drops what the filter refuses, and hands each page's messages
//! to the stream's bounded channel as one chunk; the connection writes chunks in arrival
//! order, so each partition's events arrive in PLog order. An unfiltered reader that reached
//! the end takes new events from the partition's hub (`consume`'s, the one live tails share:
//! read once from the writer's memory and encoded once for every reader of this node) rather
//! than polling pages, and goes back to pages when it falls behind the hub's buffer. Pages
//! are encoded on the thread that read them (`consume::page_then`). A reader that filtered
//! events out after its last delivered one adds a `progress` message, so a filtered
//! consumer's position still advances. The stream's writer keeps the resume vector (each partition's next
//! offset) and sends it as the SSE `id:` at most every [`RESUME_ID_EVERY`] and in every
//! heartbeat, so an `EventSource` that reconnects resumes where it was (redelivering at most
//! what came after the last id).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use monoseq_wire::{
    ErrorCode, PLOG_PAGE_MAX, PlogEntryBody, ProgressBody, SSE_EVENT, SSE_GAP, SSE_HEARTBEAT,
    SSE_PROGRESS, StreamHeartbeatBody, TaggedEventBody, TaggedGapBody,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::AppState;
use super::consume::{self, OFFSET_READ_MAX, PageEvent, Slot};
use super::filter::{Filter, ParamError};
use crate::base::error;
use crate::query::{EVENTS_STREAM_PARAMS, Params};

/// Chunks a stream's channel holds before its readers wait for the connection.
const FEED_CHUNKS: usize = 16;
/// How long a reader's page read waits for a new event before it reads again.
const READ_WAIT: Duration = Duration::from_secs(1);
/// Pause of a reader after a failed read (its partition moving, its owner not answering).
const READ_RETRY: Duration = Duration::from_millis(200);
/// Least interval between two resume ids of a busy stream.
const RESUME_ID_EVERY: Duration = Duration::from_millis(100);

/// What a feed's connection writes.
#[derive(Debug)]
pub(super) enum Chunk {
    /// A page's messages of one partition; everything below `next` there was read.
    Data {
        /// The partition.
        partition: u32,
        /// The next offset its reader reads.
        next: u64,
        /// The SSE messages.
        bytes: Bytes,
    },
    /// A message of the stream itself (a session's `assigned`, `revoked`).
    Control(Bytes),
    /// The last message: the stream ends after it.
    Last(Bytes),
}

/// Appends one SSE message (`id:` when given) with `body` as its JSON data.
pub(super) fn push_message<T: serde::Serialize + ?Sized>(
    buf: &mut BytesMut,
    kind: &str,
    id: Option<&str>,
    body: &T,
) {
    use std::fmt::Write as _;
    // Writing into a `BytesMut` grows it and cannot fail.
    let _ = match id {
        Some(id) => write!(buf, "id: {id}\nevent: {kind}\ndata: "),
        None => write!(buf, "event: {kind}\ndata: "),
    };
    let mut w = std::mem::take(buf).writer();
    // Plain data serializes; a failure would leave a message without data, never a panic.
    let _ = serde_json::to_writer(&mut w, body);
    *buf = w.into_inner();
    buf.extend_from_slice(b"\n\n");
}

/// A message's bytes.
pub(super) fn message<T: serde::Serialize + ?Sized>(kind: &str, body: &T) -> Bytes {
    let mut buf = BytesMut::new();
    push_message(&mut buf, kind, None, body);
    buf.freeze()
}

/// Where a reader starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// At this offset.
    At(u64),
    /// At the partition's end when the reader starts.
    End,
}

/// Until when a group member's reader may deliver (its session's last renewal plus its
/// timeout); `None` before the first renewal.
pub(super) type Until = Arc<std::sync::Mutex<Option<Instant>>>;

/// How often a reader past its `Until` looks whether it was extended.
const UNTIL_RECHECK: Duration = Duration::from_millis(50);

/// Starts the reader of partition `p` feeding `tx` from `start` through `filter`; with
/// `until`, it delivers nothing past that instant.
pub(super) fn spawn_reader(
    st: &Arc<AppState>,
    p: u32,
    start: Start,
    (filter, until): (Arc<Filter>, Option<Until>),
    tx: mpsc::Sender<Chunk>,
) -> JoinHandle<()> {
    let st = Arc::clone(st);
    tokio::spawn(async move { read_into(&st, p, start, (filter, until.as_ref()), &tx).await })
}

/// Waits while `until` is past (the session is not renewed); `false` once the stream is gone.
async fn within(until: Option<&Until>, tx: &mpsc::Sender<Chunk>) -> bool {
    let Some(until) = until else {
        return true;
    };
    loop {
        let valid = until
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|u| Instant::now() <= u);
        if valid {
            return true;
        }
        if tx.is_closed() {
            return false;
        }
        tokio::time::sleep(UNTIL_RECHECK).await;
    }
}

/// The reader's loop: ends when the stream's connection is gone.
async fn read_into(
    st: &Arc<AppState>,
    p: u32,
    start: Start,
    (filter, until): (Arc<Filter>, Option<&Until>),
    tx: &mpsc::Sender<Chunk>,
) {
    let mut next = match start {
        Start::At(from) => from,
        Start::End => loop {
            match consume::page(st, p, OFFSET_READ_MAX, 1, Duration::ZERO).await {
                Ok(page) => break page.end.max(1),
                Err(_) => tokio::time::sleep(READ_RETRY).await,
            }
        },
    };
    // An unfiltered reader waits for new events at the hub, not in a page read.
    let live = filter.is_all();
    // Whether the reader had caught up: what its next page brings was written since.
    let mut caught_up = matches!(start, Start::End);
    loop {
        let wait = if live { Duration::ZERO } else { READ_WAIT };
        let read = read_messages(st, p, (next, wait), &filter, caught_up).await;
        let (page_next, end, bytes) = match read {
            Ok(read) => read,
            Err(_) => {
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(READ_RETRY).await;
                continue;
            }
        };
        caught_up = page_next >= end;
        if page_next <= next {
            if tx.is_closed() {
                return;
            }
            if live && !follow_hub(st, p, &mut next, until, tx).await {
                return;
            }
            continue;
        }
        next = page_next;
        let chunk = Chunk::Data {
            partition: p,
            next,
            bytes,
        };
        if !within(until, tx).await || tx.send(chunk).await.is_err() {
            return;
        }
    }
}

/// Delivers partition `p`'s events from `next` as its hub hands them out, each wake-up's as
/// one chunk, reading from the store what came before the first frame; `true` when the
/// reader fell behind (the hub's buffer moved past it, or it ended): it goes back to pages;
/// `false` once the stream is gone.
async fn follow_hub(
    st: &Arc<AppState>,
    p: u32,
    next: &mut u64,
    until: Option<&Until>,
    tx: &mpsc::Sender<Chunk>,
) -> bool {
    use tokio::sync::broadcast::error::{RecvError, TryRecvError};
    let mut rx = consume::subscribe(st, p);
    loop {
        let first = match tokio::time::timeout(READ_WAIT, rx.recv()).await {
            Err(_) if tx.is_closed() => return false,
            Err(_) => continue,
            Ok(Ok(frame)) => frame,
            Ok(Err(RecvError::Lagged(_) | RecvError::Closed)) => return true,
        };
        let mut buf = BytesMut::new();
        let mut got = Some(first);
        // Behind the hub: what `buf` holds is sent first (`next` is past it), then pages.
        let mut behind = false;
        while let Some(frame) = got.take() {
            if frame.first() > *next && !read_up_to(st, p, next, frame.first(), &mut buf).await {
                behind = true;
                break;
            }
            if frame.after() > *next && frame.first() == *next {
                push_frame(&mut buf, p, &frame);
                *next = frame.after();
            }
            got = match rx.try_recv() {
                Ok(f) => Some(f),
                Err(TryRecvError::Lagged(_)) => {
                    behind = true;
                    None
                }
                Err(TryRecvError::Empty | TryRecvError::Closed) => None,
            };
        }
        if !buf.is_empty() {
            let chunk = Chunk::Data {
                partition: p,
                next: *next,
                bytes: buf.freeze(),
            };
            if !within(until, tx).await || tx.send(chunk).await.is_err() {
                return false;
            }
        }
        if behind {
            return true;
        }
    }
}

/// Appends the messages of partition `p`'s stored events from `next` up to `until` (the
/// first frame a hub handed a reader that subscribed after them) to `buf`; whether it got
/// there.
async fn read_up_to(
    st: &Arc<AppState>,
    p: u32,
    next: &mut u64,
    until: u64,
    buf: &mut BytesMut,
) -> bool {
    let all = Arc::new(Filter::default());
    while *next < until {
        let read = read_messages(st, p, (*next, Duration::ZERO), &all, false).await;
        let Ok((page_next, _, bytes)) = read else {
            return false;
        };
        if page_next <= *next {
            return false;
        }
        buf.extend_from_slice(&bytes);
        *next = page_next;
    }
    true
}

/// Partition `p`'s page from `from` (a long poll of `wait`) as a stream's messages through
/// `filter`, made on the thread that read it: the offset after the page, and its messages
/// (none when it read nothing).
async fn read_messages(
    st: &Arc<AppState>,
    p: u32,
    (from, wait): (u64, Duration),
    filter: &Arc<Filter>,
    caught_up: bool,
) -> Result<(u64, u64, Bytes), consume::ConsumeError> {
    let filter = Arc::clone(filter);
    let state = Arc::clone(st);
    let keep = filter.for_store();
    consume::page_then(st, p, (from, PLOG_PAGE_MAX, wait), keep, move |page| {
        let bytes = if page.next > from {
            if caught_up {
                // What a caught-up reader's page brings was written since: a live delivery.
                state.metrics.latency.live_page(&page.events, &filter);
            }
            page_messages(p, &page.events, page.next, &filter)
        } else {
            Bytes::new()
        };
        (page.next, page.end, bytes)
    })
    .await
}

/// Appends a hub's frame of partition `p` as a tagged message, its JSON as the hub encoded it.
fn push_frame(buf: &mut BytesMut, p: u32, frame: &consume::Frame) {
    use std::fmt::Write as _;
    let (kind, field) = if frame.is_event() {
        (SSE_EVENT, "event")
    } else {
        (SSE_GAP, "gap")
    };
    // Writing into a `BytesMut` grows it and cannot fail.
    let _ = write!(buf, "event: {kind}\ndata: {{\"partition\":{p},\"{field}\":");
    buf.extend_from_slice(frame.json());
    buf.extend_from_slice(b"}\n\n");
}

/// The messages of one page of partition `p`: its events that pass `filter`, its gaps, and
/// a `progress` message when events after the last one delivered were filtered out.
fn page_messages(
    p: u32,
    entries: &[PlogEntryBody<PageEvent>],
    next: u64,
    filter: &Filter,
) -> Bytes {
    let mut buf = BytesMut::with_capacity(entries.len() * consume::EVENT_JSON_BYTES);
    let mut delivered_to = 0;
    for entry in entries {
        match entry {
            PlogEntryBody::Event(e) => {
                if !e.passes(filter) {
                    continue;
                }
                delivered_to = e.plog_offset() + 1;
                let body = TaggedEventBody {
                    partition: p,
                    event: &**e,
                };
                push_message(&mut buf, SSE_EVENT, None, &body);
            }
            PlogEntryBody::Gap { gap } => {
                delivered_to = gap.to + 1;
                let body = TaggedGapBody {
                    partition: p,
                    gap: gap.clone(),
                };
                push_message(&mut buf, SSE_GAP, None, &body);
            }
        }
    }
    if delivered_to < next {
        push_message(
            &mut buf,
            SSE_PROGRESS,
            None,
            &ProgressBody { partition: p, next },
        );
    }
    buf.freeze()
}

/// The resume vector: each partition's next offset, `p:next` pairs joined by commas.
fn resume_id(vector: &BTreeMap<u32, u64>) -> String {
    vector
        .iter()
        .map(|(p, next)| format!("{p}:{next}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a feed's connection is written from.
pub(super) struct Feed {
    /// The chunks its readers and its owner send.
    pub(super) rx: mpsc::Receiver<Chunk>,
    /// Each partition's next offset, for the resume id.
    pub(super) vector: BTreeMap<u32, u64>,
    /// The slot it takes of `--followers-max`, given back when the connection ends (held
    /// for its drop).
    pub(super) _slot: Slot,
}

/// What the writer of a feed waits for next.
enum Next {
    Chunk(Option<Chunk>),
    Quiet,
}

/// A new feed's channel.
pub(super) fn channel() -> (mpsc::Sender<Chunk>, mpsc::Receiver<Chunk>) {
    mpsc::channel(FEED_CHUNKS)
}

/// The `text/event-stream` answer written from `feed`: its chunks in order, a resume id at
/// most every [`RESUME_ID_EVERY`], a heartbeat (with the resume vector) after a quiet
/// interval; it ends with the server, with a `Last` chunk, or when every sender is gone.
pub(super) fn sse_answer(st: &Arc<AppState>, feed: Feed) -> Response {
    let heartbeat = st.follow.limits().heartbeat;
    let closing = st.follow.closing();
    let state = (feed, closing, Instant::now(), false, false);
    let stream = futures_util::stream::unfold(
        state,
        move |(mut feed, mut closing, mut id_at, mut dirty, ended)| async move {
            if ended {
                return None;
            }
            let quiet = tokio::time::sleep(heartbeat);
            let chunk = tokio::select! {
                c = feed.rx.recv() => Next::Chunk(c),
                () = quiet => Next::Quiet,
                _ = closing.wait_for(|c| *c) => Next::Chunk(None),
            };
            let chunk = match chunk {
                Next::Chunk(c) => c,
                Next::Quiet => {
                    let mut buf = BytesMut::new();
                    let resume = resume_id(&feed.vector);
                    let body = StreamHeartbeatBody {
                        resume: resume.clone(),
                    };
                    // Before anything was read there is nothing to resume from: no id.
                    let id = (!resume.is_empty()).then_some(resume.as_str());
                    push_message(&mut buf, SSE_HEARTBEAT, id, &body);
                    let state = (feed, closing, Instant::now(), false, false);
                    return Some((Ok::<_, std::convert::Infallible>(buf.freeze()), state));
                }
            };
            let (bytes, last) = match chunk {
                None => return None,
                Some(Chunk::Control(b)) => (b, false),
                Some(Chunk::Last(b)) => (b, true),
                Some(Chunk::Data {
                    partition,
                    next,
                    bytes,
                }) => {
                    feed.vector.insert(partition, next);
                    dirty = true;
                    (bytes, false)
                }
            };
            let bytes = if dirty && id_at.elapsed() >= RESUME_ID_EVERY {
                id_at = Instant::now();
                dirty = false;
                let mut buf = BytesMut::from(&bytes[..]);
                // An id without data sets the client's Last-Event-ID and fires no event.
                buf.extend_from_slice(format!("id: {}\n\n", resume_id(&feed.vector)).as_bytes());
                buf.freeze()
            } else {
                bytes
            };
            Some((Ok(bytes), (feed, closing, id_at, dirty, last)))
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONNECTION, "close"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Why a stream's request is refused: a 400 naming the parameter (`from`, or the
/// `Last-Event-ID` that stands for it: `what`) and what to send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum StreamRequestError {
    /// `partitions` holds something other than a partition number.
    #[error("`partitions` is `all` or partition numbers joined by commas, not {0:?}")]
    PartitionsSyntax(String),
    /// `partitions` names a partition the server does not have.
    #[error("`partitions` names partition {partition}; the server has partitions 0 to {last}")]
    NoSuchPartition { partition: u32, last: u32 },
    /// A partition named twice.
    #[error("`{what}` names partition {partition} twice")]
    Twice { what: &'static str, partition: u32 },
    /// A start that is neither an offset, `end`, nor pairs.
    #[error(
        "`{what}` is an offset, `end`, or `partition:offset` pairs joined by commas (got {value:?})"
    )]
    StartSyntax { what: &'static str, value: String },
    /// A pair that is not `partition:offset`.
    #[error("`{what}` pairs are `partition:offset`, not {pair:?}")]
    PairSyntax { what: &'static str, pair: String },
    /// An offset out of `1..=OFFSET_READ_MAX`.
    #[error("`{what}` offsets are 1 to {OFFSET_READ_MAX} (got {offset})")]
    Offset { what: &'static str, offset: u64 },
    /// A pair of a partition the stream does not read.
    #[error("`{what}` names partition {partition}, which this stream does not read")]
    NotRead { what: &'static str, partition: u32 },
    /// The filter's parameters, refused as the filter says.
    #[error(transparent)]
    Filter(#[from] ParamError),
}

/// A stream's request: its partitions with their starts, and its filter.
#[derive(Debug, PartialEq)]
pub(super) struct StreamRequest {
    pub(super) starts: Vec<(u32, Start)>,
    pub(super) filter: Filter,
}

/// `partitions=all|0,3,7` of `partitions` partitions.
pub(super) fn parse_partitions(
    value: Option<&str>,
    partitions: u32,
) -> Result<Vec<u32>, StreamRequestError> {
    let value = value.unwrap_or("all");
    if value == "all" {
        return Ok((0..partitions).collect());
    }
    let mut out: Vec<u32> = Vec::new();
    for item in value.split(',') {
        let p: u32 = item
            .parse()
            .map_err(|_| StreamRequestError::PartitionsSyntax(item.to_owned()))?;
        if p >= partitions {
            return Err(StreamRequestError::NoSuchPartition {
                partition: p,
                last: partitions - 1,
            });
        }
        if out.contains(&p) {
            return Err(StreamRequestError::Twice {
                what: "partitions",
                partition: p,
            });
        }
        out.push(p);
    }
    Ok(out)
}

/// `from=N|end|p:N,p:N…` (or `Last-Event-ID`, a resume vector, which wins) for `partitions`.
fn parse_starts(
    from: Option<&str>,
    last_event_id: Option<&str>,
    partitions: &[u32],
) -> Result<Vec<(u32, Start)>, StreamRequestError> {
    if let Some(f) = from
        && last_event_id.is_some()
    {
        // `Last-Event-ID` wins, but a malformed `from` is refused all the same.
        parse_starts(Some(f), None, partitions)?;
    }
    let (what, value) = match (last_event_id, from) {
        (Some(id), _) => ("Last-Event-ID", id.trim()),
        (None, Some(f)) => ("from", f),
        (None, None) => ("from", "1"),
    };
    let all = |s: Start| partitions.iter().map(|&p| (p, s)).collect();
    if value == "end" {
        return Ok(all(Start::End));
    }
    // A single partition's tail sends its last offset as its id: every partition resumes
    // after it.
    if what == "Last-Event-ID"
        && let Ok(last) = value.parse::<u64>()
        && last < OFFSET_READ_MAX
    {
        return Ok(all(Start::At(last + 1)));
    }
    if !value.contains(':') {
        let n: u64 = value.parse().map_err(|_| StreamRequestError::StartSyntax {
            what,
            value: value.to_owned(),
        })?;
        if n == 0 || n > OFFSET_READ_MAX {
            return Err(StreamRequestError::Offset { what, offset: n });
        }
        return Ok(all(Start::At(n)));
    }
    let mut vector: BTreeMap<u32, u64> = BTreeMap::new();
    for pair in value.split(',') {
        let parsed = pair
            .split_once(':')
            .and_then(|(p, o)| Some((p.parse::<u32>().ok()?, o.parse::<u64>().ok()?)));
        let Some((p, offset)) = parsed else {
            return Err(StreamRequestError::PairSyntax {
                what,
                pair: pair.to_owned(),
            });
        };
        if !partitions.contains(&p) {
            return Err(StreamRequestError::NotRead { what, partition: p });
        }
        if offset == 0 || offset > OFFSET_READ_MAX {
            return Err(StreamRequestError::Offset { what, offset });
        }
        if vector.insert(p, offset).is_some() {
            return Err(StreamRequestError::Twice { what, partition: p });
        }
    }
    Ok(partitions
        .iter()
        .map(|&p| (p, Start::At(vector.get(&p).copied().unwrap_or(1))))
        .collect())
}

/// A stream request's parameters and `Last-Event-ID`.
pub(super) fn stream_request(
    params: &Params,
    last_event_id: Option<&str>,
    partitions: u32,
) -> Result<StreamRequest, StreamRequestError> {
    let listed = parse_partitions(params.get("partitions"), partitions)?;
    let starts = parse_starts(params.get("from"), last_event_id, &listed)?;
    let filter = Filter::from_params(params).map_err(StreamRequestError::Filter)?;
    Ok(StreamRequest { starts, filter })
}

/// `GET /v1/events/stream`.
pub(super) async fn stream_events(
    State(st): State<Arc<AppState>>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let last_event_id = match headers.get("last-event-id").map(|v| v.to_str()) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                "`Last-Event-ID` is a resume vector of `partition:offset` pairs in ASCII",
            );
        }
    };
    let partitions = st.cp.config().partitions;
    let params = match crate::query::params(raw.as_deref(), EVENTS_STREAM_PARAMS) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let req = match stream_request(&params, last_event_id, partitions) {
        Ok(req) => req,
        Err(e) => return error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, e),
    };
    let slot = match consume::take_slot(&st) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = channel();
    let filter = Arc::new(req.filter);
    let mut vector = BTreeMap::new();
    for &(p, start) in &req.starts {
        if let Start::At(n) = start {
            vector.insert(p, n);
        }
        spawn_reader(&st, p, start, (Arc::clone(&filter), None), tx.clone());
    }
    drop(tx);
    tracing::info!(
        partitions = req.starts.len(),
        filtered = !filter.is_all(),
        "a subscription stream started"
    );
    sse_answer(
        &st,
        Feed {
            rx,
            vector,
            _slot: slot,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_request(
        query: &str,
        last_event_id: Option<&str>,
        partitions: u32,
    ) -> Result<StreamRequest, StreamRequestError> {
        let params =
            crate::query::params(Some(query), EVENTS_STREAM_PARAMS).expect("known parameters");
        super::stream_request(&params, last_event_id, partitions)
    }

    #[test]
    fn a_resume_vector_names_listed_partitions_once_each() {
        let r = stream_request("partitions=0,2&from=0:5,2:9", None, 4).unwrap();
        assert_eq!(r.starts, vec![(0, Start::At(5)), (2, Start::At(9))]);
        let r = stream_request("from=end", None, 2).unwrap();
        assert_eq!(r.starts, vec![(0, Start::End), (1, Start::End)]);
        let r = stream_request("from=1", Some("1:7"), 2).unwrap();
        assert_eq!(r.starts, vec![(0, Start::At(1)), (1, Start::At(7))]);
        let r = stream_request("from=1", Some("0"), 2).unwrap();
        assert_eq!(r.starts, vec![(0, Start::At(1)), (1, Start::At(1))]);
        assert!(stream_request("from=", Some("0"), 2).is_err());
        for (query, names) in [
            ("partitions=9", "partition 9"),
            ("partitions=1,1", "twice"),
            ("partitions=x", "not \"x\""),
            ("partitions=0&from=1:4", "does not read"),
            ("from=0:4,0:5", "twice"),
            ("from=0-4", "pairs"),
            ("from=0:0", "1 to"),
            ("command=", "empty"),
        ] {
            let e = stream_request(query, None, 4).unwrap_err().to_string();
            assert!(e.contains(names), "{query}: {e}");
        }
    }

    #[test]
    fn a_filtered_page_reports_how_far_it_read() {
        let params = crate::query::params(Some("command=keep"), EVENTS_STREAM_PARAMS).unwrap();
        let filter = Filter::from_params(&params).unwrap();
        let bytes = page_messages(3, &[], 10, &filter);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("event: progress"), "{text}");
        assert!(text.contains(r#""partition":3,"next":10"#), "{text}");
        // Nothing filtered and nothing read: no message.
        assert!(page_messages(3, &[], 0, &Filter::default()).is_empty());
    }
}
