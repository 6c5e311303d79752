//! Consumer groups over HTTP. A member joins with `GET /v1/groups/{g}/stream?member=M`, one
//! Server-Sent Events stream that is its session: `joined`, then `assigned` and `revoked` as
//! the group rebalances, its partitions' events tagged with partition and offset (through the
//! same feed as a subscription, filters included), `heartbeat` while quiet, and
//! `session_ended` last. The member sends `POST /v1/groups/{g}/heartbeat` (or commits) at least
//! every `heartbeat_ms`, commits with `POST /v1/groups/{g}/commit`, and leaves with
//! `DELETE /v1/groups/{g}/members/{session}` or by closing its stream, all through any node:
//! a commit is stored from any node (the fence decides), and a heartbeat or leave reaching a
//! node that does not host the session is relayed once to the node that does, as the group's
//! state names it (a commit's heartbeat too, on the side).
//! `GET /v1/groups` and `GET /v1/groups/{g}` show groups, members, assignment and lag;
//! `DELETE /v1/groups/{g}` removes a group without members.
//!
//! The group's state is in the store (`monoseq_store::GroupState`); `host.rs` is what this
//! node does for the sessions it hosts.

// A refused request answers with a `Response` (128 bytes), once per request.
#![allow(clippy::result_large_err)]

mod host;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use monoseq_store::{
    ConsumerName, GroupError, GroupState, Holder, Member, PartitionId, SESSION_TIMEOUT_MS_DEFAULT,
    SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};
use monoseq_wire::{
    CommitBody, CommitPositionBody, ErrorCode, GroupBody, GroupMemberBody, GroupPartitionBody,
    GroupSummaryBody, GroupsBody, JoinedBody, SSE_JOINED, SessionBody, StaleGenerationBody,
};
use tokio::time::Instant;

use self::host::{Host, Session, blocking};
use super::AppState;
use super::answers::with_retry_after;
use super::consume::{self, OFFSET_READ_MAX};
use super::filter::{Filter, ParamError, millis};
use super::stream::{Chunk, Feed, channel, message, sse_answer};
use crate::base::error;
use crate::query::{Params, SESSION_PARAMS};

/// Most groups `GET /v1/groups` lists.
const GROUPS_LISTED_MAX: usize = 1_000;
/// Longest wait for the node hosting a member's session to answer a request relayed to it.
const RELAY_TIMEOUT: Duration = Duration::from_secs(2);

/// The groups whose members this node hosts.
pub(crate) struct Groups {
    hosts: Mutex<HashMap<String, Arc<Host>>>,
    /// How this node names itself in a group's state.
    node: String,
    sessions: AtomicU64,
}

impl Groups {
    pub(crate) fn new(node: String) -> Groups {
        Groups {
            hosts: Mutex::default(),
            node,
            sessions: AtomicU64::new(0),
        }
    }

    fn hosts(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Host>>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hosted session `id` of group `g`.
    fn session(&self, g: &ConsumerName, id: &str) -> Option<(Arc<Host>, Arc<Session>)> {
        let host = self.hosts().get(g.as_str()).cloned()?;
        let session = host.sessions().get(id).cloned()?;
        Some((host, session))
    }

    /// Adds a session to its group's host, starting the host when it has none.
    fn host(&self, st: &Arc<AppState>, g: &ConsumerName, session: Arc<Session>) {
        let mut hosts = self.hosts();
        let host = hosts.entry(g.to_string()).or_insert_with(|| {
            let host = Arc::new(Host::new(g.clone()));
            tokio::spawn(Arc::clone(&host).run(Arc::clone(st)));
            host
        });
        host.sessions().insert(session.id.clone(), session);
        host.wake.notify_one();
    }

    /// Forgets `host` when it hosts no session; whether it did.
    fn retire_if_idle(&self, host: &Arc<Host>) -> bool {
        let mut hosts = self.hosts();
        if !host.sessions().is_empty() {
            return false;
        }
        if hosts
            .get(host.group.as_str())
            .is_some_and(|h| Arc::ptr_eq(h, host))
        {
            hosts.remove(host.group.as_str());
        }
        true
    }

    /// A new session identifier: the member, this process's start and a counter.
    fn new_session_id(&self, member: &str) -> String {
        let n = self.sessions.fetch_add(1, Ordering::Relaxed);
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        format!("{member}~{started:x}.{n}")
    }
}

/// Why a group's or a member's request is refused (a 400 saying what to send).
#[derive(Debug, thiserror::Error)]
enum RequestError {
    /// A name that is not a consumer name.
    #[error("the {what} name: {cause}")]
    Name {
        what: &'static str,
        cause: monoseq_store::InvalidConsumerName,
    },
    /// A name holding a character reserved in paths and session identifiers.
    #[error(
        "the {what} name {raw:?} holds `/` or `~`: a {what} name is 1 to 255 printable ASCII \
         characters without them"
    )]
    Reserved { what: &'static str, raw: String },
    /// A join without `member`.
    #[error("`member` is required: the member's name")]
    NoMember,
    /// A join's timeout or filter, refused as the parameter's check says.
    #[error(transparent)]
    Parameter(#[from] ParamError),
}

/// A group or member name: a consumer name without `/` or `~`.
fn name(what: &'static str, raw: &str) -> Result<ConsumerName, RequestError> {
    let n = ConsumerName::new(raw).map_err(|cause| RequestError::Name { what, cause })?;
    if raw.contains(['/', '~']) {
        return Err(RequestError::Reserved {
            what,
            raw: raw.to_owned(),
        });
    }
    Ok(n)
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
}

fn group_path(path: Result<Path<String>, PathRejection>) -> Result<ConsumerName, Response> {
    match path {
        Ok(Path(g)) => name("group", &g).map_err(bad_request),
        Err(e) => Err(bad_request(e.body_text())),
    }
}

fn group_error(e: &GroupError) -> Response {
    match e {
        GroupError::Full(_) => with_retry_after(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::GroupFull,
            e,
        )),
        GroupError::Corrupt { .. } => {
            error(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Corrupted, e)
        }
        GroupError::Backwards { .. } => {
            error(StatusCode::CONFLICT, ErrorCode::PositionBackwards, e)
        }
        _ => with_retry_after(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            crate::base::chain(e),
        )),
    }
}

/// A member's join: who, for how long, which events.
struct Join {
    member: ConsumerName,
    timeout: Duration,
    filter: Filter,
}

fn join_request(params: &Params) -> Result<Join, RequestError> {
    let member = params.get("member").ok_or(RequestError::NoMember)?;
    let timeout = match params.get("session_timeout_ms") {
        Some(v) => millis(
            "session_timeout_ms",
            v,
            SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX,
        )
        .map_err(RequestError::Parameter)?,
        None => Duration::from_millis(SESSION_TIMEOUT_MS_DEFAULT),
    };
    Ok(Join {
        member: name("member", member)?,
        timeout,
        filter: Filter::from_params(params).map_err(RequestError::Parameter)?,
    })
}

/// `GET /v1/groups/{g}/stream`: joins the group; the stream is the session.
pub(super) async fn join(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Response {
    let g = match group_path(path) {
        Ok(g) => g,
        Err(r) => return r,
    };
    let join = match crate::query::params(raw.as_deref(), SESSION_PARAMS)
        .and_then(|p| join_request(&p).map_err(bad_request))
    {
        Ok(j) => j,
        Err(r) => return r,
    };
    let slot = match consume::take_slot(&st) {
        Ok(slot) => slot,
        Err(e) => return e.into_response(),
    };
    let id = st.groups.new_session_id(join.member.as_str());
    let member = Member {
        name: join.member.to_string(),
        session: id.clone(),
        node: st.groups.node.clone(),
        timeout_ms: u64::try_from(join.timeout.as_millis()).unwrap_or(u64::MAX),
        beat: 0,
        leaving: false,
    };
    let partitions = st.cp.config().partitions;
    let joined = blocking(&st, {
        let g = g.clone();
        move |store| {
            store.update_group(&g, partitions, |state| {
                state.join(member.clone())?;
                state.rebalance();
                Ok(true)
            })
        }
    })
    .await;
    if let Err(e) = joined {
        tracing::info!(group = %g, member = %join.member, error = %crate::base::chain(&e), "a consumer group member was refused");
        return group_error(&e);
    }
    open_session(&st, &g, join, id, slot)
}

/// The stream of a session that joined: `joined` first, then what its host sends.
fn open_session(
    st: &Arc<AppState>,
    g: &ConsumerName,
    join: Join,
    id: String,
    slot: super::consume::Slot,
) -> Response {
    let (tx, rx) = channel();
    let timeout_ms = u64::try_from(join.timeout.as_millis()).unwrap_or(u64::MAX);
    let body = JoinedBody {
        group: g.to_string(),
        member: join.member.to_string(),
        session: id.clone(),
        session_timeout_ms: timeout_ms,
        heartbeat_ms: timeout_ms / 3,
    };
    let _ = tx.try_send(Chunk::Control(message(SSE_JOINED, &body)));
    let session = Arc::new(Session {
        member: join.member.to_string(),
        id: id.clone(),
        timeout: join.timeout,
        filter: Arc::new(join.filter),
        tx,
        client_beat: Mutex::new(Instant::now()),
        leaving: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        until: Arc::default(),
    });
    tracing::info!(group = %g, member = %join.member, session = %id, timeout_ms, "a consumer group member joined");
    st.groups.host(st, g, session);
    sse_answer(
        st,
        Feed {
            rx,
            vector: std::collections::BTreeMap::new(),
            _slot: slot,
        },
    )
}

/// The group of the path and the JSON body of a member's request (through the body checks
/// every JSON endpoint shares: 413, 415, 400).
fn member_request<T: serde::de::DeserializeOwned>(
    path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(ConsumerName, T), Response> {
    let g = group_path(path)?;
    let body = super::batch::json_bytes(headers, body, "a group member's request")
        .map_err(|(status, code, message)| error(status, code, message))?;
    let parsed = serde_json::from_slice(&body)
        .map_err(|e| bad_request(format!("the body does not parse: {e}")))?;
    Ok((g, parsed))
}

fn unknown_session(g: &ConsumerName, id: &str) -> Response {
    error(
        StatusCode::CONFLICT,
        ErrorCode::UnknownSession,
        format!("no node hosts session {id:?} of group {g}: the session ended; join again"),
    )
}

/// A member's request that reached a node not hosting its session, to relay to the one that
/// does: its method, the path's segments after `/v1/groups/{g}/`, and its JSON body.
struct Relayed {
    method: reqwest::Method,
    segments: Vec<String>,
    body: Option<Bytes>,
}

impl Relayed {
    /// A heartbeat of session `id`.
    fn heartbeat(id: &str) -> Relayed {
        let body = SessionBody {
            session: id.to_owned(),
        };
        Relayed {
            method: reqwest::Method::POST,
            segments: vec!["heartbeat".to_owned()],
            // Serializing a plain owned struct cannot fail.
            body: Some(Bytes::from(serde_json::to_vec(&body).unwrap_or_default())),
        }
    }
}

/// The answer of the node hosting session `id` of group `g` to a member's request that reached
/// this node, which does not host it: relayed once (a relayed request is never relayed again),
/// or 409 `unknown_session` when the group's state names no other node hosting it.
async fn relay_to_host(
    st: &Arc<AppState>,
    g: &ConsumerName,
    id: &str,
    headers: &HeaderMap,
    relayed: Relayed,
) -> Response {
    let Some((_, forwarder)) = st
        .cluster
        .as_ref()
        .filter(|_| !crate::forward::Forwarder::was_forwarded(headers))
    else {
        return unknown_session(g, id);
    };
    let host = match host_of(st, g, id).await {
        Ok(Some(host)) => host,
        Ok(None) => return unknown_session(g, id),
        Err(e) => return group_error(&e),
    };
    let Some(target) = member_url(&host, g, &relayed.segments) else {
        return host_unreachable(g, id, &host, "its URL does not take a path");
    };
    let asked = if relayed.method == reqwest::Method::GET {
        crate::forward::Asked::Read
    } else {
        crate::forward::Asked::Write
    };
    let mut request = forwarder.to_peer(relayed.method, &target);
    if let Some(body) = relayed.body {
        request = request.header(axum::http::header::CONTENT_TYPE, "application/json");
        request = request.body(body);
    }
    match request.timeout(RELAY_TIMEOUT).send().await {
        Ok(answer) => crate::forward::relay(answer, asked).await,
        Err(e) => host_unreachable(g, id, &host, &crate::base::chain(&e)),
    }
}

/// The node hosting session `id` of group `g` as the group's state names it; `None` when the
/// state lists no such session, or names this node (where it ended).
async fn host_of(
    st: &Arc<AppState>,
    g: &ConsumerName,
    id: &str,
) -> Result<Option<String>, GroupError> {
    let (g, id) = (g.clone(), id.to_owned());
    let node = blocking(st, move |store| {
        let stored = store.group(&g)?;
        Ok(stored.and_then(|s| s.state.member(&id).map(|m| m.node.clone())))
    })
    .await?;
    Ok(node.filter(|n| *n != st.groups.node))
}

/// `{host}/v1/groups/{g}/{segments…}`, each segment escaped.
fn member_url(host: &str, g: &ConsumerName, segments: &[String]) -> Option<String> {
    let mut url = reqwest::Url::parse(host).ok()?;
    url.path_segments_mut()
        .ok()?
        .pop_if_empty()
        .extend(["v1", "groups", g.as_str()])
        .extend(segments);
    Some(url.to_string())
}

fn host_unreachable(g: &ConsumerName, id: &str, host: &str, why: &str) -> Response {
    tracing::warn!(group = %g, session = %id, host, "a member's request could not be relayed to the node hosting its session: {why}");
    with_retry_after(error(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::HostUnreachable,
        format!(
            "session {id} of group {g} is hosted by node {host}, which did not answer: {why}; \
             retry. If that node is gone, the session ends after its timeout and its \
             partitions go to the other members: join again"
        ),
    ))
}

/// `POST /v1/groups/{g}/heartbeat`: counted by the node hosting the session (relayed to it by
/// any other node).
pub(super) async fn heartbeat(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (g, s): (_, SessionBody) = match member_request(path, &headers, body) {
        Ok(parsed) => parsed,
        Err(r) => return r,
    };
    match st.groups.session(&g, &s.session) {
        Some((_, session)) => {
            session.beat();
            StatusCode::NO_CONTENT.into_response()
        }
        None => {
            relay_to_host(
                &st,
                &g,
                &s.session,
                &headers,
                Relayed::heartbeat(&s.session),
            )
            .await
        }
    }
}

/// `DELETE /v1/groups/{g}/members/{session}`: the session leaves; its partitions go to the
/// others once its stream stopped delivering them. Relayed to the node hosting the session.
pub(super) async fn leave(
    State(st): State<Arc<AppState>>,
    path: Result<Path<(String, String)>, PathRejection>,
    headers: HeaderMap,
) -> Response {
    let (g, id) = match path {
        Ok(Path((g, id))) => match name("group", &g) {
            Ok(g) => (g, id),
            Err(m) => return bad_request(m),
        },
        Err(e) => return bad_request(e.body_text()),
    };
    match st.groups.session(&g, &id) {
        Some((host, session)) => {
            session.leaving.store(true, Ordering::Release);
            host.wake.notify_one();
            StatusCode::NO_CONTENT.into_response()
        }
        None => {
            let relayed = Relayed {
                method: reqwest::Method::DELETE,
                segments: vec!["members".to_owned(), id.clone()],
                body: None,
            };
            relay_to_host(&st, &g, &id, &headers, relayed).await
        }
    }
}

/// `POST /v1/groups/{g}/commit`: the member's positions, each stored only while its session
/// holds the partition.
pub(super) async fn commit(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let (g, c): (_, CommitBody) = match member_request(path, &headers, body) {
        Ok(parsed) => parsed,
        Err(r) => return r,
    };
    if let Err(r) = check_commit(&c, st.cp.config().partitions) {
        return r;
    }
    match st.groups.session(&g, &c.session) {
        Some((_, session)) => session.beat(),
        // A commit counts as a heartbeat at the node hosting the session, told on the side.
        None if st.cluster.is_some() && !crate::forward::Forwarder::was_forwarded(&headers) => {
            let (st, g, id) = (Arc::clone(&st), g.clone(), c.session.clone());
            tokio::spawn(async move {
                let relayed = Relayed::heartbeat(&id);
                relay_to_host(&st, &g, &id, &HeaderMap::new(), relayed).await
            });
        }
        None => {}
    }
    let mut committed = Vec::new();
    for pos in &c.positions {
        let (g2, id, generation, p, offset) = (
            g.clone(),
            c.session.clone(),
            c.generation,
            pos.partition,
            pos.offset,
        );
        let r = blocking(&st, move |store| {
            store.commit_group_position(&g2, PartitionId(p), &id, generation, offset)
        })
        .await;
        match r {
            Ok(()) => committed.push(*pos),
            Err(e @ GroupError::StaleGeneration { .. }) => {
                tracing::info!(group = %g, session = %c.session, partition = p, "a consumer group commit was refused: the session no longer holds the partition");
                let body = StaleGenerationBody {
                    code: ErrorCode::StaleGeneration,
                    message: e.to_string(),
                    partition: p,
                    committed,
                };
                return (StatusCode::CONFLICT, axum::Json(body)).into_response();
            }
            Err(e) => return group_error(&e),
        }
    }
    axum::Json(committed).into_response()
}

/// A commit's 400 (a malformed body) or 404 (a partition the server does not have).
fn check_commit(c: &CommitBody, partitions: u32) -> Result<(), Response> {
    if c.session.is_empty() {
        return Err(bad_request(
            "`session` is empty: send the session `joined` named",
        ));
    }
    let mut seen = Vec::new();
    for CommitPositionBody { partition, offset } in &c.positions {
        if *partition >= partitions {
            return Err(error(
                StatusCode::NOT_FOUND,
                ErrorCode::NoSuchPartition,
                format!(
                    "partition {partition} does not exist: the server has partitions 0 to {}",
                    partitions - 1
                ),
            ));
        }
        if seen.contains(partition) {
            return Err(bad_request(format!(
                "partition {partition} is committed twice"
            )));
        }
        if *offset > OFFSET_READ_MAX {
            return Err(bad_request(format!(
                "offset {offset} is past every possible end"
            )));
        }
        seen.push(*partition);
    }
    Ok(())
}

/// `GET /v1/groups`.
pub(super) async fn list(State(st): State<Arc<AppState>>) -> Response {
    let listed = blocking(&st, |store| {
        let (names, truncated) = store.group_names(GROUPS_LISTED_MAX)?;
        let mut groups = Vec::with_capacity(names.len());
        for n in names {
            if let Some(g) = store.group(&n)? {
                groups.push(GroupSummaryBody {
                    group: n.to_string(),
                    generation: g.state.generation,
                    members: g.state.members.len(),
                });
            }
        }
        Ok(GroupsBody { groups, truncated })
    })
    .await;
    match listed {
        Ok(body) => axum::Json(body).into_response(),
        Err(e) => group_error(&e),
    }
}

/// `GET /v1/groups/{g}`.
pub(super) async fn show(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let g = match group_path(path) {
        Ok(g) => g,
        Err(r) => return r,
    };
    let read = blocking(&st, {
        let g = g.clone();
        move |store| {
            let Some(stored) = store.group(&g)? else {
                return Ok(None);
            };
            let mut offsets = Vec::with_capacity(stored.state.holders.len());
            for p in 0..stored.state.holders.len() as u32 {
                offsets.push(store.group_position(&g, PartitionId(p))?.0);
            }
            Ok(Some((stored.state, offsets)))
        }
    })
    .await;
    let (state, offsets) = match read {
        Ok(Some(read)) => read,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownGroup,
                format!("there is no group {g}: a member's join creates it"),
            );
        }
        Err(e) => return group_error(&e),
    };
    let mut ends = Vec::with_capacity(offsets.len());
    for p in 0..offsets.len() as u32 {
        ends.push(partition_end(&st, p).await);
    }
    axum::Json(group_body(&g, &state, &offsets, &ends)).into_response()
}

/// The partition's end as its owner knows it; `None` while it cannot be read.
pub(super) async fn partition_end(st: &Arc<AppState>, p: u32) -> Option<u64> {
    consume::page(st, p, OFFSET_READ_MAX, 1, Duration::ZERO)
        .await
        .ok()
        .map(|page| page.end)
}

fn group_body(
    g: &ConsumerName,
    state: &GroupState,
    offsets: &[u64],
    ends: &[Option<u64>],
) -> GroupBody {
    let name_of = |session: &str| state.member(session).map(|m| m.name.clone());
    GroupBody {
        group: g.to_string(),
        generation: state.generation,
        members: state
            .members
            .iter()
            .map(|m| GroupMemberBody {
                member: m.name.clone(),
                session: m.session.clone(),
                node: m.node.clone(),
                session_timeout_ms: m.timeout_ms,
                leaving: m.leaving,
                partitions: state.held_by(&m.session),
            })
            .collect(),
        partitions: state
            .holders
            .iter()
            .enumerate()
            .map(|(p, h)| {
                let (member, st) = match h {
                    Holder::Free => (None, "free"),
                    Holder::Held { session, .. } => (name_of(session), "held"),
                    Holder::Revoking { session, .. } => (name_of(session), "revoking"),
                };
                let end = ends.get(p).copied().flatten();
                let offset = offsets.get(p).copied().unwrap_or(0);
                GroupPartitionBody {
                    partition: p as u32,
                    member,
                    state: st.into(),
                    offset,
                    end,
                    lag: end.map(|e| e.saturating_sub(offset + 1)),
                }
            })
            .collect(),
    }
}

/// `DELETE /v1/groups/{g}`: removes a group that has no member (its positions stay, under the
/// group's name, until `DELETE /v1/consumers/{g}`).
pub(super) async fn delete(
    State(st): State<Arc<AppState>>,
    path: Result<Path<String>, PathRejection>,
) -> Response {
    let g = match group_path(path) {
        Ok(g) => g,
        Err(r) => return r,
    };
    let removed = blocking(&st, {
        let g = g.clone();
        move |store| match store.group(&g)? {
            Some(s) if !s.state.members.is_empty() => Ok(Some(false)),
            Some(_) => store.delete_group(&g).map(|d| d.then_some(true)),
            None => Ok(None),
        }
    })
    .await;
    match removed {
        Ok(Some(true)) => {
            tracing::info!(group = %g, "a consumer group was deleted");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(Some(false)) => error(
            StatusCode::CONFLICT,
            ErrorCode::GroupActive,
            format!("group {g} has members: stop them (or let their sessions expire) first"),
        ),
        Ok(None) => error(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownGroup,
            format!("there is no group {g}"),
        ),
        Err(e) => group_error(&e),
    }
}
