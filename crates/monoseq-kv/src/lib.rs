//! monoseq-kv: the ordered key-value storage contract ([`KvStore`]) in the reference design's model
//! — partition key plus clustering columns, ordered range reads, atomic batches with
//! insert-if-absent, compare-and-swap — with its backends and its conformance suite.
//!
//! Backends: [`MemoryStore`] (the reference), [`FjallStore`] (the default embedded engine,
//! also named [`EmbeddedStore`]) and [`RedbStore`] (the measured alternative). The
//! `conformance` feature exposes `conformance`, the suite every backend passes; the
//! `testing` feature exposes `FaultyStore`, a wrapper that fails chosen calls on demand.

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod batch;
#[cfg(any(feature = "fjall", feature = "redb"))]
mod bounds;
#[cfg(feature = "conformance")]
pub mod conformance;
#[cfg(any(feature = "fjall", feature = "redb"))]
mod embedded;
#[cfg(any(feature = "fjall", feature = "redb"))]
mod encoding;
#[cfg(any(feature = "fjall", feature = "redb"))]
mod engine;
mod error;
#[cfg(feature = "testing")]
mod faulty;
#[cfg(feature = "fjall")]
mod fjall_store;
#[cfg(any(feature = "fjall", feature = "redb"))]
mod group_commit;
mod key;
mod memory;
mod options;
#[cfg(feature = "redb")]
mod redb_store;
mod store;

pub use batch::{BatchItem, Op, WriteBatch};
pub use error::{CasError, KvError, OpenError, POISONED, WriteError, chain, is_poisoned};
#[cfg(feature = "testing")]
pub use faulty::{FaultOp, FaultyStore};
#[cfg(feature = "fjall")]
pub use fjall_store::{
    COMPACTION_LEVEL0_TABLES, COMPACTION_TABLE_BYTES, COMPACTION_WORKER_NICE, CopyStats,
    FjallStore, MEMTABLE_BYTES, keyspace_options as fjall_keyspace_options, leveled_compaction,
};
/// The default embedded durable backend (chosen by measurement; see DESIGN.md, "Storage
/// engine").
#[cfg(feature = "fjall")]
pub type EmbeddedStore = FjallStore;
pub use key::{Key, KeyBuf, Oversized, limits};
pub use memory::MemoryStore;
pub use options::{CACHE_BYTES_DEFAULT, Durability, GROUP_COMMIT_DELAY_MAX, Options};
#[cfg(feature = "redb")]
pub use redb_store::RedbStore;
pub use store::{BlockReads, EngineStats, KvStore, Order, Swap, Visitor};
