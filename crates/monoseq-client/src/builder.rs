//! [`ClientBuilder`]: the nodes, the token, TLS, the timeouts and the retry bounds of a
//! [`Client`], each with a default.

use std::sync::Arc;
use std::time::Duration;

use monoseq_backoff::Backoff;

use crate::client::{Client, Inner};
use crate::error::ClientError;
use crate::routing::View;

impl Client {
    /// A builder for a client of the nodes at `urls` (such as `http://127.0.0.1:8080`; one is
    /// enough, any node answers any command).
    pub fn builder<I, S>(urls: I) -> ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientBuilder::new(urls.into_iter().map(Into::into).collect())
    }

    /// A client of the server at `url` with the default settings.
    ///
    /// # Errors
    ///
    /// [`ClientError::Config`] when the URL is not `http://` or `https://`.
    pub fn new(url: &str) -> Result<Client, ClientError> {
        Client::builder([url]).build()
    }
}

/// Default of [`ClientBuilder::connect_timeout`].
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// Default of [`ClientBuilder::request_timeout`]: one attempt. A command is answered once its
/// event is durable (milliseconds); a forwarded one within the server's 30 s forwarding bound.
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default of [`ClientBuilder::idle_timeout`]: half the server's default `--idle-timeout-ms`
/// (60 s), so that the client lets an unused connection go before the server closes it.
pub const IDLE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default of [`ClientBuilder::retry_timeout`]: every attempt of one call together.
pub const RETRY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// Default first delay of the jittered backoff between attempts.
pub const BACKOFF_FIRST_DEFAULT: Duration = Duration::from_millis(20);
/// Default largest delay of the jittered backoff between attempts.
pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(2);
/// Default of [`ClientBuilder::view_max_age`]: how long the client trusts its view of the
/// owners before asking `/v1/cluster` again on the next command. A forwarded command is
/// answered like a direct one, so without a refresh a client would never learn that a
/// partition moved to another node; it would only cost a hop per command.
pub const VIEW_MAX_AGE_DEFAULT: Duration = Duration::from_secs(5);

/// Builds a [`Client`]; every setting has a default.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<String>,
    ca_pem: Option<Vec<u8>>,
    connect_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    retry_timeout: Duration,
    backoff: Backoff,
    view_max_age: Duration,
}

impl ClientBuilder {
    pub(crate) fn new(urls: Vec<String>) -> ClientBuilder {
        ClientBuilder {
            urls,
            token: None,
            ca_pem: None,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            idle_timeout: IDLE_TIMEOUT_DEFAULT,
            retry_timeout: RETRY_TIMEOUT_DEFAULT,
            backoff: Backoff::new(BACKOFF_FIRST_DEFAULT, BACKOFF_MAX_DEFAULT),
            view_max_age: VIEW_MAX_AGE_DEFAULT,
        }
    }

    /// Presents `token` as `Authorization: Bearer <token>` on every request.
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> ClientBuilder {
        self.token = Some(token.into());
        self
    }

    /// Trusts only the CA certificates of this PEM text for `https://` nodes (without it:
    /// the platform's trusted CAs).
    #[must_use]
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> ClientBuilder {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Bound on opening one connection [default: [`CONNECT_TIMEOUT_DEFAULT`]].
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.connect_timeout = timeout;
        self
    }

    /// Bound on one attempt, from sending to the answer's end [default:
    /// [`REQUEST_TIMEOUT_DEFAULT`]].
    #[must_use]
    pub fn request_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.request_timeout = timeout;
        self
    }

    /// How long a connection is kept unused for the next request before the client closes it
    /// [default: [`IDLE_TIMEOUT_DEFAULT`]]. Keep it below the server's `--idle-timeout-ms`
    /// (and any proxy's): a request sent on a connection the server is closing gets no
    /// answer, and a command without a key is not sent again (it may have been applied).
    #[must_use]
    pub fn idle_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.idle_timeout = timeout;
        self
    }

    /// Bound on all the attempts of one call; past it the last error is returned
    /// [default: [`RETRY_TIMEOUT_DEFAULT`]]. `Duration::ZERO` makes one attempt.
    #[must_use]
    pub fn retry_timeout(mut self, timeout: Duration) -> ClientBuilder {
        self.retry_timeout = timeout;
        self
    }

    /// The backoff between attempts: a delay drawn below `first × 2^(failures − 1)`, at most
    /// `max` [default: [`BACKOFF_FIRST_DEFAULT`], [`BACKOFF_MAX_DEFAULT`]].
    #[must_use]
    pub fn backoff(mut self, first: Duration, max: Duration) -> ClientBuilder {
        self.backoff = Backoff::new(first, max);
        self
    }

    /// How long the view of the partitions' owners is trusted before the next command asks
    /// a node for it again (one `GET /v1/cluster`) [default: [`VIEW_MAX_AGE_DEFAULT`]].
    #[must_use]
    pub fn view_max_age(mut self, age: Duration) -> ClientBuilder {
        self.view_max_age = age;
        self
    }

    /// The client.
    ///
    /// # Errors
    ///
    /// [`ClientError::Config`] when no URL is given, a URL is not `http://` or `https://`,
    /// the token cannot be a header value, or the CA file holds no certificate.
    pub fn build(self) -> Result<Client, ClientError> {
        if self.urls.is_empty() {
            return Err(ClientError::Config("give at least one node URL".into()));
        }
        let mut nodes = Vec::with_capacity(self.urls.len());
        for url in &self.urls {
            let url = url.trim_end_matches('/');
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ClientError::Config(format!(
                    "{url}: a node URL starts with http:// or https://"
                )));
            }
            nodes.push(url.to_owned());
        }
        let http = self.http()?;
        let sequences = crate::SequencesClient::with_http(&nodes[0], http.clone());
        Ok(Client {
            inner: Arc::new(Inner {
                http,
                view: View::new(nodes, self.view_max_age),
                sequences,
                request_timeout: self.request_timeout,
                retry_timeout: self.retry_timeout,
                backoff: self.backoff,
            }),
        })
    }

    fn http(&self) -> Result<reqwest::Client, ClientError> {
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(token) = &self.token {
            let mut value = reqwest::header::HeaderValue::try_from(format!("Bearer {token}"))
                .map_err(|_| {
                    ClientError::Config("the token holds characters a header cannot".into())
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        // Redirects are followed by the client itself: each one teaches it an owner, and
        // reqwest would drop the token on a redirect to another port.
        let mut http = reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_idle_timeout(self.idle_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .default_headers(headers);
        if let Some(pem) = &self.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| ClientError::Config(format!("the CA certificates: {e}")))?;
            if certs.is_empty() {
                return Err(ClientError::Config(
                    "the CA file holds no PEM certificate".into(),
                ));
            }
            http = http.tls_certs_only(certs);
        }
        http.build()
            .map_err(|e| ClientError::Config(format!("building the HTTP client: {e}")))
    }
}
