//! Authentication of the HTTP API: the bearer tokens the server accepts (`write` for every
//! request, `read` for `GET` and `HEAD`), the middleware that checks every request before its
//! body is read, the token this node presents to its peers, and the `serve` flags and
//! `[security]` settings of tokens and TLS. Owns the tokens: they are kept only as SHA-256
//! digests, compared in constant time, and never logged, printed or put in an error.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use clap::Args;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

/// Fewest characters of a token: shorter ones can be guessed.
pub const TOKEN_CHARS_MIN: usize = 16;
/// Most characters of a token (it travels in a request header).
pub const TOKEN_CHARS_MAX: usize = 1024;
/// The environment variable of tokens given without a file: `write:<token>,read:<token>`.
pub const TOKENS_ENV: &str = "MONOSEQ_TOKENS";
/// The environment variable of the token this node presents to its peers.
pub const NODE_TOKEN_ENV: &str = "MONOSEQ_NODE_TOKEN";
/// Paths answered without a token under `--open-health`.
const HEALTH_PATHS: [&str; 2] = ["/healthz", "/readyz"];

/// Security flags of `serve`; each also reads `MONOSEQ_<NAME>` from the environment, and the
/// settings file's `[security]` table under them.
#[derive(Debug, Clone, Default, Args)]
pub struct SecurityArgs {
    /// File of bearer tokens, one `write <token>` or `read <token>` a line (`#` starts a
    /// comment line). More tokens come from the environment only, as
    /// MONOSEQ_TOKENS=write:TOKEN,read:TOKEN. A write token may send every request, a read
    /// token only GET (and HEAD). Without any token nothing is authenticated.
    #[arg(long, env = "MONOSEQ_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// File holding the token this node sends when it forwards a request to another node (a
    /// write token there); MONOSEQ_NODE_TOKEN gives it from the environment instead [default:
    /// the first write token].
    #[arg(long, env = "MONOSEQ_NODE_TOKEN_FILE")]
    pub node_token_file: Option<PathBuf>,
    /// Answer /healthz and /readyz without a token (for load balancers and orchestrators).
    #[arg(long, env = "MONOSEQ_OPEN_HEALTH")]
    pub open_health: bool,
    /// Serve on an address other than loopback without any token: anyone who reaches it can
    /// read and write. Without it such a start is refused.
    #[arg(long, env = "MONOSEQ_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,
    /// PEM file of the server's certificate chain: serve HTTPS (give --tls-key too).
    #[arg(long, env = "MONOSEQ_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --tls-cert.
    #[arg(long, env = "MONOSEQ_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

/// The `[security]` table of the settings file: the same settings as [`SecurityArgs`], which
/// override it. Tokens themselves are not taken from the settings file, only file names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityFile {
    tokens_file: Option<PathBuf>,
    node_token_file: Option<PathBuf>,
    open_health: Option<bool>,
    allow_unauthenticated: Option<bool>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
}

/// What the server enforces: the tokens (through [`Auth`]) and TLS.
pub struct Security {
    /// The tokens, shared by the middleware and the forwarding code.
    pub auth: Arc<Auth>,
    /// The TLS server configuration, when the server speaks HTTPS.
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// The certificate file of `tls`, for the start line.
    tls_cert: Option<PathBuf>,
    /// Serving without tokens on a non-loopback address was allowed explicitly.
    allow_unauthenticated: bool,
}

impl fmt::Debug for Security {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Security")
            .field("auth", &self.auth)
            .field("tls_cert", &self.tls_cert)
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .finish()
    }
}

/// Secrets that come only from the environment.
#[derive(Default)]
pub(crate) struct EnvSecrets {
    tokens: Option<String>,
    node_token: Option<String>,
}

impl EnvSecrets {
    fn read() -> anyhow::Result<EnvSecrets> {
        let var = |name: &str| match std::env::var(name) {
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => {
                bail!("{name} is not valid UTF-8; tokens are printable ASCII")
            }
        };
        Ok(EnvSecrets {
            tokens: var(TOKENS_ENV)?,
            node_token: var(NODE_TOKEN_ENV)?,
        })
    }
}

impl SecurityArgs {
    /// Merges the flags (and their environment variables) over the settings file's
    /// `[security]` table, reads the token files and `MONOSEQ_TOKENS`/`MONOSEQ_NODE_TOKEN`, and
    /// loads the TLS certificate and key.
    ///
    /// # Errors
    ///
    /// A malformed token (named by file and line, or by its entry in `MONOSEQ_TOKENS`, never
    /// by its text), an unreadable file, a certificate without its key or the reverse, a
    /// certificate or key that does not load; and no token at all while `listen` is not a
    /// loopback address, unless unauthenticated serving was allowed.
    pub fn resolve(&self, file: &SecurityFile, listen: SocketAddr) -> anyhow::Result<Security> {
        self.resolve_with(file, listen, EnvSecrets::read()?)
    }

    pub(crate) fn resolve_with(
        &self,
        file: &SecurityFile,
        listen: SocketAddr,
        env: EnvSecrets,
    ) -> anyhow::Result<Security> {
        let tokens_file = self.tokens_file.as_ref().or(file.tokens_file.as_ref());
        let mut tokens = Vec::new();
        if let Some(path) = tokens_file {
            let text = read_secret_file(path, "tokens file")?;
            let origin = format!("tokens file {}", path.display());
            tokens.extend(parse_tokens_file(&text, &origin)?);
        }
        if let Some(list) = &env.tokens {
            tokens.extend(parse_tokens_env(list)?);
        }
        check_distinct(&tokens)?;
        let node_token_file = self
            .node_token_file
            .as_ref()
            .or(file.node_token_file.as_ref());
        let node_token = node_token(node_token_file, env.node_token.as_deref())?;
        let open_health = self.open_health || file.open_health.unwrap_or(false);
        let allow_unauthenticated =
            self.allow_unauthenticated || file.allow_unauthenticated.unwrap_or(false);
        if tokens.is_empty() && !listen.ip().is_loopback() && !allow_unauthenticated {
            bail!(
                "{listen} is not a loopback address and no token is configured, so anyone who \
                 reaches it could write: give --tokens-file (or {TOKENS_ENV}), or \
                 --allow-unauthenticated to serve it open"
            );
        }
        let tls_cert = self.tls_cert.as_ref().or(file.tls_cert.as_ref());
        let tls_key = self.tls_key.as_ref().or(file.tls_key.as_ref());
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(crate::tls::acceptor(cert, key)?),
            (None, None) => None,
            (Some(_), None) => bail!("--tls-cert is given without --tls-key: give both or neither"),
            (None, Some(_)) => bail!("--tls-key is given without --tls-cert: give both or neither"),
        };
        Ok(Security {
            auth: Arc::new(Auth::new(&tokens, node_token, open_health)),
            tls,
            tls_cert: tls_cert.cloned(),
            allow_unauthenticated,
        })
    }
}

impl Security {
    /// The certificate file the server presents, with TLS.
    #[must_use]
    pub fn tls_cert(&self) -> Option<&std::path::Path> {
        self.tls_cert.as_deref()
    }

    /// `https` with TLS, else `http`.
    #[must_use]
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// Logs whether authentication and TLS are on, with counts of tokens but never a token,
    /// and warns about an open or unencrypted non-loopback listener.
    pub fn log_start(&self, listen: SocketAddr) {
        let a = &self.auth;
        let (write, read) = (a.count(Kind::Write), a.count(Kind::Read));
        if a.is_on() {
            tracing::info!(
                write_tokens = write,
                read_tokens = read,
                open_health = a.open_health,
                presents_token_to_peers = a.outbound.is_some(),
                "authentication on: every request needs a bearer token"
            );
        } else if self.allow_unauthenticated && !listen.ip().is_loopback() {
            tracing::warn!(
                "authentication off on {listen} (--allow-unauthenticated): anyone who reaches it \
                 can read and write"
            );
        } else {
            tracing::info!("authentication off: no token configured (loopback only)");
        }
        match &self.tls_cert {
            Some(cert) => tracing::info!(certificate = %cert.display(), "TLS on"),
            None if a.is_on() && !listen.ip().is_loopback() => tracing::warn!(
                "TLS off: tokens cross the network unencrypted; give --tls-cert and --tls-key, \
                 or serve behind a TLS proxy"
            ),
            None => {}
        }
    }
}

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `GET` and `HEAD` only: reading events, WLogs, records, named sequences, info, cluster
    /// state, health and metrics.
    Read,
    /// Every request.
    Write,
}

impl Kind {
    fn parse(word: &str) -> Option<Kind> {
        match word {
            "write" => Some(Kind::Write),
            "read" => Some(Kind::Read),
            _ => None,
        }
    }

    /// The kind a request needs: a read for `GET` and `HEAD` (which change nothing on any
    /// route of the server), a write for every other method.
    pub fn needed_for(method: &Method) -> Kind {
        if *method == Method::GET || *method == Method::HEAD {
            Kind::Read
        } else {
            Kind::Write
        }
    }
}

/// A secret token. It has no `Display`, and its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl std::str::FromStr for Token {
    type Err = String;

    /// A token of printable ASCII without spaces, [`TOKEN_CHARS_MIN`] to [`TOKEN_CHARS_MAX`]
    /// characters. The error does not repeat the text.
    fn from_str(text: &str) -> Result<Token, String> {
        if text.len() < TOKEN_CHARS_MIN {
            return Err(format!(
                "the token is shorter than {TOKEN_CHARS_MIN} characters; make one with \
                 `openssl rand -hex 32`"
            ));
        }
        if text.len() > TOKEN_CHARS_MAX {
            return Err(format!(
                "the token is longer than {TOKEN_CHARS_MAX} characters"
            ));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(
                "the token holds a character other than printable ASCII without spaces".into(),
            );
        }
        Ok(Token(text.to_owned()))
    }
}

/// A token given as a flag or an environment variable, checked only when used
/// ([`TokenArg::token`]): clap quotes the text of a value that fails to parse, and a token's
/// text must not reach an error. Its `Debug` shows nothing of it.
#[derive(Clone)]
pub struct TokenArg(String);

impl fmt::Debug for TokenArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenArg(<redacted>)")
    }
}

impl std::str::FromStr for TokenArg {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<TokenArg, Self::Err> {
        Ok(TokenArg(text.to_owned()))
    }
}

impl TokenArg {
    /// The token, checked as [`Token`]'s `from_str` does.
    ///
    /// # Errors
    ///
    /// The text is no valid token; the error names `setting`, not the text.
    pub fn token(&self, setting: &str) -> anyhow::Result<Token> {
        self.0
            .parse::<Token>()
            .map_err(|e| anyhow::anyhow!("{setting}: {e}"))
    }
}

impl Token {
    fn digest(&self) -> [u8; 32] {
        digest(self.0.as_bytes())
    }

    /// The token itself, for a client that presents it (`monoseq-client`); never to be logged.
    pub fn secret(&self) -> &str {
        &self.0
    }

    /// The `Authorization` header value that presents this token, marked sensitive (hyper and
    /// `Debug` do not show it).
    pub fn authorization(&self) -> HeaderValue {
        let mut value = HeaderValue::try_from(format!("Bearer {}", self.0))
            .expect("a token is printable ASCII, so a valid header value");
        value.set_sensitive(true);
        value
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(&Sha256::digest(bytes));
    out
}

/// A token the server accepts, with where it was configured (for errors).
struct Configured {
    kind: Kind,
    token: Token,
    origin: String,
}

/// Reads a file of secrets, warning when users other than its owner may read it.
fn read_secret_file(path: &std::path::Path, what: &str) -> anyhow::Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the {what} {}", path.display()))?;
    if let Ok(meta) = std::fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "the {what} {} may be read by other users; restrict it with `chmod 600`",
            path.display()
        );
    }
    Ok(text)
}

/// Parses a tokens file: `write <token>` or `read <token>` a line, blank lines and lines
/// starting with `#` skipped. Errors name `origin` and the line number, never the text.
fn parse_tokens_file(text: &str, origin: &str) -> anyhow::Result<Vec<Configured>> {
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{origin} line {}", index + 1);
        let mut words = line.split_whitespace();
        let kind = words.next().and_then(Kind::parse).with_context(|| {
            format!("{at}: a line is `write <token>` or `read <token>`; this one starts otherwise")
        })?;
        let token = words
            .next()
            .with_context(|| format!("{at}: the token is missing after the kind"))?;
        if words.next().is_some() {
            bail!("{at}: more than one word follows the kind; a token holds no spaces");
        }
        let token = token
            .parse::<Token>()
            .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        tokens.push(Configured {
            kind,
            token,
            origin: at,
        });
    }
    Ok(tokens)
}

/// Parses `MONOSEQ_TOKENS`: `kind:token` entries separated by commas. Errors name the entry by
/// its position, never its text.
fn parse_tokens_env(list: &str) -> anyhow::Result<Vec<Configured>> {
    let mut tokens = Vec::new();
    for (index, entry) in list.split(',').enumerate() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        let at = format!("{TOKENS_ENV} entry {}", index + 1);
        let (kind, token) = entry
            .split_once(':')
            .and_then(|(kind, token)| Some((Kind::parse(kind)?, token)))
            .with_context(|| format!("{at}: an entry is `write:<token>` or `read:<token>`"))?;
        let token = token
            .parse::<Token>()
            .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
        tokens.push(Configured {
            kind,
            token,
            origin: at,
        });
    }
    Ok(tokens)
}

/// Refuses a token configured twice: as two kinds it would be ambiguous, as one a mistake.
fn check_distinct(tokens: &[Configured]) -> anyhow::Result<()> {
    for (i, later) in tokens.iter().enumerate() {
        if let Some(earlier) = tokens[..i].iter().find(|t| t.token == later.token) {
            bail!(
                "{} repeats the token of {}: give each token once, with one kind",
                later.origin,
                earlier.origin
            );
        }
    }
    Ok(())
}

/// The node token from its file or from `MONOSEQ_NODE_TOKEN` (not both).
fn node_token(file: Option<&PathBuf>, env: Option<&str>) -> anyhow::Result<Option<Token>> {
    let (text, origin) = match (file, env) {
        (Some(_), Some(_)) => bail!(
            "the node token is given twice, by --node-token-file and by {NODE_TOKEN_ENV}: give one"
        ),
        (Some(path), None) => (
            read_secret_file(path, "node token file")?,
            format!("node token file {}", path.display()),
        ),
        (None, Some(text)) => (text.to_owned(), NODE_TOKEN_ENV.to_owned()),
        (None, None) => return Ok(None),
    };
    let token = text
        .trim()
        .parse::<Token>()
        .map_err(|e| anyhow::anyhow!("{origin}: {e}"))?;
    Ok(Some(token))
}

/// A token the server accepts, as the digest it is compared by.
struct Accepted {
    kind: Kind,
    digest: [u8; 32],
}

/// The tokens the server accepts and the one it presents to its peers. Cloned by `Arc`; its
/// `Debug` shows counts only.
pub struct Auth {
    accepted: Vec<Accepted>,
    pub(crate) open_health: bool,
    outbound: Option<HeaderValue>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("write_tokens", &self.count(Kind::Write))
            .field("read_tokens", &self.count(Kind::Read))
            .field("open_health", &self.open_health)
            .field("node_token", &self.outbound.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer token the server does not accept.
    Invalid,
    /// A read token on a request that needs a write token.
    ReadOnly,
}

impl Auth {
    /// Accepts `tokens`; presents `node_token` to peers, or else the first write token.
    fn new(tokens: &[Configured], node_token: Option<Token>, open_health: bool) -> Auth {
        let outbound = node_token
            .or_else(|| {
                tokens
                    .iter()
                    .find(|t| t.kind == Kind::Write)
                    .map(|t| t.token.clone())
            })
            .map(|t| t.authorization());
        Auth {
            accepted: tokens
                .iter()
                .map(|t| Accepted {
                    kind: t.kind,
                    digest: t.token.digest(),
                })
                .collect(),
            open_health,
            outbound,
        }
    }

    /// Requests need a token: at least one is configured.
    pub fn is_on(&self) -> bool {
        !self.accepted.is_empty()
    }

    /// The `Authorization` header this node sends with a request it forwards to another node
    /// (`Bearer <node token>`, marked sensitive): the node token, or else the first write
    /// token; `None` when neither is configured (send no header then).
    #[allow(
        dead_code,
        reason = "for the forwarding of requests to other nodes (issue 14)"
    )]
    pub fn outbound_authorization(&self) -> Option<HeaderValue> {
        self.outbound.clone()
    }

    pub(crate) fn count(&self, kind: Kind) -> usize {
        self.accepted.iter().filter(|t| t.kind == kind).count()
    }

    /// The kind of `presented`, if the server accepts it. Compares its digest with every
    /// accepted digest in constant time, without stopping at a match, so the time taken says
    /// nothing about which token matched or how much of one.
    fn kind_of(&self, presented: &[u8]) -> Option<Kind> {
        let presented = digest(presented);
        let (mut write, mut read) = (Choice::from(0), Choice::from(0));
        for t in &self.accepted {
            let equal = t.digest.ct_eq(&presented);
            match t.kind {
                Kind::Write => write |= equal,
                Kind::Read => read |= equal,
            }
        }
        if bool::from(write) {
            Some(Kind::Write)
        } else if bool::from(read) {
            Some(Kind::Read)
        } else {
            None
        }
    }

    /// Whether a request of `method` on `path` with `headers` may go on.
    fn authorize(&self, method: &Method, path: &str, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.is_on() || (self.open_health && HEALTH_PATHS.contains(&path)) {
            return Ok(());
        }
        let presented = bearer(headers).ok_or(Refusal::Missing)?;
        let kind = self.kind_of(presented).ok_or(Refusal::Invalid)?;
        if kind == Kind::Read && Kind::needed_for(method) == Kind::Write {
            return Err(Refusal::ReadOnly);
        }
        Ok(())
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in any case).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(header::AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|b| *b == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// The middleware on the whole router: a request goes on only with a token that allows it,
/// and is answered 401 `unauthorized` (no or an unknown token) or 403 `forbidden` (a read
/// token on a write) before its body is read, so a refused request changes nothing.
pub async fn require_token(
    State(auth): State<Arc<Auth>>,
    request: Request,
    next: Next,
) -> Response {
    match auth.authorize(request.method(), request.uri().path(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refused(refusal, request.method()),
    }
}

fn refused(refusal: Refusal, method: &Method) -> Response {
    let (status, code, message, challenge) = match refusal {
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this server needs a token: send `Authorization: Bearer <token>` with a token of \
             its --tokens-file or MONOSEQ_TOKENS"
                .to_owned(),
            "Bearer",
        ),
        Refusal::Invalid => (
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the bearer token is not one this server accepts; check the token".to_owned(),
            "Bearer error=\"invalid_token\"",
        ),
        Refusal::ReadOnly => (
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("a read token may only GET; {method} needs a write token"),
            "",
        ),
    };
    let mut response = crate::base::error(status, code, message);
    if !challenge.is_empty() {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens_of(text: &str) -> anyhow::Result<Vec<Configured>> {
        parse_tokens_file(text, "tokens file t")
    }

    const W: &str = "w-0123456789abcdef";
    const R: &str = "r-0123456789abcdef";

    fn auth(text: &str, open_health: bool) -> Auth {
        Auth::new(&tokens_of(text).expect("valid tokens"), None, open_health)
    }

    fn with_bearer(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::try_from(format!("Bearer {token}")).unwrap(),
        );
        h
    }

    #[test]
    fn a_tokens_file_takes_kinds_comments_and_blank_lines() {
        let text = format!("# tokens\n\nwrite {W}\n  read   {R}  \n");
        let tokens = tokens_of(&text).expect("valid");
        assert_eq!(tokens.len(), 2);
        assert_eq!(tokens[0].kind, Kind::Write);
        assert_eq!(tokens[1].kind, Kind::Read);
        assert_eq!(tokens[1].origin, "tokens file t line 4");
    }

    #[test]
    fn a_malformed_line_is_named_by_number_and_its_token_is_not_repeated() {
        let secret = "s3cr3t-0123456789abcdef";
        for (text, line) in [
            (format!("write {W}\nadmin {secret}\n"), 2),
            (format!("\n\n{secret}\n"), 3),
            (format!("read {secret} extra\n"), 1),
            ("write tiny1\n".to_owned(), 1),
            ("write\n".to_owned(), 1),
        ] {
            let err = format!("{:#}", tokens_of(&text).err().expect("refused"));
            assert!(err.contains(&format!("line {line}:")), "{err}");
            assert!(!err.contains(secret) && !err.contains("tiny1"), "{err}");
        }
    }

    #[test]
    fn the_environment_list_takes_kind_colon_token_entries() {
        let tokens = parse_tokens_env(&format!("write:{W}, read:{R},")).expect("valid");
        assert_eq!(
            tokens.iter().map(|t| t.kind).collect::<Vec<_>>(),
            [Kind::Write, Kind::Read]
        );
        let err = parse_tokens_env(&format!("write:{W},{R}"))
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("entry 2") && !err.contains(R), "{err}");
    }

    #[test]
    fn a_token_configured_twice_is_refused() {
        let tokens = tokens_of(&format!("write {W}\nread {W}\n")).expect("parses");
        let err = check_distinct(&tokens).unwrap_err().to_string();
        assert!(
            err.contains("line 2 repeats the token of") && !err.contains(W),
            "{err}"
        );
    }

    #[test]
    fn a_token_is_matched_to_its_kind() {
        let a = auth(&format!("write {W}\nread {R}\n"), false);
        assert_eq!(a.kind_of(W.as_bytes()), Some(Kind::Write));
        assert_eq!(a.kind_of(R.as_bytes()), Some(Kind::Read));
        assert_eq!(a.kind_of(b"w-0123456789abcdeX"), None);
        assert_eq!(a.kind_of(b""), None);
    }

    #[test]
    fn a_read_token_may_only_get_and_a_write_token_everything() {
        let a = auth(&format!("write {W}\nread {R}\n"), false);
        let path = "/v1/commands";
        assert_eq!(
            a.authorize(&Method::POST, path, &HeaderMap::new()),
            Err(Refusal::Missing)
        );
        assert_eq!(
            a.authorize(&Method::POST, path, &with_bearer("nope-0123456789abcdef")),
            Err(Refusal::Invalid)
        );
        assert_eq!(
            a.authorize(&Method::POST, path, &with_bearer(R)),
            Err(Refusal::ReadOnly)
        );
        assert_eq!(
            a.authorize(&Method::DELETE, path, &with_bearer(R)),
            Err(Refusal::ReadOnly)
        );
        assert_eq!(a.authorize(&Method::GET, path, &with_bearer(R)), Ok(()));
        assert_eq!(a.authorize(&Method::HEAD, path, &with_bearer(R)), Ok(()));
        assert_eq!(a.authorize(&Method::POST, path, &with_bearer(W)), Ok(()));
        let mut lower = HeaderMap::new();
        lower.insert(
            header::AUTHORIZATION,
            HeaderValue::try_from(format!("bearer {W}")).unwrap(),
        );
        assert_eq!(a.authorize(&Method::POST, path, &lower), Ok(()));
        let mut basic = HeaderMap::new();
        basic.insert(
            header::AUTHORIZATION,
            HeaderValue::try_from(format!("Basic {W}")).unwrap(),
        );
        assert_eq!(
            a.authorize(&Method::GET, path, &basic),
            Err(Refusal::Missing)
        );
    }

    #[test]
    fn health_is_open_only_when_asked_and_only_health() {
        let closed = auth(&format!("write {W}\n"), false);
        let open = auth(&format!("write {W}\n"), true);
        for path in HEALTH_PATHS {
            assert_eq!(
                closed.authorize(&Method::GET, path, &HeaderMap::new()),
                Err(Refusal::Missing)
            );
            assert_eq!(
                open.authorize(&Method::GET, path, &HeaderMap::new()),
                Ok(())
            );
        }
        assert_eq!(
            open.authorize(&Method::GET, "/metrics", &HeaderMap::new()),
            Err(Refusal::Missing)
        );
    }

    #[test]
    fn without_tokens_everything_passes() {
        let a = Auth::new(&[], None, false);
        assert!(!a.is_on());
        assert_eq!(
            a.authorize(&Method::POST, "/v1/commands", &HeaderMap::new()),
            Ok(())
        );
        assert_eq!(a.outbound_authorization(), None);
    }

    #[test]
    fn the_outbound_token_is_the_node_token_or_the_first_write_token() {
        let tokens = tokens_of(&format!("read {R}\nwrite {W}\n")).expect("valid");
        let first_write = Auth::new(&tokens, None, false);
        let header = first_write
            .outbound_authorization()
            .expect("a write token exists");
        assert_eq!(header.as_bytes(), format!("Bearer {W}").as_bytes());
        assert!(header.is_sensitive());
        let node: Token = "node-0123456789abcdef".parse().expect("valid");
        let given = Auth::new(&tokens, Some(node), false);
        assert_eq!(
            given.outbound_authorization().expect("given").as_bytes(),
            b"Bearer node-0123456789abcdef"
        );
        let read_only = Auth::new(&tokens_of(&format!("read {R}\n")).unwrap(), None, false);
        assert_eq!(read_only.outbound_authorization(), None);
    }

    #[test]
    fn debug_shows_counts_and_never_a_token() {
        let node: Token = "node-0123456789abcdef".parse().expect("valid");
        let tokens = tokens_of(&format!("write {W}\nread {R}\n")).expect("valid");
        let a = Auth::new(&tokens, Some(node.clone()), true);
        let text = format!("{a:?} {node:?} {:?}", tokens[0].token);
        for secret in [W, R, "node-0123456789abcdef"] {
            assert!(!text.contains(secret), "{text}");
        }
        assert!(text.contains("write_tokens: 1"), "{text}");
    }

    fn resolve(args: &SecurityArgs, listen: &str, env: EnvSecrets) -> anyhow::Result<Security> {
        args.resolve_with(&SecurityFile::default(), listen.parse().unwrap(), env)
    }

    #[test]
    fn a_non_loopback_listener_needs_tokens_or_an_explicit_allowance() {
        let none = SecurityArgs::default();
        let err = resolve(&none, "0.0.0.0:8080", EnvSecrets::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--tokens-file") && err.contains("--allow-unauthenticated"),
            "{err}"
        );
        assert!(resolve(&none, "127.0.0.1:8080", EnvSecrets::default()).is_ok());
        assert!(resolve(&none, "[::1]:8080", EnvSecrets::default()).is_ok());
        let allowed = SecurityArgs {
            allow_unauthenticated: true,
            ..SecurityArgs::default()
        };
        assert!(resolve(&allowed, "0.0.0.0:8080", EnvSecrets::default()).is_ok());
        let env = EnvSecrets {
            tokens: Some(format!("write:{W}")),
            node_token: None,
        };
        let on = resolve(&none, "0.0.0.0:8080", env).expect("tokens given");
        assert!(on.auth.is_on());
    }

    #[test]
    fn the_node_token_comes_from_one_place() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node");
        std::fs::write(&file, "node-0123456789abcdef\n").unwrap();
        let args = SecurityArgs {
            node_token_file: Some(file),
            ..SecurityArgs::default()
        };
        let s = resolve(&args, "127.0.0.1:1", EnvSecrets::default()).expect("valid");
        assert_eq!(
            s.auth.outbound_authorization().unwrap().as_bytes(),
            b"Bearer node-0123456789abcdef"
        );
        let both = EnvSecrets {
            tokens: None,
            node_token: Some("node-0123456789abcdef".into()),
        };
        let err = resolve(&args, "127.0.0.1:1", both).unwrap_err().to_string();
        assert!(err.contains("given twice"), "{err}");
    }

    #[test]
    fn a_token_argument_is_checked_when_used_and_never_quoted() {
        let short: TokenArg = "tiny1".parse().unwrap();
        let err = short.token("--token").unwrap_err().to_string();
        assert!(
            err.starts_with("--token: ") && !err.contains("tiny1"),
            "{err}"
        );
        assert_eq!(format!("{short:?}"), "TokenArg(<redacted>)");
        let good: TokenArg = W.parse().unwrap();
        assert_eq!(
            good.token("--token").unwrap().authorization().as_bytes(),
            format!("Bearer {W}").as_bytes()
        );
    }

    #[test]
    fn the_settings_file_section_is_read_under_the_flags() {
        let section: SecurityFile =
            toml::from_str("open_health = true\ntls_cert = \"c.pem\"\n").expect("parses");
        assert_eq!(section.open_health, Some(true));
        let err = SecurityArgs::default()
            .resolve_with(
                &section,
                "127.0.0.1:1".parse().unwrap(),
                EnvSecrets::default(),
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains("without --tls-key"), "{err}");
        assert!(toml::from_str::<SecurityFile>("tokens = \"x\"\n").is_err());
    }
}
