//! The edge's metrics and the logging of its limits: which limit tripped, how often, and one
//! log line per limit per [`TRIP_LOG_INTERVAL`].

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::{EdgeLimits, TRIP_LOG_INTERVAL};
use crate::base::LogThrottle;

/// Which limit tripped (the `limit` label of the metric, and the setting's name).
#[derive(Debug, Clone, Copy)]
pub(super) enum Limit {
    HeaderReadTimeout,
    BodyReadTimeout,
    IdleTimeout,
    ConnectionsMax,
    RequestsMax,
}

impl Limit {
    const ALL: [Limit; 5] = [
        Limit::HeaderReadTimeout,
        Limit::BodyReadTimeout,
        Limit::IdleTimeout,
        Limit::ConnectionsMax,
        Limit::RequestsMax,
    ];

    fn name(self) -> &'static str {
        match self {
            Limit::HeaderReadTimeout => "header_read_timeout",
            Limit::BodyReadTimeout => "body_read_timeout",
            Limit::IdleTimeout => "idle_timeout",
            Limit::ConnectionsMax => "connections_max",
            Limit::RequestsMax => "requests_max",
        }
    }
}

/// The edge's metrics: trips by limit, open connections, requests in flight. One set per
/// process (one server per process), registered with the server's metrics.
pub struct EdgeMetrics {
    trips: Family<Vec<(String, String)>, Counter>,
    pub(super) connections: Gauge,
    pub(super) requests: Gauge,
    /// Per limit: its trips' log lines, at most one per [`TRIP_LOG_INTERVAL`].
    logged: [LogThrottle; 5],
}

/// The process's edge metrics.
pub fn metrics() -> &'static EdgeMetrics {
    static METRICS: std::sync::OnceLock<EdgeMetrics> = std::sync::OnceLock::new();
    METRICS.get_or_init(|| {
        let trips = Family::<Vec<(String, String)>, Counter>::default();
        for limit in Limit::ALL {
            // Every label present from the start: a dashboard sees 0, not nothing.
            let _ = trips.get_or_create(&vec![("limit".into(), limit.name().into())]);
        }
        EdgeMetrics {
            trips,
            connections: Gauge::default(),
            requests: Gauge::default(),
            logged: [const { LogThrottle::new(TRIP_LOG_INTERVAL) }; 5],
        }
    })
}

impl EdgeMetrics {
    /// Registers the edge's metrics with the server's.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "edge_limit_trips",
            "Connections or requests cut or refused by an edge limit, by limit",
            self.trips.clone(),
        );
        registry.register(
            "edge_open_connections",
            "Connections being served now",
            self.connections.clone(),
        );
        registry.register(
            "edge_requests_in_flight",
            "Requests being answered now",
            self.requests.clone(),
        );
    }

    pub(super) fn trip(&self, limit: Limit, limits: &EdgeLimits) {
        self.trips
            .get_or_create(&vec![("limit".into(), limit.name().into())])
            .inc();
        let Some(unlogged) = self.logged[limit as usize].note() else {
            return;
        };
        let (setting, value) = match limit {
            Limit::HeaderReadTimeout => {
                ("--header-read-timeout-ms", ms(limits.header_read_timeout))
            }
            Limit::BodyReadTimeout => ("--body-read-timeout-ms", ms(limits.body_read_timeout)),
            Limit::IdleTimeout => ("--idle-timeout-ms", ms(limits.idle_timeout)),
            Limit::ConnectionsMax => ("--connections-max", limits.connections_max as u64),
            Limit::RequestsMax => ("--requests-max", limits.requests_max as u64),
        };
        tracing::warn!(
            limit = limit.name(),
            setting,
            value,
            trips = unlogged,
            "edge limit tripped: {} (counted in monoseq_edge_limit_trips_total; logged at most \
             once per {TRIP_LOG_INTERVAL:?})",
            match limit {
                Limit::HeaderReadTimeout =>
                    "a connection sent no complete request head in time; closed",
                Limit::BodyReadTimeout => "a request body did not arrive in time; answered 408",
                Limit::IdleTimeout => "an idle kept-alive connection was closed",
                Limit::ConnectionsMax => "a connection past the cap was answered 503 and closed",
                Limit::RequestsMax => "a request past the cap was answered 503 overloaded",
            }
        );
    }
}

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
