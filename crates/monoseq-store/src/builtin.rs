//! Built-in sequences (docs/invariants.md): their IDs and initial values, which record
//! kinds feed which sequence, and the sequencer parameters that declare them.

use monoseq_core::{Number, PLogOffset, ParamsBuilder, SeqId, WsKind};

/// A sequence every workspace (or, for the PLog offset, every partition) has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltInSequence {
    /// The sequence's ID, as the sequencer and the projection know it.
    pub id: SeqId,
    /// A short name for messages and tools.
    pub name: &'static str,
    /// The first number the sequence hands out.
    pub initial: Number,
}

/// PLog offsets, per partition, from 1. The sequencer keeps this one itself (it is the
/// checkpoint's unit, not a per-workspace number), so it is not in [`workspace_sequences`].
pub const PLOG_OFFSET_SEQUENCE: BuiltInSequence = BuiltInSequence {
    id: SeqId(1),
    name: "PLogOffset",
    initial: Number(1),
};

/// WLog offsets, per workspace, from 1.
pub const WLOG_OFFSET_SEQUENCE: BuiltInSequence = BuiltInSequence {
    id: SeqId(2),
    name: "WLogOffset",
    initial: Number(1),
};

/// IDs of new CDocs and CRecords, per workspace, from 322 685 000 131 072.
pub const CRECORD_ID_SEQUENCE: BuiltInSequence = BuiltInSequence {
    id: SeqId(3),
    name: "CRecordID",
    initial: Number(322_685_000_131_072),
};

/// IDs of new ODocs, ORecords, WDocs and WRecords (and of the argument object with its
/// children), per workspace, from 322 680 000 131 072.
pub const OWRECORD_ID_SEQUENCE: BuiltInSequence = BuiltInSequence {
    id: SeqId(4),
    name: "OWRecordID",
    initial: Number(322_680_000_131_072),
};

/// All four built-in sequences, PLog offset first.
pub const BUILT_IN_SEQUENCES: [BuiltInSequence; 4] = [
    PLOG_OFFSET_SEQUENCE,
    WLOG_OFFSET_SEQUENCE,
    CRECORD_ID_SEQUENCE,
    OWRECORD_ID_SEQUENCE,
];

const _: () = assert!(PLOG_OFFSET_SEQUENCE.initial.0 == PLogOffset::FIRST.0);

/// The per-workspace built-in sequences with their initial values, ready for
/// [`ParamsBuilder::kind`].
///
/// # Example
///
/// ```
/// use monoseq_core::{Params, WsKind};
/// use monoseq_store::{workspace_sequences, CRECORD_ID_SEQUENCE};
///
/// let params = Params::builder().kind(WsKind(1), workspace_sequences()).build().unwrap();
/// assert_eq!(
///     params.initial_value(WsKind(1), CRECORD_ID_SEQUENCE.id),
///     Some(CRECORD_ID_SEQUENCE.initial)
/// );
/// ```
#[must_use]
pub fn workspace_sequences() -> [(SeqId, Number); 3] {
    [
        (WLOG_OFFSET_SEQUENCE.id, WLOG_OFFSET_SEQUENCE.initial),
        (CRECORD_ID_SEQUENCE.id, CRECORD_ID_SEQUENCE.initial),
        (OWRECORD_ID_SEQUENCE.id, OWRECORD_ID_SEQUENCE.initial),
    ]
}

/// A parameters builder that declares the per-workspace built-in sequences for each of
/// `kinds`; limits keep their defaults and can still be changed on the returned builder.
pub fn built_in_params(kinds: impl IntoIterator<Item = WsKind>) -> ParamsBuilder {
    kinds
        .into_iter()
        .fold(monoseq_core::Params::builder(), |b, kind| {
            b.kind(kind, workspace_sequences())
        })
}

/// Like [`built_in_params`], with every workspace sequence starting above what `retired` says
/// was handed out before an accepted loss (numbers at or below it are never handed out again).
pub fn built_in_params_above(
    kinds: impl IntoIterator<Item = WsKind>,
    retired: &crate::marks::Mark,
) -> ParamsBuilder {
    let above = |s: BuiltInSequence, handed_out: u64| {
        (s.id, Number(s.initial.0.max(handed_out.saturating_add(1))))
    };
    let seqs = [
        above(WLOG_OFFSET_SEQUENCE, retired.wlog),
        above(CRECORD_ID_SEQUENCE, retired.crecord),
        above(OWRECORD_ID_SEQUENCE, retired.owrecord),
    ];
    kinds
        .into_iter()
        .fold(monoseq_core::Params::builder(), |b, kind| {
            b.kind(kind, seqs)
        })
}

/// The initial value of a built-in sequence, if `seq` is one.
#[must_use]
pub fn built_in_initial(seq: SeqId) -> Option<Number> {
    BUILT_IN_SEQUENCES
        .iter()
        .find(|s| s.id == seq)
        .map(|s| s.initial)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RecordKind;

    #[test]
    fn built_in_sequences_have_the_seed_initial_values() {
        assert_eq!(PLOG_OFFSET_SEQUENCE.initial, Number(1));
        assert_eq!(WLOG_OFFSET_SEQUENCE.initial, Number(1));
        assert_eq!(CRECORD_ID_SEQUENCE.initial, Number(322_685_000_131_072));
        assert_eq!(OWRECORD_ID_SEQUENCE.initial, Number(322_680_000_131_072));
        let mut ids: Vec<SeqId> = BUILT_IN_SEQUENCES.iter().map(|s| s.id).collect();
        ids.dedup();
        assert_eq!(ids.len(), 4, "built-in sequence IDs are distinct");
    }

    #[test]
    fn built_in_params_declare_the_three_workspace_sequences_per_kind() {
        let p = built_in_params([WsKind(1), WsKind(2)]).build().unwrap();
        for kind in [WsKind(1), WsKind(2)] {
            for s in &BUILT_IN_SEQUENCES[1..] {
                assert_eq!(p.initial_value(kind, s.id), Some(s.initial));
            }
            assert_eq!(p.initial_value(kind, PLOG_OFFSET_SEQUENCE.id), None);
        }
    }

    #[test]
    fn record_kinds_feed_their_id_sequence() {
        assert_eq!(RecordKind::CDoc.id_sequence(), CRECORD_ID_SEQUENCE.id);
        assert_eq!(RecordKind::CRecord.id_sequence(), CRECORD_ID_SEQUENCE.id);
        for k in [
            RecordKind::WDoc,
            RecordKind::WRecord,
            RecordKind::ODoc,
            RecordKind::ORecord,
        ] {
            assert_eq!(k.id_sequence(), OWRECORD_ID_SEQUENCE.id);
        }
    }
}
