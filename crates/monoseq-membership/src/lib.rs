//! monoseq-membership: the cluster membership of one monoseq node as a sans-I/O state machine.
//! Owns the rules of the lease rounds (heartbeat, renew, read, take, hand off), the balanced
//! assignment of partitions to live nodes, the watchdogs that stop serving before a lease or
//! the node's name can lapse, the check that an epoch never goes back, and the rule "one name,
//! one live run". It does no I/O and reads no clock: the caller gives the time, performs the
//! [`Call`]s it asks for on a [`LeaseTable`] and hands their [`Reply`]s back, and carries out
//! the [`Action`]s (serve, stop, drain) through [`Serving`], the machine beside it that pulls
//! marks, settles accepted losses, starts, drains and reports back in the right order.
//! [`route`] places a request for a partition from the last read of the table (here, relayed
//! to its owner, or unavailable and why), for every kind of request. [`NodeMachine`] is the
//! three as one machine: what the node on tokio and the simulated node both step.
//!
//! [`MemoryLeaseTable`] is the reference lease table, on a database clock the caller sets;
//! the PostgreSQL one lives with the binary.
//!
//! # Example
//!
//! ```
//! use monoseq_membership::{Action, Config, MemoryLeaseTable, Membership, execute};
//!
//! let table = MemoryLeaseTable::new();
//! let config = Config::new("node-a", "run-1", "http://127.0.0.1:8080", 4, 1_500, 300)?;
//! let mut node = Membership::new(config.clone(), 0);
//! let mut served = Vec::new();
//! for now in (0..2_000).step_by(10) {
//!     table.set_now(now);
//!     while let Some(action) = node.poll(now) {
//!         match action {
//!             Action::Call(call) => node.reply(now, execute(&call, &table, &config)),
//!             Action::Serve { partition, .. } => served.push(partition),
//!             _ => {}
//!         }
//!     }
//! }
//! served.sort();
//! assert_eq!(served, [0, 1, 2, 3], "a lone node serves every partition");
//! # Ok::<(), monoseq_membership::ConfigError>(())
//! ```

// Library code answers errors; an `expect` states why it cannot fail.
#![cfg_attr(not(test), deny(clippy::unwrap_used))]

mod config;
mod machine;
mod memory;
mod node;
mod plan;
mod route;
mod serving;
mod table;

pub use config::{Config, ConfigError, NODE_ID_BYTES_MAX, RENEWALS_PER_LEASE_MIN};
pub use machine::{Action, Call, Membership, NameTaken, Phase, Reply, StopReason, View, execute};
pub use memory::MemoryLeaseTable;
pub use node::{NodeAction, NodeMachine};
pub use plan::{Assignment, assign};
pub use route::{Leases, Owner, Request, Route, Unplaced, route};
pub use serving::{DRAIN_MS_MAX, Retry, SETTLE_BACKOFF, Serving, ServingAction, Settled};
pub use table::{LeaseRow, LeaseTable, NameClaim, NodeRow, TableError, TableStatus};
