//! The consumer side through the client: page reads of a partition's PLog
//! ([`Client::read_partition`], with a long-poll form; [`Client::read_partition_stored`], the
//! binary page of each event's stored bytes), live tails of a partition or a
//! workspace ([`Client::follow`], [`Client::follow_wlog`]) as a `Stream` that parses the
//! server's Server-Sent Events itself and resumes by itself, and consumer positions
//! ([`Client::consumer_position`], [`Client::store_consumer_position`]).
//!
//! A tail tracks the next offset it owes its caller and checks every message's offset against
//! it: after a `slow_follower` cut, a dropped connection, a 503 or a server restart it
//! reconnects with `Last-Event-ID` (the last offset delivered), drops what it already
//! delivered, and refuses a message that would skip an offset. So each offset is yielded once,
//! in order, with nothing left out; heartbeats are not yielded.

use std::time::{Duration, Instant};

use futures_util::Stream;
use monoseq_wire::{
    EVENTS_BINARY, ErrorBody, ErrorCode, EventBody, EventsEntry, EventsPage, GapBody, PlogPageBody,
    SSE_EVENT, SSE_GAP, SSE_SLOW_FOLLOWER, SlowFollowerBody, WAIT_MS_MAX,
};
use reqwest::{StatusCode, header};

use crate::client::{Client, MOVED_CODES, Outage};
use crate::error::ClientError;

/// A tail with no message (not even a heartbeat, sent every few seconds while idle) for this
/// long is taken as a dead connection and reopened. Above the longest heartbeat interval a
/// server can be given (`--follower-heartbeat-ms` at most [`WAIT_MS_MAX`]).
pub const FOLLOW_IDLE_MAX: Duration = Duration::from_millis(WAIT_MS_MAX + 15_000);
/// Largest SSE message a tail accepts (an event's JSON with its fields); a larger one ends the
/// tail with [`ClientError::Protocol`].
pub const SSE_MESSAGE_MAX: usize = 64 << 20;

/// What a tail yields: an event, or a retired range in its place.
#[derive(Debug, Clone, PartialEq)]
pub enum FollowItem {
    /// The event at the next offset.
    Event(Box<EventBody>),
    /// Offsets that were retired (an operator's accepted loss, a restored backup): no event
    /// is, or will ever be, there. `from` is the next offset owed.
    Gap(GapBody),
}

/// A page of a partition's PLog in the binary encoding ([`Client::read_partition_stored`]):
/// the entries of [`PlogPageBody`], each event as the bytes the server stores for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPage {
    /// The partition read.
    pub partition: u32,
    /// The offset asked for.
    pub from: u64,
    /// The offset to ask for next: after the last entry, or the asked one.
    pub next: u64,
    /// The partition's end: the next offset to be written; every offset below it is final.
    pub end: u64,
    /// The events and gaps, in offset order.
    pub entries: Vec<StoredEntry>,
}

/// An entry of a [`StoredPage`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoredEntry {
    /// The event at `offset`: its encoded bytes as stored (docs/format.md, "Event"), their
    /// CRC-32 and offset checked.
    Event {
        /// Its PLog offset.
        offset: u64,
        /// Its encoded bytes (a slice of the page's body, not a copy).
        bytes: bytes::Bytes,
    },
    /// Offsets that were retired (an accepted loss, a restored backup): no event is there.
    Gap(GapBody),
}

impl StoredPage {
    /// Reads a binary page's body ([`EventsPage::decode`]: every event's CRC-32 and offset
    /// checked), keeping each event's bytes as a slice of `body`.
    ///
    /// # Errors
    ///
    /// [`ClientError::Protocol`] naming what does not read (a cut or damaged body, a JSON one).
    pub fn decode(body: bytes::Bytes) -> Result<StoredPage, ClientError> {
        let page = EventsPage::decode(&body)
            .map_err(|e| ClientError::Protocol(format!("binary PLog page: {e}")))?;
        let entries = page
            .entries
            .into_iter()
            .map(|e| match e {
                EventsEntry::Event { offset, bytes } => StoredEntry::Event {
                    offset,
                    bytes: body.slice_ref(bytes),
                },
                EventsEntry::Gap(gap) => StoredEntry::Gap(gap),
            })
            .collect();
        Ok(StoredPage {
            partition: page.partition,
            from: page.from,
            next: page.next,
            end: page.end,
            entries,
        })
    }

    /// Each event's offset and stored bytes, in order (gaps left out).
    pub fn events(&self) -> impl Iterator<Item = (u64, &bytes::Bytes)> + '_ {
        self.entries.iter().filter_map(|e| match e {
            StoredEntry::Event { offset, bytes } => Some((*offset, bytes)),
            StoredEntry::Gap(_) => None,
        })
    }
}

/// Which log a tail follows.
#[derive(Debug, Clone, Copy)]
enum Log {
    /// A partition's PLog: offsets are `plog_offset`.
    Partition(u32),
    /// A workspace's WLog: offsets are `wlog_offset`.
    Workspace(u64),
}

impl std::fmt::Display for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Log::Partition(p) => write!(f, "partition {p}"),
            Log::Workspace(ws) => write!(f, "workspace {ws}'s WLog"),
        }
    }
}

impl Client {
    /// At most `limit` (1 to [`monoseq_wire::PLOG_PAGE_MAX`]) entries of partition `p`'s PLog
    /// from offset `from` (1 is the first), with the partition's end; fewer, or none, at the
    /// end. Any node answers (one that does not own the partition relays from its owner).
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`]: `bad_request` for a `limit` out of range or `from` 0,
    /// `no_such_partition`, a 503 past the retries; [`ClientError::Transport`].
    pub async fn read_partition(
        &self,
        p: u32,
        from: u64,
        limit: usize,
    ) -> Result<PlogPageBody, ClientError> {
        self.read_partition_wait(p, from, limit, Duration::ZERO)
            .await
    }

    /// As [`Client::read_partition`], but a page that would be empty waits up to `wait` (at
    /// most [`WAIT_MS_MAX`] ms) for an event to become durable at `from` (a long poll).
    ///
    /// # Errors
    ///
    /// As [`Client::read_partition`]; `bad_request` for a `wait` past the maximum.
    pub async fn read_partition_wait(
        &self,
        p: u32,
        from: u64,
        limit: usize,
        wait: Duration,
    ) -> Result<PlogPageBody, ClientError> {
        let body = self.page_body(p, (from, limit, wait), None).await?;
        decode(&body)
    }

    /// As [`Client::read_partition_wait`], in the binary encoding
    /// ([`monoseq_wire::EVENTS_BINARY`]): each event as the bytes the server stores for it
    /// (the event encoding of docs/format.md), sent without decoding them; checked here
    /// (structure, each event's CRC-32 and the offset it names), not decoded into fields.
    ///
    /// # Errors
    ///
    /// As [`Client::read_partition`]; [`ClientError::Protocol`] for a page that does not read
    /// whole (cut, damaged, or a server that answered JSON because it predates the encoding).
    pub async fn read_partition_stored(
        &self,
        p: u32,
        from: u64,
        limit: usize,
        wait: Duration,
    ) -> Result<StoredPage, ClientError> {
        let body = self
            .page_body(p, (from, limit, wait), Some(EVENTS_BINARY))
            .await?;
        StoredPage::decode(body)
    }

    /// The body of partition `p`'s page read, in the media type `accept` names (JSON: `None`).
    async fn page_body(
        &self,
        p: u32,
        (from, limit, wait): (u64, usize, Duration),
        accept: Option<&str>,
    ) -> Result<bytes::Bytes, ClientError> {
        let wait_ms = wait.as_millis();
        let path = format!("/v1/partitions/{p}/events?from={from}&limit={limit}&wait_ms={wait_ms}");
        let node = self.inner.view.node_for(Some(p));
        let answer = self
            .get_retried(&node, &path, self.inner.request_timeout + wait, accept)
            .await?;
        answer.ok_or_else(|| ClientError::Protocol(format!("{path} answered 404")))
    }

    /// The last offset consumer `name` stored for partition `p` (`None` when it stored none):
    /// [`Client::position`].
    ///
    /// # Errors
    ///
    /// As [`Client::position`].
    pub async fn consumer_position(&self, name: &str, p: u32) -> Result<Option<u64>, ClientError> {
        self.position(name, p).await
    }

    /// Stores `offset` as consumer `name`'s position in partition `p` if the stored one is
    /// still `expected` (`None`: none is stored yet): [`Client::set_position`].
    ///
    /// # Errors
    ///
    /// As [`Client::set_position`]: [`ClientError::PositionConflict`] when the stored position
    /// is not `expected` (another consumer of that name moved it).
    pub async fn store_consumer_position(
        &self,
        name: &str,
        p: u32,
        offset: u64,
        expected: Option<u64>,
    ) -> Result<(), ClientError> {
        self.set_position(name, p, offset, expected).await
    }

    /// Partition `p`'s PLog from offset `from` (1 is the first), stored events first, then
    /// each new one once it is durable, for as long as the stream is polled. Each offset is
    /// yielded once and in order, as an event or within a gap; heartbeats are skipped. The
    /// tail goes to the partition's owner as last seen (any node serves it) and resumes by
    /// itself after a `slow_follower` cut, a dropped connection, a 503 or a server restart.
    /// It ends after yielding an error: a refusal (`no_such_partition`, a bad token), a message
    /// that breaks the order, or no node answering for the client's retry timeout, counted
    /// from the start of each outage (any message, a heartbeat included, ends one). Each
    /// outage is logged once as a warning (`tracing`), and its end at info.
    pub fn follow(
        &self,
        p: u32,
        from: u64,
    ) -> impl Stream<Item = Result<FollowItem, ClientError>> + Send + 'static {
        self.tail(Log::Partition(p), from)
    }

    /// Workspace `ws`'s WLog from offset `from` (1 is the first), as [`Client::follow`]: its
    /// events by `wlog_offset`, stored then live, each once and in order.
    pub fn follow_wlog(
        &self,
        ws: u64,
        from: u64,
    ) -> impl Stream<Item = Result<FollowItem, ClientError>> + Send + 'static {
        self.tail(Log::Workspace(ws), from)
    }

    fn tail(
        &self,
        log: Log,
        from: u64,
    ) -> impl Stream<Item = Result<FollowItem, ClientError>> + Send + 'static {
        let tail = Tail {
            client: self.clone(),
            log,
            next: from.max(1),
            response: None,
            buffer: SseBuffer::default(),
            outage: Outage::default(),
            ended: false,
        };
        futures_util::stream::unfold(tail, |mut tail| async move {
            if tail.ended {
                return None;
            }
            let item = tail.next_item().await;
            tail.ended = item.is_err();
            Some((item, tail))
        })
    }

    /// A GET of `node` retried on a 503 (after `Retry-After`) or no answer, within the retry
    /// timeout: the body of a success, `None` for a 404, else the error.
    async fn get_retried(
        &self,
        node: &str,
        path: &str,
        timeout: Duration,
        accept: Option<&str>,
    ) -> Result<Option<bytes::Bytes>, ClientError> {
        let started = Instant::now();
        let mut failures = 0u32;
        let mut node = node.to_owned();
        loop {
            let mut request = self
                .inner
                .http
                .get(format!("{node}{path}"))
                .timeout(timeout);
            if let Some(accept) = accept {
                request = request.header(header::ACCEPT, accept);
            }
            let sent = request.send().await;
            let (error, floor) = match sent {
                Ok(r) => {
                    let status = r.status();
                    let retry_after = retry_after(&r);
                    let body = r.bytes().await.map_err(ClientError::Transport)?;
                    if status.is_success() {
                        return Ok(Some(body));
                    }
                    let error = api_error(status, &body);
                    if status == StatusCode::NOT_FOUND && error.code() != ErrorCode::NoSuchPartition
                    {
                        return Ok(None);
                    }
                    if status != StatusCode::SERVICE_UNAVAILABLE {
                        return Err(error);
                    }
                    (error, retry_after.unwrap_or_default())
                }
                Err(e) => {
                    if e.is_connect() {
                        self.inner.view.forget_node(&node);
                        node = self.inner.view.any_node();
                    }
                    (ClientError::Transport(e), Duration::ZERO)
                }
            };
            failures += 1;
            let wait = floor + self.inner.backoff.jittered(failures);
            if started.elapsed() + wait > self.inner.retry_timeout {
                return Err(error);
            }
            tokio::time::sleep(wait).await;
        }
    }
}

/// One live tail's state: where it is, its open connection and what it has not parsed yet.
struct Tail {
    client: Client,
    log: Log,
    /// The next offset owed to the caller.
    next: u64,
    response: Option<reqwest::Response>,
    buffer: SseBuffer,
    /// When the current run of failed connections began (`None` while messages flow).
    outage: Outage,
    ended: bool,
}

/// What one SSE message means to a tail.
enum Parsed {
    Item(FollowItem),
    /// Already delivered (a resumed tail's overlap), a heartbeat or an unknown message.
    Skip,
    /// `slow_follower`: the server closes; reopen at once.
    Reopen,
}

impl Tail {
    async fn next_item(&mut self) -> Result<FollowItem, ClientError> {
        loop {
            if self.response.is_none() {
                self.connect().await?;
                continue;
            }
            if let Some(block) = self.buffer.take()? {
                let parsed = self.parse(&block)?;
                if !matches!(parsed, Parsed::Reopen) && self.outage.end() {
                    // A message, a heartbeat included, shows the tail works again: an outage
                    // after this one gets a retry timeout of its own.
                    tracing::info!(next = self.next, "following {} again", self.log);
                }
                match parsed {
                    Parsed::Item(item) => return Ok(item),
                    Parsed::Skip => continue,
                    Parsed::Reopen => {
                        self.close();
                        continue;
                    }
                }
            }
            let Some(response) = self.response.as_mut() else {
                continue;
            };
            match tokio::time::timeout(FOLLOW_IDLE_MAX, response.chunk()).await {
                Ok(Ok(Some(bytes))) => {
                    self.buffer.push(&bytes)?;
                }
                Ok(Ok(None)) => {
                    tracing::debug!(next = self.next, "the tail's connection closed; resuming");
                    self.close();
                    self.fail(ClientError::Protocol("the tail closed".into()), None)
                        .await?;
                }
                Ok(Err(e)) => {
                    tracing::debug!(next = self.next, error = %e, "the tail's connection broke; resuming");
                    self.close();
                    self.fail(ClientError::Transport(e), None).await?;
                }
                Err(_) => {
                    tracing::debug!(next = self.next, "the tail was silent too long; resuming");
                    self.close();
                }
            }
        }
    }

    fn close(&mut self) {
        self.response = None;
        self.buffer.clear();
    }

    /// Opens the stream from `next` (with `Last-Event-ID`), or waits before the next attempt.
    async fn connect(&mut self) -> Result<(), ClientError> {
        let client = &self.client;
        let (node, path) = match self.log {
            Log::Partition(p) => (
                client.inner.view.node_for(Some(p)),
                format!("/v1/partitions/{p}/events/stream"),
            ),
            Log::Workspace(ws) => (
                client.node_of(ws).await,
                format!("/v1/workspaces/{ws}/wlog/stream"),
            ),
        };
        let mut request = client
            .inner
            .http
            .get(format!("{node}{path}?from={}", self.next))
            .header(header::ACCEPT, "text/event-stream");
        if self.next > 1 {
            request = request.header("last-event-id", (self.next - 1).to_string());
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                if e.is_connect() {
                    client.inner.view.forget_node(&node);
                }
                return self.fail(ClientError::Transport(e), None).await;
            }
        };
        let status = response.status();
        if status.is_success() {
            tracing::debug!(node, path, next = self.next, "tail opened");
            self.response = Some(response);
            return Ok(());
        }
        let floor = retry_after(&response);
        let body = response.bytes().await.unwrap_or_default();
        let error = api_error(status, &body);
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return Err(error);
        }
        if MOVED_CODES.contains(&error.code()) {
            if let Log::Partition(p) = self.log {
                client.inner.view.forget_owner(p);
            }
            client.refresh_after_move().await;
        }
        self.fail(error, floor).await
    }

    /// Waits before the next attempt (at least `floor`, the server's `Retry-After`), or
    /// answers `error` once the failures in a row have lasted the client's retry timeout.
    async fn fail(
        &mut self,
        error: ClientError,
        floor: Option<Duration>,
    ) -> Result<(), ClientError> {
        let inner = &self.client.inner;
        let Some(wait) = self.outage.next_wait(inner, floor) else {
            return Err(error);
        };
        if self.outage.failures() == 1 {
            // Once per outage: a tail waits quietly otherwise, as a follower should.
            let bound = if inner.retry_timeout == Duration::MAX {
                "until a node answers".to_owned()
            } else {
                format!("for up to {:?}", inner.retry_timeout)
            };
            tracing::warn!(
                next = self.next,
                "following {}: {error}; retrying {bound}",
                self.log
            );
        }
        tracing::debug!(failures = self.outage.failures(), wait_ms = wait.as_secs_f64() * 1e3, %error, "tail: retrying after a wait");
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// What one message means, checked against the next offset owed.
    fn parse(&mut self, block: &str) -> Result<Parsed, ClientError> {
        let (event, id, data) = fields(block);
        let id = id
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    ClientError::Protocol(format!("an SSE id that is not an offset: {v:?}"))
                })
            })
            .transpose()?;
        match event {
            SSE_EVENT => {
                let body: EventBody = decode(data.as_bytes())?;
                let offset = match self.log {
                    Log::Partition(_) => body.plog_offset,
                    Log::Workspace(_) => body.wlog_offset,
                };
                if id.is_some_and(|id| id != offset) {
                    return Err(ClientError::Protocol(format!(
                        "an event with id {id:?} holds offset {offset}"
                    )));
                }
                if offset > self.next {
                    return Err(self.skipped(offset));
                }
                if offset < self.next {
                    return Ok(Parsed::Skip);
                }
                self.next += 1;
                Ok(Parsed::Item(FollowItem::Event(Box::new(body))))
            }
            SSE_GAP => {
                let mut gap: GapBody = decode(data.as_bytes())?;
                if gap.to < self.next {
                    return Ok(Parsed::Skip);
                }
                if gap.from > self.next {
                    return Err(self.skipped(gap.from));
                }
                gap.from = self.next;
                self.next = gap.to + 1;
                Ok(Parsed::Item(FollowItem::Gap(gap)))
            }
            SSE_SLOW_FOLLOWER => {
                let cut: Option<SlowFollowerBody> = serde_json::from_str(&data).ok();
                tracing::debug!(
                    next = self.next,
                    resume_from = cut.map(|c| c.resume_from),
                    "tail cut as a slow follower; resuming"
                );
                Ok(Parsed::Reopen)
            }
            _ => Ok(Parsed::Skip),
        }
    }

    fn skipped(&self, at: u64) -> ClientError {
        ClientError::Protocol(format!(
            "the tail sent offset {at} where {} was owed: offsets would be skipped; follow \
             again from {}",
            self.next, self.next
        ))
    }
}

/// The bytes of an SSE answer received and not yet read as whole messages.
#[derive(Debug, Default)]
pub(crate) struct SseBuffer(Vec<u8>);

impl SseBuffer {
    /// Adds bytes received; a message past [`SSE_MESSAGE_MAX`] bytes is a protocol error.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        self.0.extend_from_slice(bytes);
        if self.0.len() > SSE_MESSAGE_MAX {
            return Err(ClientError::Protocol(format!(
                "an SSE message past {SSE_MESSAGE_MAX} bytes"
            )));
        }
        Ok(())
    }

    /// The next whole message, if one arrived.
    pub(crate) fn take(&mut self) -> Result<Option<String>, ClientError> {
        let Some(end) = self.0.windows(2).position(|w| w == b"\n\n") else {
            return Ok(None);
        };
        let block: Vec<u8> = self.0.drain(..end + 2).collect();
        String::from_utf8(block)
            .map(Some)
            .map_err(|_| ClientError::Protocol("an SSE message that is not UTF-8".into()))
    }

    /// Forgets what a closed connection left.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// An SSE message's `event` (default `message`), `id` and `data` (its lines joined).
pub(crate) fn fields(block: &str) -> (&str, Option<&str>, String) {
    let mut event = "message";
    let mut id: Option<&str> = None;
    let mut data = String::new();
    for line in block.lines() {
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = value,
            "id" => id = Some(value),
            "data" => {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value);
            }
            _ => {}
        }
    }
    (event, id, data)
}

pub(crate) fn retry_after(response: &reqwest::Response) -> Option<Duration> {
    response
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

pub(crate) fn api_error(status: StatusCode, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => ClientError::Api {
            status: status.as_u16(),
            code: e.code,
            message: e.message,
        },
        Err(_) => ClientError::Protocol(format!(
            "status {status} without an error body: {}",
            String::from_utf8_lossy(body)
        )),
    }
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ClientError> {
    serde_json::from_slice(body).map_err(|e| {
        ClientError::Protocol(format!(
            "body not as documented ({e}): {}",
            String::from_utf8_lossy(body)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_split_across_chunks_is_read_whole_and_an_oversized_or_broken_one_is_refused() {
        let mut buf = SseBuffer::default();
        buf.push(b"event: heartbeat\ndata: {\"end\"").unwrap();
        assert_eq!(buf.take().unwrap(), None, "half a message is not a message");
        buf.push(b":3}\n\nid: 4\n").unwrap();
        assert_eq!(
            buf.take().unwrap().as_deref(),
            Some("event: heartbeat\ndata: {\"end\":3}\n\n")
        );
        assert_eq!(buf.take().unwrap(), None);
        buf.clear();
        buf.push(b"data: \xff\n\n").unwrap();
        assert!(matches!(buf.take(), Err(ClientError::Protocol(m)) if m.contains("UTF-8")));
        let mut big = SseBuffer::default();
        let e = big.push(&vec![b'x'; SSE_MESSAGE_MAX + 1]).unwrap_err();
        assert!(matches!(e, ClientError::Protocol(m) if m.contains("past")));
    }
}
