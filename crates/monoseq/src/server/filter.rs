//! Server-side filters of multi-partition streams and group sessions (`command`,
//! `command_prefix`, `ws`, `kind` query parameters), and the strict query parsing those
//! endpoints share: every parameter is named in the endpoint's list, or the request is
//! refused with a 400 naming it.

use std::time::Duration;

use monoseq_store::Event;
use monoseq_wire::EventBody;

/// Longest filter value, in bytes (a command name is at most this long).
pub(super) const FILTER_BYTES_MAX: usize = 255;

/// The query parameters of a request as `(name, value)` pairs, each name in `accepted`, none
/// twice; or the 400 message naming the first that is not.
pub(super) fn query_pairs<'a>(
    raw: Option<&'a str>,
    accepted: &[&str],
) -> Result<Vec<(&'a str, &'a str)>, String> {
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !accepted.contains(&name) {
            return Err(format!(
                "unknown query parameter `{name}`: this endpoint takes {}",
                if accepted.is_empty() {
                    "none".to_owned()
                } else {
                    accepted
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        if pairs.iter().any(|(n, _)| *n == name) {
            return Err(format!("query parameter `{name}` is given twice"));
        }
        pairs.push((name, value));
    }
    Ok(pairs)
}

/// A value's percent-decoding (a command name may hold reserved characters).
pub(super) fn decoded(name: &str, value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("`{name}` holds a malformed percent-escape"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{name}` is not UTF-8 once decoded"))
}

/// A decimal unsigned integer parameter.
pub(super) fn number(name: &str, value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .map_err(|_| format!("`{name}` is a decimal unsigned integer, not {value:?}"))
}

/// A millisecond parameter within `range`.
pub(super) fn millis(
    name: &str,
    value: &str,
    range: std::ops::RangeInclusive<u64>,
) -> Result<Duration, String> {
    let n = number(name, value)?;
    if !range.contains(&n) {
        return Err(format!(
            "`{name}` is {} to {} milliseconds (got {n})",
            range.start(),
            range.end()
        ));
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

/// The filter parameters every stream takes.
pub(super) const FILTER_PARAMS: [&str; 4] = ["command", "command_prefix", "ws", "kind"];

impl Filter {
    /// Takes the filter parameters of `pairs` (others are left to the caller).
    pub(super) fn from_pairs(pairs: &[(&str, &str)]) -> Result<Filter, String> {
        let mut f = Filter::default();
        for &(name, value) in pairs {
            match name {
                "command" => f.command = Some(text(name, value)?),
                "command_prefix" => f.command_prefix = Some(text(name, value)?),
                "ws" => f.ws = Some(number(name, value)?),
                "kind" => {
                    let n = number(name, value)?;
                    let kind = u16::try_from(n).map_err(|_| {
                        format!("`kind` is a workspace kind, 0 to {} (got {n})", u16::MAX)
                    })?;
                    f.kind = Some(kind);
                }
                _ => {}
            }
        }
        Ok(f)
    }

    /// Whether it lets every event through.
    pub(super) fn is_all(&self) -> bool {
        *self == Filter::default()
    }

    /// Whether a stored event passes.
    pub(super) fn stored(&self, e: &Event) -> bool {
        self.passes(&e.command, e.ws.0, e.ws_kind.0)
    }

    /// Whether a relayed event passes.
    pub(super) fn relayed(&self, e: &EventBody) -> bool {
        self.passes(&e.command, e.ws, e.ws_kind)
    }

    fn passes(&self, command: &str, ws: u64, kind: u16) -> bool {
        self.command.as_deref().is_none_or(|c| c == command)
            && self
                .command_prefix
                .as_deref()
                .is_none_or(|p| command.starts_with(p))
            && self.ws.is_none_or(|w| w == ws)
            && self.kind.is_none_or(|k| k == kind)
    }
}

/// A non-empty text filter of at most [`FILTER_BYTES_MAX`] bytes.
fn text(name: &str, value: &str) -> Result<String, String> {
    let v = decoded(name, value)?;
    if v.is_empty() {
        return Err(format!(
            "`{name}` is empty: name what to keep, or leave it out"
        ));
    }
    if v.len() > FILTER_BYTES_MAX {
        return Err(format!(
            "`{name}` is {} bytes; at most {FILTER_BYTES_MAX}",
            v.len()
        ));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_or_repeated_parameter_is_refused_by_name() {
        let e = query_pairs(Some("from=1&limt=2"), &["from", "limit"]).unwrap_err();
        assert!(e.contains("`limt`"), "{e}");
        let e = query_pairs(Some("from=1&from=2"), &["from"]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        assert_eq!(
            query_pairs(Some("from=1&&limit=2"), &["from", "limit"]).unwrap(),
            vec![("from", "1"), ("limit", "2")]
        );
    }

    #[test]
    fn filters_keep_what_they_name_and_refuse_empty_or_long_values() {
        let f = Filter::from_pairs(&[("command_prefix", "app.Pay"), ("kind", "3")]).unwrap();
        assert!(f.passes("app.PayOrder", 9, 3));
        assert!(!f.passes("app.PayOrder", 9, 4));
        assert!(!f.passes("app.ShipOrder", 9, 3));
        let exact = Filter::from_pairs(&[("command", "app%2EPay")]).unwrap();
        assert!(exact.passes("app.Pay", 1, 1) && !exact.passes("app.PayOrder", 1, 1));
        assert!(Filter::from_pairs(&[("command", "")]).is_err());
        let long = "x".repeat(FILTER_BYTES_MAX + 1);
        assert!(Filter::from_pairs(&[("command", &long)]).is_err());
        assert!(Filter::from_pairs(&[("ws", "-1")]).is_err());
        assert!(Filter::default().is_all());
    }
}
