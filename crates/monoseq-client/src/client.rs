//! [`Client`]: commands sent to their partition's owner and retried safely, and the reads.
//! One attempt is [`Client::send`]; what follows an answer (done, fail, retry after how long,
//! through which node) is decided in [`Client::submit_with_key`] and [`Client::read`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::Stream;
use monoseq_backoff::Backoff;
use monoseq_wire::{
    BackupBody, BackupRequestBody, ClusterBody, CommandBody, ErrorBody, ErrorCode, EventBody,
    IDEMPOTENCY_KEY, IDEMPOTENCY_REPLAYED, InfoBody, OutcomeBody, RecordBody, WlogPageBody,
};
use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;

use crate::error::ClientError;
use crate::routing::View;

/// Redirects followed in a row without waiting; past it each waits a backoff delay, so two
/// nodes with stale views cannot bounce a command quickly forever.
const REDIRECTS_UNDELAYED_MAX: u32 = 3;
/// The codes of a 503 that mean "another node owns it now": the view is refreshed and the
/// command retried without waiting for `Retry-After`, which advised retrying the same node.
pub(crate) const MOVED_CODES: [ErrorCode; 3] = [
    ErrorCode::NotOwner,
    ErrorCode::PartitionUnavailable,
    ErrorCode::OwnerUnreachable,
];

/// The longest [`Client::backup`] waits for its answer: the copy of a whole store.
pub const BACKUP_TIMEOUT: Duration = Duration::from_secs(3600);

/// A client of one monoseq server or of a cluster of nodes. Cheap to clone (shared
/// connections and view of the owners).
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

/// The failures in a row of a long-lived stream (a tail, a group member's session): when they
/// began and how many, against the client's retry timeout.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    since: Option<Instant>,
    failures: u32,
}

impl Outage {
    /// Counts one more failure: the wait before the next attempt (at least `floor`, the
    /// server's `Retry-After`), or `None` once the outage would outlast the retry timeout.
    pub(crate) fn next_wait(&mut self, inner: &Inner, floor: Option<Duration>) -> Option<Duration> {
        let since = *self.since.get_or_insert_with(Instant::now);
        self.failures += 1;
        let wait = floor.unwrap_or_default() + inner.backoff.jittered(self.failures);
        (since.elapsed() + wait <= inner.retry_timeout).then_some(wait)
    }

    /// The failures in a row so far (1: the outage just began).
    pub(crate) fn failures(&self) -> u32 {
        self.failures
    }

    /// Ends the outage: the next one gets a retry timeout of its own. `true` if there was one.
    pub(crate) fn end(&mut self) -> bool {
        self.failures = 0;
        self.since.take().is_some()
    }
}

pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    pub(crate) view: View,
    pub(crate) sequences: crate::SequencesClient,
    pub(crate) request_timeout: Duration,
    pub(crate) retry_timeout: Duration,
    pub(crate) backoff: Backoff,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("nodes", &self.inner.view.candidates())
            .finish_non_exhaustive()
    }
}

/// A command's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The partition, offsets and real IDs.
    pub outcome: OutcomeBody,
    /// The server answered from the original event of this key (an earlier attempt, or an
    /// earlier call with the same key, was applied).
    pub replayed: bool,
    /// The `Idempotency-Key` every attempt carried.
    pub key: String,
    /// Attempts made (1 when the first was answered).
    pub attempts: u32,
}

/// One attempt's answer, what the decisions need of it.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) retry_after: Option<Duration>,
    location: Option<String>,
    replayed: bool,
    pub(crate) body: bytes::Bytes,
}

impl Answer {
    pub(crate) fn error(&self) -> ClientError {
        match serde_json::from_slice::<ErrorBody>(&self.body) {
            Ok(e) => ClientError::of_body(self.status.as_u16(), e),
            Err(_) => ClientError::Protocol(format!(
                "status {} without an error body: {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )),
        }
    }

    pub(crate) fn decode<T: DeserializeOwned>(&self) -> Result<T, ClientError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            ClientError::Protocol(format!(
                "status {}, body not as documented ({e}): {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            ))
        })
    }
}

impl Client {
    /// Named sequences on the same server (`next`, `reserve` through a
    /// `monoseq_named::Reserver`, `get`, …), with this client's token, TLS and timeouts.
    #[must_use]
    pub fn sequences(&self) -> &crate::SequencesClient {
        &self.inner.sequences
    }

    /// Submits `command` with a fresh `Idempotency-Key`, retried with that key until it is
    /// answered or `retry_timeout` passes.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] for a refusal (the README's codes), or the last 503 once the
    /// retries ran out of time; [`ClientError::Transport`] when the last attempt got no
    /// answer (the command may have been applied: resend with the same key).
    pub async fn submit(&self, command: &CommandBody) -> Result<Submitted, ClientError> {
        self.submit_with_key(command, &crate::key::new_idempotency_key())
            .await
    }

    /// Submits `command` with the caller's `key`: a retry of a call whose outcome is unknown
    /// (same key, same body) is applied at most once and answered like the original.
    ///
    /// # Errors
    ///
    /// As [`Client::submit`].
    pub async fn submit_with_key(
        &self,
        command: &CommandBody,
        key: &str,
    ) -> Result<Submitted, ClientError> {
        self.submit_as(command, Some(key)).await
    }

    /// Submits `command` without an `Idempotency-Key` (what keys cost can be measured so; see
    /// `monoseq bench --idempotency-keys`). Retried only after answers that say nothing was
    /// applied (a 503 other than `owner_unreachable`, a redirect, a refused connection); an
    /// attempt that got no answer is returned, since sending it again could apply it twice.
    /// [`Submitted::key`] is empty.
    ///
    /// # Errors
    ///
    /// As [`Client::submit`].
    pub async fn submit_unkeyed(&self, command: &CommandBody) -> Result<Submitted, ClientError> {
        self.submit_as(command, None).await
    }

    async fn submit_as(
        &self,
        command: &CommandBody,
        key: Option<&str>,
    ) -> Result<Submitted, ClientError> {
        let body = bytes::Bytes::from(
            serde_json::to_vec(command).map_err(|e| ClientError::Protocol(e.to_string()))?,
        );
        let started = Instant::now();
        let partition = self.partition_of(command.ws).await;
        let (mut attempts, mut failures, mut redirects) = (0u32, 0u32, 0u32);
        let mut via: Option<String> = None;
        loop {
            let node = via
                .take()
                .unwrap_or_else(|| self.inner.view.node_for(partition));
            attempts += 1;
            let sent = self
                .send(
                    Method::POST,
                    &format!("{node}/v1/commands"),
                    Some((&body, key)),
                )
                .await;
            let (error, floor) = match self.judge_command(sent, partition, &node).await {
                Judged::Final(answer) => {
                    let (outcome, replayed) = answer?;
                    return Ok(Submitted {
                        outcome,
                        replayed,
                        key: key.unwrap_or_default().to_owned(),
                        attempts,
                    });
                }
                Judged::Redirected { owner, error } => {
                    via = Some(owner);
                    redirects += 1;
                    if redirects <= REDIRECTS_UNDELAYED_MAX {
                        continue;
                    }
                    (error, Duration::ZERO)
                }
                Judged::Retry { error, floor } => (error, floor),
            };
            if key.is_none() && maybe_applied(&error) {
                return Err(error);
            }
            failures += 1;
            self.wait_or_fail(started, floor, failures, error).await?;
        }
    }

    /// What one attempt's answer to a command of `partition` sent to `node` means; learns
    /// from it who owns the partition and which nodes are down.
    async fn judge_command(
        &self,
        sent: Result<Answer, reqwest::Error>,
        partition: Option<u32>,
        node: &str,
    ) -> Judged {
        match sent {
            Ok(a) if a.status.is_success() => Judged::Final(a.decode().map(|o| (o, a.replayed))),
            Ok(a) if a.status == StatusCode::TEMPORARY_REDIRECT => {
                let Some(owner) = a.location.as_deref().and_then(owner_of) else {
                    return Judged::Final(Err(ClientError::Protocol(
                        "a 307 without a Location".into(),
                    )));
                };
                if let Some(p) = partition {
                    self.inner.view.learn_owner(p, owner);
                }
                Judged::Redirected {
                    owner: owner.to_owned(),
                    error: a.error_or_redirect(),
                }
            }
            Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => {
                let error = a.error();
                if MOVED_CODES.contains(&error.code()) {
                    if let Some(p) = partition {
                        self.inner.view.forget_owner(p);
                    }
                    self.refresh_after_move().await;
                    Judged::Retry {
                        error,
                        floor: Duration::ZERO,
                    }
                } else {
                    let floor = a.retry_after.unwrap_or_default();
                    Judged::Retry { error, floor }
                }
            }
            Ok(a) => Judged::Final(Err(a.error())),
            Err(e) => {
                if e.is_connect() {
                    self.inner.view.forget_node(node);
                    let _ = self.refresh().await;
                }
                Judged::Retry {
                    error: ClientError::Transport(e),
                    floor: Duration::ZERO,
                }
            }
        }
    }

    /// The event at `plog_offset` of `partition`; `None` when there is none (yet).
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] (`no_such_partition`, `corrupted`, a 503 past the retries),
    /// [`ClientError::Transport`].
    pub async fn event(
        &self,
        partition: u32,
        plog_offset: u64,
    ) -> Result<Option<EventBody>, ClientError> {
        self.read(&format!("/v1/partitions/{partition}/events/{plog_offset}"))
            .await
    }

    /// The record `id` of workspace `ws`; `None` when there is none.
    ///
    /// # Errors
    ///
    /// As [`Client::event`].
    pub async fn record(&self, ws: u64, id: u64) -> Result<Option<RecordBody>, ClientError> {
        self.read(&format!("/v1/workspaces/{ws}/records/{id}"))
            .await
    }

    /// At most `limit` (1 to [`monoseq_wire::WLOG_PAGE_MAX`]) events of workspace `ws`'s WLog
    /// from offset `from` (1 is the first); fewer at its end.
    ///
    /// # Errors
    ///
    /// As [`Client::event`]; `bad_request` for a `limit` out of range or `from` 0.
    pub async fn wlog_page(
        &self,
        ws: u64,
        from: u64,
        limit: usize,
    ) -> Result<Vec<EventBody>, ClientError> {
        let page: Option<WlogPageBody> = self
            .read(&format!(
                "/v1/workspaces/{ws}/wlog?from={from}&limit={limit}"
            ))
            .await?;
        Ok(page.map(|p| p.events).unwrap_or_default())
    }

    /// Workspace `ws`'s WLog from offset `from` as a stream of pages of at most `limit`
    /// events, ending at the WLog's end as it is when read (consume it with
    /// `futures_util::TryStreamExt::try_next`).
    pub fn wlog(
        &self,
        ws: u64,
        from: u64,
        limit: usize,
    ) -> impl Stream<Item = Result<Vec<EventBody>, ClientError>> + Send + 'static {
        let state = Some((self.clone(), from));
        futures_util::stream::try_unfold(state, move |state| async move {
            let Some((client, from)) = state else {
                return Ok(None);
            };
            let events = client.wlog_page(ws, from, limit).await?;
            let next = match events.last() {
                Some(last) if events.len() == limit => Some((client, last.wlog_offset + 1)),
                Some(_) => None,
                None => return Ok(None),
            };
            Ok(Some((events, next)))
        })
    }

    /// `GET /v1/info` of a node: version, partitions, trust level, storage.
    ///
    /// # Errors
    ///
    /// As [`Client::event`].
    pub async fn info(&self) -> Result<InfoBody, ClientError> {
        let info: Option<InfoBody> = self.read("/v1/info").await?;
        let info = info.ok_or_else(|| ClientError::Protocol("/v1/info answered 404".into()))?;
        self.inner.view.set_partitions(info.partitions);
        Ok(info)
    }

    /// `GET /v1/cluster` of a node: the nodes and each partition's owner.
    ///
    /// # Errors
    ///
    /// As [`Client::event`].
    pub async fn cluster(&self) -> Result<ClusterBody, ClientError> {
        let cluster: Option<ClusterBody> = self.read("/v1/cluster").await?;
        cluster.ok_or_else(|| ClientError::Protocol("/v1/cluster answered 404".into()))
    }

    /// `POST /v1/admin/backup` of a node the client was given (a backup is of one machine:
    /// build the client with that server's URL alone): the server copies its embedded store
    /// into `to`, a new directory on its machine under its `--backup-root`.
    /// Needs an admin token (`ClientBuilder::token`). One attempt, waiting at most
    /// [`BACKUP_TIMEOUT`]: a backup is not retried, since its directory exists after the
    /// first.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] with the server's refusal: 403 `forbidden` (not an admin token),
    /// `admin_on_loopback_off` or `backups_disabled`; 400 naming the rule the path breaks
    /// (`backup_path_outside_root`, `backup_path_exists`, …); 409 `backup_running`; 500
    /// `backup_failed`. [`ClientError::Transport`] when no answer came.
    pub async fn backup(&self, to: &str) -> Result<BackupBody, ClientError> {
        let body = serde_json::to_vec(&BackupRequestBody { to: to.to_owned() })
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let node = self
            .inner
            .view
            .candidates()
            .into_iter()
            .next()
            .ok_or_else(|| ClientError::Config("no node to ask".into()))?;
        let url = format!("{node}/v1/admin/backup");
        let began = Instant::now();
        let response = self
            .inner
            .http
            .post(&url)
            .timeout(BACKUP_TIMEOUT)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(ClientError::Transport)?;
        let status = response.status();
        let body = response.bytes().await.map_err(ClientError::Transport)?;
        tracing::debug!(
            url,
            status = status.as_u16(),
            elapsed_ms = began.elapsed().as_secs_f64() * 1e3,
            "answered"
        );
        let answer = Answer {
            status,
            retry_after: None,
            location: None,
            replayed: false,
            body,
        };
        if status.is_success() {
            answer.decode()
        } else {
            Err(answer.error())
        }
    }

    /// The node a command of workspace `ws` goes to now: its partition's owner as last seen
    /// (the view is fetched first when it names no owner yet or has grown old), or a node
    /// the client was given while no owner is known. To batch by owner: the commands of one
    /// node travel as one request of [`Client::submit_batch`].
    pub async fn node_of(&self, ws: u64) -> String {
        if self.inner.view.stale(Instant::now()) {
            let _ = self.refresh().await;
        }
        let view = &self.inner.view;
        view.node_for(view.partition_of(ws))
    }

    /// Learns the partition count and every partition's owner now (a client also does it on
    /// its own when a command meets a moved partition or a refused connection).
    ///
    /// # Errors
    ///
    /// The last node's error when none answered.
    pub async fn refresh(&self) -> Result<(), ClientError> {
        if self.inner.view.claim_refresh(Instant::now()).is_err() {
            return Ok(());
        }
        self.fetch_view().await
    }

    /// The refresh after an answer saying the partition moved. When the last refresh was
    /// within [`crate::routing::REFRESH_INTERVAL_MIN`], it waits until the next is allowed
    /// rather than skip it: retried without a new view, the command would only go back to
    /// the node that refused it, and the backoff between those attempts would grow.
    pub(crate) async fn refresh_after_move(&self) {
        if let Err(allowed) = self.inner.view.claim_refresh(Instant::now()) {
            let wait = allowed.saturating_duration_since(Instant::now());
            tracing::debug!(
                wait_ms = wait.as_secs_f64() * 1e3,
                "the partition moved: waiting for the next allowed refresh of the view"
            );
            tokio::time::sleep(wait).await;
            // Another call may have refreshed meanwhile; its view serves this one too.
            if self.inner.view.claim_refresh(Instant::now()).is_err() {
                return;
            }
        }
        let _ = self.fetch_view().await;
    }

    /// Fetches the partition count (when unknown) and the owners from the first node that
    /// answers; the refresh is already claimed.
    async fn fetch_view(&self) -> Result<(), ClientError> {
        let mut last = ClientError::Config("no node to ask".into());
        for node in self.inner.view.candidates() {
            if self.inner.view.partitions().is_none() {
                match self.get_once::<InfoBody>(&node, "/v1/info").await {
                    Ok(info) => self.inner.view.set_partitions(info.partitions),
                    Err(e) => {
                        last = e;
                        continue;
                    }
                }
            }
            match self.get_once::<ClusterBody>(&node, "/v1/cluster").await {
                Ok(cluster) => {
                    self.inner.view.apply(&cluster, &node);
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The partition of `ws`, learning the partition count first if needed (`None` when no
    /// node told it: the command then goes to a seed, which forwards it).
    async fn partition_of(&self, ws: u64) -> Option<u32> {
        if self.inner.view.stale(Instant::now()) {
            let _ = self.refresh().await;
        }
        self.inner.view.partition_of(ws)
    }

    /// A GET that any node answers, retried like a command; 404 `not_found` and
    /// `unknown_record` are `None`.
    pub(crate) async fn read<T: DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<Option<T>, ClientError> {
        let started = Instant::now();
        let mut failures = 0u32;
        loop {
            let node = self.inner.view.any_node();
            let (error, floor) = match self.send(Method::GET, &format!("{node}{path}"), None).await
            {
                Ok(a) if a.status.is_success() => return a.decode().map(Some),
                Ok(a) if a.status == StatusCode::SERVICE_UNAVAILABLE => {
                    (a.error(), a.retry_after.unwrap_or_default())
                }
                Ok(a) => {
                    let error = a.error();
                    return match error.code() {
                        ErrorCode::NotFound | ErrorCode::UnknownRecord => Ok(None),
                        _ => Err(error),
                    };
                }
                Err(e) => {
                    if e.is_connect() {
                        self.inner.view.forget_node(&node);
                    }
                    (ClientError::Transport(e), Duration::ZERO)
                }
            };
            failures += 1;
            self.wait_or_fail(started, floor, failures, error).await?;
        }
    }

    /// One GET of `node`, no retry (for refreshing the view).
    async fn get_once<T: DeserializeOwned>(
        &self,
        node: &str,
        path: &str,
    ) -> Result<T, ClientError> {
        let a = self
            .send(Method::GET, &format!("{node}{path}"), None)
            .await
            .map_err(ClientError::Transport)?;
        if a.status.is_success() {
            a.decode()
        } else {
            Err(a.error())
        }
    }

    /// Sleeps before the next attempt — at least `floor` (the server's `Retry-After`), plus a
    /// jittered backoff delay — or answers `error` when that would pass `retry_timeout`.
    pub(crate) async fn wait_or_fail(
        &self,
        started: Instant,
        floor: Duration,
        failures: u32,
        error: ClientError,
    ) -> Result<(), ClientError> {
        let wait = floor + self.inner.backoff.jittered(failures);
        if started.elapsed() + wait > self.inner.retry_timeout {
            tracing::debug!(failures, %error, "giving up: the next attempt would pass the retry timeout");
            return Err(error);
        }
        tracing::debug!(failures, wait_ms = wait.as_secs_f64() * 1e3, %error, "retrying after a wait");
        tokio::time::sleep(wait).await;
        Ok(())
    }

    /// One attempt: the answer whole, or the transport's error. Logged at debug level with
    /// its time, so a slow or failing call shows where its time went.
    pub(crate) async fn send(
        &self,
        method: Method,
        url: &str,
        command: Option<(&bytes::Bytes, Option<&str>)>,
    ) -> Result<Answer, reqwest::Error> {
        let began = Instant::now();
        let sent = self.send_once(method.clone(), url, command).await;
        let elapsed_ms = began.elapsed().as_secs_f64() * 1e3;
        match &sent {
            Ok(a) => {
                tracing::debug!(%method, url, status = a.status.as_u16(), elapsed_ms, "answered")
            }
            Err(e) => tracing::debug!(%method, url, error = %e, elapsed_ms, "no answer"),
        }
        sent
    }

    async fn send_once(
        &self,
        method: Method,
        url: &str,
        command: Option<(&bytes::Bytes, Option<&str>)>,
    ) -> Result<Answer, reqwest::Error> {
        let mut request = self
            .inner
            .http
            .request(method, url)
            .timeout(self.inner.request_timeout);
        if let Some((body, key)) = command {
            request = request
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(key) = key {
                request = request.header(IDEMPOTENCY_KEY, key);
            }
        }
        let response = request.send().await?;
        let headers = response.headers();
        let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
        let retry_after = text(header::RETRY_AFTER.as_str())
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let location = text(header::LOCATION.as_str()).map(str::to_owned);
        let replayed = text(IDEMPOTENCY_REPLAYED) == Some("true");
        let status = response.status();
        let body = response.bytes().await?;
        Ok(Answer {
            status,
            retry_after,
            location,
            replayed,
            body,
        })
    }
}

impl Answer {
    /// A redirect past the undelayed ones, as the error returned if time runs out.
    fn error_or_redirect(&self) -> ClientError {
        ClientError::Api {
            status: self.status.as_u16(),
            code: ErrorCode::Redirect,
            message: format!(
                "redirected {} times in a row, last to {}",
                REDIRECTS_UNDELAYED_MAX + 1,
                self.location.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// What one attempt's answer to a command means.
enum Judged {
    /// The command's answer, returned as it is: its outcome and whether it was replayed, or a
    /// refusal.
    Final(Result<(OutcomeBody, bool), ClientError>),
    /// Another node owns the partition: send the command there (`error` if it keeps
    /// redirecting).
    Redirected { owner: String, error: ClientError },
    /// Retry after waiting at least `floor`, or answer `error` when out of time.
    Retry { error: ClientError, floor: Duration },
}

/// Whether the command that failed with `error` may have been applied: then a command without
/// an `Idempotency-Key` is not sent again, since that could apply it twice.
fn maybe_applied(error: &ClientError) -> bool {
    match error {
        ClientError::Api { code, .. } => *code == ErrorCode::OwnerUnreachable,
        ClientError::Transport(t) => !t.is_connect(),
        _ => false,
    }
}

/// The node's base URL of a redirect to its `…/v1/commands`.
fn owner_of(location: &str) -> Option<&str> {
    location
        .strip_suffix("/v1/commands")
        .filter(|base| base.starts_with("http://") || base.starts_with("https://"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_redirect_names_its_node() {
        assert_eq!(
            super::owner_of("http://127.0.0.1:9/v1/commands"),
            Some("http://127.0.0.1:9")
        );
        assert_eq!(super::owner_of("/v1/commands"), None);
    }
}
