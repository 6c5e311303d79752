//! monoseq-named: named sequences in the style of the reference design (docs/invariants.md) —
//! counters addressed by scope and name, shared by many processes, made atomic by conditional
//! writes instead of locks. Owns the operations ([`Sequences`]), the addresses and key layout
//! ([`Address`], [`Scope`]), the stored format, the backend contract ([`Backend`]) with its S3 and
//! key-value backends, and the reservation mode ([`Reserver`], over any [`BlockSource`]) and the
//! server-side number cache ([`CacheOptions`]). The domain only: the HTTP API is the edge crate
//! `monoseq-named-http`, its client is in `monoseq-client`, the command line is the `monoseq`
//! binary's. The backends are features (`kv`, `s3`, both default); without them a client gets
//! the domain types and no storage.
//!
//! # Example
//!
//! ```
//! use monoseq_kv::MemoryStore;
//! use monoseq_named::{KvBackend, NextOptions, Sequences};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
//! let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
//! let counter = "orders/counter".parse()?;
//! assert_eq!(sequences.next(&counter, &NextOptions::new()).await?, 1); // stores 2
//! assert_eq!(sequences.get(&counter).await?, Some(2));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # })?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod address;
mod backend;
mod cache;
mod combine;
mod error;
#[cfg(feature = "kv")]
mod kv;
mod record;
mod reserve;
#[cfg(feature = "s3")]
mod s3;
mod sequences;

pub use address::{Address, NAME_BYTES_MAX, PREFIX_BYTES_MAX, SCOPE_SEGMENT_BYTES_MAX, Scope};
pub use backend::{Backend, BoxFuture, ConditionalWrite, Object, Version, WriteFailure};
pub use cache::{CACHE_BLOCKS_MAX_DEFAULT, CacheOptions};
pub use combine::{COMBINE_WRITES_MAX, DURABLE_WRITES_IN_FLIGHT};
pub use error::{AddressError, DeleteError, NextError, ReadError, SetError, StorageError};
#[cfg(feature = "kv")]
pub use kv::{KV_TAG, KvBackend};
pub use record::{METADATA_BYTES_MAX, Metadata, SequenceData, VALUE_MAX};
pub use reserve::{BlockSource, ReserveOptions, Reserver};
#[cfg(feature = "s3")]
pub use s3::{S3_REQUEST_TIMEOUT, S3_RETRIES_MAX, S3Backend, S3Config};
pub use sequences::{
    BACKOFF_FIRST, BACKOFF_MAX, COMBINE_CALLS_MAX, LANE_CALLS_MAX, NextOptions, Sequences,
    SetOptions, TIMEOUT_DEFAULT, TIMEOUT_MAX,
};
