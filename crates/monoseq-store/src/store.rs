//! The event store: writes events to the PLog, the WLog and the records table in one atomic
//! batch per group of events, with the write modes of the trust level, and reads them back.
//! Owns the trust-level rules and the merging of record updates.

use std::collections::{HashMap, HashSet};
use std::ops::{Bound, ControlFlow};
use std::sync::Arc;

use monoseq_core::{PLogOffset, WsId};
use monoseq_kv::{KeyBuf, KvError, KvStore, Op, Order, Oversized, WriteBatch, WriteError};

use crate::chunks::{ChunkError, Chunks, GroupIndex, RecordPlace, chunk_storage};
use crate::codec::{
    ChunkedRecord, ChunkedWLog, DecodeError, EncodeError, EventHead, EventPeek, RecordRef,
    RecordValue, WLogEntry, WLogRef, decode_event_if, decode_idempotency, decode_record_value,
    encode_record_value, event_crc, merged_record_value_len, record_value_len,
};
use crate::event::{Event, Field, Idempotency, Record, RecordId, WLogOffset};
use crate::keys::{
    self, AppId, LOG_BLOCK_EVENTS, PartKey, PartitionId, RECORD_BLOCK_IDS, Slot,
    announces_next_block, block_position, plog_key, record_key, wlog_key, wlog_partition,
};
use crate::plog::{RETIRED_PAYLOAD, Segments};
use crate::seqstore::PLogSeqStorage;

/// How events and records are written (the reference design's `SequencesTrustLevel`,
/// docs/invariants.md). The lower the level, the less the store trusts the sequencer: conditional
/// inserts detect a number handed out twice ("sequence violation") instead of overwriting what is
/// there.
///
/// | Level | Events (PLog, WLog) | New records | Updated records |
/// |-------|---------------------|-------------|-----------------|
/// | 0     | insert-if-absent    | insert-if-absent | put |
/// | 1     | insert-if-absent    | put         | put |
/// | 2     | put                 | put         | put |
///
/// At level 0 the conditional inserts of a group of events are one all-or-nothing batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TrustLevel {
    /// Level 0: events and new records are inserted only where their keys are absent.
    #[default]
    Level0,
    /// Level 1: events are inserted only where absent; records are put.
    Level1,
    /// Level 2: everything is put; the sequencer is trusted fully.
    Level2,
}

impl TrustLevel {
    fn event_op(self) -> Op {
        match self {
            TrustLevel::Level0 | TrustLevel::Level1 => Op::InsertIfAbsent,
            TrustLevel::Level2 => Op::Put,
        }
    }

    fn new_record_op(self) -> Op {
        match self {
            TrustLevel::Level0 => Op::InsertIfAbsent,
            TrustLevel::Level1 | TrustLevel::Level2 => Op::Put,
        }
    }
}

impl TryFrom<u8> for TrustLevel {
    type Error = InvalidTrustLevel;

    fn try_from(level: u8) -> Result<TrustLevel, InvalidTrustLevel> {
        match level {
            0 => Ok(TrustLevel::Level0),
            1 => Ok(TrustLevel::Level1),
            2 => Ok(TrustLevel::Level2),
            _ => Err(InvalidTrustLevel(level)),
        }
    }
}

/// A trust level other than 0, 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("trust level {0} does not exist; use 0, 1 or 2")]
pub struct InvalidTrustLevel(pub u8);

/// Why a group of events was not written. Whatever the variant, nothing of the group was
/// written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AppendError {
    /// A conditional insert found its key present: a number was handed out twice.
    #[error(
        "sequence violation: {slot} already exists (event {event_index} of the group, key {key}); \
         nothing was written. Actualize the sequencer and retry the command"
    )]
    SequenceViolation {
        /// Position of the offending event in the group.
        event_index: usize,
        /// What the key stands for.
        slot: Slot,
        /// The conflicting key.
        key: KeyBuf,
    },
    /// An event names PLog or WLog offset 0; offsets start at 1.
    #[error(
        "event {event_index} of the group has {what} 0; offsets start at 1: take them from the \
         sequencer"
    )]
    ZeroOffset {
        /// Position of the event in the group.
        event_index: usize,
        /// Which offset.
        what: &'static str,
    },
    /// The group does not continue the partition's PLog where it ends (the PLog in segment
    /// files takes each offset once, in order); nothing was written.
    #[error(
        "event {event_index} of the group is at PLog offset {offset}, but the partition's PLog \
         takes offset {end} next; nothing was written. Actualize the sequencer and retry the \
         command"
    )]
    NotAtEnd {
        /// Position of the event in the group.
        event_index: usize,
        /// Its PLog offset.
        offset: u64,
        /// The offset the PLog takes next.
        end: u64,
    },
    /// An event could not be encoded.
    #[error("event {event_index} of the group cannot be encoded")]
    Encode {
        /// Position of the event in the group.
        event_index: usize,
        /// Why.
        #[source]
        source: EncodeError,
    },
    /// An event updates a record that does not exist.
    #[error(
        "event {event_index} of the group updates record {id} of workspace {ws}, which does not \
         exist; create the record first"
    )]
    UnknownRecord {
        /// Position of the event in the group.
        event_index: usize,
        /// The workspace.
        ws: WsId,
        /// The record.
        id: RecordId,
    },
    /// An event or record is over a size limit of the storage.
    #[error(
        "event {event_index} of the group: {what:?} is {len} bytes, over the storage limit of \
         {max}; make the command smaller"
    )]
    TooLarge {
        /// Position of the event in the group.
        event_index: usize,
        /// Which part is too large.
        what: Oversized,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A stored record that an update merges into does not decode.
    #[error("stored record {id} of workspace {ws} is damaged")]
    CorruptRecord {
        /// The workspace.
        ws: WsId,
        /// The record.
        id: RecordId,
        /// Why it does not decode.
        #[source]
        source: DecodeError,
    },
    /// A storage fault; retry, and actualize the sequencer if the fault persists.
    #[error("the event store's storage failed")]
    Storage(#[from] KvError),
}

/// Why a read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError {
    /// A stored value does not decode.
    #[error("{slot} is damaged")]
    Corrupt {
        /// Where the value is stored.
        slot: Slot,
        /// Why it does not decode.
        #[source]
        source: DecodeError,
    },
    /// A stored event says it sits somewhere else than its key.
    #[error(
        "{slot} holds an event that says it is at offset {found}: the log is damaged; restore \
         it from a backup"
    )]
    Misplaced {
        /// Where the event is stored.
        slot: Slot,
        /// The offset the event names.
        found: u64,
    },
    /// A WLog entry, or a record stored as a reference to the event that created it, names a
    /// PLog event that is not there or is another event.
    #[error(
        "{slot} refers to {target}, which holds {found}: the logs are damaged; restore them from \
         a backup"
    )]
    Dangling {
        /// Where the entry is stored.
        slot: Slot,
        /// The PLog place it names.
        target: Slot,
        /// What that place holds ("no event", or which event).
        found: String,
    },
    /// A storage fault; retry.
    #[error("the event store's storage failed")]
    Storage(#[from] KvError),
}

/// Most events one [`EventStore::read_wlog`] call returns.
pub const WLOG_READ_EVENTS_MAX: usize = 65_536;

/// The event store of one application on a key-value store `S` (an `Arc<impl KvStore>` to
/// share it).
///
/// # Example
///
/// ```
/// use std::sync::Arc;
/// use monoseq_core::{PLogOffset, WsId, WsKind};
/// use monoseq_kv::MemoryStore;
/// use monoseq_store::{AppId, Event, EventStore, PartitionId, TrustLevel, WLogOffset};
///
/// let store = EventStore::new(Arc::new(MemoryStore::new()), AppId(1), TrustLevel::Level0);
/// let event = Event {
///     plog_offset: PLogOffset(1),
///     ws: WsId(7),
///     ws_kind: WsKind(1),
///     wlog_offset: WLogOffset(1),
///     registered_at_ms: 0,
///     command: "app.Ping".into(),
///     argument: None,
///     created: vec![],
///     updated: vec![],
///     idempotency: None,
/// };
/// store.append(PartitionId(0), std::slice::from_ref(&event))?;
/// assert_eq!(store.read_event(PartitionId(0), PLogOffset(1))?, Some(event.clone()));
///
/// // The same PLog offset again is a sequence violation at level 0.
/// let err = store.append(PartitionId(0), &[event]).unwrap_err();
/// assert!(err.to_string().contains("sequence violation"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct EventStore<S> {
    pub(crate) kv: S,
    app: AppId,
    trust: TrustLevel,
    /// The PLogs in segment files (key layout 4); `None`: in `kv` (layout 3).
    pub(crate) segments: Option<Arc<Segments>>,
    /// The WLog entries and created records' references held and written in chunks (key
    /// layout 5, with `segments`); `None`: a key each.
    pub(crate) chunks: Option<Arc<Chunks>>,
}

impl<S: KvStore> EventStore<S> {
    /// The event store of `app` on `kv`, writing with `trust`, its PLogs in `kv`.
    pub fn new(kv: S, app: AppId, trust: TrustLevel) -> EventStore<S> {
        EventStore {
            kv,
            app,
            trust,
            segments: None,
            chunks: None,
        }
    }

    /// The event store of `app` on `kv`, writing with `trust`, its PLogs in `segments`
    /// (a data directory's, key layout 4): a group is appended to its partition's log and
    /// synced before its WLog entries and records are written to `kv`.
    pub fn with_segments(
        kv: S,
        app: AppId,
        trust: TrustLevel,
        segments: Arc<Segments>,
    ) -> EventStore<S> {
        EventStore {
            kv,
            app,
            trust,
            chunks: segments.index(app),
            segments: Some(segments),
        }
    }

    /// Whether the store is in key layout 5 ([`Segments::with_chunks`]).
    pub fn is_chunked(&self) -> bool {
        self.chunks.is_some()
    }

    /// The event store of `app` on `kv`, writing with `trust`, its PLogs in `segments` when
    /// given ([`EventStore::with_segments`]), else in `kv` ([`EventStore::new`]).
    pub fn with_plogs(
        kv: S,
        app: AppId,
        trust: TrustLevel,
        segments: Option<Arc<Segments>>,
    ) -> EventStore<S> {
        EventStore {
            kv,
            app,
            trust,
            chunks: segments.as_ref().and_then(|s| s.index(app)),
            segments,
        }
    }

    /// The PLogs' segment files, when the PLogs are kept there.
    pub fn segments(&self) -> Option<&Arc<Segments>> {
        self.segments.as_ref()
    }

    /// This store with `trust` instead.
    #[must_use]
    pub fn with_trust(mut self, trust: TrustLevel) -> EventStore<S> {
        self.trust = trust;
        self
    }

    /// The application.
    pub fn app(&self) -> AppId {
        self.app
    }

    /// The trust level writes use.
    pub fn trust_level(&self) -> TrustLevel {
        self.trust
    }

    /// The key-value store underneath.
    pub fn kv(&self) -> &S {
        &self.kv
    }

    /// The sequence storage of `partition` over this store, for the sequencer.
    pub fn seq_storage(&self, partition: PartitionId) -> PLogSeqStorage<S>
    where
        S: Clone,
    {
        PLogSeqStorage::new(self.kv.clone(), self.app, partition)
            .with_segments(self.segments.clone())
    }

    /// Writes a group of events of `partition` (group commit): each event to the PLog and to
    /// its workspace's WLog, the records it creates and the records it updates, all in one
    /// atomic batch, with the write modes of the trust level. Updates merge their fields into
    /// the stored record (a field of the same name is replaced, a new one added); updates
    /// always put. Whether the write is durable on return is the key-value store's setting;
    /// [`EventStore::sync`] makes it durable.
    ///
    /// # Errors
    ///
    /// [`AppendError`]; whatever the error, nothing of the group was written.
    /// [`AppendError::SequenceViolation`] (levels 0 and 1) names the key that already existed:
    /// the caller actualizes its sequencer.
    pub fn append(&self, partition: PartitionId, events: &[Event]) -> Result<(), AppendError> {
        let stored = self.read_updated_records(events)?;
        self.append_onto(partition, events, stored).map(drop)
    }

    /// [`EventStore::append`] with the updated records as the caller read them before the
    /// group: `stored` holds, as stored, every record an event of the group updates that no
    /// earlier event of the group creates (one missing is [`AppendError::UnknownRecord`];
    /// others are ignored). A writer that read them to check its commands hands them over
    /// here, so that each record is read once. The caller must be the only writer of those
    /// records (a partition's writer is of its workspaces'), or an update may be merged into
    /// a record changed since it was read. Answers the records given and the ones the group
    /// updated, each as it is stored now (the caller may keep them instead of reading them
    /// again).
    ///
    /// # Errors
    ///
    /// As [`EventStore::append`].
    pub fn append_onto(
        &self,
        partition: PartitionId,
        events: &[Event],
        stored: StoredRecords,
    ) -> Result<StoredRecords, AppendError> {
        self.append_group(partition, events, stored, false)
    }

    /// [`EventStore::append_onto`] for a caller that raises a high-water mark after it (a
    /// partition's writer): where the PLog's segments share one flush
    /// ([`Segments::shares_flush`]), the group's frames are only appended (the flush writes
    /// them back with every partition's), and its WLog entries and records wait for
    /// [`EventStore::apply_deferred`], which the caller runs once [`EventStore::sync`] (the
    /// marks cycle's, run by whichever partition leads it) made the frames durable. Until
    /// then neither the group's events nor its records may be acknowledged. Elsewhere it is
    /// [`EventStore::append_onto`].
    ///
    /// # Errors
    ///
    /// As [`EventStore::append`].
    pub fn append_deferred(
        &self,
        partition: PartitionId,
        events: &[Event],
        stored: StoredRecords,
    ) -> Result<StoredRecords, AppendError> {
        self.append_group(partition, events, stored, true)
    }

    fn append_group(
        &self,
        partition: PartitionId,
        events: &[Event],
        stored: StoredRecords,
        defer: bool,
    ) -> Result<StoredRecords, AppendError> {
        if let Some(segments) = &self.segments {
            return self.append_to_segments(segments, partition, events, stored, defer);
        }
        let (group, current) = self.build_group(partition, events, stored, false, false)?;
        group.announce(&self.kv)?;
        self.kv.write(&group.batch).map_err(|e| group.refusal(e))?;
        Ok(current)
    }

    /// The batch of a group (with its PLog entries unless `to_segments`, which collects the
    /// events' bytes for the segment log, checks absence apart and writes created records as
    /// references to their events), and the records as the group leaves them.
    pub(crate) fn build_group(
        &self,
        partition: PartitionId,
        events: &[Event],
        stored: StoredRecords,
        to_segments: bool,
        redo: bool,
    ) -> Result<(GroupBatch, StoredRecords), AppendError> {
        let updated = updated_keys(events);
        let mut current = stored.0;
        let mut group = GroupBatch {
            to_segments,
            redo,
            ..GroupBatch::default()
        };
        group.index.events = events.len();
        for (i, e) in events.iter().enumerate() {
            check_offsets(i, e)?;
            self.push_logs(&mut group, partition, i, e)?;
            self.push_created(&mut group, (partition, i), e, &updated, &mut current)?;
            self.push_updated(&mut group, i, e, &mut current)?;
        }
        Ok((group, StoredRecords(current)))
    }

    /// Adds event `e` (index `i` of the group) to the PLog of `partition` and to its
    /// workspace's WLog.
    fn push_logs(
        &self,
        group: &mut GroupBatch,
        partition: PartitionId,
        i: usize,
        e: &Event,
    ) -> Result<(), AppendError> {
        group.event_bytes.clear();
        e.encode_into(&mut group.event_bytes)
            .map_err(|source| AppendError::Encode {
                event_index: i,
                source,
            })?;
        let op = self.trust.event_op();
        if group.to_segments {
            group.payloads.extend_from_slice(&group.event_bytes);
            group.payload_ends.push(group.payloads.len());
        } else {
            let plog = plog_key(self.app, partition, e.plog_offset);
            let slot = Slot::PLog {
                partition,
                offset: e.plog_offset,
            };
            group.push(op, plog.as_key(), None, (i, slot));
        }
        // The WLog entry names the PLog event (about 12 bytes) instead of copying it, so each
        // event is written, flushed and compacted once. Key layout 4 writes it without a
        // checksum of its own (the engine checksums its blocks; a reader checks the event it
        // names); layout 3 (a database's, and a directory an older build may read) with one.
        group.ref_bytes.clear();
        let r = WLogRef {
            partition,
            plog_offset: e.plog_offset,
            event_crc: event_crc(&group.event_bytes).unwrap_or_default(),
        };
        if let Some(chunks) = self.chunks.as_deref().filter(|_| group.to_segments) {
            return self.push_chunked_wlog(chunks, group, (partition, i), e, r.event_crc);
        }
        if group.to_segments {
            r.encode_bare_into(&mut group.ref_bytes);
        } else {
            r.encode_into(&mut group.ref_bytes);
        }
        let wlog = wlog_key(self.app, e.ws, e.wlog_offset);
        let slot = Slot::WLog {
            ws: e.ws,
            offset: e.wlog_offset,
        };
        group.push(op, wlog.as_key(), Some(Value::Ref), (i, slot));
        if op == Op::InsertIfAbsent && announces_next_block(e.ws, e.wlog_offset.0, LOG_BLOCK_EVENTS)
        {
            let next = WLogOffset(e.wlog_offset.0.saturating_add(LOG_BLOCK_EVENTS));
            group.ahead.push(wlog_partition(self.app, e.ws, next));
        }
        Ok(())
    }

    /// Adds event `e`'s WLog entry (index `i` of the group, of `partition`, its checksum
    /// `crc`) to the group's index in chunks (key layout 5): at an offset above every offset
    /// its workspace holds, or held already with this very entry (the group written again).
    fn push_chunked_wlog(
        &self,
        chunks: &Chunks,
        group: &mut GroupBatch,
        (partition, i): (PartitionId, usize),
        e: &Event,
        crc: u32,
    ) -> Result<(), AppendError> {
        let entry = ChunkedWLog {
            offset: e.wlog_offset.0,
            plog: e.plog_offset.0,
            crc,
        };
        match chunks.wlog_takes(&self.kv, e.ws, partition, entry, &group.index, group.redo)? {
            Ok(true) => group.index.push_wlog(e.ws, entry),
            Ok(false) => {}
            Err(()) => {
                return Err(AppendError::SequenceViolation {
                    event_index: i,
                    slot: Slot::WLog {
                        ws: e.ws,
                        offset: e.wlog_offset,
                    },
                    key: chunks.wlog_chunk_key(e.ws, e.wlog_offset.0),
                });
            }
        }
        Ok(())
    }

    /// Adds the records event `e` (index `i` of the group, of `partition`) creates; one a
    /// later event of the group updates becomes the base of that update. With the PLog in
    /// segment files each is written as a reference to the event (whose bytes are in
    /// `group.event_bytes`): the record is stored once, in the event; an update writes it whole.
    fn push_created(
        &self,
        group: &mut GroupBatch,
        (partition, i): (PartitionId, usize),
        e: &Event,
        updated: &HashSet<(WsId, RecordId)>,
        current: &mut HashMap<(WsId, RecordId), Record>,
    ) -> Result<(), AppendError> {
        let op = self.trust.new_record_op();
        let crc = event_crc(&group.event_bytes).unwrap_or_default();
        for (index, r) in e.created.iter().enumerate() {
            if updated.contains(&(e.ws, r.id)) {
                current.insert((e.ws, r.id), r.clone());
            }
            if let Some(chunks) = self.chunks.as_deref().filter(|_| group.to_segments) {
                let entry = ChunkedRecord {
                    id: r.id.0,
                    plog: e.plog_offset.0,
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    crc,
                };
                let redo = group.redo;
                match chunks.record_place(&self.kv, e.ws, partition, entry, &group.index, redo)? {
                    RecordPlace::Chunk => {
                        group.index.push_record(e.ws, entry);
                        continue;
                    }
                    RecordPlace::Held => continue,
                    RecordPlace::Own if op == Op::InsertIfAbsent => {
                        let taken = group.index.record(e.ws, r.id.0).is_some()
                            || chunks.held_record(e.ws, r.id).is_some()
                            || chunks
                                .stored_record(&self.kv, e.ws, r.id)
                                .map_err(|e| AppendError::Storage(chunk_storage(e)))?
                                .is_some();
                        if taken {
                            return Err(AppendError::SequenceViolation {
                                event_index: i,
                                slot: Slot::Record { ws: e.ws, id: r.id },
                                key: record_key(self.app, e.ws, r.id).as_key().to_owned(),
                            });
                        }
                    }
                    RecordPlace::Own => {}
                }
            }
            group.record_bytes.clear();
            if group.to_segments {
                RecordRef {
                    partition,
                    plog_offset: e.plog_offset,
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    event_crc: crc,
                }
                .encode_bare_into(&mut group.record_bytes);
            } else {
                encode_record_value(&mut group.record_bytes, r);
            }
            let key = record_key(self.app, e.ws, r.id);
            let slot = Slot::Record { ws: e.ws, id: r.id };
            group.push(op, key.as_key(), Some(Value::Record), (i, slot));
            if op == Op::InsertIfAbsent && announces_next_block(e.ws, r.id.0, RECORD_BLOCK_IDS) {
                let next = RecordId(r.id.0.saturating_add(RECORD_BLOCK_IDS));
                group.ahead.push(record_key(self.app, e.ws, next).partition);
            }
        }
        Ok(())
    }

    /// Merges the updates of event `e` into the current records and puts the results.
    fn push_updated(
        &self,
        group: &mut GroupBatch,
        i: usize,
        e: &Event,
        current: &mut HashMap<(WsId, RecordId), Record>,
    ) -> Result<(), AppendError> {
        for u in &e.updated {
            let Some(stored) = current.get_mut(&(e.ws, u.id)) else {
                return Err(AppendError::UnknownRecord {
                    event_index: i,
                    ws: e.ws,
                    id: u.id,
                });
            };
            merge_fields(&mut stored.fields, &u.fields);
            group.record_bytes.clear();
            encode_record_value(&mut group.record_bytes, stored);
            let key = record_key(self.app, e.ws, u.id);
            let slot = Slot::Record { ws: e.ws, id: u.id };
            group.push(Op::Put, key.as_key(), Some(Value::Record), (i, slot));
        }
        Ok(())
    }

    /// Checks, without writing, that `event` and the records it creates and updates encode
    /// within the storage's limits; what [`EventStore::append`] would refuse as
    /// [`AppendError::Encode`] or [`AppendError::TooLarge`] (with `event_index` 0). A caller
    /// checks a command this way before it takes numbers for it.
    ///
    /// # Errors
    ///
    /// [`AppendError::Encode`] or [`AppendError::TooLarge`].
    pub fn check_storable(&self, event: &Event) -> Result<(), AppendError> {
        let max = monoseq_kv::limits::VALUE_BYTES_MAX;
        let len = event.encoded_len().map_err(|source| match source {
            EncodeError::TooLarge { len } => AppendError::TooLarge {
                event_index: 0,
                what: Oversized::Value,
                len,
                max,
            },
            source => AppendError::Encode {
                event_index: 0,
                source,
            },
        })?;
        debug_assert!(len <= max);
        for r in event.created.iter().chain(&event.updated) {
            let len = record_value_len(r);
            if len > max {
                return Err(AppendError::TooLarge {
                    event_index: 0,
                    what: Oversized::Value,
                    len,
                    max,
                });
            }
        }
        Ok(())
    }

    /// Checks, without writing, that applying `update` (its fields) to the stored record
    /// `stored` gives a record within the storage's limits.
    ///
    /// # Errors
    ///
    /// [`AppendError::TooLarge`] (with `event_index` 0).
    pub fn check_update_storable(
        &self,
        stored: &Record,
        update: &Record,
    ) -> Result<(), AppendError> {
        let len = merged_record_value_len(stored, &update.fields);
        let max = monoseq_kv::limits::VALUE_BYTES_MAX;
        if len > max {
            return Err(AppendError::TooLarge {
                event_index: 0,
                what: Oversized::Value,
                len,
                max,
            });
        }
        Ok(())
    }

    /// Calls `visit` with every event of `partition`'s PLog from offset `from` to `to`
    /// (exclusive), in offset order, reading block by block; stops at the first missing offset.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails or a stored event is damaged or misplaced.
    pub fn for_each_event(
        &self,
        partition: PartitionId,
        from: PLogOffset,
        to: PLogOffset,
        visit: &mut dyn FnMut(Event),
    ) -> Result<(), ReadError> {
        self.scan_events(partition, (from, to), None, &mut |_, e| {
            if let Some(e) = e {
                visit(e);
            }
        })
    }

    /// As [`EventStore::for_each_event`], calling `visit` with every offset read; with
    /// `keep`, only the events it keeps are built and given (see [`decode_event_if`]), the
    /// others are checked (checksum, place and structure) and given as `None`.
    pub(crate) fn scan_events(
        &self,
        partition: PartitionId,
        (from, to): (PLogOffset, PLogOffset),
        keep: Option<&dyn Fn(&EventPeek<'_>) -> bool>,
        visit: &mut dyn FnMut(u64, Option<Event>),
    ) -> Result<(), ReadError> {
        let decode = |value: &[u8]| match keep {
            None => Event::decode(value).map(|e| (e.plog_offset, Some(e))),
            Some(keep) => decode_event_if(value, keep).map(|(h, e)| (h.plog_offset, e)),
        };
        self.scan_decoded(partition, (from, to), decode, visit)
    }

    /// Calls `visit` with the place and idempotency key of every event of `partition`'s PLog
    /// from offset `from` to `to` (exclusive) sent with a key, in offset order, reading as
    /// [`EventStore::for_each_event`] does but building no event ([`decode_idempotency`]).
    ///
    /// # Errors
    ///
    /// [`ReadError`] as [`EventStore::for_each_event`].
    pub fn for_each_key(
        &self,
        partition: PartitionId,
        from: PLogOffset,
        to: PLogOffset,
        visit: &mut dyn FnMut(EventHead, Idempotency),
    ) -> Result<(), ReadError> {
        let decode = |value: &[u8]| {
            decode_idempotency(value).map(|(h, key)| (h.plog_offset, key.map(|k| (h, k))))
        };
        self.scan_decoded(partition, (from, to), decode, &mut |_, found| {
            if let Some((head, key)) = found {
                visit(head, key);
            }
        })
    }

    /// Reads `partition`'s PLog from `from` to `to` (exclusive) in offset order, each event
    /// by `decode` (its place and what is kept of it), checked to be at its offset, and
    /// given to `visit`; stops at the first missing offset.
    fn scan_decoded<T>(
        &self,
        partition: PartitionId,
        (from, to): (PLogOffset, PLogOffset),
        decode: impl Fn(&[u8]) -> Result<(PLogOffset, T), DecodeError>,
        visit: &mut dyn FnMut(u64, T),
    ) -> Result<(), ReadError> {
        let mut next = from.0.max(1);
        if next >= to.0 {
            return Ok(());
        }
        let mut failure = None;
        self.visit_plog(partition, next, &mut |offset, value| {
            if offset != next || offset >= to.0 {
                return ControlFlow::Break(());
            }
            let slot = Slot::PLog {
                partition,
                offset: PLogOffset(offset),
            };
            match decode(value) {
                Ok((at, e)) if at.0 == offset => visit(offset, e),
                Ok((at, _)) => {
                    failure = Some(ReadError::Misplaced { slot, found: at.0 });
                    return ControlFlow::Break(());
                }
                Err(source) => {
                    failure = Some(ReadError::Corrupt { slot, source });
                    return ControlFlow::Break(());
                }
            }
            next += 1;
            ControlFlow::Continue(())
        })?;
        match failure {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Reads the stored records that `events` update and that no earlier event of the group
    /// creates, in one `get_many`: what [`EventStore::append_onto`] and
    /// [`EventStore::append_deferred`] take as `stored`.
    ///
    /// # Errors
    ///
    /// [`AppendError::Storage`] when the store cannot be read.
    pub fn read_updated_records(&self, events: &[Event]) -> Result<StoredRecords, AppendError> {
        if events.iter().all(|e| e.updated.is_empty()) {
            return Ok(StoredRecords::default());
        }
        let mut wanted: Vec<(WsId, RecordId)> = Vec::new();
        let mut seen: HashSet<(WsId, RecordId)> = HashSet::new();
        let mut created: HashSet<(WsId, RecordId)> = HashSet::new();
        for e in events {
            for u in &e.updated {
                let k = (e.ws, u.id);
                if seen.insert(k) && !created.contains(&k) {
                    wanted.push(k);
                }
            }
            for r in &e.created {
                created.insert((e.ws, r.id));
            }
        }
        let mut found = HashMap::with_capacity(wanted.len());
        if wanted.is_empty() {
            return Ok(StoredRecords(found));
        }
        let stored: Vec<_> = wanted
            .iter()
            .map(|&(ws, id)| record_key(self.app, ws, id))
            .collect();
        let keys: Vec<_> = stored.iter().map(keys::BlockKey::as_key).collect();
        let values = self.kv.get_many(&keys)?;
        for (&(ws, id), value) in wanted.iter().zip(values) {
            if value.is_none()
                && let Some(record) = self
                    .chunked_record(ws, id)
                    .map_err(|e| unreadable_record(ws, id, e))?
            {
                found.insert((ws, id), record);
            }
            if let Some(bytes) = value {
                let record = match decode_record_value(&bytes)
                    .map_err(|source| AppendError::CorruptRecord { ws, id, source })?
                {
                    RecordValue::Full(record) => Some(record),
                    // `None`: lost with its event in an accepted loss; an update of it is
                    // refused as of an unknown record.
                    RecordValue::Ref(r) => self
                        .resolve_record(ws, id, r)
                        .map_err(|e| unreadable_record(ws, id, e))?,
                };
                if let Some(record) = record {
                    found.insert((ws, id), record);
                }
            }
        }
        Ok(StoredRecords(found))
    }

    /// Makes every group appended before this call durable. With the PLogs in segment files
    /// each group's log was synced before its batch was written, and the batch needs no sync
    /// (a restart writes it again from the log); only the frames of groups
    /// [`EventStore::append_deferred`] wrote back wait for this flush, one for every
    /// partition's ([`Segments::flush`]).
    ///
    /// # Errors
    ///
    /// A [`KvError`] when flushing failed.
    pub fn sync(&self) -> Result<(), KvError> {
        match &self.segments {
            Some(segments) => segments.flush(),
            None => self.kv.sync(),
        }
    }

    /// The event at `offset` of `partition`'s PLog, if any.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails or the stored event is damaged or misplaced.
    pub fn read_event(
        &self,
        partition: PartitionId,
        offset: PLogOffset,
    ) -> Result<Option<Event>, ReadError> {
        let bytes = match &self.segments {
            Some(segments) => Self::logged_bytes(segments, partition, offset.0)?,
            None => self
                .kv
                .get(plog_key(self.app, partition, offset).as_key())?,
        };
        let Some(bytes) = bytes else {
            return Ok(None);
        };
        let slot = Slot::PLog { partition, offset };
        let event = Event::decode(&bytes).map_err(|source| ReadError::Corrupt { slot, source })?;
        if event.plog_offset != offset {
            return Err(ReadError::Misplaced {
                slot,
                found: event.plog_offset.0,
            });
        }
        Ok(Some(event))
    }

    /// Up to `limit` events of `ws`'s WLog from offset `from` on, in offset order (at most
    /// [`WLOG_READ_EVENTS_MAX`]). Reading stops at the end of the WLog.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails, a stored event is damaged or misplaced, or an entry
    /// names a PLog event that is not there ([`ReadError::Dangling`]).
    pub fn read_wlog(
        &self,
        ws: WsId,
        from: WLogOffset,
        limit: usize,
    ) -> Result<Vec<Event>, ReadError> {
        let limit = limit.min(WLOG_READ_EVENTS_MAX);
        if limit == 0 {
            return Ok(Vec::new());
        }
        if let Some(chunks) = &self.chunks {
            self.load_index().map_err(index_unloaded)?;
            let entries = self.chunked_wlog(chunks, ws, from, limit)?;
            return self.resolve_wlog(ws, entries);
        }
        // Entries in offset order: a copy of the event (written before WLog references) or
        // where the event is; the references are resolved in one read of the PLog below.
        let mut entries: Vec<(WLogOffset, WLogEntry)> = Vec::new();
        let mut failure: Option<ReadError> = None;
        self.scan_log(
            from.0,
            &|first| wlog_partition(self.app, ws, WLogOffset(first)),
            &mut |offset, value| {
                let offset = WLogOffset(offset);
                let slot = Slot::WLog { ws, offset };
                match WLogEntry::decode(value) {
                    Ok(WLogEntry::Copy(e)) if e.wlog_offset != offset || e.ws != ws => {
                        failure = Some(ReadError::Misplaced {
                            slot,
                            found: e.wlog_offset.0,
                        });
                        return ControlFlow::Break(());
                    }
                    Ok(entry) => entries.push((offset, entry)),
                    Err(source) => {
                        failure = Some(ReadError::Corrupt { slot, source });
                        return ControlFlow::Break(());
                    }
                }
                if entries.len() >= limit {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.resolve_wlog(ws, entries)
    }

    /// Up to `limit` WLog entries of `ws` from `from` on, in key layout 5: those held (read
    /// first, so an entry written to a chunk meanwhile is found there), then the chunk that
    /// may hold `from` and the ones after it.
    fn chunked_wlog(
        &self,
        chunks: &Chunks,
        ws: WsId,
        from: WLogOffset,
        limit: usize,
    ) -> Result<Vec<(WLogOffset, WLogEntry)>, ReadError> {
        let held = chunks.held_wlog(ws, from.0);
        let mut found = WLogFound::new();
        let take = |found: &mut WLogFound, first: u64, partition, entries: Vec<ChunkedWLog>| {
            if entries.first().is_some_and(|e| e.offset != first) {
                return Err(ReadError::Misplaced {
                    slot: Slot::WLog {
                        ws,
                        offset: WLogOffset(first),
                    },
                    found: entries[0].offset,
                });
            }
            for e in entries.into_iter().filter(|e| e.offset >= from.0) {
                found.insert(e.offset, chunked_wlog_ref(partition, e));
            }
            Ok(())
        };
        let at = chunks
            .wlog_chunk_at(&self.kv, ws, from.0)
            .map_err(|e| chunk_read(ws, e))?;
        if let Some((first, partition, entries)) = at {
            take(&mut found, first, partition, entries)?;
        }
        let mut failure = None;
        chunks
            .wlog_chunks_after(&self.kv, ws, from.0, &mut |first, partition, entries| {
                if let Err(e) = take(&mut found, first, partition, entries) {
                    failure = Some(e);
                    return ControlFlow::Break(());
                }
                if found.len() >= limit {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .map_err(|e| chunk_read(ws, e))?;
        if let Some(e) = failure {
            return Err(e);
        }
        for (partition, e) in held {
            found.insert(e.offset, chunked_wlog_ref(partition, e));
        }
        Ok(found
            .into_iter()
            .take(limit)
            .map(|(offset, r)| (WLogOffset(offset), WLogEntry::Ref(r)))
            .collect())
    }

    /// Record `id` of `ws` as created, in key layout 5: from the reference held or in its
    /// chunk (its own key, read before, holds it when updated since or not in a chunk).
    fn chunked_record(&self, ws: WsId, id: RecordId) -> Result<Option<Record>, ReadError> {
        let Some(chunks) = &self.chunks else {
            return Ok(None);
        };
        self.load_index().map_err(index_unloaded)?;
        let found = match chunks.held_record(ws, id) {
            Some(held) => Some(held),
            None => chunks
                .stored_record(&self.kv, ws, id)
                .map_err(|e| match e {
                    ChunkError::Damaged { first, source, .. } => ReadError::Corrupt {
                        slot: Slot::Record {
                            ws,
                            id: RecordId(first),
                        },
                        source,
                    },
                    ChunkError::Misplaced { first, found, .. } => ReadError::Misplaced {
                        slot: Slot::Record {
                            ws,
                            id: RecordId(first),
                        },
                        found,
                    },
                    ChunkError::Storage(e) => ReadError::Storage(e),
                })?,
        };
        let Some((partition, r)) = found else {
            return Ok(None);
        };
        let r = RecordRef {
            partition,
            plog_offset: PLogOffset(r.plog),
            index: r.index,
            event_crc: r.crc,
        };
        self.resolve_record(ws, id, r)
    }

    /// The events of WLog entries of `ws` (in order), reading the events that references name
    /// from the PLog and checking that each is the event its entry names.
    fn resolve_wlog(
        &self,
        ws: WsId,
        entries: Vec<(WLogOffset, WLogEntry)>,
    ) -> Result<Vec<Event>, ReadError> {
        let places: Vec<_> = entries
            .iter()
            .filter_map(|(_, entry)| match entry {
                WLogEntry::Ref(r) => Some((r.partition, r.plog_offset)),
                WLogEntry::Copy(_) => None,
            })
            .collect();
        let mut stored = self.plog_many(&places)?.into_iter();
        let mut events = Vec::with_capacity(entries.len());
        for (offset, entry) in entries {
            let r = match entry {
                WLogEntry::Copy(event) => {
                    events.push(*event);
                    continue;
                }
                WLogEntry::Ref(r) => r,
            };
            let slot = Slot::WLog { ws, offset };
            let target = Slot::PLog {
                partition: r.partition,
                offset: r.plog_offset,
            };
            let dangling = |found: String| ReadError::Dangling {
                slot,
                target,
                found,
            };
            let Some(bytes) = stored.next().flatten() else {
                return Err(dangling("no event".into()));
            };
            if bytes == RETIRED_PAYLOAD {
                // The entry of an event an accepted loss took from the segment files (the
                // engine kept it): left out, as the engine's own loss would have.
                continue;
            }
            if event_crc(&bytes) != Some(r.event_crc) {
                return Err(dangling("another event (its checksum differs)".into()));
            }
            let event = Event::decode(&bytes).map_err(|source| ReadError::Corrupt {
                slot: target,
                source,
            })?;
            if event.plog_offset != r.plog_offset || event.ws != ws || event.wlog_offset != offset {
                return Err(dangling(format!(
                    "the event of PLog offset {} of workspace {} at WLog offset {}",
                    event.plog_offset, event.ws, event.wlog_offset
                )));
            }
            events.push(event);
        }
        Ok(events)
    }

    /// Calls `visit` with every event of `partition`'s PLog from offset `from` on, in offset
    /// order, until it breaks or the log ends, from the segment files or the key-value store.
    fn visit_plog(
        &self,
        partition: PartitionId,
        from: u64,
        visit: &mut dyn FnMut(u64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), KvError> {
        match &self.segments {
            Some(segments) => Self::visit_logged(segments, partition, from, visit),
            None => self.scan_log(
                from,
                &|first| keys::plog_partition(self.app, partition, PLogOffset(first)),
                visit,
            ),
        }
    }

    /// The stored bytes of the PLog events at `places`, in order ([`RETIRED_PAYLOAD`] where
    /// an accepted loss retired the offset in segment files).
    fn plog_many(
        &self,
        places: &[(PartitionId, PLogOffset)],
    ) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let Some(segments) = &self.segments else {
            let keys: Vec<_> = places
                .iter()
                .map(|&(p, o)| plog_key(self.app, p, o))
                .collect();
            let key_refs: Vec<_> = keys.iter().map(keys::BlockKey::as_key).collect();
            return self.kv.get_many(&key_refs);
        };
        places
            .iter()
            .map(|&(p, o)| Self::logged_frame(segments, p, o.0))
            .collect()
    }

    /// Visits a log (PLog or WLog, split into blocks of [`LOG_BLOCK_EVENTS`] whose partition
    /// keys `part` gives for a block's first offset) from offset `from` on, in offset order,
    /// until `visit` breaks or a block is not full (offsets are contiguous: it is the last).
    pub(crate) fn scan_log(
        &self,
        from: u64,
        part: &dyn Fn(u64) -> keys::PartKey,
        visit: &mut dyn FnMut(u64, &[u8]) -> ControlFlow<()>,
    ) -> Result<(), KvError> {
        let mut block_start = from;
        loop {
            let block_first = block_start / LOG_BLOCK_EVENTS * LOG_BLOCK_EVENTS;
            let lower = block_position(block_start, LOG_BLOCK_EVENTS);
            let (mut last, mut stopped) = (None, false);
            self.kv.scan(
                part(block_start).as_bytes(),
                Bound::Included(&lower),
                Bound::Unbounded,
                Order::Ascending,
                &mut |clustering, value| {
                    let offset = keys::from_block_position(block_first, clustering).unwrap_or(0);
                    last = Some(offset);
                    let flow = visit(offset, value);
                    stopped = flow.is_break();
                    flow
                },
            )?;
            // The last block of the number space ends at `u64::MAX`: nothing comes after it.
            let block_last = block_first.saturating_add(LOG_BLOCK_EVENTS - 1);
            match (last, block_last.checked_add(1)) {
                (Some(l), Some(next)) if !stopped && l >= block_last => block_start = next,
                _ => return Ok(()),
            }
        }
    }

    /// The record `id` of `ws`, with all its fields as last written, if it exists.
    ///
    /// # Errors
    ///
    /// [`ReadError`] when storage fails or the stored record is damaged.
    pub fn read_record(&self, ws: WsId, id: RecordId) -> Result<Option<Record>, ReadError> {
        let key = record_key(self.app, ws, id);
        let Some(bytes) = self.kv.get(key.as_key())? else {
            return self.chunked_record(ws, id);
        };
        let slot = Slot::Record { ws, id };
        let record = match decode_record_value(&bytes)
            .map_err(|source| ReadError::Corrupt { slot, source })?
        {
            RecordValue::Full(record) => record,
            RecordValue::Ref(r) => return self.resolve_record(ws, id, r),
        };
        if record.id != id {
            return Err(ReadError::Misplaced {
                slot,
                found: record.id.0,
            });
        }
        Ok(Some(record))
    }

    /// The key of the PLog entry at `offset` of `partition` (for tools and tests that inspect
    /// or repair storage).
    pub fn plog_key(&self, partition: PartitionId, offset: PLogOffset) -> KeyBuf {
        plog_key(self.app, partition, offset).as_key().to_owned()
    }

    /// The key of the WLog entry at `offset` of `ws`.
    pub fn wlog_key(&self, ws: WsId, offset: WLogOffset) -> KeyBuf {
        wlog_key(self.app, ws, offset).as_key().to_owned()
    }

    /// The key of record `id` of `ws`.
    pub fn record_key(&self, ws: WsId, id: RecordId) -> KeyBuf {
        record_key(self.app, ws, id).as_key().to_owned()
    }
}

/// Records as stored before a group, by workspace and ID: what the group's updates are merged
/// into ([`EventStore::append_onto`]).
#[derive(Debug, Clone, Default)]
pub struct StoredRecords(HashMap<(WsId, RecordId), Record>);

impl StoredRecords {
    /// No record yet.
    #[must_use]
    pub fn new() -> StoredRecords {
        StoredRecords::default()
    }

    /// Record `id` of `ws`, if held.
    #[must_use]
    pub fn get(&self, ws: WsId, id: RecordId) -> Option<&Record> {
        self.0.get(&(ws, id))
    }

    /// Holds `record` of `ws`, as stored (replacing one of the same ID).
    pub fn insert(&mut self, ws: WsId, record: Record) {
        self.0.insert((ws, record.id), record);
    }

    /// Forgets every record.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Every record held, with its workspace.
    pub fn into_records(self) -> impl Iterator<Item = (WsId, Record)> {
        self.0.into_iter().map(|((ws, _), record)| (ws, record))
    }
}

/// The keys of every record the events update (none allocated when no event updates one).
fn updated_keys(events: &[Event]) -> HashSet<(WsId, RecordId)> {
    events
        .iter()
        .flat_map(|e| e.updated.iter().map(move |u| (e.ws, u.id)))
        .collect()
}

/// Refuses an event numbered 0 in the PLog or its WLog: offsets start at 1.
fn check_offsets(i: usize, e: &Event) -> Result<(), AppendError> {
    if e.plog_offset.0 == 0 || e.wlog_offset.0 == 0 {
        return Err(AppendError::ZeroOffset {
            event_index: i,
            what: if e.plog_offset.0 == 0 {
                "PLog offset"
            } else {
                "WLog offset"
            },
        });
    }
    Ok(())
}

/// One group's write batch as it is built, with the slot each write fills (`(event index,
/// slot)` in write order), so that a refused write can be named.
#[derive(Default)]
pub(crate) struct GroupBatch {
    pub(crate) batch: WriteBatch,
    slots: Vec<(usize, Slot)>,
    event_bytes: Vec<u8>,
    ref_bytes: Vec<u8>,
    record_bytes: Vec<u8>,
    /// The PLog goes to segment files: the events' bytes are collected in `payloads` (each
    /// ending at its `payload_ends` entry), and an insert-if-absent is written as a put whose
    /// key's absence is checked before (its index in `checks`).
    to_segments: bool,
    /// The group is written again from its partition's log ([`Chunks::wlog_takes`]).
    redo: bool,
    pub(crate) payloads: Vec<u8>,
    pub(crate) payload_ends: Vec<usize>,
    pub(crate) checks: Vec<usize>,
    /// The next blocks of WLogs and records this group's inserts announce
    /// ([`announces_next_block`]).
    pub(crate) ahead: Vec<PartKey>,
    /// What the group adds to the index in chunks (key layout 5).
    pub(crate) index: GroupIndex,
}

/// Which of the group's buffers holds a write's value.
#[derive(Clone, Copy)]
enum Value {
    Ref,
    Record,
}

impl GroupBatch {
    /// Adds a write of `key` with the value in `value`'s buffer (the event's, for `None`).
    fn push(
        &mut self,
        op: Op,
        key: monoseq_kv::Key<'_>,
        value: Option<Value>,
        slot: (usize, Slot),
    ) {
        let bytes = match value {
            None => &self.event_bytes,
            Some(Value::Ref) => &self.ref_bytes,
            Some(Value::Record) => &self.record_bytes,
        };
        let op = if self.to_segments && op == Op::InsertIfAbsent {
            self.checks.push(self.batch.len());
            Op::Put
        } else {
            op
        };
        self.batch.push(op, key, bytes);
        self.slots.push(slot);
    }

    /// Announces the partitions in [`GroupBatch::ahead`] to `kv`.
    pub(crate) fn announce(&self, kv: &impl KvStore) -> Result<(), AppendError> {
        if self.ahead.is_empty() {
            return Ok(());
        }
        let partitions: Vec<&[u8]> = self.ahead.iter().map(PartKey::as_bytes).collect();
        Ok(kv.expect_inserts(&partitions)?)
    }

    /// The events' bytes, one slice each.
    pub(crate) fn payloads(&self) -> Vec<&[u8]> {
        let mut start = 0;
        self.payload_ends
            .iter()
            .map(|&end| {
                let p = &self.payloads[start..end];
                start = end;
                p
            })
            .collect()
    }

    /// The append error of a refused write of this batch, naming the event and slot it hit.
    pub(crate) fn refusal(&self, error: WriteError) -> AppendError {
        match error {
            WriteError::Conflict { index, key } => {
                let (event_index, slot) = self.slots[index];
                AppendError::SequenceViolation {
                    event_index,
                    slot,
                    key,
                }
            }
            WriteError::TooLarge {
                index,
                what,
                len,
                max,
            } => AppendError::TooLarge {
                event_index: self.slots[index].0,
                what,
                len,
                max,
            },
            WriteError::Storage(e) => AppendError::Storage(e),
            other => AppendError::Storage(KvError::Backend {
                message: other.to_string(),
                source: None,
            }),
        }
    }
}

/// The append error of a stored record that an update merges into but that cannot be read.
fn unreadable_record(ws: WsId, id: RecordId, e: ReadError) -> AppendError {
    match e {
        ReadError::Storage(e) => AppendError::Storage(e),
        ReadError::Corrupt { source, .. } => AppendError::CorruptRecord { ws, id, source },
        e => AppendError::Storage(KvError::Corrupted {
            message: e.to_string(),
        }),
    }
}

/// Applies an update's fields: a field of the same name is replaced, a new one appended.
fn merge_fields(stored: &mut Vec<Field>, changes: &[Field]) {
    for c in changes {
        match stored.iter_mut().find(|f| f.name == c.name) {
            Some(f) => f.value.clone_from(&c.value),
            None => stored.push(c.clone()),
        }
    }
}

/// WLog references found, by offset.
type WLogFound = std::collections::BTreeMap<u64, WLogRef>;

/// The WLog reference of a chunk's entry of `partition`.
fn chunked_wlog_ref(partition: PartitionId, e: ChunkedWLog) -> WLogRef {
    WLogRef {
        partition,
        plog_offset: PLogOffset(e.plog),
        event_crc: e.crc,
    }
}

/// The read error of an index in chunks whose held part could not be read back.
fn index_unloaded(e: AppendError) -> ReadError {
    match e {
        AppendError::Storage(e) => ReadError::Storage(e),
        e => ReadError::Storage(KvError::Corrupted {
            message: monoseq_kv::chain(&e),
        }),
    }
}

/// A WLog chunk's read error as a read error.
fn chunk_read(ws: WsId, e: ChunkError) -> ReadError {
    match e {
        ChunkError::Damaged { first, source, .. } => ReadError::Corrupt {
            slot: Slot::WLog {
                ws,
                offset: WLogOffset(first),
            },
            source,
        },
        e @ ChunkError::Misplaced { .. } => ReadError::Storage(chunk_storage(e)),
        ChunkError::Storage(e) => ReadError::Storage(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::RecordKind;

    fn field(name: &str, value: &str) -> Field {
        Field::new(name, value.as_bytes().to_vec())
    }

    /// The workspace and the record the append-onto tests write.
    const WS: WsId = WsId(7);
    const DOC: RecordId = RecordId(40);

    fn memory_store() -> EventStore<std::sync::Arc<monoseq_kv::MemoryStore>> {
        EventStore::new(
            std::sync::Arc::new(monoseq_kv::MemoryStore::new()),
            AppId(1),
            TrustLevel::Level0,
        )
    }

    /// An event of workspace [`WS`] at PLog and WLog offset `offset`.
    fn event(offset: u64, created: Vec<Record>, updated: Vec<Record>) -> Event {
        Event {
            plog_offset: PLogOffset(offset),
            ws: WS,
            ws_kind: monoseq_core::WsKind(1),
            wlog_offset: WLogOffset(offset),
            registered_at_ms: 0,
            command: "c".into(),
            argument: None,
            created,
            updated,
            idempotency: None,
        }
    }

    /// Record [`DOC`] with `fields`.
    fn record(fields: Vec<Field>) -> Record {
        Record {
            id: DOC,
            kind: RecordKind::CDoc,
            name: "app.Doc".into(),
            fields,
        }
    }

    #[test]
    fn an_append_onto_records_read_before_merges_into_them_and_refuses_one_not_given() {
        let store = memory_store();
        let (ws, id) = (WS, DOC);
        let p = PartitionId(0);
        store
            .append(p, &[event(1, vec![record(vec![field("a", "1")])], vec![])])
            .unwrap();
        let change = event(2, vec![], vec![record(vec![field("b", "2")])]);
        let err = store
            .append_onto(p, std::slice::from_ref(&change), StoredRecords::new())
            .unwrap_err();
        assert!(matches!(err, AppendError::UnknownRecord { .. }), "{err}");
        let mut read = StoredRecords::new();
        read.insert(ws, store.read_record(ws, id).unwrap().unwrap());
        let written = store.append_onto(p, &[change], read).unwrap();
        let merged = store.read_record(ws, id).unwrap().unwrap();
        assert_eq!(merged.fields, vec![field("a", "1"), field("b", "2")]);
        let written: Vec<_> = written.into_records().collect();
        assert_eq!(
            written,
            vec![(ws, merged)],
            "the records answered are the stored ones"
        );
    }

    #[test]
    fn an_append_onto_answers_a_record_created_and_updated_in_the_group_as_stored() {
        let store = memory_store();
        let (ws, id) = (WS, DOC);
        let events = [
            event(1, vec![record(vec![field("a", "1")])], vec![]),
            event(2, vec![], vec![record(vec![field("a", "3")])]),
        ];
        let written = store
            .append_onto(PartitionId(0), &events, StoredRecords::new())
            .unwrap();
        let stored = store.read_record(ws, id).unwrap().unwrap();
        assert_eq!(stored.fields, vec![field("a", "3")]);
        assert_eq!(
            written.into_records().collect::<Vec<_>>(),
            vec![(ws, stored)]
        );
    }

    #[test]
    fn a_workspace_announces_its_next_wlog_and_records_blocks_once_a_block() {
        let announced = |trust: TrustLevel| {
            let store = EventStore::new(
                std::sync::Arc::new(monoseq_kv::MemoryStore::new()),
                AppId(1),
                trust,
            );
            let mut announced = Vec::new();
            for n in 1..=2 * LOG_BLOCK_EVENTS {
                let created = Record {
                    id: RecordId(n),
                    ..record(vec![])
                };
                let events = [event(n, vec![created], vec![])];
                let (group, _) = store
                    .build_group(PartitionId(0), &events, StoredRecords::new(), true, false)
                    .expect("a valid group");
                if !group.ahead.is_empty() {
                    announced.push((n, group.ahead));
                }
            }
            announced
        };
        let at_level0 = announced(TrustLevel::Level0);
        assert_eq!(at_level0.len(), 2, "once in each of two blocks");
        for (n, ahead) in at_level0 {
            let next_wlog = wlog_partition(AppId(1), WS, WLogOffset(n + LOG_BLOCK_EVENTS));
            let next_records = record_key(AppId(1), WS, RecordId(n + RECORD_BLOCK_IDS)).partition;
            assert_eq!(ahead, vec![next_wlog, next_records], "at {n}");
        }
        let at_level1 = announced(TrustLevel::Level1);
        assert_eq!(at_level1.len(), 2, "level 1 checks events, not records");
        assert!(at_level1.iter().all(|(_, ahead)| ahead.len() == 1));
        assert!(
            announced(TrustLevel::Level2).is_empty(),
            "level 2 checks nothing, so learns no bound"
        );
    }

    #[test]
    fn an_update_s_merged_length_is_the_length_of_the_merged_record_s_encoding() {
        let stored = Record {
            id: RecordId(300),
            kind: RecordKind::WDoc,
            name: "app.Order".into(),
            fields: vec![field("a", "1"), field("b", "22"), field("a", "333")],
        };
        let changes = [
            vec![],
            vec![field("a", "4444")],
            vec![field("c", "5"), field("c", "66666"), field("b", "")],
            vec![
                field("d", &"x".repeat(300)),
                field("a", "7"),
                field("e", "8"),
            ],
        ];
        for change in changes {
            let mut merged = stored.clone();
            merge_fields(&mut merged.fields, &change);
            let mut bytes = Vec::new();
            encode_record_value(&mut bytes, &merged);
            assert_eq!(
                merged_record_value_len(&stored, &change),
                bytes.len(),
                "{change:?}"
            );
        }
    }
}
