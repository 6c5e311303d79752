//! Serving, stopping and draining partitions on the command processor as the membership asks:
//! a partition starts only once the peers' marks are pulled and its accepted losses are
//! settled, and a drain finishes the queued commands and flushes before the lease goes.

use super::*;

/// Longest wait for a released partition to finish its queued commands and flush.
pub(super) const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a partition leased here is not served yet.
pub(super) enum Unsettled {
    /// A loss accepted after this process started: held until the node restarts.
    Refused(String),
    /// The storage failed to retire an accepted loss's numbers: retried.
    Failed(String),
}

/// Retries of a failed retirement: 100 ms after the first failure, doubling, at most 5 s apart.
pub(super) const SETTLE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// The one command that continues a partition refused for a loss.
pub const ACCEPT_LOSS_HINT: &str = "restart this node with `monoseq serve --accept-loss` (the \
     loss is recorded in its marks directory and the lost numbers are retired), or restore the \
     database to hold them";

impl Cluster {
    /// Starts serving `p` under `epoch`: pulls every live peer's marks first (so the mark
    /// includes what former owners acknowledged), makes sure numbers retired by an accepted
    /// loss stay retired (a storage failure doing so is retried with backoff while the lease
    /// is held here), then starts the partition with its writes going through the fenced view,
    /// unless the membership stopped it meanwhile.
    pub(super) fn serve(self: &Arc<Self>, p: u32, epoch: u64, previous: Option<&str>) {
        lock(&self.serving).insert(p, epoch);
        lock(&self.refused).remove(&p);
        let me = Arc::clone(self);
        let previous = previous.map(str::to_owned);
        tokio::spawn(async move {
            me.pull_marks(&me.peer_urls()).await;
            let mut failures = 0;
            loop {
                match me.settle_losses(p, epoch).await {
                    Ok(()) => break,
                    Err(Unsettled::Refused(why)) => {
                        tracing::error!(partition = p, epoch, "{why}");
                        me.hold(p, epoch, why);
                        return;
                    }
                    Err(Unsettled::Failed(why)) => {
                        failures += 1;
                        let wait = SETTLE_BACKOFF.delay(failures);
                        tracing::error!(
                            partition = p,
                            epoch,
                            attempt = failures,
                            "{why}; the partition is not served until this succeeds: retrying \
                             in {} ms",
                            wait.as_millis()
                        );
                        if !me.hold(p, epoch, why) {
                            return;
                        }
                        tokio::time::sleep(wait).await;
                    }
                }
            }
            lock(&me.held).remove(&p);
            me.start_serving(p, epoch, previous.as_deref());
        });
    }

    /// Records why `p`, leased here under `epoch`, is not served yet (for `/readyz`); false
    /// when the membership stopped it meanwhile (nothing is recorded then).
    pub(super) fn hold(&self, p: u32, epoch: u64, why: String) -> bool {
        let serving = lock(&self.serving);
        let still = serving.get(&p) == Some(&epoch);
        if still {
            lock(&self.held).insert(p, why);
        }
        still
    }

    /// Numbers of `p` retired by an accepted loss: the command processor must continue above
    /// them (it was started knowing the loss) and the database's stored state must be past
    /// them (the node that accepted the loss retires them, and so does any later owner if the
    /// database lost that write).
    pub(super) async fn settle_losses(&self, p: u32, epoch: u64) -> Result<(), Unsettled> {
        let retired = self.marks.retired(p);
        let known = self
            .cp
            .config()
            .retired
            .get(p as usize)
            .copied()
            .unwrap_or_default();
        if !known.covers(&retired) {
            return Err(Unsettled::Refused(format!(
                "a loss of partition {p} (PLog offsets up to {}) was accepted after this process \
                 started; it does not serve the partition until restarted, so that the numbers \
                 handed out before the loss stay retired: restart this node",
                retired.plog
            )));
        }
        let store = EventStore::new(self.view_of(p, epoch), APP, TrustLevel::Level0);
        let seq = store.seq_storage(PartitionId(p));
        let done = tokio::task::spawn_blocking(move || ensure_retired(seq, p, retired))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| crate::base::chain(&e)));
        match done {
            Ok(true) => {
                tracing::warn!(
                    partition = p,
                    epoch,
                    retired_plog = retired.plog,
                    "moved the partition's next PLog offset past its accepted loss"
                );
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(Unsettled::Failed(format!(
                "retiring the numbers of partition {p}'s accepted loss failed: {e}"
            ))),
        }
    }

    pub(super) fn view_of(&self, p: u32, epoch: u64) -> Store {
        self.table.fenced(p, epoch, &self.settings.node_id)
    }

    pub(super) fn start_serving(self: &Arc<Self>, p: u32, epoch: u64, previous: Option<&str>) {
        let serving = lock(&self.serving);
        if serving.get(&p) != Some(&epoch) {
            return;
        }
        let store = EventStore::new(self.view_of(p, epoch), APP, self.trust);
        if let Err(e) = self.cp.acquire(p, store) {
            tracing::error!(
                partition = p,
                "starting the partition failed: {}",
                crate::base::chain(&e)
            );
            return;
        }
        drop(serving);
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
    pub(super) fn stop_serving(self: &Arc<Self>, p: u32) {
        self.forget(p);
        let cp = self.cp.clone();
        tokio::spawn(async move {
            if !cp.release(p, RELEASE_TIMEOUT).await {
                tracing::warn!(partition = p, "the partition did not stop in time");
            }
        });
    }

    /// A planned move: finishes `p`'s queued commands, flushes, then reports (the lease is
    /// released for the next owner).
    pub(super) fn drain(
        self: &Arc<Self>,
        p: u32,
        epoch: u64,
        to: Option<String>,
        done: mpsc::Sender<Done>,
    ) {
        match &to {
            Some(to) => tracing::info!(
                partition = p,
                epoch,
                to = %to,
                "handing the partition over to balance the nodes"
            ),
            None => tracing::info!(partition = p, epoch, "handing the partition back: leaving"),
        }
        self.forget(p);
        let cp = self.cp.clone();
        tokio::spawn(async move {
            let ok = cp.release(p, RELEASE_TIMEOUT).await;
            if !ok {
                tracing::warn!(
                    partition = p,
                    "the partition did not stop in time; its lease is left to expire"
                );
            }
            let _ = done.send(Done::Drained(p, epoch, ok)).await;
        });
    }

    /// `p` is no longer to be served here: a pending start of it is dropped.
    pub(super) fn forget(&self, p: u32) {
        lock(&self.serving).remove(&p);
        lock(&self.held).remove(&p);
    }
}
