//! The conversions between the HTTP API's JSON bodies (`monoseq-wire`, shared with the client
//! crate) and the command processor's domain types. The wire format itself is defined in
//! `monoseq-wire`; this module is the one place the two meet.

use monoseq_cp::{Command, KindName, NewArg, NewRecord, Outcome, RecordUpdate};
use monoseq_store::{AcceptedLoss, LossCause, Mark};
use monoseq_wire::{
    AcceptedLossBody, KindBody, LossCauseBody, MarkBody, NewArgBody, NewRecordBody,
    RecordUpdateBody,
};
pub use monoseq_wire::{CommandBody, OutcomeBody};

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
pub fn outcome(o: Outcome) -> OutcomeBody {
    OutcomeBody {
        partition: o.partition,
        plog_offset: o.plog_offset,
        wlog_offset: o.wlog_offset,
        ids: o.ids,
    }
}

/// A partition's high-water mark, as `/v1/marks` answers it.
pub fn mark_body(m: &Mark) -> MarkBody {
    MarkBody {
        plog: m.plog,
        wlog: m.wlog,
        crecord: m.crecord,
        owrecord: m.owrecord,
    }
}

/// A high-water mark a peer's `/v1/marks` answered.
pub fn mark(b: &MarkBody) -> Mark {
    Mark {
        plog: b.plog,
        wlog: b.wlog,
        crecord: b.crecord,
        owrecord: b.owrecord,
    }
}

/// An accepted loss, as `/v1/marks` answers it.
pub fn loss_body(l: &AcceptedLoss) -> AcceptedLossBody {
    AcceptedLossBody {
        partition: l.partition,
        plog_from: l.plog_from,
        plog_to: l.plog_to,
        mark: mark_body(&l.mark),
        accepted_at_ms: l.accepted_at_ms,
        cause: match l.cause {
            LossCause::Restore => LossCauseBody::Restore,
            _ => LossCauseBody::AcceptedLoss,
        },
    }
}

/// An accepted loss a peer's `/v1/marks` answered.
pub fn loss(b: &AcceptedLossBody) -> AcceptedLoss {
    AcceptedLoss {
        partition: b.partition,
        plog_from: b.plog_from,
        plog_to: b.plog_to,
        mark: mark(&b.mark),
        accepted_at_ms: b.accepted_at_ms,
        cause: match b.cause {
            LossCauseBody::AcceptedLoss => LossCause::AcceptedLoss,
            LossCauseBody::Restore => LossCause::Restore,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_becomes_the_domain_command_field_by_field() {
        let body: CommandBody = serde_json::from_str(
            r#"{
                "ws": 7, "ws_kind": 1, "command": "app.Create",
                "create": [{"raw_id": 1, "kind": "WRecord", "name": "app.Row", "fields": {"n": 1}}],
                "update": [{"id": 9, "fields": {"paid": true}}],
                "argument": {"raw_id": 2, "name": "app.Arg", "children": [{"raw_id": 3, "name": "c"}]},
                "expected_wlog_offset": 4
            }"#,
        )
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

    /// The wire's command and the processor's are two types (the processor's JSON is the
    /// canonical form idempotency fingerprints hash, so it must not move with the wire); they
    /// are held to one tree: a body and its domain command serialize to the same JSON.
    #[test]
    fn a_body_and_its_domain_command_serialize_alike() {
        let bodies = [
            r#"{"ws": 1, "ws_kind": 0, "command": "app.Empty"}"#,
            r#"{
                "ws": 18446744073709551615, "ws_kind": 65535, "command": "app.Every",
                "create": [
                    {"raw_id": 1, "kind": "CDoc", "name": "a.D", "fields": {"n": 1, "s": "x"}},
                    {"raw_id": 2, "kind": "CRecord", "name": "a.R", "fields": {"p": {"$raw": 1}}},
                    {"raw_id": 3, "kind": "WDoc", "name": "a.W"},
                    {"raw_id": 4, "kind": "WRecord", "name": "a.X", "fields": {"o": {"k": [1, null]}}}
                ],
                "update": [{"id": 9, "fields": {"paid": true, "ref": {"$raw": 2}}}],
                "argument": {"raw_id": 5, "name": "a.Arg", "fields": {"q": 2.5},
                             "children": [{"raw_id": 6, "name": "c", "children": [{"raw_id": 7, "name": "d"}]}]},
                "expected_wlog_offset": 0
            }"#,
        ];
        for text in bodies {
            let body: CommandBody = serde_json::from_str(text).expect("a valid body");
            let wire = serde_json::to_value(&body).expect("the body serializes");
            let domain = serde_json::to_value(command(body)).expect("the command serializes");
            assert_eq!(wire, domain, "the two shapes differ for {text}");
        }
    }

    #[test]
    fn the_shared_limits_are_the_processor_s() {
        assert_eq!(
            monoseq_wire::IDEMPOTENCY_KEY_BYTES_MAX,
            monoseq_cp::IDEMPOTENCY_KEY_BYTES_MAX
        );
    }
}
