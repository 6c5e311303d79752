//! The PLog pass: reads every PLog block of a partition (past gaps, unlike replay, which stops at
//! the first block that is not full), or every page of its segment files in key layouts 4 and 5
//! ([`segments`]), decodes every event, checks it sits at its own offset and
//! that offsets are contiguous except at accepted losses, checks the numbers it uses (invariants
//! 1–3 and 10 of docs/invariants.md), and remembers per workspace and per record what the later
//! passes need, among them a digest of the workspace's events that the WLog pass compares with its
//! entries (in key layout 5 of the events below the indexed end only: no chunk holds the others).
//! The same pass, in comparison mode, reads the PLog again for the few workspaces whose digests
//! differ and compares their WLog entries byte for byte (in key layout 5, their chunks' entries
//! field by field, [`crate::chunks`]), to name each entry that is missing or different.

mod segments;

use std::collections::{HashMap, HashSet};
use std::ops::{Bound, ControlFlow};

use monoseq_kv::{Key, KvStore, Order};
use monoseq_store::{Event, LOG_BLOCK_EVENTS, Mark, WLogRef, event_crc};

use crate::chunks::{self, EventAt, WLogCursor};
use crate::keys;
use crate::problem::Problem;
use crate::source::{PROGRESS_EVERY, Source, describe_entry};
use crate::state::{
    Problems, RecordState, SEQUENCES, State, WsState, entry_hash, initial, mark_of, slot,
};
use crate::{Progress, Stage};

pub(crate) use segments::{check_applied, read_applied};

/// Empty PLog blocks read past the last block holding an event (and past every offset the
/// checkpoint, the marks or an accepted loss name) before the scan of a partition ends, when
/// no partition list says which blocks exist: events after a gap this long are not found.
pub const PLOG_EMPTY_BLOCKS_PROBED: u64 = 4;
/// Most events whose WLog entries are compared in one `get_many`.
const WLOG_COMPARE_EVENTS_MAX: usize = 1024;
/// Most event bytes held for one WLog comparison.
const WLOG_COMPARE_BYTES_MAX: usize = 4 << 20;

/// An event whose WLog entry is yet to be compared.
struct Pending {
    ws: u64,
    wlog: u64,
    offset: u64,
    bytes: std::ops::Range<usize>,
}

/// The PLog pass over one partition.
pub(crate) struct PLogPass<'s, 'a, S> {
    src: &'s Source<'a, S>,
    partition: u32,
    state: &'s mut State,
    problems: &'s mut Problems,
    progress: &'s mut dyn FnMut(Progress),
    partitions: u32,
    /// Comparison mode: only the WLog entries of these workspaces' events are compared.
    compare: Option<&'s HashSet<u64>>,
    /// The next PLog offset expected.
    next: u64,
    pending: Vec<Pending>,
    pending_bytes: Vec<u8>,
    /// Key layout 5, comparison mode: the WLog chunk last read of each workspace compared.
    cursors: HashMap<u64, WLogCursor>,
}

impl<'s, 'a, S: KvStore> PLogPass<'s, 'a, S> {
    pub(crate) fn new(
        src: &'s Source<'a, S>,
        partition: u32,
        state: &'s mut State,
        problems: &'s mut Problems,
        progress: &'s mut dyn FnMut(Progress),
    ) -> Self {
        let partitions = state.partitions.len() as u32;
        PLogPass {
            src,
            partition,
            state,
            problems,
            progress,
            partitions,
            compare: None,
            next: 1,
            pending: Vec::new(),
            pending_bytes: Vec::new(),
            cursors: HashMap::new(),
        }
    }

    /// Comparison mode: reads the PLog again only to compare the WLog entries of the events
    /// of `workspaces` with the events.
    pub(crate) fn comparing(mut self, workspaces: &'s HashSet<u64>) -> Self {
        self.compare = Some(workspaces);
        self
    }

    /// Reads the partition's PLog; `mark_plog` is the acknowledged end its marks name (0:
    /// none), so that a scan without a partition list reads at least that far.
    pub(crate) fn run(mut self, mark_plog: u64) {
        match self.src.segments {
            Some(dir) => self.read_segments(dir),
            None => self.scan_blocks(mark_plog),
        }
        self.flush_wlog();
        if self.compare.is_none() {
            let now = self.progress_now();
            (self.progress)(now);
        }
    }

    /// Reads the partition's PLog blocks: those the list names, or else from block 0 on
    /// until [`PLOG_EMPTY_BLOCKS_PROBED`] empty ones follow every offset known to be used.
    fn scan_blocks(&mut self, mark_plog: u64) {
        let p = self.partition as usize;
        let Some(part) = self.state.partitions.get(p) else {
            return;
        };
        let listed: Option<Vec<u64>> = self
            .src
            .list
            .map(|l| l.plog.get(&self.partition).cloned().unwrap_or_default());
        match listed {
            Some(blocks) => {
                for block in blocks {
                    self.scan_block(block);
                }
            }
            None => {
                let bound = [part.checkpoint, mark_plog]
                    .into_iter()
                    .chain(part.losses.iter().map(|l| l.plog_to.saturating_add(1)))
                    .map(keys::log_block_of)
                    .max()
                    .unwrap_or(0);
                let mut block = 0u64;
                let mut empty_run = 0u64;
                while block <= bound || empty_run < PLOG_EMPTY_BLOCKS_PROBED {
                    if self.scan_block(block) == 0 {
                        empty_run += 1;
                    } else {
                        empty_run = 0;
                    }
                    block += 1;
                }
            }
        }
    }

    fn progress_now(&self) -> Progress {
        Progress {
            stage: Stage::PLog {
                partition: self.partition,
                partitions: self.partitions,
            },
            done: self.state.events,
            total: None,
        }
    }

    /// Reads one block; returns how many entries it holds.
    fn scan_block(&mut self, block: u64) -> u64 {
        let part = keys::plog_block(self.src.app, self.partition, block);
        let mut after: Option<Vec<u8>> = None;
        let mut entries = 0u64;
        loop {
            let mut batch: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut batch_bytes = 0usize;
            let from = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
            let read = self.src.kv.scan(
                &part,
                from,
                Bound::Unbounded,
                Order::Ascending,
                &mut |clustering, value| {
                    batch.push((clustering.to_vec(), value.to_vec()));
                    batch_bytes += value.len();
                    if batch.len() >= WLOG_COMPARE_EVENTS_MAX
                        || batch_bytes >= WLOG_COMPARE_BYTES_MAX
                    {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                },
            );
            let full =
                batch.len() >= WLOG_COMPARE_EVENTS_MAX || batch_bytes >= WLOG_COMPARE_BYTES_MAX;
            after = batch.last().map(|(c, _)| c.clone());
            entries += batch.len() as u64;
            for (clustering, value) in &batch {
                self.entry(block, clustering, value);
            }
            if let Err(e) = read {
                self.problems.unreadable(
                    format!("PLog block {block} of partition {}", self.partition),
                    &e,
                );
                if let Some(part) = self.state.partitions.get_mut(self.partition as usize) {
                    part.plog_unreadable = true;
                }
                return entries;
            }
            if !full {
                return entries;
            }
        }
    }

    fn entry(&mut self, block: u64, clustering: &[u8], value: &[u8]) {
        match keys::at_position(block, clustering) {
            Some(offset) => self.event_at(offset, value),
            None if self.compare.is_some() => {}
            None => self.problems.push(Problem::PLogBadKey {
                partition: self.partition,
                block,
                len: clustering.len(),
            }),
        }
    }

    /// The PLog entry at `offset`, as stored (`value`).
    fn event_at(&mut self, offset: u64, value: &[u8]) {
        let partition = self.partition;
        if let Some(workspaces) = self.compare {
            if let Ok(e) = Event::decode(value)
                && e.plog_offset.0 == offset
                && workspaces.contains(&e.ws.0)
            {
                if self.src.chunked {
                    self.compare_in_chunks(e.ws.0, e.wlog_offset.0, offset, value);
                } else {
                    self.push_pending(e.ws.0, e.wlog_offset.0, offset, value);
                }
            }
            return;
        }
        self.state.events += 1;
        if self.state.events.is_multiple_of(PROGRESS_EVERY) {
            let now = self.progress_now();
            (self.progress)(now);
        }
        self.contiguity(offset);
        if let Some(part) = self.state.partitions.get_mut(partition as usize) {
            part.plog_last = part.plog_last.max(offset);
        }
        let event = match Event::decode(value) {
            Ok(e) => e,
            Err(error) => {
                self.problems.push(Problem::PLogCorrupt {
                    partition,
                    offset,
                    error,
                });
                return;
            }
        };
        if event.plog_offset.0 != offset {
            self.problems.push(Problem::PLogMisplaced {
                partition,
                offset,
                found: event.plog_offset.0,
            });
            return;
        }
        let crc = event_crc(value).unwrap_or_default();
        self.numbers(&event);
        self.records(&event, crc);
        let unindexed = self
            .state
            .partitions
            .get(partition as usize)
            .is_some_and(|p| p.unindexed(offset));
        // In key layout 5 the entry of an event at or above the indexed end is in no chunk:
        // it counts as present (the event itself holds it).
        if let Some(w) = self.state.workspaces.get_mut(&event.ws.0)
            && !unindexed
        {
            w.wlog_digest =
                w.wlog_digest
                    .wrapping_add(entry_hash(event.wlog_offset.0, partition, offset, crc));
        }
    }

    /// Key layout 5: compares the WLog entry the chunks hold for the event at `offset` (its
    /// bytes `value`) of workspace `ws`, at WLog offset `wlog`, with the event.
    fn compare_in_chunks(&mut self, ws: u64, wlog: u64, offset: u64, value: &[u8]) {
        let at = EventAt {
            ws,
            wlog,
            partition: self.partition,
            offset,
            crc: event_crc(value).unwrap_or_default(),
        };
        let cursor = self
            .cursors
            .entry(ws)
            .or_insert_with(|| WLogCursor::new(ws));
        chunks::compare_event(self.src, cursor, &self.state.partitions, &at, self.problems);
    }

    fn push_pending(&mut self, ws: u64, wlog: u64, offset: u64, value: &[u8]) {
        let at = self.pending_bytes.len();
        self.pending_bytes.extend_from_slice(value);
        self.pending.push(Pending {
            ws,
            wlog,
            offset,
            bytes: at..self.pending_bytes.len(),
        });
        if self.pending.len() >= WLOG_COMPARE_EVENTS_MAX
            || self.pending_bytes.len() >= WLOG_COMPARE_BYTES_MAX
        {
            self.flush_wlog();
        }
    }

    /// Offsets are contiguous from 1 except across accepted losses.
    fn contiguity(&mut self, offset: u64) {
        let partition = self.partition;
        let Some(part) = self.state.partitions.get(partition as usize) else {
            return;
        };
        if let Some(loss) = part.loss_at(offset) {
            self.problems.push(Problem::PLogInAcceptedLoss {
                partition,
                offset,
                from: loss.plog_from,
                to: loss.plog_to,
            });
        } else if offset > self.next {
            // The missing range, less the parts accepted losses name.
            let mut from = self.next;
            while from < offset {
                match part.loss_at(from) {
                    Some(loss) => from = loss.plog_to.saturating_add(1),
                    None => {
                        let to = part
                            .losses
                            .iter()
                            .filter(|l| l.plog_from > from && l.plog_from < offset)
                            .map(|l| l.plog_from - 1)
                            .min()
                            .unwrap_or(offset - 1);
                        self.problems.push(Problem::PLogGap {
                            partition,
                            from,
                            to,
                        });
                        from = to + 1;
                    }
                }
            }
        }
        self.next = self.next.max(offset.saturating_add(1));
    }

    /// invariants 1, 2 and 10 of docs/invariants.md for the numbers of one event.
    fn numbers(&mut self, event: &Event) {
        let at = At {
            partition: self.partition,
            offset: event.plog_offset.0,
            ws: event.ws.0,
        };
        let used = used_numbers(event);
        let Some(part) = self.state.partitions.get_mut(at.partition as usize) else {
            return;
        };
        let retired = if part.losses.is_empty() {
            Mark::default()
        } else {
            part.retired_before(at.offset)
        };
        let w = workspace_of(&mut self.state.workspaces, &at, self.problems);
        w.last_plog = at.offset;
        for (i, numbers) in used.iter().enumerate() {
            let Some(&max) = numbers.last() else {
                continue;
            };
            check_sequence(&at, i, numbers, mark_of(&retired, i), w, self.problems);
            let st = &mut w.seqs[i];
            st.last = st.last.max(max);
            if at.offset < part.checkpoint {
                st.covered = st.covered.max(max);
            }
            if let Some(m) = part.max.get_mut(i) {
                *m = (*m).max(max);
            }
        }
    }

    /// Remembers the records the event (whose header holds checksum `crc`) creates and
    /// updates.
    fn records(&mut self, event: &Event, crc: u32) {
        let ws = event.ws.0;
        let offset = event.plog_offset.0;
        for (index, r) in event.created.iter().enumerate() {
            let e = self
                .state
                .records
                .entry((ws, r.id.0))
                .or_insert(RecordState::named_at(offset));
            if e.kind == 0 {
                *e = RecordState {
                    offset,
                    crc,
                    index: u16::try_from(index).unwrap_or(u16::MAX),
                    kind: r.kind.code(),
                    updated: false,
                };
            }
        }
        for r in &event.updated {
            let e = self
                .state
                .records
                .entry((ws, r.id.0))
                .or_insert(RecordState::named_at(offset));
            e.updated |= e.kind != 0;
        }
    }

    /// Compares the pending events with their WLog entries.
    fn flush_wlog(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let app = self.src.app;
        let parts: Vec<Vec<u8>> = self
            .pending
            .iter()
            .map(|p| keys::wlog_block(app, p.ws, keys::log_block_of(p.wlog)))
            .collect();
        let positions: Vec<[u8; 2]> = self
            .pending
            .iter()
            .map(|p| keys::position(p.wlog))
            .collect();
        let wanted: Vec<Key<'_>> = parts
            .iter()
            .zip(&positions)
            .map(|(p, c)| Key::new(p, c))
            .collect();
        let partition = self.partition;
        match self.src.kv.get_many(&wanted) {
            Err(e) => {
                let (first, last) = (
                    self.pending.first().map_or(0, |p| p.offset),
                    self.pending.last().map_or(0, |p| p.offset),
                );
                self.problems.unreadable(
                    format!(
                        "the WLog entries of PLog offsets {first}..={last} of partition \
                         {partition}"
                    ),
                    &e,
                );
            }
            Ok(values) => {
                let part = self.state.partitions.get(partition as usize);
                for (p, value) in self.pending.iter().zip(values) {
                    let plog = self.pending_bytes.get(p.bytes.clone()).unwrap_or_default();
                    match value {
                        None if part.is_some_and(|part| part.lags(p.offset)) => {}
                        None => self.problems.push(Problem::WLogMissing {
                            ws: p.ws,
                            wlog: p.wlog,
                            partition,
                            offset: p.offset,
                        }),
                        Some(v) if names_event(&v, partition, p.offset, plog) => {}
                        Some(v) => self.problems.push(Problem::WLogDiffers {
                            ws: p.ws,
                            wlog: p.wlog,
                            partition,
                            offset: p.offset,
                            detail: describe_entry(&v),
                        }),
                    }
                }
            }
        }
        self.pending.clear();
        self.pending_bytes.clear();
    }
}

/// Whether WLog entry `entry` names the event `plog` (its bytes) at PLog offset `offset` of
/// `partition`: as a reference to exactly that event, or as a copy of its bytes.
fn names_event(entry: &[u8], partition: u32, offset: u64, plog: &[u8]) -> bool {
    if !WLogRef::is_ref(entry) {
        return entry == plog;
    }
    WLogRef::decode(entry).is_ok_and(|r| {
        r.partition.0 == partition
            && r.plog_offset.0 == offset
            && Some(r.event_crc) == event_crc(plog)
    })
}

const _: () = assert!(LOG_BLOCK_EVENTS <= 1 << 16);

/// Where an event is: its partition, PLog offset and workspace.
struct At {
    partition: u32,
    offset: u64,
    ws: u64,
}

/// The numbers of each sequence (WLog, CRecord, OWRecord) an event uses, sorted; numbers below
/// a sequence's first are left out.
fn used_numbers(event: &Event) -> [Vec<u64>; 3] {
    let mut used: [Vec<u64>; 3] = Default::default();
    event.for_each_number(|seq, n| {
        if let Some(i) = slot(seq)
            && n.0 >= initial(i)
            && let Some(v) = used.get_mut(i)
        {
            v.push(n.0);
        }
    });
    for numbers in &mut used {
        numbers.sort_unstable();
    }
    used
}

/// The state of the event's workspace, created at its first event; a workspace whose events
/// sit in two partitions is a problem.
fn workspace_of<'w>(
    workspaces: &'w mut HashMap<u64, WsState>,
    at: &At,
    problems: &mut Problems,
) -> &'w mut WsState {
    let w = workspaces.entry(at.ws).or_insert_with(|| WsState {
        partition: at.partition,
        ..WsState::default()
    });
    if w.partition != at.partition {
        problems.push(Problem::WorkspaceInTwoPartitions {
            ws: at.ws,
            first: w.partition,
            second: at.partition,
            offset: at.offset,
        });
    }
    w
}

/// Checks the numbers of sequence `i` an event uses (`numbers`, sorted, not empty) against the
/// workspace's earlier ones and the numbers its partition's accepted losses retired
/// (`retired`): none is used twice, none is retired, and WLog offsets follow each other (a
/// skipped one is remembered as a hole).
fn check_sequence(
    at: &At,
    i: usize,
    numbers: &[u64],
    retired: u64,
    w: &mut WsState,
    problems: &mut Problems,
) {
    let (Some(&min), sequence) = (numbers.first(), SEQUENCES[i]) else {
        return;
    };
    let last = w.seqs[i].last;
    let reused = |number, last| Problem::NumberReused {
        partition: at.partition,
        offset: at.offset,
        ws: at.ws,
        sequence,
        number,
        last,
    };
    for pair in numbers.windows(2) {
        if pair[0] == pair[1] {
            problems.push(reused(pair[1], pair[0]));
        }
    }
    if min <= last {
        problems.push(reused(min, last));
    } else if min <= retired {
        problems.push(Problem::RetiredNumberUsed {
            partition: at.partition,
            offset: at.offset,
            ws: at.ws,
            sequence,
            number: min,
            retired,
        });
    }
    if i == 0 {
        if min > (last + 1).max(retired + 1) {
            problems.push(Problem::WLogOffsetSkipped {
                partition: at.partition,
                offset: at.offset,
                ws: at.ws,
                wlog: min,
                last,
            });
        }
        if min > last + 1 {
            w.add_hole(last + 1, min - 1);
        }
    }
}
