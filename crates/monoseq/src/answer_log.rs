//! The answer log, a test aid: with `MONOSEQ_ANSWER_LOG=<file>` in its environment the server
//! appends one JSON line per answer (method, path, status, the documented headers, the body)
//! to that file, so the end-to-end tests can check every answer they caused against the
//! OpenAPI document (`docs/openapi.json`). Off unless the variable is set; never on a
//! production path (each answer's body is buffered whole to be written).

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use serde::Serialize;

/// The environment variable naming the file.
pub const ANSWER_LOG_ENV: &str = "MONOSEQ_ANSWER_LOG";
/// The answer headers the document describes, and so the ones logged.
const LOGGED_HEADERS: [&str; 6] = [
    "allow",
    "content-type",
    "retry-after",
    "location",
    "idempotency-replayed",
    "www-authenticate",
];

/// One line of the log: an answer as the tests read it back.
#[derive(Serialize)]
struct Line<'a> {
    method: &'a str,
    path: &'a str,
    status: u16,
    /// The [`LOGGED_HEADERS`] the answer carries, by name.
    headers: std::collections::BTreeMap<&'static str, &'a str>,
    body: std::borrow::Cow<'a, str>,
}

/// The open log file.
#[derive(Clone)]
pub struct AnswerLog(Arc<Mutex<std::fs::File>>);

impl AnswerLog {
    /// The log named by [`ANSWER_LOG_ENV`], if set and openable (a warning otherwise).
    pub fn from_env() -> Option<AnswerLog> {
        let path = std::env::var_os(ANSWER_LOG_ENV)?;
        match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            Ok(file) => Some(AnswerLog(Arc::new(Mutex::new(file)))),
            Err(e) => {
                tracing::warn!(path = ?path, "the answer log cannot be opened: {}", crate::base::chain(&e));
                None
            }
        }
    }
}

/// The middleware: runs the request, logs its answer, returns the answer unchanged.
pub async fn record(State(log): State<AnswerLog>, request: Request, next: Next) -> Response {
    let method = request.method().to_string();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let (parts, body) = response.into_parts();
    // A live tail never ends: it is logged without its body, which passes through as it comes.
    let streamed = parts
        .headers
        .get("content-type")
        .is_some_and(|c| c.as_bytes().starts_with(b"text/event-stream"));
    let (bytes, body) = if streamed {
        (axum::body::Bytes::new(), body)
    } else {
        let bytes = axum::body::to_bytes(body, usize::MAX)
            .await
            .unwrap_or_default();
        (bytes.clone(), Body::from(bytes))
    };
    let headers = LOGGED_HEADERS
        .iter()
        .filter_map(|name| Some((*name, parts.headers.get(*name)?.to_str().ok()?)))
        .collect();
    let line = Line {
        method: &method,
        path: &path,
        status: parts.status.as_u16(),
        headers,
        body: String::from_utf8_lossy(&bytes),
    };
    // One write of the whole line: a server killed mid-answer leaves whole lines only.
    let mut text = serde_json::to_string(&line).unwrap_or_default();
    text.push('\n');
    if let Ok(mut file) = log.0.lock() {
        let _ = file.write_all(text.as_bytes());
    }
    Response::from_parts(parts, body)
}
