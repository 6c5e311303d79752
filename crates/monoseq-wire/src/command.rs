//! `POST /v1/commands`: the command a client sends and the answer it gets.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The partition that runs the commands of workspace `ws` among `partitions`: `ws mod
/// partitions` (a count of 0 is taken as 1). The one place the rule is written: the server's
/// processor and routing (through `monoseq_core::WsId::partition`) and the client's routing
/// use it, so a client sends a command where the server runs it.
#[must_use]
pub fn partition_of(ws: u64, partitions: u32) -> u32 {
    let p = ws % u64::from(partitions.max(1));
    u32::try_from(p).unwrap_or(0)
}

/// The body of `POST /v1/commands`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandBody {
    /// The workspace the command runs in; its partition is `ws mod partitions`.
    #[serde(deserialize_with = "crate::whole::number")]
    pub ws: u64,
    /// The workspace's kind.
    #[serde(deserialize_with = "crate::whole::number")]
    pub ws_kind: u16,
    /// The command's name.
    pub command: String,
    /// Records to create, each with a raw ID.
    #[serde(default)]
    pub create: Vec<NewRecordBody>,
    /// Existing records to update, by real ID.
    #[serde(default)]
    pub update: Vec<RecordUpdateBody>,
    /// The argument object, with raw IDs.
    #[serde(default)]
    pub argument: Option<NewArgBody>,
    /// Applies the command only if the workspace's WLog ends at this offset (the WLog offset
    /// of its last event; 0: it has none yet); otherwise it is refused `409 wlog_conflict`
    /// with `current_wlog_offset` in the error body, and takes no number. Optimistic
    /// concurrency per workspace: of commands sent on the same expected offset, one succeeds.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "expected_wlog_offset"
    )]
    pub expected_wlog_offset: Option<u64>,
}

impl CommandBody {
    /// A command that creates, updates and carries nothing yet.
    #[must_use]
    pub fn new(ws: u64, ws_kind: u16, command: impl Into<String>) -> CommandBody {
        CommandBody {
            ws,
            ws_kind,
            command: command.into(),
            create: Vec::new(),
            update: Vec::new(),
            argument: None,
            expected_wlog_offset: None,
        }
    }

    /// The command, applied only if its workspace's WLog ends at `offset` (0: the workspace
    /// has no event yet); see [`CommandBody::expected_wlog_offset`].
    ///
    /// # Example
    ///
    /// ```
    /// use monoseq_wire::CommandBody;
    ///
    /// let first = CommandBody::new(7, 1, "app.Open").with_expected_wlog_offset(0);
    /// let json = serde_json::to_value(&first).expect("serializes");
    /// assert_eq!(json["expected_wlog_offset"], 0);
    /// ```
    #[must_use]
    pub fn with_expected_wlog_offset(mut self, offset: u64) -> CommandBody {
        self.expected_wlog_offset = Some(offset);
        self
    }
}

/// Reads `expected_wlog_offset` (absent or `null`: none; a whole number written `5.0` is 5, as
/// in [`crate::whole`]) and refuses, naming the field, anything but a whole number from 0 to
/// `u64::MAX`: a negative number, a fraction, a number too large, text.
pub(crate) fn expected_wlog_offset<'de, D>(d: D) -> Result<Option<u64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct Offset;

    impl<'de> serde::de::Visitor<'de> for Offset {
        type Value = Option<u64>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "expected_wlog_offset as a whole number from 0 to {}",
                u64::MAX
            )
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Option<u64>, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Option<u64>, D2::Error> {
            d.deserialize_any(Offset)
        }

        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Option<u64>, E> {
            Ok(Some(v))
        }

        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Option<u64>, E> {
            u64::try_from(v).map(Some).map_err(|_| {
                E::custom(format!(
                    "expected_wlog_offset is {v}: give the WLog offset as a whole number from 0 \
                     to {}",
                    u64::MAX
                ))
            })
        }

        fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Option<u64>, E> {
            if let Some(whole) = crate::whole::from_f64(v) {
                return Ok(Some(whole));
            }
            Err(E::custom(format!(
                "expected_wlog_offset is {v}: give the WLog offset as a whole number from 0 to \
                 {} (no fraction)",
                u64::MAX
            )))
        }
    }

    d.deserialize_option(Offset)
}

/// A record to create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewRecordBody {
    /// The client's placeholder ID.
    #[serde(deserialize_with = "crate::whole::number")]
    pub raw_id: u64,
    /// `CDoc`, `CRecord`, `WDoc` or `WRecord`.
    pub kind: KindBody,
    /// The record's type name.
    pub name: String,
    /// Field values; `{"$raw": n}` refers to another record of the command.
    #[serde(default)]
    pub fields: Map<String, Value>,
}

impl NewRecordBody {
    /// A record without fields.
    #[must_use]
    pub fn new(raw_id: u64, kind: KindBody, name: impl Into<String>) -> NewRecordBody {
        NewRecordBody {
            raw_id,
            kind,
            name: name.into(),
            fields: Map::new(),
        }
    }
}

/// An update of an existing record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordUpdateBody {
    /// The record's real ID.
    #[serde(deserialize_with = "crate::whole::number")]
    pub id: u64,
    /// The fields to change.
    pub fields: Map<String, Value>,
}

/// The argument object or one of its children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewArgBody {
    /// The client's placeholder ID.
    #[serde(deserialize_with = "crate::whole::number")]
    pub raw_id: u64,
    /// The type name.
    pub name: String,
    /// Field values.
    #[serde(default)]
    pub fields: Map<String, Value>,
    /// Nested objects.
    #[serde(default)]
    pub children: Vec<NewArgBody>,
}

/// A record kind a command may create, as clients spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KindBody {
    /// Configuration document.
    CDoc,
    /// Configuration record.
    CRecord,
    /// Workflow document.
    WDoc,
    /// Workflow record.
    WRecord,
}

/// The answer to a command (also to its retries with the same `Idempotency-Key`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutcomeBody {
    /// The partition that ran it.
    pub partition: u32,
    /// The event's PLog offset.
    pub plog_offset: u64,
    /// The event's WLog offset.
    pub wlog_offset: u64,
    /// Real IDs by raw ID.
    pub ids: BTreeMap<u64, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unknown_fields_of_a_command_are_refused() {
        let e = serde_json::from_value::<CommandBody>(json!({
            "ws": 7, "ws_kind": 1, "command": "c", "extra": 1
        }))
        .unwrap_err();
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn an_expected_wlog_offset_is_read_and_written_only_when_given() {
        let none: CommandBody =
            serde_json::from_value(json!({"ws": 7, "ws_kind": 1, "command": "c"})).unwrap();
        assert_eq!(none.expected_wlog_offset, None);
        assert!(
            !serde_json::to_string(&none)
                .unwrap()
                .contains("expected_wlog_offset")
        );
        let null: CommandBody = serde_json::from_value(
            json!({"ws": 7, "ws_kind": 1, "command": "c", "expected_wlog_offset": null}),
        )
        .unwrap();
        assert_eq!(null.expected_wlog_offset, None);
        for n in [0, 5, u64::MAX] {
            let text =
                format!(r#"{{"ws":7,"ws_kind":1,"command":"c","expected_wlog_offset":{n}}}"#);
            let body: CommandBody = serde_json::from_str(&text).unwrap();
            assert_eq!(body.expected_wlog_offset, Some(n));
            assert_eq!(
                body,
                CommandBody::new(7, 1, "c").with_expected_wlog_offset(n)
            );
            assert!(
                serde_json::to_string(&body)
                    .unwrap()
                    .contains(&n.to_string())
            );
        }
    }

    #[test]
    fn whole_numbers_written_with_a_fraction_or_exponent_are_read_as_integers() {
        let text = r#"{"ws":7.0,"ws_kind":1e0,"command":"c","expected_wlog_offset":1e3,
            "create":[{"raw_id":2.0,"kind":"CDoc","name":"a"}],"update":[{"id":5.0,"fields":{}}],
            "argument":{"raw_id":3.0,"name":"b"}}"#;
        let body: CommandBody = serde_json::from_str(text).unwrap();
        assert_eq!((body.ws, body.ws_kind), (7, 1));
        assert_eq!(body.expected_wlog_offset, Some(1000));
        assert_eq!(body.create[0].raw_id, 2);
        assert_eq!(body.update[0].id, 5);
        assert_eq!(body.argument.map(|a| a.raw_id), Some(3));
        for bad in [r#""ws":7.5"#, r#""ws":-7.0"#] {
            let text = format!(r#"{{{bad},"ws_kind":1,"command":"c"}}"#);
            let e = serde_json::from_str::<CommandBody>(&text).unwrap_err();
            assert!(e.to_string().contains("a whole number"), "{bad}: {e}");
        }
        let e = serde_json::from_str::<CommandBody>(r#"{"ws":7,"ws_kind":65536.0,"command":"c"}"#)
            .unwrap_err();
        assert!(e.to_string().contains("0 to 65535"), "{e}");
    }

    #[test]
    fn a_bad_expected_wlog_offset_is_refused_naming_the_field() {
        for bad in [
            "-1",
            "1.5",
            "18446744073709551616",
            "1.8446744073709552e19",
            "\"5\"",
            "true",
            "[]",
            "{}",
        ] {
            let text =
                format!(r#"{{"ws":7,"ws_kind":1,"command":"c","expected_wlog_offset":{bad}}}"#);
            let e = serde_json::from_str::<CommandBody>(&text).unwrap_err();
            assert!(e.is_data(), "{bad}: {e}");
            assert!(e.to_string().contains("expected_wlog_offset"), "{bad}: {e}");
        }
    }

    #[test]
    fn an_outcome_round_trips_with_its_ids_keyed_by_raw_id() {
        let text = r#"{"partition":7,"plog_offset":1,"wlog_offset":1,"ids":{"1":322685000131072}}"#;
        let outcome: OutcomeBody = serde_json::from_str(text).unwrap();
        assert_eq!(outcome.ids[&1], 322_685_000_131_072);
        assert_eq!(serde_json::to_string(&outcome).unwrap(), text);
    }
}
