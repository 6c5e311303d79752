//! monoseq event store: the versioned event encoding, the built-in sequences, the PLog, WLog
//! and records tables on the key-value contract, and the PLog-backed sequence storage the
//! sequencer runs on.

mod builtin;
mod codec;
mod event;

pub use builtin::{
    BUILT_IN_SEQUENCES, BuiltInSequence, CRECORD_ID_SEQUENCE, OWRECORD_ID_SEQUENCE,
    PLOG_OFFSET_SEQUENCE, WLOG_OFFSET_SEQUENCE, built_in_initial, built_in_params,
    workspace_sequences,
};
pub use codec::{
    ARG_DEPTH_MAX, DecodeError, EVENT_BYTES_MAX, EncodeError, EventHead, FORMAT_VERSION,
    decode_numbers,
};
pub use event::{ArgObject, Event, Field, Record, RecordId, RecordKind, WLogOffset};
