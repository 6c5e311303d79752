//! Operator commands over a data directory (the server must be stopped: the directory is
//! locked): `inspect` shows each partition's checkpoint against its PLog end; `verify` scans
//! every PLog and checks SPEC invariants 1–5 against the stored projection.

use std::collections::HashMap;
use std::ops::ControlFlow;

use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use monoseq_core::{Number, NumberKey, PLogOffset, ReplayedEvent, SeqId, SeqStorage, WsId};
use monoseq_kv::KvStore;
use monoseq_store::{
    CRECORD_ID_SEQUENCE, EventStore, LOG_BLOCK_EVENTS, OWRECORD_ID_SEQUENCE, PartitionId,
    WLOG_OFFSET_SEQUENCE,
};

use crate::config::{APP, Settings, check_key_layout, open_store, recorded_partitions};

/// What one partition's scan found.
#[derive(Debug, Default)]
struct Scan {
    /// The PLog offset after the last event.
    end: u64,
    events: u64,
    violations: Vec<String>,
}

/// Violations listed before the rest are only counted.
const VIOLATIONS_SHOWN_MAX: usize = 20;

fn partitions(settings: &Settings, kv: &impl KvStore) -> anyhow::Result<u32> {
    check_key_layout(kv)?;
    Ok(recorded_partitions(kv)?.unwrap_or(settings.partitions))
}

/// `monoseq inspect`.
pub fn inspect(settings: &Settings, full: bool) -> anyhow::Result<()> {
    let kv = open_store(&settings.data_dir)?;
    let n = partitions(settings, &*kv)?;
    let store = EventStore::new(kv, APP, settings.trust);
    println!("data directory: {}", settings.data_dir.display());
    println!("partitions: {n}");
    println!(
        "{:>9} {:>12} {:>12} {:>10}{}",
        "partition",
        "checkpoint",
        "plog_end",
        "tail",
        if full { "  workspaces" } else { "" }
    );
    for p in 0..n {
        let seq = store.seq_storage(PartitionId(p));
        let checkpoint = seq
            .read_next_plog_offset()
            .context("reading the checkpoint")?;
        let mut last = checkpoint.0.saturating_sub(1);
        let mut workspaces = std::collections::HashSet::new();
        let from = if full { PLogOffset::FIRST } else { checkpoint };
        seq.replay_plog(from, &mut |e: ReplayedEvent<'_>| {
            last = last.max(e.offset.0);
            if full && let Some(v) = e.values.first() {
                workspaces.insert(v.key.ws);
            }
            ControlFlow::Continue(())
        })
        .context("scanning the PLog")?;
        let end = last + 1;
        print!(
            "{p:>9} {:>12} {:>12} {:>10}",
            checkpoint.0,
            end,
            end.saturating_sub(checkpoint.0)
        );
        if full {
            print!("  {:>10}", workspaces.len());
        }
        println!();
    }
    Ok(())
}

/// `monoseq verify`: exits non-zero when an invariant is violated.
pub fn verify(settings: &Settings) -> anyhow::Result<()> {
    let kv = open_store(&settings.data_dir)?;
    let n = partitions(settings, &*kv)?;
    let store = EventStore::new(kv, APP, settings.trust);
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} partition {msg} — {pos} events ({per_sec})")
            .expect("valid template"),
    );
    let mut total_events = 0u64;
    let mut violations = Vec::new();
    for p in 0..n {
        bar.set_message(format!("{p}/{n}"));
        let scan = verify_partition(&store, PartitionId(p), &bar)?;
        total_events += scan.events;
        violations.extend(
            scan.violations
                .into_iter()
                .map(|v| format!("partition {p}: {v}")),
        );
    }
    bar.finish_and_clear();
    println!("verified {n} partitions, {total_events} events");
    if violations.is_empty() {
        println!("ok: invariants 1-5 hold");
        return Ok(());
    }
    for v in violations.iter().take(VIOLATIONS_SHOWN_MAX) {
        println!("VIOLATION {v}");
    }
    if violations.len() > VIOLATIONS_SHOWN_MAX {
        println!("... and {} more", violations.len() - VIOLATIONS_SHOWN_MAX);
    }
    bail!("{} invariant violations", violations.len())
}

/// Per (workspace, sequence): the largest number of events before the checkpoint, and of all
/// events.
#[derive(Default, Clone, Copy)]
struct KeyState {
    last: Number,
    before_checkpoint: Number,
}

fn verify_partition<S: KvStore + Clone>(
    store: &EventStore<S>,
    partition: PartitionId,
    bar: &ProgressBar,
) -> anyhow::Result<Scan> {
    let seq = store.seq_storage(partition);
    let checkpoint = seq
        .read_next_plog_offset()
        .context("reading the checkpoint")?;
    let mut scan = Scan {
        end: 1,
        ..Scan::default()
    };
    let mut keys: HashMap<NumberKey, KeyState> = HashMap::new();
    let mut event_min: HashMap<NumberKey, Number> = HashMap::new();
    seq.replay_plog(PLogOffset::FIRST, &mut |e: ReplayedEvent<'_>| {
        // Invariant 3: offsets contiguous from 1, each once.
        if e.offset.0 != scan.end {
            scan.violations.push(format!(
                "PLog offset {} follows {}: offsets must be contiguous from 1",
                e.offset,
                scan.end - 1
            ));
        }
        scan.end = e.offset.0 + 1;
        scan.events += 1;
        if scan.events.is_multiple_of(4096) {
            bar.set_position(scan.events);
        }
        event_min.clear();
        for v in e.values {
            let m = event_min.entry(v.key).or_insert(v.value);
            *m = (*m).min(v.value);
        }
        for (&key, &min) in &event_min {
            let max = e
                .values
                .iter()
                .filter(|v| v.key == key)
                .map(|v| v.value)
                .max()
                .unwrap_or(min);
            let st = keys.entry(key).or_default();
            // Invariants 1 and 2: numbers of committed events increase strictly, so no
            // number is used twice.
            if min <= st.last {
                scan.violations.push(format!(
                    "event {} uses number {min} of {key:?} after {} was used",
                    e.offset, st.last
                ));
            }
            // WLog offsets are contiguous per workspace.
            if key.seq == WLOG_OFFSET_SEQUENCE.id && min.0 != st.last.0 + 1 {
                scan.violations.push(format!(
                    "event {} has WLog offset {min} of workspace {} after {}",
                    e.offset, key.ws, st.last
                ));
            }
            st.last = st.last.max(max);
            if e.offset < checkpoint {
                st.before_checkpoint = st.before_checkpoint.max(max);
            }
        }
        ControlFlow::Continue(())
    })
    .context("scanning the PLog")?;
    // A gap at a block boundary ends the scan early: nothing may follow the end.
    let next_block = (scan.end - 1) / LOG_BLOCK_EVENTS * LOG_BLOCK_EVENTS + LOG_BLOCK_EVENTS;
    for probe in [scan.end, next_block] {
        if store
            .read_event(partition, PLogOffset(probe))
            .context("reading the PLog")?
            .is_some()
        {
            scan.violations.push(format!(
                "an event sits at PLog offset {probe}, after a gap at {}",
                scan.end
            ));
        }
    }
    // Invariant 4: the checkpoint is not ahead of the PLog, and the stored numbers cover every
    // event before it. Invariant 5 (and the durable-PLog rule): no stored number is ahead of
    // the PLog either.
    if checkpoint.0 > scan.end {
        scan.violations.push(format!(
            "checkpoint {checkpoint} is ahead of the PLog end {}",
            scan.end
        ));
    }
    let mut by_ws: HashMap<WsId, Vec<(SeqId, KeyState)>> = HashMap::new();
    for (k, st) in keys {
        by_ws.entry(k.ws).or_default().push((k.seq, st));
    }
    let mut stored = Vec::new();
    for (ws, seqs) in by_ws {
        let ids: Vec<SeqId> = seqs.iter().map(|s| s.0).collect();
        stored.clear();
        stored.resize(ids.len(), Number(0));
        seq.read_numbers(ws, &ids, &mut stored)
            .context("reading stored numbers")?;
        for ((id, st), &have) in seqs.iter().zip(&stored) {
            if have < st.before_checkpoint {
                scan.violations.push(format!(
                    "checkpoint {checkpoint} covers number {} of sequence {} of workspace {ws}, \
                     but only {have} is stored",
                    st.before_checkpoint,
                    name(*id)
                ));
            }
            if have > st.last {
                scan.violations.push(format!(
                    "sequence {} of workspace {ws} is stored as {have}, ahead of the PLog's {}",
                    name(*id),
                    st.last
                ));
            }
        }
    }
    Ok(scan)
}

fn name(seq: SeqId) -> String {
    [
        WLOG_OFFSET_SEQUENCE,
        CRECORD_ID_SEQUENCE,
        OWRECORD_ID_SEQUENCE,
    ]
    .iter()
    .find(|s| s.id == seq)
    .map_or_else(|| seq.to_string(), |s| s.name.to_owned())
}
