//! The event store with its PLogs in segment files ([`Segments`], key layout 4): a group's
//! append (the log first, made durable, then the key-value store), the redo that brings the
//! key-value store up to the logs, and the PLog's reads there.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

use monoseq_kv::{Key, KvError, KvStore, WriteBatch, WriteError};

use monoseq_core::WsId;

use crate::chunks::{Chunks, GroupIndex, RecordPlace};
use crate::codec::{ChunkedRecord, ChunkedWLog};
use crate::codec::{RecordRef, event_crc};
use crate::event::{Event, Record, RecordId};
use crate::keys::record_key;
use crate::keys::{PartitionId, Slot, applied_partition};
use crate::plog::{self, Deferred, RETIRED_PAYLOAD, SCAN_PAGE_BYTES, SCAN_PAGE_EVENTS, Segments};
use crate::store::{AppendError, EventStore, GroupBatch, ReadError, StoredRecords};

impl<S: KvStore> EventStore<S> {
    /// [`EventStore::append_onto`] on segment files: checks that the group continues the
    /// partition's log and that its conditional keys are absent, appends its events to the log
    /// and syncs it, then writes its WLog entries and records with the partition's new applied
    /// end in one batch, which needs no sync of its own (a restart writes it again from the
    /// log). A group whose batch failed after its log was synced is written again before the
    /// partition's next group, and answers [`KvError::OutcomeUnknown`]: its events are stored.
    ///
    /// With `defer` and a shared flush ([`Segments::shares_flush`]) the frames are left for
    /// the next [`Segments::flush`] to write back and sync, and the batch is kept for
    /// [`EventStore::apply_deferred`], to be written once [`EventStore::sync`] made the frames
    /// durable: the store must never hold the effect of an event its log may lose.
    pub(crate) fn append_to_segments(
        &self,
        segments: &Segments,
        partition: PartitionId,
        events: &[Event],
        stored: StoredRecords,
        defer: bool,
    ) -> Result<StoredRecords, AppendError> {
        let log = segments.log(partition)?;
        let mut applied = plog::applied(log);
        // A group deferred and never applied (its raise failed) is written again from the log
        // below, as its applied end was not moved.
        plog::deferred(log).take();
        let mut stored = stored;
        let redone = self
            .redo_held(segments, partition, &mut applied, false)
            .map_err(|e| redo_failed(partition, e))?;
        if redone > 0 {
            // The events written again may have updated records the caller read before them.
            for (ws, record) in self.read_updated_records(events)?.into_records() {
                stored.insert(ws, record);
            }
        }
        let end = plog::read_log(log).end();
        check_continues(events, end)?;
        let (mut group, current) = self.build_group(partition, events, stored, true, false)?;
        if events.is_empty() {
            return Ok(current);
        }
        group.batch.check_limits().map_err(|e| group.refusal(e))?;
        group.announce(&self.kv)?;
        self.check_absent(&group)?;
        let next = end + events.len() as u64;
        // A failed append or sync leaves frames that may or may not be in the log after a
        // restart: the log stops taking writes (poisoned), as a failed engine flush stops it.
        let fatal = |e: monoseq_seglog::SegError| KvError::poisoned(monoseq_kv::chain(&e));
        plog::write_log(log)
            .append(end, &group.payloads())
            .map_err(fatal)?;
        if defer && segments.shares_flush() {
            // Written back by the flush, with every other partition's frames.
            log.unflushed.store(true, Ordering::Release);
            *plog::deferred(log) = Some(Deferred {
                batch: group.batch,
                index: group.index,
                end,
                next,
            });
            return Ok(current);
        }
        plog::read_log(log).sync().map_err(fatal)?;
        self.write_applied(partition, &mut group.batch, &group.index, end, next)?;
        *applied = Some(next);
        Ok(current)
    }

    /// Writes the key-value batch of the group [`EventStore::append_deferred`] kept for
    /// `partition`, once [`EventStore::sync`] made its frames durable. Nothing to do when no
    /// group is kept (none was deferred, or the store is not on a shared flush).
    ///
    /// # Errors
    ///
    /// [`AppendError::Storage`] with [`KvError::OutcomeUnknown`] when the batch failed: the
    /// group's events are stored, and its batch is written again from the log before the
    /// partition's next group.
    pub fn apply_deferred(&self, partition: PartitionId) -> Result<(), AppendError> {
        let Some(segments) = &self.segments else {
            return Ok(());
        };
        let log = segments.log(partition)?;
        let mut applied = plog::applied(log);
        let Some(mut group) = plog::deferred(log).take() else {
            return Ok(());
        };
        if *applied != Some(group.end) {
            // Redone from the log meanwhile, or to be.
            return Ok(());
        }
        let next = group.next;
        self.write_applied(partition, &mut group.batch, &group.index, group.end, next)?;
        *applied = Some(next);
        Ok(())
    }

    /// Writes the batch of a group of offsets `end..next` whose frames are durable.
    fn write_applied(
        &self,
        partition: PartitionId,
        batch: &mut WriteBatch,
        index: &GroupIndex,
        end: u64,
        next: u64,
    ) -> Result<(), AppendError> {
        self.write_indexed(partition, batch, index, next)
            .map_err(|e| match e {
                // Nothing more is written to the store until it is opened again, which redoes
                // the group from the log.
                WriteError::Storage(e) if e.is_poisoned() => AppendError::Storage(e),
                WriteError::Storage(e) => outcome_unknown(partition, end, next, &e),
                e => outcome_unknown(partition, end, next, &e),
            })
    }

    /// Writes `batch` of a group of `partition` ending before `next`, with the partition's
    /// applied end `next` and what the group adds to the index in chunks (key layout 5): held
    /// after the batch is written, or, when the group closes the partition's chunk, written in
    /// it with everything held and the indexed end. A group with nothing else to write leaves
    /// the applied end out too, while the store's lags by fewer than
    /// [`APPLIED_LAG_MAX`](crate::chunks::APPLIED_LAG_MAX)
    /// events: the group is only held, and a restart redoes it from the log.
    fn write_indexed(
        &self,
        partition: PartitionId,
        batch: &mut WriteBatch,
        index: &GroupIndex,
        next: u64,
    ) -> Result<(), WriteError> {
        let Some(chunks) = &self.chunks else {
            put_applied(batch, self, partition, next);
            return self.kv.write(batch);
        };
        let closes = chunks.closes(partition, index.events)?;
        if !closes && batch.is_empty() && chunks.skips_applied(partition, index.events)? {
            chunks.hold(partition, index)?;
            return Ok(());
        }
        put_applied(batch, self, partition, next);
        if !closes {
            self.kv.write(batch)?;
            chunks.applied_recorded(partition)?;
            chunks.hold(partition, index)?;
            return Ok(());
        }
        chunks.write_chunks(&self.kv, partition, index, next, batch)?;
        if let Err(e) = self.kv.write(batch) {
            chunks.uncount(partition, index.events)?;
            return Err(e);
        }
        chunks.applied_recorded(partition)?;
        chunks.release(partition)?;
        Ok(())
    }

    /// Brings the key-value store up to every partition's log (at start, before anything is
    /// read); answers how many events' WLog entries and records it wrote again. With
    /// `accept_loss`, a store that holds more of a log than the log does (its segment files
    /// lost events) is taken as it is, from the log's end on.
    ///
    /// # Errors
    ///
    /// [`AppendError`] when the store cannot be read or written, or holds more of a log than
    /// the log does and `accept_loss` is false.
    pub fn redo(&self, accept_loss: bool) -> Result<u64, AppendError> {
        let Some(segments) = &self.segments else {
            return Ok(0);
        };
        self.read_back_held(segments)?;
        let mut redone = 0;
        for p in 0..segments.partitions() {
            let partition = PartitionId(p);
            let mut applied = plog::applied(segments.log(partition)?);
            redone += self.redo_held(segments, partition, &mut applied, accept_loss)?;
        }
        Ok(redone)
    }

    /// Brings the key-value store up to `partition`'s log: writes again the WLog entries and
    /// records of the events the log holds above the store's applied end (a group whose
    /// batch failed after its log was made durable, or that was deferred and never applied);
    /// answers how many. Nothing to do with the PLogs in the store.
    ///
    /// # Errors
    ///
    /// [`AppendError`] when the store cannot be read or written, or holds more of the log than
    /// the log does.
    pub fn redo_partition(&self, partition: PartitionId) -> Result<u64, AppendError> {
        let Some(segments) = &self.segments else {
            return Ok(0);
        };
        let log = segments.log(partition)?;
        let mut applied = plog::applied(log);
        // A deferred group is written below from the log, as its applied end was not moved.
        plog::deferred(log).take();
        self.redo_held(segments, partition, &mut applied, false)
    }

    /// Writes the WLog entries and records of the events of `partition`'s log above
    /// `applied` (read from the store when `None`), with `applied` held; answers how many.
    /// A poisoned log is refused (poisoned): nothing of it is written to the store.
    /// A store ahead of the log is an error, or with `ahead_ok` taken from the log's end on.
    fn redo_held(
        &self,
        segments: &Segments,
        partition: PartitionId,
        applied: &mut Option<u64>,
        ahead_ok: bool,
    ) -> Result<u64, AppendError> {
        let (start, end) = unpoisoned_bounds(segments, partition)?;
        let mut from = match *applied {
            Some(at) => at,
            None => {
                self.rebuild_held(segments, partition)?;
                self.read_applied(partition)?.unwrap_or(start)
            }
        };
        if from > end && ahead_ok {
            tracing::warn!(
                partition = partition.0,
                "the store holds WLog entries and records of PLog offsets {end} to {}, which \
                 the segment files lost; going on from offset {end}, as --accept-loss allows",
                from - 1
            );
            let mut batch = WriteBatch::new();
            put_applied(&mut batch, self, partition, end);
            self.kv
                .write(&batch)
                .map_err(|e| GroupBatch::default().refusal(e))?;
            // Durable before the loss is recorded, so no later start finds the store ahead.
            self.kv.sync()?;
            from = end;
        }
        if from > end {
            return Err(AppendError::Storage(KvError::Corrupted {
                message: format!(
                    "the store holds the WLog entries and records of partition {partition}'s \
                     PLog up to offset {}, but its segment files end at offset {}: they lost \
                     events",
                    from - 1,
                    end - 1
                ),
            }));
        }
        let at = self.rewrite_from_log(segments, partition, from, end)?;
        if at > from {
            tracing::info!(
                partition = partition.0,
                "brought the store up to the PLog: redid offsets {from} to {} from the log \
                 (their WLog entries and records written again, or held in memory)",
                at - 1
            );
        }
        *applied = Some(at);
        Ok(at - from)
    }

    /// Holds again, in key layout 5, the WLog entries and created records' references of
    /// `partition`'s events from its indexed end to its applied end, as they were held when
    /// the store was last closed (a record under its own key is left there); once.
    fn rebuild_held(&self, segments: &Segments, partition: PartitionId) -> Result<(), AppendError> {
        let Some(chunks) = &self.chunks else {
            return Ok(());
        };
        let _loading = chunks.loading(partition);
        if chunks.is_part_loaded(partition)? {
            return Ok(());
        }
        let (start, end) = {
            let log = plog::read_log(segments.log(partition)?);
            (log.start(), log.end())
        };
        let to = self.read_applied(partition)?.unwrap_or(start).min(end);
        let mut at = chunks
            .read_indexed(&self.kv, partition)?
            .unwrap_or(start)
            .max(start);
        let from = at;
        while at < to {
            let page = segments.read(partition, at, SCAN_PAGE_EVENTS, SCAN_PAGE_BYTES)?;
            if page.is_empty() {
                break;
            }
            let index = self.held_of_page(chunks, partition, &page, to)?;
            chunks.hold(partition, &index)?;
            at = page.end().min(to);
        }
        chunks.set_part_loaded(partition)?;
        if at > from {
            tracing::info!(
                partition = partition.0,
                "read back the WLog entries and created records of PLog offsets {from} to {} \
                 from the segment files into the index held in memory",
                at - 1
            );
        }
        Ok(())
    }

    /// The index entries of `partition`'s events in `page` below `to`, as a restart holds
    /// them again: every WLog entry, and every created record not stored under its own key.
    fn held_of_page(
        &self,
        chunks: &Chunks,
        partition: PartitionId,
        page: &monoseq_seglog::Page,
        to: u64,
    ) -> Result<GroupIndex, AppendError> {
        let mut index = GroupIndex::default();
        for (i, payload) in page.payloads().enumerate() {
            let offset = page.first() + i as u64;
            if offset >= to {
                break;
            }
            index.events += 1;
            if payload == RETIRED_PAYLOAD {
                continue;
            }
            let event = decode_logged(partition, offset, payload)?;
            let crc = event_crc(payload).unwrap_or_default();
            let wlog = ChunkedWLog {
                offset: event.wlog_offset.0,
                plog: offset,
                crc,
            };
            index.push_wlog(event.ws, wlog);
            for (n, r) in event.created.iter().enumerate() {
                let entry = ChunkedRecord {
                    id: r.id.0,
                    plog: offset,
                    index: u32::try_from(n).unwrap_or(u32::MAX),
                    crc,
                };
                // Its own key first: a record without one was held (and learning its bucket's
                // bound, a reverse read of the engine, is left to the first write needing it).
                let own = self
                    .kv
                    .get(record_key(self.app(), event.ws, r.id).as_key())?
                    .is_some()
                    && chunks.record_place(&self.kv, event.ws, partition, entry, &index, true)?
                        == RecordPlace::Own;
                if !own {
                    index.push_record(event.ws, entry);
                }
            }
        }
        Ok(index)
    }

    /// Reads back every partition's held part of the index in chunks (key layout 5) where
    /// it was not yet (a store only read, by a tool, never redone): before the first read.
    pub(crate) fn load_index(&self) -> Result<(), AppendError> {
        let (Some(segments), Some(chunks)) = (&self.segments, &self.chunks) else {
            return Ok(());
        };
        if chunks.is_loaded() {
            return Ok(());
        }
        self.read_back_held(segments)
    }

    /// Reads back every partition's held part (key layout 5), one partition after another
    /// in partition order. A workspace that moved between partitions has held runs in
    /// several; they are held where their numbers go whatever the order they are read back in
    /// (`a_workspace_moving_to_a_lower_partition_keeps_its_chunks_apart`), but where a
    /// created record with its own key goes ([`Chunks::record_place`], asked while reading
    /// back) still depends on what is held before it, so the order is kept fixed.
    fn read_back_held(&self, segments: &Segments) -> Result<(), AppendError> {
        let Some(chunks) = &self.chunks else {
            return Ok(());
        };
        for p in 0..segments.partitions() {
            self.rebuild_held(segments, PartitionId(p))?;
        }
        chunks.set_loaded();
        Ok(())
    }

    /// Writes the WLog entries and records of `partition`'s PLog offsets `from..end` into
    /// the store, a page at a time, each page with its applied end; answers the end reached.
    fn rewrite_from_log(
        &self,
        segments: &Segments,
        partition: PartitionId,
        from: u64,
        end: u64,
    ) -> Result<u64, AppendError> {
        let mut at = from;
        while at < end {
            let page = segments.read(partition, at, SCAN_PAGE_EVENTS, SCAN_PAGE_BYTES)?;
            let mut events = Vec::with_capacity(page.len());
            for (i, payload) in page.payloads().enumerate() {
                if payload != RETIRED_PAYLOAD {
                    events.push(decode_logged(partition, page.first() + i as u64, payload)?);
                }
            }
            let stored = self.read_updated_records(&events)?;
            let (mut group, _) = self.build_group(partition, &events, stored, true, true)?;
            self.write_indexed(partition, &mut group.batch, &group.index, page.end())
                .map_err(|e| group.refusal(e))?;
            at = page.end();
        }
        Ok(at)
    }

    /// The applied end the store records for `partition`, if any.
    fn read_applied(&self, partition: PartitionId) -> Result<Option<u64>, AppendError> {
        let part = applied_partition(self.app(), partition);
        let Some(bytes) = self.kv.get(Key::new(part.as_bytes(), &[]))? else {
            return Ok(None);
        };
        match crate::keys::be64(&bytes) {
            Some(at) => Ok(Some(at)),
            None => Err(AppendError::Storage(KvError::Corrupted {
                message: format!(
                    "the applied end of partition {partition} is {} bytes, not 8",
                    bytes.len()
                ),
            })),
        }
    }

    /// Refuses the group when a key it inserts only if absent is present, in the store or
    /// written by an earlier item of the group, naming the first such item.
    fn check_absent(&self, group: &GroupBatch) -> Result<(), AppendError> {
        if group.checks.is_empty() {
            return Ok(());
        }
        let mut earlier: HashMap<Key<'_>, usize> = HashMap::with_capacity(group.batch.len());
        let mut conflict = None;
        let mut asked = Vec::with_capacity(group.checks.len());
        for (index, item) in group.batch.iter().enumerate() {
            if group.checks.binary_search(&index).is_ok() {
                if earlier.contains_key(&item.key) {
                    conflict.get_or_insert(index);
                } else {
                    asked.push((index, item.key));
                }
            }
            earlier.entry(item.key).or_insert(index);
        }
        let keys: Vec<Key<'_>> = asked.iter().map(|(_, k)| *k).collect();
        // Asked in batch order: the first stored one is the earliest conflict among them.
        if let Some(found) = self.kv.first_present(&keys)? {
            let index = asked[found].0;
            if conflict.is_none_or(|c| index < c) {
                conflict = Some(index);
            }
        }
        match conflict {
            None => Ok(()),
            Some(index) => {
                let key = group
                    .batch
                    .get(index)
                    .expect("a conflict's index is one of the batch's")
                    .key
                    .to_owned();
                Err(group.refusal(WriteError::Conflict { index, key }))
            }
        }
    }

    /// The stored bytes of the event at `offset` of `partition`'s log, if any.
    pub(crate) fn logged_bytes(
        segments: &Segments,
        partition: PartitionId,
        offset: u64,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let frame = Self::logged_frame(segments, partition, offset)?;
        Ok(frame.filter(|p| p != RETIRED_PAYLOAD))
    }

    /// The payload of the frame at `offset` of `partition`'s log, if any: an event's bytes,
    /// or [`RETIRED_PAYLOAD`] at an offset an accepted loss retired.
    pub(crate) fn logged_frame(
        segments: &Segments,
        partition: PartitionId,
        offset: u64,
    ) -> Result<Option<Vec<u8>>, KvError> {
        let page = segments.read(partition, offset, 1, 1)?;
        if page.first() != offset {
            return Ok(None);
        }
        Ok(page.payloads().next().map(<[u8]>::to_vec))
    }

    /// Calls `visit` with every event of `partition`'s log from offset `from` on, in order,
    /// a page at a time, until it breaks or the log ends; retired offsets are left out (the
    /// visitor sees a gap).
    pub(crate) fn visit_logged(
        segments: &Segments,
        partition: PartitionId,
        from: u64,
        visit: &mut dyn FnMut(u64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), KvError> {
        let mut at = from;
        loop {
            let page = segments.read(partition, at, SCAN_PAGE_EVENTS, SCAN_PAGE_BYTES)?;
            if page.is_empty() {
                return Ok(());
            }
            for (i, payload) in page.payloads().enumerate() {
                if payload == RETIRED_PAYLOAD {
                    continue;
                }
                if visit(page.first() + i as u64, payload).is_break() {
                    return Ok(());
                }
            }
            at = page.end();
        }
    }
}

/// The start and end of `partition`'s PLog, or a poisoned error when a failed sync poisoned it:
/// its frames since the last good flush may not be on disk, and the store must never hold the
/// effect of an event its log may lose.
fn unpoisoned_bounds(
    segments: &Segments,
    partition: PartitionId,
) -> Result<(u64, u64), AppendError> {
    let log = plog::read_log(segments.log(partition)?);
    if let Some(what) = log.poisoned() {
        return Err(AppendError::Storage(KvError::poisoned(format!(
            "partition {partition}'s PLog is poisoned by a failed {what}: restart the server, \
             which reads the log back from its files"
        ))));
    }
    Ok((log.start(), log.end()))
}

impl<S: KvStore> EventStore<S> {
    /// Record `id` of `ws` as the event that reference `r` names created it: the event's frame
    /// read from its partition's log, checked to be the event the reference names (checksum,
    /// offset, workspace), and its created record at the reference's index, checked to be `id`.
    /// `None` when an accepted loss retired the event's offset: the record was lost with its
    /// event, as the event's WLog entry is (reads leave both out).
    ///
    /// # Errors
    ///
    /// [`ReadError::Dangling`] when the frame is missing or another event, or the event does
    /// not create the record there; [`ReadError::Corrupt`] when it does not decode;
    /// [`ReadError::Storage`] when the log cannot be read.
    pub(crate) fn resolve_record(
        &self,
        ws: WsId,
        id: RecordId,
        r: RecordRef,
    ) -> Result<Option<Record>, ReadError> {
        let slot = Slot::Record { ws, id };
        let target = Slot::PLog {
            partition: r.partition,
            offset: r.plog_offset,
        };
        let dangling = |found: &str| ReadError::Dangling {
            slot,
            target,
            found: found.to_owned(),
        };
        let Some(segments) = &self.segments else {
            return Err(dangling(
                "no event where this store reads (its PLog is not in segment files)",
            ));
        };
        let Some(bytes) = Self::logged_frame(segments, r.partition, r.plog_offset.0)? else {
            return Err(dangling("no event"));
        };
        if bytes == RETIRED_PAYLOAD {
            return Ok(None);
        }
        if event_crc(&bytes) != Some(r.event_crc) {
            return Err(dangling("another event (its checksum differs)"));
        }
        let event = Event::decode(&bytes).map_err(|source| ReadError::Corrupt {
            slot: target,
            source,
        })?;
        let index = r.index as usize;
        let mut created = event.created;
        if event.plog_offset != r.plog_offset
            || event.ws != ws
            || created.get(index).is_none_or(|c| c.id != id)
        {
            return Err(dangling(&format!(
                "an event that does not create the record as its created record {}",
                r.index
            )));
        }
        Ok(Some(created.swap_remove(index)))
    }
}

/// The error of a group whose log was synced but whose batch `e` failed.
fn outcome_unknown(
    partition: PartitionId,
    end: u64,
    next: u64,
    e: &(dyn std::error::Error + 'static),
) -> AppendError {
    AppendError::Storage(KvError::OutcomeUnknown {
        message: format!(
            "the group's events are in partition {partition}'s PLog (offsets {end} to {}), but \
             writing their WLog entries and records failed ({}); they are written again before \
             the partition's next group, or at restart",
            next - 1,
            monoseq_kv::chain(e)
        ),
    })
}

/// The error of a group that was not written because the redo before it failed. A redo
/// whose store write lost its answer (`OutcomeUnknown`) leaves the group itself certainly not
/// written: answered as a failure, so that nobody reads back a group that cannot be there.
fn redo_failed(partition: PartitionId, e: AppendError) -> AppendError {
    match e {
        AppendError::Storage(e) if e.is_outcome_unknown() => {
            AppendError::Storage(KvError::Backend {
                message: format!(
                    "bringing partition {partition}'s store up to its PLog before the group failed \
                 ({}); the group was not written: it may be sent again",
                    monoseq_kv::chain(&e)
                ),
                source: None,
            })
        }
        e => e,
    }
}

/// Refuses a group that does not take the log's offsets from `end` on, one each in order.
fn check_continues(events: &[Event], end: u64) -> Result<(), AppendError> {
    for (i, e) in events.iter().enumerate() {
        let expected = end + i as u64;
        if e.plog_offset.0 != expected {
            return Err(AppendError::NotAtEnd {
                event_index: i,
                offset: e.plog_offset.0,
                end: expected,
            });
        }
    }
    Ok(())
}

/// Adds `partition`'s applied end `next` to `batch`.
fn put_applied<S: KvStore>(
    batch: &mut WriteBatch,
    store: &EventStore<S>,
    partition: PartitionId,
    next: u64,
) {
    let part = applied_partition(store.app(), partition);
    batch.put(Key::new(part.as_bytes(), &[]), &next.to_be_bytes());
}

/// The event logged at `offset` of `partition`, checked to say it is there.
fn decode_logged(partition: PartitionId, offset: u64, bytes: &[u8]) -> Result<Event, AppendError> {
    let damaged = |what: String| {
        AppendError::Storage(KvError::Corrupted {
            message: format!("the event at offset {offset} of partition {partition}'s PLog {what}"),
        })
    };
    match Event::decode(bytes) {
        Ok(e) if e.plog_offset.0 == offset => Ok(e),
        Ok(e) => Err(damaged(format!("says it is at offset {}", e.plog_offset))),
        Err(e) => Err(damaged(format!("does not decode: {e}"))),
    }
}
