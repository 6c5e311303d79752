//! What verification remembers between its passes, bounded per key and never whole events:
//! per workspace its partition and, per numbered sequence, the last number its events used
//! and the last one before the checkpoint; per record its creating (or first updating) event;
//! per partition its PLog end, checkpoint, accepted losses and (key layouts 4 and 5) applied
//! and indexed ends. Also the sink that keeps the first problems and counts the rest.

use std::collections::{HashMap, HashSet};

use monoseq_core::SeqId;
use monoseq_store::{
    AcceptedLoss, CRECORD_ID_SEQUENCE, Mark, OWRECORD_ID_SEQUENCE, WLOG_OFFSET_SEQUENCE,
};

use crate::problem::{Problem, Sequence};

/// The three sequences events use, in the order of [`WsState::seqs`].
pub(crate) const SEQUENCES: [Sequence; 3] = [Sequence::WLog, Sequence::CRecord, Sequence::OWRecord];

/// The slot of a sequence in [`WsState::seqs`]; `None` for sequences events do not use.
pub(crate) fn slot(seq: SeqId) -> Option<usize> {
    match seq {
        s if s == WLOG_OFFSET_SEQUENCE.id => Some(0),
        s if s == CRECORD_ID_SEQUENCE.id => Some(1),
        s if s == OWRECORD_ID_SEQUENCE.id => Some(2),
        _ => None,
    }
}

/// The initial value of the sequence in slot `i`: numbers below it are external or reserved IDs
/// that never move a sequence (invariant 5 of docs/invariants.md), so the checks leave them out as
/// replay does.
pub(crate) fn initial(i: usize) -> u64 {
    [
        WLOG_OFFSET_SEQUENCE.initial.0,
        CRECORD_ID_SEQUENCE.initial.0,
        OWRECORD_ID_SEQUENCE.initial.0,
    ]
    .get(i)
    .copied()
    .unwrap_or(1)
}

/// The value of a mark for the sequence in slot `i`.
pub(crate) fn mark_of(mark: &Mark, i: usize) -> u64 {
    [mark.wlog, mark.crecord, mark.owrecord]
        .get(i)
        .copied()
        .unwrap_or(0)
}

/// One sequence of one workspace.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SeqState {
    /// The highest number its events used (0: none).
    pub(crate) last: u64,
    /// The highest number its events before the partition's checkpoint used.
    pub(crate) covered: u64,
}

/// One workspace.
#[derive(Debug, Default)]
pub(crate) struct WsState {
    /// The partition whose PLog holds its first event.
    pub(crate) partition: u32,
    /// The PLog offset of its last event.
    pub(crate) last_plog: u64,
    /// WLog offset, CRecord ID, OWRecord ID.
    pub(crate) seqs: [SeqState; 3],
    /// The sum of [`entry_hash`] over the workspace's PLog events, less the sum over the WLog
    /// entries those events name: 0 when every entry is there and names its event.
    pub(crate) wlog_digest: u64,
    /// WLog offsets at or below the last one that no event names (jumps and skips), as
    /// inclusive ranges; `None` in the usual case of none (a boxed slice: 8 bytes per
    /// workspace, reallocated on the rare push).
    pub(crate) wlog_holes: Option<Box<[(u64, u64)]>>,
}

impl WsState {
    /// Whether an event names WLog offset `offset` of this workspace.
    pub(crate) fn names_wlog(&self, offset: u64) -> bool {
        offset >= 1
            && offset <= self.seqs[0].last
            && !self
                .wlog_holes
                .as_deref()
                .is_some_and(|h| h.iter().any(|&(a, b)| a <= offset && offset <= b))
    }

    pub(crate) fn add_hole(&mut self, from: u64, to: u64) {
        let mut holes = self.wlog_holes.take().map(Vec::from).unwrap_or_default();
        holes.push((from, to));
        self.wlog_holes = Some(holes.into_boxed_slice());
    }
}

/// The hash of a WLog entry at WLog offset `wlog` naming the event at PLog offset `plog` of
/// `partition` whose header holds checksum `crc`, for [`WsState::wlog_digest`]. A WLog entry is
/// a reference to its event or (written before references) a copy of it; both say which event
/// they name (a copy's partition is its workspace's), and the checksum names its exact bytes.
pub(crate) fn entry_hash(wlog: u64, partition: u32, plog: u64, crc: u32) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write_u64(wlog);
    h.write_u32(partition);
    h.write_u64(plog);
    h.write_u32(crc);
    h.finish()
}

/// A record some event created or updated (16 bytes).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordState {
    /// The PLog offset of the event that created it (or first updated it).
    pub(crate) offset: u64,
    /// The checksum in the creating event's header (what a record reference names).
    pub(crate) crc: u32,
    /// The record's position among the creating event's created records (`u16::MAX` for
    /// any position from there on).
    pub(crate) index: u16,
    /// The created kind's code; 0 when only updates name it.
    pub(crate) kind: u8,
    /// Whether an event updated it after the one that created it: then it is stored whole,
    /// never as a reference to its creating event.
    pub(crate) updated: bool,
}

impl RecordState {
    /// A record an event at `offset` names, not created yet.
    pub(crate) fn named_at(offset: u64) -> RecordState {
        RecordState {
            offset,
            crc: 0,
            index: 0,
            kind: 0,
            updated: false,
        }
    }
}

/// One partition.
#[derive(Debug, Default, Clone)]
pub(crate) struct PartitionState {
    /// The checkpoint: the first PLog offset the stored numbers do not cover.
    pub(crate) checkpoint: u64,
    /// The highest PLog offset holding an event (0: none).
    pub(crate) plog_last: u64,
    /// Whether reading a PLog block failed (reported as unreadable): how far the PLog goes is
    /// then unknown, so it is not compared with the marks or the checkpoint; a loss is claimed
    /// only from what was read.
    pub(crate) plog_unreadable: bool,
    /// Highest numbers the partition's events use: WLog, CRecord, OWRecord.
    pub(crate) max: [u64; 3],
    /// Accepted losses, oldest first.
    pub(crate) losses: Vec<AcceptedLoss>,
    /// The mark below which numbers are retired by its losses.
    pub(crate) retired: Mark,
    /// Key layout 4: one past the last offset its segment files hold (`None` when they were
    /// not read, or could not be opened).
    pub(crate) log_end: Option<u64>,
    /// Key layout 4: what follows the data of its last segment when that is not zeros.
    pub(crate) tail: Option<String>,
    /// Key layouts 4 and 5: the applied end the engine records (1 when it records none): one
    /// past the last PLog offset whose WLog entries and records it holds. Those of later
    /// events may be missing, as a crash leaves them: the server writes them again at its
    /// start.
    pub(crate) applied: Option<u64>,
    /// Key layout 5: the indexed end the engine records (1 when it records none): one past
    /// the last PLog offset whose WLog entries and created records' references are in chunks.
    /// Those of later events are held in memory only while the server runs (a restart reads
    /// them back from the segment files), so no chunk holds them. `None` in layouts 3 and 4,
    /// or when it is unknown.
    pub(crate) indexed: Option<u64>,
    /// Key layout 5: the indexed end is damaged or unreadable (reported), so which events
    /// the chunks hold is unknown: an entry a chunk holds must match its event, but none is
    /// required.
    pub(crate) indexed_unknown: bool,
}

impl PartitionState {
    /// The mark retired by the losses that end before PLog offset `offset`.
    pub(crate) fn retired_before(&self, offset: u64) -> Mark {
        self.losses
            .iter()
            .filter(|l| l.plog_to < offset)
            .fold(Mark::default(), |m, l| m.max(&l.mark))
    }

    /// Whether the engine need not hold the WLog entry and records of the event at `offset`
    /// yet (key layout 4: it is at or above the applied end).
    pub(crate) fn lags(&self, offset: u64) -> bool {
        self.applied.is_some_and(|applied| offset >= applied)
    }

    /// Whether no chunk may hold the WLog entry and created records of the event at `offset`
    /// (key layout 5: it is at or above the indexed end).
    pub(crate) fn unindexed(&self, offset: u64) -> bool {
        self.indexed.is_some_and(|indexed| offset >= indexed)
    }

    /// Whether the engine need not hold the WLog entry and created records of the event at
    /// `offset` in chunks, or at all: not applied yet, at or above the indexed end (key layout
    /// 5: held in memory only), or the indexed end is unknown.
    pub(crate) fn may_lack_chunk_entry(&self, offset: u64) -> bool {
        self.lags(offset) || self.unindexed(offset) || self.indexed_unknown
    }

    /// The accepted loss that contains `offset`, if any.
    pub(crate) fn loss_at(&self, offset: u64) -> Option<&AcceptedLoss> {
        self.losses
            .iter()
            .find(|l| l.plog_from <= offset && offset <= l.plog_to)
    }
}

/// Everything the passes share.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) partitions: Vec<PartitionState>,
    pub(crate) workspaces: HashMap<u64, WsState>,
    pub(crate) records: HashMap<(u64, u64), RecordState>,
    pub(crate) events: u64,
}

impl State {
    /// The retired mark of `ws`'s partition, or for a workspace no event names the highest of
    /// every partition's.
    pub(crate) fn retired_of(&self, ws: u64) -> Mark {
        match self.workspaces.get(&ws) {
            Some(w) => self
                .partitions
                .get(w.partition as usize)
                .map(|p| p.retired)
                .unwrap_or_default(),
            None => self
                .partitions
                .iter()
                .fold(Mark::default(), |m, p| m.max(&p.retired)),
        }
    }
}

/// Keeps the first `max` problems and counts all.
#[derive(Debug)]
pub(crate) struct Problems {
    pub(crate) list: Vec<Problem>,
    pub(crate) total: u64,
    max: usize,
}

impl Problems {
    pub(crate) fn new(max: usize) -> Problems {
        Problems {
            list: Vec::new(),
            total: 0,
            max,
        }
    }

    pub(crate) fn push(&mut self, p: Problem) {
        self.total += 1;
        if self.list.len() < self.max {
            self.list.push(p);
        }
    }

    /// Records a storage fault while reading `what`.
    pub(crate) fn unreadable(&mut self, what: impl Into<String>, e: &dyn std::fmt::Display) {
        self.push(Problem::Unreadable {
            what: what.into(),
            message: e.to_string(),
        });
    }
}

/// The workspaces whose WLog digests do not come to 0: an entry of theirs is missing or
/// differs from its event.
pub(crate) fn differing(state: &State) -> HashSet<u64> {
    state
        .workspaces
        .iter()
        .filter(|(_, w)| w.wlog_digest != 0)
        .map(|(&ws, _)| ws)
        .collect()
}
