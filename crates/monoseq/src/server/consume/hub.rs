//! The hubs: one per followed partition on this node, which reads each new group once (from
//! the writer's memory, the store, or the owner's long poll) and encodes each event's SSE
//! message once for every follower, in a bounded buffer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use bytes::{BufMut, BytesMut};
use monoseq_wire::{PLOG_PAGE_MAX, PlogEntryBody, SSE_EVENT, SSE_GAP};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::super::AppState;
use super::super::place::Relay;
use super::EVENT_JSON_BYTES;
use super::error::ConsumeError;
use super::pages::{Page, local_page_from, owner_elsewhere, relay_page};
use super::params::Start;
use super::sse::sse_head;
use crate::json::StoredEventRef;

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
/// Pause of a relaying hub after the owner did not answer.
const RELAY_RETRY: Duration = Duration::from_millis(200);

/// One item a hub hands its followers: its JSON encoded once, shared by every follower.
#[derive(Debug)]
pub(in crate::server) struct Frame {
    /// First PLog offset it covers.
    pub(super) from: u64,
    /// The offset after it.
    pub(super) next: u64,
    /// An event's workspace and WLog offset (`None` for a gap).
    pub(super) wlog: Option<(u64, u64)>,
    /// The whole SSE message of a partition's tail (`id:` the PLog offset, or a gap's last).
    pub(super) sse: Bytes,
    /// Where the event's JSON lies in `sse` (a workspace's tail sends it with its own `id:`).
    pub(super) json: std::ops::Range<usize>,
}

impl Frame {
    /// The event's or gap's JSON.
    pub(in crate::server) fn json(&self) -> &[u8] {
        &self.sse[self.json.clone()]
    }

    /// The first PLog offset it covers.
    pub(in crate::server) fn first(&self) -> u64 {
        self.from
    }

    /// The offset after it.
    pub(in crate::server) fn after(&self) -> u64 {
        self.next
    }

    /// Whether it is an event (else a gap).
    pub(in crate::server) fn is_event(&self) -> bool {
        self.wlog.is_some()
    }
}

/// The live side of one followed partition on this node.
pub(super) struct Hub {
    tx: broadcast::Sender<Arc<Frame>>,
    /// The partition's end as this hub last learned it.
    end: AtomicU64,
}

/// The partition's end as this node's hub (or, serving it, its writer) knows it.
pub(super) fn hub_end(st: &AppState, p: u32) -> u64 {
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
pub(super) fn heartbeat_end(st: &AppState, p: u32, next: u64) -> Option<u64> {
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
pub(in crate::server) fn subscribe(st: &Arc<AppState>, p: u32) -> broadcast::Receiver<Arc<Frame>> {
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
        // Where the partition is read from is decided once a round.
        let relay = match owner_elsewhere(&st, p, false) {
            Ok(relay) => relay,
            Err(_) => {
                tokio::time::sleep(RELAY_RETRY).await;
                continue;
            }
        };
        if relay.is_none() {
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
        let Ok(page) = hub_page(&st, p, relay.as_ref(), next).await else {
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
/// signal, else on the owner (through `relay`). A hub that knows no end yet (`next` 0) starts
/// at the owner's, and that first read answers at once, so that heartbeats carry the owner's
/// end soon. A page is at most half the buffer, so that followers keeping up are never cut by
/// one page handed out at once.
async fn hub_page(
    st: &Arc<AppState>,
    p: u32,
    relay: Option<&Relay<'_>>,
    next: u64,
) -> Result<Page, ConsumeError> {
    let (from, wait) = if next == 0 {
        (Start::End, Duration::ZERO)
    } else {
        (Start::At(next), HUB_WAIT)
    };
    let limit = PLOG_PAGE_MAX.min(st.follow.limits.buffer_events / 2).max(1);
    match relay {
        Some(relay) => relay_page(relay, p, from, limit, wait).await,
        None => local_page_from(st, p, from, limit, wait).await,
    }
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
pub(super) fn frame<T: serde::Serialize + ?Sized>(
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
