//! `POST /v1/commands/batch`: many commands in one request (`monoseq_wire::BatchBody`), each
//! run exactly as if it had come alone to `POST /v1/commands` and answered on its own, in the
//! order sent. One refused command fails only itself; a batch refused whole (not JSON, not a
//! batch, too many commands) wrote nothing.
//!
//! The commands a batch carries for partitions this node serves go to the command processor
//! together (`CommandProcessor::submit_all`): each partition's share is queued at once and
//! written in one group commit (a share its partition's queue has no room for is refused
//! whole, busy); those for partitions another node owns are relayed to that node as one batch
//! per owner, each command's text as the client wrote it.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use monoseq_core::WsId;
use monoseq_cp::{CommandError, IdempotencyKey, RETRY_AFTER_SECS};
use monoseq_wire::{
    BATCH_COMMANDS_MAX, BatchAnswerBody, BatchCommandBody, BatchResultBody, ErrorBody, ErrorCode,
    RawBatchBody,
};
use serde_json::value::RawValue;

use super::AppState;
use super::answers::status_of;
use super::place::{Placed, Relay, unplaced_body};
use crate::base::{chain, error};
use crate::forward::Forwarder;

/// `POST /v1/commands/batch`: reads the batch, runs its commands, counts each in the metrics
/// (its latency from the batch's arrival to its answer) as a single command would be, and
/// answers their results.
pub(super) async fn submit_batch(
    State(st): State<Arc<AppState>>,
    Sent { headers, body }: Sent,
) -> Response {
    let began = std::time::Instant::now();
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            let (status, code) = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge)
            } else {
                (StatusCode::BAD_REQUEST, ErrorCode::BadRequest)
            };
            return error(status, code, rejection.body_text());
        }
    };
    let commands = match read(&headers, &body) {
        Ok(commands) => commands,
        Err((status, code, message)) => return error(status, code, message),
    };
    let results = run(&st, &headers, &commands).await;
    for result in &results {
        let code = result.error.as_ref().map_or("ok", |e| e.code.as_str());
        match &result.error {
            None => {
                st.metrics.commands_ok.inc();
            }
            Some(e) => st.metrics.count_command(e.code.as_str()),
        }
        st.metrics.latency.command(code, began);
    }
    answer(results)
}

/// Where each command of a batch goes.
enum Route<'a> {
    /// To this node's command processor.
    Here(Option<IdempotencyKey>, monoseq_wire::CommandBody),
    /// Relayed to the owner, as sent.
    Owner(Relay<'a>, &'a RawValue),
    /// Answered at once (malformed, or its partition has no reachable owner now).
    Answered(BatchResultBody),
}

/// Commands of a batch, each with its place in the batch, as sent.
type Items<'a> = Vec<(usize, &'a RawValue)>;

/// Why a batch is refused whole: the status, the code and the message.
pub(super) type Refusal = (StatusCode, ErrorCode, String);

/// Reads a batch's body: the commands as text, or why the whole batch is refused.
///
/// # Errors
///
/// 415 without a JSON content type, 400 `malformed_json` or `invalid_batch`, 413
/// `batch_too_large`.
fn read<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<Vec<&'a RawValue>, Refusal> {
    if !is_json(headers) {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::ContentType,
            "a batch is sent with `Content-Type: application/json`".to_owned(),
        ));
    }
    let raw: RawBatchBody<'_> = serde_json::from_slice(body).map_err(|e| {
        let code = if e.is_data() {
            ErrorCode::InvalidBatch
        } else {
            ErrorCode::MalformedJson
        };
        (
            StatusCode::BAD_REQUEST,
            code,
            format!("the body is not a batch `{{\"commands\": [...]}}`: {e}; nothing was run"),
        )
    })?;
    if raw.commands.len() > BATCH_COMMANDS_MAX {
        return Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BatchTooLarge,
            format!(
                "a batch carries at most {BATCH_COMMANDS_MAX} commands, this one {}; split it \
                 (nothing was run)",
                raw.commands.len()
            ),
        ));
    }
    Ok(raw.commands)
}

/// A request's body when it was read whole and is declared JSON; else the refusal: 413
/// `too_large`, 400 `bad_request` (unreadable), 415 `content_type` (naming `what` is sent).
pub(super) fn json_bytes(
    headers: &HeaderMap,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
    what: &str,
) -> Result<axum::body::Bytes, Refusal> {
    let body = body.map_err(|rejection| {
        let (status, code) = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            (StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::TooLarge)
        } else {
            (StatusCode::BAD_REQUEST, ErrorCode::BadRequest)
        };
        (status, code, rejection.body_text())
    })?;
    if !is_json(headers) {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::ContentType,
            format!("{what} is sent with `Content-Type: application/json`"),
        ));
    }
    Ok(body)
}

pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim();
            let (start, end) = (
                mime.get(..12),
                mime.len().checked_sub(5).and_then(|at| mime.get(at..)),
            );
            mime.eq_ignore_ascii_case("application/json")
                || (start.is_some_and(|s| s.eq_ignore_ascii_case("application/"))
                    && end.is_some_and(|e| e.eq_ignore_ascii_case("+json")))
        })
}

/// A request's headers and its body read whole, for the handlers that need both: the headers
/// are moved out of the request (axum's `HeaderMap` extractor clones them, an allocation per
/// header on every command).
pub(super) struct Sent {
    pub(super) headers: HeaderMap,
    /// The body, or why it could not be read (too large, cut off).
    pub(super) body: Result<Bytes, BytesRejection>,
}

impl<S: Send + Sync> FromRequest<S> for Sent {
    type Rejection = std::convert::Infallible;

    async fn from_request(mut request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let headers = std::mem::take(request.headers_mut());
        Ok(Sent {
            headers,
            body: Bytes::from_request(request, state).await,
        })
    }
}

/// Runs the commands of a batch and answers each: those of partitions served here through
/// the command processor, the others relayed to their owners (unless this request was itself
/// relayed), one batch per owner.
async fn run(st: &AppState, headers: &HeaderMap, commands: &[&RawValue]) -> Vec<BatchResultBody> {
    let relayed = Forwarder::was_forwarded(headers);
    let routes: Vec<Route<'_>> = commands.iter().map(|raw| route(st, relayed, raw)).collect();
    let mut results: Vec<Option<BatchResultBody>> = vec![None; routes.len()];
    let mut here = Vec::new();
    let mut owners: BTreeMap<String, (Relay<'_>, Items<'_>)> = BTreeMap::new();
    for (i, route) in routes.into_iter().enumerate() {
        match route {
            Route::Here(key, command) => here.push((i, key, command)),
            Route::Owner(relay, raw) => {
                let url = relay.url.clone();
                owners
                    .entry(url)
                    .or_insert((relay, Vec::new()))
                    .1
                    .push((i, raw));
            }
            Route::Answered(result) => results[i] = Some(result),
        }
    }
    let (places, commands): (Vec<usize>, Vec<_>) = here
        .into_iter()
        .map(|(i, key, command)| (i, (crate::wire::command(command), key)))
        .unzip();
    let local = async {
        let answers = st.cp.submit_all(commands).await;
        places
            .into_iter()
            .zip(answers)
            .map(|(i, answer)| (i, answer.map_or_else(|e| refused(&e), ok)))
            .collect::<Vec<_>>()
    };
    let relayed = join_all(
        owners
            .into_values()
            .map(|(relay, items)| async move { self::relay(&relay, items).await }),
    );
    let (local, relayed) = tokio::join!(local, relayed);
    for (i, result) in local.into_iter().chain(relayed.into_iter().flatten()) {
        results[i] = Some(result);
    }
    results
        .into_iter()
        .map(|r| r.unwrap_or_else(|| internal("the command got no result")))
        .collect()
}

fn route<'a>(st: &'a AppState, relayed: bool, raw: &'a RawValue) -> Route<'a> {
    let item: BatchCommandBody = match serde_json::from_str(raw.get()) {
        Ok(item) => item,
        Err(e) => {
            return Route::Answered(invalid(
                ErrorCode::InvalidCommand,
                format!("the command is not valid: {e}; it was not run"),
            ));
        }
    };
    let (key, command) = item.into_parts();
    let key = match key.as_deref().map(IdempotencyKey::new).transpose() {
        Ok(key) => key,
        Err(e) => return Route::Answered(refused(&e)),
    };
    let partition = st.cp.partition_of(WsId(command.ws));
    match st.place(partition, relayed) {
        Placed::Local => Route::Here(key, command),
        Placed::Relay(relay) => Route::Owner(relay, raw),
        Placed::Unavailable(why) => Route::Answered(unplaced_body(partition, why)),
    }
}

/// The owner's results for `items` (relayed through `relay`), or each item refused with the
/// reason the relay failed; an owner that did not answer, or no longer serves a partition,
/// makes the membership read the lease table soon.
async fn relay(relay: &Relay<'_>, items: Vec<(usize, &RawValue)>) -> Vec<(usize, BatchResultBody)> {
    let url = &relay.url;
    let body = relayed_body(items.iter().map(|(_, raw)| *raw));
    let results = match relay.forwarder.batch(url, body).await {
        Ok(answer) if answer.results.len() == items.len() => items
            .into_iter()
            .map(|(i, _)| i)
            .zip(answer.results)
            .collect(),
        Ok(answer) => {
            let message = format!(
                "the owner at {url} answered {} results for {} commands; whether they ran is \
                 unknown: retry them with their idempotency keys",
                answer.results.len(),
                items.len()
            );
            fail_all(items, &internal(message))
        }
        Err(result) => fail_all(items, &result),
    };
    let unavailable = StatusCode::SERVICE_UNAVAILABLE.as_u16();
    if results.iter().any(|(_, r)| r.status == unavailable) {
        // The owner read last did not answer, or no longer serves the partition.
        relay.cluster.read_soon();
    }
    results
}

/// `{"commands":[…]}` of the commands' text as the client sent it.
fn relayed_body<'a>(commands: impl Iterator<Item = &'a RawValue>) -> Bytes {
    let mut body = Vec::from(&b"{\"commands\":["[..]);
    for (n, raw) in commands.enumerate() {
        if n > 0 {
            body.push(b',');
        }
        body.extend_from_slice(raw.get().as_bytes());
    }
    body.extend_from_slice(b"]}");
    Bytes::from(body)
}

fn fail_all(
    items: Vec<(usize, &RawValue)>,
    result: &BatchResultBody,
) -> Vec<(usize, BatchResultBody)> {
    items
        .into_iter()
        .map(|(i, _)| (i, result.clone()))
        .collect()
}

fn ok(outcome: monoseq_cp::Outcome) -> BatchResultBody {
    let replayed = outcome.replayed;
    BatchResultBody::ok(crate::wire::outcome(outcome), replayed)
}

/// The result of a refused command: the status and body `POST /v1/commands` would answer.
fn refused(e: &CommandError) -> BatchResultBody {
    BatchResultBody::refused(
        status_of(e.class()).as_u16(),
        ErrorBody {
            code: super::answers::command_code(e),
            message: chain(e),
            key: None,
            current_wlog_offset: e.current_wlog_offset(),
        },
        e.is_transient().then_some(RETRY_AFTER_SECS),
    )
}

fn invalid(code: ErrorCode, message: String) -> BatchResultBody {
    BatchResultBody::refused(
        StatusCode::BAD_REQUEST.as_u16(),
        ErrorBody {
            code: code.to_owned(),
            message,
            key: None,
            current_wlog_offset: None,
        },
        None,
    )
}

fn internal(message: impl Into<String>) -> BatchResultBody {
    BatchResultBody::refused(
        StatusCode::INTERNAL_SERVER_ERROR.as_u16(),
        ErrorBody {
            code: ErrorCode::Internal,
            message: message.into(),
            key: None,
            current_wlog_offset: None,
        },
        None,
    )
}

/// The answer to a batch that was run: 200 with one result per command.
fn answer(results: Vec<BatchResultBody>) -> Response {
    axum::Json(BatchAnswerBody { results }).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, value.parse().expect("a header value"));
        headers
    }

    #[test]
    fn a_json_media_type_is_recognised_in_any_case_with_parameters_and_as_a_json_suffix() {
        for json in [
            "application/json",
            "Application/JSON",
            " application/json ; charset=utf-8",
            "application/problem+json",
            "APPLICATION/VND.API+JSON;v=1",
        ] {
            assert!(is_json(&typed(json)), "{json:?} is JSON");
        }
        for other in [
            "text/plain",
            "application/jsonl",
            "application/json-seq",
            "text/json",
            "json",
            "application",
            "",
            "application/x+jsonp",
        ] {
            assert!(!is_json(&typed(other)), "{other:?} is not JSON");
        }
        assert!(!is_json(&HeaderMap::new()), "no content type is not JSON");
    }
}
