//! Start-up and shutdown of `monoseq serve`: the listener (bound before any storage is
//! touched), the 503 answers while the storage opens, opening it and starting the command
//! processor, joining a cluster on PostgreSQL, serving until a signal, and the bounded
//! shutdown that flushes the sequencers.

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use monoseq_cp::CommandProcessor;

use super::routes::{opening_router, router};
use crate::auth::Security;
use crate::base::shutdown_signal;
use crate::cluster::{Cluster, ClusterArgs};
use crate::config::{Settings, Storage, Store};
use crate::forward::Forwarder;
use crate::storage::open_storage;

/// The server of [`opening_router`], on a second handle of the listening socket, until the
/// storage is open; the real router then takes over the same socket.
struct Opening {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Opening {
    fn serve(
        listener: tokio::net::TcpListener,
        security: &Security,
        limits: crate::edge::EdgeLimits,
    ) -> anyhow::Result<(tokio::net::TcpListener, Opening)> {
        let socket = listener.into_std()?;
        let second = tokio::net::TcpListener::from_std(socket.try_clone()?)?;
        let listener = tokio::net::TcpListener::from_std(socket)?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = opening_router(Arc::clone(&security.auth));
        let until = async {
            let _ = stopped.await;
        };
        // The edge's limits hold while the storage opens too.
        let task = match security.tls.clone() {
            Some(tls) => tokio::spawn(async move {
                let listener = crate::tls::TlsListener::new(second, tls);
                let _ = crate::edge::serve(listener, app, limits, until).await;
            }),
            None => tokio::spawn(async move {
                let _ = crate::edge::serve(second, app, limits, until).await;
            }),
        };
        Ok((listener, Opening { stop, task }))
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// Runs the server until SIGTERM or Ctrl-C, then shuts down within the configured bound.
pub async fn serve(
    mut settings: Settings,
    security: Security,
    cluster_args: ClusterArgs,
) -> anyhow::Result<()> {
    // The address first: a busy port refuses the start before any storage is touched.
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let local = listener.local_addr()?;
    let node = match settings.storage {
        Storage::Postgres(_) => Some(NodeStart::new(&settings, &cluster_args, &security, local)?),
        Storage::Embedded => None,
    };
    let (listener, opening) = Opening::serve(listener, &security, settings.edge)?;
    let running = open_while_answering(&mut settings, node, opening).await?;
    tracing::info!(address = %local, "listening");
    // Printed for scripts and tests that start the server on port 0.
    println!("monoseq listening on {}://{local}", security.scheme());
    security.log_start(local);
    let members = running.cluster.as_ref().map(|(c, _)| Arc::clone(c));
    if let Some((c, forwarder)) = &running.cluster {
        tokio::spawn(Arc::clone(c).probe_peers(forwarder.prober()));
    }
    let Running {
        opened,
        cp,
        cluster,
    } = running;
    let follow = Arc::new(super::consume::Follow::new(settings.follow));
    let losses: super::Losses = match &cluster {
        Some((c, _)) => {
            let c = Arc::clone(c);
            Arc::new(move || c.losses())
        }
        None => {
            let losses = opened.identity.losses.clone();
            Arc::new(move || losses.clone())
        }
    };
    let app = router(
        cp.clone(),
        info(&settings, &opened),
        Arc::clone(&security.auth),
        cluster,
        settings.named_cache(),
        (Arc::clone(&follow), losses),
    )
    .merge(crate::backup::Backups::router(
        crate::backup::Backups::new(&settings, &opened),
        Arc::clone(&security.auth),
    ));
    let superseded = serve_until_stopped(
        listener,
        app,
        &settings,
        security,
        (members.clone(), follow),
    )
    .await?;
    if let Some(cluster) = members {
        // Every partition finished and handed over at once, not when its lease expires.
        cluster.leave().await;
    }
    shut_down(&settings, cp, opened).await?;
    if let Some(why) = superseded {
        anyhow::bail!("{why}");
    }
    Ok(())
}

/// A node whose storage is open, command processor started and cluster joined.
struct Running {
    opened: crate::storage::Opened,
    cp: CommandProcessor<Store>,
    cluster: Option<(Arc<Cluster>, Forwarder)>,
}

/// Opens the storage and joins the cluster while `opening` answers 503; on a failure stops
/// what started and leaves no new, empty data directory behind.
async fn open_while_answering(
    settings: &mut Settings,
    node: Option<NodeStart>,
    opening: Opening,
) -> anyhow::Result<Running> {
    let fresh = settings.storage == Storage::Embedded && !settings.data_dir.exists();
    let (opened, cp, node) = match start(settings, node).await {
        Ok(started) => started,
        Err(e) => {
            opening.stop().await;
            if fresh {
                let _ = std::fs::remove_dir_all(&settings.data_dir);
            }
            return Err(e);
        }
    };
    let cluster = match join_cluster(node, settings, &cp).await {
        Ok(c) => c,
        Err(e) => {
            opening.stop().await;
            cp.shutdown(settings.shutdown_timeout).await;
            return Err(e);
        }
    };
    opening.stop().await;
    Ok(Running {
        opened,
        cp,
        cluster,
    })
}

/// What `GET /v1/info` answers.
fn info(settings: &Settings, opened: &crate::storage::Opened) -> monoseq_wire::InfoBody {
    monoseq_wire::InfoBody {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        partitions: settings.partitions,
        trust_level: match settings.trust {
            monoseq_store::TrustLevel::Level0 => 0,
            monoseq_store::TrustLevel::Level1 => 1,
            _ => 2,
        },
        storage: settings.storage.describe(),
        store_id: opened.identity.store_id.clone(),
        idempotency_window_events: settings.idempotency_window_events,
    }
}

/// Serves `app` until SIGTERM or Ctrl-C, or until another run took this node's name (then
/// returns why); in-flight requests finish first.
async fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    app: Router,
    settings: &Settings,
    security: Security,
    (members, follow): (Option<Arc<Cluster>>, Arc<super::consume::Follow>),
) -> anyhow::Result<Option<String>> {
    let stop = async move {
        match members {
            Some(c) => {
                tokio::select! { () = shutdown_signal() => None, why = c.ended() => Some(why) }
            }
            None => {
                shutdown_signal().await;
                None
            }
        }
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let signal = async move {
        let why = stop.await;
        // Live tails never end by themselves: they end first, so in-flight requests can.
        follow.close();
        let _ = stop_tx.send(why);
    };
    match security.tls {
        Some(tls) => {
            let listener = crate::tls::TlsListener::new(listener, tls);
            crate::edge::serve(listener, app, settings.edge, signal).await?;
        }
        None => {
            let listener = crate::edge::without_delay(listener);
            crate::edge::serve(listener, app, settings.edge, signal).await?;
        }
    }
    Ok(stop_rx.await.ok().flatten())
}

/// After the last request: flushes the sequencers within the configured bound, then writes
/// an embedded engine's journal into its table files.
async fn shut_down(
    settings: &Settings,
    cp: CommandProcessor<Store>,
    opened: crate::storage::Opened,
) -> anyhow::Result<()> {
    tracing::info!(timeout = ?settings.shutdown_timeout, "shutting down: finishing queued commands and flushing sequence numbers");
    let clean = cp.shutdown(settings.shutdown_timeout).await;
    if clean && let Some(kv) = opened.embedded {
        // Bounded as the processor's shutdown is: a storage engine that fails its flush must
        // not keep the process from exiting (the journal still holds everything).
        let flush = tokio::task::spawn_blocking(move || kv.flush_memtables());
        match tokio::time::timeout(settings.shutdown_timeout, flush).await {
            Ok(flushed) => {
                if let Err(e) = flushed? {
                    tracing::warn!(
                        "writing the journal into table files at shutdown failed: {}; the \
                         next start replays the journal",
                        crate::base::chain(&e)
                    );
                }
            }
            Err(_) => tracing::warn!(
                timeout = ?settings.shutdown_timeout,
                "writing the journal into table files at shutdown did not finish in time; \
                 stopping without it: the next start replays the journal"
            ),
        }
    }
    if clean {
        tracing::info!("stopped");
    } else {
        tracing::warn!(
            "shutdown timed out; unflushed numbers are recovered from the PLog at the next start"
        );
    }
    Ok(())
}

/// Opens the storage and starts the command processor on it; on PostgreSQL, with this node's
/// high-water marks (`cluster::marks::prepare`).
async fn start(
    settings: &mut Settings,
    node: Option<NodeStart>,
) -> anyhow::Result<(
    crate::storage::Opened,
    CommandProcessor<Store>,
    Option<NodeReady>,
)> {
    let mut opened = {
        let mut s = settings.clone();
        let opened =
            tokio::task::spawn_blocking(move || open_storage(&mut s).map(|o| (o, s))).await??;
        *settings = opened.1;
        opened.0
    };
    let node = match (node, &opened.postgres) {
        (Some(node), Some(pg)) => {
            let table: Arc<dyn crate::cluster::FencedLeases> = Arc::new(
                crate::cluster::PgLeaseTable::new(Arc::clone(pg), &lease_pool(settings).await?),
            );
            let marks = crate::cluster::marks::prepare(
                &node.cluster,
                &node.forwarder.prober(),
                &table,
                &mut opened,
                settings.accept_loss,
            )
            .await?;
            Some(NodeReady {
                start: node,
                table,
                marks,
            })
        }
        _ => None,
    };
    log_opened(settings, &opened);
    let store = opened.event_store(settings.trust);
    let mut config = settings.cp_config();
    config.retired = (0..opened.identity.partitions)
        .map(|p| opened.identity.retired(p))
        .collect();
    config.marks = opened.marks.clone();
    crate::storage::set_marks_gather(config.marks.as_deref(), settings.marks_gather_us);
    let cp = if opened.postgres.is_some() {
        // Partitions start as their leases are taken (`join_cluster`).
        CommandProcessor::start_unowned(store, config)?
    } else {
        CommandProcessor::start(store, config)?
    };
    Ok((opened, cp, node))
}

/// A second connection pool to the database, for the lease calls alone.
async fn lease_pool(settings: &Settings) -> anyhow::Result<monoseq_pg::PgStore> {
    let Storage::Postgres(url) = settings.storage.clone() else {
        anyhow::bail!("leases are kept only in a PostgreSQL database");
    };
    let options =
        monoseq_pg::PgOptions::default().pool_connections(crate::cluster::LEASE_POOL_CONNECTIONS);
    tokio::task::spawn_blocking(move || monoseq_pg::PgStore::open(&url, options))
        .await?
        .map_err(|e| {
            anyhow::anyhow!(
                "opening the lease calls' connections: {}",
                crate::base::chain(&e)
            )
        })
}

/// What a node of a cluster settles before its storage opens: its settings and how it reaches
/// the other nodes.
struct NodeStart {
    cluster: crate::cluster::ClusterSettings,
    forwarder: Forwarder,
}

impl NodeStart {
    fn new(
        settings: &Settings,
        args: &ClusterArgs,
        security: &Security,
        local: std::net::SocketAddr,
    ) -> anyhow::Result<NodeStart> {
        let cluster = args.resolve(&settings.cluster, settings.listen, local, security.scheme())?;
        let forwarder = Forwarder::new(
            &cluster.node_id,
            cluster.redirect,
            security.auth.outbound_authorization(),
            cluster.peer_ca_cert.as_deref().or(security.tls_cert()),
        )?;
        Ok(NodeStart { cluster, forwarder })
    }
}

/// A node whose storage and marks are open, ready to join.
struct NodeReady {
    start: NodeStart,
    table: Arc<dyn crate::cluster::FencedLeases>,
    marks: Arc<crate::cluster::NodeMarks>,
}

/// On PostgreSQL, joins the nodes sharing the database: takes a fair share of the partitions'
/// leases and forwards commands for the others.
async fn join_cluster(
    node: Option<NodeReady>,
    settings: &Settings,
    cp: &CommandProcessor<Store>,
) -> anyhow::Result<Option<(Arc<Cluster>, Forwarder)>> {
    let Some(NodeReady {
        start: NodeStart { cluster, forwarder },
        table,
        marks,
    }) = node
    else {
        return Ok(None);
    };
    let members = Cluster::join(
        cluster,
        table,
        cp.clone(),
        settings.trust,
        marks,
        forwarder.prober(),
    )
    .await?;
    Ok(Some((members, forwarder)))
}

/// Milliseconds with one decimal, as the other durations of the log.
fn ms(d: std::time::Duration) -> tracing::field::DisplayValue<String> {
    tracing::field::display(format!("{:.1}", d.as_secs_f64() * 1e3))
}

/// One line for the opened store, then one per loss accepted or partition moved past one.
fn log_opened(settings: &Settings, dir: &crate::storage::Opened) {
    let id = &dir.identity;
    let r = &dir.report;
    let recovery_policy = match settings.storage {
        Storage::Embedded => crate::storage::ENGINE_RECOVERY_POLICY,
        Storage::Postgres(_) => crate::storage::POSTGRES_RECOVERY_POLICY,
    };
    tracing::info!(
        storage = %settings.storage.describe(),
        data_dir = %settings.data_dir.display(),
        store_id = %id.store_id,
        partitions = id.partitions,
        key_layout = id.key_layout,
        created = r.created,
        adopted = r.adopted,
        accepted_losses = id.losses.len(),
        engine_open_ms = dir.took.map(|t| ms(t.engine)),
        data_dir_open_ms = dir.took.map(|t| ms(t.data_dir)),
        recovery_policy,
        "store opened"
    );
    if r.identity_rebuilt {
        tracing::warn!("identity file rebuilt from the engine (--accept-loss)");
    }
    if r.marks_rebuilt {
        tracing::warn!("high-water marks rebuilt from the engine (--accept-loss)");
    }
    crate::backup::log_restored(r);
    for loss in &r.accepted {
        tracing::warn!(
            partition = loss.partition,
            lost_events = loss.events(),
            "loss accepted (--accept-loss): {loss}; numbers handed out before it stay retired"
        );
    }
    for p in &r.retired_partitions {
        tracing::info!(
            partition = p,
            next_plog_offset = id.retired(*p).plog + 1,
            "sequence state moved past the accepted loss"
        );
    }
}
