//! The per-request token check: the tokens the server accepts as SHA-256 digests, compared in
//! constant time, and the middleware over the whole router that refuses a request before its
//! body is read.

use std::fmt;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use subtle::{Choice, ConstantTimeEq};

use super::settings::{Configured, GROUPS_PATH_PREFIX, Kind, Token, digest};
use monoseq_wire::ErrorCode;

/// Paths answered without a token under `--open-health`.
pub(super) const HEALTH_PATHS: [&str; 2] = ["/healthz", "/readyz"];
/// The paths of administration (backups): an admin token only, whatever the method; without
/// tokens, only with `--admin-on-loopback`.
pub(crate) const ADMIN_PATH_PREFIX: &str = "/v1/admin/";

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
    /// Without tokens, administration is allowed (`--admin-on-loopback`; start refused
    /// unless the listener is loopback and no token is configured).
    pub(crate) admin_on_loopback: bool,
    outbound: Option<HeaderValue>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("admin_tokens", &self.count(Kind::Admin))
            .field("write_tokens", &self.count(Kind::Write))
            .field("consume_tokens", &self.count(Kind::Consume))
            .field("read_tokens", &self.count(Kind::Read))
            .field("open_health", &self.open_health)
            .field("admin_on_loopback", &self.admin_on_loopback)
            .field("node_token", &self.outbound.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer token the server does not accept.
    Invalid,
    /// A read or consume token on a request that needs more (the token's kind, the kind
    /// needed).
    Scope(Kind, Kind),
    /// A read or write token on an administration path.
    NotAdmin,
    /// An administration path on a server without tokens, started without
    /// `--admin-on-loopback`.
    AdminOff,
}

impl Auth {
    /// Accepts `tokens`; presents `node_token` to peers, or else the first write token (an
    /// admin token is never sent to a peer).
    pub(super) fn new(tokens: &[Configured], node_token: Option<Token>, open_health: bool) -> Auth {
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
            admin_on_loopback: false,
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
    pub(super) fn kind_of(&self, presented: &[u8]) -> Option<Kind> {
        let presented = digest(presented);
        let (mut admin, mut write, mut consume, mut read) = (
            Choice::from(0),
            Choice::from(0),
            Choice::from(0),
            Choice::from(0),
        );
        for t in &self.accepted {
            let equal = t.digest.ct_eq(&presented);
            match t.kind {
                Kind::Admin => admin |= equal,
                Kind::Write => write |= equal,
                Kind::Consume => consume |= equal,
                Kind::Read => read |= equal,
            }
        }
        if bool::from(admin) {
            Some(Kind::Admin)
        } else if bool::from(write) {
            Some(Kind::Write)
        } else if bool::from(consume) {
            Some(Kind::Consume)
        } else if bool::from(read) {
            Some(Kind::Read)
        } else {
            None
        }
    }

    /// Whether a request of `method` on `path` with `headers` may go on: an administration
    /// path needs an admin token (without tokens, `--admin-on-loopback`); any other path a
    /// read token for `GET` and `HEAD`, a consume token to set a position or join a group
    /// ([`Kind::needed_for`]), a write token for the rest. A token of a kind may send what
    /// the kinds below it may.
    pub(super) fn authorize(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let needed = Kind::needed_for(method, path);
        if !self.is_on() {
            return match needed {
                Kind::Admin if !self.admin_on_loopback => Err(Refusal::AdminOff),
                _ => Ok(()),
            };
        }
        if self.open_health && HEALTH_PATHS.contains(&path) {
            return Ok(());
        }
        let presented = bearer(headers).ok_or(Refusal::Missing)?;
        let kind = self.kind_of(presented).ok_or(Refusal::Invalid)?;
        match needed {
            _ if kind >= needed => Ok(()),
            Kind::Admin => Err(Refusal::NotAdmin),
            _ => Err(Refusal::Scope(kind, needed)),
        }
    }
}

impl Auth {
    /// What the token presented in `headers` may do (`read`, `consume`, `write` or `admin`), for a
    /// client that shows only the actions it may take; `None` for a missing or unknown token
    /// where tokens are required. Without tokens: `write`, or `admin` under
    /// `--admin-on-loopback`.
    pub fn scope(&self, headers: &HeaderMap) -> Option<&'static str> {
        if !self.is_on() {
            return Some(if self.admin_on_loopback {
                "admin"
            } else {
                "write"
            });
        }
        Some(match self.kind_of(bearer(headers)?)? {
            Kind::Admin => "admin",
            Kind::Write => "write",
            Kind::Consume => "consume",
            Kind::Read => "read",
        })
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
/// and is answered 401 `unauthorized` (no or an unknown token), 403 `forbidden` (a read token
/// on a write, a read or write token on administration) or 403 `admin_on_loopback_off`
/// (administration on a server without tokens started without `--admin-on-loopback`) before
/// its body is read, so a refused request changes nothing.
pub async fn require_token(
    State(auth): State<Arc<Auth>>,
    request: Request,
    next: Next,
) -> Response {
    match auth.authorize(request.method(), request.uri().path(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refused(refusal, request.method(), request.uri().path()),
    }
}

/// What a token of `kind` may send, for a refusal.
fn scope_of(kind: Kind) -> String {
    match kind {
        Kind::Consume => format!(
            "a consume token may only GET, set a consumer's position (PUT \
             /v1/consumers/<name>/partitions/<p>) and join consumer groups (POST under \
             {GROUPS_PATH_PREFIX}; DELETE of a member's session)"
        ),
        _ => "a read token may only GET".to_owned(),
    }
}

fn refused(refusal: Refusal, method: &Method, path: &str) -> Response {
    let (status, code, message, challenge) = match refusal {
        Refusal::Missing => (
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "this server needs a token: send `Authorization: Bearer <token>` with a token of \
             its --tokens-file or MONOSEQ_TOKENS"
                .to_owned(),
            "Bearer",
        ),
        Refusal::Invalid => (
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the bearer token is not one this server accepts; check the token".to_owned(),
            "Bearer error=\"invalid_token\"",
        ),
        Refusal::Scope(kind, needed) => (
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!(
                "{}; {method} {path} needs a {} token",
                scope_of(kind),
                needed.word()
            ),
            "",
        ),
        Refusal::NotAdmin => (
            StatusCode::FORBIDDEN,
            ErrorCode::Forbidden,
            format!(
                "{ADMIN_PATH_PREFIX}* needs an admin token (`admin <token>` in the tokens file); \
                 read, consume and write tokens may not administer the server"
            ),
            "",
        ),
        Refusal::AdminOff => (
            StatusCode::FORBIDDEN,
            ErrorCode::AdminOnLoopbackOff,
            format!(
                "this server has no tokens, so {ADMIN_PATH_PREFIX}* is refused: configure an \
                 admin token (--tokens-file), or restart it with --admin-on-loopback to let \
                 anyone on this machine administer it"
            ),
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
