//! monoseq core: the sequencing-transaction state machine that hands out monotonic PLog offsets
//! and per-workspace numbers, over the [`SeqStorage`] trait.

mod params;
mod storage;
mod types;

pub use params::{Params, ParamsBuilder, ParamsError};
pub use storage::{Batcher, ReplayEnd, ReplayedEvent, SeqStorage, StorageError};
pub use types::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};
