//! [`SequencesClient`]: the named-sequence operations over the HTTP API
//! (`/v1/sequences/…`, served by `monoseq-named-http`), for the `monoseq seq` command, for
//! other processes and for the tests. Owns the request building and the decoding of answers
//! and `{"code", "message"}` errors, with `monoseq-wire`'s bodies. A client is also a
//! [`BlockSource`], so a [`monoseq_named::Reserver`] can take its blocks through a server.

use std::time::Duration;

use serde::de::DeserializeOwned;

use monoseq_named::{
    Address, BlockSource, BoxFuture, NextError, NextOptions, SequenceData, SetOptions, StorageError,
};
use monoseq_wire::{
    Checked, ErrorBody, ErrorCode, NextRequestBody, ResetRequestBody, SequenceExistsBody,
    SequenceValueBody,
};

/// Time a named-sequence request may take beyond the operation's own timeout.
pub const SEQUENCES_GRACE: Duration = Duration::from_secs(2);

/// Longest opening a connection may take, for a client this crate builds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time the server may take for an operation without a timeout of its own (`get`, `get_data`,
/// `exists`, `delete`); the request may take [`SEQUENCES_GRACE`] beyond it.
const PLAIN_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A request through [`SequencesClient`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SequencesError {
    /// The server answered with an error (its stable code and message).
    #[error("{message} ({code})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code.
        code: ErrorCode,
        /// The server's message.
        message: String,
    },
    /// The request did not get an answer (connection refused, timeout, …); an operation that
    /// writes may or may not have happened.
    #[error("no answer from the sequence server; check that it runs and is reachable")]
    Transport(#[source] reqwest::Error),
    /// The answer is not what the API documents.
    #[error("unexpected answer from the sequence server: {0}")]
    Protocol(String),
    /// The bearer token cannot be sent in a header (it holds characters a header cannot).
    #[error("the token is not acceptable in an HTTP header; use printable ASCII characters")]
    InvalidToken,
}

impl SequencesError {
    /// The stable code: the server's, or the client's own ([`ErrorCode::Transport`],
    /// [`ErrorCode::Protocol`], [`ErrorCode::InvalidToken`]).
    #[must_use]
    pub fn code(&self) -> ErrorCode {
        match self {
            SequencesError::Api { code, .. } => *code,
            SequencesError::Transport(_) => ErrorCode::Transport,
            SequencesError::Protocol(_) => ErrorCode::Protocol,
            SequencesError::InvalidToken => ErrorCode::InvalidToken,
        }
    }
}

/// A client of the named-sequence HTTP API. Cheap to clone (connections are pooled).
///
/// # Example
///
/// ```no_run
/// use monoseq_named::NextOptions;
/// use monoseq_client::SequencesClient;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = SequencesClient::new("http://127.0.0.1:8080")?;
/// let number = client.next(&"orders/invoice".parse()?, &NextOptions::new()).await?;
/// # let _ = number;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SequencesClient {
    http: reqwest::Client,
    base: String,
}

impl SequencesClient {
    /// A client of the server at `base_url` (such as `http://127.0.0.1:8080`).
    ///
    /// # Errors
    ///
    /// [`SequencesError::Transport`] when the HTTP client cannot be built.
    pub fn new(base_url: &str) -> Result<SequencesClient, SequencesError> {
        SequencesClient::build(base_url, reqwest::header::HeaderMap::new())
    }

    /// A client of the server at `base_url` that presents `token` as a bearer token on every
    /// request (a server with tokens configured answers `unauthorized` without one).
    ///
    /// # Errors
    ///
    /// [`SequencesError::InvalidToken`] when the token is not a valid header value,
    /// [`SequencesError::Transport`] when the HTTP client cannot be built.
    pub fn with_token(base_url: &str, token: &str) -> Result<SequencesClient, SequencesError> {
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| SequencesError::InvalidToken)?;
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        SequencesClient::build(base_url, headers)
    }

    /// A client of the server at `base_url` that sends through `http`, a client its caller
    /// configured (timeouts, a CA for TLS, a bearer token among its default headers). The
    /// command client (`monoseq-client`) shares its connections and settings this way.
    #[must_use]
    pub fn with_http(base_url: &str, http: reqwest::Client) -> SequencesClient {
        SequencesClient {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
        }
    }

    fn build(
        base_url: &str,
        headers: reqwest::header::HeaderMap,
    ) -> Result<SequencesClient, SequencesError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .build()
            .map_err(SequencesError::Transport)?;
        Ok(SequencesClient {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
        })
    }

    fn url(&self, address: &Address, operation: Option<&str>) -> String {
        match operation {
            Some(operation) => format!("{}/v1/sequences/{address}/{operation}", self.base),
            None => format!("{}/v1/sequences/{address}", self.base),
        }
    }

    /// Sends `request` (with `body` as JSON) and reads a success answer as `T`; `None` for a
    /// 204 (no content).
    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<Option<T>, SequencesError> {
        let mut request = request.timeout(timeout + SEQUENCES_GRACE);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let response = request.send().await.map_err(SequencesError::Transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(SequencesError::Transport)?;
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let unexpected = |e: serde_json::Error| {
            SequencesError::Protocol(format!(
                "status {status}, body not as documented ({e}): {}",
                String::from_utf8_lossy(&bytes)
            ))
        };
        if status.is_success() {
            return serde_json::from_slice(&bytes).map(Some).map_err(unexpected);
        }
        let error: ErrorBody = serde_json::from_slice(&bytes).map_err(unexpected)?;
        Err(SequencesError::Api {
            status: status.as_u16(),
            code: error.code,
            message: error.message,
        })
    }

    /// The answer `T` of a request that does not answer 204.
    fn answered<T>(answer: Option<T>) -> Result<T, SequencesError> {
        answer.ok_or_else(|| SequencesError::Protocol("no body in the answer".to_owned()))
    }

    fn timeout_ms(timeout: Duration) -> Option<Checked<u64>> {
        Some(Checked::from(
            u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        ))
    }

    fn next_body(options: &NextOptions) -> NextRequestBody {
        NextRequestBody {
            initial: Some(Checked::from(options.initial_value())),
            increment: Some(Checked::from(options.increment_value().get())),
            timeout_ms: SequencesClient::timeout_ms(options.timeout_value()),
            metadata: options.metadata_value().cloned().map(Checked::from),
        }
    }

    fn json(body: &impl serde::Serialize) -> Result<Vec<u8>, SequencesError> {
        serde_json::to_vec(body).map_err(|e| SequencesError::Protocol(e.to_string()))
    }

    async fn advance(
        &self,
        address: &Address,
        options: &NextOptions,
        operation: &str,
    ) -> Result<u64, SequencesError> {
        let body = SequencesClient::json(&SequencesClient::next_body(options))?;
        let answer: Option<SequenceValueBody> = self
            .call(
                self.http.post(self.url(address, Some(operation))),
                Some(body),
                options.timeout_value(),
            )
            .await?;
        SequencesClient::answered(answer)?
            .value
            .ok_or_else(|| SequencesError::Protocol("\"value\" is null".to_owned()))
    }

    /// [`monoseq_named::Sequences::next`] on the server.
    ///
    /// # Errors
    ///
    /// [`SequencesError::Api`] with the server's code (such as `busy`), or a transport or protocol
    /// failure.
    pub async fn next(
        &self,
        address: &Address,
        options: &NextOptions,
    ) -> Result<u64, SequencesError> {
        self.advance(address, options, "next").await
    }

    /// [`monoseq_named::Sequences::increment`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn increment(
        &self,
        address: &Address,
        options: &NextOptions,
    ) -> Result<u64, SequencesError> {
        self.advance(address, options, "increment").await
    }

    /// [`monoseq_named::Sequences::get`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn get(&self, address: &Address) -> Result<Option<u64>, SequencesError> {
        let request = self.http.get(self.url(address, Some("value")));
        let answer: Option<SequenceValueBody> =
            self.call(request, None, PLAIN_OPERATION_TIMEOUT).await?;
        Ok(SequencesClient::answered(answer)?.value)
    }

    /// [`monoseq_named::Sequences::get_data`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn get_data(
        &self,
        address: &Address,
    ) -> Result<Option<SequenceData>, SequencesError> {
        let request = self.http.get(self.url(address, Some("data")));
        match self.call(request, None, PLAIN_OPERATION_TIMEOUT).await {
            Ok(answer) => SequencesClient::answered(answer).map(Some),
            Err(SequencesError::Api {
                code: ErrorCode::NotFound,
                ..
            }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`monoseq_named::Sequences::exists`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn exists(&self, address: &Address) -> Result<bool, SequencesError> {
        let request = self.http.get(self.url(address, Some("exists")));
        let answer: Option<SequenceExistsBody> =
            self.call(request, None, PLAIN_OPERATION_TIMEOUT).await?;
        Ok(SequencesClient::answered(answer)?.exists)
    }

    /// [`monoseq_named::Sequences::reset`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn reset(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, SequencesError> {
        let body = SequencesClient::json(&ResetRequestBody {
            value: Some(Checked::from(value)),
            timeout_ms: SequencesClient::timeout_ms(options.timeout_value()),
            metadata: options.metadata_value().cloned().map(Checked::from),
        })?;
        let request = self.http.post(self.url(address, Some("reset")));
        let answer = self
            .call(request, Some(body), options.timeout_value())
            .await?;
        SequencesClient::answered(answer)
    }

    /// [`monoseq_named::Sequences::delete`] on the server.
    ///
    /// # Errors
    ///
    /// As [`SequencesClient::next`].
    pub async fn delete(&self, address: &Address) -> Result<(), SequencesError> {
        let request = self.http.delete(self.url(address, None));
        let _: Option<serde::de::IgnoredAny> =
            self.call(request, None, PLAIN_OPERATION_TIMEOUT).await?;
        Ok(())
    }
}

/// Blocks for a [`monoseq_named::Reserver`] through the server's `next`, so a process that
/// cannot open the storage itself (the embedded store admits one process) still reserves
/// blocks. Every failure, the server's answer included, is a [`NextError::Storage`] whose
/// message carries the server's code: the reserver's caller retries either way.
///
/// # Example
///
/// ```no_run
/// use std::num::NonZeroU64;
/// use monoseq_named::{ReserveOptions, Reserver};
/// use monoseq_client::SequencesClient;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = SequencesClient::new("http://127.0.0.1:8080")?;
/// let options = ReserveOptions::new(NonZeroU64::new(10_000).unwrap());
/// let ids = Reserver::new(client, "orders/id".parse()?, options);
/// let id = ids.next().await?; // one request per 5 000 numbers
/// # let _ = id;
/// # Ok(())
/// # }
/// ```
impl BlockSource for SequencesClient {
    fn take<'a>(
        &'a self,
        address: &'a Address,
        options: &'a NextOptions,
    ) -> BoxFuture<'a, Result<u64, NextError>> {
        Box::pin(async move {
            self.next(address, options).await.map_err(|e| {
                NextError::Storage(StorageError::new(
                    "taking a block from the sequence server",
                    e,
                ))
            })
        })
    }
}
