//! `POST /v1/commands/batch`: many commands in one request, each answered on its own.
//!
//! A batch is a convenience of transport, not a transaction: every command is run exactly as
//! if it had come alone to `POST /v1/commands` (its own partition, its own group commit, its
//! own `Idempotency-Key`), and one refused command fails only itself. The answer lists one
//! result per command, in the order sent, each with the status the command alone would have
//! got.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::answers::ErrorBody;
use crate::command::{CommandBody, NewArgBody, NewRecordBody, OutcomeBody, RecordUpdateBody};

/// Most commands one batch may carry; a longer one is refused whole (`413 batch_too_large`).
pub const BATCH_COMMANDS_MAX: usize = 1_000;

/// The body of `POST /v1/commands/batch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// The commands, answered in this order.
    pub commands: Vec<BatchCommandBody>,
}

/// The body the server reads first: the commands still as text, so that a malformed command
/// fails only itself and a command for another node is relayed as the client wrote it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatchBody<'a> {
    /// The commands, each as sent.
    #[serde(borrow)]
    pub commands: Vec<&'a RawValue>,
}

/// One command of a batch: the body of `POST /v1/commands` and, in place of that endpoint's
/// header, its own optional `idempotency_key`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchCommandBody {
    /// Makes this command safe to retry, alone or in another batch (the header
    /// `Idempotency-Key` of a single command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// As [`CommandBody::ws`].
    #[serde(deserialize_with = "crate::whole::number")]
    pub ws: u64,
    /// As [`CommandBody::ws_kind`].
    #[serde(deserialize_with = "crate::whole::number")]
    pub ws_kind: u16,
    /// As [`CommandBody::command`].
    pub command: String,
    /// As [`CommandBody::create`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub create: Vec<NewRecordBody>,
    /// As [`CommandBody::update`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub update: Vec<RecordUpdateBody>,
    /// As [`CommandBody::argument`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argument: Option<NewArgBody>,
    /// As [`CommandBody::expected_wlog_offset`]: this command alone is refused
    /// (`wlog_conflict`) when its workspace's WLog does not end there. Commands of one batch
    /// on one workspace run in the order sent, so the second of two on the same expected
    /// offset sees the first's event.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::command::expected_wlog_offset"
    )]
    pub expected_wlog_offset: Option<u64>,
}

impl BatchCommandBody {
    /// `command` with `key` as its idempotency key.
    #[must_use]
    pub fn new(command: CommandBody, idempotency_key: Option<String>) -> BatchCommandBody {
        BatchCommandBody {
            idempotency_key,
            ws: command.ws,
            ws_kind: command.ws_kind,
            command: command.command,
            create: command.create,
            update: command.update,
            argument: command.argument,
            expected_wlog_offset: command.expected_wlog_offset,
        }
    }

    /// The idempotency key and the command.
    #[must_use]
    pub fn into_parts(self) -> (Option<String>, CommandBody) {
        let command = CommandBody {
            ws: self.ws,
            ws_kind: self.ws_kind,
            command: self.command,
            create: self.create,
            update: self.update,
            argument: self.argument,
            expected_wlog_offset: self.expected_wlog_offset,
        };
        (self.idempotency_key, command)
    }
}

/// The answer to a batch: one result per command, in the order sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchAnswerBody {
    /// The results.
    pub results: Vec<BatchResultBody>,
}

/// What one command of a batch got: the status, and the outcome or the error, that
/// `POST /v1/commands` would have answered for it alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResultBody {
    /// The HTTP status the command alone would have got (200, 400, 503, …).
    pub status: u16,
    /// With status 200: the command's outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<OutcomeBody>,
    /// With status 200: the outcome is the original one of an earlier command with the same
    /// idempotency key (the header `Idempotency-Replayed` of a single command).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// Otherwise: the error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
    /// With a transient error: seconds to wait before retrying this command (the header
    /// `Retry-After` of a single command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

impl BatchResultBody {
    /// A command that ran.
    #[must_use]
    pub fn ok(outcome: OutcomeBody, replayed: bool) -> BatchResultBody {
        BatchResultBody {
            status: 200,
            outcome: Some(outcome),
            replayed,
            error: None,
            retry_after: None,
        }
    }

    /// A command refused with `status` and `error`; `retry_after` for a transient one.
    #[must_use]
    pub fn refused(status: u16, error: ErrorBody, retry_after: Option<u64>) -> BatchResultBody {
        BatchResultBody {
            status,
            outcome: None,
            replayed: false,
            error: Some(error),
            retry_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;
    use serde_json::json;

    #[test]
    fn a_batch_command_is_a_command_body_with_its_own_key() {
        let item: BatchCommandBody = serde_json::from_value(json!({
            "idempotency_key": "order-17", "ws": 7, "ws_kind": 1, "command": "app.Create",
            "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order"}]
        }))
        .expect("a valid command");
        let (key, command) = item.clone().into_parts();
        assert_eq!(key.as_deref(), Some("order-17"));
        assert_eq!((command.ws, command.create.len()), (7, 1));
        assert_eq!(BatchCommandBody::new(command, key), item);
    }

    #[test]
    fn a_batch_command_carries_its_expected_wlog_offset() {
        let item: BatchCommandBody = serde_json::from_value(json!({
            "ws": 7, "ws_kind": 1, "command": "c", "expected_wlog_offset": 4
        }))
        .expect("a valid command");
        let (_, command) = item.clone().into_parts();
        assert_eq!(command.expected_wlog_offset, Some(4));
        assert_eq!(BatchCommandBody::new(command, None), item);
        let e = serde_json::from_value::<BatchCommandBody>(json!({
            "ws": 7, "ws_kind": 1, "command": "c", "expected_wlog_offset": -4
        }))
        .expect_err("a negative offset");
        assert!(e.to_string().contains("expected_wlog_offset"), "{e}");
    }

    #[test]
    fn unknown_fields_of_a_batch_command_are_refused() {
        let e = serde_json::from_value::<BatchCommandBody>(json!({
            "ws": 7, "ws_kind": 1, "command": "c", "key": "k"
        }))
        .expect_err("a misspelt key field");
        assert!(e.to_string().contains("unknown field"), "{e}");
    }

    #[test]
    fn a_raw_batch_keeps_each_command_as_sent() {
        let text = r#"{"commands":[{"ws":1,"ws_kind":1,"command":"a"}, {"ws":"x"}]}"#;
        let raw: RawBatchBody<'_> = serde_json::from_str(text).expect("a batch");
        assert_eq!(raw.commands.len(), 2);
        assert_eq!(raw.commands[1].get(), r#"{"ws":"x"}"#);
    }

    #[test]
    fn a_result_carries_only_what_its_status_needs() {
        let refused = BatchResultBody::refused(
            503,
            ErrorBody {
                code: ErrorCode::Busy,
                message: "retry".into(),
                key: None,
                current_wlog_offset: None,
            },
            Some(1),
        );
        let text = serde_json::to_value(&refused).expect("serializes");
        assert_eq!(
            text,
            json!({"status": 503, "error": {"code": "busy", "message": "retry"}, "retry_after": 1})
        );
    }
}
