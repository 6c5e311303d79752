//! The consumer side of the log over HTTP: ordered page reads of a partition's PLog (with a
//! long-poll form), and live tails of a partition or a workspace as Server-Sent Events.
//!
//! Nothing a reader gets is at or beyond its partition's end (`CommandProcessor::plog_end`):
//! every event delivered is durable and final. A tail first sends what is stored from its
//! offset, then what its partition's [`Hub`] hands it: one hub per followed partition on this
//! node reads each new group once, when the partition's writer signals its new end, and
//! encodes each event's JSON once for every follower. A hub's buffer is bounded; a follower
//! that falls behind it is cut with a `slow_follower` message naming where to resume. On a
//! node that does not own the partition, page reads are relayed from the owner and the hub
//! long-polls the owner's page read, so followers there see the owner's end.
//!
//! By concern: `params` (what a read asks), `pages` (page reads, here or relayed), `hub`,
//! `tail` (one tail, of a PLog or a WLog), `sse` (the tails' endpoints and answer), `error`
//! (every refusal, answered in one place). This file holds the flags and the node's state.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use monoseq_wire::WAIT_MS_MAX;
use tokio::sync::watch;

use crate::config::{FOLLOWER_HEARTBEAT_MS_DEFAULT, FollowLimits};

mod error;
mod hub;
mod pages;
mod params;
mod sse;
mod tail;

use hub::Hub;

pub(super) use error::ConsumeError;
pub(super) use hub::{Frame, subscribe};
pub(super) use pages::{
    PageEvent, known_end, page, page_then, partition_end, read_partition, wait_for_plog,
    wlog_end_below,
};
pub(super) use sse::{Slot, stream_partition, stream_wlog, take_slot};

/// Largest `--follower-buffer-events`.
const FOLLOWER_BUFFER_EVENTS_MAX: usize = 1 << 20;
/// What an event's JSON is sized for when a buffer is reserved for it (it grows past).
pub(super) const EVENT_JSON_BYTES: usize = 512;
/// Longest `--follower-batch-ms`: a second of latency is as much as a live tail should add.
const FOLLOWER_BATCH_MS_MAX: u64 = 1_000;
/// Largest offset a read starts from (no log reaches near it; the store's block arithmetic
/// must not overflow).
pub(super) const OFFSET_READ_MAX: u64 = u64::MAX >> 1;

/// The `serve` flags of the consumer side.
#[derive(Debug, Clone, Default, Args)]
pub struct FollowArgs {
    /// Most live tails (SSE followers) this node serves at once; one more is answered 503
    /// with `Retry-After` [default: 1024]
    #[arg(long, env = "MONOSEQ_FOLLOWERS_MAX", value_name = "COUNT")]
    pub followers_max: Option<usize>,
    /// Events a followed partition keeps in memory for its followers on this node; a follower
    /// that falls further behind is cut with a `slow_follower` message and resumes from its
    /// offset. Memory is this many events per followed partition, whatever the follower count
    /// [default: 4096]
    #[arg(long, env = "MONOSEQ_FOLLOWER_BUFFER_EVENTS", value_name = "EVENTS")]
    pub follower_buffer_events: Option<usize>,
    /// Interval of a tail's heartbeat message while no event arrives [default: 5000]
    #[arg(long, env = "MONOSEQ_FOLLOWER_HEARTBEAT_MS", value_name = "MS")]
    pub follower_heartbeat_ms: Option<u64>,
    /// Hands a followed partition's new events to its followers at most every MS
    /// milliseconds: fewer and larger writes to each follower, so less CPU taken from the
    /// writers, for up to MS more latency; 0 hands them out as soon as they are durable
    /// (paced only past 50 followers of one partition) [default: 0]
    #[arg(long, env = "MONOSEQ_FOLLOWER_BATCH_MS", value_name = "MS")]
    pub follower_batch_ms: Option<u64>,
}

impl FollowArgs {
    /// The limits these flags give.
    ///
    /// # Errors
    ///
    /// A flag out of its range, named with the range.
    pub fn resolve(&self) -> anyhow::Result<FollowLimits> {
        let d = FollowLimits::default();
        let followers_max = self.followers_max.unwrap_or(d.followers_max);
        let buffer_events = self.follower_buffer_events.unwrap_or(d.buffer_events);
        let heartbeat_ms = self
            .follower_heartbeat_ms
            .unwrap_or(FOLLOWER_HEARTBEAT_MS_DEFAULT);
        anyhow::ensure!(
            followers_max >= 1,
            "--followers-max is at least 1 (got {followers_max})"
        );
        anyhow::ensure!(
            (1..=FOLLOWER_BUFFER_EVENTS_MAX).contains(&buffer_events),
            "--follower-buffer-events is 1 to {FOLLOWER_BUFFER_EVENTS_MAX} (got {buffer_events})"
        );
        anyhow::ensure!(
            (1..=WAIT_MS_MAX).contains(&heartbeat_ms),
            "--follower-heartbeat-ms is 1 to {WAIT_MS_MAX} (got {heartbeat_ms})"
        );
        let batch_ms = self.follower_batch_ms.unwrap_or(0);
        anyhow::ensure!(
            batch_ms <= FOLLOWER_BATCH_MS_MAX,
            "--follower-batch-ms is 0 to {FOLLOWER_BATCH_MS_MAX} (got {batch_ms})"
        );
        Ok(FollowLimits {
            followers_max,
            buffer_events,
            heartbeat: Duration::from_millis(heartbeat_ms),
            batch: Duration::from_millis(batch_ms),
        })
    }
}

/// Counters of the consumer side, for `/metrics` (registered by `Metrics::register_follow`).
#[derive(Debug, Default)]
pub(crate) struct FollowCounts {
    /// Tails being served now (the cap's count).
    pub(crate) followers: AtomicUsize,
    /// The same, as the `followers` gauge.
    pub(crate) followers_gauge: prometheus_client::metrics::gauge::Gauge,
    /// Tails cut for falling behind.
    pub(crate) cut_slow: prometheus_client::metrics::counter::Counter,
    /// Tails refused for the cap.
    pub(crate) refused: prometheus_client::metrics::counter::Counter,
    /// Events and gaps delivered to tails.
    pub(crate) delivered: prometheus_client::metrics::counter::Counter,
}

/// The consumer side of this node: its limits, its hubs and its counters.
pub(crate) struct Follow {
    limits: FollowLimits,
    hubs: Mutex<HashMap<u32, Arc<Hub>>>,
    pub(crate) counts: FollowCounts,
    /// Set when the server stops: every tail ends.
    closing: watch::Sender<bool>,
}

impl Follow {
    /// A receiver that sees `true` once the server stops.
    pub(super) fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// The limits of live tails.
    pub(super) fn limits(&self) -> &FollowLimits {
        &self.limits
    }

    pub(crate) fn new(limits: FollowLimits) -> Follow {
        Follow {
            limits,
            hubs: Mutex::default(),
            counts: FollowCounts::default(),
            closing: watch::Sender::new(false),
        }
    }

    /// Ends every tail (the server stops; clients resume elsewhere or later).
    pub(crate) fn close(&self) {
        self.closing.send_replace(true);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Hub>>> {
        self.hubs.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_follower_batch_interval_is_zero_unless_asked_and_refused_past_a_second() {
        let limits = FollowArgs::default().resolve().unwrap();
        assert_eq!(limits.batch, Duration::ZERO);
        let asked = FollowArgs {
            follower_batch_ms: Some(FOLLOWER_BATCH_MS_MAX),
            ..FollowArgs::default()
        };
        assert_eq!(asked.resolve().unwrap().batch, Duration::from_secs(1));
        let too_long = FollowArgs {
            follower_batch_ms: Some(FOLLOWER_BATCH_MS_MAX + 1),
            ..FollowArgs::default()
        };
        let refused = too_long.resolve().unwrap_err().to_string();
        assert_eq!(refused, "--follower-batch-ms is 0 to 1000 (got 1001)");
    }
}
