//! `monoseq serve`: the HTTP API over the command processor — command submission, reading
//! events, WLog ranges and records back, liveness, readiness and Prometheus metrics — with a
//! graceful, bounded shutdown. Errors are JSON `{"code", "message"}` with stable codes.
//!
//! `routes.rs` holds the router and its handlers, `batch.rs` the batch endpoint's, `answers.rs` the error answers they share,
//! `positions.rs` the consumer positions' handlers, `metrics.rs` the Prometheus registry, and
//! `startup.rs` `serve`: the listener, opening the storage, joining a cluster and the shutdown.

use std::sync::Arc;

use clap::Args;
use monoseq_cp::CommandProcessor;

use crate::cluster::Cluster;
use crate::config::{Settings, Store};
use crate::forward::Forwarder;

mod answers;
mod batch;
mod consume;
mod filter;
mod groups;
mod metrics;
mod place;
mod positions;
mod routes;
mod startup;
mod stream;
mod ui;

pub use consume::FollowArgs;
pub use startup::serve;

/// Every flag of `serve`, group by group; a new group is one more flattened field.
#[derive(Debug, Clone, Default, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub storage: crate::config::StorageArgs,
    #[command(flatten)]
    pub store: crate::config::StoreArgs,
    #[command(flatten)]
    pub processor: crate::config::ProcessorArgs,
    #[command(flatten)]
    pub listen: crate::config::ListenArgs,
    #[command(flatten)]
    pub cluster: crate::cluster::ClusterArgs,
    #[command(flatten)]
    pub security: crate::auth::SecurityArgs,
    #[command(flatten)]
    pub edge: crate::edge::EdgeArgs,
    #[command(flatten)]
    pub restore: crate::backup::RestoreArgs,
    #[command(flatten)]
    pub follow: FollowArgs,
    #[command(flatten)]
    pub backup: crate::backup::BackupRootArgs,
}

impl ServeArgs {
    /// Merges flags/environment over the file over the defaults.
    pub fn resolve(&self) -> anyhow::Result<Settings> {
        let mut settings =
            crate::config::resolve(&self.storage, &self.store, &self.processor, &self.listen)?;
        settings.edge = self.edge.resolve(&settings.edge_file)?;
        settings.restore = self.restore.resolve();
        settings.follow = self.follow.resolve()?;
        let root = self
            .backup
            .backup_root
            .clone()
            .or(settings.backup_root.take());
        settings.backup_root = crate::backup::resolve_root(root.as_deref(), &settings)?;
        Ok(settings)
    }
}

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
    /// The consumer groups whose members this node hosts.
    groups: groups::Groups,
}

/// Where the accepted losses are read from (the identity file; on a cluster, the losses its
/// nodes share, which may grow while serving).
pub(crate) type Losses = Arc<dyn Fn() -> Vec<monoseq_store::AcceptedLoss> + Send + Sync>;
