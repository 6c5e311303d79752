//! Page reads of a partition's PLog: from this node's store below its end, or relayed from
//! the partition's owner; the long poll of an empty page; the end of a workspace's WLog.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::{BufMut, BytesMut};
use monoseq_core::WsId;
use monoseq_store::{EventPeek, PageItem, PartitionId, StoredItem, WLogOffset, retired_ranges};
use monoseq_wire::{
    EVENTS_BINARY, EventBody, EventsPageWriter, GapBody, PLOG_PAGE_MAX, PlogEntryBody, PlogPageBody,
};

use super::super::AppState;
use super::super::answers::read_failure;
use super::super::place::{Placed, Relay};
use super::error::ConsumeError;
use super::hub::hub_end;
use super::params::{ReadQuery, Start, check_partition, path_error, read_query};
use super::{EVENT_JSON_BYTES, OFFSET_READ_MAX};

/// Room a binary page sets aside per entry (an event's stored bytes and its entry header).
const EVENT_STORED_BYTES: usize = 256;
use crate::forward::Forwarder;
use crate::json::StoredEvent;
use crate::query;

/// Time a relayed page read may take beyond its own wait.
const RELAY_GRACE: Duration = Duration::from_secs(5);

/// `GET /v1/partitions/{p}/events?from=N&limit=L&wait_ms=W`: JSON, or with
/// `Accept: application/vnd.monoseq.events` the binary page ([`Encoding::Stored`]).
pub(in crate::server) async fn read_partition(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u32>, PathRejection>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Response {
    let encoding = Encoding::asked(&headers);
    match page_answer(&st, path, &headers, raw.as_deref(), encoding).await {
        Ok(body) => ([(header::CONTENT_TYPE, encoding.media_type())], body).into_response(),
        Err(e) => e.into_response(),
    }
}

/// How a page read is answered; an error is always the JSON error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// [`PlogPageBody`] as JSON: each event decoded and written as JSON.
    Json,
    /// The binary page ([`EventsPageWriter`]): each event's stored bytes, never decoded.
    Stored,
}

impl Encoding {
    /// [`Encoding::Stored`] when `Accept` names [`EVENTS_BINARY`] (with a `q` above 0), else
    /// JSON (any other or no `Accept`, as before the binary page).
    fn asked(headers: &HeaderMap) -> Encoding {
        let binary = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|range| {
                let mut parts = range.split(';').map(str::trim);
                parts
                    .next()
                    .is_some_and(|t| t.eq_ignore_ascii_case(EVENTS_BINARY))
                    && !parts.any(|p| {
                        p.strip_prefix("q=")
                            .is_some_and(|q| q.trim().parse::<f32>().is_ok_and(|q| q <= 0.0))
                    })
            });
        if binary {
            Encoding::Stored
        } else {
            Encoding::Json
        }
    }

    fn media_type(self) -> &'static str {
        match self {
            Encoding::Json => "application/json",
            Encoding::Stored => EVENTS_BINARY,
        }
    }
}

/// The body of the page read a request asks for, in `encoding`.
async fn page_answer(
    st: &Arc<AppState>,
    path: Result<Path<u32>, PathRejection>,
    headers: &HeaderMap,
    raw: Option<&str>,
    encoding: Encoding,
) -> Result<Bytes, ConsumeError> {
    let Path(partition) = path.map_err(|e| path_error(&e))?;
    check_partition(st, partition)?;
    let q = read_query(raw, query::PAGE_PARAMS, PLOG_PAGE_MAX)?;
    match owner_elsewhere(st, partition, Forwarder::was_forwarded(headers))? {
        // Passed on as the owner wrote it: this node neither decodes nor encodes the page.
        Some(relay) => relay_raw(&relay, partition, &q, encoding).await,
        None => {
            let from = match q.from {
                Start::At(from) => from,
                Start::End => st.cp.plog_end(partition),
            };
            match encoding {
                Encoding::Json => local_page_json(st, partition, from, q.limit, q.wait).await,
                Encoding::Stored => local_page_stored(st, partition, (from, q.limit), q.wait).await,
            }
        }
    }
}

/// A page's JSON, written once into a buffer sized for it.
fn encode_page(page: &Page) -> Result<Bytes, ConsumeError> {
    let mut body = BytesMut::with_capacity((page.events.len() + 1) * EVENT_JSON_BYTES).writer();
    match serde_json::to_writer(&mut body, page) {
        Ok(()) => Ok(body.into_inner().freeze()),
        Err(e) => Err(ConsumeError::internal(e)),
    }
}

/// A page as this node answers it: its events read from its store, or relayed from the owner.
pub(super) type Page = PlogPageBody<PageEvent>;

/// An event of a [`Page`].
#[derive(Debug)]
pub(in crate::server) enum PageEvent {
    /// Read from this node's store, written without building its body.
    Stored(StoredEvent),
    /// Relayed from the partition's owner.
    Relayed(EventBody),
}

impl PageEvent {
    pub(in crate::server) fn plog_offset(&self) -> u64 {
        match self {
            PageEvent::Stored(e) => e.0.plog_offset.0,
            PageEvent::Relayed(e) => e.plog_offset,
        }
    }

    /// Whether it passes a stream's filter.
    pub(in crate::server) fn passes(&self, filter: &super::super::filter::Filter) -> bool {
        match self {
            PageEvent::Stored(e) => filter.stored(&e.0),
            PageEvent::Relayed(e) => filter.relayed(e),
        }
    }

    /// Its workspace and WLog offset.
    pub(super) fn wlog(&self) -> (u64, u64) {
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
pub(in crate::server) async fn page(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    limit: usize,
    wait: Duration,
) -> Result<Page, ConsumeError> {
    page_from(st, p, Start::At(from), limit, wait).await
}

/// As [`page`], and what `then` makes of the page, on the thread that read it where this
/// node reads its store: the page's events are freed where they were allocated (as a page
/// read's answer is encoded), not on the task that asked. With `keep`, a page read from this
/// node's store holds only the events it passes (the others are read past, not built).
pub(in crate::server) async fn page_then<T: Send + 'static>(
    st: &Arc<AppState>,
    p: u32,
    (from, limit, wait): (u64, usize, Duration),
    keep: Option<Arc<super::super::filter::Filter>>,
    then: impl FnOnce(Page) -> T + Send + 'static,
) -> Result<T, ConsumeError> {
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
) -> Result<Page, ConsumeError> {
    match owner_elsewhere(st, p, false)? {
        Some(relay) => relay_page(&relay, p, from, limit, wait).await,
        None => local_page_from(st, p, from, limit, wait).await,
    }
}

/// As [`page_from`] where this node reads partition `p` itself.
pub(super) async fn local_page_from(
    st: &Arc<AppState>,
    p: u32,
    from: Start,
    limit: usize,
    wait: Duration,
) -> Result<Page, ConsumeError> {
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
pub(super) fn owner_elsewhere(
    st: &AppState,
    p: u32,
    relayed: bool,
) -> Result<Option<Relay<'_>>, ConsumeError> {
    match st.place(p, relayed) {
        Placed::Local => Ok(None),
        Placed::Relay(relay) => Ok(Some(relay)),
        Placed::Unavailable(why) => Err(ConsumeError::Unplaced { partition: p, why }),
    }
}

/// The end of partition `p` (the next PLog offset to be written) as its owner knows it: this
/// node's when it serves the partition (or is the only node), else asked of the owner (a page
/// read from `end`); 503 while the partition moves between nodes, or when the owner does
/// not answer.
pub(in crate::server) async fn partition_end(
    st: &Arc<AppState>,
    p: u32,
) -> Result<u64, ConsumeError> {
    match owner_elsewhere(st, p, false)? {
        None => Ok(st.cp.plog_end(p)),
        Some(relay) => Ok(relay_page(&relay, p, Start::End, 1, Duration::ZERO)
            .await?
            .end),
    }
}

/// The end of partition `p` as this node knows it without asking another: the true end where
/// it serves the partition, else a lower bound (what its hub or its writer last saw).
pub(in crate::server) fn known_end(st: &AppState, p: u32) -> u64 {
    hub_end(st, p)
}

/// A page read from this node's store, below this node's end of the partition.
async fn local_page(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    limit: usize,
) -> Result<Page, ConsumeError> {
    read_local(st, p, (from, limit), None, |page| page).await
}

/// A page read from this node's store as its JSON answer, encoded on the thread that read
/// it (its events are freed where they were allocated, not on another thread).
async fn local_page_json(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    limit: usize,
    wait: Duration,
) -> Result<Bytes, ConsumeError> {
    wait_for_event(st, p, from, wait).await;
    read_local(st, p, (from, limit), None, |page| encode_page(&page)).await?
}

/// A page read from this node's store as its binary answer: each event's stored bytes copied
/// into the page as they are (never decoded; the reader checks each event's CRC-32).
async fn local_page_stored(
    st: &Arc<AppState>,
    p: u32,
    (from, limit): (u64, usize),
    wait: Duration,
) -> Result<Bytes, ConsumeError> {
    wait_for_event(st, p, from, wait).await;
    let end = st.cp.plog_end(p);
    let mut page = EventsPageWriter::new(p, from, end, limit * EVENT_STORED_BYTES);
    if from > OFFSET_READ_MAX || from >= end {
        return Ok(Bytes::from(page.finish(from)));
    }
    let store = st.cp.store().clone();
    let retired = retired_ranges(&(st.losses)(), p);
    let timer = st.metrics.latency.page_read.clone();
    let asked = || format!("PLog of partition {p} from offset {from}");
    read_blocking(st, asked, move || {
        let mut failed = None;
        let next = super::super::metrics::timed(&timer, || {
            store.visit_plog_page_stored(
                PartitionId(p),
                (from, limit, end),
                &retired,
                &mut |item| match item {
                    StoredItem::Event { offset, bytes } => {
                        if let Err(e) = page.event(offset, bytes) {
                            failed.get_or_insert(e);
                        }
                    }
                    StoredItem::Gap(g) => page.gap(g.from, g.to, g.cause.as_str()),
                },
            )
        })?;
        Ok(match failed {
            None => Ok(Bytes::from(page.finish(next))),
            Some(e) => Err(ConsumeError::internal(e)),
        })
    })
    .await?
}

/// Partition `p`'s page from `from` read from this node's store below this node's end (with
/// `keep`, of the events it passes), and what `then` makes of it on the reading thread.
async fn read_local<T: Send + 'static>(
    st: &Arc<AppState>,
    p: u32,
    (from, limit): (u64, usize),
    keep: Option<Arc<super::super::filter::Filter>>,
    then: impl FnOnce(Page) -> T + Send + 'static,
) -> Result<T, ConsumeError> {
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
    let asked = || format!("PLog of partition {p} from offset {from}");
    read_blocking(st, asked, move || {
        let keep = keep
            .as_deref()
            .map(|f| move |e: &EventPeek<'_>| f.peeked(e));
        let keep = keep.as_ref().map(|k| k as &dyn Fn(&EventPeek<'_>) -> bool);
        let page = super::super::metrics::timed(&timer, || {
            store.read_plog_page_where(PartitionId(p), (from, limit, end), &retired, keep)
        })?;
        Ok(then(Page {
            events: page.items.into_iter().map(entry).collect(),
            next: page.next,
            end,
        }))
    })
    .await
}

/// Runs `read` on a blocking thread (reads of this node's store block); a failed read is
/// answered as a read of what `asked` names.
async fn read_blocking<T: Send + 'static>(
    st: &AppState,
    asked: impl FnOnce() -> String,
    read: impl FnOnce() -> Result<T, monoseq_store::ReadError> + Send + 'static,
) -> Result<T, ConsumeError> {
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(e)) => Err(ConsumeError::Read(read_failure(st, asked, &e))),
        Err(e) => Err(ConsumeError::internal(e)),
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
async fn relay_raw(
    relay: &Relay<'_>,
    p: u32,
    q: &ReadQuery,
    encoding: Encoding,
) -> Result<Bytes, ConsumeError> {
    let accept = (encoding == Encoding::Stored).then_some(EVENTS_BINARY);
    relay
        .forwarder
        .read_raw(
            &relay_target(&relay.url, p, q.from, q.limit, q.wait),
            accept,
            q.wait + RELAY_GRACE,
        )
        .await
        .map_err(ConsumeError::relay)
}

/// The URL of partition `p`'s page read at its owner `url`.
fn relay_target(url: &str, p: u32, from: Start, limit: usize, wait: Duration) -> String {
    format!(
        "{url}/v1/partitions/{p}/events?from={from}&limit={limit}&wait_ms={}",
        wait.as_millis()
    )
}

/// A page of partition `p` read by its owner (through `relay`).
pub(super) async fn relay_page(
    relay: &Relay<'_>,
    p: u32,
    from: Start,
    limit: usize,
    wait: Duration,
) -> Result<Page, ConsumeError> {
    let target = relay_target(&relay.url, p, from, limit, wait);
    let page = relay
        .forwarder
        .read_json::<PlogPageBody>(&target, wait + RELAY_GRACE)
        .await
        .map_err(ConsumeError::relay)?;
    Ok(relayed(page))
}

/// A page its owner answered, as this node's page.
fn relayed(page: PlogPageBody) -> Page {
    let events = page
        .events
        .into_iter()
        .map(|e| match e {
            PlogEntryBody::Event(e) => PlogEntryBody::Event(Box::new(PageEvent::Relayed(*e))),
            PlogEntryBody::Gap { gap } => PlogEntryBody::Gap { gap },
        })
        .collect();
    Page {
        events,
        next: page.next,
        end: page.end,
    }
}

/// The end of workspace `ws`'s WLog (in `partition`): the WLog offset after its last event
/// below the partition's end as its owner knows it.
pub(super) async fn wlog_end(
    st: &Arc<AppState>,
    partition: u32,
    ws: u64,
) -> Result<u64, ConsumeError> {
    let plog_end = partition_end(st, partition).await?;
    wlog_end_at(st, ws, plog_end).await
}

/// The end of workspace `ws`'s WLog below the partition's end as this node knows it without
/// asking another (`known_end`): what a WLog tail's heartbeat carries.
pub(super) async fn known_wlog_end(
    st: &Arc<AppState>,
    partition: u32,
    ws: u64,
) -> Result<u64, ConsumeError> {
    wlog_end_at(st, ws, known_end(st, partition)).await
}

async fn wlog_end_at(st: &Arc<AppState>, ws: u64, plog_end: u64) -> Result<u64, ConsumeError> {
    let store = st.cp.store().clone();
    read_blocking(
        st,
        || format!("WLog of workspace {ws}"),
        move || wlog_end_below(&store, ws, Some(plog_end)),
    )
    .await
}

/// The WLog offset after workspace `ws`'s last stored event whose PLog offset is below
/// `plog_end` (every stored event when `None`), found by doubling then halving reads of one
/// event each (about 2 log2(n) reads for n events). Blocks on the store.
pub(in crate::server) fn wlog_end_below(
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
pub(in crate::server) async fn wait_for_plog(
    st: &Arc<AppState>,
    p: u32,
    from: u64,
    wait: Duration,
) {
    let _ = page(st, p, from, 1, wait).await;
}

#[cfg(test)]
mod tests {
    use monoseq_wire::{SSE_EVENT, WlogPageBody};

    use super::super::hub::frame;
    use super::*;
    use crate::json::tests::{stored_event, stored_fields};
    use crate::json::{StoredEventRef, event};

    #[test]
    fn an_event_is_written_alike_by_page_reads_relays_wlog_reads_and_tails() {
        let e = stored_event(stored_fields());
        let expected = serde_json::to_string(&StoredEventRef(&e)).unwrap();
        let stored = PageEvent::Stored(StoredEvent(e.clone()));
        let page = Page {
            events: vec![PlogEntryBody::Event(Box::new(stored))],
            next: 42,
            end: 42,
        };
        // A page read's answer.
        let local = encode_page(&page).unwrap();
        let text = std::str::from_utf8(&local).unwrap();
        assert!(text.contains(&format!("[{expected}]")), "{text}");
        // The same page relayed by another node: decoded there, then written again.
        let decoded: PlogPageBody = serde_json::from_slice(&local).unwrap();
        assert_eq!(encode_page(&relayed(decoded)).unwrap(), local);
        // A WLog page read's answer.
        let wlog = WlogPageBody {
            events: vec![event(&e)],
            next: 4,
            end: 4,
        };
        let text = serde_json::to_string(&wlog).unwrap();
        assert!(text.contains(&format!("[{expected}]")), "{text}");
        // A tail's SSE message, encoded once by the hub: its data is the event's JSON.
        let PlogEntryBody::Event(stored) = &page.events[0] else {
            unreachable!("the page holds an event");
        };
        let f = frame(SSE_EVENT, 41, 1, Some((7, 3)), &**stored).unwrap();
        assert_eq!(f.json(), expected.as_bytes());
        let sse = std::str::from_utf8(&f.sse).unwrap();
        assert_eq!(sse, format!("id: 41\nevent: event\ndata: {expected}\n\n"));
    }
}
