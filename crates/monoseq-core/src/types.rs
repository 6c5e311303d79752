//! Vocabulary types: workspace IDs and kinds, sequence IDs, numbers, PLog offsets and the
//! `(workspace, sequence) → number` pairs that storage and replay exchange.

use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<$inner> for $name {
            fn from(value: $inner) -> Self {
                Self(value)
            }
        }
    };
}

id_type!(
    /// A workspace: the owner of a WLog and of a set of sequences.
    WsId(u64)
);

impl WsId {
    /// The partition that runs this workspace's commands among `partitions`: the workspace
    /// ID modulo the partition count (a count of 0 is taken as 1), as
    /// [`monoseq_wire::partition_of`] writes it for the server (processor, routing, the
    /// simulation) and its client alike.
    #[must_use]
    pub fn partition(self, partitions: u32) -> u32 {
        monoseq_wire::partition_of(self.0, partitions)
    }
}

id_type!(
    /// The kind of a workspace; it decides which sequences the workspace has.
    WsKind(u16)
);
id_type!(
    /// A sequence of a workspace (WLog offset, CRecord IDs, …).
    SeqId(u16)
);
id_type!(
    /// A value a sequence hands out. `Number(0)` means "never handed out" in storage and
    /// replay; a sequence never hands out 0 because initial values are at least 1.
    Number(u64)
);
id_type!(
    /// The position of an event in its partition's PLog. The first event sits at 1.
    PLogOffset(u64)
);

impl PLogOffset {
    /// The offset of the first event of an empty PLog.
    pub const FIRST: PLogOffset = PLogOffset(1);

    /// The offset right after this one.
    ///
    /// # Panics
    ///
    /// Panics if the offset is `u64::MAX`: a PLog cannot grow past it, and reaching it means
    /// the stored state is corrupt.
    #[must_use]
    pub fn next(self) -> PLogOffset {
        PLogOffset(self.0.checked_add(1).expect("PLog offset overflow"))
    }
}

/// Identifies one sequence of one workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NumberKey {
    /// The workspace.
    pub ws: WsId,
    /// The sequence within the workspace.
    pub seq: SeqId,
}

/// A number of one sequence of one workspace, as stored or as found in the PLog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SeqValue {
    /// Which sequence.
    pub key: NumberKey,
    /// The last number it handed out.
    pub value: Number,
}

impl SeqValue {
    /// Builds a value from its parts.
    #[must_use]
    pub fn new(ws: WsId, seq: SeqId, value: Number) -> SeqValue {
        SeqValue {
            key: NumberKey { ws, seq },
            value,
        }
    }
}
