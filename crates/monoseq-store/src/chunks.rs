//! Key layout 5's index in chunks: a partition's WLog entries and created records' references
//! are held in memory ([`Chunks`]) until the partition has written [`CHUNK_EVENTS`] events, then
//! written as one key per workspace (and records bucket) and run, with the partition's indexed
//! end, in one batch. A chunk's key is the first offset or ID of its run; a workspace's runs
//! are disjoint, so the chunk that may hold an offset is the last one starting at or below it.
//!
//! What keeps runs disjoint: a workspace's WLog takes offsets above every offset it holds
//! (refused otherwise, at every trust level), and a created record's ID goes to a chunk only
//! when it is above every ID of its bucket (otherwise it is written under its own key, as in
//! layout 4). A run is the entries one partition holds between two of another partition's (a
//! workspace that moved), and a run is split at every chunk already stored inside its range
//! (what a restart, rebuilding the held part from the segment files, cannot tell apart).

use std::collections::{HashMap, HashSet};
use std::ops::{Bound, ControlFlow};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use monoseq_core::WsId;
use monoseq_kv::{Key, KeyBuf, KvError, KvStore, Order, WriteBatch};

use crate::codec::{
    ChunkedRecord, ChunkedWLog, DecodeError, decode_record_chunk, decode_wlog_chunk,
    encode_record_chunk, encode_wlog_chunk,
};
use crate::event::RecordId;
use crate::keys::{
    AppId, PartKey, PartitionId, indexed_partition, record_bucket, record_chunk_partition,
    wlog_chunk_partition,
};

/// Shards of the held entries, by workspace: a reader locks one shard, not a partition.
const SHARDS: usize = 64;
/// Workspaces a shard keeps with nothing held (their learned bounds) before it forgets them.
const IDLE_KEPT: usize = 4096;

/// Events a partition's applied end in the store may lag its log by, in groups that add
/// nothing to the store but index entries held in memory: such a group leaves its applied end
/// out of the store (no engine write at all) until this many events went unrecorded. A
/// restart redoes them from the log, which it reads from the indexed end anyway.
pub const APPLIED_LAG_MAX: usize = 1024;

/// A number an entry is ordered by: a WLog offset or a record ID.
pub(crate) trait Numbered: Copy {
    fn number(&self) -> u64;
}

impl Numbered for ChunkedWLog {
    fn number(&self) -> u64 {
        self.offset
    }
}

impl Numbered for ChunkedRecord {
    fn number(&self) -> u64 {
        self.id
    }
}

/// Entries one partition holds for a workspace, ascending, with no other partition's between.
#[derive(Debug)]
struct Run<T> {
    partition: PartitionId,
    entries: Vec<T>,
}

impl<T> Run<T> {
    /// A run of one entry.
    fn of(partition: PartitionId, entry: T) -> Run<T> {
        Run {
            partition,
            entries: vec![entry],
        }
    }
}

/// A workspace's held runs of one kind (its WLog, or one records bucket), ascending, and the
/// highest number its stored chunks hold, once learned.
#[derive(Debug)]
struct Held<T> {
    runs: Vec<Run<T>>,
    bound: Option<u64>,
}

impl<T> Default for Held<T> {
    fn default() -> Held<T> {
        Held {
            runs: Vec::new(),
            bound: None,
        }
    }
}

impl<T: Numbered> Held<T> {
    /// The highest number held.
    fn last(&self) -> Option<u64> {
        self.runs
            .iter()
            .filter_map(|r| r.entries.last())
            .map(Numbered::number)
            .max()
    }

    /// The entry held for `n`.
    fn find(&self, n: u64) -> Option<(PartitionId, T)> {
        self.runs.iter().find_map(|r| {
            let at = r.entries.binary_search_by_key(&n, Numbered::number).ok()?;
            Some((r.partition, r.entries[at]))
        })
    }

    /// Where `entry` of `partition` goes against what is held and `others`, the highest
    /// numbers known elsewhere (stored chunks, the group's own entries). A redo counts only
    /// what `partition` holds: its entry was placed when it was written, before another
    /// partition held the entries above it (a workspace that moved), and is held where its
    /// number goes.
    fn place(&self, partition: PartitionId, entry: T, others: [Option<u64>; 2], redo: bool) -> Place
    where
        T: PartialEq,
    {
        let n = entry.number();
        let last = self.last();
        // Above every number held, it is not held: no search (a writer's entry, always).
        if last.is_some_and(|l| n <= l) && self.find(n) == Some((partition, entry)) {
            return Place::Held;
        }
        let last = if redo { self.last_of(partition) } else { last };
        let high = others.into_iter().chain([last]).flatten().max();
        if high.is_none_or(|h| n > h) {
            Place::Above
        } else {
            Place::Below
        }
    }

    /// The highest number `partition` holds.
    fn last_of(&self, partition: PartitionId) -> Option<u64> {
        self.runs
            .iter()
            .filter(|r| r.partition == partition)
            .filter_map(|r| r.entries.last())
            .map(Numbered::number)
            .max()
    }

    /// Holds `entry` of `partition` where its number goes, unless it is held already. A
    /// writer's entry is above every number held; a start reads the partitions' held parts
    /// back one partition after another, so a workspace that moved has its later runs held
    /// before its earlier ones. Held below a number, an entry joins the run of its own
    /// partition next to it, or splits the run of another partition it falls inside: the runs
    /// are the same whatever order the partitions were read back in.
    fn hold(&mut self, partition: PartitionId, entry: T) {
        let n = entry.number();
        // A writer's entry: after every run, with no search.
        let above = self
            .runs
            .last()
            .and_then(|r| r.entries.last())
            .is_none_or(|e| e.number() < n);
        if !above && self.find(n).is_some() {
            return;
        }
        // The runs before `at` start below `n`.
        let at = if above {
            self.runs.len()
        } else {
            self.runs
                .partition_point(|r| r.entries.first().is_some_and(|e| e.number() < n))
        };
        if let Some(before) = at.checked_sub(1).map(|i| &mut self.runs[i]) {
            let inside = if above {
                before.entries.len()
            } else {
                before.entries.partition_point(|e| e.number() < n)
            };
            if before.partition == partition {
                before.entries.insert(inside, entry);
                return;
            }
            if inside < before.entries.len() {
                let rest = Run {
                    partition: before.partition,
                    entries: before.entries.split_off(inside),
                };
                self.runs.splice(at..at, [Run::of(partition, entry), rest]);
                return;
            }
        }
        match self.runs.get_mut(at) {
            Some(run) if run.partition == partition => run.entries.insert(0, entry),
            _ => self.runs.insert(at, Run::of(partition, entry)),
        }
    }

    /// Takes `partition`'s runs out.
    fn take(&mut self, partition: PartitionId) -> Vec<Vec<T>> {
        let (taken, kept) = std::mem::take(&mut self.runs)
            .into_iter()
            .partition(|r| r.partition == partition);
        self.runs = kept;
        taken.into_iter().map(|r: Run<T>| r.entries).collect()
    }

    /// Where the runs of partitions other than `partition` start.
    fn others(&self, partition: PartitionId) -> Vec<u64> {
        self.runs
            .iter()
            .filter(|r| r.partition != partition)
            .filter_map(|r| r.entries.first().map(Numbered::number))
            .collect()
    }

    /// `partition`'s runs, copied.
    fn copied(&self, partition: PartitionId) -> Vec<Vec<T>> {
        self.runs
            .iter()
            .filter(|r| r.partition == partition)
            .map(|r| r.entries.clone())
            .collect()
    }
}

/// Where an entry goes against what is held ([`Held::place`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Above every number held or known elsewhere.
    Above,
    /// Held already, with this very entry.
    Held,
    /// At or below a number held or known elsewhere, and not this very entry.
    Below,
}

/// A shard of [`Chunks`]' workspaces, locked.
type Shard<'a> = MutexGuard<'a, HashMap<WsId, HeldWs>>;

/// What one workspace has held.
#[derive(Debug, Default)]
struct HeldWs {
    wlog: Held<ChunkedWLog>,
    records: HashMap<u64, Held<ChunkedRecord>>,
}

impl HeldWs {
    fn is_idle(&self) -> bool {
        self.wlog.runs.is_empty() && self.records.values().all(|h| h.runs.is_empty())
    }
}

/// What a partition holds: how many events, and whose entries.
#[derive(Debug, Default)]
struct PartHeld {
    events: usize,
    /// Events written since the store last recorded the applied end (under
    /// [`APPLIED_LAG_MAX`]).
    unrecorded: usize,
    workspaces: HashSet<WsId>,
    /// Its held part was read back from the segment files.
    loaded: bool,
}

/// The entries a group of events adds to the index, in the group's order, with the highest
/// WLog offset of each workspace and record ID of each bucket among them.
#[derive(Debug, Default, Clone)]
pub(crate) struct GroupIndex {
    pub(crate) wlog: Vec<(WsId, ChunkedWLog)>,
    pub(crate) records: Vec<(WsId, ChunkedRecord)>,
    pub(crate) events: usize,
    wlog_last: HashMap<WsId, u64>,
    records_last: HashMap<(WsId, u64), u64>,
}

impl GroupIndex {
    /// Adds `ws`'s WLog entry `e`.
    pub(crate) fn push_wlog(&mut self, ws: WsId, e: ChunkedWLog) {
        let last = self.wlog_last.entry(ws).or_default();
        *last = (*last).max(e.offset);
        self.wlog.push((ws, e));
    }

    /// Adds `ws`'s created record reference `r`.
    pub(crate) fn push_record(&mut self, ws: WsId, r: ChunkedRecord) {
        let bucket = record_bucket(RecordId(r.id));
        let last = self.records_last.entry((ws, bucket)).or_default();
        *last = (*last).max(r.id);
        self.records.push((ws, r));
    }

    /// The highest WLog offset of `ws` this group adds.
    fn wlog_last(&self, ws: WsId) -> Option<u64> {
        self.wlog_last.get(&ws).copied()
    }

    /// The reference to record `id` of `ws` this group adds.
    pub(crate) fn record(&self, ws: WsId, id: u64) -> Option<ChunkedRecord> {
        self.records
            .iter()
            .find(|(w, r)| *w == ws && r.id == id)
            .map(|&(_, r)| r)
    }

    /// The highest record ID of `ws` in `bucket` this group adds.
    fn record_last(&self, ws: WsId, bucket: u64) -> Option<u64> {
        self.records_last.get(&(ws, bucket)).copied()
    }
}

/// Where a created record goes in key layout 5.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordPlace {
    /// Into the index (above every ID of its bucket).
    Chunk,
    /// Under its own key, as in layout 4 (at or below an ID its bucket holds).
    Own,
    /// Held already, with this very reference: the group is written again (a redo).
    Held,
}

/// The index of a store in key layout 5: what every partition holds, by workspace.
#[derive(Debug)]
pub(crate) struct Chunks {
    app: AppId,
    events: usize,
    shards: Box<[Mutex<HashMap<WsId, HeldWs>>]>,
    parts: Box<[Mutex<PartHeld>]>,
    /// Every partition's held part read back from its segment files (after a start).
    loaded: AtomicBool,
    /// Held through reading a partition's held part back, so that it is read once.
    loading: Box<[Mutex<()>]>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Chunks {
    /// The index of `app` over `partitions` partitions, each writing its chunks every `events`
    /// events.
    pub(crate) fn new(app: AppId, partitions: u32, events: usize) -> Chunks {
        Chunks {
            app,
            events: events.max(1),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            parts: (0..partitions).map(|_| Mutex::default()).collect(),
            loaded: AtomicBool::new(false),
            loading: (0..partitions).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, ws: WsId) -> Shard<'_> {
        let at = (ws.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % SHARDS;
        lock(&self.shards[at])
    }

    fn part(&self, partition: PartitionId) -> Result<MutexGuard<'_, PartHeld>, KvError> {
        self.parts
            .get(partition.0 as usize)
            .map(lock)
            .ok_or_else(|| KvError::Backend {
                message: format!(
                    "partition {partition} has no index: the store has {} partitions",
                    self.parts.len()
                ),
                source: None,
            })
    }

    /// Whether `ws`'s WLog may take `offset`: `Ok(true)` above every offset it holds, stored
    /// or held (and above `group_last`, the group's own); `Ok(false)` when exactly `entry` of
    /// `partition` is held (a group written again); an error names a conflict otherwise. A
    /// `redo` of an event from `partition`'s log counts only the offsets `partition` holds and
    /// the group's: the log is what was written (the stored chunks above it, another
    /// partition's, were written after it).
    pub(crate) fn wlog_takes(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        partition: PartitionId,
        entry: ChunkedWLog,
        group: &GroupIndex,
        redo: bool,
    ) -> Result<Result<bool, ()>, KvError> {
        let (mut shard, bound) = self.wlog_bound(kv, ws)?;
        let held = &shard.entry(ws).or_default().wlog;
        let bound = bound.filter(|_| !redo);
        let place = held.place(partition, entry, [bound, group.wlog_last(ws)], redo);
        Ok(match place {
            Place::Above => Ok(true),
            Place::Held => Ok(false),
            Place::Below => Err(()),
        })
    }

    /// Where record `entry` of `ws` goes (see [`RecordPlace`]); a `redo` of an event from
    /// `partition`'s log counts only the IDs `partition` holds among those held.
    pub(crate) fn record_place(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        partition: PartitionId,
        entry: ChunkedRecord,
        group: &GroupIndex,
        redo: bool,
    ) -> Result<RecordPlace, KvError> {
        let bucket = record_bucket(RecordId(entry.id));
        let (mut shard, bound) = self.record_bound(kv, ws, bucket)?;
        let held = shard
            .entry(ws)
            .or_default()
            .records
            .entry(bucket)
            .or_default();
        let place = held.place(
            partition,
            entry,
            [bound, group.record_last(ws, bucket)],
            redo,
        );
        Ok(match place {
            Place::Above => RecordPlace::Chunk,
            Place::Held => RecordPlace::Held,
            Place::Below => RecordPlace::Own,
        })
    }

    /// The highest WLog offset of `ws` in stored chunks, learned once, with `ws`'s shard held.
    fn wlog_bound(&self, kv: &impl KvStore, ws: WsId) -> Result<(Shard<'_>, Option<u64>), KvError> {
        self.learned_bound(
            ws,
            |held| &mut held.wlog.bound,
            || {
                let part = wlog_chunk_partition(self.app, ws);
                stored_last(kv, &part, ("WLog chunk", ws), decode_wlog_chunk)
            },
        )
    }

    /// The highest ID of `ws`'s `bucket` in stored chunks, learned once, with `ws`'s shard held.
    fn record_bound(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        bucket: u64,
    ) -> Result<(Shard<'_>, Option<u64>), KvError> {
        self.learned_bound(
            ws,
            |held| &mut held.records.entry(bucket).or_default().bound,
            || {
                let part = record_chunk_partition(self.app, ws, bucket);
                stored_last(kv, &part, ("records chunk", ws), decode_record_chunk)
            },
        )
    }

    /// The bound `slot` of `ws` keeps: read with `read_last` (the last number its stored
    /// chunks hold) the first time, kept from then on (0 for none); `None` while no chunk is
    /// stored. With `ws`'s shard held, locked once when the bound is known.
    fn learned_bound(
        &self,
        ws: WsId,
        slot: impl Fn(&mut HeldWs) -> &mut Option<u64>,
        read_last: impl FnOnce() -> Result<Option<u64>, KvError>,
    ) -> Result<(Shard<'_>, Option<u64>), KvError> {
        let mut shard = self.shard(ws);
        if let Some(b) = *slot(shard.entry(ws).or_default()) {
            return Ok((shard, Some(b).filter(|&b| b > 0)));
        }
        drop(shard);
        let last = read_last()?;
        let mut shard = self.shard(ws);
        let bound = slot(shard.entry(ws).or_default());
        *bound = (*bound).max(last).or(Some(0));
        let bound = bound.filter(|&b| b > 0);
        Ok((shard, bound))
    }

    /// Whether every partition's held part was read back from its segment files.
    pub(crate) fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Records that every partition's held part was read back.
    pub(crate) fn set_loaded(&self) {
        self.loaded.store(true, Ordering::Release);
    }

    /// Held while `partition`'s held part is read back (taken after a partition's applied end
    /// by a writer, never before it).
    pub(crate) fn loading(&self, partition: PartitionId) -> Option<MutexGuard<'_, ()>> {
        self.loading.get(partition.0 as usize).map(lock)
    }

    /// Whether `partition`'s held part was read back from its segment files.
    pub(crate) fn is_part_loaded(&self, partition: PartitionId) -> Result<bool, KvError> {
        Ok(self.part(partition)?.loaded)
    }

    /// Records that `partition`'s held part was read back.
    pub(crate) fn set_part_loaded(&self, partition: PartitionId) -> Result<(), KvError> {
        self.part(partition)?.loaded = true;
        Ok(())
    }

    /// Whether a group of `events` events closes `partition`'s chunk.
    pub(crate) fn closes(&self, partition: PartitionId, events: usize) -> Result<bool, KvError> {
        Ok(self.part(partition)?.events + events >= self.events)
    }

    /// Whether a group of `events` events of `partition` that writes nothing to the store but
    /// its applied end leaves that out too: while the store's applied end lags the log by
    /// fewer than [`APPLIED_LAG_MAX`] events with it. Counted as unrecorded if so.
    pub(crate) fn skips_applied(
        &self,
        partition: PartitionId,
        events: usize,
    ) -> Result<bool, KvError> {
        let mut part = self.part(partition)?;
        let skips = part.unrecorded + events < APPLIED_LAG_MAX;
        if skips {
            part.unrecorded += events;
        }
        Ok(skips)
    }

    /// The store recorded `partition`'s applied end, at the log's applied end.
    pub(crate) fn applied_recorded(&self, partition: PartitionId) -> Result<(), KvError> {
        self.part(partition)?.unrecorded = 0;
        Ok(())
    }

    /// Holds `group`'s entries, written by `partition` (entries held already stay as they are).
    pub(crate) fn hold(&self, partition: PartitionId, group: &GroupIndex) -> Result<(), KvError> {
        let mut part = self.part(partition)?;
        part.events += group.events;
        for &(ws, e) in &group.wlog {
            part.workspaces.insert(ws);
            self.shard(ws)
                .entry(ws)
                .or_default()
                .wlog
                .hold(partition, e);
        }
        for &(ws, r) in &group.records {
            part.workspaces.insert(ws);
            let bucket = record_bucket(RecordId(r.id));
            let mut shard = self.shard(ws);
            let held = shard
                .entry(ws)
                .or_default()
                .records
                .entry(bucket)
                .or_default();
            held.hold(partition, r);
        }
        Ok(())
    }

    /// Adds to `batch` the chunks of everything `partition` holds with `group` (held first),
    /// and its indexed end `next`; [`Chunks::release`] follows once the batch is written.
    pub(crate) fn write_chunks(
        &self,
        kv: &impl KvStore,
        partition: PartitionId,
        group: &GroupIndex,
        next: u64,
        batch: &mut WriteBatch,
    ) -> Result<(), KvError> {
        self.hold(partition, group)?;
        let workspaces: Vec<WsId> = self.part(partition)?.workspaces.iter().copied().collect();
        let mut value = Vec::new();
        for ws in workspaces {
            let (wlog, records) = {
                let shard = self.shard(ws);
                let Some(held) = shard.get(&ws) else { continue };
                let records: Vec<_> = held
                    .records
                    .iter()
                    .map(|(&b, h)| (b, h.copied(partition), h.others(partition), h.bound))
                    .collect();
                let wlog = (
                    held.wlog.copied(partition),
                    held.wlog.others(partition),
                    held.wlog.bound,
                );
                (wlog, records)
            };
            let part = wlog_chunk_partition(self.app, ws);
            for run in split_runs(kv, &part, wlog.0, &wlog.1, wlog.2)? {
                value.clear();
                encode_wlog_chunk(&mut value, partition, &run);
                batch.put(
                    Key::new(part.as_bytes(), &run[0].offset.to_be_bytes()),
                    &value,
                );
            }
            for (bucket, runs, others, bound) in records {
                let part = record_chunk_partition(self.app, ws, bucket);
                for run in split_runs(kv, &part, runs, &others, bound)? {
                    value.clear();
                    encode_record_chunk(&mut value, partition, &run);
                    batch.put(Key::new(part.as_bytes(), &run[0].id.to_be_bytes()), &value);
                }
            }
        }
        let part = indexed_partition(self.app, partition);
        batch.put(Key::new(part.as_bytes(), &[]), &next.to_be_bytes());
        Ok(())
    }

    /// Takes back the count of `events` events of a group [`Chunks::write_chunks`] held but
    /// whose write failed: its entries stay held (a redo holds them once), its events are
    /// counted again when it is written again.
    pub(crate) fn uncount(&self, partition: PartitionId, events: usize) -> Result<(), KvError> {
        let mut part = self.part(partition)?;
        part.events = part.events.saturating_sub(events);
        Ok(())
    }

    /// Forgets what `partition` held, now in stored chunks, raising the workspaces' bounds.
    pub(crate) fn release(&self, partition: PartitionId) -> Result<(), KvError> {
        let mut part = self.part(partition)?;
        part.events = 0;
        for ws in std::mem::take(&mut part.workspaces) {
            let mut shard = self.shard(ws);
            let Some(held) = shard.get_mut(&ws) else {
                continue;
            };
            raise(&mut held.wlog, partition);
            for h in held.records.values_mut() {
                raise(h, partition);
            }
            if held.is_idle() && shard.len() > IDLE_KEPT {
                shard.remove(&ws);
            }
        }
        Ok(())
    }

    /// The WLog entries of `ws` held at `from` and above, ascending.
    pub(crate) fn held_wlog(&self, ws: WsId, from: u64) -> Vec<(PartitionId, ChunkedWLog)> {
        let shard = self.shard(ws);
        let Some(held) = shard.get(&ws) else {
            return Vec::new();
        };
        let mut out: Vec<_> = held
            .wlog
            .runs
            .iter()
            .flat_map(|r| r.entries.iter().map(move |e| (r.partition, *e)))
            .filter(|(_, e)| e.offset >= from)
            .collect();
        out.sort_unstable_by_key(|(_, e)| e.offset);
        out
    }

    /// The reference to record `id` of `ws` held.
    pub(crate) fn held_record(
        &self,
        ws: WsId,
        id: RecordId,
    ) -> Option<(PartitionId, ChunkedRecord)> {
        let shard = self.shard(ws);
        shard.get(&ws)?.records.get(&record_bucket(id))?.find(id.0)
    }

    /// The WLog chunk of `ws` that may hold `offset` (the last starting at or below it):
    /// its first offset, partition and entries.
    pub(crate) fn wlog_chunk_at(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        offset: u64,
    ) -> Result<Option<(u64, PartitionId, Vec<ChunkedWLog>)>, ChunkError> {
        let part = wlog_chunk_partition(self.app, ws);
        let Some((first, value)) = last_chunk(kv, &part, offset)? else {
            return Ok(None);
        };
        let (partition, entries) =
            decode_wlog_chunk(&value).map_err(|source| ChunkError::Damaged {
                what: "WLog chunk",
                ws,
                first,
                source,
            })?;
        Ok(Some((first, partition, entries)))
    }

    /// The WLog chunks of `ws` starting above `after`, ascending, until `visit` breaks.
    pub(crate) fn wlog_chunks_after(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        after: u64,
        visit: &mut dyn FnMut(u64, PartitionId, Vec<ChunkedWLog>) -> ControlFlow<()>,
    ) -> Result<(), ChunkError> {
        let part = wlog_chunk_partition(self.app, ws);
        let from = after.to_be_bytes();
        let mut failure = None;
        kv.scan(
            part.as_bytes(),
            Bound::Excluded(&from),
            Bound::Unbounded,
            Order::Ascending,
            &mut |clustering, value| {
                let first = crate::keys::be64(clustering).unwrap_or(0);
                match decode_wlog_chunk(value) {
                    Ok((partition, entries)) => visit(first, partition, entries),
                    Err(source) => {
                        failure = Some(ChunkError::Damaged {
                            what: "WLog chunk",
                            ws,
                            first,
                            source,
                        });
                        ControlFlow::Break(())
                    }
                }
            },
        )?;
        failure.map_or(Ok(()), Err)
    }

    /// The reference to record `id` of `ws` in a stored chunk.
    pub(crate) fn stored_record(
        &self,
        kv: &impl KvStore,
        ws: WsId,
        id: RecordId,
    ) -> Result<Option<(PartitionId, ChunkedRecord)>, ChunkError> {
        let part = record_chunk_partition(self.app, ws, record_bucket(id));
        let Some((first, value)) = last_chunk(kv, &part, id.0)? else {
            return Ok(None);
        };
        let (partition, entries) =
            decode_record_chunk(&value).map_err(|source| ChunkError::Damaged {
                what: "records chunk",
                ws,
                first,
                source,
            })?;
        let starts = entries.first().map(|r| r.id);
        let last = entries.last().map_or(first, |r| r.id);
        if starts != Some(first) || record_bucket(RecordId(last)) != record_bucket(id) {
            return Err(ChunkError::Misplaced {
                ws,
                first,
                found: starts.unwrap_or(first),
            });
        }
        Ok(entries
            .binary_search_by_key(&id.0, |r| r.id)
            .ok()
            .map(|at| (partition, entries[at])))
    }

    /// The key a WLog chunk of `ws` starting at `offset` would have (names a conflict).
    pub(crate) fn wlog_chunk_key(&self, ws: WsId, offset: u64) -> KeyBuf {
        let part = wlog_chunk_partition(self.app, ws);
        Key::new(part.as_bytes(), &offset.to_be_bytes()).to_owned()
    }

    /// The indexed end `kv` records for `partition`, if any.
    pub(crate) fn read_indexed(
        &self,
        kv: &impl KvStore,
        partition: PartitionId,
    ) -> Result<Option<u64>, KvError> {
        let part = indexed_partition(self.app, partition);
        let Some(bytes) = kv.get(Key::new(part.as_bytes(), &[]))? else {
            return Ok(None);
        };
        crate::keys::be64(&bytes)
            .map(Some)
            .ok_or_else(|| KvError::Corrupted {
                message: format!(
                    "the indexed end of partition {partition} is {} bytes, not 8",
                    bytes.len()
                ),
            })
    }
}

/// Raises `held`'s learned bound over `partition`'s runs, and forgets them.
fn raise<T: Numbered>(held: &mut Held<T>, partition: PartitionId) {
    let top = held
        .take(partition)
        .iter()
        .filter_map(|r| r.last())
        .map(Numbered::number)
        .max();
    if let Some(b) = held.bound.as_mut() {
        *b = (*b).max(top.unwrap_or(0));
    }
}

/// `runs` split where a chunk stored in `part`, or another partition's run (`others`, their
/// first numbers), starts inside one (see the module's note). A run above `bound`, the
/// highest number stored chunks hold when learned, has none inside it: no read.
fn split_runs<T: Numbered>(
    kv: &impl KvStore,
    part: &PartKey,
    runs: Vec<Vec<T>>,
    others: &[u64],
    bound: Option<u64>,
) -> Result<Vec<Vec<T>>, KvError> {
    let mut out = Vec::with_capacity(runs.len());
    for run in runs {
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            continue;
        };
        let mut starts = Vec::new();
        let (from, to) = (first.number().to_be_bytes(), last.number().to_be_bytes());
        if bound.is_none_or(|b| first.number() <= b) {
            kv.scan(
                part.as_bytes(),
                Bound::Excluded(&from),
                Bound::Included(&to),
                Order::Ascending,
                &mut |clustering, _| {
                    starts.extend(crate::keys::be64(clustering));
                    ControlFlow::Continue(())
                },
            )?;
        }
        starts.extend(
            others
                .iter()
                .filter(|&&o| o > first.number() && o <= last.number()),
        );
        starts.sort_unstable();
        let mut piece = Vec::new();
        let mut next = starts.into_iter().peekable();
        for e in run {
            if next.peek().is_some_and(|&s| e.number() >= s) {
                while next.peek().is_some_and(|&s| e.number() >= s) {
                    next.next();
                }
                if !piece.is_empty() {
                    out.push(std::mem::take(&mut piece));
                }
            }
            piece.push(e);
        }
        if !piece.is_empty() {
            out.push(piece);
        }
    }
    Ok(out)
}

/// A chunk's decoder: the partition that wrote it and its entries.
type DecodeChunk<T> = fn(&[u8]) -> Result<(PartitionId, Vec<T>), DecodeError>;

/// The last number held by the last stored chunk of `part` (a `what` of `ws`, decoded with
/// `decode`), if one is stored.
fn stored_last<T: Numbered>(
    kv: &impl KvStore,
    part: &PartKey,
    (what, ws): (&str, WsId),
    decode: DecodeChunk<T>,
) -> Result<Option<u64>, KvError> {
    last_chunk(kv, part, u64::MAX)?
        .map(|(first, value)| {
            decode(&value)
                .map(|(_, e)| e.last().map_or(first, Numbered::number))
                .map_err(|e| damaged_chunk(what, ws, first, &e))
        })
        .transpose()
}

/// The last chunk of `part` starting at or below `at`: its first number and value.
fn last_chunk(
    kv: &impl KvStore,
    part: &PartKey,
    at: u64,
) -> Result<Option<(u64, Vec<u8>)>, KvError> {
    let to = at.to_be_bytes();
    let mut found = None;
    kv.scan(
        part.as_bytes(),
        Bound::Unbounded,
        Bound::Included(&to),
        Order::Descending,
        &mut |clustering, value| {
            found = Some((crate::keys::be64(clustering).unwrap_or(0), value.to_vec()));
            ControlFlow::Break(())
        },
    )?;
    Ok(found)
}

fn damaged_chunk(what: &str, ws: WsId, first: u64, e: &DecodeError) -> KvError {
    KvError::Corrupted {
        message: format!("the {what} of workspace {ws} starting at {first} is damaged: {e}"),
    }
}

/// Why a chunk could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ChunkError {
    /// A stored chunk does not decode.
    #[error("the {what} of workspace {ws} starting at {first} is damaged")]
    Damaged {
        what: &'static str,
        ws: WsId,
        first: u64,
        #[source]
        source: DecodeError,
    },
    /// A records chunk does not hold the run its key names (it starts elsewhere, or reaches
    /// past its bucket).
    #[error(
        "the records chunk of workspace {ws} under ID {first} holds the run from ID {found} \
         (or past its bucket): the chunk is misplaced; restore the store from a backup"
    )]
    Misplaced { ws: WsId, first: u64, found: u64 },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] KvError),
}

/// A chunk's read error as a storage error (damage stays damage).
pub(crate) fn chunk_storage(e: ChunkError) -> KvError {
    match e {
        ChunkError::Storage(e) => e,
        e => KvError::Corrupted {
            message: monoseq_kv::chain(&e),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wlog(offset: u64, plog: u64) -> ChunkedWLog {
        ChunkedWLog {
            offset,
            plog,
            crc: (offset as u32).wrapping_mul(2_654_435_761),
        }
    }

    fn record(id: u64, plog: u64, index: u32) -> ChunkedRecord {
        ChunkedRecord {
            id,
            plog,
            index,
            crc: (plog as u32).wrapping_mul(2_246_822_519),
        }
    }

    #[test]
    fn chunks_decode_as_encoded_with_gaps_and_records_sharing_an_event() {
        let entries = [
            wlog(1, 7),
            wlog(2, 9),
            wlog(40, 10),
            wlog(u64::MAX, u64::MAX),
        ];
        let mut bytes = Vec::new();
        encode_wlog_chunk(&mut bytes, PartitionId(3), &entries);
        assert_eq!(
            decode_wlog_chunk(&bytes).expect("decodes"),
            (PartitionId(3), entries.to_vec())
        );
        let records = [
            record(322_685_000_131_073, 5, 0),
            record(322_685_000_131_074, 5, 1),
            record(322_685_000_131_080, 6, 0),
        ];
        let mut bytes = Vec::new();
        encode_record_chunk(&mut bytes, PartitionId(0), &records);
        // Three IDs, steps and indexes, and two checksums: the second record shares its event.
        assert_eq!(
            bytes.len(),
            1 + 1 + 1 + (7 + 1 + 1) + (1 + 1 + 1) + (1 + 1 + 1) + 2 * 4
        );
        assert_eq!(
            decode_record_chunk(&bytes).expect("decodes"),
            (PartitionId(0), records.to_vec())
        );
    }

    #[test]
    fn a_damaged_chunk_is_an_error_not_a_panic_nor_an_allocation() {
        let mut wlog_bytes = Vec::new();
        encode_wlog_chunk(&mut wlog_bytes, PartitionId(1), &[wlog(5, 5), wlog(6, 8)]);
        let mut record_bytes = Vec::new();
        encode_record_chunk(
            &mut record_bytes,
            PartitionId(1),
            &[record(9, 5, 0), record(10, 5, 1)],
        );
        for cut in 0..wlog_bytes.len() {
            assert!(
                decode_wlog_chunk(&wlog_bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        for cut in 0..record_bytes.len() {
            assert!(
                decode_record_chunk(&record_bytes[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        // A count no bytes could hold, a step of 0, a trailing byte, another version.
        let huge_count = [7u8, 1, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert!(matches!(
            decode_wlog_chunk(&huge_count),
            Err(DecodeError::OutOfRange { .. })
        ));
        let zero_step = [7u8, 1, 1, 0, 1, 0, 0, 0, 0];
        assert!(matches!(
            decode_wlog_chunk(&zero_step),
            Err(DecodeError::OutOfRange { .. })
        ));
        let mut trailing = wlog_bytes.clone();
        trailing.push(0);
        assert!(matches!(
            decode_wlog_chunk(&trailing),
            Err(DecodeError::TrailingBytes { .. })
        ));
        assert!(matches!(
            decode_wlog_chunk(&record_bytes),
            Err(DecodeError::UnsupportedVersion(8))
        ));
        let mut no_event = Vec::new();
        encode_record_chunk(&mut no_event, PartitionId(1), &[record(9, 5, 0)]);
        no_event[4] = 0; // the first record's PLog offset: 0 names no event
        assert!(decode_record_chunk(&no_event).is_err());
    }

    #[test]
    fn held_entries_form_a_run_per_partition_stretch_and_are_held_once() {
        let mut held = Held::<ChunkedWLog>::default();
        held.hold(PartitionId(0), wlog(1, 1));
        held.hold(PartitionId(0), wlog(2, 2));
        held.hold(PartitionId(1), wlog(3, 1));
        held.hold(PartitionId(0), wlog(4, 3));
        held.hold(PartitionId(0), wlog(2, 2));
        assert_eq!(held.last(), Some(4));
        assert_eq!(held.find(3), Some((PartitionId(1), wlog(3, 1))));
        let numbers = |runs: Vec<Vec<ChunkedWLog>>| -> Vec<Vec<u64>> {
            runs.iter()
                .map(|r| r.iter().map(|e| e.offset).collect())
                .collect()
        };
        assert_eq!(numbers(held.copied(PartitionId(0))), [vec![1, 2], vec![4]]);
        assert_eq!(held.others(PartitionId(0)), [3]);
        held.bound = Some(0);
        raise(&mut held, PartitionId(0));
        assert_eq!(held.bound, Some(4), "the bound rises over what was written");
        assert_eq!(numbers(held.copied(PartitionId(1))), [vec![3]]);
        assert!(held.copied(PartitionId(0)).is_empty());
    }

    /// Each run's partition and numbers, in order.
    fn shape(held: &Held<ChunkedWLog>) -> Vec<(u32, Vec<u64>)> {
        held.runs
            .iter()
            .map(|r| (r.partition.0, r.entries.iter().map(|e| e.offset).collect()))
            .collect()
    }

    proptest::proptest! {
        /// A workspace's entries spread over partitions (`owners[i]` wrote offset `i + 1`) and
        /// held in any order that keeps each partition's own ascending (as a start reads each
        /// partition's log back, one partition after another or interleaved by `picks`) form
        /// the runs they form held in ascending order, as the writers held them.
        #[test]
        fn held_runs_do_not_depend_on_the_order_partitions_are_read_back_in(
            owners in proptest::collection::vec(0u32..3, 1..40),
            picks in proptest::collection::vec(0usize..3, 0..120),
        ) {
            let entries: Vec<(PartitionId, ChunkedWLog)> = (1u64..)
                .zip(&owners)
                .map(|(n, &p)| (PartitionId(p), wlog(n, n)))
                .collect();
            let mut written = Held::default();
            for &(p, e) in &entries {
                written.hold(p, e);
            }
            let mut queues: Vec<std::collections::VecDeque<_>> = (0..3)
                .map(|p| entries.iter().filter(|(q, _)| q.0 == p).copied().collect())
                .collect();
            let mut read_back = Held::default();
            for pick in picks {
                if let Some((p, e)) = queues[pick].pop_front() {
                    read_back.hold(p, e);
                }
            }
            for queue in queues.iter_mut().rev() {
                for (p, e) in queue.drain(..) {
                    read_back.hold(p, e);
                }
            }
            // Held twice: nothing changes.
            for &(p, e) in &entries {
                read_back.hold(p, e);
            }
            proptest::prop_assert_eq!(shape(&read_back), shape(&written));
        }
    }
}
