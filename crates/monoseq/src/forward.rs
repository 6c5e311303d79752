//! Any node answers: a command for a partition another node owns is forwarded to that node
//! (or, with `--redirect`, answered with a redirect naming it), so clients can sit behind one
//! load balancer. A forwarded request carries this node's name; a node never forwards a
//! forwarded request again, so a stale view of the owners cannot make requests loop.
//!
//! A forwarded request goes on a pooled connection, which can go silent (the owner's machine
//! lost, its link blackholed) without an error for a long time. So while the owner's answer
//! has not begun, the forwarder checks every [`FORWARD_SILENCE`] that the owner still answers
//! `/healthz` on a new connection within [`LIVENESS_TIMEOUT`] (one check per owner at a time,
//! shared by the requests waiting on it): an owner that does not is answered
//! `owner_unreachable` about a second after the request was sent. A slow command on an owner
//! that answers is never cut short before [`FORWARD_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use monoseq_cp::RETRY_AFTER_SECS;

use axum::body::Bytes;
use monoseq_wire::{BatchAnswerBody, BatchResultBody, ErrorBody, ErrorCode};

use crate::peers::{NODE_TOKEN_HINT, Prober};

/// The header naming the node that forwarded a request.
pub const FORWARDED_BY: &str = "x-monoseq-forwarded-by";
/// Longest wait for the owner's answer. A command is answered once durable, which takes
/// milliseconds, or refused within its storage's connect timeout (5 s by default); an owner
/// that does not answer in this time is treated as gone (`owner_unreachable`, retried with
/// the same idempotency key). It bounds how long a command waits on a connection whose packets
/// vanish (a blackholed link).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for a connection to the owner: peers are near, so an owner whose link drops
/// packets (a blackholed route, a dead machine) is answered `owner_unreachable` in a second,
/// not after the whole [`FORWARD_TIMEOUT`].
const FORWARD_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Idle time before TCP keepalives probe a pooled connection to a peer.
const FORWARD_KEEPALIVE: Duration = Duration::from_secs(5);
/// How long the owner's answer may be in coming before the forwarder checks that the owner
/// still answers at all (and again this often while it waits). Commands are answered in
/// milliseconds; one that takes longer is only checked on, never cut short for it.
const FORWARD_SILENCE: Duration = Duration::from_millis(400);
/// Longest wait for the owner's `/healthz` on a new connection (connection, TLS handshake and
/// answer): peers are near, and a live owner answers it without touching its storage.
const LIVENESS_TIMEOUT: Duration = Duration::from_millis(600);
/// A liveness check of an owner begun this recently is shared by the requests that need one.
const LIVENESS_SHARED: Duration = Duration::from_millis(200);
/// Headers of a command request that go with it to the owner.
const PASSED_ON: [&str; 1] = ["idempotency-key"];
/// Headers of the owner's answer that go back to the client.
const PASSED_BACK: [&str; 3] = ["content-type", "retry-after", "idempotency-replayed"];

/// Sends commands on to the nodes that own their partitions.
pub struct Forwarder {
    client: reqwest::Client,
    /// Page reads relayed to owners, apart from `client`: a followed partition's hub relays
    /// from the followers' lower-priority threads (`edge/lanes.rs`), which drive the
    /// connections it opens, so forwarded commands never share those connections.
    reads: reqwest::Client,
    node_id: HeaderValue,
    redirect: bool,
    /// What this node presents to its peers (`Authorization`), when they require a token.
    authorization: Option<HeaderValue>,
    liveness: Liveness,
}

/// A liveness check's outcome: `Err` says why the owner is taken for gone.
type Check = Shared<BoxFuture<'static, Result<(), Gone>>>;

/// Why an owner is taken for gone: its answer did not begin in time, and it did not answer a
/// liveness check either (the check's error, with its causes).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "its answer did not begin within {silence} ms, and it did not answer /healthz on a new \
     connection within {liveness} ms: {0}",
    silence = FORWARD_SILENCE.as_millis(),
    liveness = LIVENESS_TIMEOUT.as_millis()
)]
struct Gone(String);

/// Checks that owners still answer, on new connections.
struct Liveness {
    /// Keeps no idle connection: every check opens a new one.
    client: reqwest::Client,
    /// The latest check of each owner, with when it began.
    checks: Mutex<HashMap<String, (Instant, Check)>>,
}

impl Liveness {
    /// Whether the owner at `url` answers `/healthz` on a new connection within
    /// [`LIVENESS_TIMEOUT`]; a check begun within [`LIVENESS_SHARED`] is shared.
    async fn check(&self, url: &str) -> Result<(), Gone> {
        let check = {
            let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
            match checks.get(url) {
                Some((began, check)) if began.elapsed() < LIVENESS_SHARED => check.clone(),
                _ => {
                    let request = self.client.get(format!("{url}/healthz")).send();
                    let check = async move {
                        match request.await {
                            Ok(_) => Ok(()),
                            Err(e) => Err(Gone(crate::base::chain(&e))),
                        }
                    }
                    .boxed()
                    .shared();
                    checks.insert(url.to_owned(), (Instant::now(), check.clone()));
                    check
                }
            }
        };
        check.await
    }

    /// Resolves with why once the owner at `url` fails a liveness check made after each
    /// [`FORWARD_SILENCE`] of waiting; never while it answers them.
    async fn gone(&self, url: &str) -> Gone {
        loop {
            tokio::time::sleep(FORWARD_SILENCE).await;
            if let Err(why) = self.check(url).await {
                return why;
            }
        }
    }
}

impl Forwarder {
    /// A forwarder for node `node_id`; `redirect` answers with a redirect instead. It presents
    /// `authorization` to its peers and, over HTTPS, trusts the CA certificates of
    /// `peer_ca` (the system's without it).
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (its TLS roots).
    pub fn new(
        node_id: &str,
        redirect: bool,
        authorization: Option<HeaderValue>,
        peer_ca: Option<&std::path::Path>,
    ) -> anyhow::Result<Forwarder> {
        // Without trusted roots (no CA given and none on the system) only plain HTTP peers
        // are reachable.
        let tls = crate::tls::client_config(peer_ca)
            .ok()
            .map(std::sync::Arc::unwrap_or_clone);
        let with_tls = |builder: reqwest::ClientBuilder| match &tls {
            Some(tls) => builder.tls_backend_preconfigured(tls.clone()),
            None => builder,
        };
        let peers = || {
            with_tls(
                reqwest::Client::builder()
                    .timeout(FORWARD_TIMEOUT)
                    .connect_timeout(FORWARD_CONNECT_TIMEOUT)
                    .tcp_keepalive(FORWARD_KEEPALIVE)
                    // Let go before the peer's idle timeout closes it (`edge.rs`).
                    .pool_idle_timeout(monoseq_client::IDLE_TIMEOUT_DEFAULT),
            )
        };
        let fresh = with_tls(
            reqwest::Client::builder()
                .timeout(LIVENESS_TIMEOUT)
                .pool_max_idle_per_host(0),
        );
        Ok(Forwarder {
            client: peers().build()?,
            reads: peers().build()?,
            node_id: HeaderValue::from_str(node_id)?,
            redirect,
            authorization,
            liveness: Liveness {
                client: fresh.build()?,
                checks: Mutex::new(HashMap::new()),
            },
        })
    }

    /// A prober of other nodes' readiness and marks with this forwarder's client and token.
    #[must_use]
    pub fn prober(&self) -> Prober {
        Prober::new(self.client.clone(), self.authorization.clone())
    }

    /// Whether this request was already forwarded by a node.
    #[must_use]
    pub fn was_forwarded(headers: &HeaderMap) -> bool {
        headers.contains_key(FORWARDED_BY)
    }

    /// The answer of the node at `url` to a command (or a redirect to it): its `body` is
    /// relayed as the client sent it, not parsed and written again.
    pub async fn command(&self, url: &str, body: Bytes, headers: &HeaderMap) -> Response {
        let target = format!("{url}/v1/commands");
        if self.redirect {
            return redirect(&target);
        }
        let mut request = self
            .client
            .post(&target)
            .header(FORWARDED_BY, self.node_id.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
        for name in PASSED_ON {
            if let Some(v) = headers.get(name) {
                request = request.header(name, v.clone());
            }
        }
        if let Some(auth) = &self.authorization {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        self.send(url, request).await
    }

    /// The owner's relayed answer to `request`, or `owner_unreachable` when it fails, or when
    /// the owner stops answering liveness checks while the answer has not begun.
    async fn send(&self, url: &str, request: reqwest::RequestBuilder) -> Response {
        tokio::select! {
            sent = request.send() => match sent {
                Ok(answer) => relay(answer, Asked::Write).await,
                Err(e) => owner_unreachable(url, &crate::base::chain(&e), Asked::Write),
            },
            why = self.liveness.gone(url) => {
                owner_unreachable(url, &why.to_string(), Asked::Write)
            }
        }
    }

    /// A request to a peer (`target`: its full URL) as this node sends them, marked as
    /// forwarded and with this node's token: a consumer group member's request relayed to the
    /// node hosting its session. Its answer goes back through `relay`.
    pub fn to_peer(&self, method: reqwest::Method, target: &str) -> reqwest::RequestBuilder {
        let request = self.client.request(method, target);
        let request = request.header(FORWARDED_BY, self.node_id.clone());
        match &self.authorization {
            Some(auth) => request.header(header::AUTHORIZATION, auth.clone()),
            None => request,
        }
    }

    /// The owner's JSON answer to a read (`target`: its full URL), which may take `timeout`
    /// (a long poll); a refusal of the owner comes back as its answer, unchanged.
    ///
    /// # Errors
    ///
    /// As [`Forwarder::read_raw`], and `owner_unreachable` for a body that is not a `T`.
    pub async fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        target: &str,
        timeout: Duration,
    ) -> Result<T, Response> {
        let bytes = self.read_raw(target, None, timeout).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            crate::base::error(
                StatusCode::BAD_GATEWAY,
                ErrorCode::OwnerUnreachable,
                format!("the partition's owner answered a read with an unexpected body: {e}"),
            )
        })
    }

    /// The body of the owner's successful answer to a read (`target`: its full URL), as it
    /// came (in the media type `accept` names, JSON when `None`): a node that only passes a
    /// page on neither decodes nor encodes it.
    ///
    /// # Errors
    ///
    /// The answer to give the reader: the owner's own error answer, `owner_unreachable`, or
    /// `node_unauthorized` when the owner refused this node's token.
    pub async fn read_raw(
        &self,
        target: &str,
        accept: Option<&'static str>,
        timeout: Duration,
    ) -> Result<Bytes, Response> {
        let mut request = self
            .reads
            .get(target)
            .timeout(timeout)
            .header(FORWARDED_BY, self.node_id.clone());
        if let Some(accept) = accept {
            request = request.header(header::ACCEPT, accept);
        }
        if let Some(auth) = &self.authorization {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        let answer = match request.send().await {
            Ok(answer) => answer,
            Err(e) => {
                return Err(owner_unreachable(
                    target,
                    &crate::base::chain(&e),
                    Asked::Read,
                ));
            }
        };
        if !answer.status().is_success() {
            return Err(relay(answer, Asked::Read).await);
        }
        answer
            .bytes()
            .await
            .map_err(|e| owner_unreachable(target, &crate::base::chain(&e), Asked::Read))
    }

    /// The answer of the node at `url` to a batch whose `body` (`{"commands":[…]}`) is relayed
    /// as given.
    ///
    /// # Errors
    ///
    /// The result every command of the batch gets when the owner did not answer with results:
    /// `owner_unreachable` (the commands may have run: retry them with their keys),
    /// `node_unauthorized`, or the owner's own refusal of the whole batch.
    pub async fn batch(&self, url: &str, body: Bytes) -> Result<BatchAnswerBody, BatchResultBody> {
        let mut request = self
            .client
            .post(format!("{url}/v1/commands/batch"))
            .header(FORWARDED_BY, self.node_id.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(auth) = &self.authorization {
            request = request.header(header::AUTHORIZATION, auth.clone());
        }
        let answer = self.send(url, request).await;
        batch_results(answer).await
    }
}

/// The results of a relayed batch's answer, or what every command gets when it has none.
async fn batch_results(answer: Response) -> Result<BatchAnswerBody, BatchResultBody> {
    let status = answer.status();
    let retry_after = answer
        .headers()
        .get(header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    if status.is_success()
        && let Ok(results) = serde_json::from_slice::<BatchAnswerBody>(&body)
    {
        return Ok(results);
    }
    let error = serde_json::from_slice::<ErrorBody>(&body).unwrap_or_else(|_| ErrorBody {
        code: ErrorCode::OwnerUnreachable,
        message: format!(
            "the node owning the partition answered {status} without results; whether the \
             commands ran is unknown: retry them with their idempotency keys"
        ),
        key: None,
        current_wlog_offset: None,
    });
    Err(BatchResultBody::refused(
        status.as_u16(),
        error,
        retry_after,
    ))
}

fn redirect(target: &str) -> Response {
    match HeaderValue::from_str(target) {
        Ok(location) => {
            let mut r = StatusCode::TEMPORARY_REDIRECT.into_response();
            r.headers_mut().insert(header::LOCATION, location);
            r
        }
        Err(_) => crate::base::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            "the owner's URL is not a valid header value",
        ),
    }
}

/// Owners' refusals of this node's token: logged at most once per [`REFUSAL_LOG_INTERVAL`]
/// (a live tail's hub asks its owner again every 200 ms while it is refused).
static REFUSALS: crate::base::LogThrottle = crate::base::LogThrottle::new(REFUSAL_LOG_INTERVAL);
/// At most one line per this interval about the owners' refusals of this node's token.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What a relayed request asked of the owner, so that its failures say what became of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A command, a batch or a consumer group's call: something to write.
    Write,
    /// A read: a page, a stream's start, a consumer's position.
    Read,
}

impl Asked {
    /// What a refused request left behind, and what to do.
    fn refused(self) -> &'static str {
        match self {
            Asked::Write => "nothing was written",
            Asked::Read => "nothing was read; read through another node meanwhile",
        }
    }

    /// What to do when the owner did not answer.
    fn retry(self) -> &'static str {
        match self {
            Asked::Write => {
                "retry (with the same Idempotency-Key, the command is applied at most once)"
            }
            Asked::Read => "retry the read",
        }
    }
}

/// The owner's answer, status, body and the headers a client needs, unchanged; but the
/// owner refusing this node's own token is this node's misconfiguration, not the client's.
pub(crate) async fn relay(answer: reqwest::Response, asked: Asked) -> Response {
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        if let Some(refusals) = REFUSALS.note() {
            tracing::error!(
                status = status.as_u16(),
                refusals,
                "the partition's owner refused this node's token; {}: {NODE_TOKEN_HINT}",
                asked.refused()
            );
        }
        return crate::base::error(
            StatusCode::BAD_GATEWAY,
            ErrorCode::NodeUnauthorized,
            format!(
                "the node owning the partition refused this node's token (a configuration \
                 error of the cluster); {}",
                asked.refused()
            ),
        );
    }
    let mut headers = HeaderMap::new();
    for name in PASSED_BACK {
        if let Some(v) = answer.headers().get(name)
            && let Ok(v) = HeaderValue::from_bytes(v.as_bytes())
        {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    match answer.bytes().await {
        Ok(body) => {
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            *r.headers_mut() = headers;
            r
        }
        Err(e) => owner_unreachable("the owner", &crate::base::chain(&e), asked),
    }
}

/// The owner could not be reached or did not answer in time (`why`). A command may have been
/// applied if the request reached it: a retry with the same `Idempotency-Key` is safe.
fn owner_unreachable(url: &str, why: &str, asked: Asked) -> Response {
    match asked {
        Asked::Write => tracing::warn!(owner = %url, "forwarding a command failed: {why}"),
        Asked::Read => tracing::warn!(owner = %url, "relaying a read failed: {why}"),
    }
    let mut r = crate::base::error(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::OwnerUnreachable,
        format!(
            "the node owning the partition ({url}) did not answer: {why}; {}",
            asked.retry()
        ),
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error body of `answer`.
    async fn error_body(answer: Response) -> ErrorBody {
        let body = axum::body::to_bytes(answer.into_body(), usize::MAX)
            .await
            .expect("the body");
        serde_json::from_slice(&body).expect("an error body")
    }

    /// An owner refusing this node's token is a 502 `node_unauthorized` whose message says
    /// what became of the request: nothing written for a write, nothing read for a read
    /// (whose client has nothing to retry with a key); an owner not answering says how to
    /// retry each.
    #[tokio::test]
    async fn a_relayed_failure_says_what_became_of_a_write_and_of_a_read() {
        for (asked, says, never) in [
            (Asked::Write, "nothing was written", "nothing was read"),
            (Asked::Read, "nothing was read", "nothing was written"),
        ] {
            let refusal = axum::http::Response::builder()
                .status(StatusCode::UNAUTHORIZED)
                .body("refused")
                .expect("a response");
            let answer = relay(reqwest::Response::from(refusal), asked).await;
            assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
            let body = error_body(answer).await;
            assert_eq!(body.code, ErrorCode::NodeUnauthorized);
            assert!(body.message.contains(says), "{asked:?}: {}", body.message);
            assert!(!body.message.contains(never), "{asked:?}: {}", body.message);
        }
        let read = error_body(owner_unreachable("http://b", "refused", Asked::Read)).await;
        assert!(read.message.ends_with("retry the read"), "{}", read.message);
        let write = error_body(owner_unreachable("http://b", "refused", Asked::Write)).await;
        assert!(
            write.message.contains("Idempotency-Key"),
            "{}",
            write.message
        );
    }

    /// A node at `127.0.0.1:<port>` answering `/healthz` at once and every command after
    /// `delay`.
    async fn slow_owner(delay: Duration) -> String {
        let app = axum::Router::new()
            .route("/healthz", axum::routing::get(|| async { "ok" }))
            .route(
                "/v1/commands",
                axum::routing::post(move || async move {
                    tokio::time::sleep(delay).await;
                    "{}"
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn forwarder() -> Forwarder {
        Forwarder::new("n1", false, None, None).expect("a forwarder")
    }

    #[tokio::test]
    async fn a_slow_command_on_an_owner_that_answers_is_relayed_not_cut_short() {
        let slow = FORWARD_SILENCE * 5;
        let url = slow_owner(slow).await;
        let began = Instant::now();
        let answer = forwarder()
            .command(&url, Bytes::from_static(b"{}"), &HeaderMap::new())
            .await;
        assert_eq!(answer.status(), StatusCode::OK);
        assert!(began.elapsed() >= slow);
    }

    #[tokio::test]
    async fn an_owner_that_accepts_connections_but_never_answers_is_unreachable_long_before_the_forward_timeout()
     {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        // Accepts every connection and never answers on any.
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let began = Instant::now();
        let answer = forwarder()
            .command(&url, Bytes::from_static(b"{}"), &HeaderMap::new())
            .await;
        let waited = began.elapsed();
        assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = error_body(answer).await;
        assert_eq!(body.code, ErrorCode::OwnerUnreachable);
        assert!(body.message.contains("/healthz"), "{}", body.message);
        // About a second (the silence, then the liveness check's timeout), with slack for a
        // loaded machine; without the liveness check it is the whole forward timeout (10 s).
        assert!(
            waited >= FORWARD_SILENCE && waited < FORWARD_TIMEOUT / 3,
            "answered after {waited:?}"
        );
    }
}
