//! One live tail: what is stored from its offset, then its hub's frames, gathered into one
//! chunk per wake-up; heartbeats while quiet; cut with `slow_follower` when it falls behind.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use monoseq_core::WsId;
use monoseq_store::WLogOffset;
use monoseq_wire::{
    ErrorCode, GapBody, HeartbeatBody, PLOG_PAGE_MAX, PlogEntryBody, SSE_EVENT, SSE_GAP,
    SSE_HEARTBEAT, SSE_SLOW_FOLLOWER, SlowFollowerBody, WLOG_PAGE_MAX,
};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, Sleep};

use super::super::AppState;
use super::OFFSET_READ_MAX;
use super::hub::{Frame, heartbeat_end, hub_end, subscribe};
use super::pages::page;
use super::sse::{Handoff, sse_head};
use crate::json::StoredEventRef;

/// Entries a tail reads from the store per step while it catches up.
const CATCH_UP_PAGE: usize = PLOG_PAGE_MAX;
/// Bytes gathered for a tail past which they go to its connection at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// Why a tail ended.
enum Ended {
    /// The connection closed, or the server stops.
    Gone,
    /// It fell behind its hub's buffer (cut with `slow_follower`).
    Slow,
}

/// One live tail: its connection, where it is, and the messages gathered for its next chunk.
pub(super) struct Tail<'a> {
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
    pub(super) fn new(st: &'a Arc<AppState>, partition: u32, out: Arc<Handoff>) -> Tail<'a> {
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
    pub(super) async fn follow_partition(&mut self, from: u64) -> Option<String> {
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
    async fn take_plog_frame(
        &mut self,
        frame: &Frame,
        next: &mut u64,
    ) -> Result<(), Ended> {
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
    pub(super) async fn follow_wlog(&mut self, ws: u64, from: u64) -> Option<String> {
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
fn try_recv(
    rx: &mut broadcast::Receiver<Arc<Frame>>,
) -> Result<Option<Arc<Frame>>, Ended> {
    match rx.try_recv() {
        Ok(f) => Ok(Some(f)),
        Err(broadcast::error::TryRecvError::Lagged(_)) => Err(Ended::Slow),
        Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed) => {
            Ok(None)
        }
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
