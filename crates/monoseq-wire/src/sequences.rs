//! The bodies of the named-sequence API (`/v1/sequences/{address}/…`): what `next`,
//! `increment` and `reset` take, and what `value` and `exists` answer. A request's numbers and
//! metadata are [`Checked`]: a client writes them typed, and a server that reads a wrong value
//! (a negative or fractional number, a string, metadata that is no object) still knows which
//! field held it, so each gets its own stable code instead of one "not JSON" refusal.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A request field as sent: the type the API documents, or whatever JSON value came instead
/// (kept so the server can say what is wrong with it). Serializes as the bare value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Checked<T> {
    /// A value of the documented type (its range is the server's to check).
    Valid(T),
    /// Any other JSON value.
    Invalid(Value),
}

impl<T> From<T> for Checked<T> {
    fn from(value: T) -> Checked<T> {
        Checked::Valid(value)
    }
}

/// A field that is present, `null` included: a number field holding `null` is a wrong value
/// (refused with its field's code), not an absent one. (`metadata: null` is absent.) A whole
/// number written with a fraction or exponent (`5.0`) is that number ([`crate::whole`]).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Checked<u64>>, D::Error> {
    let checked = match Checked::deserialize(d)? {
        Checked::Invalid(Value::Number(n)) => match n.as_f64().and_then(crate::whole::from_f64) {
            Some(whole) => Checked::Valid(whole),
            None => Checked::Invalid(Value::Number(n)),
        },
        checked => checked,
    };
    Ok(Some(checked))
}

/// `POST /v1/sequences/{address}/next` and `…/increment`: every field optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextRequestBody {
    /// The first number of a sequence that does not exist yet.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub initial: Option<Checked<u64>>,
    /// How far one call advances the sequence (1 or more).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub increment: Option<Checked<u64>>,
    /// How long the server may try, in milliseconds.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_ms: Option<Checked<u64>>,
    /// Metadata stored with the write (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Checked<Map<String, Value>>>,
}

/// `POST /v1/sequences/{address}/reset` (or `/set`): the value to store, and options.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetRequestBody {
    /// The value to store (required: a server refuses the body without it).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub value: Option<Checked<u64>>,
    /// How long the server may try, in milliseconds.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub timeout_ms: Option<Checked<u64>>,
    /// Metadata stored with the write (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Checked<Map<String, Value>>>,
}

/// The answer of `next`, `increment` (the number handed out) and `value` (the stored value,
/// `null` when the sequence does not exist).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceValueBody {
    /// The number.
    pub value: Option<u64>,
}

/// The answer of `GET /v1/sequences/{address}/exists`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceExistsBody {
    /// Whether the sequence exists.
    pub exists: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_wrong_value_is_kept_with_its_field() {
        let body: NextRequestBody =
            serde_json::from_value(json!({"initial": -1, "increment": "2", "metadata": [1]}))
                .unwrap();
        assert_eq!(body.initial, Some(Checked::Invalid(json!(-1))));
        assert_eq!(body.increment, Some(Checked::Invalid(json!("2"))));
        assert_eq!(body.metadata, Some(Checked::Invalid(json!([1]))));
    }

    #[test]
    fn a_typed_request_serializes_as_bare_values_without_absent_fields() {
        let body = NextRequestBody {
            increment: Some(Checked::from(5)),
            ..NextRequestBody::default()
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"increment": 5})
        );
    }

    #[test]
    fn a_whole_number_with_a_fraction_is_that_number_and_a_fraction_stays_wrong() {
        let body: NextRequestBody = serde_json::from_value(
            json!({"initial": 833155.0, "increment": 2e1, "timeout_ms": 1.5}),
        )
        .unwrap();
        assert_eq!(body.initial, Some(Checked::Valid(833_155)));
        assert_eq!(body.increment, Some(Checked::Valid(20)));
        assert_eq!(body.timeout_ms, Some(Checked::Invalid(json!(1.5))));
        let body: ResetRequestBody = serde_json::from_str(r#"{"value": -3.0}"#).unwrap();
        assert_eq!(body.value, Some(Checked::Invalid(json!(-3.0))));
    }

    #[test]
    fn a_null_number_is_a_wrong_value_not_an_absent_one() {
        let body: NextRequestBody =
            serde_json::from_value(json!({"timeout_ms": null, "metadata": null})).unwrap();
        assert_eq!(body.timeout_ms, Some(Checked::Invalid(Value::Null)));
        assert_eq!(body.metadata, None);
    }

    #[test]
    fn a_misspelled_field_is_refused_and_null_metadata_is_none() {
        assert!(serde_json::from_value::<NextRequestBody>(json!({"incremnt": 2})).is_err());
        let body: ResetRequestBody =
            serde_json::from_value(json!({"value": 3, "metadata": null})).unwrap();
        assert_eq!(body.metadata, None);
    }
}
