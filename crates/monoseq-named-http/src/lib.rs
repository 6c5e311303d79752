//! monoseq-named-http: the server side of named sequences' HTTP API. [`router`] serves the
//! `/v1/sequences/…` API over a [`monoseq_named::Sequences`]. Owns the route scheme, the
//! checking of request bodies (their types are `monoseq-wire`'s, shared with the client in
//! `monoseq-client`), and each domain error's stable code ([`Coded`], a
//! `monoseq_wire::ErrorCode`) and HTTP status; `monoseq-named` knows nothing of HTTP.
//!
//! # Example
//!
//! ```no_run
//! use monoseq_kv::MemoryStore;
//! use monoseq_named::{KvBackend, Sequences};
//! use monoseq_named_http::router;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let sequences = Sequences::new(KvBackend::new(MemoryStore::new()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, router(sequences)).await?; // `monoseq_client::SequencesClient` calls it
//! # Ok(())
//! # }
//! ```

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod router;

mod codes;

pub use codes::Coded;
pub use router::{BODY_BYTES_MAX, router};
