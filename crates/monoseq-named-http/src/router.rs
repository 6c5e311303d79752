//! The HTTP API of named sequences: [`router`], JSON in and out, errors as
//! `{"code": ..., "message": ...}` with the stable codes of [`crate::code`]. Owns the route
//! scheme, the checking of the request bodies (`monoseq-wire`'s types, where negative,
//! fractional, zero or oversized numbers become typed errors) and the mapping of errors to
//! status codes.
//!
//! Routes (`{address}` is the textual [`monoseq_named::Address`], e.g. `orders/invoice` or
//! `resource=orders/plugin=backup/run`; the last segment names the operation):
//!
//! | method and path | body | answer |
//! |-----------------|------|--------|
//! | `POST /v1/sequences/{address}/next` | `{"initial"?, "increment"?, "timeout_ms"?, "metadata"?}` | `{"value": first}` |
//! | `POST /v1/sequences/{address}/increment` | as `next` | `{"value": after}` |
//! | `GET /v1/sequences/{address}/value` | | `{"value": n}` or `{"value": null}` |
//! | `GET /v1/sequences/{address}/data` | | sequence data, or 404 `not_found` |
//! | `GET /v1/sequences/{address}/exists` | | `{"exists": bool}` |
//! | `POST /v1/sequences/{address}/reset` (or `/set`) | `{"value", "metadata"?, "timeout_ms"?}` | sequence data |
//! | `DELETE /v1/sequences/{address}` | | 204 |

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, RawPathParamsRejection};
use axum::extract::{DefaultBodyLimit, RawPathParams, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use serde::de::DeserializeOwned;
use serde_json::Value;

use monoseq_named::{
    Address, AddressError, METADATA_BYTES_MAX, Metadata, NextOptions, Sequences, SetOptions,
    VALUE_MAX,
};
use monoseq_wire::{
    Checked, ErrorBody, ErrorCode, NextRequestBody, ResetRequestBody, SequenceExistsBody,
    SequenceValueBody,
};

use crate::Coded;

/// Largest request body, in bytes.
pub const BODY_BYTES_MAX: usize = 64 * 1024;

/// The router of the named-sequence API (paths under `/v1/sequences/`), to serve alone or to
/// merge into a larger router.
///
/// # Example
///
/// ```no_run
/// use monoseq_kv::MemoryStore;
/// use monoseq_named::{KvBackend, Sequences};
/// use monoseq_named_http::router;
///
/// # async fn serve() -> std::io::Result<()> {
/// let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
/// axum::serve(listener, router(sequences)).await
/// # }
/// ```
pub fn router(sequences: Sequences) -> Router {
    Router::new()
        .route("/v1/sequences/{*path}", any(dispatch))
        .layer(DefaultBodyLimit::max(BODY_BYTES_MAX))
        .with_state(sequences)
}

/// An error answer: status, stable code, message.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    code: ErrorCode,
    message: String,
    /// With a 405: the methods the path takes (RFC 9110's `Allow`).
    allow: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            allow: None,
        }
    }

    fn bad_request(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody::new(self.code, self.message);
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(allow) = self.allow {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        if self.code == ErrorCode::Busy || self.code == ErrorCode::StorageUnavailable {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// The status of each stable code.
fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::NotFound | ErrorCode::UnknownOperation => StatusCode::NOT_FOUND,
        ErrorCode::Overflow | ErrorCode::InvalidStored => StatusCode::CONFLICT,
        ErrorCode::Busy | ErrorCode::StorageUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        _ => StatusCode::BAD_REQUEST,
    }
}

fn api<E: std::fmt::Display>(code: ErrorCode, error: E) -> ApiError {
    ApiError::new(status_of(code), code, error.to_string())
}

impl<E: Coded + std::fmt::Display> From<E> for ApiError {
    fn from(e: E) -> ApiError {
        api(e.error_code(), e)
    }
}

async fn dispatch(
    State(sequences): State<Sequences>,
    method: Method,
    params: Result<RawPathParams, RawPathParamsRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match handle(&sequences, &method, params, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn handle(
    sequences: &Sequences,
    method: &Method,
    params: Result<RawPathParams, RawPathParamsRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let params = params.map_err(|e| ApiError::bad_request(ErrorCode::BadRequest, e.body_text()))?;
    let path = params
        .iter()
        .next()
        .map(|(_, value)| value)
        .unwrap_or_default();
    if *method == Method::DELETE {
        // An address is deleted; a path that is no address but names an operation is that
        // operation's, which DELETE is not.
        let address = match parse_address(path) {
            Ok(address) => address,
            Err(e) => {
                return Err(match route(path, method) {
                    Err(not_allowed) if not_allowed.allow.is_some() => not_allowed,
                    _ => e,
                });
            }
        };
        sequences.delete(&address).await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let (address, operation) = route(path, method)?;
    let value = |value| answer(SequenceValueBody { value });
    match operation {
        "value" => value(sequences.get(&address).await?),
        "exists" => answer(SequenceExistsBody {
            exists: sequences.exists(&address).await?,
        }),
        "data" => match sequences.get_data(&address).await? {
            Some(data) => answer(data),
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                format!("sequence {address} does not exist"),
            )),
        },
        "next" | "increment" => {
            let options = next_options(body_of(body)?)?;
            let number = if operation == "next" {
                sequences.next(&address, &options).await?
            } else {
                sequences.increment(&address, &options).await?
            };
            value(Some(number))
        }
        _ => {
            let (value, options) = reset_body(body_of(body)?)?;
            let data = sequences.reset(&address, value, &options).await?;
            answer(data)
        }
    }
}

/// A 200 answer with `body` as JSON.
fn answer(body: impl serde::Serialize) -> Result<Response, ApiError> {
    Ok(axum::Json(body).into_response())
}

/// The address and operation a path names (`ADDRESS/OPERATION`), checked against `method`.
/// A path that is an address alone takes DELETE only.
fn route<'p>(path: &'p str, method: &Method) -> Result<(Address, &'p str), ApiError> {
    let unknown = |message: String| {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::UnknownOperation, message)
    };
    let (address, operation) = path.rsplit_once('/').ok_or_else(|| {
        unknown(format!(
            "{path:?} names no operation; use /v1/sequences/ADDRESS/OPERATION"
        ))
    })?;
    let (allowed, allow) = match operation {
        "value" | "data" | "exists" => (Method::GET, "GET, HEAD"),
        "next" | "increment" | "reset" | "set" => (Method::POST, "POST"),
        _ if path.parse::<Address>().is_ok() => {
            return Err(not_allowed(
                format!(
                    "{path} is a sequence: it takes DELETE only, not {method}; add an operation to the path"
                ),
                "DELETE",
            ));
        }
        _ => {
            parse_address(address)?;
            return Err(unknown(format!(
                "unknown operation {operation:?}; use next, increment, reset, set (POST), \
                 value, data, exists (GET) or DELETE on the address"
            )));
        }
    };
    let address = parse_address(address)?;
    if *method != allowed && !(allowed == Method::GET && *method == Method::HEAD) {
        return Err(not_allowed(
            format!("{operation} takes {allowed}, not {method}"),
            allow,
        ));
    }
    Ok((address, operation))
}

/// A 405 naming the methods the path takes.
fn not_allowed(message: String, allow: &'static str) -> ApiError {
    ApiError {
        allow: Some(allow),
        ..ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::MethodNotAllowed,
            message,
        )
    }
}

/// The body of `reset` / `set`: the value and the options.
fn reset_body(body: ResetRequestBody) -> Result<(u64, SetOptions), ApiError> {
    let value = body.value.ok_or_else(|| {
        ApiError::bad_request(ErrorCode::InvalidValue, "the body needs a \"value\" field")
    })?;
    let value = value_u64(value, "value", ErrorCode::InvalidValue)?;
    let mut options = SetOptions::new();
    if let Some(timeout) = timeout(body.timeout_ms)? {
        options = options.timeout(timeout);
    }
    if let Some(metadata) = metadata(body.metadata)? {
        options = options.metadata(metadata);
    }
    Ok((value, options))
}

fn parse_address(text: &str) -> Result<Address, ApiError> {
    text.parse()
        .map_err(|e: AddressError| ApiError::bad_request(e.error_code(), e.to_string()))
}

/// The body as a request type (an empty body is an empty object).
fn body_of<T: DeserializeOwned + Default>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            let message = format!("the body is over the limit of {BODY_BYTES_MAX} bytes");
            ApiError::new(e.status(), ErrorCode::TooLarge, message)
        } else {
            ApiError::new(e.status(), ErrorCode::BadRequest, e.body_text())
        }
    })?;
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Ok(T::default()),
        // A derived struct would also read a JSON array, field by field in order.
        Some(b'{') => {}
        Some(_) => {
            return Err(ApiError::bad_request(
                ErrorCode::BadRequest,
                "the body must be a JSON object",
            ));
        }
    }
    serde_json::from_slice(&body).map_err(|e| {
        let problem = if e.is_data() {
            "is not a JSON object of the documented fields"
        } else {
            "is not JSON"
        };
        ApiError::bad_request(ErrorCode::BadRequest, format!("the body {problem}: {e}"))
    })
}

/// A request number as a value in `0..=VALUE_MAX`, or the typed error `code`.
fn value_u64(value: Checked<u64>, field: &str, code: ErrorCode) -> Result<u64, ApiError> {
    let problem = match value {
        Checked::Valid(v) if v <= VALUE_MAX => return Ok(v),
        Checked::Valid(v) => format!("{v} is over the largest value {VALUE_MAX}"),
        Checked::Invalid(Value::Number(n)) => match n.as_i64() {
            Some(v) => format!("{v} is negative"),
            None => float_problem(&n),
        },
        Checked::Invalid(other) => format!("{other} is not a number"),
    };
    Err(ApiError::bad_request(
        code,
        format!("\"{field}\": {problem}"),
    ))
}

/// What is wrong with a number serde_json holds as a float and the wire did not read as a whole
/// number from 0 to `u64::MAX` (`5.0` is read as 5): a fraction, or a negative or too large one.
fn float_problem(n: &serde_json::Number) -> String {
    match n.as_f64() {
        Some(f) if f.fract() != 0.0 || !f.is_finite() => format!("{n} is not a whole number"),
        Some(f) if f < 0.0 => format!("{n} is negative"),
        _ => format!("{n} is over the largest value {VALUE_MAX}"),
    }
}

/// `timeout_ms`: any whole number of milliseconds (the options cut it to
/// [`monoseq_named::TIMEOUT_MAX`]), 0 meaning one try.
fn timeout(timeout_ms: Option<Checked<u64>>) -> Result<Option<std::time::Duration>, ApiError> {
    timeout_ms
        .map(|v| match v {
            Checked::Valid(ms) => Ok(ms),
            invalid => value_u64(invalid, "timeout_ms", ErrorCode::BadRequest),
        })
        .transpose()
        .map(|ms| ms.map(std::time::Duration::from_millis))
}

fn metadata(metadata: Option<Checked<Metadata>>) -> Result<Option<Metadata>, ApiError> {
    match metadata {
        None => Ok(None),
        Some(Checked::Valid(map)) => Ok(Some(map)),
        Some(Checked::Invalid(_)) => Err(ApiError::bad_request(
            ErrorCode::InvalidMetadata,
            format!("\"metadata\" must be a JSON object of at most {METADATA_BYTES_MAX} bytes"),
        )),
    }
}

fn next_options(body: NextRequestBody) -> Result<NextOptions, ApiError> {
    let mut options = NextOptions::new();
    if let Some(initial) = body.initial {
        options = options.initial(value_u64(initial, "initial", ErrorCode::InvalidValue)?);
    }
    if let Some(increment) = body.increment {
        let increment = value_u64(increment, "increment", ErrorCode::InvalidIncrement)?;
        let increment = std::num::NonZeroU64::new(increment).ok_or_else(|| {
            ApiError::bad_request(
                ErrorCode::InvalidIncrement,
                "\"increment\": 0 would hand out the same number twice; use 1 or more",
            )
        })?;
        options = options.increment(increment);
    }
    if let Some(timeout) = timeout(body.timeout_ms)? {
        options = options.timeout(timeout);
    }
    if let Some(metadata) = metadata(body.metadata)? {
        options = options.metadata(metadata);
    }
    Ok(options)
}
