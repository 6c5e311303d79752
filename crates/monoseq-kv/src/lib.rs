//! monoseq-kv: the ordered key-value storage contract ([`KvStore`]) in the seed's model —
//! partition key plus clustering columns, ordered range reads, atomic batches with
//! insert-if-absent, compare-and-swap — with its backends and its conformance suite.

mod batch;
mod error;
mod key;
mod memory;
mod store;

pub use batch::{BatchItem, Op, WriteBatch};
pub use error::{CasError, KvError, OpenError, Oversized, WriteError};
pub use key::{Key, KeyBuf, limits};
pub use memory::MemoryStore;
pub use store::{KvStore, Order, Visitor};
