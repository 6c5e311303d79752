//! The live tails' endpoints and their `text/event-stream` answer: where a tail starts, the
//! `--followers-max` slot it holds, the log lines of its connect and end, and the body that
//! polls the tail itself.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use monoseq_core::WsId;

use super::super::AppState;
use super::error::ConsumeError;
use super::pages::{partition_end, wlog_end};
use super::params::{Start, check_partition, path_error, stream_from};
use super::tail::{Followed, Tail};
use crate::edge::PeerAddr;

/// Who a tail serves, for its log lines: the peer's address (when the edge knows it) and
/// what it follows.
#[derive(Debug, Clone)]
struct Follower {
    peer: Option<Arc<str>>,
    partition: u32,
    followed: Followed,
}

impl Follower {
    /// An info line about this follower (connected, ended, refused), with why.
    fn log(&self, what: &str, why: &str) {
        let peer = self.peer.as_deref().unwrap_or("unknown");
        tracing::info!(
            peer,
            partition = self.partition,
            ws = self.followed.ws(),
            "follower {what}: {why}"
        );
    }
}

/// A tail counted against the cap while it lives; logs its end, with why, when it knows
/// whom it serves.
pub(in crate::server) struct Slot {
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

/// `GET /v1/partitions/{p}/events/stream?from=N`: the partition's PLog as Server-Sent Events.
pub(in crate::server) async fn stream_partition(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u32>, PathRejection>,
    RawQuery(raw): RawQuery,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
) -> Response {
    let partition = match path {
        Ok(Path(p)) => p,
        Err(e) => return path_error(&e).into_response(),
    };
    if let Err(e) = check_partition(&st, partition) {
        return e.into_response();
    }
    let who = Follower {
        peer: peer.map(|Extension(p)| p.0),
        partition,
        followed: Followed::Plog,
    };
    start_tail(&st, who, (raw.as_deref(), &headers)).await
}

/// `GET /v1/workspaces/{ws}/wlog/stream?from=N`: the workspace's WLog as Server-Sent Events.
pub(in crate::server) async fn stream_wlog(
    State(st): State<Arc<AppState>>,
    path: Result<Path<u64>, PathRejection>,
    RawQuery(raw): RawQuery,
    peer: Option<Extension<PeerAddr>>,
    headers: HeaderMap,
) -> Response {
    let ws = match path {
        Ok(Path(ws)) => ws,
        Err(e) => return path_error(&e).into_response(),
    };
    let who = Follower {
        peer: peer.map(|Extension(p)| p.0),
        partition: st.cp.partition_of(WsId(ws)),
        followed: Followed::Wlog(ws),
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
        Err(e) => {
            let status = e.status();
            let reason = status.canonical_reason().unwrap_or("refused");
            who.log("refused", &format!("{} {reason}", status.as_u16()));
            return e.into_response();
        }
    };
    let mut slot = match take_slot(st) {
        Ok(slot) => slot,
        Err(e) => {
            who.log(
                "refused",
                "this node serves its most live tails (--followers-max)",
            );
            return e.into_response();
        }
    };
    who.log("connected", &format!("from offset {from}"));
    slot.who = Some(who.clone());
    let handoff = Arc::new(Handoff::default());
    let out = Arc::clone(&handoff);
    let followed = (who.partition, who.followed);
    let tail = async move {
        let mut slot = slot;
        let st = Arc::clone(&slot.st);
        slot.ended = Tail::new(&st, followed, out).follow(from).await;
    };
    sse_response(tail, handoff)
}

/// Where a tail for `who` starts: an offset, `end` resolved to the owner's end (of the
/// partition, or of the workspace's WLog). A tail from an offset asks the partition's end
/// too (its owner's, through this node's own token, when another node owns it), so that a
/// refusal comes before the stream begins, as for `end`: a stream that began would wait in
/// silence, its reads refused.
async fn tail_start(
    st: &Arc<AppState>,
    who: &Follower,
    raw: Option<&str>,
    headers: &HeaderMap,
) -> Result<u64, ConsumeError> {
    match (stream_from(raw, headers)?, who.followed) {
        (Start::At(from), _) => partition_end(st, who.partition).await.map(|_| from),
        (Start::End, Followed::Plog) => partition_end(st, who.partition).await,
        (Start::End, Followed::Wlog(ws)) => wlog_end(st, who.partition, ws).await,
    }
}

/// Counts a new tail against `--followers-max`, or refuses it.
pub(in crate::server) fn take_slot(st: &Arc<AppState>) -> Result<Slot, ConsumeError> {
    let counts = &st.follow.counts;
    let max = st.follow.limits.followers_max;
    let taken = counts
        .followers
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < max).then_some(n + 1)
        });
    if taken.is_err() {
        counts.refused.inc();
        return Err(ConsumeError::TooManyFollowers { max });
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
pub(super) struct Handoff(Mutex<Option<Bytes>>);

impl Handoff {
    pub(super) fn put(&self, chunk: Bytes) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(chunk);
    }

    fn take(&self) -> Option<Bytes> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// Writes an SSE message's head (`id:` when given, `event:`, the start of `data:`) into `buf`.
pub(super) fn sse_head(buf: &mut BytesMut, kind: &str, id: Option<u64>) {
    use std::fmt::Write as _;
    // Writing into a `BytesMut` grows it and cannot fail.
    let _ = match id {
        Some(id) => write!(buf, "id: {id}\nevent: {kind}\ndata: "),
        None => write!(buf, "event: {kind}\ndata: "),
    };
}
