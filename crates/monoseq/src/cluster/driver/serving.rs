//! The I/O of serving, stopping and draining partitions on the command processor, as the
//! node machine (`monoseq_membership::NodeMachine`) asks: pulling the peers' marks, settling a
//! partition's accepted losses, starting it with its writes fenced, releasing it, and the log
//! lines and `/readyz` reasons of each. The order and the retries are the machine's; each
//! answer goes back to it through the driver's queue.

use super::*;

/// The one command that continues a partition refused for a loss.
pub const ACCEPT_LOSS_HINT: &str = "restart this node with `monoseq serve --accept-loss` (the \
     loss is recorded in its marks directory and the lost numbers are retired), or restore the \
     database to hold them";

impl Cluster {
    /// Carries out one serving action of the node machine at `now` (the driver's clock); what
    /// comes of the I/O goes back to the machine through `done`.
    pub(super) fn carry_out(
        self: &Arc<Self>,
        action: NodeAction,
        now: u64,
        done: &mpsc::Sender<Done>,
    ) {
        match action {
            NodeAction::PullMarks { partition, epoch } => {
                lock(&self.refused).remove(&partition);
                let (me, done) = (Arc::clone(self), done.clone());
                tokio::spawn(async move {
                    me.pull_marks(&me.peer_urls()).await;
                    let _ = done.send(Done::Pulled(partition, epoch)).await;
                });
            }
            NodeAction::Settle { partition, epoch } => {
                let (me, done) = (Arc::clone(self), done.clone());
                tokio::spawn(async move {
                    let settled = me.settle_losses(partition, epoch).await;
                    let _ = done.send(Done::Settled(partition, epoch, settled)).await;
                });
            }
            NodeAction::Start {
                partition,
                epoch,
                previous,
            } => self.start_serving(partition, epoch, previous.as_deref()),
            NodeAction::Stop { partition } => self.stop_serving(partition),
            NodeAction::Drain {
                partition,
                epoch,
                deadline,
            } => self.release_drained(partition, epoch, deadline.saturating_sub(now), done),
            NodeAction::Drained {
                partition,
                ok: false,
                ..
            } => tracing::warn!(
                partition,
                "the partition did not stop in time; its lease is left to expire"
            ),
            NodeAction::Hold {
                partition,
                epoch,
                why,
                retry,
            } => {
                log_hold(partition, epoch, &why, retry);
                lock(&self.held).insert(partition, why);
            }
            NodeAction::Unhold { partition } => {
                lock(&self.held).remove(&partition);
            }
            // The membership's own actions are the driver's (`Cluster::perform`).
            _ => {}
        }
    }

    /// The settle rule (`monoseq_store::settle_losses`) for `p` under `epoch`: numbers retired
    /// by an accepted loss must be known to the command processor (it continues above them)
    /// and retired in the database (by any owner, if the database lost that write).
    async fn settle_losses(&self, p: u32, epoch: u64) -> Settled {
        let retired = self.marks.retired(p);
        let known = self
            .cp
            .config()
            .retired
            .get(p as usize)
            .copied()
            .unwrap_or_default();
        let store = EventStore::new(self.view_of(p, epoch), APP, TrustLevel::Level0);
        let seq = store.seq_storage(PartitionId(p));
        let done = tokio::task::spawn_blocking(move || settle_losses(seq, p, known, retired)).await;
        match done {
            Ok(Ok(true)) => {
                tracing::warn!(
                    partition = p,
                    epoch,
                    retired_plog = retired.plog,
                    "moved the partition's next PLog offset past its accepted loss"
                );
                Settled::Done
            }
            Ok(Ok(false)) => Settled::Done,
            Ok(Err(e)) if e.needs_restart() => Settled::Refused(e.to_string()),
            Ok(Err(e)) => Settled::Failed(crate::base::chain(&e)),
            Err(e) => Settled::Failed(format!(
                "retiring the numbers of partition {p}'s accepted loss failed: {e}"
            )),
        }
    }

    pub(super) fn view_of(&self, p: u32, epoch: u64) -> Store {
        self.table.fenced(p, epoch, &self.settings.node_id)
    }

    /// Starts `p` on the command processor, its writes going through the view fenced with
    /// `epoch` (the machine asks only while the membership still gives it `p` under `epoch`).
    fn start_serving(&self, p: u32, epoch: u64, previous: Option<&str>) {
        let store = EventStore::new(self.view_of(p, epoch), APP, self.trust);
        if let Err(e) = self.cp.acquire(p, store) {
            tracing::error!(
                partition = p,
                "starting the partition failed: {}",
                crate::base::chain(&e)
            );
            return;
        }
        match previous {
            Some(prev) if prev == self.settings.node_id => tracing::info!(
                partition = p,
                epoch,
                "took back the partition an earlier run of this node held; actualizing it"
            ),
            Some(prev) => tracing::info!(
                partition = p,
                epoch,
                from = prev,
                "took the partition over; actualizing it"
            ),
            None => tracing::info!(
                partition = p,
                epoch,
                "took the partition's lease; actualizing it"
            ),
        }
    }

    /// Stops serving `p` here at once (commands for it are answered "not the owner" from now
    /// on); its queued commands finish in the background.
    fn stop_serving(&self, p: u32) {
        let cp = self.cp.clone();
        tokio::spawn(async move {
            if !cp.release(p, Duration::from_millis(DRAIN_MS_MAX)).await {
                tracing::warn!(partition = p, "the partition did not stop in time");
            }
        });
    }

    /// A drain: `p` takes no more commands, finishes its queued ones and flushes; the machine
    /// hears when it did within `wait_ms` (past it, the machine reports it not drained).
    fn release_drained(&self, p: u32, epoch: u64, wait_ms: u64, done: &mpsc::Sender<Done>) {
        let (cp, done) = (self.cp.clone(), done.clone());
        tokio::spawn(async move {
            if cp.release(p, Duration::from_millis(wait_ms)).await {
                let _ = done.send(Done::Idle(p, epoch)).await;
            }
        });
    }
}

/// The error of a partition leased here but not served: a loss accepted after this process
/// started, or a retirement that failed and is retried.
fn log_hold(partition: u32, epoch: u64, why: &str, retry: Option<Retry>) {
    match retry {
        None => tracing::error!(partition, epoch, "{why}"),
        Some(retry) => tracing::error!(
            partition,
            epoch,
            attempt = retry.attempt,
            "{why}; the partition is not served until this succeeds: retrying in {} ms",
            retry.in_ms
        ),
    }
}
