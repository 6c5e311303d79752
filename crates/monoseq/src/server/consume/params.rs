//! What a page read or a tail asks: `from` (an offset or `end`), `limit`, `wait_ms`, a
//! tail's `Last-Event-ID`, the path's partition; each checked with a 400 naming it.

use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::http::HeaderMap;
use monoseq_membership::Unplaced;
use monoseq_wire::{PLOG_PAGE_MAX, WAIT_MS_MAX};

use super::super::AppState;
use super::OFFSET_READ_MAX;
use super::error::ConsumeError;
use crate::query;

/// Entries a page read answers when the request names no `limit`.
const PAGE_DEFAULT: usize = 100;

/// Where a read or a tail starts: at a PLog (or WLog) offset, or at the current end
/// (`from=end`: only what is written from now on).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// At this offset (1 or more).
    At(u64),
    /// At the end as the partition's owner knows it when the read starts.
    End,
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Start::At(offset) => write!(f, "{offset}"),
            Start::End => f.write_str("end"),
        }
    }
}

/// The offsets and sizes a read names, each checked with a 400 naming it.
pub(super) struct ReadQuery {
    pub(super) from: Start,
    pub(super) limit: usize,
    pub(super) wait: Duration,
}

/// Parses `from` (an offset or `end`), `limit` and `wait_ms` of a query (`from` defaults to
/// 1); refuses every parameter not in `accepted` (see [`query::params`]).
pub(super) fn read_query(
    raw: Option<&str>,
    accepted: &[&str],
    limit_max: usize,
) -> Result<ReadQuery, ConsumeError> {
    let params = query::parse(raw, accepted)?;
    let number = |name: &str, value: &str, what: &str| {
        value.parse::<u64>().map_err(|_| {
            ConsumeError::bad_request(format!(
                "`{name}` is {what}, not {value:?}: send a decimal unsigned integer"
            ))
        })
    };
    let mut q = ReadQuery {
        from: Start::At(1),
        limit: PAGE_DEFAULT.min(limit_max),
        wait: Duration::ZERO,
    };
    match params.get("from") {
        None => {}
        Some("end") => q.from = Start::End,
        Some(value) => {
            let from = number("from", value, "an offset (1 or more) or `end`")?;
            if from == 0 {
                return Err(ConsumeError::bad_request(
                    "`from` starts at 1 (the first offset), or is `end`",
                ));
            }
            q.from = Start::At(from);
        }
    }
    if let Some(value) = params.get("limit") {
        let n = number("limit", value, &format!("a count (1 to {limit_max})"))?;
        if n == 0 || n > limit_max as u64 {
            return Err(ConsumeError::bad_request(format!(
                "`limit` is 1 to {limit_max} (got {n})"
            )));
        }
        q.limit = n as usize;
    }
    if let Some(value) = params.get("wait_ms") {
        let n = number(
            "wait_ms",
            value,
            &format!("milliseconds (0 to {WAIT_MS_MAX})"),
        )?;
        if n > WAIT_MS_MAX {
            return Err(ConsumeError::bad_request(format!(
                "`wait_ms` is 0 to {WAIT_MS_MAX} (got {n})"
            )));
        }
        q.wait = Duration::from_millis(n);
    }
    Ok(q)
}

/// The 400 of a path whose parameters do not parse.
pub(super) fn path_error(rejection: &PathRejection) -> ConsumeError {
    ConsumeError::bad_request(format!(
        "the path's parameters are unsigned integers: {}",
        rejection.body_text()
    ))
}

/// 404 for a partition the server does not have.
pub(super) fn check_partition(st: &AppState, partition: u32) -> Result<(), ConsumeError> {
    let partitions = st.cp.config().partitions;
    if partition < partitions {
        return Ok(());
    }
    Err(ConsumeError::Unplaced {
        partition,
        why: Unplaced::NoSuchPartition { partitions },
    })
}

/// The resume point a `Last-Event-ID` names (the offset after it), if sent.
fn last_event_id(headers: &HeaderMap) -> Result<Option<u64>, ConsumeError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let id = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|id| *id < OFFSET_READ_MAX)
        .ok_or_else(|| {
            ConsumeError::bad_request(format!(
                "`Last-Event-ID` is the last offset received, a decimal unsigned integer \
                 (got {value:?})"
            ))
        })?;
    Ok(Some(id + 1))
}

/// Where a tail starts: after `Last-Event-ID` when sent, else `from` (default 1; `end`).
pub(super) fn stream_from(raw: Option<&str>, headers: &HeaderMap) -> Result<Start, ConsumeError> {
    let q = read_query(raw, query::STREAM_PARAMS, PLOG_PAGE_MAX)?;
    Ok(last_event_id(headers)?.map_or(q.from, Start::At))
}
