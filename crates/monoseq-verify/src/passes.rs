//! The passes after the PLogs, block by block in key order: the WLogs (entries no event names;
//! in key layout 5 their chunks, [`crate::chunks`]), the records table (every record created
//! or updated exists, decodes and matches its event, or is a reference that resolves to it, or
//! in key layout 5 is in a records chunk that does; no record without an event) and the
//! numbers table (invariants 4 and 5 of docs/invariants.md: stored numbers cover every event
//! before the checkpoint and are never ahead of the PLog).

use std::collections::{HashMap, HashSet};

use monoseq_kv::KvStore;
use monoseq_store::{DecodeError, Mark, RecordKind, RecordRef, WLogTarget};

use crate::chunks::{self, InChunk};
use crate::keys;
use crate::problem::Problem;
use crate::record::{ExpectedRecord, Place, StoredRecord, decode_record, reference_found};
use crate::source::{Source, describe_entry, report, scan_all, union};
use crate::state::{
    PartitionState, Problems, RecordState, SEQUENCES, State, differing, entry_hash, initial,
    mark_of, slot,
};
use crate::{Progress, Stage};

/// Reads the WLogs: in the blocks up to (and one past) each workspace's last WLog offset, or
/// in every listed WLog block. Reports entries no PLog event names, and subtracts the entries
/// events name from their workspace's digest. Returns the workspaces whose digests do not come
/// to 0: an entry of theirs is missing or differs from its event.
pub(crate) fn wlog_entries<S: KvStore>(
    src: &Source<'_, S>,
    state: &mut State,
    problems: &mut Problems,
    progress: &mut dyn FnMut(Progress),
) -> HashSet<u64> {
    let blocks = wlog_blocks(src, state);
    let total = blocks.len() as u64;
    for (done, (ws, block)) in blocks.into_iter().enumerate() {
        let retired = mark_of(&state.retired_of(ws), 0);
        let mut w = state.workspaces.get_mut(&ws);
        let part = keys::wlog_block(src.app, ws, block);
        let mut found: Vec<Problem> = Vec::new();
        let read = scan_all(src.kv, &part, &mut |clustering, value| {
            let Some(offset) = keys::at_position(block, clustering) else {
                found.push(Problem::WLogOrphan {
                    ws,
                    wlog: block * monoseq_store::LOG_BLOCK_EVENTS,
                    detail: format!(
                        "a key in block {block} with {} clustering bytes where 2 belong",
                        clustering.len()
                    ),
                });
                return;
            };
            if let Some(w) = w.as_deref_mut()
                && w.names_wlog(offset)
            {
                // A damaged entry subtracts nothing: the digest stays off and the workspace is
                // checked entry by entry.
                if let Ok(t) = WLogTarget::decode(value) {
                    let partition = t.partition.map_or(w.partition, |p| p.0);
                    let hash = entry_hash(offset, partition, t.plog_offset.0, t.event_crc);
                    w.wlog_digest = w.wlog_digest.wrapping_sub(hash);
                }
                return;
            }
            if offset <= retired {
                return;
            }
            found.push(Problem::WLogOrphan {
                ws,
                wlog: offset,
                detail: describe_entry(value),
            });
        });
        for p in found {
            problems.push(p);
        }
        if let Err(e) = read {
            problems.unreadable(format!("WLog block {block} of workspace {ws}"), &e);
        }
        report(progress, Stage::WLog, done as u64 + 1, total);
    }
    differing(state)
}

/// The WLog blocks to read, as (workspace, block): every listed one, or those up to (and one
/// past) each workspace's last WLog offset.
fn wlog_blocks<S: KvStore>(src: &Source<'_, S>, state: &State) -> Vec<(u64, u64)> {
    if let Some(list) = src.list {
        return list.wlog.clone();
    }
    let mut wss: Vec<u64> = state.workspaces.keys().copied().collect();
    wss.sort_unstable();
    wss.iter()
        .flat_map(|&ws| {
            let last = state.workspaces.get(&ws).map_or(0, |w| w.seqs[0].last);
            (0..=keys::log_block_of(last) + 1).map(move |b| (ws, b))
        })
        .collect()
}

/// The records table against the records the events created and updated (in key layout 5,
/// the records chunks first). Consumes the records map.
pub(crate) fn records<S: KvStore>(
    src: &Source<'_, S>,
    state: &mut State,
    problems: &mut Problems,
    progress: &mut dyn FnMut(Progress),
) {
    let mut expected: Vec<ExpectedRecord> = state.records.drain().collect();
    expected.shrink_to_fit();
    expected.sort_unstable_by_key(|(k, _)| *k);
    let in_chunks = if src.chunked {
        chunks::record_chunks(src, state, &expected, problems, progress)
    } else {
        Vec::new()
    };
    let derived = expected
        .iter()
        .map(|&((ws, id), _)| (ws, keys::record_block_of(id)));
    let blocks = union(
        derived,
        src.list.map(|l| l.records.clone()).unwrap_or_default(),
    );
    let total = blocks.len() as u64;
    let mut next = 0usize;
    let mut stored: Vec<(u64, Result<StoredRecord, DecodeError>)> = Vec::new();
    for (done, &(ws, block)) in blocks.iter().enumerate() {
        let part = keys::record_block(src.app, ws, block);
        stored.clear();
        let mut bad_keys = 0usize;
        let read = scan_all(
            src.kv,
            &part,
            &mut |clustering, value| match keys::at_position(block, clustering) {
                Some(id) => stored.push((id, decode_record(value))),
                None => bad_keys += 1,
            },
        );
        if bad_keys > 0 {
            problems.push(Problem::RecordMismatch {
                ws,
                id: block * monoseq_store::RECORD_BLOCK_IDS,
                detail: format!(
                    "block {block} holds {bad_keys} keys whose clustering is not 2 bytes"
                ),
            });
        }
        if let Err(e) = read {
            problems.unreadable(format!("records block {block} of workspace {ws}"), &e);
        }
        // The expected records of this block: a run of `expected`, sorted by ID as `stored`.
        let start = next;
        while expected
            .get(next)
            .is_some_and(|&((w, id), _)| (w, keys::record_block_of(id)) <= (ws, block))
        {
            next += 1;
        }
        let run = expected.get(start..next).unwrap_or_default();
        let run_in_chunks = in_chunks.get(start..next).unwrap_or_default();
        let at = Place::of(state, ws, src.segments.is_some());
        check_block(state, &at, (run, run_in_chunks), &stored, problems);
        report(progress, Stage::Records, done as u64 + 1, total);
    }
}

/// Merges one block's stored records with the expected ones (both sorted by ID) of workspace
/// `at.ws`; `run_in_chunks` says (key layout 5) which of the expected ones the records chunks
/// hold (empty: none).
fn check_block(
    state: &State,
    at: &Place,
    (run, run_in_chunks): (&[ExpectedRecord], &[InChunk]),
    stored: &[(u64, Result<StoredRecord, DecodeError>)],
    problems: &mut Problems,
) {
    let ws = at.ws;
    let retired = state.retired_of(ws);
    let part = state.partitions.get(at.partition as usize);
    let mut s = stored.iter().peekable();
    let mut e = run.iter().enumerate().peekable();
    loop {
        match (s.peek(), e.peek()) {
            (None, None) => break,
            (Some(&&(id, ref got)), exp) if exp.is_none_or(|&(_, &((_, eid), _))| id < eid) => {
                s.next();
                stored_without_event(at, id, got, &retired, problems);
            }
            (stored_now, Some(&(i, &((_, id), rs))))
                if stored_now.is_none_or(|&&(sid, _)| id < sid) =>
            {
                e.next();
                let below = [1usize, 2].iter().any(|&i| id <= mark_of(&retired, i));
                let in_chunk = run_in_chunks.get(i).copied().unwrap_or_default();
                if !missing_excused(part, rs, below, in_chunk) {
                    problems.push(Problem::RecordMissing {
                        ws,
                        id,
                        partition: at.partition,
                        offset: rs.offset,
                        verb: if rs.kind == 0 { "updated" } else { "created" },
                    });
                }
            }
            (Some(&&(id, ref got)), Some(&(_, &(_, rs)))) => {
                s.next();
                e.next();
                compare_record(at, id, got, rs, problems);
            }
            _ => break,
        }
    }
}

/// Whether a record its own key does not hold may be missing there: below a retired mark
/// (`below_retired`: an accepted loss took it), not applied yet, or (key layout 5) created and
/// not updated since, and either in a records chunk (`in_chunk`, checked there) or held in
/// memory only (its event is at or above the indexed end, or the indexed end is unknown). A
/// record updated since is stored whole under its own key: a chunk's reference to its creating
/// event would lose the update.
fn missing_excused(
    part: Option<&PartitionState>,
    rs: RecordState,
    below_retired: bool,
    in_chunk: InChunk,
) -> bool {
    let created_only = rs.kind != 0 && !rs.updated;
    (rs.kind == 0 && below_retired)
        || part.is_some_and(|p| p.lags(rs.offset))
        || (created_only
            && (in_chunk != InChunk::Absent
                || part.is_some_and(|p| p.may_lack_chunk_entry(rs.offset))))
}

/// A stored record no event created: fine only below a retired mark (an accepted loss took
/// its event, and a reference to it with it); a record that does not decode is corrupt either
/// way.
fn stored_without_event(
    at: &Place,
    id: u64,
    got: &Result<StoredRecord, DecodeError>,
    retired: &Mark,
    problems: &mut Problems,
) {
    let ws = at.ws;
    let below =
        |kind: RecordKind| slot(kind.id_sequence()).is_some_and(|i| id <= mark_of(retired, i));
    match got {
        Err(error) => problems.push(Problem::RecordCorrupt {
            ws,
            id,
            error: error.clone(),
        }),
        Ok(StoredRecord::Ref(_)) if below(RecordKind::CRecord) || below(RecordKind::WRecord) => {}
        Ok(StoredRecord::Ref(r)) => check_reference(at, id, r, None, problems),
        Ok(StoredRecord::Whole { kind, .. }) if !below(*kind) => {
            problems.push(Problem::RecordOrphan { ws, id });
        }
        Ok(StoredRecord::Whole { .. }) => {}
    }
}

/// A stored record against the one its event created or updated: it decodes, names its own ID
/// and has the created kind, or is a reference that resolves to it.
fn compare_record(
    at: &Place,
    id: u64,
    got: &Result<StoredRecord, DecodeError>,
    expected: RecordState,
    problems: &mut Problems,
) {
    let ws = at.ws;
    let (kind, stored_id) = match got {
        Err(error) => {
            return problems.push(Problem::RecordCorrupt {
                ws,
                id,
                error: error.clone(),
            });
        }
        Ok(StoredRecord::Ref(r)) => return check_reference(at, id, r, Some(expected), problems),
        Ok(StoredRecord::Whole { kind, id }) => (*kind, *id),
    };
    if stored_id != id {
        problems.push(Problem::RecordMismatch {
            ws,
            id,
            detail: format!("says it is record {stored_id}"),
        });
    } else if expected.kind != 0 && kind.code() != expected.kind {
        problems.push(Problem::RecordMismatch {
            ws,
            id,
            detail: format!(
                "is a {kind:?}, but the event at PLog offset {} created a {}",
                expected.offset,
                RecordKind::from_code(expected.kind)
                    .map_or_else(|| expected.kind.to_string(), |k| format!("{k:?}"))
            ),
        });
    }
}

/// A record reference against the event that created the record (`expected`, as the PLog pass
/// found it; `None`: no event did): it names that event (partition, offset, checksum) and the
/// record's place among its created records, and no later event updated the record (an update
/// stores it whole).
fn check_reference(
    at: &Place,
    id: u64,
    r: &RecordRef,
    expected: Option<RecordState>,
    problems: &mut Problems,
) {
    let ws = at.ws;
    if !at.refs_allowed {
        return problems.push(Problem::RecordMismatch {
            ws,
            id,
            detail: "is a record reference, which a key layout 3 store never holds".into(),
        });
    }
    match (reference_found(at, r, expected), expected) {
        (Some(found), _) => problems.push(Problem::RecordDangling {
            ws,
            id,
            partition: r.partition.0,
            offset: r.plog_offset.0,
            found,
        }),
        (None, Some(e)) if e.updated => problems.push(Problem::RecordMismatch {
            ws,
            id,
            detail: format!(
                "is stored as the event at PLog offset {} created it, but a later event \
                 updated it: the update is lost",
                e.offset
            ),
        }),
        (None, _) => {}
    }
}

/// Stored numbers of one numbers block, by workspace and sequence slot.
type StoredNumbers = HashMap<(u64, usize), u64>;

/// The numbers table against the numbers the events used.
pub(crate) fn numbers<S: KvStore>(
    src: &Source<'_, S>,
    state: &State,
    problems: &mut Problems,
    progress: &mut dyn FnMut(Progress),
) -> u64 {
    let mut wss: Vec<u64> = state.workspaces.keys().copied().collect();
    wss.sort_unstable();
    let blocks = union(
        wss.iter().map(|&ws| ws / keys::NUMBERS_BLOCK_WS),
        src.list.map(|l| l.numbers.clone()).unwrap_or_default(),
    );
    let total = blocks.len() as u64;
    let mut stored_count = 0u64;
    let mut next = 0usize;
    let mut stored = StoredNumbers::new();
    for (done, &block) in blocks.iter().enumerate() {
        read_numbers_block(src, block, &mut stored, problems);
        stored_count += stored.len() as u64;
        check_numbers_ahead(state, &stored, problems);
        let in_block = wss
            .get(next..)
            .unwrap_or_default()
            .iter()
            .take_while(|&&ws| ws / keys::NUMBERS_BLOCK_WS <= block)
            .count();
        let block_wss = wss.get(next..next + in_block).unwrap_or_default();
        check_numbers_covered(state, block_wss, &stored, problems);
        next += in_block;
        report(progress, Stage::Numbers, done as u64 + 1, total);
    }
    stored_count
}

/// Reads numbers block `block` into `stored` (cleared first); keys and values of the wrong
/// size are damage, a failed read leaves the block unverified.
fn read_numbers_block<S: KvStore>(
    src: &Source<'_, S>,
    block: u64,
    stored: &mut StoredNumbers,
    problems: &mut Problems,
) {
    stored.clear();
    let part = keys::numbers_block(src.app, block);
    let mut damaged: Vec<String> = Vec::new();
    let read = scan_all(src.kv, &part, &mut |clustering, value| {
        let Some((ws, seq)) = keys::numbers_at(block, clustering) else {
            damaged.push(format!(
                "a key with {} clustering bytes where 4 belong",
                clustering.len()
            ));
            return;
        };
        let Ok(v) = <[u8; 8]>::try_from(value) else {
            damaged.push(format!(
                "the number of sequence {seq} of workspace {ws} has {} bytes where 8 belong",
                value.len()
            ));
            return;
        };
        if let Some(i) = slot(monoseq_core::SeqId(seq)) {
            stored.insert((ws, i), u64::from_be_bytes(v));
        }
    });
    for what in damaged {
        problems.push(Problem::NumberDamaged { block, what });
    }
    if let Err(e) = read {
        problems.unreadable(format!("numbers block {block}"), &e);
    }
}

/// Stored numbers ahead of the last one the PLog uses (and of what accepted losses retired).
fn check_numbers_ahead(state: &State, stored: &StoredNumbers, problems: &mut Problems) {
    let mut ahead: Vec<(u64, usize, u64)> =
        stored.iter().map(|(&(ws, i), &v)| (ws, i, v)).collect();
    ahead.sort_unstable();
    for (ws, i, value) in ahead {
        let last = state.workspaces.get(&ws).map_or(0, |w| w.seqs[i].last);
        let retired = mark_of(&state.retired_of(ws), i);
        if value > last && value > retired && value >= initial(i) {
            problems.push(Problem::NumberAhead {
                ws,
                sequence: SEQUENCES[i],
                stored: value,
                plog_last: last,
            });
        }
    }
}

/// Numbers the checkpoint covers but the table does not hold, for workspaces `wss` (those of
/// the block just read).
fn check_numbers_covered(
    state: &State,
    wss: &[u64],
    stored: &StoredNumbers,
    problems: &mut Problems,
) {
    for &ws in wss {
        let Some(w) = state.workspaces.get(&ws) else {
            continue;
        };
        let checkpoint = state
            .partitions
            .get(w.partition as usize)
            .map_or(1, |p| p.checkpoint);
        for (i, st) in w.seqs.iter().enumerate() {
            let have = stored.get(&(ws, i)).copied().unwrap_or(0);
            if st.covered > have {
                problems.push(Problem::NumberNotCovered {
                    ws,
                    partition: w.partition,
                    sequence: SEQUENCES[i],
                    stored: have,
                    covered: st.covered,
                    checkpoint,
                });
            }
        }
    }
}
