//! [`Client`]: the named-sequence operations over the HTTP API of [`crate::router`], for the
//! `monoseq seq` command, for other processes and for the tests. Owns the request building and
//! the decoding of answers and `{"code", "message"}` errors. A client is also a
//! [`BlockSource`], so a [`monoseq_named::Reserver`] can take its blocks through a server.

use std::time::Duration;

use serde_json::{Value, json};

use monoseq_named::{
    Address, BlockSource, BoxFuture, NextError, NextOptions, SequenceData, SetOptions, StorageError,
};

/// Time a request may take beyond the operation's own timeout.
pub const CLIENT_GRACE: Duration = Duration::from_secs(2);

/// Longest opening a connection may take, for a client this crate builds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Time the server may take for an operation without a timeout of its own (`get`, `get_data`,
/// `exists`, `delete`); the request may take [`CLIENT_GRACE`] beyond it.
const PLAIN_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// A request through [`Client`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The server answered with an error (its stable code and message).
    #[error("{message} ({code})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code (see [`monoseq_named::code`]).
        code: String,
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

impl ClientError {
    /// The stable code: the server's, or `transport` / `protocol` / `invalid_token`.
    pub fn code(&self) -> &str {
        match self {
            ClientError::Api { code, .. } => code,
            ClientError::Transport(_) => "transport",
            ClientError::Protocol(_) => "protocol",
            ClientError::InvalidToken => "invalid_token",
        }
    }
}

/// A client of the named-sequence HTTP API. Cheap to clone (connections are pooled).
///
/// # Example
///
/// ```no_run
/// use monoseq_named::NextOptions;
/// use monoseq_named_http::Client;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new("http://127.0.0.1:8080")?;
/// let number = client.next(&"orders/invoice".parse()?, &NextOptions::new()).await?;
/// # let _ = number;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    /// A client of the server at `base_url` (such as `http://127.0.0.1:8080`).
    ///
    /// # Errors
    ///
    /// [`ClientError::Transport`] when the HTTP client cannot be built.
    pub fn new(base_url: &str) -> Result<Client, ClientError> {
        Client::build(base_url, reqwest::header::HeaderMap::new())
    }

    /// A client of the server at `base_url` that presents `token` as a bearer token on every
    /// request (a server with tokens configured answers `unauthorized` without one).
    ///
    /// # Errors
    ///
    /// [`ClientError::InvalidToken`] when the token is not a valid header value,
    /// [`ClientError::Transport`] when the HTTP client cannot be built.
    pub fn with_token(base_url: &str, token: &str) -> Result<Client, ClientError> {
        let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|_| ClientError::InvalidToken)?;
        value.set_sensitive(true);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, value);
        Client::build(base_url, headers)
    }

    /// A client of the server at `base_url` that sends through `http`, a client its caller
    /// configured (timeouts, a CA for TLS, a bearer token among its default headers). The
    /// command client (`monoseq-client`) shares its connections and settings this way.
    #[must_use]
    pub fn with_http(base_url: &str, http: reqwest::Client) -> Client {
        Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
        }
    }

    fn build(base_url: &str, headers: reqwest::header::HeaderMap) -> Result<Client, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .default_headers(headers)
            .build()
            .map_err(ClientError::Transport)?;
        Ok(Client {
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

    async fn call(
        &self,
        request: reqwest::RequestBuilder,
        body: Option<Value>,
        timeout: Duration,
    ) -> Result<Option<Value>, ClientError> {
        let mut request = request.timeout(timeout + CLIENT_GRACE);
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.map_err(ClientError::Transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(ClientError::Transport)?;
        if status == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
            ClientError::Protocol(format!(
                "status {status}, body not JSON ({e}): {}",
                String::from_utf8_lossy(&bytes)
            ))
        })?;
        if status.is_success() {
            return Ok(Some(value));
        }
        let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_owned);
        match (field("code"), field("message")) {
            (Some(code), Some(message)) => Err(ClientError::Api {
                status: status.as_u16(),
                code,
                message,
            }),
            _ => Err(ClientError::Protocol(format!("status {status}: {value}"))),
        }
    }

    fn field_u64(value: Option<Value>, field: &str) -> Result<Option<u64>, ClientError> {
        match value.as_ref().and_then(|v| v.get(field)) {
            Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ClientError::Protocol(format!("\"{field}\" is {v}"))),
            None => Err(ClientError::Protocol(format!(
                "no \"{field}\" in the answer"
            ))),
        }
    }

    fn next_body(options: &NextOptions) -> Value {
        let mut body = json!({
            "initial": options.initial_value(),
            "increment": options.increment_value().get(),
            "timeout_ms": u64::try_from(options.timeout_value().as_millis()).unwrap_or(u64::MAX),
        });
        if let Some(metadata) = options.metadata_value() {
            body["metadata"] = Value::Object(metadata.clone());
        }
        body
    }

    async fn advance(
        &self,
        address: &Address,
        options: &NextOptions,
        operation: &str,
    ) -> Result<u64, ClientError> {
        let body = Client::next_body(options);
        let answer = self
            .call(
                self.http.post(self.url(address, Some(operation))),
                Some(body),
                options.timeout_value(),
            )
            .await?;
        Client::field_u64(answer, "value")?
            .ok_or_else(|| ClientError::Protocol("\"value\" is null".to_owned()))
    }

    /// [`monoseq_named::Sequences::next`] on the server.
    ///
    /// # Errors
    ///
    /// [`ClientError::Api`] with the server's code (such as `busy`), or a transport or protocol
    /// failure.
    pub async fn next(&self, address: &Address, options: &NextOptions) -> Result<u64, ClientError> {
        self.advance(address, options, "next").await
    }

    /// [`monoseq_named::Sequences::increment`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn increment(
        &self,
        address: &Address,
        options: &NextOptions,
    ) -> Result<u64, ClientError> {
        self.advance(address, options, "increment").await
    }

    /// [`monoseq_named::Sequences::get`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn get(&self, address: &Address) -> Result<Option<u64>, ClientError> {
        let request = self.http.get(self.url(address, Some("value")));
        let answer = self.call(request, None, PLAIN_OPERATION_TIMEOUT).await?;
        Client::field_u64(answer, "value")
    }

    /// [`monoseq_named::Sequences::get_data`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn get_data(&self, address: &Address) -> Result<Option<SequenceData>, ClientError> {
        let request = self.http.get(self.url(address, Some("data")));
        match self.call(request, None, PLAIN_OPERATION_TIMEOUT).await {
            Ok(answer) => serde_json::from_value(answer.unwrap_or_default())
                .map(Some)
                .map_err(|e| ClientError::Protocol(e.to_string())),
            Err(ClientError::Api { code, .. }) if code == monoseq_named::code::NOT_FOUND => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// [`monoseq_named::Sequences::exists`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn exists(&self, address: &Address) -> Result<bool, ClientError> {
        let request = self.http.get(self.url(address, Some("exists")));
        let answer = self.call(request, None, PLAIN_OPERATION_TIMEOUT).await?;
        answer
            .as_ref()
            .and_then(|v| v.get("exists"))
            .and_then(Value::as_bool)
            .ok_or_else(|| ClientError::Protocol("no boolean \"exists\"".to_owned()))
    }

    /// [`monoseq_named::Sequences::reset`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn reset(
        &self,
        address: &Address,
        value: u64,
        options: &SetOptions,
    ) -> Result<SequenceData, ClientError> {
        let mut body = json!({
            "value": value,
            "timeout_ms": u64::try_from(options.timeout_value().as_millis()).unwrap_or(u64::MAX),
        });
        if let Some(metadata) = options.metadata_value() {
            body["metadata"] = Value::Object(metadata.clone());
        }
        let request = self.http.post(self.url(address, Some("reset")));
        let answer = self
            .call(request, Some(body), options.timeout_value())
            .await?;
        serde_json::from_value(answer.unwrap_or_default())
            .map_err(|e| ClientError::Protocol(e.to_string()))
    }

    /// [`monoseq_named::Sequences::delete`] on the server.
    ///
    /// # Errors
    ///
    /// As [`Client::next`].
    pub async fn delete(&self, address: &Address) -> Result<(), ClientError> {
        let request = self.http.delete(self.url(address, None));
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
/// use monoseq_named_http::Client;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = Client::new("http://127.0.0.1:8080")?;
/// let options = ReserveOptions::new(NonZeroU64::new(10_000).unwrap());
/// let ids = Reserver::new(client, "orders/id".parse()?, options);
/// let id = ids.next().await?; // one request per 5 000 numbers
/// # let _ = id;
/// # Ok(())
/// # }
/// ```
impl BlockSource for Client {
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
