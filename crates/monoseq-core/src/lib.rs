//! monoseq core: the sequencing-transaction state machine that hands out monotonic PLog offsets
//! and per-workspace numbers for one partition, over the [`SeqStorage`] trait.
//!
//! A [`Sequencer`] answers [`Sequencer::start`] with a [`Transaction`] carrying the PLog offset
//! of the next event (or [`Busy`]); [`Transaction::next`] hands out numbers;
//! [`Transaction::flush`] commits once the event is durable; [`Transaction::actualize`] (or
//! dropping the transaction) rebuilds state from the PLog. A background [`Worker`] persists
//! committed numbers with their checkpoint and replays the PLog tail after the checkpoint.
//!
//! Features: `tokio` adds the driver (`Runtime`, `Sequencer::new`) that steps the workers of
//! many sequencers on one shared tokio runtime; `testing` adds `mem::MemSeqStorage`, the
//! in-memory reference storage with fault hooks; `conformance` adds `conformance`, the suite
//! every [`SeqStorage`] passes. Without features the crate is the state machine alone,
//! stepped by hand through [`Sequencer::new_manual`] and [`Worker::step`].

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(feature = "tokio")]
mod driver;
#[cfg(feature = "testing")]
pub mod mem;
mod params;
mod sequencer;
mod shared;
mod storage;
mod types;
mod wait;
mod worker;
mod ws_numbers;
#[cfg(feature = "testing")]
mod ws_table;

#[cfg(feature = "tokio")]
pub use driver::{BLOCKING_THREADS_DEFAULT, Runtime};
pub use params::{
    BACKLOG_VALUES_MAX_DEFAULT, BATCHER_DELAY_DEFAULT, CACHE_WORKSPACES_MAX_DEFAULT,
    KIND_SEQUENCES_MAX, Params, ParamsBuilder, ParamsError, REPLAY_VALUES_MAX_DEFAULT,
};
pub use sequencer::{
    Busy, CacheStats, NextError, Sequencer, SequencerHandle, SequencerStats, ShutdownReport, Start,
    StartError, Transaction,
};
pub use shared::{PoisonReason, Status};
pub use storage::{
    Batcher, Claim, Fence, Generation, ReplayEnd, ReplayedEvent, SeqStorage, StorageError,
    StorageErrorKind, check_out_len, read_numbers_by_workspace,
};
pub use types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};
pub use worker::{Step, Worker};
