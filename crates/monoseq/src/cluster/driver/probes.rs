//! The readiness probes of the other nodes (`/readyz`, once per renewal interval, faster while
//! a partition they took is starting) and the pull of their high-water marks, and what their
//! answers mean for forwarding.

use super::*;
use monoseq_membership::{Owner, Route};

/// Longest wait for a peer's `/readyz`.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A peer that says a partition it took within the last lease interval is not ready yet is
/// probed again this many times per renewal interval (once per interval otherwise: a partition
/// that stays unready longer, such as one refused against its marks, waits for the next one).
pub(super) const PROBES_PER_RENEWAL_WHILE_STARTING: u32 = 8;

/// A peer's last answer to a readiness probe.
#[derive(Debug, Clone)]
pub(super) struct Probe {
    /// When the probe was sent.
    pub(super) sent: Instant,
    /// What the peer answered.
    pub(super) answer: Readiness,
}

/// Why a partition another node owns cannot be forwarded to it yet, if it cannot. Its owner
/// must have answered a readiness probe within `fresh`, sent after this node first read the
/// lease's current epoch (`since`: an earlier answer says nothing of a partition the owner
/// took after it), and not named the partition in it.
pub(super) fn remote_unready(
    p: u32,
    (node_id, url): (&str, &str),
    probe: Option<&Probe>,
    since: Instant,
    fresh: Duration,
) -> Option<String> {
    match probe {
        Some(probe) if probe.sent.elapsed() >= fresh => Some(format!(
            "its owner {node_id} ({url}) did not answer a readiness probe in the last {} ms",
            fresh.as_millis()
        )),
        None => Some(format!(
            "its owner {node_id} ({url}) did not answer a readiness probe yet"
        )),
        Some(Probe {
            answer: Readiness::TokenRefused(status),
            ..
        }) => Some(format!(
            "its owner {node_id} ({url}) refused this node's token ({status}), so this node \
             cannot forward to it: {NODE_TOKEN_HINT}"
        )),
        Some(probe) if probe.sent < since => Some(format!(
            "its owner {node_id} ({url}) took it lately and did not report it ready yet"
        )),
        Some(Probe {
            answer: Readiness::Unready(unready),
            ..
        }) if unready.contains(&p) => Some(format!("its owner {node_id} ({url}) is starting it")),
        Some(_) => None,
    }
}

/// Whether the prober pulls the peers' marks this round, the last pull at `last`: on every
/// round at the renewal cadence, at most twice a renewal while it probes faster.
pub(super) fn marks_due(last: Option<Instant>, renew: Duration) -> bool {
    last.is_none_or(|at| at.elapsed() >= renew / 2)
}

/// Logs once when the peer at `url` starts refusing this node's token on readiness probes
/// (`before`: its previous answer, `now`: this one), and once when it accepts it again.
pub(super) fn report_token_refusal(url: &str, before: Option<&Readiness>, now: &Readiness) {
    let refused_before = matches!(before, Some(Readiness::TokenRefused(_)));
    match (refused_before, now) {
        (false, Readiness::TokenRefused(status)) => tracing::error!(
            peer = url,
            status,
            "the node at {url} refused this node's token ({status}): this node reports the \
             partitions it owns not ready and cannot forward commands to it; {NODE_TOKEN_HINT}"
        ),
        (true, Readiness::Unready(_)) => {
            tracing::info!(
                peer = url,
                "the node at {url} accepts this node's token again"
            );
        }
        _ => {}
    }
}

impl Cluster {
    /// Probes every other live node's `/readyz` once per renewal interval with `probe`, for
    /// readiness, until the membership ends: at once when a read finds a partition taken by
    /// another node, and more often while a peer says a partition it took lately is starting.
    pub async fn probe_peers(self: Arc<Self>, probe: crate::peers::Prober) {
        let mut wait = Duration::ZERO;
        let mut marks_pulled = None;
        while matches!(*self.life.borrow(), Life::Joining | Life::Member) {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.probe_soon.notified() => {}
            }
            let urls = self.peer_urls();
            let taken = self.taken_lately();
            let mut starting = false;
            for url in &urls {
                let sent = Instant::now();
                let Some(answer) = probe.readiness(url, PROBE_TIMEOUT).await else {
                    continue;
                };
                if let Readiness::Unready(unready) = &answer {
                    starting |= taken
                        .get(url)
                        .is_some_and(|ps| ps.iter().any(|p| unready.contains(p)));
                }
                let now = answer.clone();
                let before = lock(&self.probes).insert(url.clone(), Probe { sent, answer });
                report_token_refusal(url, before.map(|p| p.answer).as_ref(), &now);
            }
            if marks_due(marks_pulled, self.settings.renew) {
                self.pull_marks(&urls).await;
                marks_pulled = Some(Instant::now());
            }
            wait = match starting {
                true => self.settings.renew / PROBES_PER_RENEWAL_WHILE_STARTING,
                false => self.settings.renew,
            };
        }
    }

    /// Peer URL → the partitions it owns ([`Cluster::route`]) under an epoch this node first
    /// read within the last lease interval.
    pub(super) fn taken_lately(&self) -> HashMap<String, Vec<u32>> {
        let view = self.view();
        let mut taken: HashMap<String, Vec<u32>> = HashMap::new();
        for p in 0..self.partitions {
            let lately = view
                .since
                .get(&p)
                .is_some_and(|(_, at)| at.elapsed() < self.settings.lease);
            if let (true, Route::Relay(Owner { url, .. })) = (lately, self.route(p, false, false)) {
                taken.entry(url).or_default().push(p);
            }
        }
        taken
    }

    /// The URLs of the other live nodes, by the last read of the table.
    pub(super) fn peer_urls(&self) -> Vec<String> {
        let view = self.view();
        view.status
            .nodes
            .iter()
            .filter(|n| n.node_id != self.settings.node_id)
            .filter(|n| view.live.contains(&n.node_id))
            .map(|n| n.url.clone())
            .collect()
    }

    /// Pulls the marks of the live nodes at `urls` into this node's.
    pub(super) async fn pull_marks(&self, urls: &[String]) {
        crate::cluster::marks::pull_into(&self.marks, &self.prober, urls).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: (&str, &str) = ("b", "http://b");
    const FRESH: Duration = Duration::from_secs(7);

    fn probe(sent: Instant, unready: &[u32]) -> Probe {
        Probe {
            sent,
            answer: Readiness::Unready(unready.iter().copied().collect()),
        }
    }

    #[test]
    fn a_partition_whose_owner_reported_it_ready_after_taking_it_is_ready() {
        let since = Instant::now();
        let p = probe(since + Duration::from_millis(1), &[3]);
        assert_eq!(remote_unready(0, OWNER, Some(&p), since, FRESH), None);
    }

    #[test]
    fn a_readiness_answer_sent_before_the_owner_took_the_partition_does_not_count() {
        let sent = Instant::now();
        let p = probe(sent, &[]);
        let since = sent + Duration::from_millis(1);
        let why = remote_unready(0, OWNER, Some(&p), since, FRESH).expect("not ready");
        assert!(why.contains("did not report it ready yet"), "{why}");
    }

    #[test]
    fn a_partition_its_owner_names_unready_is_not_ready() {
        let since = Instant::now();
        let p = probe(since, &[0]);
        let why = remote_unready(0, OWNER, Some(&p), since, FRESH).expect("not ready");
        assert!(why.contains("is starting it"), "{why}");
    }

    #[test]
    fn a_partition_whose_owner_refuses_this_nodes_token_is_not_ready_and_says_what_to_do() {
        let since = Instant::now();
        let refused = Probe {
            sent: since + Duration::from_millis(1),
            answer: Readiness::TokenRefused(401),
        };
        let why = remote_unready(0, OWNER, Some(&refused), since, FRESH).expect("not ready");
        assert!(why.contains("refused this node's token (401)"), "{why}");
        assert!(why.contains(NODE_TOKEN_HINT), "{why}");
    }

    #[test]
    fn peers_marks_are_pulled_at_most_twice_a_renewal_while_probes_run_faster() {
        let renew = Duration::from_secs(4);
        assert!(marks_due(None, renew), "the first round pulls");
        assert!(
            !marks_due(Some(Instant::now()), renew),
            "a fast round right after does not"
        );
        let round_ago = Instant::now()
            .checked_sub(renew)
            .expect("a monotonic clock this old");
        assert!(
            marks_due(Some(round_ago), renew),
            "a round a renewal later does"
        );
    }

    #[test]
    fn a_partition_whose_owner_answered_no_probe_lately_is_not_ready() {
        let since = Instant::now();
        let p = probe(since, &[]);
        let stale = Duration::ZERO;
        assert!(remote_unready(0, OWNER, Some(&p), since, stale).is_some());
        assert!(remote_unready(0, OWNER, None, since, FRESH).is_some());
    }
}
