//! The security settings of `serve`: the flags and `[security]` table, the bearer tokens read
//! from their file and `MONOSEQ_TOKENS` (checked, kept only as [`Token`]s until they become
//! digests), the token this node presents to its peers, and the TLS configuration. A token's
//! text is never logged, printed or put in an error.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use axum::http::{HeaderValue, Method};
use clap::Args;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::check::Auth;

/// Fewest characters of a token: shorter ones can be guessed.
pub const TOKEN_CHARS_MIN: usize = 16;
/// Most characters of a token (it travels in a request header).
pub const TOKEN_CHARS_MAX: usize = 1024;
/// The environment variable of tokens given without a file:
/// `admin:<token>,write:<token>,consume:<token>,read:<token>`.
pub const TOKENS_ENV: &str = "MONOSEQ_TOKENS";
/// The environment variable of the token this node presents to its peers.
pub const NODE_TOKEN_ENV: &str = "MONOSEQ_NODE_TOKEN";

/// Security flags of `serve`; each also reads `MONOSEQ_<NAME>` from the environment, and the
/// settings file's `[security]` table under them.
#[derive(Debug, Clone, Default, Args)]
pub struct SecurityArgs {
    /// File of bearer tokens, one `admin <token>`, `write <token>`, `consume <token>` or
    /// `read <token>` a line (`#` starts a comment line). More tokens come from the
    /// environment only, as MONOSEQ_TOKENS=admin:TOKEN,write:TOKEN,consume:TOKEN,read:TOKEN.
    /// An admin token may send every request and alone may administer the server
    /// (/v1/admin/*, backups); a write token every other request; a consume token GET, PUT
    /// of a consumer position (/v1/consumers/NAME/partitions/P) and POST under /v1/groups/;
    /// a read token only GET (and HEAD). Without any token nothing is authenticated, and
    /// administration is refused unless --admin-on-loopback.
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
    /// On a loopback listener without tokens, allow administration (/v1/admin/*, backups) to
    /// anyone on this machine. Without it such a request is answered 403
    /// `admin_on_loopback_off`. Refused with tokens (give an admin token instead) and on a
    /// listener other than loopback.
    #[arg(long, env = "MONOSEQ_ADMIN_ON_LOOPBACK")]
    pub admin_on_loopback: bool,
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
    pub(super) open_health: Option<bool>,
    allow_unauthenticated: Option<bool>,
    admin_on_loopback: Option<bool>,
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
    pub(super) tokens: Option<String>,
    pub(super) node_token: Option<String>,
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
        let admin_on_loopback = self.admin_on_loopback || file.admin_on_loopback.unwrap_or(false);
        if admin_on_loopback && !tokens.is_empty() {
            bail!(
                "--admin-on-loopback is for a server without tokens, and tokens are configured: \
                 drop the flag and give an admin token (`admin <token>` in the tokens file, or \
                 admin:<token> in {TOKENS_ENV})"
            );
        }
        if admin_on_loopback && !listen.ip().is_loopback() {
            bail!(
                "--admin-on-loopback is given but {listen} is not a loopback address, so anyone \
                 who reaches it could administer the server: listen on 127.0.0.1 (or ::1), or \
                 drop the flag and give an admin token"
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
        let mut auth = Auth::new(&tokens, node_token, open_health);
        auth.admin_on_loopback = admin_on_loopback;
        Ok(Security {
            auth: Arc::new(auth),
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
        let (admin, write, consume, read) = (
            a.count(Kind::Admin),
            a.count(Kind::Write),
            a.count(Kind::Consume),
            a.count(Kind::Read),
        );
        if a.is_on() {
            tracing::info!(
                admin_tokens = admin,
                write_tokens = write,
                consume_tokens = consume,
                read_tokens = read,
                open_health = a.open_health,
                presents_token_to_peers = a.outbound_authorization().is_some(),
                "authentication on: every request needs a bearer token"
            );
        } else if self.allow_unauthenticated && !listen.ip().is_loopback() {
            tracing::warn!(
                "authentication off on {listen} (--allow-unauthenticated): anyone who reaches it \
                 can read and write"
            );
        } else if a.admin_on_loopback {
            tracing::warn!(
                "authentication off: no token configured (loopback only); administration \
                 (backups) allowed to anyone on this machine (--admin-on-loopback)"
            );
        } else {
            tracing::info!(
                "authentication off: no token configured (loopback only); administration \
                 (backups) refused without --admin-on-loopback"
            );
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

/// What a token may do (its scope). Each kind may do what the kinds before it may:
/// `Read < Consume < Write < Admin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `GET` and `HEAD` only: reading events, WLogs, records, named sequences, positions,
    /// info, cluster state, health and metrics.
    Read,
    /// What a consumer of the log needs and nothing more: a read token's requests, setting
    /// its positions (`PUT /v1/consumers/{name}/partitions/{p}`) and joining consumer groups
    /// (`POST` under `/v1/groups/`). No command, no deleted consumer, no administration.
    Consume,
    /// Every request but administration.
    Write,
    /// Every request, administration (`/v1/admin/*`: backups) included.
    Admin,
}

/// The path prefix of consumer groups: a consume token may `GET` and `POST` under it.
pub(crate) const GROUPS_PATH_PREFIX: &str = "/v1/groups/";

impl Kind {
    fn parse(word: &str) -> Option<Kind> {
        match word {
            "admin" => Some(Kind::Admin),
            "write" => Some(Kind::Write),
            "consume" => Some(Kind::Consume),
            "read" => Some(Kind::Read),
            _ => None,
        }
    }

    /// The least kind a request needs: an admin for every method on an administration path
    /// ([`super::check::ADMIN_PATH_PREFIX`]); else a read for `GET` and `HEAD` (which change
    /// nothing on any route of the server); a consume to set a position (`PUT
    /// /v1/consumers/{name}/partitions/{p}`) or to `POST` under [`GROUPS_PATH_PREFIX`]; a
    /// write for every other request.
    pub fn needed_for(method: &Method, path: &str) -> Kind {
        if path.starts_with(super::check::ADMIN_PATH_PREFIX) {
            Kind::Admin
        } else if *method == Method::GET || *method == Method::HEAD {
            Kind::Read
        } else if (*method == Method::PUT && is_position_path(path))
            || (*method == Method::POST && path.starts_with(GROUPS_PATH_PREFIX))
            || (*method == Method::DELETE && is_member_path(path))
        {
            Kind::Consume
        } else {
            Kind::Write
        }
    }

    /// The word of this kind in the tokens file.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Kind::Read => "read",
            Kind::Consume => "consume",
            Kind::Write => "write",
            Kind::Admin => "admin",
        }
    }
}

/// Whether `path` is one group member's session (`/v1/groups/{g}/members/{session}`): a
/// member leaving its group.
fn is_member_path(path: &str) -> bool {
    path.strip_prefix(GROUPS_PATH_PREFIX)
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(group, rest)| Some((group, rest.strip_prefix("members/")?)))
        .is_some_and(|(group, session)| {
            !group.is_empty() && !session.is_empty() && !session.contains('/')
        })
}

/// Whether `path` (as sent: a consumer name's `/` is percent-encoded) is one consumer's
/// position on one partition, `/v1/consumers/{name}/partitions/{p}`.
fn is_position_path(path: &str) -> bool {
    let Some(rest) = path.strip_prefix("/v1/consumers/") else {
        return false;
    };
    let mut segments = rest.split('/');
    matches!(
        (segments.next(), segments.next(), segments.next(), segments.next()),
        (Some(name), Some("partitions"), Some(p), None) if !name.is_empty() && !p.is_empty()
    )
}

/// A secret token. It has no `Display`, and its `Debug` shows nothing of it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Why a text is no valid [`Token`]; it never repeats the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Under [`TOKEN_CHARS_MIN`] characters.
    #[error(
        "the token is shorter than {TOKEN_CHARS_MIN} characters; make one with `openssl rand \
         -hex 32`"
    )]
    TooShort,
    /// Over [`TOKEN_CHARS_MAX`] characters.
    #[error("the token is longer than {TOKEN_CHARS_MAX} characters")]
    TooLong,
    /// A space, a control character or a character outside ASCII.
    #[error("the token holds a character other than printable ASCII without spaces")]
    NotPrintable,
}

impl std::str::FromStr for Token {
    type Err = TokenError;

    /// A token of printable ASCII without spaces, [`TOKEN_CHARS_MIN`] to [`TOKEN_CHARS_MAX`]
    /// characters. The error does not repeat the text.
    fn from_str(text: &str) -> Result<Token, TokenError> {
        if text.len() < TOKEN_CHARS_MIN {
            return Err(TokenError::TooShort);
        }
        if text.len() > TOKEN_CHARS_MAX {
            return Err(TokenError::TooLong);
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::NotPrintable);
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
    pub(super) fn digest(&self) -> [u8; 32] {
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

pub(super) fn digest(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(&Sha256::digest(bytes));
    out
}

/// A token the server accepts, with where it was configured (for errors).
pub(super) struct Configured {
    pub(super) kind: Kind,
    pub(super) token: Token,
    pub(super) origin: String,
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

/// Parses a tokens file: `admin <token>`, `write <token>`, `consume <token>` or `read <token>`
/// a line, blank lines and lines starting with `#` skipped. Errors name `origin` and the line number, never the text.
pub(super) fn parse_tokens_file(text: &str, origin: &str) -> anyhow::Result<Vec<Configured>> {
    let mut tokens = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = format!("{origin} line {}", index + 1);
        let mut words = line.split_whitespace();
        let kind = words.next().and_then(Kind::parse).with_context(|| {
            format!(
                "{at}: a line is `admin <token>`, `write <token>`, `consume <token>` or \
                 `read <token>`; this one starts otherwise"
            )
        })?;
        let token = words
            .next()
            .with_context(|| format!("{at}: the token is missing after the kind"))?;
        if words.next().is_some() {
            bail!("{at}: more than one word follows the kind; a token holds no spaces");
        }
        tokens.push(configured(kind, token, at)?);
    }
    Ok(tokens)
}

/// Parses `MONOSEQ_TOKENS`: `kind:token` entries separated by commas. Errors name the entry by
/// its position, never its text.
pub(super) fn parse_tokens_env(list: &str) -> anyhow::Result<Vec<Configured>> {
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
            .with_context(|| {
                format!(
                    "{at}: an entry is `admin:<token>`, `write:<token>`, `consume:<token>` or \
                     `read:<token>`"
                )
            })?;
        tokens.push(configured(kind, token, at)?);
    }
    Ok(tokens)
}

/// A token of `kind` parsed from `text`, named by `at` (a place, never the token) in errors.
fn configured(kind: Kind, text: &str, at: String) -> anyhow::Result<Configured> {
    let token = text
        .parse::<Token>()
        .map_err(|e| anyhow::anyhow!("{at}: {e}"))?;
    Ok(Configured {
        kind,
        token,
        origin: at,
    })
}

/// Refuses a token configured twice: as two kinds it would be ambiguous, as one a mistake.
pub(super) fn check_distinct(tokens: &[Configured]) -> anyhow::Result<()> {
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
