//! `monoseq serve`: the HTTP API over the command processor — command submission, reading
//! events, WLog ranges and records back, liveness, readiness and Prometheus metrics — with a
//! graceful, bounded shutdown. Errors are JSON `{"code", "message"}` with stable codes.
//!
//! `routes.rs` holds the router and its handlers, `batch.rs` the batch endpoint's, `answers.rs` the error answers they share,
//! `positions.rs` the consumer positions' handlers, `metrics.rs` the Prometheus registry, and
//! `startup.rs` `serve`: the listener, opening the storage, joining a cluster and the shutdown.

use std::sync::Arc;

use monoseq_cp::CommandProcessor;

use crate::cluster::Cluster;
use crate::config::Store;
use crate::forward::Forwarder;

mod answers;
mod batch;
mod consume;
mod metrics;
mod positions;
mod routes;
mod startup;

pub use consume::{FollowArgs, FollowLimits};
pub use startup::serve;

/// What every handler reads: the command processor, the cluster, `/v1/info` and the metrics.
pub(crate) struct AppState {
    cp: CommandProcessor<Store>,
    /// This node's cluster membership and its forwarder (PostgreSQL storage only).
    cluster: Option<(Arc<Cluster>, Forwarder)>,
    /// What `GET /v1/info` answers.
    info: monoseq_wire::InfoBody,
    metrics: metrics::Metrics,
    /// Live tails: their hubs, limits and counters.
    follow: Arc<consume::Follow>,
    /// The losses accepted for the store: ranges readers are given as gaps.
    losses: Losses,
}

/// Where the accepted losses are read from (the identity file; on a cluster, the losses its
/// nodes share, which may grow while serving).
pub(crate) type Losses = Arc<dyn Fn() -> Vec<monoseq_store::AcceptedLoss> + Send + Sync>;
