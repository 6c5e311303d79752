//! What the binary's modules share and what depends on nothing else of the binary: the
//! application the server runs, the store type, the JSON error answer every endpoint gives,
//! an error chain rendered with each cause once, and the wait for a stop signal. Kept at the
//! bottom of the module graph so that no import cycle runs through it.

use std::sync::Arc;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use monoseq_kv::KvStore;
use monoseq_store::AppId;

/// A key-value store of either kind, as the server and the tools use it.
pub type Store = Arc<dyn KvStore>;

/// The application the server runs (one per data directory).
pub const APP: AppId = AppId(1);

/// The JSON error answer `{"code", "message"}` of every endpoint.
pub(crate) fn error(
    status: StatusCode,
    code: monoseq_wire::ErrorCode,
    message: impl std::fmt::Display,
) -> Response {
    (
        status,
        axum::Json(monoseq_wire::ErrorBody::new(code, message.to_string())),
    )
        .into_response()
}

pub(crate) use monoseq_kv::chain;

/// Resolves when the process is asked to stop: SIGINT (Ctrl-C) or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}
