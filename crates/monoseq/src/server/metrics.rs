//! The server's Prometheus metrics: the registry and its series, registered once at start, and
//! their refresh from the command processor's statistics when `/metrics` is read.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use monoseq_cp::CommandProcessor;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::config::Store;

/// Commands answered, by their outcome code.
pub(super) type CommandCounters = Family<Vec<(String, String)>, Counter>;

/// A ratio or a duration in seconds.
type FloatGauge = Gauge<f64, AtomicU64>;

pub(super) struct Metrics {
    registry: Registry,
    pub(super) commands: CommandCounters,
    /// The `code="ok"` counter of `commands`, held so that a successful command costs no
    /// label allocation or family lookup.
    pub(super) commands_ok: Counter,
    state: StateGauges,
    /// Reads (and commands) that found corrupt bytes in storage.
    pub(super) corrupted: Counter,
    /// Commands forwarded to the node owning their partition.
    pub(super) forwarded: Counter,
    /// Corrupt places already logged, so each is logged once (bounded).
    pub(super) corrupted_logged: Mutex<HashSet<String>>,
    /// Events each consumer has not processed, per partition (set when `/metrics` is read).
    pub(super) consumer_lag: Family<Vec<(String, String)>, Gauge>,
    /// 1 when more positions are stored than `consumer_lag` reports.
    pub(super) consumer_lag_truncated: Gauge,
    /// The latency histograms.
    pub(super) latency: Latency,
    /// The embedded engine's gauges, when the store has such an engine.
    engine: Option<EngineGauges>,
}

/// Smallest upper bound of the duration histograms' buckets, in seconds (100 µs).
const DURATION_BUCKET_FIRST: f64 = 0.000_1;
/// Duration buckets: each bound twice the one before, 100 µs to about 6.6 s (then `+Inf`).
const DURATION_BUCKETS: u16 = 17;
/// Group-size buckets: 1, 2, 4, ... 2048 commands (then `+Inf`).
const GROUP_SIZE_BUCKETS: u16 = 12;

/// A histogram family by one label.
type HistogramFamily = Family<Vec<(String, String)>, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(
        DURATION_BUCKET_FIRST,
        2.0,
        DURATION_BUCKETS,
    ))
}

/// The latency histograms (Prometheus `_bucket`, `_sum`, `_count` series; `docs/operating.md`).
pub(super) struct Latency {
    /// Commands answered by this node (single ones and each of a batch; refusals included),
    /// by outcome.
    commands: HistogramFamily,
    /// The `outcome="ok"` histogram of `commands`, held (no lookup per command).
    commands_ok: Histogram,
    /// Commands forwarded to their partition's owner, until its answer.
    pub(super) forward: Histogram,
    /// Store reads of a PLog page (for a page read or a tail's catch-up).
    pub(super) page_read: Histogram,
    /// From an event's registration to its live delivery (a hub's hand-off to this node's
    /// tails, or a stream's page read once it had caught up).
    follower_delay: Histogram,
    /// Commands per group written.
    group_commands: Histogram,
    /// A group's append to the store.
    group_write: Histogram,
    /// A group's sync after its append: the store's sync and the raise of its high-water mark.
    group_sync: Histogram,
}

impl Latency {
    fn register(r: &mut Registry) -> Latency {
        let commands = HistogramFamily::new_with_constructor(duration_histogram);
        r.register(
            "command_duration_seconds",
            "Time from a command's arrival to its answer, by outcome code: POST /v1/commands \
             answered by this node, and each command of POST /v1/commands/batch (from the \
             batch's arrival to its answer), refusals included",
            commands.clone(),
        );
        let commands_ok = commands
            .get_or_create(&vec![("outcome".into(), "ok".into())])
            .clone();
        let mut one = |name: &str, help: &str, h: Histogram| {
            r.register(name, help, h.clone());
            h
        };
        Latency {
            commands,
            commands_ok,
            forward: one(
                "forward_duration_seconds",
                "Time to forward a command to its partition's owner and get its answer",
                duration_histogram(),
            ),
            page_read: one(
                "page_read_duration_seconds",
                "Time to read one page of a partition's PLog from the store",
                duration_histogram(),
            ),
            follower_delay: one(
                "follower_delay_seconds",
                "Time from an event's registration (just before its group is written and \
                 acknowledged) to its live delivery: once per event a partition's hub hands \
                 this node's tails (from its writer, its store or its owner), once per stream \
                 for an event a subscription or group member's stream delivers after catching \
                 up (millisecond wall clocks; gaps have no registration and are not counted)",
                duration_histogram(),
            ),
            group_commands: one(
                "group_commands",
                "Commands per group written by a partition's writer",
                Histogram::new(exponential_buckets(1.0, 2.0, GROUP_SIZE_BUCKETS)),
            ),
            group_write: one(
                "group_write_duration_seconds",
                "Time to append a group's events and records to the store (before its sync)",
                duration_histogram(),
            ),
            group_sync: one(
                "group_sync_duration_seconds",
                "Time from a group's append to its durability: the store's sync and the raise \
                 of its high-water mark (one sync may serve groups of several partitions)",
                duration_histogram(),
            ),
        }
    }

    /// One command answered with `outcome` (its code), begun at `began`.
    pub(super) fn command(&self, outcome: &str, began: Instant) {
        let seconds = began.elapsed().as_secs_f64();
        if outcome == "ok" {
            self.commands_ok.observe(seconds);
        } else {
            self.commands
                .get_or_create(&vec![("outcome".into(), outcome.into())])
                .observe(seconds);
        }
    }

    /// An event registered at `registered_at_ms` (Unix milliseconds) handed to the tails now.
    pub(super) fn follower_delivery(&self, registered_at_ms: u64) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let delay = now.saturating_sub(Duration::from_millis(registered_at_ms));
        self.follower_delay.observe(delay.as_secs_f64());
    }

    /// An event of a page delivered live now (read from this node's store or relayed from
    /// the partition's owner).
    pub(super) fn page_delivery(&self, e: &super::consume::PageEvent) {
        use super::consume::PageEvent;
        self.follower_delivery(match e {
            PageEvent::Stored(e) => e.0.registered_at_ms,
            PageEvent::Relayed(e) => e.registered_at_ms,
        });
    }

    /// The events of a page that a subscription's or a group member's reader delivers live
    /// (it had caught up before reading it), those passing its filter.
    pub(super) fn live_page(
        &self,
        entries: &[monoseq_wire::PlogEntryBody<super::consume::PageEvent>],
        filter: &super::filter::Filter,
    ) {
        for entry in entries {
            if let monoseq_wire::PlogEntryBody::Event(e) = entry
                && e.passes(filter)
            {
                self.page_delivery(e);
            }
        }
    }

    /// The observer the command processor tells of every group written.
    pub(super) fn group_observer(&self) -> Arc<dyn monoseq_cp::GroupObserver> {
        Arc::new(GroupHistograms {
            commands: self.group_commands.clone(),
            write: self.group_write.clone(),
            sync: self.group_sync.clone(),
        })
    }
}

/// Observes `f`'s duration into `histogram`.
pub(super) fn timed<T>(histogram: &Histogram, f: impl FnOnce() -> T) -> T {
    let began = Instant::now();
    let out = f();
    histogram.observe(began.elapsed().as_secs_f64());
    out
}

/// The group histograms, as the command processor's observer.
struct GroupHistograms {
    commands: Histogram,
    write: Histogram,
    sync: Histogram,
}

impl monoseq_cp::GroupObserver for GroupHistograms {
    fn group_written(&self, commands: usize, write: Duration, sync: Duration) {
        self.commands.observe(commands as f64);
        self.write.observe(write.as_secs_f64());
        self.sync.observe(sync.as_secs_f64());
    }
}

/// The gauges set from the command processor's statistics when `/metrics` is read.
struct StateGauges {
    backlog: Gauge,
    actualizing: Gauge,
    checkpoint_lag: Gauge,
    cache_hit_ratio: FloatGauge,
    replayed: Gauge,
    actualizations: Gauge,
    actualization_seconds: FloatGauge,
    groups: Gauge,
    rebuilds: Gauge,
    unavailable: Gauge,
    replayed_commands: Gauge,
    /// Partitions this node serves now.
    owned: Gauge,
    /// 1 for each partition whose storage failed fatally (labelled `partition`).
    storage_fatal: Family<Vec<(String, String)>, Gauge>,
}

impl Metrics {
    pub(super) fn new() -> Metrics {
        let mut registry = Registry::with_prefix("monoseq");
        let commands = CommandCounters::default();
        registry.register(
            "commands",
            "Commands answered, by outcome code (ok, busy, ...)",
            commands.clone(),
        );
        let state = StateGauges::register(&mut registry);
        let corrupted = counter(
            &mut registry,
            "corrupted_reads",
            "Reads that found corrupt bytes in storage (answered 500 corrupted)",
        );
        let forwarded = counter(
            &mut registry,
            "forwarded_commands",
            "Commands forwarded to (or redirected to) the node owning their partition",
        );
        let consumer_lag = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "consumer_lag_events",
            format!(
                "Events of a partition's PLog a consumer has not processed (end - 1 - position), \
                 per consumer and partition served by this node; at most {} series",
                super::positions::CONSUMER_LAG_SERIES_MAX
            ),
            consumer_lag.clone(),
        );
        let consumer_lag_truncated = gauge(
            &mut registry,
            "consumer_lag_truncated",
            "1 when more consumer positions are stored than consumer_lag_events reports",
        );
        crate::edge::metrics().register(&mut registry);
        let latency = Latency::register(&mut registry);
        let commands_ok = commands
            .get_or_create(&vec![("code".into(), "ok".into())])
            .clone();
        Metrics {
            registry,
            commands_ok,
            commands,
            state,
            corrupted,
            forwarded,
            corrupted_logged: Mutex::default(),
            consumer_lag,
            consumer_lag_truncated,
            latency,
            engine: None,
        }
    }

    /// Registers the embedded engine's series (`monoseq_engine_*`), for a store that has one.
    pub(super) fn register_engine(&mut self) {
        self.engine = Some(EngineGauges::register(&mut self.registry));
    }

    /// Registers the consumer side's series (the same counters its tails raise).
    pub(super) fn register_follow(&mut self, counts: &super::consume::FollowCounts) {
        let r = &mut self.registry;
        r.register(
            "followers",
            "Live tails (SSE followers) served now",
            counts.followers_gauge.clone(),
        );
        r.register(
            "followers_refused",
            "Live tails refused for the cap (--followers-max), answered 503",
            counts.refused.clone(),
        );
        r.register(
            "followers_cut_slow",
            "Live tails cut with slow_follower for falling behind (--follower-buffer-events)",
            counts.cut_slow.clone(),
        );
        r.register(
            "follower_messages_delivered",
            "Events and gaps sent to live tails",
            counts.delivered.clone(),
        );
    }

    /// Counts one answered command by its outcome code (`ok` has its own held counter).
    pub(super) fn count_command(&self, code: &str) {
        self.commands
            .get_or_create(&vec![("code".into(), code.into())])
            .inc();
    }

    /// Sets the gauges from the command processor's statistics and renders every series as
    /// OpenMetrics text.
    pub(super) fn render(&self, cp: &CommandProcessor<Store>) -> Result<String, std::fmt::Error> {
        self.state.refresh(cp);
        if let (Some(gauges), Some(stats)) = (&self.engine, cp.store().kv().engine_stats()) {
            gauges.set(&stats);
        }
        let mut text = String::new();
        encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let c = Counter::default();
    registry.register(name, help, c.clone());
    c
}

fn gauge_family(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> Family<Vec<(String, String)>, Gauge> {
    let f = Family::default();
    registry.register(name, help, f.clone());
    f
}

fn gauge(registry: &mut Registry, name: &str, help: &str) -> Gauge {
    let g = Gauge::default();
    registry.register(name, help, g.clone());
    g
}

fn float_gauge(registry: &mut Registry, name: &str, help: &str) -> FloatGauge {
    let g = FloatGauge::default();
    registry.register(name, help, g.clone());
    g
}

impl StateGauges {
    fn register(registry: &mut Registry) -> StateGauges {
        let r = registry;
        StateGauges {
            backlog: gauge(
                r,
                "backlog_values",
                "Unflushed sequence values, all partitions",
            ),
            actualizing: gauge(r, "actualizing_partitions", "Partitions actualizing now"),
            checkpoint_lag: gauge(
                r,
                "checkpoint_lag_events",
                "Largest distance between a partition's PLog end and its persisted checkpoint",
            ),
            replayed: gauge(
                r,
                "actualization_replayed_events",
                "Events replayed by actualizations (grows during one: progress)",
            ),
            actualizations: gauge(r, "actualizations", "Completed actualizations"),
            groups: gauge(r, "group_commits", "Group commits written"),
            rebuilds: gauge(
                r,
                "partition_rebuilds",
                "Partitions rebuilt after their sequencer failed, since start",
            ),
            unavailable: gauge(
                r,
                "unavailable_partitions",
                "Partitions not serving now (starting or being rebuilt)",
            ),
            replayed_commands: gauge(
                r,
                "idempotent_replays",
                "Retries answered from the original event of their idempotency key",
            ),
            owned: gauge(r, "owned_partitions", "Partitions this node serves now"),
            storage_fatal: {
                let family = Family::<Vec<(String, String)>, Gauge>::default();
                r.register(
                    "storage_fatal",
                    "1 for a partition whose storage failed fatally (a poisoned engine): it \
                     writes nothing until the server is restarted; /readyz names the failure \
                     (0 for the other partitions served here)",
                    family.clone(),
                );
                family
            },
            cache_hit_ratio: float_gauge(
                r,
                "cache_hit_ratio",
                "Share of transactions whose workspace numbers were in memory",
            ),
            actualization_seconds: float_gauge(
                r,
                "actualization_duration_seconds",
                "Duration of the longest last actualization among partitions",
            ),
        }
    }

    fn refresh(&self, cp: &CommandProcessor<Store>) {
        let s = cp.stats();
        self.backlog.set(s.backlog_values as i64);
        self.actualizing.set(s.actualizing_partitions as i64);
        self.replayed.set(s.replayed_events as i64);
        self.actualizations.set(s.actualizations as i64);
        self.groups.set(s.groups as i64);
        self.rebuilds.set(s.rebuilds as i64);
        self.unavailable.set(s.unavailable_partitions as i64);
        self.replayed_commands.set(s.replayed as i64);
        let owned = cp.owned();
        self.owned.set(owned.len() as i64);
        // 0 for every partition served here, so that the series exists before a failure.
        for partition in owned {
            let _ = self
                .storage_fatal
                .get_or_create(&vec![("partition".into(), partition.to_string())]);
        }
        for (partition, _) in cp.storage_failures() {
            self.storage_fatal
                .get_or_create(&vec![("partition".into(), partition.to_string())])
                .set(1);
        }
        let lookups = s.cache_hits + s.cache_misses;
        self.cache_hit_ratio.set(if lookups == 0 {
            0.0
        } else {
            s.cache_hits as f64 / lookups as f64
        });
        let (mut lag, mut longest) = (0u64, 0u64);
        for p in cp.partition_stats() {
            lag = lag.max(p.next_offset.saturating_sub(p.durable_offset));
            longest = longest.max(p.last_actualization_micros);
        }
        self.checkpoint_lag.set(lag as i64);
        self.actualization_seconds.set(longest as f64 / 1e6);
    }
}

/// The embedded engine's memory and background work (`monoseq_kv::EngineStats`), set when
/// `/metrics` is read.
struct EngineGauges {
    memtable_bytes: Gauge,
    sealed_memtables: Gauge,
    cache_bytes: Gauge,
    cache_capacity_bytes: Gauge,
    tables: Gauge,
    level0_tables: Gauge,
    flushes_pending: Gauge,
    compactions_running: Gauge,
    compactions: Gauge,
    compaction_seconds: FloatGauge,
    journals: Gauge,
    /// Table blocks read, by `block` (data, index, filter) and `from` (cache, file).
    block_reads: Family<Vec<(String, String)>, Gauge>,
    /// Bytes of table blocks read from their files, by `block`.
    block_read_bytes: Family<Vec<(String, String)>, Gauge>,
}

impl EngineGauges {
    fn register(r: &mut Registry) -> EngineGauges {
        EngineGauges {
            memtable_bytes: gauge(
                r,
                "engine_memtable_bytes",
                "Bytes the embedded engine counts in its memtables: the active one and those \
                 sealed and waiting for their flush",
            ),
            sealed_memtables: gauge(
                r,
                "engine_sealed_memtables",
                "Memtables sealed and waiting for their flush to a table file (writes halt at 4)",
            ),
            cache_bytes: gauge(
                r,
                "engine_cache_bytes",
                "Bytes the engine's block cache holds",
            ),
            cache_capacity_bytes: gauge(
                r,
                "engine_cache_capacity_bytes",
                "The most the engine's block cache may hold, in bytes",
            ),
            tables: gauge(r, "engine_tables", "Table files of the embedded engine"),
            level0_tables: gauge(
                r,
                "engine_level0_tables",
                "Table files in level 0: flushed and not compacted yet (writes slow past 20)",
            ),
            flushes_pending: gauge(
                r,
                "engine_flushes_pending",
                "Memtable flushes queued or running",
            ),
            compactions_running: gauge(r, "engine_compactions_running", "Compactions running now"),
            compactions: gauge(
                r,
                "engine_compactions",
                "Compactions completed since the store was opened",
            ),
            compaction_seconds: float_gauge(
                r,
                "engine_compaction_seconds",
                "Time every compaction since the store was opened took, in seconds",
            ),
            journals: gauge(r, "engine_journals", "Journal files of the embedded engine"),
            block_reads: gauge_family(
                r,
                "engine_block_reads",
                "Blocks of the engine's tables read since the store was opened, by block (data, \
                 index, filter) and from (cache: its block cache; file: the table's file)",
            ),
            block_read_bytes: gauge_family(
                r,
                "engine_block_read_bytes",
                "Bytes of table blocks read from their files since the store was opened, by \
                 block (data, index, filter)",
            ),
        }
    }

    fn set(&self, s: &monoseq_kv::EngineStats) {
        let set = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        set(&self.memtable_bytes, s.memtable_bytes);
        set(&self.sealed_memtables, s.sealed_memtables);
        set(&self.cache_bytes, s.cache_bytes);
        set(&self.cache_capacity_bytes, s.cache_capacity_bytes);
        set(&self.tables, s.tables);
        set(&self.level0_tables, s.level0_tables);
        set(&self.flushes_pending, s.flushes_pending);
        set(&self.compactions_running, s.compactions_running);
        set(&self.compactions, s.compactions_completed);
        self.compaction_seconds.set(s.compaction_seconds);
        set(&self.journals, s.journals);
        for (block, reads) in [
            ("data", &s.data_blocks),
            ("index", &s.index_blocks),
            ("filter", &s.filter_blocks),
        ] {
            for (from, n) in [("cache", reads.cached), ("file", reads.from_file)] {
                let labels = vec![("block".into(), block.into()), ("from".into(), from.into())];
                set(&self.block_reads.get_or_create(&labels), n);
            }
            let labels = vec![("block".into(), block.into())];
            set(
                &self.block_read_bytes.get_or_create(&labels),
                reads.file_bytes,
            );
        }
    }
}
