//! The conversions between the HTTP API's JSON bodies (`monoseq-wire`, shared with the client
//! crate) and the command processor's domain types. The wire format itself is defined in
//! `monoseq-wire`; this module is the one place the two meet.

use monoseq_cp::{Command, KindName, NewArg, NewRecord, Outcome, RecordUpdate};
pub use monoseq_wire::{CommandBody, OutcomeBody};
use monoseq_wire::{KindBody, NewArgBody, NewRecordBody, RecordUpdateBody};

/// The domain command of a request body.
pub fn command(b: CommandBody) -> Command {
    Command {
        ws: b.ws,
        ws_kind: b.ws_kind,
        command: b.command,
        create: b.create.into_iter().map(new_record).collect(),
        update: b.update.into_iter().map(record_update).collect(),
        argument: b.argument.map(new_arg),
        expected_wlog_offset: b.expected_wlog_offset,
    }
}

fn new_record(b: NewRecordBody) -> NewRecord {
    NewRecord {
        raw_id: b.raw_id,
        kind: kind(b.kind),
        name: b.name,
        fields: b.fields,
    }
}

fn record_update(b: RecordUpdateBody) -> RecordUpdate {
    RecordUpdate {
        id: b.id,
        fields: b.fields,
    }
}

fn new_arg(b: NewArgBody) -> NewArg {
    NewArg {
        raw_id: b.raw_id,
        name: b.name,
        fields: b.fields,
        children: b.children.into_iter().map(new_arg).collect(),
    }
}

fn kind(k: KindBody) -> KindName {
    match k {
        KindBody::CDoc => KindName::CDoc,
        KindBody::CRecord => KindName::CRecord,
        KindBody::WDoc => KindName::WDoc,
        KindBody::WRecord => KindName::WRecord,
    }
}

/// The answer body of a command's outcome.
pub fn outcome(o: &Outcome) -> OutcomeBody {
    OutcomeBody {
        partition: o.partition,
        plog_offset: o.plog_offset,
        wlog_offset: o.wlog_offset,
        ids: o.ids.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_becomes_the_domain_command_field_by_field() {
        let body: CommandBody = serde_json::from_value(serde_json::json!({
            "ws": 7, "ws_kind": 1, "command": "app.Create",
            "create": [{"raw_id": 1, "kind": "WRecord", "name": "app.Row", "fields": {"n": 1}}],
            "update": [{"id": 9, "fields": {"paid": true}}],
            "argument": {"raw_id": 2, "name": "app.Arg", "children": [{"raw_id": 3, "name": "c"}]},
            "expected_wlog_offset": 4
        }))
        .expect("a valid body");
        let cmd = command(body);
        assert_eq!(
            (cmd.ws, cmd.ws_kind, cmd.command.as_str()),
            (7, 1, "app.Create")
        );
        assert_eq!(cmd.create[0].kind, KindName::WRecord);
        assert_eq!(cmd.update[0].id, 9);
        let arg = cmd.argument.expect("argument");
        assert_eq!((arg.raw_id, arg.children[0].raw_id), (2, 3));
        assert_eq!(cmd.expected_wlog_offset, Some(4));
    }

    #[test]
    fn the_shared_limits_are_the_processor_s() {
        assert_eq!(
            monoseq_wire::IDEMPOTENCY_KEY_BYTES_MAX,
            monoseq_cp::IDEMPOTENCY_KEY_BYTES_MAX
        );
    }
}
