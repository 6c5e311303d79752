//! `monoseq serve`: the HTTP API over the command processor — command submission, reading
//! events, WLog ranges and records back, liveness, readiness and Prometheus metrics — with a
//! graceful, bounded shutdown. Errors are JSON `{"code", "message"}` with stable codes.
//!
//! `routes.rs` holds the router and its handlers, `batch.rs` the batch endpoint's, `answers.rs` the error answers they share,
//! `metrics.rs` the Prometheus registry, and `startup.rs` `serve`: the listener, opening the
//! storage, joining a cluster and the shutdown.

use std::sync::Arc;

use monoseq_cp::CommandProcessor;

use crate::cluster::Cluster;
use crate::config::Store;
use crate::forward::Forwarder;

mod answers;
mod batch;
mod metrics;
mod routes;
mod startup;

pub use startup::serve;

/// What every handler reads: the command processor, the cluster, `/v1/info` and the metrics.
pub(crate) struct AppState {
    cp: CommandProcessor<Store>,
    /// This node's cluster membership and its forwarder (PostgreSQL storage only).
    cluster: Option<(Arc<Cluster>, Forwarder)>,
    /// What `GET /v1/info` answers.
    info: serde_json::Value,
    metrics: metrics::Metrics,
}
