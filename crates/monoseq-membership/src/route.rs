//! [`route`]: where a request for a partition goes, decided once for every kind of request
//! (commands, batches, page reads, tails, consumer positions, groups) by the node on tokio
//! and by the simulated node alike. No I/O and no clock: the caller says whether it serves
//! the partition now and gives its last read of the lease table with that read's age by its
//! own clock.
//!
//! A lease read `age_ms` ago that had `expires_in_ms` left then may have expired since: its
//! holder is not taken for the owner once `age_ms` reaches `expires_in_ms` (a request sent
//! there would wait for a node that may be gone, or serve nothing). A request relayed once is
//! never relayed again, so stale views cannot make requests loop.

use crate::table::TableStatus;

/// Where a request for a partition goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node serves the partition (or is the only node): it answers the request itself.
    Local,
    /// Another node holds the partition's live lease: the request is relayed to it.
    Relay(Owner),
    /// The request cannot be placed now, for this reason.
    Unavailable(Unplaced),
}

/// The node holding a partition's live lease, as last read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// Its name.
    pub node_id: String,
    /// Where it is reached.
    pub url: String,
}

/// Why a request cannot be placed. Each has one answer, the same on every path: a partition
/// that does not exist is not found (a retry cannot help); every other reason is transient
/// (retry, with the same idempotency key for a command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unplaced {
    /// The partition is not below the partition count.
    NoSuchPartition {
        /// The partition count.
        partitions: u32,
    },
    /// No live lease as last read: the partition is free, its lease expired (or may have
    /// since the read), or its holder left the node registry. It is moving between nodes.
    Moving,
    /// This node holds the lease but does not serve the partition yet (it starts, settles
    /// accepted losses, or hands the partition over).
    Starting,
    /// Another node owns the partition and this request was already relayed by a node: a
    /// node relays a request once.
    Relayed,
}

impl Unplaced {
    /// Whether a retry later can place the request.
    #[must_use]
    pub fn is_transient(self) -> bool {
        !matches!(self, Unplaced::NoSuchPartition { .. })
    }

    /// What happened and what to do, for partition `p`.
    #[must_use]
    pub fn message(self, p: u32) -> String {
        match self {
            Unplaced::NoSuchPartition { partitions } => format!(
                "partition {p} does not exist: the server has partitions 0 to {}",
                partitions.saturating_sub(1)
            ),
            Unplaced::Moving => format!(
                "partition {p} is moving between nodes (no live lease as this node last read \
                 the lease table); retry"
            ),
            Unplaced::Starting => {
                format!("partition {p} is starting on this node, or being handed over; retry")
            }
            Unplaced::Relayed => format!(
                "partition {p} is not served by the node this request was relayed to (its owner \
                 changed just now); retry"
            ),
        }
    }
}

/// What a node knows of the partitions' leases.
#[derive(Debug, Clone, Copy)]
pub enum Leases<'a> {
    /// No lease table: one node serves every partition.
    Alone,
    /// The last read of the lease table, sent `age_ms` ago by this node's clock, by node
    /// `me`.
    Read {
        /// What was read.
        status: &'a TableStatus,
        /// How long ago the read was sent.
        age_ms: u64,
        /// This node's name.
        me: &'a str,
    },
}

/// A request to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// The partition it is for.
    pub partition: u32,
    /// The partition count.
    pub partitions: u32,
    /// This node serves the partition now.
    pub served_here: bool,
    /// Another node relayed the request here.
    pub relayed: bool,
}

/// Where `request` goes, given what this node knows of the `leases`.
#[must_use]
pub fn route(request: Request, leases: Leases<'_>) -> Route {
    let Request {
        partition,
        partitions,
        served_here,
        relayed,
    } = request;
    if partition >= partitions {
        return Route::Unavailable(Unplaced::NoSuchPartition { partitions });
    }
    if served_here {
        return Route::Local;
    }
    let Leases::Read { status, age_ms, me } = leases else {
        return Route::Local;
    };
    let age = i64::try_from(age_ms).unwrap_or(i64::MAX);
    let owner = status
        .lease(partition)
        .filter(|row| row.expires_in_ms > age)
        .and_then(|row| row.live_owner());
    let Some(owner) = owner else {
        return Route::Unavailable(Unplaced::Moving);
    };
    if owner == me {
        return Route::Unavailable(Unplaced::Starting);
    }
    let Some(node) = status.node(owner) else {
        return Route::Unavailable(Unplaced::Moving);
    };
    if relayed {
        return Route::Unavailable(Unplaced::Relayed);
    }
    Route::Relay(Owner {
        node_id: node.node_id.clone(),
        url: node.url.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{LeaseRow, NodeRow};

    fn status(expires_in_ms: i64) -> TableStatus {
        TableStatus {
            leases: vec![LeaseRow {
                partition: 0,
                epoch: 3,
                node_id: Some("b".into()),
                expires_in_ms,
            }],
            nodes: vec![NodeRow {
                node_id: "b".into(),
                run_id: "r".into(),
                url: "http://b".into(),
                seen_ms_ago: 0,
                dir_id: String::new(),
            }],
        }
    }

    fn ask(partition: u32) -> Request {
        Request {
            partition,
            partitions: 2,
            served_here: false,
            relayed: false,
        }
    }

    fn read(status: &TableStatus, age_ms: u64) -> Leases<'_> {
        Leases::Read {
            status,
            age_ms,
            me: "a",
        }
    }

    #[test]
    fn a_live_lease_read_lately_relays_to_its_holder() {
        let s = status(1_000);
        let b = Route::Relay(Owner {
            node_id: "b".into(),
            url: "http://b".into(),
        });
        assert_eq!(route(ask(0), read(&s, 999)), b);
    }

    #[test]
    fn a_lease_that_may_have_expired_since_the_read_names_no_owner() {
        let s = status(1_000);
        assert_eq!(
            route(ask(0), read(&s, 1_000)),
            Route::Unavailable(Unplaced::Moving)
        );
        assert_eq!(
            route(ask(0), read(&s, u64::MAX)),
            Route::Unavailable(Unplaced::Moving)
        );
    }

    #[test]
    fn served_here_is_local_and_an_unknown_partition_is_not_found() {
        let s = status(1_000);
        let here = Request {
            served_here: true,
            ..ask(0)
        };
        assert_eq!(route(here, read(&s, 0)), Route::Local);
        assert_eq!(route(ask(0), Leases::Alone), Route::Local);
        let unknown = Route::Unavailable(Unplaced::NoSuchPartition { partitions: 2 });
        assert_eq!(route(ask(2), read(&s, 0)), unknown);
        assert_eq!(route(ask(2), Leases::Alone), unknown);
        assert!(!Unplaced::NoSuchPartition { partitions: 2 }.is_transient());
    }

    #[test]
    fn a_relayed_request_is_not_relayed_again_and_a_lease_here_is_starting() {
        let s = status(1_000);
        let relayed = Request {
            relayed: true,
            ..ask(0)
        };
        assert_eq!(
            route(relayed, read(&s, 0)),
            Route::Unavailable(Unplaced::Relayed)
        );
        let mine = Leases::Read {
            status: &s,
            age_ms: 0,
            me: "b",
        };
        assert_eq!(route(ask(0), mine), Route::Unavailable(Unplaced::Starting));
        let free = TableStatus {
            leases: Vec::new(),
            ..status(1_000)
        };
        assert_eq!(
            route(ask(1), read(&free, 0)),
            Route::Unavailable(Unplaced::Moving)
        );
        let unregistered = TableStatus {
            nodes: Vec::new(),
            ..status(1_000)
        };
        assert_eq!(
            route(ask(0), read(&unregistered, 0)),
            Route::Unavailable(Unplaced::Moving)
        );
    }
}
