//! Query parameters, refused unless documented: [`params`] parses a request's query for a
//! handler, given the names its endpoint accepts, and [`refuse_unknown`], a layer over the
//! whole router, answers 400 naming every parameter its route does not accept
//! ([`ROUTE_PARAMS`], matched by path pattern; a path not listed there accepts none), so a
//! typo such as `?limt=1` is never silently ignored. A new endpoint that takes parameters adds one line to
//! [`ROUTE_PARAMS`] and passes the same list to [`params`].

// The helpers return the answer a refused query gets: a `Response` (128 bytes) once per
// request, not on a hot path.
#![allow(clippy::result_large_err)]

use axum::extract::Request;
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;

use crate::base::error;
use monoseq_wire::ErrorCode;

/// The parameters of a partition's page read.
pub(crate) const PAGE_PARAMS: &[&str] = &["from", "limit", "wait_ms"];
/// The parameters of a partition's or a workspace's live tail.
pub(crate) const STREAM_PARAMS: &[&str] = &["from"];
/// The parameters of a workspace's WLog page read.
pub(crate) const WLOG_PARAMS: &[&str] = &["from", "limit", "wait_ms"];
/// The parameters of the listing of every consumer.
pub(crate) const CONSUMERS_PARAMS: &[&str] = &["after"];
/// The parameters of a stream over many partitions.
pub(crate) const EVENTS_STREAM_PARAMS: &[&str] = &[
    "partitions",
    "from",
    "command",
    "command_prefix",
    "ws",
    "kind",
];
/// The parameters of a group member's session.
pub(crate) const SESSION_PARAMS: &[&str] = &[
    "member",
    "session_timeout_ms",
    "command",
    "command_prefix",
    "ws",
    "kind",
];

/// The query parameters each route accepts, by its path pattern; every other route accepts
/// none.
pub(crate) const ROUTE_PARAMS: &[(&str, &[&str])] = &[
    ("/v1/partitions/{partition}/events", PAGE_PARAMS),
    ("/v1/partitions/{partition}/events/stream", STREAM_PARAMS),
    ("/v1/workspaces/{ws}/wlog", WLOG_PARAMS),
    ("/v1/workspaces/{ws}/wlog/stream", STREAM_PARAMS),
    ("/v1/consumers", CONSUMERS_PARAMS),
    ("/v1/events/stream", EVENTS_STREAM_PARAMS),
    ("/v1/groups/{group}/stream", SESSION_PARAMS),
];

/// Characters of a refused parameter's name repeated in the error.
const NAME_SHOWN_CHARS_MAX: usize = 64;

/// A request's query parameters, each named once and accepted by its endpoint, their names
/// and values percent-decoded.
#[derive(Debug, Default)]
pub(crate) struct Params(Vec<(String, String)>);

impl Params {
    /// The value of parameter `name`, if the request gives it.
    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The parameters of query `raw` (`None`: the request has no query), or a 400 naming each
/// one not in `accepted`, one given twice, or a query that does not decode.
pub(crate) fn params(raw: Option<&str>, accepted: &[&str]) -> Result<Params, Response> {
    parse(raw, accepted).map_err(|e| bad_request(e.0))
}

/// A refused query: what the 400 of [`params`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueryError(pub(crate) String);

/// As [`params`], the refusal as its message.
pub(crate) fn parse(raw: Option<&str>, accepted: &[&str]) -> Result<Params, QueryError> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(Params::default());
    };
    let pairs = decode(raw)?;
    let unknown: Vec<String> = pairs
        .iter()
        .filter(|(name, _)| !accepted.contains(&name.as_str()))
        .map(|(name, _)| format!("`{}`", shown(name)))
        .collect();
    if !unknown.is_empty() {
        let takes = if accepted.is_empty() {
            "this endpoint takes no query parameters".to_owned()
        } else {
            let names: Vec<String> = accepted.iter().map(|n| format!("`{n}`")).collect();
            format!("this endpoint takes {}", names.join(", "))
        };
        let plural = if unknown.len() == 1 { "" } else { "s" };
        return Err(QueryError(format!(
            "unknown query parameter{plural} {}: {takes} (see docs/openapi.json)",
            unknown.join(", ")
        )));
    }
    for (i, (name, _)) in pairs.iter().enumerate() {
        if pairs[..i].iter().any(|(earlier, _)| earlier == name) {
            return Err(QueryError(format!(
                "`{}` is given twice: give each query parameter once",
                shown(name)
            )));
        }
    }
    Ok(Params(pairs))
}

/// The name/value pairs of `raw`, percent-decoded (`+` is a space).
fn decode(raw: &str) -> Result<Vec<(String, String)>, QueryError> {
    let refused = || {
        QueryError(
            "the query does not decode: it is name=value pairs joined by `&`, percent-encoded \
             as UTF-8"
                .to_owned(),
        )
    };
    let uri: Uri = format!("/?{raw}").parse().map_err(|_| refused())?;
    axum::extract::Query::<Vec<(String, String)>>::try_from_uri(&uri)
        .map(|q| q.0)
        .map_err(|_| refused())
}

/// A parameter name as an error repeats it: cut to a readable length.
fn shown(name: &str) -> String {
    name.chars()
        .take(NAME_SHOWN_CHARS_MAX)
        .flat_map(char::escape_debug)
        .collect()
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
}

/// The layer over every route (inside the token check): a request whose query names a
/// parameter its route does not accept ([`ROUTE_PARAMS`]) is answered 400 naming it, before
/// its handler runs. A request that matched no route goes on (to the 404 fallback).
pub(crate) async fn refuse_unknown(request: Request, next: Next) -> Response {
    if request.uri().query().is_some() {
        let path = request.uri().path();
        let accepted = ROUTE_PARAMS
            .iter()
            .find(|(pattern, _)| matches_route(pattern, path))
            .map_or(&[][..], |(_, names)| *names);
        if let Err(refused) = params(request.uri().query(), accepted) {
            return refused;
        }
    }
    next.run(request).await
}

/// Whether `path` is one of route `pattern` (a `{name}` segment stands for any one segment).
fn matches_route(pattern: &str, path: &str) -> bool {
    let (mut want, mut got) = (pattern.split('/'), path.split('/'));
    loop {
        match (want.next(), got.next()) {
            (None, None) => return true,
            (Some(w), Some(g)) if w == g || (w.starts_with('{') && !g.is_empty()) => {}
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn message(r: Response) -> String {
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let body = axum::body::to_bytes(r.into_body(), 4096)
            .await
            .expect("a body");
        String::from_utf8(body.to_vec()).expect("UTF-8")
    }

    #[tokio::test]
    async fn accepted_parameters_are_decoded_and_unknown_ones_refused_by_name() {
        let p = params(Some("from=3&after=a%2Fb+c"), &["from", "after"]).unwrap();
        assert_eq!((p.get("from"), p.get("after")), (Some("3"), Some("a/b c")));
        assert_eq!(p.get("limit"), None);
        assert!(params(None, &[]).unwrap().get("x").is_none());
        assert!(params(Some(""), &[]).unwrap().get("x").is_none());
        let typo = message(params(Some("from=1&limt=1"), PAGE_PARAMS).unwrap_err()).await;
        assert!(
            typo.contains("unknown query parameter `limt`")
                && typo.contains("takes `from`, `limit`, `wait_ms`"),
            "{typo}"
        );
        let none = message(params(Some("a=1&b"), &[]).unwrap_err()).await;
        assert!(
            none.contains("parameters `a`, `b`") && none.contains("takes no query"),
            "{none}"
        );
        let twice = message(params(Some("from=1&from=2"), PAGE_PARAMS).unwrap_err()).await;
        assert!(twice.contains("`from` is given twice"), "{twice}");
    }

    #[test]
    fn a_path_matches_the_route_pattern_segment_by_segment() {
        let stream = "/v1/partitions/{partition}/events/stream";
        assert!(matches_route(stream, "/v1/partitions/3/events/stream"));
        assert!(!matches_route(stream, "/v1/partitions/3/events"));
        assert!(!matches_route(stream, "/v1/partitions//events/stream"));
        assert!(!matches_route(stream, "/v1/partitions/3/events/stream/x"));
        assert!(matches_route("/v1/consumers", "/v1/consumers"));
        assert!(!matches_route("/v1/consumers", "/v1/consumers/c"));
    }

    #[test]
    fn every_route_with_parameters_lists_each_name_once() {
        for (route, names) in ROUTE_PARAMS {
            for (i, name) in names.iter().enumerate() {
                assert!(!names[..i].contains(name), "{route}: {name} twice");
            }
        }
    }
}
