//! A consumer group's member through the client ([`Client::join_group`]): one
//! `GET /v1/groups/{g}/stream` session as a `Stream` of [`GroupItem`]s (the partitions given
//! and taken, and their events tagged with partition), heartbeats sent by a task of its own at
//! the session's `heartbeat_ms` to the node hosting the stream, commits
//! ([`GroupConsumer::commit`]) fenced by the member's generation, and a new session after a
//! lost connection or an expired session, waited for in the client's backoff style.
//!
//! Delivery starts after the group's committed position on each partition given, so an event
//! processed but not committed before a rebalance is delivered again (at least once). When a
//! session is lost the stream yields [`GroupItem::Lost`] with the partitions it held: stop
//! processing them (another member may hold them now), and expect `Assigned` of the new
//! session. A commit refused `409 stale_generation` means the same for that partition.

use std::collections::{BTreeMap, BTreeSet};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::Stream;
use monoseq_wire::{
    AssignedBody, CommitBody, CommitPositionBody, ErrorCode, EventBody, GapBody, JoinedBody,
    ProgressBody, RevokedBody, SSE_ASSIGNED, SSE_EVENT, SSE_GAP, SSE_JOINED, SSE_PROGRESS,
    SSE_REVOKED, SSE_SESSION_ENDED, SessionBody, SessionEndedBody, TaggedEventBody, TaggedGapBody,
};
use reqwest::{Method, StatusCode, header};

use crate::client::{Client, Outage};
use crate::error::ClientError;
use crate::follow::{FOLLOW_IDLE_MAX, SseBuffer, api_error, decode, fields, retry_after};
use crate::positions::path_segment;

/// What a session ended with when the member itself left: the stream ends.
const REASON_LEFT: &str = "left";
/// What a session ended with when another session of the same member name took over: the
/// stream ends with an error rather than take it back (two processes with one name).
const REASON_REPLACED: &str = "replaced";

/// How a member joins: its session timeout and the filters of its stream.
#[derive(Debug, Clone, Default)]
pub struct GroupOptions {
    session_timeout: Option<Duration>,
    filters: Vec<(String, String)>,
}

impl GroupOptions {
    /// The session timeout (the server's default when not set; its documented range applies):
    /// without a heartbeat for this long the session ends and its partitions move.
    #[must_use]
    pub fn session_timeout(mut self, timeout: Duration) -> GroupOptions {
        self.session_timeout = Some(timeout);
        self
    }

    /// A server-side filter of the stream: `command`, `command_prefix`, `ws` or `kind`, as
    /// `GET /v1/groups/{g}/stream` takes it. Filtered-out events come as
    /// [`GroupItem::Progress`].
    #[must_use]
    pub fn filter(mut self, name: &str, value: &str) -> GroupOptions {
        self.filters.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// What a member's stream yields.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupItem {
    /// A session started (the first, or a new one after a lost one).
    Joined(JoinedBody),
    /// Partitions given to this member; each one's delivery starts after its `position`.
    Assigned(AssignedBody),
    /// Partitions taken from this member (a rebalance): nothing more of them comes, and
    /// commits on them are refused.
    Revoked(RevokedBody),
    /// The session was lost (connection cut, session expired, server stopping): the member
    /// no longer holds `partitions`. A new session is joined by itself.
    Lost {
        /// The partitions it held.
        partitions: Vec<u32>,
        /// Why (`session_expired`, `server_stopping`, or how the connection was lost).
        reason: String,
    },
    /// An event of a held partition.
    Event {
        /// Its partition.
        partition: u32,
        /// The event (`plog_offset` is its offset there).
        event: Box<EventBody>,
    },
    /// A retired range of a held partition.
    Gap {
        /// Its partition.
        partition: u32,
        /// The range.
        gap: GapBody,
    },
    /// Everything of a partition below `next` was read (filtered-out events included): a
    /// filtered member may commit `next - 1`.
    Progress(ProgressBody),
}

/// The session as the stream and the commits share it.
#[derive(Debug, Default)]
struct Shared {
    /// The node hosting the stream: heartbeats (and commits) go there.
    node: String,
    session: Option<String>,
    generation: u64,
    held: BTreeSet<u32>,
    /// The last offset committed per partition in this session (a commit never goes back).
    committed: BTreeMap<u32, u64>,
}

/// Commits and leaves for a member; cheap to clone, usable while the stream is polled
/// elsewhere.
#[derive(Clone)]
pub struct GroupCommitter {
    client: Client,
    group: String,
    shared: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for GroupCommitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommitter")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl GroupCommitter {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current session's partitions.
    #[must_use]
    pub fn held(&self) -> Vec<u32> {
        self.shared().held.iter().copied().collect()
    }

    /// Commits `offset` (the last event processed) as the group's position on `partition`,
    /// retried on a 503 or no answer within the client's retry timeout. An offset at or below
    /// what this session committed there already is not sent.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] `stale_generation` (HTTP 409) when this member no longer holds the
    /// partition (revoked, or its session was lost): stop processing it, another member
    /// resumes from the group's position; `unknown_session` when the session ended; else as
    /// any call.
    pub async fn commit(&self, partition: u32, offset: u64) -> Result<(), ClientError> {
        let (node, body) = {
            let shared = self.shared();
            let Some(session) = shared
                .session
                .clone()
                .filter(|_| shared.held.contains(&partition))
            else {
                return Err(stale(partition, "this member does not hold it"));
            };
            if shared.committed.get(&partition) >= Some(&offset) {
                return Ok(());
            }
            let body = CommitBody {
                session,
                generation: shared.generation,
                positions: vec![CommitPositionBody { partition, offset }],
            };
            (shared.node.clone(), body)
        };
        let bytes = bytes::Bytes::from(
            serde_json::to_vec(&body).map_err(|e| ClientError::Protocol(e.to_string()))?,
        );
        let url = format!("{node}/v1/groups/{}/commit", path_segment(&self.group));
        let started = Instant::now();
        let mut failures = 0u32;
        loop {
            let (error, floor) = match self
                .client
                .send(Method::POST, &url, Some((&bytes, None)))
                .await
            {
                Ok(a) if a.status.is_success() => {
                    let mut shared = self.shared();
                    if shared.session.as_deref() == Some(body.session.as_str()) {
                        let c = shared.committed.entry(partition).or_default();
                        *c = (*c).max(offset);
                    }
                    return Ok(());
                }
                Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => {
                    (a.error(), a.retry_after.unwrap_or_default())
                }
                Ok(a) => return Err(a.error()),
                Err(e) => (ClientError::Transport(e), Duration::ZERO),
            };
            failures += 1;
            self.client
                .wait_or_fail(started, floor, failures, error)
                .await?;
        }
    }

    /// Leaves the group: the session ends (`session_ended` `left`), its partitions go to
    /// the other members at once, and the stream ends. Without a session, nothing to do.
    ///
    /// # Errors
    ///
    /// As any call; `unknown_session` when the session ended meanwhile.
    pub async fn leave(&self) -> Result<(), ClientError> {
        let (node, session) = {
            let shared = self.shared();
            match &shared.session {
                Some(s) => (shared.node.clone(), s.clone()),
                None => return Ok(()),
            }
        };
        let url = format!(
            "{node}/v1/groups/{}/members/{}",
            path_segment(&self.group),
            path_segment(&session)
        );
        let a = self
            .client
            .send(Method::DELETE, &url, None)
            .await
            .map_err(ClientError::Transport)?;
        if a.status.is_success() {
            Ok(())
        } else {
            Err(a.error())
        }
    }
}

fn stale(partition: u32, why: &str) -> ClientError {
    ClientError::Api {
        status: 409,
        code: ErrorCode::StaleGeneration,
        message: format!(
            "partition {partition} cannot be committed: {why}; stop processing it (the \
             member that holds it now resumes from the group's position)"
        ),
    }
}

/// A member of a consumer group: a `Stream` of [`GroupItem`]s, with commits.
pub struct GroupConsumer {
    committer: GroupCommitter,
    /// Behind a mutex only so that the consumer is `Sync` (a `&GroupConsumer` held across a
    /// commit's `await` in a spawned task); polling takes `&mut self` and never locks.
    stream: Mutex<ItemStream>,
}

type ItemStream = Pin<Box<dyn Stream<Item = Result<GroupItem, ClientError>> + Send>>;

impl std::fmt::Debug for GroupConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupConsumer")
            .field("committer", &self.committer)
            .finish_non_exhaustive()
    }
}

impl GroupConsumer {
    /// A handle for commits and the leave, for another task.
    #[must_use]
    pub fn committer(&self) -> GroupCommitter {
        self.committer.clone()
    }

    /// [`GroupCommitter::commit`].
    ///
    /// # Errors
    ///
    /// As [`GroupCommitter::commit`].
    pub async fn commit(&self, partition: u32, offset: u64) -> Result<(), ClientError> {
        self.committer.commit(partition, offset).await
    }

    /// [`GroupCommitter::leave`].
    ///
    /// # Errors
    ///
    /// As [`GroupCommitter::leave`].
    pub async fn leave(&self) -> Result<(), ClientError> {
        self.committer.leave().await
    }

    /// The current session's partitions.
    #[must_use]
    pub fn held(&self) -> Vec<u32> {
        self.committer.held()
    }
}

impl Stream for GroupConsumer {
    type Item = Result<GroupItem, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let stream = self.get_mut().stream.get_mut();
        stream
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .poll_next(cx)
    }
}

impl Client {
    /// Joins consumer group `group` as member `member` (names of 1 to 255 printable ASCII
    /// characters without `/`). Nothing is sent until the stream is polled. The stream yields
    /// [`GroupItem::Joined`], then the partitions given and taken and their events, for as
    /// long as it is polled; heartbeats go by themselves. After a lost connection or session
    /// it yields [`GroupItem::Lost`] and joins again (a new session), retrying as a tail does.
    /// It ends after [`GroupConsumer::leave`], and after yielding an error: a refusal (bad
    /// name, bad token), the member's name taken over by another session (`replaced`), or
    /// no node answering for the client's retry timeout. Dropping it closes the session.
    pub fn join_group(&self, group: &str, member: &str, options: GroupOptions) -> GroupConsumer {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let committer = GroupCommitter {
            client: self.clone(),
            group: group.to_owned(),
            shared: shared.clone(),
        };
        let session = Session {
            client: self.clone(),
            group: group.to_owned(),
            member: member.to_owned(),
            options,
            shared,
            response: None,
            buffer: SseBuffer::default(),
            beats: None,
            outage: Outage::default(),
            ended: false,
        };
        let stream = futures_util::stream::unfold(session, |mut s| async move {
            if s.ended {
                return None;
            }
            match s.next_item().await {
                Ok(Some(item)) => Some((Ok(item), s)),
                Ok(None) => None,
                Err(e) => {
                    s.ended = true;
                    Some((Err(e), s))
                }
            }
        });
        GroupConsumer {
            committer,
            stream: Mutex::new(Box::pin(stream)),
        }
    }
}

/// A member's connection and what it has not parsed yet.
struct Session {
    client: Client,
    group: String,
    member: String,
    options: GroupOptions,
    shared: Arc<Mutex<Shared>>,
    response: Option<reqwest::Response>,
    buffer: SseBuffer,
    /// The task sending this session's heartbeats.
    beats: Option<tokio::task::JoinHandle<()>>,
    outage: Outage,
    ended: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(beats) = self.beats.take() {
            beats.abort();
        }
    }
}

/// What one message means to a member.
enum Parsed {
    Item(GroupItem),
    Skip,
    /// The session ended: lost (join again) or over (`left`: the stream ends).
    Ended(SessionEndedBody),
}

impl Session {
    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next item; `None` once the member left.
    async fn next_item(&mut self) -> Result<Option<GroupItem>, ClientError> {
        loop {
            if self.response.is_none() {
                self.connect().await?;
                continue;
            }
            if let Some(block) = self.buffer.take()? {
                match self.parse(&block)? {
                    Parsed::Item(item) => return Ok(Some(item)),
                    Parsed::Skip => continue,
                    Parsed::Ended(end) => {
                        tracing::info!(group = %self.group, member = %self.member, reason = %end.reason, "{}", end.message);
                        let lost = self.lose();
                        if end.reason == REASON_LEFT {
                            return Ok(None);
                        }
                        if end.reason == REASON_REPLACED {
                            return Err(ClientError::Api {
                                status: 409,
                                code: ErrorCode::Replaced,
                                message: end.message,
                            });
                        }
                        if let Some(lost) = lost.into_lost(end.reason) {
                            return Ok(Some(lost));
                        }
                        continue;
                    }
                }
            }
            if let Some(lost) = self.read_more().await? {
                return Ok(Some(lost));
            }
        }
    }

    /// Reads more of the stream; on a lost connection, what the session held.
    async fn read_more(&mut self) -> Result<Option<GroupItem>, ClientError> {
        let Some(response) = self.response.as_mut() else {
            return Ok(None);
        };
        let why = match tokio::time::timeout(FOLLOW_IDLE_MAX, response.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                self.buffer.push(&bytes)?;
                return Ok(None);
            }
            Ok(Ok(None)) => "the session's stream closed".to_owned(),
            Ok(Err(e)) => format!("the session's stream broke: {e}"),
            Err(_) => format!("the session's stream was silent for {FOLLOW_IDLE_MAX:?}"),
        };
        tracing::warn!(group = %self.group, member = %self.member, "{why}; joining again");
        Ok(self.lose().into_lost(why))
    }

    /// Forgets the session: its connection, heartbeats and partitions.
    fn lose(&mut self) -> Lost {
        self.response = None;
        self.buffer.clear();
        if let Some(beats) = self.beats.take() {
            beats.abort();
        }
        let mut shared = self.shared();
        shared.session = None;
        shared.committed.clear();
        Lost(std::mem::take(&mut shared.held).into_iter().collect())
    }

    /// Opens a session, or waits before the next attempt.
    async fn connect(&mut self) -> Result<(), ClientError> {
        let node = self.client.inner.view.any_node();
        let mut url = format!(
            "{node}/v1/groups/{}/stream?member={}",
            path_segment(&self.group),
            path_segment(&self.member)
        );
        if let Some(t) = self.options.session_timeout {
            url.push_str(&format!("&session_timeout_ms={}", t.as_millis()));
        }
        for (name, value) in &self.options.filters {
            url.push_str(&format!("&{}={}", path_segment(name), path_segment(value)));
        }
        let sent = self
            .client
            .inner
            .http
            .get(url)
            .header(header::ACCEPT, "text/event-stream")
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => {
                if e.is_connect() {
                    self.client.inner.view.forget_node(&node);
                }
                return self.fail(ClientError::Transport(e), None).await;
            }
        };
        let status = response.status();
        if status.is_success() {
            self.shared().node = node;
            self.response = Some(response);
            return Ok(());
        }
        let floor = retry_after(&response);
        let body = response.bytes().await.unwrap_or_default();
        let error = api_error(status, &body);
        if status != StatusCode::SERVICE_UNAVAILABLE {
            return Err(error);
        }
        self.fail(error, floor).await
    }

    /// Waits before the next attempt, or answers `error` once the failures in a row have
    /// lasted the client's retry timeout.
    async fn fail(
        &mut self,
        error: ClientError,
        floor: Option<Duration>,
    ) -> Result<(), ClientError> {
        let Some(wait) = self.outage.next_wait(&self.client.inner, floor) else {
            return Err(error);
        };
        if self.outage.failures() == 1 {
            tracing::warn!(group = %self.group, member = %self.member, "joining the group: {error}; retrying");
        }
        tokio::time::sleep(wait).await;
        Ok(())
    }

    fn parse(&mut self, block: &str) -> Result<Parsed, ClientError> {
        let (event, _, data) = fields(block);
        let data = data.as_bytes();
        let item = match event {
            SSE_JOINED => {
                let joined: JoinedBody = decode(data)?;
                self.joined(&joined);
                GroupItem::Joined(joined)
            }
            SSE_ASSIGNED => {
                let a: AssignedBody = decode(data)?;
                let mut shared = self.shared();
                shared.generation = shared.generation.max(a.generation);
                shared.held.extend(a.partitions.iter().map(|p| p.partition));
                GroupItem::Assigned(a)
            }
            SSE_REVOKED => {
                let r: RevokedBody = decode(data)?;
                let mut shared = self.shared();
                shared.generation = shared.generation.max(r.generation);
                for p in &r.partitions {
                    shared.held.remove(p);
                    shared.committed.remove(p);
                }
                GroupItem::Revoked(r)
            }
            SSE_EVENT => {
                let e: TaggedEventBody = decode(data)?;
                GroupItem::Event {
                    partition: e.partition,
                    event: Box::new(e.event),
                }
            }
            SSE_GAP => {
                let g: TaggedGapBody = decode(data)?;
                GroupItem::Gap {
                    partition: g.partition,
                    gap: g.gap,
                }
            }
            SSE_PROGRESS => GroupItem::Progress(decode(data)?),
            SSE_SESSION_ENDED => return Ok(Parsed::Ended(decode(data)?)),
            _ => return Ok(Parsed::Skip),
        };
        Ok(Parsed::Item(item))
    }

    /// A session started: it is the one commits name, and its heartbeats start.
    fn joined(&mut self, joined: &JoinedBody) {
        if self.outage.end() {
            tracing::info!(group = %self.group, member = %self.member, session = %joined.session, "joined the group again");
        }
        let node = {
            let mut shared = self.shared();
            shared.session = Some(joined.session.clone());
            shared.generation = 0;
            shared.held.clear();
            shared.committed.clear();
            shared.node.clone()
        };
        if let Some(old) = self.beats.take() {
            old.abort();
        }
        let (client, session) = (self.client.clone(), joined.session.clone());
        let url = format!("{node}/v1/groups/{}/heartbeat", path_segment(&self.group));
        let every = Duration::from_millis(joined.heartbeat_ms.max(1));
        self.beats = Some(tokio::spawn(heartbeats(client, url, session, every)));
    }
}

/// Sends a session's heartbeats every `every` until it is unknown (the stream then ends it).
async fn heartbeats(client: Client, url: String, session: String, every: Duration) {
    let Ok(body) = serde_json::to_vec(&SessionBody {
        session: session.clone(),
    }) else {
        return;
    };
    let body = bytes::Bytes::from(body);
    loop {
        tokio::time::sleep(every).await;
        match client.send(Method::POST, &url, Some((&body, None))).await {
            Ok(a) if a.status.is_success() => {}
            Ok(a) if a.status == StatusCode::CONFLICT => {
                tracing::info!(session, error = %a.error(), "the session's heartbeats stop: the server no longer hosts it");
                return;
            }
            Ok(a) => tracing::debug!(session, error = %a.error(), "a heartbeat was refused"),
            Err(e) => tracing::debug!(session, error = %e, "a heartbeat got no answer"),
        }
    }
}

/// The partitions of a lost session.
struct Lost(Vec<u32>);

impl Lost {
    fn into_lost(self, reason: String) -> Option<GroupItem> {
        (!self.0.is_empty()).then_some(GroupItem::Lost {
            partitions: self.0,
            reason,
        })
    }
}
