//! Server-side filters of multi-partition streams and group sessions (`command`,
//! `command_prefix`, `ws`, `kind` query parameters, decoded by `crate::query`), and the
//! checks of the numbers those endpoints take.

use std::sync::Arc;
use std::time::Duration;

use monoseq_store::{Event, EventPeek};
use monoseq_wire::EventBody;

use crate::query::Params;

/// Longest filter value, in bytes (a command name is at most this long).
pub(super) const FILTER_BYTES_MAX: usize = 255;

/// A parameter of a stream, a group session or a filter that the server refuses (answered 400
/// with this text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum ParamError {
    /// Not a decimal unsigned integer.
    #[error("`{name}` is a decimal unsigned integer, not {value:?}")]
    NotNumber { name: &'static str, value: String },
    /// A number of milliseconds out of its range.
    #[error("`{name}` is {min} to {max} milliseconds (got {got})")]
    Millis {
        name: &'static str,
        min: u64,
        max: u64,
        got: u64,
    },
    /// A workspace kind past the largest.
    #[error("`kind` is a workspace kind, 0 to {max} (got {got})", max = u16::MAX)]
    Kind { got: u64 },
    /// An empty text filter.
    #[error("`{0}` is empty: name what to keep, or leave it out")]
    Empty(&'static str),
    /// A text filter longer than [`FILTER_BYTES_MAX`].
    #[error("`{name}` is {len} bytes; at most {FILTER_BYTES_MAX}")]
    TooLong { name: &'static str, len: usize },
}

/// A decimal unsigned integer parameter.
pub(super) fn number(name: &'static str, value: &str) -> Result<u64, ParamError> {
    value.parse::<u64>().map_err(|_| ParamError::NotNumber {
        name,
        value: value.to_owned(),
    })
}

/// A millisecond parameter within `range`.
pub(super) fn millis(
    name: &'static str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, ParamError> {
    let n = number(name, value)?;
    if !range.contains(&n) {
        return Err(ParamError::Millis {
            name,
            min: *range.start(),
            max: *range.end(),
            got: n,
        });
    }
    Ok(Duration::from_millis(n))
}

/// Which events a stream delivers; the others are read past and reported by `progress`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Filter {
    command: Option<String>,
    command_prefix: Option<String>,
    ws: Option<u64>,
    kind: Option<u16>,
}

impl Filter {
    /// Takes the filter parameters of a request (others are left to the caller).
    pub(super) fn from_params(params: &Params) -> Result<Filter, ParamError> {
        let kind = match params.get("kind") {
            None => None,
            Some(v) => {
                let n = number("kind", v)?;
                Some(u16::try_from(n).map_err(|_| ParamError::Kind { got: n })?)
            }
        };
        Ok(Filter {
            command: params
                .get("command")
                .map(|v| text("command", v))
                .transpose()?,
            command_prefix: params
                .get("command_prefix")
                .map(|v| text("command_prefix", v))
                .transpose()?,
            ws: params.get("ws").map(|v| number("ws", v)).transpose()?,
            kind,
        })
    }

    /// Whether it lets every event through.
    pub(super) fn is_all(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether a stored event passes.
    pub(super) fn stored(&self, e: &Event) -> bool {
        self.passes(e.command.as_bytes(), e.ws.0, e.ws_kind.0)
    }

    /// Whether a relayed event passes.
    pub(super) fn relayed(&self, e: &EventBody) -> bool {
        self.passes(e.command.as_bytes(), e.ws, e.ws_kind)
    }

    fn passes(&self, command: &[u8], ws: u64, kind: u16) -> bool {
        self.command
            .as_deref()
            .is_none_or(|c| c.as_bytes() == command)
            && self
                .command_prefix
                .as_deref()
                .is_none_or(|p| command.starts_with(p.as_bytes()))
            && self.ws.is_none_or(|w| w == ws)
            && self.kind.is_none_or(|k| k == kind)
    }

    /// Whether a stored event passes, from its place and command name as the store reads them
    /// before building the event ([`monoseq_store::EventStore::read_plog_page_where`]): the
    /// events it refuses are checked and counted there, never built.
    pub(super) fn peeked(&self, e: &EventPeek<'_>) -> bool {
        self.passes(e.command, e.head.ws.0, e.head.ws_kind.0)
    }

    /// The filter a store read applies: `None` when it lets every event through.
    pub(super) fn for_store(self: &Arc<Filter>) -> Option<Arc<Filter>> {
        (!self.is_all()).then(|| Arc::clone(self))
    }
}

/// A non-empty text filter of at most [`FILTER_BYTES_MAX`] bytes.
fn text(name: &'static str, value: &str) -> Result<String, ParamError> {
    if value.is_empty() {
        return Err(ParamError::Empty(name));
    }
    if value.len() > FILTER_BYTES_MAX {
        return Err(ParamError::TooLong {
            name,
            len: value.len(),
        });
    }
    Ok(value.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(query: &str) -> Result<Filter, ParamError> {
        let params =
            crate::query::params(Some(query), &["command", "command_prefix", "ws", "kind"])
                .expect("known parameters");
        Filter::from_params(&params)
    }

    #[test]
    fn filters_keep_what_they_name_and_refuse_empty_or_long_values() {
        let f = filter("command_prefix=app.Pay&kind=3").unwrap();
        assert!(f.passes(b"app.PayOrder", 9, 3));
        assert!(!f.passes(b"app.PayOrder", 9, 4));
        assert!(!f.passes(b"app.ShipOrder", 9, 3));
        let exact = filter("command=app%2EPay").unwrap();
        assert!(exact.passes(b"app.Pay", 1, 1) && !exact.passes(b"app.PayOrder", 1, 1));
        assert!(filter("command=").is_err());
        let long = "x".repeat(FILTER_BYTES_MAX + 1);
        assert!(filter(&format!("command={long}")).is_err());
        assert!(filter("ws=-1").is_err());
        assert!(filter("kind=70000").is_err());
        assert!(Filter::default().is_all());
    }
}
