//! [`Problem`]: everything verification can find wrong in a store, one variant per kind of
//! damage, each message naming the partition, workspace, offset or key and what it means.

use monoseq_store::{DecodeError, Mark};

/// The numbered sequences events use, as messages name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Sequence {
    /// WLog offsets.
    WLog,
    /// CDoc and CRecord IDs.
    CRecord,
    /// ODoc, ORecord, WDoc and WRecord IDs (and argument objects).
    OWRecord,
}

impl std::fmt::Display for Sequence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sequence::WLog => "WLogOffset",
            Sequence::CRecord => "CRecordID",
            Sequence::OWRecord => "OWRecordID",
        })
    }
}

/// Which table of the index in chunks (key layout 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ChunkTable {
    /// WLog chunks: where the events of a run of one workspace's WLog offsets are.
    WLog,
    /// Records chunks: which events created a run of one workspace's records.
    Records,
}

impl ChunkTable {
    /// What one entry of a chunk of this table is numbered by, for messages.
    pub(crate) fn item(self) -> &'static str {
        match self {
            ChunkTable::WLog => "WLog offset",
            ChunkTable::Records => "record",
        }
    }
}

impl std::fmt::Display for ChunkTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChunkTable::WLog => "WLog",
            ChunkTable::Records => "records",
        })
    }
}

/// Which file of the data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DirFile {
    /// `monoseq.identity`.
    Identity,
    /// `monoseq.marks`.
    Marks,
}

impl std::fmt::Display for DirFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DirFile::Identity => monoseq_store::IDENTITY_FILE,
            DirFile::Marks => monoseq_store::MARKS_FILE,
        })
    }
}

/// One thing found wrong. [`crate::Report::problems`] lists every one found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Problem {
    // -- The data directory's files and the engine's metadata --------------------------------
    /// A file of the data directory cannot be read or is damaged.
    #[error("{file} cannot be used: {message}")]
    FileUnreadable {
        /// Which file.
        file: DirFile,
        /// Why.
        message: String,
    },
    /// A file of the data directory is missing although the store holds data.
    #[error(
        "{file} is missing, but the engine holds store {store_id}: the store cannot prove it is \
         whole"
    )]
    FileMissing {
        /// Which file.
        file: DirFile,
        /// The store the engine holds.
        store_id: String,
    },
    /// The identity names a store the engine does not hold.
    #[error(
        "the identity file names store {identity}, but the engine holds {}",
        engine.as_deref().map_or_else(|| "no store at all (its files were lost or replaced)".to_owned(), |e| format!("store {e} (files of another data directory)"))
    )]
    ForeignEngine {
        /// The identity's store ID.
        identity: String,
        /// The engine's store ID, if any.
        engine: Option<String>,
    },
    /// The identity and the engine (or the marks file) disagree on something fixed at
    /// creation.
    #[error("the {what} differs: {a_name} says {a}, {b_name} says {b}")]
    Inconsistent {
        /// What differs ("partition count", "key layout", "event format").
        what: &'static str,
        /// The first source.
        a_name: &'static str,
        /// Its value.
        a: String,
        /// The second source.
        b_name: &'static str,
        /// Its value.
        b: String,
    },
    /// A server-metadata value does not decode.
    #[error("the engine's metadata record `{key}` is damaged ({len} bytes where 4 belong)")]
    MetaDamaged {
        /// Which record.
        key: &'static str,
        /// Its length.
        len: usize,
    },
    /// Neither the engine nor the identity records the partition count, and none was given.
    #[error(
        "no partition count is recorded (no engine metadata, no identity file): pass the \
         partition count to verify"
    )]
    NoPartitionCount,
    /// A partition's PLog ends below what its high-water mark says was acknowledged.
    #[error(
        "partition {partition}: the PLog holds {what} up to {found}, but {mark_value} was \
         acknowledged (high-water mark {mark:?}): acknowledged events are lost"
    )]
    BelowMark {
        /// The partition.
        partition: u32,
        /// Which mark ("events", "WLog offsets", …).
        what: &'static str,
        /// The highest the PLog holds.
        found: u64,
        /// The mark's value.
        mark_value: u64,
        /// The whole mark.
        mark: Mark,
    },

    // -- Reading ------------------------------------------------------------------------------
    /// Storage failed while reading; what it covers is unverified.
    #[error("reading {what} failed: {message}; it is unverified")]
    Unreadable {
        /// What was being read.
        what: String,
        /// The storage error.
        message: String,
    },

    // -- PLog ---------------------------------------------------------------------------------
    /// A PLog key whose clustering is not a 2-byte position.
    #[error(
        "partition {partition}: PLog block {block} holds a key with {len} clustering bytes where \
         2 belong"
    )]
    PLogBadKey {
        /// The partition.
        partition: u32,
        /// The block.
        block: u64,
        /// Clustering length.
        len: usize,
    },
    /// A PLog value does not decode.
    #[error("partition {partition}: the event at PLog offset {offset} does not decode: {error}")]
    PLogCorrupt {
        /// The partition.
        partition: u32,
        /// Its offset.
        offset: u64,
        /// Why.
        error: DecodeError,
    },
    /// A PLog event names another offset than its key.
    #[error("partition {partition}: the event at PLog offset {offset} says it is at {found}")]
    PLogMisplaced {
        /// The partition.
        partition: u32,
        /// Where it is stored.
        offset: u64,
        /// The offset it names.
        found: u64,
    },
    /// PLog offsets are missing and no accepted loss names them.
    #[error(
        "partition {partition}: PLog offsets {from}..={to} are missing ({} events), and the \
         event at {next} follows them; no accepted loss names the gap",
        to - from + 1,
        next = to + 1
    )]
    PLogGap {
        /// The partition.
        partition: u32,
        /// First missing offset.
        from: u64,
        /// Last missing offset.
        to: u64,
    },
    /// An event sits inside a range recorded as an accepted loss.
    #[error(
        "partition {partition}: an event sits at PLog offset {offset}, inside the accepted loss \
         {from}..={to}"
    )]
    PLogInAcceptedLoss {
        /// The partition.
        partition: u32,
        /// Its offset.
        offset: u64,
        /// The loss's first offset.
        from: u64,
        /// The loss's last offset.
        to: u64,
    },
    /// A PLog of a partition the store does not have.
    #[error(
        "a PLog of partition {partition} exists (a block in the engine, or a directory of \
         segment files under plog/), but the store has {partitions} partitions"
    )]
    PLogUnknownPartition {
        /// The partition.
        partition: u32,
        /// The store's count.
        partitions: u32,
    },
    /// Frames of a PLog's segment file (key layout 4) fail their check.
    #[error(
        "partition {partition}: PLog offsets {from}..={to} cannot be read from their segment \
         file: {message}"
    )]
    PLogSegmentDamaged {
        /// The partition.
        partition: u32,
        /// The first offset not read (its frame is damaged).
        from: u64,
        /// The last offset not read (the rest of its segment).
        to: u64,
        /// The segment log's error.
        message: String,
    },
    /// The engine holds the WLog entries and records of PLog offsets the segment files (key
    /// layout 4) do not: the files lost events, or were replaced by older ones.
    #[error(
        "partition {partition}: the engine holds the WLog entries and records of PLog offsets \
         below {applied}, but the segment files hold offsets below {log_end} only{}: events \
         written to the PLog are lost",
        tail.as_deref().map_or_else(String::new, |t| format!(" ({t})"))
    )]
    AppliedAhead {
        /// The partition.
        partition: u32,
        /// The applied end the engine records.
        applied: u64,
        /// One past the last offset the segment files hold.
        log_end: u64,
        /// What follows the log's data in its last segment, when not zeros.
        tail: Option<String>,
    },
    /// An applied end (key layouts 4 and 5) does not decode.
    #[error("partition {partition}: the applied end is damaged ({len} bytes where 8 belong)")]
    AppliedDamaged {
        /// The partition.
        partition: u32,
        /// Its length.
        len: usize,
    },
    /// One workspace's events sit in two partitions' PLogs.
    #[error(
        "workspace {ws} has events in partition {first} and in partition {second} (PLog offset \
         {offset}): a workspace belongs to one partition"
    )]
    WorkspaceInTwoPartitions {
        /// The workspace.
        ws: u64,
        /// The partition of its first event.
        first: u32,
        /// The other partition.
        second: u32,
        /// The offset of the event in `second`.
        offset: u64,
    },

    // -- Numbers (invariants 1-5 of docs/invariants.md) ----------------------------------------
    /// A number is not above the last one of its sequence: handed out twice or backwards.
    #[error(
        "partition {partition}: the event at PLog offset {offset} uses {sequence} {number} of \
         workspace {ws}, but {last} was already used: numbers must increase strictly"
    )]
    NumberReused {
        /// The partition.
        partition: u32,
        /// The event's offset.
        offset: u64,
        /// The workspace.
        ws: u64,
        /// The sequence.
        sequence: Sequence,
        /// The number.
        number: u64,
        /// The last number before.
        last: u64,
    },
    /// An event after an accepted loss uses a number the loss retired (invariant 10 of
    /// docs/invariants.md).
    #[error(
        "partition {partition}: the event at PLog offset {offset} uses {sequence} {number} of \
         workspace {ws}, but an accepted loss retired every number up to {retired}"
    )]
    RetiredNumberUsed {
        /// The partition.
        partition: u32,
        /// The event's offset.
        offset: u64,
        /// The workspace.
        ws: u64,
        /// The sequence.
        sequence: Sequence,
        /// The number.
        number: u64,
        /// The retired mark of the sequence.
        retired: u64,
    },
    /// A workspace's WLog offsets skip numbers (not explained by an accepted loss).
    #[error(
        "partition {partition}: the event at PLog offset {offset} has WLog offset {wlog} of \
         workspace {ws}, after {last}: WLog offsets must be contiguous"
    )]
    WLogOffsetSkipped {
        /// The partition.
        partition: u32,
        /// The event's offset.
        offset: u64,
        /// The workspace.
        ws: u64,
        /// Its WLog offset.
        wlog: u64,
        /// The WLog offset before.
        last: u64,
    },
    /// The checkpoint value does not decode.
    #[error("partition {partition}: the checkpoint is damaged ({len} bytes, value {value:?})")]
    CheckpointDamaged {
        /// The partition.
        partition: u32,
        /// Its length.
        len: usize,
        /// Its value when 8 bytes.
        value: Option<u64>,
    },
    /// The checkpoint claims events the PLog does not hold.
    #[error(
        "partition {partition}: the checkpoint {checkpoint} is ahead of the PLog, whose next \
         offset is {plog_next}"
    )]
    CheckpointAhead {
        /// The partition.
        partition: u32,
        /// The checkpoint (next PLog offset it claims).
        checkpoint: u64,
        /// The PLog's next offset.
        plog_next: u64,
    },
    /// A stored number is below what the checkpoint claims it covers.
    #[error(
        "workspace {ws}: {sequence} is stored as {stored}, but the checkpoint {checkpoint} of \
         partition {partition} covers {covered}"
    )]
    NumberNotCovered {
        /// The workspace.
        ws: u64,
        /// Its partition.
        partition: u32,
        /// The sequence.
        sequence: Sequence,
        /// The stored number.
        stored: u64,
        /// The highest number of the events before the checkpoint.
        covered: u64,
        /// The checkpoint.
        checkpoint: u64,
    },
    /// A stored number is ahead of every event.
    #[error(
        "workspace {ws}: {sequence} is stored as {stored}, ahead of the PLog, whose events use \
         at most {plog_last}"
    )]
    NumberAhead {
        /// The workspace.
        ws: u64,
        /// The sequence.
        sequence: Sequence,
        /// The stored number.
        stored: u64,
        /// The highest number the PLog's events use (0: none).
        plog_last: u64,
    },
    /// A stored number's key or value does not decode.
    #[error("numbers block {block}: {what}")]
    NumberDamaged {
        /// The numbers block (workspaces `block × 4096 ..`).
        block: u64,
        /// What is wrong and where.
        what: String,
    },

    // -- WLog ---------------------------------------------------------------------------------
    /// A PLog event has no WLog entry.
    #[error(
        "workspace {ws}: WLog offset {wlog} is missing, but partition {partition}'s PLog holds \
         its event at offset {offset}"
    )]
    WLogMissing {
        /// The workspace.
        ws: u64,
        /// The WLog offset.
        wlog: u64,
        /// The partition.
        partition: u32,
        /// The event's PLog offset.
        offset: u64,
    },
    /// A WLog entry differs from its PLog event.
    #[error(
        "workspace {ws}: WLog offset {wlog} differs from its event at PLog offset {offset} of \
         partition {partition} ({detail})"
    )]
    WLogDiffers {
        /// The workspace.
        ws: u64,
        /// The WLog offset.
        wlog: u64,
        /// The partition.
        partition: u32,
        /// The event's PLog offset.
        offset: u64,
        /// What the WLog holds instead.
        detail: String,
    },
    /// A WLog entry no PLog event names.
    #[error("workspace {ws}: WLog offset {wlog} holds an entry no PLog event names ({detail})")]
    WLogOrphan {
        /// The workspace.
        ws: u64,
        /// The WLog offset.
        wlog: u64,
        /// What it holds.
        detail: String,
    },

    // -- Records ------------------------------------------------------------------------------
    /// A record value does not decode.
    #[error("workspace {ws}: record {id} does not decode: {error}")]
    RecordCorrupt {
        /// The workspace.
        ws: u64,
        /// The record ID (from its key).
        id: u64,
        /// Why.
        error: DecodeError,
    },
    /// A stored record says another ID or kind than its key and creating event.
    #[error("workspace {ws}: record {id} {detail}")]
    RecordMismatch {
        /// The workspace.
        ws: u64,
        /// The record ID (from its key).
        id: u64,
        /// What differs.
        detail: String,
    },
    /// A record an event created or updated is missing.
    #[error(
        "workspace {ws}: record {id} is missing, but the event at PLog offset {offset} of \
         partition {partition} {verb} it"
    )]
    RecordMissing {
        /// The workspace.
        ws: u64,
        /// The record ID.
        id: u64,
        /// The partition.
        partition: u32,
        /// The event's offset.
        offset: u64,
        /// "created" or "updated".
        verb: &'static str,
    },
    /// A record no event created.
    #[error("workspace {ws}: record {id} exists, but no event created it")]
    RecordOrphan {
        /// The workspace.
        ws: u64,
        /// The record ID.
        id: u64,
    },
    /// A record stored as a reference to the event that created it (under its own key in key
    /// layouts 4 and 5, or in a records chunk in layout 5) whose
    /// reference does not resolve to the record: the event is not there, is another event,
    /// or does not create the record where the reference says.
    #[error(
        "workspace {ws}: record {id} refers to PLog offset {offset} of partition {partition}, \
         which holds {found}: the record cannot be read; restore the data directory from a \
         backup"
    )]
    RecordDangling {
        /// The workspace.
        ws: u64,
        /// The record ID.
        id: u64,
        /// The partition the reference names.
        partition: u32,
        /// The PLog offset it names.
        offset: u64,
        /// What that place holds instead.
        found: String,
    },

    // -- The index in chunks (key layout 5) ---------------------------------------------------
    /// A WLog or records chunk does not decode, or does not hold the run its key names (its
    /// first entry is elsewhere, an entry is outside its records bucket, or its run reaches
    /// into the next chunk's): the entries of its run cannot be read, or are read from no
    /// chunk.
    #[error(
        "workspace {ws}: the {table} chunk whose run starts at {} {first} is damaged ({detail}): \
         the engine cannot read the entries of its run (reads of them fail, or miss them); \
         restore the data directory from a backup",
        table.item()
    )]
    ChunkDamaged {
        /// Which table.
        table: ChunkTable,
        /// The workspace.
        ws: u64,
        /// The WLog offset or record ID its key names.
        first: u64,
        /// What is wrong.
        detail: String,
    },
    /// A chunk holds the entry of an event at or above its partition's indexed end: the chunks
    /// and the indexed end, written in one batch, disagree.
    #[error(
        "workspace {ws}: a {table} chunk holds {} {number}, whose event at PLog offset {offset} \
         of partition {partition} is at or above the partition's indexed end {indexed}: chunks \
         hold only events below it, so the engine's keys disagree with each other (the indexed \
         end went back, or the chunk was written by something else); restore the data \
         directory from a backup",
        table.item()
    )]
    ChunkAhead {
        /// Which table.
        table: ChunkTable,
        /// The workspace.
        ws: u64,
        /// The WLog offset or record ID.
        number: u64,
        /// The partition of the event.
        partition: u32,
        /// The event's PLog offset.
        offset: u64,
        /// The partition's indexed end.
        indexed: u64,
    },
    /// A partition's indexed end is above its applied end: it says chunks hold the WLog
    /// entries and records of events the engine never applied.
    #[error(
        "partition {partition}: the indexed end {indexed} is above the applied end {applied}: it \
         says chunks hold the WLog entries and created records of events the engine never \
         applied, and a restart reads none of the events below it back from the segment files; \
         restore the data directory from a backup"
    )]
    IndexedAhead {
        /// The partition.
        partition: u32,
        /// The indexed end the engine records.
        indexed: u64,
        /// The applied end it records (1 when none).
        applied: u64,
    },
    /// A partition's indexed end does not decode.
    #[error(
        "partition {partition}: the indexed end is damaged ({len} bytes where 8 belong): the \
         engine does not start on it"
    )]
    IndexedDamaged {
        /// The partition.
        partition: u32,
        /// Its length.
        len: usize,
    },
}

impl Problem {
    /// A short stable name of the kind of problem (`plog-gap`, `wlog-missing`, …), for
    /// counting and for scripts.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::FileUnreadable { .. } => "file-unreadable",
            Problem::FileMissing { .. } => "file-missing",
            Problem::ForeignEngine { .. } => "foreign-engine",
            Problem::Inconsistent { .. } => "inconsistent",
            Problem::MetaDamaged { .. } => "meta-damaged",
            Problem::NoPartitionCount => "no-partition-count",
            Problem::BelowMark { .. } => "below-mark",
            Problem::Unreadable { .. } => "unreadable",
            Problem::PLogBadKey { .. } => "plog-bad-key",
            Problem::PLogCorrupt { .. } => "plog-corrupt",
            Problem::PLogMisplaced { .. } => "plog-misplaced",
            Problem::PLogGap { .. } => "plog-gap",
            Problem::PLogInAcceptedLoss { .. } => "plog-in-accepted-loss",
            Problem::PLogUnknownPartition { .. } => "plog-unknown-partition",
            Problem::PLogSegmentDamaged { .. } => "plog-segment-damaged",
            Problem::AppliedAhead { .. } => "applied-ahead",
            Problem::AppliedDamaged { .. } => "applied-damaged",
            Problem::WorkspaceInTwoPartitions { .. } => "workspace-in-two-partitions",
            Problem::NumberReused { .. } => "number-reused",
            Problem::RetiredNumberUsed { .. } => "retired-number-used",
            Problem::WLogOffsetSkipped { .. } => "wlog-offset-skipped",
            Problem::CheckpointDamaged { .. } => "checkpoint-damaged",
            Problem::CheckpointAhead { .. } => "checkpoint-ahead",
            Problem::NumberNotCovered { .. } => "number-not-covered",
            Problem::NumberAhead { .. } => "number-ahead",
            Problem::NumberDamaged { .. } => "number-damaged",
            Problem::WLogMissing { .. } => "wlog-missing",
            Problem::WLogDiffers { .. } => "wlog-differs",
            Problem::WLogOrphan { .. } => "wlog-orphan",
            Problem::RecordCorrupt { .. } => "record-corrupt",
            Problem::RecordMismatch { .. } => "record-mismatch",
            Problem::RecordMissing { .. } => "record-missing",
            Problem::RecordOrphan { .. } => "record-orphan",
            Problem::RecordDangling { .. } => "record-dangling",
            Problem::ChunkDamaged { .. } => "chunk-damaged",
            Problem::ChunkAhead { .. } => "chunk-ahead",
            Problem::IndexedAhead { .. } => "indexed-ahead",
            Problem::IndexedDamaged { .. } => "indexed-damaged",
        }
    }
}
