//! Where this node sends a request for a partition: every handler (commands, batches, page
//! reads, tails, positions, groups) asks [`AppState::place`], which takes the decision of
//! `monoseq_membership::route` and, for a relay, hands over the forwarder with the owner, so
//! that no path can find itself without one. A request that cannot be placed gets one answer
//! on every path ([`unplaced`], [`unplaced_body`]): 404 `no_such_partition` for a partition
//! the server does not have, else 503 `partition_unavailable` with `Retry-After` and why.

use axum::http::StatusCode;
use axum::response::Response;
use monoseq_cp::RETRY_AFTER_SECS;
use monoseq_membership::{Leases, Request, Route, Unplaced, route};
use monoseq_wire::{ErrorBody, ErrorCode};

use super::AppState;
use super::answers::with_retry_after;
use crate::base::error;
use crate::cluster::Cluster;
use crate::forward::Forwarder;

/// Where a request goes, as [`AppState::place`] decided.
pub(super) enum Placed<'a> {
    /// Answered here.
    Local,
    /// Relayed to the owner.
    Relay(Relay<'a>),
    /// Not placeable now, and why.
    Unavailable(Unplaced),
}

/// A relay to a partition's owner, with what it takes.
pub(super) struct Relay<'a> {
    /// Where the owner is reached.
    pub(super) url: String,
    /// What relays the request.
    pub(super) forwarder: &'a Forwarder,
    /// The membership, told when the owner read last did not answer.
    pub(super) cluster: &'a Cluster,
}

impl AppState {
    /// Where a request for partition `p` goes: here when this node's processor serves it (or
    /// it is the only node), else to the owner of its live lease as last read (unless
    /// `relayed`: another node relayed it here already), else nowhere and why.
    pub(super) fn place(&self, p: u32, relayed: bool) -> Placed<'_> {
        let partitions = self.cp.config().partitions;
        let Some((cluster, forwarder)) = &self.cluster else {
            // One node alone serves every partition: the processor need not be asked.
            let request = Request {
                partition: p,
                partitions,
                served_here: true,
                relayed,
            };
            return match route(request, Leases::Alone) {
                Route::Unavailable(why) => Placed::Unavailable(why),
                _ => Placed::Local,
            };
        };
        let served_here = p < partitions && self.cp.serves(p);
        match cluster.route(p, served_here, relayed) {
            Route::Local => Placed::Local,
            Route::Relay(owner) => Placed::Relay(Relay {
                url: owner.url,
                forwarder,
                cluster,
            }),
            Route::Unavailable(why) => Placed::Unavailable(why),
        }
    }
}

/// The status, code and `Retry-After` of a request that cannot be placed.
fn parts(why: Unplaced) -> (StatusCode, ErrorCode, Option<u64>) {
    match why {
        Unplaced::NoSuchPartition { .. } => {
            (StatusCode::NOT_FOUND, ErrorCode::NoSuchPartition, None)
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::PartitionUnavailable,
            Some(RETRY_AFTER_SECS),
        ),
    }
}

/// The answer to a request for partition `p` that cannot be placed (`why`).
pub(super) fn unplaced(p: u32, why: Unplaced) -> Response {
    let (status, code, retry) = parts(why);
    let answer = error(status, code, why.message(p));
    match retry {
        Some(_) => with_retry_after(answer),
        None => answer,
    }
}

/// The same answer as a batch's result for one command.
pub(super) fn unplaced_body(p: u32, why: Unplaced) -> monoseq_wire::BatchResultBody {
    let (status, code, retry) = parts(why);
    monoseq_wire::BatchResultBody::refused(
        status.as_u16(),
        ErrorBody::new(code, why.message(p)),
        retry,
    )
}
