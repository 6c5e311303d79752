//! One live tail, of a partition's PLog or of a workspace's WLog (one code path, given what
//! it follows): what is stored from its offset, then its hub's frames, gathered into one chunk
//! per wake-up; heartbeats while quiet; cut with `slow_follower` when it falls behind.

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
use super::pages::{PageEvent, known_wlog_end, page};
use super::sse::{Handoff, sse_head};
use crate::json::StoredEvent;

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

/// What a tail follows: its partition's PLog, or one workspace's WLog (in its partition),
/// whose offsets its `next` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Followed {
    /// The partition's PLog.
    Plog,
    /// The WLog of this workspace.
    Wlog(u64),
}

impl Followed {
    /// The workspace whose WLog it is.
    pub(super) fn ws(self) -> Option<u64> {
        match self {
            Followed::Plog => None,
            Followed::Wlog(ws) => Some(ws),
        }
    }

    /// Where a hub's frame lies in the followed log (its offset, the one after it); `None`
    /// when it is not in it (another workspace's event, or a gap, in a WLog).
    fn place(self, frame: &Frame) -> Option<(u64, u64)> {
        match self {
            Followed::Plog => Some((frame.from, frame.next)),
            Followed::Wlog(ws) => match frame.wlog {
                Some((frame_ws, wlog)) if frame_ws == ws => Some((wlog, wlog + 1)),
                _ => None,
            },
        }
    }
}

/// Stored messages a tail catches up with: each with its `id:` and the followed log's offset
/// after it.
struct Stored {
    entries: Vec<(u64, u64, PlogEntryBody<PageEvent>)>,
    /// Whether the log may hold more below the bound it was read to.
    more: bool,
}

/// One live tail: its connection, where it is, and the messages gathered for its next chunk.
pub(super) struct Tail<'a> {
    st: &'a Arc<AppState>,
    partition: u32,
    followed: Followed,
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
    pub(super) fn new(
        st: &'a Arc<AppState>,
        (partition, followed): (u32, Followed),
        out: Arc<Handoff>,
    ) -> Tail<'a> {
        let now = Instant::now();
        Tail {
            st,
            partition,
            followed,
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
                end: self.heartbeat_end(next).await,
            };
            self.send_body(SSE_HEARTBEAT, None, &beat).await?;
            self.beat.as_mut().reset(self.sent_at + heartbeat);
        }
    }

    /// The end a heartbeat carries, in the followed log's offsets: the partition's PLog end,
    /// or the workspace's WLog end (read below the partition's end as this node knows it; none
    /// when it cannot be read now, or when it is below what the tail already sent).
    async fn heartbeat_end(&self, next: u64) -> Option<u64> {
        match self.followed {
            Followed::Plog => heartbeat_end(self.st, self.partition, next),
            Followed::Wlog(ws) => known_wlog_end(self.st, self.partition, ws)
                .await
                .ok()
                .filter(|&end| end >= next),
        }
    }

    /// Its log from `from`: stored first, then live, until the connection closes. Answers
    /// why it ended when it ended by itself (cut as a slow follower).
    pub(super) async fn follow(&mut self, from: u64) -> Option<String> {
        let mut next = from;
        loop {
            match self.round(&mut next).await {
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
    async fn round(&mut self, next: &mut u64) -> Result<(), Ended> {
        self.catch_up(next, u64::MAX).await?;
        let mut rx = subscribe(self.st, self.partition);
        loop {
            let Some(first) = self.recv(&mut rx, *next).await? else {
                return Ok(());
            };
            let mut got = Some(first);
            while let Some(frame) = got.take() {
                self.take_frame(&frame, next).await?;
                self.flush_large().await?;
                got = match try_recv(&mut rx)? {
                    Some(f) => Some(f),
                    None => break,
                };
            }
            self.flush().await?;
        }
    }

    /// Adds a hub frame to the next chunk when it is the tail's next message, reading what
    /// the tail missed from the store first.
    async fn take_frame(&mut self, frame: &Frame, next: &mut u64) -> Result<(), Ended> {
        let Some((at, after)) = self.followed.place(frame) else {
            return Ok(());
        };
        if after <= *next {
            return Ok(());
        }
        if at > *next {
            self.catch_up(next, frame.from).await?;
            if at != *next {
                return Ok(());
            }
        }
        match self.followed {
            // A partition's tail sends the message as its hub encoded it.
            Followed::Plog => self.push_encoded(&frame.sse),
            Followed::Wlog(_) => self.push_json(SSE_EVENT, at, frame.json()),
        }
        *next = after;
        Ok(())
    }

    /// Sends what is stored from `next` below the partition's end and below PLog offset
    /// `plog_until`.
    async fn catch_up(&mut self, next: &mut u64, plog_until: u64) -> Result<(), Ended> {
        loop {
            let Some(stored) = self.stored(*next, plog_until).await else {
                break;
            };
            for (id, after, entry) in &stored.entries {
                match entry {
                    PlogEntryBody::Event(e) => self.push(SSE_EVENT, Some(*id), &**e),
                    PlogEntryBody::Gap { gap } => self.push(SSE_GAP, Some(*id), gap),
                }?;
                *next = *after;
                self.flush_large().await?;
            }
            if !stored.more {
                break;
            }
        }
        self.flush().await
    }

    /// The followed log's stored messages from `next` below PLog offset `plog_until`; `None`
    /// when there are none, or the read failed (the live side retries after its next frame
    /// or heartbeat).
    async fn stored(&self, next: u64, plog_until: u64) -> Option<Stored> {
        match self.followed {
            Followed::Plog => self.stored_plog(next, plog_until).await,
            Followed::Wlog(ws) => self.stored_wlog(ws, next, plog_until).await,
        }
    }

    /// A page of the partition's PLog from `next`, cut before `until`.
    async fn stored_plog(&self, next: u64, until: u64) -> Option<Stored> {
        if next >= until {
            return None;
        }
        let page = page(self.st, self.partition, next, CATCH_UP_PAGE, Duration::ZERO)
            .await
            .ok()?;
        let mut stored = Stored {
            entries: Vec::with_capacity(page.events.len()),
            more: true,
        };
        for entry in page.events {
            let (id, after) = match &entry {
                PlogEntryBody::Event(e) => (e.plog_offset(), e.plog_offset() + 1),
                PlogEntryBody::Gap { gap } => (gap.to, gap.to + 1),
            };
            if after > until {
                stored.more = false;
                break;
            }
            stored.entries.push((id, after, entry));
        }
        (!stored.entries.is_empty()).then_some(stored)
    }

    /// Events of workspace `ws`'s WLog from WLog offset `next` whose PLog offsets are below
    /// the partition's end and `plog_until`; a jump in WLog offsets (numbers retired by a
    /// loss) is a gap.
    async fn stored_wlog(&self, ws: u64, next: u64, plog_until: u64) -> Option<Stored> {
        let end = hub_end(self.st, self.partition).min(plog_until);
        if next > OFFSET_READ_MAX {
            return None;
        }
        let store = self.st.cp.store().clone();
        let read = tokio::task::spawn_blocking(move || {
            store.read_wlog(WsId(ws), WLogOffset(next), WLOG_PAGE_MAX)
        });
        let events = read.await.ok()?.ok()?;
        let mut stored = Stored {
            entries: Vec::with_capacity(events.len()),
            more: events.len() >= WLOG_PAGE_MAX,
        };
        let mut at = next;
        for e in events {
            if e.plog_offset.0 >= end {
                stored.more = false;
                break;
            }
            let wlog = e.wlog_offset.0;
            if wlog > at {
                let reason = "retired".to_owned();
                let gap = GapBody {
                    from: at,
                    to: wlog - 1,
                    reason,
                };
                stored
                    .entries
                    .push((gap.to, wlog, PlogEntryBody::Gap { gap }));
            }
            let event = PageEvent::Stored(StoredEvent(e));
            stored
                .entries
                .push((wlog, wlog + 1, PlogEntryBody::Event(Box::new(event))));
            at = wlog + 1;
        }
        (!stored.entries.is_empty()).then_some(stored)
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
