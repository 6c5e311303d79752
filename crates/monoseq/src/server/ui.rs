//! The web console at `/ui`: its page, script and style, embedded in the binary and served
//! gzip-compressed to a browser that accepts it, and `GET /v1/token`, which tells the console
//! what its token may do. The assets hold no data and are served without a token; every
//! value the console shows comes from the API behind the token check, with the token the
//! operator typed into its login view.

use std::io::Write as _;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use monoseq_wire::{ErrorCode, TokenScopeBody};

use crate::auth::Auth;
use crate::base::error;

/// One embedded asset: its bytes, its content type, and its gzip form (made once, on the
/// first request that accepts it).
struct Asset {
    body: &'static str,
    content_type: &'static str,
    gzip: OnceLock<Vec<u8>>,
}

static INDEX: Asset = Asset::new(include_str!("ui/index.html"), "text/html; charset=utf-8");
static SCRIPT: Asset = Asset::new(include_str!("ui/app.js"), "text/javascript; charset=utf-8");
static STYLE: Asset = Asset::new(include_str!("ui/app.css"), "text/css; charset=utf-8");

/// What the console's page may load and connect to: this server alone (no inline script, no
/// other origin), so that even a value that escaped its escaping could run nothing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

impl Asset {
    const fn new(body: &'static str, content_type: &'static str) -> Asset {
        Asset {
            body,
            content_type,
            gzip: OnceLock::new(),
        }
    }

    fn gzipped(&self) -> &[u8] {
        self.gzip.get_or_init(|| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            // Writing to a Vec does not fail.
            let _ = gz.write_all(self.body.as_bytes());
            gz.finish().unwrap_or_default()
        })
    }

    /// The asset, gzip-compressed when `headers` accept it.
    fn answer(&self, headers: &HeaderMap) -> Response {
        let gzip = headers
            .get_all(header::ACCEPT_ENCODING)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|e| e.trim().starts_with("gzip")));
        let mut r = if gzip {
            let mut r = self.gzipped().to_vec().into_response();
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        } else {
            self.body.into_response()
        };
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(self.content_type),
        );
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        r
    }
}

/// The console's assets, answered without a token (they hold no data).
pub(super) fn assets() -> Router {
    Router::new()
        .route("/ui", get(|h: HeaderMap| async move { INDEX.answer(&h) }))
        .route("/ui/", get(|h: HeaderMap| async move { INDEX.answer(&h) }))
        .route(
            "/ui/app.js",
            get(|h: HeaderMap| async move { SCRIPT.answer(&h) }),
        )
        .route(
            "/ui/app.css",
            get(|h: HeaderMap| async move { STYLE.answer(&h) }),
        )
        .method_not_allowed_fallback(|| async {
            error(
                StatusCode::METHOD_NOT_ALLOWED,
                ErrorCode::MethodNotAllowed,
                "the console's assets take GET and HEAD only",
            )
        })
}

/// `GET /v1/token`, behind the token check like every API route.
pub(super) fn token_route(auth: Arc<Auth>) -> Router {
    Router::new()
        .route("/v1/token", get(token_scope))
        .with_state(auth)
}

/// `GET /v1/token`: what the presented token may do.
async fn token_scope(State(auth): State<Arc<Auth>>, headers: HeaderMap) -> Response {
    match auth.scope(&headers) {
        Some(scope) => axum::Json(TokenScopeBody {
            scope: scope.to_owned(),
            tokens: auth.is_on(),
        })
        .into_response(),
        // The token check refuses such a request before it gets here.
        None => error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "send `Authorization: Bearer <token>` with a token this server accepts",
        ),
    }
}
