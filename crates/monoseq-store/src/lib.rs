//! monoseq event store: the versioned event encoding, the built-in sequences, the PLog, WLog
//! and records tables on the key-value contract ([`EventStore`]), and the PLog-backed
//! sequence storage the sequencer runs on ([`PLogSeqStorage`]); and the consumers' positions
//! in the same store ([`EventStore::set_position`]).
//!
//! Byte layouts of values and keys are in `docs/format.md`.

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod backup;
mod builtin;
mod chunks;
mod codec;
#[cfg(feature = "conformance")]
pub mod conformance;
mod datadir;
mod event;
mod fence;
mod groups;
mod identity;
mod keys;
mod marks;
mod plog;
mod plog_page;
mod positions;
mod segmented;
mod seqstore;
mod store;

pub use backup::{BACKUP_FILE, BACKUP_FORMAT, BackupError, BackupStamp, Restore, Restored};
pub use builtin::{
    BUILT_IN_SEQUENCES, BuiltInSequence, CRECORD_ID_SEQUENCE, OWRECORD_ID_SEQUENCE,
    PLOG_OFFSET_SEQUENCE, WLOG_OFFSET_SEQUENCE, built_in_initial, built_in_params,
    built_in_params_above, workspace_sequences,
};
pub use chunks::APPLIED_LAG_MAX;
pub use codec::{
    ARG_DEPTH_MAX, ChunkedRecord, ChunkedWLog, DecodeError, EVENT_BYTES_MAX, EncodeError,
    EventHead, EventPeek, FORMAT_VERSION, FORMAT_VERSION_KEYED, FORMAT_VERSION_RECORD_CHUNK,
    FORMAT_VERSION_RECORD_REF, FORMAT_VERSION_RECORD_REF_BARE, FORMAT_VERSION_WLOG_CHUNK,
    FORMAT_VERSION_WLOG_REF, FORMAT_VERSION_WLOG_REF_BARE, RecordRef, WLogEntry, WLogRef,
    WLogTarget, decode_event_if, decode_idempotency, decode_numbers, decode_record_chunk,
    decode_wlog_chunk, encode_record_chunk, encode_wlog_chunk, event_crc,
};
pub use datadir::{
    DataDir, DataDirError, Loss, OpenPolicy, OpenReport, SettleError, ensure_retired, find_losses,
    open_data_dir, open_database, plog_end, recorded_partitions, retire_partition, settle_losses,
};
pub use event::{ArgObject, Event, Field, Idempotency, Record, RecordId, RecordKind, WLogOffset};
pub use fence::encode_fenced;
pub use groups::{
    Changes, EXPIRY_MARGIN_MS, Ending, FENCED_POSITION_VERSION, Fence, GROUP_FORMAT_VERSION,
    GROUP_MEMBERS_MAX, GroupError, GroupFull, GroupState, Holder, Hosted, Member,
    SESSION_TIMEOUT_MS_DEFAULT, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN, Seen, StepPlan,
    StoredGroup, plan_step, to_claim,
};
pub use identity::{AcceptedLoss, IDENTITY_FILE, Identity, IdentityError, LossCause};
pub use keys::{
    AppId, CHUNK_EVENTS, KEY_LAYOUT, KEY_LAYOUT_CHUNKS, KEY_LAYOUT_SEGMENTS, LOG_BLOCK_EVENTS,
    PartitionId, RECORD_BLOCK_IDS, RECORD_BUCKET_BITS, Slot,
};
pub use marks::{GATHER_MAX, GroupBegun, MARKS_FILE, Mark, Marks, MarksError, start_mark};
pub use plog::{PLOG_DIR, RETIRED_PAYLOAD, Segments, keeps_segments};
pub use plog_page::{Gap, PLOG_PAGE_ITEMS_MAX, PageItem, PlogPage, StoredItem, retired_ranges};
pub use positions::{
    CONSUMER_NAME_BYTES_MAX, ConsumerName, ConsumerPosition, InvalidConsumerName,
    POSITION_FORMAT_VERSION, PositionError, SetPosition,
};
pub use seqstore::PLogSeqStorage;
pub use store::{
    AppendError, EventStore, InvalidTrustLevel, ReadError, StoredRecords, TrustLevel,
    WLOG_READ_EVENTS_MAX,
};
